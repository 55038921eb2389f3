//! The command line against real stores (SQLite, PostgreSQL, MySQL, Redis): an engine writes,
//! the command line reads and operates, the store and the engine see the result.
//!
//! PostgreSQL, MySQL and Redis come from `WATUKUY_TEST_POSTGRES_URL` / `WATUKUY_TEST_MYSQL_URL` /
//! `WATUKUY_TEST_REDIS_URL`; while one is unset, its tests are ignored with the reason
//! (docs/testing.md).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Backend, Kind, engine, failing, on};
use serde_json::{Value, json};
use watukuy_core::{
    Lane,
    store::{LogQuery, PKey, ParkedKind, ParkedQuery, StatePatch},
};
use watukuy_testkit::world::{Consumer, POLLER, World, key};

/// The whole tour on one backend: inspect shows what the engine wrote; parked ls, retry and
/// discard change the store (and the engine then delivers); pause, resume, trigger and
/// reset-cursor write the state; replay queues the logged events for the next run; unknown
/// pollers and partitions are exit code 1 with a clear message.
async fn tour(b: Arc<Backend>) {
    let world = World::new(6, 10).unwrap();
    let consumer = failing(&["item-002", "item-004"]);
    let engine = engine(&world, &b.store, &consumer);
    let store = &b.store;
    let key = key();

    world.tick(&engine).await.unwrap();
    assert_eq!(
        consumer.delivered().len(),
        4,
        "two of six events are parked"
    );

    // inspect shows what the engine wrote, field for field.
    let out = b.cli(&world, &["inspect", "--json"]).await.unwrap();
    let ours = &out.json["pollers"];
    assert_eq!(ours.as_array().map(Vec::len), Some(1), "{ours}");
    let report = serde_json::to_value(engine.inspect().await.unwrap()).unwrap();
    let theirs = &report["pollers"][0];
    for (field, value) in ours[0].as_object().unwrap() {
        assert_eq!(value, &theirs[field], "inspect field {field}");
    }
    assert_eq!(ours[0]["parked"], 2);
    assert_eq!(ours[0]["items"], 6);
    assert_eq!(ours[0]["outboxPending"], 0);
    assert_eq!(
        ours[0]["lagMs"], 1_000,
        "now minus the newest item's timestamp"
    );
    assert_eq!(
        ours[0]["cursors"]["live"]["tieBreak"], "item-006",
        "{}",
        ours[0]["cursors"]
    );
    assert_eq!(out.json["generatedAt"], world.now());

    // The readable table says the same.
    let text = b.cli(&world, &["inspect"]).await.unwrap().text;
    let row = text
        .lines()
        .find(|l| l.starts_with("items "))
        .unwrap_or_else(|| panic!("no row for the poller:\n{text}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        &cells[..8],
        ["items", "-", "idle", "closed", "0", "1.0s", "0", "2"],
        "{text}"
    );
    assert!(text.contains("items: 2 parked"), "{text}");

    // parked ls shows both poison rows, oldest first, with the handler's error.
    let out = b
        .cli(&world, &["parked", "ls", "--poller", POLLER, "--json"])
        .await
        .unwrap();
    let rows = out.json.as_array().unwrap().clone();
    let subjects: Vec<&str> = rows
        .iter()
        .map(|r| r["event"]["subject"].as_str().unwrap())
        .collect();
    assert_eq!(subjects, ["item-002", "item-004"]);
    assert!(
        rows[0]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("cannot handle item-002"),
        "{}",
        rows[0]
    );
    let (retry_id, discard_id) = (
        rows[0]["id"].as_str().unwrap().to_owned(),
        rows[1]["id"].as_str().unwrap().to_owned(),
    );
    let text = b
        .cli(&world, &["parked", "ls", "--poller", POLLER])
        .await
        .unwrap()
        .text;
    assert!(
        text.contains(&retry_id) && text.contains("created item-002"),
        "{text}"
    );

    // retry moves the row back to the outbox...
    consumer.heal();
    let out = b
        .cli(
            &world,
            &[
                "parked", "retry", "--poller", POLLER, "--ids", &retry_id, "--json",
            ],
        )
        .await
        .unwrap();
    assert_eq!(out.json, json!({ "retried": 1, "ids": [retry_id] }));
    assert_eq!(store.counts(&key).await.map(|c| c.parked).unwrap(), 1);
    assert_eq!(store.counts(&key).await.map(|c| c.pending).unwrap(), 1);
    // ...and discard deletes the other for good.
    let out = b
        .cli(
            &world,
            &[
                "parked",
                "discard",
                "--poller",
                POLLER,
                "--ids",
                &discard_id,
            ],
        )
        .await
        .unwrap();
    assert!(out.text.contains("1 parked row(s)"), "{}", out.text);
    assert_eq!(store.counts(&key).await.map(|c| c.parked).unwrap(), 0);
    // The engine's next run delivers the retried event, never the discarded one.
    world.tick(&engine).await.unwrap();
    let delivered: Vec<String> = consumer
        .delivered()
        .into_iter()
        .map(|e| e.id.to_string())
        .collect();
    assert!(delivered.contains(&retry_id));
    assert!(!delivered.contains(&discard_id));
    assert_eq!(store.counts(&key).await.map(|c| c.pending).unwrap(), 0);

    // An id that is not parked changes nothing and says so.
    let error = b
        .cli(
            &world,
            &["parked", "retry", "--poller", POLLER, "--ids", &retry_id],
        )
        .await
        .unwrap_err();
    assert_eq!((error.code.as_str(), error.exit_code), ("NOT_FOUND", 1));
    assert!(
        error.message.contains("no such parked row"),
        "{}",
        error.message
    );

    // pause / resume / trigger write the state.
    b.cli(&world, &["pause", "--poller", POLLER]).await.unwrap();
    assert!(store.load_state(&key).await.unwrap().unwrap().paused);
    let result = world.tick(&engine).await.unwrap();
    assert_eq!(result.skipped_not_due, 1, "a paused key is skipped");
    world.advance(Duration::from_secs(60));
    b.cli(&world, &["resume", "--poller", POLLER])
        .await
        .unwrap();
    let state = store.load_state(&key).await.unwrap().unwrap();
    assert!(!state.paused);
    assert_eq!(
        state.schedule.next_due_at,
        Some(world.now()),
        "resume makes it due"
    );
    world.tick(&engine).await.unwrap();
    let state = store.load_state(&key).await.unwrap().unwrap();
    assert!(
        state.schedule.next_due_at > Some(world.now()),
        "ran, due later"
    );
    b.cli(&world, &["trigger", "--poller", POLLER])
        .await
        .unwrap();
    let state = store.load_state(&key).await.unwrap().unwrap();
    assert_eq!(state.schedule.next_due_at, Some(world.now()));
    assert_eq!(state.schedule.throttled_until, None);

    // reset-cursor: a cursor of the wrong shape is refused, the right one is written.
    let error = b
        .cli(
            &world,
            &["reset-cursor", "--poller", POLLER, "--to", r#"{"page":1}"#],
        )
        .await
        .unwrap_err();
    assert_eq!((error.code.as_str(), error.exit_code), ("CONFIG", 1));
    let cursor = r#"{"value":"2026-01-01T00:00:02.000Z","tieBreak":"item-003"}"#;
    b.cli(
        &world,
        &["reset-cursor", "--poller", POLLER, "--to", cursor],
    )
    .await
    .unwrap();
    let state = store.load_state(&key).await.unwrap().unwrap();
    let live = state.lanes.live.unwrap();
    assert_eq!(live.cursor.as_deref(), Some(cursor));
    // The engine reads it: the next run re-reads from there (items 4 to 6, unchanged: no events).
    let result = world.tick(&engine).await.unwrap();
    assert!(
        result.polled.iter().all(|p| p.error.is_none()),
        "{result:?}"
    );
    b.cli(
        &world,
        &[
            "reset-cursor",
            "--poller",
            POLLER,
            "--to",
            "null",
            "--clear-snapshot",
        ],
    )
    .await
    .unwrap();
    assert_eq!(store.counts(&key).await.map(|c| c.items).unwrap(), 0);
    let state = store.load_state(&key).await.unwrap().unwrap();
    assert_eq!(state.lanes.live.unwrap().cursor, None);

    // replay copies the logged events into the outbox, with fresh sequences, not logged again;
    // the next run delivers them with lane `replay` and their original ids.
    let logged = store
        .read_log(&key, LogQuery::default(), 1_000)
        .await
        .unwrap();
    assert!(!logged.is_empty());
    let sequence = store.load_state(&key).await.unwrap().unwrap().sequence;
    let from = logged[0].created_at.to_string();
    let out = b
        .cli(
            &world,
            &["replay", "--poller", POLLER, "--from", &from, "--json"],
        )
        .await
        .unwrap();
    assert_eq!(out.json["replayed"], logged.len());
    let pending = store.load_pending(&key, 1_000).await.unwrap();
    assert_eq!(pending.len(), logged.len());
    assert!(pending.iter().all(|r| r.event.lane == Lane::Replay));
    assert_eq!(pending[0].sequence, sequence + 1, "fresh sequences");
    assert_eq!(
        store
            .read_log(&key, LogQuery::default(), 1_000)
            .await
            .unwrap()
            .len(),
        logged.len(),
        "copies are not logged again"
    );
    assert_eq!(
        store.get_lease(&key).await.unwrap(),
        None,
        "the lease is released"
    );
    let before = consumer.delivered().len();
    // Pause first so only the drain runs: no poll re-emits anything meanwhile.
    b.cli(&world, &["pause", "--poller", POLLER]).await.unwrap();
    b.cli(&world, &["resume", "--poller", POLLER])
        .await
        .unwrap();
    world.tick(&engine).await.unwrap();
    let replayed: Vec<_> = consumer.delivered()[before..]
        .iter()
        .filter(|e| e.lane == Lane::Replay)
        .map(|e| e.id.clone())
        .collect();
    let original: Vec<_> = logged.iter().map(|l| l.event.id.clone()).collect();
    assert_eq!(replayed, original, "same ids, same order");

    // Unknown pollers and partitions: exit code 1, a message that says what exists.
    let error = b
        .cli(&world, &["parked", "ls", "--poller", "nope"])
        .await
        .unwrap_err();
    assert_eq!(
        (error.code.as_str(), error.exit_code),
        ("UNKNOWN_POLLER", 1)
    );
    assert!(
        error.message.contains("unknown poller 'nope'"),
        "{}",
        error.message
    );
    assert!(
        error.message.contains("known pollers: 'items'"),
        "{}",
        error.message
    );
    let error = b
        .cli(
            &world,
            &["trigger", "--poller", POLLER, "--partition", "acme"],
        )
        .await
        .unwrap_err();
    assert_eq!(
        (error.code.as_str(), error.exit_code),
        ("UNKNOWN_PARTITION", 1)
    );
    engine
        .stop(watukuy_core::StopOptions::default())
        .await
        .unwrap();
}

/// Partitioned pollers need `--partition`; `keys` and `inspect --poller --partition` narrow.
async fn partitions(b: Arc<Backend>) {
    let world = World::new(0, 10).unwrap();
    let store = &b.store;
    for partition in ["acme", "globex"] {
        store
            .save_state_unfenced(
                &PKey::new("tenants", partition),
                &StatePatch {
                    sequence: Some(0),
                    updated_at: Some(world.now()),
                    ..StatePatch::default()
                },
            )
            .await
            .unwrap();
    }
    let error = b
        .cli(&world, &["pause", "--poller", "tenants"])
        .await
        .unwrap_err();
    assert_eq!(
        (error.code.as_str(), error.exit_code),
        ("UNKNOWN_PARTITION", 1)
    );
    assert_eq!(
        error.message,
        "poller 'tenants' is partitioned: name a partition (partitions: 'acme', 'globex')"
    );
    b.cli(
        &world,
        &["pause", "--poller", "tenants", "--partition", "globex"],
    )
    .await
    .unwrap();
    let out = b.cli(&world, &["keys", "--json"]).await.unwrap();
    assert_eq!(
        out.json,
        json!([
            { "poller": "tenants", "partition": "acme" },
            { "poller": "tenants", "partition": "globex" },
        ])
    );
    let out = b
        .cli(
            &world,
            &[
                "inspect",
                "--poller",
                "tenants",
                "--partition",
                "globex",
                "--json",
            ],
        )
        .await
        .unwrap();
    let pollers = out.json["pollers"].as_array().unwrap();
    assert_eq!(pollers.len(), 1);
    assert_eq!(pollers[0]["paused"], true);
    assert_eq!(pollers[0]["lagMs"], Value::Null);
    let text = b.cli(&world, &["inspect"]).await.unwrap().text;
    assert!(text.contains("tenants  globex     paused"), "{text}");
    assert!(
        !store
            .load_state(&PKey::new("tenants", "acme"))
            .await
            .unwrap()
            .unwrap()
            .paused
    );
}

/// Retrying every poison row without `--ids`; invalid rows are listed by kind and cannot be
/// retried, only discarded.
async fn parked_kinds(b: Arc<Backend>) {
    let world = World::new(4, 10).unwrap();
    let consumer = failing(&["item-001", "item-003"]);
    let store = &b.store;
    let engine = world.parking_engine(Arc::clone(store), &consumer).unwrap();
    world.tick(&engine).await.unwrap();
    let key = key();
    assert_eq!(store.counts(&key).await.map(|c| c.parked).unwrap(), 3);

    let out = b
        .cli(
            &world,
            &[
                "parked", "ls", "--poller", POLLER, "--kind", "invalid", "--json",
            ],
        )
        .await
        .unwrap();
    let rows = out.json.as_array().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["kind"], "invalid");
    let invalid_id = rows[0]["id"].as_str().unwrap().to_owned();
    let error = b
        .cli(
            &world,
            &["parked", "retry", "--poller", POLLER, "--kind", "invalid"],
        )
        .await
        .unwrap_err();
    assert_eq!(error.code, "CONFIG");
    let error = b
        .cli(
            &world,
            &["parked", "retry", "--poller", POLLER, "--ids", &invalid_id],
        )
        .await
        .unwrap_err();
    assert_eq!(error.code, "CONFIG");
    assert!(
        error.message.contains(&format!(
            "{invalid_id} quarantined (invalid): quarantined items cannot be retried"
        )),
        "{}",
        error.message
    );

    consumer.heal();
    let out = b
        .cli(&world, &["parked", "retry", "--poller", POLLER, "--json"])
        .await
        .unwrap();
    assert_eq!(out.json["retried"], 2, "every poison row");
    assert_eq!(store.counts(&key).await.map(|c| c.pending).unwrap(), 2);
    let left = store
        .list_parked(&key, ParkedQuery::default())
        .await
        .unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].kind, ParkedKind::Invalid);
    let out = b
        .cli(
            &world,
            &[
                "parked", "discard", "--poller", POLLER, "--kind", "invalid", "--json",
            ],
        )
        .await
        .unwrap();
    assert_eq!(out.json["discarded"], 1);
    assert_eq!(store.counts(&key).await.map(|c| c.parked).unwrap(), 0);
    world.tick(&engine).await.unwrap();
    assert_eq!(store.counts(&key).await.map(|c| c.pending).unwrap(), 0);
    let subjects: Vec<String> = consumer
        .delivered()
        .into_iter()
        .map(|e| e.subject.to_string())
        .collect();
    assert!(subjects.contains(&"item-001".to_owned()) && subjects.contains(&"item-003".to_owned()));
}

/// `replay` waits for a key held by a running engine, then reports who holds it.
async fn replay_on_a_leased_key(b: Arc<Backend>) {
    let world = World::new(2, 10).unwrap();
    let consumer = Consumer::default();
    let engine = engine(&world, &b.store, &consumer);
    world.tick(&engine).await.unwrap();
    let key = key();
    let lease = b
        .store
        .acquire_lease(&key, "node-b", 30_000, world.now())
        .await
        .unwrap()
        .unwrap();
    let error = b
        .cli(&world, &["replay", "--poller", POLLER, "--from", "0"])
        .await
        .unwrap_err();
    assert_eq!((error.code.as_str(), error.exit_code), ("STORE", 1));
    assert!(error.message.contains("node-b"), "{}", error.message);
    assert_eq!(
        b.store.counts(&key).await.map(|c| c.pending).unwrap(),
        0,
        "nothing copied"
    );
    b.store.release_lease(&key, &lease).await.unwrap();
    let out = b
        .cli(
            &world,
            &[
                "replay",
                "--poller",
                POLLER,
                "--from",
                "2026-01-01T00:00:00Z",
                "--json",
            ],
        )
        .await
        .unwrap();
    assert_eq!(out.json["replayed"], 2);
    let error = b
        .cli(
            &world,
            &["replay", "--poller", POLLER, "--from", "last tuesday"],
        )
        .await
        .unwrap_err();
    assert_eq!(error.code, "CONFIG");
}

macro_rules! on_every_store {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            use super::*;
            $(
                #[tokio::test]
                async fn $name() {
                    on(Kind::Sqlite, stringify!($name), super::$name).await;
                }
            )*
        }
        mod postgres {
            use super::*;
            $(
                #[watukuy_testenv::requires(postgres)]
                #[tokio::test]
                async fn $name() {
                    on(Kind::Postgres, stringify!($name), super::$name).await;
                }
            )*
        }
        mod mysql {
            use super::*;
            $(
                #[watukuy_testenv::requires(mysql)]
                #[tokio::test]
                async fn $name() {
                    on(Kind::MySql, stringify!($name), super::$name).await;
                }
            )*
        }
        mod redis {
            use super::*;
            $(
                #[watukuy_testenv::requires(redis)]
                #[tokio::test]
                async fn $name() {
                    on(Kind::Redis, stringify!($name), super::$name).await;
                }
            )*
        }
    };
}

on_every_store!(tour, partitions, parked_kinds, replay_on_a_leased_key);
