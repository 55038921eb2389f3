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
//! use watukuy_store_postgres::{PgPool, ProcessedEvents};
//!
//! # async fn handler(pool: PgPool, event: Event, ctx: HandlerContext) -> Result<(), HandlerError> {
//! let processed = ProcessedEvents::default();
//! # processed.migrate(&pool).await?;
//! let subject = event.subject.as_str(); // the projection may borrow
//! processed
//!     .apply_once(&pool, &event, |tx| {
//!         Box::pin(async move {
//!             sqlx::query("UPDATE totals SET n = n + 1 WHERE subject = $1")
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

use std::sync::{Arc, LazyLock};

use futures::future::BoxFuture;
use sqlx::{Executor, PgConnection, PgPool, Postgres, Row, Transaction};
use watukuy_core::delivery::{
    self, ApplyError, ApplyOutcome, ConsumerStore, Fence, LastApplied, reapplies,
};
use watukuy_core::{
    Error, Event, Result,
    clock::{Clock, SystemClock},
    store::StoreErrorKind,
};

use crate::error::classify;

/// The newest version of the processed-events table this crate creates.
pub const PROCESSED_EVENTS_VERSION: i32 = 3;

/// The default table name.
pub const DEFAULT_PROCESSED_EVENTS_TABLE: &str = "watukuy_processed_events";

/// The longest suffix derived from the table name (`_applied_idx`).
const LONGEST_SUFFIX: usize = "_applied_idx".len();

struct Migration {
    version: i32,
    name: &'static str,
    template: &'static str,
}

const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "processed_events",
        template: include_str!("../sql/consumer/0001_processed_events.sql"),
    },
    Migration {
        version: 2,
        name: "subjects",
        template: include_str!("../sql/consumer/0002_subjects.sql"),
    },
    Migration {
        version: 3,
        name: "sequence",
        template: include_str!("../sql/consumer/0003_sequence.sql"),
    },
];

const VERSION_TABLE: &str = include_str!("../sql/consumer/schema_version.sql");
const INSERT_MARKER: &str = include_str!("../sql/consumer/insert_marker.sql");
const RECHECK: &str = include_str!("../sql/consumer/recheck.sql");
const RECLAIM: &str = include_str!("../sql/consumer/reclaim.sql");
const FENCE: &str = include_str!("../sql/consumer/fence.sql");
const PRUNE: &str = include_str!("../sql/consumer/prune.sql");
const IS_PROCESSED: &str = include_str!("../sql/consumer/is_processed.sql");

/// The processed-events table of an idempotent consumer, in the consumer's own database (the
/// one its read model lives in; it need not be the store's).
///
/// Columns: `event_id` (primary key), `poller`, `partition`, `lane`, `type`, `applied_at`
/// (epoch ms from the configured [`Clock`]); beside it, `<table>_subjects` keeps the last event
/// applied per subject, so an id that comes back as a new change (a re-create after a delete)
/// is applied again (see [`claim`](Self::claim)). Create them with [`migrate`](Self::migrate) (versioned,
/// under advisory locks, safe to run from every instance at once) or take the text from
/// [`ddl`](Self::ddl) for your own migration tool.
#[derive(Clone)]
pub struct ProcessedEvents {
    schema: String,
    table: String,
    clock: Arc<dyn Clock>,
    insert: String,
    recheck: String,
    reclaim: String,
    prune: String,
    is_processed: String,
    /// The lease check of `fenced_by`, on the engine store's table.
    fence: Option<String>,
}

impl std::fmt::Debug for ProcessedEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessedEvents")
            .field("schema", &self.schema)
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl Default for ProcessedEvents {
    /// `public.watukuy_processed_events`, stamped with the system clock.
    fn default() -> Self {
        Self::build(
            "public".to_owned(),
            DEFAULT_PROCESSED_EVENTS_TABLE.to_owned(),
        )
    }
}

impl ProcessedEvents {
    /// The table `schema.table`. Both must match `^[A-Za-z_][A-Za-z0-9_]*$` (the table at most
    /// 51 bytes, so its index name fits PostgreSQL's 63); anything else is a `Config` error
    /// naming `processed_events.schema` or `processed_events.table`.
    pub fn new(schema: impl Into<String>, table: impl Into<String>) -> Result<Self> {
        let (schema, table) = (schema.into(), table.into());
        check_identifier("processed_events.schema", &schema, 63)?;
        check_identifier("processed_events.table", &table, 63 - LONGEST_SUFFIX)?;
        Ok(Self::build(schema, table))
    }

    fn build(schema: String, table: String) -> Self {
        let render = |t: &str| render(t, &schema, &table);
        Self {
            insert: render(INSERT_MARKER),
            recheck: render(RECHECK),
            reclaim: render(RECLAIM),
            prune: render(PRUNE),
            is_processed: render(IS_PROCESSED),
            schema,
            table,
            clock: Arc::new(SystemClock),
            fence: None,
        }
    }

    /// Lets [`check_fence`](ConsumerStore::check_fence) (and so
    /// [`apply_once_fenced`](Self::apply_once_fenced)) read the leases of the engine store
    /// configured with `store` — a [`PostgresStore`](crate::PostgresStore) in the same
    /// database as this table. A projection's transaction then commits only while its
    /// delivery's lease is still held: an instance frozen past its lease cannot commit when it
    /// wakes. Fails with a `Config` error naming the option when `store` is invalid.
    pub fn fenced_by(mut self, store: &crate::PostgresOptions) -> Result<Self> {
        store.validate()?;
        let pollers = format!("\"{}\".\"{}pollers\"", store.schema, store.table_prefix);
        self.fence = Some(FENCE.replace("{pollers}", &pollers));
        Ok(self)
    }

    /// Stamps `applied_at` and measures TTLs with `clock` (default: the system clock).
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The schema.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The table name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The complete, idempotent DDL (schema, version table, every migration and its version
    /// row) for review or your own migration tool.
    pub fn ddl(&self) -> String {
        let mut out = format!("CREATE SCHEMA IF NOT EXISTS \"{}\";\n", self.schema);
        out.push_str(self.render(VERSION_TABLE).trim_end());
        out.push_str(";\n");
        for migration in MIGRATIONS {
            out.push_str(self.render(migration.template).trim_end());
            out.push('\n');
            out.push_str(&format!(
                "INSERT INTO \"{}\".\"{}_version\" (version, name) VALUES ({}, '{}') ON CONFLICT (version) DO NOTHING;\n",
                self.schema, self.table, migration.version, migration.name
            ));
        }
        out
    }

    /// Creates the schema (when missing) and the table, applying pending migrations in one
    /// transaction under the advisory locks `watukuy:migrate:<schema>` (shared with the store's
    /// own migrations) and `watukuy:consumer:<schema>.<table>`. Fails with a `Schema` store
    /// error when the table is newer than this crate knows.
    pub async fn migrate(&self, pool: &PgPool) -> Result<()> {
        let mut tx = pool.begin().await.map_err(classify)?;
        self.migrate_in(&mut tx).await?;
        tx.commit().await.map_err(classify)
    }

    async fn migrate_in(&self, conn: &mut PgConnection) -> Result<()> {
        for lock in [
            format!("watukuy:migrate:{}", self.schema),
            format!("watukuy:consumer:{}.{}", self.schema, self.table),
        ] {
            sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
                .bind(lock)
                .execute(&mut *conn)
                .await
                .map_err(classify)?;
        }
        let schema_exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
                .bind(&self.schema)
                .fetch_one(&mut *conn)
                .await
                .map_err(classify)?;
        if !schema_exists {
            let create = format!("CREATE SCHEMA IF NOT EXISTS \"{}\"", self.schema);
            (&mut *conn)
                .execute(create.as_str())
                .await
                .map_err(classify)?;
        }
        let versions = self.render(VERSION_TABLE);
        (&mut *conn)
            .execute(versions.as_str())
            .await
            .map_err(classify)?;
        let versions_table = format!("\"{}\".\"{}_version\"", self.schema, self.table);
        let current: Option<i32> =
            sqlx::query_scalar(&format!("SELECT max(version) FROM {versions_table}"))
                .fetch_one(&mut *conn)
                .await
                .map_err(classify)?;
        let current = current.unwrap_or(0);
        if current > PROCESSED_EVENTS_VERSION {
            return Err(Error::store(
                StoreErrorKind::Schema,
                false,
                format!(
                    "the processed-events table {:?}.{:?} is at version {current}, newer than \
                     this watukuy-store-postgres knows ({PROCESSED_EVENTS_VERSION}): upgrade the crate",
                    self.schema, self.table
                ),
            ));
        }
        let record = format!("INSERT INTO {versions_table} (version, name) VALUES ($1, $2)");
        for migration in MIGRATIONS.iter().filter(|m| m.version > current) {
            let ddl = self.render(migration.template);
            (&mut *conn).execute(ddl.as_str()).await.map_err(classify)?;
            sqlx::query(&record)
                .bind(migration.version)
                .bind(migration.name)
                .execute(&mut *conn)
                .await
                .map_err(classify)?;
        }
        Ok(())
    }

    /// Claims `event` inside a transaction you run: records it and returns `true` when it is a
    /// change to apply, or returns `false` when it was applied already (then do nothing, and let
    /// your transaction end). Commit your projection's writes in the same transaction, so the
    /// record exists exactly when they do. A concurrent claim of the same id waits for the
    /// first transaction to end and decides on what it committed (default `READ COMMITTED`
    /// isolation; under `REPEATABLE READ` or `SERIALIZABLE` it fails with a transient
    /// serialization error instead, to retry).
    ///
    /// An id with a marker is a duplicate while it is still its subject's last applied event,
    /// or when this delivery is not newer (by sequence) than that event: a redelivery. When a
    /// newer event is an id that another event of its subject was applied after, it came back
    /// as a new change — a re-create after a delete with the same content, an item changed
    /// back to an earlier content — and is claimed again (see
    /// [`reapplies`](watukuy_core::delivery::reapplies)); that costs two more statements.
    /// Markers written before the subjects table existed count as duplicates.
    pub async fn claim(&self, conn: &mut PgConnection, event: &Event) -> Result<bool> {
        let now = self.clock.now_ms();
        let bind = |sql| {
            sqlx::query(sql)
                .bind(event.id.as_str())
                .bind(event.poller.as_str())
                .bind(event.partition.as_str())
                .bind(event.lane.as_str())
                .bind(event.event_type.as_str())
                .bind(now)
                .bind(event.subject.as_str())
                .bind(event.sequence)
        };
        // A marker pruned between the insert and the re-check is claimed afresh; a few rounds
        // are plenty (prune deletes only old markers).
        for _ in 0..3 {
            let inserted: bool = bind(&self.insert)
                .fetch_one(&mut *conn)
                .await
                .and_then(|row| row.try_get(0))
                .map_err(classify)?;
            if inserted {
                return Ok(true);
            }
            let row = sqlx::query(&self.recheck)
                .bind(event.id.as_str())
                .bind(event.poller.as_str())
                .bind(event.partition.as_str())
                .bind(event.subject.as_str())
                .fetch_one(&mut *conn)
                .await
                .map_err(classify)?;
            let read = || -> std::result::Result<_, sqlx::Error> {
                Ok((
                    row.try_get::<bool, _>(0)?,
                    row.try_get::<Option<String>, _>(1)?,
                    row.try_get::<Option<String>, _>(2)?,
                    row.try_get::<Option<i64>, _>(3)?,
                ))
            };
            let (marked, last_id, last_type, last_sequence) = read().map_err(classify)?;
            if !marked {
                continue;
            }
            let last = last_id
                .as_deref()
                .zip(last_type.as_deref())
                .map(|(id, kind)| LastApplied::new(id, kind, last_sequence));
            if !reapplies(event, last) {
                return Ok(false);
            }
            bind(&self.reclaim)
                .execute(&mut *conn)
                .await
                .map_err(classify)?;
            return Ok(true);
        }
        Err(Error::store(
            StoreErrorKind::Other,
            true,
            format!(
                "the marker of event {} in {:?}.{:?} vanished three times while it was claimed \
                 (pruned concurrently?)",
                event.id, self.schema, self.table
            ),
        ))
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
    /// run statements on `&mut **tx`. It may borrow from the caller (the transaction's `'a`), and
    /// the whole call stays `Send`, so it works inside handlers. Where this table shares the
    /// engine store's database, prefer [`apply_once_fenced`](Self::apply_once_fenced).
    pub async fn apply_once<'a, T, E, F>(
        &'a self,
        pool: &'a PgPool,
        event: &Event,
        projection: F,
    ) -> std::result::Result<ApplyOutcome<T>, ApplyError<E>>
    where
        F: for<'t> FnOnce(
            &'t mut Transaction<'a, Postgres>,
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
        pool: &'a PgPool,
        event: &Event,
        fence: &Fence,
        projection: F,
    ) -> std::result::Result<ApplyOutcome<T>, ApplyError<E>>
    where
        F: for<'t> FnOnce(
            &'t mut Transaction<'a, Postgres>,
        ) -> BoxFuture<'t, std::result::Result<T, E>>,
    {
        delivery::apply_once(self, pool, event, Some(fence), projection).await
    }

    /// Whether `event_id` has a marker.
    pub async fn is_processed(&self, pool: &PgPool, event_id: &str) -> Result<bool> {
        sqlx::query_scalar(&self.is_processed)
            .bind(event_id)
            .fetch_one(pool)
            .await
            .map_err(classify)
    }

    /// Deletes markers applied before `older_than` (epoch ms); returns how many.
    ///
    /// A pruned event is no longer recognised: only prune markers older than any redelivery
    /// you still expect (retries and parked events you may retry, and the poller's log
    /// retention if you replay into the same read model).
    pub async fn prune(&self, pool: &PgPool, older_than: i64) -> Result<u64> {
        let pruned: i64 = sqlx::query_scalar(&self.prune)
            .bind(older_than)
            .fetch_one(pool)
            .await
            .map_err(classify)?;
        Ok(u64::try_from(pruned).unwrap_or(0))
    }

    /// Deletes markers older than `ttl` on the configured clock; returns how many.
    pub async fn prune_older_than(&self, pool: &PgPool, ttl: std::time::Duration) -> Result<u64> {
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        self.prune(pool, self.clock.now_ms().saturating_sub(ttl_ms))
            .await
    }

    fn render(&self, template: &str) -> String {
        render(template, &self.schema, &self.table)
    }
}

#[async_trait::async_trait]
impl ConsumerStore for ProcessedEvents {
    type Conn = PgPool;
    type Tx<'a> = Transaction<'a, Postgres>;

    async fn begin<'a>(&'a self, pool: &'a PgPool) -> Result<Transaction<'a, Postgres>> {
        pool.begin().await.map_err(classify)
    }

    async fn claim(&self, tx: &mut Transaction<'_, Postgres>, event: &Event) -> Result<bool> {
        ProcessedEvents::claim(self, tx, event).await
    }

    async fn check_fence(&self, tx: &mut Transaction<'_, Postgres>, fence: &Fence) -> Result<()> {
        let Some(sql) = &self.fence else {
            return Err(Error::Unsupported {
                message: format!(
                    "the processed-events table {:?}.{:?} cannot check leases: build it with \
                     fenced_by(&store_options) (the engine store must share its database)",
                    self.schema, self.table
                ),
            });
        };
        let held: bool = sqlx::query_scalar(sql)
            .bind(fence.poller.as_str())
            .bind(fence.partition.as_str())
            .bind(fence.owner.as_str())
            .bind(fence.epoch)
            .fetch_one(&mut **tx)
            .await
            .map_err(classify)?;
        if held {
            Ok(())
        } else {
            Err(Error::lease_lost(&fence.key(), fence.epoch))
        }
    }

    async fn commit(&self, tx: Transaction<'_, Postgres>) -> Result<()> {
        tx.commit().await.map_err(classify)
    }

    async fn rollback(&self, tx: Transaction<'_, Postgres>) -> Result<()> {
        tx.rollback().await.map_err(classify)
    }

    async fn is_processed(&self, pool: &PgPool, event_id: &str) -> Result<bool> {
        ProcessedEvents::is_processed(self, pool, event_id).await
    }

    async fn prune(&self, pool: &PgPool, older_than: i64) -> Result<u64> {
        ProcessedEvents::prune(self, pool, older_than).await
    }
}

/// [`ProcessedEvents::apply_once`] on the default table (`public.watukuy_processed_events`,
/// system clock).
pub async fn apply_once<'a, T, E, F>(
    pool: &'a PgPool,
    event: &Event,
    projection: F,
) -> std::result::Result<ApplyOutcome<T>, ApplyError<E>>
where
    F: for<'t> FnOnce(
        &'t mut Transaction<'a, Postgres>,
    ) -> BoxFuture<'t, std::result::Result<T, E>>,
{
    static DEFAULT: LazyLock<ProcessedEvents> = LazyLock::new(ProcessedEvents::default);
    DEFAULT.apply_once(pool, event, projection).await
}

/// Fills `{schema}` and `{table}` (validated identifiers, always inside double quotes in the
/// templates).
fn render(template: &str, schema: &str, table: &str) -> String {
    template
        .replace("{schema}", schema)
        .replace("{table}", table)
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
        assert!(ProcessedEvents::new("app", "processed").is_ok());
        for (schema, table, option) in [
            ("x; drop", "t", "processed_events.schema"),
            ("s", "", "processed_events.table"),
            ("s", "1abc", "processed_events.table"),
            ("s", &"t".repeat(52), "processed_events.table"),
        ] {
            match ProcessedEvents::new(schema, table) {
                Err(Error::Config { option: named, .. }) => assert_eq!(named, option),
                other => panic!("expected a config error, got {other:?}"),
            }
        }
        let ddl = ProcessedEvents::new("app", "seen").unwrap().ddl();
        assert!(ddl.contains(r#"CREATE TABLE IF NOT EXISTS "app"."seen""#));
        assert!(ddl.contains(r#""seen_applied_idx""#));
        assert!(ddl.contains(r#"INSERT INTO "app"."seen_version""#));
        assert!(!ddl.contains('{'));
    }
}
