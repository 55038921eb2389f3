//! The `snapshot_diff` strategy: no cursor, every cycle lists everything.

use std::sync::Arc;

use super::shared;
use super::{Advance, AdvanceInput, Cursor, CursorStrategy, SharedStrategy};
use crate::error::Result;

const NAME: &str = "snapshot_diff";

/// The `snapshot_diff` strategy: every cycle is a full listing (`fetch` pages by the fetch
/// context's page index), so items missing from a complete listing are reported as deleted.
/// The cursor is always [`Cursor::Snapshot`], persisted as `null`; the listing is done unless a
/// page says `has_more: true`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnapshotDiffCursor;

impl SnapshotDiffCursor {
    /// Wraps the strategy for a poller.
    pub(crate) fn into_strategy(self) -> SharedStrategy {
        Arc::new(self)
    }
}

impl CursorStrategy for SnapshotDiffCursor {
    fn name(&self) -> &'static str {
        NAME
    }

    fn initial(&self) -> Cursor {
        Cursor::Snapshot
    }

    fn serialize(&self, cursor: &Cursor) -> String {
        shared::encode(cursor)
    }

    fn deserialize(&self, text: &str) -> Result<Cursor> {
        match serde_json::from_str::<serde_json::Value>(text) {
            Ok(serde_json::Value::Null) => Ok(Cursor::Snapshot),
            Ok(_) => Err(shared::corrupt(NAME, text, "expected null")),
            Err(e) => Err(shared::corrupt(NAME, text, format!("not JSON: {e}"))),
        }
    }

    fn for_fetch(&self, _cursor: &Cursor, _first_request: bool) -> Cursor {
        Cursor::Snapshot
    }

    fn advance(&self, _cursor: &Cursor, input: AdvanceInput<'_>) -> Result<Advance> {
        Ok(Advance {
            cursor: Cursor::Snapshot,
            done: input.has_more != Some(true),
            keep: vec![true; input.items.len()],
        })
    }

    fn on_cycle_complete(&self, _cursor: &Cursor) -> Cursor {
        Cursor::Snapshot
    }

    fn reached(&self, _cursor: &Cursor, _target: &Cursor) -> bool {
        true
    }

    fn from_raw(&self, _raw: Option<&str>) -> Result<Cursor> {
        Ok(Cursor::Snapshot)
    }

    fn is_full_scan(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn snapshot_diff_stays_on_its_snapshot() -> crate::error::Result<()> {
        use crate::cursor::{AdvanceInput, Cursor, CursorStrategy, SnapshotDiffCursor};

        let strategy = SnapshotDiffCursor;
        let input = AdvanceInput {
            items: &[],
            page_cursor: None,
            has_more: Some(true),
            now_ms: 0,
        };
        let step = strategy.advance(&Cursor::Snapshot, input)?;
        assert_eq!((step.cursor, step.done), (Cursor::Snapshot, false));
        assert!(strategy.is_full_scan());
        Ok(())
    }

    use super::*;
    use crate::error::ErrorCode;
    use serde_json::json;

    #[test]
    fn basics() {
        let strategy = SnapshotDiffCursor;
        assert_eq!(strategy.name(), "snapshot_diff");
        assert_eq!(strategy.initial(), Cursor::Snapshot);
        assert!(strategy.is_full_scan());
        assert_eq!(strategy.lag_ms(&Cursor::Snapshot, 5), None);
        assert_eq!(
            strategy.for_fetch(&Cursor::Snapshot, true),
            Cursor::Snapshot
        );
        assert_eq!(
            strategy.for_fetch(&Cursor::Snapshot, false),
            Cursor::Snapshot
        );
        assert_eq!(
            strategy.on_cycle_complete(&Cursor::Snapshot),
            Cursor::Snapshot
        );
    }

    #[test]
    fn done_unless_has_more_true() {
        let items = [json!({ "id": 1 }), json!("x"), json!(null)];
        for (has_more, done) in [(None, true), (Some(false), true), (Some(true), false)] {
            let step = SnapshotDiffCursor
                .advance(
                    &Cursor::Snapshot,
                    AdvanceInput {
                        items: &items,
                        page_cursor: Some("ignored"),
                        has_more,
                        now_ms: 0,
                    },
                )
                .unwrap();
            assert_eq!(
                step,
                Advance {
                    cursor: Cursor::Snapshot,
                    done,
                    keep: vec![true; 3],
                },
                "{has_more:?}"
            );
        }
    }

    #[test]
    fn always_reached_and_from_raw_is_snapshot() {
        let strategy = SnapshotDiffCursor;
        assert!(strategy.reached(&Cursor::Snapshot, &Cursor::Snapshot));
        assert_eq!(strategy.from_raw(None).unwrap(), Cursor::Snapshot);
        assert_eq!(
            strategy.from_raw(Some("anything")).unwrap(),
            Cursor::Snapshot
        );
    }

    #[test]
    fn serialize_round_trips_and_garbage_is_rejected() {
        let strategy = SnapshotDiffCursor;
        assert_eq!(strategy.serialize(&Cursor::Snapshot), "null");
        assert_eq!(strategy.deserialize("null").unwrap(), Cursor::Snapshot);
        assert_eq!(strategy.deserialize(" null\n").unwrap(), Cursor::Snapshot);
        for text in ["", "nul", "{}", "0", r#"{"page":1}"#, "[null]"] {
            let err = strategy.deserialize(text).unwrap_err();
            assert_eq!(err.code(), ErrorCode::Store, "{text}");
            assert!(err.to_string().contains("snapshot_diff cursor"), "{err}");
        }
    }
}
