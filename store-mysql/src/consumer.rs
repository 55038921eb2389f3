//! The idempotent consumer: a processed-events table in the consumer's database and
//! [`apply_once`], which records an event id and runs the projection in one transaction.
//!
//! Delivery is at least once, so a handler can see an event again (after a crash between its
//! commit and the acknowledgement, a lost lease, a timeout, a replay). `apply_once` makes a
//! projection exactly-once in its effect: the marker row and the projection's writes commit
//! together or not at all, and a second delivery of the same event id finds the marker and
//! changes nothing.
//!
//! ```rust,no_run
//! use watukuy_core::delivery::ApplyOutcome;
//! use watukuy_core::{Event, HandlerContext, HandlerError};
//! use watukuy_store_mysql::{MySqlPool, ProcessedEvents};
//!
//! # async fn handler(pool: MySqlPool, event: Event, ctx: HandlerContext) -> Result<(), HandlerError> {
//! let processed = ProcessedEvents::default();
//! # processed.migrate(&pool).await?;
//! let subject = event.subject.as_str(); // the projection may borrow
//! processed
//!     .apply_once(&pool, &event, |tx| {
//!         Box::pin(async move {
//!             sqlx::query("INSERT INTO totals (subject, n) VALUES (?, 1) ON DUPLICATE KEY UPDATE n = n + 1")
//!                 .bind(subject)
//!                 .execute(&mut **tx)
//!                 .await?;
//!             Ok::<_, sqlx::Error>(())
//!         })
//!     })
//!     .await?
//!     .report(&ctx); // counts as applied or deduplicated in `inspect()`
//! # Ok(())
//! # }
//! ```
//!
//! # How a claim decides on MySQL / MariaDB
//!
//! A claim first locks a row that always exists: one of 4096 rows of `<table>_locks`, chosen
//! by a hash of the event's poller, partition and subject. Claims of one subject, and so of one
//! event id, run one after the other: a claim that meets a concurrent, uncommitted one waits for
//! that transaction to end. (Waiting on the insert of a new row instead deadlocks in InnoDB when
//! the inserter rolls back and two claims wait: their locks on the vanished row turn into gap
//! locks that block each other's inserts.) Then it inserts the marker; when the marker exists
//! already, it reads the subject's last applied event with a locking read (the newest committed
//! row, not the snapshot InnoDB's default `REPEATABLE READ` would show) and asks [`reapplies`].
//! So overlapping claims wait, and never deadlock each other, at any isolation level.

use std::sync::{Arc, LazyLock};

use futures::future::BoxFuture;
use sqlx::mysql::MySqlDatabaseError;
use sqlx::{Executor, MySql, MySqlConnection, MySqlPool, Transaction};
use watukuy_core::delivery::{
    self, ApplyError, ApplyOutcome, ConsumerStore, Fence, LastApplied, reapplies,
};
use watukuy_core::{
    Error, Event, Result,
    clock::{Clock, SystemClock},
    store::StoreErrorKind,
};

use crate::codec::text;
use crate::error::{OrStore, map, number};
use crate::schema::{release_named_lock, take_named_lock};
use crate::sql::{Tables, check_len, limit};

/// The newest version of the processed-events table this crate creates.
pub const PROCESSED_EVENTS_VERSION: i32 = 3;

/// The default table name.
pub const DEFAULT_PROCESSED_EVENTS_TABLE: &str = "watukuy_processed_events";

/// MySQL names are at most 64 characters.
const MAX_NAME: usize = 64;

/// The longest suffix derived from the table name (`_subjects`; `_version` and `_locks` are
/// shorter).
const LONGEST_SUFFIX: usize = "_subjects".len();

/// How long `migrate` waits for another process's migration of the same table, in seconds.
const MIGRATE_LOCK_TIMEOUT_SECS: u32 = 60;

/// One version: its statements (one per file; MySQL commits each DDL statement on its own, so
/// every one is re-runnable).
struct Migration {
    version: i32,
    name: &'static str,
    templates: &'static [&'static str],
}

const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "processed_events",
        templates: &[include_str!("../sql/consumer/0001_processed_events.sql")],
    },
    Migration {
        version: 2,
        name: "subjects",
        templates: &[include_str!("../sql/consumer/0002_subjects.sql")],
    },
    Migration {
        version: 3,
        name: "claim_locks",
        templates: &[
            include_str!("../sql/consumer/0003_claim_locks.sql"),
            include_str!("../sql/consumer/0003_claim_lock_rows.sql"),
        ],
    },
];

const VERSION_TABLE: &str = include_str!("../sql/consumer/schema_version.sql");
const LOCK_BUCKET: &str = include_str!("../sql/consumer/lock_bucket.sql");
const INSERT_MARKER: &str = include_str!("../sql/consumer/insert_marker.sql");
const LAST_APPLIED: &str = include_str!("../sql/consumer/last_applied.sql");
const RECORD_SUBJECT: &str = include_str!("../sql/consumer/record_subject.sql");
const RECLAIM: &str = include_str!("../sql/consumer/reclaim.sql");
const FENCE: &str = include_str!("../sql/consumer/fence.sql");
const IS_PROCESSED: &str = include_str!("../sql/consumer/is_processed.sql");
const PRUNE_SUBJECTS: &str = include_str!("../sql/consumer/prune_subjects.sql");
const PRUNE_MARKERS: &str = include_str!("../sql/consumer/prune_markers.sql");

/// The statements of one table, rendered once.
struct Statements {
    lock_bucket: String,
    insert_marker: String,
    last_applied: String,
    record_subject: String,
    reclaim: String,
    is_processed: String,
    prune_subjects: String,
    prune_markers: String,
}

impl Statements {
    fn new(table: &str) -> Self {
        let render = |t: &str| render(t, table);
        Self {
            lock_bucket: render(LOCK_BUCKET),
            insert_marker: render(INSERT_MARKER),
            last_applied: render(LAST_APPLIED),
            record_subject: render(RECORD_SUBJECT),
            reclaim: render(RECLAIM),
            is_processed: render(IS_PROCESSED),
            prune_subjects: render(PRUNE_SUBJECTS),
            prune_markers: render(PRUNE_MARKERS),
        }
    }
}

/// The processed-events table of an idempotent consumer, in the consumer's own database (the
/// one its read model lives in, the database of the pool you pass; it need not be the
/// store's).
///
/// Columns: `event_id` (primary key), `poller`, `partition`, `lane`, `type`, `applied_at`
/// (epoch ms from the configured [`Clock`]); beside it, `<table>_subjects` keeps the last event
/// applied per subject (its id, type and sequence), so an id that comes back as a new change (a
/// re-create after a delete) is applied again (see [`claim`](Self::claim)), and
/// `<table>_locks` holds the 4096 rows claims lock (`<table>_version` the migrations). Ids and
/// keys are
/// `VARBINARY`, compared byte for byte like the store's; event ids, pollers and partitions are
/// at most 255 bytes, subjects 1024. Create the tables with [`migrate`](Self::migrate)
/// (versioned, under a `GET_LOCK` named lock, safe to run from every instance at once) or take
/// the text from [`ddl`](Self::ddl) for your own migration tool.
///
/// [`apply_once`](Self::apply_once) runs the projection at `READ COMMITTED`, set for its
/// transaction only (the store's level, and PostgreSQL's default): no gap locks, so
/// projections of different subjects do not block each other. On a server writing its binary
/// log in `STATEMENT` format writes fail at that level (error 1665); use `ROW` or `MIXED`.
#[derive(Clone)]
pub struct ProcessedEvents {
    table: String,
    clock: Arc<dyn Clock>,
    sql: Arc<Statements>,
    /// The lease check of `fenced_by`, on the engine store's key table.
    fence: Option<Arc<str>>,
}

impl std::fmt::Debug for ProcessedEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessedEvents")
            .field("table", &self.table)
            .field("fenced", &self.fence.is_some())
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
    /// The table `table` in the pool's database. It must match `^[A-Za-z_][A-Za-z0-9_]*$` and
    /// be at most 55 bytes (so `<table>_subjects` fits MySQL's 64); anything else is a `Config`
    /// error naming `processed_events.table`.
    pub fn new(table: impl Into<String>) -> Result<Self> {
        let table = table.into();
        check_identifier("processed_events.table", &table, MAX_NAME - LONGEST_SUFFIX)?;
        Ok(Self::build(table))
    }

    fn build(table: String) -> Self {
        Self {
            sql: Arc::new(Statements::new(&table)),
            table,
            clock: Arc::new(SystemClock),
            fence: None,
        }
    }

    /// Lets [`check_fence`](ConsumerStore::check_fence) (and so
    /// [`apply_once_fenced`](Self::apply_once_fenced)) read the leases of the engine store
    /// configured with `store` — a [`MySqlStore`](crate::MySqlStore) in the same database as
    /// this table. A projection's transaction then commits only while its delivery's lease is
    /// still held: an instance frozen past its lease cannot commit when it wakes. Fails with a
    /// `Config` error naming the option when `store` is invalid.
    pub fn fenced_by(mut self, store: &crate::MySqlOptions) -> Result<Self> {
        store.validate()?;
        let keys = Tables::new(&store.table_prefix).keys;
        self.fence = Some(FENCE.replace("{keys}", &keys).into());
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
        &self.table
    }

    /// The complete, idempotent DDL (version table, every migration and its version row), one
    /// statement per `;`, for review or your own migration tool.
    pub fn ddl(&self) -> String {
        let mut out = String::new();
        out.push_str(self.render(VERSION_TABLE).trim_end());
        out.push_str(";\n");
        for migration in MIGRATIONS {
            for template in migration.templates {
                out.push_str(self.render(template).trim_end());
                out.push_str(";\n");
            }
            out.push_str(&format!(
                "INSERT INTO `{}_version` (version, name) VALUES ({}, '{}') ON DUPLICATE KEY UPDATE name = name;\n",
                self.table, migration.version, migration.name
            ));
        }
        out
    }

    /// Creates the tables, applying pending migrations under the named lock
    /// `watukuy-consumer:<SHA1 of database/table>` (`GET_LOCK`, waited for up to 60 s), so
    /// instances migrating at once apply each step once. MySQL commits every DDL statement on
    /// its own; each step is re-runnable and its version row is written after it, so a
    /// migration cut short is finished by the next. Fails with a `Schema` store error when the
    /// table is newer than this crate knows, with a `Config` error when the pool's URL names no
    /// database.
    pub async fn migrate(&self, pool: &MySqlPool) -> Result<()> {
        let doing = format!("migrate the processed-events table `{}`", self.table);
        let mut conn = pool.acquire().await.store(&doing)?;
        let lock = take_named_lock(
            &mut conn,
            "watukuy-consumer",
            &self.table,
            MIGRATE_LOCK_TIMEOUT_SECS,
            &doing,
        )
        .await?;
        let outcome = self.migrate_locked(&mut conn, &doing).await;
        let released = release_named_lock(&mut conn, &lock, &doing).await;
        outcome?;
        released
    }

    async fn migrate_locked(&self, conn: &mut MySqlConnection, doing: &str) -> Result<()> {
        let versions = self.render(VERSION_TABLE);
        (&mut *conn).execute(versions.as_str()).await.store(doing)?;
        let current: Option<i32> = sqlx::query_scalar(&format!(
            "SELECT MAX(version) FROM `{}_version`",
            self.table
        ))
        .fetch_one(&mut *conn)
        .await
        .store(doing)?;
        let current = current.unwrap_or(0);
        if current > PROCESSED_EVENTS_VERSION {
            return Err(Error::store(
                StoreErrorKind::Schema,
                false,
                format!(
                    "the processed-events table `{}` is at version {current}, newer than this \
                     watukuy-store-mysql knows ({PROCESSED_EVENTS_VERSION}): upgrade the crate",
                    self.table
                ),
            ));
        }
        let record = format!(
            "INSERT INTO `{}_version` (version, name) VALUES (?, ?) ON DUPLICATE KEY UPDATE name = name",
            self.table
        );
        for migration in MIGRATIONS.iter().filter(|m| m.version > current) {
            let step = format!("{doing}: step {} ({})", migration.version, migration.name);
            for template in migration.templates {
                let ddl = self.render(template);
                (&mut *conn).execute(ddl.as_str()).await.store(&step)?;
            }
            sqlx::query(&record)
                .bind(migration.version)
                .bind(migration.name)
                .execute(&mut *conn)
                .await
                .store(&step)?;
        }
        Ok(())
    }

    /// Claims `event` inside a transaction you run: records it and returns `true` when it is a
    /// change to apply, or returns `false` when it was applied already (then do nothing, and let
    /// your transaction end). Commit your projection's writes in the same transaction, so the
    /// record exists exactly when they do. Correct at any isolation level, InnoDB's default
    /// `REPEATABLE READ` included.
    ///
    /// The claim first locks its subject's bucket row in `<table>_locks` (one of 4096 rows,
    /// chosen by a hash of poller, partition and subject), so a concurrent claim of the same id
    /// (or of another event of the same subject) waits until the first transaction ends, then
    /// decides on what it committed. When the id has a marker, it is a duplicate while it is
    /// still its subject's last applied event, or when this delivery is not newer (by sequence)
    /// than that event: a redelivery. When it is newer and another event
    /// of its subject was applied since, it came back as a new change — a re-create after a
    /// delete with the same content, an item changed back to an earlier content — and is
    /// claimed again (see [`reapplies`](watukuy_core::delivery::reapplies)). Three statements
    /// for a new id, three (a duplicate) or five (a new change) for one already recorded.
    ///
    /// An event id, poller or partition longer than 255 bytes, or a subject longer than 1024,
    /// is a permanent `Rejected` error naming it. A wait longer than the server's
    /// `innodb_lock_wait_timeout` fails with a transient `Busy` error.
    pub async fn claim(&self, conn: &mut MySqlConnection, event: &Event) -> Result<bool> {
        check_len("event id", &event.id, limit::NAME)?;
        check_len("poller name", &event.poller, limit::NAME)?;
        check_len("partition", &event.partition, limit::NAME)?;
        check_len("subject", &event.subject, limit::IDENTITY)?;
        let sql = &self.sql;
        let now = self.clock.now_ms();
        let failed = |step: &'static str| {
            move |e| {
                map(
                    &format!("claim event {} in `{}`: {step}", event.id, self.table),
                    e,
                )
            }
        };
        let (poller, partition, subject) = (
            event.poller.as_bytes(),
            event.partition.as_bytes(),
            event.subject.as_bytes(),
        );
        let record_subject = || {
            sqlx::query(&sql.record_subject)
                .bind(poller)
                .bind(partition)
                .bind(subject)
                .bind(event.id.as_bytes())
                .bind(event.event_type.as_str().as_bytes())
                .bind(now)
                .bind(event.sequence)
                .bind(event.id.as_bytes())
                .bind(event.event_type.as_str().as_bytes())
                .bind(now)
                .bind(event.sequence)
        };

        let bucket = sqlx::query(&sql.lock_bucket)
            .bind(poller)
            .bind(partition)
            .bind(subject)
            .fetch_optional(&mut *conn)
            .await
            .map_err(failed("lock its subject's bucket"))?;
        if bucket.is_none() {
            return Err(Error::store(
                StoreErrorKind::Schema,
                false,
                format!(
                    "the processed-events table `{}` has no claim locks (`{}_locks` is missing \
                     rows): run migrate",
                    self.table, self.table
                ),
            ));
        }
        let inserted = sqlx::query(&sql.insert_marker)
            .bind(event.id.as_bytes())
            .bind(poller)
            .bind(partition)
            .bind(event.lane.as_str().as_bytes())
            .bind(event.event_type.as_str().as_bytes())
            .bind(now)
            .execute(&mut *conn)
            .await;
        match inserted {
            Ok(_) => {
                record_subject()
                    .execute(&mut *conn)
                    .await
                    .map_err(failed("record its subject"))?;
                return Ok(true);
            }
            Err(e) if is_duplicate_key(&e) => {}
            Err(e) => return Err(failed("insert its marker")(e)),
        }

        let row: Option<(Vec<u8>, Vec<u8>, i64)> = sqlx::query_as(&sql.last_applied)
            .bind(poller)
            .bind(partition)
            .bind(subject)
            .fetch_optional(&mut *conn)
            .await
            .map_err(failed("read its subject"))?;
        let last = match row {
            Some((id, kind, sequence)) => {
                let what = format!("the last applied event of subject {:?}", event.subject);
                Some((text(&what, id)?, text(&what, kind)?, sequence))
            }
            None => None,
        };
        let last = last
            .as_ref()
            .map(|(id, kind, sequence)| LastApplied::new(id, kind, Some(*sequence)));
        if !reapplies(event, last) {
            return Ok(false);
        }
        sqlx::query(&sql.reclaim)
            .bind(event.lane.as_str().as_bytes())
            .bind(event.event_type.as_str().as_bytes())
            .bind(now)
            .bind(event.id.as_bytes())
            .execute(&mut *conn)
            .await
            .map_err(failed("stamp its marker again"))?;
        record_subject()
            .execute(&mut *conn)
            .await
            .map_err(failed("record its subject"))?;
        Ok(true)
    }

    /// Applies `event` at most once: in ONE transaction, claims it and, when it is a change to
    /// apply, runs `projection` on the transaction, then commits (see
    /// [`apply_once`](watukuy_core::delivery::apply_once) for every outcome).
    ///
    /// - A repeated delivery is a no-op: [`ApplyOutcome::Deduplicated`] (the projection does
    ///   not run).
    /// - The projection's error rolls everything back, marker included:
    ///   [`ApplyError::Projection`]; a later delivery applies it afresh.
    /// - Dropping the returned future before it completes (a crash) rolls back as well.
    /// - A failure of the claim or of the commit is [`ApplyError::Store`]. When a commit fails
    ///   in flight its outcome is unknown; the redelivery then finds the marker or not.
    ///
    /// The projection is a closure taking the transaction and returning a boxed future
    /// (`|tx| Box::pin(async move { ... })`, the shape of sqlx's own `Connection::transaction`);
    /// run statements on `&mut **tx`. It may borrow from the caller (the transaction's `'a`),
    /// and the whole call stays `Send`, so it works inside handlers. The transaction runs at
    /// `READ COMMITTED`. Where this table shares the engine store's database, prefer
    /// [`apply_once_fenced`](Self::apply_once_fenced).
    pub async fn apply_once<'a, T, E, F>(
        &'a self,
        pool: &'a MySqlPool,
        event: &Event,
        projection: F,
    ) -> std::result::Result<ApplyOutcome<T>, ApplyError<E>>
    where
        F: for<'t> FnOnce(
            &'t mut Transaction<'a, MySql>,
        ) -> BoxFuture<'t, std::result::Result<T, E>>,
    {
        delivery::apply_once(self, pool, event, None, projection).await
    }

    /// [`apply_once`](Self::apply_once) that commits only while the delivery's lease is still
    /// held: `fence` is the handler's [`HandlerContext::fence`](watukuy_core::HandlerContext::fence),
    /// checked in the projection's transaction just before the commit. A lease lost meanwhile
    /// (the instance was frozen past it) rolls everything back with
    /// [`ApplyError::Store`]`(`[`Error::LeaseLost`]`)`, and the new holder applies the event.
    /// Needs [`fenced_by`](Self::fenced_by) (otherwise every call fails with `Unsupported`).
    pub async fn apply_once_fenced<'a, T, E, F>(
        &'a self,
        pool: &'a MySqlPool,
        event: &Event,
        fence: &Fence,
        projection: F,
    ) -> std::result::Result<ApplyOutcome<T>, ApplyError<E>>
    where
        F: for<'t> FnOnce(
            &'t mut Transaction<'a, MySql>,
        ) -> BoxFuture<'t, std::result::Result<T, E>>,
    {
        delivery::apply_once(self, pool, event, Some(fence), projection).await
    }

    /// Whether `event_id` has a marker (committed; a claim in flight is not seen).
    pub async fn is_processed(&self, pool: &MySqlPool, event_id: &str) -> Result<bool> {
        let found = sqlx::query(&self.sql.is_processed)
            .bind(event_id.as_bytes())
            .fetch_optional(pool)
            .await
            .store(&format!("is_processed in `{}`", self.table))?;
        Ok(found.is_some())
    }

    /// Deletes markers (and subjects' last applied events) applied before `older_than` (epoch
    /// ms), in one `READ COMMITTED` transaction; returns how many markers.
    ///
    /// A pruned event is no longer recognised: only prune markers older than any redelivery
    /// you still expect (retries and parked events you may retry, and the poller's log
    /// retention if you replay into the same read model).
    pub async fn prune(&self, pool: &MySqlPool, older_than: i64) -> Result<u64> {
        let doing = format!("prune `{}`", self.table);
        let mut tx = crate::store::begin(pool, &doing).await?;
        sqlx::query(&self.sql.prune_subjects)
            .bind(older_than)
            .execute(&mut *tx)
            .await
            .store(&doing)?;
        let markers = sqlx::query(&self.sql.prune_markers)
            .bind(older_than)
            .execute(&mut *tx)
            .await
            .store(&doing)?;
        tx.commit().await.store(&doing)?;
        Ok(markers.rows_affected())
    }

    /// Deletes markers older than `ttl` on the configured clock; returns how many.
    pub async fn prune_older_than(
        &self,
        pool: &MySqlPool,
        ttl: std::time::Duration,
    ) -> Result<u64> {
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        self.prune(pool, self.clock.now_ms().saturating_sub(ttl_ms))
            .await
    }

    fn render(&self, template: &str) -> String {
        render(template, &self.table)
    }
}

#[async_trait::async_trait]
impl ConsumerStore for ProcessedEvents {
    type Conn = MySqlPool;
    type Tx<'a> = Transaction<'a, MySql>;

    /// A `READ COMMITTED` transaction, begun in a task of its own so a caller dropped mid-begin
    /// never hands the pool a connection inside a transaction.
    async fn begin<'a>(&'a self, pool: &'a MySqlPool) -> Result<Transaction<'a, MySql>> {
        let doing = format!("apply_once on `{}`: begin", self.table);
        Ok(crate::store::begin(pool, &doing).await?)
    }

    async fn claim(&self, tx: &mut Transaction<'_, MySql>, event: &Event) -> Result<bool> {
        ProcessedEvents::claim(self, tx, event).await
    }

    async fn check_fence(&self, tx: &mut Transaction<'_, MySql>, fence: &Fence) -> Result<()> {
        let Some(sql) = &self.fence else {
            return Err(Error::Unsupported {
                message: format!(
                    "the processed-events table `{}` cannot check leases: build it with \
                     fenced_by(&store_options) (the engine store must share its database)",
                    self.table
                ),
            });
        };
        let held = sqlx::query(sql)
            .bind(fence.poller.as_bytes())
            .bind(fence.partition.as_bytes())
            .bind(fence.owner.as_bytes())
            .bind(fence.epoch)
            .fetch_optional(&mut **tx)
            .await
            .store(&format!("check the lease of {}", fence.key()))?;
        if held.is_some() {
            Ok(())
        } else {
            Err(Error::lease_lost(&fence.key(), fence.epoch))
        }
    }

    async fn commit(&self, tx: Transaction<'_, MySql>) -> Result<()> {
        tx.commit()
            .await
            .store(&format!("apply_once on `{}`: commit", self.table))
    }

    async fn rollback(&self, tx: Transaction<'_, MySql>) -> Result<()> {
        tx.rollback()
            .await
            .store(&format!("apply_once on `{}`: roll back", self.table))
    }

    async fn is_processed(&self, pool: &MySqlPool, event_id: &str) -> Result<bool> {
        ProcessedEvents::is_processed(self, pool, event_id).await
    }

    async fn prune(&self, pool: &MySqlPool, older_than: i64) -> Result<u64> {
        ProcessedEvents::prune(self, pool, older_than).await
    }
}

/// [`ProcessedEvents::apply_once`] on the default table (`watukuy_processed_events` in the
/// pool's database, system clock).
pub async fn apply_once<'a, T, E, F>(
    pool: &'a MySqlPool,
    event: &Event,
    projection: F,
) -> std::result::Result<ApplyOutcome<T>, ApplyError<E>>
where
    F: for<'t> FnOnce(&'t mut Transaction<'a, MySql>) -> BoxFuture<'t, std::result::Result<T, E>>,
{
    static DEFAULT: LazyLock<ProcessedEvents> = LazyLock::new(ProcessedEvents::default);
    DEFAULT.apply_once(pool, event, projection).await
}

/// Whether `error` is the server's duplicate-key error (`ER_DUP_ENTRY`).
fn is_duplicate_key(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<MySqlDatabaseError>()
            .is_some_and(|my| my.number() == number::DUP_ENTRY),
        _ => false,
    }
}

/// Fills `{table}` (a validated identifier, always inside back quotes in the templates).
fn render(template: &str, table: &str) -> String {
    template.replace("{table}", table)
}

/// Accepts `^[A-Za-z_][A-Za-z0-9_]*$` of 1 to `max` bytes.
fn check_identifier(option: &str, value: &str, max: usize) -> Result<()> {
    let mut chars = value.chars();
    let valid = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(Error::config(
            option,
            format!("must match [A-Za-z_][A-Za-z0-9_]*, got {value:?}"),
        ));
    }
    if value.len() > max {
        return Err(Error::config(
            option,
            format!("must be at most {max} bytes, got {}", value.len()),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_checked_and_quoted() {
        assert!(ProcessedEvents::new("processed").is_ok());
        assert!(ProcessedEvents::new("t".repeat(55)).is_ok());
        for table in ["x; drop", "", "1abc", "a-b", "`t`", &"t".repeat(56)] {
            match ProcessedEvents::new(table) {
                Err(Error::Config { option, .. }) => assert_eq!(option, "processed_events.table"),
                other => panic!("expected a config error for {table:?}, got {other:?}"),
            }
        }
        let ddl = ProcessedEvents::new("seen").unwrap().ddl();
        assert!(ddl.contains("CREATE TABLE IF NOT EXISTS `seen` ("));
        assert!(ddl.contains("CREATE TABLE IF NOT EXISTS `seen_subjects` ("));
        assert!(ddl.contains("CREATE TABLE IF NOT EXISTS `seen_version` ("));
        assert!(ddl.contains("CREATE TABLE IF NOT EXISTS `seen_locks` ("));
        assert!(ddl.contains("INSERT INTO `seen_version` (version, name) VALUES (2, 'subjects')"));
        assert!(ddl.contains("VALUES (3, 'claim_locks')"));
        // Every lock a claim can ask for is one of the rows the migration writes.
        assert!(LOCK_BUCKET.contains("% 4096"));
        assert!(MIGRATIONS[2].templates[1].contains("a.n * 256 + b.n * 16 + c.n < 4096"));
        assert!(!ddl.contains('{'));
    }

    #[test]
    fn the_fence_reads_the_store_keys_in_share_mode() {
        let fenced = ProcessedEvents::default()
            .fenced_by(&crate::MySqlOptions::default().table_prefix("app_"))
            .unwrap();
        let sql = fenced.fence.as_deref().unwrap();
        assert!(sql.contains("FROM `app_keys`"));
        assert!(sql.trim_end().ends_with("LOCK IN SHARE MODE"));
        let err = ProcessedEvents::default()
            .fenced_by(&crate::MySqlOptions::default().table_prefix("a-b"))
            .unwrap_err();
        assert!(err.to_string().contains("table_prefix"));
    }
}
