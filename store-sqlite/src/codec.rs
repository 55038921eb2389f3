//! Rows to column values and back. JSON travels as text: `Json` values are written with
//! `as_str()` and read back with `Json::parse`, so payloads, cursors and raw items keep every
//! byte; an absent `Option<Json>` is SQL `NULL`, a JSON `null` is the text `null`. Anything
//! stored that cannot be decoded is a `Corrupt` store error, never a panic.

use serde::de::DeserializeOwned;
use watukuy_core::{
    Error, Event, Result,
    json::Json,
    store::{
        ItemRow, OutboxRow, OutboxStatus, ParkedError, ParkedKind, ParkedRow, SerializedError,
        StoreErrorKind,
    },
};

use crate::error::DbResult;

/// Serializes a value the store writes as JSON text.
pub(crate) use watukuy_core::json::encode_for_store as encode;

/// Deserializes stored JSON text.
pub(crate) fn decode<T: DeserializeOwned>(what: impl std::fmt::Display, text: &str) -> DbResult<T> {
    serde_json::from_str(text).map_err(|e| Error::corrupt(what, e).into())
}

/// Reads stored JSON text back as [`Json`], byte for byte.
pub(crate) fn decode_json(what: impl std::fmt::Display, text: String) -> DbResult<Json> {
    Json::parse(&text).map_err(|e| Error::corrupt(what, e).into())
}

/// A stored integer that must fit a `u32` (attempts, schema versions).
pub(crate) fn to_u32(what: impl std::fmt::Display, value: i64) -> DbResult<u32> {
    u32::try_from(value).map_err(|e| Error::corrupt(what, e).into())
}

/// A `COUNT(*)`, which is never negative.
pub(crate) fn to_count(value: i64) -> u64 {
    u64::try_from(value).unwrap_or_default()
}

/// A `usize` limit as SQLite's `LIMIT` operand.
pub(crate) fn to_limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// An item row as column values.
#[derive(Debug)]
pub(crate) struct ItemValues {
    pub(crate) identity: String,
    pub(crate) version: Option<String>,
    pub(crate) hash: String,
    pub(crate) schema_version: i64,
    pub(crate) payload: Option<String>,
    pub(crate) seen_at: i64,
}

impl ItemValues {
    pub(crate) fn new(row: &ItemRow) -> Self {
        Self {
            identity: row.identity.clone(),
            version: row.version.clone(),
            hash: row.hash.clone(),
            schema_version: i64::from(row.schema_version),
            payload: row.payload.as_ref().map(|p| p.as_str().to_owned()),
            seen_at: row.seen_at,
        }
    }
}

/// Reads an item row: `identity, version, hash, schema_version, payload, seen_at`.
pub(crate) fn item_row(row: &rusqlite::Row<'_>) -> DbResult<ItemRow> {
    let identity: String = row.get(0)?;
    let what = || format!("the item {identity:?}");
    Ok(ItemRow {
        version: row.get(1)?,
        hash: row.get(2)?,
        schema_version: to_u32(what(), row.get(3)?)?,
        payload: match row.get::<_, Option<String>>(4)? {
            Some(text) => Some(decode_json(what(), text)?),
            None => None,
        },
        seen_at: row.get(5)?,
        identity,
    })
}

/// An outbox row as column values; `pending: false` rows are deleted instead of stored.
#[derive(Debug)]
pub(crate) struct OutboxValues {
    pub(crate) event_id: String,
    pub(crate) sequence: i64,
    pub(crate) event: String,
    pub(crate) pending: bool,
    pub(crate) attempts: i64,
    pub(crate) next_attempt_at: Option<i64>,
    pub(crate) last_error: Option<String>,
    pub(crate) created_at: i64,
}

impl OutboxValues {
    pub(crate) fn new(row: &OutboxRow) -> Result<Self> {
        Ok(Self {
            event_id: row.event_id.to_string(),
            sequence: row.sequence,
            event: encode("an event", &row.event)?,
            pending: row.status == OutboxStatus::Pending,
            attempts: i64::from(row.attempts),
            next_attempt_at: row.next_attempt_at,
            last_error: row
                .last_error
                .as_ref()
                .map(|e| encode("an error", e))
                .transpose()?,
            created_at: row.created_at,
        })
    }
}

/// Reads an outbox row: `event_id, seq, event, attempts, next_attempt_at, last_error,
/// created_at`. Stored rows are pending (delivered rows are deleted).
pub(crate) fn outbox_row(row: &rusqlite::Row<'_>) -> DbResult<OutboxRow> {
    let event_id: String = row.get(0)?;
    let what = |part: &str| format!("the {part} of outbox row {event_id:?}");
    let event: Event = decode(what("event"), &row.get::<_, String>(2)?)?;
    let last_error: Option<SerializedError> = match row.get::<_, Option<String>>(5)? {
        Some(text) => Some(decode(what("last error"), &text)?),
        None => None,
    };
    Ok(OutboxRow {
        sequence: row.get(1)?,
        event_id: watukuy_core::SmolStr::new(&event_id),
        event,
        status: OutboxStatus::Pending,
        attempts: to_u32(what("attempts"), row.get(3)?)?,
        next_attempt_at: row.get(4)?,
        last_error,
        created_at: row.get(6)?,
    })
}

/// A parked row as column values.
#[derive(Debug)]
pub(crate) struct ParkedValues {
    pub(crate) id: String,
    pub(crate) kind: &'static str,
    /// The event's id, whose outbox row `park_event` removes.
    pub(crate) event_id: Option<String>,
    pub(crate) event: Option<String>,
    pub(crate) item: Option<String>,
    pub(crate) error: String,
    pub(crate) attempts: i64,
    pub(crate) parked_at: i64,
    pub(crate) hold_key: Option<String>,
}

impl ParkedValues {
    pub(crate) fn new(row: &ParkedRow) -> Result<Self> {
        Ok(Self {
            id: row.id.clone(),
            kind: row.kind.as_str(),
            event_id: row.event.as_ref().map(|e| e.id.to_string()),
            event: row
                .event
                .as_ref()
                .map(|e| encode("a parked event", e))
                .transpose()?,
            item: row.item.as_ref().map(|i| i.as_str().to_owned()),
            error: encode("a parked error", &row.error)?,
            attempts: i64::from(row.attempts),
            parked_at: row.parked_at,
            hold_key: row.hold_key.clone(),
        })
    }
}

/// Reads a parked row: `id, kind, event, item, error, attempts, parked_at, hold_key`.
pub(crate) fn parked_row(row: &rusqlite::Row<'_>) -> DbResult<ParkedRow> {
    let id: String = row.get(0)?;
    let what = |part: &str| format!("the {part} of parked row {id:?}");
    let kind: String = row.get(1)?;
    let kind = match kind.as_str() {
        "poison" => ParkedKind::Poison,
        "invalid" => ParkedKind::Invalid,
        other => {
            return Err(Error::store(
                StoreErrorKind::Corrupt,
                false,
                format!("cannot decode {}: unknown kind {other:?}", what("kind")),
            )
            .into());
        }
    };
    let event: Option<Event> = match row.get::<_, Option<String>>(2)? {
        Some(text) => Some(decode(what("event"), &text)?),
        None => None,
    };
    let item = match row.get::<_, Option<String>>(3)? {
        Some(text) => Some(decode_json(what("item"), text)?),
        None => None,
    };
    let error: ParkedError = decode(what("error"), &row.get::<_, String>(4)?)?;
    Ok(ParkedRow {
        kind,
        event,
        item,
        error,
        attempts: to_u32(what("attempts"), row.get(5)?)?,
        parked_at: row.get(6)?,
        hold_key: row.get(7)?,
        id,
    })
}
