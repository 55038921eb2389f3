//! Conformance cases: `outbox` — pending rows, acks and recorded attempts.

use watukuy_core::store::{OutboxRow, OutboxStatus, ParkedAction, SerializedError};

use super::fixtures::{
    T0, commit_events, event, key_b, key_other, leased, leased_after_zero_count, others_count_zero,
    owned_ids, pending, pending_ids, poison,
};
use crate::harness::{CaseError, CaseResult, Env};
use crate::{check, check_eq};

/// A year in milliseconds: "far in the future" for `next_attempt_at`.
const YEAR_MS: i64 = 365 * 24 * 60 * 60 * 1_000;

/// `Store::load_pending` contract 1: rows come in sequence order whatever the insertion order
/// (and whatever the order of their ids and creation times), `limit` is honoured (0 gives none),
/// rows whose `next_attempt_at` lies far in the future are still returned, and another key sees
/// none of them.
pub async fn load_pending_orders_by_sequence(env: Env) -> CaseResult {
    let (store, k, lease) = leased(&env).await?;

    // Ids sort opposite to sequences, creation times run backwards, and the rows arrive in two
    // batches in scrambled order.
    let s1 = OutboxRow::pending(event(&k, "evt-d", 1, "o1"), T0 + 4_000);
    let s2 = OutboxRow {
        next_attempt_at: Some(T0 + YEAR_MS),
        ..OutboxRow::pending(event(&k, "evt-c", 2, "o2"), T0 + 3_000)
    };
    let s3 = OutboxRow::pending(event(&k, "evt-b", 3, "o3"), T0 + 2_000);
    let s4 = OutboxRow::pending(event(&k, "evt-a", 4, "o4"), T0 + 1_000);
    commit_events(
        store,
        &k,
        &lease,
        vec![s3.clone(), s1.clone(), s4.clone()],
        false,
    )
    .await?;
    commit_events(store, &k, &lease, vec![s2.clone()], false).await?;

    // A recorded attempt pushes s3's next attempt a year out too.
    let failure = SerializedError::new("HandlerError", "try again next year");
    store
        .record_attempt(&k, &lease, "evt-b", &failure, Some(T0 + YEAR_MS))
        .await?;
    let s3 = OutboxRow {
        attempts: 1,
        last_error: Some(failure),
        next_attempt_at: Some(T0 + YEAR_MS),
        ..s3
    };

    let all = vec![s1.clone(), s2.clone(), s3.clone(), s4.clone()];
    check_eq!(
        store.load_pending(&k, 100).await?,
        all,
        "every pending row in sequence order, future next_attempt_at included"
    );
    check_eq!(
        store.load_pending(&k, 4).await?,
        all,
        "a limit equal to the count"
    );
    check_eq!(
        store.load_pending(&k, 2).await?,
        vec![s1.clone(), s2],
        "limit 2 gives the two lowest sequences"
    );
    check_eq!(store.load_pending(&k, 1).await?, vec![s1], "limit 1");
    check!(
        store.load_pending(&k, 0).await?.is_empty(),
        "limit 0 gives none"
    );
    for other in [key_b(), key_other()] {
        check!(
            store.load_pending(&other, 100).await?.is_empty(),
            "{other} has no pending rows"
        );
    }
    Ok(())
}

/// `Store::load_pending_with_holds` contract 1: the rows equal `load_pending`'s and the hold keys
/// equal `held_keys`'s, whatever the limit, before and after parking with and without a hold key,
/// after the hold is released, with nothing pending, and per key.
pub async fn load_pending_with_holds_reads_both(env: Env) -> CaseResult {
    let (store, k, lease) = leased(&env).await?;
    let rows = vec![
        pending(&k, "evt-1", 1, "o1"),
        pending(&k, "evt-2", 2, "o2"),
        pending(&k, "evt-3", 3, "o1"),
        pending(&k, "evt-4", 4, "o4"),
    ];
    commit_events(store, &k, &lease, rows.clone(), false).await?;
    let both = |limit: usize| {
        let k = k.clone();
        async move {
            let (rows, mut held) = store.load_pending_with_holds(&k, limit).await?;
            held.sort();
            let mut expected_held = store.held_keys(&k).await?;
            expected_held.sort();
            check_eq!(
                rows,
                store.load_pending(&k, limit).await?,
                "the rows of load_pending, limit {limit}"
            );
            check_eq!(held, expected_held, "the keys of held_keys, limit {limit}");
            Ok::<_, CaseError>(held)
        }
    };
    for limit in [0, 1, 3, 4, 100] {
        check!(
            both(limit).await?.is_empty(),
            "nothing is held yet (limit {limit})"
        );
    }
    for (row, hold) in [(0, Some("o1")), (1, None), (3, Some("o4"))] {
        let parked = poison(rows[row].event.clone(), hold, T0 + 1_000);
        store.park_event(&k, &lease, &parked).await?;
    }
    for limit in [0, 1, 100] {
        check_eq!(
            both(limit).await?,
            owned_ids(&["o1", "o4"]),
            "limit {limit}"
        );
    }
    store.ack_events(&k, &lease, &owned_ids(&["evt-3"])).await?;
    check_eq!(
        both(100).await?,
        owned_ids(&["o1", "o4"]),
        "hold keys are read with nothing pending"
    );
    let released = store
        .resolve_parked(&k, &owned_ids(&["evt-1"]), ParkedAction::Retry)
        .await?;
    check_eq!(released, 1, "one row retried");
    check_eq!(
        both(100).await?,
        owned_ids(&["o4"]),
        "retrying evt-1 released o1"
    );
    for other in [key_b(), key_other()] {
        let (rows, held) = store.load_pending_with_holds(&other, 100).await?;
        check!(
            rows.is_empty() && held.is_empty(),
            "{other} sees none of it"
        );
    }
    Ok(())
}

/// `Store::count_pending` contract 1: only pending rows count (rows committed with status
/// `Delivered` do not), acks decrement the count, unknown and repeated acks do not, and another
/// key counts 0.
pub async fn count_pending_counts_pending_only(env: Env) -> CaseResult {
    let (store, k, lease) = leased_after_zero_count(&env, |c| c.pending).await?;

    let delivered = OutboxRow {
        status: OutboxStatus::Delivered,
        ..pending(&k, "evt-4", 4, "o4")
    };
    commit_events(
        store,
        &k,
        &lease,
        vec![
            pending(&k, "evt-1", 1, "o1"),
            pending(&k, "evt-2", 2, "o2"),
            pending(&k, "evt-3", 3, "o3"),
            delivered,
        ],
        false,
    )
    .await?;
    check_eq!(
        store.counts(&k).await.map(|c| c.pending)?,
        3,
        "the delivered row is not counted"
    );
    check_eq!(
        pending_ids(store, &k).await?,
        owned_ids(&["evt-1", "evt-2", "evt-3"]),
        "the delivered row is not pending"
    );

    store.ack_events(&k, &lease, &owned_ids(&["evt-1"])).await?;
    check_eq!(
        store.counts(&k).await.map(|c| c.pending)?,
        2,
        "an ack decrements the count"
    );
    store
        .ack_events(&k, &lease, &owned_ids(&["evt-1", "unknown", "evt-4"]))
        .await?;
    check_eq!(
        store.counts(&k).await.map(|c| c.pending)?,
        2,
        "acking an acked, an unknown and a delivered id changes nothing"
    );
    store
        .ack_events(&k, &lease, &owned_ids(&["evt-2", "evt-3"]))
        .await?;
    check_eq!(store.counts(&k).await.map(|c| c.pending)?, 0);
    others_count_zero(store, |c| c.pending).await
}

/// `Store::ack_events` contract 1: acked rows leave the outbox, the others stay exactly as they
/// were; unknown ids, already-acked ids, repeated ids and an empty list are no-ops.
pub async fn ack_removes_rows_ignores_unknown(env: Env) -> CaseResult {
    let (store, k, lease) = leased(&env).await?;
    let e1 = pending(&k, "evt-1", 1, "o1");
    let e2 = pending(&k, "evt-2", 2, "o2");
    let e3 = pending(&k, "evt-3", 3, "o3");
    commit_events(store, &k, &lease, vec![e1.clone(), e2, e3.clone()], false).await?;

    store.ack_events(&k, &lease, &[]).await?;
    check_eq!(
        store.counts(&k).await.map(|c| c.pending)?,
        3,
        "an empty ack list is a no-op"
    );

    store
        .ack_events(&k, &lease, &owned_ids(&["evt-2", "unknown"]))
        .await?;
    check_eq!(
        store.load_pending(&k, 10).await?,
        vec![e1.clone(), e3.clone()],
        "evt-2 is gone, the unknown id was ignored, the other rows are unchanged"
    );

    store
        .ack_events(&k, &lease, &owned_ids(&["evt-2", "also-unknown"]))
        .await?;
    check_eq!(
        store.load_pending(&k, 10).await?,
        vec![e1, e3],
        "acking an acked id again is a no-op"
    );

    store
        .ack_events(&k, &lease, &owned_ids(&["evt-3", "evt-1", "evt-3"]))
        .await?;
    check!(
        store.load_pending(&k, 10).await?.is_empty(),
        "every row acked (repeated ids are fine)"
    );
    check_eq!(store.counts(&k).await.map(|c| c.pending)?, 0);
    Ok(())
}

/// `Store::record_attempt` contract 1: each call adds one attempt and stores the error (with its
/// nested cause) and `next_attempt_at`, which may be `None`; nothing else of the row changes,
/// other rows are untouched, and an unknown id is a no-op that creates no row.
pub async fn record_attempt_updates_row(env: Env) -> CaseResult {
    let (store, k, lease) = leased(&env).await?;
    let e1 = pending(&k, "evt-1", 1, "o1");
    let e2 = pending(&k, "evt-2", 2, "o2");
    commit_events(store, &k, &lease, vec![e1.clone(), e2.clone()], false).await?;

    let first = SerializedError::new("HandlerError", "first failure");
    store
        .record_attempt(&k, &lease, "evt-1", &first, Some(T0 + 1_000))
        .await?;
    let after_first = OutboxRow {
        attempts: 1,
        last_error: Some(first),
        next_attempt_at: Some(T0 + 1_000),
        ..e1.clone()
    };
    check_eq!(
        store.load_pending(&k, 10).await?,
        vec![after_first.clone(), e2.clone()],
        "attempts 1, the error and next_attempt_at recorded; evt-2 untouched"
    );

    let mut second = SerializedError::new("HttpError", "POST https://sink.example/x responded 503")
        .with_code("HTTP");
    second.status = Some(503);
    second.cause = Some(Box::new(SerializedError::new(
        "Error",
        "upstream unavailable",
    )));
    store
        .record_attempt(&k, &lease, "evt-1", &second, None)
        .await?;
    let after_second = OutboxRow {
        attempts: 2,
        last_error: Some(second),
        next_attempt_at: None,
        ..e1
    };
    check_eq!(
        store.load_pending(&k, 10).await?,
        vec![after_second.clone(), e2.clone()],
        "attempts 2, the new error replaces the old one, next_attempt_at cleared to None"
    );

    store
        .record_attempt(
            &k,
            &lease,
            "unknown",
            &SerializedError::new("HandlerError", "nobody"),
            Some(T0),
        )
        .await?;
    check_eq!(
        store.load_pending(&k, 10).await?,
        vec![after_second, e2],
        "an unknown id is a no-op"
    );
    check_eq!(
        store.counts(&k).await.map(|c| c.pending)?,
        2,
        "no row was created for the unknown id"
    );
    Ok(())
}
