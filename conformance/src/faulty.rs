//! [`FaultyStore`]: a wrapper that injects failures and counts calls, for guarantee and chaos
//! tests.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use futures::stream::BoxStream;
use watukuy_core::{
    Capabilities, CommitBatch, Error, ItemRow, Lease, LogQuery, LoggedEvent, OutboxRow, PKey,
    ParkedQuery, ParkedRow, PollerState, Result, SerializedError, StatePatch, Store,
    StoreErrorKind, Validator,
};

/// A store operation that can fail on purpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// `acquire_lease`.
    AcquireLease,
    /// `renew_lease`.
    RenewLease,
    /// `release_lease`.
    ReleaseLease,
    /// `save_state`.
    SaveState,
    /// `commit_poll`.
    CommitPoll,
    /// `load_pending`.
    LoadPending,
    /// `ack_events`.
    AckEvents,
    /// `record_attempt`.
    RecordAttempt,
    /// `park_event`.
    ParkEvent,
}

/// Whether an injected failure happens before the call reaches the store (nothing written) or
/// after it succeeded (written, but the caller sees an error: a crash after the write).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Timing {
    /// Fail without calling the inner store.
    Before,
    /// Call the inner store, then fail.
    After,
}

/// Wraps a store, failing chosen operations on demand and counting what passes through.
pub struct FaultyStore {
    inner: Arc<dyn Store>,
    armed: Mutex<HashMap<(Op, Timing), u32>>,
    calls: Mutex<HashMap<Op, u64>>,
    max_pending_limit: AtomicUsize,
    max_pending_rows: AtomicUsize,
}

impl std::fmt::Debug for FaultyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultyStore").finish_non_exhaustive()
    }
}

impl FaultyStore {
    /// Wraps `inner` with no fault armed.
    pub fn new(inner: Arc<dyn Store>) -> Self {
        Self {
            inner,
            armed: Mutex::default(),
            calls: Mutex::default(),
            max_pending_limit: AtomicUsize::new(0),
            max_pending_rows: AtomicUsize::new(0),
        }
    }

    /// Makes the next `times` calls of `op` fail at `timing` with a transient store error.
    pub fn fail(&self, op: Op, timing: Timing, times: u32) {
        *self
            .armed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry((op, timing))
            .or_default() += times;
    }

    /// How many times `op` was called (failed calls included).
    pub fn calls(&self, op: Op) -> u64 {
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&op)
            .copied()
            .unwrap_or(0)
    }

    /// The largest `limit` ever passed to `load_pending`.
    pub fn max_load_pending_limit(&self) -> usize {
        self.max_pending_limit.load(Ordering::Relaxed)
    }

    /// The most rows one `load_pending` call ever returned.
    pub fn max_load_pending_rows(&self) -> usize {
        self.max_pending_rows.load(Ordering::Relaxed)
    }

    fn take(&self, op: Op, timing: Timing) -> Result<()> {
        let mut armed = self.armed.lock().unwrap_or_else(PoisonError::into_inner);
        match armed.get_mut(&(op, timing)) {
            Some(n) if *n > 0 => {
                *n -= 1;
                Err(Error::store(
                    StoreErrorKind::Other,
                    true,
                    format!("injected fault: {op:?} ({timing:?})"),
                ))
            }
            _ => Ok(()),
        }
    }

    /// Counts the call and applies a `Before` fault.
    fn before(&self, op: Op) -> Result<()> {
        *self
            .calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(op)
            .or_default() += 1;
        self.take(op, Timing::Before)
    }

    /// Applies an `After` fault to a successful result.
    fn after<T>(&self, op: Op, result: Result<T>) -> Result<T> {
        let value = result?;
        self.take(op, Timing::After)?;
        Ok(value)
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl Store for FaultyStore {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn migrate(&self) -> Result<()> {
        self.inner.migrate().await
    }

    async fn close(&self) -> Result<()> {
        self.inner.close().await
    }

    async fn acquire_lease(
        &self,
        key: &PKey,
        owner: &str,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<Option<Lease>> {
        self.before(Op::AcquireLease)?;
        let result = self.inner.acquire_lease(key, owner, ttl_ms, now_ms).await;
        self.after(Op::AcquireLease, result)
    }

    async fn renew_lease(
        &self,
        key: &PKey,
        lease: &Lease,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<bool> {
        self.before(Op::RenewLease)?;
        let result = self.inner.renew_lease(key, lease, ttl_ms, now_ms).await;
        self.after(Op::RenewLease, result)
    }

    async fn release_lease(&self, key: &PKey, lease: &Lease) -> Result<()> {
        self.before(Op::ReleaseLease)?;
        let result = self.inner.release_lease(key, lease).await;
        self.after(Op::ReleaseLease, result)
    }

    async fn get_lease(&self, key: &PKey) -> Result<Option<Lease>> {
        self.inner.get_lease(key).await
    }

    async fn load_state(&self, key: &PKey) -> Result<Option<PollerState>> {
        self.inner.load_state(key).await
    }

    async fn save_state(&self, key: &PKey, lease: &Lease, patch: &StatePatch) -> Result<()> {
        self.before(Op::SaveState)?;
        let result = self.inner.save_state(key, lease, patch).await;
        self.after(Op::SaveState, result)
    }

    async fn save_state_unfenced(&self, key: &PKey, patch: &StatePatch) -> Result<()> {
        self.inner.save_state_unfenced(key, patch).await
    }

    async fn list_keys(&self, poller: Option<&str>) -> Result<Vec<PKey>> {
        self.inner.list_keys(poller).await
    }

    async fn delete_key(&self, key: &PKey) -> Result<()> {
        self.inner.delete_key(key).await
    }

    async fn clear_items(&self, key: &PKey) -> Result<()> {
        self.inner.clear_items(key).await
    }

    async fn load_versions(
        &self,
        key: &PKey,
        identities: &[String],
    ) -> Result<HashMap<String, ItemRow>> {
        self.inner.load_versions(key, identities).await
    }

    fn stream_identities<'a>(
        &'a self,
        key: &'a PKey,
        batch_size: usize,
    ) -> BoxStream<'a, Result<Vec<String>>> {
        self.inner.stream_identities(key, batch_size)
    }

    async fn count_items(&self, key: &PKey) -> Result<u64> {
        self.inner.count_items(key).await
    }

    async fn commit_poll(&self, key: &PKey, lease: &Lease, batch: &CommitBatch) -> Result<()> {
        self.before(Op::CommitPoll)?;
        let result = self.inner.commit_poll(key, lease, batch).await;
        self.after(Op::CommitPoll, result)
    }

    async fn load_pending(&self, key: &PKey, limit: usize) -> Result<Vec<OutboxRow>> {
        self.before(Op::LoadPending)?;
        self.max_pending_limit.fetch_max(limit, Ordering::Relaxed);
        let result = self.inner.load_pending(key, limit).await;
        if let Ok(rows) = &result {
            self.max_pending_rows
                .fetch_max(rows.len(), Ordering::Relaxed);
        }
        self.after(Op::LoadPending, result)
    }

    async fn count_pending(&self, key: &PKey) -> Result<u64> {
        self.inner.count_pending(key).await
    }

    async fn ack_events(&self, key: &PKey, lease: &Lease, ids: &[String]) -> Result<()> {
        self.before(Op::AckEvents)?;
        let result = self.inner.ack_events(key, lease, ids).await;
        self.after(Op::AckEvents, result)
    }

    async fn record_attempt(
        &self,
        key: &PKey,
        lease: &Lease,
        id: &str,
        error: &SerializedError,
        next_attempt_at: Option<i64>,
    ) -> Result<()> {
        self.before(Op::RecordAttempt)?;
        let result = self
            .inner
            .record_attempt(key, lease, id, error, next_attempt_at)
            .await;
        self.after(Op::RecordAttempt, result)
    }

    async fn park_event(&self, key: &PKey, lease: &Lease, row: &ParkedRow) -> Result<()> {
        self.before(Op::ParkEvent)?;
        let result = self.inner.park_event(key, lease, row).await;
        self.after(Op::ParkEvent, result)
    }

    async fn list_parked(&self, key: &PKey, query: ParkedQuery) -> Result<Vec<ParkedRow>> {
        self.inner.list_parked(key, query).await
    }

    async fn count_parked(&self, key: &PKey) -> Result<u64> {
        self.inner.count_parked(key).await
    }

    async fn retry_parked(&self, key: &PKey, ids: &[String]) -> Result<u64> {
        self.inner.retry_parked(key, ids).await
    }

    async fn discard_parked(&self, key: &PKey, ids: &[String]) -> Result<u64> {
        self.inner.discard_parked(key, ids).await
    }

    async fn held_keys(&self, key: &PKey) -> Result<Vec<String>> {
        self.inner.held_keys(key).await
    }

    async fn get_validator(&self, key: &PKey, url_hash: &str) -> Result<Option<Validator>> {
        self.inner.get_validator(key, url_hash).await
    }

    async fn set_validator(
        &self,
        key: &PKey,
        lease: &Lease,
        url_hash: &str,
        validator: &Validator,
    ) -> Result<()> {
        self.inner
            .set_validator(key, lease, url_hash, validator)
            .await
    }

    async fn read_log(
        &self,
        key: &PKey,
        query: LogQuery,
        limit: usize,
    ) -> Result<Vec<LoggedEvent>> {
        self.inner.read_log(key, query, limit).await
    }

    async fn prune_log(&self, key: &PKey, older_than: i64) -> Result<u64> {
        self.inner.prune_log(key, older_than).await
    }
}
