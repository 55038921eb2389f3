//! [`RedisOptions`]: the key prefix, how [`RedisStore::connect`](crate::RedisStore::connect)
//! talks to the server (timeouts, reconnection, TLS) and how durable a fenced write is (`WAIT`).

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
    pub(crate) tls: TlsOptions,
    pub(crate) wait: Option<WaitReplicas>,
}

/// What a `rediss://` connection trusts, and the client certificate it shows.
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct TlsOptions {
    /// PEM certificates of the authorities to trust instead of the system's.
    pub(crate) ca_pem: Option<Vec<u8>>,
    /// PEM certificate chain and private key for mutual TLS.
    pub(crate) client_pem: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the private key.
        f.debug_struct("TlsOptions")
            .field("ca", &self.ca_pem.as_ref().map(|_| "<pem>"))
            .field("client_auth", &self.client_pem.is_some())
            .finish()
    }
}

/// `WAIT <replicas> <timeout>` after every fenced write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WaitReplicas {
    pub(crate) replicas: usize,
    pub(crate) timeout: Duration,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            prefix: "watukuy:".to_owned(),
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(10),
            reconnect_attempts: 6,
            tls: TlsOptions::default(),
            wait: None,
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

    /// The certificate authorities a `rediss://` connection trusts, as PEM text (one or more
    /// `CERTIFICATE` blocks), instead of the system's roots. Only used by
    /// [`connect`](crate::RedisStore::connect) and
    /// [`connect_cluster`](crate::RedisStore::connect_cluster) with a TLS URL (the `tls` feature,
    /// on by default). Text without a certificate is an [`Error::Config`] naming `redis.tls_ca`.
    #[must_use]
    pub fn tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.ca_pem = Some(pem.into());
        self
    }

    /// A client certificate (chain) and its private key, both PEM, for servers that require
    /// mutual TLS (`tls-auth-clients yes`). Checked like [`tls_ca_pem`](Self::tls_ca_pem)
    /// (`redis.tls_client_cert`, `redis.tls_client_key`); never printed by `Debug`.
    #[must_use]
    pub fn tls_client_auth(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client_pem = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// Makes fenced writes durable across a failover: after every fenced write (`commit_poll`,
    /// `save_state`, `ack_events`, `record_attempt`, `park_event`) and every lease acquisition,
    /// the store sends `WAIT <replicas> <timeout>` on the same connection, in the same round trip,
    /// and fails the call with a transient `Timeout` store error when fewer than `replicas`
    /// replicas acknowledged the write in time. The write itself stays applied on the primary
    /// (repeating it is safe, as for any timed-out write): the error only says it may not survive
    /// a failover yet, so the engine retries instead of delivering on top of it.
    ///
    /// Off by default: Redis replicates asynchronously, so without it a failover can lose the
    /// writes of the last moments before it (committed pages and their events, acks, leases);
    /// see the crate documentation. `replicas` must be at least 1 and the timeout more than zero
    /// (`redis.wait_replicas`); a `WAIT` with fewer replicas attached than asked fails every
    /// fenced write, so ask for no more than each primary has.
    #[must_use]
    pub fn wait_replicas(mut self, replicas: usize, timeout: Duration) -> Self {
        self.wait = Some(WaitReplicas { replicas, timeout });
        self
    }

    /// The key prefix.
    pub fn get_prefix(&self) -> &str {
        &self.prefix
    }

    /// Checks every option, failing with an [`Error::Config`] that names the first bad one
    /// (`redis.prefix`, `redis.connect_timeout`, `redis.response_timeout`, `redis.tls_ca`,
    /// `redis.tls_client_cert`, `redis.tls_client_key`, `redis.wait_replicas`).
    pub fn validate(&self) -> Result<()> {
        check_prefix(&self.prefix)?;
        check_tls(&self.tls)?;
        if let Some(wait) = self.wait {
            if wait.replicas == 0 {
                return Err(Error::config(
                    "redis.wait_replicas",
                    "must ask for at least 1 replica (leave the option off for none)",
                ));
            }
            if wait.timeout.is_zero() {
                return Err(Error::config(
                    "redis.wait_replicas",
                    "the timeout must be more than zero (WAIT 0 would block forever)",
                ));
            }
        }
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

/// Every PEM block of `pem` labelled `CERTIFICATE`, or a `Config` error naming `option`.
#[cfg(feature = "tls")]
fn certificates(option: &str, pem: &[u8]) -> Result<usize> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut n = 0;
    for cert in CertificateDer::pem_slice_iter(pem) {
        cert.map_err(|e| Error::config(option, format!("not readable PEM: {e}")))?;
        n += 1;
    }
    if n == 0 {
        return Err(Error::config(
            option,
            "holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
        ));
    }
    Ok(n)
}

#[cfg(feature = "tls")]
fn check_tls(tls: &TlsOptions) -> Result<()> {
    use rustls::pki_types::PrivateKeyDer;
    use rustls::pki_types::pem::PemObject;
    if let Some(pem) = &tls.ca_pem {
        certificates("redis.tls_ca", pem)?;
    }
    if let Some((cert, key)) = &tls.client_pem {
        certificates("redis.tls_client_cert", cert)?;
        PrivateKeyDer::from_pem_slice(key).map_err(|e| {
            Error::config(
                "redis.tls_client_key",
                format!("holds no readable PEM private key: {e}"),
            )
        })?;
    }
    Ok(())
}

#[cfg(not(feature = "tls"))]
fn check_tls(tls: &TlsOptions) -> Result<()> {
    if tls.ca_pem.is_some() || tls.client_pem.is_some() {
        return Err(Error::config(
            "redis.tls_ca",
            "TLS is not compiled in: enable the `tls` feature of watukuy-store-redis",
        ));
    }
    Ok(())
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
            assert_eq!(err.config_option(), Some("redis.prefix"), "{prefix:?}");
        }
    }

    #[test]
    fn rejects_zero_timeouts() {
        let err = RedisOptions::default()
            .connect_timeout(Duration::ZERO)
            .validate()
            .unwrap_err();
        assert_eq!(err.config_option(), Some("redis.connect_timeout"));
        let err = RedisOptions::default()
            .response_timeout(Duration::ZERO)
            .validate()
            .unwrap_err();
        assert_eq!(err.config_option(), Some("redis.response_timeout"));
        assert!(
            RedisOptions::default()
                .reconnect_attempts(0)
                .validate()
                .is_ok()
        );
    }
}
