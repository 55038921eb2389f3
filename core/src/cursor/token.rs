//! The `token` strategy: the API's opaque continuation token.

use std::sync::Arc;

use super::shared;
use super::{Advance, AdvanceInput, Cursor, CursorStrategy, SharedStrategy};
use crate::error::Result;

const NAME: &str = "token";

/// The `token` strategy: `fetch` gets the API's continuation token (`None` on a lane's first
/// request, or `initial`).
///
/// Per page: a non-empty `page_cursor` becomes the next token, and the listing is done only when
/// the page says `has_more: false`; no (or an empty) `page_cursor` resets the token to `initial`
/// and ends the listing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenCursor {
    initial: Option<String>,
}

impl TokenCursor {
    /// A token strategy starting from `initial` (`None`: the API's first page).
    pub fn new(initial: Option<String>) -> Self {
        Self { initial }
    }

    /// Wraps the strategy for a poller.
    pub(crate) fn into_strategy(self) -> SharedStrategy {
        Arc::new(self)
    }
}

impl CursorStrategy for TokenCursor {
    fn name(&self) -> &'static str {
        NAME
    }

    fn initial(&self) -> Cursor {
        Cursor::Token {
            value: self.initial.clone(),
        }
    }

    fn serialize(&self, cursor: &Cursor) -> String {
        shared::encode(cursor)
    }

    fn deserialize(&self, text: &str) -> Result<Cursor> {
        let map = shared::object_with_keys(NAME, text, &["value"])?;
        Ok(Cursor::Token {
            value: shared::string_or_null(NAME, text, &map, "value")?,
        })
    }

    fn for_fetch(&self, cursor: &Cursor, _first_request: bool) -> Cursor {
        cursor.clone()
    }

    fn advance(&self, cursor: &Cursor, input: AdvanceInput<'_>) -> Result<Advance> {
        if !matches!(cursor, Cursor::Token { .. }) {
            return Err(shared::wrong_cursor(NAME, cursor));
        }
        let keep = vec![true; input.items.len()];
        Ok(match input.page_cursor.filter(|c| !c.is_empty()) {
            Some(next) => Advance {
                cursor: Cursor::Token {
                    value: Some(next.to_owned()),
                },
                done: input.has_more == Some(false),
                keep,
            },
            None => Advance {
                cursor: self.initial(),
                done: true,
                keep,
            },
        })
    }

    fn reached(&self, cursor: &Cursor, target: &Cursor) -> bool {
        matches!(
            (cursor, target),
            (Cursor::Token { value: a }, Cursor::Token { value: b }) if a == b
        )
    }

    /// `{ value: raw }`; an empty raw token is no token, like an empty page cursor.
    fn from_raw(&self, raw: Option<&str>) -> Result<Cursor> {
        Ok(Cursor::Token {
            value: raw.filter(|r| !r.is_empty()).map(str::to_owned),
        })
    }

    fn is_full_scan(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn token_cursor_takes_the_page_cursor() -> crate::error::Result<()> {
        use crate::cursor::{AdvanceInput, Cursor, CursorStrategy, TokenCursor};

        let strategy = TokenCursor::new(None);
        let input = AdvanceInput {
            items: &[],
            page_cursor: Some("abc"),
            has_more: None,
            now_ms: 0,
        };
        let step = strategy.advance(&strategy.initial(), input)?;
        assert_eq!(
            step.cursor,
            Cursor::Token {
                value: Some("abc".into())
            }
        );
        assert!(!step.done);
        Ok(())
    }

    use super::*;
    use crate::error::ErrorCode;
    use serde_json::{Value, json};

    fn tok(value: Option<&str>) -> Cursor {
        Cursor::Token {
            value: value.map(str::to_owned),
        }
    }

    fn step(
        strategy: &TokenCursor,
        cursor: &Cursor,
        items: &[Value],
        page_cursor: Option<&str>,
        has_more: Option<bool>,
    ) -> Advance {
        strategy
            .advance(
                cursor,
                AdvanceInput {
                    items,
                    page_cursor,
                    has_more,
                    now_ms: 0,
                },
            )
            .unwrap()
    }

    #[test]
    fn basics() {
        let strategy = TokenCursor::new(Some("start".into()));
        assert_eq!(strategy.name(), "token");
        assert_eq!(strategy.initial(), tok(Some("start")));
        assert_eq!(TokenCursor::default().initial(), tok(None));
        assert!(!strategy.is_full_scan());
        assert_eq!(strategy.lag_ms(&tok(Some("x")), 5), None);
        let cursor = tok(Some("abc"));
        assert_eq!(strategy.for_fetch(&cursor, true), cursor);
        assert_eq!(strategy.for_fetch(&cursor, false), cursor);
        assert_eq!(strategy.on_cycle_complete(&cursor), cursor);
    }

    #[test]
    fn a_token_moves_the_cursor_and_done_needs_has_more_false() {
        let strategy = TokenCursor::new(None);
        let items = [json!({ "id": 1 }), json!({ "id": 2 })];
        for (has_more, done) in [(None, false), (Some(true), false), (Some(false), true)] {
            assert_eq!(
                step(&strategy, &tok(Some("t1")), &items, Some("t2"), has_more),
                Advance {
                    cursor: tok(Some("t2")),
                    done,
                    keep: vec![true, true],
                },
                "{has_more:?}"
            );
        }
    }

    #[test]
    fn no_token_resets_to_initial_and_ends_the_listing() {
        let strategy = TokenCursor::new(Some("start".into()));
        for page_cursor in [None, Some("")] {
            for has_more in [None, Some(true), Some(false)] {
                assert_eq!(
                    step(
                        &strategy,
                        &tok(Some("t9")),
                        &[json!(1)],
                        page_cursor,
                        has_more
                    ),
                    Advance {
                        cursor: tok(Some("start")),
                        done: true,
                        keep: vec![true],
                    }
                );
            }
        }
        let strategy = TokenCursor::new(None);
        assert_eq!(
            step(&strategy, &tok(Some("t9")), &[], None, None).cursor,
            tok(None)
        );
    }

    #[test]
    fn a_foreign_cursor_is_an_error() {
        let err = TokenCursor::new(None)
            .advance(
                &Cursor::Snapshot,
                AdvanceInput {
                    items: &[],
                    page_cursor: None,
                    has_more: None,
                    now_ms: 0,
                },
            )
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::Config);
    }

    #[test]
    fn reached_is_equality() {
        let strategy = TokenCursor::new(None);
        assert!(strategy.reached(&tok(Some("a")), &tok(Some("a"))));
        assert!(strategy.reached(&tok(None), &tok(None)));
        assert!(!strategy.reached(&tok(Some("a")), &tok(Some("b"))));
        assert!(!strategy.reached(&tok(None), &tok(Some("a"))));
        assert!(!strategy.reached(&Cursor::Snapshot, &tok(None)));
    }

    #[test]
    fn from_raw() {
        let strategy = TokenCursor::new(Some("start".into()));
        assert_eq!(strategy.from_raw(Some("abc")).unwrap(), tok(Some("abc")));
        assert_eq!(strategy.from_raw(None).unwrap(), tok(None));
        assert_eq!(strategy.from_raw(Some("")).unwrap(), tok(None));
    }

    #[test]
    fn serialize_round_trips_and_garbage_is_rejected() {
        let strategy = TokenCursor::new(None);
        for (cursor, text) in [
            (tok(None), r#"{"value":null}"#),
            (tok(Some("eyJwIjoyfQ==")), r#"{"value":"eyJwIjoyfQ=="}"#),
            (tok(Some("a\\b\"c")), r#"{"value":"a\\b\"c"}"#),
        ] {
            assert_eq!(strategy.serialize(&cursor), text);
            assert_eq!(strategy.deserialize(text).unwrap(), cursor);
        }
        for text in [
            "",
            "null",
            "\"abc\"",
            "{}",
            r#"{"value":3}"#,
            r#"{"value":"a","tieBreak":null}"#,
            r#"{"page":1}"#,
        ] {
            let err = strategy.deserialize(text).unwrap_err();
            assert_eq!(err.code(), ErrorCode::Store, "{text}");
            assert!(err.to_string().contains("token cursor"), "{err}");
        }
    }
}
