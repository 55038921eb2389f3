//! Bounded memory (G10), reported rather than timed: the dispatcher draining a million pending
//! events, and a `snapshot_diff` full scan over a million items.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use watukuy_core::cursor;
use watukuy_core::{
    BoxError, DeliveryOptions, Engine, Event, FetchContext, Poller, TickOptions,
    clock::SystemClock, delivery::DrainContext, store::PKey,
};
use watukuy_testkit::{FakeApi, FakeApiOptions};

use crate::measure::{Stopwatch, fmt_mib, peak_rss_kb, rate, reset_peak_rss, rss_kb};
use crate::pipeline;
use crate::stores::{self, Backend, Targets};
use crate::workload::{self, Params};

/// RSS around one phase.
#[derive(Clone, Debug, Default)]
pub(crate) struct Footprint {
    /// RSS right before the phase, kB.
    pub(crate) before_kb: u64,
    /// Peak RSS during the phase (high-water mark reset at its start), kB.
    pub(crate) peak_kb: u64,
    /// RSS right after, kB.
    pub(crate) after_kb: u64,
    /// `(events delivered, RSS kB)` samples taken during the phase.
    pub(crate) samples: Vec<(u64, u64)>,
    /// Events (or items) per second of the phase, for context only.
    pub(crate) rate: f64,
}

impl Footprint {
    fn describe(&self) -> String {
        let samples: Vec<String> = self
            .samples
            .iter()
            .map(|(n, kb)| format!("{}k: {}", n / 1000, fmt_mib(*kb)))
            .collect();
        format!(
            "before {}, peak {} (+{}), after {}; samples [{}]",
            fmt_mib(self.before_kb),
            fmt_mib(self.peak_kb),
            fmt_mib(self.peak_kb.saturating_sub(self.before_kb)),
            fmt_mib(self.after_kb),
            samples.join(", ")
        )
    }
}

/// Pre-fills `events` pending events on `backend`, then drains them with one dispatcher
/// (stopping after `limit` deliveries: a store that acknowledges at disk-sync speed would take
/// too long to drain a million), sampling RSS ten times along the way.
pub(crate) async fn dispatcher_drain(
    backend: Backend,
    t: &Targets,
    events: u64,
    limit: u64,
    payload: usize,
) -> Result<Footprint, BoxError> {
    let limit = limit.min(events);
    let sample_every = (limit / 10).max(1);
    let store = stores::fresh(backend, t).await?;
    let key = PKey::new("bench-memory", "");
    let lease = pipeline::lease(store.as_ref(), &key).await?;
    eprintln!("  pre-filling {events} events on {}...", backend.name());
    pipeline::prefill(store.as_ref(), &key, &lease, events, payload).await?;
    let samples = Arc::new(Mutex::new(Vec::new()));
    let delivered = Arc::new(AtomicU64::new(0));
    let (s, d) = (Arc::clone(&samples), Arc::clone(&delivered));
    let ctx = DrainContext::default();
    let stop = ctx.cancel.clone();
    let p = Params {
        events,
        keys: 1000,
        concurrency: 16,
        payload,
        overlap: false,
        ack_window: None,
        ack_delay: std::time::Duration::ZERO,
        partitions: 1,
    };
    let dispatcher = pipeline::dispatcher(Arc::clone(&store), &key.poller, &p, move |_| {
        let n = d.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= limit {
            stop.cancel();
        }
        if n % sample_every == 0 {
            s.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((n, rss_kb()));
        }
    })?;
    let before_kb = rss_kb();
    reset_peak_rss();
    let watch = Stopwatch::start();
    let report = dispatcher.drain(&key, &lease, &ctx).await?;
    let elapsed = watch.elapsed();
    let peak_kb = peak_rss_kb();
    // A cancelled drain may have handled (but not acknowledged) a few more in flight.
    if report.delivered < limit.saturating_sub(64) {
        return Err(format!("drained {} of {limit}", report.delivered).into());
    }
    drop(dispatcher);
    store.close().await?;
    let samples = std::mem::take(&mut *samples.lock().unwrap_or_else(PoisonError::into_inner));
    Ok(Footprint {
        before_kb,
        peak_kb,
        after_kb: rss_kb(),
        samples,
        rate: rate(report.delivered, elapsed),
    })
}

/// A `snapshot_diff` poller over `items` items (1,000 a page): a first cycle stores them all,
/// then `removed` items disappear from the API and a second full scan runs; returns both scans'
/// footprints (the first measured from the RSS after the fake API was seeded). No consumer is attached (events stay in the outbox), so the figure is
/// the scan's own and a slow acknowledgement does not stretch the run.
pub(crate) async fn snapshot_diff(
    backend: Backend,
    t: &Targets,
    items: u64,
    removed: u64,
    payload: usize,
) -> Result<(Footprint, Footprint), BoxError> {
    let store = stores::fresh(backend, t).await?;
    let api = FakeApi::new(FakeApiOptions::new(Arc::new(SystemClock)).page_size(1000));
    api.seed((0..items).map(|i| workload::item(i, payload)))?;
    let pages = u32::try_from(items / 1000 + 10).unwrap_or(u32::MAX);
    let fetch_api = api.clone();
    let poller = Poller::builder::<serde_json::Value>("bench")
        .identity_field("id")
        .cursor(cursor::snapshot_diff())
        .schedule(workload::one_cycle())
        .max_pages_per_cycle(pages)
        .full_scan_page_cap(pages)
        .delivery(
            DeliveryOptions::default()
                .concurrency(16)
                .ordering_key(|e: &Event| workload::ordering_key(&e.subject, 1000)),
        )
        .fetch(move |ctx: FetchContext| {
            let api = fetch_api.clone();
            async move { api.fetch_all(&ctx).await }
        })
        .build()?;
    let engine = Engine::builder(Arc::clone(&store))
        .poller(poller)
        .instance_id("bench")
        .build()?;
    eprintln!(
        "  first full scan: storing {items} items on {}...",
        backend.name()
    );
    let first_before_kb = rss_kb();
    reset_peak_rss();
    let watch = Stopwatch::start();
    let first = engine.tick(TickOptions::default()).await?;
    let first_scan = Footprint {
        before_kb: first_before_kb,
        peak_kb: peak_rss_kb(),
        after_kb: rss_kb(),
        samples: Vec::new(),
        rate: rate(items, watch.elapsed()),
    };
    eprintln!("  first scan: {}", first_scan.describe());
    if let Some(error) = first.polled.iter().find_map(|r| r.error.as_ref()) {
        return Err(format!("first scan failed: {}", error.message).into());
    }
    let created: u64 = first.polled.iter().map(|r| r.events).sum();
    if created != items {
        return Err(format!("first scan committed {created} events of {items}").into());
    }
    for i in 0..removed {
        // Spread the deletes over the whole listing.
        api.remove(&workload::identity(i * (items / removed.max(1))));
    }
    engine.trigger("bench", None).await?;
    let before_kb = rss_kb();
    reset_peak_rss();
    let watch = Stopwatch::start();
    let second = engine.tick(TickOptions::default()).await?;
    let elapsed = watch.elapsed();
    let peak_kb = peak_rss_kb();
    if let Some(error) = second.polled.iter().find_map(|r| r.error.as_ref()) {
        return Err(format!("second scan failed: {}", error.message).into());
    }
    let deletes: u64 = second.polled.iter().map(|r| r.events).sum();
    if deletes != removed {
        return Err(format!("second scan committed {deletes} deletes, expected {removed}").into());
    }
    drop(engine);
    store.close().await?;
    let second_scan = Footprint {
        before_kb,
        peak_kb,
        after_kb: rss_kb(),
        samples: Vec::new(),
        rate: rate(items, elapsed),
    };
    Ok((first_scan, second_scan))
}

/// The whole bounded-memory report, printed as Markdown.
pub(crate) async fn report(
    backends: &[Backend],
    t: &Targets,
    events: u64,
    limit: u64,
    scan_sizes: &[u64],
    payload: usize,
) -> Result<(), BoxError> {
    println!("\n### Bounded memory (reported, not timed)\n");
    println!(
        "| what | store | size | RSS before | peak during | peak − before | RSS after | rate (context) |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for &backend in backends {
        eprintln!(
            "dispatcher drain of {events} pending events on {}",
            backend.name()
        );
        let f = dispatcher_drain(backend, t, events, limit, payload).await?;
        eprintln!("  {}", f.describe());
        println!(
            "| dispatcher drain | {} | {} pending, {} drained | {} | {} | {} | {} | {} |",
            backend.name(),
            events,
            limit.min(events),
            fmt_mib(f.before_kb),
            fmt_mib(f.peak_kb),
            fmt_mib(f.peak_kb.saturating_sub(f.before_kb)),
            fmt_mib(f.after_kb),
            crate::measure::fmt_rate(f.rate)
        );
        let trail: Vec<String> = f
            .samples
            .iter()
            .map(|(n, kb)| format!("{}k→{}", n / 1000, fmt_mib(*kb)))
            .collect();
        println!(
            "|  ↳ RSS while draining | {} | | {} | | | | |",
            backend.name(),
            trail.join(", ")
        );
    }
    for &backend in backends {
        for &items in scan_sizes {
            let removed = (items / 1000).max(1);
            eprintln!(
                "snapshot_diff full scan over {items} items on {}",
                backend.name()
            );
            let (first, second) = snapshot_diff(backend, t, items, removed, payload).await?;
            eprintln!("  second scan: {}", second.describe());
            for (what, f) in [
                ("snapshot_diff 1st scan (all created)".to_owned(), first),
                (
                    format!("snapshot_diff 2nd scan ({removed} deletes)"),
                    second,
                ),
            ] {
                println!(
                    "| {what} | {} | {} items | {} | {} | {} | {} | {} |",
                    backend.name(),
                    items,
                    fmt_mib(f.before_kb),
                    fmt_mib(f.peak_kb),
                    fmt_mib(f.peak_kb.saturating_sub(f.before_kb)),
                    fmt_mib(f.after_kb),
                    crate::measure::fmt_rate(f.rate)
                );
            }
        }
    }
    Ok(())
}
