//! The webhook sink: POSTs each event, signed per Standard Webhooks.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use reqwest::{StatusCode, Url};
use rustls_platform_verifier::BuilderVerifierExt as _;
use watukuy_core::clock::{duration_ms, ms_duration};
use watukuy_core::{
    Event, HandlerContext, HandlerError, HandlerResult,
    clock::{Clock, SystemClock},
    delivery::Handler,
};

use crate::format::{EventFormat, serialize_event};
use crate::signature::{WebhookSecret, WebhookSecretError, sign_webhook};

/// How long one webhook request may take, body included: 10 seconds.
pub const DEFAULT_WEBHOOK_TIMEOUT: Duration = Duration::from_secs(10);

/// At most this many characters of an error response's body are kept in a
/// [`WebhookDeliveryError`].
pub const MAX_WEBHOOK_ERROR_BODY_CHARS: usize = 4096;

/// The header carrying the event id (stable across retries, so receivers can deduplicate).
pub const WEBHOOK_ID_HEADER: &str = "webhook-id";

/// The header carrying the signing time in unix seconds.
pub const WEBHOOK_TIMESTAMP_HEADER: &str = "webhook-timestamp";

/// The header carrying the `v1,<base64>` signature.
pub const WEBHOOK_SIGNATURE_HEADER: &str = "webhook-signature";

/// What a [`WebhookSink`] is built from. Only the URL and the secret are required.
#[derive(Clone)]
pub struct WebhookOptions {
    url: String,
    secret: String,
    headers: Vec<(String, String)>,
    format: EventFormat,
    timeout: Duration,
    success_statuses: Option<Vec<u16>>,
    clock: Arc<dyn Clock>,
    client: Option<reqwest::Client>,
}

impl fmt::Debug for WebhookOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookOptions")
            .field("url", &self.url)
            .field("secret", &"<redacted>")
            .field("headers", &self.headers)
            .field("format", &self.format)
            .field("timeout", &self.timeout)
            .field("success_statuses", &self.success_statuses)
            .finish_non_exhaustive()
    }
}

impl WebhookOptions {
    /// POST to `url` (http or https), signing with `secret`: `whsec_<base64>` (the Standard
    /// Webhooks form) or any other string, used as raw UTF-8 key bytes.
    pub fn new(url: impl Into<String>, secret: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            secret: secret.into(),
            headers: Vec::new(),
            format: EventFormat::default(),
            timeout: DEFAULT_WEBHOOK_TIMEOUT,
            success_statuses: None,
            clock: Arc::new(SystemClock),
            client: None,
        }
    }

    /// Adds a header to every request (e.g. `authorization`). `content-type` and the
    /// `webhook-*` headers are the sink's own and cannot be set.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The body format: CloudEvents (the default) or the raw event.
    pub fn format(mut self, format: EventFormat) -> Self {
        self.format = format;
        self
    }

    /// How long one request may take, reading the response included (default 10 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The statuses that count as delivered (default: any 2xx).
    pub fn success_statuses(mut self, statuses: impl IntoIterator<Item = u16>) -> Self {
        self.success_statuses = Some(statuses.into_iter().collect());
        self
    }

    /// The clock the `webhook-timestamp` is read from (default [`SystemClock`]).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Sends through this client instead of the sink's own (rustls on ring with the platform's
    /// certificate verifier, no redirects followed). The per-request timeout still applies.
    pub fn client(mut self, client: reqwest::Client) -> Self {
        self.client = Some(client);
        self
    }
}

/// Why a [`WebhookSink`] could not be built.
#[derive(Debug, thiserror::Error)]
pub enum WebhookConfigError {
    /// The URL does not parse, or is not http(s).
    #[error("invalid webhook url {url:?}: {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The secret is unusable.
    #[error(transparent)]
    Secret(#[from] WebhookSecretError),
    /// A configured header is malformed or reserved.
    #[error("invalid webhook header {name:?}: {reason}")]
    InvalidHeader {
        /// The header's name as given.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `success_statuses` was given no status.
    #[error("success_statuses is empty: no response could count as delivered")]
    NoSuccessStatus,
    /// The HTTP client (or its TLS configuration) could not be built.
    #[error("cannot build the webhook HTTP client: {0}")]
    Client(String),
}

/// A webhook answered with a status that is not a success.
///
/// Returned (inside a [`HandlerError`]) so the dispatcher retries or parks the event: 408, 429
/// and 5xx are transient (429 and 503 with a `Retry-After` say when to retry), any other 4xx is
/// permanent, anything else transient.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("webhook {url} answered {status}{}", fmt_body(.body_text))]
pub struct WebhookDeliveryError {
    /// The response status.
    pub status: u16,
    /// The URL posted to.
    pub url: String,
    /// The start of the response body (at most [`MAX_WEBHOOK_ERROR_BODY_CHARS`] characters, lossy
    /// UTF-8).
    pub body_text: String,
    /// The delay a 429 or 503 asked for in `Retry-After`.
    pub retry_after: Option<Duration>,
}

fn fmt_body(body: &str) -> String {
    if body.is_empty() {
        String::new()
    } else {
        format!(": {body}")
    }
}

impl WebhookDeliveryError {
    /// Whether this is a throttle: 429, or 503 with a `Retry-After`.
    pub fn is_throttle(&self) -> bool {
        self.status == 429 || (self.status == 503 && self.retry_after.is_some())
    }

    /// Whether retrying could help: 408, 429, 5xx and anything outside 4xx are transient.
    pub fn is_transient(&self) -> bool {
        !(400..500).contains(&self.status) || self.status == 408 || self.status == 429
    }

    /// This failure as a classified [`HandlerError`].
    pub fn into_handler_error(self) -> HandlerError {
        match self.retry_after {
            Some(delay) if self.is_throttle() => HandlerError::retry_after(delay, self),
            _ if self.is_transient() => HandlerError::transient(self),
            _ => HandlerError::permanent(self),
        }
    }
}

/// A handler that POSTs each event to a URL, signed per Standard Webhooks.
///
/// Headers: `content-type` (`application/cloudevents+json` or `application/json`),
/// `webhook-id` = the event id, `webhook-timestamp` = unix seconds from the injected clock, and
/// `webhook-signature` = `v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}.{body}")>`. A non-success
/// status becomes a [`WebhookDeliveryError`]; network errors and timeouts are transient. The sink
/// never retries by itself: the dispatcher does. On success it calls `ctx.ack()`.
#[derive(Clone)]
pub struct WebhookSink {
    client: reqwest::Client,
    url: Url,
    secret: WebhookSecret,
    headers: HeaderMap,
    format: EventFormat,
    timeout: Duration,
    success_statuses: Option<Vec<u16>>,
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for WebhookSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookSink")
            .field("url", &self.url.as_str())
            .field("format", &self.format)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

const RESERVED_HEADERS: [&str; 4] = [
    "content-type",
    WEBHOOK_ID_HEADER,
    WEBHOOK_TIMESTAMP_HEADER,
    WEBHOOK_SIGNATURE_HEADER,
];

impl WebhookSink {
    /// Validates the options (URL, secret, headers) and builds the HTTP client.
    pub fn new(options: WebhookOptions) -> Result<Self, WebhookConfigError> {
        let url = Url::parse(&options.url).map_err(|e| WebhookConfigError::InvalidUrl {
            url: options.url.clone(),
            reason: e.to_string(),
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(WebhookConfigError::InvalidUrl {
                url: options.url,
                reason: format!("scheme {:?} is not http or https", url.scheme()),
            });
        }
        let secret = WebhookSecret::new(&options.secret)?;
        let mut headers = HeaderMap::new();
        for (name, value) in &options.headers {
            let invalid = |reason: String| WebhookConfigError::InvalidHeader {
                name: name.clone(),
                reason,
            };
            let header_name =
                HeaderName::from_bytes(name.as_bytes()).map_err(|e| invalid(e.to_string()))?;
            if RESERVED_HEADERS.contains(&header_name.as_str()) {
                return Err(invalid("set by the sink itself".to_owned()));
            }
            let header_value = HeaderValue::from_str(value).map_err(|e| invalid(e.to_string()))?;
            headers.append(header_name, header_value);
        }
        if options.success_statuses.as_ref().is_some_and(Vec::is_empty) {
            return Err(WebhookConfigError::NoSuccessStatus);
        }
        let client = match options.client {
            Some(client) => client,
            None => default_client()?,
        };
        Ok(Self {
            client,
            url,
            secret,
            headers,
            format: options.format,
            timeout: options.timeout,
            success_statuses: options.success_statuses,
            clock: options.clock,
        })
    }

    /// The URL events are posted to.
    pub fn url(&self) -> &str {
        self.url.as_str()
    }

    /// POSTs one event: `Ok` on a success status, else a classified error. Does not retry.
    pub async fn deliver(&self, event: &Event) -> Result<(), HandlerError> {
        let serialized = serialize_event(event, self.format).map_err(HandlerError::permanent)?;
        let timestamp = self.clock.now_ms().div_euclid(1000);
        let signature = sign_webhook(&self.secret, &event.id, timestamp, &serialized.body);
        let id = HeaderValue::from_str(&event.id).map_err(|e| {
            HandlerError::permanent(format!(
                "event id {:?} is not a header value: {e}",
                event.id
            ))
        })?;
        let mut headers = self.headers.clone();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static(serialized.content_type),
        );
        headers.insert(WEBHOOK_ID_HEADER, id);
        headers.insert(WEBHOOK_TIMESTAMP_HEADER, HeaderValue::from(timestamp));
        headers.insert(
            WEBHOOK_SIGNATURE_HEADER,
            HeaderValue::from_str(&signature).map_err(HandlerError::permanent)?,
        );
        let response = self
            .client
            .post(self.url.clone())
            .headers(headers)
            .body(serialized.body)
            .timeout(self.timeout)
            .send()
            .await
            .map_err(HandlerError::transient)?;
        let status = response.status();
        if self.is_success(status) {
            return Ok(());
        }
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, self.clock.now_ms()));
        let body_text = read_limited_text(response, MAX_WEBHOOK_ERROR_BODY_CHARS).await;
        Err(WebhookDeliveryError {
            status: status.as_u16(),
            url: self.url.to_string(),
            body_text,
            retry_after,
        }
        .into_handler_error())
    }

    fn is_success(&self, status: StatusCode) -> bool {
        match &self.success_statuses {
            Some(statuses) => statuses.contains(&status.as_u16()),
            None => status.is_success(),
        }
    }
}

#[async_trait]
impl Handler for WebhookSink {
    async fn handle(&self, event: Event, ctx: HandlerContext) -> HandlerResult {
        crate::send::ack_when_sent(&ctx, "webhook delivery", self.deliver(&event)).await
    }
}

/// The sink's own client: rustls on the ring provider with the platform verifier, HTTP/1.1, no
/// redirects (a redirected POST would lose its body or carry a signature elsewhere).
fn default_client() -> Result<reqwest::Client, WebhookConfigError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|builder| builder.with_platform_verifier())
        .map_err(|e| WebhookConfigError::Client(e.to_string()))?
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| WebhookConfigError::Client(e.to_string()))
}

/// Reads at most `max_chars` characters of the body (lossy UTF-8), stopping early so a huge
/// error page is not buffered whole; read errors just end the text.
async fn read_limited_text(mut response: reqwest::Response, max_chars: usize) -> String {
    let max_bytes = max_chars.saturating_mul(4);
    let mut bytes = Vec::new();
    while bytes.len() < max_bytes {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = max_bytes - bytes.len();
                bytes.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            Ok(None) | Err(_) => break,
        }
    }
    String::from_utf8_lossy(&bytes)
        .chars()
        .take(max_chars)
        .collect()
}

/// A `Retry-After` value as a delay from `now_ms`: delay-seconds, or an HTTP date (a date in the
/// past is no delay). `None` when it is neither.
pub(crate) fn parse_retry_after(value: &str, now_ms: i64) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // All digits: only an overflow fails, and an absurdly long wait is capped instead.
        return Some(Duration::from_secs(
            value.parse::<u64>().unwrap_or(u64::MAX),
        ));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    let date_ms = duration_ms(date.duration_since(UNIX_EPOCH).ok()?);
    Some(ms_duration(date_ms.saturating_sub(now_ms)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_takes_seconds_and_dates() {
        assert_eq!(parse_retry_after("120", 0), Some(Duration::from_secs(120)));
        assert_eq!(parse_retry_after(" 0 ", 0), Some(Duration::ZERO));
        // 1994-11-06T08:49:37Z is 784111777 s after the epoch.
        let date = "Sun, 06 Nov 1994 08:49:37 GMT";
        assert_eq!(
            parse_retry_after(date, 784_111_777_000 - 30_000),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_retry_after(date, 784_111_777_000 + 5_000),
            Some(Duration::ZERO),
            "a date in the past means retry now"
        );
        assert_eq!(parse_retry_after("soon", 0), None);
        assert_eq!(parse_retry_after("-5", 0), None);
        assert_eq!(parse_retry_after("", 0), None);
        assert_eq!(
            parse_retry_after("99999999999999999999999", 0),
            Some(Duration::from_secs(u64::MAX))
        );
    }

    fn error(status: u16, retry_after: Option<Duration>) -> WebhookDeliveryError {
        WebhookDeliveryError {
            status,
            url: "http://x".into(),
            body_text: String::new(),
            retry_after,
        }
    }

    #[test]
    fn statuses_are_classified() {
        use watukuy_core::delivery::HandlerErrorKind as K;
        let kind = |status, ra| error(status, ra).into_handler_error().kind().clone();
        let wait = Some(Duration::from_secs(7));
        assert_eq!(kind(404, None), K::Permanent);
        assert_eq!(kind(400, wait), K::Permanent);
        assert_eq!(kind(410, None), K::Permanent);
        assert_eq!(kind(408, None), K::Transient);
        assert_eq!(kind(429, None), K::Transient);
        assert_eq!(kind(429, wait), K::RetryAfter(Duration::from_secs(7)));
        assert_eq!(kind(503, wait), K::RetryAfter(Duration::from_secs(7)));
        assert_eq!(kind(503, None), K::Transient);
        assert_eq!(kind(500, wait), K::Transient);
        assert_eq!(kind(302, None), K::Transient);
        assert!(error(503, wait).is_throttle());
        assert!(!error(503, None).is_throttle());
    }
}
