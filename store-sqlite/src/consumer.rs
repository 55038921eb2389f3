//! The idempotent consumer for SQLite: a processed-events table in the consumer's database and
//! `apply_once`, which records an event id and runs the projection in one transaction on the
//! consumer's own connection.
//!
//! rusqlite is synchronous, so the projection is a plain closure over a
//! [`rusqlite::Transaction`]. [`ProcessedEvents::apply_once_in`] runs it on a connection you hold
//! (call it from blocking code); [`ProcessedEvents::apply_once`] takes your connection behind an
//! `Arc<Mutex<_>>` and runs everything on tokio's blocking pool, so async handlers never block
//! the runtime.
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

use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};
use watukuy_core::delivery::{ApplyError, ApplyOutcome, reapplies};
use watukuy_core::{Clock, Error, Event, Result, StoreErrorKind, SystemClock};

use crate::error::classify;
use crate::options::Location;

/// The newest version of the processed-events table this crate creates.
pub const PROCESSED_EVENTS_VERSION: i64 = 2;

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
];

const VERSION_TABLE: &str = include_str!("../sql/consumer/schema_version.sql");

/// The processed-events table of an idempotent consumer, in the consumer's own database (the
/// one its read model lives in; it need not be the store's).
///
/// Columns: `event_id` (primary key), `poller`, `partition`, `lane`, `type`, `applied_at`
/// (epoch ms from the configured [`Clock`]); beside it, `<table>_subjects` keeps the last event
/// applied per subject, so an id that comes back as a new change (a re-create after a delete)
/// is applied again (see [`claim`](Self::claim)). Create them with [`migrate`](Self::migrate)
/// (versioned, in one immediate transaction, so concurrent migrations serialize) or take the
/// text from [`ddl`](Self::ddl).
#[derive(Clone)]
pub struct ProcessedEvents {
    table: String,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for ProcessedEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessedEvents")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl Default for ProcessedEvents {
    /// `watukuy_processed_events`, stamped with the system clock.
    fn default() -> Self {
        Self {
            table: DEFAULT_PROCESSED_EVENTS_TABLE.to_owned(),
            clock: Arc::new(SystemClock),
        }
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
        Ok(Self {
            table,
            clock: Arc::new(SystemClock),
        })
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

    /// The complete, idempotent DDL (version table, every migration and its version row).
    pub fn ddl(&self) -> String {
        let mut out = self.render(VERSION_TABLE);
        for migration in MIGRATIONS {
            out.push('\n');
            out.push_str(&self.render(migration.sql));
            out.push_str(&format!(
                "\nINSERT OR IGNORE INTO {}_version (version) VALUES ({});\n",
                self.table, migration.version
            ));
        }
        out
    }

    /// Brings the table to [`PROCESSED_EVENTS_VERSION`] in one immediate transaction. Blocking;
    /// idempotent. Fails with a `Schema` store error when the table is newer than this crate
    /// knows.
    pub fn migrate(&self, conn: &mut Connection) -> Result<()> {
        let location = location_of(conn);
        let run = |conn: &mut Connection| -> std::result::Result<(), Failure> {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute_batch(&self.render(VERSION_TABLE))?;
            let current: i64 = tx.query_row(
                &format!(
                    "SELECT COALESCE(MAX(version), 0) FROM {}_version",
                    self.table
                ),
                [],
                |r| r.get(0),
            )?;
            if current > PROCESSED_EVENTS_VERSION {
                return Err(Failure::Newer(current));
            }
            for migration in MIGRATIONS.iter().filter(|m| m.version > current) {
                tx.execute_batch(&self.render(migration.sql))?;
                tx.execute(
                    &format!("INSERT INTO {}_version (version) VALUES (?1)", self.table),
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
                    "the processed-events table {:?} in {location} is at version {current}, newer \
                     than this watukuy-store-sqlite knows ({PROCESSED_EVENTS_VERSION}): upgrade the crate",
                    self.table
                ),
            ),
        })
    }

    /// Claims `event` inside a transaction you run: records it and returns `true` when it is
    /// a change not yet applied, or returns `false` when it was already applied. Commit your
    /// projection's writes in the same transaction, so the record exists exactly when they do.
    /// Start that transaction with `TransactionBehavior::Immediate`, so two connections
    /// claiming at once serialize on the write lock instead of failing to upgrade a read lock.
    ///
    /// An id with a marker is a duplicate while it is still its subject's last applied event:
    /// a redelivery. When another event of the same subject was applied since, the id came back
    /// as a new change — a re-create after a delete with the same content, an item changed back
    /// to an earlier content — and is claimed again (see
    /// [`reapplies`](watukuy_core::delivery::reapplies)). Markers written before
    /// the subjects table existed count as duplicates.
    pub fn claim(&self, tx: &Transaction<'_>, event: &Event) -> Result<bool> {
        let now = self.clock.now_ms();
        let run = || -> rusqlite::Result<bool> {
            let inserted =
                tx.prepare_cached(&format!(
                    "INSERT INTO {} (event_id, poller, \"partition\", lane, \"type\", applied_at) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (event_id) DO NOTHING",
                    self.table
                ))?
                .execute(params![
                    event.id.as_str(),
                    event.poller.as_str(),
                    event.partition.as_str(),
                    event.lane.as_str(),
                    event.event_type.as_str(),
                    now
                ])? == 1;
            if !inserted {
                let last: Option<(String, String)> = tx
                    .prepare_cached(&format!(
                        "SELECT event_id, \"type\" FROM {}_subjects \
                         WHERE poller = ?1 AND \"partition\" = ?2 AND subject = ?3",
                        self.table
                    ))?
                    .query_row(
                        params![
                            event.poller.as_str(),
                            event.partition.as_str(),
                            event.subject.as_str()
                        ],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .optional()?;
                let last = last.as_ref().map(|(id, kind)| (id.as_str(), kind.as_str()));
                if !reapplies(event, last) {
                    return Ok(false);
                }
                tx.prepare_cached(&format!(
                    "UPDATE {} SET lane = ?2, \"type\" = ?3, applied_at = ?4 WHERE event_id = ?1",
                    self.table
                ))?
                .execute(params![
                    event.id.as_str(),
                    event.lane.as_str(),
                    event.event_type.as_str(),
                    now
                ])?;
            }
            tx.prepare_cached(&format!(
                "INSERT INTO {}_subjects \
                 (poller, \"partition\", subject, event_id, \"type\", applied_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (poller, \"partition\", subject) \
                 DO UPDATE SET event_id = excluded.event_id, \"type\" = excluded.\"type\", \
                 applied_at = excluded.applied_at",
                self.table
            ))?
            .execute(params![
                event.poller.as_str(),
                event.partition.as_str(),
                event.subject.as_str(),
                event.id.as_str(),
                event.event_type.as_str(),
                now
            ])?;
            Ok(true)
        };
        run().map_err(|e| classify(e, &location_of(tx)))
    }

    /// Applies `event` at most once on `conn` (blocking): in ONE immediate transaction, inserts
    /// the marker and, when it was new, runs `projection`, then commits.
    ///
    /// - A repeated id is a no-op: [`ApplyOutcome::Deduplicated`] (the projection does not run).
    /// - The projection's error rolls everything back, marker included:
    ///   [`ApplyError::Projection`]; a later delivery applies it afresh.
    /// - A crash (or a panic in the projection) before the commit leaves nothing behind.
    /// - A failure to begin, to insert the marker or to commit is [`ApplyError::Store`].
    pub fn apply_once_in<T, E>(
        &self,
        conn: &mut Connection,
        event: &Event,
        projection: impl FnOnce(&Transaction<'_>) -> std::result::Result<T, E>,
    ) -> std::result::Result<ApplyOutcome<T>, ApplyError<E>> {
        let location = location_of(conn);
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| ApplyError::Store(classify(e, &location)))?;
        if !self.claim(&tx, event).map_err(ApplyError::Store)? {
            // Nothing was written; dropping the transaction rolls it back.
            return Ok(ApplyOutcome::Deduplicated);
        }
        match projection(&tx) {
            Ok(value) => {
                tx.commit()
                    .map_err(|e| ApplyError::Store(classify(e, &location)))?;
                Ok(ApplyOutcome::Applied(value))
            }
            // Dropping the transaction rolls back the projection and the marker.
            Err(error) => Err(ApplyError::Projection(error)),
        }
    }

    /// [`apply_once_in`](Self::apply_once_in) on tokio's blocking pool, on your connection
    /// behind a mutex (held for the whole transaction). Needs a tokio runtime.
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
        let this = self.clone();
        let conn = Arc::clone(conn);
        let event = event.clone();
        crate::db::blocking(move || {
            // A poisoned lock means a projection panicked mid-transaction; its transaction was
            // dropped (rolled back) while unwinding, so the connection is consistent.
            let mut conn = conn.lock().unwrap_or_else(PoisonError::into_inner);
            this.apply_once_in(&mut conn, &event, projection)
        })
        .await
        .map_err(ApplyError::Store)?
    }

    /// Whether `event_id` has a marker. Blocking.
    pub fn is_processed(&self, conn: &Connection, event_id: &str) -> Result<bool> {
        conn.query_row(
            &format!("SELECT 1 FROM {} WHERE event_id = ?1", self.table),
            [event_id],
            |_| Ok(()),
        )
        .optional()
        .map(|found| found.is_some())
        .map_err(|e| classify(e, &location_of(conn)))
    }

    /// Deletes markers applied before `older_than` (epoch ms); returns how many. Blocking.
    ///
    /// A pruned event is no longer recognised: only prune markers older than any redelivery you
    /// still expect (retries, parked events you may retry, and the poller's log retention if
    /// you replay into the same read model).
    pub fn prune(&self, conn: &Connection, older_than: i64) -> Result<u64> {
        let run = || -> rusqlite::Result<usize> {
            conn.execute(
                &format!("DELETE FROM {}_subjects WHERE applied_at < ?1", self.table),
                [older_than],
            )?;
            conn.execute(
                &format!("DELETE FROM {} WHERE applied_at < ?1", self.table),
                [older_than],
            )
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
        sql.replace("{table}", &self.table)
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

enum Failure {
    Sql(rusqlite::Error),
    Newer(i64),
}

impl From<rusqlite::Error> for Failure {
    fn from(error: rusqlite::Error) -> Self {
        Failure::Sql(error)
    }
}

/// Where `conn` points, for error messages.
fn location_of(conn: &Connection) -> Location {
    match conn.path() {
        Some(path) if !path.is_empty() => Location::File(path.into()),
        _ => Location::Memory,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_checked_and_the_ddl_is_idempotent() {
        assert!(matches!(
            ProcessedEvents::new("x; drop"),
            Err(Error::Config { .. })
        ));
        let processed = ProcessedEvents::new("seen").unwrap();
        let mut conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(&processed.ddl()).unwrap();
        conn.execute_batch(&processed.ddl()).unwrap();
        processed.migrate(&mut conn).unwrap();
        processed.migrate(&mut conn).unwrap();
        let version: i64 = conn
            .query_row("SELECT MAX(version) FROM seen_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, PROCESSED_EVENTS_VERSION);
        conn.execute("INSERT INTO seen_version VALUES (99)", [])
            .unwrap();
        let err = processed.migrate(&mut conn).unwrap_err();
        assert!(err.to_string().contains("newer"), "{err}");
    }
}
