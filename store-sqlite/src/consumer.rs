//! The idempotent consumer for SQLite: a processed-events table in the consumer's database, and
//! the ways to apply an event's projection at most once with it, in one transaction on the
//! consumer's own connection.
//!
//! Delivery is at least once, so a handler can see an event again (after a crash between its
//! commit and the acknowledgement, a lost lease, a timeout, a replay). Claiming the event in the
//! projection's own transaction makes the projection exactly-once in its effect: the marker and
//! the projection's writes commit together or not at all, and another delivery of the same event
//! finds the marker and changes nothing.
//!
//! Two ways to run a projection, both on your connection behind an `Arc<Mutex<_>>`:
//!
//! - [`ProcessedEvents::apply_once`] (and [`apply_once_fenced`](ProcessedEvents::apply_once_fenced)):
//!   the projection is a plain closure over a [`rusqlite::Transaction`], and the whole
//!   transaction runs on tokio's blocking pool, so async handlers never block the runtime.
//!   [`ProcessedEvents::apply_once_in`] does the same on a connection you hold, from blocking
//!   code.
//! - [`watukuy_core::delivery::apply_once`], the generic one: `ProcessedEvents` is a
//!   [`ConsumerStore`] whose transaction is a [`SqliteTx`]. The projection is async; it runs its
//!   SQL through [`SqliteTx::run`] (a closure over the transaction, run on the transaction's
//!   thread) and may await anything else in between. See [`SqliteTx`] for an example.
//!
//! Every transaction here is `BEGIN IMMEDIATE`: it takes the file's write lock when it begins, so
//! claims serialize and each decides on what committed before it (two overlapping deliveries
//! apply once; the second waits for the first, up to the connection's busy timeout). Other
//! writers of the file wait meanwhile: keep projections short.
//!
//! **Fenced applies.** When the consumer's tables live in the engine store's file, build the
//! table with [`fenced_by`](ProcessedEvents::fenced_by) and pass the delivery's
//! [`HandlerContext::fence`](watukuy_core::HandlerContext::fence)
//! ([`apply_once_fenced`](ProcessedEvents::apply_once_fenced), or the generic `apply_once`'s
//! `fence`). The key's lease row is read in the projection's transaction after the projection
//! and before the commit, and the commit happens only while the lease is still held by the
//! fence's owner with its epoch (its expiry is not looked at, as in the store's own fenced
//! writes): the transaction holds the write lock, so a takeover cannot commit in between. An
//! instance that lost its lease while the projection ran (frozen past it by a GC or VM pause)
//! rolls everything back, marker included, with [`Error::LeaseLost`], and the new holder
//! applies the event.
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use watukuy_store_sqlite::ProcessedEvents;
//!
//! # async fn run(event: watukuy_core::Event, ctx: watukuy_core::HandlerContext)
//! #     -> Result<(), watukuy_core::HandlerError> {
//! let conn = Arc::new(Mutex::new(rusqlite::Connection::open_in_memory()?));
//! let processed = ProcessedEvents::default();
//! processed.migrate(&mut conn.lock().unwrap())?;
//! # conn.lock().unwrap().execute_batch("CREATE TABLE totals (subject TEXT PRIMARY KEY, n INTEGER)")?;
//! let subject = event.subject.clone();
//! processed
//!     .apply_once(&conn, &event, move |tx| {
//!         tx.execute(
//!             "INSERT INTO totals VALUES (?1, 1) ON CONFLICT (subject) DO UPDATE SET n = n + 1",
//!             [subject.as_str()],
//!         )
//!     })
//!     .await?
//!     .report(&ctx); // counts as applied or deduplicated in `inspect()`
//! # Ok(())
//! # }
//! ```

use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};
use watukuy_core::delivery::{
    ApplyError, ApplyOutcome, ConsumerStore, Fence, LastApplied, reapplies,
};
use watukuy_core::{
    Error, Event, Result,
    clock::{Clock, SystemClock},
    store::StoreErrorKind,
};

use crate::error::classify;
use crate::options::SqliteOptions;
use crate::tx::{SqliteTx, location_of};

/// The newest version of the processed-events table this crate creates.
pub const PROCESSED_EVENTS_VERSION: i32 = 3;

/// The default table name.
pub const DEFAULT_PROCESSED_EVENTS_TABLE: &str = "watukuy_processed_events";

struct Migration {
    version: i64,
    sql: &'static str,
}

const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        sql: include_str!("../sql/consumer/0001_processed_events.sql"),
    },
    Migration {
        version: 2,
        sql: include_str!("../sql/consumer/0002_subjects.sql"),
    },
    Migration {
        version: 3,
        sql: include_str!("../sql/consumer/0003_sequence.sql"),
    },
];

const VERSION_TABLE: &str = include_str!("../sql/consumer/schema_version.sql");
const INSERT_MARKER: &str = include_str!("../sql/consumer/insert_marker.sql");
const LAST_APPLIED: &str = include_str!("../sql/consumer/last_applied.sql");
const RECLAIM: &str = include_str!("../sql/consumer/reclaim.sql");
const SET_LAST: &str = include_str!("../sql/consumer/set_last.sql");
const FENCE: &str = include_str!("../sql/consumer/fence.sql");
const IS_PROCESSED: &str = include_str!("../sql/consumer/is_processed.sql");
const PRUNE_LAST: &str = include_str!("../sql/consumer/prune_last.sql");
const PRUNE_MARKERS: &str = include_str!("../sql/consumer/prune_markers.sql");

/// The table's name and every statement on it, rendered once.
#[derive(Clone, Debug)]
struct Statements {
    table: String,
    insert: String,
    last_applied: String,
    reclaim: String,
    set_last: String,
    is_processed: String,
    prune_last: String,
    prune_markers: String,
    /// The lease check of `fenced_by`, on the engine store's table.
    fence: Option<String>,
}

impl Statements {
    fn new(table: String) -> Self {
        let render = |sql: &str| render(sql, &table);
        Self {
            insert: render(INSERT_MARKER),
            last_applied: render(LAST_APPLIED),
            reclaim: render(RECLAIM),
            set_last: render(SET_LAST),
            is_processed: render(IS_PROCESSED),
            prune_last: render(PRUNE_LAST),
            prune_markers: render(PRUNE_MARKERS),
            fence: None,
            table,
        }
    }
}

/// The processed-events table of an idempotent consumer, in the consumer's own database (the
/// one its read model lives in; it need not be the store's).
///
/// Columns: `event_id` (primary key), `poller`, `partition`, `lane`, `type`, `applied_at`
/// (epoch ms from the configured [`Clock`]); beside it, `<table>_last` keeps the last event
/// applied per subject with its `sequence`, so an id that comes back as a new change (a
/// re-create after a delete) is applied again while a late redelivery is not (see
/// [`claim`](Self::claim)). Create them with [`migrate`](Self::migrate) (versioned, in one
/// immediate transaction, so concurrent migrations serialize) or take the text from
/// [`ddl`](Self::ddl).
///
/// It is a [`ConsumerStore`] on `Arc<Mutex<rusqlite::Connection>>` with [`SqliteTx`] for
/// transactions, for [`watukuy_core::delivery::apply_once`] (see the module documentation).
#[derive(Clone)]
pub struct ProcessedEvents {
    sql: Arc<Statements>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for ProcessedEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessedEvents")
            .field("table", &self.sql.table)
            .field("fenced", &self.sql.fence.is_some())
            .finish_non_exhaustive()
    }
}

impl Default for ProcessedEvents {
    /// `watukuy_processed_events`, stamped with the system clock.
    fn default() -> Self {
        Self::build(DEFAULT_PROCESSED_EVENTS_TABLE.to_owned())
    }
}

impl ProcessedEvents {
    /// The table `table` (`^[A-Za-z_][A-Za-z0-9_]*$`; anything else is a `Config` error naming
    /// `processed_events.table`).
    pub fn new(table: impl Into<String>) -> Result<Self> {
        let table = table.into();
        let mut chars = table.chars();
        let valid = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(Error::config(
                "processed_events.table",
                format!("must match [A-Za-z_][A-Za-z0-9_]*, got {table:?}"),
            ));
        }
        Ok(Self::build(table))
    }

    fn build(table: String) -> Self {
        Self {
            sql: Arc::new(Statements::new(table)),
            clock: Arc::new(SystemClock),
        }
    }

    /// Lets [`check_fence`](ConsumerStore::check_fence) (and so
    /// [`apply_once_fenced`](Self::apply_once_fenced)) read the leases of the engine store
    /// configured with `store` — a [`SqliteStore`](crate::SqliteStore) on the same file as this
    /// table (its [`table_prefix`](SqliteOptions::table_prefix) names the leases' table,
    /// `<prefix>pollers`). A projection's transaction then commits only while its delivery's
    /// lease is still held: an instance frozen past its lease cannot commit when it wakes.
    /// Fails with a `Config` error naming the option when `store` is invalid.
    pub fn fenced_by(mut self, store: &SqliteOptions) -> Result<Self> {
        store.validate()?;
        let pollers = format!("{}pollers", store.prefix());
        Arc::make_mut(&mut self.sql).fence = Some(FENCE.replace("{pollers}", &pollers));
        Ok(self)
    }

    /// Stamps `applied_at` and measures TTLs with `clock` (default: the system clock).
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The table name.
    pub fn table(&self) -> &str {
        &self.sql.table
    }

    /// The complete, idempotent DDL (version table, every migration and its version row).
    /// Running it twice is harmless (migration 3 explains how it stays so).
    pub fn ddl(&self) -> String {
        let mut out = self.render(VERSION_TABLE);
        for migration in MIGRATIONS {
            out.push('\n');
            out.push_str(&self.render(migration.sql));
            out.push_str(&format!(
                "\nINSERT OR IGNORE INTO {}_version (version) VALUES ({});\n",
                self.sql.table, migration.version
            ));
        }
        out
    }

    /// Brings the table to [`PROCESSED_EVENTS_VERSION`] in one immediate transaction. Blocking;
    /// idempotent. Fails with a `Schema` store error when the table is newer than this crate
    /// knows.
    ///
    /// Version 3 moves the subjects' last applied events from `<table>_subjects` to
    /// `<table>_last`, which has their sequence (`NULL` for the rows it takes over): code that
    /// knows only version 2 fails on the missing table afterwards, so upgrade every process
    /// sharing the file together.
    pub fn migrate(&self, conn: &mut Connection) -> Result<()> {
        let location = location_of(conn);
        let table = &self.sql.table;
        let run = |conn: &mut Connection| -> std::result::Result<(), Failure> {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute_batch(&self.render(VERSION_TABLE))?;
            let current: i64 = tx.query_row(
                &format!("SELECT COALESCE(MAX(version), 0) FROM {table}_version"),
                [],
                |r| r.get(0),
            )?;
            if current > i64::from(PROCESSED_EVENTS_VERSION) {
                return Err(Failure::Newer(current));
            }
            for migration in MIGRATIONS.iter().filter(|m| m.version > current) {
                tx.execute_batch(&self.render(migration.sql))?;
                tx.execute(
                    &format!("INSERT INTO {table}_version (version) VALUES (?1)"),
                    [migration.version],
                )?;
            }
            tx.commit()?;
            Ok(())
        };
        run(conn).map_err(|failure| match failure {
            Failure::Sql(e) => classify(e, &location),
            Failure::Newer(current) => Error::store(
                StoreErrorKind::Schema,
                false,
                format!(
                    "the processed-events table {table:?} in {location} is at version {current}, \
                     newer than this watukuy-store-sqlite knows ({PROCESSED_EVENTS_VERSION}): \
                     upgrade the crate"
                ),
            ),
        })
    }

    /// Claims `event` inside a transaction you run: records it and returns `true` when it is
    /// a change to apply, or returns `false` when it was applied already (then do nothing, and
    /// let your transaction end). Commit your projection's writes in the same transaction, so
    /// the record exists exactly when they do. Start that transaction with
    /// `TransactionBehavior::Immediate`: it then holds the write lock from its start, so two
    /// connections claiming at once serialize (the second waits for the first to end and
    /// decides on what it committed) instead of failing to upgrade a read lock.
    ///
    /// An id with a marker is a duplicate while it is still its subject's last applied event,
    /// or when this delivery is not newer (by sequence) than that event: a redelivery. When a
    /// newer event is an id that another event of its subject was applied after, it came back
    /// as a new change — a re-create after a delete with the same content, an item changed
    /// back to an earlier content — and is claimed again (see
    /// [`reapplies`](watukuy_core::delivery::reapplies)). Markers written before the subjects'
    /// last events were kept count as duplicates.
    pub fn claim(&self, tx: &Transaction<'_>, event: &Event) -> Result<bool> {
        let now = self.clock.now_ms();
        let sql = &*self.sql;
        let run = || -> rusqlite::Result<bool> {
            let inserted = tx.prepare_cached(&sql.insert)?.execute(params![
                event.id.as_str(),
                event.poller.as_str(),
                event.partition.as_str(),
                event.lane.as_str(),
                event.event_type.as_str(),
                now
            ])? == 1;
            if !inserted {
                let last: Option<(String, String, Option<i64>)> = tx
                    .prepare_cached(&sql.last_applied)?
                    .query_row(
                        params![
                            event.poller.as_str(),
                            event.partition.as_str(),
                            event.subject.as_str()
                        ],
                        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                    )
                    .optional()?;
                let last = last
                    .as_ref()
                    .map(|(id, kind, sequence)| LastApplied::new(id, kind, *sequence));
                if !reapplies(event, last) {
                    return Ok(false);
                }
                tx.prepare_cached(&sql.reclaim)?.execute(params![
                    event.id.as_str(),
                    event.lane.as_str(),
                    event.event_type.as_str(),
                    now
                ])?;
            }
            tx.prepare_cached(&sql.set_last)?.execute(params![
                event.poller.as_str(),
                event.partition.as_str(),
                event.subject.as_str(),
                event.id.as_str(),
                event.event_type.as_str(),
                now,
                event.sequence
            ])?;
            Ok(true)
        };
        run().map_err(|e| classify(e, &location_of(tx)))
    }

    /// Checks in `tx`, a transaction you run, that `fence`'s lease is still held (the engine
    /// store's lease row has its owner and epoch): [`Error::LeaseLost`] when it is not, and
    /// `Unsupported` without [`fenced_by`](Self::fenced_by). Call it after the projection,
    /// just before the commit, in an immediate transaction (see [`claim`](Self::claim)).
    pub fn check_fence_in(&self, tx: &Transaction<'_>, fence: &Fence) -> Result<()> {
        let Some(sql) = &self.sql.fence else {
            return Err(self.unfenced());
        };
        let held: bool = tx
            .prepare_cached(sql)
            .and_then(|mut statement| {
                statement.query_row(
                    params![
                        fence.poller.as_str(),
                        fence.partition.as_str(),
                        fence.owner.as_str(),
                        fence.epoch
                    ],
                    |r| r.get(0),
                )
            })
            .map_err(|e| classify(e, &location_of(tx)))?;
        if held {
            Ok(())
        } else {
            Err(Error::lease_lost(&fence.key(), fence.epoch))
        }
    }

    /// Applies `event` at most once on `conn` (blocking): in ONE immediate transaction, claims
    /// it and, when it is a change to apply, runs `projection`, then commits.
    ///
    /// - A repeated delivery is a no-op: [`ApplyOutcome::Deduplicated`] (the projection does
    ///   not run).
    /// - The projection's error rolls everything back, marker included:
    ///   [`ApplyError::Projection`]; a later delivery applies it afresh.
    /// - A crash (or a panic in the projection) before the commit leaves nothing behind.
    /// - A failure to begin, to claim or to commit is [`ApplyError::Store`].
    pub fn apply_once_in<T, E>(
        &self,
        conn: &mut Connection,
        event: &Event,
        projection: impl FnOnce(&Transaction<'_>) -> std::result::Result<T, E>,
    ) -> std::result::Result<ApplyOutcome<T>, ApplyError<E>> {
        self.apply_in(conn, event, None, projection)
    }

    /// [`apply_once_in`](Self::apply_once_in), checking `fence` (when given) after the
    /// projection and before the commit.
    fn apply_in<T, E>(
        &self,
        conn: &mut Connection,
        event: &Event,
        fence: Option<&Fence>,
        projection: impl FnOnce(&Transaction<'_>) -> std::result::Result<T, E>,
    ) -> std::result::Result<ApplyOutcome<T>, ApplyError<E>> {
        if fence.is_some() && self.sql.fence.is_none() {
            // It could never commit: fail before anything runs.
            return Err(ApplyError::Store(self.unfenced()));
        }
        let location = location_of(conn);
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| ApplyError::Store(classify(e, &location)))?;
        if !self.claim(&tx, event).map_err(ApplyError::Store)? {
            // Nothing was written; dropping the transaction rolls it back.
            return Ok(ApplyOutcome::Deduplicated);
        }
        // On every early return below, dropping the transaction rolls back the projection and
        // the marker.
        let value = projection(&tx).map_err(ApplyError::Projection)?;
        if let Some(fence) = fence {
            self.check_fence_in(&tx, fence).map_err(ApplyError::Store)?;
        }
        tx.commit()
            .map_err(|e| ApplyError::Store(classify(e, &location)))?;
        Ok(ApplyOutcome::Applied(value))
    }

    /// [`apply_once_in`](Self::apply_once_in) on tokio's blocking pool, on your connection
    /// behind a mutex (held for the whole transaction). Needs a tokio runtime. Where this table
    /// shares the engine store's file, prefer [`apply_once_fenced`](Self::apply_once_fenced).
    pub async fn apply_once<T, E, F>(
        &self,
        conn: &Arc<Mutex<Connection>>,
        event: &Event,
        projection: F,
    ) -> std::result::Result<ApplyOutcome<T>, ApplyError<E>>
    where
        T: Send + 'static,
        E: Send + 'static,
        F: FnOnce(&Transaction<'_>) -> std::result::Result<T, E> + Send + 'static,
    {
        self.apply_on_pool(conn, event, None, projection).await
    }

    /// [`apply_once`](Self::apply_once) that commits only while the delivery's lease is still
    /// held: `fence` is the handler's [`HandlerContext::fence`](watukuy_core::HandlerContext::fence),
    /// checked in the projection's transaction after the projection and just before the commit.
    /// A lease lost meanwhile (the instance was frozen past it) rolls everything back with
    /// [`ApplyError::Store`]`(`[`Error::LeaseLost`]`)`, and the new holder applies the event.
    /// Needs [`fenced_by`](Self::fenced_by) (otherwise every call fails with `Unsupported`
    /// before the projection runs).
    pub async fn apply_once_fenced<T, E, F>(
        &self,
        conn: &Arc<Mutex<Connection>>,
        event: &Event,
        fence: &Fence,
        projection: F,
    ) -> std::result::Result<ApplyOutcome<T>, ApplyError<E>>
    where
        T: Send + 'static,
        E: Send + 'static,
        F: FnOnce(&Transaction<'_>) -> std::result::Result<T, E> + Send + 'static,
    {
        self.apply_on_pool(conn, event, Some(fence), projection)
            .await
    }

    async fn apply_on_pool<T, E, F>(
        &self,
        conn: &Arc<Mutex<Connection>>,
        event: &Event,
        fence: Option<&Fence>,
        projection: F,
    ) -> std::result::Result<ApplyOutcome<T>, ApplyError<E>>
    where
        T: Send + 'static,
        E: Send + 'static,
        F: FnOnce(&Transaction<'_>) -> std::result::Result<T, E> + Send + 'static,
    {
        let this = self.clone();
        let conn = Arc::clone(conn);
        let event = event.clone();
        let fence = fence.cloned();
        crate::db::blocking(move || {
            // A poisoned lock means a projection panicked mid-transaction; its transaction was
            // dropped (rolled back) while unwinding, so the connection is consistent.
            let mut conn = conn.lock().unwrap_or_else(PoisonError::into_inner);
            this.apply_in(&mut conn, &event, fence.as_ref(), projection)
        })
        .await
        .map_err(ApplyError::Store)?
    }

    /// Whether `event_id` has a marker. Blocking.
    pub fn is_processed(&self, conn: &Connection, event_id: &str) -> Result<bool> {
        conn.prepare_cached(&self.sql.is_processed)
            .and_then(|mut statement| statement.query_row([event_id], |r| r.get(0)))
            .map_err(|e| classify(e, &location_of(conn)))
    }

    /// Deletes markers (and subjects' last events) applied before `older_than` (epoch ms);
    /// returns how many markers. Blocking.
    ///
    /// A pruned event is no longer recognised: only prune markers older than any redelivery you
    /// still expect (retries, parked events you may retry, and the poller's log retention if
    /// you replay into the same read model).
    pub fn prune(&self, conn: &Connection, older_than: i64) -> Result<u64> {
        let run = || -> rusqlite::Result<usize> {
            conn.prepare_cached(&self.sql.prune_last)?
                .execute([older_than])?;
            conn.prepare_cached(&self.sql.prune_markers)?
                .execute([older_than])
        };
        run()
            .map(|n| u64::try_from(n).unwrap_or(u64::MAX))
            .map_err(|e| classify(e, &location_of(conn)))
    }

    /// Deletes markers older than `ttl` on the configured clock; returns how many. Blocking.
    pub fn prune_older_than(&self, conn: &Connection, ttl: std::time::Duration) -> Result<u64> {
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        self.prune(conn, self.clock.now_ms().saturating_sub(ttl_ms))
    }

    fn render(&self, sql: &str) -> String {
        render(sql, &self.sql.table)
    }

    /// The error of a fence check on a table built without `fenced_by`.
    fn unfenced(&self) -> Error {
        Error::Unsupported {
            message: format!(
                "the processed-events table {:?} cannot check leases: build it with \
                 fenced_by(&store_options), the options of the SqliteStore whose file it shares",
                self.sql.table
            ),
        }
    }

    /// Runs `f` with `conn` locked, on tokio's blocking pool.
    async fn on_pool<T, F>(&self, conn: &Arc<Mutex<Connection>>, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Self, &Connection) -> Result<T> + Send + 'static,
    {
        let this = self.clone();
        let conn = Arc::clone(conn);
        crate::db::blocking(move || {
            // Poisoned: see `apply_on_pool`.
            let conn = conn.lock().unwrap_or_else(PoisonError::into_inner);
            f(&this, &conn)
        })
        .await?
    }
}

/// The consumer contract on SQLite: `begin` opens a [`SqliteTx`] (an immediate transaction on a
/// blocking-pool thread that holds the connection's mutex); `claim` and `check_fence` run in it
/// through [`SqliteTx::run`]; `is_processed` and `prune` lock the connection on the blocking
/// pool. `check_fence` needs [`fenced_by`](ProcessedEvents::fenced_by).
#[async_trait]
impl ConsumerStore for ProcessedEvents {
    type Conn = Arc<Mutex<Connection>>;
    type Tx<'a> = SqliteTx;

    async fn begin<'a>(&'a self, conn: &'a Arc<Mutex<Connection>>) -> Result<SqliteTx> {
        SqliteTx::begin(conn).await
    }

    async fn claim(&self, tx: &mut Self::Tx<'_>, event: &Event) -> Result<bool> {
        let (this, event) = (self.clone(), event.clone());
        tx.run(move |t| ProcessedEvents::claim(&this, t, &event))
            .await?
    }

    async fn check_fence(&self, tx: &mut Self::Tx<'_>, fence: &Fence) -> Result<()> {
        if self.sql.fence.is_none() {
            return Err(self.unfenced());
        }
        let (this, fence) = (self.clone(), fence.clone());
        tx.run(move |t| this.check_fence_in(t, &fence)).await?
    }

    async fn commit(&self, tx: Self::Tx<'_>) -> Result<()> {
        tx.commit().await
    }

    async fn rollback(&self, tx: Self::Tx<'_>) -> Result<()> {
        tx.rollback().await
    }

    async fn is_processed(&self, conn: &Arc<Mutex<Connection>>, event_id: &str) -> Result<bool> {
        let event_id = event_id.to_owned();
        self.on_pool(conn, move |this, conn| {
            ProcessedEvents::is_processed(this, conn, &event_id)
        })
        .await
    }

    async fn prune(&self, conn: &Arc<Mutex<Connection>>, older_than: i64) -> Result<u64> {
        self.on_pool(conn, move |this, conn| {
            ProcessedEvents::prune(this, conn, older_than)
        })
        .await
    }
}

/// [`ProcessedEvents::apply_once`] on the default table (`watukuy_processed_events`, system
/// clock).
pub async fn apply_once<T, E, F>(
    conn: &Arc<Mutex<Connection>>,
    event: &Event,
    projection: F,
) -> std::result::Result<ApplyOutcome<T>, ApplyError<E>>
where
    T: Send + 'static,
    E: Send + 'static,
    F: FnOnce(&Transaction<'_>) -> std::result::Result<T, E> + Send + 'static,
{
    ProcessedEvents::default()
        .apply_once(conn, event, projection)
        .await
}

/// Fills `{table}` (a validated identifier).
fn render(template: &str, table: &str) -> String {
    template.replace("{table}", table)
}

enum Failure {
    Sql(rusqlite::Error),
    Newer(i64),
}

impl From<rusqlite::Error> for Failure {
    fn from(error: rusqlite::Error) -> Self {
        Failure::Sql(error)
    }
}

#[cfg(test)]
mod tests;
