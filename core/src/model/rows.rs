//! The rows a store keeps: snapshot items, outbox rows, parked rows with their failure details, validators, the replay log.

use serde::{Deserialize, Serialize};
use smol_str::SmolStr;

use crate::event::Event;
use crate::json;
use crate::json::Json;

/// An error as plain data: what the engine persists and reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SerializedError {
    /// The error's kind, e.g. `HandlerError`, `HttpError`, `PoisonHalt`.
    pub name: String,
    /// A human-readable message.
    pub message: String,
    /// The stable code for watukuy errors (`LEASE_LOST`, `STORE`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// The HTTP status, for HTTP errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The error's cause, nested up to three levels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<Box<SerializedError>>,
}

impl SerializedError {
    /// Builds an error with a name and a message.
    pub fn new(name: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            message: message.into(),
            code: None,
            status: None,
            cause: None,
        }
    }

    /// Serializes any error with its `source()` chain, nested up to three levels.
    pub fn from_error(name: impl Into<String>, error: &(dyn std::error::Error + 'static)) -> Self {
        fn chain(
            error: &(dyn std::error::Error + 'static),
            depth: u8,
        ) -> Option<Box<SerializedError>> {
            if depth == 0 {
                return None;
            }
            let source = error.source()?;
            Some(Box::new(SerializedError {
                name: "Error".to_owned(),
                message: source.to_string(),
                code: None,
                status: None,
                cause: chain(source, depth - 1),
            }))
        }
        Self {
            name: name.into(),
            message: error.to_string(),
            code: None,
            status: None,
            cause: chain(error, 3),
        }
    }

    /// Sets the stable code.
    #[must_use]
    pub fn with_code(mut self, code: impl Into<String>) -> Self {
        self.code = Some(code.into());
        self
    }
}

/// One item of the snapshot: what the engine remembers about an identity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ItemRow {
    /// The item's identity.
    pub identity: String,
    /// The version string, when the poller has a version selector.
    pub version: Option<String>,
    /// SHA-256 hex of the canonical fingerprint.
    pub hash: String,
    /// The schema version the row was written with.
    pub schema_version: u32,
    /// The last payload, kept only with `retain: payload`. Absent and JSON `null` differ.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "json::present"
    )]
    pub payload: Option<Json>,
    /// When the row was last written (epoch ms). Unchanged items are not rewritten, full scans
    /// included, so this is when the item was created or last changed (or re-stored after a
    /// schema or version change), not when it was last listed.
    pub seen_at: i64,
}

/// Whether an outbox row still waits for delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutboxStatus {
    /// Waiting for delivery.
    Pending,
    /// Delivered; stores may delete the row instead of keeping it with this status.
    Delivered,
}

/// One event waiting in the outbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutboxRow {
    /// The event id (the row's key within its `PKey`).
    pub event_id: SmolStr,
    /// The key's outbox sequence; delivery follows it.
    pub sequence: i64,
    /// The event.
    pub event: Event,
    /// Pending or delivered.
    pub status: OutboxStatus,
    /// Failed delivery attempts so far.
    pub attempts: u32,
    /// Earliest time of the next attempt (epoch ms), after a failure.
    pub next_attempt_at: Option<i64>,
    /// The last delivery failure.
    pub last_error: Option<SerializedError>,
    /// When the row was committed (epoch ms).
    pub created_at: i64,
}

impl OutboxRow {
    /// A pending row for `event`, never attempted.
    pub fn pending(event: Event, created_at: i64) -> Self {
        Self {
            event_id: event.id.clone(),
            sequence: event.sequence,
            event,
            status: OutboxStatus::Pending,
            attempts: 0,
            next_attempt_at: None,
            last_error: None,
            created_at,
        }
    }
}

/// Why a row is parked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum ParkedKind {
    /// An event whose handler failed every attempt.
    Poison,
    /// An item that failed validation (quarantined).
    Invalid,
}

impl ParkedKind {
    /// The kind's name as it appears in JSON and in stores.
    pub fn as_str(self) -> &'static str {
        match self {
            ParkedKind::Poison => "poison",
            ParkedKind::Invalid => "invalid",
        }
    }
}

/// One validation problem of an item.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValidationIssue {
    /// What is wrong.
    pub message: String,
    /// Where, as a path of keys and indexes (e.g. `["lines", "0", "qty"]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<Vec<String>>,
}

/// The error of a parked row: the last error plus the history and validation issues.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParkedError {
    /// The last error.
    #[serde(flatten)]
    pub error: SerializedError,
    /// Earlier errors of this event, oldest first, ending with the last one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<Vec<SerializedError>>,
    /// Validation issues, for quarantined items.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issues: Option<Vec<ValidationIssue>>,
    /// What the dispatcher recorded about a poison event (classification, timed attempt log,
    /// handler version, correlation id, redactions). Flattened: each part is an optional
    /// top-level key, absent for quarantined items and for rows parked before it existed.
    #[serde(flatten)]
    pub details: FailureDetails,
}

/// How a delivery failure was classified (see `delivery::HandlerErrorKind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FailureClass {
    /// Worth retrying with backoff: unclassified errors and handler timeouts.
    Transient,
    /// Retry no earlier than a given delay.
    RetryAfter,
    /// Retrying cannot help.
    Permanent,
}

/// Why a poison event was parked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ParkReason {
    /// The handler classified the failure as permanent: parked at once, without using the
    /// remaining attempts.
    Permanent,
    /// Every allowed attempt failed.
    AttemptsExhausted,
}

/// One failed delivery attempt of a poison event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttemptRecord {
    /// The attempt, 1-based.
    pub attempt: u32,
    /// When the attempt started (epoch ms); `None` when only its error is known (an attempt
    /// made before a restart or by another instance).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<i64>,
    /// When the attempt failed (epoch ms); `None` when unknown, as for `started_at`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_at: Option<i64>,
    /// How the failure was classified; `None` when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub classification: Option<FailureClass>,
    /// When the next attempt was allowed (epoch ms), for a failure that was retried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<i64>,
    /// The error.
    pub error: SerializedError,
}

/// The delivery details of a parked poison event. Every part is optional, so records written
/// before these existed (and quarantined items) read back with all of them `None`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct FailureDetails {
    /// How the last failure was classified.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub classification: Option<FailureClass>,
    /// Why the event was parked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub park_reason: Option<ParkReason>,
    /// The failed attempts, oldest first, with their timestamps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempt_log: Option<Vec<AttemptRecord>>,
    /// The handler version configured on the poller's delivery options.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handler_version: Option<String>,
    /// The correlation id the handler (or the delivery options) attached.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<String>,
    /// What was kept out of the parked event: `"data"`/`"previous"` for whole payloads, or
    /// JSON pointers such as `"/data/card/number"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redacted: Option<Vec<String>>,
}

impl FailureDetails {
    /// True when nothing was recorded.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// A parked event (poison) or a quarantined item (invalid).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParkedRow {
    /// The row id: the event id for poison rows, `invalid:<hash>` for quarantined items.
    pub id: String,
    /// Poison or invalid.
    pub kind: ParkedKind,
    /// The event, for poison rows.
    pub event: Option<Event>,
    /// The raw item, for quarantined items.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "json::present"
    )]
    pub item: Option<Json>,
    /// What went wrong.
    pub error: ParkedError,
    /// Delivery attempts made.
    pub attempts: u32,
    /// When the row was parked (epoch ms).
    pub parked_at: i64,
    /// The ordering key this row holds back, if any.
    pub hold_key: Option<String>,
}

/// HTTP validators remembered for one URL.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Validator {
    /// The `ETag` response header.
    pub etag: Option<String>,
    /// The `Last-Modified` response header.
    pub last_modified: Option<String>,
    /// When they were stored (epoch ms).
    pub stored_at: i64,
}

/// One entry of the replay log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoggedEvent {
    /// The outbox sequence the event was committed with.
    pub sequence: i64,
    /// The event.
    pub event: Event,
    /// When it was committed (epoch ms).
    pub created_at: i64,
}
