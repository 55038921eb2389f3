//! The chaos harness: engines crash at the kill points K1–K7 ([`KillPoint`]) while the API changes,
//! fresh instances carry on over the same store, and once everything is quiet an invariant
//! checker proves G1 (convergence, lifecycle, no phantom versions, retained payloads), G2, G3,
//! G4, G5, G7, G9 and liveness from what the consumer received.
//!
//! ```text
//! let report = run_chaos(ChaosOptions::new(7, store).strategy(ChaosStrategy::Token)).await?;
//! assert_chaos_report(&report);
//! ```
//!
//! Everything is deterministic: a [`ManualClock`](watukuy_core::clock::ManualClock) and independent [`SeededRng`] streams (forks of
//! the seed) for kills, mutations, clock advances and each engine instance. On the reference
//! store the same options give the same report, trace included; a failing seed prints the exact
//! command that replays it.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde_json::{Value, json};
use watukuy_core::cursor;
use watukuy_core::{
    DeliveryOptions, Engine, Event, EventType, HandlerContext, HandlerError, HandlerResult, Lane,
    TickOptions, TickResult,
    backoff::Backoff,
    poller::Retain,
    rng::SeededRng,
    store::{PKey, Store},
};

use crate::faulty::{FaultyStore, KillPoint, KillSwitch, LeaseAudit};
use crate::world::{POLLER, StrategyKind, World};

/// The lease TTL of every chaos engine: 10 s.
pub const LEASE_TTL: Duration = Duration::from_secs(10);
/// How far the clock moves when a crashed instance is replaced: past the lease TTL.
pub const RESTART_ADVANCE: Duration = Duration::from_secs(11);
/// How far the clock moves before each quiescence tick: past the schedule's `max` (30 s), so
/// every quiescence tick polls.
pub const QUIESCENCE_ADVANCE: Duration = Duration::from_secs(31);
/// The minimum number of quiescence ticks.
pub const QUIESCENCE_MIN_TICKS: u64 = 10;
/// The page size of the chaos API.
pub const PAGE_SIZE: usize = 25;
/// The dispatcher's slice size in chaos engines.
pub const DISPATCH_BATCH_SIZE: usize = 20;
/// How many trace lines a report keeps (the last ones).
pub const TRACE_LINES: usize = 200;
/// The environment variable that sets how many seeds each chaos case runs.
pub const SEEDS_ENV: &str = "WATUKUY_CHAOS_SEEDS";

/// The cursor strategies a chaos run can poll with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChaosStrategy {
    /// `timestamp` on `updatedAt` (version `updatedAt`, tie-break `id`, lag 1 s).
    Timestamp,
    /// `snapshot_diff`: a full listing every cycle, so removals become `deleted`.
    SnapshotDiff,
    /// `token` over the fake's `/token` listing.
    Token,
    /// `page` over `/page`; its API is append-only (no removals).
    Page,
}

impl ChaosStrategy {
    /// Every strategy, in the order the harness runs them.
    pub const ALL: [ChaosStrategy; 4] = [
        ChaosStrategy::Timestamp,
        ChaosStrategy::SnapshotDiff,
        ChaosStrategy::Token,
        ChaosStrategy::Page,
    ];

    /// The name in reports and replay hints (`timestamp`, `snapshotDiff`, `token`, `page`: the
    /// TypeScript harness's spelling, so seeds compare across both).
    pub fn name(self) -> &'static str {
        match self {
            ChaosStrategy::Timestamp => "timestamp",
            ChaosStrategy::SnapshotDiff => "snapshotDiff",
            ChaosStrategy::Token => "token",
            ChaosStrategy::Page => "page",
        }
    }

    /// The world strategy it polls with.
    pub fn kind(self) -> StrategyKind {
        match self {
            ChaosStrategy::Timestamp => StrategyKind::Timestamp,
            ChaosStrategy::SnapshotDiff => StrategyKind::SnapshotDiff,
            ChaosStrategy::Token => StrategyKind::Token,
            ChaosStrategy::Page => StrategyKind::Page,
        }
    }

    /// Whether removals are reported as `deleted`.
    pub fn sees_deletes(self) -> bool {
        self == ChaosStrategy::SnapshotDiff
    }

    /// Whether the API may remove items (all but `page`, which is append-only).
    pub fn allows_removals(self) -> bool {
        self != ChaosStrategy::Page
    }
}

impl fmt::Display for ChaosStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ChaosStrategy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "timestamp" => Ok(ChaosStrategy::Timestamp),
            "snapshotDiff" | "snapshot_diff" | "snapshot-diff" => Ok(ChaosStrategy::SnapshotDiff),
            "token" => Ok(ChaosStrategy::Token),
            "page" => Ok(ChaosStrategy::Page),
            other => Err(format!(
                "unknown strategy {other:?}; expected timestamp, snapshotDiff, token or page"
            )),
        }
    }
}

/// The options of a chaos run.
#[derive(Clone)]
pub struct ChaosOptions {
    /// The seed every random stream forks from.
    pub seed: u32,
    /// Random steps before quiescence (default 150); quiescence is bounded by
    /// `max(steps, 30)` ticks.
    pub steps: usize,
    /// The cursor strategy (default `timestamp`).
    pub strategy: ChaosStrategy,
    /// The kill points that may be armed (default all; empty disables kills).
    pub kill_points: Vec<KillPoint>,
    /// The probability that a step arms a random kill point (default 0.3).
    pub kill_probability: f64,
    /// At most this many API changes per step (default 3).
    pub max_mutations_per_step: u32,
    /// Items in the API at the start (default 20).
    pub initial_items: usize,
    /// Delivery concurrency (default 3).
    pub concurrency: usize,
    /// Delivers with [`DeliveryOptions::ack_window`] of this many events (default `None`: no
    /// window). The G9 check then allows `max(concurrency, window)` duplicates per crash.
    pub ack_window: Option<usize>,
    /// What the snapshot retains (default `Hash`; `Payload` checks `previous` and deleted data).
    pub retain: Retain,
    /// Runs the pollers with [`PollerBuilder::overlap_delivery`](watukuy_core::PollerBuilder::overlap_delivery)
    /// (default `false`).
    pub overlap_delivery: bool,
    /// The API answers with `ETag`s and the pollers send `If-None-Match` from the validators
    /// committed with their pages (default `false`): a crash between a `200` and its page's
    /// commit must not turn the next request into a `304` that hides the change.
    pub etags: bool,
    /// The store, shared by every instance of the run.
    pub store: Arc<dyn Store>,
    /// How the replay command names the store (`memory`, `sqlite:<path>`, `postgres`, `redis`).
    pub store_label: String,
    /// Prints every trace line to stderr as it happens.
    pub trace: bool,
}

impl fmt::Debug for ChaosOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChaosOptions")
            .field("seed", &self.seed)
            .field("steps", &self.steps)
            .field("strategy", &self.strategy)
            .field("kill_points", &self.kill_points)
            .field("kill_probability", &self.kill_probability)
            .field("max_mutations_per_step", &self.max_mutations_per_step)
            .field("initial_items", &self.initial_items)
            .field("concurrency", &self.concurrency)
            .field("ack_window", &self.ack_window)
            .field("retain", &self.retain)
            .field("overlap_delivery", &self.overlap_delivery)
            .field("etags", &self.etags)
            .field("store_label", &self.store_label)
            .field("trace", &self.trace)
            .finish_non_exhaustive()
    }
}

/// Why a chaos run could not start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChaosError {
    /// An option is out of range; the message names it.
    InvalidOption {
        /// The option's name.
        option: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// The world or an engine could not be built.
    Setup(String),
}

impl fmt::Display for ChaosError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChaosError::InvalidOption { option, message } => {
                write!(f, "invalid chaos option `{option}`: {message}")
            }
            ChaosError::Setup(message) => write!(f, "chaos setup failed: {message}"),
        }
    }
}

impl std::error::Error for ChaosError {}

const DEFAULT_STEPS: usize = 150;
const DEFAULT_KILL_PROBABILITY: f64 = 0.3;
const DEFAULT_MUTATIONS: u32 = 3;
const DEFAULT_ITEMS: usize = 20;
const DEFAULT_CONCURRENCY: usize = 3;
/// How long an ack waits for its window to fill before it is flushed anyway (`ack_window`).
const ACK_WINDOW_DELAY: Duration = Duration::from_millis(50);

/// Builder setters that replace one field each: `name: Type;` makes
/// `#[must_use] pub fn name(mut self, name: Type) -> Self`, with the doc comment given.
macro_rules! setters {
    ($($(#[doc = $doc:literal])* $field:ident: $ty:ty;)*) => {
        $(
            $(#[doc = $doc])*
            #[must_use]
            pub fn $field(mut self, $field: $ty) -> Self {
                self.$field = $field;
                self
            }
        )*
    };
}

impl ChaosOptions {
    /// The default options for `seed`, over `store`: 150 steps of the `timestamp` strategy,
    /// every kill point with probability 0.3, up to 3 mutations per step, 20 initial items,
    /// delivery concurrency 3, hashes retained (no payloads), no overlapped delivery, no ETags.
    pub fn new(seed: u32, store: Arc<dyn Store>) -> Self {
        Self {
            seed,
            steps: DEFAULT_STEPS,
            strategy: ChaosStrategy::Timestamp,
            kill_points: KillPoint::ALL.to_vec(),
            kill_probability: DEFAULT_KILL_PROBABILITY,
            max_mutations_per_step: DEFAULT_MUTATIONS,
            initial_items: DEFAULT_ITEMS,
            concurrency: DEFAULT_CONCURRENCY,
            ack_window: None,
            retain: Retain::Hash,
            overlap_delivery: false,
            etags: false,
            store,
            store_label: "memory".to_owned(),
            trace: false,
        }
    }

    setters! {
        /// Sets `steps`.
        steps: usize;
        /// Sets `strategy`.
        strategy: ChaosStrategy;
        /// Sets `kill_probability`.
        kill_probability: f64;
        /// Sets `max_mutations_per_step`.
        max_mutations_per_step: u32;
        /// Sets `initial_items`.
        initial_items: usize;
        /// Sets the delivery `concurrency`.
        concurrency: usize;
        /// Sets `retain`.
        retain: Retain;
        /// Sets `overlap_delivery`.
        overlap_delivery: bool;
        /// Sets `ack_window` (the most acks flushed together; `None`: no window).
        ack_window: Option<usize>;
        /// Sets `etags`.
        etags: bool;
        /// Prints the trace as it happens.
        trace: bool;
    }

    /// Sets `kill_points` (empty disables kills).
    #[must_use]
    pub fn kill_points(mut self, points: impl IntoIterator<Item = KillPoint>) -> Self {
        self.kill_points = points.into_iter().collect();
        self
    }

    /// Sets how the replay command names the store.
    #[must_use]
    pub fn store_label(mut self, label: impl Into<String>) -> Self {
        self.store_label = label.into();
        self
    }

    /// Checks every option's range.
    pub fn validate(&self) -> Result<(), ChaosError> {
        let invalid = |option: &'static str, message: String| {
            Err(ChaosError::InvalidOption { option, message })
        };
        if self.steps == 0 || self.steps > 100_000 {
            return invalid("steps", format!("must be 1 to 100000, got {}", self.steps));
        }
        if !self.kill_probability.is_finite() || !(0.0..=1.0).contains(&self.kill_probability) {
            return invalid(
                "kill_probability",
                format!("must be within [0, 1], got {}", self.kill_probability),
            );
        }
        let distinct: BTreeSet<KillPoint> = self.kill_points.iter().copied().collect();
        if distinct.len() != self.kill_points.len() {
            return invalid(
                "kill_points",
                format!("lists a kill point twice: {:?}", self.kill_points),
            );
        }
        if self.max_mutations_per_step > 1_000 {
            return invalid(
                "max_mutations_per_step",
                format!("must be at most 1000, got {}", self.max_mutations_per_step),
            );
        }
        if self.initial_items > 10_000 {
            return invalid(
                "initial_items",
                format!("must be at most 10000, got {}", self.initial_items),
            );
        }
        if self.concurrency == 0 || self.concurrency > 64 {
            return invalid(
                "concurrency",
                format!("must be 1 to 64, got {}", self.concurrency),
            );
        }
        if self.ack_window.is_some_and(|w| w == 0 || w > 10_000) {
            return invalid(
                "ack_window",
                format!("must be 1 to 10000, got {:?}", self.ack_window),
            );
        }
        if self.store_label.trim().is_empty() {
            return invalid("store_label", "must not be empty".to_owned());
        }
        Ok(())
    }

    /// The options that differ from the defaults, as command-line flags of the chaos binary
    /// (seed, strategy and steps always included).
    pub fn flags(&self) -> String {
        let mut flags = vec![
            format!("--seed {}", self.seed),
            format!("--strategy {}", self.strategy),
            format!("--steps {}", self.steps),
        ];
        if self.kill_points != KillPoint::ALL {
            let names: Vec<&str> = self.kill_points.iter().map(|k| k.name()).collect();
            flags.push(format!(
                "--kill-points {}",
                if names.is_empty() {
                    "none".to_owned()
                } else {
                    names.join(",")
                }
            ));
        }
        if self.kill_probability.to_bits() != DEFAULT_KILL_PROBABILITY.to_bits() {
            flags.push(format!("--kill-probability {}", self.kill_probability));
        }
        if self.max_mutations_per_step != DEFAULT_MUTATIONS {
            flags.push(format!("--mutations {}", self.max_mutations_per_step));
        }
        if self.initial_items != DEFAULT_ITEMS {
            flags.push(format!("--items {}", self.initial_items));
        }
        if self.concurrency != DEFAULT_CONCURRENCY {
            flags.push(format!("--concurrency {}", self.concurrency));
        }
        if self.retain == Retain::Payload {
            flags.push("--retain payload".to_owned());
        }
        if self.overlap_delivery {
            flags.push("--overlap-delivery".to_owned());
        }
        if self.etags {
            flags.push("--etags".to_owned());
        }
        if let Some(window) = self.ack_window {
            flags.push(format!("--ack-window {window}"));
        }
        flags.join(" ")
    }

    /// The delivery options of every instance's poller.
    pub fn delivery(&self) -> DeliveryOptions {
        let delivery = DeliveryOptions::default()
            .attempts(3)
            .backoff(Backoff::new(
                Duration::from_secs(1),
                2.0,
                Duration::from_secs(4),
            ))
            .concurrency(self.concurrency);
        match self.ack_window {
            Some(window) => delivery.ack_window(window, ACK_WINDOW_DELAY),
            None => delivery,
        }
    }

    /// The exact command that replays this run (with its trace), and the same run in Rust.
    pub fn replay_command(&self) -> String {
        let store = match self.store_label.as_str() {
            label if label.starts_with("sqlite:") => label.to_owned(),
            label if label.starts_with("sqlite") => "sqlite:/tmp/watukuy-chaos.db".to_owned(),
            label if label.starts_with("postgres") => "postgres".to_owned(),
            label if label.starts_with("redis") => "redis".to_owned(),
            _ => "memory".to_owned(),
        };
        let mut rust = format!(
            "run_chaos(ChaosOptions::new({}, store).strategy(ChaosStrategy::{:?}).steps({})",
            self.seed, self.strategy, self.steps
        );
        if self.kill_points != KillPoint::ALL {
            let points: Vec<String> = self
                .kill_points
                .iter()
                .map(|k| format!("KillPoint::{k:?}"))
                .collect();
            rust.push_str(&format!(".kill_points([{}])", points.join(", ")));
        }
        if self.kill_probability.to_bits() != DEFAULT_KILL_PROBABILITY.to_bits() {
            rust.push_str(&format!(".kill_probability({:?})", self.kill_probability));
        }
        if self.max_mutations_per_step != DEFAULT_MUTATIONS {
            rust.push_str(&format!(
                ".max_mutations_per_step({})",
                self.max_mutations_per_step
            ));
        }
        if self.initial_items != DEFAULT_ITEMS {
            rust.push_str(&format!(".initial_items({})", self.initial_items));
        }
        if self.concurrency != DEFAULT_CONCURRENCY {
            rust.push_str(&format!(".concurrency({})", self.concurrency));
        }
        if self.retain == Retain::Payload {
            rust.push_str(".retain(Retain::Payload)");
        }
        if self.overlap_delivery {
            rust.push_str(".overlap_delivery(true)");
        }
        if self.etags {
            rust.push_str(".etags(true)");
        }
        if let Some(window) = self.ack_window {
            rust.push_str(&format!(".ack_window(Some({window}))"));
        }
        rust.push_str(".trace(true))");
        format!(
            "cargo run -p watukuy-examples --bin chaos -- --store {store} {} --trace\n  (in Rust: {rust}, store = {})",
            self.flags(),
            self.store_label
        )
    }
}

/// What the API went through.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MutationCounts {
    /// Items added.
    pub added: u64,
    /// Items updated.
    pub updated: u64,
    /// Items removed.
    pub removed: u64,
}

/// The result of a chaos run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChaosReport {
    /// The seed.
    pub seed: u32,
    /// The random steps.
    pub steps: usize,
    /// The strategy.
    pub strategy: ChaosStrategy,
    /// The run's options as flags of the chaos binary.
    pub options: String,
    /// The command that replays the run.
    pub replay: String,
    /// How many times each kill point fired (every point listed).
    pub kills: BTreeMap<KillPoint, u64>,
    /// Instances replaced after a crash.
    pub restarts: u64,
    /// What the API went through.
    pub mutations: MutationCounts,
    /// Events the consumer received (duplicates included).
    pub delivered: u64,
    /// Distinct event ids received.
    pub unique_events: u64,
    /// `delivered − unique_events`.
    pub duplicates: u64,
    /// Parked rows after quiescence.
    pub parked: u64,
    /// Ticks quiescence took.
    pub quiescence_ticks: u64,
    /// Leases granted over the run (the lease audit saw every one).
    pub lease_acquisitions: u64,
    /// Writes the lease audit made with a superseded or released lease (each must be rejected).
    pub lease_probes: u64,
    /// Requests the API answered `304 Not Modified` (only with `etags`).
    pub not_modified: u64,
    /// The most events one accepted `ack_events` call carried.
    pub largest_ack: usize,
    /// The most events delivered and not acknowledged at once under the run's delivery options
    /// ([`DeliveryOptions::unacked_bound`]): the duplicates one crash may cause.
    pub unacked_bound: usize,
    /// Every broken guarantee, each message starting with the guarantee (`G1: ...`).
    pub violations: Vec<String>,
    /// The last [`TRACE_LINES`] trace lines.
    pub trace: Vec<String>,
}

impl ChaosReport {
    /// True when no guarantee was broken.
    pub fn is_ok(&self) -> bool {
        self.violations.is_empty()
    }

    /// How many distinct kill points fired at least once.
    pub fn kill_points_fired(&self) -> usize {
        self.kills.values().filter(|n| **n > 0).count()
    }

    /// Store-level kills (process deaths), every kill point but `handler`.
    pub fn crashes(&self) -> u64 {
        self.kills
            .iter()
            .filter(|(k, _)| k.is_crash())
            .map(|(_, n)| n)
            .sum()
    }

    /// A one-line summary.
    pub fn describe(&self) -> String {
        let kills: Vec<String> = self
            .kills
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        format!(
            "chaos seed={} strategy={} steps={}: {} violation(s); kills {} [{}]; restarts {}; mutations +{} ~{} -{}; delivered {} (unique {}, duplicates {}); parked {}; quiescence {} ticks; leases {} (probes {})",
            self.seed,
            self.strategy,
            self.steps,
            self.violations.len(),
            self.kills.values().sum::<u64>(),
            kills.join(", "),
            self.restarts,
            self.mutations.added,
            self.mutations.updated,
            self.mutations.removed,
            self.delivered,
            self.unique_events,
            self.duplicates,
            self.parked,
            self.quiescence_ticks,
            self.lease_acquisitions,
            self.lease_probes
        )
    }

    /// Why the report fails: its violations, the replay command and the last 30 trace lines;
    /// `None` when it passed.
    pub fn failure(&self) -> Option<String> {
        if self.is_ok() {
            return None;
        }
        let start = self.trace.len().saturating_sub(30);
        Some(format!(
            "{}\nviolations:\n  {}\nreplay with:\n  {}\nlast trace lines:\n  {}",
            self.describe(),
            self.violations.join("\n  "),
            self.replay,
            self.trace[start..].join("\n  ")
        ))
    }
}

impl fmt::Display for ChaosReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

/// Panics unless the report is free of violations, printing them with the exact replay command
/// and the last 30 trace lines.
pub fn assert_chaos_report(report: &ChaosReport) {
    if let Some(failure) = report.failure() {
        panic!("{failure}");
    }
}

/// How many seeds each chaos case runs: [`SEEDS_ENV`] when set to a positive number, else
/// `default`.
pub fn seeds_from_env(default: u32) -> u32 {
    std::env::var(SEEDS_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(default)
}

// ----- the run -----

/// Keeps the last [`TRACE_LINES`] lines (and prints each when asked).
struct Trace {
    lines: VecDeque<String>,
    echo: bool,
}

impl Trace {
    fn push(&mut self, line: String) {
        if self.echo {
            eprintln!("[chaos] {line}");
        }
        if self.lines.len() == TRACE_LINES {
            self.lines.pop_front();
        }
        self.lines.push_back(line);
    }
}

/// One engine instance (one "process").
struct Instance {
    name: String,
    engine: Engine,
    store: Arc<FaultyStore>,
}

/// What the API ever served, per identity.
#[derive(Default)]
struct ApiHistory {
    versions: BTreeMap<String, Vec<Value>>,
    counts: MutationCounts,
    next_new: u64,
}

impl ApiHistory {
    /// Remembers `stored` as the newest version the API served of `id`.
    fn served(&mut self, id: &str, stored: Value) {
        self.versions.entry(id.to_owned()).or_default().push(stored);
    }
}

/// Everything the consumer received, in order, across instances.
type Deliveries = Arc<Mutex<Vec<Event>>>;

struct Sim {
    options: ChaosOptions,
    world: World,
    key: PKey,
    kills: Arc<KillSwitch>,
    audit: Arc<LeaseAudit>,
    deliveries: Deliveries,
    kill_rng: SeededRng,
    mutation_rng: SeededRng,
    clock_rng: SeededRng,
    engine_rng: SeededRng,
    history: ApiHistory,
    trace: Trace,
    instance: Option<Instance>,
    spawned: u32,
    restarts: u64,
    violations: Vec<String>,
}

/// Runs one chaos simulation and checks every invariant of the module docs. Fails only when the
/// options are invalid or the world cannot be built; broken guarantees are the report's
/// `violations`.
pub async fn run_chaos(options: ChaosOptions) -> Result<ChaosReport, ChaosError> {
    options.validate()?;
    let world = World::new(options.initial_items, PAGE_SIZE)
        .map_err(|e| ChaosError::Setup(format!("cannot build the fake API: {e}")))?;
    world.api.set_etags(options.etags);
    let master = SeededRng::new(options.seed);
    let (kill_rng, mutation_rng, clock_rng, engine_rng) =
        (master.fork(), master.fork(), master.fork(), master.fork());
    let mut history = ApiHistory::default();
    for item in world.api.all() {
        if let Some(id) = item["id"].as_str() {
            history.versions.insert(id.to_owned(), vec![item.clone()]);
        }
    }
    let echo = options.trace;
    let sim = Sim {
        world,
        key: PKey::new(POLLER, ""),
        kills: Arc::new(KillSwitch::new()),
        audit: Arc::new(LeaseAudit::new()),
        deliveries: Arc::default(),
        kill_rng,
        mutation_rng,
        clock_rng,
        engine_rng,
        history,
        trace: Trace {
            lines: VecDeque::new(),
            echo,
        },
        instance: None,
        spawned: 0,
        restarts: 0,
        violations: Vec::new(),
        options,
    };
    sim.run().await
}

impl Sim {
    async fn run(mut self) -> Result<ChaosReport, ChaosError> {
        self.trace.push(format!(
            "start seed={} {} items={} at {}",
            self.options.seed,
            self.options.flags(),
            self.options.initial_items,
            self.world.now()
        ));
        self.spawn()?;
        for step in 0..self.options.steps {
            self.step(step).await?;
        }
        let quiescence = self.quiesce().await?;
        self.finish(quiescence).await
    }

    /// Starts instance `inst-N` over the shared store.
    fn spawn(&mut self) -> Result<(), ChaosError> {
        self.spawned += 1;
        let name = format!("inst-{}", self.spawned);
        let store = Arc::new(
            FaultyStore::new(Arc::clone(&self.options.store))
                .with_kills(Arc::clone(&self.kills))
                .with_audit(Arc::clone(&self.audit)),
        );
        let poller = self
            .poller()
            .map_err(|e| ChaosError::Setup(format!("cannot build the poller: {e}")))?;
        let engine = Engine::builder(Arc::clone(&store) as Arc<dyn Store>)
            .poller(poller)
            .clock(Arc::new(self.world.clock.clone()))
            .rng(Arc::new(SeededRng::new(self.engine_rng.next_u32())))
            .instance_id(name.clone())
            .lease(LEASE_TTL, None)
            .dispatch_batch_size(DISPATCH_BATCH_SIZE)
            .build()
            .map_err(|e| ChaosError::Setup(format!("cannot build engine {name}: {e}")))?;
        engine
            .on(
                POLLER,
                handler(
                    Arc::clone(&self.deliveries),
                    Arc::clone(&store),
                    Arc::clone(&self.kills),
                ),
            )
            .map_err(|e| ChaosError::Setup(format!("cannot attach the handler: {e}")))?;
        self.instance = Some(Instance {
            name,
            engine,
            store,
        });
        Ok(())
    }

    fn poller(&self) -> watukuy_core::Result<watukuy_core::Poller> {
        let delivery = self.options.delivery();
        let mut builder = self
            .world
            .poller(self.options.strategy.kind())
            .delivery(delivery)
            .retain(self.options.retain)
            .overlap_delivery(self.options.overlap_delivery);
        if self.options.strategy == ChaosStrategy::Timestamp {
            builder = builder
                .cursor(
                    cursor::timestamp("updatedAt")
                        .tie_break("id")
                        .lag(Duration::from_secs(1)),
                )
                .version(|item: &Value| item["updatedAt"].as_str().unwrap_or_default().to_owned());
        }
        builder.build()
    }

    /// Replaces a dead instance: dropped without `stop()`, the clock moves past the lease TTL,
    /// a fresh instance takes over the same store.
    fn restart_if_crashed(&mut self) -> Result<(), ChaosError> {
        let Some(instance) = &self.instance else {
            return self.spawn();
        };
        if !instance.store.is_dead() {
            return Ok(());
        }
        let dead = instance.name.clone();
        let reason = instance.store.killed_by().unwrap_or_default();
        self.instance = None;
        self.world.advance(RESTART_ADVANCE);
        self.restarts += 1;
        self.spawn()?;
        let now = self.world.now();
        let name = self.current_name();
        self.trace.push(format!(
            "restart: {dead} died at {reason}; dropped without stop, +{} ms, {name} takes over at {now}",
            RESTART_ADVANCE.as_millis()
        ));
        Ok(())
    }

    fn current_name(&self) -> String {
        self.instance
            .as_ref()
            .map_or_else(String::new, |i| i.name.clone())
    }

    async fn step(&mut self, step: usize) -> Result<(), ChaosError> {
        self.restart_if_crashed()?;
        let mut armed = String::new();
        if !self.options.kill_points.is_empty()
            && self.kill_rng.chance(self.options.kill_probability)
        {
            let last = i64::try_from(self.options.kill_points.len()).unwrap_or(1) - 1;
            let index = usize::try_from(self.kill_rng.int_in(0, last)).unwrap_or(0);
            let point = self.options.kill_points[index];
            if self.kills.arm(point) {
                armed = format!(" arm {point}");
            }
        }
        let mutations = self.mutate();
        let advance = self
            .clock_rng
            .int_in(0, 10_000)
            .clamp(0, i64::from(u32::MAX));
        self.world
            .advance(Duration::from_millis(u64::try_from(advance).unwrap_or(0)));
        let outcome = self.tick(&format!("step {step}")).await;
        let name = self.current_name();
        self.trace.push(format!(
            "step {step} {name}{armed} mut[{}] +{advance}ms t={} -> {outcome}",
            mutations.join(", "),
            self.world.now()
        ));
        Ok(())
    }

    /// Applies 0..=N API changes: 40% add, 40% update (value + 1), 20% remove (an add for the
    /// append-only `page` API).
    fn mutate(&mut self) -> Vec<String> {
        let mut done = Vec::new();
        let n = self
            .mutation_rng
            .int_in(0, i64::from(self.options.max_mutations_per_step));
        for _ in 0..n {
            let ids: Vec<String> = self
                .world
                .api
                .all()
                .iter()
                .filter_map(|item| item["id"].as_str().map(str::to_owned))
                .collect();
            let roll = self.mutation_rng.int_in(0, 99);
            let pick = |rng: &SeededRng| {
                let last = i64::try_from(ids.len()).unwrap_or(1) - 1;
                ids[usize::try_from(rng.int_in(0, last)).unwrap_or(0)].clone()
            };
            let op = if ids.is_empty() || roll < 40 {
                0
            } else if roll < 80 {
                1
            } else if self.options.strategy.allows_removals() {
                2
            } else {
                0
            };
            match op {
                0 => {
                    self.history.next_new += 1;
                    let id = format!("new-{:05}", self.history.next_new);
                    let item = json!({ "id": id, "name": format!("New {}", self.history.next_new), "value": 0 });
                    match self.world.api.add(item) {
                        Ok(stored) => {
                            self.history.served(&id, stored);
                            self.history.counts.added += 1;
                            done.push(format!("+{id}"));
                        }
                        Err(e) => self
                            .violations
                            .push(format!("harness: cannot add {id}: {e}")),
                    }
                }
                1 => {
                    let id = pick(&self.mutation_rng);
                    let current = self
                        .world
                        .api
                        .get(&id)
                        .and_then(|item| item["value"].as_i64())
                        .unwrap_or(0);
                    let value = current + 1;
                    match self.world.api.update(&id, json!({ "value": value })) {
                        Ok(stored) => {
                            self.history.served(&id, stored);
                            self.history.counts.updated += 1;
                            done.push(format!("~{id}={value}"));
                        }
                        Err(e) => self
                            .violations
                            .push(format!("harness: cannot update {id}: {e}")),
                    }
                }
                _ => {
                    let id = pick(&self.mutation_rng);
                    if self.world.api.remove(&id) {
                        self.history.counts.removed += 1;
                        done.push(format!("-{id}"));
                    }
                }
            }
        }
        done
    }

    /// One tick of the current instance; returns its trace summary. An error from an instance
    /// that is still alive is a violation (only kills may fail a cycle).
    async fn tick(&mut self, label: &str) -> TickSummary {
        let Some(instance) = &self.instance else {
            return TickSummary::default();
        };
        let fired_before = self.kills.fired_counts();
        let result = instance.engine.tick(TickOptions::default()).await;
        let dead = instance.store.is_dead();
        let fired: Vec<KillPoint> = self
            .kills
            .fired_counts()
            .into_iter()
            .filter(|(k, n)| fired_before.get(k).copied().unwrap_or(0) < *n)
            .map(|(k, _)| k)
            .collect();
        let name = instance.name.clone();
        let summary = TickSummary::of(&result, dead, fired);
        match &result {
            Err(error) if !dead => self.violations.push(format!(
                "liveness: {label}: tick() of {name} failed without a kill: {error}"
            )),
            Ok(tick) if !dead => {
                for polled in &tick.polled {
                    if let Some(error) = &polled.error {
                        self.violations.push(format!(
                            "liveness: {label}: {name}: a {} cycle failed without a kill: {}: {}",
                            polled.lane.as_str(),
                            error.name,
                            error.message
                        ));
                    }
                }
            }
            _ => {}
        }
        summary
    }

    /// Disarms every kill, stops changing the API and ticks until the system is quiet: at
    /// least 10 ticks, 2 completed live cycles, 2 ticks in a row without a delivery, and an
    /// empty outbox (bounded by `max(steps, 30)` ticks; not getting there is a liveness
    /// violation).
    async fn quiesce(&mut self) -> Result<u64, ChaosError> {
        self.kills.disarm_all();
        let bound = u64::try_from(self.options.steps.max(30)).unwrap_or(u64::MAX);
        let (mut ticks, mut completed, mut quiet) = (0_u64, 0_u64, 0_u64);
        loop {
            if ticks >= bound {
                let pending = self
                    .options
                    .store
                    .counts(&self.key)
                    .await
                    .map(|c| c.pending);
                self.violations.push(format!(
                    "liveness: not quiet after {ticks} quiescence ticks ({completed} completed cycles, {quiet} quiet ticks, outbox {pending:?})"
                ));
                return Ok(ticks);
            }
            self.restart_if_crashed()?;
            self.world.advance(QUIESCENCE_ADVANCE);
            let summary = self.tick(&format!("quiescence tick {ticks}")).await;
            ticks += 1;
            completed += summary.completed_live;
            quiet = if summary.delivered == 0 { quiet + 1 } else { 0 };
            let pending = match self
                .options
                .store
                .counts(&self.key)
                .await
                .map(|c| c.pending)
            {
                Ok(n) => n,
                Err(error) => {
                    self.violations
                        .push(format!("harness: count_pending failed: {error}"));
                    return Ok(ticks);
                }
            };
            let name = self.current_name();
            self.trace.push(format!(
                "quiesce {ticks} {name} t={} -> {summary}; outbox {pending}",
                self.world.now()
            ));
            if ticks >= QUIESCENCE_MIN_TICKS && completed >= 2 && quiet >= 2 && pending == 0 {
                return Ok(ticks);
            }
        }
    }

    async fn finish(mut self, quiescence_ticks: u64) -> Result<ChaosReport, ChaosError> {
        let store = Arc::clone(&self.options.store);
        let pending = store.counts(&self.key).await.map(|c| c.pending);
        match pending {
            Ok(0) => {}
            Ok(n) => self.violations.push(format!(
                "G4: the outbox still holds {n} event(s) after quiescence"
            )),
            Err(e) => self
                .violations
                .push(format!("harness: count_pending failed: {e}")),
        }
        let parked = match store.counts(&self.key).await.map(|c| c.parked) {
            Ok(n) => n,
            Err(e) => {
                self.violations
                    .push(format!("harness: count_parked failed: {e}"));
                0
            }
        };
        if parked > 0 {
            self.violations.push(format!(
                "G7: {parked} row(s) parked after quiescence (a handler fails once at most, so nothing may be parked)"
            ));
        }
        self.violations.extend(self.audit.violations());
        let deliveries = self
            .deliveries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let current = self.world.api.all();
        let checker = Checker {
            strategy: self.options.strategy,
            retain: self.options.retain,
            history: &self.history.versions,
            current: &current,
        };
        self.violations.extend(checker.check(&deliveries));
        let kills = self.kills.fired_counts();
        let crashes: u64 = kills
            .iter()
            .filter(|(k, _)| k.is_crash())
            .map(|(_, n)| n)
            .sum();
        let unique: BTreeSet<&str> = deliveries.iter().map(|e| e.id.as_str()).collect();
        let delivered = deliveries.len() as u64;
        let unique_events = unique.len() as u64;
        let duplicates = delivered - unique_events;
        // At most one redelivery per event delivered and not acknowledged at a crash:
        // `concurrency` of them without an ack window, `max(concurrency, window)` with one.
        let unacked_bound = self.options.delivery().unacked_bound();
        let bound = unacked_bound as u64;
        if duplicates > crashes.saturating_mul(bound) {
            self.violations.push(format!(
                "G9: {duplicates} duplicate deliveries after {crashes} crash(es) with concurrency {} and ack window {:?}: at most {bound} per crash (one per event delivered and not acknowledged)",
                self.options.concurrency, self.options.ack_window
            ));
        }
        if delivered == 0 {
            self.violations
                .push("liveness: nothing was ever delivered".to_owned());
        }
        let report = ChaosReport {
            seed: self.options.seed,
            steps: self.options.steps,
            strategy: self.options.strategy,
            options: self.options.flags(),
            replay: self.options.replay_command(),
            kills,
            restarts: self.restarts,
            mutations: self.history.counts,
            delivered,
            unique_events,
            duplicates,
            parked,
            quiescence_ticks,
            lease_acquisitions: self.audit.acquisitions(),
            lease_probes: self.audit.probes(),
            largest_ack: self.audit.largest_ack(),
            unacked_bound,
            not_modified: self
                .world
                .api
                .log()
                .iter()
                .filter(|entry| entry.status == Some(304))
                .count() as u64,
            violations: std::mem::take(&mut self.violations),
            trace: Vec::new(),
        };
        let mut trace = self.trace;
        trace.push(report.describe());
        Ok(ChaosReport {
            trace: trace.lines.into_iter().collect(),
            ..report
        })
    }
}

/// The consumer of every instance: records what it received, fails attempt 1 of one event when
/// the `handler` kill is armed, and receives nothing once its instance is dead (a dead process
/// handles nothing). After recording, it yields once before returning, so concurrent deliveries
/// interleave even on an in-process store: a crash then finds other events handled but not yet
/// acknowledged, as a real process would.
fn handler(
    deliveries: Deliveries,
    store: Arc<FaultyStore>,
    kills: Arc<KillSwitch>,
) -> impl Fn(Event, HandlerContext) -> futures::future::BoxFuture<'static, HandlerResult>
+ Send
+ Sync
+ 'static {
    move |event: Event, _ctx: HandlerContext| {
        let (deliveries, store, kills) = (
            Arc::clone(&deliveries),
            Arc::clone(&store),
            Arc::clone(&kills),
        );
        Box::pin(async move {
            if store.is_dead() {
                return Err(HandlerError::transient("SimulatedCrash(dead-instance)"));
            }
            if event.attempt == 1 && kills.try_fire(KillPoint::Handler) {
                return Err(HandlerError::transient(format!(
                    "SimulatedCrash(handler): attempt 1 of {}",
                    event.id
                )));
            }
            deliveries
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(event);
            tokio::task::yield_now().await;
            Ok(())
        })
    }
}

/// What one tick did, for the trace.
#[derive(Default)]
struct TickSummary {
    delivered: u64,
    completed_live: u64,
    text: String,
}

impl TickSummary {
    fn of(result: &watukuy_core::Result<TickResult>, dead: bool, fired: Vec<KillPoint>) -> Self {
        let mut summary = TickSummary::default();
        let mut parts = Vec::new();
        match result {
            Ok(tick) => {
                summary.delivered = tick.delivered;
                parts.push(format!("delivered {}", tick.delivered));
                for polled in &tick.polled {
                    let ok = polled.error.is_none();
                    if ok && polled.lane == Lane::Live {
                        summary.completed_live += 1;
                    }
                    parts.push(format!(
                        "{} items {} events {}{}",
                        polled.lane.as_str(),
                        polled.items,
                        polled.events,
                        polled
                            .error
                            .as_ref()
                            .map(|e| format!(" error {}", e.message))
                            .unwrap_or_default()
                    ));
                }
                if tick.skipped_leased > 0 {
                    parts.push("skipped: leased".to_owned());
                }
                if tick.skipped_not_due > 0 {
                    parts.push("skipped: not due".to_owned());
                }
            }
            Err(error) => parts.push(format!("tick error {error}")),
        }
        for point in fired {
            parts.push(format!("KILL {point}"));
        }
        if dead {
            parts.push("instance dead".to_owned());
        }
        summary.text = parts.join("; ");
        summary
    }
}

impl fmt::Display for TickSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

// ----- the invariant checker -----

/// The data of an event as JSON (`None` when it carries none).
fn json_of(data: Option<&watukuy_core::json::Json>) -> Option<Value> {
    data.map(watukuy_core::json::Json::to_value)
}

/// Checks the delivered events against what the API served (G1, G2, G3).
struct Checker<'a> {
    strategy: ChaosStrategy,
    retain: Retain,
    history: &'a BTreeMap<String, Vec<Value>>,
    current: &'a [Value],
}

impl Checker<'_> {
    fn check(&self, deliveries: &[Event]) -> Vec<String> {
        let mut violations = Vec::new();
        // G2: a redelivery is the same event; one sequence, one event.
        let mut by_id: HashMap<&str, &Event> = HashMap::new();
        let mut by_sequence: HashMap<i64, &str> = HashMap::new();
        for event in deliveries {
            match by_id.get(event.id.as_str()) {
                Some(first) => {
                    let same = (
                        &first.subject,
                        first.event_type,
                        first.sequence,
                        json_of(first.data.as_ref()),
                        json_of(first.previous.as_ref()),
                    ) == (
                        &event.subject,
                        event.event_type,
                        event.sequence,
                        json_of(event.data.as_ref()),
                        json_of(event.previous.as_ref()),
                    );
                    if !same {
                        violations.push(format!(
                            "G2: event {} was delivered twice with different content: {} {} seq {} then {} {} seq {}",
                            event.id,
                            first.event_type,
                            first.subject,
                            first.sequence,
                            event.event_type,
                            event.subject,
                            event.sequence
                        ));
                    }
                }
                None => {
                    by_id.insert(&event.id, event);
                }
            }
            match by_sequence.get(&event.sequence) {
                Some(id) if *id != event.id => violations.push(format!(
                    "G2: sequence {} was delivered as two events, {id} and {}",
                    event.sequence, event.id
                )),
                Some(_) => {}
                None => {
                    by_sequence.insert(event.sequence, &event.id);
                }
            }
        }

        // G3: per key, sequences never go back; a redelivery may only repeat the newest.
        let mut newest: BTreeMap<&str, (i64, &str)> = BTreeMap::new();
        let mut unique: BTreeMap<&str, Vec<&Event>> = BTreeMap::new();
        for event in deliveries {
            let subject = event.subject.as_str();
            match newest.get(subject) {
                Some((sequence, id)) if event.sequence == *sequence && event.id == *id => {}
                Some((sequence, id)) if event.sequence <= *sequence => {
                    violations.push(format!(
                        "G3: {subject}: event {} (sequence {}) delivered after {id} (sequence {sequence}): an older event resurrected",
                        event.id, event.sequence
                    ));
                }
                _ => {
                    newest.insert(subject, (event.sequence, &event.id));
                    unique.entry(subject).or_default().push(event);
                }
            }
        }

        // G1: lifecycle, no phantom versions, retained payloads.
        for (subject, events) in &unique {
            let Some(served) = self.history.get(*subject) else {
                violations.push(format!(
                    "G1: {subject} was delivered ({} event(s)) but the API never had it (never served)",
                    events.len()
                ));
                continue;
            };
            let mut last_payload: Option<Value> = None;
            for (index, event) in events.iter().enumerate() {
                let data = json_of(event.data.as_ref());
                let previous = json_of(event.previous.as_ref());
                match event.event_type {
                    EventType::Created if index > 0 => violations.push(format!(
                        "G1 lifecycle: {subject}: created again (event {}) without a delete",
                        event.id
                    )),
                    EventType::Updated | EventType::Deleted if index == 0 => {
                        violations.push(format!(
                            "G1 lifecycle: {subject}: the first delivered event is {} ({}), not created",
                            event.event_type, event.id
                        ));
                    }
                    _ => {}
                }
                if index > 0 && events[index - 1].event_type == EventType::Deleted {
                    violations.push(format!(
                        "G1 lifecycle: {subject}: {} {} delivered after deleted",
                        event.event_type, event.id
                    ));
                }
                match event.event_type {
                    EventType::Created | EventType::Updated => {
                        match &data {
                            Some(value) if served.contains(value) => {}
                            other => violations.push(format!(
                                "G1: {subject}: event {} carries a version the API never served: {}",
                                event.id,
                                other.as_ref().map_or_else(|| "no data".to_owned(), Value::to_string)
                            )),
                        }
                        let expected_previous = match (event.event_type, self.retain) {
                            (EventType::Updated, Retain::Payload) => last_payload.clone(),
                            _ => None,
                        };
                        if previous != expected_previous {
                            violations.push(format!(
                                "G1 (retain {:?}): {subject}: {} {} has previous {} but the last delivered payload was {}",
                                self.retain,
                                event.event_type,
                                event.id,
                                previous.as_ref().map_or_else(|| "none".to_owned(), Value::to_string),
                                expected_previous.as_ref().map_or_else(|| "none".to_owned(), Value::to_string)
                            ));
                        }
                        last_payload = data;
                    }
                    EventType::Deleted => {
                        if !self.strategy.sees_deletes() {
                            violations.push(format!(
                                "G1: {subject}: deleted ({}) emitted by {}, which cannot see deletes",
                                event.id, self.strategy
                            ));
                        }
                        let expected = match self.retain {
                            Retain::Payload => last_payload.clone(),
                            Retain::Hash => None,
                        };
                        if data != expected || previous != expected {
                            violations.push(format!(
                                "G1 (retain {:?}): {subject}: deleted {} carries data {} / previous {} but the last delivered payload was {}",
                                self.retain,
                                event.id,
                                data.as_ref().map_or_else(|| "none".to_owned(), Value::to_string),
                                previous.as_ref().map_or_else(|| "none".to_owned(), Value::to_string),
                                expected.as_ref().map_or_else(|| "none".to_owned(), Value::to_string)
                            ));
                        }
                    }
                }
            }
        }

        // G1 convergence: the newest delivered event of every item is the API's item; removed
        // items end deleted when the strategy can see it.
        let mut alive = BTreeSet::new();
        for item in self.current {
            let Some(id) = item["id"].as_str() else {
                continue;
            };
            alive.insert(id);
            match unique.get(id).and_then(|events| events.last()) {
                None => violations.push(format!(
                    "G1 convergence: {id} is in the API but was never delivered"
                )),
                Some(last) if last.event_type == EventType::Deleted => violations.push(format!(
                    "G1 convergence: {id} is in the API but its newest delivered event is deleted ({})",
                    last.id
                )),
                Some(last) => {
                    let data = json_of(last.data.as_ref());
                    if data.as_ref() != Some(item) {
                        violations.push(format!(
                            "G1 convergence: {id}: the newest delivered version {} differs from the API's {item}",
                            data.as_ref().map_or_else(|| "none".to_owned(), Value::to_string)
                        ));
                    }
                }
            }
        }
        if self.strategy.sees_deletes() {
            for (subject, events) in &unique {
                if alive.contains(subject) || !self.history.contains_key(*subject) {
                    continue;
                }
                if events.last().map(|e| e.event_type) != Some(EventType::Deleted) {
                    violations.push(format!(
                        "G1 convergence: {subject} was removed from the API but never delivered as deleted"
                    ));
                }
            }
        }
        violations
    }
}
