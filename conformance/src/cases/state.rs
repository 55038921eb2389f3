//! Conformance cases: `state`: persisted poller state, patches, key
//! listing and the unfenced admin deletes.

use watukuy_core::{
    Lane,
    store::{
        Circuit, CommitBatch, EventCounts, LaneCursor, Lanes, PKey, PollSummary, PollerState,
        RateLimitInfo, RateLimitSource, ScheduleState, SerializedError, StatePatch, Store,
        Validator,
    },
};

use super::fixtures::{
    NODE_A, NODE_B, Observation, T0, acquire, event, invalid, item, key, key_b, key_other, leased,
    observe, pending, poison, progress, unleased,
};
use crate::harness::{CaseError, CaseResult, Env};
use crate::{check, check_eq};

/// The URL hash whose validator the state cases seed and watch.
const URL: &str = "url-1";

/// A lane cursor holding only a serialized cursor.
fn cursor(text: &str) -> LaneCursor {
    LaneCursor {
        cursor: Some(text.to_owned()),
        ..LaneCursor::default()
    }
}

/// A schedule with every field set, nested JSON included.
fn full_schedule() -> ScheduleState {
    ScheduleState {
        next_due_at: Some(T0 + 60_000),
        interval_ms: Some(45_000),
        consecutive_failures: 3,
        circuit: Circuit::HalfOpen,
        circuit_opened_at: Some(T0 - 120_000),
        throttled_until: Some(T0 + 90_000),
        rate_limit: Some(RateLimitInfo {
            limit: Some(100),
            remaining: Some(0),
            reset_at: Some(T0 + 30_000),
            policy: Some(r#""default";q=100;w=60"#.to_owned()),
            source: RateLimitSource::Ietf,
        }),
        last_poll_at: Some(T0 - 1_000),
        last_poll: Some(PollSummary {
            lane: Lane::Reconcile,
            started_at: T0 - 4_000,
            duration_ms: 3_000,
            pages: 4,
            items: 350,
            events: EventCounts {
                created: 7,
                updated: 11,
                deleted: 2,
            },
            not_modified: true,
            truncated: true,
            quarantined: 0,
        }),
        last_error: Some(SerializedError {
            name: "HttpError".to_owned(),
            message: "GET https://api.example.com/orders responded 503".to_owned(),
            code: Some("HTTP".to_owned()),
            status: Some(503),
            cause: Some(Box::new(SerializedError {
                name: "Error".to_owned(),
                message: "upstream unavailable: \"pool\" exhausted — ünïcödé ✓".to_owned(),
                code: Some("UPSTREAM".to_owned()),
                status: None,
                cause: Some(Box::new(SerializedError::new("Error", "connection reset"))),
            })),
        }),
    }
}

/// A patch that sets every field of the state: all four lanes, each lane field set on at least
/// one of them (the backfill lane has them all).
fn full_patch(updated_at: i64) -> StatePatch {
    StatePatch {
        lanes: Some(Lanes {
            live: Some(LaneCursor {
                cursor: Some(
                    concat!(
                        r#"{"value":"2026-01-01T00:00:00.000Z","tieBreak":"o-17","#,
                        r#""n":12345678901234567890,"u":"ü€😀\u0000"}"#
                    )
                    .to_owned(),
                ),
                target: None,
                done: Some(false),
                last_run_at: Some(T0 - 2_000),
                force: Some(false),
                failures: None,
                retry_at: None,
                suspects: None,
            }),
            reconcile: Some(LaneCursor {
                cursor: Some(r#"{"page":3,"nested":{"a":[1,2,{"b":null}],"c":true}}"#.to_owned()),
                target: None,
                done: Some(true),
                last_run_at: Some(T0 - 3_600_000),
                force: None,
                failures: Some(2),
                retry_at: Some(T0 + 4_000),
                suspects: Some(vec!["o-9".to_owned(), "o-10 \u{e9}\u{1f600}".to_owned()]),
            }),
            backfill: Some(LaneCursor {
                cursor: Some(r#"{"since":"2025-01-01"}"#.to_owned()),
                target: Some(r#"{"since":"2025-12-31"}"#.to_owned()),
                done: Some(false),
                last_run_at: Some(T0 - 60_000),
                force: Some(true),
                failures: Some(0),
                retry_at: Some(T0),
                suspects: None,
            }),
            replay: Some(LaneCursor {
                cursor: Some("42".to_owned()),
                target: Some("100".to_owned()),
                done: None,
                last_run_at: None,
                force: None,
                failures: None,
                retry_at: None,
                suspects: None,
            }),
        }),
        schedule: Some(full_schedule()),
        paused: Some(true),
        schema_version: Some(4),
        sequence: Some(42),
        updated_at: Some(updated_at),
    }
}

/// Fails unless `load_state(key)` is exactly `expected`.
async fn expect_state(
    store: &dyn Store,
    key: &PKey,
    expected: Option<&PollerState>,
    when: &str,
) -> CaseResult {
    check_eq!(
        store.load_state(key).await?.as_ref(),
        expected,
        "load_state({key}) {when}"
    );
    Ok(())
}

/// `list_keys(poller)`, sorted (the order is unspecified).
async fn sorted_keys(store: &dyn Store, poller: Option<&str>) -> Result<Vec<PKey>, CaseError> {
    let mut keys = store.list_keys(poller).await?;
    keys.sort();
    Ok(keys)
}

/// Gives `key` something of every kind: state, node-a's lease, items `i1`/`i2`, pending `e1`,
/// parked poison `e2` (holding `i2`) and an invalid row, a validator, and (log-capable stores)
/// log entries for `e1` and `e2`. Fails unless all of it reads back.
async fn seed_everything(store: &dyn Store, key: &PKey) -> Result<Observation, CaseError> {
    let log = store.capabilities().log;
    let lease = acquire(store, key, NODE_A, T0).await?;
    let batch = CommitBatch::default()
        .state_patch(StatePatch {
            lanes: Some(Lanes {
                live: Some(cursor(r#"{"page":2}"#)),
                ..Lanes::default()
            }),
            schema_version: Some(1),
            sequence: Some(2),
            updated_at: Some(T0),
            ..StatePatch::default()
        })
        .upserts(vec![item("i1", "h1"), item("i2", "h2")])
        .events(vec![
            pending(key, "e1", 1, "i1"),
            pending(key, "e2", 2, "i2"),
        ])
        .log(log)
        .parked(vec![invalid(
            "invalid:x",
            r#"{"id":"x","total":"NaN"}"#,
            T0,
        )]);
    store.commit_poll(key, &lease, &batch).await?;
    store
        .park_event(
            key,
            &lease,
            &poison(event(key, "e2", 2, "i2"), Some("i2"), T0 + 1_000),
        )
        .await?;
    let validator = Validator {
        etag: Some("W/\"abc\"".to_owned()),
        last_modified: Some("Thu, 01 Jan 2026 00:00:00 GMT".to_owned()),
        stored_at: T0,
    };
    super::fixtures::write_validator(store, key, &lease, URL, &validator).await?;

    let seen = observe(store, key, &[URL]).await?;
    check!(seen.state.is_some(), "seeding {key}: no state");
    check_eq!(seen.lease, Some(lease), "seeding {key}: lease");
    check_eq!(seen.item_count, 2, "seeding {key}: items");
    check_eq!(seen.pending_count, 1, "seeding {key}: pending rows");
    check_eq!(seen.parked_count, 2, "seeding {key}: parked rows");
    check_eq!(
        seen.held_keys,
        vec!["i2".to_owned()],
        "seeding {key}: held keys"
    );
    check_eq!(
        seen.validators,
        vec![(URL.to_owned(), Some(validator))],
        "seeding {key}: validator"
    );
    if let Some(entries) = &seen.log {
        check_eq!(entries.len(), 2, "seeding {key}: log entries");
    }
    Ok(seen)
}

/// `Store::load_state` contract 1: `None` for a key never saved, also after a lease was
/// acquired, renewed and released on it; other keys stay `None` too.
pub async fn load_state_is_none_for_unknown_key(env: Env) -> CaseResult {
    let (store, key) = unleased(&env);
    expect_state(store, &key, None, "before anything").await?;
    let lease = acquire(store, &key, NODE_A, T0).await?;
    expect_state(store, &key, None, "after acquiring a lease").await?;
    check!(
        store
            .renew_lease(&key, &lease, lease.expires_at - T0, T0 + 1_000)
            .await?,
        "renew_lease of the current lease returned false"
    );
    expect_state(store, &key, None, "after renewing the lease").await?;
    store.release_lease(&key, &lease).await?;
    expect_state(store, &key, None, "after releasing the lease").await?;
    expect_state(store, &key_b(), None, "of another partition").await?;
    expect_state(store, &key_other(), None, "of another poller").await
}

/// `Store::save_state` contract 1: a state with every field set (all four lanes with target,
/// done, force and last_run_at; a schedule with every field including the rate limit with its
/// policy, the last poll summary with counts and a last error with nested causes; nested and
/// unicode JSON in cursors) round-trips exactly, and `created_at` becomes the first patch's
/// `updated_at`; a later save keeps `created_at`.
pub async fn save_state_round_trips_every_field(env: Env) -> CaseResult {
    let (store, key, lease) = leased(&env).await?;
    let first_at = T0 + 5_000;
    let patch = full_patch(first_at);
    store.save_state(&key, &lease, &patch).await?;
    let expected = PollerState {
        lanes: patch.lanes.clone().unwrap_or_default(),
        schedule: full_schedule(),
        paused: true,
        schema_version: Some(4),
        sequence: 42,
        created_at: first_at,
        updated_at: first_at,
    };
    expect_state(store, &key, Some(&expected), "after saving every field").await?;
    // Reading twice gives the same value (no consuming or aliasing reads).
    expect_state(store, &key, Some(&expected), "read a second time").await?;

    let later = StatePatch {
        updated_at: Some(first_at + 1_000),
        ..StatePatch::default()
    };
    store.save_state(&key, &lease, &later).await?;
    let expected = PollerState {
        updated_at: first_at + 1_000,
        ..expected
    };
    expect_state(store, &key, Some(&expected), "after a second save").await
}

/// `Store::save_state_unfenced` contract 1: on a new key an unfenced save creates the zero state
/// with `created_at = patch.updated_at` plus the patch, and creates no lease (the key's first
/// acquisition still gets epoch 1).
pub async fn unfenced_save_creates_zero_state(env: Env) -> CaseResult {
    let (store, key) = unleased(&env);
    let at = T0 + 1_000;
    store
        .save_state_unfenced(
            &key,
            &StatePatch {
                paused: Some(true),
                updated_at: Some(at),
                ..StatePatch::default()
            },
        )
        .await?;
    let expected = PollerState {
        paused: true,
        ..PollerState::zero(at)
    };
    expect_state(store, &key, Some(&expected), "after an unfenced save").await?;
    check_eq!(
        store.get_lease(&key).await?,
        None,
        "an unfenced save created a lease"
    );
    let lease = acquire(store, &key, NODE_A, at).await?;
    check_eq!(
        lease.epoch,
        1,
        "first acquisition after an unfenced save (the save must not touch the lease)"
    );
    expect_state(store, &key, Some(&expected), "after acquiring a lease").await
}

/// `Store::save_state_unfenced` contract 2: a patch without `updated_at` creates the state with
/// `created_at = 0` (and `updated_at = 0`).
pub async fn unfenced_save_without_updated_at_uses_zero(env: Env) -> CaseResult {
    let (store, key) = unleased(&env);
    let patch = StatePatch {
        paused: Some(true),
        sequence: Some(3),
        ..StatePatch::default()
    };
    store.save_state_unfenced(&key, &patch).await?;
    let expected = PollerState {
        paused: true,
        sequence: 3,
        ..PollerState::zero(0)
    };
    expect_state(
        store,
        &key,
        Some(&expected),
        "after an unfenced save without updated_at",
    )
    .await
}

/// `Store::save_state_unfenced` contract 3: patches (fenced and unfenced) replace top-level
/// fields wholesale and keep `created_at`: a `lanes` patch drops the backfill lane it does not
/// mention, a `schedule` patch drops the schedule's old fields, untouched fields are kept, and an
/// unfenced patch keeps `sequence`, `created_at` and the lease.
pub async fn patches_replace_top_level_fields(env: Env) -> CaseResult {
    let (store, key, lease) = leased(&env).await?;
    let schedule = full_schedule();
    let first = StatePatch {
        lanes: Some(Lanes {
            live: Some(cursor(r#"{"value":"a"}"#)),
            backfill: Some(LaneCursor {
                cursor: Some(r#"{"since":"2025-01-01"}"#.to_owned()),
                target: Some(r#"{"since":"2025-06-01"}"#.to_owned()),
                done: Some(false),
                last_run_at: None,
                force: Some(true),
                failures: None,
                retry_at: None,
                suspects: None,
            }),
            ..Lanes::default()
        }),
        schedule: Some(schedule.clone()),
        schema_version: Some(2),
        sequence: Some(10),
        updated_at: Some(T0),
        ..StatePatch::default()
    };
    store.save_state(&key, &lease, &first).await?;
    let mut expected = PollerState {
        lanes: first.lanes.clone().unwrap_or_default(),
        schedule,
        paused: false,
        schema_version: Some(2),
        sequence: 10,
        created_at: T0,
        updated_at: T0,
    };
    expect_state(store, &key, Some(&expected), "after the first patch").await?;

    // `lanes` is replaced wholesale: the backfill lane disappears.
    let live_only = Lanes {
        live: Some(cursor(r#"{"value":"b"}"#)),
        ..Lanes::default()
    };
    let second = StatePatch {
        lanes: Some(live_only.clone()),
        updated_at: Some(T0 + 1_000),
        ..StatePatch::default()
    };
    store.save_state(&key, &lease, &second).await?;
    expected.lanes = live_only;
    expected.updated_at = T0 + 1_000;
    expect_state(store, &key, Some(&expected), "after replacing the lanes").await?;
    let backfill = store.load_state(&key).await?.and_then(|s| s.lanes.backfill);
    check_eq!(backfill, None, "the backfill lane survived a lanes patch");

    // `schedule` is replaced wholesale too: no deep merge keeps the old last_error.
    let schedule = ScheduleState {
        next_due_at: Some(T0 + 9_000),
        ..ScheduleState::default()
    };
    let third = StatePatch {
        schedule: Some(schedule.clone()),
        sequence: Some(11),
        updated_at: Some(T0 + 2_000),
        ..StatePatch::default()
    };
    store.save_state(&key, &lease, &third).await?;
    expected.schedule = schedule;
    expected.sequence = 11;
    expected.updated_at = T0 + 2_000;
    expect_state(store, &key, Some(&expected), "after replacing the schedule").await?;

    // An unfenced patch keeps sequence, created_at and everything it does not set.
    let pause = StatePatch {
        paused: Some(true),
        updated_at: Some(T0 + 3_000),
        ..StatePatch::default()
    };
    store.save_state_unfenced(&key, &pause).await?;
    expected.paused = true;
    expected.updated_at = T0 + 3_000;
    expect_state(store, &key, Some(&expected), "after an unfenced pause").await?;

    // Without updated_at, updated_at (and created_at) stay.
    let resume = StatePatch {
        paused: Some(false),
        ..StatePatch::default()
    };
    store.save_state_unfenced(&key, &resume).await?;
    expected.paused = false;
    expect_state(store, &key, Some(&expected), "after an unfenced resume").await?;
    check_eq!(
        store.get_lease(&key).await?,
        Some(lease),
        "unfenced patches touched the lease"
    );
    Ok(())
}

/// `Store::list_keys` contract 1: keys created by lease acquisition and by an unfenced save are
/// listed once each (compared sorted: the order is unspecified); reading an unknown key does not
/// list it; the poller filter matches the name exactly; an unknown poller gives an empty list.
pub async fn list_keys_filters_by_poller(env: Env) -> CaseResult {
    let store = env.store();
    check_eq!(
        sorted_keys(store, None).await?,
        Vec::<PKey>::new(),
        "list_keys of a fresh store"
    );
    // key(): a lease only. key_b(): an unfenced save only. key_other(): lease and a commit.
    acquire(store, &key(), NODE_A, T0).await?;
    store
        .save_state_unfenced(
            &key_b(),
            &StatePatch {
                paused: Some(true),
                updated_at: Some(T0),
                ..StatePatch::default()
            },
        )
        .await?;
    let other = acquire(store, &key_other(), NODE_B, T0).await?;
    store
        .commit_poll(
            &key_other(),
            &other,
            &CommitBatch::default()
                .state_patch(progress(1, T0))
                .upserts(vec![item("i1", "h1")]),
        )
        .await?;
    // Reads of a key never written must not make it known.
    let ghost = PKey::new("ghost", "");
    store.load_state(&ghost).await?;
    store.get_lease(&ghost).await?;
    store.counts(&ghost).await.map(|c| c.items)?;

    let mut all = vec![key(), key_b(), key_other()];
    all.sort();
    check_eq!(sorted_keys(store, None).await?, all, "list_keys(None)");
    let mut orders = vec![key(), key_b()];
    orders.sort();
    check_eq!(
        sorted_keys(store, Some("orders")).await?,
        orders,
        "list_keys(Some(\"orders\"))"
    );
    check_eq!(
        sorted_keys(store, Some("invoices")).await?,
        vec![key_other()],
        "list_keys(Some(\"invoices\"))"
    );
    for unknown in ["nope", "order", "ORDERS", "ghost"] {
        check_eq!(
            sorted_keys(store, Some(unknown)).await?,
            Vec::<PKey>::new(),
            "list_keys(Some({unknown:?}))"
        );
    }
    Ok(())
}

/// `Store::delete_key` contract 1: deleting a key removes its state, lease, items, outbox,
/// parked rows (and holds), validators and log; the other keys (another partition, another
/// poller) are intact; deleting again is fine; the key leaves `list_keys`.
pub async fn delete_key_removes_everything(env: Env) -> CaseResult {
    let (store, key) = unleased(&env);
    let log = store.capabilities().log;
    seed_everything(store, &key).await?;
    let b_before = seed_everything(store, &key_b()).await?;
    let other_before = seed_everything(store, &key_other()).await?;

    store.delete_key(&key).await?;
    let empty = Observation::empty(log, &[URL]);
    check_eq!(
        observe(store, &key, &[URL]).await?,
        empty,
        "the deleted key still shows data"
    );
    check_eq!(
        observe(store, &key_b(), &[URL]).await?,
        b_before,
        "delete_key({key}) changed another partition"
    );
    check_eq!(
        observe(store, &key_other(), &[URL]).await?,
        other_before,
        "delete_key({key}) changed another poller"
    );
    let mut remaining = vec![key_b(), key_other()];
    remaining.sort();
    check_eq!(
        sorted_keys(store, None).await?,
        remaining,
        "list_keys after delete_key"
    );
    check_eq!(
        sorted_keys(store, Some("orders")).await?,
        vec![key_b()],
        "list_keys(Some(\"orders\")) after delete_key"
    );

    store.delete_key(&key).await?;
    check_eq!(
        observe(store, &key, &[URL]).await?,
        empty,
        "the key after deleting it twice"
    );
    check_eq!(
        sorted_keys(store, None).await?,
        remaining,
        "list_keys after deleting twice"
    );
    store.delete_key(&PKey::new("ghost", "")).await?;
    check_eq!(
        sorted_keys(store, None).await?,
        remaining,
        "list_keys after deleting an unknown key"
    );
    Ok(())
}

/// `Store::clear_items` contract 1: clearing drops the key's item snapshot and nothing else:
/// outbox, parked rows, holds, validators, log, state and lease are untouched, other keys keep
/// their items, and clearing an unknown key is fine (and does not make it known).
pub async fn clear_items_drops_snapshot_only(env: Env) -> CaseResult {
    let (store, key) = unleased(&env);
    let before = seed_everything(store, &key).await?;
    let b_before = seed_everything(store, &key_b()).await?;

    store.clear_items(&key).await?;
    let expected = Observation {
        identities: Vec::new(),
        items: Vec::new(),
        item_count: 0,
        ..before
    };
    check_eq!(
        observe(store, &key, &[URL]).await?,
        expected,
        "clear_items changed more than the snapshot"
    );
    check_eq!(
        observe(store, &key_b(), &[URL]).await?,
        b_before,
        "clear_items({key}) changed another partition"
    );

    let keys = sorted_keys(store, None).await?;
    let ghost = PKey::new("ghost", "");
    store.clear_items(&ghost).await?;
    check_eq!(
        observe(store, &ghost, &[URL]).await?,
        Observation::empty(store.capabilities().log, &[URL]),
        "clearing an unknown key"
    );
    check_eq!(
        sorted_keys(store, None).await?,
        keys,
        "clearing an unknown key changed list_keys"
    );
    Ok(())
}
