//! Delivery in detail: commit a few events to a `MemoryStore` and deliver them, with a retry and a
//! parked event that is fixed and retried.
//!
//! Run it with `cargo run -p watukuy-examples --bin delivery`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use watukuy_core::{
    DeliveryOptions, Event, EventType, HandlerContext, HandlerError,
    backoff::Backoff,
    clock::{Clock, SystemClock, format_rfc3339_ms},
    delivery::{Dispatcher, DrainContext},
    json::Json,
    rng::SystemRng,
    store::{CommitBatch, OutboxRow, PKey, ParkedQuery, StatePatch, Store},
};
use watukuy_store_memory::MemoryStore;

fn order_event(seq: i64, order: &str, kind: EventType, total: u32, now: i64) -> Event {
    // Real events get deterministic ids from the poll cycle; here any unique id will do.
    let mut event = Event::new(format!("{seq:064x}"), kind, "orders", order);
    event.time = format_rfc3339_ms(now).into();
    event.sequence = seq;
    event.data = Some(order_json(order, total));
    event
}

fn order_json(order: &str, total: u32) -> Json {
    Json::encode(&serde_json::json!({ "id": order, "total": total }))
        .unwrap_or_else(|_| Json::null())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let key = PKey::new("orders", "");
    let Some(lease) = store
        .acquire_lease(&key, "quickstart", 30_000, clock.now_ms())
        .await?
    else {
        return Err("the key is leased by another instance".into());
    };

    // One transaction commits the events to the outbox (a poll cycle does this for every page).
    let now = clock.now_ms();
    let events = vec![
        order_event(1, "order-1", EventType::Created, 120, now),
        order_event(2, "order-2", EventType::Created, 75, now),
        order_event(3, "order-1", EventType::Updated, 130, now),
        order_event(4, "order-3", EventType::Created, 0, now),
        order_event(5, "order-3", EventType::Updated, 10, now),
    ];
    let batch = CommitBatch::default()
        .events(
            events
                .into_iter()
                .map(|e| OutboxRow::pending(e, now))
                .collect(),
        )
        .state_patch(StatePatch {
            sequence: Some(5),
            updated_at: Some(now),
            ..StatePatch::default()
        });
    store.commit_poll(&key, &lease, &batch).await?;
    println!(
        "committed 5 events for orders: order-1 (created, updated), order-2, order-3 (created, updated)"
    );

    let options = DeliveryOptions::default()
        .concurrency(4)
        .attempts(3)
        .backoff(Backoff::new(
            Duration::from_millis(50),
            2.0,
            Duration::from_millis(200),
        ));
    let dispatcher = Dispatcher::new(
        "orders",
        Arc::clone(&store),
        Arc::clone(&clock),
        Arc::new(SystemRng::new()),
        options,
        100,
    )?;

    // order-2 fails once (a timeout downstream); order-3 fails until it is fixed.
    let order_3_fixed = Arc::new(AtomicBool::new(false));
    dispatcher.on({
        let order_3_fixed = Arc::clone(&order_3_fixed);
        move |event: Event, ctx: HandlerContext| {
            let fixed = order_3_fixed.load(Ordering::SeqCst);
            async move {
                let label = format!(
                    "{} {} (attempt {})",
                    event.subject, event.event_type, ctx.attempt
                );
                if event.subject == "order-2" && ctx.attempt == 1 {
                    println!("  handler: {label} -> failed: warehouse API timed out");
                    return Err(HandlerError::from("warehouse API timed out"));
                }
                if event.subject == "order-3" && !fixed {
                    println!("  handler: {label} -> failed: total must be positive");
                    return Err(HandlerError::from("total must be positive"));
                }
                println!(
                    "  handler: {label} -> ok, data {}",
                    event.data.as_ref().map_or("-".into(), Json::to_string)
                );
                Ok(())
            }
        }
    })?;

    let drain = |label: String| {
        let (dispatcher, key, lease) = (&dispatcher, &key, &lease);
        async move {
            let report = dispatcher
                .drain(key, lease, &DrainContext::default())
                .await?;
            println!(
                "{label}: delivered {}, retrying {}, parked {}, pending {}",
                report.delivered, report.failed, report.parked, report.remaining
            );
            Ok::<_, watukuy_core::Error>(report)
        }
    };

    let mut report = drain("drain 1".into()).await?;
    let mut round = 1;
    while let Some(at) = report.next_retry_at {
        // A daemon sleeps until the earliest retry is due, then drains again.
        round += 1;
        clock.sleep_until(at).await;
        report = drain(format!("drain {round} (a retry was due)")).await?;
    }

    for row in store.list_parked(&key, ParkedQuery::default()).await? {
        let history: Vec<&str> = row
            .error
            .history
            .iter()
            .flatten()
            .map(|e| e.message.as_str())
            .collect();
        println!(
            "parked {} after {} attempts: {} (history: {:?}); holding key {:?}",
            row.event
                .as_ref()
                .map_or(row.id.as_str(), |e| e.subject.as_str()),
            row.attempts,
            row.error.error.message,
            history,
            row.hold_key
        );
        order_3_fixed.store(true, Ordering::SeqCst);
        let moved = dispatcher.retry_parked(&key, &[row.id]).await?;
        println!("fixed the handler and retried {moved} parked event");
    }
    drain("drain after retry".into()).await?;
    store.release_lease(&key, &lease).await?;
    Ok(())
}
