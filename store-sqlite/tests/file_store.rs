//! What the conformance suite cannot see: several stores on one file, the file's life cycle
//! (lazy creation, WAL, migrations, reopening after close) and bad input (files that are not
//! databases, corrupt data, places that cannot be written).

mod common;

use std::path::{Path, PathBuf};

use common::{temp_db, temp_dir};

use watukuy_conformance::cases::fixtures::{NODE_A, NODE_B, TTL, item, key, pending};
use watukuy_core::{
    Error, ErrorCode,
    store::{
        CommitBatch, Lease, LogQuery, PKey, ParkedAction, ParkedQuery, StatePatch, Store,
        StoreErrorKind,
    },
};
use watukuy_store_sqlite::{SCHEMA_VERSION, SqliteOptions, SqliteStore, Synchronous};
use watukuy_testkit::T0;

fn file_store(path: &Path) -> SqliteStore {
    SqliteStore::open(SqliteOptions::file(path)).expect("valid options")
}

/// A page holding `identities` as items and one pending event per identity, from `first_seq`.
fn page(key: &PKey, identities: &[&str], first_seq: i64) -> CommitBatch {
    let events: Vec<_> = identities
        .iter()
        .zip(first_seq..)
        .map(|(id, seq)| pending(key, &format!("evt-{seq}"), seq, id))
        .collect();
    CommitBatch::default()
        .state_patch(StatePatch {
            sequence: events.last().map(|row| row.sequence),
            updated_at: Some(T0),
            ..StatePatch::default()
        })
        .upserts(identities.iter().map(|id| item(id, "h")).collect())
        .events(events)
        .log(true)
}

/// Takes `key`'s free lease for `owner` at `T0`.
async fn take_lease(store: &SqliteStore, key: &PKey, owner: &str) -> Lease {
    store
        .acquire_lease(key, owner, TTL, T0)
        .await
        .unwrap()
        .expect("the key is free")
}

/// Takes `key`'s lease for `NODE_A` at `T0` and commits one page of `identities` under it.
async fn leased_page(
    store: &SqliteStore,
    key: &PKey,
    identities: &[&str],
    first_seq: i64,
) -> Lease {
    let lease = take_lease(store, key, NODE_A).await;
    store
        .commit_poll(key, &lease, &page(key, identities, first_seq))
        .await
        .unwrap();
    lease
}

/// A patch that only pauses the key.
fn paused() -> StatePatch {
    StatePatch {
        paused: Some(true),
        ..StatePatch::default()
    }
}

/// Retries or discards `ids` among `key`'s parked rows; how many rows it resolved.
async fn resolve(store: &SqliteStore, key: &PKey, ids: &[String], action: ParkedAction) -> u64 {
    store.resolve_parked(key, ids, action).await.unwrap()
}

/// The store error's kind and transient flag, or a panic naming what came instead.
fn store_kind<T: std::fmt::Debug>(result: Result<T, Error>) -> (StoreErrorKind, bool, String) {
    match result {
        Err(Error::Store {
            kind,
            transient,
            message,
            ..
        }) => (kind, transient, message),
        other => panic!("expected a Store error, got {other:?}"),
    }
}

/// The message of a permanent `Corrupt` store error, or a panic naming what came instead.
fn corrupt_message<T: std::fmt::Debug>(result: Result<T, Error>) -> String {
    let (kind, transient, message) = store_kind(result);
    assert_eq!(
        (kind, transient),
        (StoreErrorKind::Corrupt, false),
        "{message}"
    );
    message
}

/// Runs raw SQL on the file, as another program (or a careless operator) would.
fn raw(path: &Path, sql: &str) {
    let conn = rusqlite::Connection::open(path).expect("raw connection");
    conn.execute_batch(sql).expect("raw SQL");
}

// ---------------------------------------------------------------------------------------------
// Several stores on one file.

/// Writers of two stores on one file, racing, never see a busy error: BEGIN IMMEDIATE waits for
/// the other store's transaction (busy timeout), and every commit lands exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_on_one_file_all_land() {
    const PAGES: i64 = 40;
    let (_dir, path) = temp_db("race.db");
    let a = file_store(&path);
    let b = file_store(&path);
    a.migrate().await.unwrap();
    let key_a = PKey::new("orders", "a");
    let key_b = PKey::new("orders", "b");
    let lease_a = take_lease(&a, &key_a, NODE_A).await;
    let lease_b = take_lease(&b, &key_b, NODE_B).await;

    let run = |store: &'static SqliteStore, key: PKey, lease: Lease| async move {
        for n in 1..=PAGES {
            let id = format!("item-{n}");
            store
                .commit_poll(&key, &lease, &page(&key, &[id.as_str()], n))
                .await
                .expect("no busy error escapes the busy timeout");
            store
                .counts(&key)
                .await
                .map(|c| c.pending)
                .expect("reads work meanwhile");
        }
    };
    // The stores live for the rest of the test; leaking two small values keeps the tasks simple.
    let a: &'static SqliteStore = Box::leak(Box::new(a));
    let b: &'static SqliteStore = Box::leak(Box::new(b));
    let ta = tokio::spawn(run(a, key_a.clone(), lease_a));
    let tb = tokio::spawn(run(b, key_b.clone(), lease_b));
    ta.await.unwrap();
    tb.await.unwrap();
    for (store, key) in [(a, &key_a), (b, &key_b), (a, &key_b), (b, &key_a)] {
        assert_eq!(store.counts(key).await.map(|c| c.items).unwrap(), 40);
        assert_eq!(store.counts(key).await.map(|c| c.pending).unwrap(), 40);
        let state = store.load_state(key).await.unwrap().unwrap();
        assert_eq!(state.sequence, PAGES);
    }
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// Two prefixes on one file are two independent stores: own schema version, own epochs, own data.
#[tokio::test]
async fn prefixes_share_a_file_independently() {
    let (_dir, path) = temp_db("prefixes.db");
    let first = SqliteStore::open(SqliteOptions::file(&path).table_prefix("first_")).unwrap();
    let second = SqliteStore::open(SqliteOptions::file(&path).table_prefix("")).unwrap();
    let key = key();
    let l1 = take_lease(&first, &key, NODE_A).await;
    let l2 = take_lease(&second, &key, NODE_B).await;
    assert_eq!(
        (l1.epoch, l2.epoch),
        (1, 1),
        "each prefix has its own leases"
    );
    first
        .commit_poll(&key, &l1, &page(&key, &["only-in-first"], 1))
        .await
        .unwrap();
    assert_eq!(first.counts(&key).await.map(|c| c.items).unwrap(), 1);
    assert_eq!(second.counts(&key).await.map(|c| c.items).unwrap(), 0);
    assert_eq!(second.load_state(&key).await.unwrap(), None);

    let conn = rusqlite::Connection::open(&path).unwrap();
    for table in ["first_schema_version", "schema_version"] {
        let version: i64 = conn
            .query_row(&format!("SELECT MAX(version) FROM {table}"), [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(version, i64::from(SCHEMA_VERSION), "{table}");
    }
}

/// Id lists longer than one `IN` chunk (500) work everywhere they are accepted: loading
/// versions, deleting items, acking events, retrying and discarding parked rows.
#[tokio::test]
async fn long_id_lists_are_chunked() {
    let dir = temp_dir();
    let store = file_store(&dir.path().join("chunks.db"));
    let key = key();
    let ids: Vec<String> = (0..1_234).map(|n| format!("id-{n:05}")).collect();
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let lease = leased_page(&store, &key, &refs, 1).await;

    // Every other id, plus ids that do not exist, and a duplicate.
    let mut asked: Vec<String> = ids.iter().step_by(2).cloned().collect();
    asked.extend((0..300).map(|n| format!("missing-{n}")));
    asked.push(ids[0].clone());
    let rows = store.load_versions(&key, &asked).await.unwrap();
    assert_eq!(rows.len(), 617);

    let delete: Vec<String> = ids.iter().take(1_100).cloned().collect();
    store
        .commit_poll(&key, &lease, &CommitBatch::default().deletes(delete))
        .await
        .unwrap();
    assert_eq!(store.counts(&key).await.map(|c| c.items).unwrap(), 134);

    let events: Vec<String> = (1..=1_234).map(|seq| format!("evt-{seq}")).collect();
    store
        .ack_events(&key, &lease, &events[..1_000])
        .await
        .unwrap();
    assert_eq!(store.counts(&key).await.map(|c| c.pending).unwrap(), 234);

    // Park the remaining 234 events, then retry 100 and discard the rest (with unknown ids).
    let remaining = store.load_pending(&key, 1_000).await.unwrap();
    for row in &remaining {
        let parked = watukuy_conformance::cases::fixtures::poison(row.event.clone(), None, T0);
        store.park_event(&key, &lease, &parked).await.unwrap();
    }
    assert_eq!(store.counts(&key).await.map(|c| c.pending).unwrap(), 0);
    let mut retry: Vec<String> = events[1_000..1_100].to_vec();
    retry.extend((0..600).map(|n| format!("unknown-{n}")));
    assert_eq!(
        resolve(&store, &key, &retry, ParkedAction::Retry).await,
        100
    );
    assert_eq!(store.counts(&key).await.map(|c| c.pending).unwrap(), 100);
    let mut discard: Vec<String> = events.clone();
    discard.extend(events[1_100..].iter().cloned());
    assert_eq!(
        resolve(&store, &key, &discard, ParkedAction::Discard).await,
        134
    );
    assert_eq!(store.counts(&key).await.map(|c| c.parked).unwrap(), 0);
}

// ---------------------------------------------------------------------------------------------
// The file's life cycle.

/// Opening touches nothing; the first call that needs the database creates the file (and its
/// schema), as `migrate()` does.
#[tokio::test]
async fn no_file_is_touched_before_first_use() {
    let dir = temp_dir();
    let lazy = dir.path().join("lazy.db");
    let store = file_store(&lazy);
    assert!(!lazy.exists(), "open() created the file");
    assert_eq!(store.get_lease(&key()).await.unwrap(), None);
    assert!(lazy.exists(), "the first use creates the file");
    let tables: i64 = rusqlite::Connection::open(&lazy)
        .unwrap()
        .query_row(
            "SELECT COUNT(*) FROM sqlite_schema WHERE type = 'table' AND name LIKE 'watukuy_%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(
        tables, 7,
        "the first use migrated (six tables + schema_version)"
    );

    let explicit = dir.path().join("explicit.db");
    let store = file_store(&explicit);
    assert!(!explicit.exists());
    store.migrate().await.unwrap();
    assert!(explicit.exists(), "migrate() creates the file");

    // A store whose directory does not exist opens fine (no I/O) and fails only when used.
    let missing = dir.path().join("no-such-dir").join("x.db");
    let store = file_store(&missing);
    let (kind, transient, message) = store_kind(store.migrate().await);
    assert_eq!((kind, transient), (StoreErrorKind::Connection, false));
    assert!(message.contains("no-such-dir"), "{message}");
}

/// File databases run in WAL mode.
#[tokio::test]
async fn file_databases_use_wal() {
    let (_dir, path) = temp_db("wal.db");
    let store = file_store(&path);
    store.migrate().await.unwrap();
    let mode: String = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
}

/// The durability level: `FULL` unless asked otherwise (file and in-memory databases), `NORMAL`
/// when asked, applied again when a closed store reopens, and per store: two stores on one file
/// each keep their own level (it is a setting of the connection, not of the file).
#[tokio::test]
async fn synchronous_is_full_by_default_and_normal_when_asked() {
    let (_dir, path) = temp_db("sync.db");
    let full = file_store(&path);
    assert_eq!(
        full.synchronous_in_effect().await.unwrap(),
        Synchronous::Full
    );
    let memory = SqliteStore::open(SqliteOptions::in_memory()).unwrap();
    assert_eq!(
        memory.synchronous_in_effect().await.unwrap(),
        Synchronous::Full
    );

    let normal =
        SqliteStore::open(SqliteOptions::file(&path).synchronous(Synchronous::Normal)).unwrap();
    assert_eq!(
        normal.synchronous_in_effect().await.unwrap(),
        Synchronous::Normal
    );
    assert_eq!(
        full.synchronous_in_effect().await.unwrap(),
        Synchronous::Full,
        "another store's level does not change this one's"
    );
    let key = key();
    leased_page(&normal, &key, &["a"], 1).await;
    normal.close().await.unwrap();
    assert_eq!(
        normal.synchronous_in_effect().await.unwrap(),
        Synchronous::Normal,
        "a reopened store applies its level again"
    );
    assert_eq!(full.counts(&key).await.map(|c| c.items).unwrap(), 1);
    let memory_normal =
        SqliteStore::open(SqliteOptions::in_memory().synchronous(Synchronous::Normal)).unwrap();
    assert_eq!(
        memory_normal.synchronous_in_effect().await.unwrap(),
        Synchronous::Normal
    );
}

/// After `close()` the data stays and the next call reopens the file; a new store on the same
/// path sees everything; a closed in-memory store keeps its data too.
#[tokio::test]
async fn reopen_after_close() {
    let (_dir, path) = temp_db("reopen.db");
    let store = SqliteStore::open(SqliteOptions::file(&path).table_prefix("t_")).unwrap();
    let key = key();
    let lease = leased_page(&store, &key, &["a", "b"], 1).await;
    store.close().await.unwrap();
    store.close().await.unwrap();
    assert_eq!(
        store.counts(&key).await.map(|c| c.items).unwrap(),
        2,
        "reopened lazily"
    );
    store
        .commit_poll(&key, &lease, &page(&key, &["c"], 3))
        .await
        .expect("the lease still fences after a reopen");
    store.close().await.unwrap();

    let again = SqliteStore::open(SqliteOptions::file(&path).table_prefix("t_")).unwrap();
    assert_eq!(again.counts(&key).await.map(|c| c.items).unwrap(), 3);
    assert_eq!(again.get_lease(&key).await.unwrap(), Some(lease.clone()));
    let logged = again.read_log(&key, LogQuery::default(), 10).await.unwrap();
    assert_eq!(logged.len(), 3);

    let memory = SqliteStore::open(SqliteOptions::in_memory()).unwrap();
    leased_page(&memory, &key, &["m"], 1).await;
    memory.close().await.unwrap();
    assert_eq!(
        memory.counts(&key).await.map(|c| c.items).unwrap(),
        1,
        "closing an in-memory store keeps its data"
    );
}

/// `close()` returns once every connection is closed: the last one to close checkpoints the WAL
/// into the database and removes the WAL file, so the file is whole on its own (it can be
/// copied or moved) as soon as `close()` returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_returns_after_the_connections_are_closed() {
    let (_dir, path) = temp_db("closed.db");
    for synchronous in [Synchronous::Full, Synchronous::Normal] {
        let store = SqliteStore::open(SqliteOptions::file(&path).synchronous(synchronous)).unwrap();
        let key = key();
        store.delete_key(&key).await.unwrap();
        leased_page(&store, &key, &["a", "b"], 1).await;
        // A read opens a read connection too.
        assert_eq!(store.counts(&key).await.map(|c| c.items).unwrap(), 2);
        assert!(wal_path(&path).exists(), "the WAL is in use while open");
        store.close().await.unwrap();
        assert!(
            !wal_path(&path).exists(),
            "{synchronous}: close() returned before the last connection closed"
        );
        let count: i64 = rusqlite::Connection::open(&path)
            .unwrap()
            .query_row("SELECT COUNT(*) FROM watukuy_items", [], |r| r.get(0))
            .unwrap();
        assert_eq!(
            count, 2,
            "{synchronous}: the checkpointed file holds the data"
        );
    }
}

/// The exported DDL lets a team create the schema itself; the store then finds it current.
#[tokio::test]
async fn externally_managed_schema_is_used_as_is() {
    let (_dir, path) = temp_db("managed.db");
    let text = SqliteStore::ddl(&SqliteOptions::file(&path).table_prefix("managed_")).unwrap();
    raw(&path, &text);
    raw(&path, &text);
    let store = SqliteStore::open(SqliteOptions::file(&path).table_prefix("managed_")).unwrap();
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    let key = key();
    leased_page(&store, &key, &["x"], 1).await;
    let versions: i64 = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("SELECT COUNT(*) FROM managed_schema_version", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(
        versions,
        i64::from(SCHEMA_VERSION),
        "one row per applied migration"
    );
}

/// Invalid options are `Config` errors naming the option, at `open`, before any I/O.
#[test]
fn invalid_options_are_config_errors() {
    let (_dir, path) = temp_db("never.db");
    for prefix in ["1x", "a-b", "x; DROP TABLE y", "é"] {
        let error =
            SqliteStore::open(SqliteOptions::file(&path).table_prefix(prefix)).expect_err(prefix);
        assert_eq!(error.code(), ErrorCode::Config);
        assert!(error.to_string().contains("sqlite.table_prefix"), "{error}");
    }
    let error = SqliteStore::open(SqliteOptions::file("")).expect_err("empty path");
    assert!(error.to_string().contains("sqlite.path"), "{error}");
    // The level is an enum, so only text can be wrong: `off` is refused, not mapped.
    let error = "off".parse::<Synchronous>().expect_err("off");
    assert_eq!(error.code(), ErrorCode::Config);
    assert!(error.to_string().contains("sqlite.synchronous"), "{error}");
    assert!(!path.exists());
}

// ---------------------------------------------------------------------------------------------
// Bad input.

/// A file that is not a SQLite database is a clear, permanent `Corrupt` store error naming the
/// file, at `migrate()` and at first use, and the file is left as it was.
#[tokio::test]
async fn a_non_sqlite_file_is_a_clear_store_error() {
    let (_dir, path) = temp_db("notes.txt");
    let content = "these are my notes, not a database\n".repeat(200);
    std::fs::write(&path, &content).unwrap();

    let store = file_store(&path);
    let message = corrupt_message(store.migrate().await);
    assert!(message.contains("not a SQLite database"), "{message}");
    assert!(message.contains("notes.txt"), "{message}");

    let other = file_store(&path);
    let (kind, _, _) = store_kind(other.load_state(&key()).await);
    assert_eq!(kind, StoreErrorKind::Corrupt);
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        content,
        "the file was changed"
    );
}

/// A database whose pages were overwritten is a `Corrupt` store error, not a panic.
#[tokio::test]
async fn a_corrupt_database_is_a_clear_store_error() {
    let (_dir, path) = temp_db("corrupt.db");
    let store = file_store(&path);
    let key = key();
    let ids: Vec<String> = (0..300).map(|n| format!("item-{n:04}")).collect();
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    leased_page(&store, &key, &refs, 1).await;
    store.close().await.unwrap();
    drop(store);
    assert!(
        !wal_path(&path).exists(),
        "closing the last connection checkpoints the WAL into the file"
    );

    // Keep page 1 (header and schema), trash every other page.
    let mut bytes = std::fs::read(&path).unwrap();
    assert!(bytes.len() > 8 * 4096, "the database spans several pages");
    for (n, byte) in bytes.iter_mut().enumerate().skip(4096) {
        *byte = u8::try_from(n % 251).unwrap_or(0) ^ 0xA5;
    }
    std::fs::write(&path, &bytes).unwrap();

    let store = file_store(&path);
    let message = corrupt_message(store.migrate().await);
    assert!(message.contains("corrupt.db"), "{message}");
    let (kind, _, _) = store_kind(store.counts(&key).await.map(|c| c.items));
    assert_eq!(kind, StoreErrorKind::Corrupt);
}

fn wal_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push("-wal");
    PathBuf::from(name)
}

/// Stored rows that cannot be decoded are `Corrupt` store errors, never panics, and a fenced
/// write over a corrupt state changes nothing: beyond the suite's
/// `setup::undecodable_rows_are_corrupt_errors` (state, items, pending events), the parked rows,
/// the log, values of the wrong range or type, and a write over a corrupt state.
#[tokio::test]
async fn undecodable_rows_are_corrupt_errors() {
    let (_dir, path) = temp_db("rows.db");
    let store = file_store(&path);
    let key = key();
    let lease = take_lease(&store, &key, NODE_A).await;
    let mut batch = page(&key, &["i1"], 1);
    batch.upserts[0].payload = Some(watukuy_core::json::Json::parse(r#"{"ok":true}"#).unwrap());
    batch.parked = vec![watukuy_conformance::cases::fixtures::invalid(
        "invalid:x",
        r#"{"id":"x"}"#,
        T0,
    )];
    store.commit_poll(&key, &lease, &batch).await.unwrap();

    raw(
        &path,
        "UPDATE watukuy_pollers SET state = '{\"lanes\": oops';
         UPDATE watukuy_parked SET kind = 'mystery';
         UPDATE watukuy_log SET event = 'not json';",
    );
    let corrupt = |result: Result<(), Error>, what: &str| {
        let (kind, transient, message) = store_kind(result);
        assert_eq!(
            (kind, transient),
            (StoreErrorKind::Corrupt, false),
            "{what}: {message}"
        );
    };
    corrupt(
        store
            .list_parked(&key, ParkedQuery::default())
            .await
            .map(drop),
        "list_parked",
    );
    corrupt(
        store
            .read_log(&key, LogQuery::default(), 10)
            .await
            .map(drop),
        "read_log",
    );
    corrupt(
        store.save_state(&key, &lease, &paused()).await,
        "save_state over a corrupt state",
    );
    let state: String = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("SELECT state FROM watukuy_pollers", [], |r| r.get(0))
        .unwrap();
    assert_eq!(state, "{\"lanes\": oops", "the failed save rolled back");

    // Values of the wrong range or type: a negative attempt count, a text schema version.
    let event = serde_json::to_string(&pending(&key, "evt-1", 1, "i1").event).unwrap();
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute(
            "UPDATE watukuy_outbox SET attempts = -1, event = ?1",
            [event],
        )
        .unwrap();
    corrupt(
        store.load_pending(&key, 10).await.map(drop),
        "a negative attempt count",
    );
    raw(
        &path,
        "UPDATE watukuy_items SET schema_version = 'text', payload = NULL;",
    );
    corrupt(
        store.load_versions(&key, &["i1".into()]).await.map(drop),
        "a text schema_version",
    );
}

/// A location nobody may write (here: the root of procfs, read-only even for root) gives a clear,
/// permanent store error naming the path at `migrate()`.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_read_only_location_fails_clearly_at_migrate() {
    let path = Path::new("/proc/watukuy-sqlite-test.db");
    let store = file_store(path);
    let (kind, transient, message) = store_kind(store.migrate().await);
    assert!(!transient, "{message}");
    assert!(
        matches!(kind, StoreErrorKind::Connection | StoreErrorKind::Rejected),
        "{kind:?}: {message}"
    );
    assert!(
        message.contains("/proc/watukuy-sqlite-test.db"),
        "{message}"
    );
}
