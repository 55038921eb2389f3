//! What goes into and comes out of a store call: a page's commit, queries, counts, capabilities.

use super::*;

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
