//! [`PostgresOptions`]: where the store's tables live and how it treats its pool.

use std::path::PathBuf;
use std::time::Duration;

use watukuy_core::{Error, Result};

/// Every name the migrations create from the table prefix: tables, and indexes named
/// explicitly (primary keys are named by PostgreSQL, which shortens its own names to fit).
/// `outbox_pending_idx` is created by migration 1 and dropped by migration 2, so it still
/// counts. A unit test checks this list against the DDL.
pub(crate) const DERIVED_NAMES: &[&str] = &[
    "pollers",
    "items",
    "outbox",
    "outbox_pending_idx",
    "outbox_queue_idx",
    "parked",
    "parked_order_idx",
    "parked_hold_idx",
    "validators",
    "log",
    "log_time_idx",
    "schema_version",
];

/// The longest of [`DERIVED_NAMES`] (18 bytes, `outbox_pending_idx`).
const LONGEST_SUFFIX: usize = longest(DERIVED_NAMES);

const fn longest(names: &[&str]) -> usize {
    let mut longest = 0;
    let mut i = 0;
    while i < names.len() {
        if names[i].len() > longest {
            longest = names[i].len();
        }
        i += 1;
    }
    longest
}

/// PostgreSQL truncates identifiers longer than this many bytes.
const MAX_IDENTIFIER: usize = 63;

/// Options of a [`PostgresStore`](crate::PostgresStore).
///
/// Identifiers are validated when the store is built (`^[A-Za-z_][A-Za-z0-9_]{0,62}$`, the
/// prefix may be empty) and are then always double-quoted, so they are case-sensitive and never
/// reach SQL unchecked. Anything else is an [`Error::Config`] naming the option.
///
/// ```
/// use watukuy_store_postgres::PostgresOptions;
///
/// let options = PostgresOptions::default()
///     .schema("watukuy")
///     .table_prefix("app_")
///     .close_pool(true);
/// assert!(options.validate().is_ok());
///
/// // Identifiers are checked, never interpolated raw.
/// let err = PostgresOptions::default().schema("x; drop table y").validate().unwrap_err();
/// assert_eq!(err.code(), watukuy_core::ErrorCode::Config);
/// assert!(err.to_string().contains("postgres.schema"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PostgresOptions {
    pub(crate) schema: String,
    pub(crate) table_prefix: String,
    pub(crate) close_pool: bool,
    pub(crate) max_connections: u32,
    pub(crate) acquire_timeout: Duration,
    pub(crate) max_rows_per_statement: usize,
    pub(crate) ssl_root_cert: Option<RootCert>,
    pub(crate) transaction_pooling: bool,
}

/// A root certificate given with [`PostgresOptions::ssl_root_cert`] or
/// [`PostgresOptions::ssl_root_cert_pem`].
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum RootCert {
    /// A PEM file, read once by `connect`.
    File(PathBuf),
    /// PEM text.
    Pem(Vec<u8>),
}

impl std::fmt::Debug for RootCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RootCert::File(path) => write!(f, "File({})", path.display()),
            RootCert::Pem(pem) => write!(f, "Pem({} bytes)", pem.len()),
        }
    }
}

impl Default for PostgresOptions {
    fn default() -> Self {
        Self {
            schema: "public".to_owned(),
            table_prefix: "watukuy_".to_owned(),
            close_pool: false,
            max_connections: 10,
            acquire_timeout: Duration::from_secs(30),
            max_rows_per_statement: 5_000,
            ssl_root_cert: None,
            transaction_pooling: false,
        }
    }
}

impl PostgresOptions {
    /// The schema holding the tables (default `public`); `migrate()` creates it when missing.
    #[must_use]
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// The prefix of every table and index name (default `watukuy_`; may be empty). Several
    /// stores with different prefixes share a schema without seeing each other.
    #[must_use]
    pub fn table_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.table_prefix = prefix.into();
        self
    }

    /// Whether [`Store::close`](watukuy_core::store::Store::close) closes the pool (default `false`:
    /// a pool handed over with [`from_pool`](crate::PostgresStore::from_pool) usually serves
    /// other code too). A closed pool is not reopened; later calls fail with a permanent
    /// `Connection` store error.
    #[must_use]
    pub fn close_pool(mut self, close: bool) -> Self {
        self.close_pool = close;
        self
    }

    /// The pool size used by [`connect`](crate::PostgresStore::connect) (default 10, at least 1).
    /// A pool given to [`from_pool`](crate::PostgresStore::from_pool) keeps its own settings.
    #[must_use]
    pub fn max_connections(mut self, max: u32) -> Self {
        self.max_connections = max;
        self
    }

    /// How long [`connect`](crate::PostgresStore::connect)'s pool waits for a connection
    /// before failing with a transient `Connection` error (default 30 s, more than zero).
    #[must_use]
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// The most rows one statement carries per table (default 5,000, at least 1). A
    /// `commit_poll` or `ack_events` with more rows runs as several statements inside one
    /// transaction that holds the key's row lock from its first statement on; smaller ones are
    /// a single statement.
    #[must_use]
    pub fn max_rows_per_statement(mut self, rows: usize) -> Self {
        self.max_rows_per_statement = rows;
        self
    }

    /// A PEM file of the certificate authority (or authorities) that signed the server's
    /// certificate, for [`connect`](crate::PostgresStore::connect); the same as `sslrootcert=<file>`
    /// in the URL, which it replaces. It is trusted in addition to the system's roots.
    ///
    /// Needs the `tls` feature (on by default) and a URL with `sslmode=verify-full` (the
    /// certificate must also name the host) or `sslmode=verify-ca`; with `sslmode=require` the
    /// chain is verified as with `verify-ca` (as libpq does when it has a root certificate). With
    /// `disable`, `allow` or `prefer` (the default) it is a `Config` error: those modes verify
    /// nothing. `connect` reads the file once and fails with a `Config` error naming it when it
    /// cannot be read or holds no certificate; a rotated CA takes a new store.
    #[must_use]
    pub fn ssl_root_cert(mut self, path: impl Into<PathBuf>) -> Self {
        self.ssl_root_cert = Some(RootCert::File(path.into()));
        self
    }

    /// Like [`ssl_root_cert`](Self::ssl_root_cert), from PEM text (`-----BEGIN CERTIFICATE-----`
    /// ...), e.g. a secret handed over in an environment variable.
    #[must_use]
    pub fn ssl_root_cert_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ssl_root_cert = Some(RootCert::Pem(pem.into()));
        self
    }

    /// Whether the store talks to PostgreSQL through a pooler in *transaction* mode, such as
    /// PgBouncer with `pool_mode = transaction` (default `false`).
    ///
    /// Such a pooler hands each transaction to whichever server connection is free, so nothing
    /// may outlive a transaction: with this option every statement is prepared unnamed and runs
    /// inside an explicit transaction (`BEGIN`, the statement, `COMMIT`: two more round trips
    /// per statement), and [`connect`](crate::PostgresStore::connect) turns off the driver's
    /// statement cache and its `extra_float_digits` startup parameter, which PgBouncer rejects.
    /// `migrate()` needs nothing more: its advisory locks are transaction-level. A pool given to
    /// [`from_pool`](crate::PostgresStore::from_pool) keeps its own settings: build it with
    /// `PgConnectOptions::statement_cache_capacity(0)` and `extra_float_digits(None)`.
    ///
    /// Not needed for a pooler in session mode (PgBouncer then only needs
    /// `ignore_startup_parameters = extra_float_digits`), nor for one that tracks prepared
    /// statements itself (PgBouncer 1.21 and later with `max_prepared_statements` above zero).
    #[must_use]
    pub fn transaction_pooling(mut self, pooling: bool) -> Self {
        self.transaction_pooling = pooling;
        self
    }

    /// Checks every option, failing with an [`Error::Config`] that names the first bad one
    /// (`postgres.schema`, `postgres.table_prefix`, ...).
    pub fn validate(&self) -> Result<()> {
        check_identifier("postgres.schema", &self.schema, false, MAX_IDENTIFIER)?;
        check_identifier(
            "postgres.table_prefix",
            &self.table_prefix,
            true,
            MAX_IDENTIFIER - LONGEST_SUFFIX,
        )?;
        if self.max_connections == 0 {
            return Err(Error::config(
                "postgres.max_connections",
                "must be at least 1",
            ));
        }
        if self.acquire_timeout.is_zero() {
            return Err(Error::config(
                "postgres.acquire_timeout",
                "must be more than zero",
            ));
        }
        if self.max_rows_per_statement == 0 {
            return Err(Error::config(
                "postgres.max_rows_per_statement",
                "must be at least 1",
            ));
        }
        if self.ssl_root_cert.is_some() && !cfg!(feature = "tls") {
            return Err(Error::config(
                "postgres.ssl_root_cert",
                "TLS is not compiled in: enable the `tls` feature of watukuy-store-postgres",
            ));
        }
        Ok(())
    }
}

/// Accepts `^[A-Za-z_][A-Za-z0-9_]*$` up to `max` bytes (empty only when `may_be_empty`).
fn check_identifier(option: &str, value: &str, may_be_empty: bool, max: usize) -> Result<()> {
    if value.is_empty() {
        return if may_be_empty {
            Ok(())
        } else {
            Err(Error::config(option, "must not be empty"))
        };
    }
    let mut chars = value.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !first_ok || !rest_ok {
        return Err(Error::config(
            option,
            format!(
                "{value:?} is not a plain identifier: use ASCII letters, digits and `_`, not starting with a digit"
            ),
        ));
    }
    if value.len() > max {
        return Err(Error::config(
            option,
            format!("{value:?} is longer than {max} characters"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        let options = PostgresOptions::default();
        assert!(options.validate().is_ok());
        assert_eq!(options.schema, "public");
        assert_eq!(options.table_prefix, "watukuy_");
        assert!(!options.close_pool);
    }

    #[test]
    fn accepts_plain_identifiers_and_an_empty_prefix() {
        for schema in ["a", "_", "Watukuy_2", &"s".repeat(63)] {
            assert!(
                PostgresOptions::default().schema(schema).validate().is_ok(),
                "{schema}"
            );
        }
        for prefix in ["", "x", "app_", &"p".repeat(45)] {
            let options = PostgresOptions::default().table_prefix(prefix);
            assert!(options.validate().is_ok(), "{prefix}");
        }
    }

    #[test]
    fn rejects_anything_else_naming_the_option() {
        for schema in [
            "",
            "x; drop table y",
            "1abc",
            "a-b",
            "a\"b",
            "sch ema",
            "é",
            &"s".repeat(64),
        ] {
            let err = PostgresOptions::default().schema(schema).validate();
            assert_eq!(
                err.unwrap_err().config_option(),
                Some("postgres.schema"),
                "{schema:?}"
            );
        }
        for prefix in ["x;", "9_", "a.b", &"p".repeat(46)] {
            let err = PostgresOptions::default().table_prefix(prefix).validate();
            assert_eq!(
                err.unwrap_err().config_option(),
                Some("postgres.table_prefix"),
                "{prefix:?}"
            );
        }
        let err = PostgresOptions::default().max_connections(0).validate();
        assert_eq!(
            err.unwrap_err().config_option(),
            Some("postgres.max_connections")
        );
        let err = PostgresOptions::default()
            .acquire_timeout(Duration::ZERO)
            .validate();
        assert_eq!(
            err.unwrap_err().config_option(),
            Some("postgres.acquire_timeout")
        );
        let err = PostgresOptions::default()
            .max_rows_per_statement(0)
            .validate();
        assert_eq!(
            err.unwrap_err().config_option(),
            Some("postgres.max_rows_per_statement")
        );
    }
}
