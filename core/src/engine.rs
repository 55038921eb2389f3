//! The engine (SPEC §2.3): pollers, consumers, `tick()` for one-shot runs, `start()`/`stop()`
//! for a daemon, operations and `inspect()`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use serde::Serialize;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::clock::{Clock, SystemClock, duration_ms};
use crate::delivery::{
    DEFAULT_DISPATCH_BATCH_SIZE, Dispatcher, Handler, Partition, Subscription, Unsubscribe,
};
use crate::error::{Error, Result};
use crate::hooks::{ComposedHooks, Hooks};
use crate::model::{PKey, ParkedQuery, ParkedRow, PollerState, StatePatch};
use crate::poller::Poller;
use crate::rng::{Rng, SystemRng};
use crate::runner::{self, KeyOutcome, PollResult, RunOptions, Runtime, Shared};
use crate::schedule;
use crate::store::Store;

/// The daemon re-reads the store at least this often.
pub const MAX_SLEEP: Duration = Duration::from_secs(30);
/// How many keys `tick()` runs at once.
pub const TICK_CONCURRENCY: usize = 4;
/// The default event source prefix.
pub const DEFAULT_SOURCE_PREFIX: &str = "urn:watukuy:";

/// Where the engine is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Built, not running a daemon.
    Idle,
    /// The daemon runs.
    Running,
    /// `stop()` is in progress.
    Stopping,
    /// Stopped.
    Stopped,
}

/// Builds an [`Engine`].
pub struct EngineBuilder {
    store: Arc<dyn Store>,
    pollers: Vec<Poller>,
    clock: Arc<dyn Clock>,
    rng: Arc<dyn Rng>,
    hooks: Vec<Arc<dyn Hooks>>,
    instance_id: Option<String>,
    lease_ttl: Duration,
    renew_every: Option<Duration>,
    source_prefix: String,
    dispatch_batch_size: usize,
    budgets: Vec<(String, crate::budget::BudgetPolicy)>,
    budget_store: Arc<dyn crate::budget::BudgetStore>,
    trace: Arc<dyn crate::telemetry::TraceContext>,
}

impl std::fmt::Debug for EngineBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineBuilder")
            .field("pollers", &self.pollers)
            .finish_non_exhaustive()
    }
}

impl EngineBuilder {
    /// Adds a poller.
    #[must_use]
    pub fn poller(mut self, poller: Poller) -> Self {
        self.pollers.push(poller);
        self
    }

    /// The clock (default: the system clock).
    #[must_use]
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The randomness source (default: seeded from the OS).
    #[must_use]
    pub fn rng(mut self, rng: Arc<dyn Rng>) -> Self {
        self.rng = rng;
        self
    }

    /// Adds a set of hooks (several sets run in the order added).
    #[must_use]
    pub fn hooks(mut self, hooks: Arc<dyn Hooks>) -> Self {
        self.hooks.push(hooks);
        self
    }

    /// The lease owner id (default `watukuy-` + 10 random `[a-z0-9]`).
    #[must_use]
    pub fn instance_id(mut self, id: impl Into<String>) -> Self {
        self.instance_id = Some(id.into());
        self
    }

    /// Lease time-to-live (default 30 s) and renewal period (default a third of it).
    #[must_use]
    pub fn lease(mut self, ttl: Duration, renew_every: Option<Duration>) -> Self {
        self.lease_ttl = ttl;
        self.renew_every = renew_every;
        self
    }

    /// The prefix of default event sources (default `urn:watukuy:`).
    #[must_use]
    pub fn source_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.source_prefix = prefix.into();
        self
    }

    /// Outbox rows per dispatch slice (default 100).
    #[must_use]
    pub fn dispatch_batch_size(mut self, size: usize) -> Self {
        self.dispatch_batch_size = size;
        self
    }

    /// Declares a named rate budget that pollers draw on (`PollerBuilder::budget`).
    #[must_use]
    pub fn budget(mut self, name: impl Into<String>, policy: crate::budget::BudgetPolicy) -> Self {
        self.budgets.push((name.into(), policy));
        self
    }

    /// Where budget buckets live (default: in memory, per process). A shared store (Redis)
    /// makes budgets hold across processes.
    #[must_use]
    pub fn budget_store(mut self, store: Arc<dyn crate::budget::BudgetStore>) -> Self {
        self.budget_store = store;
        self
    }

    /// How events get their W3C `traceparent` (default: a generated, deterministic trace per
    /// poll cycle; with OpenTelemetry, return the current context's).
    #[must_use]
    pub fn trace_context(mut self, trace: Arc<dyn crate::telemetry::TraceContext>) -> Self {
        self.trace = trace;
        self
    }

    /// Validates everything and builds the engine.
    pub fn build(self) -> Result<Engine> {
        let ttl_ms = duration_ms(self.lease_ttl);
        if ttl_ms <= 0 {
            return Err(Error::config("lease.ttl", "must be greater than zero"));
        }
        let renew_ms = self.renew_every.map_or(ttl_ms / 3, duration_ms);
        if renew_ms >= ttl_ms || renew_ms <= 0 {
            return Err(Error::config(
                "lease.renew_every",
                format!(
                    "must be greater than zero and less than the ttl ({ttl_ms} ms), got {renew_ms} ms"
                ),
            ));
        }
        let instance_id = match self.instance_id {
            Some(id) if id.trim().is_empty() => {
                return Err(Error::config("instance_id", "must not be empty"));
            }
            Some(id) => id,
            None => random_instance_id(&*self.rng),
        };
        let hooks: Arc<dyn Hooks> = match self.hooks.len() {
            0 => Arc::new(crate::hooks::NoHooks),
            1 => Arc::clone(&self.hooks[0]),
            _ => Arc::new(ComposedHooks(self.hooks)),
        };
        let mut budgets = crate::budget::BudgetManager::new(
            Arc::clone(&self.budget_store),
            Arc::clone(&self.clock),
        );
        for (name, policy) in self.budgets {
            budgets = budgets.with_budget(name, policy)?;
        }
        let mut pollers = BTreeMap::new();
        for poller in self.pollers {
            let def = Arc::clone(&poller.inner);
            if let Some(budget) = &def.budget {
                if !budgets.contains(budget) {
                    return Err(Error::config(
                        "budget",
                        format!(
                            "poller '{}' uses budget '{budget}', which the engine does not declare",
                            def.name
                        ),
                    ));
                }
            }
            if def.log_retention.is_some() && !self.store.capabilities().log {
                return Err(Error::config(
                    "log_retention",
                    format!(
                        "poller '{}' keeps a replay log, but the store has none (Capabilities::log is false)",
                        def.name
                    ),
                ));
            }
            if pollers.contains_key(&def.name) {
                return Err(Error::config(
                    "pollers",
                    format!("duplicate poller name '{}'", def.name),
                ));
            }
            let dispatcher = Dispatcher::new(
                def.name.clone(),
                Arc::clone(&self.store),
                Arc::clone(&self.clock),
                Arc::clone(&self.rng),
                def.delivery.clone(),
                self.dispatch_batch_size,
            )?
            .with_hooks(Arc::clone(&hooks), instance_id.clone());
            let source = def.source_for(&self.source_prefix);
            pollers.insert(
                def.name.clone(),
                Runtime {
                    def,
                    dispatcher,
                    source,
                },
            );
        }
        let shared = Shared {
            store: self.store,
            clock: self.clock,
            rng: self.rng,
            hooks,
            instance_id,
            lease_ttl_ms: ttl_ms,
            renew_every_ms: renew_ms,
            budgets: Arc::new(budgets),
            trace: self.trace,
        };
        Ok(Engine {
            inner: Arc::new(Inner {
                shared,
                pollers,
                partitions: Mutex::default(),
                status: Mutex::new(Status::Idle),
                wake: Notify::new(),
                daemon: tokio::sync::Mutex::new(None),
            }),
        })
    }
}

fn random_instance_id(rng: &dyn Rng) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let suffix: String = (0..10)
        .map(|_| {
            let index = crate::backoff::f64_to_ms(rng.next_f64() * 36.0).clamp(0, 35);
            char::from(ALPHABET[usize::try_from(index).unwrap_or(0)])
        })
        .collect();
    format!("watukuy-{suffix}")
}

/// The cached partition list of a poller.
struct PartitionCache {
    list: Vec<Partition>,
    refreshed_at: i64,
}

struct Daemon {
    stop: CancellationToken,
    runs: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

struct Inner {
    shared: Shared,
    pollers: BTreeMap<String, Runtime>,
    partitions: Mutex<HashMap<String, PartitionCache>>,
    status: Mutex<Status>,
    wake: Notify,
    daemon: tokio::sync::Mutex<Option<Daemon>>,
}

/// Runs pollers: turns pull-only APIs into delivered events.
///
/// Cheap to clone (all clones share the same engine).
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("instance_id", &self.inner.shared.instance_id)
            .field("pollers", &self.inner.pollers.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// Options of [`Engine::tick`].
#[derive(Clone, Debug, Default)]
pub struct TickOptions {
    /// Stop starting new keys and pages after this long (a running page is never interrupted).
    pub max_duration: Option<Duration>,
    /// Only these pollers (by name).
    pub only: Option<Vec<String>>,
}

/// What one `tick()` did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TickResult {
    /// One entry per lane cycle run.
    pub polled: Vec<PollResult>,
    /// Events delivered, the outbox drain before polling included.
    pub delivered: u64,
    /// Keys skipped because another instance holds them.
    pub skipped_leased: u64,
    /// Keys skipped because they were not due (paused keys included).
    pub skipped_not_due: u64,
    /// How long the tick took.
    pub duration_ms: i64,
    /// The deadline stopped the tick before every key ran.
    pub timed_out: bool,
}

pub use crate::ops::LaneCursors;

/// Options of [`Engine::backfill`].
#[derive(Clone, Debug, Default)]
pub struct BackfillOptions {
    /// Where to start, as the API writes its cursor (`None`: the beginning).
    pub from: Option<String>,
    /// Where to stop, as the API writes its cursor (`None`: the live cursor at the time of the
    /// call, or the end of the listing when the live lane never ran).
    pub to: Option<String>,
    /// Re-emit known, unchanged items as `updated`.
    pub force: bool,
}

/// Options of [`Engine::stop`].
#[derive(Clone, Copy, Debug)]
pub struct StopOptions {
    /// Let running cycles finish (up to `timeout`) instead of aborting them.
    pub drain: bool,
    /// How long to wait for running cycles when draining.
    pub timeout: Duration,
}

impl Default for StopOptions {
    fn default() -> Self {
        Self {
            drain: true,
            timeout: Duration::from_secs(30),
        }
    }
}

/// What `inspect()` reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InspectReport {
    /// This engine's instance id.
    pub instance_id: String,
    /// The engine's status.
    pub status: Status,
    /// When the report was made (epoch ms).
    pub generated_at: i64,
    /// One entry per active `(poller, partition)`.
    pub pollers: Vec<PollerInspect>,
}

/// The state of one `(poller, partition)`: what its store holds (read through
/// [`ops::inspect_key`](crate::ops::inspect_key), the same for the engine, the CLI and the admin
/// page; its fields read directly through `Deref`), and this engine's delivery counters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PollerInspect {
    /// The key as its store holds it (the schedule is the poller's initial one for a key that
    /// never ran; `lag_ms` comes from the poller's strategy).
    #[serde(flatten)]
    pub key: crate::ops::KeyInspect,
    /// This engine's delivery counters for the key (received, applied, deduplicated, skipped,
    /// failed), in memory since the engine was built.
    pub delivery: crate::delivery::DeliveryCounters,
}

impl std::ops::Deref for PollerInspect {
    type Target = crate::ops::KeyInspect;

    fn deref(&self) -> &Self::Target {
        &self.key
    }
}

impl Engine {
    /// Starts building an engine over `store`.
    pub fn builder(store: Arc<dyn Store>) -> EngineBuilder {
        EngineBuilder {
            store,
            pollers: Vec::new(),
            clock: Arc::new(SystemClock),
            rng: Arc::new(SystemRng::new()),
            hooks: Vec::new(),
            instance_id: None,
            lease_ttl: Duration::from_secs(30),
            renew_every: None,
            source_prefix: DEFAULT_SOURCE_PREFIX.to_owned(),
            dispatch_batch_size: DEFAULT_DISPATCH_BATCH_SIZE,
            budgets: Vec::new(),
            budget_store: Arc::new(crate::budget::MemoryBudgetStore::new()),
            trace: Arc::new(crate::telemetry::GeneratedTraceContext),
        }
    }

    /// This engine's instance id (its lease owner id).
    pub fn instance_id(&self) -> &str {
        &self.inner.shared.instance_id
    }

    /// The engine's status.
    pub fn status(&self) -> Status {
        *self
            .inner
            .status
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn runtime(&self, name: &str) -> Result<&Runtime> {
        self.inner
            .pollers
            .get(name)
            .ok_or_else(|| Error::UnknownPoller {
                name: name.to_owned(),
            })
    }

    /// Attaches the handler of poller `name` (one consumer per poller: a second `on` or
    /// `subscribe` is a `Config` error). Events committed while no consumer was attached are
    /// delivered on the next run.
    pub fn on(&self, name: &str, handler: impl Handler) -> Result<Unsubscribe> {
        let handle = self.runtime(name)?.dispatcher.on(handler)?;
        self.inner.wake.notify_one();
        Ok(handle)
    }

    /// Attaches a pull-based stream of poller `name`'s events.
    pub fn subscribe(&self, name: &str) -> Result<Subscription> {
        let subscription = self.runtime(name)?.dispatcher.subscribe()?;
        self.inner.wake.notify_one();
        Ok(subscription)
    }

    /// The store's migration.
    pub async fn migrate(&self) -> Result<()> {
        self.inner.shared.store.migrate().await
    }

    /// The current partitions of `name`, refreshed now.
    pub async fn partitions(&self, name: &str) -> Result<Vec<String>> {
        let rt = self.runtime(name)?;
        self.inner.refresh_partitions(rt, true).await?;
        Ok(self
            .inner
            .partition_list(name)
            .into_iter()
            .map(|p| p.key)
            .collect())
    }

    /// Deletes everything stored for one partition of `name`.
    pub async fn remove_partition(&self, name: &str, partition: &str) -> Result<()> {
        self.runtime(name)?;
        self.inner
            .shared
            .store
            .delete_key(&PKey::new(name, partition))
            .await
    }

    /// Runs every due key once (up to four at a time), delivering what they commit.
    /// Fetch failures land in the results; they are never returned as `Err`.
    pub async fn tick(&self, options: TickOptions) -> Result<TickResult> {
        let inner = &self.inner;
        let started = inner.now();
        let deadline = options
            .max_duration
            .map(|d| started.saturating_add(duration_ms(d)));
        let mut keys = Vec::new();
        for (name, rt) in &inner.pollers {
            if options
                .only
                .as_ref()
                .is_some_and(|only| !only.iter().any(|o| o == name))
            {
                continue;
            }
            if let Err(error) = inner.refresh_partitions(rt, false).await {
                tracing::warn!(poller = %name, %error, "partition refresh failed; keeping the previous list");
            }
            keys.extend(
                inner
                    .partition_list(name)
                    .into_iter()
                    .map(|p| (name.clone(), p)),
            );
        }
        let mut result = TickResult::default();
        let cancel = CancellationToken::new();
        let mut runs = futures::stream::iter(keys)
            .map(|(name, partition)| {
                let cancel = cancel.clone();
                async move {
                    if deadline.is_some_and(|d| inner.now() >= d) {
                        return None;
                    }
                    let rt = inner.pollers.get(&name)?;
                    let key = partition.key.clone();
                    let options = RunOptions {
                        force: false,
                        deadline_ms: deadline,
                        cancel,
                    };
                    Some((
                        name,
                        key,
                        runner::run_key(&inner.shared, rt, partition, options).await,
                    ))
                }
            })
            .buffer_unordered(TICK_CONCURRENCY);
        while let Some(run) = runs.next().await {
            let Some((name, partition, outcome)) = run else {
                result.timed_out = true;
                continue;
            };
            match outcome {
                Ok(KeyOutcome::Ran(report)) => {
                    result.delivered += report.delivered;
                    result.polled.extend(report.polled);
                }
                Ok(KeyOutcome::Leased) => result.skipped_leased += 1,
                Ok(KeyOutcome::Paused | KeyOutcome::NotDue) => result.skipped_not_due += 1,
                Ok(KeyOutcome::LeaseLost | KeyOutcome::Aborted) => {}
                Err(error) => result.polled.push(PollResult {
                    poller: name,
                    partition,
                    lane: crate::model::Lane::Live,
                    items: 0,
                    events: 0,
                    delivered: 0,
                    duration_ms: 0,
                    error: Some(error.to_serialized()),
                }),
            }
        }
        // Keys skipped at the deadline set it above; a cycle cut short by it sets it here.
        result.timed_out |= deadline.is_some_and(|d| inner.now() >= d);
        result.duration_ms = inner.now().saturating_sub(started);
        Ok(result)
    }

    /// Starts the daemon: every due key runs (all due keys concurrently), the loop sleeps until
    /// the next key or retry is due, re-reading the store at least every 30 s.
    pub async fn start(&self) -> Result<()> {
        let mut daemon = self.inner.daemon.lock().await;
        {
            let mut status = self
                .inner
                .status
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            match *status {
                Status::Running => return Ok(()),
                Status::Stopping => {
                    return Err(Error::NotRunning {
                        message: "the engine is stopping; start it again once stop() returned"
                            .into(),
                    });
                }
                Status::Idle | Status::Stopped => *status = Status::Running,
            }
        }
        let stop = CancellationToken::new();
        let runs = CancellationToken::new();
        let inner = Arc::clone(&self.inner);
        let task = tokio::spawn(daemon_loop(inner, stop.clone(), runs.clone()));
        *daemon = Some(Daemon { stop, runs, task });
        Ok(())
    }

    /// Stops the daemon. With `drain`, running cycles may finish within `timeout`, then they
    /// are aborted; without it they are aborted at once. Aborted deliveries are not
    /// acknowledged: they are delivered again later. Returns once every task has ended.
    pub async fn stop(&self, options: StopOptions) -> Result<()> {
        let mut daemon = self.inner.daemon.lock().await;
        if let Some(Daemon {
            stop,
            runs,
            mut task,
        }) = daemon.take()
        {
            self.inner.set_status(Status::Stopping);
            stop.cancel();
            if !options.drain {
                runs.cancel();
            }
            let clock = Arc::clone(&self.inner.shared.clock);
            tokio::select! {
                _ = &mut task => {}
                () = clock.sleep(options.timeout) => {
                    runs.cancel();
                    let _ = task.await;
                }
            }
        }
        // Subscriptions end with the engine: their streams return `None`.
        for rt in self.inner.pollers.values() {
            rt.dispatcher.close_subscription();
        }
        self.inner.set_status(Status::Stopped);
        Ok(())
    }

    fn key_for(&self, name: &str, partition: Option<&str>) -> Result<(PKey, &Runtime)> {
        let rt = self.runtime(name)?;
        match (rt.def.partitions.is_some(), partition) {
            (true, None) => Err(Error::config(
                "partition",
                format!("poller '{name}' is partitioned; pass a partition"),
            )),
            (false, Some(p)) if !p.is_empty() => Err(Error::config(
                "partition",
                format!("poller '{name}' is not partitioned; got partition {p:?}"),
            )),
            (_, p) => Ok((PKey::new(name, p.unwrap_or_default()), rt)),
        }
    }

    /// An operator's write (unfenced: it never touches the lease), then a wake-up so a running
    /// daemon looks at the key again.
    async fn admin_write(&self, key: &PKey, patch: &StatePatch) -> Result<()> {
        self.inner
            .shared
            .store
            .save_state_unfenced(key, patch)
            .await?;
        self.inner.wake.notify_one();
        Ok(())
    }

    /// What a key that never ran looks like to this engine: the poller's initial schedule.
    fn initial_state(&self, rt: &Runtime) -> PollerState {
        let now = self.inner.now();
        let mut state = PollerState::zero(now);
        state.schedule = schedule::initial_schedule(&rt.def.schedule, now);
        state
    }

    async fn state_or_initial(&self, key: &PKey, rt: &Runtime) -> Result<PollerState> {
        crate::ops::state_or(&*self.inner.shared.store, key, self.initial_state(rt)).await
    }

    /// How this engine waits for a key's lease in an operation (a replay).
    fn lease_retry(&self) -> crate::ops::LeaseRetry {
        crate::ops::LeaseRetry {
            ttl_ms: self.inner.shared.lease_ttl_ms,
            ..crate::ops::LeaseRetry::default()
        }
    }

    /// Makes a key due now (an open circuit stays open: the run is a half-open probe).
    pub async fn trigger(&self, name: &str, partition: Option<&str>) -> Result<()> {
        let (key, rt) = self.key_for(name, partition)?;
        let store = &*self.inner.shared.store;
        crate::ops::make_due(store, &key, self.inner.now(), self.initial_state(rt)).await?;
        self.inner.wake.notify_one();
        Ok(())
    }

    /// Pauses a key: it is not polled and its outbox is not drained.
    pub async fn pause(&self, name: &str, partition: Option<&str>) -> Result<()> {
        let (key, _) = self.key_for(name, partition)?;
        crate::ops::pause(&*self.inner.shared.store, &key, self.inner.now()).await?;
        self.inner.wake.notify_one();
        Ok(())
    }

    /// Resumes a paused key and makes it due now.
    pub async fn resume(&self, name: &str, partition: Option<&str>) -> Result<()> {
        let (key, rt) = self.key_for(name, partition)?;
        let store = &*self.inner.shared.store;
        crate::ops::resume(store, &key, self.inner.now(), self.initial_state(rt)).await?;
        self.inner.wake.notify_one();
        Ok(())
    }

    /// Moves the live cursor to `to` (a raw API value; `None` = the strategy's beginning) and
    /// makes the key due. With `clear_snapshot`, the item snapshot is dropped too, so every item
    /// is re-emitted as `created` with the same ids as before.
    pub async fn reset_cursor(
        &self,
        name: &str,
        partition: Option<&str>,
        to: Option<&str>,
        clear_snapshot: bool,
    ) -> Result<()> {
        let (key, rt) = self.key_for(name, partition)?;
        let strategy = &rt.def.strategy;
        let cursor = match to {
            Some(raw) => Some(strategy.serialize(&strategy.from_raw(Some(raw))?)),
            None => None,
        };
        let store = &*self.inner.shared.store;
        let now = self.inner.now();
        let initial = self.initial_state(rt);
        crate::ops::reset_cursor(store, &key, cursor, clear_snapshot, now, initial).await?;
        self.inner.wake.notify_one();
        Ok(())
    }

    /// Starts (or replaces) a backfill: the key re-reads history from `from` to `to` on the
    /// backfill lane, after its live lane, until it reaches `to` (or the listing ends). Known,
    /// unchanged items emit nothing unless `force`. Rejected for `snapshot_diff` pollers.
    pub async fn backfill(
        &self,
        name: &str,
        partition: Option<&str>,
        options: BackfillOptions,
    ) -> Result<()> {
        let (key, rt) = self.key_for(name, partition)?;
        let strategy = &rt.def.strategy;
        if strategy.is_full_scan() {
            return Err(Error::config(
                "backfill",
                format!(
                    "poller '{name}' uses `{}`, which lists everything every cycle",
                    strategy.name()
                ),
            ));
        }
        let state = self.state_or_initial(&key, rt).await?;
        let from = strategy.serialize(&strategy.from_raw(options.from.as_deref())?);
        let target = match options.to.as_deref() {
            Some(raw) => Some(strategy.serialize(&strategy.from_raw(Some(raw))?)),
            None => state.lanes.live.as_ref().and_then(|l| l.cursor.clone()),
        };
        let mut lanes = state.lanes.clone();
        lanes.backfill = Some(crate::model::LaneCursor {
            cursor: Some(from),
            target,
            done: Some(false),
            force: Some(options.force),
            ..Default::default()
        });
        let now = self.inner.now();
        let patch = StatePatch {
            lanes: Some(lanes),
            updated_at: Some(now),
            ..StatePatch::default()
        };
        self.admin_write(&key, &patch).await
    }

    /// Re-delivers logged events committed between `from_ms` and `to_ms` (epoch ms, inclusive;
    /// `None`: up to now): copies go to the outbox with their original ids, lane `replay` and
    /// fresh sequences, and are delivered on the key's next drain. An event still pending in the
    /// outbox is replaced by its copy (same id), not duplicated. Needs the poller's `log`.
    /// Returns how many events were queued.
    pub async fn replay(
        &self,
        name: &str,
        partition: Option<&str>,
        from_ms: i64,
        to_ms: Option<i64>,
    ) -> Result<u64> {
        let (key, rt) = self.key_for(name, partition)?;
        if rt.def.log_retention.is_none() {
            return Err(Error::ReplayUnavailable {
                poller: name.to_owned(),
            });
        }
        let shared = &self.inner.shared;
        let replayed = crate::ops::replay(
            &*shared.store,
            &*shared.clock,
            &key,
            &shared.instance_id,
            self.lease_retry(),
            (from_ms, to_ms),
            self.initial_state(rt),
        )
        .await?;
        self.inner.wake.notify_one();
        Ok(replayed)
    }

    /// Parked rows of a key (poison and invalid), oldest first.
    pub async fn list_parked(
        &self,
        name: &str,
        partition: Option<&str>,
        query: ParkedQuery,
    ) -> Result<Vec<ParkedRow>> {
        let (key, _) = self.key_for(name, partition)?;
        self.inner.shared.store.list_parked(&key, query).await
    }

    /// Moves parked poison events back to the outbox (their hold released) and wakes the key.
    pub async fn retry_parked(
        &self,
        name: &str,
        partition: Option<&str>,
        ids: &[String],
    ) -> Result<u64> {
        let (key, rt) = self.key_for(name, partition)?;
        let moved = rt.dispatcher.retry_parked(&key, ids).await?;
        self.inner.wake.notify_one();
        Ok(moved)
    }

    /// Deletes parked rows (releasing their hold).
    pub async fn discard_parked(
        &self,
        name: &str,
        partition: Option<&str>,
        ids: &[String],
    ) -> Result<u64> {
        let (key, rt) = self.key_for(name, partition)?;
        let removed = rt.dispatcher.discard_parked(&key, ids).await?;
        self.inner.wake.notify_one();
        Ok(removed)
    }

    /// A plain, serializable report of every active `(poller, partition)`.
    pub async fn inspect(&self) -> Result<InspectReport> {
        let inner = &self.inner;
        let store = &inner.shared.store;
        let now = inner.now();
        let mut pollers = Vec::new();
        for (name, rt) in &inner.pollers {
            if let Err(error) = inner.refresh_partitions(rt, false).await {
                tracing::warn!(poller = %name, %error, "partition refresh failed; keeping the previous list");
            }
            for partition in inner.partition_list(name) {
                let key = PKey::new(name.clone(), partition.key.clone());
                let strategy = &rt.def.strategy;
                let lag = |text: &str, now: i64| {
                    let cursor = strategy.deserialize(text).ok()?;
                    strategy.lag_ms(&cursor, now)
                };
                let key_report =
                    crate::ops::inspect_key(&**store, &key, now, self.initial_state(rt), lag)
                        .await?;
                pollers.push(PollerInspect {
                    key: key_report,
                    delivery: rt.dispatcher.counters(&partition.key),
                });
            }
        }
        Ok(InspectReport {
            instance_id: inner.shared.instance_id.clone(),
            status: self.status(),
            generated_at: now,
            pollers,
        })
    }
}

impl Inner {
    fn now(&self) -> i64 {
        self.shared.clock.now_ms()
    }

    fn set_status(&self, status: Status) {
        *self.status.lock().unwrap_or_else(PoisonError::into_inner) = status;
    }

    /// The partitions to run: the cached list; for a partitioned poller whose list never loaded
    /// (the first listing failed or was invalid) none at all, never the unpartitioned `""`.
    fn partition_list(&self, name: &str) -> Vec<Partition> {
        let cache = self
            .partitions
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match cache.get(name) {
            Some(entry) => entry.list.clone(),
            None if self
                .pollers
                .get(name)
                .is_some_and(|rt| rt.def.partitions.is_some()) =>
            {
                Vec::new()
            }
            None => vec![Partition::new("")],
        }
    }

    /// Refreshes a poller's partitions when the refresh period passed (or `force`). A failing
    /// or invalid list keeps the previous one.
    async fn refresh_partitions(&self, rt: &Runtime, force: bool) -> Result<()> {
        let Some(source) = &rt.def.partitions else {
            return Ok(());
        };
        let now = self.now();
        let due = {
            let cache = self
                .partitions
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            cache.get(&rt.def.name).is_none_or(|entry| {
                force
                    || now.saturating_sub(entry.refreshed_at)
                        >= duration_ms(rt.def.partitions_refresh)
            })
        };
        if !due {
            return Ok(());
        }
        let listed = source.list().await.map_err(|error| {
            Error::config(
                "partitions",
                format!(
                    "poller '{}': listing partitions failed: {error}",
                    rt.def.name
                ),
            )
        })?;
        let mut seen = HashSet::new();
        if listed.is_empty() {
            return Err(Error::config(
                "partitions",
                format!("poller '{}': the partition list is empty", rt.def.name),
            ));
        }
        for partition in &listed {
            if partition.key.is_empty() || !seen.insert(partition.key.clone()) {
                return Err(Error::config(
                    "partitions",
                    format!(
                        "poller '{}': partition keys must be non-empty and unique, got {:?}",
                        rt.def.name, partition.key
                    ),
                ));
            }
        }
        let mut cache = self
            .partitions
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        cache.insert(
            rt.def.name.clone(),
            PartitionCache {
                list: listed,
                refreshed_at: now,
            },
        );
        Ok(())
    }

    /// When a key should next run, from its state and a run's outcome.
    async fn next_due(&self, rt: &Runtime, key: &PKey, retry_at: Option<i64>) -> i64 {
        let now = self.now();
        let state = match self.shared.store.load_state(key).await {
            Ok(state) => state,
            Err(error) => {
                tracing::warn!(%key, %error, "loading state failed; retrying after schedule.min");
                return now.saturating_add(duration_ms(rt.def.schedule.min));
            }
        };
        let Some(state) = state else { return now };
        if state.paused {
            return now.saturating_add(duration_ms(MAX_SLEEP));
        }
        let due = schedule::key_due_at(&rt.def, &state, now);
        let retry = if rt.dispatcher.has_consumer() {
            retry_at
        } else {
            None
        };
        runner::min_opt(Some(due), retry).unwrap_or(due)
    }
}

/// The daemon: runs due keys, sleeps until the next is due (at most 30 s), wakes early on
/// `on`, `subscribe`, `trigger`, `resume` and parked retries.
async fn daemon_loop(inner: Arc<Inner>, stop: CancellationToken, runs: CancellationToken) {
    let mut due: HashMap<(String, String), i64> = HashMap::new();
    let mut in_flight: tokio::task::JoinSet<((String, String), i64)> = tokio::task::JoinSet::new();
    let mut running: HashSet<(String, String)> = HashSet::new();
    let mut reread_at = inner.now();
    loop {
        if stop.is_cancelled() {
            break;
        }
        let now = inner.now();
        if now >= reread_at {
            // Other processes change keys too (a CLI trigger, another engine's resume): re-read
            // every key's state at least every MAX_SLEEP instead of trusting cached due times.
            due.clear();
            reread_at = now.saturating_add(duration_ms(MAX_SLEEP));
        }
        let mut active = HashSet::new();
        for (name, rt) in &inner.pollers {
            if let Err(error) = inner.refresh_partitions(rt, false).await {
                tracing::warn!(poller = %name, %error, "partition refresh failed; keeping the previous list");
            }
            for partition in inner.partition_list(name) {
                let id = (name.clone(), partition.key.clone());
                active.insert(id.clone());
                if running.contains(&id) {
                    continue;
                }
                let at = match due.get(&id) {
                    Some(at) => *at,
                    None => {
                        let at = inner
                            .next_due(rt, &PKey::new(name.clone(), partition.key.clone()), None)
                            .await;
                        due.insert(id.clone(), at);
                        at
                    }
                };
                if at <= now {
                    running.insert(id.clone());
                    let (inner, cancel) = (Arc::clone(&inner), runs.clone());
                    in_flight.spawn(async move {
                        let next = run_one(&inner, &id.0, partition, cancel).await;
                        (id, next)
                    });
                }
            }
        }
        due.retain(|id, _| active.contains(id));
        let now = inner.now();
        let next = due
            .iter()
            .filter(|(id, _)| !running.contains(*id))
            .map(|(_, at)| *at)
            .min()
            .unwrap_or(i64::MAX)
            .min(now.saturating_add(duration_ms(MAX_SLEEP)));
        let clock = Arc::clone(&inner.shared.clock);
        tokio::select! {
            () = stop.cancelled() => break,
            () = clock.sleep_until(next) => {}
            () = inner.wake.notified() => {
                // Something changed (a consumer attached, a trigger): re-read every key.
                due.clear();
            }
            Some(done) = in_flight.join_next(), if !in_flight.is_empty() => {
                if let Ok((id, at)) = done {
                    running.remove(&id);
                    due.insert(id, at);
                }
            }
        }
    }
    // Stopping: let running cycles finish (they are cancelled by `stop` when not draining or
    // after the timeout), so no task outlives the daemon.
    while in_flight.join_next().await.is_some() {}
}

/// Runs one key in the daemon and returns when it is next due.
async fn run_one(
    inner: &Inner,
    name: &str,
    partition: Partition,
    cancel: CancellationToken,
) -> i64 {
    let Some(rt) = inner.pollers.get(name) else {
        return i64::MAX;
    };
    let key = PKey::new(name, partition.key.clone());
    let options = RunOptions {
        force: false,
        deadline_ms: None,
        cancel,
    };
    let outcome = runner::run_key(&inner.shared, rt, partition, options).await;
    let now = inner.now();
    match outcome {
        Ok(KeyOutcome::Leased) => now.saturating_add((inner.shared.lease_ttl_ms / 2).max(1_000)),
        Ok(KeyOutcome::Paused) => now.saturating_add(duration_ms(MAX_SLEEP)),
        Ok(KeyOutcome::Ran(report)) => inner.next_due(rt, &key, report.next_retry_at).await,
        Ok(KeyOutcome::NotDue | KeyOutcome::LeaseLost | KeyOutcome::Aborted) => {
            inner.next_due(rt, &key, None).await
        }
        Err(error) => {
            tracing::warn!(%key, %error, "run failed; retrying after schedule.min");
            now.saturating_add(duration_ms(rt.def.schedule.min))
        }
    }
}
