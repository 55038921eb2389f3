//! Shared values for the cases: the reference suite's constants, keys, rows and small helpers.

use std::sync::{Arc, Mutex, PoisonError};

use watukuy_core::{
    DeliveryOptions, Error, Event, EventType, HandlerError,
    clock::ManualClock,
    delivery::{Dispatcher, DrainContext, DrainReport},
    json::Json,
    rng::SeededRng,
    store::{
        CommitBatch, ItemRow, KeyCounts, Lease, LogQuery, OutboxRow, PKey, ParkedError, ParkedKind,
        ParkedQuery, ParkedRow, SerializedError, StatePatch, Store, StoreErrorKind, UrlValidator,
        ValidationIssue, Validator,
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

/// Writes one of everything a store keeps for [`key`] into a migrated, empty `store`, under
/// node-a's lease taken at `T0`: the state, an item `i1` with a payload, a pending event
/// `evt-1` with a failed attempt recorded, a poison row `evt-2` holding the hold key `h1`, an
/// invalid (quarantined) row `invalid:x`, the validator of URL hash `u1`, and both events in the
/// log. What a test of foreign data damages before [`read_everything`].
pub async fn populate_one_of_everything(store: &dyn Store) -> CaseResult {
    let k = key();
    let lease = acquire(store, &k, NODE_A, T0).await?;
    let mut row = item("i1", "h1");
    row.payload = Some(json(r#"{"id":"i1"}"#));
    let batch = CommitBatch::default()
        .state_patch(progress(2, T0))
        .upserts(vec![row])
        .events(vec![
            pending(&k, "evt-1", 1, "i1"),
            pending(&k, "evt-2", 2, "i2"),
        ])
        .parked(vec![invalid("invalid:x", r#"{"id":"x"}"#, T0)])
        .validators(vec![UrlValidator {
            url_hash: "u1".to_owned(),
            validator: Validator {
                etag: Some("\"v1\"".to_owned()),
                last_modified: Some("Thu, 01 Jan 2026 00:00:00 GMT".to_owned()),
                stored_at: T0,
            },
        }])
        .log(true);
    store.commit_poll(&k, &lease, &batch).await?;
    let failure = SerializedError::new("HandlerError", "the sink timed out");
    store
        .record_attempt(&k, &lease, "evt-1", &failure, Some(T0 + 1_000))
        .await?;
    let poisoned = poison(event(&k, "evt-2", 2, "i2"), Some("h1"), T0);
    store.park_event(&k, &lease, &poisoned).await?;
    Ok(())
}

/// `Ok(())` when `result` is `Ok` or a permanent `Corrupt` store error (what a read may answer
/// over data another program wrote), else a message naming the read (`what`) and the error.
pub fn decoded_or_corrupt<T>(what: &str, result: Result<T, Error>) -> Result<(), String> {
    match result {
        Ok(_)
        | Err(Error::Store {
            kind: StoreErrorKind::Corrupt,
            transient: false,
            ..
        }) => Ok(()),
        Err(other) => Err(format!(
            "{what} answered {other:?}, not a permanent Corrupt error"
        )),
    }
}

/// Every read of [`key`] that [`populate_one_of_everything`] gave something to read, each held to
/// [`decoded_or_corrupt`]: keys, lease, state, counts, items (`i1` and every streamed
/// identity), the outbox (with and without hold keys), parked rows, hold keys, the validator of
/// `u1` and the log. The first read that answers otherwise is the error.
pub async fn read_everything(store: &dyn Store) -> Result<(), String> {
    use futures::TryStreamExt;
    let k = key();
    decoded_or_corrupt("list_keys", store.list_keys(None).await)?;
    decoded_or_corrupt("list_keys(orders)", store.list_keys(Some(&k.poller)).await)?;
    decoded_or_corrupt("get_lease", store.get_lease(&k).await)?;
    decoded_or_corrupt("load_state", store.load_state(&k).await)?;
    decoded_or_corrupt("counts", store.counts(&k).await)?;
    let streamed = store
        .stream_identities(&k, 10)
        .try_collect::<Vec<Vec<String>>>()
        .await;
    let mut identities = vec!["i1".to_owned()];
    if let Ok(batches) = &streamed {
        identities.extend(batches.iter().flatten().cloned());
    }
    decoded_or_corrupt("stream_identities", streamed)?;
    decoded_or_corrupt("load_versions", store.load_versions(&k, &identities).await)?;
    decoded_or_corrupt("load_pending", store.load_pending(&k, 10).await)?;
    decoded_or_corrupt(
        "load_pending_with_holds",
        store.load_pending_with_holds(&k, 10).await,
    )?;
    decoded_or_corrupt(
        "list_parked",
        store.list_parked(&k, ParkedQuery::default()).await,
    )?;
    decoded_or_corrupt("held_keys", store.held_keys(&k).await)?;
    decoded_or_corrupt("get_validator", store.get_validator(&k, "u1").await)?;
    decoded_or_corrupt(
        "read_log",
        store.read_log(&k, LogQuery::default(), 10).await,
    )?;
    Ok(())
}

/// Integers at the edges of the stores' columns and of the types they decode into: `i64`,
/// `u32` and the integers a float holds exactly.
pub const EDGE_INTEGERS: &[i64] = &[
    i64::MIN,
    -9_007_199_254_740_993,
    -1,
    0,
    1,
    4_294_967_295,
    4_294_967_296,
    9_007_199_254_740_993,
    i64::MAX,
];

/// JSON values at the edges of what the stores' decoders take (integers just past `u32` and
/// `i64`, a number no float holds, a lone surrogate, nesting deeper than any parser's limit), and
/// a few texts that are not JSON: what a foreign program may leave where the store keeps JSON
/// (see [`json_mutant`]).
pub fn edge_json() -> Vec<String> {
    let mut texts: Vec<String> = [
        "null",
        "true",
        "\"\"",
        "0",
        "-1",
        "0.5",
        "4294967296",
        "9223372036854775808",
        "-9223372036854775809",
        "18446744073709551616",
        "1e400",
        "[]",
        "{}",
        "{\"\":null}",
        "\"\\ud800\"",
        "\"\\u0000\"",
        "\"poison\"",
        "\"2026-02-30T25:61:00Z\"",
        "",
        "nul",
        "{",
        "[1,]",
    ]
    .map(str::to_owned)
    .to_vec();
    texts.push(format!("{}{}", "[".repeat(200), "]".repeat(200)));
    texts
}

/// `text` (a JSON document, as a store wrote it) with its `at`-th value (counting the document
/// itself as the first, in document order, modulo their number) replaced by the raw text
/// `replacement`, or removed from its object or array when `replacement` is `None`: data that is
/// almost what the store wrote, which gets past a decoder's first checks. `None` when `text` is
/// not JSON, or the value to remove is the document itself.
pub fn json_mutant(text: &str, at: usize, replacement: Option<&str>) -> Option<String> {
    use serde_json::Value;
    /// What the chosen value becomes before serializing: a string no store writes.
    const MARK: &str = "\u{0}watukuy-mutant\u{0}";
    fn count(value: &Value) -> usize {
        1 + match value {
            Value::Array(items) => items.iter().map(count).sum(),
            Value::Object(members) => members.values().map(count).sum(),
            _ => 0,
        }
    }
    fn child(value: &mut Value, index: usize) -> Option<&mut Value> {
        match value {
            Value::Array(items) => items.get_mut(index),
            Value::Object(members) => members.values_mut().nth(index),
            _ => None,
        }
    }
    /// Replaces (or removes) the `at`-th value below `value`, counting `at` down.
    fn change(value: &mut Value, at: &mut usize, remove: bool) -> bool {
        let mut index = 0;
        loop {
            if *at == 0 {
                let marked = Value::String(MARK.to_owned());
                return match value {
                    Value::Array(items) if index < items.len() => {
                        if remove {
                            items.remove(index);
                        } else {
                            items[index] = marked;
                        }
                        true
                    }
                    Value::Object(members) => match members.keys().nth(index).cloned() {
                        Some(name) if remove => members.remove(&name).is_some(),
                        Some(name) => members.insert(name, marked).is_some(),
                        None => false,
                    },
                    _ => false,
                };
            }
            let Some(next) = child(value, index) else {
                return false;
            };
            *at -= 1;
            if change(next, at, remove) {
                return true;
            }
            index += 1;
        }
    }
    let mut document: Value = serde_json::from_str(text).ok()?;
    let at = at % count(&document);
    if at == 0 {
        return replacement.map(str::to_owned);
    }
    change(&mut document, &mut (at - 1), replacement.is_none());
    let marked = serde_json::to_string(&document).ok()?;
    let mark = serde_json::to_string(MARK).ok()?;
    Some(match replacement {
        Some(replacement) => marked.replacen(&mark, replacement, 1),
        None => marked,
    })
}

#[cfg(test)]
mod tests {
    use super::json_mutant;

    #[test]
    fn json_mutant_replaces_or_removes_one_value_in_document_order() {
        let text = r#"{"a":[1,{"b":2}],"c":3}"#;
        // 0 the document, 1 a, 2 1, 3 {"b":2}, 4 2, 5 c.
        assert_eq!(json_mutant(text, 0, Some("nul")).as_deref(), Some("nul"));
        assert_eq!(json_mutant(text, 0, None), None);
        assert_eq!(
            json_mutant(text, 2, Some("1e400")).as_deref(),
            Some(r#"{"a":[1e400,{"b":2}],"c":3}"#)
        );
        assert_eq!(
            json_mutant(text, 4, None).as_deref(),
            Some(r#"{"a":[1,{}],"c":3}"#)
        );
        assert_eq!(
            json_mutant(text, 5, Some("[")).as_deref(),
            Some(r#"{"a":[1,{"b":2}],"c":[}"#)
        );
        assert_eq!(
            json_mutant(text, 6 + 1, None).as_deref(),
            Some(r#"{"c":3}"#)
        );
        assert_eq!(json_mutant("not json", 1, None), None);
    }
}
