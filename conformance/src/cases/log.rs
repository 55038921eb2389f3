//! Conformance cases: `log` — the replay log written by `commit_poll` with `log: true`.
//! Every case is skipped when the store reports `capabilities().log == false`.

use watukuy_core::store::{Lease, LogQuery, LoggedEvent, OutboxRow, PKey, Store};

use super::fixtures::{
    NODE_A, T0, acquire, commit_events, event, key, key_b, key_other, owned_ids, pending_ids,
};
use crate::harness::{CaseError, CaseResult, Env};
use crate::{check, check_eq};

/// Skips the case unless the store has a log.
fn require_log(store: &dyn Store) -> CaseResult {
    if store.capabilities().log {
        Ok(())
    } else {
        Err(CaseError::skipped(
            "the store has no log (capabilities().log is false)",
        ))
    }
}

/// A pending row for `id` at `sequence`, created at `created_at`.
fn row(key: &PKey, id: &str, sequence: i64, created_at: i64) -> OutboxRow {
    OutboxRow::pending(
        event(key, id, sequence, &format!("o{sequence}")),
        created_at,
    )
}

/// The log entry `commit_poll` appends for `row`: the row's sequence (which the fixtures keep
/// equal to `event.sequence`), the event, and the row's `created_at`.
fn logged(row: &OutboxRow) -> LoggedEvent {
    LoggedEvent {
        sequence: row.sequence,
        event: row.event.clone(),
        created_at: row.created_at,
    }
}

/// Commits `rows` with `log: true`.
async fn log_rows(store: &dyn Store, key: &PKey, lease: &Lease, rows: &[OutboxRow]) -> CaseResult {
    commit_events(store, key, lease, rows.to_vec(), true).await
}

/// The sequences `read_log` returns for `query` and `limit`.
async fn sequences(
    store: &dyn Store,
    key: &PKey,
    query: LogQuery,
    limit: usize,
) -> Result<Vec<i64>, CaseError> {
    Ok(store
        .read_log(key, query, limit)
        .await?
        .into_iter()
        .map(|entry| entry.sequence)
        .collect())
}

/// A query with only `after_sequence`.
fn after(sequence: i64) -> LogQuery {
    LogQuery::default().after_sequence(sequence)
}

/// A query with only a time range.
fn between(from_time: Option<i64>, to_time: Option<i64>) -> LogQuery {
    let mut query = LogQuery::default();
    (query.from_time, query.to_time) = (from_time, to_time);
    query
}

/// Five rows at sequences 1..=5 with ids that sort opposite to their sequences, created one
/// second apart from `T0`.
fn five_rows(key: &PKey) -> Vec<OutboxRow> {
    (1..=5)
        .map(|s| row(key, &format!("evt-{}", 9 - s), s, T0 + (s - 1) * 1_000))
        .collect()
}

/// `Store::read_log` contract 1: entries come in sequence order whatever the commit order, each
/// exactly `{ sequence: row.sequence, event, created_at: row.created_at }`; `after_sequence`
/// keeps `sequence > after_sequence` only (strictly); the log outlives the outbox (acks do not
/// touch it); another key's log is empty.
pub async fn read_log_after_sequence(env: Env) -> CaseResult {
    let store = env.store();
    require_log(store)?;
    let k = key();
    check!(
        store
            .read_log(&k, LogQuery::default(), 100)
            .await?
            .is_empty(),
        "a key never written has an empty log"
    );
    let lease = acquire(store, &k, NODE_A, T0).await?;
    let rows = five_rows(&k);
    // Two commits, each in scrambled order; the second holds the lower sequences.
    log_rows(store, &k, &lease, &[rows[4].clone(), rows[2].clone()]).await?;
    log_rows(
        store,
        &k,
        &lease,
        &[rows[1].clone(), rows[3].clone(), rows[0].clone()],
    )
    .await?;

    let expected: Vec<LoggedEvent> = rows.iter().map(logged).collect();
    check_eq!(
        store.read_log(&k, LogQuery::default(), 100).await?,
        expected,
        "every entry, in sequence order, exactly as committed"
    );
    check_eq!(
        sequences(store, &k, after(2), 100).await?,
        vec![3, 4, 5],
        "after 2"
    );
    check_eq!(
        sequences(store, &k, after(0), 100).await?,
        vec![1, 2, 3, 4, 5],
        "after 0"
    );
    check_eq!(
        sequences(store, &k, after(4), 100).await?,
        vec![5],
        "after 4 (strict)"
    );
    check!(
        sequences(store, &k, after(5), 100).await?.is_empty(),
        "after the last"
    );
    check!(
        sequences(store, &k, after(99), 100).await?.is_empty(),
        "after beyond the last"
    );
    check_eq!(
        sequences(store, &k, after(1), 2).await?,
        vec![2, 3],
        "after 1 with limit 2: the next two in order"
    );

    store
        .ack_events(
            &k,
            &lease,
            &rows
                .iter()
                .map(|r| r.event_id.to_string())
                .collect::<Vec<_>>(),
        )
        .await?;
    check_eq!(
        store.counts(&k).await.map(|c| c.pending)?,
        0,
        "fixture: outbox drained"
    );
    check_eq!(
        store.read_log(&k, LogQuery::default(), 100).await?,
        expected,
        "acks do not touch the log"
    );

    for other in [key_b(), key_other()] {
        check!(
            store
                .read_log(&other, LogQuery::default(), 100)
                .await?
                .is_empty(),
            "{other} has an empty log"
        );
    }
    Ok(())
}

/// `Store::read_log` contract 2: `from_time` and `to_time` keep `created_at` within the range,
/// inclusive on both ends (alone, together, equal, narrowed between entries, inverted); combined
/// with `after_sequence` and a limit every filter applies; limit 0 gives none.
pub async fn read_log_time_range_and_limit(env: Env) -> CaseResult {
    let store = env.store();
    require_log(store)?;
    let k = key();
    let lease = acquire(store, &k, NODE_A, T0).await?;
    // created_at: 1 -> T0, 2 -> T0+1s, 3 -> T0+2s, 4 -> T0+3s, 5 -> T0+4s.
    log_rows(store, &k, &lease, &five_rows(&k)).await?;
    let s = |ms: i64| Some(T0 + ms);

    check_eq!(
        sequences(store, &k, between(s(1_000), None), 100).await?,
        vec![2, 3, 4, 5],
        "from_time is inclusive"
    );
    check_eq!(
        sequences(store, &k, between(None, s(3_000)), 100).await?,
        vec![1, 2, 3, 4],
        "to_time is inclusive"
    );
    check_eq!(
        sequences(store, &k, between(s(1_000), s(3_000)), 100).await?,
        vec![2, 3, 4],
        "both ends inclusive"
    );
    check_eq!(
        sequences(store, &k, between(s(2_000), s(2_000)), 100).await?,
        vec![3],
        "from_time == to_time keeps the entry at that instant"
    );
    check_eq!(
        sequences(store, &k, between(s(1_001), s(2_999)), 100).await?,
        vec![3],
        "a range strictly inside two entries' times excludes them"
    );
    check!(
        sequences(store, &k, between(s(3_000), s(1_000)), 100)
            .await?
            .is_empty(),
        "an inverted range gives none"
    );
    check!(
        sequences(store, &k, between(s(4_001), None), 100)
            .await?
            .is_empty(),
        "from_time after the last entry gives none"
    );
    check!(
        sequences(store, &k, between(None, Some(T0 - 1)), 100)
            .await?
            .is_empty(),
        "to_time before the first entry gives none"
    );

    let combined = between(s(1_000), s(4_000)).after_sequence(2);
    check_eq!(
        sequences(store, &k, combined, 100).await?,
        vec![3, 4, 5],
        "after_sequence and the time range together"
    );
    check_eq!(
        sequences(store, &k, combined, 2).await?,
        vec![3, 4],
        "filters and limit together: the first two matches in order"
    );
    let combined_2 = between(s(1_000), s(3_000)).after_sequence(0);
    check_eq!(sequences(store, &k, combined_2, 1).await?, vec![2]);
    check_eq!(
        sequences(store, &k, LogQuery::default(), 1).await?,
        vec![1],
        "limit 1 without filters"
    );
    check!(
        store.read_log(&k, LogQuery::default(), 0).await?.is_empty(),
        "limit 0 gives none"
    );
    check!(
        store.read_log(&k, combined, 0).await?.is_empty(),
        "limit 0 with filters gives none"
    );
    Ok(())
}

/// `Store::prune_log` contract 1: entries with `created_at < older_than` (strictly) are removed
/// and counted; pruning again is a no-op returning 0; another key's log is untouched and pruning
/// a key without a log returns 0; the outbox is untouched.
pub async fn prune_log_strictly_older(env: Env) -> CaseResult {
    let store = env.store();
    require_log(store)?;
    let k = key();
    let lease = acquire(store, &k, NODE_A, T0).await?;
    // created_at: 1 -> T0, 2 -> T0+1s, 3 and 4 -> T0+2s, 5 -> T0+3s.
    let rows = vec![
        row(&k, "evt-1", 1, T0),
        row(&k, "evt-2", 2, T0 + 1_000),
        row(&k, "evt-3", 3, T0 + 2_000),
        row(&k, "evt-4", 4, T0 + 2_000),
        row(&k, "evt-5", 5, T0 + 3_000),
    ];
    log_rows(store, &k, &lease, &rows).await?;

    let other = key_other();
    let other_lease = acquire(store, &other, NODE_A, T0).await?;
    let other_rows = vec![
        row(&other, "inv-1", 1, T0),
        row(&other, "inv-2", 2, T0 + 1_000),
    ];
    log_rows(store, &other, &other_lease, &other_rows).await?;

    check_eq!(
        store.prune_log(&k, T0).await?,
        0,
        "nothing is strictly older than T0"
    );
    check_eq!(
        sequences(store, &k, LogQuery::default(), 100).await?,
        vec![1, 2, 3, 4, 5]
    );

    check_eq!(
        store.prune_log(&k, T0 + 2_000).await?,
        2,
        "entries at T0 and T0+1s are older; those at the cutoff stay"
    );
    check_eq!(
        store.read_log(&k, LogQuery::default(), 100).await?,
        rows[2..].iter().map(logged).collect::<Vec<_>>(),
        "the remaining entries are untouched"
    );
    check_eq!(
        store.prune_log(&k, T0 + 2_000).await?,
        0,
        "pruning again removes nothing"
    );
    check_eq!(
        sequences(store, &k, LogQuery::default(), 100).await?,
        vec![3, 4, 5]
    );

    check_eq!(
        store.read_log(&other, LogQuery::default(), 100).await?,
        other_rows.iter().map(logged).collect::<Vec<_>>(),
        "pruning {k} left {other}'s log alone"
    );
    check_eq!(
        store.prune_log(&key_b(), T0 + 1_000_000).await?,
        0,
        "a key without a log"
    );

    check_eq!(
        store.prune_log(&k, T0 + 3_001).await?,
        3,
        "a cutoff after the last entry removes the rest"
    );
    check!(
        store
            .read_log(&k, LogQuery::default(), 100)
            .await?
            .is_empty()
    );
    check_eq!(
        pending_ids(store, &k).await?,
        owned_ids(&["evt-1", "evt-2", "evt-3", "evt-4", "evt-5"]),
        "pruning the log does not touch the outbox"
    );
    check_eq!(
        store
            .read_log(&other, LogQuery::default(), 100)
            .await?
            .len(),
        2,
        "{other}'s log is still whole"
    );
    Ok(())
}
