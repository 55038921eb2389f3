//! What goes into and comes out of a store call: a page's commit, queries, counts, capabilities.

use serde::{Deserialize, Serialize};

use crate::store::{ItemRow, OutboxRow, ParkedKind, ParkedRow, StatePatch, Validator};

/// Everything one page of a poll cycle commits, in one store transaction.
///
/// A store reads the fields; the engine (or a test) builds one with `CommitBatch::default()` and
/// the setters. A field added later is a new promise of `commit_poll` with its own conformance
/// case, so a store that ignores it fails the suite rather than the build.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
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

impl CommitBatch {
    /// Sets the state change.
    #[must_use]
    pub fn state_patch(mut self, patch: StatePatch) -> Self {
        self.state_patch = patch;
        self
    }

    /// Sets the snapshot rows to insert or replace.
    #[must_use]
    pub fn upserts(mut self, rows: Vec<ItemRow>) -> Self {
        self.upserts = rows;
        self
    }

    /// Sets the identities to remove from the snapshot.
    #[must_use]
    pub fn deletes(mut self, identities: Vec<String>) -> Self {
        self.deletes = identities;
        self
    }

    /// Sets the outbox rows to insert or replace.
    #[must_use]
    pub fn events(mut self, rows: Vec<OutboxRow>) -> Self {
        self.events = rows;
        self
    }

    /// Sets whether the events are appended to the replay log.
    #[must_use]
    pub fn log(mut self, log: bool) -> Self {
        self.log = log;
        self
    }

    /// Sets the parked rows to insert or replace.
    #[must_use]
    pub fn parked(mut self, rows: Vec<ParkedRow>) -> Self {
        self.parked = rows;
        self
    }

    /// Sets the HTTP validators written with the page.
    #[must_use]
    pub fn validators(mut self, validators: Vec<UrlValidator>) -> Self {
        self.validators = validators;
        self
    }
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Capabilities {
    /// The replay log is implemented (`commit_poll` appends when asked, `read_log` and
    /// `prune_log` work). An engine refuses a poller with `log_retention` on a store without it.
    pub log: bool,
}

impl Capabilities {
    /// Says whether the replay log is implemented (`Capabilities::default()` says it is not).
    ///
    /// ```
    /// use watukuy_core::store::Capabilities;
    ///
    /// assert!(Capabilities::default().with_log(true).log);
    /// ```
    #[must_use]
    pub fn with_log(mut self, log: bool) -> Self {
        self.log = log;
        self
    }
}

/// Filters for [`crate::store::Store::read_log`]: `LogQuery::default()` (everything), then the setters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LogQuery {
    /// Only entries with a sequence greater than this.
    pub after_sequence: Option<i64>,
    /// Only entries created at or after this time (epoch ms).
    pub from_time: Option<i64>,
    /// Only entries created at or before this time (epoch ms).
    pub to_time: Option<i64>,
}

impl LogQuery {
    /// Only entries with a sequence greater than `sequence`.
    #[must_use]
    pub fn after_sequence(mut self, sequence: i64) -> Self {
        self.after_sequence = Some(sequence);
        self
    }

    /// Only entries created at or after `time` (epoch ms).
    #[must_use]
    pub fn from_time(mut self, time: i64) -> Self {
        self.from_time = Some(time);
        self
    }

    /// Only entries created at or before `time` (epoch ms).
    #[must_use]
    pub fn to_time(mut self, time: i64) -> Self {
        self.to_time = Some(time);
        self
    }
}

/// What [`crate::store::Store::resolve_parked`] does with parked rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ParkedAction {
    /// Poison rows go back to the outbox as pending; their hold is released.
    Retry,
    /// The rows are deleted.
    Discard,
}

/// How many rows a key holds, as [`crate::store::Store::counts`] reads them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyCounts {
    /// Snapshot items.
    pub items: u64,
    /// Pending outbox rows.
    pub pending: u64,
    /// Parked rows of every kind.
    pub parked: u64,
}

/// Filters for [`crate::store::Store::list_parked`]: `ParkedQuery::default()` (every row), then the
/// setters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ParkedQuery {
    /// Only rows of this kind.
    pub kind: Option<ParkedKind>,
    /// At most this many rows.
    pub limit: Option<usize>,
}

impl ParkedQuery {
    /// Only rows of this kind.
    #[must_use]
    pub fn kind(mut self, kind: ParkedKind) -> Self {
        self.kind = Some(kind);
        self
    }

    /// At most this many rows.
    #[must_use]
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = Some(limit);
        self
    }
}
