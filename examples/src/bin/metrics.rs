//! Metrics: an engine reports through the `metrics` facade to a Prometheus exporter.
//!
//! Run it with `cargo run -p watukuy-examples --bin metrics`. It polls the in-process fake API
//! a few times, records the state gauges from `inspect()`, and prints the Prometheus text a
//! scrape endpoint would serve (mount `handle.render()` on any HTTP route you like).

use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusBuilder;
use watukuy_core::telemetry::{HISTOGRAM_BUCKETS_MS, MetricsHooks, record_gauges};
use watukuy_core::{
    Engine, Event, FetchContext, HandlerContext, HandlerError, Poller, TickOptions,
    clock::SystemClock, cursor,
};
use watukuy_store_memory::MemoryStore;
use watukuy_testkit::{FakeApi, FakeApiOptions, fake_items};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let handle = PrometheusBuilder::new()
        .set_buckets(&HISTOGRAM_BUCKETS_MS)?
        .install_recorder()?;

    let api = FakeApi::new(FakeApiOptions::new(Arc::new(SystemClock)));
    api.seed(fake_items(5))?;
    let items = Poller::builder::<serde_json::Value>("items")
        .identity_field("id")
        .cursor(cursor::token(None))
        .fetch({
            let api = api.clone();
            move |ctx: FetchContext| {
                let api = api.clone();
                async move { api.fetch_token(&ctx).await }
            }
        })
        .build()?;
    let engine = Engine::builder(Arc::new(MemoryStore::new()))
        .poller(items)
        .hooks(Arc::new(MetricsHooks::new()))
        .build()?;
    engine.on("items", |_event: Event, _ctx: HandlerContext| async {
        Ok::<(), HandlerError>(())
    })?;

    for _ in 0..3 {
        engine.tick(TickOptions::default()).await?;
        engine.trigger("items", None).await?;
    }
    record_gauges(&engine.inspect().await?);

    let text = handle.render();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains("watukuy"))
    {
        println!("{line}");
    }
    Ok(())
}
