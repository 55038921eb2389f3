//! A key's persisted state: the schedule, the last poll, and patches to them.

use serde::{Deserialize, Serialize};

use crate::Lane;
use crate::json::Json;
use crate::store::{Lanes, SerializedError};

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
    /// Items that failed validation and were quarantined (`on_invalid: quarantine`); 0 in
    /// summaries written before the field existed.
    #[serde(default)]
    pub quarantined: u64,
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
