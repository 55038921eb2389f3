//! The `page` strategy: a page number, reset at the end of every cycle.

use std::sync::Arc;

use serde_json::Value;

use super::shared;
use super::{Advance, AdvanceInput, Cursor, CursorStrategy, SharedStrategy};
use crate::error::{Error, Result};

const NAME: &str = "page";

/// The `page` strategy: `fetch` gets a page number, 1-based by default.
///
/// Per page: `has_more: true` moves to the next page; anything else ends the listing (the cursor
/// stays on the last page until the cycle completes, then starts over at `initial`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageCursor {
    initial: u32,
}

impl PageCursor {
    /// A page strategy starting at page `initial` (use 0 for 0-based APIs).
    pub fn new(initial: u32) -> Self {
        Self { initial }
    }

    /// Wraps the strategy for a poller.
    pub(crate) fn into_strategy(self) -> SharedStrategy {
        Arc::new(self)
    }
}

impl Default for PageCursor {
    /// Starts at page 1.
    fn default() -> Self {
        Self::new(1)
    }
}

impl CursorStrategy for PageCursor {
    fn name(&self) -> &'static str {
        NAME
    }

    fn initial(&self) -> Cursor {
        Cursor::Page { page: self.initial }
    }

    fn serialize(&self, cursor: &Cursor) -> String {
        shared::encode(cursor)
    }

    fn deserialize(&self, text: &str) -> Result<Cursor> {
        let map = shared::object_with_keys(NAME, text, &["page"])?;
        match map
            .get("page")
            .and_then(Value::as_u64)
            .and_then(|page| u32::try_from(page).ok())
        {
            Some(page) => Ok(Cursor::Page { page }),
            None => Err(shared::corrupt(
                NAME,
                text,
                "`page` must be a non-negative integer up to 4294967295",
            )),
        }
    }

    fn for_fetch(&self, cursor: &Cursor, _first_request: bool) -> Cursor {
        cursor.clone()
    }

    fn advance(&self, cursor: &Cursor, input: AdvanceInput<'_>) -> Result<Advance> {
        let Cursor::Page { page } = cursor else {
            return Err(shared::wrong_cursor(NAME, cursor));
        };
        let keep = vec![true; input.items.len()];
        if input.has_more != Some(true) {
            return Ok(Advance {
                cursor: cursor.clone(),
                done: true,
                keep,
            });
        }
        let next = page.checked_add(1).ok_or_else(|| {
            Error::config("cursor", format!("page {page} has no next page number"))
        })?;
        Ok(Advance {
            cursor: Cursor::Page { page: next },
            done: false,
            keep,
        })
    }

    fn on_cycle_complete(&self, _cursor: &Cursor) -> Cursor {
        self.initial()
    }

    fn conditional_requests(&self) -> bool {
        true
    }

    /// The next page: an unchanged page says nothing about the pages after it.
    fn after_not_modified(&self, cursor: &Cursor) -> Option<Cursor> {
        match cursor {
            Cursor::Page { page } => page.checked_add(1).map(|page| Cursor::Page { page }),
            _ => None,
        }
    }

    fn reached(&self, cursor: &Cursor, target: &Cursor) -> bool {
        matches!(
            (cursor, target),
            (Cursor::Page { page: a }, Cursor::Page { page: b }) if a == b
        )
    }

    /// `None` is `initial`; a raw value must be a non-negative integer (ASCII digits).
    fn from_raw(&self, raw: Option<&str>) -> Result<Cursor> {
        let Some(raw) = raw else {
            return Ok(self.initial());
        };
        let digits = !raw.is_empty() && raw.bytes().all(|b| b.is_ascii_digit());
        match raw.parse::<u32>() {
            Ok(page) if digits => Ok(Cursor::Page { page }),
            _ => Err(Error::config(
                "cursor",
                format!(
                    "a page cursor is a non-negative integer up to 4294967295, got {}",
                    shared::shorten(raw)
                ),
            )),
        }
    }

    fn is_full_scan(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn page_cursor_advances_and_restarts() -> crate::error::Result<()> {
        use crate::cursor::{AdvanceInput, Cursor, CursorStrategy, PageCursor};

        let strategy = PageCursor::default();
        let input = AdvanceInput {
            items: &[],
            page_cursor: None,
            has_more: Some(true),
            now_ms: 0,
        };
        let step = strategy.advance(&strategy.initial(), input)?;
        assert_eq!(step.cursor, Cursor::Page { page: 2 });
        assert_eq!(
            strategy.on_cycle_complete(&step.cursor),
            Cursor::Page { page: 1 }
        );
        Ok(())
    }

    use super::*;
    use crate::error::ErrorCode;
    use serde_json::json;

    fn page(page: u32) -> Cursor {
        Cursor::Page { page }
    }

    fn step(strategy: &PageCursor, cursor: &Cursor, has_more: Option<bool>) -> Result<Advance> {
        strategy.advance(
            cursor,
            AdvanceInput {
                items: &[json!({ "id": 1 }), json!({ "id": 2 })],
                page_cursor: Some("ignored"),
                has_more,
                now_ms: 0,
            },
        )
    }

    #[test]
    fn basics() {
        let strategy = PageCursor::default();
        assert_eq!(strategy.name(), "page");
        assert_eq!(strategy.initial(), page(1));
        assert_eq!(PageCursor::new(0).initial(), page(0));
        assert!(!strategy.is_full_scan());
        assert_eq!(strategy.lag_ms(&page(3), 5), None);
        assert_eq!(strategy.for_fetch(&page(3), true), page(3));
        assert_eq!(strategy.for_fetch(&page(3), false), page(3));
    }

    #[test]
    fn has_more_true_increments_anything_else_is_done() {
        let strategy = PageCursor::default();
        assert_eq!(
            step(&strategy, &page(1), Some(true)).unwrap(),
            Advance {
                cursor: page(2),
                done: false,
                keep: vec![true, true],
            }
        );
        for has_more in [None, Some(false)] {
            assert_eq!(
                step(&strategy, &page(7), has_more).unwrap(),
                Advance {
                    cursor: page(7),
                    done: true,
                    keep: vec![true, true],
                }
            );
        }
        let err = step(&strategy, &page(u32::MAX), Some(true)).unwrap_err();
        assert_eq!(err.code(), ErrorCode::Config);
        let err = step(&strategy, &Cursor::Token { value: None }, Some(true)).unwrap_err();
        assert_eq!(err.code(), ErrorCode::Config);
    }

    #[test]
    fn a_completed_cycle_starts_over() {
        assert_eq!(PageCursor::default().on_cycle_complete(&page(9)), page(1));
        assert_eq!(PageCursor::new(0).on_cycle_complete(&page(9)), page(0));
    }

    #[test]
    fn reached_is_equality() {
        let strategy = PageCursor::default();
        assert!(strategy.reached(&page(3), &page(3)));
        assert!(!strategy.reached(&page(2), &page(3)));
        assert!(!strategy.reached(&page(4), &page(3)));
        assert!(!strategy.reached(&Cursor::Snapshot, &page(3)));
    }

    #[test]
    fn from_raw_parses_non_negative_integers() {
        let strategy = PageCursor::new(5);
        assert_eq!(strategy.from_raw(None).unwrap(), page(5));
        assert_eq!(strategy.from_raw(Some("0")).unwrap(), page(0));
        assert_eq!(strategy.from_raw(Some("42")).unwrap(), page(42));
        assert_eq!(strategy.from_raw(Some("007")).unwrap(), page(7));
        for bad in [
            "",
            "-1",
            "+1",
            "1.5",
            "abc",
            " 1",
            "4294967296",
            "99999999999999999999",
        ] {
            let err = strategy.from_raw(Some(bad)).unwrap_err();
            assert_eq!(err.code(), ErrorCode::Config, "{bad:?}");
            assert!(err.to_string().contains("non-negative integer"), "{err}");
        }
    }

    #[test]
    fn serialize_round_trips_and_garbage_is_rejected() {
        let strategy = PageCursor::default();
        for (cursor, text) in [
            (page(0), r#"{"page":0}"#),
            (page(1), r#"{"page":1}"#),
            (page(u32::MAX), r#"{"page":4294967295}"#),
        ] {
            assert_eq!(strategy.serialize(&cursor), text);
            assert_eq!(strategy.deserialize(text).unwrap(), cursor);
        }
        for text in [
            "",
            "null",
            "1",
            "{}",
            r#"{"page":-1}"#,
            r#"{"page":1.5}"#,
            r#"{"page":"1"}"#,
            r#"{"page":null}"#,
            r#"{"page":4294967296}"#,
            r#"{"page":1,"value":null}"#,
        ] {
            let err = strategy.deserialize(text).unwrap_err();
            assert_eq!(err.code(), ErrorCode::Store, "{text}");
            assert!(err.to_string().contains("page cursor"), "{err}");
        }
    }
}
