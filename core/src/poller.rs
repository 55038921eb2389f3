//! Poller definitions: typed at the edges, JSON inside.
//!
//! A [`PollerBuilder`] is written over the user's item type `T`; [`PollerBuilder::build`]
//! validates every option (a `Config` error names the first bad one) and erases `T` into a
//! [`Poller`] the engine runs.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::cursor::{CursorConfig, SharedStrategy};
use crate::decide::OnSchemaChange;
use crate::delivery::{DeliveryOptions, Partition};
use crate::diff::{CanonicalError, fingerprint};
use crate::error::{BoxError, Error, Result};
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

/// The reconcile lane: a periodic full listing through its own fetch, which finds deletes an
/// incremental cursor cannot see.
#[derive(Clone)]
pub(crate) struct Reconcile {
    pub(crate) every: Duration,
    pub(crate) fetch: FetchSource,
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
    /// Computes the fingerprint hash; called only when the version fast path did not decide.
    pub(crate) fingerprint: Box<dyn FnOnce() -> Result<String, CanonicalError> + Send>,
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

/// A validated, type-erased poller definition.
#[derive(Clone)]
pub struct Poller {
    pub(crate) inner: Arc<PollerDef>,
}

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
    pub(crate) overlap_delivery: bool,
    pub(crate) log_retention: Option<Duration>,
    pub(crate) reconcile: Option<Reconcile>,
    pub(crate) budget: Option<String>,
    pub(crate) budget_weight: f64,
    pub(crate) budget_cost: u64,
    pub(crate) partitions: Option<Arc<dyn Partitions>>,
    pub(crate) partitions_refresh: Duration,
}

impl fmt::Debug for Poller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Poller")
            .field("name", &self.inner.name)
            .field("cursor", &self.inner.strategy.name())
            .field("schema_version", &self.inner.schema_version)
            .finish_non_exhaustive()
    }
}

impl Poller {
    /// Starts a definition over the item type `T`. `name` must match
    /// `^[a-zA-Z0-9][a-zA-Z0-9._-]{0,127}$`: it keys the store, so renaming starts over.
    pub fn builder<T>(name: impl Into<String>) -> PollerBuilder<T>
    where
        T: Serialize + DeserializeOwned + Send + Sync + 'static,
    {
        PollerBuilder::new(name.into())
    }

    /// The poller's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// True when the poller lists partitions.
    pub fn is_partitioned(&self) -> bool {
        self.inner.partitions.is_some()
    }
}

type IdentityFn<T> = Arc<dyn Fn(&T) -> String + Send + Sync>;
type CheckFn<T> = Arc<dyn Fn(&T) -> Result<(), Vec<ValidationIssue>> + Send + Sync>;
type FingerprintFn<T> = Arc<dyn Fn(&T) -> Result<String, CanonicalError> + Send + Sync>;
type RawIdentityFn = Arc<dyn Fn(&serde_json::Value) -> Option<String> + Send + Sync>;

/// Builds a [`Poller`] over the item type `T`. Each option's method documents its default;
/// [`build`](Self::build) rejects a bad option with a `Config` error naming it.
pub struct PollerBuilder<T> {
    name: String,
    identity: Option<IdentityFn<T>>,
    identity_field: Option<String>,
    raw_identity: Option<RawIdentityFn>,
    version: Option<IdentityFn<T>>,
    fingerprint: Option<FingerprintFn<T>>,
    check: Option<CheckFn<T>>,
    schema_version: u32,
    cursor: Option<CursorConfig>,
    fetch: Option<FetchSource>,
    schedule: ScheduleOptions,
    circuit: CircuitOptions,
    delivery: DeliveryOptions,
    retain: Retain,
    on_invalid: OnInvalid,
    on_schema_change: OnSchemaChange,
    max_pages_per_cycle: u32,
    full_scan_page_cap: u32,
    delete_confirmation: DeleteConfirmation,
    overlap_delivery: bool,
    log_retention: Option<Duration>,
    reconcile: Option<Reconcile>,
    budget: Option<String>,
    budget_weight: f64,
    budget_cost: u64,
    source: Option<String>,
    partitions: Option<Arc<dyn Partitions>>,
    partitions_refresh: Duration,
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
    fn new(name: String) -> Self {
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
            delete_confirmation: DeleteConfirmation::default(),
            overlap_delivery: false,
            log_retention: None,
            reconcile: None,
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
    /// deleted (default [`DeleteConfirmation::NextListing`]).
    #[must_use]
    pub fn delete_confirmation(mut self, rule: DeleteConfirmation) -> Self {
        self.delete_confirmation = rule;
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

    /// Adds the reconcile lane: every `every`, a full listing through `fetch` (page by page, the
    /// fetch context carrying a page cursor from 1) emits `deleted` for identities it did not
    /// see. Redundant with (and rejected for) the `snapshot_diff` strategy.
    #[must_use]
    pub fn reconcile(mut self, every: Duration, fetch: impl Fetch) -> Self {
        self.reconcile = Some(Reconcile {
            every,
            fetch: FetchSource::Pages(Arc::new(fetch)),
        });
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

    /// Validates every option and builds the poller.
    pub fn build(self) -> Result<Poller> {
        validate_name(&self.name)?;
        if self.schema_version == 0 {
            return Err(Error::config(
                "schema_version",
                "must be an integer >= 1, got 0",
            ));
        }
        if self.max_pages_per_cycle == 0 {
            return Err(Error::config(
                "max_pages_per_cycle",
                "must be at least 1, got 0",
            ));
        }
        if self.full_scan_page_cap == 0 {
            return Err(Error::config(
                "full_scan_page_cap",
                "must be at least 1, got 0",
            ));
        }
        if self.partitions_refresh.is_zero() {
            return Err(Error::config(
                "partitions_refresh",
                "must be greater than zero",
            ));
        }
        if let Some(source) = &self.source {
            if source.trim().is_empty() {
                return Err(Error::config("source", "must not be empty"));
            }
        }
        self.schedule.validate()?;
        self.circuit.validate()?;
        self.delivery.validate()?;
        let strategy = self
            .cursor
            .ok_or_else(|| Error::config("cursor", "is required"))?
            .into_strategy()?;
        if let Some(reconcile) = &self.reconcile {
            if strategy.is_full_scan() {
                return Err(Error::config(
                    "reconcile",
                    format!(
                        "is redundant with the `{}` strategy, which lists everything every cycle",
                        strategy.name()
                    ),
                ));
            }
            if reconcile.every.is_zero() {
                return Err(Error::config(
                    "reconcile.every",
                    "must be greater than zero",
                ));
            }
        }
        if !(self.budget_weight.is_finite() && self.budget_weight > 0.0) {
            return Err(Error::config(
                "budget_weight",
                format!("must be a finite number > 0, got {}", self.budget_weight),
            ));
        }
        if self.log_retention.is_some_and(|r| r.is_zero()) {
            return Err(Error::config("log.retention", "must be greater than zero"));
        }
        let fetch = self
            .fetch
            .ok_or_else(|| Error::config("fetch", "is required"))?;
        let identity = match (self.identity, self.identity_field.clone()) {
            (Some(_), Some(_)) => {
                return Err(Error::config(
                    "identity",
                    "set either `identity` or `identity_field`, not both",
                ));
            }
            (None, None) => return Err(Error::config("identity", "is required")),
            (Some(f), None) => Identity::Typed(f),
            (None, Some(path)) => {
                if path.is_empty() || path.split('.').any(str::is_empty) {
                    return Err(Error::config(
                        "identity_field",
                        format!("{path:?} is not a dot path"),
                    ));
                }
                Identity::Field(path)
            }
        };
        let raw_identity: Option<RawIdentityFn> = match (&self.raw_identity, &self.identity_field) {
            (Some(f), _) => Some(Arc::clone(f)),
            (None, Some(path)) => {
                let path = path.clone();
                Some(Arc::new(move |raw: &serde_json::Value| {
                    field_string(raw, &path)
                }))
            }
            (None, None) => None,
        };
        let prepare = make_prepare::<T>(
            identity,
            raw_identity,
            self.version,
            self.fingerprint,
            self.check,
        );
        Ok(Poller {
            inner: Arc::new(PollerDef {
                name: self.name,
                source: self.source,
                schema_version: self.schema_version,
                strategy,
                fetch,
                prepare,
                schedule: self.schedule,
                circuit: self.circuit,
                delivery: self.delivery,
                retain: self.retain,
                on_invalid: self.on_invalid,
                on_schema_change: self.on_schema_change,
                max_pages_per_cycle: self.max_pages_per_cycle,
                full_scan_page_cap: self.full_scan_page_cap,
                delete_confirmation: self.delete_confirmation,
                overlap_delivery: self.overlap_delivery,
                log_retention: self.log_retention,
                reconcile: self.reconcile,
                budget: self.budget,
                budget_weight: self.budget_weight,
                budget_cost: self.budget_cost,
                partitions: self.partitions,
                partitions_refresh: self.partitions_refresh,
            }),
        })
    }
}

enum Identity<T> {
    Typed(IdentityFn<T>),
    Field(String),
}

/// Checks a poller name: `^[a-zA-Z0-9][a-zA-Z0-9._-]{0,127}$`.
pub fn validate_name(name: &str) -> Result<()> {
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

/// The value at a dot path as an identity: strings verbatim, numbers as JSON writes them.
/// The deepest nesting of arrays and objects an item may have (the item itself is level 1);
/// a deeper item is invalid (quarantined by default). Stored rows wrap an item in a few more
/// levels, and JSON parsers commonly stop at 128 (serde_json's default), so every store can read
/// back what it wrote.
pub const MAX_ITEM_DEPTH: usize = 100;

/// Whether `value` nests arrays and objects more than `max` levels deep (iterative: no stack
/// growth however deep the value is).
pub(crate) fn nested_deeper_than(value: &serde_json::Value, max: usize) -> bool {
    let mut stack = vec![(value, 1_usize)];
    while let Some((value, depth)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &serde_json::Value>> = match value {
            serde_json::Value::Array(items) => Box::new(items.iter()),
            serde_json::Value::Object(map) => Box::new(map.values()),
            _ => continue,
        };
        if depth > max {
            return true;
        }
        stack.extend(children.map(|child| (child, depth + 1)));
    }
    false
}

pub(crate) fn field_string(value: &serde_json::Value, path: &str) -> Option<String> {
    let mut current = value;
    for segment in path.split('.') {
        current = match current {
            serde_json::Value::Object(map) => map.get(segment)?,
            serde_json::Value::Array(items) => items.get(segment.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    match current {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn make_prepare<T>(
    identity: Identity<T>,
    raw_identity: Option<RawIdentityFn>,
    version: Option<IdentityFn<T>>,
    custom_fingerprint: Option<FingerprintFn<T>>,
    check: Option<CheckFn<T>>,
) -> Arc<Prepare>
where
    T: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    Arc::new(move |raw: &serde_json::Value| {
        let raw_id = || raw_identity.as_ref().and_then(|f| f(raw));
        if nested_deeper_than(raw, MAX_ITEM_DEPTH) {
            let issue = ValidationIssue {
                message: format!(
                    "the item is nested deeper than {MAX_ITEM_DEPTH} levels of arrays and objects, which watukuy does not store"
                ),
                path: None,
            };
            return Prepared::Invalid {
                issues: vec![issue],
                identity: raw_id(),
            };
        }
        let item: T = match serde_path_to_error::deserialize(raw) {
            Ok(item) => item,
            Err(error) => {
                let path = error.path().to_string();
                let issue = ValidationIssue {
                    message: error.inner().to_string(),
                    path: (path != ".").then(|| path.split('.').map(str::to_owned).collect()),
                };
                return Prepared::Invalid {
                    issues: vec![issue],
                    identity: raw_id(),
                };
            }
        };
        if let Some(check) = &check {
            if let Err(issues) = check(&item) {
                return Prepared::Invalid {
                    issues,
                    identity: raw_id(),
                };
            }
        }
        let value = match serde_json::to_value(&item) {
            Ok(value) => value,
            Err(error) => {
                let issue = ValidationIssue {
                    message: format!("the item cannot be serialized: {error}"),
                    path: None,
                };
                return Prepared::Invalid {
                    issues: vec![issue],
                    identity: raw_id(),
                };
            }
        };
        let identity = match &identity {
            Identity::Typed(f) => f(&item),
            Identity::Field(path) => match field_string(&value, path) {
                Some(id) => id,
                None => {
                    let issue = ValidationIssue {
                        message: format!(
                            "identity field `{path}` is missing or not a string or number"
                        ),
                        path: Some(path.split('.').map(str::to_owned).collect()),
                    };
                    return Prepared::Invalid {
                        issues: vec![issue],
                        identity: None,
                    };
                }
            },
        };
        let version = version.as_ref().map(|f| f(&item));
        let fingerprint: Box<dyn FnOnce() -> Result<String, CanonicalError> + Send> =
            match &custom_fingerprint {
                Some(f) => {
                    let f = Arc::clone(f);
                    Box::new(move || f(&item))
                }
                None => {
                    let whole = value.clone();
                    Box::new(move || fingerprint(&whole))
                }
            };
        Prepared::Valid(Candidate {
            identity,
            version,
            value,
            fingerprint,
        })
    })
}

impl PollerDef {
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
/// itself, so a listing of a single page is always trusted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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
}
