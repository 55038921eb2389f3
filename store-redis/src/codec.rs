//! Values in and out: JSON text for the scripts' arguments, and rows decoded from replies.
//! Decoding failures are `Corrupt` store errors, never panics.
//!
//! JSON travels as opaque strings: the store serializes a row once (payloads, events and raw
//! items are [`Json`](watukuy_core::json::Json) and serialize verbatim) and deserializes it once; no
//! script decodes it, so big integers, unicode escapes and empty arrays come back byte for byte.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use watukuy_core::{
    Error, Result,
    store::{OutboxRow, PollerState, SerializedError, StatePatch, StoreErrorKind},
};

/// Serializes a value the store writes as JSON text.
pub(crate) use watukuy_core::json::encode_for_store as encode;

/// Deserializes JSON text read from Redis.
pub(crate) fn decode<T: DeserializeOwned>(what: &str, text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| Error::corrupt(what, e))
}

/// The names of the state hash's fields, one per top-level field of [`PollerState`].
const STATE_FIELDS: [&str; 7] = [
    "lanes",
    "schedule",
    "paused",
    "schemaVersion",
    "sequence",
    "createdAt",
    "updatedAt",
];

/// The state arguments of `write_state` (lua/prelude.lua): the 7 field/value pairs of the state a
/// first save creates, then the number of patch pairs and the patch's pairs.
pub(crate) fn state_args(patch: &StatePatch) -> Result<Vec<String>> {
    // The destructuring names every field: a field added to PollerState stops this crate from
    // compiling until it gets a hash field here and in STATE_FIELDS.
    let PollerState {
        lanes,
        schedule,
        paused,
        schema_version,
        sequence,
        created_at,
        updated_at,
    } = PollerState::patched(None, patch);
    let full = [
        encode("the state's lanes", &lanes)?,
        encode("the state's schedule", &schedule)?,
        encode("the state's paused flag", &paused)?,
        encode("the state's schema version", &schema_version)?,
        encode("the state's sequence", &sequence)?,
        encode("the state's creation time", &created_at)?,
        encode("the state's update time", &updated_at)?,
    ];
    let mut args = Vec::with_capacity(14 + 1 + 12);
    for (name, value) in STATE_FIELDS.iter().zip(full) {
        args.push((*name).to_owned());
        args.push(value);
    }
    let fields = patch.fields();
    if fields.len() != patch_len(patch) {
        // `fields()` drops a field it cannot serialize; a patch must never be half-applied.
        return Err(Error::store(
            StoreErrorKind::Rejected,
            false,
            "cannot encode the state patch as JSON",
        ));
    }
    args.push(fields.len().to_string());
    for (name, json) in fields {
        args.push(name.to_owned());
        args.push(json.as_str().to_owned());
    }
    Ok(args)
}

/// How many fields a patch sets.
fn patch_len(patch: &StatePatch) -> usize {
    let StatePatch {
        lanes,
        schedule,
        paused,
        schema_version,
        sequence,
        updated_at,
    } = patch;
    [
        lanes.is_some(),
        schedule.is_some(),
        paused.is_some(),
        schema_version.is_some(),
        sequence.is_some(),
        updated_at.is_some(),
    ]
    .into_iter()
    .filter(|set| *set)
    .count()
}

/// Rebuilds a [`PollerState`] from the fields of its hash; `None` for an empty hash.
pub(crate) fn state_from_fields(fields: Vec<(String, String)>) -> Result<Option<PollerState>> {
    if fields.is_empty() {
        return Ok(None);
    }
    let mut text = String::from("{");
    for (name, value) in &fields {
        if !STATE_FIELDS.contains(&name.as_str()) {
            continue;
        }
        if text.len() > 1 {
            text.push(',');
        }
        text.push_str(&encode("a state field name", name)?);
        text.push(':');
        text.push_str(value);
    }
    text.push('}');
    decode("the key's state", &text).map(Some)
}

/// The last error and next attempt time `record_attempt` keeps beside an outbox row.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Attempt {
    pub(crate) last_error: SerializedError,
    pub(crate) next_attempt_at: Option<i64>,
}

/// An outbox row as committed plus the attempts recorded since.
pub(crate) fn outbox_row(
    row: &str,
    attempts: Option<&str>,
    attempt: Option<&str>,
) -> Result<OutboxRow> {
    let mut out: OutboxRow = decode("an outbox row", row)?;
    if let Some(attempts) = attempts {
        let more: u64 = attempts
            .parse()
            .map_err(|e| Error::corrupt("an outbox row's attempt count", e))?;
        let more = u32::try_from(more).unwrap_or(u32::MAX);
        out.attempts = out.attempts.saturating_add(more);
    }
    if let Some(attempt) = attempt {
        let Attempt {
            last_error,
            next_attempt_at,
        } = decode("an outbox row's last error", attempt)?;
        out.last_error = Some(last_error);
        out.next_attempt_at = next_attempt_at;
    }
    Ok(out)
}

/// Parses a decimal integer written by the store itself.
pub(crate) fn int(what: &str, text: &str) -> Result<i64> {
    text.parse().map_err(|e| Error::corrupt(what, e))
}

/// A `u64` count from a reply.
pub(crate) fn count(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_args_hold_the_full_state_then_the_patch() {
        let patch = StatePatch {
            paused: Some(true),
            updated_at: Some(42),
            ..StatePatch::default()
        };
        let args = state_args(&patch).unwrap();
        assert_eq!(args.len(), 14 + 1 + 4);
        assert_eq!(&args[4..6], ["paused", "true"]);
        assert_eq!(&args[10..14], ["createdAt", "42", "updatedAt", "42"]);
        assert_eq!(&args[14..], ["2", "paused", "true", "updatedAt", "42"]);
        let empty = state_args(&StatePatch::default()).unwrap();
        assert_eq!(empty[14], "0");
        assert_eq!(&empty[10..12], ["createdAt", "0"]);
    }

    #[test]
    fn state_round_trips_through_fields() {
        let args = state_args(&StatePatch {
            sequence: Some(9),
            ..StatePatch::default()
        })
        .unwrap();
        let fields: Vec<(String, String)> = args[..14]
            .chunks(2)
            .map(|pair| (pair[0].clone(), pair[1].clone()))
            .collect();
        let state = state_from_fields(fields).unwrap().unwrap();
        assert_eq!(state.sequence, 9);
        assert_eq!(state_from_fields(Vec::new()).unwrap(), None);
    }

    #[test]
    fn garbage_is_corrupt_not_a_panic() {
        let err = state_from_fields(vec![("lanes".into(), "{nope".into())]).unwrap_err();
        assert!(matches!(
            err,
            Error::Store {
                kind: StoreErrorKind::Corrupt,
                ..
            }
        ));
        assert!(outbox_row("[]", None, None).is_err());
        assert!(int("x", "1.5").is_err());
    }
}
