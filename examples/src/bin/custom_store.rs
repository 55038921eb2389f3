//! A custom store in use: the engine runs on [`CountingStore`] (a wrapper over `MemoryStore`
//! from `examples/src/custom_store.rs`) and prints how many store calls a few poll cycles made.
//!
//! Run it with `cargo run -p watukuy-examples --bin custom_store`; the conformance suite on the
//! same store runs with `cargo test -p watukuy-examples --test custom_store`.

use std::sync::Arc;

use watukuy_core::{
    Engine, Event, HandlerContext, HandlerError, Poller, TickOptions, clock::SystemClock, cursor,
};
use watukuy_examples::custom_store::CountingStore;
use watukuy_store_memory::MemoryStore;
use watukuy_testkit::{FakeApi, FakeApiOptions};

#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Order {
    id: String,
    status: String,
    updated_at: String,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = Arc::new(CountingStore::new(Arc::new(MemoryStore::new())));
    let api = FakeApi::new(FakeApiOptions::new(Arc::new(SystemClock)));
    for id in ["order-1", "order-2", "order-3"] {
        api.add(serde_json::json!({ "id": id, "status": "open" }))?;
    }
    let orders = Poller::builder::<Order>("orders")
        .identity(|order: &Order| order.id.clone())
        .cursor(cursor::timestamp("updatedAt").tie_break("id"))
        .fetch(api.since_fetch())
        .build()?;
    let engine = Engine::builder(Arc::clone(&store) as Arc<dyn watukuy_core::store::Store>)
        .poller(orders)
        .build()?;
    engine.migrate().await?;
    engine.on("orders", |event: Event, _ctx: HandlerContext| async move {
        println!("  {} {}", event.event_type.as_str(), event.subject);
        Ok::<(), HandlerError>(())
    })?;

    engine.tick(TickOptions::default()).await?;
    println!(
        "first cycle: {} store calls, {} commit(s)",
        store.calls(),
        store.commits()
    );
    api.update("order-2", serde_json::json!({ "status": "paid" }))?;
    engine.trigger("orders", None).await?;
    engine.tick(TickOptions::default()).await?;
    println!(
        "after a second cycle: {} store calls, {} commit(s)",
        store.calls(),
        store.commits()
    );
    Ok(())
}
