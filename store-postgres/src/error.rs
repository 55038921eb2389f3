//! The one mapping from driver errors to watukuy's [`Error`] (ARCHITECTURE.md, invariant 5).

use watukuy_core::{Error, store::StoreErrorKind};

/// Said after errors that mean statements outlived their server connection.
const POOLER_HINT: &str = " (is the store behind a pooler in transaction mode, such as PgBouncer \
                           with pool_mode = transaction? Then set \
                           PostgresOptions::transaction_pooling(true))";

/// Maps a sqlx error to [`Error::Store`] (or [`Error::Config`] for an unusable connection
/// string), deciding by SQLSTATE whether retrying may help:
///
/// | SQLSTATE / driver error | kind | transient |
/// |---|---|---|
/// | `40001` serialization failure, `40P01` deadlock, `55P03` lock not available, `53xxx` insufficient resources | `Busy` | yes |
/// | `57014` statement timeout or cancel | `Timeout` | yes |
/// | `08xxx` connection exceptions, `57P01`..`57P03` server shutting down or starting, I/O errors, TLS errors after the handshake, pool timeout, crashed worker | `Connection` | yes |
/// | `3D000` database does not exist (yet) | `Connection` | yes |
/// | `08P01` "unsupported startup parameter" (PgBouncer; the message says what to set) | `Connection` | no |
/// | `42P05` / `26000` prepared statement exists / is missing (a transaction pooler; the message says what to set) | `Other` | no |
/// | `28xxx` authentication failed (the message says when the server accepts only TLS there), a closed pool | `Connection` | no |
/// | TLS refused or not verified: certificate not trusted, not for this host, expired; the server has no TLS; TLS not compiled in | `Config` error naming the cause and the setting (`postgres.ssl_root_cert`, `postgres.url`) | no |
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
                // PgBouncer refusing a startup parameter it does not track: the same answer on
                // every attempt.
                "08P01" if db.message().contains("unsupported startup parameter") => (
                    Connection,
                    false,
                    " (a pooler such as PgBouncer: in transaction mode set \
                     PostgresOptions::transaction_pooling(true), which leaves the parameter out; \
                     otherwise add it to the pooler's ignore_startup_parameters)",
                ),
                // Prepared statements that another server connection holds, or a bind that reached
                // another client's statement: a transaction pooler the store was not told about.
                "42P05" | "26000" => (Other, false, POOLER_HINT),
                "08P01" if db.message().contains("bind message supplies") => {
                    (Connection, true, POOLER_HINT)
                }
                c if c.starts_with("08") => (Connection, true, ""),
                "3D000" => (Connection, true, ""),
                // `hostssl` lines only, and a plain-text connection: pg_hba.conf's "no
                // encryption" says which.
                c if c.starts_with("28") && db.message().contains("no encryption") => (
                    Connection,
                    false,
                    " (the server accepts this user and database only over TLS: connect with \
                     sslmode=verify-full, verify-ca or require in the URL)",
                ),
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
        sqlx::Error::Io(e) => match tls::handshake_error(e) {
            Some(Ok(config)) => return config,
            Some(Err(message)) => (Connection, true, message),
            None => (
                Connection,
                true,
                format!("cannot reach PostgreSQL (I/O error: {e})"),
            ),
        },
        // The driver's own TLS failures happen before or while setting TLS up: the server has no
        // TLS, TLS is not compiled in, a certificate cannot be read.
        sqlx::Error::Tls(e) => return tls::setup_error(&e.to_string()),
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

/// TLS failures: which are configuration errors, and what they say.
mod tls {
    use watukuy_core::Error;

    /// A failure of the driver's own TLS setup, as a `Config` error naming what to change.
    pub(super) fn setup_error(message: &str) -> Error {
        if message.contains("does not support TLS") {
            Error::config(
                "postgres.url",
                format!(
                    "TLS: {message}; the URL's sslmode asks for TLS: enable ssl on the server \
                     (or the pooler's client_tls_sslmode), or connect without TLS (sslmode=disable \
                     or prefer)"
                ),
            )
        } else if message.contains("without TLS support") {
            Error::config(
                "postgres.url",
                format!(
                    "TLS: {message}; enable the `tls` feature of watukuy-store-postgres, or \
                     connect without TLS"
                ),
            )
        } else {
            Error::config("postgres.ssl_root_cert", format!("TLS: {message}"))
        }
    }

    /// An I/O error that is a failed TLS handshake: `Some(Ok(config error))` when retrying
    /// cannot help (a certificate that is not trusted, not for this host or expired, a server
    /// refusing the handshake), `Some(Err(message))` for other TLS failures (transient), `None`
    /// when it is not TLS.
    #[cfg(feature = "tls")]
    pub(super) fn handshake_error(error: &std::io::Error) -> Option<Result<Error, String>> {
        use rustls::{CertificateError, Error as TlsError};

        let tls = error.get_ref()?.downcast_ref::<TlsError>()?;
        let trust = "give the certificate authority that signed it with sslrootcert=<file> in the \
                     URL or PostgresOptions::ssl_root_cert";
        let (option, message) = match tls {
            TlsError::InvalidCertificate(cause) => match cause {
                CertificateError::UnknownIssuer => (
                    "postgres.ssl_root_cert",
                    format!(
                        "the server's certificate is not signed by a trusted certificate authority ({tls}): {trust}"
                    ),
                ),
                CertificateError::NotValidForName
                | CertificateError::NotValidForNameContext { .. } => (
                    "postgres.url",
                    format!(
                        "the server's certificate does not name the host of the URL ({tls}): \
                         connect to a host name it lists (with this driver, sslmode=verify-ca \
                         checks the name too)"
                    ),
                ),
                CertificateError::Expired
                | CertificateError::ExpiredContext { .. }
                | CertificateError::NotValidYet
                | CertificateError::NotValidYetContext { .. } => (
                    "postgres.ssl_root_cert",
                    format!(
                        "the server's certificate is outside its validity period ({tls}): renew it on the server"
                    ),
                ),
                _ => (
                    "postgres.ssl_root_cert",
                    format!("the server's certificate was rejected ({tls}): {trust}"),
                ),
            },
            TlsError::NoCertificatesPresented
            | TlsError::UnsupportedNameType
            | TlsError::InvalidCertRevocationList(_) => (
                "postgres.ssl_root_cert",
                format!("the server's certificate was rejected ({tls})"),
            ),
            TlsError::PeerIncompatible(_) | TlsError::AlertReceived(_) => (
                "postgres.url",
                format!("the server refused the TLS handshake ({tls}): check its TLS settings"),
            ),
            _ => {
                return Some(Err(format!(
                    "the TLS connection to PostgreSQL failed ({tls})"
                )));
            }
        };
        Some(Ok(Error::config(option, format!("TLS: {message}"))))
    }

    #[cfg(not(feature = "tls"))]
    pub(super) fn handshake_error(_error: &std::io::Error) -> Option<Result<Error, String>> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_level_failures_are_transient() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(
            classify(sqlx::Error::Io(refused)).store_kind(),
            Some((StoreErrorKind::Connection, true))
        );
        assert_eq!(
            classify(sqlx::Error::PoolTimedOut).store_kind(),
            Some((StoreErrorKind::Connection, true))
        );
        assert_eq!(
            classify(sqlx::Error::PoolClosed).store_kind(),
            Some((StoreErrorKind::Connection, false))
        );
    }

    #[test]
    fn tls_setup_failures_are_config_errors() {
        for (message, option) in [
            ("server does not support TLS", "postgres.url"),
            (
                "TLS upgrade required by connect options but SQLx was built without TLS support enabled",
                "postgres.url",
            ),
            ("Invalid certificate file: /x", "postgres.ssl_root_cert"),
        ] {
            let err = classify(sqlx::Error::Tls(message.into()));
            assert!(
                matches!(err, Error::Config { option: ref o, .. } if o == option),
                "{message}: {err}"
            );
            assert!(!err.is_transient());
        }
    }

    #[cfg(feature = "tls")]
    #[test]
    fn certificate_failures_are_config_errors_and_other_tls_failures_transient() {
        use rustls::{CertificateError, Error as TlsError};
        let io = |tls: TlsError| std::io::Error::new(std::io::ErrorKind::InvalidData, tls);
        let err = classify(sqlx::Error::Io(io(TlsError::InvalidCertificate(
            CertificateError::UnknownIssuer,
        ))));
        assert!(
            matches!(err, Error::Config { ref option, ref message } if option == "postgres.ssl_root_cert"
                && message.contains("not signed by a trusted certificate authority")),
            "{err}"
        );
        let err = classify(sqlx::Error::Io(io(TlsError::InvalidCertificate(
            CertificateError::NotValidForName,
        ))));
        assert!(
            matches!(err, Error::Config { ref option, .. } if option == "postgres.url"),
            "{err}"
        );
        let err = classify(sqlx::Error::Io(io(TlsError::DecryptError)));
        assert_eq!(err.store_kind(), Some((StoreErrorKind::Connection, true)));
    }

    #[test]
    fn bad_configuration_is_a_config_error() {
        let err = classify(sqlx::Error::Configuration("bad port".into()));
        assert!(matches!(err, Error::Config { ref option, .. } if option == "postgres.url"));
    }
}
