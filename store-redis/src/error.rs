//! The one mapping from driver errors to watukuy's [`Error`] (ARCHITECTURE.md, invariant 5).

use redis::{ErrorKind, RedisError, ServerErrorKind};
use watukuy_core::{Error, store::StoreErrorKind};

/// Maps a redis error to [`Error::Store`] (or [`Error::Config`] for an unusable URL), deciding
/// whether retrying may help:
///
/// | redis error | kind | transient |
/// |---|---|---|
/// | I/O: refused, reset, broken pipe, end of stream, unreachable | `Connection` | yes |
/// | I/O: timed out (connect or response timeout) | `Timeout` | yes |
/// | `LOADING` (restarting with a dataset), `BUSY` (a script runs too long), `TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`, `OOM` | `Busy` | yes |
/// | `READONLY` (a replica promoted away during failover) | `Connection` | yes |
/// | authentication failed | `Connection` | no |
/// | `WRONGTYPE` (a key of the store holds another type: foreign data under the prefix), from a command or in a pipeline | `Corrupt` | no |
/// | a reply of an unexpected shape, or a parse error | `Corrupt` | no |
/// | `MOVED`/`ASK` through a cluster connection (the slot moved faster than the driver followed) | `Connection` | yes |
/// | `NOPERM` (ACL), `CROSSSLOT`, `MOVED`/`ASK` (a cluster behind a plain connection) | `Rejected` | no |
/// | script errors (`ERR ... user_script ...`), `NOSCRIPT` after the reload, `EXECABORT`, anything else | `Other` | no |
/// | an invalid URL or client configuration | [`Error::Config`] (`redis.url`) | no |
pub(crate) fn classify(error: RedisError) -> Error {
    classify_in(error, false)
}

/// [`classify`] for a connection that is (`cluster`) or is not cluster-aware. Through a cluster
/// connection, `MOVED` and `ASK` that reach the store mean the driver ran out of redirections
/// while the cluster was moving the slot (a failover, a resharding): transient `Connection`
/// errors, where a plain connection gets them because it is not cluster-aware (permanent).
pub(crate) fn classify_in(error: RedisError, cluster: bool) -> Error {
    use StoreErrorKind::{Busy, Connection, Corrupt, Other, Rejected, Timeout};
    let error = first_of_pipeline(error);
    #[cfg(feature = "tls")]
    if let Some(tls) = tls_error(&error) {
        return tls;
    }
    let (kind, transient, hint) = match error.kind() {
        ErrorKind::InvalidClientConfig => {
            return Error::config(
                "redis.url",
                format!("unusable Redis URL or client configuration: {error}"),
            );
        }
        ErrorKind::Io if error.is_timeout() => (Timeout, true, "Redis did not answer in time"),
        ErrorKind::Io => (Connection, true, "cannot reach Redis"),
        ErrorKind::AuthenticationFailed => (Connection, false, "Redis refused the credentials"),
        ErrorKind::Server(server) => match server {
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown => (Busy, true, "Redis is busy"),
            ServerErrorKind::ReadOnly => (
                Connection,
                true,
                "Redis is a read-only replica (failover in progress?)",
            ),
            ServerErrorKind::NoPerm => (Rejected, false, "Redis ACLs refuse the command"),
            ServerErrorKind::Moved | ServerErrorKind::Ask if cluster => (
                Connection,
                true,
                "Redis Cluster is moving the slot (failover or resharding?)",
            ),
            ServerErrorKind::CrossSlot | ServerErrorKind::Moved | ServerErrorKind::Ask => (
                Rejected,
                false,
                "Redis Cluster redirected the command: connect through a cluster-aware client",
            ),
            ServerErrorKind::ResponseError
            | ServerErrorKind::ExecAbort
            | ServerErrorKind::NoScript
            | ServerErrorKind::NotBusy
            | ServerErrorKind::NoSub => (Other, false, "Redis refused the command"),
            _ => (Other, false, "Redis refused the command"),
        },
        ErrorKind::Extension => match error.code().unwrap_or_default() {
            "BUSY" | "OOM" => (Busy, true, "Redis is busy"),
            "WRONGTYPE" => (
                Corrupt,
                false,
                "a key of the store holds a value of another type (foreign data under the prefix?)",
            ),
            _ => (Other, false, "Redis refused the command"),
        },
        ErrorKind::UnexpectedReturnType | ErrorKind::Parse => {
            (Corrupt, false, "cannot read a Redis reply")
        }
        _ if error.is_connection_dropped() || error.is_connection_refusal() => {
            (Connection, true, "cannot reach Redis")
        }
        _ => (Other, false, "Redis client error"),
    };
    Error::store_with(kind, transient, format!("{hint}: {error}"), error)
}

/// The first server error of a failed pipeline, or `error` itself. The driver reports a pipeline
/// whose commands failed with a code it has no kind for (`WRONGTYPE`, `BUSY`, `OOM`) as an
/// `Extension` error without a code, so [`classify_in`] would not know it; the store's pipelines
/// repeat one command over keys of one kind, so their first failure says what is wrong.
fn first_of_pipeline(error: RedisError) -> RedisError {
    if !matches!(error.kind(), ErrorKind::Extension) || error.code().is_some() {
        return error;
    }
    match error.clone().into_server_errors().as_deref() {
        Some([(_, first), ..]) => RedisError::from(first.clone()),
        _ => error,
    }
}

/// A TLS handshake that failed for a reason retrying cannot fix, as the [`Error::Config`] that
/// names what to change: the server's certificate does not verify (`redis.tls_ca`), the server
/// refused the client's certificate (`redis.tls_client_cert`), or the server does not speak TLS
/// at all (`redis.url`).
#[cfg(feature = "tls")]
fn tls_error(error: &RedisError) -> Option<Error> {
    let tls = find_rustls(error)?;
    let (option, message) = match tls {
        rustls::Error::InvalidCertificate(_) => (
            "redis.tls_ca",
            format!(
                "the server's TLS certificate does not verify ({tls}): trust the authority that \
                 signed it (RedisOptions::tls_ca_pem, or tls_ca_file=<path> in the URL) and \
                 connect by a name the certificate lists"
            ),
        ),
        rustls::Error::AlertReceived(_) => (
            "redis.tls_client_cert",
            format!(
                "the server ended the TLS handshake ({tls}): does it require a client certificate \
                 (RedisOptions::tls_client_auth, or tls_cert_file= and tls_key_file= in the URL) \
                 that it trusts?"
            ),
        ),
        rustls::Error::InvalidMessage(_)
        | rustls::Error::InappropriateMessage { .. }
        | rustls::Error::InappropriateHandshakeMessage { .. } => (
            "redis.url",
            format!(
                "the server does not answer TLS ({tls}): is this a plain-text port? Use a \
                 redis:// URL for it, or the server's TLS port"
            ),
        ),
        _ => ("redis.url", format!("the TLS handshake failed: {tls}")),
    };
    Some(Error::config(option, message))
}

/// The rustls error somewhere under a redis error: the driver keeps the I/O error behind an
/// `Arc<dyn Error>`, and the I/O error keeps the rustls error as its inner error.
#[cfg(feature = "tls")]
fn find_rustls(error: &RedisError) -> Option<&rustls::Error> {
    use std::error::Error as StdError;
    type Shared = std::sync::Arc<dyn StdError + Send + Sync>;
    let mut next: Option<&(dyn StdError + 'static)> = error.source();
    // A short chain; the bound only guards against a cycle.
    for _ in 0..8 {
        let current = next?;
        if let Some(tls) = current.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        next = if let Some(shared) = current.downcast_ref::<Shared>() {
            Some(shared.as_ref())
        } else if let Some(io) = current.downcast_ref::<std::io::Error>() {
            io.get_ref().map(|inner| inner as &(dyn StdError + 'static))
        } else {
            current.source()
        };
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io(kind: std::io::ErrorKind) -> RedisError {
        RedisError::from(std::io::Error::from(kind))
    }

    fn server(code: &str, detail: &str) -> RedisError {
        redis::make_extension_error(code.to_owned(), Some(detail.to_owned()))
    }

    #[test]
    fn connection_failures_are_transient() {
        for kind in [
            std::io::ErrorKind::ConnectionRefused,
            std::io::ErrorKind::ConnectionReset,
            std::io::ErrorKind::BrokenPipe,
            std::io::ErrorKind::UnexpectedEof,
        ] {
            assert_eq!(
                classify(io(kind)).store_kind(),
                Some((StoreErrorKind::Connection, true)),
                "{kind:?}"
            );
        }
        assert_eq!(
            classify(io(std::io::ErrorKind::TimedOut)).store_kind(),
            Some((StoreErrorKind::Timeout, true))
        );
    }

    #[test]
    fn busy_servers_are_transient() {
        for code in ["BUSY", "OOM"] {
            assert_eq!(
                classify(server(code, "try later")).store_kind(),
                Some((StoreErrorKind::Busy, true)),
                "{code}"
            );
        }
        let loading =
            RedisError::from((ErrorKind::Server(ServerErrorKind::BusyLoading), "loading"));
        assert_eq!(
            classify(loading).store_kind(),
            Some((StoreErrorKind::Busy, true))
        );
        let again = RedisError::from((ErrorKind::Server(ServerErrorKind::TryAgain), "again"));
        assert_eq!(
            classify(again).store_kind(),
            Some((StoreErrorKind::Busy, true))
        );
    }

    #[test]
    fn script_and_type_errors_are_permanent() {
        assert_eq!(
            classify(server(
                "WRONGTYPE",
                "Operation against a key holding the wrong kind of value"
            ))
            .store_kind(),
            Some((StoreErrorKind::Corrupt, false))
        );
        let script = RedisError::from((
            ErrorKind::Server(ServerErrorKind::ResponseError),
            "user_script:1: Script attempted to access nonexistent global variable",
        ));
        assert_eq!(
            classify(script).store_kind(),
            Some((StoreErrorKind::Other, false))
        );
        let noscript = RedisError::from((ErrorKind::Server(ServerErrorKind::NoScript), "gone"));
        assert_eq!(
            classify(noscript).store_kind(),
            Some((StoreErrorKind::Other, false))
        );
        let shape = RedisError::from((ErrorKind::UnexpectedReturnType, "not a string"));
        assert_eq!(
            classify(shape).store_kind(),
            Some((StoreErrorKind::Corrupt, false))
        );
    }

    #[test]
    fn redirections_are_transient_only_through_a_cluster_connection() {
        let moved = || RedisError::from((ErrorKind::Server(ServerErrorKind::Moved), "432 h:1"));
        assert_eq!(
            classify_in(moved(), true).store_kind(),
            Some((StoreErrorKind::Connection, true))
        );
        assert_eq!(
            classify_in(moved(), false).store_kind(),
            Some((StoreErrorKind::Rejected, false))
        );
    }

    #[test]
    fn a_bad_client_configuration_is_a_config_error() {
        let err = classify(RedisError::from((
            ErrorKind::InvalidClientConfig,
            "bad url",
        )));
        assert!(matches!(err, Error::Config { ref option, .. } if option == "redis.url"));
    }
}
