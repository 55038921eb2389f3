//! [`FakeApi`]: an in-process fake of a pull-only HTTP API, for engine tests and
//! guarantee cases.
//!
//! There is no HTTP server: tests and pollers call the fake directly. It holds a dataset of JSON
//! objects keyed by an id field, serves four listings (keyset by timestamp, numbered pages,
//! continuation tokens, everything at once), and can misbehave on demand: injected faults,
//! rate-limit information, ETags with `304 Not Modified`, and latency on the injected clock.
//! Every listing counts as a request, consumes at most one fault and is logged.
//!
//! The `fetch_*` adapters are poller fetch functions, one per cursor strategy:
//!
//! ```
//! use std::sync::Arc;
//! use watukuy_testkit::{FakeApi, FakeApiOptions};
//! use watukuy_core::{FetchContext, clock::ManualClock, Poller, cursor};
//!
//! let api = FakeApi::new(FakeApiOptions::new(Arc::new(ManualClock::new(0))));
//! let fetch = {
//!     let api = api.clone();
//!     move |ctx: FetchContext| {
//!         let api = api.clone();
//!         async move { api.fetch_since(&ctx).await }
//!     }
//! };
//! let poller = Poller::builder::<serde_json::Value>("items")
//!     .identity_field("id")
//!     .cursor(cursor::timestamp("updatedAt").tie_break("id"))
//!     .fetch(fetch)
//!     .build()?;
//! assert_eq!(poller.name(), "items");
//! # Ok::<(), watukuy_core::Error>(())
//! ```
//!
//! Everything is deterministic: time comes from the injected [`Clock`] only, nothing sleeps in
//! real time, and no randomness is involved.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;
use watukuy_core::clock::format_rfc3339_ms;
use watukuy_core::cursor::Cursor;
use watukuy_core::diff::sha256_hex;
use watukuy_core::{
    BoxError, Error, FetchContext, Page,
    clock::Clock,
    store::{RateLimitInfo, RateLimitSource},
};

use crate::T0;

/// The default base URL of a fake API, used in error messages and as the validator key.
pub const DEFAULT_BASE_URL: &str = "https://fake.api";

/// How a [`FakeApi`] is built.
#[derive(Clone)]
pub struct FakeApiOptions {
    /// Where every timestamp and every latency sleep comes from.
    pub clock: Arc<dyn Clock>,
    /// The field holding an item's identity (a string, or a number used as its decimal text).
    /// Default `"id"`.
    pub id_field: String,
    /// The field stamped with the clock's time on `add` and `update`, and listed by
    /// [`FakeApi::list_since`]. `None` disables stamping and the `/since` listing. Default
    /// `Some("updatedAt")`.
    pub timestamp_field: Option<String>,
    /// The page size of the `fetch_*` adapters and of listings called without a limit. Default
    /// 100; a size of 0 is treated as 1.
    pub page_size: usize,
    /// The base URL that request URLs (in errors and validator keys) start with. Default
    /// [`DEFAULT_BASE_URL`].
    pub base_url: String,
}

impl FakeApiOptions {
    /// The defaults (`id`, `updatedAt`, 100 items a page) on `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            id_field: "id".to_owned(),
            timestamp_field: Some("updatedAt".to_owned()),
            page_size: 100,
            base_url: DEFAULT_BASE_URL.to_owned(),
        }
    }

    /// Sets the identity field.
    #[must_use]
    pub fn id_field(mut self, field: impl Into<String>) -> Self {
        self.id_field = field.into();
        self
    }

    /// Sets (or, with `None`, removes) the timestamp field.
    #[must_use]
    pub fn timestamp_field(mut self, field: Option<impl Into<String>>) -> Self {
        self.timestamp_field = field.map(Into::into);
        self
    }

    /// Sets the page size (0 is treated as 1).
    #[must_use]
    pub fn page_size(mut self, size: usize) -> Self {
        self.page_size = size;
        self
    }

    /// Sets the base URL.
    #[must_use]
    pub fn base_url(mut self, url: impl Into<String>) -> Self {
        self.base_url = url.into();
        self
    }
}

impl fmt::Debug for FakeApiOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeApiOptions")
            .field("id_field", &self.id_field)
            .field("timestamp_field", &self.timestamp_field)
            .field("page_size", &self.page_size)
            .field("base_url", &self.base_url)
            .finish_non_exhaustive()
    }
}

/// A failure injected into the next request(s) with [`FakeApi::fail_next`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The API answers with an error status: the request fails with a boxed
    /// [`watukuy_core::Error::Http`] carrying the status and `retry_after_ms`.
    Http {
        /// The response status (e.g. 429, 503).
        status: u16,
        /// The `Retry-After` delay, in ms.
        retry_after_ms: Option<i64>,
        /// The response body; a Problem Details JSON body contributes its `title` (or
        /// `detail`) to the error message, any other body is the message as is.
        body: Option<String>,
    },
    /// The connection breaks: the request fails with a boxed [`std::io::Error`] of kind
    /// `ConnectionReset`, without a response (no rate-limit information either).
    Network,
    /// The request times out: it fails at once with a boxed [`std::io::Error`] of kind
    /// `TimedOut`, without a response.
    Timeout,
    /// The API answers 200 with garbage items (`[42, "x", {"no-id": true}]`): not an error, so
    /// validation and identity must reject them.
    Malformed,
}

impl Fault {
    /// An HTTP error status without `Retry-After` or body.
    pub fn http(status: u16) -> Self {
        Fault::Http {
            status,
            retry_after_ms: None,
            body: None,
        }
    }

    /// An HTTP error status with a `Retry-After` delay in ms.
    pub fn http_retry_after(status: u16, retry_after_ms: i64) -> Self {
        Fault::Http {
            status,
            retry_after_ms: Some(retry_after_ms),
            body: None,
        }
    }
}

/// The rate-limit window the fake reports on every response (see [`FakeApi::set_rate_limit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimitSpec {
    /// The quota per window.
    pub limit: i64,
    /// Requests left before the next request; every request decrements it (never below 0).
    pub remaining: i64,
    /// The window resets this long after each response (`reset_at = now + reset_in_ms`).
    pub reset_in_ms: i64,
    /// The header family the information is reported as.
    pub source: RateLimitSource,
}

impl RateLimitSpec {
    /// A window of `limit` requests with `remaining` left, resetting `reset_in_ms` after each
    /// response, reported as `source` headers.
    pub fn new(limit: i64, remaining: i64, reset_in_ms: i64, source: RateLimitSource) -> Self {
        Self {
            limit,
            remaining,
            reset_in_ms,
            source,
        }
    }
}

/// One listing request (a route with its query parameters).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Query {
    /// `GET /since`: keyset over `(timestamp, id)`, see [`FakeApi::list_since`].
    Since {
        /// Items with a timestamp at or after this one (RFC 3339, or 10/13-digit epoch
        /// seconds/ms); `None` lists from the beginning.
        since: Option<String>,
        /// At exactly `since`, only items whose id is greater than this one.
        after_id: Option<String>,
        /// The page size (`None`: the fake's page size).
        limit: Option<usize>,
    },
    /// `GET /page`: 1-based pages by id, see [`FakeApi::list_page`].
    Page {
        /// The page, from 1.
        page: u32,
        /// The page size (`None`: the fake's page size).
        limit: Option<usize>,
    },
    /// `GET /token`: continuation tokens over the items by id, see [`FakeApi::list_token`].
    Token {
        /// The token of the previous page's `next`; `None` (or empty) starts over.
        token: Option<String>,
        /// The page size (`None`: the fake's page size).
        limit: Option<usize>,
    },
    /// `GET /all`: every item by id, in one response.
    All,
}

impl Query {
    /// The route (`/since`, `/page`, `/token`, `/all`).
    pub fn route(&self) -> &'static str {
        match self {
            Query::Since { .. } => "/since",
            Query::Page { .. } => "/page",
            Query::Token { .. } => "/token",
            Query::All => "/all",
        }
    }

    /// The query parameters as sent (`afterId` in camel case, like the reference API), with the
    /// effective limit.
    fn params(&self, page_size: usize) -> BTreeMap<String, String> {
        let mut params = BTreeMap::new();
        let mut put = |name: &str, value: Option<String>| {
            if let Some(value) = value {
                params.insert(name.to_owned(), value);
            }
        };
        match self {
            Query::Since {
                since,
                after_id,
                limit,
            } => {
                put("since", since.clone());
                put("afterId", after_id.clone());
                put("limit", Some(limit.unwrap_or(page_size).to_string()));
            }
            Query::Page { page, limit } => {
                put("page", Some(page.to_string()));
                put("limit", Some(limit.unwrap_or(page_size).to_string()));
            }
            Query::Token { token, limit } => {
                put("token", token.clone().filter(|t| !t.is_empty()));
                put("limit", Some(limit.unwrap_or(page_size).to_string()));
            }
            Query::All => {}
        }
        params
    }
}

/// Per-request options: conditional request and cancellation.
#[derive(Clone, Debug, Default)]
pub struct RequestOptions {
    /// The `If-None-Match` validator; when ETags are on and it matches the response's ETag (or
    /// is `*`), the answer is `304 Not Modified` without items.
    pub if_none_match: Option<String>,
    /// Aborts the request while it waits out the fake's latency (the request then fails with
    /// [`FakeApiError::Cancelled`] and never reaches the fake).
    pub cancel: Option<CancellationToken>,
}

/// What a listing returned (the reference API's `{ data, has_more?, pages?, next? }` body plus
/// the headers that matter).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Listing {
    /// 200, or 304 when a matching `If-None-Match` was sent (then `items` is empty and
    /// `has_more`, `pages` and `next` are `None`).
    pub status: u16,
    /// The items, as stored.
    pub items: Vec<Value>,
    /// Whether more items follow (exact: the fake knows).
    pub has_more: Option<bool>,
    /// `/page` only: the number of pages at this limit.
    pub pages: Option<u64>,
    /// `/token` only: the next page's token, `None` at the end.
    pub next: Option<String>,
    /// The response's weak ETag, when ETags are on.
    pub etag: Option<String>,
    /// The rate-limit information, when a rate limit is set.
    pub rate_limit: Option<RateLimitInfo>,
}

impl Listing {
    /// True for a `304 Not Modified` answer.
    pub fn not_modified(&self) -> bool {
        self.status == 304
    }
}

/// One request as the fake logged it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogEntry {
    /// When the fake handled it (epoch ms, after any latency).
    pub at: i64,
    /// The route (`/since`, `/page`, `/token`, `/all`).
    pub route: &'static str,
    /// The query parameters (see [`Query`]).
    pub params: BTreeMap<String, String>,
    /// The response status; `None` when no response was sent (network and timeout faults).
    pub status: Option<u16>,
}

/// What the fake's dataset operations and adapters reject.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FakeApiError {
    /// The item (or patch) is not a JSON object.
    NotAnObject,
    /// The item has no usable id: the id field is missing or neither a string nor a number.
    MissingId {
        /// The id field.
        field: String,
    },
    /// An item with this id already exists.
    DuplicateId(String),
    /// No item has this id.
    UnknownId(String),
    /// An update tried to change an item's id.
    IdChanged {
        /// The item's id.
        id: String,
        /// The id the patch tried to set.
        to: Value,
    },
    /// An adapter received a cursor of the wrong kind.
    WrongCursor {
        /// The adapter (`fetch_since`, ...).
        adapter: &'static str,
        /// The cursor kind it expects.
        expected: &'static str,
        /// The cursor kind it got.
        got: &'static str,
    },
    /// The request was cancelled while it waited out the fake's latency.
    Cancelled,
}

impl fmt::Display for FakeApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FakeApiError::NotAnObject => f.write_str("fake api: not a JSON object"),
            FakeApiError::MissingId { field } => {
                write!(f, "fake api: item has no string or number `{field}`")
            }
            FakeApiError::DuplicateId(id) => write!(f, "fake api: item '{id}' already exists"),
            FakeApiError::UnknownId(id) => write!(f, "fake api: no item '{id}'"),
            FakeApiError::IdChanged { id, to } => {
                write!(
                    f,
                    "fake api: update of '{id}' cannot change its id (to {to})"
                )
            }
            FakeApiError::WrongCursor {
                adapter,
                expected,
                got,
            } => write!(
                f,
                "fake api: {adapter} expects a {expected} cursor, got a {got} cursor"
            ),
            FakeApiError::Cancelled => f.write_str("fake api: request cancelled"),
        }
    }
}

impl std::error::Error for FakeApiError {}

/// The fake's mutable state, behind one lock that is never held across an `.await`.
#[derive(Default)]
struct State {
    items: BTreeMap<String, Value>,
    faults: VecDeque<(Fault, u32)>,
    rate_limit: Option<RateLimitSpec>,
    etags: bool,
    latency: Duration,
    log: Vec<LogEntry>,
    calls: u64,
}

struct Inner {
    options: FakeApiOptions,
    state: Mutex<State>,
}

/// An in-process fake of a pull-only HTTP API, for engine tests and guarantee
/// cases; no HTTP server, the fake is called directly.
///
/// It holds a dataset of JSON objects keyed by an id field, serves four listings (keyset by
/// timestamp, numbered pages, continuation tokens, everything at once) and misbehaves on demand:
/// injected [`Fault`]s, rate-limit information, ETags with `304 Not Modified`, latency on the
/// injected clock. Every listing counts as a request, consumes at most one fault and is logged.
/// Time comes from the injected [`Clock`] only; nothing sleeps in real time.
///
/// The `fetch_*` adapters are poller fetch functions, one per cursor strategy (see the module
/// documentation for an example).
///
/// Cheap to clone: clones share the dataset, faults, settings and log, so a
/// test and a poller's fetch closure can hold the same fake.
#[derive(Clone)]
pub struct FakeApi {
    inner: Arc<Inner>,
}

impl fmt::Debug for FakeApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("FakeApi")
            .field("options", &self.inner.options)
            .field("items", &state.items.len())
            .field("calls", &state.calls)
            .finish_non_exhaustive()
    }
}

impl FakeApi {
    /// An empty fake with ETags off, no rate limit, no latency and no fault armed.
    pub fn new(mut options: FakeApiOptions) -> Self {
        options.page_size = options.page_size.max(1);
        Self {
            inner: Arc::new(Inner {
                options,
                state: Mutex::default(),
            }),
        }
    }

    /// The options the fake was built with (page size at least 1).
    pub fn options(&self) -> &FakeApiOptions {
        &self.inner.options
    }

    /// The page size of the adapters and of listings called without a limit.
    pub fn page_size(&self) -> usize {
        self.inner.options.page_size
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn now_ms(&self) -> i64 {
        self.inner.options.clock.now_ms()
    }

    // ----- dataset -----

    /// The id of an item: its id field as a string (numbers as their decimal text).
    fn id_of(&self, item: &Value) -> Result<String, FakeApiError> {
        let object = item.as_object().ok_or(FakeApiError::NotAnObject)?;
        let field = &self.inner.options.id_field;
        match object.get(field) {
            Some(Value::String(id)) => Ok(id.clone()),
            Some(Value::Number(id)) => Ok(id.to_string()),
            _ => Err(FakeApiError::MissingId {
                field: field.clone(),
            }),
        }
    }

    /// Sets the timestamp field (if any) to now; `only_if_missing` keeps a present value.
    fn stamp(&self, object: &mut Map<String, Value>, only_if_missing: bool) {
        if let Some(field) = &self.inner.options.timestamp_field {
            if only_if_missing && object.contains_key(field) {
                return;
            }
            object.insert(
                field.clone(),
                Value::String(format_rfc3339_ms(self.now_ms())),
            );
        }
    }

    /// Adds an item, stamping its timestamp field with the clock's time (RFC 3339 with ms),
    /// and returns it as stored. A non-object, an item without id or an existing id is an
    /// error.
    pub fn add(&self, item: Value) -> Result<Value, FakeApiError> {
        let id = self.id_of(&item)?;
        let Value::Object(mut object) = item else {
            return Err(FakeApiError::NotAnObject);
        };
        let mut state = self.lock();
        if state.items.contains_key(&id) {
            return Err(FakeApiError::DuplicateId(id));
        }
        self.stamp(&mut object, false);
        let item = Value::Object(object);
        state.items.insert(id, item.clone());
        Ok(item)
    }

    /// Merges the top-level fields of `patch` (an object) into item `id` (a `null` field is set
    /// to `null`, not removed), bumps its timestamp (after the merge, so a patched timestamp is
    /// overwritten) and returns it as stored. An unknown id, a non-object patch or a patch
    /// changing the id is an error (and changes nothing).
    pub fn update(&self, id: &str, patch: Value) -> Result<Value, FakeApiError> {
        let Value::Object(patch) = patch else {
            return Err(FakeApiError::NotAnObject);
        };
        let id_field = &self.inner.options.id_field;
        if let Some(new_id) = patch.get(id_field) {
            let same = match new_id {
                Value::String(s) => s == id,
                Value::Number(n) => n.to_string() == id,
                _ => false,
            };
            if !same {
                return Err(FakeApiError::IdChanged {
                    id: id.to_owned(),
                    to: new_id.clone(),
                });
            }
        }
        let mut state = self.lock();
        let Some(Value::Object(object)) = state.items.get_mut(id) else {
            return Err(FakeApiError::UnknownId(id.to_owned()));
        };
        object.extend(patch);
        self.stamp(object, false);
        Ok(Value::Object(object.clone()))
    }

    /// Removes item `id`; false when there was none.
    pub fn remove(&self, id: &str) -> bool {
        self.lock().items.remove(id).is_some()
    }

    /// Item `id`, as stored.
    pub fn get(&self, id: &str) -> Option<Value> {
        self.lock().items.get(id).cloned()
    }

    /// Every item, sorted by id (string order).
    pub fn all(&self) -> Vec<Value> {
        self.lock().items.values().cloned().collect()
    }

    /// Adds many items at once, keeping their timestamps (an item without one is stamped with
    /// the clock's time). All or nothing: an invalid item, or an id that exists or repeats in
    /// `items`, is an error and adds nothing.
    pub fn seed(&self, items: impl IntoIterator<Item = Value>) -> Result<(), FakeApiError> {
        let mut batch = BTreeMap::new();
        for item in items {
            let id = self.id_of(&item)?;
            let Value::Object(mut object) = item else {
                return Err(FakeApiError::NotAnObject);
            };
            self.stamp(&mut object, true);
            if batch.insert(id.clone(), Value::Object(object)).is_some() {
                return Err(FakeApiError::DuplicateId(id));
            }
        }
        let mut state = self.lock();
        if let Some(id) = batch.keys().find(|id| state.items.contains_key(*id)) {
            return Err(FakeApiError::DuplicateId(id.clone()));
        }
        state.items.extend(batch);
        Ok(())
    }

    /// The number of items.
    pub fn size(&self) -> usize {
        self.lock().items.len()
    }

    // ----- settings -----

    /// Makes the next `times` requests fail with `fault`. Faults queue up: each request
    /// consumes one, in the order they were armed.
    pub fn fail_next(&self, fault: Fault, times: u32) {
        if times > 0 {
            self.lock().faults.push_back((fault, times));
        }
    }

    /// How many requests will still fail (the sum over armed faults).
    pub fn pending_faults(&self) -> u64 {
        self.lock()
            .faults
            .iter()
            .map(|(_, times)| u64::from(*times))
            .sum()
    }

    /// Disarms every fault.
    pub fn clear_faults(&self) {
        self.lock().faults.clear();
    }

    /// Sets (or, with `None`, removes) the rate limit reported on every response.
    pub fn set_rate_limit(&self, spec: Option<RateLimitSpec>) {
        self.lock().rate_limit = spec;
    }

    /// Turns ETags on or off. When on, every listing carries a weak ETag derived from its body,
    /// and a request whose `If-None-Match` matches is answered 304.
    pub fn set_etags(&self, on: bool) {
        self.lock().etags = on;
    }

    /// Makes every request first wait `latency` on the injected clock (abortable through
    /// [`RequestOptions::cancel`]). Zero turns latency off.
    pub fn set_latency(&self, latency: Duration) {
        self.lock().latency = latency;
    }

    /// Every request handled since the last [`reset_stats`](Self::reset_stats), in order.
    pub fn log(&self) -> Vec<LogEntry> {
        self.lock().log.clone()
    }

    /// The number of requests handled since the last [`reset_stats`](Self::reset_stats)
    /// (faulted ones included; requests cancelled during latency never arrive).
    pub fn calls(&self) -> u64 {
        self.lock().calls
    }

    /// Clears the log and the request count (not the data, faults or settings).
    pub fn reset_stats(&self) {
        let mut state = self.lock();
        state.log.clear();
        state.calls = 0;
    }

    // ----- listings -----

    /// `GET /since`: items whose timestamp is at or after `since`, skipping those at exactly
    /// `since` whose id is not greater than `after_id`, ordered by `(timestamp, id)`; at most
    /// `limit` (default: the page size). `has_more` says whether more items follow; `after_id`
    /// without `since` is ignored.
    ///
    /// Timestamps are compared as parsed instants (RFC 3339, or 10/13-digit epoch seconds/ms),
    /// so differently formatted strings of the same instant are equal. Items whose timestamp is
    /// missing or unparseable are never listed here; an unparseable `since`, a zero limit or a
    /// fake without a timestamp field is a 400.
    pub async fn list_since(
        &self,
        since: Option<&str>,
        after_id: Option<&str>,
        limit: Option<usize>,
    ) -> Result<Listing, BoxError> {
        let query = Query::Since {
            since: since.map(str::to_owned),
            after_id: after_id.map(str::to_owned),
            limit,
        };
        self.request(&query, &RequestOptions::default()).await
    }

    /// `GET /page`: page `page` (1-based) of the items sorted by id, `limit` (default: the page
    /// size) a page, with `has_more` and the total number of `pages`. A page past the end is
    /// empty; page 0 or a zero limit is a 400.
    pub async fn list_page(&self, page: u32, limit: Option<usize>) -> Result<Listing, BoxError> {
        self.request(&Query::Page { page, limit }, &RequestOptions::default())
            .await
    }

    /// `GET /token`: the items sorted by id from the offset encoded in `token` (`None` or
    /// empty: from the start), `limit` (default: the page size) at a time; `next` is the
    /// following page's opaque token, `None` at the end. A token the fake did not issue is a
    /// 400.
    pub async fn list_token(
        &self,
        token: Option<&str>,
        limit: Option<usize>,
    ) -> Result<Listing, BoxError> {
        let query = Query::Token {
            token: token.map(str::to_owned),
            limit,
        };
        self.request(&query, &RequestOptions::default()).await
    }

    /// `GET /all`: every item, sorted by id, in one response.
    pub async fn list_all(&self) -> Result<Listing, BoxError> {
        self.request(&Query::All, &RequestOptions::default()).await
    }

    /// Sends one request: waits out the latency (abortable), then counts it, consumes a fault,
    /// applies the rate limit and the ETag, logs it and answers.
    ///
    /// Errors: a boxed [`FakeApiError::Cancelled`] when cancelled before the fake is reached; a
    /// boxed [`watukuy_core::Error::Http`] for HTTP faults and bad parameters (400); a boxed
    /// [`std::io::Error`] for network and timeout faults.
    pub async fn request(
        &self,
        query: &Query,
        options: &RequestOptions,
    ) -> Result<Listing, BoxError> {
        let cancel = options.cancel.as_ref();
        if cancel.is_some_and(CancellationToken::is_cancelled) {
            return Err(Box::new(FakeApiError::Cancelled));
        }
        let latency = self.lock().latency;
        if !latency.is_zero() {
            let sleep = self.inner.options.clock.sleep(latency);
            match cancel {
                Some(token) => {
                    tokio::select! {
                        biased;
                        () = token.cancelled() => return Err(Box::new(FakeApiError::Cancelled)),
                        () = sleep => {}
                    }
                }
                None => sleep.await,
            }
        }
        self.handle(query, options.if_none_match.as_deref())
    }

    /// The request URL (for errors and validator keys).
    fn url(&self, query: &Query) -> String {
        let params = query.params(self.page_size());
        let mut url = format!(
            "{}{}",
            self.inner.options.base_url.trim_end_matches('/'),
            query.route()
        );
        for (i, (name, value)) in params.iter().enumerate() {
            url.push(if i == 0 { '?' } else { '&' });
            url.push_str(&percent_encode(name));
            url.push('=');
            url.push_str(&percent_encode(value));
        }
        url
    }

    /// Handles an arrived request under the lock.
    fn handle(&self, query: &Query, if_none_match: Option<&str>) -> Result<Listing, BoxError> {
        let url = self.url(query);
        let now = self.now_ms();
        let mut state = self.lock();
        state.calls = state.calls.saturating_add(1);
        let mut entry = LogEntry {
            at: now,
            route: query.route(),
            params: query.params(self.page_size()),
            status: None,
        };
        let fault = take_fault(&mut state.faults);

        if let Some(Fault::Network | Fault::Timeout) = &fault {
            state.log.push(entry);
            let error = match fault {
                Some(Fault::Timeout) => std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("GET {url} timed out"),
                ),
                _ => std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    format!("GET {url}: connection reset"),
                ),
            };
            return Err(Box::new(error));
        }

        let rate_limit = state.rate_limit.as_mut().map(|spec| {
            spec.remaining = spec.remaining.saturating_sub(1).max(0);
            rate_limit_info(spec, now)
        });

        if let Some(Fault::Http {
            status,
            retry_after_ms,
            body,
        }) = fault
        {
            entry.status = Some(status);
            state.log.push(entry);
            return Err(Box::new(Error::Http {
                method: "GET".to_owned(),
                url,
                status: Some(status),
                message: body.as_deref().and_then(problem_message),
                retry_after_ms,
            }));
        }

        let body = if fault == Some(Fault::Malformed) {
            Ok(Listing {
                items: vec![json!(42), json!("x"), json!({ "no-id": true })],
                has_more: Some(false),
                ..Listing::default()
            })
        } else {
            self.listing(&state.items, query)
        };
        let mut listing = match body {
            Ok(listing) => listing,
            Err(message) => {
                entry.status = Some(400);
                state.log.push(entry);
                return Err(Box::new(Error::Http {
                    method: "GET".to_owned(),
                    url,
                    status: Some(400),
                    message: Some(message),
                    retry_after_ms: None,
                }));
            }
        };
        listing.status = 200;
        listing.rate_limit = rate_limit;
        if state.etags {
            let etag = etag_of(&listing);
            if if_none_match.is_some_and(|tag| etag_matches(tag, &etag)) {
                listing = Listing {
                    status: 304,
                    rate_limit: listing.rate_limit,
                    ..Listing::default()
                };
            }
            listing.etag = Some(etag);
        }
        entry.status = Some(listing.status);
        state.log.push(entry);
        Ok(listing)
    }

    /// The body of a listing; `Err` is a 400's message.
    fn listing(&self, items: &BTreeMap<String, Value>, query: &Query) -> Result<Listing, String> {
        let limit_of = |limit: &Option<usize>| match limit.unwrap_or(self.page_size()) {
            0 => Err("limit must be at least 1".to_owned()),
            limit => Ok(limit),
        };
        match query {
            Query::Since {
                since,
                after_id,
                limit,
            } => {
                let limit = limit_of(limit)?;
                let Some(field) = &self.inner.options.timestamp_field else {
                    return Err(
                        "this fake api has no timestamp field: /since is unavailable".to_owned(),
                    );
                };
                let since = match since {
                    None => None,
                    Some(raw) => Some(
                        parse_timestamp(raw)
                            .ok_or_else(|| format!("invalid since timestamp '{raw}'"))?,
                    ),
                };
                let mut rows: Vec<(DateTime<Utc>, &String, &Value)> = items
                    .iter()
                    .filter_map(|(id, item)| {
                        timestamp_of(item.get(field)?).map(|ts| (ts, id, item))
                    })
                    .filter(|(ts, id, _)| match since {
                        None => true,
                        Some(since) => {
                            *ts > since
                                || (*ts == since
                                    && after_id.as_deref().is_none_or(|after| id.as_str() > after))
                        }
                    })
                    .collect();
                rows.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
                let has_more = rows.len() > limit;
                Ok(Listing {
                    items: rows
                        .into_iter()
                        .take(limit)
                        .map(|(_, _, item)| item.clone())
                        .collect(),
                    has_more: Some(has_more),
                    ..Listing::default()
                })
            }
            Query::Page { page, limit } => {
                let limit = limit_of(limit)?;
                if *page == 0 {
                    return Err("page must be at least 1".to_owned());
                }
                let offset = usize::try_from(page - 1)
                    .ok()
                    .and_then(|p| p.checked_mul(limit))
                    .unwrap_or(usize::MAX);
                let pages = u64::try_from(items.len().div_ceil(limit)).unwrap_or(u64::MAX);
                Ok(Listing {
                    items: items.values().skip(offset).take(limit).cloned().collect(),
                    has_more: Some(u64::from(*page) < pages),
                    pages: Some(pages),
                    ..Listing::default()
                })
            }
            Query::Token { token, limit } => {
                let limit = limit_of(limit)?;
                let offset = match token.as_deref() {
                    None | Some("") => 0,
                    Some(token) => {
                        decode_token(token).ok_or_else(|| format!("invalid token '{token}'"))?
                    }
                };
                let end = offset.saturating_add(limit);
                let next = (end < items.len()).then(|| encode_token(end));
                Ok(Listing {
                    items: items.values().skip(offset).take(limit).cloned().collect(),
                    has_more: Some(next.is_some()),
                    next,
                    ..Listing::default()
                })
            }
            Query::All => Ok(Listing {
                items: items.values().cloned().collect(),
                has_more: Some(false),
                ..Listing::default()
            }),
        }
    }

    // ----- adapters -----

    /// [`fetch_since`](Self::fetch_since) as a poller's fetch function, on a clone of this API.
    pub fn since_fetch(
        &self,
    ) -> impl Fn(FetchContext) -> futures::future::BoxFuture<'static, Result<Page, BoxError>>
    + Send
    + Sync
    + 'static {
        let api = self.clone();
        move |ctx: FetchContext| {
            let api = api.clone();
            Box::pin(async move { api.fetch_since(&ctx).await })
        }
    }

    /// A poller fetch for the `timestamp` strategy: reads [`Cursor::Timestamp`] `{ value,
    /// tie_break }` and lists [`/since`](Self::list_since) from `value`, after `tie_break`, one
    /// page-size page at a time. `has_more` is `items.len() == page size` (like an API that
    /// does not say); the page carries no cursor (the strategy derives the watermark).
    pub async fn fetch_since(&self, ctx: &FetchContext) -> Result<Page, BoxError> {
        let Cursor::Timestamp { value, tie_break } = &ctx.cursor else {
            return Err(wrong_cursor("fetch_since", "timestamp", &ctx.cursor));
        };
        let limit = self.page_size();
        let query = Query::Since {
            since: value.clone(),
            after_id: tie_break.clone(),
            limit: Some(limit),
        };
        let listing = self.adapter_request(ctx, &query).await?;
        let has_more = listing.items.len() == limit;
        Ok(into_page(listing, Some(has_more), None))
    }

    /// A poller fetch for the `token` strategy: reads [`Cursor::Token`] and lists
    /// [`/token`](Self::list_token); the page's cursor is `next`, `has_more` whether there is
    /// one.
    pub async fn fetch_token(&self, ctx: &FetchContext) -> Result<Page, BoxError> {
        let Cursor::Token { value } = &ctx.cursor else {
            return Err(wrong_cursor("fetch_token", "token", &ctx.cursor));
        };
        let query = Query::Token {
            token: value.clone(),
            limit: Some(self.page_size()),
        };
        let listing = self.adapter_request(ctx, &query).await?;
        let next = listing.next.clone();
        Ok(into_page(listing, Some(next.is_some()), next))
    }

    /// A poller fetch for the `page` strategy: reads [`Cursor::Page`] and lists that
    /// [`/page`](Self::list_page), with its `has_more`.
    pub async fn fetch_page(&self, ctx: &FetchContext) -> Result<Page, BoxError> {
        let Cursor::Page { page } = &ctx.cursor else {
            return Err(wrong_cursor("fetch_page", "page", &ctx.cursor));
        };
        let query = Query::Page {
            page: *page,
            limit: Some(self.page_size()),
        };
        let listing = self.adapter_request(ctx, &query).await?;
        let has_more = listing.has_more;
        Ok(into_page(listing, has_more, None))
    }

    /// A poller fetch for the `snapshot_diff` strategy: expects [`Cursor::Snapshot`] and lists
    /// [`/page`](Self::list_page) number `ctx.page`, with its `has_more`, so a cycle walks every
    /// page.
    pub async fn fetch_all(&self, ctx: &FetchContext) -> Result<Page, BoxError> {
        if ctx.cursor != Cursor::Snapshot {
            return Err(wrong_cursor("fetch_all", "snapshot", &ctx.cursor));
        }
        let query = Query::Page {
            page: ctx.page,
            limit: Some(self.page_size()),
        };
        let listing = self.adapter_request(ctx, &query).await?;
        let has_more = listing.has_more;
        Ok(into_page(listing, has_more, None))
    }

    /// Sends an adapter's request, conditional on the `ETag` committed for its URL (through the
    /// fetch context's validators, as `watukuy-http` does), cancelled by the fetch context, and
    /// stages the response's `ETag` for the commit of the page. Without validators in the
    /// context (outside an engine run, and in full scans) every request is unconditional.
    async fn adapter_request(
        &self,
        ctx: &FetchContext,
        query: &Query,
    ) -> Result<Listing, BoxError> {
        let url_hash = watukuy_core::diff::hash_url(&self.url(query));
        let if_none_match = match &ctx.validators {
            Some(access) => access.get(&url_hash).await?.and_then(|v| v.etag),
            None => None,
        };
        let options = RequestOptions {
            if_none_match,
            cancel: Some(ctx.cancel.clone()),
        };
        let listing = self.request(query, &options).await?;
        if let (Some(access), Some(etag)) = (&ctx.validators, &listing.etag) {
            access.stage(&url_hash, Some(etag.clone()), None);
        }
        Ok(listing)
    }
}

/// Consumes one request's worth of the first armed fault.
fn take_fault(faults: &mut VecDeque<(Fault, u32)>) -> Option<Fault> {
    let (fault, times) = faults.front_mut()?;
    let fault = fault.clone();
    *times = times.saturating_sub(1);
    if *times == 0 {
        faults.pop_front();
    }
    Some(fault)
}

fn rate_limit_info(spec: &RateLimitSpec, now: i64) -> RateLimitInfo {
    let policy = (spec.source == RateLimitSource::Ietf).then(|| {
        let window_s = spec.reset_in_ms.max(0).saturating_add(999) / 1000;
        format!("\"fake\";q={};w={window_s}", spec.limit)
    });
    RateLimitInfo {
        limit: Some(spec.limit),
        remaining: Some(spec.remaining),
        reset_at: Some(now.saturating_add(spec.reset_in_ms)),
        policy,
        source: spec.source,
    }
}

/// The error message of an HTTP fault's body: a Problem Details `title` (else `detail`), or
/// the body text.
fn problem_message(body: &str) -> Option<String> {
    if let Ok(Value::Object(problem)) = serde_json::from_str::<Value>(body) {
        for member in ["title", "detail"] {
            if let Some(Value::String(text)) = problem.get(member) {
                return Some(text.clone());
            }
        }
    }
    (!body.is_empty()).then(|| body.to_owned())
}

/// A weak ETag of the listing's JSON body (`{ data, has_more?, pages?, next? }`): the first 32
/// hex digits of its SHA-256.
fn etag_of(listing: &Listing) -> String {
    let mut body = Map::new();
    body.insert("data".to_owned(), Value::Array(listing.items.clone()));
    if let Some(has_more) = listing.has_more {
        body.insert("has_more".to_owned(), Value::Bool(has_more));
    }
    if let Some(pages) = listing.pages {
        body.insert("pages".to_owned(), Value::from(pages));
    }
    if let Some(next) = &listing.next {
        body.insert("next".to_owned(), Value::String(next.clone()));
    }
    let bytes = serde_json::to_vec(&Value::Object(body)).unwrap_or_default();
    let hash = sha256_hex(&bytes);
    format!("W/\"{}\"", hash.get(..32).unwrap_or(&hash))
}

/// Weak comparison (RFC 9110 §13.1.2): `*`, or any listed tag equal once `W/` is dropped.
fn etag_matches(if_none_match: &str, etag: &str) -> bool {
    let opaque = |tag: &str| tag.trim().trim_start_matches("W/").to_owned();
    let etag = opaque(etag);
    if_none_match
        .split(',')
        .any(|tag| tag.trim() == "*" || opaque(tag) == etag)
}

/// The opaque token of an offset: the hex of `offset:<n>`.
fn encode_token(offset: usize) -> String {
    format!("offset:{offset}")
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn decode_token(token: &str) -> Option<usize> {
    if !token.len().is_multiple_of(2) || !token.is_ascii() {
        return None;
    }
    let bytes = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(token.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    let text = String::from_utf8(bytes).ok()?;
    let digits = text.strip_prefix("offset:")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// A timestamp field value: a string (see [`parse_timestamp`]) or a number (epoch seconds or
/// ms by digit count, like a string of its digits).
fn timestamp_of(value: &Value) -> Option<DateTime<Utc>> {
    match value {
        Value::String(text) => parse_timestamp(text),
        Value::Number(number) => parse_timestamp(&number.to_string()),
        _ => None,
    }
}

/// Exactly 10 digits: epoch seconds; exactly 13: epoch ms; else RFC 3339.
fn parse_timestamp(text: &str) -> Option<DateTime<Utc>> {
    if text.bytes().all(|b| b.is_ascii_digit()) && matches!(text.len(), 10 | 13) {
        let number: i64 = text.parse().ok()?;
        let ms = if text.len() == 10 {
            number.checked_mul(1000)?
        } else {
            number
        };
        return DateTime::from_timestamp_millis(ms);
    }
    DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|ts| ts.with_timezone(&Utc))
}

/// Percent-encodes everything but unreserved characters (and `:`, harmless in a query).
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~' | b':') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn cursor_kind(cursor: &Cursor) -> &'static str {
    match cursor {
        Cursor::Timestamp { .. } => "timestamp",
        Cursor::Token { .. } => "token",
        Cursor::Page { .. } => "page",
        Cursor::Snapshot => "snapshot",
        Cursor::Custom(_) => "custom",
    }
}

fn wrong_cursor(adapter: &'static str, expected: &'static str, got: &Cursor) -> BoxError {
    Box::new(FakeApiError::WrongCursor {
        adapter,
        expected,
        got: cursor_kind(got),
    })
}

fn into_page(listing: Listing, has_more: Option<bool>, cursor: Option<String>) -> Page {
    let mut page = if listing.not_modified() {
        Page::not_modified()
    } else {
        let mut page = Page::new(listing.items);
        (page.cursor, page.has_more) = (cursor, has_more);
        page
    };
    page.rate_limit = listing.rate_limit;
    page
}

/// `n` items `{ id: "item-001", name: "Item 1", value: 1, updatedAt }`, ids zero-padded to at
/// least 3 digits (more when `n` needs them), `updatedAt` one second apart from
/// 2026-01-01T00:00:00.000Z (item 1 at exactly that instant).
pub fn fake_items(n: usize) -> Vec<Value> {
    let width = n.to_string().len().max(3);
    (1..=n)
        .map(|i| {
            let offset_ms = i64::try_from(i - 1)
                .unwrap_or(i64::MAX)
                .saturating_mul(1000);
            json!({
                "id": format!("item-{i:0width$}"),
                "name": format!("Item {i}"),
                "value": i,
                "updatedAt": format_rfc3339_ms(T0.saturating_add(offset_ms)),
            })
        })
        .collect()
}
