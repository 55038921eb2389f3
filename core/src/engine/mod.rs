//! The engine: pollers, consumers, `tick()` for one-shot runs, `start()`/`stop()`
//! for a daemon, operations and `inspect()`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use serde::Serialize;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::clock::{SystemClock, duration_ms};
use crate::delivery::{DEFAULT_DISPATCH_BATCH_SIZE, Handler, Partition, Subscription, Unsubscribe};
use crate::error::{Error, Result};
use crate::model::PKey;
use crate::rng::SystemRng;
use crate::runner::{self, KeyOutcome, PollResult, RunOptions, Runtime, Shared};
use crate::store::Store;

mod builder;
mod daemon;
mod inspect;
mod operations;

pub use builder::EngineBuilder;
use daemon::daemon_loop;
pub use inspect::{InspectReport, PollerInspect};
pub use operations::BackfillOptions;

/// The daemon re-reads the store at least this often.
pub(crate) const MAX_SLEEP: Duration = Duration::from_secs(30);
/// How many keys [`Engine::tick`] runs at once unless [`TickOptions::concurrency`] says otherwise.
pub(crate) const DEFAULT_TICK_CONCURRENCY: usize = 4;
/// How many keys the daemon runs at once unless
/// [`EngineBuilder::max_concurrent_keys`] says otherwise.
pub(crate) const DEFAULT_MAX_CONCURRENT_KEYS: usize = 64;

/// Where the engine is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
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

/// The cached partition list of a poller.
struct PartitionCache {
    list: Vec<Partition>,
    refreshed_at: i64,
    /// Grows with every refresh, so the daemon sees a new list without comparing lists.
    generation: u64,
}

/// What operations asked the daemon to look at again since it last looked.
#[derive(Default)]
struct Wakes {
    /// Keys an operation changed (a trigger, a pause, a reset, a parked retry).
    keys: HashSet<PKey>,
    /// Pollers whose every key should run (a consumer attached).
    pollers: HashSet<String>,
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
    /// Wakes the daemon; what to look at is in `wakes`.
    wake: Notify,
    wakes: Mutex<Wakes>,
    max_concurrent_keys: usize,
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

/// Options of [`Engine::tick`]: `TickOptions::default()`, then the setters.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct TickOptions {
    /// Stop starting new keys and pages after this long (a running page is never interrupted).
    pub max_duration: Option<Duration>,
    /// Only these pollers (by name; a name the engine does not know fails the tick with
    /// [`Error::UnknownPoller`]).
    pub only: Option<Vec<String>>,
    /// Only this partition of the pollers run (`""` is the key of an unpartitioned poller).
    pub partition: Option<String>,
    /// How many keys run at once (default 4; at least 1).
    pub concurrency: Option<usize>,
}

impl TickOptions {
    /// Stops starting new keys and pages after `duration`.
    #[must_use]
    pub fn max_duration(mut self, duration: Duration) -> Self {
        self.max_duration = Some(duration);
        self
    }

    /// Runs only these pollers.
    #[must_use]
    pub fn only(mut self, pollers: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.only = Some(pollers.into_iter().map(Into::into).collect());
        self
    }

    /// Runs only this partition of the pollers run (with [`only`](Self::only), one key).
    #[must_use]
    pub fn partition(mut self, partition: impl Into<String>) -> Self {
        self.partition = Some(partition.into());
        self
    }

    /// Runs up to `keys` keys at once (default 4). With many
    /// partitions and a store or API that answers slowly, more keys at once shorten the tick;
    /// each key in flight holds its page in memory. `0` makes `tick` fail with a `Config` error
    /// naming `tick.concurrency`.
    #[must_use]
    pub fn concurrency(mut self, keys: usize) -> Self {
        self.concurrency = Some(keys);
        self
    }
}

/// What one `tick()` did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
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

/// Options of [`Engine::stop`]: `StopOptions::default()` (drain, up to 30 s), then the setters.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
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

impl StopOptions {
    /// Lets running cycles finish (`true`, the default) or aborts them (`false`).
    #[must_use]
    pub fn drain(mut self, drain: bool) -> Self {
        self.drain = drain;
        self
    }

    /// How long to wait for running cycles when draining.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
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
            source_prefix: crate::poller::DEFAULT_SOURCE_PREFIX.to_owned(),
            dispatch_batch_size: DEFAULT_DISPATCH_BATCH_SIZE,
            max_concurrent_keys: DEFAULT_MAX_CONCURRENT_KEYS,
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

    /// The names of this engine's pollers, sorted.
    pub fn poller_names(&self) -> Vec<String> {
        self.inner.pollers.keys().cloned().collect()
    }

    fn runtime(&self, name: &str) -> Result<&Runtime> {
        self.inner
            .pollers
            .get(name)
            .ok_or_else(|| Error::UnknownPoller {
                name: name.to_owned(),
                known: self.poller_names(),
            })
    }

    /// Attaches the handler of poller `name` (one consumer per poller: a second `on` or
    /// `subscribe` is a `Config` error). Events committed while no consumer was attached are
    /// delivered on the next run.
    pub fn on(&self, name: &str, handler: impl Handler) -> Result<Unsubscribe> {
        let handle = self.runtime(name)?.dispatcher.on(handler)?;
        self.inner.wake_poller(name);
        Ok(handle)
    }

    /// Attaches a pull-based stream of poller `name`'s events.
    pub fn subscribe(&self, name: &str) -> Result<Subscription> {
        let subscription = self.runtime(name)?.dispatcher.subscribe()?;
        self.inner.wake_poller(name);
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

    /// Runs every due key once ([`TickOptions::concurrency`] at a time, four by default),
    /// delivering what they commit. Fetch failures land in the results; they are never returned
    /// as `Err`.
    pub async fn tick(&self, options: TickOptions) -> Result<TickResult> {
        let concurrency = options.concurrency.unwrap_or(DEFAULT_TICK_CONCURRENCY);
        if concurrency == 0 {
            return Err(Error::config(
                "tick.concurrency",
                "must be at least 1, got 0",
            ));
        }
        for name in options.only.iter().flatten() {
            self.runtime(name)?;
        }
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
                    .filter(|p| options.partition.as_ref().is_none_or(|only| *only == p.key))
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
                        precheck: true,
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
            .buffer_unordered(concurrency);
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
        let generation = cache.get(&rt.def.name).map_or(1, |c| c.generation + 1);
        cache.insert(
            rt.def.name.clone(),
            PartitionCache {
                list: listed,
                refreshed_at: now,
                generation,
            },
        );
        Ok(())
    }
}
