//! Operator operations on one key (see [`crate::ops`], which they call): trigger, pause,
//! resume, reset the cursor, backfill, replay, parked rows.

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::model::{PKey, ParkedQuery, ParkedRow, PollerState, StatePatch};
use crate::runner::Runtime;
use crate::schedule;

/// Options of [`Engine::backfill`].
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct BackfillOptions {
    /// Where to start, as the API writes its cursor (`None`: the beginning).
    pub from: Option<String>,
    /// Where to stop, as the API writes its cursor (`None`: the live cursor at the time of the
    /// call, or the end of the listing when the live lane never ran).
    pub to: Option<String>,
    /// Re-emit known, unchanged items as `updated`.
    pub force: bool,
}

impl BackfillOptions {
    /// Starts at this cursor, as the API writes it (default: the beginning).
    #[must_use]
    pub fn from_cursor(mut self, raw: impl Into<String>) -> Self {
        self.from = Some(raw.into());
        self
    }

    /// Stops at this cursor, as the API writes it (default: the live cursor at the call).
    #[must_use]
    pub fn to_cursor(mut self, raw: impl Into<String>) -> Self {
        self.to = Some(raw.into());
        self
    }

    /// Re-emits known, unchanged items as `updated`.
    #[must_use]
    pub fn force(mut self, force: bool) -> Self {
        self.force = force;
        self
    }
}

impl Engine {
    pub(super) fn key_for(&self, name: &str, partition: Option<&str>) -> Result<(PKey, &Runtime)> {
        let rt = self.runtime(name)?;
        match (rt.def.partitions.is_some(), partition) {
            (true, None) => Err(Error::config(
                "partition",
                format!("poller '{name}' is partitioned; pass a partition"),
            )),
            (false, Some(p)) if !p.is_empty() => Err(Error::config(
                "partition",
                format!("poller '{name}' is not partitioned; got partition {p:?}"),
            )),
            (_, p) => Ok((PKey::new(name, p.unwrap_or_default()), rt)),
        }
    }

    /// An operator's write (unfenced: it never touches the lease), then a wake-up so a running
    /// daemon looks at the key again.
    pub(super) async fn admin_write(&self, key: &PKey, patch: &StatePatch) -> Result<()> {
        self.woken(key, self.inner.shared.store.save_state_unfenced(key, patch))
            .await
    }

    /// Runs an operation on `key`, then wakes the daemon so it looks at that key again.
    async fn woken<T>(&self, key: &PKey, op: impl Future<Output = Result<T>>) -> Result<T> {
        let out = op.await?;
        self.inner.wake_key(key);
        Ok(out)
    }

    /// What a key that never ran looks like to this engine: the poller's initial schedule.
    pub(super) fn initial_state(&self, rt: &Runtime) -> PollerState {
        let now = self.inner.now();
        let mut state = PollerState::zero(now);
        state.schedule = schedule::initial_schedule(&rt.def.schedule, now);
        state
    }

    pub(super) async fn state_or_initial(&self, key: &PKey, rt: &Runtime) -> Result<PollerState> {
        crate::ops::state_or(&*self.inner.shared.store, key, self.initial_state(rt)).await
    }

    /// How this engine waits for a key's lease in an operation (a replay).
    pub(super) fn lease_retry(&self) -> crate::ops::LeaseRetry {
        crate::ops::LeaseRetry {
            ttl_ms: self.inner.shared.lease_ttl_ms,
            ..crate::ops::LeaseRetry::default()
        }
    }

    /// Makes a key due now (an open circuit stays open: the run is a half-open probe).
    pub async fn trigger(&self, name: &str, partition: Option<&str>) -> Result<()> {
        let (key, rt) = self.key_for(name, partition)?;
        let store = &*self.inner.shared.store;
        let due = crate::ops::make_due(store, &key, self.inner.now(), self.initial_state(rt));
        self.woken(&key, due).await
    }

    /// Pauses a key: it is not polled and its outbox is not drained.
    pub async fn pause(&self, name: &str, partition: Option<&str>) -> Result<()> {
        let (key, _) = self.key_for(name, partition)?;
        let paused = crate::ops::pause(&*self.inner.shared.store, &key, self.inner.now());
        self.woken(&key, paused).await
    }

    /// Resumes a paused key and makes it due now.
    pub async fn resume(&self, name: &str, partition: Option<&str>) -> Result<()> {
        let (key, rt) = self.key_for(name, partition)?;
        let store = &*self.inner.shared.store;
        let resumed = crate::ops::resume(store, &key, self.inner.now(), self.initial_state(rt));
        self.woken(&key, resumed).await
    }

    /// Moves the live cursor to `to` (a raw API value; `None` = the strategy's beginning) and
    /// makes the key due. With `clear_snapshot`, the item snapshot is dropped too, so every item
    /// is re-emitted as `created` with the same ids as before.
    pub async fn reset_cursor(
        &self,
        name: &str,
        partition: Option<&str>,
        to: Option<&str>,
        clear_snapshot: bool,
    ) -> Result<()> {
        let (key, rt) = self.key_for(name, partition)?;
        let strategy = &rt.def.strategy;
        let cursor = match to {
            Some(raw) => Some(strategy.serialize(&strategy.from_raw(Some(raw))?)),
            None => None,
        };
        let store = &*self.inner.shared.store;
        let (now, initial) = (self.inner.now(), self.initial_state(rt));
        let reset = crate::ops::reset_cursor(store, &key, cursor, clear_snapshot, now, initial);
        self.woken(&key, reset).await
    }

    /// Starts (or replaces) a backfill: the key re-reads history from `from` to `to` on the
    /// backfill lane, after its live lane, until it reaches `to` (or the listing ends). Known,
    /// unchanged items emit nothing unless `force`. Rejected for `snapshot_diff` pollers.
    pub async fn backfill(
        &self,
        name: &str,
        partition: Option<&str>,
        options: BackfillOptions,
    ) -> Result<()> {
        let (key, rt) = self.key_for(name, partition)?;
        let strategy = &rt.def.strategy;
        if strategy.is_full_scan() {
            return Err(Error::config(
                "backfill",
                format!(
                    "poller '{name}' uses `{}`, which lists everything every cycle",
                    strategy.name()
                ),
            ));
        }
        let state = self.state_or_initial(&key, rt).await?;
        let from = strategy.serialize(&strategy.from_raw(options.from.as_deref())?);
        let target = match options.to.as_deref() {
            Some(raw) => Some(strategy.serialize(&strategy.from_raw(Some(raw))?)),
            None => state.lanes.live.as_ref().and_then(|l| l.cursor.clone()),
        };
        let mut lanes = state.lanes.clone();
        lanes.backfill = Some(crate::model::LaneCursor {
            cursor: Some(from),
            target,
            done: Some(false),
            force: Some(options.force),
            ..Default::default()
        });
        let now = self.inner.now();
        let patch = StatePatch {
            lanes: Some(lanes),
            updated_at: Some(now),
            ..StatePatch::default()
        };
        self.admin_write(&key, &patch).await
    }

    /// Re-delivers logged events committed between `from_ms` and `to_ms` (epoch ms, inclusive;
    /// `None`: up to now): copies go to the outbox with their original ids, lane `replay` and
    /// fresh sequences, and are delivered on the key's next drain. An event still pending in the
    /// outbox is replaced by its copy (same id), not duplicated. Needs the poller's `log`.
    /// Returns how many events were queued.
    pub async fn replay(
        &self,
        name: &str,
        partition: Option<&str>,
        from_ms: i64,
        to_ms: Option<i64>,
    ) -> Result<u64> {
        let (key, rt) = self.key_for(name, partition)?;
        if rt.def.log_retention.is_none() {
            return Err(Error::ReplayUnavailable {
                poller: name.to_owned(),
            });
        }
        let shared = &self.inner.shared;
        let replayed = crate::ops::replay(
            &*shared.store,
            &*shared.clock,
            &key,
            &shared.instance_id,
            self.lease_retry(),
            (from_ms, to_ms),
            self.initial_state(rt),
        )
        .await?;
        self.inner.wake_key(&key);
        Ok(replayed)
    }

    /// Parked rows of a key (poison and invalid), oldest first.
    pub async fn list_parked(
        &self,
        name: &str,
        partition: Option<&str>,
        query: ParkedQuery,
    ) -> Result<Vec<ParkedRow>> {
        let (key, _) = self.key_for(name, partition)?;
        self.inner.shared.store.list_parked(&key, query).await
    }

    /// Moves parked poison events back to the outbox (their hold released) and wakes the key.
    /// Returns how many moved. Each id must name a poison row of the key: a quarantined item
    /// cannot be retried ([`Error::Config`]) and an unknown id is [`Error::NotFound`], naming
    /// it; then nothing moves (the rules of [`ops::retry_parked`](crate::ops::retry_parked)).
    pub async fn retry_parked(
        &self,
        name: &str,
        partition: Option<&str>,
        ids: &[String],
    ) -> Result<u64> {
        let (key, _) = self.key_for(name, partition)?;
        let selection = crate::ops::ParkedSelection::ids(ids.iter().cloned());
        let retried = crate::ops::retry_parked(&*self.inner.shared.store, &key, &selection);
        Ok(self.woken(&key, retried).await?.len() as u64)
    }

    /// Deletes parked rows (releasing their hold). Returns how many were removed. Each id must
    /// name a parked row of the key, else [`Error::NotFound`] names it and nothing is removed.
    pub async fn discard_parked(
        &self,
        name: &str,
        partition: Option<&str>,
        ids: &[String],
    ) -> Result<u64> {
        let (key, _) = self.key_for(name, partition)?;
        let selection = crate::ops::ParkedSelection::ids(ids.iter().cloned());
        let discarded = crate::ops::discard_parked(&*self.inner.shared.store, &key, &selection);
        Ok(self.woken(&key, discarded).await?.len() as u64)
    }
}
