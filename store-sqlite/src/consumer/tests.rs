//! The processed-events table's migrations, its transaction handle and its fence, on real
//! files. Nothing sleeps: a transaction's end is observed by taking the connection's mutex or
//! the file's write lock after it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use watukuy_core::delivery::{self, ApplyError, ApplyOutcome};
use watukuy_core::{
    BoxError, EventType,
    clock::ManualClock,
    store::{PKey, Store},
};

use super::*;
use crate::SqliteStore;

/// A moment in epoch ms.
const T0: i64 = 1_767_225_600_000;

/// A lease time-to-live.
const TTL: i64 = 30_000;

/// A temporary directory and the path of a database file in it.
fn temp_file(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("watukuy-sqlite-consumer-")
        .tempdir()
        .expect("a temporary directory");
    let path = dir.path().join(name);
    (dir, path)
}

/// A connection to `path` that waits for locks (it never waits long here: every transaction
/// that holds the lock ends without outside help).
fn connect(path: &Path) -> Connection {
    let conn = Connection::open(path).expect("open the database");
    conn.busy_timeout(Duration::from_secs(30))
        .expect("busy timeout");
    conn
}

fn shared(conn: Connection) -> Arc<Mutex<Connection>> {
    Arc::new(Mutex::new(conn))
}

/// A `created` event of `subject` on `orders/""`.
fn event(id: &str, sequence: i64, subject: &str) -> Event {
    let mut event = Event::new(id, EventType::Created, "orders", subject);
    event.time = "2026-01-01T00:00:00.000Z".into();
    event.sequence = sequence;
    event.attempt = 1;
    event
}

/// The number of rows of `table`, as `conn` sees it.
fn count(conn: &Connection, table: &str) -> i64 {
    conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
        .expect("count")
}

fn table_exists(conn: &Connection, table: &str) -> bool {
    conn.query_row(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
        [table],
        |r| r.get::<_, i64>(0),
    )
    .expect("sqlite_master")
        == 1
}

#[test]
fn tables_are_checked_and_the_ddl_is_idempotent() {
    assert!(matches!(
        ProcessedEvents::new("x; drop"),
        Err(Error::Config { .. })
    ));
    let processed = ProcessedEvents::new("seen").unwrap();
    let mut conn = Connection::open_in_memory().unwrap();
    conn.execute_batch(&processed.ddl()).unwrap();
    // A claim between the two runs: the second run must keep its last applied event.
    {
        let tx = conn.transaction().unwrap();
        assert!(processed.claim(&tx, &event("evt-1", 7, "o1")).unwrap());
        tx.commit().unwrap();
    }
    conn.execute_batch(&processed.ddl()).unwrap();
    processed.migrate(&mut conn).unwrap();
    processed.migrate(&mut conn).unwrap();
    let version: i64 = conn
        .query_row("SELECT MAX(version) FROM seen_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, i64::from(PROCESSED_EVENTS_VERSION));
    assert!(!table_exists(&conn, "seen_subjects"));
    let last: (String, Option<i64>) = conn
        .query_row("SELECT event_id, sequence FROM seen_last", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert_eq!(last, ("evt-1".to_owned(), Some(7)));
    assert!(!processed.ddl().contains('{'));
    conn.execute("INSERT INTO seen_version VALUES (99)", [])
        .unwrap();
    let err = processed.migrate(&mut conn).unwrap_err();
    assert!(err.to_string().contains("newer"), "{err}");
}

/// A table created by version 2 (the text of migrations 1 and 2, as the DDL of that version
/// wrote it) moves to version 3 with its subjects' last events, their sequence unknown; claims
/// then judge those rows as before (no sequence check) and record sequences from then on.
#[test]
fn a_version_2_table_migrates_to_3_keeping_its_subjects() {
    let processed = ProcessedEvents::new("seen").unwrap();
    let mut conn = Connection::open_in_memory().unwrap();
    let mut version_2 = processed.render(VERSION_TABLE);
    for migration in &MIGRATIONS[..2] {
        version_2.push_str(&processed.render(migration.sql));
        version_2.push_str(&format!(
            "\nINSERT INTO seen_version (version) VALUES ({});\n",
            migration.version
        ));
    }
    conn.execute_batch(&version_2).unwrap();
    conn.execute_batch(
        "INSERT INTO seen VALUES ('evt-1', 'orders', '', 'live', 'created', 1);
         INSERT INTO seen VALUES ('evt-2', 'orders', '', 'live', 'created', 2);
         INSERT INTO seen VALUES ('evt-3', 'orders', '', 'live', 'deleted', 3);
         INSERT INTO seen_subjects VALUES ('orders', '', 'o1', 'evt-1', 'created', 1);
         INSERT INTO seen_subjects VALUES ('orders', '', 'o2', 'evt-3', 'deleted', 3);",
    )
    .unwrap();

    processed.migrate(&mut conn).unwrap();
    let version: i64 = conn
        .query_row("SELECT MAX(version) FROM seen_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, 3);
    assert!(!table_exists(&conn, "seen_subjects"));
    let mut statement = conn
        .prepare("SELECT subject, event_id, \"type\", applied_at, sequence FROM seen_last ORDER BY subject")
        .unwrap();
    let rows: Vec<(String, String, String, i64, Option<i64>)> = statement
        .query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    drop(statement);
    assert_eq!(
        rows,
        [
            ("o1".into(), "evt-1".into(), "created".into(), 1, None),
            ("o2".into(), "evt-3".into(), "deleted".into(), 3, None),
        ]
    );
    assert_eq!(count(&conn, "seen"), 3);

    let tx = conn.transaction().unwrap();
    // Still o1's last event: a redelivery, whatever its sequence.
    assert!(!processed.claim(&tx, &event("evt-1", 99, "o1")).unwrap());
    // o2 was deleted since evt-2 was applied: a re-create, applied again, with its sequence.
    assert!(processed.claim(&tx, &event("evt-2", 5, "o2")).unwrap());
    let sequence: Option<i64> = tx
        .query_row(
            "SELECT sequence FROM seen_last WHERE subject = 'o2'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(sequence, Some(5));
    // From now on a late copy of the delete (not newer than the re-create) is a duplicate.
    let mut late = event("evt-3", 4, "o2");
    late.event_type = EventType::Deleted;
    assert!(!processed.claim(&tx, &late).unwrap());
    tx.commit().unwrap();
}

#[test]
fn prune_removes_old_last_events_too() {
    let clock = ManualClock::new(T0);
    let processed = ProcessedEvents::new("seen")
        .unwrap()
        .with_clock(Arc::new(clock.clone()));
    let mut conn = Connection::open_in_memory().unwrap();
    processed.migrate(&mut conn).unwrap();
    let claim = |conn: &mut Connection, e: &Event| {
        let tx = conn.transaction().unwrap();
        assert!(processed.claim(&tx, e).unwrap());
        tx.commit().unwrap();
    };
    claim(&mut conn, &event("old", 1, "o1"));
    clock.advance(Duration::from_secs(3_600));
    claim(&mut conn, &event("new", 1, "o2"));
    assert_eq!(processed.prune(&conn, T0 + 1).unwrap(), 1);
    assert_eq!(count(&conn, "seen_last"), 1);
    assert!(processed.is_processed(&conn, "new").unwrap());
    assert!(!processed.is_processed(&conn, "old").unwrap());
}

/// A file database with a table `t` and the shared connection to it.
fn with_table(name: &str) -> (tempfile::TempDir, PathBuf, Arc<Mutex<Connection>>) {
    let (dir, path) = temp_file(name);
    let conn = connect(&path);
    conn.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (name TEXT PRIMARY KEY)")
        .unwrap();
    (dir, path, shared(conn))
}

/// Inserts `name` into `t` in `tx`; returns the rows changed.
async fn insert(tx: &mut SqliteTx, name: &'static str) -> usize {
    tx.run(move |t| t.execute("INSERT INTO t VALUES (?1)", [name]))
        .await
        .expect("the job ran")
        .expect("the insert")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_transaction_is_visible_and_a_dropped_one_rolls_back() {
    let (_dir, path, conn) = with_table("tx.db");
    let mut tx = SqliteTx::begin(&conn).await.unwrap();
    assert_eq!(insert(&mut tx, "kept").await, 1);
    let inside = tx
        .run(|t| t.query_row("SELECT count(*) FROM t", [], |r| r.get::<_, i64>(0)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(inside, 1, "a job sees the transaction's writes");
    assert_eq!(count(&connect(&path), "t"), 0, "nothing committed yet");
    tx.commit().await.unwrap();
    assert_eq!(count(&connect(&path), "t"), 1);

    // Dropped with a write in it (a crash, an aborted task).
    let mut tx = SqliteTx::begin(&conn).await.unwrap();
    insert(&mut tx, "dropped").await;
    drop(tx);
    // The next transaction on the connection begins once the dropped one's thread let go of it.
    let mut next = SqliteTx::begin(&conn).await.unwrap();
    let names = next
        .run(|t| {
            let mut statement = t.prepare("SELECT name FROM t ORDER BY name")?;
            statement
                .query_map([], |r| r.get::<_, String>(0))?
                .collect::<rusqlite::Result<Vec<_>>>()
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(names, ["kept"], "the dropped transaction's write survived");
    next.rollback().await.unwrap();
    assert_eq!(count(&connect(&path), "t"), 1);
    let autocommit = conn.lock().unwrap().is_autocommit();
    assert!(autocommit, "no transaction is left open");
}

/// A transaction dropped while its job runs (the task aborted mid-way) is rolled back once the
/// job returns; the job's own result goes nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_dropped_during_a_job_rolls_back_after_it() {
    let (_dir, path, conn) = with_table("abandoned.db");
    let mut tx = SqliteTx::begin(&conn).await.unwrap();
    let (started, is_running) = tokio::sync::oneshot::channel::<()>();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let task = tokio::spawn(async move {
        tx.run(move |t| {
            t.execute("INSERT INTO t VALUES ('during')", []).unwrap();
            let _ = started.send(());
            let _ = released.recv();
        })
        .await
    });
    is_running.await.unwrap();
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    release.send(()).unwrap();
    let locked = SqliteTx::begin(&conn).await.unwrap();
    locked.rollback().await.unwrap();
    assert_eq!(count(&connect(&path), "t"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_job_rolls_back_and_returns_an_error() {
    let (_dir, path, conn) = with_table("panic.db");
    let mut tx = SqliteTx::begin(&conn).await.unwrap();
    insert(&mut tx, "before").await;
    let panicked = tx
        .run(|t| {
            t.execute("INSERT INTO t VALUES ('in the job')", [])
                .unwrap();
            panic!("a projection that panics after writing");
        })
        .await;
    let error: Error = panicked.expect_err("the panic is an error");
    assert!(error.to_string().contains("panicked"), "{error}");
    let after = tx.run(|_| ()).await.expect_err("the handle is spent");
    assert!(after.to_string().contains("is over"), "{after}");
    tx.rollback().await.expect("rolled back already");
    assert_eq!(
        count(&connect(&path), "t"),
        0,
        "the writes were rolled back"
    );

    // The connection is fine (its mutex is not poisoned), and so is the runtime.
    assert!(!conn.is_poisoned());
    let mut tx = SqliteTx::begin(&conn).await.unwrap();
    insert(&mut tx, "after").await;
    tx.commit().await.unwrap();
    assert_eq!(count(&connect(&path), "t"), 1);

    // A commit after a panic fails rather than pretend.
    let mut tx = SqliteTx::begin(&conn).await.unwrap();
    let _ = tx.run(|_| panic!("again")).await;
    assert!(tx.commit().await.is_err());
}

/// An engine store, a consumer table fenced by it, in one file; `owner`'s lease on `orders/""`.
struct Fenced {
    _dir: tempfile::TempDir,
    path: PathBuf,
    store: SqliteStore,
    processed: ProcessedEvents,
    conn: Arc<Mutex<Connection>>,
}

impl Fenced {
    async fn new() -> Self {
        let (dir, path) = temp_file("fenced.db");
        let options = SqliteOptions::file(&path).table_prefix("engine_");
        let store = SqliteStore::open(options.clone()).unwrap();
        store.migrate().await.unwrap();
        let processed = ProcessedEvents::new("processed")
            .unwrap()
            .with_clock(Arc::new(ManualClock::new(T0)))
            .fenced_by(&options)
            .unwrap();
        let mut conn = connect(&path);
        processed.migrate(&mut conn).unwrap();
        conn.execute_batch("CREATE TABLE rm (subject TEXT PRIMARY KEY)")
            .unwrap();
        Self {
            _dir: dir,
            path,
            store,
            processed,
            conn: shared(conn),
        }
    }

    async fn lease(&self, owner: &str, now: i64) -> Fence {
        let key = PKey::new("orders", "");
        let lease = self
            .store
            .acquire_lease(&key, owner, TTL, now)
            .await
            .unwrap()
            .expect("the lease is free");
        Fence::new(key, lease.owner.as_str(), lease.epoch)
    }

    /// `check_fence` of `fence` in a transaction of its own.
    async fn check(&self, fence: &Fence) -> Result<()> {
        let mut tx = self.processed.begin(&self.conn).await.unwrap();
        let checked = self.processed.check_fence(&mut tx, fence).await;
        self.processed.rollback(tx).await.unwrap();
        checked
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_holds_for_the_current_lease_only() {
    let db = Fenced::new().await;
    let old = db.lease("node-a", T0).await;
    db.check(&old).await.expect("the holder's fence");
    let new = db.lease("node-b", T0 + TTL + 1).await;
    assert!(new.epoch > old.epoch);
    match db.check(&old).await {
        Err(Error::LeaseLost { epoch, .. }) => assert_eq!(epoch, old.epoch),
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    db.check(&new).await.expect("the new holder's fence");
    let stranger = Fence::new(new.key(), "node-c", new.epoch);
    assert!(matches!(
        db.check(&stranger).await,
        Err(Error::LeaseLost { .. })
    ));

    // Without fenced_by: Unsupported, saying what to configure.
    let unfenced = ProcessedEvents::new("processed").unwrap();
    let mut tx = unfenced.begin(&db.conn).await.unwrap();
    match unfenced.check_fence(&mut tx, &new).await {
        Err(Error::Unsupported { message }) => {
            assert!(message.contains("fenced_by"), "{message}");
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
    unfenced.rollback(tx).await.unwrap();
    let e = event("evt-1", 1, "o1");
    let refused = unfenced
        .apply_once_fenced(&db.conn, &e, &new, |_| Ok::<_, rusqlite::Error>(()))
        .await;
    assert!(
        matches!(refused, Err(ApplyError::Store(Error::Unsupported { .. }))),
        "{refused:?}"
    );
}

/// The projection of the fenced tests: a row per subject.
fn project(tx: &Transaction<'_>, e: &Event) -> rusqlite::Result<()> {
    tx.execute("INSERT INTO rm VALUES (?1)", [e.subject.as_str()])
        .map(drop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_apply_commits_only_under_the_current_lease() {
    let db = Fenced::new().await;
    let old = db.lease("node-a", T0).await;
    let new = db.lease("node-b", T0 + TTL + 1).await;
    let e = event("evt-1", 1, "o1");
    let reader = connect(&db.path);

    // The blocking flavour.
    let projected = e.clone();
    let stale = db
        .processed
        .apply_once_fenced(&db.conn, &e, &old, move |tx| project(tx, &projected))
        .await;
    assert!(
        matches!(&stale, Err(ApplyError::Store(Error::LeaseLost { epoch, .. })) if *epoch == old.epoch),
        "{stale:?}"
    );
    assert_eq!(count(&reader, "rm"), 0, "the stale projection committed");
    assert_eq!(count(&reader, "processed"), 0, "the stale marker committed");

    // The generic one, through SqliteTx.
    let stale = apply_generic(&db, e.clone(), Some(&old), false).await;
    assert!(
        matches!(&stale, Err(ApplyError::Store(Error::LeaseLost { .. }))),
        "{stale:?}"
    );
    assert_eq!(count(&reader, "rm"), 0);
    assert_eq!(count(&reader, "processed"), 0);

    let applied = apply_generic(&db, e.clone(), Some(&new), false).await;
    assert!(
        matches!(applied, Ok(ApplyOutcome::Applied(()))),
        "{applied:?}"
    );
    let projected = e.clone();
    let again = db
        .processed
        .apply_once_fenced(&db.conn, &e, &new, move |tx| project(tx, &projected))
        .await;
    assert!(matches!(again, Ok(ApplyOutcome::Deduplicated)), "{again:?}");
    assert_eq!(count(&reader, "rm"), 1);
    assert_eq!(count(&reader, "processed"), 1);
}

/// The generic `apply_once` of `e` into `rm` through `db`'s table, fenced by `fence` if given;
/// the projection panics after writing when `panic` is set.
async fn apply_generic(
    db: &Fenced,
    e: Event,
    fence: Option<&Fence>,
    panic: bool,
) -> std::result::Result<ApplyOutcome<()>, ApplyError<BoxError>> {
    let projected = e.clone();
    delivery::apply_once(&db.processed, &db.conn, &e, fence, move |tx| {
        Box::pin(async move {
            tx.run(move |t| {
                project(t, &projected)?;
                assert!(!panic, "a projection that panics after writing");
                Ok::<_, rusqlite::Error>(())
            })
            .await??;
            Ok::<_, BoxError>(())
        })
    })
    .await
}

/// The generic `apply_once` over `SqliteTx`: a projection that panics inside its job rolls back
/// (marker included) and fails; the redelivery applies once; a late copy is a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_generic_apply_once_runs_on_a_sqlite_tx() {
    let db = Fenced::new().await;
    let reader = connect(&db.path);
    let apply = |e: Event, panic: bool| apply_generic(&db, e, None, panic);
    let first = event("evt-1", 1, "o1");
    let crashed = apply(first.clone(), true).await;
    assert!(
        matches!(&crashed, Err(ApplyError::Projection(e)) if e.to_string().contains("panicked")),
        "{crashed:?}"
    );
    assert_eq!(count(&reader, "rm"), 0);
    assert_eq!(count(&reader, "processed"), 0);
    assert!(apply(first.clone(), false).await.unwrap().is_applied());
    assert!(apply(first.clone(), false).await.unwrap().is_deduplicated());
    let mut second = event("evt-2", 2, "o2");
    assert!(apply(second.clone(), false).await.unwrap().is_applied());
    second.sequence = 1;
    assert!(
        apply(second.clone(), false)
            .await
            .unwrap()
            .is_deduplicated()
    );
    assert!(
        ConsumerStore::is_processed(&db.processed, &db.conn, "evt-2")
            .await
            .unwrap()
    );
    assert_eq!(count(&reader, "rm"), 2);
}
