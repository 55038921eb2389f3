//! The operations, on a store alone: what each command does, without rendering.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use watukuy_core::{
    clock::{Clock, SystemClock},
    ops,
    store::{PKey, ParkedKind, ParkedRow, PollerState, Store},
};

use crate::CliError;

/// The lease owner the command line uses for `replay`.
pub const CLI_OWNER: &str = "watukuy-cli";

/// How long the command line's lease lasts (renewed after every page of a replay).
pub const CLI_LEASE_TTL_MS: i64 = 60_000;

/// Log entries copied per commit by `replay` (as the engine does).
pub const REPLAY_PAGE: usize = watukuy_core::ops::REPLAY_PAGE;

/// What `inspect` reports: one entry per key the store holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The store, password redacted.
    pub store: String,
    /// When the report was made (epoch ms).
    pub generated_at: i64,
    /// One entry per `(poller, partition)` in the store, sorted.
    pub pollers: Vec<KeyInspect>,
}

/// The state of one `(poller, partition)` as the store holds it: the fields of
/// [`watukuy_core::ops::PollerInspect`] that live in the store, with the same names and JSON shape
/// (the engine's in-memory counters are not in the store, so not here).
pub use watukuy_core::ops::KeyInspect;

/// A store, a clock and how patiently to wait for a lease: everything the commands need.
#[derive(Clone)]
pub struct Session {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    label: String,
    lease_tries: u32,
    lease_retry: Duration,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("store", &self.label)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Commands on `store`, with the system clock; `label` names the store in reports.
    pub fn new(store: Arc<dyn Store>, label: impl Into<String>) -> Self {
        Self {
            store,
            clock: Arc::new(SystemClock),
            label: label.into(),
            lease_tries: 20,
            lease_retry: Duration::from_millis(250),
        }
    }

    /// Uses another clock (tests drive it by hand).
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// How often `replay` tries to take a key held by a running engine, and how long it waits
    /// between tries (default 20 × 250 ms, like the engine).
    #[must_use]
    pub fn with_lease_retry(mut self, tries: u32, every: Duration) -> Self {
        self.lease_tries = tries.max(1);
        self.lease_retry = every;
        self
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The store's label (its URL, password redacted).
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Now, on the session's clock.
    pub fn now(&self) -> i64 {
        self.clock.now_ms()
    }

    /// Creates or upgrades the schema.
    pub async fn migrate(&self) -> Result<(), CliError> {
        Ok(self.store.migrate().await?)
    }

    /// The keys of the store (of one poller), sorted ([`ops::stored_keys`]).
    pub async fn keys(&self, poller: Option<&str>) -> Result<Vec<PKey>, CliError> {
        Ok(ops::stored_keys(&*self.store, poller).await?)
    }

    /// The key a command works on: the poller must have keys in the store; a partitioned
    /// poller needs `partition`, and the partition must exist ([`ops::stored_key`]).
    pub async fn key(&self, poller: &str, partition: Option<&str>) -> Result<PKey, CliError> {
        Ok(ops::stored_key(&*self.store, poller, partition).await?)
    }

    /// What the store holds about every key (of one poller, of one partition), as
    /// [`ops::inspect_store`] reads it.
    ///
    /// Every field is read from the store as [`watukuy_core::Engine::inspect`] reads it, with two
    /// differences that come from not having the pollers' code: a key whose state was never
    /// saved shows the default schedule (due now), and `lagMs` is computed for cursors of the
    /// timestamp strategy's shape (`{"value", "tieBreak"}`) whose value the default timestamp
    /// parser reads.
    pub async fn inspect(
        &self,
        poller: Option<&str>,
        partition: Option<&str>,
    ) -> Result<Report, CliError> {
        let now = self.now();
        Ok(Report {
            store: self.label.clone(),
            generated_at: now,
            pollers: ops::inspect_store(&*self.store, poller, partition, now).await?,
        })
    }

    /// Parked rows of a key, oldest first (filtered by id and kind).
    pub async fn parked(
        &self,
        key: &PKey,
        ids: Option<&[String]>,
        kind: Option<ParkedKind>,
        limit: Option<usize>,
    ) -> Result<Vec<ParkedRow>, CliError> {
        let selection = selection(ids, kind, limit);
        Ok(ops::list_parked(&*self.store, key, &selection).await?)
    }

    /// Moves poison rows back to the outbox (every poison row of the key when `ids` is
    /// `None`), with the rules of [`ops::retry_parked`]. Returns the ids that moved. The key's
    /// next run delivers them.
    pub async fn retry_parked(
        &self,
        key: &PKey,
        ids: Option<&[String]>,
        kind: Option<ParkedKind>,
    ) -> Result<Vec<String>, CliError> {
        let selection = selection(ids, kind, None);
        Ok(ops::retry_parked(&*self.store, key, &selection).await?)
    }

    /// Deletes parked rows (every row of the key, of `kind`, when `ids` is `None`), with the
    /// rules of [`ops::discard_parked`]. Returns the ids removed.
    pub async fn discard_parked(
        &self,
        key: &PKey,
        ids: Option<&[String]>,
        kind: Option<ParkedKind>,
    ) -> Result<Vec<String>, CliError> {
        let selection = selection(ids, kind, None);
        Ok(ops::discard_parked(&*self.store, key, &selection).await?)
    }

    async fn state(&self, key: &PKey) -> Result<PollerState, CliError> {
        Ok(ops::state_or(&*self.store, key, PollerState::zero(self.now())).await?)
    }

    /// Pauses a key (unfenced write of `paused: true`).
    pub async fn pause(&self, key: &PKey) -> Result<(), CliError> {
        Ok(ops::pause(&*self.store, key, self.now()).await?)
    }

    /// Resumes a key and makes it due now.
    pub async fn resume(&self, key: &PKey) -> Result<(), CliError> {
        let now = self.now();
        Ok(ops::resume(&*self.store, key, now, PollerState::zero(now)).await?)
    }

    /// Makes a key due now (`next_due_at = now`, throttle cleared; an open circuit stays open).
    pub async fn trigger(&self, key: &PKey) -> Result<(), CliError> {
        let now = self.now();
        Ok(ops::make_due(&*self.store, key, now, PollerState::zero(now)).await?)
    }

    /// Sets the live cursor to `cursor` (the strategy's cursor as JSON text; `None` for its
    /// initial cursor) and makes the key due; with `clear_snapshot` the item snapshot is
    /// dropped first.
    ///
    /// The text must be JSON, and when the key already has a live cursor, of the same shape
    /// (same JSON type, same object keys): the poller's strategy would reject anything else
    /// on its next run.
    pub async fn reset_cursor(
        &self,
        key: &PKey,
        cursor: Option<&str>,
        clear_snapshot: bool,
    ) -> Result<(), CliError> {
        let state = self.state(key).await?;
        let current = state.lanes.live.as_ref().and_then(|l| l.cursor.clone());
        let cursor = match cursor {
            None => None,
            Some(text) => Some(check_cursor(text.trim(), current.as_deref())?),
        };
        let now = self.now();
        Ok(ops::reset_cursor(&*self.store, key, cursor, clear_snapshot, now, state).await?)
    }

    /// Copies the events logged on `key` between `from_ms` and `to_ms` (inclusive; `None`: up
    /// to now) into the outbox, as [`watukuy_core::Engine::replay`] does (both call
    /// [`watukuy_core::ops::replay`]): under the key's lease (owner [`CLI_OWNER`], renewed after
    /// every page of [`REPLAY_PAGE`]), with their original ids, lane `replay`, fresh sequences
    /// continuing the key's, attempt 0, and not logged again. The key's next run delivers them.
    /// Returns how many were queued.
    ///
    /// The poller must keep a log (`PollerBuilder::log`); the command line cannot see the
    /// poller's configuration, so a poller without one simply replays nothing.
    pub async fn replay(
        &self,
        key: &PKey,
        from_ms: i64,
        to_ms: Option<i64>,
    ) -> Result<u64, CliError> {
        if !self.store.capabilities().log {
            return Err(CliError::new(
                "REPLAY_UNAVAILABLE",
                "this store keeps no replay log",
            ));
        }
        let retry = ops::LeaseRetry {
            tries: self.lease_tries,
            every: self.lease_retry,
            ttl_ms: CLI_LEASE_TTL_MS,
        };
        let initial = PollerState::zero(self.now());
        Ok(ops::replay(
            &*self.store,
            &*self.clock,
            key,
            CLI_OWNER,
            retry,
            (from_ms, to_ms),
            initial,
        )
        .await?)
    }
}

/// The parked rows `--ids`, `--kind` and `--limit` select.
fn selection(
    ids: Option<&[String]>,
    kind: Option<ParkedKind>,
    limit: Option<usize>,
) -> ops::ParkedSelection {
    let mut selection = match ids {
        Some(ids) => ops::ParkedSelection::ids(ids.iter().cloned()),
        None => ops::ParkedSelection::all(),
    };
    if let Some(kind) = kind {
        selection = selection.kind(kind);
    }
    if let Some(limit) = limit {
        selection = selection.limit(limit);
    }
    selection
}

/// The JSON kind and, for objects, the sorted keys: what must not change across a reset.
fn shape(value: &serde_json::Value) -> String {
    use serde_json::Value;
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(_) => "a boolean".to_owned(),
        Value::Number(_) => "a number".to_owned(),
        Value::String(_) => "a string".to_owned(),
        Value::Array(_) => "an array".to_owned(),
        Value::Object(map) => {
            let mut keys: Vec<&str> = map.keys().map(String::as_str).collect();
            keys.sort_unstable();
            format!("an object with keys {keys:?}")
        }
    }
}

/// Checks a new cursor's text against the current one; returns the text to store.
fn check_cursor(text: &str, current: Option<&str>) -> Result<String, CliError> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| {
        CliError::config(format!(
            "--to must be the cursor as JSON text (as `inspect --json` shows it) or `null`; \
             '{text}' is not JSON: {e}"
        ))
    })?;
    if let Some(current) = current
        && let Ok(existing) = serde_json::from_str::<serde_json::Value>(current)
        && !existing.is_null()
        && shape(&existing) != shape(&value)
    {
        return Err(CliError::config(format!(
            "--to is {}, but the poller's cursor is {} (currently {current}); the poller would \
             reject it on its next run",
            shape(&value),
            shape(&existing)
        )));
    }
    Ok(text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_checks_keep_the_shape() {
        let current = r#"{"value":"2026-01-01T00:00:00Z","tieBreak":"a"}"#;
        assert_eq!(
            check_cursor(
                r#"{"tieBreak":null,"value":"2025-01-01T00:00:00Z"}"#,
                Some(current)
            )
            .unwrap(),
            r#"{"tieBreak":null,"value":"2025-01-01T00:00:00Z"}"#
        );
        let error = check_cursor(r#"{"page":1}"#, Some(current)).unwrap_err();
        assert!(
            error.message.contains("\"tieBreak\", \"value\""),
            "{}",
            error.message
        );
        assert!(check_cursor("2025-01-01", Some(current)).is_err());
        assert!(check_cursor("not json", None).is_err());
        assert_eq!(check_cursor("7", None).unwrap(), "7");
        assert_eq!(check_cursor("7", Some("null")).unwrap(), "7");
    }
}
