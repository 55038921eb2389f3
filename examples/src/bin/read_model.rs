//! An idempotent read model in PostgreSQL: each event is projected with `apply_once`, which
//! records the event id and the projection's writes in one transaction, so a redelivery changes
//! nothing.
//!
//! Run it with `WATUKUY_TEST_POSTGRES_URL=postgres://user@127.0.0.1/db cargo run -p
//! watukuy-examples --bin read_model` (or pass `--url postgres://…`). Without a URL it prints how
//! to run it and exits 0.
//!
//! The engine's store and the read model share the database, each in a schema of its own made
//! for this run (dropped at the end). The API is watukuy's in-process fake. The handler for
//! `order-2` "crashes" after its transaction committed and before the acknowledgement: the event
//! is delivered again, `apply_once` finds its marker, and the row is not touched twice. The
//! projection is fenced by the delivery's lease (`fenced_by`, `apply_once_fenced`): it commits
//! only while this instance still holds the key, so an instance frozen past its lease cannot
//! commit when it wakes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::Row;
use watukuy_core::delivery::ApplyOutcome;
use watukuy_core::{
    DeliveryOptions, Engine, Event, EventType, HandlerContext, HandlerError, Poller, TickOptions,
    backoff::Backoff,
    clock::{Clock, SystemClock},
    cursor,
};
use watukuy_store_postgres::{PgPool, PostgresOptions, PostgresStore, ProcessedEvents};
use watukuy_testkit::{FakeApi, FakeApiOptions};

#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Order {
    id: String,
    status: String,
    total: i64,
    updated_at: String,
}

fn database_url() -> Option<String> {
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--url" {
            return args.next();
        }
    }
    std::env::var("WATUKUY_TEST_POSTGRES_URL")
        .ok()
        .filter(|u| !u.trim().is_empty())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Some(url) = database_url() else {
        println!("read_model needs PostgreSQL. Run it with");
        println!(
            "  WATUKUY_TEST_POSTGRES_URL=postgres://user@127.0.0.1/db cargo run -p watukuy-examples --bin read_model"
        );
        println!("or pass --url postgres://…");
        return Ok(());
    };
    let run = format!(
        "{}_{}",
        std::process::id(),
        SystemClock.now_ms() % 1_000_000
    );
    let (store_schema, app_schema) = (format!("wk_store_{run}"), format!("wk_app_{run}"));
    let pool = PgPool::connect(&url).await?;
    let result = run_example(&url, &pool, &store_schema, &app_schema).await;
    for schema in [&store_schema, &app_schema] {
        sqlx::query(&format!(r#"DROP SCHEMA IF EXISTS "{schema}" CASCADE"#))
            .execute(&pool)
            .await?;
    }
    result
}

async fn run_example(
    url: &str,
    pool: &PgPool,
    store_schema: &str,
    app_schema: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    // The read model: one row per order, and how many times a projection touched it.
    sqlx::query(&format!(r#"CREATE SCHEMA "{app_schema}""#))
        .execute(pool)
        .await?;
    sqlx::query(&format!(
        r#"CREATE TABLE "{app_schema}".orders (id text PRIMARY KEY, status text NOT NULL,
           total bigint NOT NULL, applications integer NOT NULL)"#
    ))
    .execute(pool)
    .await?;
    let store_options = PostgresOptions::default().schema(store_schema);
    // The markers beside the read model, fenced by the leases of the engine's store (same
    // database, another schema).
    let processed =
        ProcessedEvents::new(app_schema, "processed_events")?.fenced_by(&store_options)?;
    processed.migrate(pool).await?;

    let store = PostgresStore::connect(url, store_options).await?;
    store.migrate().await?;

    let api = FakeApi::new(FakeApiOptions::new(Arc::new(SystemClock)));
    for (id, total) in [("order-1", 120), ("order-2", 75), ("order-3", 310)] {
        api.add(serde_json::json!({ "id": id, "status": "open", "total": total }))?;
    }
    let orders = Poller::builder::<Order>("orders")
        .identity(|order: &Order| order.id.clone())
        .version(|order: &Order| order.updated_at.clone())
        .cursor(cursor::timestamp("updatedAt").tie_break("id"))
        .delivery(DeliveryOptions::default().backoff(Backoff::new(
            Duration::from_millis(100),
            2.0,
            Duration::from_millis(400),
        )))
        .fetch(api.since_fetch())
        .build()?;
    let engine = Engine::builder(Arc::new(store)).poller(orders).build()?;

    let crashed_once = Arc::new(AtomicBool::new(false));
    engine.on("orders", {
        let (pool, processed) = (pool.clone(), processed.clone());
        let table = format!(r#""{app_schema}".orders"#);
        move |event: Event, ctx: HandlerContext| {
            let (pool, processed, table) = (pool.clone(), processed.clone(), table.clone());
            let crashed_once = Arc::clone(&crashed_once);
            async move {
                let order: Option<Order> = event.data_as()?;
                let (sql, order) = match (event.event_type, order) {
                    (EventType::Deleted, _) | (_, None) => {
                        (format!("DELETE FROM {table} WHERE id = $1"), None)
                    }
                    (_, Some(order)) => (
                        format!(
                            "INSERT INTO {table} (id, status, total, applications) \
                             VALUES ($1, $2, $3, 1) ON CONFLICT (id) DO UPDATE SET \
                             status = $2, total = $3, applications = {table}.applications + 1"
                        ),
                        Some(order),
                    ),
                };
                let subject = event.subject.clone();
                let fence = ctx
                    .fence()
                    .ok_or_else(|| HandlerError::permanent("delivered without a lease"))?;
                let outcome = processed
                    .apply_once_fenced(&pool, &event, fence, |tx| {
                        Box::pin(async move {
                            let query = sqlx::query(&sql).bind(subject.as_str());
                            let query = match &order {
                                Some(o) => query.bind(&o.status).bind(o.total),
                                None => query,
                            };
                            query.execute(&mut **tx).await?;
                            Ok::<_, sqlx::Error>(())
                        })
                    })
                    .await
                    .map_err(|e| HandlerError::transient(format!("{e:?}")))?
                    .report(&ctx);
                let what = match outcome {
                    ApplyOutcome::Applied(()) => "applied",
                    ApplyOutcome::Deduplicated => "deduplicated (already applied: no change)",
                };
                println!(
                    "  {} {} #{} (attempt {}): {what}",
                    event.event_type.as_str(),
                    event.subject,
                    event.sequence,
                    ctx.attempt
                );
                if event.subject == "order-2" && !crashed_once.swap(true, Ordering::SeqCst) {
                    println!("  ... and the handler crashes before the acknowledgement");
                    return Err(HandlerError::transient("crashed after commit"));
                }
                Ok::<(), HandlerError>(())
            }
        }
    })?;

    println!("1. first poll: three orders are projected; order-2's handler crashes once");
    settle(&engine).await?;
    println!("2. order-1 is paid and order-3 is cancelled");
    api.update("order-1", serde_json::json!({ "status": "paid" }))?;
    api.update("order-3", serde_json::json!({ "status": "cancelled" }))?;
    engine.trigger("orders", None).await?;
    settle(&engine).await?;

    println!("read model:");
    let rows = sqlx::query(&format!(
        r#"SELECT id, status, total, applications FROM "{app_schema}".orders ORDER BY id"#
    ))
    .fetch_all(pool)
    .await?;
    let mut consistent = true;
    for row in &rows {
        let (id, status, total, applications): (String, String, i64, i32) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        println!("  {id}: {status}, total {total}, applied {applications} time(s)");
        let expected = if id == "order-2" { 1 } else { 2 };
        consistent &= applications == expected;
    }
    let report = engine.inspect().await?;
    let counters = &report.pollers[0].delivery;
    println!(
        "delivery: {} applied, {} deduplicated, {} failed attempt(s)",
        counters.applied, counters.deduplicated, counters.failed
    );
    if !consistent || rows.len() != 3 || counters.deduplicated != 1 {
        return Err("the read model does not match the events".into());
    }
    println!("read model consistent: every event applied exactly once");
    Ok(())
}

/// Ticks until the outbox is empty (retries included), for at most ~10 s.
async fn settle(engine: &Engine) -> Result<(), Box<dyn std::error::Error>> {
    for _ in 0..100 {
        engine.tick(TickOptions::default()).await?;
        let report = engine.inspect().await?;
        if report.pollers.iter().all(|k| k.outbox_pending == 0) {
            return Ok(());
        }
        SystemClock.sleep(Duration::from_millis(100)).await;
    }
    Err("events were still pending after 10 s".into())
}
