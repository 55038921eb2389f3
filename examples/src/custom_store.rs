//! A tiny custom store: [`CountingStore`] wraps any [`Store`] and counts the calls it forwards.
//!
//! Try it with `cargo run -p watukuy-examples --bin custom_store`, and run the whole conformance
//! suite on it with `cargo test -p watukuy-examples --test custom_store`.
//!
//! This is the template for a store of your own (a new backend, or a wrapper adding metrics,
//! caching or tracing to an existing one):
//!
//! 1. implement every method of [`Store`]; `#[deny(clippy::missing_trait_methods)]` on the impl
//!    makes clippy fail when a method is left to a default or a new one is added to the trait,
//!    so a wrapper never silently skips a call;
//! 2. keep each method's contract (the doc comment of each [`Store`] method says what it must
//!    guarantee: fencing by lease epoch, one transaction per `commit_poll`, ...);
//! 3. add a test file with a [`Harness`](watukuy_conformance::Harness) that hands out a fresh,
//!    migrated store per case, and `watukuy_conformance::store_tests!(YourHarness);` — one
//!    `#[test]` per conformance case (see `examples/tests/custom_store.rs`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use futures::stream::BoxStream;
use watukuy_core::{
    Result,
    store::{
        Capabilities, Claim, CommitBatch, ItemRow, KeyCounts, Lease, LogQuery, LoggedEvent,
        OutboxRow, PKey, ParkedAction, ParkedQuery, ParkedRow, PollerState, SerializedError,
        StatePatch, Store, Validator,
    },
};

/// A store that forwards every call to `inner` and counts them.
pub struct CountingStore {
    inner: Arc<dyn Store>,
    calls: AtomicU64,
    commits: AtomicU64,
}

impl CountingStore {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Store>) -> Self {
        Self {
            inner,
            calls: AtomicU64::new(0),
            commits: AtomicU64::new(0),
        }
    }

    /// Calls forwarded so far (every method).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// `commit_poll` calls forwarded so far (one per committed page).
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    fn count(&self) -> &dyn Store {
        self.calls.fetch_add(1, Ordering::Relaxed);
        &*self.inner
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl Store for CountingStore {
    fn capabilities(&self) -> Capabilities {
        self.count().capabilities()
    }

    async fn migrate(&self) -> Result<()> {
        self.count().migrate().await
    }

    async fn close(&self) -> Result<()> {
        self.count().close().await
    }

    async fn acquire_lease(
        &self,
        key: &PKey,
        owner: &str,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<Option<Lease>> {
        self.count().acquire_lease(key, owner, ttl_ms, now_ms).await
    }

    async fn claim(
        &self,
        key: &PKey,
        owner: &str,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<Option<Claim>> {
        self.count().claim(key, owner, ttl_ms, now_ms).await
    }

    async fn renew_lease(
        &self,
        key: &PKey,
        lease: &Lease,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<bool> {
        self.count().renew_lease(key, lease, ttl_ms, now_ms).await
    }

    async fn release_lease(&self, key: &PKey, lease: &Lease) -> Result<()> {
        self.count().release_lease(key, lease).await
    }

    async fn get_lease(&self, key: &PKey) -> Result<Option<Lease>> {
        self.count().get_lease(key).await
    }

    async fn load_state(&self, key: &PKey) -> Result<Option<PollerState>> {
        self.count().load_state(key).await
    }

    async fn save_state(&self, key: &PKey, lease: &Lease, patch: &StatePatch) -> Result<()> {
        self.count().save_state(key, lease, patch).await
    }

    async fn save_state_unfenced(&self, key: &PKey, patch: &StatePatch) -> Result<()> {
        self.count().save_state_unfenced(key, patch).await
    }

    async fn list_keys(&self, poller: Option<&str>) -> Result<Vec<PKey>> {
        self.count().list_keys(poller).await
    }

    async fn delete_key(&self, key: &PKey) -> Result<()> {
        self.count().delete_key(key).await
    }

    async fn clear_items(&self, key: &PKey) -> Result<()> {
        self.count().clear_items(key).await
    }

    async fn load_versions(
        &self,
        key: &PKey,
        identities: &[String],
    ) -> Result<HashMap<String, ItemRow>> {
        self.count().load_versions(key, identities).await
    }

    fn stream_identities<'a>(
        &'a self,
        key: &'a PKey,
        batch_size: usize,
    ) -> BoxStream<'a, Result<Vec<String>>> {
        self.count().stream_identities(key, batch_size)
    }

    async fn counts(&self, key: &PKey) -> Result<KeyCounts> {
        self.count().counts(key).await
    }

    async fn commit_poll(&self, key: &PKey, lease: &Lease, batch: &CommitBatch) -> Result<()> {
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.count().commit_poll(key, lease, batch).await
    }

    async fn load_pending(&self, key: &PKey, limit: usize) -> Result<Vec<OutboxRow>> {
        self.count().load_pending(key, limit).await
    }

    async fn load_pending_with_holds(
        &self,
        key: &PKey,
        limit: usize,
    ) -> Result<(Vec<OutboxRow>, Vec<String>)> {
        self.count().load_pending_with_holds(key, limit).await
    }

    async fn ack_events(&self, key: &PKey, lease: &Lease, ids: &[String]) -> Result<()> {
        self.count().ack_events(key, lease, ids).await
    }

    async fn record_attempt(
        &self,
        key: &PKey,
        lease: &Lease,
        id: &str,
        error: &SerializedError,
        next_attempt_at: Option<i64>,
    ) -> Result<()> {
        self.count()
            .record_attempt(key, lease, id, error, next_attempt_at)
            .await
    }

    async fn park_event(&self, key: &PKey, lease: &Lease, row: &ParkedRow) -> Result<()> {
        self.count().park_event(key, lease, row).await
    }

    async fn list_parked(&self, key: &PKey, query: ParkedQuery) -> Result<Vec<ParkedRow>> {
        self.count().list_parked(key, query).await
    }

    async fn resolve_parked(
        &self,
        key: &PKey,
        ids: &[String],
        action: ParkedAction,
    ) -> Result<u64> {
        self.count().resolve_parked(key, ids, action).await
    }

    async fn held_keys(&self, key: &PKey) -> Result<Vec<String>> {
        self.count().held_keys(key).await
    }

    async fn get_validator(&self, key: &PKey, url_hash: &str) -> Result<Option<Validator>> {
        self.count().get_validator(key, url_hash).await
    }

    async fn read_log(
        &self,
        key: &PKey,
        query: LogQuery,
        limit: usize,
    ) -> Result<Vec<LoggedEvent>> {
        self.count().read_log(key, query, limit).await
    }

    async fn prune_log(&self, key: &PKey, older_than: i64) -> Result<u64> {
        self.count().prune_log(key, older_than).await
    }
}
