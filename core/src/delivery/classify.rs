//! Classifying handler failures: HTTP statuses, network errors and watukuy's own errors into
//! [`HandlerErrorKind`]s. Pure functions; no I/O.
//!
//! ```
//! use std::time::Duration;
//! use watukuy_core::delivery::{HandlerErrorKind, TransientStatuses, classify_http_response};
//!
//! let transient = TransientStatuses::default();
//! assert_eq!(classify_http_response(503, None, &transient), HandlerErrorKind::Transient);
//! assert_eq!(classify_http_response(422, None, &transient), HandlerErrorKind::Permanent);
//! assert_eq!(
//!     classify_http_response(429, Some(Duration::from_secs(7)), &transient),
//!     HandlerErrorKind::RetryAfter(Duration::from_secs(7)),
//! );
//! // A downstream that answers 409 while it catches up: make it transient.
//! let custom = TransientStatuses::default().with(409);
//! assert_eq!(classify_http_response(409, None, &custom), HandlerErrorKind::Transient);
//! ```

use std::collections::BTreeSet;
use std::io::ErrorKind;
use std::time::Duration;

use super::consumer::{HandlerError, HandlerErrorKind};
use crate::clock::ms_duration;
use crate::error::Error;

/// The HTTP statuses worth retrying. Default: 408, 429 and every 5xx.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransientStatuses {
    statuses: BTreeSet<u16>,
}

impl Default for TransientStatuses {
    fn default() -> Self {
        Self {
            statuses: [408, 429].into_iter().chain(500..=599).collect(),
        }
    }
}

impl TransientStatuses {
    /// No status is transient (every 4xx and 5xx is then permanent).
    pub fn none() -> Self {
        Self {
            statuses: BTreeSet::new(),
        }
    }

    /// Exactly these statuses are transient.
    pub fn only(statuses: impl IntoIterator<Item = u16>) -> Self {
        Self {
            statuses: statuses.into_iter().collect(),
        }
    }

    /// Also treats `status` as transient.
    #[must_use]
    pub fn with(mut self, status: u16) -> Self {
        self.statuses.insert(status);
        self
    }

    /// Treats `status` as not transient (a 4xx or 5xx is then permanent).
    #[must_use]
    pub fn without(mut self, status: u16) -> Self {
        self.statuses.remove(&status);
        self
    }

    /// True when `status` is in the list.
    pub fn contains(&self, status: u16) -> bool {
        self.statuses.contains(&status)
    }
}

/// Classifies a failed HTTP response by its status: a status in `transient` is transient; any
/// other 4xx or 5xx is permanent; anything else (a 1xx–3xx the caller treats as a failure, or a
/// non-standard code) is unclassified and so transient.
pub fn classify_http_status(status: u16, transient: &TransientStatuses) -> HandlerErrorKind {
    if transient.contains(status) {
        HandlerErrorKind::Transient
    } else if (400..=599).contains(&status) {
        HandlerErrorKind::Permanent
    } else {
        HandlerErrorKind::Transient
    }
}

/// As [`classify_http_status`], and a transient status that came with a `Retry-After` delay
/// becomes [`HandlerErrorKind::RetryAfter`] (the delay overrides the backoff). A permanent
/// status stays permanent whatever its `Retry-After`.
pub fn classify_http_response(
    status: u16,
    retry_after: Option<Duration>,
    transient: &TransientStatuses,
) -> HandlerErrorKind {
    match (classify_http_status(status, transient), retry_after) {
        (HandlerErrorKind::Transient, Some(delay)) => HandlerErrorKind::RetryAfter(delay),
        (kind, _) => kind,
    }
}

/// Classifies a failure to reach a server (no response): walks the error and its `source()`
/// chain (HTTP clients wrap the socket's [`std::io::Error`]) and returns
///
/// - permanent for I/O errors retrying cannot fix: `InvalidInput` (a malformed address or
///   request), `PermissionDenied`, `Unsupported`;
/// - the HTTP rules for a watukuy [`Error::Http`] found in the chain (see [`classify_error`]);
/// - transient for everything else: refused, reset, aborted, timed out, unreachable, DNS
///   failures and unrecognised errors (unclassified errors are transient).
pub fn classify_network_error(error: &(dyn std::error::Error + 'static)) -> HandlerErrorKind {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = current {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return match io.kind() {
                ErrorKind::InvalidInput | ErrorKind::PermissionDenied | ErrorKind::Unsupported => {
                    HandlerErrorKind::Permanent
                }
                _ => HandlerErrorKind::Transient,
            };
        }
        if let Some(watukuy) = e.downcast_ref::<Error>()
            && matches!(watukuy, Error::Http { .. })
        {
            return classify_error(watukuy, &TransientStatuses::default());
        }
        current = e.source();
    }
    HandlerErrorKind::Transient
}

/// Classifies a watukuy [`Error`] met inside a handler (e.g. from `ctx.http`-style calls or a
/// store): an HTTP error by its status and `Retry-After` (no status, i.e. no response:
/// transient); any other error transient when [`Error::is_transient`] says so, else permanent.
pub fn classify_error(error: &Error, transient: &TransientStatuses) -> HandlerErrorKind {
    match error {
        Error::Http {
            status: Some(status),
            retry_after_ms,
            ..
        } => classify_http_response(*status, retry_after_ms.map(ms_duration), transient),
        Error::Http { status: None, .. } => HandlerErrorKind::Transient,
        other if other.is_transient() => HandlerErrorKind::Transient,
        _ => HandlerErrorKind::Permanent,
    }
}

impl HandlerError {
    /// A network failure, classified with [`classify_network_error`].
    pub fn network(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        let kind = classify_network_error(&error);
        Self::new(kind, error)
    }

    /// A failed HTTP response, classified with [`classify_http_response`] (default transient
    /// statuses).
    pub fn http_status(
        status: u16,
        retry_after: Option<Duration>,
        error: impl Into<crate::error::BoxError>,
    ) -> Self {
        let kind = classify_http_response(status, retry_after, &TransientStatuses::default());
        Self::new(kind, error)
    }

    /// A watukuy error, classified with [`classify_error`] (default transient statuses).
    pub fn classified(error: Error) -> Self {
        let kind = classify_error(&error, &TransientStatuses::default());
        Self::new(kind, error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_follow_the_default_list() {
        let t = TransientStatuses::default();
        for status in [408, 429, 500, 502, 503, 504, 599] {
            assert_eq!(
                classify_http_status(status, &t),
                HandlerErrorKind::Transient,
                "{status}"
            );
        }
        for status in [400, 401, 403, 404, 409, 410, 422, 499] {
            assert_eq!(
                classify_http_status(status, &t),
                HandlerErrorKind::Permanent,
                "{status}"
            );
        }
        assert_eq!(classify_http_status(302, &t), HandlerErrorKind::Transient);
        assert_eq!(classify_http_status(999, &t), HandlerErrorKind::Transient);
    }

    #[test]
    fn the_list_is_configurable() {
        let t = TransientStatuses::default().with(409).without(501);
        assert_eq!(classify_http_status(409, &t), HandlerErrorKind::Transient);
        assert_eq!(classify_http_status(501, &t), HandlerErrorKind::Permanent);
        let none = TransientStatuses::none();
        assert_eq!(
            classify_http_status(503, &none),
            HandlerErrorKind::Permanent
        );
        let only = TransientStatuses::only([404]);
        assert_eq!(
            classify_http_status(404, &only),
            HandlerErrorKind::Transient
        );
        assert_eq!(
            classify_http_status(500, &only),
            HandlerErrorKind::Permanent
        );
    }

    #[test]
    fn retry_after_only_overrides_transient_statuses() {
        let t = TransientStatuses::default();
        let d = Duration::from_millis(1_500);
        assert_eq!(
            classify_http_response(503, Some(d), &t),
            HandlerErrorKind::RetryAfter(d)
        );
        assert_eq!(
            classify_http_response(400, Some(d), &t),
            HandlerErrorKind::Permanent
        );
        assert_eq!(
            classify_http_response(500, None, &t),
            HandlerErrorKind::Transient
        );
    }

    #[derive(Debug)]
    struct Wrapped(std::io::Error);

    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("request failed")
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn network_errors_are_classified_through_the_source_chain() {
        let refused = Wrapped(std::io::Error::from(ErrorKind::ConnectionRefused));
        assert_eq!(
            classify_network_error(&refused),
            HandlerErrorKind::Transient
        );
        let timed_out = std::io::Error::from(ErrorKind::TimedOut);
        assert_eq!(
            classify_network_error(&timed_out),
            HandlerErrorKind::Transient
        );
        let bad_address = Wrapped(std::io::Error::from(ErrorKind::InvalidInput));
        assert_eq!(
            classify_network_error(&bad_address),
            HandlerErrorKind::Permanent
        );
        let unknown = std::fmt::Error;
        assert_eq!(
            classify_network_error(&unknown),
            HandlerErrorKind::Transient
        );
        assert_eq!(
            HandlerError::network(std::io::Error::from(ErrorKind::PermissionDenied)).kind(),
            &HandlerErrorKind::Permanent
        );
    }

    #[test]
    fn watukuy_errors_use_the_status_and_retry_after() {
        let http = |status: Option<u16>, retry_after_ms: Option<i64>| Error::Http {
            method: "POST".into(),
            url: "https://example.test/hook".into(),
            status,
            message: None,
            retry_after_ms,
        };
        let t = TransientStatuses::default();
        assert_eq!(
            classify_error(&http(Some(429), Some(2_000)), &t),
            HandlerErrorKind::RetryAfter(Duration::from_secs(2))
        );
        assert_eq!(
            classify_error(&http(Some(404), None), &t),
            HandlerErrorKind::Permanent
        );
        assert_eq!(
            classify_error(&http(None, None), &t),
            HandlerErrorKind::Transient
        );
        assert_eq!(
            classify_error(&Error::config("x", "y"), &t),
            HandlerErrorKind::Permanent
        );
        assert_eq!(
            HandlerError::classified(http(Some(502), None)).kind(),
            &HandlerErrorKind::Transient
        );
        assert_eq!(
            classify_network_error(&http(Some(410), None)),
            HandlerErrorKind::Permanent
        );
    }
}
