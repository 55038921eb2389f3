//! Conformance cases: `parked` — poison events and quarantined items, holds, retry and discard.

use watukuy_core::store::{AttemptRecord, FailureClass, FailureDetails, ParkReason};
use watukuy_core::store::{
    CommitBatch, Lease, OutboxRow, OutboxStatus, PKey, ParkedError, ParkedKind, ParkedQuery,
    ParkedRow, SerializedError, StatePatch, Store, ValidationIssue,
};

use super::fixtures::{
    NODE_A, T0, acquire, commit_events, event, invalid, key, key_b, key_other, leased,
    leased_after_zero_count, others_count_zero, owned_ids, pending, pending_ids, poison,
};
use crate::harness::{CaseError, CaseResult, Env};
use crate::{check, check_eq};

/// `list_parked` with an optional kind and limit.
async fn list(
    store: &dyn Store,
    key: &PKey,
    kind: Option<ParkedKind>,
    limit: Option<usize>,
) -> Result<Vec<ParkedRow>, CaseError> {
    let mut query = ParkedQuery::default();
    (query.kind, query.limit) = (kind, limit);
    Ok(store.list_parked(key, query).await?)
}

/// The ids of `list_parked` with an optional kind and limit.
async fn list_ids(
    store: &dyn Store,
    key: &PKey,
    kind: Option<ParkedKind>,
    limit: Option<usize>,
) -> Result<Vec<String>, CaseError> {
    Ok(list(store, key, kind, limit)
        .await?
        .into_iter()
        .map(|row| row.id)
        .collect())
}

/// `held_keys`, sorted (the contract leaves the order open).
async fn held(store: &dyn Store, key: &PKey) -> Result<Vec<String>, CaseError> {
    let mut keys = store.held_keys(key).await?;
    keys.sort();
    Ok(keys)
}

/// `row` with the failure details the dispatcher records when it parks an event.
fn with_details(mut row: ParkedRow, details: FailureDetails) -> ParkedRow {
    row.error.details = details;
    row
}

/// The details of an event parked after its attempts ran out: every field set, a timed attempt
/// log (the retried attempts with their `retry_at`), a handler version, a correlation id and
/// the JSON pointers redacted out of the parked copy.
fn exhausted_details(parked_at: i64) -> FailureDetails {
    let attempt = |n: u32, classification: FailureClass, retry_at: Option<i64>| AttemptRecord {
        attempt: n,
        started_at: Some(parked_at - 3_000 + i64::from(n) * 1_000),
        failed_at: Some(parked_at - 3_000 + i64::from(n) * 1_000 + 5),
        classification: Some(classification),
        retry_at,
        error: SerializedError::new("HandlerError", format!("failure {n}")),
    };
    FailureDetails {
        classification: Some(FailureClass::RetryAfter),
        park_reason: Some(ParkReason::AttemptsExhausted),
        attempt_log: Some(vec![
            attempt(1, FailureClass::Transient, Some(parked_at - 2_000)),
            attempt(2, FailureClass::Transient, Some(parked_at - 1_000)),
            attempt(3, FailureClass::RetryAfter, None),
        ]),
        handler_version: Some("orders-projector@1.4.2".to_owned()),
        correlation_id: Some("req-1".to_owned()),
        redacted: Some(vec![
            "/data/card/number".to_owned(),
            "/data/email".to_owned(),
        ]),
    }
}

/// The details of an event parked at once on a permanent failure: an attempt whose timing is
/// unknown (made before a restart), no correlation id, the whole payload redacted.
fn permanent_details() -> FailureDetails {
    FailureDetails {
        classification: Some(FailureClass::Permanent),
        park_reason: Some(ParkReason::Permanent),
        attempt_log: Some(vec![AttemptRecord {
            attempt: 1,
            started_at: None,
            failed_at: None,
            classification: None,
            retry_at: None,
            error: SerializedError::new("HandlerError", "no such customer"),
        }]),
        handler_version: Some("v1".to_owned()),
        correlation_id: None,
        redacted: Some(vec!["data".to_owned()]),
    }
}

/// `Store::park_event` contract 1 (and `Store::held_keys` contract 1): parking a poison row
/// removes the outbox row of its event and keeps the row exactly, history and failure details
/// included (classification, park reason, timed attempt log, handler version, correlation id,
/// redactions); `held_keys`
/// lists each hold key once; an invalid row without an event and without a hold key leaves the
/// outbox alone (even when its id equals a pending event's id) and holds nothing; the kind filter
/// separates them; parking an event that is no longer in the outbox is fine.
pub async fn park_event_removes_outbox_row_and_holds(env: Env) -> CaseResult {
    let store = env.store();
    let k = key();
    check!(held(store, &k).await?.is_empty(), "no holds on a fresh key");
    let lease = acquire(store, &k, NODE_A, T0).await?;
    let e1 = pending(&k, "evt-1", 1, "o1");
    let e2 = pending(&k, "evt-2", 2, "o2");
    let e3 = pending(&k, "evt-3", 3, "o1");
    let e4 = pending(&k, "evt-4", 4, "o4");
    commit_events(
        store,
        &k,
        &lease,
        vec![e1.clone(), e2.clone(), e3.clone(), e4.clone()],
        false,
    )
    .await?;

    let poisoned = with_details(
        poison(e1.event.clone(), Some("o1"), T0 + 1_000),
        exhausted_details(T0 + 1_000),
    );
    check!(
        poisoned
            .error
            .history
            .as_ref()
            .is_some_and(|h| h.len() == 2),
        "fixture: the poison row has a two-entry history"
    );
    store.park_event(&k, &lease, &poisoned).await?;
    check_eq!(
        pending_ids(store, &k).await?,
        owned_ids(&["evt-2", "evt-3", "evt-4"]),
        "parking evt-1 removed its outbox row and nothing else"
    );
    check_eq!(
        list(store, &k, None, None).await?,
        vec![poisoned.clone()],
        "the parked row round-trips, history and failure details included"
    );
    check_eq!(held(store, &k).await?, owned_ids(&["o1"]), "o1 is held");

    // An invalid row: no event, no hold. Its id equals evt-4's on purpose: parking must remove
    // the outbox row of `row.event`, never the row named `row.id`.
    let quarantined = invalid("evt-4", r#"{"id":"o9","total":"ten"}"#, T0 + 2_000);
    store.park_event(&k, &lease, &quarantined).await?;
    check_eq!(
        store.load_pending(&k, 10).await?,
        vec![e2.clone(), e3.clone(), e4.clone()],
        "a row without an event leaves the outbox alone"
    );
    check_eq!(
        held(store, &k).await?,
        owned_ids(&["o1"]),
        "a row without hold_key holds nothing"
    );
    check_eq!(store.counts(&k).await.map(|c| c.parked)?, 2);

    // A second poison row holding the same key: still one hold key.
    let poisoned_3 = with_details(
        poison(e3.event.clone(), Some("o1"), T0 + 3_000),
        permanent_details(),
    );
    store.park_event(&k, &lease, &poisoned_3).await?;
    check_eq!(
        held(store, &k).await?,
        owned_ids(&["o1"]),
        "each hold key is listed once"
    );
    check_eq!(
        store.load_pending(&k, 10).await?,
        vec![e2.clone(), e4.clone()]
    );

    // A poison row whose event already left the outbox, holding another key.
    store.ack_events(&k, &lease, &owned_ids(&["evt-2"])).await?;
    let poisoned_2 = poison(e2.event.clone(), Some("o2"), T0 + 4_000);
    store.park_event(&k, &lease, &poisoned_2).await?;
    check_eq!(
        store.load_pending(&k, 10).await?,
        vec![e4],
        "parking an event that is no longer pending is fine; evt-4 is still pending"
    );
    check_eq!(held(store, &k).await?, owned_ids(&["o1", "o2"]));

    check_eq!(
        list(store, &k, Some(ParkedKind::Poison), None).await?,
        vec![poisoned, poisoned_3, poisoned_2],
        "the poison filter lists only poison rows"
    );
    check_eq!(
        list(store, &k, Some(ParkedKind::Invalid), None).await?,
        vec![quarantined],
        "the invalid filter lists only invalid rows"
    );
    check_eq!(store.counts(&k).await.map(|c| c.parked)?, 4);
    for other in [key_b(), key_other()] {
        check!(
            held(store, &other).await?.is_empty(),
            "{other} holds nothing"
        );
    }
    Ok(())
}

/// `Store::list_parked` contract 1: rows come ordered by `parked_at`, then id (whatever the
/// order they were parked in, by `park_event` or by `commit_poll`), the kind filter keeps one
/// kind, and the limit (alone or with the filter; 0 gives none) is honoured.
pub async fn list_parked_filters_orders_limits(env: Env) -> CaseResult {
    let (store, k, lease) = leased(&env).await?;

    let p_b = poison(event(&k, "p-b", 2, "o2"), Some("o2"), T0 + 2_000);
    let p_a = poison(event(&k, "p-a", 1, "o1"), Some("o1"), T0 + 2_000);
    let p_c = poison(event(&k, "p-c", 3, "o3"), None, T0 + 500);
    let i_z = invalid("invalid:z", r#"{"id":"z"}"#, T0 + 1_000);
    let i_y = invalid("invalid:y", r#"{"id":"y"}"#, T0 + 3_000);

    store.park_event(&k, &lease, &p_b).await?;
    store.park_event(&k, &lease, &i_y).await?;
    let batch = CommitBatch::default()
        .state_patch(StatePatch {
            updated_at: Some(T0),
            ..StatePatch::default()
        })
        .parked(vec![p_a.clone(), i_z.clone()]);
    store.commit_poll(&k, &lease, &batch).await?;
    store.park_event(&k, &lease, &p_c).await?;

    check_eq!(
        list(store, &k, None, None).await?,
        vec![
            p_c.clone(),
            i_z.clone(),
            p_a.clone(),
            p_b.clone(),
            i_y.clone()
        ],
        "ordered by parked_at, ties by id, rows exactly as parked"
    );
    check_eq!(
        list_ids(store, &k, Some(ParkedKind::Poison), None).await?,
        owned_ids(&["p-c", "p-a", "p-b"]),
        "poison only, in order"
    );
    check_eq!(
        list_ids(store, &k, Some(ParkedKind::Invalid), None).await?,
        owned_ids(&["invalid:z", "invalid:y"]),
        "invalid only, in order"
    );
    check_eq!(
        list_ids(store, &k, None, Some(2)).await?,
        owned_ids(&["p-c", "invalid:z"]),
        "limit 2 keeps the two oldest"
    );
    check_eq!(
        list_ids(store, &k, Some(ParkedKind::Poison), Some(2)).await?,
        owned_ids(&["p-c", "p-a"]),
        "filter and limit together"
    );
    check_eq!(
        list_ids(store, &k, Some(ParkedKind::Invalid), Some(1)).await?,
        owned_ids(&["invalid:z"])
    );
    check_eq!(
        list_ids(store, &k, None, Some(100)).await?.len(),
        5,
        "a limit above the count gives every row"
    );
    check!(
        list(store, &k, None, Some(0)).await?.is_empty(),
        "limit 0 gives none"
    );
    check!(
        list(store, &k, Some(ParkedKind::Poison), Some(0))
            .await?
            .is_empty(),
        "limit 0 with a filter gives none"
    );
    for other in [key_b(), key_other()] {
        check!(
            list(store, &other, None, None).await?.is_empty(),
            "{other} has no parked rows"
        );
    }
    Ok(())
}

/// `Store::count_parked` contract 1: every kind counts; re-parking an id (by `park_event` or by
/// `commit_poll`) replaces the row instead of adding one.
pub async fn count_parked_counts_every_kind(env: Env) -> CaseResult {
    let (store, k, lease) = leased_after_zero_count(&env, |c| c.parked).await?;
    check_eq!(store.counts(&k).await.map(|c| c.parked)?, 0);

    let p1 = poison(event(&k, "evt-1", 1, "o1"), Some("o1"), T0 + 1_000);
    store.park_event(&k, &lease, &p1).await?;
    let i1 = invalid("invalid:1", r#"{"id":"o9"}"#, T0 + 2_000);
    commit_parked(store, &k, &lease, vec![i1.clone()]).await?;
    check_eq!(
        store.counts(&k).await.map(|c| c.parked)?,
        2,
        "a poison and an invalid row"
    );

    let p1_again = ParkedRow {
        attempts: 5,
        parked_at: T0 + 3_000,
        error: ParkedError {
            error: SerializedError::new("HandlerError", "fifth failure"),
            history: Some(vec![SerializedError::new("HandlerError", "fifth failure")]),
            issues: None,
            details: Default::default(),
        },
        ..p1
    };
    store.park_event(&k, &lease, &p1_again).await?;
    check_eq!(
        store.counts(&k).await.map(|c| c.parked)?,
        2,
        "re-parking the same id does not add a row"
    );

    let mut i1_again = i1;
    i1_again.parked_at = T0 + 4_000;
    i1_again.error.issues = Some(vec![
        ValidationIssue {
            message: "expected a number".to_owned(),
            path: Some(vec!["total".to_owned()]),
        },
        ValidationIssue {
            message: "required".to_owned(),
            path: Some(vec!["lines".to_owned(), "0".to_owned(), "qty".to_owned()]),
        },
    ]);
    commit_parked(store, &k, &lease, vec![i1_again.clone()]).await?;
    check_eq!(
        store.counts(&k).await.map(|c| c.parked)?,
        2,
        "re-committing the same id does not add a row"
    );

    check_eq!(
        list(store, &k, None, None).await?,
        vec![p1_again, i1_again],
        "both rows were replaced (attempts 5, new issues, new parked_at)"
    );
    others_count_zero(store, |c| c.parked).await
}

/// Commits a batch holding only parked rows.
async fn commit_parked(
    store: &dyn Store,
    key: &PKey,
    lease: &Lease,
    parked: Vec<ParkedRow>,
) -> CaseResult {
    let batch = CommitBatch::default()
        .state_patch(StatePatch {
            updated_at: Some(T0),
            ..StatePatch::default()
        })
        .parked(parked);
    store.commit_poll(key, lease, &batch).await?;
    Ok(())
}

/// `Store::retry_parked` contract 1: a poison row goes back to the outbox as exactly
/// `{ event_id, sequence: event.sequence, event (as parked), status Pending, attempts 0,
/// next_attempt_at None, last_error None, created_at: parked_at }` in its sequence place; the
/// parked row and its hold are gone; invalid rows and unknown ids are ignored; the count of moved
/// rows is returned; a second retry and an empty id list return 0.
pub async fn retry_parked_moves_poison_back(env: Env) -> CaseResult {
    let (store, k, lease) = leased(&env).await?;
    let e1 = pending(&k, "evt-1", 1, "o1");
    let e2 = pending(&k, "evt-2", 2, "o2");
    let e3 = pending(&k, "evt-3", 3, "o1");
    commit_events(
        store,
        &k,
        &lease,
        vec![e1.clone(), e2.clone(), e3.clone()],
        false,
    )
    .await?;

    // evt-1 fails twice and is parked; the parked event differs from the committed one (the
    // delivery attempt it died on), so the retried row must carry the parked event.
    let failure = SerializedError::new("HandlerError", "boom");
    for at in [T0 + 1_000, T0 + 2_000] {
        store
            .record_attempt(&k, &lease, "evt-1", &failure, Some(at))
            .await?;
    }
    let mut parked_event_1 = e1.event.clone();
    parked_event_1.attempt = 3;
    let p1 = poison(parked_event_1.clone(), Some("o1"), T0 + 5_000);
    store.park_event(&k, &lease, &p1).await?;
    let p2 = poison(e2.event.clone(), Some("o2"), T0 + 6_000);
    store.park_event(&k, &lease, &p2).await?;
    let quarantined = invalid("invalid:x", r#"{"id":"x"}"#, T0 + 7_000);
    store.park_event(&k, &lease, &quarantined).await?;
    check_eq!(
        pending_ids(store, &k).await?,
        owned_ids(&["evt-3"]),
        "fixture: only evt-3 pending"
    );
    check_eq!(
        held(store, &k).await?,
        owned_ids(&["o1", "o2"]),
        "fixture: o1 and o2 held"
    );

    let moved = store
        .resolve_parked(
            &k,
            &owned_ids(&["evt-1", "invalid:x", "unknown"]),
            watukuy_core::store::ParkedAction::Retry,
        )
        .await?;
    check_eq!(
        moved,
        1,
        "only the poison row moved; the invalid row and unknown id are ignored"
    );
    let retried = OutboxRow {
        event_id: "evt-1".into(),
        sequence: parked_event_1.sequence,
        event: parked_event_1,
        status: OutboxStatus::Pending,
        attempts: 0,
        next_attempt_at: None,
        last_error: None,
        created_at: T0 + 5_000,
    };
    check_eq!(
        store.load_pending(&k, 10).await?,
        vec![retried.clone(), e3.clone()],
        "exactly the documented row is back, in sequence order"
    );
    check_eq!(
        list(store, &k, None, None).await?,
        vec![p2, quarantined.clone()],
        "the retried row left parking; the invalid row stayed"
    );
    check_eq!(
        held(store, &k).await?,
        owned_ids(&["o2"]),
        "o1's hold is released"
    );

    check_eq!(
        store
            .resolve_parked(
                &k,
                &owned_ids(&["evt-1"]),
                watukuy_core::store::ParkedAction::Retry
            )
            .await?,
        0,
        "a second retry moves nothing"
    );
    check_eq!(
        store
            .resolve_parked(&k, &[], watukuy_core::store::ParkedAction::Retry)
            .await?,
        0,
        "an empty id list moves nothing"
    );
    check_eq!(
        store.load_pending(&k, 10).await?,
        vec![retried.clone(), e3.clone()],
        "nothing changed"
    );

    check_eq!(
        store
            .resolve_parked(
                &k,
                &owned_ids(&["evt-2"]),
                watukuy_core::store::ParkedAction::Retry
            )
            .await?,
        1
    );
    let retried_2 = OutboxRow {
        created_at: T0 + 6_000,
        ..e2
    };
    check_eq!(
        store.load_pending(&k, 10).await?,
        vec![retried, retried_2, e3],
        "evt-2 is back between evt-1 and evt-3"
    );
    check!(held(store, &k).await?.is_empty(), "no hold is left");
    check_eq!(
        list(store, &k, None, None).await?,
        vec![quarantined],
        "only the invalid row is parked"
    );
    check_eq!(
        store
            .resolve_parked(
                &key_b(),
                &owned_ids(&["evt-1", "evt-2"]),
                watukuy_core::store::ParkedAction::Retry
            )
            .await?,
        0,
        "another key has nothing to retry"
    );
    Ok(())
}

/// `Store::discard_parked` contract 1 (and `Store::held_keys` contract 1): rows of either kind
/// are deleted and the count of rows actually removed is returned (duplicate ids count once,
/// unknown and already-discarded ids not at all); a hold key disappears once no row holds it;
/// discarded events do not come back to the outbox, which is untouched.
pub async fn discard_parked_returns_count(env: Env) -> CaseResult {
    let (store, k, lease) = leased(&env).await?;
    let e4 = pending(&k, "evt-4", 4, "o4");
    commit_events(
        store,
        &k,
        &lease,
        vec![
            pending(&k, "evt-1", 1, "o1"),
            pending(&k, "evt-2", 2, "o2"),
            pending(&k, "evt-3", 3, "o2"),
            e4.clone(),
        ],
        false,
    )
    .await?;
    for (id, sequence, hold) in [("evt-1", 1, "o1"), ("evt-2", 2, "o2"), ("evt-3", 3, "o2")] {
        let row = poison(
            event(&k, id, sequence, hold),
            Some(hold),
            T0 + sequence * 1_000,
        );
        store.park_event(&k, &lease, &row).await?;
    }
    let quarantined = invalid("invalid:1", r#"{"id":"o9"}"#, T0 + 10_000);
    store.park_event(&k, &lease, &quarantined).await?;
    check_eq!(
        store.counts(&k).await.map(|c| c.parked)?,
        4,
        "fixture: four parked rows"
    );
    check_eq!(
        held(store, &k).await?,
        owned_ids(&["o1", "o2"]),
        "fixture: o1 and o2 held"
    );

    check_eq!(
        store
            .resolve_parked(
                &k,
                &owned_ids(&["evt-2", "evt-2", "unknown"]),
                watukuy_core::store::ParkedAction::Discard
            )
            .await?,
        1,
        "a duplicate id counts once, an unknown id not at all"
    );
    check_eq!(store.counts(&k).await.map(|c| c.parked)?, 3);
    check_eq!(
        held(store, &k).await?,
        owned_ids(&["o1", "o2"]),
        "o2 is still held by evt-3"
    );

    check_eq!(
        store
            .resolve_parked(
                &k,
                &owned_ids(&["evt-3", "invalid:1"]),
                watukuy_core::store::ParkedAction::Discard
            )
            .await?,
        2,
        "both kinds are discarded"
    );
    check_eq!(held(store, &k).await?, owned_ids(&["o1"]), "o2 is released");
    check_eq!(
        list_ids(store, &k, None, None).await?,
        owned_ids(&["evt-1"])
    );

    check_eq!(
        store
            .resolve_parked(
                &k,
                &owned_ids(&["evt-3"]),
                watukuy_core::store::ParkedAction::Discard
            )
            .await?,
        0,
        "discarding again removes nothing"
    );
    check_eq!(
        store
            .resolve_parked(&k, &[], watukuy_core::store::ParkedAction::Discard)
            .await?,
        0,
        "an empty id list removes nothing"
    );

    check_eq!(
        store
            .resolve_parked(
                &k,
                &owned_ids(&["evt-1", "evt-1"]),
                watukuy_core::store::ParkedAction::Discard
            )
            .await?,
        1
    );
    check_eq!(store.counts(&k).await.map(|c| c.parked)?, 0);
    check!(held(store, &k).await?.is_empty(), "no hold is left");
    check_eq!(
        store.load_pending(&k, 10).await?,
        vec![e4],
        "discarded events do not return to the outbox; evt-4 is untouched"
    );
    check_eq!(
        store
            .resolve_parked(
                &key_other(),
                &owned_ids(&["evt-1"]),
                watukuy_core::store::ParkedAction::Discard
            )
            .await?,
        0,
        "another key has nothing to discard"
    );
    Ok(())
}
