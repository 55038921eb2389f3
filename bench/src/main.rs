//! `watukuy-bench`: the benchmark harness of watukuy (a runnable binary, not `cargo test`).
//!
//! Modes:
//! - `suite` (default): per store, the limit probe's cycle (batched and per-event ack) in the
//!   same process and run, then end-to-end throughput (in-process fake API → engine → commit →
//!   dispatch → no-op handler → ack) with commit-to-handler latency p50/p99 and peak RSS, the
//!   same with a single hot key, dispatch-only throughput from a pre-filled outbox, commit
//!   throughput (pages of 100 items through the engine's tick: the diff and `commit_poll`) and, with the `apalis`
//!   feature, apalis on the same backend. Each figure is printed with its ratio to the limit,
//!   medians over `--reps` repetitions, as a Markdown table.
//! - `sweep`: end-to-end throughput against concurrency, against keys and against the ack
//!   window (`--sweep-ack-window`, default 1, 16, 100, 1000), as tables and PNG plots in
//!   `--plots`.
//! - `memory`: bounded memory (G10), reported and not timed: RSS while one dispatcher drains
//!   a million pending events, and the peak RSS of a `snapshot_diff` full scan over a million
//!   items.
//! - `tenants`: one poller with N partitions (`--tenants`, default 10, 100, 1,000, 10,000), each
//!   asked to be polled every second with 5 unchanged items from memory: the first round's
//!   `tick` throughput, then the daemon idle for `--tenants-seconds`: achieved polls/s, CPU and
//!   store calls per idle poll, RSS per partition and a trigger's latency.
//!
//! ```text
//! cargo run --release -p watukuy-bench -- --store postgres --events 100000 --keys 1000 --concurrency 16
//! cargo run --release -p watukuy-bench --features apalis -- --store memory,sqlite,postgres,redis
//! cargo run --release -p watukuy-bench -- --store postgres --ack-window 100
//! cargo run --release -p watukuy-bench -- --mode sweep --store memory,sqlite,postgres,redis
//! cargo run --release -p watukuy-bench -- --mode memory --store memory,sqlite
//! cargo run --release -p watukuy-bench -- --mode tenants --store memory,sqlite,postgres --tenants 10,100,1000,10000
//! ```

mod measure;
mod memory;
#[cfg(feature = "apalis")]
mod peer;
mod pipeline;
mod plot;
mod probe;
mod stores;
mod tenants;
mod workload;

use std::path::PathBuf;

use clap::Parser;
use watukuy_core::BoxError;
use watukuy_store_sqlite::Synchronous;

use crate::measure::{as_f64, fmt_mib, fmt_rate, fmt_ratio, median, median_u64};
use crate::probe::Limit;
use crate::stores::{Backend, Targets};
use crate::workload::Params;

/// What to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Mode {
    /// Every figure per store, with ratios to the limit.
    Suite,
    /// Throughput against concurrency, keys and the ack window, with plots.
    Sweep,
    /// Bounded-memory report.
    Memory,
    /// One poller with many partitions under `tick` and the daemon.
    Tenants,
    /// Several engines on one PostgreSQL sharing the tenants mode's partitions.
    TenantsShared,
}

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "watukuy-bench",
    about = "Benchmarks of watukuy against the limit probe"
)]
struct Args {
    /// What to run.
    #[arg(long, value_enum, default_value = "suite")]
    mode: Mode,
    /// Stores, comma separated.
    #[arg(
        long = "store",
        value_enum,
        value_delimiter = ',',
        default_value = "memory,sqlite,postgres,redis,mysql"
    )]
    stores: Vec<Backend>,
    /// Events per run (the memory mode's pending events).
    #[arg(long, default_value_t = 20_000)]
    events: u64,
    /// Ordering keys the events spread over.
    #[arg(long, default_value_t = 1_000)]
    keys: u64,
    /// Ordering keys in flight at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Deliver with an ack window of this many events (default: no window).
    #[arg(long)]
    ack_window: Option<usize>,
    /// The ack window's longest wait, in milliseconds.
    #[arg(long, default_value_t = 10)]
    ack_delay_ms: u64,
    /// Partitions (tenants) the end-to-end runs spread the events over, polled up to 4 at once.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    partitions: u64,
    /// Padding bytes per item (items are ~70 bytes without it).
    #[arg(long, default_value_t = 64)]
    payload: usize,
    /// Repetitions (medians are reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Rows of the limit probe's cycle (its own default: 20,000).
    #[arg(long, default_value_t = 20_000)]
    probe_events: i64,
    /// Concurrency values of the sweep.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    sweep_concurrency: Vec<usize>,
    /// Ack windows of the sweep (events per flush).
    #[arg(long, value_delimiter = ',', default_value = "1,16,100,1000")]
    sweep_ack_window: Vec<usize>,
    /// Key counts of the sweep.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100,1000,10000")]
    sweep_keys: Vec<u64>,
    /// The memory mode's drain stops after this many deliveries (default: drains everything).
    #[arg(long)]
    drain_limit: Option<u64>,
    /// Item counts of the memory mode's `snapshot_diff` scans.
    #[arg(long, value_delimiter = ',', default_value = "100000,1000000")]
    scan_items: Vec<u64>,
    /// Partition counts of the tenants mode (30,000 works too, at length).
    #[arg(long, value_delimiter = ',', default_value = "10,100,1000,10000")]
    tenants: Vec<u64>,
    /// Engines of the tenants-shared mode (it uses the largest `--tenants`).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    instances: u64,
    /// The tenants mode's idle window under the daemon, in seconds.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    tenants_seconds: u64,
    /// Where the plots go.
    #[arg(long, default_value = "bench/plots")]
    plots: PathBuf,
    /// A TrueType font for the plots' text (default: DejaVu Sans or Liberation Sans).
    #[arg(long)]
    font: Option<PathBuf>,
    /// Postgres URL.
    #[arg(
        long,
        env = "WATUKUY_BENCH_POSTGRES_URL",
        default_value = "postgres://root@127.0.0.1/test"
    )]
    postgres_url: String,
    /// Redis URL.
    #[arg(
        long,
        env = "WATUKUY_BENCH_REDIS_URL",
        default_value = "redis://127.0.0.1:6379"
    )]
    redis_url: String,
    /// MySQL / MariaDB URL.
    #[arg(
        long,
        env = "WATUKUY_BENCH_MYSQL_URL",
        default_value = "mysql://root@127.0.0.1:3306/test"
    )]
    mysql_url: String,
    /// Directory of the SQLite files.
    #[arg(long, default_value_t = std::env::temp_dir().display().to_string())]
    dir: String,
    /// End-to-end runs poll with `overlap_delivery(true)`: a page's events are delivered while
    /// the next page is fetched and committed (default: the reference lifecycle, one after
    /// the other).
    #[arg(long)]
    overlap_delivery: bool,
    /// The SQLite store's durability level: `full` or `normal` (the limit probe always runs
    /// `normal`).
    #[arg(long, default_value_t = Synchronous::default(), value_parser = str::parse::<Synchronous>)]
    sqlite_synchronous: Synchronous,
}

impl Args {
    fn params(&self) -> Params {
        Params {
            events: self.events,
            keys: self.keys,
            concurrency: self.concurrency,
            payload: self.payload,
            overlap: self.overlap_delivery,
            ack_window: self.ack_window,
            ack_delay: std::time::Duration::from_millis(self.ack_delay_ms),
            partitions: self.partitions,
        }
    }

    fn targets(&self, concurrency: usize) -> Targets {
        Targets {
            postgres: self.postgres_url.clone(),
            redis: self.redis_url.clone(),
            mysql: self.mysql_url.clone(),
            dir: PathBuf::from(&self.dir),
            concurrency,
            sqlite_synchronous: self.sqlite_synchronous,
        }
    }

    /// A store's name in tables and plots; SQLite's says its durability level.
    fn label(&self, backend: Backend) -> String {
        match backend {
            Backend::Sqlite => format!(
                "{} (synchronous={})",
                backend.name(),
                self.sqlite_synchronous
            ),
            _ => backend.name().to_owned(),
        }
    }
}

/// The limit probe's figures for one backend (none for the memory store).
async fn limit(backend: Backend, args: &Args) -> Result<Option<Limit>, BoxError> {
    let (n, b) = (args.probe_events, 100);
    let t = args.targets(args.concurrency);
    let mut out = Limit::default();
    for per_event in [false, true] {
        let r = match backend {
            Backend::Memory => return Ok(None),
            Backend::Sqlite => {
                let dir = t.dir.clone();
                tokio::task::spawn_blocking(move || probe::sqlite(&dir, n, b, per_event)).await??
            }
            Backend::Postgres => probe::postgres(&t.postgres, n, b, per_event).await?,
            Backend::Redis => probe::redis_probe(&t.redis, n, b, per_event).await?,
            Backend::MySql => probe::mysql(&t.mysql, n, b, per_event).await?,
        };
        if per_event {
            out.per_event = r;
        } else {
            out.batched = r;
        }
    }
    Ok(Some(out))
}

/// Every repetition's figures of one store.
#[derive(Debug, Default)]
struct Samples {
    limit_batched: Vec<f64>,
    limit_per_event: Vec<f64>,
    e2e: Vec<f64>,
    p50: Vec<u64>,
    p99: Vec<u64>,
    rss: Vec<u64>,
    hot: Vec<f64>,
    dispatch: Vec<f64>,
    dispatch_analyzed: Vec<f64>,
    commit: Vec<f64>,
    apalis: Vec<f64>,
    apalis_note: Option<String>,
}

async fn suite_store(backend: Backend, args: &Args) -> Result<Samples, BoxError> {
    let p = args.params();
    let t = args.targets(p.concurrency);
    let mut s = Samples::default();
    for rep in 1..=args.reps {
        eprintln!("[{}] repetition {rep}/{}", backend.name(), args.reps);
        if let Some(l) = limit(backend, args).await? {
            eprintln!(
                "  limit: batched {} per-event {}",
                fmt_rate(l.batched),
                fmt_rate(l.per_event)
            );
            s.limit_batched.push(l.batched);
            s.limit_per_event.push(l.per_event);
        }
        let store = stores::fresh(backend, &t).await?;
        let e = pipeline::end_to_end(std::sync::Arc::clone(&store), &p).await?;
        store.close().await?;
        eprintln!(
            "  end-to-end: {} p50 {} µs p99 {} µs peak RSS {}",
            fmt_rate(e.rate),
            e.p50_us,
            e.p99_us,
            fmt_mib(e.peak_rss_kb)
        );
        s.e2e.push(e.rate);
        s.p50.push(e.p50_us);
        s.p99.push(e.p99_us);
        s.rss.push(e.peak_rss_kb);
        let hot_params = Params { keys: 1, ..p };
        let store = stores::fresh(backend, &t).await?;
        let h = pipeline::end_to_end(std::sync::Arc::clone(&store), &hot_params).await?;
        store.close().await?;
        eprintln!("  hot key end-to-end: {}", fmt_rate(h.rate));
        s.hot.push(h.rate);
        let store = stores::fresh(backend, &t).await?;
        let d = pipeline::dispatch_only(std::sync::Arc::clone(&store), &p, None).await?;
        store.close().await?;
        eprintln!("  dispatch-only: {}", fmt_rate(d));
        s.dispatch.push(d);
        if backend == Backend::Postgres {
            let store = stores::fresh(backend, &t).await?;
            let url = t.postgres.clone();
            let d = pipeline::dispatch_only(std::sync::Arc::clone(&store), &p, Some(&url)).await?;
            store.close().await?;
            eprintln!("  dispatch-only after ANALYZE: {}", fmt_rate(d));
            s.dispatch_analyzed.push(d);
        }
        let store = stores::fresh(backend, &t).await?;
        let c = pipeline::commit(std::sync::Arc::clone(&store), &p).await?;
        store.close().await?;
        eprintln!("  commit: {}", fmt_rate(c));
        s.commit.push(c);
        #[cfg(feature = "apalis")]
        match peer::run(backend, &t, &p).await {
            Ok(Some(r)) => {
                eprintln!("  apalis: {}", fmt_rate(r));
                s.apalis.push(r);
            }
            Ok(None) => s.apalis_note = Some("no apalis backend".to_owned()),
            Err(error) => {
                eprintln!("  apalis failed: {error}");
                s.apalis_note = Some(format!("failed: {error}"));
            }
        }
        #[cfg(not(feature = "apalis"))]
        {
            s.apalis_note = Some("not built (--features apalis)".to_owned());
        }
    }
    Ok(s)
}

async fn suite(args: &Args) -> Result<(), BoxError> {
    let p = args.params();
    let mut rows = Vec::new();
    for &backend in &args.stores {
        let s = suite_store(backend, args).await?;
        rows.push((backend, s));
    }
    println!(
        "\n### Suite: {} events, {} keys, {} partition(s), concurrency {}, payload {} B, overlap_delivery {}, ack window {}, median of {} (limit probe: {} rows, slices of 100)\n",
        p.events,
        p.keys,
        p.partitions,
        p.concurrency,
        p.payload,
        p.overlap,
        window_label(&p),
        args.reps,
        args.probe_events
    );
    println!(
        "| store | limit batched | limit per-event | end-to-end | e2e / batched | hot key (1 key) | hot / per-event | dispatch-only | dispatch / batched | commit (items) | p50 | p99 | peak RSS | apalis | apalis / batched |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (backend, s) in &rows {
        let lb = median(&s.limit_batched);
        let lp = median(&s.limit_per_event);
        let e2e = median(&s.e2e);
        let hot = median(&s.hot);
        let dispatch = median(&s.dispatch);
        let apalis = median(&s.apalis);
        let apalis_text = if s.apalis.is_empty() {
            s.apalis_note.clone().unwrap_or_else(|| "—".to_owned())
        } else {
            fmt_rate(apalis)
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2} ms | {:.2} ms | {} | {} | {} |",
            args.label(*backend),
            fmt_rate(lb),
            fmt_rate(lp),
            fmt_rate(e2e),
            fmt_ratio(e2e, lb),
            fmt_rate(hot),
            fmt_ratio(hot, lp),
            fmt_rate(dispatch),
            fmt_ratio(dispatch, lb),
            fmt_rate(median(&s.commit)),
            as_f64(median_u64(&s.p50)) / 1000.0,
            as_f64(median_u64(&s.p99)) / 1000.0,
            fmt_mib(median_u64(&s.rss)),
            apalis_text,
            fmt_ratio(apalis, lb),
        );
    }
    let calls = pipeline::calls_per_page(&p).await?;
    let total: f64 = calls.iter().map(|(_, n)| n).sum();
    let each: Vec<String> = calls.iter().map(|(op, n)| format!("{op} {n:.2}")).collect();
    println!(
        "\nStore calls per page of 100 events, end to end (counted on the memory store; every store gets the same calls): {total:.2} in all: {}",
        each.join(", ")
    );
    println!("\nEvery repetition (events/s):\n");
    for (backend, s) in &rows {
        let list = |v: &[f64]| {
            v.iter()
                .map(|x| format!("{x:.0}"))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        println!(
            "- {}: limit batched {} · per-event {} · e2e {} · hot {} · dispatch {} · commit {} · apalis {}",
            args.label(*backend),
            list(&s.limit_batched),
            list(&s.limit_per_event),
            list(&s.e2e),
            list(&s.hot),
            list(&s.dispatch),
            list(&s.commit),
            list(&s.apalis)
        );
        if !s.dispatch_analyzed.is_empty() {
            println!(
                "  - {}: dispatch-only with the tables ANALYZEd after the pre-fill (diagnostic): {} (median {})",
                backend.name(),
                list(&s.dispatch_analyzed),
                fmt_rate(median(&s.dispatch_analyzed))
            );
        }
    }
    Ok(())
}

/// `None` reads "off".
fn window_label(p: &Params) -> String {
    p.ack_window.map_or_else(
        || "off".to_owned(),
        |n| format!("{n} ({} ms)", p.ack_delay.as_millis()),
    )
}

/// One end-to-end run per x value on a fresh store, with `params(x)`.
async fn series(
    args: &Args,
    backend: Backend,
    xs: &[u64],
    params: impl Fn(u64) -> Params,
) -> Result<plot::Series, BoxError> {
    let mut points = Vec::new();
    for &x in xs {
        let p = params(x);
        let store = stores::fresh(backend, &args.targets(p.concurrency)).await?;
        let r = pipeline::end_to_end(std::sync::Arc::clone(&store), &p)
            .await?
            .rate;
        store.close().await?;
        eprintln!(
            "[{}] concurrency {} keys {} ack window {}: {}",
            backend.name(),
            p.concurrency,
            p.keys,
            window_label(&p),
            fmt_rate(r)
        );
        points.push((as_f64(x), r));
    }
    Ok(plot::Series {
        label: args.label(backend),
        points,
    })
}

/// One sweep: its title, its plot's (shorter) title, x axis, x values, one series per store and
/// its plot's file name.
struct Sweep {
    title: String,
    plot_title: String,
    x_name: &'static str,
    xs: Vec<u64>,
    series: Vec<plot::Series>,
    file: &'static str,
}

async fn sweep(args: &Args) -> Result<(), BoxError> {
    let base = args.params();
    let to_u64 = |v: &[usize]| -> Vec<u64> {
        v.iter()
            .map(|&x| u64::try_from(x).unwrap_or(u64::MAX))
            .collect()
    };
    let mut sweeps = [
        Sweep {
            title: format!(
                "End-to-end events/s against concurrency ({} keys, ack window {})",
                base.keys,
                window_label(&base)
            ),
            plot_title: format!("Throughput vs concurrency ({} keys)", base.keys),
            x_name: "concurrency",
            xs: to_u64(&args.sweep_concurrency),
            series: Vec::new(),
            file: "throughput-vs-concurrency.png",
        },
        Sweep {
            title: format!(
                "End-to-end events/s against keys (concurrency {}, ack window {})",
                base.concurrency,
                window_label(&base)
            ),
            plot_title: format!("Throughput vs keys (concurrency {})", base.concurrency),
            x_name: "keys",
            xs: args.sweep_keys.clone(),
            series: Vec::new(),
            file: "throughput-vs-keys.png",
        },
        Sweep {
            title: format!(
                "End-to-end events/s against the ack window ({} keys, concurrency {}, max delay {} ms)",
                base.keys,
                base.concurrency,
                base.ack_delay.as_millis()
            ),
            plot_title: format!(
                "Throughput vs ack window ({} keys, concurrency {})",
                base.keys, base.concurrency
            ),
            x_name: "ack window",
            xs: to_u64(&args.sweep_ack_window),
            series: Vec::new(),
            file: "throughput-vs-ack-window.png",
        },
    ];
    println!(
        "\n### Sweep: end-to-end events/s, {} events, payload {} B, overlap_delivery {}, one run per point\n",
        base.events, base.payload, base.overlap
    );
    for &backend in &args.stores {
        let [by_concurrency, by_keys, by_window] = &mut sweeps;
        by_concurrency.series.push(
            series(args, backend, &by_concurrency.xs, |c| Params {
                concurrency: usize::try_from(c).unwrap_or(usize::MAX),
                ..base
            })
            .await?,
        );
        by_keys
            .series
            .push(series(args, backend, &by_keys.xs, |keys| Params { keys, ..base }).await?);
        by_window.series.push(
            series(args, backend, &by_window.xs, |n| Params {
                ack_window: Some(usize::try_from(n).unwrap_or(usize::MAX)),
                ..base
            })
            .await?,
        );
    }
    for sweep in &sweeps {
        println!("\n{}:\n", sweep.title);
        let xs: Vec<String> = sweep.xs.iter().map(ToString::to_string).collect();
        println!("| store \\ {} | {} |", sweep.x_name, xs.join(" | "));
        println!("|---|{}", "---:|".repeat(xs.len()));
        for s in &sweep.series {
            let cells: Vec<String> = s.points.iter().map(|p| fmt_rate(p.1)).collect();
            println!("| {} | {} |", s.label, cells.join(" | "));
        }
    }
    match plot::register_font(args.font.as_deref()) {
        Ok(()) => {
            std::fs::create_dir_all(&args.plots)?;
            for sweep in &sweeps {
                let path = args.plots.join(sweep.file);
                plot::chart(
                    &path,
                    &format!("{}, {} events", sweep.plot_title, base.events),
                    sweep.x_name,
                    &sweep.series,
                )?;
                eprintln!("plot: {}", path.display());
            }
        }
        Err(error) => eprintln!("plots skipped: {error}"),
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    match args.mode {
        Mode::Suite => suite(&args).await,
        Mode::Sweep => sweep(&args).await,
        Mode::Tenants => {
            let backends: Vec<(Backend, String)> =
                args.stores.iter().map(|&b| (b, args.label(b))).collect();
            // The daemon runs up to 64 keys at once: size the Postgres pool for them.
            tenants::report(
                &backends,
                &args.targets(64),
                &args.tenants,
                std::time::Duration::from_secs(args.tenants_seconds),
            )
            .await
        }
        Mode::TenantsShared => {
            // Each engine has a pool of its own: 3 x 22 connections stay under Postgres's 100.
            tenants::shared_report(
                &args.targets(20),
                args.tenants.iter().copied().max().unwrap_or(10_000),
                usize::try_from(args.instances)?,
                std::time::Duration::from_secs(args.tenants_seconds),
            )
            .await
        }
        Mode::Memory => {
            memory::report(
                &args.stores,
                &args.targets(args.concurrency),
                args.events,
                args.drain_limit.unwrap_or(u64::MAX),
                &args.scan_items,
                args.payload,
            )
            .await
        }
    }
}
