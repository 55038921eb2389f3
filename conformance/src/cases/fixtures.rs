//! Shared values for the cases: the reference suite's constants, keys, rows and small helpers.

use watukuy_core::{
    Error, Event, EventType, ItemRow, Json, Lane, Lease, OutboxRow, PKey, ParkedError, ParkedKind,
    ParkedRow, SerializedError, Store, ValidationIssue,
};

use crate::harness::{CaseError, CaseResult};

/// 2026-01-01T00:00:00Z in epoch ms: the suite's start of time.
pub const T0: i64 = 1_767_225_600_000;
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
    Event {
        id: id.to_owned(),
        event_type: EventType::Created,
        source: format!("urn:watukuy:{}", key.poller),
        subject: subject.to_owned(),
        time: "2026-01-01T00:00:00.000Z".to_owned(),
        poller: key.poller.clone(),
        partition: key.partition.clone(),
        lane: Lane::Live,
        sequence,
        cursor: Some(json(r#"{"value":"2026-01-01T00:00:00Z","tieBreak":null}"#)),
        data: Some(json(&format!(r#"{{"id":"{subject}","seq":{sequence}}}"#))),
        previous: None,
        attempt: 0,
    }
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
        id: event.id.clone(),
        kind: ParkedKind::Poison,
        event: Some(event),
        item: None,
        error: ParkedError {
            error: last.clone(),
            history: Some(vec![first, last]),
            issues: None,
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
