//! Shared values for the cases: the reference suite's constants, keys, rows and small helpers.

use std::sync::{Arc, Mutex, PoisonError};

use watukuy_core::{
    DeliveryOptions, Error, Event, EventType, HandlerError,
    clock::ManualClock,
    delivery::{Dispatcher, DrainContext, DrainReport},
    json::Json,
    rng::SeededRng,
    store::{
        CommitBatch, ItemRow, KeyCounts, Lease, OutboxRow, PKey, ParkedError, ParkedKind,
        ParkedRow, SerializedError, StatePatch, Store, ValidationIssue,
    },
};

pub(crate) use watukuy_testkit::T0;

use crate::harness::{CaseError, CaseResult, Env};

/// The lease time-to-live the suite uses.
pub const TTL: i64 = 30_000;
/// The first instance.
pub const NODE_A: &str = "node-a";
/// The second instance.
pub const NODE_B: &str = "node-b";

/// `orders/""`.
pub fn key() -> PKey {
    PKey::new("orders", "")
}

/// The store under test and [`key`], nothing written or taken yet.
pub fn unleased(env: &Env) -> (&dyn Store, PKey) {
    (env.store(), key())
}

/// The store under test, [`key`], and node-a's lease on it taken at `T0`: where most cases
/// start.
pub async fn leased(env: &Env) -> Result<(&dyn Store, PKey, Lease), CaseError> {
    let store = env.store();
    let k = key();
    let lease = acquire(store, &k, NODE_A, T0).await?;
    Ok((store, k, lease))
}

/// The opening of a `counts` case: checks that `count` of [`key`], never written, is 0, then
/// takes node-a's lease on it at `T0`.
pub async fn leased_after_zero_count(
    env: &Env,
    count: fn(KeyCounts) -> u64,
) -> Result<(&dyn Store, PKey, Lease), CaseError> {
    let store = env.store();
    let k = key();
    crate::check_eq!(
        store.counts(&k).await.map(count)?,
        0,
        "a key never written counts 0"
    );
    let lease = acquire(store, &k, NODE_A, T0).await?;
    Ok((store, k, lease))
}

/// The close of a `counts` case: `count` of another partition ([`key_b`]) and of another
/// poller ([`key_other`]) is 0.
pub async fn others_count_zero(store: &dyn Store, count: fn(KeyCounts) -> u64) -> CaseResult {
    crate::check_eq!(
        store.counts(&key_b()).await.map(count)?,
        0,
        "another partition counts 0"
    );
    crate::check_eq!(
        store.counts(&key_other()).await.map(count)?,
        0,
        "another poller counts 0"
    );
    Ok(())
}

/// A state patch that sets the sequence to `sequence` and `updated_at` to `at`, and nothing else.
pub fn progress(sequence: i64, at: i64) -> StatePatch {
    StatePatch {
        sequence: Some(sequence),
        updated_at: Some(at),
        ..StatePatch::default()
    }
}

/// `orders/"tenant-b"`: another partition of the same poller.
pub fn key_b() -> PKey {
    PKey::new("orders", "tenant-b")
}

/// `invoices/""`: another poller with the same partition.
pub fn key_other() -> PKey {
    PKey::new("invoices", "")
}

/// A `created` event on `key` with a small payload.
pub fn event(key: &PKey, id: &str, sequence: i64, subject: &str) -> Event {
    let mut event = Event::new(id, EventType::Created, key.poller.as_str(), subject);
    event.time = "2026-01-01T00:00:00.000Z".into();
    event.partition = key.partition.as_str().into();
    event.sequence = sequence;
    event.cursor = Some(json(r#"{"value":"2026-01-01T00:00:00Z","tieBreak":null}"#));
    event.data = Some(json(&format!(r#"{{"id":"{subject}","seq":{sequence}}}"#)));
    event
}

/// A pending outbox row for [`event`], created at `T0`.
pub fn pending(key: &PKey, id: &str, sequence: i64, subject: &str) -> OutboxRow {
    OutboxRow::pending(event(key, id, sequence, subject), T0)
}

/// A snapshot row without payload.
pub fn item(identity: &str, hash: &str) -> ItemRow {
    ItemRow {
        identity: identity.to_owned(),
        version: None,
        hash: hash.to_owned(),
        schema_version: 1,
        payload: None,
        seen_at: T0,
    }
}

/// A poison row for `event`, holding `hold_key`, with a two-entry history.
pub fn poison(event: Event, hold_key: Option<&str>, parked_at: i64) -> ParkedRow {
    let first = SerializedError::new("HandlerError", "first failure");
    let last = SerializedError::new("HandlerError", "last failure");
    ParkedRow {
        id: event.id.to_string(),
        kind: ParkedKind::Poison,
        event: Some(event),
        item: None,
        error: ParkedError {
            error: last.clone(),
            history: Some(vec![first, last]),
            issues: None,
            details: Default::default(),
        },
        attempts: 3,
        parked_at,
        hold_key: hold_key.map(str::to_owned),
    }
}

/// A quarantined (invalid) item row with one issue.
pub fn invalid(id: &str, raw_item: &str, parked_at: i64) -> ParkedRow {
    ParkedRow {
        id: id.to_owned(),
        kind: ParkedKind::Invalid,
        event: None,
        item: Some(json(raw_item)),
        error: ParkedError {
            error: SerializedError::new("ValidationError", "total: expected a number"),
            history: None,
            details: Default::default(),
            issues: Some(vec![ValidationIssue {
                message: "expected a number".to_owned(),
                path: Some(vec!["total".to_owned()]),
            }]),
        },
        attempts: 0,
        parked_at,
        hold_key: None,
    }
}

/// Parses JSON text the suite wrote itself.
pub fn json(text: &str) -> Json {
    Json::parse(text).unwrap_or_else(|e| panic!("fixture JSON {text:?} is invalid: {e}"))
}

/// Acquires the lease or fails the case.
pub async fn acquire(
    store: &dyn Store,
    key: &PKey,
    owner: &str,
    now: i64,
) -> Result<Lease, CaseError> {
    store
        .acquire_lease(key, owner, TTL, now)
        .await?
        .ok_or_else(|| {
            CaseError::failed(format!(
                "acquire_lease({key}, {owner}) at {now} returned None"
            ))
        })
}

/// Fails the case unless `result` is `LeaseLost` for `key` carrying `epoch`.
pub fn expect_lease_lost<T: std::fmt::Debug>(
    result: Result<T, Error>,
    key: &PKey,
    epoch: i64,
    what: &str,
) -> CaseResult {
    match result {
        Err(Error::LeaseLost {
            poller,
            partition,
            epoch: rejected,
        }) if poller == key.poller && partition == key.partition && rejected == epoch => Ok(()),
        Err(Error::LeaseLost {
            poller,
            partition,
            epoch: rejected,
        }) => Err(CaseError::failed(format!(
            "{what}: LeaseLost carried {poller}/{partition} epoch {rejected}, expected {key} epoch {epoch}"
        ))),
        Err(other) => Err(CaseError::failed(format!(
            "{what}: expected LeaseLost, got {other}"
        ))),
        Ok(value) => Err(CaseError::failed(format!(
            "{what}: expected LeaseLost, the write succeeded ({value:?})"
        ))),
    }
}

/// Collects every batch of [`Store::stream_identities`].
pub async fn identity_batches(
    store: &dyn Store,
    key: &PKey,
    batch_size: usize,
) -> Result<Vec<Vec<String>>, CaseError> {
    use futures::TryStreamExt;
    Ok(store
        .stream_identities(key, batch_size)
        .try_collect()
        .await?)
}

/// The most rows [`observe`] reads from one list.
pub const OBSERVE_LIMIT: usize = 10_000;

/// Everything a store shows about one key through its read methods: what a case compares to
/// prove that a call changed nothing, or exactly one thing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    /// `load_state`.
    pub state: Option<watukuy_core::store::PollerState>,
    /// `get_lease`.
    pub lease: Option<Lease>,
    /// Every identity of `stream_identities`, sorted.
    pub identities: Vec<String>,
    /// `load_versions` of those identities, in the same order.
    pub items: Vec<ItemRow>,
    /// `count_items`.
    pub item_count: u64,
    /// `load_pending` (up to [`OBSERVE_LIMIT`]).
    pub pending: Vec<OutboxRow>,
    /// `count_pending`.
    pub pending_count: u64,
    /// `list_parked` without filters (up to [`OBSERVE_LIMIT`]).
    pub parked: Vec<ParkedRow>,
    /// `count_parked`.
    pub parked_count: u64,
    /// `held_keys`, sorted.
    pub held_keys: Vec<String>,
    /// `get_validator` of each URL hash asked for.
    pub validators: Vec<(String, Option<watukuy_core::store::Validator>)>,
    /// `read_log` without filters (up to [`OBSERVE_LIMIT`]); `None` when the store has no log.
    pub log: Option<Vec<watukuy_core::store::LoggedEvent>>,
}

impl Observation {
    /// What a key holding nothing looks like (`log`: the store's `capabilities().log`).
    pub fn empty(log: bool, url_hashes: &[&str]) -> Self {
        Observation {
            state: None,
            lease: None,
            identities: Vec::new(),
            items: Vec::new(),
            item_count: 0,
            pending: Vec::new(),
            pending_count: 0,
            parked: Vec::new(),
            parked_count: 0,
            held_keys: Vec::new(),
            validators: url_hashes.iter().map(|u| ((*u).to_owned(), None)).collect(),
            log: log.then(Vec::new),
        }
    }
}

/// Reads everything of `key` (validators of the given URL hashes; the log only when the store
/// has one).
pub async fn observe(
    store: &dyn Store,
    key: &PKey,
    url_hashes: &[&str],
) -> Result<Observation, CaseError> {
    let mut identities: Vec<String> = identity_batches(store, key, 100)
        .await?
        .into_iter()
        .flatten()
        .collect();
    identities.sort();
    let mut rows = store.load_versions(key, &identities).await?;
    let items = identities
        .iter()
        .filter_map(|identity| rows.remove(identity))
        .collect();
    let mut held_keys = store.held_keys(key).await?;
    held_keys.sort();
    let mut validators = Vec::with_capacity(url_hashes.len());
    for url in url_hashes {
        validators.push(((*url).to_owned(), store.get_validator(key, url).await?));
    }
    let log = if store.capabilities().log {
        Some(
            store
                .read_log(key, watukuy_core::store::LogQuery::default(), OBSERVE_LIMIT)
                .await?,
        )
    } else {
        None
    };
    Ok(Observation {
        state: store.load_state(key).await?,
        lease: store.get_lease(key).await?,
        identities,
        items,
        item_count: store.counts(key).await.map(|c| c.items)?,
        pending: store.load_pending(key, OBSERVE_LIMIT).await?,
        pending_count: store.counts(key).await.map(|c| c.pending)?,
        parked: store
            .list_parked(
                key,
                watukuy_core::store::ParkedQuery::default().limit(OBSERVE_LIMIT),
            )
            .await?,
        parked_count: store.counts(key).await.map(|c| c.parked)?,
        held_keys,
        validators,
        log,
    })
}

/// Owned ids from string slices, for `ack_events`, `retry_parked`, `discard_parked`, ...
pub fn owned_ids(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|id| (*id).to_owned()).collect()
}

/// Commits a batch holding only `events` (appended to the log when `log`), with a patch that
/// sets `sequence` to the highest event sequence and `updated_at` to `T0`, as the engine would.
pub async fn commit_events(
    store: &dyn Store,
    key: &PKey,
    lease: &Lease,
    events: Vec<OutboxRow>,
    log: bool,
) -> CaseResult {
    let sequence = events.iter().map(|row| row.sequence).max();
    let batch = watukuy_core::store::CommitBatch::default()
        .state_patch(watukuy_core::store::StatePatch {
            sequence,
            updated_at: Some(T0),
            ..watukuy_core::store::StatePatch::default()
        })
        .events(events)
        .log(log);
    store.commit_poll(key, lease, &batch).await?;
    Ok(())
}

/// The event ids of the pending rows of `key` (up to [`OBSERVE_LIMIT`]), in the order
/// `load_pending` returns them.
pub async fn pending_ids(store: &dyn Store, key: &PKey) -> Result<Vec<String>, CaseError> {
    Ok(store
        .load_pending(key, OBSERVE_LIMIT)
        .await?
        .into_iter()
        .map(|row| row.event_id.to_string())
        .collect())
}

/// Stores `validator` for `url_hash` the only way the contract has: a `commit_poll` carrying it.
pub async fn write_validator(
    store: &dyn Store,
    key: &PKey,
    lease: &Lease,
    url_hash: &str,
    validator: &watukuy_core::store::Validator,
) -> watukuy_core::Result<()> {
    let batch = watukuy_core::store::CommitBatch::default().validators(vec![
        watukuy_core::store::UrlValidator {
            url_hash: url_hash.to_owned(),
            validator: validator.clone(),
        },
    ]);
    store.commit_poll(key, lease, &batch).await
}

/// A consumer's test bench against real redeliveries: `event` committed as pending on
/// [`key`]'s outbox in `store` under node-a's lease, and a dispatcher for `orders` over it on a
/// manual clock at `T0` (seed 1, default delivery options).
pub struct PendingDelivery {
    /// The dispatcher; drain it with [`key`] and [`lease`](Self::lease).
    pub dispatcher: Dispatcher,
    /// The dispatcher's clock: advance it past a retry's backoff.
    pub clock: ManualClock,
    /// Node-a's lease on [`key`].
    pub lease: Lease,
}

impl PendingDelivery {
    /// Migrates `store`, commits `event` and builds the dispatcher.
    pub async fn new(store: Arc<dyn Store>, event: Event) -> Result<Self, CaseError> {
        store.migrate().await?;
        let k = key();
        let lease = acquire(&*store, &k, NODE_A, T0).await?;
        let batch = CommitBatch::default().events(vec![OutboxRow::pending(event, T0)]);
        store.commit_poll(&k, &lease, &batch).await?;
        let clock = ManualClock::new(T0);
        let dispatcher = Dispatcher::new(
            "orders",
            store,
            Arc::new(clock.clone()),
            Arc::new(SeededRng::new(1)),
            DeliveryOptions::default(),
            100,
        )?;
        Ok(Self {
            dispatcher,
            clock,
            lease,
        })
    }

    /// One drain of [`key`]'s outbox.
    pub async fn drain(&self) -> Result<DrainReport, CaseError> {
        Ok(self
            .dispatcher
            .drain(&key(), &self.lease, &DrainContext::default())
            .await?)
    }
}

/// The part of a consumer's handler that plays a crash after its commit and before the
/// acknowledgement: it records, attempt by attempt, whether the event was applied, and fails
/// the first attempt (transiently) once it has run, so the event is redelivered.
#[derive(Clone, Default)]
pub struct CrashBeforeAck {
    crashed: Arc<Mutex<bool>>,
    applied: Arc<Mutex<Vec<bool>>>,
}

impl CrashBeforeAck {
    /// Ends an attempt that `applied` the event or not: an error the first time.
    pub fn after(&self, applied: bool) -> Result<(), HandlerError> {
        self.applied
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(applied);
        let mut crashed = self.crashed.lock().unwrap_or_else(PoisonError::into_inner);
        if *crashed {
            Ok(())
        } else {
            *crashed = true;
            Err(HandlerError::transient("crashed before the ack"))
        }
    }

    /// Whether each attempt so far applied the event.
    pub fn applied(&self) -> Vec<bool> {
        self.applied
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}
