//! The `custom` strategy: the user's own cursor type and advance rule.

use std::fmt;
use std::marker::PhantomData;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::shared;
use super::{Advance, AdvanceInput, Cursor, CursorStrategy};
use crate::error::{BoxError, Error, Result};
use crate::json::Json;

const NAME: &str = "custom";

/// What one fetched page tells a [`CustomCursor`].
#[derive(Clone, Copy, Debug)]
pub struct CustomStep<'a> {
    /// The page's items as the API returned them (before validation), in page order.
    pub items: &'a [serde_json::Value],
    /// The page's cursor as the API returned it, if any.
    pub page_cursor: Option<&'a str>,
    /// The page's `has_more` flag (`false` when the API sent none).
    pub has_more: bool,
}

/// What a [`CustomCursor`] decided about a page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CustomAdvance<C> {
    /// The cursor after the page.
    pub cursor: C,
    /// The listing is complete for this cycle.
    pub done: bool,
}

/// A user-defined cursor: any serde type, moved by the user's rule. Hand it to a poller with
/// [`cursor::custom`](super::custom). The cursor is persisted as its JSON
/// serialization, and a backfill target is reached when the serialized forms are equal.
///
/// ```
/// use serde::{Deserialize, Serialize};
/// use watukuy_core::BoxError;
/// use watukuy_core::cursor::{self, CustomAdvance, CustomCursor, CustomStep};
///
/// /// Offset paging: `fetch` asks for `limit` items from `offset`.
/// #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
/// struct Offset {
///     offset: usize,
/// }
///
/// struct OffsetCursor;
///
/// impl CustomCursor for OffsetCursor {
///     type Cursor = Offset;
///
///     fn initial(&self) -> Offset {
///         Offset { offset: 0 }
///     }
///
///     fn advance(&self, cursor: &Offset, step: CustomStep<'_>) -> Result<CustomAdvance<Offset>, BoxError> {
///         Ok(CustomAdvance {
///             cursor: Offset { offset: cursor.offset + step.items.len() },
///             done: !step.has_more,
///         })
///     }
/// }
///
/// let config = cursor::custom(OffsetCursor)?; // `.cursor(config)` on a poller builder
/// assert_eq!(config.name(), "custom");
/// # Ok::<(), watukuy_core::Error>(())
/// ```
pub trait CustomCursor: Send + Sync + 'static {
    /// The cursor type; persisted as its JSON serialization.
    type Cursor: Serialize + DeserializeOwned;

    /// The cursor of a lane that has never run.
    fn initial(&self) -> Self::Cursor;

    /// Moves the cursor over one page; an error fails the cycle (reported as a Config error
    /// naming `cursor.advance`).
    fn advance(
        &self,
        cursor: &Self::Cursor,
        step: CustomStep<'_>,
    ) -> std::result::Result<CustomAdvance<Self::Cursor>, BoxError>;
}

/// The strategy of a [`CustomCursor`]: the cursor travels as
/// [`Cursor::Custom`] JSON, normalized through the user's type (so equal cursors have equal
/// text).
pub(crate) struct CustomStrategy<C: CustomCursor> {
    inner: C,
    initial: Json,
}

impl<C: CustomCursor> CustomStrategy<C> {
    /// Wraps `inner`; fails with a Config error naming `cursor.initial` when its initial cursor
    /// cannot be serialized (or read back).
    pub(crate) fn new(inner: C) -> Result<Self> {
        let initial = encode(&inner.initial())
            .and_then(|json| json.decode::<C::Cursor>().and_then(|c| encode(&c)))
            .map_err(|e| {
                Error::config(
                    "cursor.initial",
                    format!("the custom cursor's initial value cannot be serialized: {e}"),
                )
            })?;
        Ok(Self { inner, initial })
    }

    /// Reads JSON text as the user's type and writes it back in normal form.
    fn normalize(text: &str) -> std::result::Result<Json, String> {
        let typed: C::Cursor =
            serde_json::from_str(text).map_err(|e| format!("not a valid cursor: {e}"))?;
        encode(&typed).map_err(|e| format!("cannot be serialized back: {e}"))
    }
}

impl<C: CustomCursor> fmt::Debug for CustomStrategy<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CustomStrategy")
            .field("cursor", &std::any::type_name::<C>())
            .field("initial", &self.initial)
            .finish()
    }
}

fn encode<T: Serialize>(value: &T) -> std::result::Result<Json, serde_json::Error> {
    Json::encode(value)
}

impl<C: CustomCursor> CursorStrategy for CustomStrategy<C> {
    fn name(&self) -> &'static str {
        NAME
    }

    fn initial(&self) -> Cursor {
        Cursor::Custom(self.initial.clone())
    }

    fn serialize(&self, cursor: &Cursor) -> String {
        shared::encode(cursor)
    }

    fn deserialize(&self, text: &str) -> Result<Cursor> {
        Self::normalize(text)
            .map(Cursor::Custom)
            .map_err(|reason| shared::corrupt(NAME, text, reason))
    }

    fn for_fetch(&self, cursor: &Cursor, _first_request: bool) -> Cursor {
        cursor.clone()
    }

    fn advance(&self, cursor: &Cursor, input: AdvanceInput<'_>) -> Result<Advance> {
        let Cursor::Custom(json) = cursor else {
            return Err(shared::wrong_cursor(NAME, cursor));
        };
        let current: C::Cursor = json.decode().map_err(|e| {
            Error::config(
                "cursor",
                format!(
                    "the custom cursor {} does not match its type: {e}",
                    shared::shorten(json.as_str())
                ),
            )
        })?;
        let step = CustomStep {
            items: input.items,
            page_cursor: input.page_cursor,
            has_more: input.has_more == Some(true),
        };
        let next = self.inner.advance(&current, step).map_err(|e| {
            Error::config(
                "cursor.advance",
                format!("the custom cursor's advance failed: {e}"),
            )
        })?;
        let text = encode(&next.cursor).map_err(|e| {
            Error::config(
                "cursor.advance",
                format!(
                    "the custom cursor's advance returned a cursor that cannot be serialized: {e}"
                ),
            )
        })?;
        let normal = Self::normalize(text.as_str()).map_err(|reason| {
            Error::config(
                "cursor.advance",
                format!(
                    "the custom cursor's advance returned {} which does not read back: {reason}",
                    shared::shorten(text.as_str())
                ),
            )
        })?;
        Ok(Advance {
            cursor: Cursor::Custom(normal),
            done: next.done,
            keep: vec![true; input.items.len()],
        })
    }

    fn reached(&self, cursor: &Cursor, target: &Cursor) -> bool {
        matches!(
            (cursor, target),
            (Cursor::Custom(a), Cursor::Custom(b)) if a == b
        )
    }

    /// `None` is the initial cursor; a raw value is the cursor's JSON text.
    fn from_raw(&self, raw: Option<&str>) -> Result<Cursor> {
        let Some(raw) = raw else {
            return Ok(self.initial());
        };
        Self::normalize(raw).map(Cursor::Custom).map_err(|reason| {
            Error::config("cursor", format!("{} is {reason}", shared::shorten(raw)))
        })
    }

    fn is_full_scan(&self) -> bool {
        false
    }
}

/// A [`CustomCursor`] made of an initial value and a closure, for cursors that need no type
/// of their own.
///
/// ```
/// use watukuy_core::cursor::{self, CustomAdvance, FnCustomCursor};
///
/// // Count the items seen so far.
/// let counter = FnCustomCursor::new(0_u64, |seen: &u64, step| {
///     let len = u64::try_from(step.items.len())?;
///     Ok(CustomAdvance { cursor: seen + len, done: !step.has_more })
/// });
/// let config = cursor::custom(counter)?;
/// assert_eq!(config.name(), "custom");
/// # Ok::<(), watukuy_core::Error>(())
/// ```
pub struct FnCustomCursor<T, F> {
    initial: T,
    advance: F,
    _cursor: PhantomData<fn() -> T>,
}

/// The closure's bound is here so that its argument types are inferred; the rest of what a
/// cursor needs is on the [`CustomCursor`] impl.
impl<T, F> FnCustomCursor<T, F>
where
    F: Fn(&T, CustomStep<'_>) -> std::result::Result<CustomAdvance<T>, BoxError>,
{
    /// A cursor starting at `initial`, moved by `advance`.
    pub fn new(initial: T, advance: F) -> Self {
        Self {
            initial,
            advance,
            _cursor: PhantomData,
        }
    }
}

impl<T, F> CustomCursor for FnCustomCursor<T, F>
where
    T: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
    F: Fn(&T, CustomStep<'_>) -> std::result::Result<CustomAdvance<T>, BoxError>
        + Send
        + Sync
        + 'static,
{
    type Cursor = T;

    fn initial(&self) -> T {
        self.initial.clone()
    }

    fn advance(
        &self,
        cursor: &T,
        step: CustomStep<'_>,
    ) -> std::result::Result<CustomAdvance<T>, BoxError> {
        (self.advance)(cursor, step)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Deserialize;
    use serde_json::{Value, json};

    use super::*;
    use crate::error::ErrorCode;

    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    struct Offset {
        offset: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        since: Option<String>,
    }

    /// Offset paging that fails on a page cursor `"boom"`.
    struct OffsetCursor;

    impl CustomCursor for OffsetCursor {
        type Cursor = Offset;

        fn initial(&self) -> Offset {
            Offset {
                offset: 0,
                since: None,
            }
        }

        fn advance(
            &self,
            cursor: &Offset,
            step: CustomStep<'_>,
        ) -> std::result::Result<CustomAdvance<Offset>, BoxError> {
            if step.page_cursor == Some("boom") {
                return Err("the API changed its mind".into());
            }
            Ok(CustomAdvance {
                cursor: Offset {
                    offset: cursor.offset + u64::try_from(step.items.len())?,
                    since: step.page_cursor.map(str::to_owned),
                },
                done: !step.has_more,
            })
        }
    }

    fn strategy() -> CustomStrategy<OffsetCursor> {
        CustomStrategy::new(OffsetCursor).unwrap()
    }

    fn custom(text: &str) -> Cursor {
        Cursor::Custom(Json::parse(text).unwrap())
    }

    fn input<'a>(
        items: &'a [Value],
        page_cursor: Option<&'a str>,
        has_more: Option<bool>,
    ) -> AdvanceInput<'a> {
        AdvanceInput {
            items,
            page_cursor,
            has_more,
            now_ms: 0,
        }
    }

    #[test]
    fn basics() {
        let s = strategy();
        assert_eq!(s.name(), "custom");
        assert_eq!(s.initial(), custom(r#"{"offset":0}"#));
        assert!(!s.is_full_scan());
        let c = custom(r#"{"offset":4}"#);
        assert_eq!(s.lag_ms(&c, 5), None);
        assert_eq!(s.for_fetch(&c, true), c);
        assert_eq!(s.for_fetch(&c, false), c);
        assert_eq!(s.on_cycle_complete(&c), c);
        assert!(format!("{s:?}").contains("OffsetCursor"));
    }

    #[test]
    fn advance_runs_the_user_rule() {
        let s = strategy();
        let items = [json!({ "id": 1 }), json!({ "id": 2 }), json!({ "id": 3 })];
        let step = s
            .advance(&s.initial(), input(&items, Some("p2"), Some(true)))
            .unwrap();
        assert_eq!(
            step,
            Advance {
                cursor: custom(r#"{"offset":3,"since":"p2"}"#),
                done: false,
                keep: vec![true; 3],
            }
        );
        // `has_more` absent is false for the user.
        let step = s
            .advance(&step.cursor, input(&items[..1], None, None))
            .unwrap();
        assert_eq!(
            step,
            Advance {
                cursor: custom(r#"{"offset":4}"#),
                done: true,
                keep: vec![true],
            }
        );
    }

    #[test]
    fn advance_errors_are_reported_not_panics() {
        let s = strategy();
        let err = s
            .advance(&s.initial(), input(&[], Some("boom"), None))
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::Config);
        let text = err.to_string();
        assert!(text.contains("`cursor.advance`"), "{text}");
        assert!(text.contains("the API changed its mind"), "{text}");

        // A cursor of another type, and a foreign variant.
        let err = s
            .advance(&custom(r#"{"offset":"x"}"#), input(&[], None, None))
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::Config);
        let err = s
            .advance(&Cursor::Page { page: 1 }, input(&[], None, None))
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::Config);
    }

    /// A cursor whose serialization fails: a map with non-string keys.
    struct BadCursor {
        fail_initial: bool,
    }

    impl CustomCursor for BadCursor {
        type Cursor = BTreeMap<Vec<u8>, u8>;

        fn initial(&self) -> Self::Cursor {
            if self.fail_initial {
                BTreeMap::from([(vec![1], 1)])
            } else {
                BTreeMap::new()
            }
        }

        fn advance(
            &self,
            _cursor: &Self::Cursor,
            _step: CustomStep<'_>,
        ) -> std::result::Result<CustomAdvance<Self::Cursor>, BoxError> {
            Ok(CustomAdvance {
                cursor: BTreeMap::from([(vec![2], 2)]),
                done: true,
            })
        }
    }

    #[test]
    fn unserializable_cursors_are_errors() {
        let err = CustomStrategy::new(BadCursor { fail_initial: true }).unwrap_err();
        assert_eq!(err.code(), ErrorCode::Config);
        assert!(err.to_string().contains("`cursor.initial`"), "{err}");

        let s = CustomStrategy::new(BadCursor {
            fail_initial: false,
        })
        .unwrap();
        assert_eq!(s.initial(), custom("{}"));
        let err = s.advance(&s.initial(), input(&[], None, None)).unwrap_err();
        assert_eq!(err.code(), ErrorCode::Config);
        assert!(err.to_string().contains("`cursor.advance`"), "{err}");
    }

    #[test]
    fn reached_compares_serialized_forms() {
        let s = strategy();
        assert!(s.reached(&custom(r#"{"offset":3}"#), &custom(r#"{"offset":3}"#)));
        assert!(!s.reached(&custom(r#"{"offset":3}"#), &custom(r#"{"offset":4}"#)));
        assert!(!s.reached(&Cursor::Snapshot, &custom(r#"{"offset":3}"#)));
        // Normalized on the way in, so spelling does not matter.
        let target = s.from_raw(Some(r#"{ "offset" : 3 }"#)).unwrap();
        assert!(s.reached(&custom(r#"{"offset":3}"#), &target));
    }

    #[test]
    fn from_raw() {
        let s = strategy();
        assert_eq!(s.from_raw(None).unwrap(), s.initial());
        assert_eq!(
            s.from_raw(Some(r#"{"since":"a","offset":7}"#)).unwrap(),
            custom(r#"{"offset":7,"since":"a"}"#)
        );
        for bad in ["", "7", r#"{"offset":-1}"#, "{"] {
            let err = s.from_raw(Some(bad)).unwrap_err();
            assert_eq!(err.code(), ErrorCode::Config, "{bad:?}");
            assert!(err.to_string().contains("`cursor`"), "{err}");
        }
    }

    #[test]
    fn serialize_round_trips_and_garbage_is_rejected() {
        let s = strategy();
        for text in [r#"{"offset":0}"#, r#"{"offset":12,"since":"tok"}"#] {
            let cursor = s.deserialize(text).unwrap();
            assert_eq!(cursor, custom(text));
            assert_eq!(s.serialize(&cursor), text);
        }
        assert_eq!(
            s.deserialize(" {\"offset\": 1} ").unwrap(),
            custom(r#"{"offset":1}"#)
        );
        for text in ["", "null", "[]", r#"{"offset":"1"}"#, "{"] {
            let err = s.deserialize(text).unwrap_err();
            assert_eq!(err.code(), ErrorCode::Store, "{text}");
            assert!(err.to_string().contains("custom cursor"), "{err}");
        }
    }

    #[test]
    fn closures_make_a_cursor() {
        let s = CustomStrategy::new(FnCustomCursor::new(
            Option::<String>::None,
            |_: &Option<String>, step| {
                Ok(CustomAdvance {
                    cursor: step.page_cursor.map(str::to_owned),
                    done: step.page_cursor.is_none(),
                })
            },
        ))
        .unwrap();
        assert_eq!(s.serialize(&s.initial()), "null");
        assert_eq!(s.deserialize("null").unwrap(), s.initial());
        let step = s
            .advance(&s.initial(), input(&[], Some("n"), None))
            .unwrap();
        assert_eq!((step.cursor.clone(), step.done), (custom(r#""n""#), false));
        let step = s.advance(&step.cursor, input(&[], None, None)).unwrap();
        assert_eq!((step.cursor, step.done), (custom("null"), true));
    }
}
