//! Chaos runs on a chosen store: many seeds, every strategy, engines crashing at the
//! kill points K1–K7 while the API changes; prints one line per run and a summary (kills per
//! kill point, restarts, deliveries, duplicates, violations). Exits with 1 on any violation.
//!
//! ```text
//! cargo run -p watukuy-examples --bin chaos -- --seeds 50 --store memory
//! cargo run -p watukuy-examples --bin chaos -- --seeds 10 --store sqlite:/tmp/chaos.db
//! WATUKUY_TEST_POSTGRES_URL=postgres://root@127.0.0.1/test \
//!   cargo run -p watukuy-examples --bin chaos -- --seeds 10 --store postgres
//! WATUKUY_TEST_REDIS_URL=redis://127.0.0.1:6379 \
//!   cargo run -p watukuy-examples --bin chaos -- --seeds 10 --store redis
//! cargo run -p watukuy-examples --bin chaos -- --seed 7 --strategy token --steps 120 --trace
//! ```
//!
//! Options: `--seeds N` (seeds 1..=N, default 10) or `--seed S` (one seed); `--strategy
//! all|timestamp|snapshotDiff|token|page` (default all); `--retain hash|payload|both` (default
//! hash); `--steps N` (default 120); `--kill-points all|none|a,b,...`; `--kill-probability P`;
//! `--mutations N`; `--items N`; `--concurrency N`; `--ack-window N` (acks flushed in batches of
//! up to N); `--store memory|sqlite:<path>|postgres|
//! redis` (default memory; `postgres:<url>` and `redis:<url>` name the server directly);
//! `--overlap-delivery` runs the pollers with `overlap_delivery(true)`; `--etags` makes the API
//! answer with `ETag`s and the pollers send conditional requests; `--trace` prints every step.
//!
//! The chaos binary lives here rather than in `watukuy-conformance` because the stores depend on
//! the conformance crate (for their tests), so the conformance crate cannot depend on them.
//! Every run gets a fresh store: a new SQLite file next to `<path>`, a new Postgres schema, a
//! new Redis key prefix; each is removed after a passing run and kept after a failing one.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use sqlx::postgres::PgPoolOptions;
use watukuy_core::{poller::Retain, store::Store};
use watukuy_store_memory::MemoryStore;
use watukuy_store_postgres::{PostgresOptions, PostgresStore};
use watukuy_store_redis::{RedisOptions, RedisStore};
use watukuy_store_sqlite::{SqliteOptions, SqliteStore};
use watukuy_testkit::{
    KillPoint,
    chaos::{ChaosOptions, ChaosReport, ChaosStrategy, run_chaos},
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Where the runs keep their state.
#[derive(Clone, Debug)]
enum StoreKind {
    Memory,
    Sqlite(PathBuf),
    Postgres(String),
    Redis(String),
}

impl StoreKind {
    fn parse(text: &str) -> Result<Self, String> {
        let env = |var: &str| {
            std::env::var(var)
                .ok()
                .filter(|v| !v.trim().is_empty())
                .ok_or_else(|| format!("--store {text} needs {var} (or --store {text}:<url>)"))
        };
        match text.split_once(':') {
            None if text == "memory" => Ok(StoreKind::Memory),
            None if text == "postgres" => {
                Ok(StoreKind::Postgres(env("WATUKUY_TEST_POSTGRES_URL")?))
            }
            None if text == "redis" => Ok(StoreKind::Redis(env("WATUKUY_TEST_REDIS_URL")?)),
            Some(("sqlite", path)) if !path.is_empty() => Ok(StoreKind::Sqlite(path.into())),
            Some(("postgres", url)) if !url.is_empty() => Ok(StoreKind::Postgres(url.to_owned())),
            Some(("redis", url)) if !url.is_empty() => Ok(StoreKind::Redis(url.to_owned())),
            _ => Err(format!(
                "unknown store {text:?}; expected memory, sqlite:<path>, postgres or redis"
            )),
        }
    }

    /// How the replay command names the store.
    fn label(&self) -> String {
        match self {
            StoreKind::Memory => "memory".to_owned(),
            StoreKind::Sqlite(path) => format!("sqlite:{}", path.display()),
            StoreKind::Postgres(_) => "postgres".to_owned(),
            StoreKind::Redis(_) => "redis".to_owned(),
        }
    }
}

/// A fresh store for one run, and how to remove it after a passing run.
struct RunStore {
    store: Arc<dyn Store>,
    cleanup: Cleanup,
}

enum Cleanup {
    None,
    File(PathBuf),
    Schema(sqlx::PgPool, String),
    Redis(Arc<RedisStore>),
}

impl RunStore {
    async fn open(kind: &StoreKind, run: &str) -> Result<Self, BoxError> {
        Ok(match kind {
            StoreKind::Memory => RunStore {
                store: Arc::new(MemoryStore::new()),
                cleanup: Cleanup::None,
            },
            StoreKind::Sqlite(path) => {
                let stem = path
                    .file_stem()
                    .map_or_else(|| "chaos".into(), |s| s.to_string_lossy().into_owned());
                let file = path.with_file_name(format!("{stem}-{run}.db"));
                let _ = std::fs::remove_file(&file);
                let store = SqliteStore::open(SqliteOptions::file(&file))?;
                store.migrate().await?;
                RunStore {
                    store: Arc::new(store),
                    cleanup: Cleanup::File(file),
                }
            }
            StoreKind::Postgres(url) => {
                let pool = PgPoolOptions::new().max_connections(4).connect(url).await?;
                let schema = format!("wk_chaos_{}_{run}", std::process::id());
                sqlx::query(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                    .execute(&pool)
                    .await?;
                let store = PostgresStore::from_pool(
                    pool.clone(),
                    PostgresOptions::default().schema(schema.clone()),
                )?;
                store.migrate().await?;
                RunStore {
                    store: Arc::new(store),
                    cleanup: Cleanup::Schema(pool, schema),
                }
            }
            StoreKind::Redis(url) => {
                let prefix = format!("wk:chaos:{}:{run}:", std::process::id());
                let store = Arc::new(
                    RedisStore::connect(url, RedisOptions::default().prefix(prefix)).await?,
                );
                store.purge().await?;
                RunStore {
                    store: Arc::clone(&store) as Arc<dyn Store>,
                    cleanup: Cleanup::Redis(store),
                }
            }
        })
    }

    /// Removes the run's data (after a passing run); a failing run's data is kept and named.
    async fn finish(self, passed: bool) {
        if !passed {
            match &self.cleanup {
                Cleanup::None => {}
                Cleanup::File(file) => eprintln!("  kept {}", file.display()),
                Cleanup::Schema(_, schema) => eprintln!("  kept schema {schema}"),
                Cleanup::Redis(store) => {
                    eprintln!("  kept keys under {}", store.options().get_prefix())
                }
            }
            return;
        }
        match self.cleanup {
            Cleanup::None => {}
            Cleanup::File(file) => {
                let _ = self.store.close().await;
                for suffix in ["", "-wal", "-shm"] {
                    let mut name = file.clone().into_os_string();
                    name.push(suffix);
                    let _ = std::fs::remove_file(name);
                }
            }
            Cleanup::Schema(pool, schema) => {
                let _ = sqlx::query(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                    .execute(&pool)
                    .await;
                pool.close().await;
            }
            Cleanup::Redis(store) => {
                let _ = store.purge().await;
            }
        }
    }
}

/// The command line.
struct Args {
    seeds: Vec<u32>,
    strategies: Vec<ChaosStrategy>,
    retains: Vec<Retain>,
    steps: usize,
    kill_points: Option<Vec<KillPoint>>,
    kill_probability: Option<f64>,
    mutations: Option<u32>,
    items: Option<usize>,
    concurrency: Option<usize>,
    ack_window: Option<usize>,
    store: StoreKind,
    overlap_delivery: bool,
    etags: bool,
    trace: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        seeds: (1..=10).collect(),
        strategies: ChaosStrategy::ALL.to_vec(),
        retains: vec![Retain::Hash],
        steps: 120,
        kill_points: None,
        kill_probability: None,
        mutations: None,
        items: None,
        concurrency: None,
        ack_window: None,
        store: StoreKind::Memory,
        overlap_delivery: false,
        etags: false,
        trace: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--trace" {
            args.trace = true;
            continue;
        }
        if flag == "--overlap-delivery" {
            args.overlap_delivery = true;
            continue;
        }
        if flag == "--etags" {
            args.etags = true;
            continue;
        }
        if flag == "--help" || flag == "-h" {
            return Err(String::new());
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = |what: &str| format!("{flag}: {what} expected, got {value:?}");
        match flag.as_str() {
            "--seeds" => {
                let n: u32 = value.parse().map_err(|_| number("a number"))?;
                args.seeds = (1..=n).collect();
            }
            "--seed" => args.seeds = vec![value.parse().map_err(|_| number("a seed"))?],
            "--strategy" => {
                args.strategies = if value == "all" {
                    ChaosStrategy::ALL.to_vec()
                } else {
                    value.split(',').map(str::parse).collect::<Result<_, _>>()?
                }
            }
            "--retain" => {
                args.retains = match value.as_str() {
                    "hash" => vec![Retain::Hash],
                    "payload" => vec![Retain::Payload],
                    "both" => vec![Retain::Hash, Retain::Payload],
                    _ => return Err(number("hash, payload or both")),
                }
            }
            "--steps" => args.steps = value.parse().map_err(|_| number("a number"))?,
            "--kill-points" => {
                args.kill_points = Some(match value.as_str() {
                    "all" => KillPoint::ALL.to_vec(),
                    "none" => Vec::new(),
                    list => list.split(',').map(str::parse).collect::<Result<_, _>>()?,
                })
            }
            "--kill-probability" => {
                args.kill_probability = Some(value.parse().map_err(|_| number("a probability"))?)
            }
            "--mutations" => args.mutations = Some(value.parse().map_err(|_| number("a number"))?),
            "--items" => args.items = Some(value.parse().map_err(|_| number("a number"))?),
            "--ack-window" => {
                args.ack_window = Some(value.parse().map_err(|_| number("a number"))?)
            }
            "--concurrency" => {
                args.concurrency = Some(value.parse().map_err(|_| number("a number"))?)
            }
            "--store" => args.store = StoreKind::parse(&value)?,
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok(args)
}

impl Args {
    fn options(
        &self,
        seed: u32,
        strategy: ChaosStrategy,
        retain: Retain,
        store: Arc<dyn Store>,
    ) -> ChaosOptions {
        let mut options = ChaosOptions::new(seed, store)
            .strategy(strategy)
            .steps(self.steps)
            .retain(retain)
            .store_label(self.store.label())
            .overlap_delivery(self.overlap_delivery)
            .etags(self.etags)
            .ack_window(self.ack_window)
            .trace(self.trace);
        if let Some(points) = &self.kill_points {
            options = options.kill_points(points.iter().copied());
        }
        if let Some(p) = self.kill_probability {
            options = options.kill_probability(p);
        }
        if let Some(n) = self.mutations {
            options = options.max_mutations_per_step(n);
        }
        if let Some(n) = self.items {
            options = options.initial_items(n);
        }
        if let Some(n) = self.concurrency {
            options = options.concurrency(n);
        }
        options
    }
}

/// The totals over every run.
#[derive(Default)]
struct Summary {
    runs: u64,
    failed: u64,
    kills: BTreeMap<KillPoint, u64>,
    restarts: u64,
    delivered: u64,
    unique: u64,
    duplicates: u64,
    violations: u64,
}

impl Summary {
    fn add(&mut self, report: &ChaosReport) {
        self.runs += 1;
        self.failed += u64::from(!report.is_ok());
        for (point, n) in &report.kills {
            *self.kills.entry(*point).or_default() += n;
        }
        self.restarts += report.restarts;
        self.delivered += report.delivered;
        self.unique += report.unique_events;
        self.duplicates += report.duplicates;
        self.violations += report.violations.len() as u64;
    }

    fn print(&self, store: &str) {
        println!();
        println!(
            "chaos on {store}: {} runs, {} failed, {} violation(s)",
            self.runs, self.failed, self.violations
        );
        println!("  kills: {} in total", self.kills.values().sum::<u64>());
        for (point, n) in &self.kills {
            println!("    {:<5} {:<26} {n}", point.label(), point.name());
        }
        println!("  restarts:   {}", self.restarts);
        println!("  delivered:  {}", self.delivered);
        println!("  unique:     {}", self.unique);
        println!(
            "  duplicates: {} (delivered − unique = {})",
            self.duplicates,
            self.delivered - self.unique
        );
        println!("{} passed, {} failed", self.runs - self.failed, self.failed);
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            if !message.is_empty() {
                eprintln!("chaos: {message}");
            }
            eprintln!(
                "usage: chaos [--seeds N | --seed S] [--strategy all|timestamp|snapshotDiff|token|page] [--retain hash|payload|both] [--steps N] [--kill-points all|none|a,b] [--kill-probability P] [--mutations N] [--items N] [--concurrency N] [--ack-window N] [--store memory|sqlite:<path>|postgres|redis] [--overlap-delivery] [--etags] [--trace]"
            );
            return ExitCode::from(2);
        }
    };
    let mut summary = Summary::default();
    for retain in &args.retains {
        for strategy in &args.strategies {
            for seed in &args.seeds {
                let retain_name = if *retain == Retain::Payload {
                    "payload"
                } else {
                    "hash"
                };
                let run = format!("{strategy}_{retain_name}_{seed}").to_lowercase();
                let run_store = match RunStore::open(&args.store, &run).await {
                    Ok(store) => store,
                    Err(error) => {
                        eprintln!(
                            "chaos: cannot open the {} store: {error}",
                            args.store.label()
                        );
                        return ExitCode::from(2);
                    }
                };
                let options = args.options(*seed, *strategy, *retain, Arc::clone(&run_store.store));
                let report = match run_chaos(options).await {
                    Ok(report) => report,
                    Err(error) => {
                        eprintln!("chaos: {error}");
                        return ExitCode::from(2);
                    }
                };
                println!("{}", report.describe());
                if let Some(failure) = report.failure() {
                    println!("{failure}");
                }
                summary.add(&report);
                run_store.finish(report.is_ok()).await;
            }
        }
    }
    summary.print(&args.store.label());
    if summary.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
