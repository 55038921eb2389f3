//! The one mapping of rusqlite errors into watukuy's [`Error`].

use rusqlite::ErrorCode as Code;
use watukuy_core::{Error, store::StoreErrorKind as Kind};

use crate::options::Location;

/// What a blocking database closure fails with: a driver error, mapped by [`classify`] at the
/// boundary (where the database's location is known), or an error that is already watukuy's
/// (a lost lease, a row that cannot be decoded).
#[derive(Debug)]
pub(crate) enum Failure {
    /// A rusqlite error, not yet classified.
    Sql(rusqlite::Error),
    /// A finished watukuy error.
    Store(Error),
}

impl From<rusqlite::Error> for Failure {
    fn from(error: rusqlite::Error) -> Self {
        Failure::Sql(error)
    }
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        Failure::Store(error)
    }
}

impl Failure {
    /// The watukuy error, classifying a driver error against the database at `location`.
    pub(crate) fn into_error(self, location: &Location) -> Error {
        match self {
            Failure::Sql(error) => classify(error, location),
            Failure::Store(error) => error,
        }
    }
}

/// The result of a blocking database closure.
pub(crate) type DbResult<T> = std::result::Result<T, Failure>;

/// Maps a rusqlite error on the database at `location` into a [`Error::Store`]: busy and locked
/// are transient (`Busy`); a file that is not a database or is corrupt is `Corrupt`; a file that
/// cannot be opened or fails with I/O is `Connection`; read-only, permission, constraint and
/// full-disk failures are `Rejected`; a missing table is `Schema`; a stored value of the wrong
/// type is `Corrupt`. Everything but busy/locked is permanent. The message names the database.
pub(crate) fn classify(error: rusqlite::Error, location: &Location) -> Error {
    let (kind, transient, message) = match &error {
        rusqlite::Error::SqliteFailure(failure, detail) => {
            let detail = detail.clone().unwrap_or_else(|| failure.to_string());
            let (kind, transient, what) = match failure.code {
                Code::DatabaseBusy | Code::DatabaseLocked => (
                    Kind::Busy,
                    true,
                    format!("{location} is locked by another connection or process"),
                ),
                Code::NotADatabase => (
                    Kind::Corrupt,
                    false,
                    format!("{location} is not a SQLite database"),
                ),
                Code::DatabaseCorrupt => (Kind::Corrupt, false, format!("{location} is corrupt")),
                Code::CannotOpen => (Kind::Connection, false, format!("cannot open {location}")),
                Code::ReadOnly => (Kind::Rejected, false, format!("{location} is read-only")),
                Code::PermissionDenied | Code::AuthorizationForStatementDenied => (
                    Kind::Rejected,
                    false,
                    format!("access to {location} was denied"),
                ),
                Code::SystemIoFailure
                | Code::FileLockingProtocolFailed
                | Code::NoLargeFileSupport => {
                    (Kind::Connection, false, format!("I/O error on {location}"))
                }
                Code::DiskFull => (
                    Kind::Rejected,
                    false,
                    format!("the disk holding {location} is full"),
                ),
                Code::ConstraintViolation | Code::TooBig | Code::TypeMismatch => (
                    Kind::Rejected,
                    false,
                    format!("{location} rejected a write"),
                ),
                Code::OperationInterrupted => (
                    Kind::Timeout,
                    false,
                    format!("a statement on {location} was interrupted"),
                ),
                _ if detail.contains("no such table") || detail.contains("no such column") => (
                    Kind::Schema,
                    false,
                    format!("the schema of {location} is missing or out of date"),
                ),
                _ => (Kind::Other, false, format!("SQLite failed on {location}")),
            };
            (kind, transient, format!("{what}: {detail}"))
        }
        rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::InvalidColumnType(..)
        | rusqlite::Error::IntegralValueOutOfRange(..)
        | rusqlite::Error::Utf8Error(..) => (
            Kind::Corrupt,
            false,
            format!("cannot decode a stored value of {location}: {error}"),
        ),
        other => (
            Kind::Other,
            false,
            format!("SQLite failed on {location}: {other}"),
        ),
    };
    Error::store_with(kind, transient, message, error)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(code: i32, message: &str) -> rusqlite::Error {
        rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), Some(message.to_owned()))
    }

    #[test]
    fn busy_and_locked_are_transient() {
        let at = Location::File("/tmp/a.db".into());
        for code in [rusqlite::ffi::SQLITE_BUSY, rusqlite::ffi::SQLITE_LOCKED] {
            let error = classify(failure(code, "database is locked"), &at);
            assert_eq!(error.store_kind(), Some((Kind::Busy, true)));
            assert!(error.is_transient());
            assert!(error.to_string().contains("/tmp/a.db"), "{error}");
        }
    }

    #[test]
    fn broken_files_are_permanent_and_named() {
        let at = Location::File("/data/x.db".into());
        let cases = [
            (rusqlite::ffi::SQLITE_NOTADB, Kind::Corrupt),
            (rusqlite::ffi::SQLITE_CORRUPT, Kind::Corrupt),
            (rusqlite::ffi::SQLITE_CANTOPEN, Kind::Connection),
            (rusqlite::ffi::SQLITE_IOERR, Kind::Connection),
            (rusqlite::ffi::SQLITE_READONLY, Kind::Rejected),
            (rusqlite::ffi::SQLITE_FULL, Kind::Rejected),
        ];
        for (code, kind) in cases {
            let error = classify(failure(code, "boom"), &at);
            assert_eq!(error.store_kind(), Some((kind, false)), "code {code}");
            assert!(error.to_string().contains("/data/x.db"), "{error}");
        }
        let error = classify(
            failure(rusqlite::ffi::SQLITE_ERROR, "no such table: x_items"),
            &at,
        );
        assert_eq!(error.store_kind(), Some((Kind::Schema, false)));
        let error = classify(
            rusqlite::Error::InvalidColumnType(0, "n".into(), rusqlite::types::Type::Text),
            &Location::Memory,
        );
        assert_eq!(error.store_kind(), Some((Kind::Corrupt, false)));
    }
}
