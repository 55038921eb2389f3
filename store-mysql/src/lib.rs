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
mod options;
mod schema;
mod sql;
mod store;

pub use schema::SCHEMA_VERSION;

pub use crate::options::MySqlOptions;
pub use crate::store::MySqlStore;

pub use crate::consumer::{
    DEFAULT_PROCESSED_EVENTS_TABLE, PROCESSED_EVENTS_VERSION, ProcessedEvents, apply_once,
};

/// The sqlx pool type [`MySqlStore::from_pool`] and [`ProcessedEvents`] take, re-exported so
/// callers can name it without matching this crate's sqlx version by hand.
pub use sqlx::MySqlPool;

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
