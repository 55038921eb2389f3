//! The event envelope delivered to handlers, and its CloudEvents 1.0 form.

use std::fmt;

use serde::{Deserialize, Serialize};
use smol_str::SmolStr;

use crate::json::{self, Json};
use crate::model::Lane;

/// What happened to an item.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventType {
    /// First seen.
    Created,
    /// Its fingerprint changed.
    Updated,
    /// A complete listing no longer contains it.
    Deleted,
}

impl EventType {
    /// The type's name as it appears in JSON and in event ids.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Created => "created",
            EventType::Updated => "updated",
            EventType::Deleted => "deleted",
        }
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One change, as stored in the outbox and delivered to a handler.
///
/// The JSON shape (camelCase) is the reference implementation's, so events serialized by either
/// implementation read the same.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Event {
    /// Deterministic id: 64 hex characters, identical across restarts, instances and replays.
    pub id: SmolStr,
    /// Created, updated or deleted.
    #[serde(rename = "type")]
    pub event_type: EventType,
    /// The event source, `urn:watukuy:<poller>` by default.
    pub source: SmolStr,
    /// The item's identity.
    pub subject: SmolStr,
    /// When the change was observed (RFC 3339, UTC).
    pub time: SmolStr,
    /// The poller's name.
    pub poller: SmolStr,
    /// The partition key (`""` for an unpartitioned poller).
    pub partition: SmolStr,
    /// The lane that produced the event.
    pub lane: Lane,
    /// Monotonic per `(poller, partition)`; delivery order within an ordering key follows it.
    pub sequence: i64,
    /// The lane cursor after the page that produced the event (parsed JSON), if any.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "json::present"
    )]
    pub cursor: Option<Json>,
    /// The item; absent for deletes unless the poller retains payloads.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "json::present"
    )]
    pub data: Option<Json>,
    /// The previous payload (`retain: payload` only): on updates, and on full-scan deletes.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "json::present"
    )]
    pub previous: Option<Json>,
    /// The delivery attempt, 1-based when delivered; 0 in storage.
    pub attempt: u32,
    /// The W3C `traceparent` of the poll cycle that observed the change, captured at commit, so
    /// a consumer can link its work to it (see `telemetry::TraceContext`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<SmolStr>,
}

/// The content type of CloudEvents `data` written by [`Event::to_cloud_event`].
pub(crate) const CLOUDEVENTS_DATA_CONTENT_TYPE: &str = "application/json";

/// An [`Event`] as a CloudEvents 1.0 structured-mode JSON object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloudEvent {
    /// Always `"1.0"`.
    pub specversion: String,
    /// The event id.
    pub id: String,
    /// The event source.
    pub source: String,
    /// `<poller>.<created|updated|deleted>`.
    #[serde(rename = "type")]
    pub event_type: String,
    /// The item's identity.
    pub subject: String,
    /// Observation time (RFC 3339).
    pub time: String,
    /// Always `application/json`.
    pub datacontenttype: String,
    /// The item.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "json::present"
    )]
    pub data: Option<Json>,
    /// Extension: the partition key.
    pub watukuypartition: String,
    /// Extension: the lane.
    pub watukuylane: Lane,
    /// Extension: the outbox sequence.
    pub watukuysequence: i64,
    /// Extension: the poller's name.
    pub watukuypoller: String,
    /// Extension: the previous payload, when retained.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "json::present"
    )]
    pub watukuyprevious: Option<Json>,
    /// Distributed-tracing extension: the W3C trace context of the observing poll.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

impl Event {
    /// An event with the given id, type, poller and subject; the rest as an unpartitioned live
    /// event in storage: source `urn:watukuy:<poller>`, time `1970-01-01T00:00:00.000Z`, sequence
    /// 0, attempt 0, no cursor, data, previous payload or trace. For tests of handlers and sinks
    /// (the engine builds the events it delivers): the fields are public, set the ones a test
    /// needs.
    ///
    /// ```
    /// use watukuy_core::{Event, EventType, json::Json};
    ///
    /// let mut event = Event::new("evt-1", EventType::Created, "orders", "o-1");
    /// event.data = Some(Json::parse(r#"{"id":"o-1","total":42}"#).expect("valid JSON"));
    /// assert_eq!(event.source, "urn:watukuy:orders");
    /// ```
    pub fn new(
        id: impl Into<SmolStr>,
        event_type: EventType,
        poller: impl Into<SmolStr>,
        subject: impl Into<SmolStr>,
    ) -> Self {
        let poller = poller.into();
        Event {
            id: id.into(),
            event_type,
            source: SmolStr::from(format!("urn:watukuy:{poller}")),
            subject: subject.into(),
            time: SmolStr::new_static("1970-01-01T00:00:00.000Z"),
            poller,
            partition: SmolStr::default(),
            lane: Lane::Live,
            sequence: 0,
            cursor: None,
            data: None,
            previous: None,
            attempt: 0,
            traceparent: None,
        }
    }

    /// The CloudEvents 1.0 structured form of this event.
    pub fn to_cloud_event(&self) -> CloudEvent {
        CloudEvent {
            specversion: "1.0".to_owned(),
            id: self.id.to_string(),
            source: self.source.to_string(),
            event_type: format!("{}.{}", self.poller, self.event_type),
            subject: self.subject.to_string(),
            time: self.time.to_string(),
            datacontenttype: CLOUDEVENTS_DATA_CONTENT_TYPE.to_owned(),
            data: self.data.clone(),
            watukuypartition: self.partition.to_string(),
            watukuylane: self.lane,
            watukuysequence: self.sequence,
            watukuypoller: self.poller.to_string(),
            watukuyprevious: self.previous.clone(),
            traceparent: self.traceparent.as_ref().map(SmolStr::to_string),
        }
    }

    /// Decodes `data` into the user's item type, naming the failing path on error.
    pub fn data_as<T: serde::de::DeserializeOwned>(&self) -> Result<Option<T>, serde_json::Error> {
        self.data.as_ref().map(Json::decode).transpose()
    }
}

/// Why a CloudEvent could not be read back as an [`Event`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a watukuy CloudEvent: {0}")]
pub struct CloudEventError(String);

impl TryFrom<CloudEvent> for Event {
    type Error = CloudEventError;

    fn try_from(ce: CloudEvent) -> Result<Self, Self::Error> {
        if ce.specversion != "1.0" {
            return Err(CloudEventError(format!(
                "specversion {:?} is not \"1.0\"",
                ce.specversion
            )));
        }
        let prefix = format!("{}.", ce.watukuypoller);
        let event_type = match ce.event_type.strip_prefix(&prefix) {
            Some("created") => EventType::Created,
            Some("updated") => EventType::Updated,
            Some("deleted") => EventType::Deleted,
            _ => {
                return Err(CloudEventError(format!(
                    "type {:?} is not <poller>.<created|updated|deleted> for poller {:?}",
                    ce.event_type, ce.watukuypoller
                )));
            }
        };
        Ok(Event {
            id: ce.id.into(),
            event_type,
            source: ce.source.into(),
            subject: ce.subject.into(),
            time: ce.time.into(),
            poller: ce.watukuypoller.into(),
            partition: ce.watukuypartition.into(),
            lane: ce.watukuylane,
            sequence: ce.watukuysequence,
            cursor: None,
            data: ce.data,
            previous: ce.watukuyprevious,
            attempt: 0,
            traceparent: ce.traceparent.map(SmolStr::from),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Event {
        Event {
            id: "a".repeat(64).into(),
            event_type: EventType::Updated,
            source: "urn:watukuy:orders".into(),
            subject: "o1".into(),
            time: "2026-01-01T00:00:00.000Z".into(),
            poller: "orders".into(),
            partition: "".into(),
            lane: Lane::Live,
            sequence: 7,
            cursor: Some(Json::parse(r#"{"value":"2026","tieBreak":null}"#).unwrap()),
            data: Some(Json::parse(r#"{"id":"o1","total":12}"#).unwrap()),
            previous: Some(Json::parse(r#"{"id":"o1","total":10}"#).unwrap()),
            attempt: 0,
            traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
        }
    }

    #[test]
    fn serializes_in_the_reference_shape() {
        let json = serde_json::to_value(sample()).unwrap();
        assert_eq!(json["type"], "updated");
        assert_eq!(json["lane"], "live");
        assert_eq!(json["cursor"]["value"], "2026");
        let mut delete = sample();
        delete.event_type = EventType::Deleted;
        delete.data = None;
        delete.previous = None;
        let json = serde_json::to_value(delete).unwrap();
        assert!(
            json.get("data").is_none(),
            "a delete under retain:hash has no data field"
        );
    }

    #[test]
    fn cloud_event_round_trip() {
        let event = sample();
        let ce = event.to_cloud_event();
        assert_eq!(ce.event_type, "orders.updated");
        assert_eq!(ce.specversion, "1.0");
        let text = serde_json::to_string(&ce).unwrap();
        assert!(text.contains(r#""watukuyprevious":{"id":"o1","total":10}"#));
        let back = Event::try_from(serde_json::from_str::<CloudEvent>(&text).unwrap()).unwrap();
        assert_eq!(
            back,
            Event {
                cursor: None,
                ..event
            }
        );
    }

    #[test]
    fn foreign_cloud_event_is_rejected_with_a_reason() {
        let mut ce = sample().to_cloud_event();
        ce.event_type = "com.example.thing".into();
        let err = Event::try_from(ce).unwrap_err();
        assert!(err.to_string().contains("com.example.thing"));
    }
}
