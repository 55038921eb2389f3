//! Redaction of secret headers in logs and spans.

use std::fmt;

use reqwest::header::HeaderMap;

/// The headers whose values never appear in logs or spans (compared case-insensitively).
pub const REDACTED_HEADERS: [&str; 5] = [
    "authorization",
    "cookie",
    "set-cookie",
    "x-api-key",
    "proxy-authorization",
];

/// What a redacted value is replaced with.
pub const REDACTED: &str = "***";

/// Decides which header values are secret: [`REDACTED_HEADERS`] plus configured extras.
#[derive(Clone, Debug, Default)]
pub struct Redactor {
    extra: Vec<String>,
}

impl Redactor {
    /// The default list plus `extra` header names.
    pub fn with_extra<I, S>(extra: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self {
            extra: extra
                .into_iter()
                .map(|name| name.as_ref().trim().to_ascii_lowercase())
                .collect(),
        }
    }

    /// Whether the value of header `name` is secret.
    pub fn is_secret(&self, name: &str) -> bool {
        REDACTED_HEADERS
            .iter()
            .any(|secret| secret.eq_ignore_ascii_case(name))
            || self.extra.iter().any(|e| e.eq_ignore_ascii_case(name))
    }

    /// A view of `headers` that displays secret values as [`REDACTED`].
    pub fn headers<'a>(&'a self, headers: &'a HeaderMap) -> RedactedHeaders<'a> {
        RedactedHeaders {
            headers,
            redactor: self,
        }
    }

    /// The value of one header as it may be logged.
    pub fn value<'a>(&self, name: &str, value: &'a str) -> &'a str {
        if self.is_secret(name) {
            REDACTED
        } else {
            value
        }
    }
}

/// Headers as they may be logged: `{name: value, authorization: ***}`. Values that are not
/// visible ASCII are shown as `<binary>`.
pub struct RedactedHeaders<'a> {
    headers: &'a HeaderMap,
    redactor: &'a Redactor,
}

impl fmt::Display for RedactedHeaders<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        for (i, (name, value)) in self.headers.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            let shown = if self.redactor.is_secret(name.as_str()) {
                REDACTED
            } else {
                value.to_str().unwrap_or("<binary>")
            };
            write!(f, "{name}: {shown}")?;
        }
        f.write_str("}")
    }
}

impl fmt::Debug for RedactedHeaders<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// `headers` as they may be logged, with the default [`REDACTED_HEADERS`].
///
/// ```
/// use watukuy_http::header::{HeaderMap, HeaderValue, AUTHORIZATION, ACCEPT};
/// use watukuy_http::redact_headers;
///
/// let mut headers = HeaderMap::new();
/// headers.insert(AUTHORIZATION, HeaderValue::from_static("Bearer s3cr3t"));
/// headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
/// let shown = redact_headers(&headers).to_string();
/// assert_eq!(shown, "{authorization: ***, accept: application/json}");
/// ```
pub fn redact_headers(headers: &HeaderMap) -> RedactedHeaders<'_> {
    static DEFAULT: Redactor = Redactor { extra: Vec::new() };
    DEFAULT.headers(headers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::{HeaderName, HeaderValue};

    #[test]
    fn secrets_are_redacted_case_insensitively() {
        let redactor = Redactor::with_extra(["X-Secret-Token"]);
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("Authorization", "Bearer a1"),
            ("Cookie", "sid=a2"),
            ("Set-Cookie", "sid=a3"),
            ("X-API-Key", "a4"),
            ("Proxy-Authorization", "Basic a5"),
            ("x-secret-token", "a6"),
            ("accept", "application/json"),
        ] {
            headers.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        headers.append("x-bin", HeaderValue::from_bytes(b"\xff").unwrap());
        let shown = redactor.headers(&headers).to_string();
        for secret in ["a1", "a2", "a3", "a4", "a5", "a6"] {
            assert!(!shown.contains(secret), "{secret} leaked: {shown}");
        }
        assert!(shown.contains("accept: application/json"));
        assert!(shown.contains("x-bin: <binary>"));
        assert_eq!(shown.matches(REDACTED).count(), 6);
        assert!(redactor.is_secret("AUTHORIZATION"));
        assert_eq!(redactor.value("Cookie", "c"), REDACTED);
        assert_eq!(redactor.value("accept", "c"), "c");
        assert!(!Redactor::default().is_secret("x-secret-token"));
    }
}
