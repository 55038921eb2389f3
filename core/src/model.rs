//! The values the engine and the stores exchange: keys, leases, persisted state and rows.
//!
//! Every type here is plain data with a stable camelCase JSON shape (the same shape as the
//! reference implementation), so a store may persist any of them as JSON text.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::event::Event;
use crate::json::{self, Json};

/// Identifies one `(poller, partition)`: the unit of leasing, state, snapshot, outbox and parking.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PKey {
    /// The poller's name.
    pub poller: String,
    /// The partition key; `""` for an unpartitioned poller.
    pub partition: String,
}

impl PKey {
    /// Builds a key from a poller name and a partition key.
    pub fn new(poller: impl Into<String>, partition: impl Into<String>) -> Self {
        Self {
            poller: poller.into(),
            partition: partition.into(),
        }
    }
}

impl fmt::Display for PKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.poller, self.partition)
    }
}

/// A lease on a key: who holds it, its fencing epoch and when it expires (epoch ms).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    /// The holder's instance id.
    pub owner: String,
    /// The fencing token: strictly increasing per key across every acquisition.
    pub epoch: i64,
    /// Expiry in epoch milliseconds; the lease may be taken by another owner at or after it.
    pub expires_at: i64,
}

/// The lane an event was produced on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Lane {
    /// Incremental polling driven by the schedule.
    Live,
    /// A periodic full listing that finds deletes.
    Reconcile,
    /// A bounded re-read of history from a given cursor.
    Backfill,
    /// Copies of logged events re-delivered on request.
    Replay,
}

impl Lane {
    /// Every lane, in priority order (live first).
    pub const ALL: [Lane; 4] = [Lane::Live, Lane::Reconcile, Lane::Backfill, Lane::Replay];

    /// The lane's name as it appears in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Lane::Live => "live",
            Lane::Reconcile => "reconcile",
            Lane::Backfill => "backfill",
            Lane::Replay => "replay",
        }
    }

    /// Budget priority: lower is served first (live 0, reconcile 1, backfill 2, replay 3).
    pub fn rank(self) -> u8 {
        match self {
            Lane::Live => 0,
            Lane::Reconcile => 1,
            Lane::Backfill => 2,
            Lane::Replay => 3,
        }
    }
}

impl fmt::Display for Lane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The persisted position of one lane.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LaneCursor {
    /// The strategy's serialized cursor (JSON text), or `None` for the strategy's initial cursor.
    pub cursor: Option<String>,
    /// Backfill only: the serialized cursor at which the backfill stops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Reconcile and backfill: whether the lane finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done: Option<bool>,
    /// Reconcile: when the last complete listing (or one cut short by the page cap) finished
    /// (epoch ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run_at: Option<i64>,
    /// Backfill: re-emit known unchanged items as `updated`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub force: Option<bool>,
    /// Reconcile and backfill: consecutive failures of this lane (lane-level backoff).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failures: Option<u32>,
    /// Reconcile and backfill: after a failure, the lane waits until this time (epoch ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<i64>,
    /// Full scans: identities the last complete listing of several pages did not name, in
    /// ascending order, not yet reported deleted. The next complete listing that misses one of
    /// them again deletes it (see [`DeleteConfirmation`](crate::DeleteConfirmation)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspects: Option<Vec<String>>,
}

/// The cursors of every lane of a key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lanes {
    /// The live lane.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<LaneCursor>,
    /// The reconcile lane.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconcile: Option<LaneCursor>,
    /// The backfill lane.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backfill: Option<LaneCursor>,
    /// The replay lane.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<LaneCursor>,
}

impl Lanes {
    /// The cursor of `lane`, if it ever ran.
    pub fn get(&self, lane: Lane) -> Option<&LaneCursor> {
        match lane {
            Lane::Live => self.live.as_ref(),
            Lane::Reconcile => self.reconcile.as_ref(),
            Lane::Backfill => self.backfill.as_ref(),
            Lane::Replay => self.replay.as_ref(),
        }
    }

    /// The slot of `lane`.
    pub fn slot(&mut self, lane: Lane) -> &mut Option<LaneCursor> {
        match lane {
            Lane::Live => &mut self.live,
            Lane::Reconcile => &mut self.reconcile,
            Lane::Backfill => &mut self.backfill,
            Lane::Replay => &mut self.replay,
        }
    }
}

/// The circuit breaker's position.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Circuit {
    /// Polling normally.
    #[default]
    Closed,
    /// Too many failures: only probes run, every `probe_every`.
    Open,
    /// A probe cycle is running.
    HalfOpen,
}

/// Where rate-limit information was read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RateLimitSource {
    /// IETF `RateLimit` / `RateLimit-Policy` structured fields.
    Ietf,
    /// `RateLimit-Limit` / `-Remaining` / `-Reset`.
    Legacy,
    /// `X-RateLimit-*` and similar vendor headers.
    Vendor,
}

/// Rate-limit information reported by the API.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RateLimitInfo {
    /// The quota per window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<i64>,
    /// Requests left in the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remaining: Option<i64>,
    /// When the window resets (epoch ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset_at: Option<i64>,
    /// The raw policy header, when one was sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// Which header family the values came from.
    pub source: RateLimitSource,
}

/// Counts of events by type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventCounts {
    /// `created` events.
    pub created: u64,
    /// `updated` events.
    pub updated: u64,
    /// `deleted` events.
    pub deleted: u64,
}

/// What one lane cycle did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PollSummary {
    /// The lane that ran.
    pub lane: Lane,
    /// When the cycle started (epoch ms).
    pub started_at: i64,
    /// How long it took.
    pub duration_ms: i64,
    /// Pages fetched.
    pub pages: u64,
    /// Items fetched.
    pub items: u64,
    /// Events committed, by type.
    pub events: EventCounts,
    /// The API answered 304 and no items were seen.
    pub not_modified: bool,
    /// The cycle stopped before the listing ended (page cap or deadline).
    pub truncated: bool,
}

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

/// The persisted schedule of a key (see the scheduler).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleState {
    /// When the live lane is next due (epoch ms); `None` means due now.
    pub next_due_at: Option<i64>,
    /// The current adaptive interval.
    pub interval_ms: Option<i64>,
    /// Failures since the last success.
    pub consecutive_failures: u32,
    /// The circuit breaker.
    pub circuit: Circuit,
    /// When the circuit last opened (epoch ms).
    pub circuit_opened_at: Option<i64>,
    /// Retry-After honoured until this time (epoch ms).
    pub throttled_until: Option<i64>,
    /// The last rate-limit information seen.
    pub rate_limit: Option<RateLimitInfo>,
    /// When the live lane last finished a cycle (epoch ms).
    pub last_poll_at: Option<i64>,
    /// What the last cycle did.
    pub last_poll: Option<PollSummary>,
    /// The last failure, cleared by a success.
    pub last_error: Option<SerializedError>,
}

/// Everything persisted per key apart from the snapshot, outbox, parked rows, validators and log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PollerState {
    /// Lane cursors.
    pub lanes: Lanes,
    /// The live lane's schedule.
    pub schedule: ScheduleState,
    /// Paused keys are not polled and their outbox is not drained.
    pub paused: bool,
    /// The schema version the snapshot was last written with.
    pub schema_version: Option<u32>,
    /// The last outbox sequence assigned on this key.
    pub sequence: i64,
    /// When the state was first written (epoch ms).
    pub created_at: i64,
    /// When the state was last written (epoch ms).
    pub updated_at: i64,
}

impl PollerState {
    /// The zero state: no lanes, an unscheduled closed circuit, not paused, sequence 0.
    pub fn zero(created_at: i64) -> Self {
        Self {
            lanes: Lanes::default(),
            schedule: ScheduleState::default(),
            paused: false,
            schema_version: None,
            sequence: 0,
            created_at,
            updated_at: created_at,
        }
    }

    /// Applies a patch: every field the patch sets replaces the whole top-level field.
    ///
    /// Stores that read, merge and write call this, so every store merges the same way.
    pub fn apply(&mut self, patch: &StatePatch) {
        if let Some(lanes) = &patch.lanes {
            self.lanes = lanes.clone();
        }
        if let Some(schedule) = &patch.schedule {
            self.schedule = schedule.clone();
        }
        if let Some(paused) = patch.paused {
            self.paused = paused;
        }
        if let Some(schema_version) = patch.schema_version {
            self.schema_version = Some(schema_version);
        }
        if let Some(sequence) = patch.sequence {
            self.sequence = sequence;
        }
        if let Some(updated_at) = patch.updated_at {
            self.updated_at = updated_at;
        }
    }

    /// The state after `patch` is applied to `current`, or to the zero state created at
    /// `patch.updated_at` (or 0) when there is none yet. `created_at` is never changed by a patch.
    pub fn patched(current: Option<PollerState>, patch: &StatePatch) -> PollerState {
        let mut state = current.unwrap_or_else(|| PollerState::zero(patch.updated_at.unwrap_or(0)));
        state.apply(patch);
        state
    }
}

/// A partial update of [`PollerState`]: each `Some` field replaces that top-level field.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatePatch {
    /// Replaces every lane cursor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lanes: Option<Lanes>,
    /// Replaces the schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<ScheduleState>,
    /// Sets the paused flag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// Sets the schema version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_version: Option<u32>,
    /// Sets the last assigned sequence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence: Option<i64>,
    /// Sets the update time (and the creation time of a state that does not exist yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<i64>,
}

impl StatePatch {
    /// The patch's set fields as `(camelCase name, JSON text)` pairs, for stores that keep one
    /// field per top-level property (a Redis hash, say).
    pub fn fields(&self) -> Vec<(&'static str, Json)> {
        let mut out = Vec::new();
        let mut push = |name: &'static str, value: Result<Json, serde_json::Error>| {
            if let Ok(json) = value {
                out.push((name, json));
            }
        };
        if let Some(v) = &self.lanes {
            push("lanes", Json::encode(v));
        }
        if let Some(v) = &self.schedule {
            push("schedule", Json::encode(v));
        }
        if let Some(v) = self.paused {
            push("paused", Json::encode(&v));
        }
        if let Some(v) = self.schema_version {
            push("schemaVersion", Json::encode(&v));
        }
        if let Some(v) = self.sequence {
            push("sequence", Json::encode(&v));
        }
        if let Some(v) = self.updated_at {
            push("updatedAt", Json::encode(&v));
        }
        out
    }

    /// True when the patch sets nothing.
    pub fn is_empty(&self) -> bool {
        *self == StatePatch::default()
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
    pub event_id: String,
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

/// Everything one page of a poll cycle commits, in one store transaction.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CommitBatch {
    /// The state change (cursor, schedule, sequence, ...).
    pub state_patch: StatePatch,
    /// Snapshot rows to insert or replace.
    pub upserts: Vec<ItemRow>,
    /// Identities to remove from the snapshot.
    pub deletes: Vec<String>,
    /// Outbox rows to insert or replace (by event id).
    pub events: Vec<OutboxRow>,
    /// Append the events to the replay log.
    pub log: bool,
    /// Parked rows to insert or replace (by id), e.g. quarantined items.
    pub parked: Vec<ParkedRow>,
    /// HTTP validators of the responses this page was built from, to insert or replace (by URL
    /// hash). They land with the page or not at all, so a stored validator always belongs to a
    /// committed response: a later `304 Not Modified` can be trusted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub validators: Vec<UrlValidator>,
}

/// The validators of one URL, as a page's commit writes them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UrlValidator {
    /// The URL's hash (see [`hash_url`](crate::diff::hash_url)).
    pub url_hash: String,
    /// Its validators.
    pub validator: Validator,
}

/// What a store supports, as far as the engine acts on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// The replay log is implemented (`commit_poll` appends when asked, `read_log` and
    /// `prune_log` work). An engine refuses a poller with `log_retention` on a store without it.
    pub log: bool,
}

/// Filters for [`crate::Store::read_log`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogQuery {
    /// Only entries with a sequence greater than this.
    pub after_sequence: Option<i64>,
    /// Only entries created at or after this time (epoch ms).
    pub from_time: Option<i64>,
    /// Only entries created at or before this time (epoch ms).
    pub to_time: Option<i64>,
}

/// What [`crate::Store::resolve_parked`] does with parked rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ParkedAction {
    /// Poison rows go back to the outbox as pending; their hold is released.
    Retry,
    /// The rows are deleted.
    Discard,
}

/// How many rows a key holds, as [`crate::Store::counts`] reads them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyCounts {
    /// Snapshot items.
    pub items: u64,
    /// Pending outbox rows.
    pub pending: u64,
    /// Parked rows of every kind.
    pub parked: u64,
}

/// Filters for [`crate::Store::list_parked`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ParkedQuery {
    /// Only rows of this kind.
    pub kind: Option<ParkedKind>,
    /// At most this many rows.
    pub limit: Option<usize>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patch_replaces_top_level_fields_and_keeps_created_at() {
        let lanes = Lanes {
            backfill: Some(LaneCursor {
                cursor: Some("1".into()),
                ..LaneCursor::default()
            }),
            ..Lanes::default()
        };
        let first = StatePatch {
            lanes: Some(lanes),
            sequence: Some(3),
            updated_at: Some(10),
            ..StatePatch::default()
        };
        let state = PollerState::patched(None, &first);
        assert_eq!(state.created_at, 10);
        assert_eq!(state.sequence, 3);
        let second = StatePatch {
            lanes: Some(Lanes::default()),
            updated_at: Some(20),
            ..StatePatch::default()
        };
        let state = PollerState::patched(Some(state), &second);
        assert_eq!(state.lanes, Lanes::default());
        assert_eq!(
            (state.created_at, state.updated_at, state.sequence),
            (10, 20, 3)
        );
    }

    #[test]
    fn patch_without_updated_at_creates_at_zero() {
        let state = PollerState::patched(
            None,
            &StatePatch {
                paused: Some(true),
                ..StatePatch::default()
            },
        );
        assert_eq!(state.created_at, 0);
        assert!(state.paused);
    }

    #[test]
    fn patch_fields_name_the_set_fields() {
        let patch = StatePatch {
            paused: Some(true),
            sequence: Some(7),
            ..StatePatch::default()
        };
        let fields: Vec<(&str, String)> = patch
            .fields()
            .into_iter()
            .map(|(k, v)| (k, v.as_str().to_owned()))
            .collect();
        assert_eq!(
            fields,
            vec![("paused", "true".to_owned()), ("sequence", "7".to_owned())]
        );
    }
}
