//! The `timestamp` strategy: a watermark on an item field, with an optional
//! tie-break field, a `lag` that holds back the newest items and an `overlap` that re-reads a
//! window on the first request of every cycle.

use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::shared::{self, read_field};
use super::time::{format_timestamp, parse_timestamp};
use super::{Advance, AdvanceInput, Cursor, CursorStrategy, SharedStrategy};
use crate::clock::duration_ms;
use crate::error::{Error, Result};

const NAME: &str = "timestamp";

/// A user `parse`: a field value as the server wrote it → epoch ms (`None` = not a timestamp).
pub type ParseFn = Arc<dyn Fn(&str) -> Option<i64> + Send + Sync>;

/// A user `format`: epoch ms and a sample of the server's strings (the stored watermark) → the
/// string to hand to `fetch` (used for `overlap`).
pub type FormatFn = Arc<dyn Fn(i64, &str) -> String + Send + Sync>;

/// The options of a `timestamp` cursor ([`timestamp`](super::timestamp)), checked when the
/// poller is built: a bad one is a Config error naming it (`cursor.field`, `cursor.tie_break`,
/// `cursor.initial`, `cursor.skip_seen`).
///
/// ```
/// use std::time::Duration;
/// use watukuy_core::{Error, Page, Poller, cursor};
///
/// #[derive(Clone, serde::Serialize, serde::Deserialize)]
/// struct Order { id: String, meta: serde_json::Value }
///
/// let poller = |cursor| {
///     Poller::builder::<Order>("orders")
///         .identity(|order: &Order| order.id.clone())
///         .cursor(cursor)
///         .fetch(|_ctx| async { Ok(Page::new(Vec::new())) })
///         .build()
/// };
/// poller(
///     cursor::timestamp("meta.updatedAt")
///         .tie_break("id")
///         .initial(Some("2026-01-01T00:00:00Z".to_owned()))
///         .lag(Duration::from_secs(5))
///         .overlap(Duration::from_secs(60)),
/// )?;
/// let err = poller(cursor::timestamp("")).unwrap_err();
/// assert!(matches!(err, Error::Config { ref option, .. } if option == "cursor.field"));
/// # Ok::<(), Error>(())
/// ```
#[derive(Clone)]
pub struct TimestampCursorBuilder {
    field: String,
    tie_break: Option<String>,
    tie_break_order: TieBreakOrder,
    skip_seen: bool,
    initial: Option<String>,
    lag: Duration,
    overlap: Duration,
    parse: Option<ParseFn>,
    format: Option<FormatFn>,
}

impl TimestampCursorBuilder {
    /// Options for a watermark on `field` (a dot path such as `meta.updatedAt`), with no
    /// tie-break, no initial value, no lag and no overlap.
    pub fn new(field: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            tie_break: None,
            tie_break_order: TieBreakOrder::Text,
            skip_seen: false,
            initial: None,
            lag: Duration::ZERO,
            overlap: Duration::ZERO,
            parse: None,
            format: None,
        }
    }

    /// A second field (dot path, typically the id) that orders items sharing the same timestamp.
    /// Values compare as strings (UTF-16 code units, like JavaScript): `"9"` sorts after `"10"`;
    /// for numeric ids choose [`TieBreakOrder::Numeric`] with
    /// [`tie_break_order`](Self::tie_break_order).
    #[must_use]
    pub fn tie_break(mut self, field: impl Into<String>) -> Self {
        self.tie_break = Some(field.into());
        self
    }

    /// How tie-break values compare (default [`TieBreakOrder::Text`], the reference's order).
    /// Use the order the API sorts by: a cursor that believes `"9"` is the largest id seen while
    /// the API lists `10` after `9` would ask for nothing past `9`.
    #[must_use]
    pub fn tie_break_order(mut self, order: TieBreakOrder) -> Self {
        self.tie_break_order = order;
        self
    }

    /// For APIs that can only filter `field >= value` (not `field > value`, nor the tie-break):
    /// items at exactly the watermark whose tie-break is not past the cursor's were committed by
    /// an earlier page, and are dropped from the page before validation and diffing (default
    /// `false`). A page of nothing but such items ends the cycle instead of asking for the same
    /// page again. Needs a tie-break; cannot be combined with `overlap`, which re-reads on
    /// purpose.
    #[must_use]
    pub fn skip_seen(mut self, skip: bool) -> Self {
        self.skip_seen = skip;
        self
    }

    /// Where a lane that has never run starts (`None`: from the beginning). It must parse.
    #[must_use]
    pub fn initial(mut self, initial: Option<String>) -> Self {
        self.initial = initial;
        self
    }

    /// Items newer than `now - lag` are dropped from the page and fetched again next cycle
    /// (for APIs whose newest writes are not yet visible in a consistent order). Default 0:
    /// items dated in the future are still held back until their time has come.
    #[must_use]
    pub fn lag(mut self, lag: Duration) -> Self {
        self.lag = lag;
        self
    }

    /// The first request of every cycle starts `overlap` before the watermark (without the
    /// tie-break), to catch late writes; the persisted cursor never moves back. Default 0.
    #[must_use]
    pub fn overlap(mut self, overlap: Duration) -> Self {
        self.overlap = overlap;
        self
    }

    /// Replaces the default parser ([`parse_timestamp`](super::parse_timestamp)).
    #[must_use]
    pub fn parse(mut self, parse: impl Fn(&str) -> Option<i64> + Send + Sync + 'static) -> Self {
        self.parse = Some(Arc::new(parse));
        self
    }

    /// Replaces the default formatter ([`format_timestamp`](super::format_timestamp)) used for
    /// `overlap`: it gets epoch ms and the stored watermark as a sample of the server's shape.
    #[must_use]
    pub fn format(mut self, format: impl Fn(i64, &str) -> String + Send + Sync + 'static) -> Self {
        self.format = Some(Arc::new(format));
        self
    }

    /// Checks the options: `cursor.field` and `cursor.tie_break` must be dot paths without empty
    /// segments, `cursor.initial` must parse.
    pub(crate) fn build(self) -> Result<TimestampCursor> {
        shared::check_path("cursor.field", &self.field)?;
        if let Some(tie_break) = &self.tie_break {
            shared::check_path("cursor.tie_break", tie_break)?;
        }
        if self.skip_seen && self.tie_break.is_none() {
            return Err(Error::config(
                "cursor.skip_seen",
                "needs a tie-break field (`tie_break`) to tell seen items from new ones",
            ));
        }
        if self.skip_seen && !self.overlap.is_zero() {
            return Err(Error::config(
                "cursor.skip_seen",
                "cannot be combined with `overlap`, which re-reads items on purpose",
            ));
        }
        let cursor = TimestampCursor {
            field: self.field,
            tie_break: self.tie_break,
            tie_break_order: self.tie_break_order,
            skip_seen: self.skip_seen,
            initial: self.initial,
            lag_ms: duration_ms(self.lag),
            overlap_ms: duration_ms(self.overlap),
            parse: self.parse,
            format: self.format,
        };
        if let Some(initial) = &cursor.initial
            && cursor.parse_value(initial).is_none()
        {
            return Err(Error::config(
                "cursor.initial",
                format!("{} is not a timestamp", shared::shorten(initial)),
            ));
        }
        Ok(cursor)
    }

    /// Builds and wraps the strategy for a poller.
    pub(crate) fn into_strategy(self) -> Result<SharedStrategy> {
        self.build().map(TimestampCursor::into_strategy)
    }
}

impl fmt::Debug for TimestampCursorBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TimestampCursorBuilder")
            .field("field", &self.field)
            .field("tie_break", &self.tie_break)
            .field("initial", &self.initial)
            .field("lag", &self.lag)
            .field("overlap", &self.overlap)
            .field("parse", &self.parse.as_ref().map(|_| "custom"))
            .field("format", &self.format.as_ref().map(|_| "custom"))
            .finish()
    }
}

/// The `timestamp` strategy: the cursor is `{ value, tie_break }`, the largest field value seen
/// (as the server wrote it) and the largest tie-break at exactly that value. `fetch` asks for
/// `field >= value` and, at exactly `value`, `tie_break > cursor.tie_break`.
///
/// Per page (see [`CursorStrategy::advance`]): a non-empty server cursor is trusted as the
/// watermark; otherwise items newer than `now - lag` are dropped (fetched again next cycle),
/// items without a parseable field are kept but never move the watermark, and the watermark
/// moves to the page's largest timestamp when that is newer, or only grows the tie-break when
/// equal. The listing is done unless the page says `has_more: true` and held nothing back.
#[derive(Clone)]
pub(crate) struct TimestampCursor {
    field: String,
    tie_break: Option<String>,
    tie_break_order: TieBreakOrder,
    skip_seen: bool,
    initial: Option<String>,
    lag_ms: i64,
    overlap_ms: i64,
    parse: Option<ParseFn>,
    format: Option<FormatFn>,
}

impl TimestampCursor {
    /// A validated strategy on `field` with default options (see [`TimestampCursorBuilder`]).
    pub(crate) fn new(field: impl Into<String>) -> Result<Self> {
        TimestampCursorBuilder::new(field).build()
    }

    /// The options, to set a tie-break, an initial value, lag, overlap, parse or format.
    #[cfg(test)]
    pub(crate) fn builder(field: impl Into<String>) -> TimestampCursorBuilder {
        TimestampCursorBuilder::new(field)
    }

    /// The watermark field (dot path).
    #[cfg(test)]
    pub(crate) fn field(&self) -> &str {
        &self.field
    }

    /// The tie-break field (dot path), if any.
    #[cfg(test)]
    pub(crate) fn tie_break_field(&self) -> Option<&str> {
        self.tie_break.as_deref()
    }

    /// The configured lag, in ms.
    #[cfg(test)]
    pub(crate) fn lag_window_ms(&self) -> i64 {
        self.lag_ms
    }

    /// The configured overlap, in ms.
    #[cfg(test)]
    pub(crate) fn overlap_ms(&self) -> i64 {
        self.overlap_ms
    }

    /// Parses a field value with the configured (or default) parser, into epoch ms.
    pub(crate) fn parse_value(&self, raw: &str) -> Option<i64> {
        match &self.parse {
            Some(parse) => parse(raw),
            None => parse_timestamp(raw),
        }
    }

    /// Wraps the strategy for a poller.
    pub(crate) fn into_strategy(self) -> SharedStrategy {
        Arc::new(self)
    }

    /// Parses the stored watermark; one that does not parse is a Config error naming the field
    /// and the raw string.
    fn parse_stored(&self, raw: &str) -> Result<i64> {
        self.parse_value(raw).ok_or_else(|| {
            Error::config(
                "cursor.field",
                format!(
                    "the cursor value {} of `{}` is not a timestamp",
                    shared::shorten(raw),
                    self.field
                ),
            )
        })
    }

    fn format_value(&self, ms: i64, sample: &str) -> Option<String> {
        match &self.format {
            Some(format) => Some(format(ms, sample)),
            None => format_timestamp(ms, sample),
        }
    }
}

/// The newest kept item of a page: its timestamp, the server's string and the largest
/// tie-break at that timestamp.
/// How a `timestamp` cursor compares tie-break values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TieBreakOrder {
    /// As strings, by UTF-16 code units (JavaScript's order, the reference's): `"9" > "10"`.
    #[default]
    Text,
    /// As integers of any length (`-?[0-9]+`, leading zeros ignored): `"9" < "10"`. Values that
    /// are not integers sort after every integer, among themselves as [`Text`](Self::Text).
    Numeric,
}

impl TieBreakOrder {
    /// Compares two tie-break values in this order.
    pub fn cmp(self, a: &str, b: &str) -> Ordering {
        match self {
            TieBreakOrder::Text => shared::cmp_utf16(a, b),
            TieBreakOrder::Numeric => match (integer(a), integer(b)) {
                (Some(a), Some(b)) => a.cmp(&b),
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (None, None) => shared::cmp_utf16(a, b),
            },
        }
    }

    /// The larger of two optional values (a value beats none).
    fn max(self, a: Option<String>, b: Option<String>) -> Option<String> {
        match (a, b) {
            (Some(a), Some(b)) => Some(if self.cmp(&b, &a) == Ordering::Greater {
                b
            } else {
                a
            }),
            (a, None) => a,
            (None, b) => b,
        }
    }
}

/// An integer of any length as a sortable key: `(sign, digits without leading zeros)`, where
/// larger magnitudes of negative numbers sort first.
#[derive(PartialEq, Eq)]
struct Integer<'a> {
    negative: bool,
    digits: &'a str,
}

impl Ord for Integer<'_> {
    fn cmp(&self, other: &Self) -> Ordering {
        let magnitude = self
            .digits
            .len()
            .cmp(&other.digits.len())
            .then_with(|| self.digits.cmp(other.digits));
        match (self.negative, other.negative) {
            (false, false) => magnitude,
            (true, true) => magnitude.reverse(),
            (false, true) => Ordering::Greater,
            (true, false) => Ordering::Less,
        }
    }
}

impl PartialOrd for Integer<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// `text` as an integer, if it is one.
fn integer(text: &str) -> Option<Integer<'_>> {
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let digits = digits.trim_start_matches('0');
    Some(Integer {
        // -0 is 0.
        negative: negative && !digits.is_empty(),
        digits,
    })
}

struct PageMax {
    ms: i64,
    raw: String,
    tie_break: Option<String>,
}

impl CursorStrategy for TimestampCursor {
    /// A request reads `since=` the watermark: a 304 means nothing changed since, and the
    /// cycle ends with the cursor where it is.
    fn conditional_requests(&self) -> bool {
        true
    }

    fn name(&self) -> &'static str {
        NAME
    }

    fn initial(&self) -> Cursor {
        Cursor::Timestamp {
            value: self.initial.clone(),
            tie_break: None,
        }
    }

    fn serialize(&self, cursor: &Cursor) -> String {
        shared::encode(cursor)
    }

    fn deserialize(&self, text: &str) -> Result<Cursor> {
        let map = shared::object_with_keys(NAME, text, &["value", "tieBreak"])?;
        Ok(Cursor::Timestamp {
            value: shared::string_or_null(NAME, text, &map, "value")?,
            tie_break: shared::string_or_null(NAME, text, &map, "tieBreak")?,
        })
    }

    fn for_fetch(&self, cursor: &Cursor, first_request: bool) -> Cursor {
        if !first_request || self.overlap_ms <= 0 {
            return cursor.clone();
        }
        let Cursor::Timestamp {
            value: Some(value), ..
        } = cursor
        else {
            return cursor.clone();
        };
        let Some(ms) = self.parse_value(value) else {
            // `advance` reports the bad value; the request goes out unchanged.
            return cursor.clone();
        };
        match self.format_value(ms.saturating_sub(self.overlap_ms), value) {
            Some(text) => Cursor::Timestamp {
                value: Some(text),
                tie_break: None,
            },
            None => cursor.clone(),
        }
    }

    fn advance(&self, cursor: &Cursor, input: AdvanceInput<'_>) -> Result<Advance> {
        let Cursor::Timestamp { value, tie_break } = cursor else {
            return Err(shared::wrong_cursor(NAME, cursor));
        };
        let done = input.has_more != Some(true);
        if let Some(server) = input.page_cursor.filter(|c| !c.is_empty()) {
            return Ok(Advance {
                cursor: Cursor::Timestamp {
                    value: Some(server.to_owned()),
                    tie_break: None,
                },
                done,
                keep: vec![true; input.items.len()],
            });
        }

        let cutoff = input.now_ms.saturating_sub(self.lag_ms);
        let mut keep = Vec::with_capacity(input.items.len());
        let mut best: Option<PageMax> = None;
        // `skip_seen`: the watermark and tie-break already committed.
        let seen = match (value.as_deref(), tie_break.as_deref()) {
            (Some(value), Some(tie)) if self.skip_seen => {
                self.parse_value(value).map(|ms| (ms, tie))
            }
            _ => None,
        };
        let (mut held_back, mut skipped) = (false, 0_usize);
        for item in input.items {
            let parsed = read_field(item, &self.field)
                .and_then(|raw| self.parse_value(&raw).map(|ms| (ms, raw)));
            let Some((ms, raw)) = parsed else {
                // Kept for diffing, never moves the watermark.
                keep.push(true);
                continue;
            };
            if ms > cutoff {
                keep.push(false);
                held_back = true;
                continue;
            }
            let tie = self
                .tie_break
                .as_deref()
                .and_then(|field| read_field(item, field));
            if let (Some((seen_ms, seen_tie)), Some(tie)) = (seen, tie.as_deref())
                && ms == seen_ms
                && self.tie_break_order.cmp(tie, seen_tie) != Ordering::Greater
            {
                keep.push(false);
                skipped += 1;
                continue;
            }
            keep.push(true);
            match &mut best {
                Some(max) if ms == max.ms => {
                    max.tie_break = self.tie_break_order.max(max.tie_break.take(), tie);
                }
                Some(max) if ms < max.ms => {}
                _ => {
                    best = Some(PageMax {
                        ms,
                        raw,
                        tie_break: tie,
                    });
                }
            }
        }

        let next = match (best, value) {
            (None, _) => cursor.clone(),
            (Some(max), None) => Cursor::Timestamp {
                value: Some(max.raw),
                tie_break: max.tie_break,
            },
            (Some(max), Some(current)) => {
                let current_ms = self.parse_stored(current)?;
                if max.ms > current_ms {
                    Cursor::Timestamp {
                        value: Some(max.raw),
                        tie_break: max.tie_break,
                    }
                } else if max.ms == current_ms && self.tie_break.is_some() {
                    Cursor::Timestamp {
                        value: Some(current.clone()),
                        tie_break: self.tie_break_order.max(tie_break.clone(), max.tie_break),
                    }
                } else {
                    cursor.clone()
                }
            }
        };
        // A held-back item is fetched again next cycle, and the listing is ordered by the field,
        // so whatever follows is newer still: the cycle ends here. Going on would ask for the
        // same held-back items again (a full page of them would repeat up to the page cap).
        // A page of nothing but seen items would be asked for again too: the API cannot list
        // past them.
        let only_seen = skipped > 0 && skipped == input.items.len();
        Ok(Advance {
            cursor: next,
            done: done || held_back || only_seen,
            keep,
        })
    }

    fn lag_ms(&self, cursor: &Cursor, now_ms: i64) -> Option<i64> {
        match cursor {
            Cursor::Timestamp {
                value: Some(value), ..
            } => self.parse_value(value).map(|ms| now_ms.saturating_sub(ms)),
            _ => None,
        }
    }

    fn reached(&self, cursor: &Cursor, target: &Cursor) -> bool {
        let Cursor::Timestamp { value: target, .. } = target else {
            return false;
        };
        let Some(target) = target else {
            return true;
        };
        let Cursor::Timestamp {
            value: Some(value), ..
        } = cursor
        else {
            return false;
        };
        match (self.parse_value(value), self.parse_value(target)) {
            (Some(at), Some(goal)) => at >= goal,
            // Cannot compare: keep going; the strategy's own `done` ends the lane.
            _ => false,
        }
    }

    fn from_raw(&self, raw: Option<&str>) -> Result<Cursor> {
        if let Some(raw) = raw
            && self.parse_value(raw).is_none()
        {
            return Err(Error::config(
                "cursor",
                format!(
                    "{} is not a timestamp for `{}`",
                    shared::shorten(raw),
                    self.field
                ),
            ));
        }
        Ok(Cursor::Timestamp {
            value: raw.map(str::to_owned),
            tie_break: None,
        })
    }

    fn is_full_scan(&self) -> bool {
        false
    }

    fn skips_items(&self) -> bool {
        self.lag_ms > 0 || self.skip_seen
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_custom_parser_reads_the_apis_format() -> crate::error::Result<()> {
        use crate::cursor::TimestampCursor;

        // The API writes "2026/01/01 00:00".
        let cursor = TimestampCursor::builder("updated")
            .parse(|raw| crate::cursor::parse_timestamp(&raw.replace('/', "-")))
            .build()?;
        assert_eq!(
            cursor.parse_value("2026/01/01 00:00"),
            Some(1_767_225_600_000)
        );
        Ok(())
    }

    #[test]
    fn an_empty_field_is_a_config_error() -> crate::error::Result<()> {
        use crate::cursor::TimestampCursor;

        let err = TimestampCursor::builder("")
            .build()
            .err()
            .expect("an error");
        assert!(err.to_string().contains("`cursor.field`"));
        Ok(())
    }

    #[test]
    fn timestamp_cursor_advances_to_the_last_item() -> crate::error::Result<()> {
        use crate::cursor::{AdvanceInput, Cursor, CursorStrategy, TimestampCursor};

        let strategy = TimestampCursor::builder("updatedAt")
            .tie_break("id")
            .build()?;
        let items = [
            serde_json::json!({ "id": "a", "updatedAt": "2026-01-01T00:00:00Z" }),
            serde_json::json!({ "id": "b", "updatedAt": "2026-01-01T00:00:00Z" }),
        ];
        let input = AdvanceInput {
            items: &items,
            page_cursor: None,
            has_more: None,
            now_ms: 1_767_225_600_000,
        };
        let step = strategy.advance(&strategy.initial(), input)?;
        assert_eq!(
            step.cursor,
            Cursor::Timestamp {
                value: Some("2026-01-01T00:00:00Z".into()),
                tie_break: Some("b".into())
            }
        );
        assert!(step.done);
        Ok(())
    }

    use super::*;
    use crate::error::ErrorCode;
    use serde_json::{Value, json};

    /// 2026-01-01T00:00:00Z in epoch ms.
    const T0: i64 = 1_767_225_600_000;

    fn ts(value: Option<&str>, tie_break: Option<&str>) -> Cursor {
        Cursor::Timestamp {
            value: value.map(str::to_owned),
            tie_break: tie_break.map(str::to_owned),
        }
    }

    fn input<'a>(items: &'a [Value], now_ms: i64) -> AdvanceInput<'a> {
        AdvanceInput {
            items,
            page_cursor: None,
            has_more: None,
            now_ms,
        }
    }

    /// A page with `has_more`, long after its items' times.
    fn page(items: &[Value], has_more: Option<bool>) -> AdvanceInput<'_> {
        AdvanceInput {
            has_more,
            ..input(items, T0 + 86_400_000)
        }
    }

    fn plain() -> TimestampCursor {
        TimestampCursor::new("updatedAt").unwrap()
    }

    fn with_tie() -> TimestampCursor {
        TimestampCursor::builder("updatedAt")
            .tie_break("id")
            .build()
            .unwrap()
    }

    fn item(id: &str, at: &str) -> Value {
        json!({ "id": id, "updatedAt": at })
    }

    /// The cursor `strategy` moves `start` to over `items`, five seconds after `T0`.
    fn moved(strategy: &TimestampCursor, start: &Cursor, items: &[Value]) -> Cursor {
        strategy
            .advance(start, input(items, T0 + 5_000))
            .unwrap()
            .cursor
    }

    #[test]
    fn config_is_validated() {
        for (builder, option) in [
            (TimestampCursor::builder(""), "`cursor.field`"),
            (TimestampCursor::builder("a..b"), "`cursor.field`"),
            (
                TimestampCursor::builder("a").tie_break(""),
                "`cursor.tie_break`",
            ),
            (
                TimestampCursor::builder("a").initial(Some("soon".into())),
                "`cursor.initial`",
            ),
        ] {
            let err = builder.build().err().expect("an error");
            assert_eq!(err.code(), ErrorCode::Config);
            assert!(err.to_string().contains(option), "{err}");
        }
        let ok = TimestampCursor::builder("meta.updatedAt")
            .tie_break("meta.id")
            .initial(Some("1767225600".into()))
            .lag(Duration::from_millis(1500))
            .overlap(Duration::from_secs(60))
            .build()
            .unwrap();
        assert_eq!(ok.field(), "meta.updatedAt");
        assert_eq!(ok.tie_break_field(), Some("meta.id"));
        assert_eq!(ok.lag_window_ms(), 1500);
        assert_eq!(ok.overlap_ms(), 60_000);
        assert_eq!(ok.initial(), ts(Some("1767225600"), None));
        assert_eq!(plain().initial(), ts(None, None));
        assert_eq!(plain().name(), "timestamp");
        assert!(!plain().is_full_scan());
    }

    #[test]
    fn first_page_sets_the_watermark_to_the_server_string_of_the_max() {
        let items = [
            item("a", "2026-01-01T00:00:01Z"),
            item("b", "2026-01-01T00:00:03.000+00:00"),
            item("c", "2026-01-01T00:00:02Z"),
        ];
        let step = plain()
            .advance(&ts(None, None), input(&items, T0 + 10_000))
            .unwrap();
        assert_eq!(
            step,
            Advance {
                cursor: ts(Some("2026-01-01T00:00:03.000+00:00"), None),
                done: true,
                keep: vec![true, true, true],
            }
        );
    }

    #[test]
    fn done_follows_has_more() {
        let items = [item("a", "2026-01-01T00:00:01Z")];
        for (has_more, done) in [(None, true), (Some(false), true), (Some(true), false)] {
            let step = plain()
                .advance(
                    &ts(None, None),
                    AdvanceInput {
                        has_more,
                        ..input(&items, T0 + 10_000)
                    },
                )
                .unwrap();
            assert_eq!(step.done, done, "{has_more:?}");
        }
    }

    #[test]
    fn lag_drops_items_newer_than_the_cutoff() {
        let strategy = TimestampCursor::builder("updatedAt")
            .lag(Duration::from_secs(5))
            .build()
            .unwrap();
        let now = T0 + 10_000; // cutoff = T0 + 5s
        let items = [
            item("a", "2026-01-01T00:00:04Z"),
            item("b", "2026-01-01T00:00:05Z"), // exactly at the cutoff: kept
            item("c", "2026-01-01T00:00:05.001Z"), // newer: dropped
            item("d", "2026-01-01T00:00:09Z"), // newer: dropped
        ];
        let step = strategy
            .advance(&ts(None, None), input(&items, now))
            .unwrap();
        assert_eq!(step.cursor, ts(Some("2026-01-01T00:00:05Z"), None));
        assert_eq!(step.keep, vec![true, true, false, false]);

        // Every item too new: nothing moves, nothing is kept.
        let step = strategy
            .advance(
                &ts(Some("2026-01-01T00:00:01Z"), None),
                input(&items[2..], now),
            )
            .unwrap();
        assert_eq!(step.cursor, ts(Some("2026-01-01T00:00:01Z"), None));
        assert_eq!(step.keep, vec![false, false]);
    }

    #[test]
    fn a_held_back_item_ends_the_listing() {
        let strategy = TimestampCursor::builder("updatedAt")
            .lag(Duration::from_secs(5))
            .build()
            .unwrap();
        let now = T0 + 10_000; // cutoff = T0 + 5s
        let items = [
            item("a", "2026-01-01T00:00:04Z"),
            item("b", "2026-01-01T00:00:06Z"), // held back
        ];
        for page in [&items[..], &items[1..]] {
            let step = strategy
                .advance(
                    &ts(Some("2026-01-01T00:00:01Z"), None),
                    AdvanceInput {
                        has_more: Some(true),
                        ..input(page, now)
                    },
                )
                .unwrap();
            assert!(step.done, "{page:?}: the rest is newer still");
        }
        // Nothing held back: `has_more` decides.
        let step = strategy
            .advance(
                &ts(None, None),
                AdvanceInput {
                    has_more: Some(true),
                    ..input(&items[..1], now)
                },
            )
            .unwrap();
        assert!(!step.done);
    }

    #[test]
    fn without_lag_future_items_are_held_back() {
        let items = [
            item("a", "2026-01-01T00:00:00Z"),
            item("b", "2026-01-01T00:00:00.001Z"),
        ];
        let step = plain().advance(&ts(None, None), input(&items, T0)).unwrap();
        assert_eq!(step.cursor, ts(Some("2026-01-01T00:00:00Z"), None));
        assert_eq!(step.keep, vec![true, false]);
    }

    #[test]
    fn unparseable_and_missing_fields_are_kept_but_never_move_the_watermark() {
        let items = [
            item("a", "not a date"),
            json!({ "id": "b" }),
            json!({ "id": "c", "updatedAt": true }),
            json!({ "id": "d", "updatedAt": null }),
        ];
        let start = ts(Some("2026-01-01T00:00:00Z"), Some("x"));
        let step = with_tie().advance(&start, input(&items, T0)).unwrap();
        assert_eq!(step.cursor, start);
        assert_eq!(step.keep, vec![true; 4]);

        // Mixed with a parseable item, only that one counts.
        let mixed = [item("a", "garbage"), item("b", "2026-01-01T00:00:02Z")];
        let step = with_tie()
            .advance(&ts(None, None), input(&mixed, T0 + 5_000))
            .unwrap();
        assert_eq!(step.cursor, ts(Some("2026-01-01T00:00:02Z"), Some("b")));
        assert_eq!(step.keep, vec![true, true]);
    }

    #[test]
    fn tie_break_is_the_max_at_the_max_timestamp() {
        let items = [
            item("zz", "2026-01-01T00:00:01Z"), // older: its tie-break does not count
            item("b", "2026-01-01T00:00:02Z"),
            item("d", "2026-01-01T00:00:02.000Z"), // same instant, other spelling
            item("c", "2026-01-01T00:00:02Z"),
            json!({ "updatedAt": "2026-01-01T00:00:02Z" }), // no tie-break value
        ];
        let step = with_tie()
            .advance(&ts(None, None), input(&items, T0 + 5_000))
            .unwrap();
        // The first server string at the max, the largest tie-break among all items at it.
        assert_eq!(step.cursor, ts(Some("2026-01-01T00:00:02Z"), Some("d")));
    }

    #[test]
    fn tie_breaks_compare_as_strings_and_numbers_are_stringified() {
        let items = [
            json!({ "id": 10, "updatedAt": 1_767_225_600 }),
            json!({ "id": 9, "updatedAt": 1_767_225_600 }),
        ];
        let step = with_tie()
            .advance(&ts(None, None), input(&items, T0))
            .unwrap();
        assert_eq!(step.cursor, ts(Some("1767225600"), Some("9")));
    }

    #[test]
    fn equal_max_grows_only_the_tie_break() {
        let start = ts(Some("2026-01-01T00:00:02Z"), Some("m"));
        // Equal instant in another spelling: the stored string stays, the tie-break grows.
        let items = [item("q", "2026-01-01T00:00:02.000Z")];
        let grown = ts(Some("2026-01-01T00:00:02Z"), Some("q"));
        assert_eq!(moved(&with_tie(), &start, &items), grown);
        // A smaller tie-break never shrinks it.
        let items = [item("a", "2026-01-01T00:00:02Z")];
        assert_eq!(moved(&with_tie(), &start, &items), start);
        // A stored null tie-break grows to the page's.
        let untied = ts(Some("2026-01-01T00:00:02Z"), None);
        let grown = ts(Some("2026-01-01T00:00:02Z"), Some("a"));
        assert_eq!(moved(&with_tie(), &untied, &items), grown);
        // Without a tie-break field an equal max changes nothing.
        assert_eq!(moved(&plain(), &untied, &items), untied);
    }

    #[test]
    fn newer_max_replaces_value_and_tie_break_older_changes_nothing() {
        let start = ts(Some("2026-01-01T00:00:02Z"), Some("zzz"));
        let newer = [item("a", "2026-01-01T00:00:03Z")];
        let replaced = ts(Some("2026-01-01T00:00:03Z"), Some("a"));
        assert_eq!(moved(&with_tie(), &start, &newer), replaced);
        let older = [item("zzzz", "2026-01-01T00:00:01Z")];
        let step = with_tie()
            .advance(&start, input(&older, T0 + 5_000))
            .unwrap();
        assert_eq!((step.cursor, step.keep), (start, vec![true]));
    }

    #[test]
    fn a_server_cursor_is_trusted() {
        let items = [
            item("a", "2026-01-01T00:00:09Z"), // would be dropped by lag
            item("b", "garbage"),
        ];
        let strategy = TimestampCursor::builder("updatedAt")
            .tie_break("id")
            .lag(Duration::from_secs(60))
            .build()
            .unwrap();
        let step = strategy
            .advance(
                &ts(Some("2026-01-01T00:00:30Z"), Some("q")),
                AdvanceInput {
                    page_cursor: Some("2026-01-01T00:00:05Z"),
                    has_more: Some(true),
                    ..input(&items, T0)
                },
            )
            .unwrap();
        assert_eq!(
            step,
            Advance {
                cursor: ts(Some("2026-01-01T00:00:05Z"), None),
                done: false,
                keep: vec![true, true],
            }
        );
        // An empty server cursor is no cursor.
        let step = strategy
            .advance(
                &ts(None, None),
                AdvanceInput {
                    page_cursor: Some(""),
                    ..input(&items, T0 + 120_000)
                },
            )
            .unwrap();
        assert_eq!(step.cursor, ts(Some("2026-01-01T00:00:09Z"), Some("a")));
    }

    #[test]
    fn an_unparseable_stored_value_is_an_error_naming_field_and_value() {
        let items = [item("a", "2026-01-01T00:00:01Z")];
        let err = plain()
            .advance(&ts(Some("tomorrow"), None), input(&items, T0 + 5_000))
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::Config);
        let text = err.to_string();
        assert!(text.contains("`cursor.field`"), "{text}");
        assert!(text.contains("\"tomorrow\""), "{text}");
        assert!(text.contains("`updatedAt`"), "{text}");
        // With nothing to compare, the bad value is not read.
        let step = plain()
            .advance(&ts(Some("tomorrow"), None), input(&[], T0))
            .unwrap();
        assert_eq!(step.cursor, ts(Some("tomorrow"), None));
    }

    #[test]
    fn a_foreign_cursor_is_an_error() {
        let err = plain()
            .advance(&Cursor::Page { page: 1 }, input(&[], T0))
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::Config);
        assert!(err.to_string().contains("page cursor"), "{err}");
    }

    #[test]
    fn epoch_seconds_and_millis_fields() {
        let seconds = [json!({ "t": "1767225601" }), json!({ "t": 1_767_225_602 })];
        let strategy = TimestampCursor::new("t").unwrap();
        let step = strategy
            .advance(&ts(None, None), input(&seconds, T0 + 5_000))
            .unwrap();
        assert_eq!(step.cursor, ts(Some("1767225602"), None));

        let millis = [
            json!({ "t": "1767225600999" }),
            json!({ "t": 1_767_225_600_500_i64 }),
        ];
        let step = strategy
            .advance(&ts(None, None), input(&millis, T0 + 5_000))
            .unwrap();
        assert_eq!(step.cursor, ts(Some("1767225600999"), None));
        // Mixed shapes compare by instant.
        let step = strategy
            .advance(&ts(Some("1767225601"), None), input(&millis, T0 + 5_000))
            .unwrap();
        assert_eq!(step.cursor, ts(Some("1767225601"), None));
    }

    #[test]
    fn overlap_applies_to_the_first_request_only_in_the_stored_shape() {
        let strategy = TimestampCursor::builder("t")
            .tie_break("id")
            .overlap(Duration::from_millis(1500))
            .build()
            .unwrap();
        let cases = [
            ("1767225600", "1767225598"),
            ("1767225600000", "1767225598500"),
            ("2026-01-01T00:00:00Z", "2025-12-31T23:59:58.500Z"),
            ("2026-01-01T01:00:00+01:00", "2025-12-31T23:59:58.500Z"),
            ("2026-01-01", "2025-12-31T23:59:58.500Z"),
        ];
        for (stored, fetched) in cases {
            let cursor = ts(Some(stored), Some("k"));
            assert_eq!(
                strategy.for_fetch(&cursor, true),
                ts(Some(fetched), None),
                "{stored}"
            );
            assert_eq!(strategy.for_fetch(&cursor, false), cursor, "{stored}");
        }
        // Nothing to move back: unchanged.
        for cursor in [ts(None, None), ts(Some("garbage"), Some("k"))] {
            assert_eq!(strategy.for_fetch(&cursor, true), cursor);
        }
        // No overlap: unchanged, tie-break included.
        let cursor = ts(Some("1767225600"), Some("k"));
        assert_eq!(plain().for_fetch(&cursor, true), cursor);
    }

    #[test]
    fn user_parse_and_format() {
        // The API writes "2026/01/01 00:00:00" and wants the same back.
        let strategy = TimestampCursor::builder("t")
            .parse(|raw| parse_timestamp(&raw.replace('/', "-")))
            .format(|ms, sample| {
                let iso = super::super::time::iso_ms(ms).unwrap_or_default();
                assert_eq!(sample, "2026/01/01 00:00:00");
                iso.get(..19)
                    .unwrap_or_default()
                    .replace('-', "/")
                    .replace('T', " ")
            })
            .overlap(Duration::from_secs(60))
            .initial(Some("2026/01/01 00:00:00".into()))
            .build()
            .unwrap();
        assert_eq!(
            strategy.for_fetch(&strategy.initial(), true),
            ts(Some("2025/12/31 23:59:00"), None)
        );
        let items = [json!({ "t": "2026/01/01 00:00:01" })];
        let step = strategy
            .advance(&strategy.initial(), input(&items, T0 + 1_000))
            .unwrap();
        assert_eq!(step.cursor, ts(Some("2026/01/01 00:00:01"), None));
        assert_eq!(strategy.lag_ms(&step.cursor, T0 + 3_000), Some(2_000));
    }

    #[test]
    fn lag_ms_is_now_minus_the_watermark() {
        let strategy = plain();
        assert_eq!(
            strategy.lag_ms(&ts(Some("2026-01-01T00:00:00Z"), None), T0 + 42_000),
            Some(42_000)
        );
        assert_eq!(
            strategy.lag_ms(&ts(Some("1767225600"), None), T0 + 1),
            Some(1)
        );
        assert_eq!(
            strategy.lag_ms(&ts(Some("1767225600000"), None), T0 - 5),
            Some(-5)
        );
        assert_eq!(strategy.lag_ms(&ts(None, None), T0), None);
        assert_eq!(strategy.lag_ms(&ts(Some("garbage"), None), T0), None);
        assert_eq!(strategy.lag_ms(&Cursor::Page { page: 1 }, T0), None);
    }

    #[test]
    fn reached_compares_instants() {
        let strategy = plain();
        let target = ts(Some("2026-01-01T00:00:05Z"), Some("m"));
        assert!(strategy.reached(&ts(None, None), &ts(None, None)));
        assert!(strategy.reached(&ts(Some("1767225600"), None), &ts(None, None)));
        assert!(!strategy.reached(&ts(None, None), &target));
        assert!(!strategy.reached(&ts(Some("2026-01-01T00:00:04Z"), Some("z")), &target));
        assert!(strategy.reached(&ts(Some("1767225605"), None), &target));
        assert!(strategy.reached(&ts(Some("1767225605001"), None), &target));
        // Cannot compare: not reached.
        assert!(!strategy.reached(&ts(Some("garbage"), None), &target));
        assert!(!strategy.reached(&ts(Some("1767225605"), None), &ts(Some("garbage"), None)));
        assert!(!strategy.reached(&Cursor::Snapshot, &target));
        assert!(!strategy.reached(&target, &Cursor::Snapshot));
    }

    #[test]
    fn from_raw_takes_the_value_and_checks_it() {
        let strategy = plain();
        assert_eq!(strategy.from_raw(None).unwrap(), ts(None, None));
        assert_eq!(
            strategy.from_raw(Some("2026-01-01T00:00:00Z")).unwrap(),
            ts(Some("2026-01-01T00:00:00Z"), None)
        );
        assert_eq!(
            strategy.from_raw(Some("1767225600")).unwrap(),
            ts(Some("1767225600"), None)
        );
        let err = strategy.from_raw(Some("last tuesday")).unwrap_err();
        assert_eq!(err.code(), ErrorCode::Config);
        assert!(err.to_string().contains("\"last tuesday\""), "{err}");
    }

    #[test]
    fn serialize_round_trips() {
        let strategy = with_tie();
        for (cursor, text) in [
            (ts(None, None), r#"{"value":null,"tieBreak":null}"#),
            (
                ts(Some("2026-01-01T00:00:00Z"), Some("o-1")),
                r#"{"value":"2026-01-01T00:00:00Z","tieBreak":"o-1"}"#,
            ),
            (
                ts(Some("1767225600"), None),
                r#"{"value":"1767225600","tieBreak":null}"#,
            ),
            (
                ts(Some("\"quoted\" \u{e9}"), Some("\n")),
                r#"{"value":"\"quoted\" é","tieBreak":"\n"}"#,
            ),
        ] {
            assert_eq!(strategy.serialize(&cursor), text);
            assert_eq!(strategy.deserialize(text).unwrap(), cursor);
        }
        // Key order and whitespace do not matter when reading.
        assert_eq!(
            strategy
                .deserialize(r#" { "tieBreak" : "b", "value" : "v" } "#)
                .unwrap(),
            ts(Some("v"), Some("b"))
        );
    }

    #[test]
    fn deserialize_rejects_garbage() {
        let strategy = plain();
        for text in [
            "",
            "null",
            "{",
            "[]",
            r#""2026-01-01""#,
            r#"{"value":"x"}"#,
            r#"{"tieBreak":null}"#,
            r#"{"value":1,"tieBreak":null}"#,
            r#"{"value":null,"tieBreak":false}"#,
            r#"{"value":null,"tieBreak":null,"extra":1}"#,
        ] {
            let err = strategy.deserialize(text).unwrap_err();
            assert_eq!(err.code(), ErrorCode::Store, "{text}");
            assert!(err.to_string().contains("timestamp cursor"), "{err}");
        }
    }

    #[test]
    fn tie_break_orders_compare_as_documented() {
        let text = TieBreakOrder::Text;
        assert_eq!(
            text.max(Some("\u{1F600}".into()), Some("\u{FF5E}".into()))
                .as_deref(),
            Some("\u{FF5E}"),
            "UTF-16 code units, as JavaScript"
        );
        assert_eq!(text.max(None, Some("a".into())).as_deref(), Some("a"));
        assert_eq!(text.max(Some("a".into()), None).as_deref(), Some("a"));
        assert_eq!(text.max(None, None), None);
        assert_eq!(text.cmp("9", "10"), Ordering::Greater);

        let numeric = TieBreakOrder::Numeric;
        assert_eq!(numeric.cmp("9", "10"), Ordering::Less);
        assert_eq!(numeric.cmp("010", "10"), Ordering::Equal);
        assert_eq!(numeric.cmp("-0", "0"), Ordering::Equal);
        assert_eq!(numeric.cmp("-20", "-3"), Ordering::Less);
        assert_eq!(numeric.cmp("-1", "0"), Ordering::Less);
        assert_eq!(
            numeric.cmp("123456789012345678901234567890", "99999999999999999999"),
            Ordering::Greater,
            "any length"
        );
        assert_eq!(
            numeric.cmp("abc", "99"),
            Ordering::Greater,
            "text after numbers"
        );
        assert_eq!(numeric.cmp("b", "a"), Ordering::Greater);
        assert_eq!(numeric.cmp("", "0"), Ordering::Greater);
        assert_eq!(
            numeric.max(Some("9".into()), Some("10".into())).as_deref(),
            Some("10")
        );
    }

    #[test]
    fn numeric_tie_breaks_keep_the_largest_id_at_the_watermark() {
        let strategy = TimestampCursor::builder("t")
            .tie_break("id")
            .tie_break_order(TieBreakOrder::Numeric)
            .build()
            .unwrap();
        let items = [
            json!({"t": "2026-01-01T00:00:00Z", "id": "9"}),
            json!({"t": "2026-01-01T00:00:00Z", "id": "10"}),
        ];
        let step = strategy
            .advance(&strategy.initial(), page(&items, Some(false)))
            .unwrap();
        assert_eq!(step.cursor, ts(Some("2026-01-01T00:00:00Z"), Some("10")));
    }

    #[test]
    fn skip_seen_drops_what_the_cursor_already_passed_and_ends_a_page_of_nothing_else() {
        let strategy = TimestampCursor::builder("t")
            .tie_break("id")
            .tie_break_order(TieBreakOrder::Numeric)
            .skip_seen(true)
            .build()
            .unwrap();
        let cursor = ts(Some("2026-01-01T00:00:00Z"), Some("10"));
        // The API filters `t >= watermark` only: the first two were committed before.
        let items = [
            json!({"t": "2026-01-01T00:00:00Z", "id": "9"}),
            json!({"t": "2026-01-01T00:00:00Z", "id": "10"}),
            json!({"t": "2026-01-01T00:00:00Z", "id": "11"}),
            json!({"t": "2026-01-01T00:00:01Z", "id": "1"}),
        ];
        let step = strategy.advance(&cursor, page(&items, Some(true))).unwrap();
        assert_eq!(step.keep, [false, false, true, true]);
        assert_eq!(step.cursor, ts(Some("2026-01-01T00:00:01Z"), Some("1")));
        assert!(!step.done, "more pages follow");

        let stuck = strategy
            .advance(&cursor, page(&items[..2], Some(true)))
            .unwrap();
        assert_eq!(stuck.keep, [false, false]);
        assert_eq!(stuck.cursor, cursor);
        assert!(stuck.done, "the same page would come back: the cycle ends");

        for (builder, why) in [
            (TimestampCursor::builder("t").skip_seen(true), "a tie-break"),
            (
                TimestampCursor::builder("t")
                    .tie_break("id")
                    .skip_seen(true)
                    .overlap(Duration::from_secs(1)),
                "overlap",
            ),
        ] {
            let error = builder.build().err().expect("an error");
            assert!(
                error.to_string().contains("`cursor.skip_seen`"),
                "{why}: {error}"
            );
        }
    }
}
