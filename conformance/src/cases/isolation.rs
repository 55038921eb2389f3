//! Conformance cases: `isolation` — keys never see each other: neither two partitions of one
//! poller nor two pollers with the same partition.

use watukuy_core::store::{
    CommitBatch, ItemRow, Lease, OutboxRow, PKey, SerializedError, StatePatch, Store, Validator,
};

use super::fixtures::{
    NODE_A, Observation, T0, TTL, acquire, event, expect_lease_lost, invalid, item, json, key,
    key_b, key_other, observe, owned_ids, pending, poison, progress,
};
use crate::harness::{CaseResult, Env};
use crate::{check, check_eq};

/// The URL hash whose validator the cases write and observe.
const URL: &str = "url-hash-1";

/// Fills `key` with something of every kind: state, two items, two pending events (all logged),
/// an invalid row, a poison row holding `o1`, and a validator.
async fn populate(store: &dyn Store, key: &PKey, lease: &Lease) -> CaseResult {
    let batch = CommitBatch::default()
        .state_patch(StatePatch {
            sequence: Some(3),
            schema_version: Some(1),
            updated_at: Some(T0),
            ..StatePatch::default()
        })
        .upserts(vec![
            ItemRow {
                payload: Some(json(r#"{"id":"o1","owner":"a"}"#)),
                ..item("o1", "hash-a-o1")
            },
            item("o2", "hash-a-o2"),
        ])
        .events(vec![
            pending(key, "evt-1", 1, "o1"),
            pending(key, "evt-2", 2, "o2"),
            pending(key, "evt-3", 3, "o1"),
        ])
        .log(store.capabilities().log)
        .parked(vec![invalid("invalid:a", r#"{"id":"bad-a"}"#, T0)]);
    store.commit_poll(key, lease, &batch).await?;
    let parked = poison(event(key, "evt-3", 3, "o1"), Some("o1"), T0 + 100);
    store.park_event(key, lease, &parked).await?;
    let validator = Validator {
        etag: Some("\"etag-a\"".to_owned()),
        last_modified: None,
        stored_at: T0,
    };
    super::fixtures::write_validator(store, key, lease, URL, &validator).await?;
    Ok(())
}

/// Fails unless every fenced write on `key` with `lease` fails with `LeaseLost` for `key`
/// carrying `lease.epoch`.
async fn expect_fenced_out(store: &dyn Store, key: &PKey, lease: &Lease, what: &str) -> CaseResult {
    let patch = StatePatch {
        paused: Some(true),
        updated_at: Some(T0 + 2_000),
        ..StatePatch::default()
    };
    let batch = CommitBatch::default()
        .state_patch(patch.clone())
        .upserts(vec![item("intruder", "hash")])
        .deletes(owned_ids(&["o1"]))
        .events(vec![pending(key, "evt-9", 9, "intruder")])
        .log(true);
    let error = SerializedError::new("HandlerError", "intruder");
    let parked = poison(event(key, "evt-1", 1, "o1"), Some("o1"), T0);
    let validator = Validator {
        etag: None,
        last_modified: None,
        stored_at: T0,
    };
    let epoch = lease.epoch;
    expect_lease_lost(
        store.save_state(key, lease, &patch).await,
        key,
        epoch,
        &format!("save_state {what}"),
    )?;
    expect_lease_lost(
        store.commit_poll(key, lease, &batch).await,
        key,
        epoch,
        &format!("commit_poll {what}"),
    )?;
    expect_lease_lost(
        store.ack_events(key, lease, &owned_ids(&["evt-1"])).await,
        key,
        epoch,
        &format!("ack_events {what}"),
    )?;
    expect_lease_lost(
        store
            .record_attempt(key, lease, "evt-1", &error, None)
            .await,
        key,
        epoch,
        &format!("record_attempt {what}"),
    )?;
    expect_lease_lost(
        store.park_event(key, lease, &parked).await,
        key,
        epoch,
        &format!("park_event {what}"),
    )?;
    expect_lease_lost(
        super::fixtures::write_validator(store, key, lease, URL, &validator).await,
        key,
        epoch,
        &format!("a commit of a validator {what}"),
    )?;
    Ok(())
}

/// Proves that `other` is independent of `key()` (called A here):
/// - `other` starts at epoch 1 with nothing stored while A is leased (at epoch 2) and full;
/// - A's lease fails the fence on `other` (before and after `other` is leased by the same owner,
///   so only the epoch differs), and `other`'s lease fails it on A;
/// - every write on `other`, including ones naming A's identities, event ids and parked ids,
///   and finally `delete_key(other)`, leaves A exactly as it was.
async fn check_isolated(store: &dyn Store, other: &PKey) -> CaseResult {
    let a = key();
    let log = store.capabilities().log;
    let first = acquire(store, &a, NODE_A, T0).await?;
    let lease_a = acquire(store, &a, NODE_A, T0 + 500).await?;
    check_eq!(
        (first.epoch, lease_a.epoch),
        (1, 2),
        "fixture: A is at epoch 2"
    );
    populate(store, &a, &lease_a).await?;
    let before = observe(store, &a, &[URL]).await?;
    check_eq!(before.item_count, 2, "fixture: A holds two items");
    check_eq!(
        before.pending_count,
        2,
        "fixture: A holds two pending events"
    );
    check_eq!(before.parked_count, 2, "fixture: A holds two parked rows");
    check_eq!(before.held_keys, owned_ids(&["o1"]), "fixture: A holds o1");

    let empty = Observation::empty(log, &[URL]);
    check_eq!(
        observe(store, other, &[URL]).await?,
        empty,
        "{other} starts with nothing stored"
    );

    // A's lease on a key that has no lease at all.
    expect_fenced_out(
        store,
        other,
        &lease_a,
        "with A's lease on the unleased other key",
    )
    .await?;
    check_eq!(
        observe(store, other, &[URL]).await?,
        empty,
        "rejected writes created nothing on {other}"
    );

    // The same owner takes the other key: a fresh epoch counter, not blocked by A's valid lease.
    let lease_o = acquire(store, other, NODE_A, T0 + 1_000).await?;
    check_eq!(
        lease_o,
        Lease {
            owner: NODE_A.to_owned(),
            epoch: 1,
            expires_at: T0 + 1_000 + TTL,
        },
        "{other} starts at epoch 1"
    );
    check_eq!(
        observe(store, other, &[URL]).await?,
        Observation {
            lease: Some(lease_o.clone()),
            ..Observation::empty(log, &[URL])
        },
        "a lease alone stores nothing else on {other}"
    );
    expect_fenced_out(store, other, &lease_a, "with A's lease on the other key").await?;
    expect_fenced_out(store, &a, &lease_o, "with the other key's lease on A").await?;
    check_eq!(
        observe(store, &a, &[URL]).await?,
        before,
        "rejected writes changed nothing on A"
    );

    // The other key's own writes, naming A's identities, event ids and parked ids.
    let batch = CommitBatch::default()
        .state_patch(StatePatch {
            sequence: Some(9),
            paused: Some(true),
            updated_at: Some(T0 + 5_000),
            ..StatePatch::default()
        })
        .upserts(vec![ItemRow {
            payload: Some(json(r#"{"id":"o1","owner":"other"}"#)),
            ..item("o1", "hash-other-o1")
        }])
        .deletes(owned_ids(&["o2"]))
        .events(vec![OutboxRow::pending(
            event(other, "evt-1", 1, "o1"),
            T0 + 5_000,
        )])
        .log(log)
        .parked(vec![invalid(
            "invalid:a",
            r#"{"id":"bad-other"}"#,
            T0 + 5_000,
        )]);
    store.commit_poll(other, &lease_o, &batch).await?;
    check_eq!(
        store.counts(other).await.map(|c| c.items)?,
        1,
        "{other} sees only its own item"
    );
    check_eq!(
        store.counts(other).await.map(|c| c.pending)?,
        1,
        "{other} sees only its own event"
    );
    check_eq!(
        store.counts(other).await.map(|c| c.parked)?,
        1,
        "{other} sees only its own parked row"
    );
    store
        .record_attempt(
            other,
            &lease_o,
            "evt-2",
            &SerializedError::new("HandlerError", "not mine"),
            Some(T0 + 6_000),
        )
        .await?;
    store
        .ack_events(other, &lease_o, &owned_ids(&["evt-1", "evt-2"]))
        .await?;
    check_eq!(
        store.counts(other).await.map(|c| c.pending)?,
        0,
        "{other} acked its own evt-1"
    );
    check_eq!(
        store
            .resolve_parked(
                other,
                &owned_ids(&["evt-3"]),
                watukuy_core::store::ParkedAction::Retry
            )
            .await?,
        0,
        "A's poison row cannot be retried through {other}"
    );
    check_eq!(
        store
            .resolve_parked(
                other,
                &owned_ids(&["evt-3", "invalid:a"]),
                watukuy_core::store::ParkedAction::Discard
            )
            .await?,
        1,
        "only {other}'s own invalid:a is discarded, not A's evt-3"
    );
    super::fixtures::write_validator(
        store,
        other,
        &lease_o,
        URL,
        &Validator {
            etag: Some("\"etag-other\"".to_owned()),
            last_modified: Some("Thu, 01 Jan 2026 00:00:00 GMT".to_owned()),
            stored_at: T0 + 5_000,
        },
    )
    .await?;
    store
        .save_state(other, &lease_o, &progress(10, T0 + 6_000))
        .await?;
    store
        .save_state_unfenced(
            other,
            &StatePatch {
                paused: Some(false),
                ..StatePatch::default()
            },
        )
        .await?;
    if log {
        check_eq!(
            store.prune_log(other, T0 + 1_000_000).await?,
            1,
            "{other} prunes only its own log entry"
        );
    }
    store.clear_items(other).await?;
    check_eq!(
        observe(store, &a, &[URL]).await?,
        before,
        "writes on {other} changed nothing on A"
    );

    store.release_lease(other, &lease_o).await?;
    store.delete_key(other).await?;
    check_eq!(
        observe(store, other, &[URL]).await?,
        empty,
        "{other} is gone after delete_key"
    );
    check_eq!(
        observe(store, &a, &[URL]).await?,
        before,
        "releasing and deleting {other} left A intact"
    );
    check_eq!(
        store.get_lease(&a).await?,
        Some(lease_a),
        "A's lease is still the current one"
    );
    Ok(())
}

/// `Store::acquire_lease` contract 6: partitions of one poller are independent keys — a new
/// partition starts at epoch 1 with nothing stored, A's lease fails the fence on partition B
/// (LeaseLost carrying B and A's epoch), and B's writes (deleting A's identity, acking A's event
/// id, discarding A's parked id, ...) and its deletion leave A untouched.
pub async fn partitions_are_isolated(env: Env) -> CaseResult {
    let store = env.store();
    let b = key_b();
    check_eq!(b.poller, key().poller, "fixture: same poller");
    check_isolated(store, &b).await
}

/// `Store::delete_key` contract 2: pollers are independent keys even with the same partition —
/// the other poller starts empty at epoch 1, leases do not cross, its writes do not reach A, and
/// `delete_key` on it leaves A intact (A stays in `list_keys`).
pub async fn pollers_are_isolated(env: Env) -> CaseResult {
    let store = env.store();
    let other = key_other();
    let a = key();
    check_eq!(other.partition, a.partition, "fixture: same partition");
    check_isolated(store, &other).await?;
    let keys = store.list_keys(Some(a.poller.as_str())).await?;
    check!(
        keys.contains(&a),
        "{a} is still listed after deleting {other}: {keys:?}"
    );
    let others = store.list_keys(Some(other.poller.as_str())).await?;
    check!(
        others.is_empty(),
        "the deleted poller has no keys left: {others:?}"
    );
    Ok(())
}
