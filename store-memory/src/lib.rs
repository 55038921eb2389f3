#![doc = include_str!("../README.md")]

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use futures::stream::{self, BoxStream, StreamExt};
use watukuy_core::{
    Error, Result, SmolStr,
    store::{
        Capabilities, Claim, CommitBatch, ItemRow, KeyCounts, Lease, LogQuery, LoggedEvent,
        OutboxRow, OutboxStatus, PKey, ParkedAction, ParkedKind, ParkedQuery, ParkedRow,
        PollerState, SerializedError, StatePatch, Store, Validator,
    },
};

/// Everything stored for one key.
#[derive(Default)]
struct Record {
    state: Option<PollerState>,
    lease: Option<Lease>,
    items: BTreeMap<String, ItemRow>,
    /// Pending outbox rows by event id; delivered rows are removed.
    outbox: HashMap<SmolStr, OutboxRow>,
    /// `(sequence, event id)` of every pending row, for ordered loads.
    order: BTreeSet<(i64, SmolStr)>,
    parked: HashMap<String, ParkedRow>,
    validators: HashMap<String, Validator>,
    log: BTreeMap<i64, LoggedEvent>,
}

impl Record {
    /// Up to `limit` pending rows in sequence order.
    fn pending(&self, limit: usize) -> Vec<OutboxRow> {
        self.order
            .iter()
            .take(limit)
            .filter_map(|(_, id)| self.outbox.get(id).cloned())
            .collect()
    }

    /// The distinct hold keys of the parked rows.
    fn held_keys(&self) -> Vec<String> {
        let held: BTreeSet<&String> = self
            .parked
            .values()
            .filter_map(|row| row.hold_key.as_ref())
            .collect();
        held.into_iter().cloned().collect()
    }

    fn put_outbox(&mut self, row: OutboxRow) {
        self.remove_outbox(&row.event_id);
        if row.status == OutboxStatus::Pending {
            self.order.insert((row.sequence, row.event_id.clone()));
            self.outbox.insert(row.event_id.clone(), row);
        }
    }

    fn remove_outbox(&mut self, id: &str) {
        if let Some(old) = self.outbox.remove(id) {
            self.order.remove(&(old.sequence, old.event_id));
        }
    }
}

#[derive(Default)]
struct Inner {
    records: HashMap<PKey, Record>,
    /// Epoch counters outlive `delete_key`, so a key that comes back never reuses an epoch.
    epochs: HashMap<PKey, i64>,
}

/// The reference [`Store`]: everything in process memory, behind one lock.
///
/// It is fenced exactly like a durable store (owner and epoch are checked under the same lock as
/// the write), `commit_poll` is all-or-nothing, and values are copied in and out. Use it for
/// tests, examples and single-process programs that need no durability.
#[derive(Default)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("keys", &self.lock().records.len())
            .finish()
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// [`Store::migrate`], callable without importing the trait. There is no schema: it does
    /// nothing and always succeeds, so code written for a durable store runs unchanged here.
    ///
    /// ```
    /// use watukuy_store_memory::MemoryStore; // no `use watukuy_core::store::Store`
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let store = MemoryStore::new();
    /// store.migrate().await?;
    /// store.close().await?;
    /// # Ok::<(), watukuy_core::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn migrate(&self) -> Result<()> {
        <Self as Store>::migrate(self).await
    }

    /// [`Store::close`], callable without importing the trait. Nothing is released: the data
    /// lives as long as the store value and stays readable after `close`.
    pub async fn close(&self) -> Result<()> {
        <Self as Store>::close(self).await
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave a record half-written (every write checks
        // first and then applies infallible steps), so a poisoned lock is still consistent.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reads a record without creating it.
    fn read<T>(&self, key: &PKey, f: impl FnOnce(&Record) -> T, default: T) -> T {
        self.lock().records.get(key).map_or(default, f)
    }

    /// Takes the lease of `key` for `owner` unless another owner holds an unexpired one, and
    /// reads `f` of the record under the same lock.
    fn take_lease<T>(
        &self,
        key: &PKey,
        owner: &str,
        ttl_ms: i64,
        now_ms: i64,
        f: impl FnOnce(&Record) -> T,
    ) -> Option<(Lease, T)> {
        let mut inner = self.lock();
        let Inner { records, epochs } = &mut *inner;
        let record = records.entry(key.clone()).or_default();
        let free = match &record.lease {
            None => true,
            Some(held) => held.owner == owner || held.expires_at <= now_ms,
        };
        if !free {
            return None;
        }
        let epoch = epochs.entry(key.clone()).or_insert(0);
        *epoch += 1;
        let lease = Lease {
            owner: owner.to_owned(),
            epoch: *epoch,
            expires_at: now_ms.saturating_add(ttl_ms),
        };
        record.lease = Some(lease.clone());
        Some((lease, f(record)))
    }

    /// Checks the fence and, only if it passes, applies `f` to the record.
    fn fenced<T>(&self, key: &PKey, lease: &Lease, f: impl FnOnce(&mut Record) -> T) -> Result<T> {
        let mut inner = self.lock();
        match inner.records.get_mut(key) {
            Some(record) if holds(record, lease) => Ok(f(record)),
            _ => Err(Error::lease_lost(key, lease.epoch)),
        }
    }
}

fn holds(record: &Record, lease: &Lease) -> bool {
    record
        .lease
        .as_ref()
        .is_some_and(|held| held.owner == lease.owner && held.epoch == lease.epoch)
}

#[async_trait]
impl Store for MemoryStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities::default().with_log(true)
    }

    async fn acquire_lease(
        &self,
        key: &PKey,
        owner: &str,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<Option<Lease>> {
        Ok(self
            .take_lease(key, owner, ttl_ms, now_ms, |_| ())
            .map(|(lease, ())| lease))
    }

    async fn claim(
        &self,
        key: &PKey,
        owner: &str,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<Option<Claim>> {
        let claimed = self.take_lease(key, owner, ttl_ms, now_ms, |record| {
            (record.state.clone(), !record.pending(1).is_empty())
        });
        Ok(claimed.map(|(lease, (state, pending))| Claim::new(lease, state, pending)))
    }

    async fn renew_lease(
        &self,
        key: &PKey,
        lease: &Lease,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<bool> {
        Ok(self
            .fenced(key, lease, |record| {
                if let Some(held) = &mut record.lease {
                    held.expires_at = now_ms.saturating_add(ttl_ms);
                }
            })
            .is_ok())
    }

    async fn release_lease(&self, key: &PKey, lease: &Lease) -> Result<()> {
        // A stale release is a silent no-op by contract.
        let _ = self.fenced(key, lease, |record| record.lease = None);
        Ok(())
    }

    async fn get_lease(&self, key: &PKey) -> Result<Option<Lease>> {
        Ok(self.read(key, |r| r.lease.clone(), None))
    }

    async fn load_state(&self, key: &PKey) -> Result<Option<PollerState>> {
        Ok(self.read(key, |r| r.state.clone(), None))
    }

    async fn save_state_unfenced(&self, key: &PKey, patch: &StatePatch) -> Result<()> {
        let mut inner = self.lock();
        let record = inner.records.entry(key.clone()).or_default();
        record.state = Some(PollerState::patched(record.state.take(), patch));
        Ok(())
    }

    async fn list_keys(&self, poller: Option<&str>) -> Result<Vec<PKey>> {
        let inner = self.lock();
        let mut keys: Vec<PKey> = inner
            .records
            .keys()
            .filter(|k| poller.is_none_or(|p| k.poller == p))
            .cloned()
            .collect();
        keys.sort();
        Ok(keys)
    }

    async fn delete_key(&self, key: &PKey) -> Result<()> {
        self.lock().records.remove(key);
        Ok(())
    }

    async fn clear_items(&self, key: &PKey) -> Result<()> {
        if let Some(record) = self.lock().records.get_mut(key) {
            record.items.clear();
        }
        Ok(())
    }

    async fn load_versions(
        &self,
        key: &PKey,
        identities: &[String],
    ) -> Result<HashMap<String, ItemRow>> {
        Ok(self.read(
            key,
            |r| {
                identities
                    .iter()
                    .filter_map(|id| r.items.get(id).map(|row| (id.clone(), row.clone())))
                    .collect()
            },
            HashMap::new(),
        ))
    }

    fn stream_identities<'a>(
        &'a self,
        key: &'a PKey,
        batch_size: usize,
    ) -> BoxStream<'a, Result<Vec<String>>> {
        // Keyset pagination over the sorted snapshot (a `BTreeMap<String, _>`, so byte order as
        // the contract wants): one short lock per batch, never the whole snapshot copied at once.
        let batch_size = batch_size.max(1);
        stream::unfold(Some(None::<String>), move |after| async move {
            let after = after?;
            let batch: Vec<String> = self.read(
                key,
                |r| {
                    let range = match &after {
                        Some(last) => r.items.range::<String, _>((
                            std::ops::Bound::Excluded(last),
                            std::ops::Bound::Unbounded,
                        )),
                        None => r.items.range::<String, _>(..),
                    };
                    range.take(batch_size).map(|(id, _)| id.clone()).collect()
                },
                Vec::new(),
            );
            if batch.is_empty() {
                return None;
            }
            let next = (batch.len() == batch_size).then(|| batch.last().cloned());
            Some((Ok(batch), next))
        })
        .boxed()
    }

    async fn counts(&self, key: &PKey) -> Result<KeyCounts> {
        Ok(self.read(
            key,
            |r| KeyCounts {
                items: r.items.len() as u64,
                pending: r.outbox.len() as u64,
                parked: r.parked.len() as u64,
            },
            KeyCounts::default(),
        ))
    }

    async fn commit_poll(&self, key: &PKey, lease: &Lease, batch: &CommitBatch) -> Result<()> {
        // The fence is checked first and every step after it is infallible, all under one lock:
        // the batch lands completely or not at all.
        self.fenced(key, lease, |record| {
            for row in &batch.upserts {
                record.items.insert(row.identity.clone(), row.clone());
            }
            for identity in &batch.deletes {
                record.items.remove(identity);
            }
            for row in &batch.events {
                record.put_outbox(row.clone());
                if batch.log {
                    record.log.insert(
                        row.sequence,
                        LoggedEvent {
                            sequence: row.sequence,
                            event: row.event.clone(),
                            created_at: row.created_at,
                        },
                    );
                }
            }
            for row in &batch.parked {
                record.parked.insert(row.id.clone(), row.clone());
            }
            for v in &batch.validators {
                record
                    .validators
                    .insert(v.url_hash.clone(), v.validator.clone());
            }
            record.state = Some(PollerState::patched(
                record.state.take(),
                &batch.state_patch,
            ));
        })
    }

    async fn load_pending(&self, key: &PKey, limit: usize) -> Result<Vec<OutboxRow>> {
        Ok(self.read(key, |r| r.pending(limit), Vec::new()))
    }

    async fn load_pending_with_holds(
        &self,
        key: &PKey,
        limit: usize,
    ) -> Result<(Vec<OutboxRow>, Vec<String>)> {
        Ok(self.read(
            key,
            |r| (r.pending(limit), r.held_keys()),
            (Vec::new(), Vec::new()),
        ))
    }

    async fn held_keys(&self, key: &PKey) -> Result<Vec<String>> {
        Ok(self.read(key, Record::held_keys, Vec::new()))
    }

    async fn ack_events(&self, key: &PKey, lease: &Lease, ids: &[String]) -> Result<()> {
        self.fenced(key, lease, |record| {
            for id in ids {
                record.remove_outbox(id);
            }
        })
    }

    async fn record_attempt(
        &self,
        key: &PKey,
        lease: &Lease,
        id: &str,
        error: &SerializedError,
        next_attempt_at: Option<i64>,
    ) -> Result<()> {
        self.fenced(key, lease, |record| {
            if let Some(row) = record.outbox.get_mut(id) {
                row.attempts = row.attempts.saturating_add(1);
                row.last_error = Some(error.clone());
                row.next_attempt_at = next_attempt_at;
            }
        })
    }

    async fn park_event(&self, key: &PKey, lease: &Lease, row: &ParkedRow) -> Result<()> {
        self.fenced(key, lease, |record| {
            if let Some(event) = &row.event {
                record.remove_outbox(&event.id);
            }
            record.parked.insert(row.id.clone(), row.clone());
        })
    }

    async fn list_parked(&self, key: &PKey, query: ParkedQuery) -> Result<Vec<ParkedRow>> {
        Ok(self.read(
            key,
            |r| {
                let mut rows: Vec<&ParkedRow> = r
                    .parked
                    .values()
                    .filter(|row| query.kind.is_none_or(|k| row.kind == k))
                    .collect();
                rows.sort_by(|a, b| (a.parked_at, &a.id).cmp(&(b.parked_at, &b.id)));
                rows.into_iter()
                    .take(query.limit.unwrap_or(usize::MAX))
                    .cloned()
                    .collect()
            },
            Vec::new(),
        ))
    }

    async fn resolve_parked(
        &self,
        key: &PKey,
        ids: &[String],
        action: ParkedAction,
    ) -> Result<u64> {
        let mut inner = self.lock();
        let Some(record) = inner.records.get_mut(key) else {
            return Ok(0);
        };
        if action == ParkedAction::Discard {
            return Ok(unique(ids)
                .filter(|id| record.parked.remove(*id).is_some())
                .count() as u64);
        }
        let mut moved = 0;
        for id in unique(ids) {
            let retryable = record
                .parked
                .get(id)
                .is_some_and(|row| row.kind == ParkedKind::Poison && row.event.is_some());
            if !retryable {
                continue;
            }
            if let Some(ParkedRow {
                event: Some(event),
                parked_at,
                ..
            }) = record.parked.remove(id)
            {
                let mut row = OutboxRow::pending(event, parked_at);
                row.event_id = id.as_str().into();
                record.put_outbox(row);
                moved += 1;
            }
        }
        Ok(moved)
    }

    async fn get_validator(&self, key: &PKey, url_hash: &str) -> Result<Option<Validator>> {
        Ok(self.read(key, |r| r.validators.get(url_hash).cloned(), None))
    }

    async fn read_log(
        &self,
        key: &PKey,
        query: LogQuery,
        limit: usize,
    ) -> Result<Vec<LoggedEvent>> {
        Ok(self.read(
            key,
            |r| {
                r.log
                    .values()
                    .filter(|e| query.after_sequence.is_none_or(|s| e.sequence > s))
                    .filter(|e| query.from_time.is_none_or(|t| e.created_at >= t))
                    .filter(|e| query.to_time.is_none_or(|t| e.created_at <= t))
                    .take(limit)
                    .cloned()
                    .collect()
            },
            Vec::new(),
        ))
    }

    async fn prune_log(&self, key: &PKey, older_than: i64) -> Result<u64> {
        let mut inner = self.lock();
        let Some(record) = inner.records.get_mut(key) else {
            return Ok(0);
        };
        let before = record.log.len();
        record.log.retain(|_, e| e.created_at >= older_than);
        Ok((before - record.log.len()) as u64)
    }
}

/// The distinct ids, in first-appearance order.
fn unique(ids: &[String]) -> impl Iterator<Item = &String> {
    let mut seen = HashSet::new();
    ids.iter().filter(move |id| seen.insert(id.as_str()))
}
