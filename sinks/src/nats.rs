//! The NATS JetStream sink: publishes with `Nats-Msg-Id` = event id and waits for the stream's ack.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::header::{HeaderName, HeaderValue, NATS_MESSAGE_ID};
use async_nats::jetstream::{self, publish::PublishAck};
use async_trait::async_trait;
use watukuy_core::{Event, HandlerContext, HandlerError, HandlerResult, delivery::Handler};

use crate::format::{EventFormat, KeyFn, default_key, serialize_event};

/// How long a publish waits for the stream's ack by default: 5 seconds (async-nats' default).
pub const DEFAULT_NATS_ACK_TIMEOUT: Duration = Duration::from_secs(5);

/// A handler that publishes each event to a JetStream stream.
///
/// The message carries `Nats-Msg-Id` = the event id, so a stream with a duplicate window stores
/// a redelivered event once, and `Content-Type`. The sink waits for the stream's `PubAck`; any
/// failure (no connection, no stream bound to the subject, no ack in time) is a transient error
/// for the dispatcher to retry. On success it calls `ctx.ack()`.
///
/// The subject defaults to `<poller>.<created|updated|deleted>`; a stream must capture it.
#[derive(Clone)]
pub struct NatsSink {
    js: jetstream::Context,
    subject: KeyFn,
    format: EventFormat,
}

impl fmt::Debug for NatsSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsSink")
            .field("format", &self.format)
            .finish_non_exhaustive()
    }
}

impl NatsSink {
    /// A sink publishing through `client`'s JetStream context.
    pub fn new(client: async_nats::Client) -> Self {
        Self::from_context(jetstream::new(client))
    }

    /// A sink publishing through a JetStream context (for a domain or API prefix).
    pub fn from_context(js: jetstream::Context) -> Self {
        Self {
            js,
            subject: Arc::new(default_key),
            format: EventFormat::default(),
        }
    }

    /// Connects to `url` (e.g. `nats://127.0.0.1:4222`) and returns a sink. The connection is
    /// established in the background and re-established whenever it drops, so a server that is
    /// down now only makes deliveries fail (transiently) until it is back. Fails only on options
    /// the client rejects outright, such as an unparsable URL.
    pub async fn connect(url: &str) -> Result<Self, async_nats::ConnectError> {
        let client = async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .connect(url)
            .await?;
        Ok(Self::new(client))
    }

    /// Derives the subject from the event (default `<poller>.<type>`).
    pub fn subject(mut self, subject: impl Fn(&Event) -> String + Send + Sync + 'static) -> Self {
        self.subject = Arc::new(subject);
        self
    }

    /// The body format: CloudEvents (the default) or the raw event.
    pub fn format(mut self, format: EventFormat) -> Self {
        self.format = format;
        self
    }

    /// How long a publish waits for the stream's ack (default [`DEFAULT_NATS_ACK_TIMEOUT`]).
    pub fn ack_timeout(mut self, timeout: Duration) -> Self {
        self.js.set_timeout(timeout);
        self
    }

    /// Publishes one event and waits for the stream's ack (`duplicate` is set when the stream
    /// already held a message with this id).
    pub async fn publish(&self, event: &Event) -> Result<PublishAck, HandlerError> {
        let serialized = serialize_event(event, self.format).map_err(HandlerError::permanent)?;
        let mut headers = HeaderMap::new();
        let id = HeaderValue::from_str(&event.id).map_err(|e| {
            HandlerError::permanent(format!(
                "event id {:?} is not a header value: {e}",
                event.id
            ))
        })?;
        headers.insert(NATS_MESSAGE_ID, id);
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_str("Content-Type"),
            HeaderValue::from_str(serialized.content_type),
        ) {
            headers.insert(name, value);
        }
        let subject = (self.subject)(event);
        let ack = self
            .js
            .publish_with_headers(subject, headers, serialized.body.into())
            .await
            .map_err(HandlerError::transient)?
            .await
            .map_err(HandlerError::transient)?;
        if ack.duplicate {
            tracing::debug!(event_id = %event.id, stream = %ack.stream, "nats: duplicate publish, stream kept the first");
        }
        Ok(ack)
    }
}

#[async_trait]
impl Handler for NatsSink {
    async fn handle(&self, event: Event, ctx: HandlerContext) -> HandlerResult {
        crate::send::ack_when_sent(&ctx, "nats publish", self.publish(&event)).await
    }
}
