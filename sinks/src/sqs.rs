//! The Amazon SQS sink: sends each event as a message, with `MessageDeduplicationId` = event id
//! on FIFO queues.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_sqs::config::http::HttpResponse;
use aws_sdk_sqs::config::retry::RetryConfig;
use aws_sdk_sqs::config::{BehaviorVersion, Region, SharedHttpClient};
use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::operation::send_message::SendMessageOutput;
use aws_sdk_sqs::types::MessageAttributeValue;
use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};
use watukuy_core::{Event, HandlerContext, HandlerError, HandlerResult, delivery::Handler};

use crate::format::{EventFormat, KeyFn, serialize_event};

/// How long one send waits for SQS by default: 10 seconds.
pub const DEFAULT_SQS_TIMEOUT: Duration = Duration::from_secs(10);

/// The message attribute carrying the poller's name.
pub const SQS_POLLER_ATTRIBUTE: &str = "poller";

/// The message attribute carrying the event type (`created`, `updated`, `deleted`).
pub const SQS_TYPE_ATTRIBUTE: &str = "type";

/// The message attribute carrying the body's content type.
pub const SQS_CONTENT_TYPE_ATTRIBUTE: &str = "contentType";

/// An option of [`SqsSink`] that cannot be used, named.
#[derive(Debug, thiserror::Error)]
#[error("sqs.{option}: {message}")]
#[non_exhaustive]
pub struct SqsConfigError {
    /// The option (`queue_url`, `endpoint_url`, `region`, `group_id`).
    pub option: &'static str,
    /// What is wrong with it.
    pub message: String,
}

impl SqsConfigError {
    fn new(option: &'static str, message: impl Into<String>) -> Self {
        Self {
            option,
            message: message.into(),
        }
    }
}

/// What an [`SqsSink`] is built from. Only the queue URL is required; a URL converts into
/// options (`SqsSink::from_env("https://…/orders.fifo")`).
#[derive(Clone)]
pub struct SqsOptions {
    queue_url: String,
    fifo: bool,
    group_id: Option<KeyFn>,
    format: EventFormat,
    endpoint_url: Option<String>,
    timeout: Duration,
}

impl fmt::Debug for SqsOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqsOptions")
            .field("queue_url", &self.queue_url)
            .field("fifo", &self.fifo)
            .field("group_id", &self.group_id.as_ref().map(|_| "<fn>"))
            .field("format", &self.format)
            .field("endpoint_url", &self.endpoint_url)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl SqsOptions {
    /// Send to the queue at `queue_url` (`https://sqs.<region>.amazonaws.com/<account>/<name>`),
    /// a FIFO queue unless [`standard`](Self::standard) is set.
    pub fn new(queue_url: impl Into<String>) -> Self {
        Self {
            queue_url: queue_url.into(),
            fifo: true,
            group_id: None,
            format: EventFormat::default(),
            endpoint_url: None,
            timeout: DEFAULT_SQS_TIMEOUT,
        }
    }

    /// The queue is a standard queue: messages carry no `MessageDeduplicationId` and no
    /// `MessageGroupId` (SQS refuses both there), so a redelivered event is a second message.
    #[must_use]
    pub fn standard(mut self) -> Self {
        self.fifo = false;
        self
    }

    /// Derives the FIFO `MessageGroupId` from the event (default: the event's subject, so the
    /// changes of one item are received in order and different items in parallel). SQS allows
    /// 1 to 128 characters, ASCII letters, digits and punctuation.
    #[must_use]
    pub fn group_id(mut self, group_id: impl Fn(&Event) -> String + Send + Sync + 'static) -> Self {
        self.group_id = Some(Arc::new(group_id));
        self
    }

    /// The body format: CloudEvents (the default) or the raw event.
    #[must_use]
    pub fn format(mut self, format: EventFormat) -> Self {
        self.format = format;
        self
    }

    /// Sends to this endpoint instead of the region's (a VPC endpoint, a local SQS-compatible
    /// server such as moto or ElasticMQ). Requests are still signed for the region.
    #[must_use]
    pub fn endpoint_url(mut self, endpoint_url: impl Into<String>) -> Self {
        self.endpoint_url = Some(endpoint_url.into());
        self
    }

    /// How long one send waits for SQS (default [`DEFAULT_SQS_TIMEOUT`]); then the attempt is a
    /// transient failure.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

impl From<&str> for SqsOptions {
    fn from(queue_url: &str) -> Self {
        Self::new(queue_url)
    }
}

impl From<String> for SqsOptions {
    fn from(queue_url: String) -> Self {
        Self::new(queue_url)
    }
}

/// A handler that sends each event as a message to an
/// [Amazon SQS](https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/)
/// queue with the official AWS SDK.
///
/// - body = the event as JSON, a CloudEvents object by default (or
///   [`format`](SqsOptions::format));
/// - message attributes `poller`, `type` (`created`/`updated`/`deleted`) and `contentType`
///   (strings);
/// - on a FIFO queue (the default): `MessageDeduplicationId` = the event id, so SQS stores a
///   redelivered event once within its 5-minute deduplication interval, and `MessageGroupId` =
///   the event's subject (or [`group_id`](SqsOptions::group_id));
/// - on a standard queue ([`standard`](SqsOptions::standard)): neither.
///
/// The handler acknowledges once SQS answered `SendMessage`. Throttling (`ThrottlingException`,
/// `RequestThrottled`, `OverLimit`, …), 5xx answers, timeouts and connection errors are
/// transient (the dispatcher retries); a queue that does not exist, denied access or invalid
/// credentials, invalid parameters and a message that is too large are permanent and park the
/// event with SQS' message.
#[derive(Clone)]
pub struct SqsSink {
    client: aws_sdk_sqs::Client,
    queue_url: String,
    fifo: bool,
    group_id: KeyFn,
    format: EventFormat,
    timeout: Duration,
}

impl fmt::Debug for SqsSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqsSink")
            .field("queue_url", &self.queue_url)
            .field("fifo", &self.fifo)
            .field("format", &self.format)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// The event's subject: the default FIFO message group.
fn subject(event: &Event) -> String {
    event.subject.to_string()
}

/// The sink's HTTPS client: hyper on rustls with the ring provider and the platform's root
/// certificates (plain `http://` endpoints too).
fn https_client() -> SharedHttpClient {
    aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::Ring))
        .build_https()
}

impl SqsSink {
    /// Loads the credentials and the region the AWS SDK's usual way (environment variables,
    /// the shared config and credentials files and their profiles, web identity, the ECS and EC2
    /// instance roles) and returns a sink sending to the options' queue.
    ///
    /// The client sends over the sink's own HTTPS client (rustls on ring) and makes one attempt
    /// per delivery: the dispatcher retries, with its own backoff and attempt limit. Fails only
    /// on options that cannot work (see [`new`](Self::new)); missing credentials show when a
    /// delivery fails.
    pub async fn from_env(options: impl Into<SqsOptions>) -> Result<Self, SqsConfigError> {
        Self::from_loader(aws_config::defaults(BehaviorVersion::latest()), options).await
    }

    /// Like [`from_env`](Self::from_env), with the configuration `loader` gives (a profile, a
    /// region or a credentials provider set by the application). The sink's HTTPS client and
    /// one attempt per delivery replace any the loader had.
    pub async fn from_loader(
        loader: aws_config::ConfigLoader,
        options: impl Into<SqsOptions>,
    ) -> Result<Self, SqsConfigError> {
        let options = options.into();
        check_urls(&options)?;
        let config = loader
            .http_client(https_client())
            .retry_config(RetryConfig::disabled())
            .load()
            .await;
        Self::new(aws_sdk_sqs::Client::new(&config), options)
    }

    /// A sink sending through `client`, configured as it is (its retries included), but for:
    /// the options' endpoint, the region of an AWS queue URL (`sqs.<region>.amazonaws.com`: SQS
    /// answers only in the queue's region), and the sink's HTTPS client (rustls on ring) when
    /// `client` has none.
    ///
    /// Fails on options that cannot work: a queue URL that is not an http(s) URL with a queue
    /// name, a FIFO sink on a URL without the `.fifo` suffix or a standard one on a URL with it,
    /// a `group_id` on a standard queue, an endpoint that is not an http(s) URL, no region.
    pub fn new(
        client: aws_sdk_sqs::Client,
        options: impl Into<SqsOptions>,
    ) -> Result<Self, SqsConfigError> {
        let options = options.into();
        check_urls(&options)?;
        let config = client.config();
        let region = url_region(&options.queue_url).or_else(|| config.region().cloned());
        if region.is_none() {
            return Err(SqsConfigError::new(
                "region",
                "no region: set one on the client or in the environment (AWS_REGION, a profile's \
                 region), or give an AWS queue URL (https://sqs.<region>.amazonaws.com/…)",
            ));
        }
        let mut builder = config.to_builder().region(region);
        if config.http_client().is_none() {
            builder = builder.http_client(https_client());
        }
        if let Some(endpoint) = &options.endpoint_url {
            builder = builder.endpoint_url(endpoint);
        }
        Ok(Self {
            client: aws_sdk_sqs::Client::from_conf(builder.build()),
            queue_url: options.queue_url,
            fifo: options.fifo,
            group_id: options.group_id.unwrap_or_else(|| Arc::new(subject)),
            format: options.format,
            timeout: options.timeout,
        })
    }

    /// The queue's URL.
    pub fn queue_url(&self) -> &str {
        &self.queue_url
    }

    /// Sends one event and waits for SQS' answer (on a FIFO queue, a duplicate within the
    /// deduplication interval is answered as a success and not stored again).
    pub async fn send(&self, event: &Event) -> Result<SendMessageOutput, HandlerError> {
        let serialized = serialize_event(event, self.format).map_err(HandlerError::permanent)?;
        let body = String::from_utf8(serialized.body).map_err(HandlerError::permanent)?;
        let mut request = self
            .client
            .send_message()
            .queue_url(&self.queue_url)
            .message_body(body)
            .message_attributes(SQS_POLLER_ATTRIBUTE, string_attribute(&event.poller)?)
            .message_attributes(
                SQS_TYPE_ATTRIBUTE,
                string_attribute(&event.event_type.to_string())?,
            )
            .message_attributes(
                SQS_CONTENT_TYPE_ATTRIBUTE,
                string_attribute(serialized.content_type)?,
            );
        if self.fifo {
            request = request
                .message_deduplication_id(&*event.id)
                .message_group_id((self.group_id)(event));
        }
        tokio::time::timeout(self.timeout, request.send())
            .await
            .map_err(|_| {
                HandlerError::transient(format!(
                    "sqs: no answer from SendMessage to {} within {} ms",
                    self.queue_url,
                    self.timeout.as_millis()
                ))
            })?
            .map_err(|error| classify(error, &self.queue_url))
    }
}

fn string_attribute(value: &str) -> Result<MessageAttributeValue, HandlerError> {
    MessageAttributeValue::builder()
        .data_type("String")
        .string_value(value)
        .build()
        .map_err(HandlerError::permanent)
}

/// The queue URL and the endpoint are http(s) URLs, the queue's kind matches its name.
fn check_urls(options: &SqsOptions) -> Result<(), SqsConfigError> {
    let url = options.queue_url.as_str();
    if url.trim().is_empty() {
        return Err(SqsConfigError::new("queue_url", "must not be empty"));
    }
    let name = http_url_path(url)
        .and_then(|path| path.rsplit('/').next())
        .filter(|name| !name.is_empty())
        .ok_or_else(|| {
            SqsConfigError::new(
                "queue_url",
                format!(
                    "{url:?} is not a queue URL: expected http(s)://<host>/<account>/<queue name>"
                ),
            )
        })?;
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(SqsConfigError::new(
            "queue_url",
            format!(
                "{url:?}: the queue name {name:?} may hold only letters, digits, '-' and '_' \
                 (and the '.fifo' suffix)"
            ),
        ));
    }
    let fifo_name = name.ends_with(".fifo");
    if options.fifo && !fifo_name {
        return Err(SqsConfigError::new(
            "queue_url",
            format!(
                "{url:?} is not a FIFO queue (its name has no '.fifo' suffix): a FIFO sink sends \
                 MessageGroupId and MessageDeduplicationId, which a standard queue refuses; use \
                 SqsOptions::standard() for a standard queue"
            ),
        ));
    }
    if !options.fifo && fifo_name {
        return Err(SqsConfigError::new(
            "queue_url",
            format!(
                "{url:?} is a FIFO queue (its name ends in '.fifo'), which needs a MessageGroupId \
                 on every message: drop SqsOptions::standard()"
            ),
        ));
    }
    if !options.fifo && options.group_id.is_some() {
        return Err(SqsConfigError::new(
            "group_id",
            "a message group id is sent to FIFO queues only: drop group_id or standard()",
        ));
    }
    if let Some(endpoint) = &options.endpoint_url
        && http_url_path(endpoint).is_none()
    {
        return Err(SqsConfigError::new(
            "endpoint_url",
            format!("{endpoint:?} is not an http(s) URL"),
        ));
    }
    Ok(())
}

/// The path of an `http://` or `https://` URL with a host (`""` when it has none), or `None`.
fn http_url_path(url: &str) -> Option<&str> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))?;
    if rest.chars().any(char::is_whitespace) {
        return None;
    }
    let (host, path) = rest.split_at(rest.find(['/', '?', '#']).unwrap_or(rest.len()));
    let host = host.rsplit('@').next().unwrap_or(host);
    if host.is_empty() || host.starts_with(':') {
        return None;
    }
    Some(path.split(['?', '#']).next().unwrap_or(path))
}

/// The region an AWS queue URL names: `https://sqs.<region>.amazonaws.com[.cn]/…` or the
/// legacy `https://<region>.queue.amazonaws.com/…`.
fn url_region(url: &str) -> Option<Region> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))?;
    let host = rest.split(['/', ':', '?', '#']).next()?;
    let labels: Vec<&str> = host.split('.').collect();
    let region = match labels.as_slice() {
        ["sqs", region, "amazonaws", "com", ..] | [region, "queue", "amazonaws", "com", ..] => {
            *region
        }
        _ => return None,
    };
    let valid = !region.is_empty()
        && region
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    valid.then(|| Region::new(region.to_owned()))
}

/// Error codes SQS (and AWS generally) answers when the request may succeed later.
const TRANSIENT_CODES: &[&str] = &[
    // Throttling.
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottled",
    "RequestThrottledException",
    "TooManyRequestsException",
    "RequestLimitExceeded",
    "BandwidthLimitExceeded",
    "LimitExceededException",
    "ProvisionedThroughputExceededException",
    "SlowDown",
    "PriorRequestNotComplete",
    "EC2ThrottledException",
    "TransactionInProgressException",
    // SQS: too many messages in flight, KMS throttled.
    "OverLimit",
    "AWS.SimpleQueueService.OverLimit",
    "KmsThrottled",
    "KMS.ThrottlingException",
    // The service's own trouble.
    "InternalError",
    "InternalFailure",
    "ServiceUnavailable",
    "ServiceUnavailableException",
    "AWS.SimpleQueueService.ServiceUnavailable",
    "RequestTimeout",
    "RequestTimeoutException",
    "IDPCommunicationError",
    // Credentials that a refresh replaces, a clock skew the SDK corrects.
    "ExpiredToken",
    "ExpiredTokenException",
    "RequestExpired",
];

/// The codes of a queue that does not exist (JSON protocol, and the query-compatible code
/// SQS sends in `x-amzn-query-error`).
const MISSING_QUEUE_CODES: &[&str] = &[
    "QueueDoesNotExist",
    "AWS.SimpleQueueService.NonExistentQueue",
];

/// Throttling, 5xx answers, timeouts and connection errors are transient; an answer saying the
/// request itself is wrong (a missing queue, access denied, invalid parameters) is permanent.
fn classify<E>(error: SdkError<E, HttpResponse>, queue_url: &str) -> HandlerError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match &error {
        SdkError::ServiceError(service) => {
            let status = service.raw().status().as_u16();
            let err = service.err();
            let (code, message) = match err.code() {
                Some(code) => (code.to_owned(), err.message().unwrap_or("").to_owned()),
                None => query_error(service.raw()).unwrap_or_default(),
            };
            let code = code.as_str();
            let detail = match (code.is_empty(), message.is_empty()) {
                (false, false) => format!("{code}: {message}"),
                (false, true) => code.to_owned(),
                (true, false) => message,
                (true, true) => chain(&error),
            };
            if MISSING_QUEUE_CODES.contains(&code) {
                return HandlerError::permanent(format!(
                    "sqs: queue {queue_url} does not exist ({detail})"
                ));
            }
            let text = format!("sqs: SendMessage to {queue_url}: HTTP {status}, {detail}");
            if TRANSIENT_CODES.contains(&code) || status >= 500 || status == 429 {
                HandlerError::transient(text)
            } else if (400..500).contains(&status) {
                // Access denied, invalid credentials or signatures, invalid parameters (a
                // message too large, a group id SQS refuses), KMS keys not usable: no retry
                // mends the request.
                HandlerError::permanent(text)
            } else {
                HandlerError::transient(text)
            }
        }
        // The SDK could not build the request: it will not build on a retry either.
        SdkError::ConstructionFailure(_) => HandlerError::permanent(format!(
            "sqs: cannot build SendMessage to {queue_url}: {}",
            chain(&error)
        )),
        // Timeouts, connection errors (credentials that could not be loaded among them), and an
        // answer that could not be read (a proxy's error page).
        _ => HandlerError::transient(format!(
            "sqs: SendMessage to {queue_url} failed: {}",
            chain(&error)
        )),
    }
}

/// The error and its sources, joined by `: ` (what `DisplayErrorContext` shows, without the
/// debug dump of the whole response it appends).
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(next) = source {
        let shown = next.to_string();
        if !text.ends_with(&shown) {
            text.push_str(": ");
            text.push_str(&shown);
        }
        source = next.source();
    }
    text
}

/// The code and message of an error answered in the query protocol's XML
/// (`<Error><Code>…</Code><Message>…</Message></Error>`) rather than JSON, which the SDK cannot
/// read: what some SQS-compatible servers answer, moto for a request it refuses to
/// authenticate among them.
fn query_error(response: &HttpResponse) -> Option<(String, String)> {
    let body = std::str::from_utf8(response.body().bytes()?).ok()?;
    let element = |name: &str| -> Option<String> {
        let start = body.find(&format!("<{name}>"))? + name.len() + 2;
        let end = start + body[start..].find(&format!("</{name}>"))?;
        Some(unescape_xml(body[start..end].trim()))
    };
    let code = element("Code")?;
    Some((code, element("Message").unwrap_or_default()))
}

fn unescape_xml(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

#[async_trait]
impl Handler for SqsSink {
    async fn handle(&self, event: Event, ctx: HandlerContext) -> HandlerResult {
        crate::send::ack_when_sent(&ctx, "sqs send", self.send(&event)).await
    }
}

#[cfg(test)]
mod tests;
