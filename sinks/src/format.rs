//! How an event becomes a message body, and how a message's subject or routing key is derived.

use std::sync::Arc;

use watukuy_core::Event;

/// The content type of a structured-mode CloudEvent body.
pub const CLOUDEVENTS_CONTENT_TYPE: &str = "application/cloudevents+json";

/// The content type of a raw event body.
pub const JSON_CONTENT_TYPE: &str = "application/json";

/// The shape of the body a sink sends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum EventFormat {
    /// The event as a CloudEvents 1.0 structured-mode JSON object ([`Event::to_cloud_event`]),
    /// sent as [`CLOUDEVENTS_CONTENT_TYPE`]. The default.
    #[default]
    CloudEvents,
    /// The native event envelope as JSON, sent as [`JSON_CONTENT_TYPE`].
    Raw,
}

impl EventFormat {
    /// The content type of bodies in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            EventFormat::CloudEvents => CLOUDEVENTS_CONTENT_TYPE,
            EventFormat::Raw => JSON_CONTENT_TYPE,
        }
    }
}

/// A serialized event: the exact bytes a sink sends (and a webhook signs), and their content type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SerializedEvent {
    /// The JSON body.
    pub body: Vec<u8>,
    /// [`CLOUDEVENTS_CONTENT_TYPE`] or [`JSON_CONTENT_TYPE`].
    pub content_type: &'static str,
}

/// Serializes `event` in `format`.
pub fn serialize_event(
    event: &Event,
    format: EventFormat,
) -> Result<SerializedEvent, serde_json::Error> {
    let body = match format {
        EventFormat::CloudEvents => serde_json::to_vec(&event.to_cloud_event())?,
        EventFormat::Raw => serde_json::to_vec(event)?,
    };
    Ok(SerializedEvent {
        body,
        content_type: format.content_type(),
    })
}

/// Derives a message's subject (NATS) or routing key (RabbitMQ) from the event.
pub type KeyFn = Arc<dyn Fn(&Event) -> String + Send + Sync>;

/// The default subject / routing key: `<poller>.<created|updated|deleted>` (the CloudEvent type).
pub fn default_key(event: &Event) -> String {
    format!("{}.{}", event.poller, event.event_type)
}
