//! Conformance cases: `fencing`: every lease-taking method rejects a
//! lease that is not the key's current one with `LeaseLost`, and writes nothing.
//!
//! The per-method cases share one seed: node-a acquires at T0 and commits item `i1`, pending event `e1`
//! and sequence 1 (updated at T0); then node-b steals the lease at T0+TTL. Each method is then
//! called with three bad leases, which together catch the usual fencing mistakes:
//! - node-a's stale lease (epoch 1): no fence at all, or a fence on expiry only;
//! - the current epoch with node-a as owner: a fence that compares epochs only;
//! - node-b with epoch + 1: a fence that compares owners only, or accepts "newer" epochs
//!   (`>=`), or a made-up epoch.
//!
//! After every rejection the whole key is read back ([`observe`]) and must equal the seed
//! exactly, with node-b's lease still current: that catches writes applied before the fence
//! check or outside its atomic unit, and a fence failure that clobbers the lease. The error must
//! carry the key and the *rejected* epoch (the stale lease's epoch 1 differs from the current 2,
//! so an error carrying the current epoch fails). Finally the same call with the current lease
//! succeeds and shows its effect, so each rejection demonstrably prevented a visible change.

use watukuy_core::{
    ErrorCode,
    store::{
        CommitBatch, Lease, LoggedEvent, OutboxStatus, PKey, PollerState, SerializedError,
        StatePatch, Store, Validator,
    },
};

use super::fixtures::{
    NODE_A, NODE_B, Observation, T0, TTL, acquire, event, expect_lease_lost, invalid, item, key,
    key_b, leased, observe, pending, poison, progress, unleased,
};
use crate::harness::{CaseError, CaseResult, Env};
use crate::{check, check_eq};

/// The URL hash whose validator the fencing cases watch.
const URL: &str = "url-1";

/// The fencing seed: the key, node-b's current lease, and what the key must keep showing.
struct Seeded {
    key: PKey,
    current: Lease,
    expected: Observation,
}

impl Seeded {
    /// The three leases every fenced call must reject, with the epoch the error must carry and
    /// a label for messages.
    fn rejected(&self, stale: &Lease) -> [(Lease, &'static str); 3] {
        [
            (stale.clone(), "node-a's stale lease"),
            (
                Lease {
                    owner: NODE_A.to_owned(),
                    ..self.current.clone()
                },
                "the current epoch with another owner",
            ),
            (
                Lease {
                    epoch: self.current.epoch + 1,
                    ..self.current.clone()
                },
                "the current owner with epoch + 1",
            ),
        ]
    }

    /// Fails unless the key still reads exactly as seeded.
    async fn verify_unchanged(&self, store: &dyn Store, what: &str) -> CaseResult {
        check_eq!(
            observe(store, &self.key, &[URL]).await?,
            self.expected,
            "{what} changed the key"
        );
        Ok(())
    }
}

/// Seeds `key()` as the module docs describe; returns the seed and node-a's stale lease.
async fn seed(store: &dyn Store) -> Result<(Seeded, Lease), CaseError> {
    let key = key();
    let log = store.capabilities().log;
    let stale = acquire(store, &key, NODE_A, T0).await?;
    let batch = CommitBatch::default()
        .state_patch(progress(1, T0))
        .upserts(vec![item("i1", "h1")])
        .events(vec![pending(&key, "e1", 1, "i1")])
        .log(log);
    store.commit_poll(&key, &stale, &batch).await?;
    let current = acquire(store, &key, NODE_B, T0 + TTL).await?;
    check_eq!(current.epoch, stale.epoch + 1, "node-b's steal at T0+TTL");
    let expected = Observation {
        state: Some(PollerState {
            sequence: 1,
            ..PollerState::zero(T0)
        }),
        lease: Some(current.clone()),
        identities: vec!["i1".to_owned()],
        items: vec![item("i1", "h1")],
        item_count: 1,
        pending: vec![pending(&key, "e1", 1, "i1")],
        pending_count: 1,
        parked: Vec::new(),
        parked_count: 0,
        held_keys: Vec::new(),
        validators: vec![(URL.to_owned(), None)],
        log: log.then(|| {
            vec![LoggedEvent {
                sequence: 1,
                event: event(&key, "e1", 1, "i1"),
                created_at: T0,
            }]
        }),
    };
    let seeded = Seeded {
        key,
        current,
        expected,
    };
    seeded.verify_unchanged(store, "seeding").await?;
    Ok((seeded, stale))
}

/// `Store::save_state` contract 2: with a stale lease, the current epoch under another owner, or
/// epoch + 1, `save_state` fails with `LeaseLost` (key, rejected epoch) and the state keeps
/// `paused: false`, `updated_at: T0` (nothing else of the key changes); node-b's lease stays
/// current and its own save then lands.
pub async fn save_state_rejects_stale_lease(env: Env) -> CaseResult {
    let store = env.store();
    let (seeded, stale) = seed(store).await?;
    let key = &seeded.key;
    let patch = StatePatch {
        paused: Some(true),
        sequence: Some(9),
        updated_at: Some(T0 + TTL + 1_000),
        ..StatePatch::default()
    };
    for (lease, label) in seeded.rejected(&stale) {
        let what = format!("save_state with {label}");
        expect_lease_lost(
            store.save_state(key, &lease, &patch).await,
            key,
            lease.epoch,
            &what,
        )?;
        seeded.verify_unchanged(store, &what).await?;
    }
    store.save_state(key, &seeded.current, &patch).await?;
    check_eq!(
        store.load_state(key).await?,
        Some(PollerState::patched(seeded.expected.state.clone(), &patch)),
        "save_state with the current lease"
    );
    Ok(())
}

/// `Store::commit_poll` contract 5: with a bad lease `commit_poll` fails with `LeaseLost` and
/// nothing of the batch lands: no upsert, no delete, no event (new or overwritten), no parked
/// row, no validator, no log entry, no state patch.
pub async fn commit_poll_rejects_stale_lease(env: Env) -> CaseResult {
    let store = env.store();
    let (seeded, stale) = seed(store).await?;
    let key = &seeded.key;
    let mut overwritten = pending(key, "e1", 1, "i1");
    overwritten.attempts = 5;
    overwritten.status = OutboxStatus::Delivered;
    let batch = CommitBatch::default()
        .state_patch(StatePatch {
            paused: Some(true),
            sequence: Some(2),
            updated_at: Some(T0 + TTL + 1_000),
            ..StatePatch::default()
        })
        .upserts(vec![item("i2", "h2")])
        .deletes(vec!["i1".to_owned()])
        .events(vec![overwritten, pending(key, "e2", 2, "i2")])
        .log(store.capabilities().log)
        .parked(vec![invalid(
            "invalid:bad",
            r#"{"id":"bad","total":"x"}"#,
            T0 + TTL,
        )])
        .validators(vec![watukuy_core::store::UrlValidator {
            url_hash: URL.to_owned(),
            validator: watukuy_core::store::Validator {
                etag: Some("\"v2\"".to_owned()),
                last_modified: None,
                stored_at: T0 + TTL,
            },
        }]);
    for (lease, label) in seeded.rejected(&stale) {
        let what = format!("commit_poll with {label}");
        expect_lease_lost(
            store.commit_poll(key, &lease, &batch).await,
            key,
            lease.epoch,
            &what,
        )?;
        seeded.verify_unchanged(store, &what).await?;
    }
    store.commit_poll(key, &seeded.current, &batch).await?;
    let after = observe(store, key, &[URL]).await?;
    check_eq!(
        after.state,
        Some(PollerState::patched(
            seeded.expected.state.clone(),
            &batch.state_patch
        )),
        "state after commit_poll with the current lease"
    );
    check_eq!(
        after.identities,
        vec!["i2".to_owned()],
        "snapshot after commit_poll with the current lease"
    );
    check_eq!(
        after.validators,
        vec![(URL.to_owned(), Some(batch.validators[0].validator.clone()))],
        "validators after commit_poll with the current lease"
    );
    check!(
        after.pending.iter().any(|row| row.event_id == "e2"),
        "e2 is not pending after commit_poll with the current lease: {:?}",
        after.pending
    );
    check_eq!(
        after.parked_count,
        1,
        "parked rows after commit_poll with the current lease"
    );
    Ok(())
}

/// `Store::ack_events` contract 2: with a bad lease `ack_events` fails with `LeaseLost` and `e1`
/// stays pending (nothing else changes).
pub async fn ack_events_rejects_stale_lease(env: Env) -> CaseResult {
    let store = env.store();
    let (seeded, stale) = seed(store).await?;
    let key = &seeded.key;
    let ids = vec!["e1".to_owned()];
    for (lease, label) in seeded.rejected(&stale) {
        let what = format!("ack_events with {label}");
        expect_lease_lost(
            store.ack_events(key, &lease, &ids).await,
            key,
            lease.epoch,
            &what,
        )?;
        seeded.verify_unchanged(store, &what).await?;
    }
    store.ack_events(key, &seeded.current, &ids).await?;
    check_eq!(
        store.counts(key).await.map(|c| c.pending)?,
        0,
        "ack_events with the current lease"
    );
    Ok(())
}

/// `Store::record_attempt` contract 2: with a bad lease `record_attempt` fails with `LeaseLost`
/// and `e1` keeps `attempts: 0`, `last_error: None`, `next_attempt_at: None`.
pub async fn record_attempt_rejects_stale_lease(env: Env) -> CaseResult {
    let store = env.store();
    let (seeded, stale) = seed(store).await?;
    let key = &seeded.key;
    let error = SerializedError::new("HandlerError", "boom");
    let next = Some(T0 + TTL + 5_000);
    for (lease, label) in seeded.rejected(&stale) {
        let what = format!("record_attempt with {label}");
        expect_lease_lost(
            store.record_attempt(key, &lease, "e1", &error, next).await,
            key,
            lease.epoch,
            &what,
        )?;
        seeded.verify_unchanged(store, &what).await?;
    }
    store
        .record_attempt(key, &seeded.current, "e1", &error, next)
        .await?;
    let mut attempted = pending(key, "e1", 1, "i1");
    attempted.attempts = 1;
    attempted.last_error = Some(error);
    attempted.next_attempt_at = next;
    check_eq!(
        store.load_pending(key, 10).await?,
        vec![attempted],
        "record_attempt with the current lease"
    );
    Ok(())
}

/// `Store::park_event` contract 2: with a bad lease `park_event` fails with `LeaseLost`; nothing
/// is parked, no key is held and `e1` stays pending.
pub async fn park_event_rejects_stale_lease(env: Env) -> CaseResult {
    let store = env.store();
    let (seeded, stale) = seed(store).await?;
    let key = &seeded.key;
    let row = poison(event(key, "e1", 1, "i1"), Some("i1"), T0 + TTL);
    for (lease, label) in seeded.rejected(&stale) {
        let what = format!("park_event with {label}");
        expect_lease_lost(
            store.park_event(key, &lease, &row).await,
            key,
            lease.epoch,
            &what,
        )?;
        seeded.verify_unchanged(store, &what).await?;
    }
    store.park_event(key, &seeded.current, &row).await?;
    let after = observe(store, key, &[URL]).await?;
    check_eq!(
        (after.pending_count, after.parked, after.held_keys),
        (0, vec![row], vec!["i1".to_owned()]),
        "park_event with the current lease"
    );
    Ok(())
}

/// `Store::save_state` contract 3: a made-up ("ghost") lease on a key nobody ever leased is
/// rejected by every fenced method (`save_state`, `commit_poll`, `ack_events`, `record_attempt`,
/// `park_event`) with `LeaseLost`, and no state, lease or key is created.
pub async fn fenced_writes_without_lease_are_rejected(env: Env) -> CaseResult {
    let (store, key) = unleased(&env);
    let log = store.capabilities().log;
    let ghost = Lease {
        owner: NODE_A.to_owned(),
        epoch: 1,
        expires_at: T0 + TTL,
    };
    let patch = StatePatch {
        paused: Some(true),
        updated_at: Some(T0),
        ..StatePatch::default()
    };
    let batch = CommitBatch::default()
        .state_patch(patch.clone())
        .upserts(vec![item("i1", "h1")])
        .events(vec![pending(&key, "e1", 1, "i1")])
        .log(log)
        .validators(vec![watukuy_core::store::UrlValidator {
            url_hash: URL.to_owned(),
            validator: Validator {
                etag: Some("\"v1\"".to_owned()),
                last_modified: None,
                stored_at: T0,
            },
        }]);
    let error = SerializedError::new("HandlerError", "boom");
    let row = poison(event(&key, "e1", 1, "i1"), Some("i1"), T0);
    let epoch = ghost.epoch;
    expect_lease_lost(
        store.save_state(&key, &ghost, &patch).await,
        &key,
        epoch,
        "save_state with a ghost lease",
    )?;
    expect_lease_lost(
        store.commit_poll(&key, &ghost, &batch).await,
        &key,
        epoch,
        "commit_poll with a ghost lease",
    )?;
    expect_lease_lost(
        store.ack_events(&key, &ghost, &["e1".to_owned()]).await,
        &key,
        epoch,
        "ack_events with a ghost lease",
    )?;
    expect_lease_lost(
        store.record_attempt(&key, &ghost, "e1", &error, None).await,
        &key,
        epoch,
        "record_attempt with a ghost lease",
    )?;
    expect_lease_lost(
        store.park_event(&key, &ghost, &row).await,
        &key,
        epoch,
        "park_event with a ghost lease",
    )?;
    check_eq!(
        observe(store, &key, &[URL]).await?,
        Observation::empty(log, &[URL]),
        "ghost-lease writes left something behind"
    );
    check!(
        store.list_keys(None).await?.is_empty(),
        "ghost-lease writes created a key"
    );
    Ok(())
}

/// `Store::release_lease` contract 3: once node-a released its lease, its writes (`save_state`,
/// `commit_poll`) fail with `LeaseLost`, the state is unchanged, the lease is not resurrected and
/// `renew_lease` returns `false`.
pub async fn released_lease_fails_fence(env: Env) -> CaseResult {
    let (store, key, lease) = leased(&env).await?;
    let first = progress(1, T0);
    store.save_state(&key, &lease, &first).await?;
    store.release_lease(&key, &lease).await?;
    let before = observe(store, &key, &[URL]).await?;
    check_eq!(before.lease, None, "get_lease after the release");

    let patch = StatePatch {
        paused: Some(true),
        sequence: Some(2),
        updated_at: Some(T0 + 1_000),
        ..StatePatch::default()
    };
    expect_lease_lost(
        store.save_state(&key, &lease, &patch).await,
        &key,
        lease.epoch,
        "save_state with a released lease",
    )?;
    let batch = CommitBatch::default()
        .state_patch(patch)
        .upserts(vec![item("i1", "h1")])
        .events(vec![pending(&key, "e1", 1, "i1")])
        .log(store.capabilities().log);
    expect_lease_lost(
        store.commit_poll(&key, &lease, &batch).await,
        &key,
        lease.epoch,
        "commit_poll with a released lease",
    )?;
    check!(
        !store.renew_lease(&key, &lease, TTL, T0 + 1_000).await?,
        "renew_lease with a released lease returned true"
    );
    check_eq!(
        observe(store, &key, &[URL]).await?,
        before,
        "writes with a released lease changed the key"
    );
    Ok(())
}

/// `Store::save_state` contract 4: the `LeaseLost` error carries code `LEASE_LOST`, the key's
/// poller and partition, and the *rejected* epoch (here 1, while the current epoch is 3).
pub async fn lease_lost_carries_key_and_epoch(env: Env) -> CaseResult {
    let store = env.store();
    let key = key_b();
    let stale = acquire(store, &key, NODE_A, T0).await?;
    acquire(store, &key, NODE_A, T0 + 1_000).await?;
    let current = acquire(store, &key, NODE_B, T0 + 1_000 + TTL).await?;
    check_eq!(
        (stale.epoch, current.epoch),
        (1, 3),
        "epochs of three acquisitions"
    );
    let patch = StatePatch {
        paused: Some(true),
        updated_at: Some(T0),
        ..StatePatch::default()
    };
    match store.save_state(&key, &stale, &patch).await {
        Err(error) => {
            check_eq!(error.code(), ErrorCode::LeaseLost, "the error's code");
            check_eq!(error.code().as_str(), "LEASE_LOST", "the code's text");
            check_eq!(
                error.to_serialized().code.as_deref(),
                Some("LEASE_LOST"),
                "the serialized error's code"
            );
            let watukuy_core::Error::LeaseLost {
                poller,
                partition,
                epoch,
            } = error
            else {
                return Err(CaseError::failed(format!(
                    "expected Error::LeaseLost, got {error}"
                )));
            };
            check_eq!(
                (poller.as_str(), partition.as_str(), epoch),
                ("orders", "tenant-b", stale.epoch),
                "LeaseLost must carry the key and the rejected epoch"
            );
        }
        Ok(()) => {
            return Err(CaseError::failed(
                "save_state with a stale lease succeeded".to_owned(),
            ));
        }
    }
    expect_lease_lost(
        store
            .commit_poll(&key, &stale, &CommitBatch::default().state_patch(patch))
            .await,
        &key,
        stale.epoch,
        "commit_poll with a stale lease",
    )?;
    check_eq!(
        store.load_state(&key).await?,
        None,
        "rejected writes created state"
    );
    Ok(())
}

/// The fence across instances: two instances of one store (two pools, two clients, two file
/// handles, as two processes of a service hold) share data, and a lease taken over by one
/// fences every write of the other. Then both race for an expired lease twenty times: exactly
/// one wins each round, with the next epoch, and a write with the winner's epoch but another
/// owner is rejected. Skipped for a harness that opens no second instance.
pub async fn a_second_instance_shares_data_and_is_fenced(env: Env) -> CaseResult {
    let b = env.another_instance().await?;
    let a = env.store();
    let k = key();
    let lease_a = acquire(a, &k, NODE_A, T0).await?;
    check!(
        b.acquire_lease(&k, NODE_B, TTL, T0 + 1).await?.is_none(),
        "b took a valid lease held by a"
    );
    let seed = CommitBatch::default()
        .upserts(vec![item("i1", "h1")])
        .events(vec![pending(&k, "e1", 1, "i1")])
        .state_patch(progress(1, T0));
    a.commit_poll(&k, &lease_a, &seed).await?;
    check_eq!(b.counts(&k).await?.items, 1, "b sees a's commit");
    check_eq!(
        b.get_lease(&k).await?,
        Some(lease_a.clone()),
        "b sees a's lease"
    );

    // b takes the expired lease: every fenced write of a is rejected and changes nothing.
    let lease_b = acquire(&*b, &k, NODE_B, T0 + TTL).await?;
    check_eq!(lease_b.epoch, lease_a.epoch + 1, "the epoch advances");
    let before = observe(&*b, &k, &[]).await?;
    let stale = CommitBatch::default()
        .upserts(vec![item("i2", "h2")])
        .state_patch(progress(2, T0 + TTL));
    expect_lease_lost(
        a.commit_poll(&k, &lease_a, &stale).await,
        &k,
        lease_a.epoch,
        "a's commit_poll",
    )?;
    expect_lease_lost(
        a.ack_events(&k, &lease_a, &["e1".to_owned()]).await,
        &k,
        lease_a.epoch,
        "a's ack_events",
    )?;
    check!(
        !a.renew_lease(&k, &lease_a, TTL, T0 + TTL).await?,
        "a renewed a lease b took"
    );
    check_eq!(
        observe(&*b, &k, &[]).await?,
        before,
        "a's stale writes changed nothing"
    );
    b.commit_poll(&k, &lease_b, &stale).await?;
    check_eq!(a.counts(&k).await?.items, 2, "a sees b's commit");

    // Both race for an expired lease: exactly one wins each round.
    let mut now = T0 + TTL;
    let mut last_epoch = lease_b.epoch;
    for round in 0..20 {
        now += TTL;
        let (owner_a, owner_b) = (format!("a-{round}"), format!("b-{round}"));
        let (won_a, won_b) = futures::join!(
            a.acquire_lease(&k, &owner_a, TTL, now),
            b.acquire_lease(&k, &owner_b, TTL, now),
        );
        let winner = match (won_a?, won_b?) {
            (Some(winner), None) | (None, Some(winner)) => winner,
            other => {
                return Err(CaseError::failed(format!(
                    "round {round}: not exactly one winner: {other:?}"
                )));
            }
        };
        check_eq!(
            winner.epoch,
            last_epoch + 1,
            "round {round}: the next epoch"
        );
        last_epoch = winner.epoch;
        let ghost = Lease {
            owner: "ghost".to_owned(),
            ..winner.clone()
        };
        expect_lease_lost(
            a.save_state(&k, &ghost, &StatePatch::default()).await,
            &k,
            winner.epoch,
            "a write with the winner's epoch and another owner",
        )?;
        let patch = StatePatch {
            sequence: Some(last_epoch),
            ..StatePatch::default()
        };
        b.save_state(&k, &winner, &patch).await?;
    }
    let state = a.load_state(&k).await?;
    check_eq!(
        state.map(|s| s.sequence),
        Some(last_epoch),
        "the last winner's write, seen by the other instance"
    );
    Ok(())
}
