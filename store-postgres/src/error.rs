//! The one mapping from driver errors to watukuy's [`Error`] (ARCHITECTURE.md, invariant 5).

use watukuy_core::{Error, StoreErrorKind};

/// Maps a sqlx error to [`Error::Store`] (or [`Error::Config`] for an unusable connection
/// string), deciding by SQLSTATE whether retrying may help:
///
/// | SQLSTATE / driver error | kind | transient |
/// |---|---|---|
/// | `40001` serialization failure, `40P01` deadlock, `55P03` lock not available, `53xxx` insufficient resources | `Busy` | yes |
/// | `57014` statement timeout or cancel | `Timeout` | yes |
/// | `08xxx` connection exceptions, `57P01`..`57P03` server shutting down or starting, I/O and TLS errors, pool timeout, crashed worker | `Connection` | yes |
/// | `3D000` database does not exist (yet) | `Connection` | yes |
/// | `28xxx` authentication failed, a closed pool | `Connection` | no |
/// | `23505` unique violation (a conflict) and other `23xxx` constraint violations, `22xxx` data exceptions, `42501` permission denied | `Rejected` | no |
/// | `42P01` undefined table, `3F000` undefined schema | `Schema` (run `migrate()`) | no |
/// | undecodable columns | `Corrupt` | no |
/// | anything else | `Other` | no |
pub(crate) fn classify(error: sqlx::Error) -> Error {
    use StoreErrorKind::{Busy, Connection, Corrupt, Other, Rejected, Schema, Timeout};
    let (kind, transient, message) = match &error {
        sqlx::Error::Database(db) => {
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            let (kind, transient, hint) = match code.as_str() {
                "40001" | "40P01" | "55P03" => (Busy, true, ""),
                c if c.starts_with("53") => (Busy, true, ""),
                "57014" => (Timeout, true, ""),
                "57P01" | "57P02" | "57P03" => (Connection, true, ""),
                c if c.starts_with("08") => (Connection, true, ""),
                "3D000" => (Connection, true, ""),
                c if c.starts_with("28") => (Connection, false, ""),
                "42P01" | "3F000" => (
                    Schema,
                    false,
                    " (the store's tables are missing: run PostgresStore::migrate() first)",
                ),
                c if c.starts_with("23") || c.starts_with("22") || c == "42501" => {
                    (Rejected, false, "")
                }
                _ => (Other, false, ""),
            };
            (
                kind,
                transient,
                format!("PostgreSQL error {code}: {}{hint}", db.message()),
            )
        }
        sqlx::Error::Io(e) => (
            Connection,
            true,
            format!("cannot reach PostgreSQL (I/O error: {e})"),
        ),
        sqlx::Error::Tls(e) => (
            Connection,
            true,
            format!("TLS error talking to PostgreSQL: {e}"),
        ),
        sqlx::Error::PoolTimedOut => (
            Connection,
            true,
            "timed out waiting for a PostgreSQL connection from the pool".to_owned(),
        ),
        sqlx::Error::WorkerCrashed => (
            Connection,
            true,
            "the PostgreSQL connection's worker crashed".to_owned(),
        ),
        sqlx::Error::Protocol(m) => (
            Connection,
            true,
            format!("the PostgreSQL connection broke (protocol error: {m})"),
        ),
        sqlx::Error::PoolClosed => (
            Connection,
            false,
            "the PostgreSQL pool is closed (close() was called with close_pool)".to_owned(),
        ),
        sqlx::Error::Configuration(e) => {
            return Error::config("postgres.url", format!("unusable connection string: {e}"));
        }
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. }
        | sqlx::Error::TypeNotFound { .. } => {
            (Corrupt, false, format!("cannot read a stored row: {error}"))
        }
        other => (Other, false, other.to_string()),
    };
    Error::store_with(kind, transient, message, error)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind_of(err: &Error) -> (StoreErrorKind, bool) {
        match err {
            Error::Store {
                kind, transient, ..
            } => (*kind, *transient),
            other => panic!("expected a Store error, got {other}"),
        }
    }

    #[test]
    fn connection_level_failures_are_transient() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(
            kind_of(&classify(sqlx::Error::Io(refused))),
            (StoreErrorKind::Connection, true)
        );
        assert_eq!(
            kind_of(&classify(sqlx::Error::PoolTimedOut)),
            (StoreErrorKind::Connection, true)
        );
        assert_eq!(
            kind_of(&classify(sqlx::Error::PoolClosed)),
            (StoreErrorKind::Connection, false)
        );
    }

    #[test]
    fn bad_configuration_is_a_config_error() {
        let err = classify(sqlx::Error::Configuration("bad port".into()));
        assert!(matches!(err, Error::Config { ref option, .. } if option == "postgres.url"));
    }
}
