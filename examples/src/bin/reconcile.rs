//! Deletes from a pull-only API: a live `timestamp` lane reads what changed, and a reconcile lane
//! lists everything every 10 s, page by page by offset, to find what was deleted; an item a
//! listing missed is looked up by id before it is reported deleted (docs/deletes.md).
//!
//! Run it with `cargo run -p watukuy-examples --bin reconcile`: a local catalog API (axum on
//! 127.0.0.1, a random port) starts with six items and changes every second (items added,
//! updated, deleted) while the engine runs as a daemon and prints every event; Ctrl-C or SIGTERM
//! stops it cleanly.
//!
//! With `--scenario` it runs a fixed script instead, on a manual clock driven by `tick()` (no
//! waiting), including a listing that changes while the reconcile lane reads it, and stops by
//! itself once the consumer's read model, rebuilt from the events alone, equals the API's
//! listing; it exits 1 if that never happens.

use std::sync::Arc;
use std::time::Duration;

use watukuy_core::{
    StopOptions,
    clock::{Clock, SystemClock},
};
use watukuy_examples::reconcile::{
    Catalog, Change, Consumer, INITIAL_ITEMS, RECONCILE_EVERY, engine, poller, scenario, serve,
};
use watukuy_store_memory::MemoryStore;

#[tokio::main]
async fn main() -> Result<(), watukuy_core::BoxError> {
    if std::env::args().skip(1).any(|a| a == "--scenario") {
        let report = scenario().await?;
        let deletes = report
            .seen
            .iter()
            .filter(|s| s.event_type == watukuy_core::EventType::Deleted)
            .count();
        if report.converged() {
            println!(
                "scenario done: {} events ({deletes} deletes); the read model equals the API's \
                 {} items",
                report.seen.len(),
                report.listing.len()
            );
            return Ok(());
        }
        println!("scenario failed: the read model never matched the API: {report:#?}");
        std::process::exit(1);
    }
    daemon().await
}

/// The catalog changes every second, forever; the engine runs as a daemon until a signal.
async fn daemon() -> Result<(), watukuy_core::BoxError> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let catalog = Catalog::new(Arc::clone(&clock), &INITIAL_ITEMS);
    let base = serve(Arc::clone(&catalog)).await?;
    let store = Arc::new(MemoryStore::new());
    let consumer = Arc::new(Consumer::default());
    let engine = engine(poller(&base, RECONCILE_EVERY)?, clock, store, &consumer)?;
    engine.migrate().await?;
    println!(
        "polling {base}/items (live) and {base}/items/all (reconcile, every 10 s; missing items \
         looked up at {base}/items/lookup)"
    );
    println!("(Ctrl-C or SIGTERM stops the engine cleanly)");
    engine.start().await?;

    // A cycle of changes over twelve ids: add, update, then delete each one in turn.
    const IDS: [&str; 12] = [
        "item-01", "item-02", "item-03", "item-04", "item-05", "item-06", "item-07", "item-08",
        "item-09", "item-10", "item-11", "item-12",
    ];
    let changes = async {
        let mut every = tokio::time::interval(Duration::from_secs(1));
        every.tick().await;
        for step in 0_usize.. {
            every.tick().await;
            let id = IDS[(step * 5) % IDS.len()];
            let price = u32::try_from(100 + (step * 37) % 900).unwrap_or(100);
            let exists = catalog.items().contains_key(id);
            let change = match (exists, step % 3) {
                (false, _) => Change::Add(id, price),
                (true, 0) => Change::Delete(id),
                (true, _) => Change::Update(id, price),
            };
            println!("  api: {}", catalog.apply(&change));
        }
    };
    tokio::select! {
        () = changes => {}
        signal = watukuy_examples::shutdown::signal() => println!("{}: stopping", signal?),
    }
    engine.stop(StopOptions::default()).await?;
    let model = consumer.model();
    println!(
        "stopped cleanly: {} events; the read model holds {} items, the API {}",
        consumer.seen().len(),
        model.len(),
        catalog.items().len()
    );
    Ok(())
}
