//! Poll the quickstart's ERP into a Kafka topic: each order change becomes one record, keyed by
//! the order id, with the CloudEvents attributes in `ce_*` headers and the order as the value.
//!
//! With a Kafka (or Kafka-compatible) broker on 127.0.0.1:9092 and a topic `orders`:
//!
//! ```text
//! cargo run -p watukuy-examples --bin kafka -- --brokers 127.0.0.1:9092 --topic orders --for 10
//! ```
//!
//! (`--for <seconds>` stops by itself; without it, Ctrl-C or SIGTERM stops it cleanly.) The
//! cursor, the item snapshot and the outbox are in `./kafka.sqlite`: an event is in the outbox,
//! committed with the cursor that found it, before it is produced, so a broker that is down only
//! delays records (the dispatcher retries), and a restart carries on. docs/operations.md shows
//! how to read the topic back.

use std::sync::{Arc, PoisonError};
use std::time::Duration;

use watukuy_core::clock::{Clock, SystemClock};
use watukuy_core::hooks::{HookContext, Hooks};
use watukuy_core::schedule::ScheduleOptions;
use watukuy_core::store::SerializedError;
use watukuy_core::{Engine, Event, StopOptions};
use watukuy_examples::erp::{self, ErpState, run_erp, serve_erp};
use watukuy_sinks::{KafkaOptions, KafkaSink};
use watukuy_store_sqlite::{SqliteOptions, SqliteStore};

/// `--brokers host:port[,host:port]`, `--topic name`, `--for seconds`.
struct Args {
    brokers: Vec<String>,
    topic: String,
    run_for: Option<Duration>,
}

fn args() -> Result<Args, Box<dyn std::error::Error>> {
    let mut parsed = Args {
        brokers: vec!["127.0.0.1:9092".to_owned()],
        topic: "orders".to_owned(),
        run_for: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} expects a value"));
        match arg.as_str() {
            "--brokers" => parsed.brokers = value()?.split(',').map(str::to_owned).collect(),
            "--topic" => parsed.topic = value()?,
            "--for" => {
                let seconds = value()?;
                parsed.run_for =
                    Some(Duration::from_secs(seconds.parse().map_err(|_| {
                        format!("--for expects a number of seconds, got {seconds:?}")
                    })?));
            }
            other => {
                return Err(format!(
                    "unknown argument {other:?} (try --brokers 127.0.0.1:9092 --topic orders --for 10)"
                )
                .into());
            }
        }
    }
    Ok(parsed)
}

/// Prints what a user watches for: records produced, retries while the broker is away.
struct Printer;

#[async_trait::async_trait]
impl Hooks for Printer {
    async fn on_delivered(&self, _ctx: &HookContext, event: &Event, _duration_ms: i64) {
        println!(
            "  produced {} {} #{}",
            event.event_type.as_str(),
            event.subject,
            event.sequence
        );
    }

    async fn on_retry(
        &self,
        _ctx: &HookContext,
        event: &Event,
        error: &SerializedError,
        delay_ms: i64,
    ) {
        println!(
            "  retry    {} #{}: {} (next attempt in {delay_ms} ms)",
            event.subject, event.sequence, error.message
        );
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Args {
        brokers,
        topic,
        run_for,
    } = args()?;
    // The options are checked before anything starts: a bad broker address or topic name is
    // an error naming the option.
    let sink = KafkaSink::new(KafkaOptions::new(brokers.clone(), topic.clone()))?;

    let erp: ErpState = Arc::default();
    {
        let mut book = erp.lock().unwrap_or_else(PoisonError::into_inner);
        for total in [120, 75, 310] {
            book.create(total);
        }
    }
    let base = serve_erp(Arc::clone(&erp)).await?;
    tokio::spawn(run_erp(Arc::clone(&erp)));

    let store = Arc::new(SqliteStore::open(SqliteOptions::file("./kafka.sqlite"))?);
    let orders = erp::poller("orders", &base)?
        .schedule(
            ScheduleOptions::default()
                .min(Duration::from_secs(1))
                .max(Duration::from_secs(5)),
        )
        .build()?;
    let engine = Engine::builder(store)
        .poller(orders)
        .hooks(Arc::new(Printer) as Arc<dyn Hooks>)
        .build()?;
    engine.migrate().await?;
    engine.on("orders", sink)?;

    println!(
        "polling {base}/orders into Kafka topic {topic} at {}",
        brokers.join(",")
    );
    engine.start().await?;
    let deadline = async {
        match run_for {
            Some(d) => SystemClock.sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        signal = watukuy_examples::shutdown::signal() => println!("{}: stopping", signal?),
        () = deadline => println!("time is up: stopping"),
    }
    engine.stop(StopOptions::default()).await?;
    for key in &engine.inspect().await?.pollers {
        println!(
            "stopped: {} records produced, {} events still in the outbox, {} parked",
            key.delivery.applied, key.outbox_pending, key.parked
        );
    }
    Ok(())
}
