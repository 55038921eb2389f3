//! What only SQLite's closure flavour of the idempotent consumer shows: `ProcessedEvents::
//! apply_once` (a plain closure over a `rusqlite::Transaction`, run on tokio's blocking pool)
//! and the blocking `apply_once_in`, which open their own immediate transaction instead of a
//! `SqliteTx`.
//!
//! - a projection that panics on the blocking pool: a store error, nothing committed, and the
//!   redelivery applies once on the connection whose mutex the panic poisoned; a connection
//!   closed with its transaction open leaves nothing either;
//! - overlapping deliveries through `apply_once_in` on two threads (the second seen waiting in
//!   its busy handler) and through `apply_once` on four connections: applied once.
//!
//! The scenarios every consumer store shares (crashes before the commit and before the
//! acknowledgement, overlapping and late deliveries, projection failures, repeated ids, pruning,
//! migrations, the fence, replays) run through the generic `delivery::apply_once` in the
//! consumer suite, `tests/consumer.rs`.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, Transaction};
use watukuy_conformance::cases::fixtures::{event, key};
use watukuy_core::delivery::{ApplyError, ApplyOutcome};
use watukuy_core::{Event, clock::ManualClock};
use watukuy_store_sqlite::ProcessedEvents;
use watukuy_testkit::T0;

use common::temp_db;

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

/// A consumer database at `path`: the marker table `processed` and a read model `rm`, one row
/// per subject with its payload and how many times a projection touched it (so a double
/// application shows).
fn setup(path: &Path) -> ProcessedEvents {
    let mut conn = connect(path);
    let processed = ProcessedEvents::new("processed")
        .unwrap()
        .with_clock(Arc::new(ManualClock::new(T0)));
    processed.migrate(&mut conn).unwrap();
    conn.execute_batch(
        "CREATE TABLE rm (subject TEXT PRIMARY KEY, value TEXT, applications INTEGER NOT NULL)",
    )
    .unwrap();
    processed
}

fn rows(conn: &Connection) -> Vec<(String, Option<String>, i64)> {
    let mut statement = conn
        .prepare("SELECT subject, value, applications FROM rm ORDER BY subject")
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

/// The projection: upserts the subject's row with the event's data, counting applications.
fn project(tx: &Transaction<'_>, event: &Event) -> rusqlite::Result<()> {
    tx.execute(
        "INSERT INTO rm (subject, value, applications) VALUES (?1, ?2, 1)
         ON CONFLICT (subject) DO UPDATE SET value = excluded.value,
         applications = applications + 1",
        rusqlite::params![
            event.subject.as_str(),
            event.data.as_ref().map(|d| d.as_str())
        ],
    )?;
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
        .apply_once(conn, e, move |tx| project(tx, &projected))
        .await
        .unwrap()
}

fn order(id: &str, subject: &str) -> Event {
    event(&key(), id, 1, subject)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_on_the_blocking_pool_or_a_closed_connection_leaves_nothing() {
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
                project(tx, &e)?;
                panic!("simulated crash after the projection's write")
            }
        })
        .await;
    assert!(matches!(crashed, Err(ApplyError::Store(_))), "{crashed:?}");
    let reader = connect(&path);
    assert!(rows(&reader).is_empty(), "an uncommitted write is visible");
    assert_eq!(markers(&reader), 0, "an uncommitted marker is visible");

    // 2. A connection that goes away with its transaction open (the process died): closed
    //    without a commit.
    {
        let mut dying = connect(&path);
        let tx = dying.transaction().unwrap();
        assert!(processed.claim(&tx, &e).unwrap());
        project(&tx, &e).unwrap();
        std::mem::forget(tx); // no rollback, no commit: only the closing connection ends it
        drop(dying);
    }
    assert!(rows(&reader).is_empty());
    assert_eq!(markers(&reader), 0);

    // The redelivery (on the connection whose mutex the panic poisoned) applies it once.
    let outcome = apply(&processed, &conn, &e).await;
    assert!(outcome.is_applied());
    let again = apply(&processed, &conn, &e).await;
    assert!(again.is_deduplicated());
    let rows = rows(&reader);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].2, 1, "applied more than once");
    assert_eq!(markers(&reader), 1);
}

/// Set by the busy handler of the second connection in
/// [`the_closure_flavour_serializes_overlapping_deliveries`]: it is waiting for the first's lock.
static SECOND_WAITS: AtomicBool = AtomicBool::new(false);

/// That busy handler: says it waits, yields the thread and tries again (a bounded number of
/// times; nothing sleeps).
fn second_waits(tries: i32) -> bool {
    SECOND_WAITS.store(true, Ordering::SeqCst);
    std::thread::yield_now();
    tries < 20_000_000
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_closure_flavour_serializes_overlapping_deliveries() {
    let (_dir, path) = temp_db("consumer.sqlite");
    let processed = setup(&path);

    // Forced overlap through `apply_once_in` on two threads: the first holds its transaction
    // open after claiming the id; the second waits for the write lock (seen in its busy
    // handler) until the first commits, then finds the marker.
    let e = order("evt-race", "o1");
    let (claimed_tx, claimed_rx) = std::sync::mpsc::channel::<()>();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let first = std::thread::spawn({
        let (processed, e, path) = (processed.clone(), e.clone(), path.clone());
        move || {
            let mut conn = connect(&path);
            processed.apply_once_in(&mut conn, &e, |tx| {
                project(tx, &e)?;
                claimed_tx.send(()).unwrap();
                go_rx.recv().unwrap();
                Ok::<_, rusqlite::Error>(())
            })
        }
    });
    claimed_rx.recv().unwrap();
    let second = std::thread::spawn({
        let (processed, e, path) = (processed.clone(), e.clone(), path.clone());
        move || {
            let mut conn = Connection::open(&path).unwrap();
            conn.busy_handler(Some(second_waits)).unwrap();
            processed.apply_once_in(&mut conn, &e, |tx| project(tx, &e))
        }
    });
    let mut polls = 0u64;
    while !SECOND_WAITS.load(Ordering::SeqCst) {
        polls += 1;
        assert!(polls < 100_000_000, "the second delivery never waited");
        std::thread::yield_now();
    }
    go_tx.send(()).unwrap();
    let first = first.join().unwrap();
    let second = second.join().unwrap();
    assert!(matches!(first, Ok(ApplyOutcome::Applied(()))), "{first:?}");
    assert!(
        matches!(second, Ok(ApplyOutcome::Deduplicated)),
        "{second:?}"
    );

    // Free-for-all through `apply_once` on the blocking pool: 20 ids, 4 concurrent deliveries
    // each, on 4 connections.
    let conns: Vec<_> = (0..4).map(|_| shared(connect(&path))).collect();
    let mut tasks = Vec::new();
    for n in 0..20 {
        for conn in &conns {
            let (conn, processed) = (conn.clone(), processed.clone());
            let e = order(&format!("evt-{n}"), &format!("s{n}"));
            tasks.push(tokio::spawn(async move {
                let projected = e.clone();
                processed
                    .apply_once(&conn, &e, move |tx| project(tx, &projected))
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
    let rows = rows(&reader);
    assert_eq!(rows.len(), 21);
    assert!(
        rows.iter().all(|r| r.2 == 1),
        "a row was applied twice: {rows:?}"
    );
    assert_eq!(markers(&reader), 21);
}
