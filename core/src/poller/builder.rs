//! The poller builder's options, each with its default.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::cursor::CursorConfig;
use crate::decide::OnSchemaChange;
use crate::delivery::DeliveryOptions;
use crate::diff::{CanonicalError, fingerprint};
use crate::model::ValidationIssue;
use crate::poller::{
    DEFAULT_FULL_SCAN_PAGE_CAP, DEFAULT_MAX_PAGES_PER_CYCLE, DeleteConfirmation, Fetch,
    FetchSource, FetchStream, Lookup, LookupDef, OnInvalid, Partitions, Retain,
};
use crate::schedule::{CircuitOptions, ScheduleOptions};

pub(super) type IdentityFn<T> = Arc<dyn Fn(&T) -> String + Send + Sync>;
pub(super) type CheckFn<T> = Arc<dyn Fn(&T) -> Result<(), Vec<ValidationIssue>> + Send + Sync>;
pub(super) type FingerprintFn<T> = Arc<dyn Fn(&T) -> Result<String, CanonicalError> + Send + Sync>;
pub(super) type RawIdentityFn = Arc<dyn Fn(&serde_json::Value) -> Option<String> + Send + Sync>;

/// Builds a [`Poller`](crate::Poller) over the item type `T`. Each option's method documents its default;
/// [`build`](Self::build) rejects a bad option with a `Config` error naming it.
pub struct PollerBuilder<T> {
    pub(super) name: String,
    pub(super) identity: Option<IdentityFn<T>>,
    pub(super) identity_field: Option<String>,
    pub(super) raw_identity: Option<RawIdentityFn>,
    pub(super) version: Option<IdentityFn<T>>,
    pub(super) fingerprint: Option<FingerprintFn<T>>,
    pub(super) check: Option<CheckFn<T>>,
    pub(super) schema_version: u32,
    pub(super) cursor: Option<CursorConfig>,
    pub(super) fetch: Option<FetchSource>,
    pub(super) schedule: ScheduleOptions,
    pub(super) circuit: CircuitOptions,
    pub(super) delivery: DeliveryOptions,
    pub(super) retain: Retain,
    pub(super) on_invalid: OnInvalid,
    pub(super) on_schema_change: OnSchemaChange,
    pub(super) max_pages_per_cycle: u32,
    pub(super) full_scan_page_cap: u32,
    /// `None` until set: `NextListing`, or `Lookup` when a lookup is set.
    pub(super) delete_confirmation: Option<DeleteConfirmation>,
    pub(super) lookup: Option<LookupDef>,
    pub(super) overlap_delivery: bool,
    pub(super) log_retention: Option<Duration>,
    pub(super) reconcile: Option<(Duration, FetchSource)>,
    pub(super) reconcile_cursor: Option<CursorConfig>,
    pub(super) budget: Option<String>,
    pub(super) budget_weight: f64,
    pub(super) budget_cost: u64,
    pub(super) source: Option<String>,
    pub(super) partitions: Option<Arc<dyn Partitions>>,
    pub(super) partitions_refresh: Duration,
}

impl<T> fmt::Debug for PollerBuilder<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PollerBuilder")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl<T> PollerBuilder<T>
where
    T: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    pub(super) fn new(name: String) -> Self {
        Self {
            name,
            identity: None,
            identity_field: None,
            raw_identity: None,
            version: None,
            fingerprint: None,
            check: None,
            schema_version: 1,
            cursor: None,
            fetch: None,
            schedule: ScheduleOptions::default(),
            circuit: CircuitOptions::default(),
            delivery: DeliveryOptions::default(),
            retain: Retain::Hash,
            on_invalid: OnInvalid::Quarantine,
            on_schema_change: OnSchemaChange::Rebaseline,
            max_pages_per_cycle: DEFAULT_MAX_PAGES_PER_CYCLE,
            full_scan_page_cap: DEFAULT_FULL_SCAN_PAGE_CAP,
            delete_confirmation: None,
            lookup: None,
            overlap_delivery: false,
            log_retention: None,
            reconcile: None,
            reconcile_cursor: None,
            budget: None,
            budget_weight: 1.0,
            budget_cost: 1,
            source: None,
            partitions: None,
            partitions_refresh: Duration::from_secs(300),
        }
    }

    /// The item's identity, from the typed item. Quarantined items (which failed to become a
    /// `T`) are then identified with [`raw_identity`](Self::raw_identity) if given.
    #[must_use]
    pub fn identity(mut self, f: impl Fn(&T) -> String + Send + Sync + 'static) -> Self {
        self.identity = Some(Arc::new(f));
        self
    }

    /// The item's identity is the field at this dot path (a string, or a number written as
    /// JSON writes it). Works on raw items too, so quarantined items keep their identity.
    #[must_use]
    pub fn identity_field(mut self, path: impl Into<String>) -> Self {
        self.identity_field = Some(path.into());
        self
    }

    /// Reads an identity from a raw item that failed validation, so a full scan still counts it
    /// as seen (it is not reported deleted).
    #[must_use]
    pub fn raw_identity(
        mut self,
        f: impl Fn(&serde_json::Value) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.raw_identity = Some(Arc::new(f));
        self
    }

    /// The item's version: enables the version fast path (no hashing when unchanged).
    #[must_use]
    pub fn version(mut self, f: impl Fn(&T) -> String + Send + Sync + 'static) -> Self {
        self.version = Some(Arc::new(f));
        self
    }

    /// What counts as a change (default: the whole item), canonicalized (RFC 8785) and hashed.
    #[must_use]
    pub fn fingerprint<F, V>(mut self, f: F) -> Self
    where
        F: Fn(&T) -> V + Send + Sync + 'static,
        V: Serialize,
    {
        self.fingerprint = Some(Arc::new(move |item: &T| fingerprint(&f(item))));
        self
    }

    /// An extra check after deserialization; its issues quarantine the item.
    #[must_use]
    pub fn check(
        mut self,
        f: impl Fn(&T) -> Result<(), Vec<ValidationIssue>> + Send + Sync + 'static,
    ) -> Self {
        self.check = Some(Arc::new(f));
        self
    }

    /// The schema version (at least 1; default 1). Part of every event id.
    #[must_use]
    pub fn schema_version(mut self, version: u32) -> Self {
        self.schema_version = version;
        self
    }

    /// The cursor strategy (see [`crate::cursor`]: `timestamp`, `token`, `page`,
    /// `snapshot_diff`, `custom`); validated when the poller is built.
    #[must_use]
    pub fn cursor(mut self, cursor: impl Into<CursorConfig>) -> Self {
        self.cursor = Some(cursor.into());
        self
    }

    /// How to fetch one page (the runner calls it once per page, advancing the cursor).
    #[must_use]
    pub fn fetch(mut self, fetch: impl Fetch) -> Self {
        self.fetch = Some(FetchSource::Pages(Arc::new(fetch)));
        self
    }

    /// How to fetch a whole cycle as a stream of pages (instead of [`fetch`](Self::fetch)):
    /// every page is processed and committed in order; the cycle ends with the stream.
    #[must_use]
    pub fn fetch_stream(mut self, fetch: impl FetchStream) -> Self {
        self.fetch = Some(FetchSource::Stream(Arc::new(fetch)));
        self
    }

    /// The schedule.
    #[must_use]
    pub fn schedule(mut self, schedule: ScheduleOptions) -> Self {
        self.schedule = schedule;
        self
    }

    /// The circuit breaker.
    #[must_use]
    pub fn circuit(mut self, circuit: CircuitOptions) -> Self {
        self.circuit = circuit;
        self
    }

    /// How events are delivered.
    #[must_use]
    pub fn delivery(mut self, delivery: DeliveryOptions) -> Self {
        self.delivery = delivery;
        self
    }

    /// What the snapshot keeps per item.
    #[must_use]
    pub fn retain(mut self, retain: Retain) -> Self {
        self.retain = retain;
        self
    }

    /// What happens to invalid items.
    #[must_use]
    pub fn on_invalid(mut self, on_invalid: OnInvalid) -> Self {
        self.on_invalid = on_invalid;
        self
    }

    /// What a schema-version change does.
    #[must_use]
    pub fn on_schema_change(mut self, on_schema_change: OnSchemaChange) -> Self {
        self.on_schema_change = on_schema_change;
        self
    }

    /// The page cap of one incremental cycle (default 50); a capped cycle continues at once.
    #[must_use]
    pub fn max_pages_per_cycle(mut self, pages: u32) -> Self {
        self.max_pages_per_cycle = pages;
        self
    }

    /// The page cap of one full scan (default 10,000); a capped scan emits no deletes.
    #[must_use]
    pub fn full_scan_page_cap(mut self, pages: u32) -> Self {
        self.full_scan_page_cap = pages;
        self
    }

    /// When a full scan (`snapshot_diff`, the reconcile lane) may report an unlisted item as
    /// deleted (default [`DeleteConfirmation::NextListing`], or [`DeleteConfirmation::Lookup`]
    /// when a [`lookup`](Self::lookup) is set). `Lookup` needs a lookup, and a lookup needs
    /// `Lookup`: [`build`](Self::build) rejects either without the other.
    #[must_use]
    pub fn delete_confirmation(mut self, rule: DeleteConfirmation) -> Self {
        self.delete_confirmation = Some(rule);
        self
    }

    /// Confirms a full scan's suspects by asking the API for them
    /// ([`DeleteConfirmation::Lookup`], which this selects): after a complete listing of
    /// several pages, the items it did not name are looked up, `batch_size` identities per
    /// call (at least 1), in the same cycle; those the lookup does not return are reported
    /// deleted, the others are diffed like listed items. Needs a full scan to confirm
    /// (`snapshot_diff` or a [`reconcile`](Self::reconcile) lane). See [`Lookup`] for what the
    /// function receives and must return.
    ///
    /// ```
    /// # use watukuy_core::{cursor, BoxError, FetchContext, Page, Poller};
    /// # use std::time::Duration;
    /// # #[derive(serde::Serialize, serde::Deserialize)]
    /// # struct Order { id: String }
    /// # fn orders_by_ids(ids: &[String]) -> Vec<Order> { Vec::new() }
    /// let orders = Poller::builder::<Order>("orders")
    ///     .identity(|order: &Order| order.id.clone())
    ///     .cursor(cursor::snapshot_diff()) // `GET /orders?page=N`: it shifts
    ///     .fetch(|_ctx: FetchContext| async { Ok::<Page, BoxError>(Page::default()) })
    ///     // `GET /orders?ids=a,b,c`: the orders that still exist.
    ///     .lookup(50, |ctx: FetchContext, ids: Vec<String>| async move {
    ///         ctx.charge_budget().await?;
    ///         Ok::<Page, BoxError>(Page::from_items(&orders_by_ids(&ids))?)
    ///     })
    ///     .build()?;
    /// # Ok::<(), watukuy_core::Error>(())
    /// ```
    #[must_use]
    pub fn lookup(mut self, batch_size: usize, lookup: impl Lookup) -> Self {
        self.lookup = Some(LookupDef {
            batch_size,
            lookup: Arc::new(lookup),
        });
        self
    }

    /// Delivers a page's events while the next page is fetched, validated and committed
    /// (default `false`).
    ///
    /// Off, a cycle follows the reference lifecycle: each page is committed, then its events
    /// are drained, then the next page is fetched, so a cycle costs the *sum* of committing and
    /// delivering. On, the drain of the pages committed so far runs concurrently with the next
    /// page's fetch and `commit_poll`, and a catch-up cycle approaches the *slower* of the two
    /// (see BENCHMARKS.md). What stays: per-key order, at-least-once, one drain at a time per
    /// key, every write fenced, the last page drained before the cycle ends. What changes: the
    /// hooks of page *n + 1*'s fetch and commit interleave with page *n*'s deliveries, the
    /// lease is renewed after the page's commit rather than after its drain, and a poison
    /// `halt` stops the cycle after the page being committed when it fired (that page's events
    /// stay pending, as a halt leaves them now).
    #[must_use]
    pub fn overlap_delivery(mut self, overlap: bool) -> Self {
        self.overlap_delivery = overlap;
        self
    }

    /// Adds the reconcile lane: every `every`, a full listing through `fetch`, one page per
    /// call, emits `deleted` for identities it did not see (confirmed as
    /// [`delete_confirmation`](Self::delete_confirmation) says). The fetch context carries a
    /// page cursor from 1 unless [`reconcile_cursor`](Self::reconcile_cursor) chooses another.
    /// Every listing starts from its first page, and a listing that does not end (a failed
    /// request, a crash, the page cap) deletes nothing. Redundant with (and rejected for) the
    /// `snapshot_diff` strategy. See docs/deletes.md for the listing shapes that are safe.
    #[must_use]
    pub fn reconcile(mut self, every: Duration, fetch: impl Fetch) -> Self {
        self.reconcile = Some((every, FetchSource::Pages(Arc::new(fetch))));
        self
    }

    /// Adds the reconcile lane with a listing fetched as a stream of pages (see
    /// [`fetch_stream`](Self::fetch_stream)); otherwise as [`reconcile`](Self::reconcile). The
    /// stream receives the context of the listing's first page.
    #[must_use]
    pub fn reconcile_stream(mut self, every: Duration, fetch: impl FetchStream) -> Self {
        self.reconcile = Some((every, FetchSource::Stream(Arc::new(fetch))));
        self
    }

    /// How the reconcile listing pages (default `cursor::page(1)`): a `token` or `custom`
    /// cursor for APIs with continuation tokens, or a keyset (`timestamp` with a tie-break, or
    /// `custom`) for APIs that filter on a sorted field. Every listing starts from the cursor's
    /// initial value. Validated when the poller is built.
    #[must_use]
    pub fn reconcile_cursor(mut self, cursor: impl Into<CursorConfig>) -> Self {
        self.reconcile_cursor = Some(cursor.into());
        self
    }

    /// Draws on the engine's rate budget `name` (declared with `EngineBuilder::budget`); the
    /// fetch charges it with `ctx.charge_budget()` before each request.
    #[must_use]
    pub fn budget(mut self, name: impl Into<String>) -> Self {
        self.budget = Some(name.into());
        self
    }

    /// This poller's weight under `weighted` fairness (default 1, must be > 0).
    #[must_use]
    pub fn budget_weight(mut self, weight: f64) -> Self {
        self.budget_weight = weight;
        self
    }

    /// Tokens one request takes (default 1; 0 skips the budget).
    #[must_use]
    pub fn budget_cost(mut self, cost: u64) -> Self {
        self.budget_cost = cost;
        self
    }

    /// Keeps a replay log of every event for `retention`.
    #[must_use]
    pub fn log(mut self, retention: Duration) -> Self {
        self.log_retention = Some(retention);
        self
    }

    /// The event source (default `urn:watukuy:<name>`, with the engine's source prefix).
    #[must_use]
    pub fn source(mut self, source: impl Into<String>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// Lists partitions (tenants), refreshed every `refresh` (default 5 min).
    #[must_use]
    pub fn partitions(mut self, partitions: impl Partitions, refresh: Duration) -> Self {
        self.partitions = Some(Arc::new(partitions));
        self.partitions_refresh = refresh;
        self
    }
}

pub(super) enum Identity<T> {
    Typed(IdentityFn<T>),
    Field(String),
}
