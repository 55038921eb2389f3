//! Quickstart: poll an API into a SQLite store and print every change as an event.
//!
//! Run it with `cargo run -p watukuy-examples --bin quickstart`.
//!
//! The API here is watukuy's in-process fake (from `watukuy-conformance`), so the program runs
//! anywhere; a real poller's `fetch` calls an HTTP API the same way.

use std::sync::Arc;

use watukuy_conformance::{FakeApi, FakeApiOptions, Fault};
use watukuy_core::{
    Engine, Event, FetchContext, HandlerContext, HandlerError, Poller, SystemClock, TickOptions,
    cursor,
};
use watukuy_store_sqlite::{SqliteOptions, SqliteStore};

/// The item type: what the API returns per order.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Order {
    id: String,
    status: String,
    total: u32,
    updated_at: String,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The embedded default: one SQLite file holds cursors, the item snapshot and the outbox.
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("watukuy.sqlite");
    let store = Arc::new(SqliteStore::open(SqliteOptions::file(&path))?);

    // A pull-only API with three orders.
    let api = FakeApi::new(FakeApiOptions::new(Arc::new(SystemClock)));
    for (id, total) in [("order-1", 120), ("order-2", 75), ("order-3", 310)] {
        api.add(serde_json::json!({ "id": id, "status": "open", "total": total }))?;
    }

    // The poller: how to identify an order and how to fetch a page of changes.
    let orders = Poller::builder::<Order>("orders")
        .identity(|order: &Order| order.id.clone())
        .version(|order: &Order| order.updated_at.clone())
        .cursor(cursor::timestamp("updatedAt").tie_break("id"))
        .fetch({
            let api = api.clone();
            move |ctx: FetchContext| {
                let api = api.clone();
                async move { api.fetch_since(&ctx).await }
            }
        })
        .build()?;

    let engine = Engine::builder(store).poller(orders).build()?;
    engine.migrate().await?;
    engine.on("orders", |event: Event, ctx: HandlerContext| async move {
        let order: Option<Order> = event.data_as()?;
        println!(
            "  {:<7} {} (sequence {}, attempt {}) -> {}",
            event.event_type.as_str(),
            event.subject,
            event.sequence,
            ctx.attempt,
            order.map_or_else(
                || "-".to_owned(),
                |o| format!("{} total {}", o.status, o.total)
            ),
        );
        Ok::<(), HandlerError>(())
    })?;

    println!("1. first poll: every order is new");
    engine.tick(TickOptions::default()).await?;

    println!("2. order-2 is paid, order-4 arrives");
    api.update("order-2", serde_json::json!({ "status": "paid" }))?;
    api.add(serde_json::json!({ "id": "order-4", "status": "open", "total": 42 }))?;
    engine.trigger("orders", None).await?;
    engine.tick(TickOptions::default()).await?;

    println!("3. the API fails once: the cycle reports it, nothing is lost");
    api.fail_next(Fault::http(503), 1);
    api.update("order-3", serde_json::json!({ "status": "shipped" }))?;
    engine.trigger("orders", None).await?;
    let result = engine.tick(TickOptions::default()).await?;
    for polled in &result.polled {
        if let Some(error) = &polled.error {
            println!("  cycle failed: {}", error.message);
        }
    }
    engine.trigger("orders", None).await?;
    engine.tick(TickOptions::default()).await?;

    println!("4. nothing changed: no events");
    engine.trigger("orders", None).await?;
    engine.tick(TickOptions::default()).await?;

    let report = engine.inspect().await?;
    for key in &report.pollers {
        println!(
            "inspect: {} has {} items, {} pending, {} parked; cursor {}",
            key.poller,
            key.items,
            key.outbox_pending,
            key.parked,
            key.cursors
                .live
                .as_ref()
                .map_or_else(|| "-".to_owned(), ToString::to_string)
        );
    }
    Ok(())
}
