//! The RabbitMQ sink: publishes with `message_id` = event id and waits for the publisher confirm.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::ShortString;
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use tokio::sync::Mutex;
use watukuy_core::{Event, HandlerContext, HandlerError, HandlerResult, delivery::Handler};

use crate::format::{EventFormat, KeyFn, default_key, serialize_event};

/// How long one delivery may take by default, (re)connecting and the confirm included: 10 s.
pub const DEFAULT_RABBIT_TIMEOUT: Duration = Duration::from_secs(10);

/// AMQP delivery mode 2: the broker writes the message to disk (on a durable queue).
const PERSISTENT: u8 = 2;

/// A handler that publishes each event to a RabbitMQ exchange with publisher confirms.
///
/// Properties: `message_id` = the event id (consumers deduplicate on it), `content_type`,
/// `type` = `<poller>.<type>`, persistent delivery mode. The sink connects lazily on the first
/// delivery and reconnects on the next delivery after the connection or channel broke, so a
/// broker that is down only makes deliveries fail (transiently) until it is back. A nack, a
/// returned (unroutable, when [`mandatory`](Self::mandatory)) message, a broken connection or a
/// timeout is a transient error for the dispatcher to retry; a routing key, exchange name or id
/// over AMQP's 255 bytes is permanent. On success it calls `ctx.ack()`.
///
/// Publishes go to the exchange set with [`exchange`](Self::exchange) (default: the default
/// exchange `""`, which routes to the queue named by the routing key), with the routing key
/// derived from the event (default `<poller>.<type>`).
#[derive(Clone)]
pub struct RabbitSink {
    uri: String,
    properties: ConnectionProperties,
    exchange: String,
    routing_key: KeyFn,
    format: EventFormat,
    mandatory: bool,
    timeout: Duration,
    link: Arc<Mutex<Option<Link>>>,
}

struct Link {
    connection: Connection,
    channel: Channel,
}

impl fmt::Debug for RabbitSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitSink")
            .field("exchange", &self.exchange)
            .field("format", &self.format)
            .field("mandatory", &self.mandatory)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl RabbitSink {
    /// A sink for the broker at `uri` (e.g. `amqp://guest:guest@127.0.0.1:5672/%2f`). Nothing
    /// connects until the first delivery.
    pub fn new(uri: impl Into<String>) -> Self {
        Self {
            uri: uri.into(),
            properties: ConnectionProperties::default(),
            exchange: String::new(),
            routing_key: Arc::new(default_key),
            format: EventFormat::default(),
            mandatory: false,
            timeout: DEFAULT_RABBIT_TIMEOUT,
            link: Arc::new(Mutex::new(None)),
        }
    }

    /// The connection properties (connection name, auth provider) used on every (re)connect.
    pub fn connection_properties(mut self, properties: ConnectionProperties) -> Self {
        self.properties = properties;
        self
    }

    /// The exchange to publish to (default `""`, the default exchange).
    pub fn exchange(mut self, exchange: impl Into<String>) -> Self {
        self.exchange = exchange.into();
        self
    }

    /// Derives the routing key from the event (default `<poller>.<type>`).
    pub fn routing_key(
        mut self,
        routing_key: impl Fn(&Event) -> String + Send + Sync + 'static,
    ) -> Self {
        self.routing_key = Arc::new(routing_key);
        self
    }

    /// The body format: CloudEvents (the default) or the raw event.
    pub fn format(mut self, format: EventFormat) -> Self {
        self.format = format;
        self
    }

    /// Publish as mandatory: a message no queue takes is returned, and the delivery fails
    /// (transiently) instead of the event being dropped by the broker. Off by default.
    pub fn mandatory(mut self, mandatory: bool) -> Self {
        self.mandatory = mandatory;
        self
    }

    /// How long one delivery may take, (re)connecting and the confirm included (default 10 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Publishes one event and waits for the broker's confirm.
    pub async fn publish(&self, event: &Event) -> Result<(), HandlerError> {
        let serialized = serialize_event(event, self.format).map_err(HandlerError::permanent)?;
        let short = |what: &str, value: String| {
            ShortString::try_new(value).map_err(|e| HandlerError::permanent(format!("{what}: {e}")))
        };
        let exchange = short("exchange", self.exchange.clone())?;
        let routing_key = short("routing key", (self.routing_key)(event))?;
        let mut properties = BasicProperties::default()
            .with_message_id(short("message id", event.id.to_string())?)
            .with_content_type(short("content type", serialized.content_type.to_owned())?)
            .with_delivery_mode(PERSISTENT);
        if let Ok(kind) = ShortString::try_new(default_key(event)) {
            properties = properties.with_type(kind);
        }
        let options = BasicPublishOptions {
            mandatory: self.mandatory,
            ..BasicPublishOptions::default()
        };
        let attempt = async {
            let channel = self.channel().await?;
            channel
                .basic_publish(exchange, routing_key, options, &serialized.body, properties)
                .await?
                .await
        };
        let confirmation = match tokio::time::timeout(self.timeout, attempt).await {
            Ok(Ok(confirmation)) => confirmation,
            Ok(Err(error)) => {
                self.forget_broken_link().await;
                return Err(HandlerError::transient(error));
            }
            Err(_) => {
                // A hung channel may still look connected: start afresh next time.
                self.link.lock().await.take();
                return Err(HandlerError::transient(format!(
                    "rabbitmq publish not confirmed within {:?}",
                    self.timeout
                )));
            }
        };
        match confirmation {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(_)) => Err(HandlerError::transient(format!(
                "rabbitmq returned the message as unroutable (exchange {:?}, routing key {:?})",
                self.exchange,
                (self.routing_key)(event)
            ))),
            Confirmation::Nack(_) => Err(HandlerError::transient(
                "rabbitmq nacked the message (publisher confirm failed)",
            )),
            Confirmation::NotRequested => Err(HandlerError::transient(
                "rabbitmq did not confirm the message (confirms not enabled on the channel)",
            )),
        }
    }

    /// The channel to publish on: the current one while it and its connection are up, else a
    /// new channel in confirm mode (on a new connection if the old one is gone).
    async fn channel(&self) -> Result<Channel, lapin::Error> {
        let mut link = self.link.lock().await;
        if let Some(current) = link.as_ref()
            && current.channel.status().connected()
            && current.connection.status().connected()
        {
            return Ok(current.channel.clone());
        }
        let connection = match link.take() {
            Some(old) if old.connection.status().connected() => old.connection,
            _ => Connection::connect(&self.uri, self.properties.clone()).await?,
        };
        let channel = connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        *link = Some(Link {
            connection,
            channel: channel.clone(),
        });
        Ok(channel)
    }

    /// Drops the link if its channel or connection is no longer up, so the next delivery
    /// reconnects.
    async fn forget_broken_link(&self) {
        let mut link = self.link.lock().await;
        let broken = link.as_ref().is_some_and(|current| {
            !(current.channel.status().connected() && current.connection.status().connected())
        });
        if broken {
            *link = None;
        }
    }
}

#[async_trait]
impl Handler for RabbitSink {
    async fn handle(&self, event: Event, ctx: HandlerContext) -> HandlerResult {
        crate::send::ack_when_sent(&ctx, "rabbitmq publish", self.publish(&event)).await
    }
}
