//! The idempotent consumer on real SQLite files: every failure window of `apply_once`.
//!
//! - crash before commit: nothing applied, the redelivery applies once;
//! - crash after commit, before the acknowledgement: redelivered, detected as a duplicate, the
//!   projection unchanged (through the real dispatcher);
//! - concurrent duplicate deliveries of one id (several connections on one file): applied once;
//! - projection failure: the marker is rolled back with it;
//! - replay into an empty read model (an engine with a log, `Engine::replay`): rebuilt exactly.
//!
//! "Crashes" are a projection that panics after writing (its transaction is dropped while
//! unwinding) and a connection closed with its transaction open; nothing sleeps.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, Transaction};
use watukuy_conformance::cases::fixtures::{
    CrashBeforeAck, NODE_A, PendingDelivery, T0, event, key,
};
use watukuy_conformance::world::{POLLER, StrategyKind, World, lock};
use watukuy_core::delivery::{ApplyError, ApplyOutcome};
use watukuy_core::{Event, EventType, HandlerContext, HandlerError, HandlerErrorKind, ManualClock};
use watukuy_store_sqlite::{ProcessedEvents, SqliteOptions, SqliteStore};

use common::{temp_db, temp_dir};

/// A connection to the consumer's database (its read model lives there).
fn connect(path: &Path) -> Connection {
    let conn = Connection::open(path).expect("open the read-model database");
    conn.busy_timeout(Duration::from_secs(60))
        .expect("busy timeout");
    conn
}

fn shared(conn: Connection) -> Arc<Mutex<Connection>> {
    Arc::new(Mutex::new(conn))
}

/// A consumer database at `path`: the marker table `processed` and a read model `rm`.
fn setup(path: &Path) -> ProcessedEvents {
    let mut conn = connect(path);
    let processed = ProcessedEvents::new("processed")
        .unwrap()
        .with_clock(Arc::new(ManualClock::new(T0)));
    processed.migrate(&mut conn).unwrap();
    create_read_model(&conn, "rm");
    processed
}

/// A read model: one row per subject with its payload and how many times a projection touched
/// it (so a double application shows).
fn create_read_model(conn: &Connection, table: &str) {
    conn.execute_batch(&format!(
        "CREATE TABLE {table} (subject TEXT PRIMARY KEY, value TEXT, applications INTEGER NOT NULL)"
    ))
    .unwrap();
}

fn rows(conn: &Connection, table: &str) -> Vec<(String, Option<String>, i64)> {
    let mut statement = conn
        .prepare(&format!(
            "SELECT subject, value, applications FROM {table} ORDER BY subject"
        ))
        .unwrap();
    statement
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn markers(conn: &Connection) -> i64 {
    conn.query_row("SELECT count(*) FROM processed", [], |r| r.get(0))
        .unwrap()
}

/// The projection: upsert (counting applications) or delete.
fn project(tx: &Transaction<'_>, table: &str, event: &Event) -> rusqlite::Result<()> {
    if event.event_type == EventType::Deleted {
        tx.execute(
            &format!("DELETE FROM {table} WHERE subject = ?1"),
            [event.subject.as_str()],
        )?;
    } else {
        tx.execute(
            &format!(
                "INSERT INTO {table} (subject, value, applications) VALUES (?1, ?2, 1)
                 ON CONFLICT (subject) DO UPDATE SET value = excluded.value,
                 applications = applications + 1"
            ),
            rusqlite::params![
                event.subject.as_str(),
                event.data.as_ref().map(|d| d.as_str())
            ],
        )?;
    }
    Ok(())
}

/// `apply_once` of `e` with the projection into `rm`, which succeeds.
async fn apply(
    processed: &ProcessedEvents,
    conn: &Arc<Mutex<Connection>>,
    e: &Event,
) -> ApplyOutcome<()> {
    let projected = e.clone();
    processed
        .apply_once(conn, e, move |tx| project(tx, "rm", &projected))
        .await
        .unwrap()
}

fn order(id: &str, subject: &str) -> Event {
    event(&key(), id, 1, subject)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_before_commit_applies_nothing_and_the_redelivery_applies_once() {
    let (_dir, path) = temp_db("consumer.sqlite");
    let processed = setup(&path);
    let e = order("evt-1", "o1");

    // 1. The projection writes, then the handler dies (a panic) before the commit. On the
    //    blocking pool the panic surfaces as a store error and poisons the connection's mutex.
    let conn = shared(connect(&path));
    let crashed = processed
        .apply_once(&conn, &e, {
            let e = e.clone();
            move |tx| -> rusqlite::Result<()> {
                project(tx, "rm", &e)?;
                panic!("simulated crash after the projection's write")
            }
        })
        .await;
    assert!(matches!(crashed, Err(ApplyError::Store(_))), "{crashed:?}");
    let reader = connect(&path);
    assert!(
        rows(&reader, "rm").is_empty(),
        "an uncommitted write is visible"
    );
    assert_eq!(markers(&reader), 0, "an uncommitted marker is visible");

    // 2. A connection that goes away with its transaction open (the process died): closed
    //    without a commit.
    {
        let mut dying = connect(&path);
        let tx = dying.transaction().unwrap();
        assert!(processed.claim(&tx, &e).unwrap());
        project(&tx, "rm", &e).unwrap();
        std::mem::forget(tx); // no rollback, no commit: only the closing connection ends it
        drop(dying);
    }
    assert!(rows(&reader, "rm").is_empty());
    assert_eq!(markers(&reader), 0);

    // The redelivery (on the connection whose mutex the panic poisoned) applies it once.
    let outcome = apply(&processed, &conn, &e).await;
    assert!(outcome.is_applied());
    let again = apply(&processed, &conn, &e).await;
    assert!(again.is_deduplicated());
    let rows = rows(&reader, "rm");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].2, 1, "applied more than once");
    assert_eq!(markers(&reader), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_commit_before_ack_is_redelivered_and_detected_as_duplicate() {
    let dir = temp_dir();
    let path = dir.path().join("consumer.sqlite");
    let processed = setup(&path);
    let store =
        Arc::new(SqliteStore::open(SqliteOptions::file(dir.path().join("store.sqlite"))).unwrap());
    let bench = PendingDelivery::new(store, order("evt-1", "o1"))
        .await
        .unwrap();
    let conn = shared(connect(&path));
    let crash = CrashBeforeAck::default();
    bench
        .dispatcher
        .on({
            let (conn, processed, crash) = (conn.clone(), processed.clone(), crash.clone());
            move |event: Event, ctx: HandlerContext| {
                let (conn, processed, crash) = (conn.clone(), processed.clone(), crash.clone());
                async move {
                    let projected = event.clone();
                    let outcome = processed
                        .apply_once(&conn, &event, move |tx| project(tx, "rm", &projected))
                        .await?
                        .report(&ctx);
                    crash.after(outcome.is_applied())
                }
            }
        })
        .unwrap();
    let report = bench.drain().await.unwrap();
    assert_eq!((report.failed, report.delivered), (1, 0), "{report:?}");
    let reader = connect(&path);
    let after_first = rows(&reader, "rm");
    assert_eq!(
        after_first.len(),
        1,
        "the first attempt's commit is missing"
    );

    bench.clock.advance(Duration::from_secs(60));
    let report = bench.drain().await.unwrap();
    assert_eq!((report.delivered, report.remaining), (1, 0), "{report:?}");
    assert_eq!(crash.applied(), vec![true, false]);
    assert_eq!(
        rows(&reader, "rm"),
        after_first,
        "the duplicate changed the projection"
    );
    assert_eq!(
        serde_json::to_value(bench.dispatcher.counters("")).unwrap(),
        serde_json::json!({"received": 2, "applied": 0, "deduplicated": 1, "skipped": 0, "failed": 1})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicate_deliveries_apply_once() {
    let (_dir, path) = temp_db("consumer.sqlite");
    let processed = setup(&path);

    // Forced overlap on two connections: the first holds its transaction open after claiming
    // the id; the second starts meanwhile and waits for the write lock, then finds the marker.
    let e = order("evt-race", "o1");
    let (claimed_tx, claimed_rx) = std::sync::mpsc::channel::<()>();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let first = std::thread::spawn({
        let (processed, e, path) = (processed.clone(), e.clone(), path.clone());
        move || {
            let mut conn = connect(&path);
            processed.apply_once_in(&mut conn, &e, |tx| {
                project(tx, "rm", &e)?;
                claimed_tx.send(()).unwrap();
                go_rx.recv().unwrap();
                Ok::<_, rusqlite::Error>(())
            })
        }
    });
    claimed_rx.recv().unwrap();
    let (starting_tx, starting_rx) = std::sync::mpsc::channel::<()>();
    let second = std::thread::spawn({
        let (processed, e, path) = (processed.clone(), e.clone(), path.clone());
        move || {
            let mut conn = connect(&path);
            starting_tx.send(()).unwrap();
            processed.apply_once_in(&mut conn, &e, |tx| project(tx, "rm", &e))
        }
    });
    starting_rx.recv().unwrap();
    go_tx.send(()).unwrap();
    let first = first.join().unwrap();
    let second = second.join().unwrap();
    assert!(matches!(first, Ok(ApplyOutcome::Applied(()))), "{first:?}");
    assert!(
        matches!(second, Ok(ApplyOutcome::Deduplicated)),
        "{second:?}"
    );

    // Free-for-all: 20 ids, 4 concurrent deliveries each, on 4 connections.
    let conns: Vec<_> = (0..4).map(|_| shared(connect(&path))).collect();
    let mut tasks = Vec::new();
    for n in 0..20 {
        for conn in &conns {
            let (conn, processed) = (conn.clone(), processed.clone());
            let e = order(&format!("evt-{n}"), &format!("s{n}"));
            tasks.push(tokio::spawn(async move {
                let projected = e.clone();
                processed
                    .apply_once(&conn, &e, move |tx| project(tx, "rm", &projected))
                    .await
                    .map(|o| o.is_applied())
                    .map_err(|err| err.to_string())
            }));
        }
    }
    let mut applied = 0;
    for task in tasks {
        if task.await.unwrap().unwrap() {
            applied += 1;
        }
    }
    assert_eq!(applied, 20, "one application per id");
    let reader = connect(&path);
    let rows = rows(&reader, "rm");
    assert_eq!(rows.len(), 21);
    assert!(
        rows.iter().all(|r| r.2 == 1),
        "a row was applied twice: {rows:?}"
    );
    assert_eq!(markers(&reader), 21);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_projection_failure_rolls_back_the_marker() {
    let (_dir, path) = temp_db("consumer.sqlite");
    let processed = setup(&path);
    let conn = shared(connect(&path));
    let e = order("evt-1", "o1");
    let result = processed
        .apply_once(&conn, &e, {
            let e = e.clone();
            move |tx| {
                project(tx, "rm", &e)?;
                tx.execute("INSERT INTO no_such_table VALUES (1)", [])?;
                Ok::<_, rusqlite::Error>(())
            }
        })
        .await;
    assert!(
        matches!(result, Err(ApplyError::Projection(_))),
        "{result:?}"
    );
    let reader = connect(&path);
    assert!(
        rows(&reader, "rm").is_empty(),
        "the projection's first write survived"
    );
    assert_eq!(markers(&reader), 0, "the marker survived the rollback");

    let permanent = processed
        .apply_once(&conn, &e, |_tx| {
            Err::<(), _>(HandlerError::permanent("unknown product"))
        })
        .await
        .unwrap_err();
    assert_eq!(
        HandlerError::from(permanent).kind(),
        &HandlerErrorKind::Permanent
    );

    let outcome = apply(&processed, &conn, &e).await;
    assert!(outcome.is_applied());
    assert_eq!(markers(&reader), 1);
}

#[tokio::test]
async fn markers_are_pruned_by_age() {
    let (_dir, path) = temp_db("consumer.sqlite");
    let clock = ManualClock::new(T0);
    let processed = ProcessedEvents::new("processed")
        .unwrap()
        .with_clock(Arc::new(clock.clone()));
    let mut conn = connect(&path);
    processed.migrate(&mut conn).unwrap();
    for n in 0..3 {
        let e = order(&format!("old-{n}"), "o");
        assert!(
            processed
                .apply_once_in(&mut conn, &e, |_tx| Ok::<_, rusqlite::Error>(()))
                .unwrap()
                .is_applied()
        );
    }
    clock.advance(Duration::from_secs(3_600));
    let e = order("new", "o");
    let _ = processed
        .apply_once_in(&mut conn, &e, |_tx| Ok::<_, rusqlite::Error>(()))
        .unwrap();
    assert_eq!(
        processed
            .prune_older_than(&conn, Duration::from_secs(1_800))
            .unwrap(),
        3
    );
    assert!(processed.is_processed(&conn, "new").unwrap());
    assert!(!processed.is_processed(&conn, "old-0").unwrap());
}

/// Where the engine's handler projects: the read model table and its marker table.
#[derive(Clone)]
struct Target {
    table: &'static str,
    processed: ProcessedEvents,
}

/// An engine (snapshot_diff poller with a log, SQLite store) over `items` items, whose handler
/// records every event it sees and projects it with `apply_once` into the consumer database at
/// `path` (read model `rm`, markers `processed`, see [`setup`]).
struct Projected {
    world: World,
    engine: watukuy_core::Engine,
    conn: Arc<Mutex<Connection>>,
    target: Arc<Mutex<Target>>,
    seen: Arc<Mutex<Vec<Event>>>,
}

impl Projected {
    async fn new(dir: &Path, path: &Path, items: usize) -> Self {
        let processed = setup(path);
        let store =
            Arc::new(SqliteStore::open(SqliteOptions::file(dir.join("store.sqlite"))).unwrap());
        let world = World::new(items, 10).unwrap();
        let poller = world
            .poller(StrategyKind::SnapshotDiff)
            .log(Duration::from_secs(86_400))
            .build()
            .unwrap();
        let engine = world.engine(store, NODE_A, poller, 7).unwrap();
        engine.migrate().await.unwrap();
        let conn = shared(connect(path));
        let target = Arc::new(Mutex::new(Target {
            table: "rm",
            processed,
        }));
        let seen = Arc::new(Mutex::new(Vec::new()));
        engine
            .on(POLLER, {
                let (conn, target, seen) = (conn.clone(), target.clone(), seen.clone());
                move |event: Event, ctx: HandlerContext| {
                    let conn = conn.clone();
                    let Target { table, processed } = lock(&target).clone();
                    lock(&seen).push(event.clone());
                    async move {
                        let projected = event.clone();
                        processed
                            .apply_once(&conn, &event, move |tx| project(tx, table, &projected))
                            .await?
                            .report(&ctx);
                        Ok::<(), HandlerError>(())
                    }
                }
            })
            .unwrap();
        Self {
            world,
            engine,
            conn,
            target,
            seen,
        }
    }

    /// Projects into a new, empty read model `rm_rebuilt` with its own marker table from now on.
    fn rebuild_into_a_new_model(&self, reader: &Connection) {
        create_read_model(reader, "rm_rebuilt");
        let markers = ProcessedEvents::new("processed_rebuilt").unwrap();
        markers.migrate(&mut lock(&self.conn)).unwrap();
        *lock(&self.target) = Target {
            table: "rm_rebuilt",
            processed: markers,
        };
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_into_an_empty_read_model_rebuilds_it_exactly() {
    let dir = temp_dir();
    let path = dir.path().join("consumer.sqlite");
    let fixture = Projected::new(dir.path(), &path, 5).await;
    let (world, engine) = (&fixture.world, &fixture.engine);

    // History: creates, updates and a delete, one poll each.
    world.tick(engine).await.unwrap();
    world.advance(Duration::from_secs(30));
    world
        .api
        .update("item-002", serde_json::json!({ "value": 20 }))
        .unwrap();
    world
        .api
        .update("item-004", serde_json::json!({ "name": "four" }))
        .unwrap();
    world.tick(engine).await.unwrap();
    world.advance(Duration::from_secs(30));
    assert!(world.api.remove("item-003"));
    world
        .api
        .update("item-002", serde_json::json!({ "value": 21 }))
        .unwrap();
    world.tick(engine).await.unwrap();
    let reader = connect(&path);
    let live = rows(&reader, "rm");
    assert_eq!(live.len(), 4, "{live:?}");
    assert!(
        live.iter().any(|r| r.0 == "item-002" && r.2 == 3),
        "{live:?}"
    );

    // A new, empty read model with its own marker table; replay the whole log into it.
    fixture.rebuild_into_a_new_model(&reader);
    let replayed = engine.replay(POLLER, None, 0, None).await.unwrap();
    assert_eq!(
        replayed, 9,
        "5 creates, 2 updates, then a delete and an update"
    );
    let result = world.tick(engine).await.unwrap();
    assert_eq!(result.delivered, 9);
    assert_eq!(
        rows(&reader, "rm_rebuilt"),
        live,
        "the rebuilt read model differs"
    );

    // Replaying again into the rebuilt model leaves it as it is. Every event is a duplicate but
    // item-003's create and delete: a replayed `created` after its subject's `deleted` is applied
    // again (it could be a re-create with the same id), then its delete.
    engine.replay(POLLER, None, 0, None).await.unwrap();
    world.tick(engine).await.unwrap();
    assert_eq!(rows(&reader, "rm_rebuilt"), live);
    let counters = engine.inspect().await.unwrap().pollers[0].delivery;
    assert_eq!(
        serde_json::to_value(counters).unwrap(),
        serde_json::json!({"received": 27, "applied": 20, "deduplicated": 7, "skipped": 0, "failed": 0})
    );
}

/// A delete and a re-create with identical content: the engine gives the re-create the
/// original `created` id (ids are identity + version-or-hash + type, byte-identical to the
/// reference), and a second delete the first one's `deleted` id. `apply_once` applies each of
/// them anyway, because another event of the subject was applied since the id was: the item
/// ends present after every re-create and absent after every delete, live and in a read model
/// rebuilt from the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_then_a_re_create_with_identical_content_ends_with_the_item_present() {
    let dir = temp_dir();
    let path = dir.path().join("consumer.sqlite");
    let fixture = Projected::new(dir.path(), &path, 3).await;
    let Projected {
        world,
        engine,
        seen,
        ..
    } = &fixture;
    let reader = connect(&path);
    let present = |table: &str| rows(&reader, table).iter().any(|r| r.0 == "item-002");
    // A listing; a missing item is reported deleted by the second listing that misses it.
    let listings = |n: usize| {
        let (world, engine) = (&world, &engine);
        async move {
            for _ in 0..n {
                world.advance(Duration::from_secs(60));
                world.tick(engine).await.unwrap();
            }
        }
    };

    world.tick(engine).await.unwrap();
    let original = world.api.get("item-002").unwrap();
    assert!(present("rm"));
    for round in 1..=2 {
        assert!(world.api.remove("item-002"));
        listings(2).await;
        assert!(!present("rm"), "round {round}: the delete was not applied");
        world.api.seed([original.clone()]).unwrap();
        listings(1).await;
        assert!(present("rm"), "round {round}: the re-create was dropped");
    }
    let ids = |kind| {
        let seen = lock(seen);
        let of_kind = seen
            .iter()
            .filter(|e| e.subject == "item-002" && e.event_type == kind);
        of_kind.map(|e| e.id.clone()).collect::<Vec<_>>()
    };
    let (created, deleted) = (ids(EventType::Created), ids(EventType::Deleted));
    assert_eq!(created.len(), 3, "{created:?}");
    assert_eq!(deleted.len(), 2, "{deleted:?}");
    assert!(
        created.iter().all(|id| *id == created[0]) && deleted[0] == deleted[1],
        "the scenario needs repeated ids: created {created:?}, deleted {deleted:?}"
    );
    let counters = engine.inspect().await.unwrap().pollers[0].delivery;
    assert_eq!((counters.applied, counters.deduplicated), (3 + 4, 0));

    // The same history replayed into an empty read model: the item ends present there too.
    let live = rows(&reader, "rm");
    fixture.rebuild_into_a_new_model(&reader);
    assert_eq!(engine.replay(POLLER, None, 0, None).await.unwrap(), 3 + 4);
    world.tick(engine).await.unwrap();
    assert_eq!(rows(&reader, "rm_rebuilt"), live);
    assert!(present("rm_rebuilt"));
}
