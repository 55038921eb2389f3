//! Poller definitions: typed at the edges, JSON inside.
//!
//! A [`PollerBuilder`] is written over the user's item type `T`; [`PollerBuilder::build`]
//! validates every option (a `Config` error names the first bad one) and erases `T` into a
//! [`Poller`] the engine runs.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;

mod build;
pub(crate) mod builder;
pub(crate) mod handle;
mod prepare;

pub(crate) use builder::PollerBuilder;
pub(crate) use handle::Poller;
pub use prepare::MAX_ITEM_DEPTH;

use crate::cursor::SharedStrategy;
pub use crate::decide::OnSchemaChange;
use crate::delivery::{DeliveryOptions, Partition};
use crate::diff::{CanonicalError, fingerprint};
use crate::error::{BoxError, Error, Result};
pub use crate::fetch::{BudgetCharge, RejectedItem, ValidatorAccess};
use crate::fetch::{FetchContext, Page};
use crate::model::ValidationIssue;
use crate::schedule::{CircuitOptions, ScheduleOptions};

/// What the snapshot keeps per item.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Retain {
    /// Only the fingerprint hash (and version).
    #[default]
    Hash,
    /// The last payload too: updates carry `previous`, deletes carry `data`.
    Payload,
}

/// What happens to an item that fails validation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnInvalid {
    /// Park it (kind `invalid`) with its raw JSON and issues, in the same commit.
    #[default]
    Quarantine,
    /// Drop it with a warning.
    Skip,
    /// Fail the cycle with a `Validation` error.
    Fail,
}

/// The default page cap of incremental lanes.
pub const DEFAULT_MAX_PAGES_PER_CYCLE: u32 = 50;
/// The default page cap of full scans (`snapshot_diff`, reconcile): a safety net.
pub const DEFAULT_FULL_SCAN_PAGE_CAP: u32 = 10_000;

/// Fetches one page. Implemented for every `Fn(FetchContext) -> impl Future<Output =
/// Result<Page, BoxError>>`.
#[async_trait]
pub trait Fetch: Send + Sync + 'static {
    /// Fetches the page `ctx` asks for.
    async fn fetch(&self, ctx: FetchContext) -> Result<Page, BoxError>;
}

#[async_trait]
impl<F, Fut> Fetch for F
where
    F: Fn(FetchContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Page, BoxError>> + Send + 'static,
{
    async fn fetch(&self, ctx: FetchContext) -> Result<Page, BoxError> {
        (self)(ctx).await
    }
}

/// Fetches a cycle as a stream of pages: every yielded page is processed in order and the cycle
/// ends when the stream does. Implemented for every `Fn(FetchContext) -> BoxStream<'static,
/// Result<Page, BoxError>>`.
pub trait FetchStream: Send + Sync + 'static {
    /// The pages of one cycle, starting from `ctx` (its page index is 1).
    fn pages(&self, ctx: FetchContext) -> BoxStream<'static, Result<Page, BoxError>>;
}

impl<F> FetchStream for F
where
    F: Fn(FetchContext) -> BoxStream<'static, Result<Page, BoxError>> + Send + Sync + 'static,
{
    fn pages(&self, ctx: FetchContext) -> BoxStream<'static, Result<Page, BoxError>> {
        (self)(ctx)
    }
}

/// How a poller fetches: one page per call, or a stream of pages per cycle.
#[derive(Clone)]
pub(crate) enum FetchSource {
    Pages(Arc<dyn Fetch>),
    Stream(Arc<dyn FetchStream>),
}

/// The reconcile lane: a periodic full listing through its own fetch and cursor, which finds
/// deletes an incremental cursor cannot see.
#[derive(Clone)]
pub(crate) struct Reconcile {
    pub(crate) every: Duration,
    pub(crate) fetch: FetchSource,
    /// How the listing pages (default: page numbers from 1); every listing starts from its
    /// initial cursor.
    pub(crate) strategy: SharedStrategy,
}

/// Looks up a full scan's suspects by identity, for [`DeleteConfirmation::Lookup`] (set with
/// [`PollerBuilder::lookup`]). Implemented for every `Fn(FetchContext, Vec<String>) -> impl
/// Future<Output = Result<Page, BoxError>>`.
#[async_trait]
pub trait Lookup: Send + Sync + 'static {
    /// Fetches the items among `identities` that the API still has (`GET /orders?ids=a,b`, or
    /// one `GET /orders/{id}` per identity with a `404` left out of the answer), as a page of
    /// raw items: they are validated and diffed like the items of a listing. An identity the
    /// answer does not name is reported deleted, so the answer must hold every item of the
    /// batch that exists (an answer with `has_more(true)` or `not_modified` is an error).
    ///
    /// `ctx` is the context of a fetch on the full scan's lane, with the poller's rate budget
    /// (charge it with [`FetchContext::charge_budget`] before each request, as a fetch does;
    /// `watukuy-http` does it by itself), the cancellation token and the engine's clock; its
    /// `page` is the 1-based index of this batch among the cycle's lookups, its `cursor` the
    /// lane's initial cursor, and it carries no validators. An error deletes nothing.
    async fn lookup(&self, ctx: FetchContext, identities: Vec<String>) -> Result<Page, BoxError>;
}

#[async_trait]
impl<F, Fut> Lookup for F
where
    F: Fn(FetchContext, Vec<String>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Page, BoxError>> + Send + 'static,
{
    async fn lookup(&self, ctx: FetchContext, identities: Vec<String>) -> Result<Page, BoxError> {
        (self)(ctx, identities).await
    }
}

/// A poller's lookup of suspects, with its batch size.
#[derive(Clone)]
pub(crate) struct LookupDef {
    /// Identities per call (at least 1).
    pub(crate) batch_size: usize,
    pub(crate) lookup: Arc<dyn Lookup>,
}

/// Lists a poller's partitions. Implemented for every `Fn() -> impl Future<Output =
/// Result<Vec<Partition>, BoxError>>`.
#[async_trait]
pub trait Partitions: Send + Sync + 'static {
    /// The current partitions (non-empty, unique keys).
    async fn list(&self) -> Result<Vec<Partition>, BoxError>;
}

#[async_trait]
impl<F, Fut> Partitions for F
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Vec<Partition>, BoxError>> + Send + 'static,
{
    async fn list(&self) -> Result<Vec<Partition>, BoxError> {
        (self)().await
    }
}

/// One valid item, ready for the diff.
pub(crate) struct Candidate {
    pub(crate) identity: String,
    pub(crate) version: Option<String>,
    /// The validated item, re-serialized (what handlers receive).
    pub(crate) value: serde_json::Value,
    /// The poller's own fingerprint of the typed item; `None` fingerprints `value`.
    pub(crate) custom_fingerprint: Option<CustomFingerprint>,
}

/// A poller's own fingerprint of one typed item, ready to run.
pub(crate) type CustomFingerprint = Box<dyn FnOnce() -> Result<String, CanonicalError> + Send>;

impl Candidate {
    /// Computes the fingerprint hash; called only when the version fast path did not decide.
    pub(crate) fn fingerprint(&mut self) -> Result<String, CanonicalError> {
        match self.custom_fingerprint.take() {
            Some(custom) => custom(),
            None => fingerprint(&self.value),
        }
    }
}

/// What validation made of one raw item.
pub(crate) enum Prepared {
    Valid(Candidate),
    /// Invalid, with the issues and the identity if it could still be read from the raw item.
    Invalid {
        issues: Vec<ValidationIssue>,
        identity: Option<String>,
    },
}

type Prepare = dyn Fn(&serde_json::Value) -> Prepared + Send + Sync;

/// The parts of a poller the engine uses.
pub(crate) struct PollerDef {
    pub(crate) name: String,
    pub(crate) source: Option<String>,
    pub(crate) schema_version: u32,
    pub(crate) strategy: SharedStrategy,
    pub(crate) fetch: FetchSource,
    pub(crate) prepare: Arc<Prepare>,
    pub(crate) schedule: ScheduleOptions,
    pub(crate) circuit: CircuitOptions,
    pub(crate) delivery: DeliveryOptions,
    pub(crate) retain: Retain,
    pub(crate) on_invalid: OnInvalid,
    pub(crate) on_schema_change: OnSchemaChange,
    pub(crate) max_pages_per_cycle: u32,
    pub(crate) full_scan_page_cap: u32,
    pub(crate) delete_confirmation: DeleteConfirmation,
    /// Set exactly when `delete_confirmation` is `Lookup` (checked by `build`).
    pub(crate) lookup: Option<LookupDef>,
    pub(crate) overlap_delivery: bool,
    pub(crate) log_retention: Option<Duration>,
    pub(crate) reconcile: Option<Reconcile>,
    pub(crate) budget: Option<String>,
    pub(crate) budget_weight: f64,
    pub(crate) budget_cost: u64,
    pub(crate) partitions: Option<Arc<dyn Partitions>>,
    pub(crate) partitions_refresh: Duration,
}

/// Checks a poller name: `^[a-zA-Z0-9][a-zA-Z0-9._-]{0,127}$`.
pub(crate) fn validate_name(name: &str) -> Result<()> {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if first_ok && rest_ok && name.len() <= 128 {
        Ok(())
    } else {
        Err(Error::config(
            "name",
            format!("{name:?} must match ^[a-zA-Z0-9][a-zA-Z0-9._-]{{0,127}}$"),
        ))
    }
}

/// The default event source prefix.
pub(crate) const DEFAULT_SOURCE_PREFIX: &str = "urn:watukuy:";

impl PollerDef {
    /// The reconcile lane's interval, if the poller has one (what the schedule reads).
    pub(crate) fn reconcile_every(&self) -> Option<Duration> {
        self.reconcile.as_ref().map(|reconcile| reconcile.every)
    }

    /// The event source of this poller under `prefix` (`urn:watukuy:` by default).
    pub(crate) fn source_for(&self, prefix: &str) -> String {
        self.source
            .clone()
            .unwrap_or_else(|| format!("{prefix}{}", self.name))
    }
}

/// When a full scan may report an item it did not list as deleted.
///
/// A listing of several pages is several requests, and an API that pages by offset or page
/// number (`?page=2`, `?offset=50`) shifts every later item one place up when an item before
/// them is deleted between two requests: the item that moved onto the page already fetched is
/// listed by neither request, although it was never deleted. One response cannot shift under
/// itself, so a listing of a single page is always trusted, whatever the rule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeleteConfirmation {
    /// An item missing from a complete listing of several pages is a *suspect*, kept with the
    /// lane's state; it is reported deleted only when the next complete listing misses it too,
    /// and cleared when a listing names it. Costs: a delete arrives one full listing later,
    /// and the suspects are stored in the key's state until then. A live item is then reported
    /// deleted only if the listing shifted across it in two listings in a row.
    #[default]
    NextListing,
    /// Every item missing from a complete listing is reported deleted at once (the TypeScript
    /// reference's rule). Sound only for listings that cannot shift: one page, keyset
    /// pagination (`?after=<last id>`), or a snapshot the API holds for the whole listing.
    Immediate,
    /// Every item missing from a complete listing of several pages is looked up by identity
    /// through the poller's [`lookup`](PollerBuilder::lookup), in the same cycle, right after
    /// the listing: an item the lookup does not return is reported deleted; an item it returns
    /// is alive (no delete), and its value is diffed like a listed item's (an `updated` event
    /// if it changed, validation and quarantine as usual). A lookup that fails deletes nothing:
    /// its identities stay suspects (kept with the lane's state), the cycle fails like a failed
    /// fetch, and the next complete listing looks them up again. Sound for any listing,
    /// offset-paged ones included, as long as the lookup answers for the item itself; costs
    /// one request per batch of missing items. Selected by [`PollerBuilder::lookup`].
    Lookup,
}
