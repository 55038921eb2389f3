//! [`SqliteOptions`]: where the database lives, the table prefix, the busy timeout, the readers
//! and how durable a commit is ([`Synchronous`]).

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use watukuy_core::{Error, Result};

/// The default table prefix.
pub const DEFAULT_TABLE_PREFIX: &str = "watukuy_";

/// The default busy timeout: how long a write waits for another connection's lock.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The default number of read connections of a file database.
pub const DEFAULT_MAX_READERS: usize = 4;

/// Where a [`SqliteStore`](crate::SqliteStore) keeps its data.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Location {
    /// A database file (created on first use, in WAL mode).
    File(PathBuf),
    /// A private in-memory database, seen only by the store that opened it and dropped with it.
    Memory,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::File(path) => write!(f, "SQLite database {}", path.display()),
            Location::Memory => f.write_str("private in-memory SQLite database"),
        }
    }
}

/// How durable a commit is before the call that made it returns: SQLite's `PRAGMA synchronous`,
/// set on every connection the store opens (see [`SqliteOptions::synchronous`]).
///
/// A file database always runs in WAL mode (the store refuses a file that cannot), and in WAL
/// mode both levels keep the database consistent: it never corrupts, a transaction is never
/// applied in part, and a **process** crash (a panic, `SIGKILL`, an OOM kill) loses nothing that
/// was committed. They differ only when the **machine** stops: a power loss or an OS crash.
///
/// | level | after a power loss or an OS crash |
/// |---|---|
/// | [`Full`](Synchronous::Full) (the default) | every call that returned `Ok` is on disk |
/// | [`Normal`](Synchronous::Normal) | the database is as it was after some earlier commit: the last transactions (those the OS had not yet written back, typically the last seconds) are rolled back, whole and newest first |
///
/// Text (a configuration file, a command line) parses with [`str::parse`]: `full` or `normal`,
/// in any case; anything else is a `Config` error naming `sqlite.synchronous`.
///
/// An in-memory database has no file to sync: the level is set but changes nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Synchronous {
    /// `PRAGMA synchronous = FULL`: every commit syncs the WAL to disk (an `fsync`) before the
    /// call returns, so everything the store reported as written survives a power loss or an OS
    /// crash. What the engine's guarantees (at least once, atomic commit, fencing) assume
    /// without qualification. Costs one `fsync` per write transaction, every `ack_events`
    /// included.
    #[default]
    Full,
    /// `PRAGMA synchronous = NORMAL`: commits are not synced one by one; the WAL is synced when
    /// it is checkpointed into the database file. A process crash loses nothing; a power loss or
    /// an OS crash may roll back the last transactions. No `fsync` on the path of an ordinary
    /// write, which makes small transactions (a single key's acks) several times faster.
    ///
    /// What a rollback after a power loss or an OS crash means for watukuy:
    ///
    /// - **A rolled-back ack**: the event is pending again and is delivered again, with the same
    ///   id, sequence and payload. At least once allows exactly that; handlers that deduplicate
    ///   by `event.id` (as every handler should) see a duplicate and nothing else.
    /// - **A rolled-back `commit_poll`**: the cursor, the snapshot changes and the page's events
    ///   roll back together (one transaction), so the page is fetched again and diffed again.
    ///   If the API still has the same data, the same events (same ids) are committed again and
    ///   delivered again: a duplicate. Events of the lost commit may already have been delivered,
    ///   since delivery starts as soon as the commit returns; if the API changed before the page
    ///   is fetched again, the consumer has seen events the store no longer records, and their
    ///   sequence numbers are given to the new events. For example, a `created` delivered from
    ///   the lost commit is never followed by a `deleted` if the item disappears from the API
    ///   before the refetch (the restored snapshot never knew it). Do not deduplicate by
    ///   sequence.
    /// - **Leases and fencing hold**: a file in WAL mode is shared by processes of one machine
    ///   only, so a power loss or an OS crash stopped every process that saw the rolled-back
    ///   leases. A lease epoch handed out again after the restart was never used by a running
    ///   instance.
    /// - **Operator and bookkeeping writes may be undone**: a retried or discarded parked row
    ///   is parked again, a recorded attempt is forgotten (retries start over), a stored HTTP
    ///   validator is lost (the next request is unconditional), a schedule save is older, and
    ///   replay-log entries of lost commits are gone with them.
    ///
    /// Use it when throughput matters more than those cases: the data are re-fetchable, and the
    /// consumers are idempotent by event id and do not mind an occasional event the store forgets
    /// after a power loss.
    Normal,
}

impl Synchronous {
    /// The level's name as `PRAGMA synchronous` spells it and [`str::parse`] reads it: `full` or
    /// `normal`.
    pub fn as_str(self) -> &'static str {
        match self {
            Synchronous::Full => "full",
            Synchronous::Normal => "normal",
        }
    }

    /// The level for the number `PRAGMA synchronous` reports (1 = NORMAL, 2 = FULL); `None` for
    /// a level this store never sets (0 = OFF, 3 = EXTRA).
    pub(crate) fn from_pragma(level: i64) -> Option<Self> {
        match level {
            1 => Some(Synchronous::Normal),
            2 => Some(Synchronous::Full),
            _ => None,
        }
    }
}

impl fmt::Display for Synchronous {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Synchronous {
    type Err = Error;

    /// `full` or `normal`, in any case, surrounding spaces ignored; anything else (`off`
    /// included: this store never risks corrupting a database) is a `Config` error naming
    /// `sqlite.synchronous`.
    fn from_str(text: &str) -> Result<Self> {
        match text.trim().to_ascii_lowercase().as_str() {
            "full" => Ok(Synchronous::Full),
            "normal" => Ok(Synchronous::Normal),
            _ => Err(Error::config(
                "sqlite.synchronous",
                format!("must be \"full\" or \"normal\", got {text:?}"),
            )),
        }
    }
}

/// Options of a [`SqliteStore`](crate::SqliteStore): built with [`Default`] and builder methods,
/// checked by [`SqliteStore::open`](crate::SqliteStore::open) (an invalid option is a
/// [`Config`](watukuy_core::Error::Config) error naming it, e.g. `sqlite.table_prefix`).
///
/// ```
/// use std::time::Duration;
/// use watukuy_store_sqlite::SqliteOptions;
///
/// let options = SqliteOptions::file("/var/lib/myapp/watukuy.db")
///     .table_prefix("orders_")
///     .busy_timeout(Duration::from_secs(10));
/// assert!(options.validate().is_ok());
/// assert!(SqliteOptions::in_memory().table_prefix("not valid").validate().is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SqliteOptions {
    location: Location,
    table_prefix: String,
    busy_timeout: Duration,
    max_readers: usize,
    synchronous: Synchronous,
}

impl Default for SqliteOptions {
    /// A private in-memory database, prefix `watukuy_`, a 5 s busy timeout, 4 readers,
    /// [`Synchronous::Full`].
    fn default() -> Self {
        Self {
            location: Location::Memory,
            table_prefix: DEFAULT_TABLE_PREFIX.to_owned(),
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
            max_readers: DEFAULT_MAX_READERS,
            synchronous: Synchronous::Full,
        }
    }
}

impl SqliteOptions {
    /// The default options: a private in-memory database.
    pub fn in_memory() -> Self {
        Self::default()
    }

    /// The default options on the database file at `path`.
    pub fn file(path: impl Into<PathBuf>) -> Self {
        Self::default().path(path)
    }

    /// Uses the database file at `path` (created on first use). The SQLite name `:memory:`
    /// means a private in-memory database, as [`SqliteOptions::memory`].
    #[must_use]
    pub fn path(mut self, path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        self.location = if path.as_os_str() == ":memory:" {
            Location::Memory
        } else {
            Location::File(path)
        };
        self
    }

    /// Uses a private in-memory database.
    #[must_use]
    pub fn memory(mut self) -> Self {
        self.location = Location::Memory;
        self
    }

    /// Prefixes every table (and index) name: an identifier matching `[A-Za-z_][A-Za-z0-9_]*`,
    /// or empty. Several prefixes may share one file; each has its own schema version.
    #[must_use]
    pub fn table_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.table_prefix = prefix.into();
        self
    }

    /// How long a statement waits for a lock held by another connection or process before it
    /// fails with a transient `Busy` store error. At most `i32::MAX` milliseconds.
    #[must_use]
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// How many read connections a file database opens at most (at least 1). Writes always go
    /// through one writer connection; a private in-memory database uses that one connection for
    /// everything.
    #[must_use]
    pub fn max_readers(mut self, readers: usize) -> Self {
        self.max_readers = readers;
        self
    }

    /// How durable a commit is when the call returns (default [`Synchronous::Full`]): whether
    /// the last writes survive a power loss or an OS crash. Both levels survive a process crash
    /// and never corrupt the database; read [`Synchronous::Normal`] before choosing it.
    #[must_use]
    pub fn synchronous(mut self, level: Synchronous) -> Self {
        self.synchronous = level;
        self
    }

    /// Where the data lives.
    pub fn location(&self) -> &Location {
        &self.location
    }

    /// The table prefix.
    pub fn prefix(&self) -> &str {
        &self.table_prefix
    }

    /// The durability level the store's connections are opened with.
    pub fn synchronous_level(&self) -> Synchronous {
        self.synchronous
    }

    /// Checks every option; the error names the first invalid one.
    pub fn validate(&self) -> Result<()> {
        validate_prefix(&self.table_prefix)?;
        if let Location::File(path) = &self.location {
            validate_path(path)?;
        }
        if busy_timeout_ms(self.busy_timeout).is_none() {
            return Err(Error::config(
                "sqlite.busy_timeout",
                format!(
                    "must be at most {} ms, got {:?}",
                    i32::MAX,
                    self.busy_timeout
                ),
            ));
        }
        if self.max_readers == 0 {
            return Err(Error::config("sqlite.max_readers", "must be at least 1"));
        }
        Ok(())
    }

    pub(crate) fn busy_timeout_value(&self) -> Duration {
        self.busy_timeout
    }

    pub(crate) fn max_readers_value(&self) -> usize {
        self.max_readers
    }
}

/// The busy timeout in whole milliseconds, if SQLite can take it.
fn busy_timeout_ms(timeout: Duration) -> Option<i32> {
    i32::try_from(timeout.as_millis()).ok()
}

/// Checks a table prefix: `[A-Za-z_][A-Za-z0-9_]*` or empty. The prefix is spliced into SQL, so
/// nothing else may pass.
pub(crate) fn validate_prefix(prefix: &str) -> Result<()> {
    let mut chars = prefix.chars();
    let valid = match chars.next() {
        None => true,
        Some(first) => {
            (first.is_ascii_alphabetic() || first == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        }
    };
    if valid {
        Ok(())
    } else {
        Err(Error::config(
            "sqlite.table_prefix",
            format!("must match [A-Za-z_][A-Za-z0-9_]* or be empty, got {prefix:?}"),
        ))
    }
}

fn validate_path(path: &Path) -> Result<()> {
    let text = path.as_os_str();
    if text.is_empty() {
        return Err(Error::config(
            "sqlite.path",
            "must not be empty (use SqliteOptions::in_memory() for an in-memory database)",
        ));
    }
    if text.as_encoded_bytes().contains(&0) {
        return Err(Error::config(
            "sqlite.path",
            format!("must not contain a NUL byte, got {path:?}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use watukuy_core::ErrorCode;

    #[test]
    fn defaults() {
        let options = SqliteOptions::default();
        assert_eq!(options.location(), &Location::Memory);
        assert_eq!(options.prefix(), "watukuy_");
        assert_eq!(options.busy_timeout_value(), Duration::from_secs(5));
        assert_eq!(options.synchronous_level(), Synchronous::Full);
        assert_eq!(
            SqliteOptions::file("x.db").synchronous_level(),
            Synchronous::Full
        );
        assert!(options.validate().is_ok());
    }

    #[test]
    fn synchronous_levels() {
        let options = SqliteOptions::file("x.db").synchronous(Synchronous::Normal);
        assert_eq!(options.synchronous_level(), Synchronous::Normal);
        assert!(options.validate().is_ok());
        for (text, level) in [
            ("full", Synchronous::Full),
            ("FULL", Synchronous::Full),
            (" normal ", Synchronous::Normal),
            ("Normal", Synchronous::Normal),
        ] {
            assert_eq!(text.parse::<Synchronous>().expect(text), level);
        }
        for level in [Synchronous::Full, Synchronous::Normal] {
            assert_eq!(level.to_string().parse::<Synchronous>().ok(), Some(level));
        }
        for bad in ["off", "extra", "0", "1", "2", "", "fullest"] {
            let error = bad.parse::<Synchronous>().expect_err(bad);
            assert_eq!(error.code(), ErrorCode::Config);
            assert_eq!(error.config_option(), Some("sqlite.synchronous"));
        }
        assert_eq!(Synchronous::from_pragma(1), Some(Synchronous::Normal));
        assert_eq!(Synchronous::from_pragma(2), Some(Synchronous::Full));
        assert_eq!(Synchronous::from_pragma(0), None);
        assert_eq!(Synchronous::from_pragma(3), None);
    }

    #[test]
    fn prefixes() {
        for good in ["", "_", "a", "watukuy_", "Tenant_42_", "_x9"] {
            assert!(
                validate_prefix(good).is_ok(),
                "{good:?} should be a valid prefix"
            );
        }
        for bad in [
            "1a",
            "a-b",
            "a b",
            "x;DROP TABLE t;--",
            "ü_",
            "a.b",
            "\"a\"",
        ] {
            let error = SqliteOptions::default()
                .table_prefix(bad)
                .validate()
                .expect_err(bad);
            assert_eq!(error.code(), ErrorCode::Config);
            assert_eq!(error.config_option(), Some("sqlite.table_prefix"));
        }
    }

    #[test]
    fn paths_and_limits() {
        assert_eq!(
            SqliteOptions::file(":memory:").location(),
            &Location::Memory
        );
        let error = SqliteOptions::file("").validate().expect_err("empty path");
        assert_eq!(error.config_option(), Some("sqlite.path"));
        let error = SqliteOptions::file("a\0b").validate().expect_err("NUL");
        assert_eq!(error.config_option(), Some("sqlite.path"));
        let error = SqliteOptions::default()
            .busy_timeout(Duration::from_secs(u64::MAX / 2))
            .validate()
            .expect_err("huge timeout");
        assert_eq!(error.config_option(), Some("sqlite.busy_timeout"));
        assert!(
            SqliteOptions::default()
                .busy_timeout(Duration::ZERO)
                .validate()
                .is_ok()
        );
        let error = SqliteOptions::default()
            .max_readers(0)
            .validate()
            .expect_err("no readers");
        assert_eq!(error.config_option(), Some("sqlite.max_readers"));
    }
}
