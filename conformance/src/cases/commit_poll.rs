//! Conformance cases: `commit_poll` — one page's work applied in one transaction.

use std::collections::HashMap;

use watukuy_core::store::{
    CommitBatch, ItemRow, LaneCursor, Lanes, LogQuery, LoggedEvent, OutboxRow, OutboxStatus,
    ParkedAction, ParkedQuery, PollerState, ScheduleState, SerializedError, StatePatch,
    UrlValidator, Validator,
};

use super::fixtures::{
    NODE_A, T0, acquire, commit_events, event, invalid, item, json, key, leased, owned_ids,
    pending, pending_ids, poison, progress,
};
use crate::harness::{CaseError, CaseResult, Env};
use crate::{check, check_eq};

/// The `LoggedEvent` `commit_poll` appends for an outbox row: the row's sequence (which the
/// fixtures keep equal to `event.sequence`), the event, the row's `created_at`.
fn logged(row: &OutboxRow) -> LoggedEvent {
    LoggedEvent {
        sequence: row.sequence,
        event: row.event.clone(),
        created_at: row.created_at,
    }
}

/// `Store::commit_poll` contract 1: upserts, deletes, events, parked rows (an invalid row with
/// validation issues) and the state patch all land together; the first commit's state equals
/// `PollerState::patched(None, &patch)` (zero state plus patch), a later commit's state equals the
/// earlier state plus its patch, and deletes remove rows an earlier commit wrote.
pub async fn applies_everything_together(env: Env) -> CaseResult {
    let (store, k, lease) = leased(&env).await?;

    let lanes = Lanes {
        live: Some(LaneCursor {
            cursor: Some(r#"{"value":"2026-01-01T00:00:02Z","tieBreak":"o2"}"#.to_owned()),
            ..LaneCursor::default()
        }),
        ..Lanes::default()
    };
    let patch = StatePatch {
        lanes: Some(lanes),
        schedule: Some(ScheduleState {
            next_due_at: Some(T0 + 5_000),
            interval_ms: Some(5_000),
            last_poll_at: Some(T0),
            ..ScheduleState::default()
        }),
        paused: None,
        schema_version: Some(2),
        sequence: Some(2),
        updated_at: Some(T0 + 500),
    };
    let upsert_1 = ItemRow {
        payload: Some(json(r#"{"id":"o1","total":10}"#)),
        version: Some("v1".to_owned()),
        ..item("o1", "hash-o1")
    };
    let upsert_2 = item("o2", "hash-o2");
    let events = vec![pending(&k, "evt-1", 1, "o1"), pending(&k, "evt-2", 2, "o2")];
    let quarantined = invalid(
        "invalid:hash-bad",
        r#"{"id":"bad","total":"ten"}"#,
        T0 + 500,
    );
    check!(
        quarantined
            .error
            .issues
            .as_ref()
            .is_some_and(|issues| !issues.is_empty()),
        "fixture: the invalid row carries validation issues"
    );
    let batch = CommitBatch::default()
        .state_patch(patch.clone())
        .upserts(vec![upsert_1.clone(), upsert_2.clone()])
        .deletes(owned_ids(&["never-existed"]))
        .events(events.clone())
        .log(false)
        .parked(vec![quarantined.clone()]);
    store.commit_poll(&k, &lease, &batch).await?;

    let expected_state = PollerState::patched(None, &patch);
    check_eq!(
        expected_state.created_at,
        T0 + 500,
        "fixture: created_at from the patch"
    );
    check_eq!(
        store.load_state(&k).await?,
        Some(expected_state.clone()),
        "the first commit's state is the zero state plus the patch"
    );
    let rows = store
        .load_versions(&k, &owned_ids(&["o1", "o2", "never-existed"]))
        .await?;
    check_eq!(
        rows,
        HashMap::from([
            ("o1".to_owned(), upsert_1.clone()),
            ("o2".to_owned(), upsert_2)
        ]),
        "the upserts landed"
    );
    check_eq!(store.counts(&k).await.map(|c| c.items)?, 2);
    check_eq!(
        store.load_pending(&k, 10).await?,
        events,
        "the events landed as pending rows"
    );
    check_eq!(store.counts(&k).await.map(|c| c.pending)?, 2);
    check_eq!(
        store.list_parked(&k, ParkedQuery::default()).await?,
        vec![quarantined.clone()],
        "the invalid row landed with its issues"
    );
    check_eq!(store.counts(&k).await.map(|c| c.parked)?, 1);
    check!(
        store.held_keys(&k).await?.is_empty(),
        "an invalid row without hold_key holds nothing"
    );

    // A second commit deletes what the first wrote and applies its patch on top of the state.
    let patch_2 = StatePatch {
        sequence: Some(3),
        paused: Some(true),
        updated_at: Some(T0 + 1_000),
        ..StatePatch::default()
    };
    let upsert_3 = item("o3", "hash-o3");
    let event_3 = OutboxRow::pending(event(&k, "evt-3", 3, "o3"), T0 + 1_000);
    let batch_2 = CommitBatch::default()
        .state_patch(patch_2.clone())
        .upserts(vec![upsert_3.clone()])
        .deletes(owned_ids(&["o2"]))
        .events(vec![event_3.clone()])
        .log(false);
    store.commit_poll(&k, &lease, &batch_2).await?;

    let expected_state_2 = PollerState::patched(Some(expected_state), &patch_2);
    check_eq!(
        store.load_state(&k).await?,
        Some(expected_state_2),
        "a later commit applies its patch on top (created_at kept)"
    );
    let rows = store
        .load_versions(&k, &owned_ids(&["o1", "o2", "o3"]))
        .await?;
    check_eq!(
        rows,
        HashMap::from([("o1".to_owned(), upsert_1), ("o3".to_owned(), upsert_3)]),
        "o2 was deleted, o3 upserted, o1 untouched"
    );
    check_eq!(
        pending_ids(store, &k).await?,
        owned_ids(&["evt-1", "evt-2", "evt-3"])
    );
    check_eq!(
        store.list_parked(&k, ParkedQuery::default()).await?,
        vec![quarantined],
        "a batch without parked rows leaves parked rows alone"
    );
    Ok(())
}

/// `Store::commit_poll` contract 2: events are appended to the log only when `batch.log` is true,
/// each as `LoggedEvent { sequence: row.sequence, event, created_at: row.created_at }`; the
/// outbox receives every event either way. Skipped without `capabilities().log`.
pub async fn appends_log_only_when_asked(env: Env) -> CaseResult {
    let store = env.store();
    if !store.capabilities().log {
        return Err(CaseError::skipped(
            "the store has no log (capabilities().log is false)",
        ));
    }
    let k = key();
    let lease = acquire(store, &k, NODE_A, T0).await?;
    let all = LogQuery::default();

    let unlogged = vec![pending(&k, "evt-1", 1, "o1"), pending(&k, "evt-2", 2, "o2")];
    commit_events(store, &k, &lease, unlogged, false).await?;
    check!(
        store.read_log(&k, all, 100).await?.is_empty(),
        "log: false appends nothing"
    );

    let logged_rows = vec![
        OutboxRow::pending(event(&k, "evt-3", 3, "o3"), T0 + 1_000),
        OutboxRow::pending(event(&k, "evt-4", 4, "o4"), T0 + 2_000),
    ];
    commit_events(store, &k, &lease, logged_rows.clone(), true).await?;
    let expected: Vec<LoggedEvent> = logged_rows.iter().map(logged).collect();
    check_eq!(
        store.read_log(&k, all, 100).await?,
        expected,
        "log: true appends each event with its sequence and the row's created_at"
    );

    commit_events(
        store,
        &k,
        &lease,
        vec![pending(&k, "evt-5", 5, "o5")],
        false,
    )
    .await?;
    commit_events(store, &k, &lease, Vec::new(), true).await?;
    check_eq!(
        store.read_log(&k, all, 100).await?,
        expected,
        "a later log: false batch and a log: true batch without events append nothing"
    );
    check_eq!(
        pending_ids(store, &k).await?,
        owned_ids(&["evt-1", "evt-2", "evt-3", "evt-4", "evt-5"]),
        "every event reached the outbox, logged or not"
    );
    Ok(())
}

/// `Store::commit_poll` contract 3: re-committing an event id overwrites its outbox row, attempts
/// included (reset to 0 after a `record_attempt`); committing it with status `Delivered` takes it
/// out of the pending rows; committing it pending again brings it back (at its new sequence).
pub async fn recommitting_event_overwrites_row(env: Env) -> CaseResult {
    let (store, k, lease) = leased(&env).await?;

    let e2 = pending(&k, "evt-2", 2, "o2");
    commit_events(
        store,
        &k,
        &lease,
        vec![pending(&k, "evt-1", 1, "o1"), e2.clone()],
        false,
    )
    .await?;
    let failure = SerializedError::new("HandlerError", "boom");
    store
        .record_attempt(&k, &lease, "evt-1", &failure, Some(T0 + 10_000))
        .await?;
    let rows = store.load_pending(&k, 10).await?;
    check!(
        rows.first().is_some_and(|r| r.event_id == "evt-1"
            && r.attempts == 1
            && r.last_error.as_ref() == Some(&failure)
            && r.next_attempt_at == Some(T0 + 10_000)),
        "fixture: the attempt was recorded: {rows:?}"
    );

    // Overwrite with a fresh pending row carrying a changed event.
    let mut changed = event(&k, "evt-1", 1, "o1");
    changed.data = Some(json(r#"{"id":"o1","seq":1,"changed":true}"#));
    let overwrite = OutboxRow::pending(changed.clone(), T0 + 2_000);
    commit_events(store, &k, &lease, vec![overwrite.clone()], false).await?;
    check_eq!(
        store.load_pending(&k, 10).await?,
        vec![overwrite.clone(), e2.clone()],
        "the row was overwritten: attempts 0, no error, no next attempt, new event and created_at"
    );
    check_eq!(store.counts(&k).await.map(|c| c.pending)?, 2);

    // Committed as delivered: no longer pending.
    let delivered = OutboxRow {
        status: OutboxStatus::Delivered,
        ..overwrite
    };
    commit_events(store, &k, &lease, vec![delivered], false).await?;
    check_eq!(
        store.load_pending(&k, 10).await?,
        vec![e2.clone()],
        "a row committed as delivered is not pending"
    );
    check_eq!(store.counts(&k).await.map(|c| c.pending)?, 1);

    // Committed pending again (at a later sequence): it is back, in its new place.
    let mut again_event = changed;
    again_event.sequence = 3;
    let again = OutboxRow::pending(again_event, T0 + 3_000);
    commit_events(store, &k, &lease, vec![again.clone()], false).await?;
    check_eq!(
        store.load_pending(&k, 10).await?,
        vec![e2, again],
        "re-committing the id as pending re-adds it at its new sequence"
    );
    check_eq!(store.counts(&k).await.map(|c| c.pending)?, 2);
    Ok(())
}

/// `Store::commit_poll` contract 4: a batch with nothing but a state patch still applies it
/// (creating the zero state plus patch on a fresh key, patching on top afterwards) and writes
/// nothing else; a batch with an empty patch leaves the state as it was.
pub async fn empty_batch_applies_patch(env: Env) -> CaseResult {
    let (store, k, lease) = leased(&env).await?;

    let patch = progress(5, T0 + 100);
    let batch = CommitBatch::default().state_patch(patch.clone());
    store.commit_poll(&k, &lease, &batch).await?;
    let state = PollerState::patched(None, &patch);
    check_eq!(
        store.load_state(&k).await?,
        Some(state.clone()),
        "an empty batch creates the zero state plus the patch"
    );
    check_eq!(store.counts(&k).await.map(|c| c.items)?, 0);
    check_eq!(store.counts(&k).await.map(|c| c.pending)?, 0);
    check_eq!(store.counts(&k).await.map(|c| c.parked)?, 0);
    if store.capabilities().log {
        check!(
            store
                .read_log(&k, LogQuery::default(), 10)
                .await?
                .is_empty()
        );
    }

    let patch_2 = StatePatch {
        paused: Some(true),
        updated_at: Some(T0 + 1_000),
        ..StatePatch::default()
    };
    let batch_2 = CommitBatch::default()
        .state_patch(patch_2.clone())
        .log(true);
    store.commit_poll(&k, &lease, &batch_2).await?;
    let state_2 = PollerState::patched(Some(state), &patch_2);
    check!(
        state_2.paused && state_2.sequence == 5 && state_2.created_at == T0 + 100,
        "fixture: the second patch keeps sequence and created_at"
    );
    check_eq!(
        store.load_state(&k).await?,
        Some(state_2.clone()),
        "a second empty batch patches the state on top"
    );

    store
        .commit_poll(&k, &lease, &CommitBatch::default())
        .await?;
    check_eq!(
        store.load_state(&k).await?,
        Some(state_2),
        "an empty patch changes nothing"
    );
    Ok(())
}

/// A validator as a page's commit carries it.
fn url_validator(url_hash: &str, etag: Option<&str>, stored_at: i64) -> UrlValidator {
    UrlValidator {
        url_hash: url_hash.to_owned(),
        validator: Validator {
            etag: etag.map(str::to_owned),
            last_modified: Some("Wed, 21 Oct 2015 07:28:00 GMT".to_owned()),
            stored_at,
        },
    }
}

/// `Store::commit_poll` contract 7: the validators of a page land with its commit: two URL
/// hashes written by one commit read back whole; a later commit replaces one of them whole (a
/// field set to `None` is cleared) and leaves the other alone; a commit without validators
/// changes none; another key sees none of them.
pub async fn writes_validators_with_the_page(env: Env) -> CaseResult {
    let (store, k, lease) = leased(&env).await?;
    let (a, b) = (
        url_validator("url-a", Some("W/\"a1\""), T0),
        url_validator("url-b", Some("\"b1\""), T0),
    );
    let batch = CommitBatch::default()
        .state_patch(progress(1, T0))
        .events(vec![pending(&k, "e1", 1, "i1")])
        .upserts(vec![item("i1", "h1")])
        .validators(vec![a.clone(), b.clone()]);
    store.commit_poll(&k, &lease, &batch).await?;
    for v in [&a, &b] {
        check_eq!(
            store.get_validator(&k, &v.url_hash).await?,
            Some(v.validator.clone()),
            "{} after the commit that carried it",
            v.url_hash
        );
    }

    let replaced = UrlValidator {
        validator: Validator {
            last_modified: None,
            ..url_validator("url-a", Some("W/\"a2\""), T0 + 1_000).validator
        },
        ..a.clone()
    };
    let batch = CommitBatch::default()
        .state_patch(StatePatch {
            updated_at: Some(T0 + 1_000),
            ..StatePatch::default()
        })
        .validators(vec![replaced.clone()]);
    store.commit_poll(&k, &lease, &batch).await?;
    check_eq!(
        store.get_validator(&k, "url-a").await?,
        Some(replaced.validator.clone()),
        "url-a replaced whole by a later commit (last_modified cleared)"
    );
    check_eq!(
        store.get_validator(&k, "url-b").await?,
        Some(b.validator.clone()),
        "url-b untouched by a commit that did not carry it"
    );

    store
        .commit_poll(&k, &lease, &CommitBatch::default())
        .await?;
    check_eq!(
        store.get_validator(&k, "url-a").await?,
        Some(replaced.validator),
        "an empty commit leaves validators alone"
    );
    check!(
        store
            .get_validator(&super::fixtures::key_b(), "url-a")
            .await?
            .is_none(),
        "another partition sees no validator"
    );
    Ok(())
}

/// JSON text a database would rewrite or refuse (key order, spacing, escapes, number spellings,
/// a big integer, a repeated key, the `\u0000` escape), and messages holding a raw NUL character.
const VERBATIM: &str = r#"{ "z" : 1.0, "a":[1e2, -0, 12345678901234567890123456789], "nul":"a\u0000b", "dup":1, "dup":2, "e":"caf\u00e9 ☕" }"#;

/// `Store::commit_poll` contract 8: JSON comes back byte for byte and text character for
/// character, wherever a batch puts it: an item's payload, an event's data and cursor (in the
/// outbox, the log, and a parked poison row retried back to the outbox), a quarantined item, and
/// error messages with a raw NUL character in a parked row and in the state.
pub async fn json_and_text_come_back_verbatim(env: Env) -> CaseResult {
    let (store, k, lease) = leased(&env).await?;
    let text = json(VERBATIM);
    let mut row = pending(&k, "evt-1", 1, "o1");
    row.event.data = Some(text.clone());
    row.event.cursor = Some(text.clone());
    let mut quarantined = invalid("invalid:1", VERBATIM, T0);
    quarantined.error.error = SerializedError::new("ValidationError", "nul \0 here");
    let mut patch = progress(1, T0);
    patch.schedule = Some(ScheduleState {
        last_error: Some(SerializedError::new("HttpError", "body had a \0 byte")),
        ..ScheduleState::default()
    });
    let batch = CommitBatch::default()
        .upserts(vec![ItemRow {
            payload: Some(text.clone()),
            ..item("o1", "h")
        }])
        .events(vec![row.clone()])
        .parked(vec![quarantined.clone()])
        .state_patch(patch.clone())
        .log(true);
    store.commit_poll(&k, &lease, &batch).await?;

    let rows = store.load_versions(&k, &owned_ids(&["o1"])).await?;
    check_eq!(
        rows.get("o1")
            .and_then(|r| r.payload.as_ref())
            .map(|p| p.as_str()),
        Some(VERBATIM),
        "the item's payload"
    );
    check_eq!(
        store.load_pending(&k, 10).await?,
        vec![row.clone()],
        "the outbox row (data and cursor)"
    );
    if store.capabilities().log {
        let logged_events = store.read_log(&k, LogQuery::default(), 10).await?;
        check_eq!(logged_events, vec![logged(&row)], "the logged event");
    }
    check_eq!(
        store.list_parked(&k, ParkedQuery::default()).await?,
        vec![quarantined],
        "the quarantined item and its message"
    );
    check_eq!(
        store.load_state(&k).await?,
        Some(PollerState::patched(None, &patch)),
        "the state and its error message"
    );

    // Parked as poison, then retried: the event is back in the outbox unchanged.
    store
        .park_event(&k, &lease, &poison(row.event.clone(), Some("o1"), T0 + 5))
        .await?;
    let retried = store
        .resolve_parked(&k, &owned_ids(&["evt-1"]), ParkedAction::Retry)
        .await?;
    check_eq!(retried, 1, "the poison row is retried");
    let back = store.load_pending(&k, 10).await?;
    check_eq!(
        back.first().map(|r| &r.event),
        Some(&row.event),
        "the event retried from the parked row"
    );
    Ok(())
}
