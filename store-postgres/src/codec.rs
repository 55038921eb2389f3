//! Rows in and out: statement parameters built from watukuy's values, and values decoded from
//! rows. Decoding failures are `Corrupt` store errors, never panics.
//!
//! JSON is bound as text and stored in `json` columns, which keep the text verbatim; it is read
//! back with `::text`, so payloads, events, cursors and raw items round-trip byte for byte.

use std::collections::BTreeSet;

use serde::de::DeserializeOwned;
use sqlx::Row;
use sqlx::postgres::PgRow;
use watukuy_core::{
    Error, Event, Result,
    json::Json,
    store::{
        ItemRow, Lanes, LoggedEvent, OutboxRow, OutboxStatus, ParkedKind, ParkedRow, PollerState,
        ScheduleState, StatePatch, StoreErrorKind, UrlValidator,
    },
};

use crate::error::classify;

/// A query with its arguments bound so far.
pub(crate) type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// Serializes a value the store writes as JSON text.
pub(crate) use watukuy_core::json::encode_for_store as encode;

/// Deserializes JSON text read from a column.
fn decode<T: DeserializeOwned>(what: &str, text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| Error::corrupt(what, e))
}

/// Reads a column that must not be NULL in a well-formed row.
pub(crate) fn required<T>(row: &PgRow, column: &str) -> Result<T>
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get::<Option<T>, _>(column)
        .map_err(classify)?
        .ok_or_else(|| {
            Error::store(
                StoreErrorKind::Corrupt,
                false,
                format!("cannot decode a stored row: column {column} is NULL"),
            )
        })
}

fn column<T>(row: &PgRow, column: &str) -> Result<T>
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get::<T, _>(column).map_err(classify)
}

fn to_u32(what: &str, value: i64) -> Result<u32> {
    u32::try_from(value).map_err(|e| Error::corrupt(what, e))
}

fn json_column(row: &PgRow, name: &str, what: &str) -> Result<Option<Json>> {
    column::<Option<String>>(row, name)?
        .map(|text| Json::parse(&text).map_err(|e| Error::corrupt(what, e)))
        .transpose()
}

/// A `count(*)` (or any non-negative bigint) in the row's first column.
pub(crate) fn count(row: &PgRow) -> Result<u64> {
    let value: i64 = row.try_get(0).map_err(classify)?;
    u64::try_from(value).map_err(|e| Error::corrupt("a row count", e))
}

/// A `usize` limit as a SQL bigint (larger than any table can be).
pub(crate) fn limit(rows: usize) -> i64 {
    i64::try_from(rows).unwrap_or(i64::MAX)
}

/// The rows whose key appears last, in their original order: what applying the rows one after
/// the other would leave, and what one `INSERT ... ON CONFLICT` statement can apply (it rejects
/// a key that appears twice).
pub(crate) fn last_wins<'a, T, K: Ord>(
    rows: impl DoubleEndedIterator<Item = &'a T>,
    key: impl Fn(&'a T) -> K,
) -> Vec<&'a T> {
    let mut seen = BTreeSet::new();
    let mut out: Vec<&'a T> = rows.rev().filter(|row| seen.insert(key(row))).collect();
    out.reverse();
    out
}

/// The thirteen state parameters ($3..$15) of `save_state`, `save_state_unfenced` and
/// `commit_poll`: the full state a first save creates, then the patch's fields.
#[derive(Clone, Debug)]
pub(crate) struct StateParams {
    full_lanes: String,
    full_schedule: String,
    full_paused: bool,
    full_schema_version: Option<i64>,
    full_sequence: i64,
    full_created_at: i64,
    full_updated_at: i64,
    lanes: Option<String>,
    schedule: Option<String>,
    paused: Option<bool>,
    schema_version: Option<i64>,
    sequence: Option<i64>,
    updated_at: Option<i64>,
}

impl StateParams {
    pub(crate) fn new(patch: &StatePatch) -> Result<Self> {
        // Both destructurings name every field: a field added to PollerState or StatePatch
        // stops this crate from compiling until it gets a column and a migration.
        let PollerState {
            lanes,
            schedule,
            paused,
            schema_version,
            sequence,
            created_at,
            updated_at,
        } = PollerState::patched(None, patch);
        let StatePatch {
            lanes: patch_lanes,
            schedule: patch_schedule,
            paused: patch_paused,
            schema_version: patch_schema_version,
            sequence: patch_sequence,
            updated_at: patch_updated_at,
        } = patch;
        Ok(Self {
            full_lanes: encode("the state's lanes", &lanes)?,
            full_schedule: encode("the state's schedule", &schedule)?,
            full_paused: paused,
            full_schema_version: schema_version.map(i64::from),
            full_sequence: sequence,
            full_created_at: created_at,
            full_updated_at: updated_at,
            lanes: patch_lanes
                .as_ref()
                .map(|v| encode("the state's lanes", v))
                .transpose()?,
            schedule: patch_schedule
                .as_ref()
                .map(|v| encode("the state's schedule", v))
                .transpose()?,
            paused: *patch_paused,
            schema_version: patch_schema_version.map(i64::from),
            sequence: *patch_sequence,
            updated_at: *patch_updated_at,
        })
    }

    /// The same creation values with an empty patch (a later chunk of a large commit).
    pub(crate) fn without_patch(&self) -> Self {
        Self {
            lanes: None,
            schedule: None,
            paused: None,
            schema_version: None,
            sequence: None,
            updated_at: None,
            ..self.clone()
        }
    }

    /// Binds $3..$15 onto a query that has bound $1 and $2.
    pub(crate) fn bind<'q>(&self, query: PgQuery<'q>) -> PgQuery<'q> {
        query
            .bind(self.full_lanes.clone())
            .bind(self.full_schedule.clone())
            .bind(self.full_paused)
            .bind(self.full_schema_version)
            .bind(self.full_sequence)
            .bind(self.full_created_at)
            .bind(self.full_updated_at)
            .bind(self.lanes.clone())
            .bind(self.schedule.clone())
            .bind(self.paused)
            .bind(self.schema_version)
            .bind(self.sequence)
            .bind(self.updated_at)
    }
}

/// A snapshot row as `commit_poll` parameters.
#[derive(Debug)]
pub(crate) struct ItemParams {
    identity: String,
    version: Option<String>,
    hash: String,
    schema_version: i64,
    payload: Option<String>,
    seen_at: i64,
}

impl ItemParams {
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

    /// Binds the six item arrays.
    pub(crate) fn bind<'q>(query: PgQuery<'q>, rows: &[Self]) -> PgQuery<'q> {
        query
            .bind(rows.iter().map(|r| r.identity.clone()).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.version.clone()).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.hash.clone()).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.schema_version).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.payload.clone()).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.seen_at).collect::<Vec<_>>())
    }
}

/// A pending outbox row as `commit_poll` parameters.
#[derive(Debug)]
pub(crate) struct OutboxParams {
    event_id: String,
    seq: i64,
    event: String,
    attempts: i64,
    next_attempt_at: Option<i64>,
    last_error: Option<String>,
    created_at: i64,
}

impl OutboxParams {
    pub(crate) fn new(row: &OutboxRow) -> Result<Self> {
        Ok(Self {
            event_id: row.event_id.to_string(),
            seq: row.sequence,
            event: encode("an event", &row.event)?,
            attempts: i64::from(row.attempts),
            next_attempt_at: row.next_attempt_at,
            last_error: row
                .last_error
                .as_ref()
                .map(|e| encode("an outbox row's last error", e))
                .transpose()?,
            created_at: row.created_at,
        })
    }

    /// Binds the seven outbox arrays.
    pub(crate) fn bind<'q>(query: PgQuery<'q>, rows: &[Self]) -> PgQuery<'q> {
        query
            .bind(rows.iter().map(|r| r.event_id.clone()).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.seq).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.event.clone()).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.attempts).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.next_attempt_at).collect::<Vec<_>>())
            .bind(
                rows.iter()
                    .map(|r| r.last_error.clone())
                    .collect::<Vec<_>>(),
            )
            .bind(rows.iter().map(|r| r.created_at).collect::<Vec<_>>())
    }
}

/// A log entry as `commit_poll` parameters.
#[derive(Debug)]
pub(crate) struct LogParams {
    seq: i64,
    event: String,
    created_at: i64,
}

impl LogParams {
    pub(crate) fn new(row: &OutboxRow) -> Result<Self> {
        Ok(Self {
            seq: row.sequence,
            event: encode("an event", &row.event)?,
            created_at: row.created_at,
        })
    }

    /// Binds the three log arrays.
    pub(crate) fn bind<'q>(query: PgQuery<'q>, rows: &[Self]) -> PgQuery<'q> {
        query
            .bind(rows.iter().map(|r| r.seq).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.event.clone()).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.created_at).collect::<Vec<_>>())
    }
}

/// A parked row as statement parameters.
#[derive(Debug)]
pub(crate) struct ParkedParams {
    id: String,
    kind: &'static str,
    event: Option<String>,
    event_seq: Option<i64>,
    item: Option<String>,
    error: String,
    attempts: i64,
    parked_at: i64,
    hold_key: Option<String>,
}

impl ParkedParams {
    pub(crate) fn new(row: &ParkedRow) -> Result<Self> {
        Ok(Self {
            id: row.id.clone(),
            kind: row.kind.as_str(),
            event: row
                .event
                .as_ref()
                .map(|e| encode("a parked event", e))
                .transpose()?,
            event_seq: row.event.as_ref().map(|e| e.sequence),
            item: row.item.as_ref().map(|i| i.as_str().to_owned()),
            error: encode("a parked row's error", &row.error)?,
            attempts: i64::from(row.attempts),
            parked_at: row.parked_at,
            hold_key: row.hold_key.clone(),
        })
    }

    /// Binds the nine parked arrays (`commit_poll`).
    pub(crate) fn bind<'q>(query: PgQuery<'q>, rows: &[Self]) -> PgQuery<'q> {
        query
            .bind(rows.iter().map(|r| r.id.clone()).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.kind.to_owned()).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.event.clone()).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.event_seq).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.item.clone()).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.error.clone()).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.attempts).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.parked_at).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.hold_key.clone()).collect::<Vec<_>>())
    }

    /// Binds the nine values of one row (`park_event`).
    pub(crate) fn bind_one<'q>(self, query: PgQuery<'q>) -> PgQuery<'q> {
        query
            .bind(self.id)
            .bind(self.kind)
            .bind(self.event)
            .bind(self.event_seq)
            .bind(self.item)
            .bind(self.error)
            .bind(self.attempts)
            .bind(self.parked_at)
            .bind(self.hold_key)
    }
}

/// A URL's validators as `commit_poll` parameters.
#[derive(Debug)]
pub(crate) struct ValidatorParams {
    url_hash: String,
    etag: Option<String>,
    last_modified: Option<String>,
    stored_at: i64,
}

impl ValidatorParams {
    pub(crate) fn new(row: &UrlValidator) -> Self {
        Self {
            url_hash: row.url_hash.clone(),
            etag: row.validator.etag.clone(),
            last_modified: row.validator.last_modified.clone(),
            stored_at: row.validator.stored_at,
        }
    }

    /// Binds the four validator arrays.
    pub(crate) fn bind<'q>(query: PgQuery<'q>, rows: &[Self]) -> PgQuery<'q> {
        query
            .bind(rows.iter().map(|r| r.url_hash.clone()).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.etag.clone()).collect::<Vec<_>>())
            .bind(
                rows.iter()
                    .map(|r| r.last_modified.clone())
                    .collect::<Vec<_>>(),
            )
            .bind(rows.iter().map(|r| r.stored_at).collect::<Vec<_>>())
    }
}

/// A `load_state` row.
pub(crate) fn decode_state(row: &PgRow) -> Result<PollerState> {
    let lanes: String = required(row, "lanes")?;
    let schedule: String = required(row, "schedule")?;
    Ok(PollerState {
        lanes: decode::<Lanes>("the state's lanes", &lanes)?,
        schedule: decode::<ScheduleState>("the state's schedule", &schedule)?,
        paused: required(row, "paused")?,
        schema_version: column::<Option<i64>>(row, "schema_version")?
            .map(|v| to_u32("the state's schema version", v))
            .transpose()?,
        sequence: required(row, "sequence")?,
        created_at: required(row, "created_at")?,
        updated_at: required(row, "updated_at")?,
    })
}

/// A `load_versions` row.
pub(crate) fn decode_item(row: &PgRow) -> Result<ItemRow> {
    Ok(ItemRow {
        identity: column(row, "identity")?,
        version: column(row, "version")?,
        hash: column(row, "hash")?,
        schema_version: to_u32("an item's schema version", column(row, "schema_version")?)?,
        payload: json_column(row, "payload", "an item's payload")?,
        seen_at: column(row, "seen_at")?,
    })
}

/// A `load_pending` row (every stored outbox row is pending).
pub(crate) fn decode_outbox(row: &PgRow) -> Result<OutboxRow> {
    let event: String = column(row, "event")?;
    let last_error: Option<String> = column(row, "last_error")?;
    Ok(OutboxRow {
        event_id: column::<String>(row, "event_id")?.into(),
        sequence: column(row, "seq")?,
        event: decode::<Event>("an outbox event", &event)?,
        status: OutboxStatus::Pending,
        attempts: to_u32("an outbox row's attempts", column(row, "attempts")?)?,
        next_attempt_at: column(row, "next_attempt_at")?,
        last_error: last_error
            .map(|text| decode("an outbox row's last error", &text))
            .transpose()?,
        created_at: column(row, "created_at")?,
    })
}

/// A `list_parked` row.
pub(crate) fn decode_parked(row: &PgRow) -> Result<ParkedRow> {
    let kind: String = column(row, "kind")?;
    let kind = match kind.as_str() {
        "poison" => ParkedKind::Poison,
        "invalid" => ParkedKind::Invalid,
        other => {
            return Err(Error::store(
                StoreErrorKind::Corrupt,
                false,
                format!("cannot decode a parked row: unknown kind {other:?}"),
            ));
        }
    };
    let event: Option<String> = column(row, "event")?;
    let error: String = column(row, "error")?;
    Ok(ParkedRow {
        id: column(row, "id")?,
        kind,
        event: event
            .map(|text| decode::<Event>("a parked event", &text))
            .transpose()?,
        item: json_column(row, "item", "a parked item")?,
        error: decode("a parked row's error", &error)?,
        attempts: to_u32("a parked row's attempts", column(row, "attempts")?)?,
        parked_at: column(row, "parked_at")?,
        hold_key: column(row, "hold_key")?,
    })
}

/// A `read_log` row.
pub(crate) fn decode_logged(row: &PgRow) -> Result<LoggedEvent> {
    let event: String = column(row, "event")?;
    Ok(LoggedEvent {
        sequence: column(row, "seq")?,
        event: decode::<Event>("a logged event", &event)?,
        created_at: column(row, "created_at")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_wins_keeps_the_last_row_of_each_key_in_order() {
        let rows = [("a", 1), ("b", 2), ("a", 3), ("c", 4), ("b", 5)];
        let kept = last_wins(rows.iter(), |row| row.0);
        assert_eq!(kept, vec![&("a", 3), &("c", 4), &("b", 5)]);
    }

    #[test]
    fn state_params_of_an_empty_patch_create_the_zero_state() {
        let params = StateParams::new(&StatePatch::default()).unwrap();
        assert_eq!((params.full_created_at, params.full_updated_at), (0, 0));
        assert!(params.lanes.is_none() && params.updated_at.is_none());
        let patch = StatePatch {
            sequence: Some(4),
            updated_at: Some(9),
            ..StatePatch::default()
        };
        let params = StateParams::new(&patch).unwrap();
        assert_eq!(params.full_created_at, 9);
        assert_eq!(params.sequence, Some(4));
        let later = params.without_patch();
        assert_eq!((later.sequence, later.full_sequence), (None, 4));
    }
}
