//! The consumer suite (`watukuy_conformance::consumer_tests!`) on SQLite: each case on a file of
//! its own holding the processed-events table, the suite's read model and the engine store (a
//! `SqliteStore`) whose leases fence the consumer.
//!
//! The two instances are two connections to the file. SQLite has no view of who waits for a
//! lock (nothing like PostgreSQL's `pg_stat_activity`), so `waiting()` watches the connections'
//! busy handler instead: SQLite calls it, again and again, while a statement of that connection
//! waits for another connection's lock (a claim's `BEGIN IMMEDIATE` behind the other instance's
//! open transaction). The handler counts its calls; `waiting()` is true when the count moves
//! while it looks, i.e. a transaction of this file is blocked right now, not merely earlier.
//!
//! rusqlite takes a busy handler as a plain `fn`, which cannot capture the case's counter, so
//! each database takes one of a few slots, each with a handler of its own (`busy::<SLOT>`) and
//! a counter of its own: cases running in parallel do not see each other's waits. A busy handler
//! replaces the connection's busy timeout; this one bounds the wait by its number of calls
//! instead (it yields the thread between tries rather than sleeping).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use rusqlite::{Connection, Transaction};
use watukuy_conformance::consumer::{ConsumerDb, ConsumerHarness, ModelRow};
use watukuy_conformance::{CaseError, OrFail};
use watukuy_core::{BoxError, Event, EventType, clock::ManualClock, store::Store};
use watukuy_store_sqlite::{ProcessedEvents, SqliteOptions, SqliteStore, SqliteTx};

/// How many databases may be open at once (each case has one, and its rebuilt model shares
/// it).
const SLOTS: usize = 16;

/// How many times a busy handler lets a statement try again before it fails with `Busy`: the
/// harness connections' busy timeout, counted in tries (each yields the thread once), which is
/// far longer than any wait of the suite.
const MAX_TRIES: i32 = 20_000_000;

/// The busy-handler calls per slot.
static CALLS: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];

/// Which slots a database holds.
static TAKEN: Mutex<[bool; SLOTS]> = Mutex::new([false; SLOTS]);

/// The busy handler of slot `SLOT`: counts the call, yields the thread, and tries again up to
/// [`MAX_TRIES`] times.
fn busy<const SLOT: usize>(tries: i32) -> bool {
    CALLS[SLOT].fetch_add(1, Ordering::SeqCst);
    std::thread::yield_now();
    tries < MAX_TRIES
}

/// One busy handler per slot.
const HANDLERS: [fn(i32) -> bool; SLOTS] = [
    busy::<0>, busy::<1>, busy::<2>, busy::<3>, busy::<4>, busy::<5>, busy::<6>, busy::<7>,
    busy::<8>, busy::<9>, busy::<10>, busy::<11>, busy::<12>, busy::<13>, busy::<14>, busy::<15>,
];

/// A slot held by a database; released when dropped.
struct Slot(usize);

impl Slot {
    fn take() -> Result<Self, CaseError> {
        let mut taken = TAKEN.lock().unwrap_or_else(PoisonError::into_inner);
        let free = taken
            .iter()
            .position(|t| !t)
            .ok_or_else(|| CaseError::failed(format!("more than {SLOTS} consumer databases")))?;
        taken[free] = true;
        Ok(Self(free))
    }

    fn calls(&self) -> u64 {
        CALLS[self.0].load(Ordering::SeqCst)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        TAKEN.lock().unwrap_or_else(PoisonError::into_inner)[self.0] = false;
    }
}

/// A connection to `path` whose waits for locks are counted in `slot`.
fn instance(path: &Path, slot: &Slot) -> Result<Arc<Mutex<Connection>>, CaseError> {
    let conn = Connection::open(path).or_fail_with("open a consumer connection")?;
    conn.busy_handler(Some(HANDLERS[slot.0]))
        .or_fail_with("install the busy handler")?;
    Ok(Arc::new(Mutex::new(conn)))
}

/// A plain connection to `path` (reads of the suite, migrations), with a busy timeout.
fn plain(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(30))?;
    Ok(conn)
}

/// Runs `f` on a plain connection to `path`, on the blocking pool.
async fn with_plain<T, F>(path: &Path, what: &'static str, f: F) -> Result<T, CaseError>
where
    T: Send + 'static,
    F: FnOnce(&mut Connection) -> Result<T, CaseError> + Send + 'static,
{
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || f(&mut plain(&path).or_fail_with(what)?))
        .await
        .or_fail_with(what)?
}

/// What a case's database and its rebuilt model share: the file and its directory, the two
/// instances' connections, the engine store and the busy slot.
struct File {
    dir: PathBuf,
    path: PathBuf,
    options: SqliteOptions,
    store: Arc<SqliteStore>,
    conns: [Arc<Mutex<Connection>>; 2],
    /// Last, so the connections are closed before another database takes the slot.
    slot: Slot,
}

/// A file with a processed-events table `processed<suffix>` and a read model `rm<suffix>`.
struct SqliteConsumerDb {
    file: Arc<File>,
    suffix: String,
    processed: ProcessedEvents,
    clock: ManualClock,
}

impl SqliteConsumerDb {
    async fn new(file: Arc<File>, suffix: &str, clock: ManualClock) -> Result<Self, CaseError> {
        let processed = ProcessedEvents::new(format!("processed{suffix}"))?
            .with_clock(Arc::new(clock.clone()))
            .fenced_by(&file.options)?;
        let model = format!("rm{suffix}");
        let migrated = processed.clone();
        with_plain(&file.path, "create the consumer tables", move |conn| {
            migrated.migrate(conn)?;
            conn.execute_batch(&format!(
                "CREATE TABLE {model} (subject TEXT PRIMARY KEY, value TEXT, applications INTEGER NOT NULL)"
            ))
            .or_fail_with("create the read model")
        })
        .await?;
        Ok(Self {
            file,
            suffix: suffix.to_owned(),
            processed,
            clock,
        })
    }

    fn model(&self) -> String {
        format!("rm{}", self.suffix)
    }
}

/// The suite's projection into `table`.
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

#[async_trait::async_trait]
impl ConsumerDb for SqliteConsumerDb {
    type Consumer = ProcessedEvents;

    /// One writer at a time: the takeover's lease write waits for the frozen transaction.
    fn leases_beside_an_open_write(&self) -> bool {
        false
    }

    fn consumer(&self) -> &ProcessedEvents {
        &self.processed
    }

    fn conn(&self, instance: usize) -> &Arc<Mutex<Connection>> {
        &self.file.conns[instance % 2]
    }

    fn clock(&self) -> &ManualClock {
        &self.clock
    }

    fn engine_store(&self) -> Arc<dyn Store> {
        self.file.store.clone()
    }

    fn project<'t>(
        &'t self,
        tx: &'t mut SqliteTx,
        event: &'t Event,
    ) -> BoxFuture<'t, Result<(), BoxError>> {
        let (table, event) = (self.model(), event.clone());
        Box::pin(async move {
            tx.run(move |t| project(t, &table, &event)).await??;
            Ok(())
        })
    }

    fn fail<'t>(&'t self, tx: &'t mut SqliteTx) -> BoxFuture<'t, Result<(), BoxError>> {
        Box::pin(async move {
            tx.run(|t| t.execute("INSERT INTO no_such_table VALUES (1)", []))
                .await??;
            Ok(())
        })
    }

    async fn rows(&self) -> Result<Vec<ModelRow>, CaseError> {
        let sql = format!(
            "SELECT subject, value, applications FROM {} ORDER BY subject",
            self.model()
        );
        with_plain(&self.file.path, "read the model", move |conn| {
            let mut statement = conn.prepare(&sql).or_fail_with("read the model")?;
            let rows = statement
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>());
            rows.or_fail_with("read the model")
        })
        .await
    }

    async fn markers(&self) -> Result<u64, CaseError> {
        let sql = format!("SELECT count(*) FROM {}", self.processed.table());
        let n: i64 = with_plain(&self.file.path, "count markers", move |conn| {
            conn.query_row(&sql, [], |r| r.get(0))
                .or_fail_with("count markers")
        })
        .await?;
        u64::try_from(n).or_fail()
    }

    /// On a connection of its own each time, so concurrent migrations really overlap.
    async fn migrate(&self) -> Result<(), CaseError> {
        let processed = self.processed.clone();
        with_plain(&self.file.path, "migrate", move |conn| {
            Ok(processed.migrate(conn)?)
        })
        .await
    }

    /// Whether the busy handler of this file's connections is being called right now: its
    /// count moves while this looks (see the module documentation).
    async fn waiting(&self) -> Result<bool, CaseError> {
        let before = self.file.slot.calls();
        for _ in 0..32 {
            tokio::task::yield_now().await;
            if self.file.slot.calls() != before {
                return Ok(true);
            }
        }
        Ok(false)
    }

    async fn rebuilt(&self) -> Result<Self, CaseError> {
        Self::new(
            Arc::clone(&self.file),
            &format!("{}_rebuilt", self.suffix),
            self.clock.clone(),
        )
        .await
    }
}

/// A new file per case in a temporary directory, removed when the case passed (a failing case
/// leaves it behind; its path is printed with the case's output).
struct SqliteConsumers;

#[async_trait::async_trait]
impl ConsumerHarness for SqliteConsumers {
    type Db = SqliteConsumerDb;

    async fn fresh(
        &self,
        name: &'static str,
        clock: ManualClock,
    ) -> Result<SqliteConsumerDb, CaseError> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("watukuy-sqlite-consumer-{name}-"))
            .tempdir()
            .or_fail_with("a temporary directory")?
            .keep();
        let path = dir.join("consumer.db");
        eprintln!("[sqlite consumer] {name} uses {}", path.display());
        let options = SqliteOptions::file(&path);
        let store = SqliteStore::open(options.clone())?;
        // Creates the file in WAL mode, where readers never wait for the claims' write lock.
        store.migrate().await?;
        let slot = Slot::take()?;
        let conns = [instance(&path, &slot)?, instance(&path, &slot)?];
        let file = Arc::new(File {
            dir,
            path,
            options,
            store: Arc::new(store),
            conns,
            slot,
        });
        SqliteConsumerDb::new(file, "", clock).await
    }

    async fn cleanup(&self, db: Arc<SqliteConsumerDb>) {
        let file = Arc::clone(&db.file);
        drop(db);
        // Best effort: a leftover temporary directory is harmless.
        let _ = file.store.close().await;
        let _ = std::fs::remove_dir_all(&file.dir);
    }
}

watukuy_conformance::consumer_tests!(SqliteConsumers);
