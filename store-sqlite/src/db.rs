//! Connections: one writer and a few readers per store, opened lazily, used off the runtime.
//!
//! Every statement runs on tokio's blocking pool (`spawn_blocking`), so no async task ever waits
//! on SQLite. Writes go through ONE writer connection behind an async mutex: writers of one store
//! queue in the runtime instead of spinning in SQLite's busy handler, and a write transaction
//! never meets a lock held by its own store. Other processes (or other stores on the same file)
//! are serialized by SQLite's file locks, waiting up to the busy timeout. Reads of a file
//! database use up to `max_readers` read connections: in WAL mode they see the last committed
//! transaction and never block the writer, nor are they blocked by it.
//!
//! A private in-memory database has ONE connection for reads and writes. Each connection to
//! `:memory:` is its own database, and the shared-cache alternative
//! (`file:name?mode=memory&cache=shared`) reports table locks between connections as
//! `SQLITE_LOCKED`, which the busy timeout never retries; an in-memory database has no WAL, so
//! extra connections would buy no concurrency anyway.

use std::sync::{Arc, Mutex, PoisonError};

use rusqlite::{Connection, OpenFlags, TransactionBehavior};
use tokio::sync::{Mutex as AsyncMutex, Semaphore};
use watukuy_core::{Error, Result, StoreErrorKind};

use crate::error::{DbResult, Failure};
use crate::options::{Location, SqliteOptions};
use crate::sql::{MIGRATIONS, SCHEMA_VERSION, Sql};

/// Statements cached per connection: every named statement plus the chunked variants.
const STATEMENT_CACHE: usize = 96;

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
    writer: Arc<AsyncMutex<Connection>>,
    /// `None` for an in-memory database: reads use the writer.
    readers: Option<Readers>,
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
            let mode: String = writer.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
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
            ctx,
            writer: Arc::new(AsyncMutex::new(writer)),
            readers,
        })
    }

    /// Runs `f` on the writer connection, off the runtime.
    pub(crate) async fn write<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection, &Ctx) -> DbResult<T> + Send + 'static,
    {
        let mut conn = Arc::clone(&self.writer).lock_owned().await;
        let ctx = Arc::clone(&self.ctx);
        blocking(move || f(&mut conn, &ctx).map_err(|e| e.into_error(&ctx.location))).await?
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
fn configure(conn: &Connection, ctx: &Ctx) -> DbResult<()> {
    conn.busy_timeout(ctx.options.busy_timeout_value())?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
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

/// Brings the prefix's schema to [`SCHEMA_VERSION`] in one immediate transaction (so concurrent
/// migrations from several processes serialize). Idempotent. Blocking.
pub(crate) fn migrate(conn: &mut Connection, ctx: &Ctx) -> DbResult<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(&ctx.sql.schema_version_ddl)?;
    let current: i64 = tx.query_row(&ctx.sql.schema_current, [], |r| r.get(0))?;
    if current > SCHEMA_VERSION {
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
