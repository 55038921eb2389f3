//! The MySQL / MariaDB [`Store`](watukuy_core::store::Store) for watukuy: fenced leases, one
//! transaction per page, many instances on one database.
//!
//! Written against the public contract only (`docs/custom-store.md` and the `Store` rustdoc)
//! and proven by the whole conformance suite on MariaDB 10.11. It keeps to the SQL that MySQL
//! 5.7/8.x and MariaDB 10.3+ share: no `RETURNING`, no row aliases, no writable CTEs, no JSON
//! column type.
//!
//! ```no_run
//! use watukuy_store_mysql::{MySqlOptions, MySqlStore};
//!
//! # async fn run() -> watukuy_core::Result<()> {
//! let store = MySqlStore::connect(
//!     "mysql://app:secret@127.0.0.1:3306/app",
//!     MySqlOptions::default().table_prefix("watukuy_"),
//! )
//! .await?;
//! store.migrate().await?; // safe when many instances start together
//! // Engine::builder().store(std::sync::Arc::new(store)) …
//! # Ok(())
//! # }
//! ```
//!
//! # How it keeps the contract
//!
//! - **Fencing.** Every fenced write is one transaction that first locks the key's row
//!   (`SELECT … FOR UPDATE`) and compares owner and epoch, then writes; a mismatch rolls back
//!   and fails with `LeaseLost`. MySQL has no `RETURNING` and no writable CTE, so the check and
//!   the write cannot be one statement: a page is `START TRANSACTION`, the lock, one multi-row
//!   statement per table and chunk, `COMMIT`.
//! - **Isolation.** Every transaction runs at `READ COMMITTED` (set per transaction, so a pool
//!   you hand over needs no session settings): no gap locks, so two keys never block each other.
//!   On a server logging the binary log in `STATEMENT` format this fails (error 1665); use
//!   `ROW` or `MIXED` (MySQL 8's and MariaDB's defaults).
//! - **Bytes.** Ids, identities and keys are `VARBINARY` (compared and ordered byte-wise, so
//!   `stream_identities` comes in byte order); JSON is `LONGBLOB`, stored and returned byte for
//!   byte. Indexed strings have limits (255 bytes for names and ids, 1024 for identities); a
//!   longer one is a permanent `Rejected` error naming it, checked before anything is sent.
//! - **Migrations** are versioned and run under `GET_LOCK` (a named lock of the database and
//!   the prefix), so concurrent `migrate` calls apply each step once.
//! - **Errors** are classified by the server's error number: deadlocks (1213), lock wait
//!   timeouts (1205), killed or lost connections are transient; duplicate keys, syntax, access
//!   and a missing schema are permanent.
//! - **No clock.** Every time is an argument; the store never reads one.
//!
//! # Idempotent consumers
//!
//! [`ProcessedEvents`] is a processed-events table beside a read model in MySQL / MariaDB:
//! [`ProcessedEvents::apply_once`] records an event id and runs the projection in one
//! transaction, so a redelivered event changes nothing, and
//! [`apply_once_fenced`](ProcessedEvents::apply_once_fenced) commits only while the delivery's
//! lease is held (when the table shares the store's database). It implements
//! [`ConsumerStore`](watukuy_core::delivery::ConsumerStore).

mod codec;
mod consumer;
mod error;
mod schema;
mod sql;
mod store;

use std::str::FromStr;

use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use watukuy_core::{Error, Result};

pub use schema::SCHEMA_VERSION;

pub use crate::consumer::{
    DEFAULT_PROCESSED_EVENTS_TABLE, PROCESSED_EVENTS_VERSION, ProcessedEvents, apply_once,
};

/// The sqlx pool type [`MySqlStore::from_pool`] and [`ProcessedEvents`] take, re-exported so
/// callers can name it without matching this crate's sqlx version by hand.
pub use sqlx::MySqlPool;

use crate::error::OrStore;
use crate::sql::Tables;

/// How a [`MySqlStore`] is set up: `MySqlOptions::default()`, then the setters.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MySqlOptions {
    /// Prefix of every table name (letters, digits and `_`, at most 48 bytes); several stores
    /// can share one database with different prefixes. Default `watukuy_`.
    pub table_prefix: String,
    /// Connections of the pool [`MySqlStore::connect`] opens. Default 10.
    pub max_connections: u32,
    /// How long `migrate` waits for another process's migration to finish, in seconds.
    /// Default 60.
    pub migrate_lock_timeout_secs: u32,
}

impl Default for MySqlOptions {
    fn default() -> Self {
        Self {
            table_prefix: "watukuy_".to_owned(),
            max_connections: 10,
            migrate_lock_timeout_secs: 60,
        }
    }
}

impl MySqlOptions {
    /// Sets the table prefix.
    #[must_use]
    pub fn table_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.table_prefix = prefix.into();
        self
    }

    /// Sets the pool size of [`MySqlStore::connect`].
    #[must_use]
    pub fn max_connections(mut self, max: u32) -> Self {
        self.max_connections = max;
        self
    }

    /// Sets how long `migrate` waits for the migration lock, in seconds.
    #[must_use]
    pub fn migrate_lock_timeout_secs(mut self, secs: u32) -> Self {
        self.migrate_lock_timeout_secs = secs;
        self
    }

    fn validate(&self) -> Result<()> {
        let prefix = &self.table_prefix;
        if prefix.len() > sql::MAX_PREFIX {
            return Err(Error::config(
                "table_prefix",
                format!(
                    "{prefix:?} is {} bytes long; at most {} (MySQL names are at most 64 characters)",
                    prefix.len(),
                    sql::MAX_PREFIX
                ),
            ));
        }
        if let Some(bad) = prefix
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '_'))
        {
            return Err(Error::config(
                "table_prefix",
                format!("{prefix:?} contains {bad:?}; use ASCII letters, digits and `_`"),
            ));
        }
        if self.max_connections == 0 {
            return Err(Error::config(
                "max_connections",
                "must be at least 1, got 0",
            ));
        }
        Ok(())
    }
}

/// A watukuy store on MySQL 5.7+/8.x or MariaDB 10.3+. Cheap to clone (a pool handle).
#[derive(Clone, Debug)]
pub struct MySqlStore {
    pool: MySqlPool,
    tables: std::sync::Arc<Tables>,
    migrate_lock_timeout_secs: u32,
}

impl MySqlStore {
    /// Opens a pool on `url` (`mysql://user:password@host:port/database`, with the driver's
    /// parameters such as `ssl-mode=REQUIRED`, `ssl-ca=/path/ca.pem` or `socket=/run/mysqld.sock`)
    /// and checks that one connection works. Call [`migrate`](watukuy_core::store::Store::migrate)
    /// before use.
    ///
    /// A URL that does not parse or options that are out of range are `Config` errors; a server
    /// that cannot be reached is a transient `Store` error.
    pub async fn connect(url: &str, options: MySqlOptions) -> Result<Self> {
        options.validate()?;
        let connect = MySqlConnectOptions::from_str(url)
            .map_err(|e| Error::config("url", format!("not a MySQL URL: {e}")))?;
        let pool = MySqlPoolOptions::new()
            .max_connections(options.max_connections)
            .connect_with(connect)
            .await
            .store("connect to MySQL")?;
        Self::from_pool(pool, options)
    }

    /// A store on a pool you built (its size, timeouts and TLS are yours; `max_connections` of
    /// `options` is not used). The store needs nothing of the pool's sessions: isolation is set
    /// per transaction.
    pub fn from_pool(pool: MySqlPool, options: MySqlOptions) -> Result<Self> {
        options.validate()?;
        Ok(Self {
            pool,
            tables: std::sync::Arc::new(Tables::new(&options.table_prefix)),
            migrate_lock_timeout_secs: options.migrate_lock_timeout_secs,
        })
    }

    /// Creates or upgrades the tables (the `Store` method, callable without importing the
    /// trait): safe when many instances run it at once.
    pub async fn migrate(&self) -> Result<()> {
        watukuy_core::store::Store::migrate(self).await
    }

    /// Closes the pool (the `Store` method, callable without importing the trait); later calls
    /// fail with a permanent store error.
    pub async fn close(&self) -> Result<()> {
        watukuy_core::store::Store::close(self).await
    }

    /// The complete, idempotent DDL `migrate` applies for `options`' table prefix, for teams
    /// that manage schemas themselves: the version table, every version's tables in order and
    /// the version row, one script of `;`-terminated statements (for the `mysql` client or a
    /// migration tool), so that `migrate` then finds the schema current and changes nothing.
    /// Running it twice is harmless.
    ///
    /// Fails with a `Config` error when the prefix is not an identifier.
    ///
    /// ```
    /// use watukuy_store_mysql::{MySqlOptions, MySqlStore};
    ///
    /// let ddl = MySqlStore::ddl(&MySqlOptions::default().table_prefix("orders_"))?;
    /// assert!(ddl.contains("CREATE TABLE IF NOT EXISTS `orders_outbox`"));
    /// # Ok::<(), watukuy_core::Error>(())
    /// ```
    pub fn ddl(options: &MySqlOptions) -> Result<String> {
        options.validate()?;
        Ok(schema::ddl(&Tables::new(&options.table_prefix)))
    }

    /// The pool, for queries of your own next to the store's.
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// The store's table names, quoted, each `<prefix><name>` (for tests and operators).
    pub fn table_names(&self) -> Vec<String> {
        let t = &self.tables;
        [
            &t.keys,
            &t.items,
            &t.outbox,
            &t.parked,
            &t.validators,
            &t.log,
            &t.schema_version,
        ]
        .into_iter()
        .cloned()
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_name_what_is_wrong() {
        let err = MySqlOptions::default()
            .table_prefix("bad-prefix")
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("table_prefix"));
        let err = MySqlOptions::default()
            .table_prefix("x".repeat(49))
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("49 bytes"));
        let err = MySqlOptions::default()
            .max_connections(0)
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("max_connections"));
        assert!(MySqlOptions::default().validate().is_ok());
    }

    #[test]
    fn ddl_names_the_prefixed_tables() {
        let ddl = MySqlStore::ddl(&MySqlOptions::default().table_prefix("app_")).unwrap();
        let statements: Vec<&str> = ddl.split_terminator(";\n").collect();
        assert_eq!(statements.len(), 8, "version table, 6 tables, version row");
        assert!(
            statements[..7]
                .iter()
                .all(|s| s.starts_with("CREATE TABLE IF NOT EXISTS `app_"))
        );
        assert!(statements[7].starts_with("INSERT INTO `app_schema_version`"));
        assert!(MySqlStore::ddl(&MySqlOptions::default().table_prefix("a-b")).is_err());
    }
}
