//! The one error type of watukuy, with stable codes.

use std::fmt;

use crate::model::{PKey, SerializedError, ValidationIssue};

/// The boxed error type user code (fetches, handlers, drivers) may return.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A watukuy result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The stable code of an [`Error`]: safe to match on and to alert on across minor versions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// Invalid configuration, caught when it is built.
    Config,
    /// A fenced write was rejected: another instance holds the key.
    LeaseLost,
    /// The store failed.
    Store,
    /// An HTTP call failed.
    Http,
    /// A poller's fetch failed with an error of its own (not an HTTP error).
    Fetch,
    /// Items failed validation and the poller is set to fail on invalid input.
    Validation,
    /// Replay requested on a poller without a log.
    ReplayUnavailable,
    /// A rate budget gave no token within the allowed wait.
    BudgetTimeout,
    /// The circuit is open.
    CircuitOpen,
    /// The engine is not running.
    NotRunning,
    /// No poller has that name.
    UnknownPoller,
    /// The store or configuration does not support the operation.
    Unsupported,
    /// The key has no such partition.
    UnknownPartition,
    /// What an operation names does not exist (a parked row's id).
    NotFound,
}

impl ErrorCode {
    /// The code as written in logs and serialized errors (`CONFIG`, `LEASE_LOST`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Config => "CONFIG",
            ErrorCode::LeaseLost => "LEASE_LOST",
            ErrorCode::Store => "STORE",
            ErrorCode::Http => "HTTP",
            ErrorCode::Fetch => "FETCH",
            ErrorCode::Validation => "VALIDATION",
            ErrorCode::ReplayUnavailable => "REPLAY_UNAVAILABLE",
            ErrorCode::BudgetTimeout => "BUDGET_TIMEOUT",
            ErrorCode::CircuitOpen => "CIRCUIT_OPEN",
            ErrorCode::NotRunning => "NOT_RUNNING",
            ErrorCode::UnknownPoller => "UNKNOWN_POLLER",
            ErrorCode::Unsupported => "UNSUPPORTED",
            ErrorCode::UnknownPartition => "UNKNOWN_PARTITION",
            ErrorCode::NotFound => "NOT_FOUND",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What kind of store failure happened; decides nothing by itself (see [`Error::is_transient`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The backend could not be reached or the connection broke.
    Connection,
    /// The backend is busy or locked (SQLite busy, lock timeouts, serialization failures).
    Busy,
    /// The operation timed out.
    Timeout,
    /// Stored data could not be read back (corrupt or foreign rows).
    Corrupt,
    /// The schema is missing or of an unknown version.
    Schema,
    /// The request was refused (permissions, constraints, bad arguments).
    Rejected,
    /// Anything else.
    Other,
}

/// The error type of every watukuy API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Invalid configuration; `option` names it (e.g. `delivery.concurrency`).
    #[error("invalid option `{option}`: {message}")]
    Config {
        /// The option's path.
        option: String,
        /// What is wrong with it.
        message: String,
    },
    /// A fenced write carried a lease that is no longer current.
    #[error("lease lost on {poller}/{partition}: epoch {epoch} was rejected")]
    LeaseLost {
        /// The key's poller.
        poller: String,
        /// The key's partition.
        partition: String,
        /// The rejected epoch (the caller's).
        epoch: i64,
    },
    /// The store failed.
    #[error("store error ({kind:?}{}): {message}", if *.transient { ", transient" } else { "" })]
    Store {
        /// What kind of failure.
        kind: StoreErrorKind,
        /// Retrying the same call may succeed.
        transient: bool,
        /// What happened.
        message: String,
        /// The driver's error.
        #[source]
        source: Option<BoxError>,
    },
    /// An HTTP call failed.
    #[error("{method} {url} responded {}{}", status.map_or_else(|| "without a status".to_owned(), |s| s.to_string()), message.as_deref().map(|m| format!(": {m}")).unwrap_or_default())]
    Http {
        /// The request method.
        method: String,
        /// The request URL.
        url: String,
        /// The response status, if a response arrived.
        status: Option<u16>,
        /// The problem title or detail.
        message: Option<String>,
        /// The `Retry-After` delay, if sent.
        retry_after_ms: Option<i64>,
    },
    /// A poller's fetch returned an error that is not a watukuy [`Error`]: a `String` or `&str`
    /// (`Err("upstream is down".into())`), an `io::Error`, a client library's error. The engine
    /// wraps it with [`Error::fetch`]; the cycle fails and backs off like any fetch failure.
    /// (A fetch that returns an [`Error`], such as the `Error::Http` of `watukuy-http`, is
    /// reported as that error.)
    #[error("fetch failed: {message}")]
    Fetch {
        /// The fetch's error message, followed by the messages of its causes (`: ` between them).
        message: String,
        /// Retrying may succeed; `true` for every error the engine wraps (a fetch error is
        /// transient unless it says otherwise, see [`Error::is_transient`]).
        transient: bool,
        /// The error the fetch returned, to downcast to its own type.
        error: Option<BoxError>,
    },
    /// Items failed validation (poller set to `on_invalid: fail`).
    #[error("validation failed: {}", issues.iter().map(|i| i.message.as_str()).collect::<Vec<_>>().join("; "))]
    Validation {
        /// The issues found.
        issues: Vec<ValidationIssue>,
    },
    /// Replay needs the poller's log.
    #[error("poller '{poller}' has no log: replay is unavailable")]
    ReplayUnavailable {
        /// The poller.
        poller: String,
    },
    /// A rate budget gave no token in time.
    #[error("budget '{budget}' gave no token within {waited_ms} ms")]
    BudgetTimeout {
        /// The budget.
        budget: String,
        /// How long the request waited.
        waited_ms: i64,
    },
    /// The circuit is open.
    #[error("circuit open: {message}")]
    CircuitOpen {
        /// Details.
        message: String,
    },
    /// The engine is not running (or is stopping).
    #[error("not running: {message}")]
    NotRunning {
        /// Details.
        message: String,
    },
    /// No poller has that name.
    #[error("unknown poller '{name}' ({})", known_pollers(known))]
    UnknownPoller {
        /// The name asked for.
        name: String,
        /// The names that exist, sorted (the engine's pollers, or the pollers a store holds keys
        /// for).
        known: Vec<String>,
    },
    /// Unsupported operation.
    #[error("unsupported: {message}")]
    Unsupported {
        /// Details.
        message: String,
    },
    /// The store holds no key for that partition of the poller (`partition` is `""` when none
    /// was named for a partitioned poller).
    #[error("{}", unknown_partition(poller, partition, known))]
    UnknownPartition {
        /// The poller.
        poller: String,
        /// The partition asked for.
        partition: String,
        /// The poller's partitions that exist, sorted.
        known: Vec<String>,
    },
    /// What an operation names does not exist, or is not what the operation applies to (a
    /// parked row's id); the message names each and says why.
    #[error("{message}")]
    NotFound {
        /// What was not found.
        message: String,
    },
}

/// Why a partition cannot be used, with the partitions that can.
fn unknown_partition(poller: &str, partition: &str, known: &[String]) -> String {
    let names: Vec<String> = known.iter().map(|name| format!("'{name}'")).collect();
    match (partition, names.as_slice()) {
        (_, []) => format!("poller '{poller}' has no key yet"),
        ("", _) => format!(
            "poller '{poller}' is partitioned: name a partition (partitions: {})",
            names.join(", ")
        ),
        (_, [only]) if only == "''" => {
            format!("poller '{poller}' is not partitioned; got partition '{partition}'")
        }
        _ => format!(
            "poller '{poller}' has no partition '{partition}' (partitions: {})",
            names.join(", ")
        ),
    }
}

/// `known pollers: 'a', 'b'`, or that there are none.
fn known_pollers(known: &[String]) -> String {
    if known.is_empty() {
        return "there are no pollers".to_owned();
    }
    let names: Vec<String> = known.iter().map(|name| format!("'{name}'")).collect();
    format!("known pollers: {}", names.join(", "))
}

impl Error {
    /// The stable code.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Config { .. } => ErrorCode::Config,
            Error::LeaseLost { .. } => ErrorCode::LeaseLost,
            Error::Store { .. } => ErrorCode::Store,
            Error::Http { .. } => ErrorCode::Http,
            Error::Fetch { .. } => ErrorCode::Fetch,
            Error::Validation { .. } => ErrorCode::Validation,
            Error::ReplayUnavailable { .. } => ErrorCode::ReplayUnavailable,
            Error::BudgetTimeout { .. } => ErrorCode::BudgetTimeout,
            Error::CircuitOpen { .. } => ErrorCode::CircuitOpen,
            Error::NotRunning { .. } => ErrorCode::NotRunning,
            Error::UnknownPoller { .. } => ErrorCode::UnknownPoller,
            Error::Unsupported { .. } => ErrorCode::Unsupported,
            Error::UnknownPartition { .. } => ErrorCode::UnknownPartition,
            Error::NotFound { .. } => ErrorCode::NotFound,
        }
    }

    /// True when retrying the same operation may succeed: transient store failures,
    /// HTTP 408/429/5xx and failures without a response, budget timeouts, and a fetch's own
    /// errors (unless built with `transient: false`).
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Store { transient, .. } | Error::Fetch { transient, .. } => *transient,
            Error::Http { status, .. } => status.is_none_or(|s| s == 408 || s == 429 || s >= 500),
            Error::BudgetTimeout { .. } => true,
            _ => false,
        }
    }

    /// The option a [`Error::Config`] names, or `None` for any other error.
    ///
    /// ```
    /// use watukuy_core::Error;
    ///
    /// assert_eq!(Error::config("redis.prefix", "must not be empty").config_option(), Some("redis.prefix"));
    /// assert_eq!(Error::store(watukuy_core::store::StoreErrorKind::Busy, true, "busy").config_option(), None);
    /// ```
    pub fn config_option(&self) -> Option<&str> {
        match self {
            Error::Config { option, .. } => Some(option),
            _ => None,
        }
    }

    /// The kind and transient flag of an [`Error::Store`], or `None` for any other error.
    pub fn store_kind(&self) -> Option<(StoreErrorKind, bool)> {
        match self {
            Error::Store {
                kind, transient, ..
            } => Some((*kind, *transient)),
            _ => None,
        }
    }

    /// A configuration error naming the option.
    pub fn config(option: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Config {
            option: option.into(),
            message: message.into(),
        }
    }

    /// The lease-lost error for `key` and the rejected epoch.
    pub fn lease_lost(key: &PKey, epoch: i64) -> Self {
        Error::LeaseLost {
            poller: key.poller.clone(),
            partition: key.partition.clone(),
            epoch,
        }
    }

    /// A fetch's own error (see [`Error::Fetch`]), transient: the message is the error's text
    /// followed by its causes, and the error is kept to downcast.
    ///
    /// ```
    /// use watukuy_core::{BoxError, Error, ErrorCode};
    ///
    /// let returned: BoxError = "the ERP answered garbage".into();
    /// let error = Error::fetch(returned);
    /// assert_eq!(error.code(), ErrorCode::Fetch);
    /// assert!(error.is_transient());
    /// assert_eq!(error.to_string(), "fetch failed: the ERP answered garbage");
    /// ```
    pub fn fetch(error: impl Into<BoxError>) -> Self {
        let error = error.into();
        let mut message = error.to_string();
        let mut cause = error.source();
        while let Some(c) = cause {
            let text = c.to_string();
            // Many errors repeat their cause in their own text; say each part once.
            if !message.ends_with(&text) {
                message.push_str(": ");
                message.push_str(&text);
            }
            cause = c.source();
        }
        Error::Fetch {
            message,
            transient: true,
            error: Some(error),
        }
    }

    /// A store failure without a driver error.
    pub fn store(kind: StoreErrorKind, transient: bool, message: impl Into<String>) -> Self {
        Error::Store {
            kind,
            transient,
            message: message.into(),
            source: None,
        }
    }

    /// A store failure wrapping the driver's error.
    pub fn store_with(
        kind: StoreErrorKind,
        transient: bool,
        message: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        Error::Store {
            kind,
            transient,
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// Stored data that could not be decoded.
    pub fn corrupt(what: impl fmt::Display, source: impl Into<BoxError>) -> Self {
        Error::store_with(
            StoreErrorKind::Corrupt,
            false,
            format!("cannot decode {what}"),
            source,
        )
    }

    /// This error as plain data, with its code.
    pub fn to_serialized(&self) -> SerializedError {
        let name = match self {
            Error::Config { .. } => "ConfigError",
            Error::LeaseLost { .. } => "LeaseLostError",
            Error::Store { .. } => "StoreError",
            Error::Http { .. } => "HttpError",
            Error::Fetch { .. } => "FetchError",
            Error::Validation { .. } => "ValidationError",
            Error::ReplayUnavailable { .. } => "ReplayUnavailableError",
            Error::BudgetTimeout { .. } => "BudgetTimeoutError",
            _ => "WatukuyError",
        };
        let mut out = SerializedError::from_error(name, self).with_code(self.code().as_str());
        if let Error::Http { status, .. } = self {
            out.status = *status;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_stable_strings() {
        assert_eq!(
            Error::config("delivery.concurrency", "must be at least 1")
                .code()
                .as_str(),
            "CONFIG"
        );
        let err = Error::lease_lost(&PKey::new("orders", "b"), 3);
        assert_eq!(err.code(), ErrorCode::LeaseLost);
        assert_eq!(
            err.to_string(),
            "lease lost on orders/b: epoch 3 was rejected"
        );
    }

    #[test]
    fn config_error_names_the_option() {
        let err = Error::config("delivery.retry.attempts", "must be at least 1, got 0");
        assert!(err.to_string().contains("`delivery.retry.attempts`"));
    }

    #[test]
    fn transient_flag() {
        assert!(Error::store(StoreErrorKind::Busy, true, "locked").is_transient());
        assert!(!Error::store(StoreErrorKind::Corrupt, false, "bad row").is_transient());
        assert!(!Error::config("x", "y").is_transient());
    }

    #[test]
    fn a_fetch_error_carries_the_message_and_its_causes_and_is_transient() {
        #[derive(Debug, thiserror::Error)]
        #[error("the ERP refused the listing")]
        struct Refused(#[source] std::io::Error);

        let err = Error::fetch(Refused(std::io::Error::other("connection reset")));
        assert_eq!(err.code(), ErrorCode::Fetch);
        assert!(err.is_transient());
        assert_eq!(
            err.to_string(),
            "fetch failed: the ERP refused the listing: connection reset"
        );
        let Error::Fetch {
            error: Some(inner), ..
        } = &err
        else {
            panic!("not a fetch error: {err:?}");
        };
        assert!(
            inner.downcast_ref::<Refused>().is_some(),
            "kept to downcast"
        );
        let ser = err.to_serialized();
        assert_eq!(ser.name, "FetchError");
        assert_eq!(ser.code.as_deref(), Some("FETCH"));
        assert_eq!(ser.status, None);

        let plain = Error::fetch("nope");
        assert_eq!(plain.to_string(), "fetch failed: nope");
        let permanent = Error::Fetch {
            message: "bad request".into(),
            transient: false,
            error: None,
        };
        assert!(!permanent.is_transient());
    }

    #[test]
    fn serialized_error_keeps_the_source_chain() {
        let io = std::io::Error::other("connection reset");
        let err = Error::store_with(StoreErrorKind::Connection, true, "query failed", io);
        let ser = err.to_serialized();
        assert_eq!(ser.name, "StoreError");
        assert_eq!(ser.code.as_deref(), Some("STORE"));
        assert_eq!(ser.cause.unwrap().message, "connection reset");
    }
}
