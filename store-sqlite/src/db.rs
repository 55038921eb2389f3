//! Connections: one writer and a few readers per store, opened lazily, used off the runtime.
//!
//! No async task ever waits on SQLite. Writes go through ONE writer connection, owned by a
//! thread of its own that runs the store's writes one after another from a queue: writers of one
//! store queue in memory instead of spinning in SQLite's busy handler, and a write transaction
//! never meets a lock held by its own store. Other processes (or other stores on the same file)
//! are serialized by SQLite's file locks, waiting up to the busy timeout. Reads of a file
//! database run on tokio's blocking pool (`spawn_blocking`) over up to `max_readers` read
//! connections: in WAL mode they see the last committed transaction and never block the writer,
//! nor are they blocked by it.
//!
//! Group commit: the writer takes every transactional write already queued when it starts one
//! (up to 32) into ONE `BEGIN IMMEDIATE` transaction, each write in a savepoint of its own, and
//! commits once: concurrent writers (many keys, an ack flush beside a page's commit) share one
//! commit and, under `synchronous = FULL`, one `fsync`. A write that fails (a lost fence, a
//! constraint, a panic) rolls back to its savepoint and fails alone; callers are answered after
//! the commit, so nobody hears "done" before the write is durable. A lone write runs in a
//! transaction of its own, without a savepoint: a savepoint makes SQLite copy each page the write
//! changes into a sub-journal first (measured: dispatch-only ~25 % slower with one per write).
//!
//! Why the writer has a thread rather than the blocking pool behind an async mutex (as it had
//! first): the writes of one store are serialized either way, and with a queue the writer goes
//! from one write straight to the next. Behind the mutex, every write woke the next writer's task,
//! which then handed its closure to a blocking thread: two thread wake-ups between consecutive
//! writes. A lone write pays one hop there and back either way; to a waiting thread over a
//! channel that hop is the cheaper one (an empty round trip measured ~2.5 µs against ~5.5 µs for
//! `spawn_blocking`).
//!
//! A private in-memory database has ONE connection for reads and writes (the writer). Each
//! connection to `:memory:` is its own database, and the shared-cache alternative
//! (`file:name?mode=memory&cache=shared`) reports table locks between connections as
//! `SQLITE_LOCKED`, which the busy timeout never retries; an in-memory database has no WAL, so
//! extra connections would buy no concurrency anyway.

use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::thread::JoinHandle;

use rusqlite::{Connection, OpenFlags, TransactionBehavior};
use tokio::sync::{Semaphore, oneshot};
use watukuy_core::{Error, Result, store::StoreErrorKind};

use crate::error::{DbResult, Failure};
use crate::options::{Location, SqliteOptions};
use crate::sql::{MIGRATIONS, SCHEMA_VERSION, Sql};

/// Statements cached per connection: every named statement plus the chunked variants and the
/// group commit's transaction-control statements.
const STATEMENT_CACHE: usize = 112;

/// What every blocking closure may read: the statements and the database's location.
#[derive(Debug)]
pub(crate) struct Ctx {
    /// Every statement with the prefix spliced in.
    pub(crate) sql: Sql,
    /// Where the data lives (for error messages too).
    pub(crate) location: Location,
    options: SqliteOptions,
}

impl Ctx {
    pub(crate) fn new(options: SqliteOptions) -> Self {
        Self {
            sql: Sql::new(options.prefix()),
            location: options.location().clone(),
            options,
        }
    }
}

/// The open connections of a store.
pub(crate) struct Db {
    ctx: Arc<Ctx>,
    writer: Writer,
    /// `None` for an in-memory database: reads use the writer.
    readers: Option<Readers>,
}

/// Grouped writes one transaction takes at most: enough for a burst of concurrent writers to
/// share a commit (and its `fsync`), few enough that no write waits behind a long group.
const MAX_GROUP: usize = 32;

/// Work for the writer thread.
enum Job {
    /// Runs alone on the connection and begins and ends any transaction itself.
    Alone(Box<dyn FnOnce(&mut Connection) + Send>),
    /// Runs inside a transaction the writer begins, shared with the grouped writes queued right
    /// behind it (group commit), each in a savepoint of its own.
    Grouped(Box<dyn GroupedWrite>),
}

/// A write that runs inside a group's transaction and is answered once the group commits.
trait GroupedWrite: Send {
    /// Runs the write, unless its caller is gone; `true` when it succeeded (its savepoint is
    /// kept), `false` when it failed or did not run (its savepoint is rolled back).
    fn run(&mut self, conn: &Connection) -> bool;
    /// Answers the caller: its own error if it failed, else the group's outcome (`Ok` once the
    /// transaction committed).
    fn answer(self: Box<Self>, group: Result<()>);
}

/// A grouped write: the closure until it runs, then its result until the group is answered.
struct Queued<T, F> {
    f: Option<F>,
    ctx: Arc<Ctx>,
    result: Option<Result<T>>,
    reply: oneshot::Sender<Result<T>>,
}

impl<T, F> GroupedWrite for Queued<T, F>
where
    T: Send,
    F: FnOnce(&Connection, &Ctx) -> DbResult<T> + Send,
{
    fn run(&mut self, conn: &Connection) -> bool {
        let Some(f) = self.f.take() else {
            return false;
        };
        if self.reply.is_closed() {
            return false;
        }
        let ctx = &*self.ctx;
        let result = match panic::catch_unwind(AssertUnwindSafe(|| f(conn, ctx))) {
            Ok(result) => result.map_err(|e| e.into_error(&ctx.location)),
            Err(_) => Err(Error::store(
                StoreErrorKind::Other,
                false,
                "a SQLite write panicked (its writes were rolled back)",
            )),
        };
        let ok = result.is_ok();
        self.result = Some(result);
        ok
    }

    fn answer(self: Box<Self>, group: Result<()>) {
        let answer = match (self.result, group) {
            (Some(Err(own)), _) => Err(own),
            (Some(Ok(value)), Ok(())) => Ok(value),
            (_, Err(group)) => Err(group),
            // Never ran: its caller was gone.
            (None, Ok(())) => return,
        };
        // The caller may have gone meanwhile; then nobody wants the result.
        let _ = self.reply.send(answer);
    }
}

/// The writer connection's thread and its queue. The thread ends (closing the connection) once
/// the queue's sender is dropped and every queued job has run.
struct Writer {
    jobs: mpsc::Sender<Job>,
    thread: JoinHandle<()>,
}

impl Writer {
    /// Starts the thread that owns `conn`.
    fn start(conn: Connection, location: Location) -> DbResult<Self> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("watukuy-sqlite-writer".to_owned())
            .spawn(move || {
                let mut conn = conn;
                let mut next = None;
                loop {
                    let job = match next.take() {
                        Some(job) => job,
                        None => match queue.recv() {
                            Ok(job) => job,
                            Err(_) => break,
                        },
                    };
                    match job {
                        Job::Alone(job) => job(&mut conn),
                        Job::Grouped(first) => {
                            // Whatever grouped writes queued up meanwhile share the transaction.
                            let mut group = vec![first];
                            while group.len() < MAX_GROUP {
                                match queue.try_recv() {
                                    Ok(Job::Grouped(write)) => group.push(write),
                                    Ok(alone) => {
                                        next = Some(alone);
                                        break;
                                    }
                                    Err(_) => break,
                                }
                            }
                            commit_group(&conn, group, &location);
                        }
                    }
                }
            })
            .map_err(|e| {
                Failure::Store(Error::store_with(
                    StoreErrorKind::Other,
                    false,
                    "cannot start the SQLite writer thread",
                    e,
                ))
            })?;
        Ok(Self { jobs, thread })
    }
}

/// Runs `group` in ONE immediate transaction, each write in a savepoint of its own (a write that
/// fails is rolled back alone and the others go on), commits once, then answers every write.
/// When the transaction cannot begin or commit, or SQLite rolls it back (a full disk, an I/O
/// error), no write of the group lands and each is answered with that error.
fn commit_group(conn: &Connection, mut group: Vec<Box<dyn GroupedWrite>>, location: &Location) {
    if group.len() == 1
        && let Some(write) = group.pop()
    {
        return commit_alone(conn, write, location);
    }
    let mut ran = Vec::with_capacity(group.len());
    let mut failure = control(conn, "BEGIN IMMEDIATE").err();
    let mut lost = None;
    for mut write in group {
        if failure.is_none() && lost.is_none() {
            match control(conn, "SAVEPOINT watukuy_write") {
                Ok(()) => {
                    let keep = write.run(conn);
                    if conn.is_autocommit() {
                        lost = Some(Error::store(
                            StoreErrorKind::Other,
                            true,
                            format!(
                                "{location} rolled back a group of writes when one of them failed; \
                                 nothing of the group was written"
                            ),
                        ));
                    } else {
                        let rolled_back = if keep {
                            Ok(())
                        } else {
                            control(conn, "ROLLBACK TO watukuy_write")
                        };
                        failure = rolled_back
                            .and_then(|()| control(conn, "RELEASE watukuy_write"))
                            .err();
                    }
                }
                Err(e) => failure = Some(e),
            }
        }
        ran.push(write);
    }
    if failure.is_none() && lost.is_none() {
        failure = control(conn, "COMMIT").err();
    }
    let outcome = match (failure, lost) {
        (None, None) => Ok(()),
        (Some(e), _) => {
            if !conn.is_autocommit() {
                // Best effort: the error is what gets reported.
                let _ = control(conn, "ROLLBACK");
            }
            Err(Failure::Sql(e).into_error(location))
        }
        (None, Some(lost)) => Err(lost),
    };
    for write in ran {
        write.answer(match &outcome {
            Ok(()) => Ok(()),
            Err(e) => Err(copy(e)),
        });
    }
}

/// A group of one: its own transaction without a savepoint (a savepoint makes SQLite copy every
/// page the write changes into a sub-journal first), rolled back whole if the write fails.
fn commit_alone(conn: &Connection, mut write: Box<dyn GroupedWrite>, location: &Location) {
    let ended = control(conn, "BEGIN IMMEDIATE").and_then(|()| {
        if write.run(conn) {
            control(conn, "COMMIT")
        } else if conn.is_autocommit() {
            Ok(())
        } else {
            control(conn, "ROLLBACK")
        }
    });
    write.answer(ended.map_err(|e| {
        if !conn.is_autocommit() {
            // Best effort: the error is what gets reported.
            let _ = control(conn, "ROLLBACK");
        }
        Failure::Sql(e).into_error(location)
    }));
}

/// Runs a transaction-control statement from the connection's statement cache (parsed once, not
/// for every write).
fn control(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(drop)
}

/// The same failure for another write of a group (errors are not `Clone`).
fn copy(error: &Error) -> Error {
    match error {
        Error::Store {
            kind,
            transient,
            message,
            ..
        } => Error::store(*kind, *transient, message.clone()),
        other => Error::store(StoreErrorKind::Other, false, other.to_string()),
    }
}

/// The error of a write whose writer thread is gone (it never is while its store is open).
fn writer_stopped() -> Error {
    Error::store(
        StoreErrorKind::Other,
        false,
        "the SQLite writer thread stopped",
    )
}

/// Idle read connections and the permits that bound how many exist.
struct Readers {
    permits: Arc<Semaphore>,
    idle: Arc<Mutex<Vec<Connection>>>,
}

impl Db {
    /// Opens the writer (creating the file, switching it to WAL) and migrates. Blocking.
    pub(crate) fn open(ctx: Arc<Ctx>) -> DbResult<Self> {
        let mut writer = match &ctx.location {
            Location::Memory => Connection::open_in_memory()?,
            Location::File(path) => Connection::open_with_flags(
                literal(path),
                OpenFlags::SQLITE_OPEN_READ_WRITE
                    | OpenFlags::SQLITE_OPEN_CREATE
                    | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )?,
        };
        configure(&writer, &ctx)?;
        if let Location::File(_) = &ctx.location {
            let mode = wal_mode(&writer)?;
            if !mode.eq_ignore_ascii_case("wal") {
                return Err(Failure::Store(Error::store(
                    StoreErrorKind::Rejected,
                    false,
                    format!(
                        "{} cannot use WAL journal mode (SQLite kept {mode:?}); \
                         put the file on a local file system",
                        ctx.location
                    ),
                )));
            }
        }
        migrate(&mut writer, &ctx)?;
        let readers = match &ctx.location {
            Location::Memory => None,
            Location::File(_) => Some(Readers {
                permits: Arc::new(Semaphore::new(ctx.options.max_readers_value())),
                idle: Arc::new(Mutex::new(Vec::new())),
            }),
        };
        Ok(Self {
            writer: Writer::start(writer, ctx.location.clone())?,
            ctx,
            readers,
        })
    }

    /// Runs `f` on the writer connection, on the writer's thread, after the writes queued before
    /// it. A write whose caller is gone (its future was dropped) before the write started is
    /// skipped, as a write cancelled while it waited for its turn never runs. A panic in `f` fails
    /// this write only: a transaction it left open is rolled back and the writer goes on.
    pub(crate) async fn write<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection, &Ctx) -> DbResult<T> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel::<Result<T>>();
        let ctx = Arc::clone(&self.ctx);
        let job: Box<dyn FnOnce(&mut Connection) + Send> = Box::new(move |conn| {
            if reply.is_closed() {
                return;
            }
            let outcome = panic::catch_unwind(AssertUnwindSafe(|| f(conn, &ctx)));
            let result = match outcome {
                Ok(result) => result.map_err(|e| e.into_error(&ctx.location)),
                Err(_) => {
                    // A `Transaction` rolls back while unwinding; this is for a write that
                    // began one by hand. Best effort: the panic is what gets reported.
                    if !conn.is_autocommit() {
                        let _ = conn.execute_batch("ROLLBACK");
                    }
                    Err(Error::store(
                        StoreErrorKind::Other,
                        false,
                        "a SQLite write panicked (its transaction was rolled back)",
                    ))
                }
            };
            // The caller may have gone meanwhile; then nobody wants the result.
            let _ = reply.send(result);
        });
        self.writer
            .jobs
            .send(Job::Alone(job))
            .map_err(|_| writer_stopped())?;
        answer.await.map_err(|_| writer_stopped())?
    }

    /// Runs `f` inside a transaction on the writer's thread, after the writes queued before it:
    /// `f`'s writes commit (or roll back) together, and its answer comes once they are durable.
    /// Grouped writes queued together share ONE transaction and its commit, each in a savepoint
    /// of its own, so a write that fails (or panics) is rolled back alone. `f` must not begin or
    /// end a transaction. A write whose caller is gone before it started is skipped.
    pub(crate) async fn write_in_transaction<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, &Ctx) -> DbResult<T> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel::<Result<T>>();
        let write = Queued {
            f: Some(f),
            ctx: Arc::clone(&self.ctx),
            result: None,
            reply,
        };
        self.writer
            .jobs
            .send(Job::Grouped(Box::new(write)))
            .map_err(|_| writer_stopped())?;
        answer.await.map_err(|_| writer_stopped())?
    }

    /// Closes every connection: the idle readers now, the writer once the writes already queued
    /// have run (waiting for its thread on the blocking pool). For a database no call uses any
    /// more; calls in flight hold the `Db` and keep it open.
    pub(crate) async fn shutdown(self) -> Result<()> {
        let Self {
            ctx: _,
            writer: Writer { jobs, thread },
            readers,
        } = self;
        drop(readers);
        drop(jobs);
        // The thread only runs jobs, which catch their panics: joining it never fails.
        let _ = blocking(move || thread.join()).await?;
        Ok(())
    }

    /// Runs `f` on a read connection (the writer for an in-memory database), off the runtime.
    pub(crate) async fn read<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, &Ctx) -> DbResult<T> + Send + 'static,
    {
        let Some(readers) = &self.readers else {
            return self.write(move |conn, ctx| f(conn, ctx)).await;
        };
        let permit = Arc::clone(&readers.permits)
            .acquire_owned()
            .await
            .map_err(|e| {
                Error::store_with(StoreErrorKind::Other, false, "reader pool closed", e)
            })?;
        let idle = Arc::clone(&readers.idle);
        let ctx = Arc::clone(&self.ctx);
        blocking(move || {
            let pooled = idle.lock().unwrap_or_else(PoisonError::into_inner).pop();
            let conn = match pooled {
                Some(conn) => conn,
                None => open_reader(&ctx).map_err(|e| e.into_error(&ctx.location))?,
            };
            let result = f(&conn, &ctx).map_err(|e| e.into_error(&ctx.location));
            // The connection goes back before the permit is released, so the pool never holds
            // more connections than permits.
            idle.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(conn);
            drop(permit);
            result
        })
        .await?
    }

    /// Migrates again (after the open, which already migrated).
    pub(crate) async fn migrate(&self) -> Result<()> {
        self.write(migrate).await
    }
}

/// Runs blocking work on tokio's blocking pool.
pub(crate) async fn blocking<T, F>(f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let handle = tokio::runtime::Handle::try_current().map_err(|e| {
        Error::store_with(
            StoreErrorKind::Other,
            false,
            "SqliteStore runs its SQLite work on tokio's blocking pool: use it inside a tokio runtime",
            e,
        )
    })?;
    handle.spawn_blocking(f).await.map_err(|e| {
        Error::store_with(
            StoreErrorKind::Other,
            false,
            "a SQLite task panicked or was cancelled",
            e,
        )
    })
}

/// Per-connection settings.
///
/// `synchronous` is a setting of the connection, not of the file, so every connection gets it.
/// Only the writer commits, so only the writer's level decides what a commit costs and what
/// survives a power loss. A reader's level matters only for the checkpoint a connection may run
/// when it is the last one to close the file, and that checkpoint syncs under both levels;
/// readers get the same level anyway, so no connection of a store differs from the others.
fn configure(conn: &Connection, ctx: &Ctx) -> DbResult<()> {
    conn.busy_timeout(ctx.options.busy_timeout_value())?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    conn.pragma_update(
        None,
        "synchronous",
        ctx.options.synchronous_level().as_str(),
    )?;
    Ok(())
}

/// Opens a read connection on the (existing) database file. Blocking.
fn open_reader(ctx: &Ctx) -> DbResult<Connection> {
    let Location::File(path) = &ctx.location else {
        return Err(Failure::Store(Error::store(
            StoreErrorKind::Other,
            false,
            "an in-memory database has no read connections",
        )));
    };
    let conn = Connection::open_with_flags(
        literal(path),
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    configure(&conn, ctx)?;
    conn.pragma_update(None, "query_only", true)?;
    Ok(conn)
}

/// The path SQLite should open: bundled SQLite reads names starting with `file:` as URIs, so a
/// relative path of that shape is anchored at `./` to stay a plain file name.
fn literal(path: &std::path::Path) -> std::path::PathBuf {
    if path.as_os_str().as_encoded_bytes().starts_with(b"file:") {
        std::path::Path::new(".").join(path)
    } else {
        path.to_path_buf()
    }
}

/// Switches the file to WAL and returns the journal mode SQLite kept. Two connections switching a
/// new file at once can deadlock inside SQLite (each holds a shared lock and wants the exclusive
/// one), and SQLite then fails one of them at once with `SQLITE_BUSY` instead of waiting: that
/// one asks again, and now waits in the busy handler for the other's switch like any writer.
/// Blocking.
fn wal_mode(conn: &Connection) -> DbResult<String> {
    const ATTEMPTS: usize = 5;
    let mut attempt = 1;
    loop {
        match conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0)) {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy && attempt < ATTEMPTS =>
            {
                attempt += 1;
            }
            other => return Ok(other?),
        }
    }
}

/// Brings the prefix's schema to [`SCHEMA_VERSION`] in one immediate transaction (so concurrent
/// migrations from several processes serialize). Idempotent. Blocking.
pub(crate) fn migrate(conn: &mut Connection, ctx: &Ctx) -> DbResult<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(&ctx.sql.schema_version_ddl)?;
    let current: i64 = tx.query_row(&ctx.sql.schema_current, [], |r| r.get(0))?;
    if current > i64::from(SCHEMA_VERSION) {
        return Err(Failure::Store(Error::store(
            StoreErrorKind::Schema,
            false,
            format!(
                "{} has schema version {current} for prefix {:?}, newer than the {SCHEMA_VERSION} \
                 this build of watukuy-store-sqlite understands",
                ctx.location,
                ctx.options.prefix()
            ),
        )));
    }
    for migration in MIGRATIONS.iter().filter(|m| m.version > current) {
        tx.execute_batch(&crate::sql::splice(migration.sql, ctx.options.prefix()))?;
        tx.execute(&ctx.sql.schema_record, [migration.version])?;
    }
    tx.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;
    use crate::options::Synchronous;

    /// An open database on a new file in `dir`.
    async fn open(dir: &std::path::Path, name: &str) -> Arc<Db> {
        let ctx = Arc::new(Ctx::new(SqliteOptions::file(dir.join(name))));
        let db = blocking(move || Db::open(ctx))
            .await
            .expect("the blocking pool")
            .expect("the database opens");
        Arc::new(db)
    }

    /// Whether a table called `name` exists.
    fn table_exists(conn: &Connection, name: &str) -> DbResult<bool> {
        let n: i64 = conn.query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
            [name],
            |r| r.get(0),
        )?;
        Ok(n == 1)
    }

    /// A write that panics fails alone: the transaction it began by hand is rolled back, and the
    /// writer runs the next write.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panicking_write_fails_alone_and_is_rolled_back() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let db = open(dir.path(), "panic.db").await;
        let failed = db
            .write(|conn, _| -> DbResult<()> {
                conn.execute_batch("BEGIN IMMEDIATE; CREATE TABLE half_done (x)")?;
                panic!("a write that panics mid-transaction");
            })
            .await
            .expect_err("the panic is this write's error");
        assert!(failed.to_string().contains("panicked"), "{failed}");
        let (autocommit, exists) = db
            .write(|conn, _| Ok((conn.is_autocommit(), table_exists(conn, "half_done")?)))
            .await
            .expect("the writer goes on");
        assert!(autocommit, "no transaction is left open");
        assert!(!exists, "the panicking write was rolled back");
    }

    /// Writes run in the order they were queued, and a write whose caller went away before its
    /// turn never runs (as when writers queued on a mutex).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queued_writes_run_in_order_and_abandoned_ones_are_skipped() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let db = open(dir.path(), "queue.db").await;
        let (release, first) = hold_writer(&db, "CREATE TABLE first (x)").await;
        // Polled once (so it is queued behind the first), then dropped.
        let abandoned = db
            .write(|conn, _| Ok(conn.execute_batch("CREATE TABLE abandoned (x)")?))
            .now_or_never();
        assert!(
            abandoned.is_none(),
            "the writer is busy with the first write"
        );
        // Polled once too, so it is queued behind both, and kept.
        let mut second = Box::pin(db.write(|conn, _| table_exists(conn, "first")));
        assert!((&mut second).now_or_never().is_none());
        release.send(()).expect("the first write waits");
        first.await.expect("no panic").expect("the first write");
        assert!(
            second.await.expect("the second write"),
            "writes run in order"
        );
        let skipped = db
            .write(|conn, _| table_exists(conn, "abandoned"))
            .await
            .expect("a later write");
        assert!(!skipped, "an abandoned write never ran");
    }

    /// Holds the writer with a write of its own, which runs `sql` once the returned sender is
    /// used (a channel, not a sleep), so the writes queued meanwhile reach the writer together.
    async fn hold_writer(
        db: &Arc<Db>,
        sql: &'static str,
    ) -> (mpsc::Sender<()>, tokio::task::JoinHandle<Result<()>>) {
        let (started, is_running) = oneshot::channel::<()>();
        let (release, released) = mpsc::channel::<()>();
        let holder = tokio::spawn({
            let db = Arc::clone(db);
            async move {
                db.write(move |conn, _| {
                    let _ = started.send(());
                    let _ = released.recv();
                    conn.execute_batch(sql)?;
                    Ok(())
                })
                .await
            }
        });
        is_running.await.expect("the holding write started");
        (release, holder)
    }

    /// Queues `writes` (each polled once, in order) and then `abandoned` (polled once and
    /// dropped) while the writer is held, so they reach it together; their results in order.
    async fn run_together<T>(
        db: &Arc<Db>,
        mut writes: Vec<futures::future::BoxFuture<'_, Result<T>>>,
        mut abandoned: Vec<futures::future::BoxFuture<'_, Result<T>>>,
    ) -> Vec<Result<T>> {
        let (release, holder) = hold_writer(db, TABLE_T).await;
        for write in writes.iter_mut().chain(&mut abandoned) {
            assert!(write.now_or_never().is_none(), "queued behind the holder");
        }
        drop(abandoned);
        release.send(()).expect("the holder waits");
        holder.await.expect("no panic").expect("the holding write");
        futures::future::join_all(writes).await
    }

    /// A new file database `name` in a temporary directory (kept while the directory lives), and
    /// its path.
    async fn fresh(name: &str) -> (tempfile::TempDir, std::path::PathBuf, Arc<Db>) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let db = open(dir.path(), name).await;
        let path = dir.path().join(name);
        (dir, path, db)
    }

    /// The table the grouped-write tests insert into, created by the write holding the writer.
    const TABLE_T: &str = "CREATE TABLE t (name TEXT PRIMARY KEY)";

    /// Inserts `name` into `t` in a grouped write; then fails when `fail` is set.
    fn insert(name: &'static str, fail: bool) -> impl FnOnce(&Connection, &Ctx) -> DbResult<usize> {
        move |conn, _| {
            conn.execute("INSERT INTO t (name) VALUES (?1)", [name])?;
            if fail {
                return Err(Failure::Store(Error::store(
                    StoreErrorKind::Rejected,
                    false,
                    format!("{name} fails after its insert"),
                )));
            }
            Ok(conn.query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))?)
        }
    }

    /// The names in `t`, as a fresh connection sees them (what is committed).
    fn committed(path: &std::path::Path) -> Vec<String> {
        let conn = Connection::open(path).expect("a connection of its own");
        let mut statement = conn
            .prepare("SELECT name FROM t ORDER BY name")
            .expect("prepare");
        statement
            .query_map([], |r| r.get(0))
            .expect("query")
            .collect::<rusqlite::Result<_>>()
            .expect("rows")
    }

    /// Grouped writes queued together share one transaction: the second sees the first's row
    /// while a connection of its own does not (nothing is committed yet), and every caller is
    /// answered after the one commit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queued_writes_share_one_transaction() {
        let (_dir, path, db) = fresh("group.db").await;
        let (release, holder) = hold_writer(&db, TABLE_T).await;
        let mut first = Box::pin(db.write_in_transaction(insert("a", false)));
        assert!(
            (&mut first).now_or_never().is_none(),
            "queued behind the holder"
        );
        let seen = path.clone();
        let mut second = Box::pin(db.write_in_transaction(move |conn, ctx| {
            let outside = committed(&seen);
            Ok((
                insert("b", false)(conn, ctx)?,
                outside,
                conn.is_autocommit(),
            ))
        }));
        assert!(
            (&mut second).now_or_never().is_none(),
            "queued behind the first"
        );
        release.send(()).expect("the holder waits");
        holder.await.expect("no panic").expect("the holding write");
        assert_eq!(first.await.expect("the first write"), 1);
        let (count, outside, autocommit) = second.await.expect("the second write");
        assert_eq!(count, 2, "the second write sees the first's row");
        assert!(!autocommit, "a grouped write runs inside a transaction");
        assert!(
            outside.is_empty(),
            "nothing was committed between the two writes: {outside:?}"
        );
        assert_eq!(committed(&path), ["a", "b"]);
    }

    /// A write of a group that fails, or panics, is rolled back alone: the writes before and
    /// after it land, it gets its own error, and a write whose caller left is skipped.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failing_write_of_a_group_is_rolled_back_alone() {
        let (_dir, path, db) = fresh("alone.db").await;
        let writes = vec![
            db.write_in_transaction(insert("a", false)).boxed(),
            db.write_in_transaction(insert("b", true)).boxed(),
            db.write_in_transaction(|conn, ctx| -> DbResult<usize> {
                insert("c", false)(conn, ctx)?;
                panic!("a grouped write that panics after its insert");
            })
            .boxed(),
            db.write_in_transaction(insert("e", false)).boxed(),
        ];
        let abandoned = vec![db.write_in_transaction(insert("d", false)).boxed()];
        let results = run_together(&db, writes, abandoned).await;
        assert_eq!(results[0].as_ref().ok(), Some(&1));
        let failed = results[1].as_ref().expect_err("b fails");
        assert!(failed.to_string().contains("b fails"), "{failed}");
        let panicked = results[2].as_ref().expect_err("c panics");
        assert!(panicked.to_string().contains("panicked"), "{panicked}");
        assert_eq!(
            results[3].as_ref().ok(),
            Some(&2),
            "e sees a and itself only"
        );
        assert_eq!(
            committed(&path),
            ["a", "e"],
            "d was abandoned before it ran"
        );
    }

    /// A lone write (a group of one, no savepoint) that fails after writing is rolled back
    /// whole, and one that panics too; the writer goes on.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lone_failing_write_is_rolled_back_whole() {
        let (_dir, path, db) = fresh("lone.db").await;
        db.write(|conn, _| Ok(conn.execute_batch(TABLE_T)?))
            .await
            .expect("the table");
        let failed = db.write_in_transaction(insert("a", true)).await;
        assert!(failed.expect_err("a fails").to_string().contains("a fails"));
        let panicked = db
            .write_in_transaction(|conn, ctx| -> DbResult<usize> {
                insert("b", false)(conn, ctx)?;
                panic!("a lone write that panics after its insert");
            })
            .await;
        assert!(
            panicked
                .expect_err("b panics")
                .to_string()
                .contains("panicked")
        );
        assert!(committed(&path).is_empty(), "{:?}", committed(&path));
        let after = db.write_in_transaction(insert("c", false)).await;
        assert_eq!(after.expect("the writer goes on"), 1);
    }

    /// When SQLite ends a group's transaction under it, nothing of the group lands and every
    /// write is told so with a transient error; the writer goes on.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_group_whose_transaction_is_lost_fails_whole() {
        let (_dir, path, db) = fresh("lost.db").await;
        let writes = vec![
            db.write_in_transaction(insert("a", false)).boxed(),
            db.write_in_transaction(|conn, _| -> DbResult<usize> {
                // What SQLite does itself on a full disk or an I/O error.
                conn.execute_batch("ROLLBACK")?;
                Err(Failure::Store(Error::store(
                    StoreErrorKind::Rejected,
                    false,
                    "the disk is full",
                )))
            })
            .boxed(),
            db.write_in_transaction(insert("c", false)).boxed(),
        ];
        let results = run_together(&db, writes, Vec::new()).await;
        let own = results[1].as_ref().expect_err("its own error");
        assert!(own.to_string().contains("disk is full"), "{own}");
        for lost in [&results[0], &results[2]] {
            let error = lost.as_ref().expect_err("lost with the group");
            assert!(error.is_transient(), "{error}");
            assert!(
                error.to_string().contains("nothing of the group"),
                "{error}"
            );
        }
        assert!(committed(&path).is_empty());
        let after = db.write_in_transaction(insert("d", false)).await;
        assert_eq!(after.expect("the writer goes on"), 1);
    }

    /// `PRAGMA synchronous` of a connection, as SQLite numbers it.
    fn level(conn: &Connection) -> DbResult<i64> {
        Ok(conn.pragma_query_value(None, "synchronous", |r| r.get(0))?)
    }

    /// The writer and the read connections of a file database all run at the store's level.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_connection_gets_the_level() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        for (synchronous, expected) in [(Synchronous::Full, 2), (Synchronous::Normal, 1)] {
            let path = dir.path().join(format!("{synchronous}.db"));
            let ctx = Arc::new(Ctx::new(SqliteOptions::file(path).synchronous(synchronous)));
            let db = blocking(move || Db::open(ctx))
                .await
                .expect("the blocking pool")
                .expect("the database opens");
            assert_eq!(db.write(|conn, _| level(conn)).await.unwrap(), expected);
            assert_eq!(db.read(|conn, _| level(conn)).await.unwrap(), expected);
        }
    }
}
