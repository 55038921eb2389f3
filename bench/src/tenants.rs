//! The `tenants` mode: one poller with N partitions (one per tenant), each asked to be polled
//! every second, run first by one `tick` and then by the daemon for an idle window.
//!
//! Every partition's fetch answers the same 5 items from memory (no HTTP), so after the first
//! round (which creates the snapshots) each poll is an idle cycle: the figures are the engine's
//! and the store's cost of keeping N keys on schedule.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use watukuy_core::cursor;
use watukuy_core::delivery::Unsubscribe;
use watukuy_core::schedule::ScheduleOptions;
use watukuy_core::{
    BoxError, Engine, Event, FetchContext, HandlerContext, HandlerError, Page, Partition, Poller,
    StopOptions, TickOptions,
    clock::{Clock, SystemClock},
    store::Store,
};
use watukuy_testkit::{FaultyStore, LeaseAudit, Op};

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
/// Every store operation `FaultyStore` counts by name (its total counts the others too).
const OPS: [Op; 15] = [
    Op::Claim,
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
    Op::StreamIdentities,
];

/// Fetches counted across the instances of a run.
struct Tally {
    /// Fetches of every partition (`p<i>` at index i).
    per_partition: Vec<AtomicU64>,
    /// Fetches of each partition in flight right now.
    in_flight: Vec<AtomicU64>,
    /// Fetches that began while another fetch of the same partition was in flight.
    overlaps: AtomicU64,
}

impl Tally {
    fn new(n: usize) -> Self {
        Self {
            per_partition: (0..n).map(|_| AtomicU64::new(0)).collect(),
            in_flight: (0..n).map(|_| AtomicU64::new(0)).collect(),
            overlaps: AtomicU64::new(0),
        }
    }

    fn fetches(&self, key: &str) -> u64 {
        counter(&self.per_partition, key).map_or(0, |c| c.load(Ordering::Relaxed))
    }
}

/// The tenants poller: N partitions `p0..`, each answering the same items, due every second;
/// every fetch counted in `mine` (this instance) and `tally` (all instances).
fn tenant_poller(
    n: usize,
    items: &Arc<Vec<serde_json::Value>>,
    mine: &Arc<AtomicU64>,
    tally: &Arc<Tally>,
) -> Result<Poller, BoxError> {
    let keys: Arc<Vec<String>> = Arc::new((0..n).map(|i| format!("p{i}")).collect());
    let (items, mine, tally) = (Arc::clone(items), Arc::clone(mine), Arc::clone(tally));
    Ok(Poller::builder::<serde_json::Value>(POLLER)
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
            mine.fetch_add(1, Ordering::Relaxed);
            let key = ctx.partition.key.clone();
            let page = Page::new(items.as_ref().clone());
            let tally = Arc::clone(&tally);
            async move {
                if let Some(c) = counter(&tally.per_partition, &key) {
                    c.fetch_add(1, Ordering::Relaxed);
                }
                let in_flight = counter(&tally.in_flight, &key);
                if in_flight.is_some_and(|c| c.fetch_add(1, Ordering::AcqRel) > 0) {
                    tally.overlaps.fetch_add(1, Ordering::Relaxed);
                }
                // Holds the fetch open across a scheduling point, so that another
                // instance's fetch of the key at the same time would be seen.
                tokio::task::yield_now().await;
                if let Some(c) = in_flight {
                    c.fetch_sub(1, Ordering::AcqRel);
                }
                Ok::<_, BoxError>(page)
            }
        })
        .build()?)
}

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
    pub(crate) calls_by_op: Vec<(String, f64)>,
    /// Peak RSS of the run (`VmHWM`, reset before the store is opened), kB.
    pub(crate) peak_rss_kb: u64,
    /// RSS after the window minus RSS before the engine was built, per partition, kB.
    pub(crate) rss_kb_per_partition: f64,
    /// Wall time from `trigger` to that partition's fetch, ms (`None`: not seen in 30 s).
    pub(crate) trigger_ms: Option<f64>,
    /// Wall time of one `inspect()` of every partition (the daemon still running), ms.
    pub(crate) inspect_ms: f64,
}

/// An engine on `store` as `instance` with the tenants poller and a no-op handler (kept
/// attached while the returned handle lives).
fn tenant_engine(
    store: &Arc<FaultyStore>,
    poller: Poller,
    instance: &str,
) -> Result<(Engine, Unsubscribe), BoxError> {
    let engine = Engine::builder(Arc::clone(store) as Arc<dyn Store>)
        .poller(poller)
        .instance_id(instance)
        .build()?;
    let handler = engine.on(POLLER, |_event: Event, _ctx: HandlerContext| {
        futures::future::ready(Ok::<(), HandlerError>(()))
    })?;
    Ok((engine, handler))
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
    let tally = Arc::new(Tally::new(n));
    let rss_before_kb = rss_kb();
    // The peak covers this run only (where the kernel supports the reset).
    reset_peak_rss();
    let poller = tenant_poller(n, &items, &fetches, &tally)?;
    let (engine, _handler) = tenant_engine(&store, poller, "bench-tenants")?;

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
    let (fetch_start, calls_start, total_start, cpu_start) = (
        fetches.load(Ordering::Relaxed),
        store_calls(&store),
        store.total_calls(),
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
    let calls = store.total_calls().saturating_sub(total_start);
    let cpu_s = as_f64(cpu_ticks().saturating_sub(cpu_start)) / CLK_TCK;
    let rss_after_kb = rss_kb();
    let peak = peak_rss_kb();

    // A trigger of the middle partition, timed to its fetch.
    let target = format!("p{}", n / 2);
    let seen = tally.fetches(&target);
    let watch = Stopwatch::start();
    engine.trigger(POLLER, Some(&target)).await?;
    let mut trigger_ms = None;
    while watch.elapsed() < TRIGGER_TIMEOUT {
        if tally.fetches(&target) > seen {
            trigger_ms = Some(watch.elapsed().as_secs_f64() * 1000.0);
            break;
        }
        SystemClock.sleep(Duration::from_millis(1)).await;
    }
    let watch = Stopwatch::start();
    let inspected = engine.inspect().await?;
    let inspect_ms = watch.elapsed().as_secs_f64() * 1000.0;
    if inspected.pollers.len() != n {
        return Err(format!("inspect saw {} partitions of {n}", inspected.pollers.len()).into());
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
        calls_by_op: per_op(&by_op, calls, polls_f),
        peak_rss_kb: peak,
        rss_kb_per_partition: (as_f64(rss_after_kb) - as_f64(rss_before_kb)) / as_f64(tenants),
        trigger_ms,
        inspect_ms,
    })
}

/// Calls per poll of each operation called at least once, then `other` (the calls `OPS` does
/// not name) when there were some.
fn per_op(by_op: &[(Op, u64)], total: u64, polls: f64) -> Vec<(String, f64)> {
    let named: u64 = by_op.iter().map(|(_, c)| c).sum();
    by_op
        .iter()
        .map(|(op, c)| (format!("{op:?}"), *c))
        .chain(std::iter::once((
            "other".to_owned(),
            total.saturating_sub(named),
        )))
        .filter(|(_, c)| *c > 0)
        .map(|(op, c)| (op, as_f64(c) / polls))
        .collect()
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
                "  tick {} achieved {} cpu {:.3} ms/poll calls {:.2}/poll trigger {:?} ms inspect {:.1} ms",
                fmt_rate(r.tick_rate),
                fmt_rate(r.achieved),
                r.cpu_ms_per_poll,
                r.calls_per_poll,
                r.trigger_ms,
                r.inspect_ms
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
        "| store | N | polls/s asked (N) | polls/s achieved | achieved / tick | achieved / min(N, tick) | s between polls | CPU ms per poll | store calls per idle poll | peak RSS MB | RSS KB per partition | trigger latency ms | inspect ms | tick polls/s |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (label, runs) in &rows {
        for r in runs {
            let asked = as_f64(r.tenants);
            let between = if r.achieved > 0.0 {
                format!("{:.2}", asked / r.achieved)
            } else {
                "—".to_owned()
            };
            println!(
                "| {label} | {} | {} | {} | {} | {} | {between} | {:.3} | {:.2} | {:.1} | {:.2} | {} | {:.1} | {} |",
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
                r.inspect_ms,
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
                .map(|(op, c)| format!("{op} {c:.2}"))
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

/// What the shared run measured: several engines on one Postgres schema.
#[derive(Clone, Debug, Default)]
pub(crate) struct SharedRun {
    /// Partitions shared by the instances.
    pub(crate) tenants: u64,
    /// Fetches per instance during the idle window.
    pub(crate) polls: Vec<u64>,
    /// All instances' fetches per second during the idle window.
    pub(crate) achieved: f64,
    /// Store calls per poll, all instances together.
    pub(crate) calls_per_poll: f64,
    /// Process CPU per poll (all instances run in this process), ms.
    pub(crate) cpu_ms_per_poll: f64,
    /// Fetches of a partition that began while another fetch of it was in flight.
    pub(crate) overlapping_fetches: u64,
    /// Lease violations the audit saw (two owners holding one key's unexpired lease, a
    /// superseded lease's write accepted).
    pub(crate) lease_violations: Vec<String>,
    /// Leases the audit saw granted.
    pub(crate) acquisitions: u64,
}

/// Several engines (`instances`), each with a store of its own on one Postgres schema (as many
/// processes would be), sharing `tenants` partitions: a first round by each engine's `tick` at
/// once, then every daemon idle for `window`. Every lease is audited across the instances and
/// every fetch checked for an overlap with another fetch of its partition.
pub(crate) async fn shared(
    t: &Targets,
    tenants: u64,
    instances: usize,
    window: Duration,
) -> Result<SharedRun, BoxError> {
    let n = usize::try_from(tenants)?;
    // The first store creates the schema; the others open it as it is.
    let first = stores::fresh(Backend::Postgres, t).await?;
    let audit = Arc::new(LeaseAudit::new());
    let items: Arc<Vec<serde_json::Value>> =
        Arc::new((0..ITEMS).map(|i| workload::item(i, 64)).collect());
    let tally = Arc::new(Tally::new(n));
    let mut members = Vec::new();
    for i in 0..instances {
        let inner = if i == 0 {
            Arc::clone(&first)
        } else {
            stores::postgres(t).await?
        };
        let store = Arc::new(FaultyStore::new(inner).with_audit(Arc::clone(&audit)));
        let fetches = Arc::new(AtomicU64::new(0));
        let poller = tenant_poller(n, &items, &fetches, &tally)?;
        let (engine, handler) = tenant_engine(&store, poller, &format!("bench-shared-{i}"))?;
        members.push((engine, store, fetches, handler));
    }

    // The first round: every engine ticks at once; a key goes to whichever claims it first.
    let ticks = members
        .iter()
        .map(|(engine, ..)| engine.tick(TickOptions::default().concurrency(TICK_CONCURRENCY)));
    for report in futures::future::try_join_all(ticks).await? {
        if let Some(error) = report.polled.iter().find_map(|r| r.error.as_ref()) {
            return Err(format!("first tick failed: {}", error.message).into());
        }
    }
    let unpolled = (0..n)
        .filter(|i| tally.fetches(&format!("p{i}")) == 0)
        .count();
    if unpolled > 0 {
        return Err(format!("the first round left {unpolled} partitions unpolled").into());
    }

    let before: Vec<(u64, u64)> = members
        .iter()
        .map(|(_, store, fetches, _)| (fetches.load(Ordering::Relaxed), store.total_calls()))
        .collect();
    let cpu_start = cpu_ticks();
    let watch = Stopwatch::start();
    for (engine, ..) in &members {
        engine.start().await?;
    }
    SystemClock.sleep(window).await;
    let elapsed = watch.elapsed();
    let cpu_s = as_f64(cpu_ticks().saturating_sub(cpu_start)) / CLK_TCK;
    let after: Vec<(u64, u64)> = members
        .iter()
        .map(|(_, store, fetches, _)| (fetches.load(Ordering::Relaxed), store.total_calls()))
        .collect();
    for (engine, ..) in &members {
        engine.stop(StopOptions::default()).await?;
    }
    let polls: Vec<u64> = after
        .iter()
        .zip(&before)
        .map(|(a, b)| a.0.saturating_sub(b.0))
        .collect();
    let calls: u64 = after
        .iter()
        .zip(&before)
        .map(|(a, b)| a.1.saturating_sub(b.1))
        .sum();
    for (_, store, ..) in &members {
        store.close().await?;
    }
    drop(members);
    drop_schema(&t.postgres).await?;
    let total: u64 = polls.iter().sum();
    let polls_f = as_f64(total.max(1));
    Ok(SharedRun {
        tenants,
        achieved: rate(total, elapsed),
        calls_per_poll: as_f64(calls) / polls_f,
        cpu_ms_per_poll: cpu_s * 1000.0 / polls_f,
        polls,
        overlapping_fetches: tally.overlaps.load(Ordering::Relaxed),
        lease_violations: audit.violations(),
        acquisitions: audit.acquisitions(),
    })
}

/// The shared run's report, printed as Markdown.
pub(crate) async fn shared_report(
    t: &Targets,
    tenants: u64,
    instances: usize,
    window: Duration,
) -> Result<(), BoxError> {
    eprintln!("[postgres] {instances} instances sharing {tenants} tenants, idle window {window:?}");
    let r = shared(t, tenants, instances, window).await?;
    let total: u64 = r.polls.iter().sum();
    println!(
        "\n### Tenants shared: {instances} engines (a store each) on one PostgreSQL schema, {tenants} partitions polled every second, idle window {} s\n",
        window.as_secs()
    );
    println!("| instance | polls in the window | share of the polls |\n|---|---:|---:|");
    for (i, polls) in r.polls.iter().enumerate() {
        println!(
            "| bench-shared-{i} | {polls} | {:.1} % |",
            as_f64(*polls) * 100.0 / as_f64(total.max(1))
        );
    }
    println!();
    println!(
        "- all instances: {} polls/s ({:.2} s between polls of one partition), {:.2} store calls per poll, {:.3} ms CPU per poll (the process of all {instances})",
        fmt_rate(r.achieved),
        if r.achieved > 0.0 {
            as_f64(r.tenants) / r.achieved
        } else {
            f64::INFINITY
        },
        r.calls_per_poll,
        r.cpu_ms_per_poll
    );
    println!(
        "- overlapping fetches of one partition: {}; lease violations (audit of {} leases granted): {}",
        r.overlapping_fetches,
        r.acquisitions,
        r.lease_violations.len()
    );
    for violation in r.lease_violations.iter().take(10) {
        println!("  - {violation}");
    }
    Ok(())
}
