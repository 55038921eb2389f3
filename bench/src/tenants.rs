//! The `tenants` mode: one poller with N partitions (one per tenant), each asked to be polled
//! every second, run first by one `tick` and then by the daemon for an idle window.
//!
//! Every partition's fetch answers the same 5 items from memory (no HTTP), so after the first
//! round (which creates the snapshots) each poll is an idle cycle: the figures are the engine's
//! and the store's cost of keeping N keys on schedule.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use watukuy_conformance::{FaultyStore, Op};
use watukuy_core::cursor;
use watukuy_core::schedule::ScheduleOptions;
use watukuy_core::{
    BoxError, Clock, Engine, Event, FetchContext, HandlerContext, HandlerError, Page, Partition,
    Poller, StopOptions, Store, SystemClock, TickOptions,
};

use crate::measure::{
    Stopwatch, as_f64, fmt_rate, fmt_ratio, peak_rss_kb, rate, reset_peak_rss, rss_kb,
};
use crate::stores::{self, Backend, PG_SCHEMA, Targets};
use crate::workload;

/// The poller's name.
const POLLER: &str = "tenants";
/// Items every partition's fetch answers.
const ITEMS: u64 = 5;
/// Keys the first round's `tick` runs at once.
const TICK_CONCURRENCY: usize = 16;
/// The longest wait for a triggered partition's fetch.
const TRIGGER_TIMEOUT: Duration = Duration::from_secs(30);
/// Every store operation `FaultyStore` counts.
const OPS: [Op; 13] = [
    Op::AcquireLease,
    Op::RenewLease,
    Op::ReleaseLease,
    Op::SaveState,
    Op::CommitPoll,
    Op::LoadPending,
    Op::AckEvents,
    Op::RecordAttempt,
    Op::ParkEvent,
    Op::LoadState,
    Op::HeldKeys,
    Op::Counts,
    Op::LoadVersions,
];

/// What one (store, N) run measured.
#[derive(Clone, Debug, Default)]
pub(crate) struct TenantRun {
    /// Partitions (tenants), each asked to be polled once a second.
    pub(crate) tenants: u64,
    /// Polls/s of the first round through `tick` (concurrency 16).
    pub(crate) tick_rate: f64,
    /// Fetch calls/s while the daemon ran idle.
    pub(crate) achieved: f64,
    /// Process CPU time per idle poll, ms.
    pub(crate) cpu_ms_per_poll: f64,
    /// Counted store calls per idle poll.
    pub(crate) calls_per_poll: f64,
    /// The same, per operation (those called at least once).
    pub(crate) calls_by_op: Vec<(Op, f64)>,
    /// Peak RSS of the run (`VmHWM`, reset before the store is opened), kB.
    pub(crate) peak_rss_kb: u64,
    /// RSS after the window minus RSS before the engine was built, per partition, kB.
    pub(crate) rss_kb_per_partition: f64,
    /// Wall time from `trigger` to that partition's fetch, ms (`None`: not seen in 30 s).
    pub(crate) trigger_ms: Option<f64>,
}

/// The process's CPU time (user + system) in clock ticks, from `/proc/self/stat` (0 if unknown).
fn cpu_ticks() -> u64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0;
    };
    // The command name (field 2) may hold spaces; the fields after its ')' start at field 3.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15, i.e. 11 and 12 after field 2.
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    field(11) + field(12)
}

/// Clock ticks per second of `/proc/self/stat` (`sysconf(_SC_CLK_TCK)`, 100 on Linux; the bench
/// does not depend on `libc`, so it is assumed).
const CLK_TCK: f64 = 100.0;

/// Every counted store call so far, per operation.
fn store_calls(store: &FaultyStore) -> [u64; OPS.len()] {
    OPS.map(|op| store.calls(op))
}

/// The per-partition fetch counter of key `p<i>`.
fn counter<'a>(counts: &'a [AtomicU64], key: &str) -> Option<&'a AtomicU64> {
    key.strip_prefix('p')
        .and_then(|i| i.parse::<usize>().ok())
        .and_then(|i| counts.get(i))
}

/// One run: a fresh store of `backend`, N partitions, a first round through `tick`, then the
/// daemon idle for `window`, a trigger, and a stop.
pub(crate) async fn run(
    backend: Backend,
    t: &Targets,
    tenants: u64,
    window: Duration,
) -> Result<TenantRun, BoxError> {
    let n = usize::try_from(tenants)?;
    let inner = stores::fresh(backend, t).await?;
    let store = Arc::new(FaultyStore::new(Arc::clone(&inner)));
    let items: Arc<Vec<serde_json::Value>> =
        Arc::new((0..ITEMS).map(|i| workload::item(i, 64)).collect());
    let fetches = Arc::new(AtomicU64::new(0));
    let per_partition: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
    let keys: Arc<Vec<String>> = Arc::new((0..n).map(|i| format!("p{i}")).collect());
    let rss_before_kb = rss_kb();
    // The peak covers this run only (where the kernel supports the reset).
    reset_peak_rss();
    let (fetch_items, fetch_count, fetch_each) = (
        Arc::clone(&items),
        Arc::clone(&fetches),
        Arc::clone(&per_partition),
    );
    let poller = Poller::builder::<serde_json::Value>(POLLER)
        .identity_field("id")
        .cursor(cursor::snapshot_diff())
        .schedule(
            ScheduleOptions::default()
                .min(Duration::from_secs(1))
                .max(Duration::from_secs(1))
                .jitter(0.0),
        )
        .partitions(
            move || {
                let list = keys.iter().cloned().map(Partition::new).collect();
                async move { Ok::<_, BoxError>(list) }
            },
            Duration::from_secs(3_600),
        )
        .fetch(move |ctx: FetchContext| {
            fetch_count.fetch_add(1, Ordering::Relaxed);
            if let Some(c) = counter(&fetch_each, &ctx.partition.key) {
                c.fetch_add(1, Ordering::Relaxed);
            }
            let page = Page::new(fetch_items.as_ref().clone());
            async move { Ok::<_, BoxError>(page) }
        })
        .build()?;
    let engine = Engine::builder(Arc::clone(&store) as Arc<dyn Store>)
        .poller(poller)
        .instance_id("bench-tenants")
        .build()?;
    let _handler = engine.on(POLLER, |_event: Event, _ctx: HandlerContext| {
        futures::future::ready(Ok::<(), HandlerError>(()))
    })?;

    // The first round: every key is due; it creates the snapshots.
    let watch = Stopwatch::start();
    let first = engine
        .tick(TickOptions::default().concurrency(TICK_CONCURRENCY))
        .await?;
    let tick_elapsed = watch.elapsed();
    if let Some(error) = first.polled.iter().find_map(|r| r.error.as_ref()) {
        return Err(format!("first tick failed: {}", error.message).into());
    }
    let created: u64 = first.polled.iter().map(|r| r.events).sum();
    if created != tenants * ITEMS {
        return Err(format!(
            "first tick created {created} events, expected {}",
            tenants * ITEMS
        )
        .into());
    }
    let tick_rate = rate(tenants, tick_elapsed);

    // The idle window under the daemon.
    let (fetch_start, calls_start, cpu_start) = (
        fetches.load(Ordering::Relaxed),
        store_calls(&store),
        cpu_ticks(),
    );
    let watch = Stopwatch::start();
    engine.start().await?;
    SystemClock.sleep(window).await;
    let elapsed = watch.elapsed();
    let polls = fetches.load(Ordering::Relaxed).saturating_sub(fetch_start);
    let by_op: Vec<(Op, u64)> = OPS
        .into_iter()
        .zip(store_calls(&store).into_iter().zip(calls_start))
        .map(|(op, (after, before))| (op, after.saturating_sub(before)))
        .collect();
    let calls: u64 = by_op.iter().map(|(_, c)| c).sum();
    let cpu_s = as_f64(cpu_ticks().saturating_sub(cpu_start)) / CLK_TCK;
    let rss_after_kb = rss_kb();
    let peak = peak_rss_kb();

    // A trigger of the middle partition, timed to its fetch.
    let target = format!("p{}", n / 2);
    let seen = counter(&per_partition, &target)
        .ok_or("no middle partition")?
        .load(Ordering::Relaxed);
    let watch = Stopwatch::start();
    engine.trigger(POLLER, Some(&target)).await?;
    let mut trigger_ms = None;
    while watch.elapsed() < TRIGGER_TIMEOUT {
        if counter(&per_partition, &target).is_some_and(|c| c.load(Ordering::Relaxed) > seen) {
            trigger_ms = Some(watch.elapsed().as_secs_f64() * 1000.0);
            break;
        }
        SystemClock.sleep(Duration::from_millis(1)).await;
    }
    engine.stop(StopOptions::default()).await?;
    drop(engine);
    store.close().await?;
    if backend == Backend::Postgres {
        drop_schema(&t.postgres).await?;
    }
    let polls_f = as_f64(polls.max(1));
    Ok(TenantRun {
        tenants,
        tick_rate,
        achieved: rate(polls, elapsed),
        cpu_ms_per_poll: cpu_s * 1000.0 / polls_f,
        calls_per_poll: as_f64(calls) / polls_f,
        calls_by_op: by_op
            .into_iter()
            .filter(|(_, c)| *c > 0)
            .map(|(op, c)| (op, as_f64(c) / polls_f))
            .collect(),
        peak_rss_kb: peak,
        rss_kb_per_partition: (as_f64(rss_after_kb) - as_f64(rss_before_kb)) / as_f64(tenants),
        trigger_ms,
    })
}

/// Drops the benchmark schema (a run's fresh schema does not outlive it).
async fn drop_schema(url: &str) -> Result<(), BoxError> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await?;
    sqlx::query(&format!("DROP SCHEMA IF EXISTS \"{PG_SCHEMA}\" CASCADE"))
        .execute(&pool)
        .await?;
    pool.close().await;
    Ok(())
}

/// The log-log slope of CPU per poll from the smallest to the largest N of `runs`.
fn cpu_slope(runs: &[TenantRun]) -> Option<f64> {
    let first = runs.iter().min_by_key(|r| r.tenants)?;
    let last = runs.iter().max_by_key(|r| r.tenants)?;
    if last.tenants == first.tenants || first.cpu_ms_per_poll <= 0.0 || last.cpu_ms_per_poll <= 0.0
    {
        return None;
    }
    Some(
        (last.cpu_ms_per_poll / first.cpu_ms_per_poll).ln()
            / (as_f64(last.tenants) / as_f64(first.tenants)).ln(),
    )
}

/// The whole report: every store at every N, printed as Markdown.
pub(crate) async fn report(
    backends: &[(Backend, String)],
    t: &Targets,
    tenants: &[u64],
    window: Duration,
) -> Result<(), BoxError> {
    let mut rows = Vec::new();
    for (backend, label) in backends {
        let mut runs = Vec::new();
        for &n in tenants {
            eprintln!("[{}] {n} tenants, idle window {window:?}", backend.name());
            let r = run(*backend, t, n, window).await?;
            eprintln!(
                "  tick {} achieved {} cpu {:.3} ms/poll calls {:.2}/poll trigger {:?} ms",
                fmt_rate(r.tick_rate),
                fmt_rate(r.achieved),
                r.cpu_ms_per_poll,
                r.calls_per_poll,
                r.trigger_ms
            );
            runs.push(r);
        }
        rows.push((label.clone(), runs));
    }
    println!(
        "\n### Tenants: one poller, N partitions polled every second (min = max = 1 s, jitter 0), 5 items each from memory, idle window {} s, first round by tick (concurrency {TICK_CONCURRENCY}), then the daemon (max_concurrent_keys 64)\n",
        window.as_secs()
    );
    println!(
        "| store | N | polls/s asked (N) | polls/s achieved | achieved / tick | achieved / min(N, tick) | s between polls | CPU ms per poll | store calls per idle poll | peak RSS MB | RSS KB per partition | trigger latency ms | tick polls/s |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (label, runs) in &rows {
        for r in runs {
            let asked = as_f64(r.tenants);
            let between = if r.achieved > 0.0 {
                format!("{:.2}", asked / r.achieved)
            } else {
                "—".to_owned()
            };
            println!(
                "| {label} | {} | {} | {} | {} | {} | {between} | {:.3} | {:.2} | {:.1} | {:.2} | {} | {} |",
                r.tenants,
                fmt_rate(asked),
                fmt_rate(r.achieved),
                fmt_ratio(r.achieved, r.tick_rate),
                fmt_ratio(r.achieved, asked.min(r.tick_rate)),
                r.cpu_ms_per_poll,
                r.calls_per_poll,
                as_f64(r.peak_rss_kb) / 1024.0,
                r.rss_kb_per_partition,
                r.trigger_ms
                    .map_or_else(|| "not seen".to_owned(), |ms| format!("{ms:.1}")),
                fmt_rate(r.tick_rate),
            );
        }
    }
    println!();
    for (label, runs) in &rows {
        match cpu_slope(runs) {
            Some(s) => println!(
                "- {label}: log-log slope of CPU per poll from N = {} to N = {}: {s:.2}",
                runs.iter().map(|r| r.tenants).min().unwrap_or(0),
                runs.iter().map(|r| r.tenants).max().unwrap_or(0)
            ),
            None => println!("- {label}: slope not computable (one N, or no CPU measured)"),
        }
        if let Some(r) = runs.iter().max_by_key(|r| r.tenants) {
            let each: Vec<String> = r
                .calls_by_op
                .iter()
                .map(|(op, c)| format!("{op:?} {c:.2}"))
                .collect();
            println!(
                "  - store calls per idle poll at N = {}: {}",
                r.tenants,
                each.join(", ")
            );
        }
    }
    Ok(())
}
