//! What a poller's `fetch` receives and returns.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::budget::{BudgetManager, Request};
use crate::hooks::{HookContext, Hooks};

use crate::clock::Clock;
use crate::cursor::Cursor;
use crate::delivery::Partition;
use crate::model::{Lane, PKey, RateLimitInfo, UrlValidator, Validator};
use crate::store::Store;

/// The context of one fetch call.
#[derive(Clone)]
#[non_exhaustive]
pub struct FetchContext {
    /// Where to read from (see [`Cursor`]); already adjusted for overlap on a cycle's first
    /// request.
    pub cursor: Cursor,
    /// The 1-based index of this request within the cycle (1, 2, ...; at most the lane's page
    /// cap). A `snapshot_diff` or reconcile fetch of a numbered listing passes it as the API's
    /// page number; it has the type of [`Cursor::Page`]'s `page`, so neither needs a cast.
    pub page: u32,
    /// The partition, with its transient data.
    pub partition: Partition,
    /// The lane this fetch serves.
    pub lane: Lane,
    /// Fires when the cycle is abandoned (stop without drain, lease loss, deadline).
    pub cancel: CancellationToken,
    /// The poller's rate budget, if it has one (see [`charge_budget`](Self::charge_budget)).
    pub budget: Option<BudgetCharge>,
    /// This key's committed HTTP validators (`ETag`, `Last-Modified`); a response's validators are
    /// staged here and land with the page's commit. `None` outside an engine run, in a full scan
    /// (a `304` on one page of a listing says nothing about the others), and for cursors whose
    /// next request depends on the body (`token`, `custom`): only `timestamp` and `page` cursors
    /// send conditional requests.
    pub validators: Option<ValidatorAccess>,
    /// The engine's clock: read "now" through it (rate-limit resets, `Retry-After` dates,
    /// timeouts), never through the system clock, so tests on a manual clock stay exact.
    /// `None` outside an engine run.
    pub clock: Option<Arc<dyn Clock>>,
}

impl std::fmt::Debug for FetchContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FetchContext")
            .field("cursor", &self.cursor)
            .field("page", &self.page)
            .field("partition", &self.partition)
            .field("lane", &self.lane)
            .field("budget", &self.budget)
            .field("validators", &self.validators)
            .finish_non_exhaustive()
    }
}

impl FetchContext {
    /// The context of a first request on the live lane: page 1, a fresh cancellation
    /// token, no budget, validators or clock. For calling a `fetch` outside an engine (tests,
    /// tools); the fields are public, set the ones the call needs.
    ///
    /// ```
    /// use watukuy_core::cursor::Cursor;
    /// use watukuy_core::{FetchContext, Partition};
    ///
    /// let ctx = FetchContext::new(Cursor::Page { page: 3 }, Partition::new("tenant-a"));
    /// assert_eq!((ctx.page, ctx.partition.key.as_str()), (1, "tenant-a"));
    /// ```
    pub fn new(cursor: Cursor, partition: Partition) -> Self {
        FetchContext {
            cursor,
            page: 1,
            partition,
            lane: Lane::Live,
            cancel: CancellationToken::new(),
            budget: None,
            validators: None,
            clock: None,
        }
    }

    /// Takes the poller's `budget_cost` tokens from its rate budget before a request, waiting
    /// (behind higher lanes, fairly among pollers) until the budget allows it. Call it once per
    /// HTTP request. A poller without a budget returns at once.
    ///
    /// A `BudgetTimeout` error (no token within `max_wait`) ends the cycle as a deferral: the key
    /// runs again when the budget can serve it, without counting as a failure.
    pub async fn charge_budget(&self) -> crate::error::Result<()> {
        match &self.budget {
            Some(budget) => budget.charge(budget.cost, &self.cancel).await,
            None => Ok(()),
        }
    }
}

/// A poller's share of a named rate budget, as handed to its fetch.
#[derive(Clone)]
pub struct BudgetCharge {
    pub(crate) manager: Arc<BudgetManager>,
    pub(crate) name: String,
    pub(crate) requester: String,
    pub(crate) weight: f64,
    pub(crate) lane: Lane,
    pub(crate) cost: u64,
    pub(crate) max_wait: Option<Duration>,
    pub(crate) hooks: Arc<dyn Hooks>,
    pub(crate) hook: HookContext,
}

impl std::fmt::Debug for BudgetCharge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BudgetCharge")
            .field("budget", &self.name)
            .field("requester", &self.requester)
            .field("lane", &self.lane)
            .field("cost", &self.cost)
            .finish_non_exhaustive()
    }
}

impl BudgetCharge {
    /// The budget's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Takes `cost` tokens (0 passes at once), waiting as the budget requires.
    pub async fn charge(&self, cost: u64, cancel: &CancellationToken) -> crate::error::Result<()> {
        let request = Request::new(self.requester.clone())
            .with_weight(self.weight)
            .with_lane(self.lane)
            .with_cost(cost)
            .with_cancel(cancel.clone());
        let request = match self.max_wait {
            Some(max_wait) => request.with_max_wait(max_wait),
            None => request,
        };
        let grant = self.manager.acquire(&self.name, request).await?;
        if grant.waited_ms > 0 {
            self.hooks
                .on_budget_wait(&self.hook, &self.name, grant.waited_ms)
                .await;
        }
        Ok(())
    }
}

/// One key's HTTP validators (`ETag`, `Last-Modified`) as a fetch sees them, and the engine's
/// clock.
///
/// Reads return what was **committed**: a validator is written only by the `commit_poll` of the
/// page built from its response, never on its own. [`stage`](Self::stage) keeps a response's
/// validators with the fetch; the engine takes them into that page's commit, so they land with the
/// page or not at all (a crash, a failed commit or a lost lease between the response and the
/// commit drops them, and the next request is unconditional). A `304 Not Modified` is therefore
/// only ever an answer to a validator whose `200` was committed.
#[derive(Clone)]
pub struct ValidatorAccess {
    store: Arc<dyn Store>,
    key: PKey,
    clock: Arc<dyn Clock>,
    staged: Arc<Mutex<Vec<UrlValidator>>>,
}

impl std::fmt::Debug for ValidatorAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ValidatorAccess")
            .field("key", &self.key)
            .field("staged", &self.staged())
            .finish_non_exhaustive()
    }
}

impl ValidatorAccess {
    /// The committed validators of `key` in `store`; staged ones are stamped with `clock`.
    pub fn new(store: Arc<dyn Store>, key: PKey, clock: Arc<dyn Clock>) -> Self {
        Self {
            store,
            key,
            clock,
            staged: Arc::default(),
        }
    }

    /// The key.
    pub fn key(&self) -> &PKey {
        &self.key
    }

    /// The engine's clock (read "now" through it, never through the system clock).
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The committed validators of a URL hash (see [`hash_url`](crate::diff::hash_url)). What
    /// this fetch staged is not visible here until its page is committed.
    pub async fn get(&self, url_hash: &str) -> crate::error::Result<Option<Validator>> {
        self.store.get_validator(&self.key, url_hash).await
    }

    /// Keeps a response's validators for the commit of the page this fetch returns (a later
    /// stage of the same URL hash replaces an earlier one), stamped with the clock's now.
    pub fn stage(&self, url_hash: &str, etag: Option<String>, last_modified: Option<String>) {
        let staged = UrlValidator {
            url_hash: url_hash.to_owned(),
            validator: Validator {
                etag,
                last_modified,
                stored_at: self.clock.now_ms(),
            },
        };
        let mut list = self.staged.lock().unwrap_or_else(PoisonError::into_inner);
        list.retain(|v| v.url_hash != staged.url_hash);
        list.push(staged);
    }

    /// What was staged and not yet taken into a commit.
    pub fn staged(&self) -> Vec<UrlValidator> {
        self.staged
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Takes what was staged, for the commit of the page just fetched.
    pub(crate) fn take_staged(&self) -> Vec<UrlValidator> {
        std::mem::take(&mut *self.staged.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// One page of items as the API returned them.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Page {
    /// The raw items; each is validated into the poller's item type.
    pub items: Vec<serde_json::Value>,
    /// The API's cursor for the next page (token strategy) or a watermark (timestamp strategy).
    pub cursor: Option<String>,
    /// `Some(true)`: more pages follow now (catch-up); `Some(false)`: the listing ended.
    pub has_more: Option<bool>,
    /// The API answered 304 Not Modified: an idle cycle, never an empty listing.
    pub not_modified: bool,
    /// Rate-limit information from the response, used to pace the schedule.
    pub rate_limit: Option<RateLimitInfo>,
    /// Items of the response that could not be decoded into JSON values at all (see
    /// [`reject`](Self::reject)); they are invalid items with an unknown identity.
    pub rejected: Vec<RejectedItem>,
}

/// An item of a response that could not be decoded, kept with the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RejectedItem {
    /// The item's text as the API sent it.
    pub text: String,
    /// Why it could not be decoded (e.g. `a lone surrogate escape at line 1 column 9`).
    pub reason: String,
}

impl Page {
    /// A page of raw items.
    pub fn new(items: Vec<serde_json::Value>) -> Self {
        Self {
            items,
            ..Self::default()
        }
    }

    /// A page built from typed items (serialized to JSON; values that cannot be serialized are
    /// an error naming the item's index).
    pub fn from_items<T: serde::Serialize>(items: &[T]) -> Result<Self, serde_json::Error> {
        let items = items
            .iter()
            .map(serde_json::to_value)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self::new(items))
    }

    /// Sets the next cursor.
    #[must_use]
    pub fn cursor(mut self, cursor: impl Into<String>) -> Self {
        self.cursor = Some(cursor.into());
        self
    }

    /// Sets `has_more`.
    #[must_use]
    pub fn has_more(mut self, has_more: bool) -> Self {
        self.has_more = Some(has_more);
        self
    }

    /// A 304 Not Modified page.
    pub fn not_modified() -> Self {
        Self {
            not_modified: true,
            ..Self::default()
        }
    }

    /// Adds an item that could not be decoded (a lone UTF-16 surrogate escape such as
    /// `"\ud800"`, nesting past the parser's limit, ...). The engine treats it as an invalid
    /// item without a readable identity: by `on_invalid`, quarantined (its text kept as a JSON
    /// string), skipped or failing the cycle; a full scan with one emits no deletes that cycle.
    #[must_use]
    pub fn reject(mut self, text: impl Into<String>, reason: impl Into<String>) -> Self {
        self.rejected.push(RejectedItem {
            text: text.into(),
            reason: reason.into(),
        });
        self
    }

    /// Sets the rate-limit information.
    #[must_use]
    pub fn rate_limit(mut self, info: RateLimitInfo) -> Self {
        self.rate_limit = Some(info);
        self
    }
}
