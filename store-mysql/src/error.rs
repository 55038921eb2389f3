//! Every driver error becomes a watukuy [`Error::Store`] here, and only here, classified by the
//! server's error number (the SQLSTATE of MySQL is too coarse: `HY000` covers half of them).

use sqlx::mysql::MySqlDatabaseError;
use watukuy_core::{Error, store::StoreErrorKind};

/// Server error numbers the store acts on. The numbers are the same on MySQL and MariaDB unless
/// a comment says otherwise.
pub(crate) mod number {
    /// `ER_LOCK_DEADLOCK`: the transaction was chosen as a deadlock victim and rolled back.
    pub(crate) const DEADLOCK: u16 = 1213;
    /// `ER_LOCK_WAIT_TIMEOUT`: `innodb_lock_wait_timeout` passed while waiting for a row lock.
    pub(crate) const LOCK_WAIT_TIMEOUT: u16 = 1205;
    /// `ER_DUP_ENTRY`.
    pub(crate) const DUP_ENTRY: u16 = 1062;
    /// `ER_DUP_KEY`.
    pub(crate) const DUP_KEY: u16 = 1022;
    /// `ER_PARSE_ERROR`: SQL syntax.
    pub(crate) const PARSE_ERROR: u16 = 1064;
    /// `ER_NO_SUCH_TABLE`: the schema is missing (run `migrate`).
    pub(crate) const NO_SUCH_TABLE: u16 = 1146;
    /// `ER_BAD_FIELD_ERROR`: an unknown column (a schema of another version).
    pub(crate) const BAD_FIELD: u16 = 1054;
    /// `ER_BAD_DB_ERROR`: the database in the URL does not exist.
    pub(crate) const BAD_DB: u16 = 1049;
    /// `ER_ACCESS_DENIED_ERROR`.
    pub(crate) const ACCESS_DENIED: u16 = 1045;
    /// `ER_DBACCESS_DENIED_ERROR`.
    pub(crate) const DB_ACCESS_DENIED: u16 = 1044;
    /// `ER_TABLEACCESS_DENIED_ERROR`.
    pub(crate) const TABLE_ACCESS_DENIED: u16 = 1142;
    /// `ER_CON_COUNT_ERROR`: too many connections.
    pub(crate) const TOO_MANY_CONNECTIONS: u16 = 1040;
    /// `ER_SERVER_SHUTDOWN`.
    pub(crate) const SERVER_SHUTDOWN: u16 = 1053;
    /// `ER_QUERY_INTERRUPTED`: `KILL QUERY`, or the server shutting down.
    pub(crate) const QUERY_INTERRUPTED: u16 = 1317;
    /// `ER_CONNECTION_KILLED` (MariaDB): `KILL CONNECTION` of the connection running a statement.
    pub(crate) const CONNECTION_KILLED: u16 = 1927;
    /// `ER_SESSION_WAS_KILLED` (MySQL 8).
    pub(crate) const SESSION_WAS_KILLED: u16 = 3169;
    /// `ER_CLIENT_INTERACTION_TIMEOUT` (MySQL 8.0.24+): `wait_timeout` closed an idle connection.
    pub(crate) const CLIENT_INTERACTION_TIMEOUT: u16 = 4031;
    /// `ER_NET_READ_INTERRUPTED` / `ER_NET_WRITE_INTERRUPTED` / `ER_NET_READ_ERROR`.
    pub(crate) const NET_ERRORS: [u16; 4] = [1158, 1159, 1160, 1161];
    /// `ER_STATEMENT_TIMEOUT` (MariaDB `max_statement_time`).
    pub(crate) const STATEMENT_TIMEOUT_MARIADB: u16 = 1969;
    /// `ER_QUERY_TIMEOUT` (MySQL `max_execution_time`).
    pub(crate) const QUERY_TIMEOUT_MYSQL: u16 = 3024;
    /// `ER_OPTION_PREVENTS_STATEMENT`: `--read-only` (a primary demoted during a failover).
    pub(crate) const READ_ONLY: u16 = 1290;
    /// `ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION`.
    pub(crate) const READ_ONLY_TRANSACTION: u16 = 1792;
    /// `ER_NET_PACKET_TOO_LARGE`: a statement over `max_allowed_packet`.
    pub(crate) const PACKET_TOO_LARGE: u16 = 1153;
    /// `ER_DATA_TOO_LONG`, `ER_TRUNCATED_WRONG_VALUE_FOR_FIELD`, `ER_WARN_DATA_OUT_OF_RANGE`.
    pub(crate) const BAD_VALUES: [u16; 3] = [1406, 1366, 1264];
    /// `ER_LOCK_ABORTED` / `ER_LOCK_TABLE_FULL`.
    pub(crate) const LOCK_TROUBLE: [u16; 2] = [1689, 1206];
}

/// What a server error number means for the caller: its kind and whether retrying may help.
pub(crate) fn classify_number(number: u16) -> (StoreErrorKind, bool) {
    use number::*;
    match number {
        DEADLOCK | LOCK_WAIT_TIMEOUT => (StoreErrorKind::Busy, true),
        n if LOCK_TROUBLE.contains(&n) => (StoreErrorKind::Busy, true),
        // A read-only server is usually a primary being demoted: the next try may reach the new one.
        READ_ONLY | READ_ONLY_TRANSACTION => (StoreErrorKind::Busy, true),
        TOO_MANY_CONNECTIONS
        | SERVER_SHUTDOWN
        | QUERY_INTERRUPTED
        | CONNECTION_KILLED
        | SESSION_WAS_KILLED
        | CLIENT_INTERACTION_TIMEOUT => (StoreErrorKind::Connection, true),
        n if NET_ERRORS.contains(&n) => (StoreErrorKind::Connection, true),
        STATEMENT_TIMEOUT_MARIADB | QUERY_TIMEOUT_MYSQL => (StoreErrorKind::Timeout, true),
        NO_SUCH_TABLE | BAD_FIELD => (StoreErrorKind::Schema, false),
        DUP_ENTRY | DUP_KEY | PARSE_ERROR | PACKET_TOO_LARGE => (StoreErrorKind::Rejected, false),
        ACCESS_DENIED | DB_ACCESS_DENIED | TABLE_ACCESS_DENIED | BAD_DB => {
            (StoreErrorKind::Rejected, false)
        }
        n if BAD_VALUES.contains(&n) => (StoreErrorKind::Rejected, false),
        _ => (StoreErrorKind::Other, false),
    }
}

/// Maps a driver error into a watukuy store error; `doing` says what the store was doing
/// ("commit_poll on orders/eu: insert items").
pub(crate) fn map(doing: &str, error: sqlx::Error) -> Error {
    let (kind, transient, what) = match &error {
        sqlx::Error::Database(db) => match db.try_downcast_ref::<MySqlDatabaseError>() {
            Some(my) => {
                let (kind, transient) = classify_number(my.number());
                let hint = match my.number() {
                    number::NO_SUCH_TABLE | number::BAD_FIELD => {
                        " (the schema is missing or of another version: run migrate)"
                    }
                    number::PACKET_TOO_LARGE => " (raise the server's max_allowed_packet)",
                    _ => "",
                };
                (
                    kind,
                    transient,
                    format!("MySQL error {}: {}{hint}", my.number(), my.message()),
                )
            }
            None => (StoreErrorKind::Other, false, error.to_string()),
        },
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed => (
            StoreErrorKind::Connection,
            true,
            format!("connection failed: {error}"),
        ),
        sqlx::Error::PoolTimedOut => (
            StoreErrorKind::Timeout,
            true,
            "no connection became free within the pool's acquire timeout".to_owned(),
        ),
        sqlx::Error::PoolClosed => (
            StoreErrorKind::Connection,
            false,
            "the store was closed".to_owned(),
        ),
        sqlx::Error::Tls(_) => (
            StoreErrorKind::Connection,
            false,
            format!("TLS failed: {error}"),
        ),
        sqlx::Error::Configuration(_) => (
            StoreErrorKind::Rejected,
            false,
            format!("bad connection options: {error}"),
        ),
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => (
            StoreErrorKind::Corrupt,
            false,
            format!("a stored value could not be read: {error}"),
        ),
        _ => (StoreErrorKind::Other, false, error.to_string()),
    };
    Error::store_with(kind, transient, format!("{doing}: {what}"), error)
}

/// `.store(doing)?` on a driver result.
pub(crate) trait OrStore<T> {
    /// Maps the error with [`map`].
    fn store(self, doing: &str) -> Result<T, Error>;
}

impl<T> OrStore<T> for Result<T, sqlx::Error> {
    fn store(self, doing: &str) -> Result<T, Error> {
        self.map_err(|e| map(doing, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_conflicts_are_transient_and_busy() {
        assert_eq!(classify_number(1213), (StoreErrorKind::Busy, true));
        assert_eq!(classify_number(1205), (StoreErrorKind::Busy, true));
    }

    #[test]
    fn duplicates_and_syntax_are_permanent() {
        assert_eq!(classify_number(1062), (StoreErrorKind::Rejected, false));
        assert_eq!(classify_number(1064), (StoreErrorKind::Rejected, false));
    }

    #[test]
    fn lost_and_killed_connections_are_transient() {
        for n in [1927, 3169, 1317, 1053, 4031, 1040] {
            assert_eq!(
                classify_number(n),
                (StoreErrorKind::Connection, true),
                "{n}"
            );
        }
        let io = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        let err = map("load_state on a/b", io);
        assert!(err.is_transient());
        assert!(err.to_string().contains("load_state on a/b"));
    }

    #[test]
    fn a_missing_schema_says_to_migrate() {
        assert_eq!(classify_number(1146), (StoreErrorKind::Schema, false));
        assert_eq!(classify_number(1054), (StoreErrorKind::Schema, false));
    }

    #[test]
    fn a_closed_store_fails_permanently() {
        let err = map("get_lease on a/b", sqlx::Error::PoolClosed);
        assert!(!err.is_transient());
        assert!(err.to_string().contains("closed"));
    }
}
