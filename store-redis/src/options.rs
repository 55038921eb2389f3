//! [`RedisOptions`]: the key prefix and how [`RedisStore::connect`](crate::RedisStore::connect)
//! talks to the server.

use std::time::Duration;

use watukuy_core::{Error, Result};

/// The longest prefix accepted, in bytes.
const MAX_PREFIX: usize = 256;

/// Options of a [`RedisStore`](crate::RedisStore) and a
/// [`RedisBudgetStore`](crate::RedisBudgetStore).
///
/// The prefix is validated when a store is built: it must not be empty, must be at most 256 bytes
/// and must not contain whitespace, control characters, `{`, `}` (they would change which part
/// of a key is its cluster hash tag) or the glob characters `*`, `?`, `[`, `]`, `\` (so
/// [`purge`](crate::RedisStore::purge) can match it literally). Anything else is an
/// [`Error::Config`] naming the option.
///
/// ```
/// use std::time::Duration;
/// use watukuy_store_redis::RedisOptions;
///
/// let options = RedisOptions::default()
///     .prefix("billing:watukuy:")
///     .response_timeout(Duration::from_secs(2));
/// assert!(options.validate().is_ok());
/// assert_eq!(options.get_prefix(), "billing:watukuy:");
///
/// // A brace would move the cluster hash tag of every key.
/// let err = RedisOptions::default().prefix("app{1}:").validate().unwrap_err();
/// assert_eq!(err.code(), watukuy_core::ErrorCode::Config);
/// assert!(err.to_string().contains("redis.prefix"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisOptions {
    pub(crate) prefix: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) reconnect_attempts: usize,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            prefix: "watukuy:".to_owned(),
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(10),
            reconnect_attempts: 6,
        }
    }
}

impl RedisOptions {
    /// The prefix of every key the store writes (default `watukuy:`). Stores with different
    /// prefixes share a database without seeing each other; no prefix should be the start of
    /// another (`app:` and `app:x:`), or [`purge`](crate::RedisStore::purge) of the shorter one
    /// would reach the longer one's keys.
    #[must_use]
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long [`connect`](crate::RedisStore::connect) and every reconnection wait for the
    /// server to accept a connection (default 5 s, more than zero).
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long a command waits for its reply before failing with a transient `Timeout` store
    /// error (default 10 s, more than zero). A write that timed out may still have been applied:
    /// every write of the store is safe to repeat, and a fenced one is still fenced.
    #[must_use]
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// How many times a lost connection is re-established (with exponential backoff) before
    /// the waiting calls fail with a transient `Connection` error (default 6; 0 tries once). The
    /// next call after such a failure starts reconnecting again.
    #[must_use]
    pub fn reconnect_attempts(mut self, attempts: usize) -> Self {
        self.reconnect_attempts = attempts;
        self
    }

    /// The key prefix.
    pub fn get_prefix(&self) -> &str {
        &self.prefix
    }

    /// Checks every option, failing with an [`Error::Config`] that names the first bad one
    /// (`redis.prefix`, `redis.connect_timeout`, `redis.response_timeout`).
    pub fn validate(&self) -> Result<()> {
        check_prefix(&self.prefix)?;
        if self.connect_timeout.is_zero() {
            return Err(Error::config(
                "redis.connect_timeout",
                "must be more than zero",
            ));
        }
        if self.response_timeout.is_zero() {
            return Err(Error::config(
                "redis.response_timeout",
                "must be more than zero",
            ));
        }
        Ok(())
    }
}

fn check_prefix(prefix: &str) -> Result<()> {
    const OPTION: &str = "redis.prefix";
    if prefix.is_empty() {
        return Err(Error::config(
            OPTION,
            "must not be empty: it keeps watukuy's keys apart from everything else in the database",
        ));
    }
    if prefix.len() > MAX_PREFIX {
        return Err(Error::config(
            OPTION,
            format!("must be at most {MAX_PREFIX} bytes, got {}", prefix.len()),
        ));
    }
    if let Some(bad) = prefix.chars().find(|c| {
        c.is_whitespace() || c.is_control() || matches!(c, '{' | '}' | '*' | '?' | '[' | ']' | '\\')
    }) {
        return Err(Error::config(
            OPTION,
            format!(
                "{prefix:?} contains {bad:?}: braces would change the cluster hash tag of every key, \
                 glob characters and whitespace are not allowed"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn option_of(err: Error) -> String {
        match err {
            Error::Config { option, .. } => option,
            other => panic!("expected a Config error, got {other}"),
        }
    }

    #[test]
    fn defaults_are_valid() {
        let options = RedisOptions::default();
        assert!(options.validate().is_ok());
        assert_eq!(options.get_prefix(), "watukuy:");
    }

    #[test]
    fn accepts_ordinary_prefixes() {
        for prefix in [
            "w",
            "app:watukuy:",
            "wk:123:4:leases.acquire:",
            "ñandú/ü-1",
            &"p".repeat(256),
        ] {
            assert!(
                RedisOptions::default().prefix(prefix).validate().is_ok(),
                "{prefix:?}"
            );
        }
    }

    #[test]
    fn rejects_bad_prefixes_naming_the_option() {
        for prefix in [
            "",
            "a{b",
            "a}b",
            "a*",
            "a?",
            "a[1]",
            "a\\b",
            "a b",
            "a\nb",
            "a\u{0}",
            &"p".repeat(257),
        ] {
            let err = RedisOptions::default()
                .prefix(prefix)
                .validate()
                .unwrap_err();
            assert_eq!(option_of(err), "redis.prefix", "{prefix:?}");
        }
    }

    #[test]
    fn rejects_zero_timeouts() {
        let err = RedisOptions::default()
            .connect_timeout(Duration::ZERO)
            .validate()
            .unwrap_err();
        assert_eq!(option_of(err), "redis.connect_timeout");
        let err = RedisOptions::default()
            .response_timeout(Duration::ZERO)
            .validate()
            .unwrap_err();
        assert_eq!(option_of(err), "redis.response_timeout");
        assert!(
            RedisOptions::default()
                .reconnect_attempts(0)
                .validate()
                .is_ok()
        );
    }
}
