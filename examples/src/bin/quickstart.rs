//! Quickstart: poll a (local) HTTP ERP into a SQLite file and print every change as an event.
//!
//! Run it with `cargo run -p watukuy-examples --bin quickstart` (stop it with Ctrl-C or SIGTERM,
//! which let what is running finish, or pass
//! `--for <seconds>` / set `WATUKUY_QUICKSTART_FOR=<seconds>` to stop by itself). Its store is
//! `./quickstart.sqlite` in the working folder: it stays when the quickstart stops, so the
//! command line can show what happened (the quickstart prints the command:
//! `cargo run -p watukuy-cli -- inspect -s sqlite:./quickstart.sqlite`), and the next run carries
//! on from it. `--fresh` deletes it first.
//!
//! Everything runs in this one process, offline:
//!
//! - a small "ERP" (`watukuy_examples::erp`: axum on 127.0.0.1, a random port) serves `GET /orders?since=<ts>&after=<id>`,
//!   ordered by `updatedAt` then `id` (a keyset), while a background task creates orders and
//!   moves them through `open → paid → shipped → delivered` every 1.5 s;
//! - the poller asks for the changes since its cursor with `watukuy_http::HttpClient`; the cursor
//!   is `cursor::timestamp("updatedAt").tie_break("id").lag(1 ms)`: the lag holds back writes of
//!   the current millisecond, so a later write with the same timestamp and a smaller id cannot be
//!   skipped (docs/cursors.md);
//! - the engine runs as a daemon (`engine.start()`), keeps cursors, items and the outbox in the
//!   SQLite file `./quickstart.sqlite`, and polls every 1–5 s (adaptive);
//! - the handler prints each delivered event. It fails `ord-1002`'s creation once (a retry, then delivered)
//!   and `ord-1003` every time (parked after 3 attempts, printed with its error, its key held);
//! - every 3 s a status line from `engine.inspect()`: polls, events delivered, outbox, parked,
//!   items and the cursor's lag behind now.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use watukuy_core::hooks::{HookContext, Hooks};
use watukuy_core::schedule::ScheduleOptions;
use watukuy_core::store::{ParkedRow, PollSummary, SerializedError};
use watukuy_core::{
    DeliveryOptions, Engine, Event, EventType, HandlerContext, HandlerError, StopOptions,
    backoff::Backoff,
    clock::{Clock, SystemClock},
};
use watukuy_examples::erp::{self, ErpState, Order, run_erp, serve_erp};
use watukuy_store_sqlite::{SqliteOptions, SqliteStore};

/// The store: a SQLite file in the working folder, kept between runs.
const DATABASE: &str = "./quickstart.sqlite";

/// The command that shows what the engine wrote to [`DATABASE`] (examples/tests/quickstart.rs
/// runs it, and README.md shows it).
const CLI_COMMAND: &str = "cargo run -p watukuy-cli -- inspect -s sqlite:./quickstart.sqlite";

// ---------------------------------------------------------------------------------------------
// Hooks: count polls, print retries and parked events.
// ---------------------------------------------------------------------------------------------

#[derive(Default)]
struct Printer {
    polls: AtomicU64,
}

#[async_trait::async_trait]
impl Hooks for Printer {
    async fn on_poll_end(&self, _ctx: &HookContext, _summary: &PollSummary) {
        self.polls.fetch_add(1, Ordering::Relaxed);
    }

    async fn on_retry(
        &self,
        _ctx: &HookContext,
        event: &Event,
        error: &SerializedError,
        delay_ms: i64,
    ) {
        println!(
            "  retry   {} #{}: {} (next attempt in {delay_ms} ms)",
            event.subject, event.sequence, error.message
        );
    }

    async fn on_parked(&self, _ctx: &HookContext, row: &ParkedRow) {
        let subject = row.event.as_ref().map_or("?", |e| e.subject.as_str());
        println!(
            "  PARKED  {subject} after {} attempts: {} (its later events wait until it is \
             retried or discarded)",
            row.attempts, row.error.error.message
        );
    }

    async fn on_error(
        &self,
        _ctx: &HookContext,
        error: &SerializedError,
        phase: watukuy_core::hooks::Phase,
    ) {
        println!("  poll failed in {}: {}", phase.as_str(), error.message);
    }
}

/// The command line: `--for <seconds>` (or `WATUKUY_QUICKSTART_FOR`) to stop by itself after
/// that long, `--fresh` to delete the database of earlier runs first.
struct Args {
    run_for: Option<Duration>,
    fresh: bool,
}

fn args() -> Result<Args, Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut value = std::env::var("WATUKUY_QUICKSTART_FOR").ok();
    let mut fresh = false;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--for" => value = args.next(),
            "--fresh" => fresh = true,
            other => {
                return Err(
                    format!("unknown argument {other:?} (try --for 10, or --fresh)").into(),
                );
            }
        }
    }
    let run_for = match value {
        Some(v) => {
            Some(Duration::from_secs(v.parse().map_err(|_| {
                format!("--for expects a number of seconds, got {v:?}")
            })?))
        }
        None => None,
    };
    Ok(Args { run_for, fresh })
}

/// Deletes the database and its WAL files (`--fresh`); a missing file is fine.
fn delete_database(path: &std::path::Path) -> std::io::Result<()> {
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        match std::fs::remove_file(&file) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Args { run_for, fresh } = args()?;

    // The ERP starts with three orders and changes over time.
    let erp: ErpState = Arc::default();
    {
        let mut book = erp.lock().unwrap_or_else(PoisonError::into_inner);
        for total in [120, 75, 310] {
            book.create(total);
        }
    }
    let base = serve_erp(Arc::clone(&erp)).await?;
    tokio::spawn(run_erp(Arc::clone(&erp)));

    // The embedded default: one SQLite file holds cursors, the item snapshot and the outbox.
    let path = std::path::Path::new(DATABASE);
    if fresh {
        delete_database(path)?;
    }
    let earlier = path.exists();
    let store = Arc::new(SqliteStore::open(SqliteOptions::file(path))?);

    // The poller: how to identify an order, where its cursor is, and how to fetch a page
    // (watukuy_examples::erp::poller), polled every 1-5 s, each event tried 3 times.
    let orders = erp::poller("orders", &base)?
        .schedule(
            ScheduleOptions::default()
                .min(Duration::from_secs(1))
                .max(Duration::from_secs(5)),
        )
        .delivery(DeliveryOptions::default().attempts(3).backoff(Backoff::new(
            Duration::from_millis(500),
            2.0,
            Duration::from_secs(2),
        )))
        .build()?;

    let printer = Arc::new(Printer::default());
    let engine = Engine::builder(store)
        .poller(orders)
        .hooks(Arc::clone(&printer) as Arc<dyn Hooks>)
        .build()?;
    engine.migrate().await?;
    engine.on("orders", |event: Event, ctx: HandlerContext| async move {
        let order: Option<Order> = event.data_as()?;
        if event.subject == "ord-1002" && event.event_type == EventType::Created && ctx.attempt == 1
        {
            return Err(HandlerError::transient("the warehouse API timed out"));
        }
        if event.subject == "ord-1003" {
            return Err(HandlerError::transient("the warehouse rejects ord-1003"));
        }
        let retried = if ctx.attempt > 1 {
            format!(" (attempt {})", ctx.attempt)
        } else {
            String::new()
        };
        println!(
            "  {:<7} {} #{} -> {}{retried}",
            event.event_type.as_str(),
            event.subject,
            event.sequence,
            order.map_or_else(
                || "-".to_owned(),
                |o| format!("{} total {}", o.status, o.total)
            ),
        );
        Ok::<(), HandlerError>(())
    })?;

    if earlier {
        let report = engine.inspect().await?;
        let (items, parked) = report
            .pollers
            .iter()
            .fold((0, 0), |(i, p), key| (i + key.items, p + key.parked));
        println!(
            "reusing {DATABASE} from an earlier run: {items} items, {parked} parked (--fresh \
             starts over)"
        );
    } else {
        println!("a new database: {DATABASE}");
    }
    println!("polling {base}/orders into {DATABASE}");
    println!("(Ctrl-C or SIGTERM stops the engine cleanly)");
    println!("see what it wrote, now or after it stops:");
    println!("  {CLI_COMMAND}");
    engine.start().await?;

    let status = async {
        let mut every = tokio::time::interval(Duration::from_secs(3));
        every.tick().await;
        loop {
            every.tick().await;
            match engine.inspect().await {
                Ok(report) => {
                    for key in &report.pollers {
                        let last = key.last_poll.as_ref().map_or_else(
                            || "-".to_owned(),
                            |p| format!("{} items in {} ms", p.items, p.duration_ms),
                        );
                        println!(
                            "[status] polls {} (last: {last}) | events delivered {}, failed \
                             attempts {} | outbox {} | parked {} | items {} | lag {}",
                            printer.polls.load(Ordering::Relaxed),
                            key.delivery.applied,
                            key.delivery.failed,
                            key.outbox_pending,
                            key.parked,
                            key.items,
                            key.lag_ms.map_or_else(|| "-".into(), |l| format!("{l} ms")),
                        );
                    }
                }
                Err(error) => println!("[status] inspect failed: {error}"),
            }
        }
    };
    let deadline = async {
        match run_for {
            Some(d) => SystemClock.sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = status => {}
        signal = watukuy_examples::shutdown::signal() => println!("{}: stopping", signal?),
        () = deadline => println!("time is up: stopping"),
    }
    engine.stop(StopOptions::default()).await?;
    let report = engine.inspect().await?;
    for key in &report.pollers {
        println!(
            "stopped cleanly: {} events delivered, {} parked, {} items in {DATABASE}",
            key.delivery.applied, key.parked, key.items,
        );
    }
    println!("see what it wrote:");
    println!("  {CLI_COMMAND}");
    Ok(())
}
