//! Cursor strategies: where a poll cycle starts, how a page moves it, and when the
//! listing is done. A poller takes one of [`timestamp`], [`token`], [`page`], [`snapshot_diff`]
//! or [`custom`] (each converts into a [`CursorConfig`]); `fetch` receives the [`Cursor`].

use std::sync::Arc;

use crate::error::Result;
use crate::json::Json;

/// The cursor a `fetch` receives, and that the engine persists (as JSON text) after every
/// committed page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cursor {
    /// `timestamp`: ask for items with `field >= value` (and, at exactly `value`, with a
    /// tie-break greater than `tie_break`). `value: None` means from the beginning.
    /// Persisted as `{"value":…,"tieBreak":…}`.
    Timestamp {
        /// The watermark, as the server wrote it.
        value: Option<String>,
        /// The largest tie-break value seen at exactly `value`.
        tie_break: Option<String>,
    },
    /// `token`: the API's continuation token; `None` starts over. Persisted as `{"value":…}`.
    Token {
        /// The token.
        value: Option<String>,
    },
    /// `page`: a 1-based (by default) page number. Persisted as `{"page":n}`.
    Page {
        /// The page to fetch: the number the API takes. The same type as
        /// [`FetchContext::page`](crate::FetchContext::page), so either passes to an API's page
        /// parameter without a cast.
        page: u32,
    },
    /// `snapshot_diff`: no cursor; every cycle lists everything (use the page index of the
    /// fetch context). Persisted as `null`.
    Snapshot,
    /// `custom`: the user's cursor, as JSON.
    Custom(Json),
}

/// What one fetched page tells a strategy.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AdvanceInput<'a> {
    /// The page's items as the API returned them (before validation, so invalid items move the
    /// cursor too), in page order.
    pub items: &'a [serde_json::Value],
    /// The page's cursor as the API returned it, if any.
    pub page_cursor: Option<&'a str>,
    /// The page's `has_more` flag, if the API sent one.
    pub has_more: Option<bool>,
    /// Now, in epoch ms (for the timestamp strategy's `lag`).
    pub now_ms: i64,
}

/// What a strategy decided about a page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Advance {
    /// The cursor after the page.
    pub cursor: Cursor,
    /// The listing is complete for this cycle.
    pub done: bool,
    /// For each input item, whether it is kept (the timestamp strategy drops items newer than
    /// `now - lag`: they are fetched again next cycle). Same length as the input.
    pub keep: Vec<bool>,
}

/// One cursor strategy. Implementations are pure: no I/O, no clock (time arrives in
/// [`AdvanceInput::now_ms`]).
pub(crate) trait CursorStrategy: Send + Sync + 'static {
    /// The strategy's name (`timestamp`, `token`, `page`, `snapshot_diff`, `custom`).
    fn name(&self) -> &'static str;

    /// The cursor of a lane that has never run (or was reset).
    fn initial(&self) -> Cursor;

    /// The cursor as the JSON text that is persisted per lane.
    fn serialize(&self, cursor: &Cursor) -> String;

    /// Reads persisted JSON text back; malformed text is an error naming the strategy and the
    /// text (never a panic).
    fn deserialize(&self, text: &str) -> Result<Cursor>;

    /// The cursor handed to `fetch`. `first_request` is true for the first request of a cycle
    /// (the timestamp strategy applies `overlap` only then); the persisted cursor never moves
    /// back.
    fn for_fetch(&self, cursor: &Cursor, first_request: bool) -> Cursor;

    /// Moves the cursor over one page and says whether the listing is done.
    fn advance(&self, cursor: &Cursor, input: AdvanceInput<'_>) -> Result<Advance>;

    /// The cursor to keep once a cycle finished (the page strategy starts over). Default: the
    /// cursor as it is.
    fn on_cycle_complete(&self, cursor: &Cursor) -> Cursor {
        cursor.clone()
    }

    /// How far behind now the cursor is (timestamp strategy only), in ms. Default: `None`.
    fn lag_ms(&self, _cursor: &Cursor, _now_ms: i64) -> Option<i64> {
        None
    }

    /// Whether `cursor` has reached `target` (a backfill stops there).
    fn reached(&self, cursor: &Cursor, target: &Cursor) -> bool;

    /// Builds a cursor from a raw API value given by an operator (`None` = the beginning).
    #[allow(clippy::wrong_self_convention)] // The strategy, not the raw value, builds the cursor.
    fn from_raw(&self, raw: Option<&str>) -> Result<Cursor>;

    /// True when every cycle lists everything (so deletes can be detected).
    fn is_full_scan(&self) -> bool;

    /// Whether `advance` may leave items of a page out (`keep: false`) or end a cycle before
    /// the listing ends on its own: the `timestamp` strategy with `lag` or `skip_seen`. Default
    /// `false`. A full listing (the reconcile lane) refuses such a strategy: an item it leaves
    /// out would look deleted.
    fn skips_items(&self) -> bool {
        false
    }

    /// Whether the fetch may send conditional requests (`If-None-Match` / `If-Modified-Since`
    /// from the validators committed with earlier pages) for this strategy. Default `false`: the
    /// fetch context then carries no validators. A `304 Not Modified` has no body, so it is only
    /// safe where the request itself says what comes after it: `timestamp` (`since=` the
    /// watermark: a 304 means nothing changed since) and `page` (the next page number is known
    /// without the body, see [`after_not_modified`](Self::after_not_modified)). Not `token`
    /// (the next token lives in the body: a 304 on page 1 would hide every later page), and
    /// never a full scan.
    fn conditional_requests(&self) -> bool {
        false
    }

    /// Where the listing goes on after a `304 Not Modified` page at `cursor`. `None` (the
    /// default) ends the cycle with the cursor where it is: nothing changed since the last
    /// committed response to this request. `Some(next)` goes on at `next` without a commit.
    fn after_not_modified(&self, cursor: &Cursor) -> Option<Cursor> {
        let _ = cursor;
        None
    }
}

/// A shared strategy.
pub(crate) type SharedStrategy = Arc<dyn CursorStrategy>;

mod config;
mod custom;
mod page;
mod shared;
mod snapshot_diff;
mod time;
mod timestamp;
mod token;

pub use config::{CursorConfig, custom, page, snapshot_diff, timestamp, token};
pub(crate) use custom::CustomStrategy;
pub use custom::{CustomAdvance, CustomCursor, CustomStep, FnCustomCursor};
pub use page::PageCursor;
pub use snapshot_diff::SnapshotDiffCursor;
pub use time::{format_timestamp, parse_timestamp};
pub(crate) use timestamp::TimestampCursor;
pub use timestamp::{FormatFn, ParseFn, TieBreakOrder, TimestampCursorBuilder};
pub use token::TokenCursor;

/// How far behind `now_ms` a persisted live cursor is, read without the poller's code (the
/// command line, the admin page): the timestamp strategy's persisted form, its value read by the
/// default timestamp parser (RFC 3339, or epoch seconds or milliseconds). `None` for any other
/// strategy's cursor, a cursor without a value, or a value the default parser cannot read (a
/// poller with its own `parse` knows better: the engine asks its strategy).
///
/// ```
/// use watukuy_core::cursor::persisted_lag_ms;
///
/// let t0 = 1_767_225_600_000; // 2026-01-01T00:00:00Z
/// let text = r#"{"value":"2026-01-01T00:00:00Z","tieBreak":"o-1"}"#;
/// assert_eq!(persisted_lag_ms(text, t0 + 42), Some(42));
/// assert_eq!(persisted_lag_ms(r#"{"page":3}"#, t0), None);
/// ```
pub fn persisted_lag_ms(text: &str, now_ms: i64) -> Option<i64> {
    let strategy = TimestampCursor::new("updatedAt").ok()?;
    let cursor = strategy.deserialize(text).ok()?;
    strategy.lag_ms(&cursor, now_ms)
}
