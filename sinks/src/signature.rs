//! Standard Webhooks signatures: `v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}.{body}")>`.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

type HmacSha256 = Hmac<Sha256>;

/// The prefix of a base64-encoded Standard Webhooks secret (`whsec_<base64>`).
pub const WEBHOOK_SECRET_PREFIX: &str = "whsec_";

/// How far a webhook timestamp may be from the receiver's clock, either way: 5 minutes.
pub const DEFAULT_WEBHOOK_TOLERANCE: Duration = Duration::from_secs(300);

/// The signature scheme this crate signs with and verifies (symmetric HMAC-SHA256).
const SCHEME: &str = "v1";

/// Why a webhook secret is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WebhookSecretError {
    /// The secret (or the key it decodes to) is empty.
    #[error("the webhook secret is empty")]
    Empty,
    /// A `whsec_` secret whose remainder is not valid base64.
    #[error(
        "the webhook secret starts with {WEBHOOK_SECRET_PREFIX:?} but the rest is not base64: {0}"
    )]
    InvalidBase64(String),
}

/// An HMAC key for signing or verifying webhooks. Its `Debug` output never shows the key.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookSecret(Arc<[u8]>);

impl WebhookSecret {
    /// Decodes a secret as [`decode_webhook_secret`] does.
    pub fn new(secret: &str) -> Result<Self, WebhookSecretError> {
        decode_webhook_secret(secret).map(|key| Self(key.into()))
    }

    /// A secret from raw key bytes (which must not be empty).
    pub fn from_bytes(key: impl Into<Vec<u8>>) -> Result<Self, WebhookSecretError> {
        let key = key.into();
        if key.is_empty() {
            return Err(WebhookSecretError::Empty);
        }
        Ok(Self(key.into()))
    }

    /// The HMAC key.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    fn mac(&self, id: &str, timestamp: &str, body: &[u8]) -> HmacSha256 {
        // HMAC takes keys of any length, so `new_from_slice` cannot fail; the fallback (an empty
        // key) is unreachable and a `WebhookSecret` is never empty anyway.
        let mut mac = HmacSha256::new_from_slice(&self.0)
            .unwrap_or_else(|_| <HmacSha256 as Mac>::new(&Default::default()));
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.as_bytes());
        mac.update(b".");
        mac.update(body);
        mac
    }
}

impl fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WebhookSecret(<redacted>)")
    }
}

impl FromStr for WebhookSecret {
    type Err = WebhookSecretError;

    fn from_str(secret: &str) -> Result<Self, Self::Err> {
        Self::new(secret)
    }
}

/// The HMAC key a secret stands for: the base64-decoded remainder of a `whsec_<base64>` secret,
/// or the UTF-8 bytes of any other string. An empty key is refused.
pub fn decode_webhook_secret(secret: &str) -> Result<Vec<u8>, WebhookSecretError> {
    let key = match secret.strip_prefix(WEBHOOK_SECRET_PREFIX) {
        Some(encoded) => BASE64
            .decode(encoded)
            .map_err(|e| WebhookSecretError::InvalidBase64(e.to_string()))?,
        None => secret.as_bytes().to_vec(),
    };
    if key.is_empty() {
        return Err(WebhookSecretError::Empty);
    }
    Ok(key)
}

/// The `webhook-signature` header value for a message: `v1,<base64 HMAC-SHA256>` over
/// `"{id}.{timestamp}.{body}"`, with `timestamp` in unix seconds.
pub fn sign_webhook(secret: &WebhookSecret, id: &str, timestamp: i64, body: &[u8]) -> String {
    let tag = secret
        .mac(id, &timestamp.to_string(), body)
        .finalize()
        .into_bytes();
    format!("{SCHEME},{}", BASE64.encode(tag))
}

/// Why a received webhook failed verification.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WebhookVerifyError {
    /// The `webhook-timestamp` header is not an integer count of unix seconds.
    #[error("the webhook timestamp {0:?} is not unix seconds")]
    InvalidTimestamp(String),
    /// The timestamp is older than the tolerance allows (a replay, or a very late delivery).
    #[error("the webhook timestamp {timestamp} is more than {tolerance_secs} s before now ({now})")]
    TimestampTooOld {
        /// The message's timestamp (unix seconds).
        timestamp: i64,
        /// The receiver's time (unix seconds).
        now: i64,
        /// The tolerance, in seconds.
        tolerance_secs: u64,
    },
    /// The timestamp is further in the future than the tolerance allows.
    #[error("the webhook timestamp {timestamp} is more than {tolerance_secs} s after now ({now})")]
    TimestampTooNew {
        /// The message's timestamp (unix seconds).
        timestamp: i64,
        /// The receiver's time (unix seconds).
        now: i64,
        /// The tolerance, in seconds.
        tolerance_secs: u64,
    },
    /// The signature header holds no `v1,` signature.
    #[error("the webhook-signature header holds no v1 signature")]
    NoSignature,
    /// No `v1,` signature in the header matches the message.
    #[error("no webhook signature matches the message")]
    SignatureMismatch,
}

/// Verifies a received webhook with the [`DEFAULT_WEBHOOK_TOLERANCE`] (see
/// [`verify_webhook_signature_with_tolerance`]).
///
/// `id`, `timestamp` and `signature_header` are the `webhook-id`, `webhook-timestamp` and
/// `webhook-signature` header values; `body` is the raw request body, byte for byte; `now_secs`
/// is the receiver's time in unix seconds (e.g. `SystemClock.now_ms() / 1000`).
pub fn verify_webhook_signature(
    secret: &WebhookSecret,
    id: &str,
    timestamp: &str,
    body: &[u8],
    signature_header: &str,
    now_secs: i64,
) -> Result<(), WebhookVerifyError> {
    verify_webhook_signature_with_tolerance(
        secret,
        id,
        timestamp,
        body,
        signature_header,
        now_secs,
        DEFAULT_WEBHOOK_TOLERANCE,
    )
}

/// Verifies a received webhook: the timestamp must lie within `tolerance` of `now_secs` (either
/// way), then at least one of the space-separated `v1,<base64>` entries of `signature_header`
/// must match, compared in constant time. Entries of other schemes are ignored, which lets a
/// sender rotate secrets by sending several signatures.
pub fn verify_webhook_signature_with_tolerance(
    secret: &WebhookSecret,
    id: &str,
    timestamp: &str,
    body: &[u8],
    signature_header: &str,
    now_secs: i64,
    tolerance: Duration,
) -> Result<(), WebhookVerifyError> {
    let ts: i64 = timestamp
        .parse()
        .map_err(|_| WebhookVerifyError::InvalidTimestamp(timestamp.to_owned()))?;
    let tolerance_secs = tolerance.as_secs();
    let allowed = i64::try_from(tolerance_secs).unwrap_or(i64::MAX);
    if now_secs.saturating_sub(ts) > allowed {
        return Err(WebhookVerifyError::TimestampTooOld {
            timestamp: ts,
            now: now_secs,
            tolerance_secs,
        });
    }
    if ts.saturating_sub(now_secs) > allowed {
        return Err(WebhookVerifyError::TimestampTooNew {
            timestamp: ts,
            now: now_secs,
            tolerance_secs,
        });
    }
    // Sign the timestamp exactly as received: the sender signed its own text.
    let expected = secret.mac(id, timestamp, body).finalize().into_bytes();
    let mut candidates = 0_usize;
    let mut matched = false;
    for entry in signature_header.split(' ').filter(|e| !e.is_empty()) {
        let Some((scheme, encoded)) = entry.split_once(',') else {
            continue;
        };
        if scheme != SCHEME {
            continue;
        }
        candidates += 1;
        let Ok(candidate) = BASE64.decode(encoded) else {
            continue;
        };
        // `ct_eq` compares equal-length slices in constant time (lengths are not secret).
        if bool::from(candidate.as_slice().ct_eq(expected.as_slice())) {
            matched = true;
        }
    }
    if matched {
        Ok(())
    } else if candidates == 0 {
        Err(WebhookVerifyError::NoSignature)
    } else {
        Err(WebhookVerifyError::SignatureMismatch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_both_secret_forms() {
        assert_eq!(
            decode_webhook_secret("whsec_c2VjcmV0").unwrap(),
            b"secret".to_vec()
        );
        assert_eq!(
            decode_webhook_secret("plain-secret").unwrap(),
            b"plain-secret".to_vec()
        );
        assert!(matches!(
            decode_webhook_secret("whsec_not base64!"),
            Err(WebhookSecretError::InvalidBase64(_))
        ));
        assert_eq!(decode_webhook_secret(""), Err(WebhookSecretError::Empty));
        assert_eq!(
            decode_webhook_secret("whsec_"),
            Err(WebhookSecretError::Empty)
        );
        assert_eq!(
            format!("{:?}", WebhookSecret::new("whsec_c2VjcmV0").unwrap()),
            "WebhookSecret(<redacted>)"
        );
    }
}
