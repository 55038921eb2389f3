//! The three measurements on a store: end-to-end (fake API → engine → commit → dispatch →
//! no-op handler → ack, with commit-to-handler latency), dispatch-only (a pre-filled outbox
//! drained by a [`Dispatcher`]) and commit (an engine's tick committing pages of 100 items,
//! with no handler attached).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use watukuy_core::clock::format_rfc3339_ms;
use watukuy_core::cursor;
use watukuy_core::cursor::Cursor;
use watukuy_core::delivery::DEFAULT_DISPATCH_BATCH_SIZE;
use watukuy_core::hooks::{HookContext, Hooks};
use watukuy_core::{
    BoxError, DeliveryOptions, Engine, Event, FetchContext, HandlerContext, HandlerError, Page,
    Partition, Poller, PollerBuilder, TickOptions,
    clock::{Clock, SystemClock},
    delivery::{Dispatcher, DrainContext},
    rng::SystemRng,
    store::{CommitBatch, Lease, OutboxRow, PKey, StatePatch, Store},
};

use crate::measure::{Stopwatch, as_f64, peak_rss_kb, percentile, rate, reset_peak_rss};
use crate::workload::{self, Params};

/// What one end-to-end run measured.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct EndToEnd {
    /// Events/s from the first fetch to the last ack.
    pub(crate) rate: f64,
    /// Median commit-to-handler latency, µs.
    pub(crate) p50_us: u64,
    /// 99th percentile commit-to-handler latency, µs.
    pub(crate) p99_us: u64,
    /// Peak RSS of the run (after a reset of the high-water mark), kB.
    pub(crate) peak_rss_kb: u64,
}

/// Commit instants by sequence, and latencies as the handler sees events.
struct Latency {
    clock: Stopwatch,
    committed: Mutex<Vec<u64>>,
    samples: Mutex<Vec<u64>>,
    delivered: AtomicU64,
}

impl Latency {
    fn new(events: u64) -> Self {
        let n = usize::try_from(events).unwrap_or(0).saturating_add(2);
        Self {
            clock: Stopwatch::start(),
            committed: Mutex::new(vec![0; n]),
            samples: Mutex::new(Vec::with_capacity(n)),
            delivered: AtomicU64::new(0),
        }
    }

    fn committed(&self, event: &Event) {
        let now = self.clock.nanos();
        let mut committed = self
            .committed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = usize::try_from(event.sequence)
            .ok()
            .and_then(|i| committed.get_mut(i))
        {
            *slot = now;
        }
    }

    fn handled(&self, event: &Event) {
        let now = self.clock.nanos();
        let at = usize::try_from(event.sequence).ok().and_then(|i| {
            self.committed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(i)
                .copied()
        });
        if let Some(at) = at.filter(|at| *at > 0) {
            self.samples
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(now.saturating_sub(at) / 1_000);
        }
        self.delivered.fetch_add(1, Ordering::Relaxed);
    }
}

/// Records the commit instant of each event (the engine calls `on_event` right after the
/// page's `commit_poll` returned, before it drains).
struct LatencyHooks(Arc<Latency>);

#[async_trait]
impl Hooks for LatencyHooks {
    async fn on_event(&self, _ctx: &HookContext, event: &Event) {
        self.0.committed(event);
    }
}

/// Delivery options of every run: `concurrency` keys in flight, events keyed round robin over
/// `keys` ordering keys, the ack window when asked for, everything else at its default.
fn delivery(p: &Params) -> DeliveryOptions {
    let keys = p.keys;
    let delivery = DeliveryOptions::default()
        .concurrency(p.concurrency)
        .ordering_key(move |e: &Event| workload::ordering_key(&e.subject, keys));
    match p.ack_window {
        Some(n) => delivery.ack_window(n, p.ack_delay),
        None => delivery,
    }
}

/// End to end: `p.events` items served by an in-process fake API (100 a page, by page number)
/// polled by one engine tick with a page cursor, each page committed and drained to a no-op
/// handler with per-key ordering.
///
/// The fake serves page `n` as a clone of its slice of a prepared list: O(page), so the figure
/// is the engine's and not the fake's (`watukuy_testkit::FakeApi` walks its map from the
/// first item for every page, which cost ~15 % of a 50,000-event memory-store run).
pub(crate) async fn end_to_end(store: Arc<dyn Store>, p: &Params) -> Result<EndToEnd, BoxError> {
    // Partition `j` serves items `j`, `j + partitions`, ...; one partition is the key "".
    let lists: Arc<HashMap<String, Vec<serde_json::Value>>> = Arc::new(
        (0..p.partitions)
            .map(|j| {
                let key = if p.partitions == 1 {
                    String::new()
                } else {
                    format!("t{j}")
                };
                let items = (j..p.events)
                    .step_by(usize::try_from(p.partitions).unwrap_or(usize::MAX))
                    .map(|i| workload::item(i, p.payload))
                    .collect();
                (key, items)
            })
            .collect(),
    );
    let builder = one_pass("bench", p)
        .delivery(delivery(p))
        .overlap_delivery(p.overlap);
    let builder = if p.partitions > 1 {
        let keys: Vec<String> = lists.keys().cloned().collect();
        builder.partitions(
            move || {
                let list = keys.iter().cloned().map(Partition::new).collect();
                async move { Ok::<_, BoxError>(list) }
            },
            Duration::from_secs(3_600),
        )
    } else {
        builder
    };
    let poller = builder
        .fetch(move |ctx: FetchContext| {
            let lists = Arc::clone(&lists);
            async move {
                let items = lists
                    .get(&ctx.partition.key)
                    .ok_or_else(|| format!("the bench has no partition {:?}", ctx.partition.key))?;
                fake_page(items, &ctx.cursor)
            }
        })
        .build()?;
    let latency = Arc::new(Latency::new(p.events));
    let engine = Engine::builder(store)
        .poller(poller)
        .hooks(Arc::new(LatencyHooks(Arc::clone(&latency))))
        .instance_id("bench")
        .build()?;
    let handler_latency = Arc::clone(&latency);
    let _handler = engine.on("bench", move |event: Event, _ctx: HandlerContext| {
        handler_latency.handled(&event);
        futures::future::ready(Ok::<(), HandlerError>(()))
    })?;
    reset_peak_rss();
    let t = Stopwatch::start();
    for _ in 0..5 {
        let tick = engine.tick(TickOptions::default()).await?;
        if let Some(error) = tick.polled.iter().find_map(|r| r.error.as_ref()) {
            return Err(format!("end-to-end tick failed: {}", error.message).into());
        }
        if latency.delivered.load(Ordering::Relaxed) >= p.events {
            break;
        }
    }
    let elapsed = t.elapsed();
    let peak = peak_rss_kb();
    let delivered = latency.delivered.load(Ordering::Relaxed);
    if delivered < p.events {
        return Err(format!("end-to-end delivered {delivered} of {} events", p.events).into());
    }
    let mut samples = std::mem::take(
        &mut *latency
            .samples
            .lock()
            .unwrap_or_else(PoisonError::into_inner),
    );
    Ok(EndToEnd {
        rate: rate(delivered, elapsed),
        p50_us: percentile(&mut samples, 50),
        p99_us: percentile(&mut samples, 99),
        peak_rss_kb: peak,
    })
}

/// Store calls per page of an end-to-end run, counted on a memory store (the engine makes the
/// same calls on every store; only what each call costs differs): `(operation, calls per page)`
/// for every operation called at least once.
pub(crate) async fn calls_per_page(p: &Params) -> Result<Vec<(String, f64)>, BoxError> {
    use watukuy_testkit::{FaultyStore, Op};
    let counted = Arc::new(FaultyStore::new(Arc::new(
        watukuy_store_memory::MemoryStore::new(),
    )));
    end_to_end(Arc::clone(&counted) as Arc<dyn Store>, p).await?;
    let pages = as_f64(p.events.div_ceil(PAGE_SIZE as u64));
    let ops = [
        Op::LoadState,
        Op::AcquireLease,
        Op::RenewLease,
        Op::LoadVersions,
        Op::CommitPoll,
        Op::HeldKeys,
        Op::LoadPending,
        Op::AckEvents,
        Op::Counts,
        Op::SaveState,
        Op::ReleaseLease,
    ];
    Ok(ops
        .into_iter()
        .map(|op| (op, counted.calls(op)))
        .filter(|(_, calls)| *calls > 0)
        .map(|(op, calls)| (format!("{op:?}"), as_f64(calls) / pages))
        .collect())
}

/// Items per page of the end-to-end fake API.
const PAGE_SIZE: usize = 100;

/// Page `cursor` (1-based) of `items`, with `has_more` while pages follow.
fn fake_page(items: &[serde_json::Value], cursor: &Cursor) -> Result<Page, BoxError> {
    let Cursor::Page { page } = cursor else {
        return Err(format!("the bench fake API expects a page cursor, got {cursor:?}").into());
    };
    let start = usize::try_from(page.saturating_sub(1))
        .unwrap_or(usize::MAX)
        .saturating_mul(PAGE_SIZE)
        .min(items.len());
    let end = start.saturating_add(PAGE_SIZE).min(items.len());
    let mut page = Page::new(items[start..end].to_vec());
    page.has_more = Some(end < items.len());
    Ok(page)
}

/// Takes the lease of `key` for the benchmark.
pub(crate) async fn lease(store: &dyn Store, key: &PKey) -> Result<Lease, BoxError> {
    store
        .acquire_lease(key, "bench", 3_600_000, SystemClock.now_ms())
        .await?
        .ok_or_else(|| "the benchmark key is leased by someone else".into())
}

/// Commits `events` pending events (not timed) in batches of 1,000.
pub(crate) async fn prefill(
    store: &dyn Store,
    key: &PKey,
    lease: &Lease,
    events: u64,
    payload: usize,
) -> Result<(), BoxError> {
    let now = SystemClock.now_ms();
    let time = format_rfc3339_ms(now);
    let mut i = 0;
    while i < events {
        let end = (i + 1_000).min(events);
        let rows: Vec<OutboxRow> = (i..end)
            .map(|j| {
                let seq = i64::try_from(j + 1).unwrap_or(i64::MAX);
                OutboxRow::pending(workload::event(&key.poller, j, seq, payload, &time), now)
            })
            .collect();
        let batch = CommitBatch::default()
            .state_patch(StatePatch {
                sequence: Some(i64::try_from(end).unwrap_or(i64::MAX)),
                updated_at: Some(now),
                ..StatePatch::default()
            })
            .events(rows);
        store.commit_poll(key, lease, &batch).await?;
        i = end;
    }
    Ok(())
}

/// A dispatcher for `key.poller` with the run's delivery options and a counting no-op handler.
pub(crate) fn dispatcher(
    store: Arc<dyn Store>,
    poller: &str,
    p: &Params,
    on_event: impl Fn(&Event) + Send + Sync + 'static,
) -> Result<Dispatcher, BoxError> {
    let dispatcher = Dispatcher::new(
        poller,
        store,
        Arc::new(SystemClock),
        Arc::new(SystemRng::new()),
        delivery(p),
        DEFAULT_DISPATCH_BATCH_SIZE,
    )?;
    let handle = dispatcher.on(move |event: Event, _ctx: HandlerContext| {
        on_event(&event);
        futures::future::ready(Ok::<(), HandlerError>(()))
    })?;
    // The handler stays attached for the dispatcher's life.
    std::mem::forget(handle);
    Ok(dispatcher)
}

/// Dispatch only: `p.events` events committed beforehand, then one drain, timed.
///
/// With `analyze` (a Postgres URL), the bench schema's tables are `ANALYZE`d between the
/// pre-fill and the drain: a diagnostic that shows what planner statistics change (see
/// BENCHMARKS.md, "Where the time goes").
pub(crate) async fn dispatch_only(
    store: Arc<dyn Store>,
    p: &Params,
    analyze: Option<&str>,
) -> Result<f64, BoxError> {
    let key = PKey::new("bench-dispatch", "");
    let lease = lease(store.as_ref(), &key).await?;
    prefill(store.as_ref(), &key, &lease, p.events, p.payload).await?;
    if let Some(url) = analyze {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(url)
            .await?;
        let tables: Vec<(String,)> =
            sqlx::query_as("SELECT tablename::text FROM pg_tables WHERE schemaname = $1")
                .bind(crate::stores::PG_SCHEMA)
                .fetch_all(&pool)
                .await?;
        for (table,) in tables {
            sqlx::query(&format!(
                "ANALYZE \"{}\".\"{table}\"",
                crate::stores::PG_SCHEMA
            ))
            .execute(&pool)
            .await?;
        }
        pool.close().await;
    }
    let delivered = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&delivered);
    let dispatcher = dispatcher(Arc::clone(&store), &key.poller, p, move |_| {
        counter.fetch_add(1, Ordering::Relaxed);
    })?;
    let t = Stopwatch::start();
    let report = dispatcher
        .drain(&key, &lease, &DrainContext::default())
        .await?;
    let elapsed = t.elapsed();
    let count = delivered.load(Ordering::Relaxed);
    if report.delivered != p.events || count != p.events {
        return Err(format!(
            "dispatch-only delivered {} ({count} handled) of {}",
            report.delivered, p.events
        )
        .into());
    }
    Ok(rate(p.events, elapsed))
}

/// A poller `name` of the fake's items (identity `id`, a page cursor) that takes every page of
/// `p.events` in one cycle, and makes no second cycle due.
fn one_pass(name: &str, p: &Params) -> PollerBuilder<serde_json::Value> {
    let pages = u32::try_from(p.events / PAGE_SIZE as u64 + 2).unwrap_or(u32::MAX);
    Poller::builder::<serde_json::Value>(name)
        .identity_field("id")
        .cursor(cursor::page(1))
        .schedule(workload::one_cycle())
        .max_pages_per_cycle(pages)
}

/// Commit: `p.events` new items served 100 a page by an in-process fake API (a page cursor,
/// the items prepared beforehand), polled by the engine's own `tick`, timed from the tick's
/// start to its end: per page the fetch, validation, `load_versions`, canonical fingerprint,
/// `decide`, event ids and `commit_poll` of items, events and state, plus the key's state load,
/// lease claim and release once per tick. No handler is attached: without a consumer the
/// engine skips the drain, so the events stay pending and delivery is not timed. Items/s.
pub(crate) async fn commit(store: Arc<dyn Store>, p: &Params) -> Result<f64, BoxError> {
    let key = PKey::new("bench-commit", "");
    let items: Arc<Vec<serde_json::Value>> = Arc::new(
        (0..p.events)
            .map(|j| workload::item(j, p.payload))
            .collect(),
    );
    let poller = one_pass("bench-commit", p)
        .fetch(move |ctx: FetchContext| {
            let items = Arc::clone(&items);
            async move { fake_page(&items, &ctx.cursor) }
        })
        .build()?;
    let engine = Engine::builder(Arc::clone(&store))
        .poller(poller)
        .instance_id("bench")
        .build()?;
    // One tick takes every page (the cap is above their count); the schedule makes no second
    // one due.
    let t = Stopwatch::start();
    let tick = engine.tick(TickOptions::default()).await?;
    let elapsed = t.elapsed();
    if let Some(error) = tick.polled.iter().find_map(|r| r.error.as_ref()) {
        return Err(format!("commit tick failed: {}", error.message).into());
    }
    let committed: u64 = tick.polled.iter().map(|r| r.events).sum();
    let sequence = store.load_state(&key).await?.map_or(0, |s| s.sequence);
    let pending = store.counts(&key).await?.pending;
    if committed != p.events
        || sequence != i64::try_from(p.events).unwrap_or(-1)
        || pending != p.events
    {
        return Err(format!(
            "commit made {committed} events (sequence {sequence}, {pending} pending) of {}",
            p.events
        )
        .into());
    }
    Ok(rate(p.events, elapsed))
}
