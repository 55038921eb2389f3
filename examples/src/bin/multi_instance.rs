//! Three engine instances (three processes) on one PostgreSQL database: every key is polled by
//! one instance at a time, and when an instance is killed the others take over its keys.
//!
//! Run it with `WATUKUY_TEST_POSTGRES_URL=postgres://user@127.0.0.1/db cargo run -p
//! watukuy-examples --bin multi_instance` (or pass `--url postgres://…`). Without a URL it prints
//! how to run it and exits 0.
//!
//! The program starts itself three times as children (`WATUKUY_MULTI_INSTANCE_CHILD=a|b|c`).
//! Each child runs an engine daemon over the same store schema, with a 2 s lease, polling a
//! poller partitioned into six keys (`p1`…`p6`); its fetch prints which instance polls which key
//! and takes a little while, so the lease is held during it. After 5 s the parent kills child
//! `b` (SIGKILL: no clean release); its leases expire and `a` and `c` poll every key, including
//! the ones `b` held. Children `a` and `c` stop cleanly after 12 s. The parent prints the
//! children's lines and a summary of who polled what before and after the kill.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use watukuy_core::schedule::ScheduleOptions;
use watukuy_core::{
    BoxError, Engine, Event, FetchContext, HandlerContext, HandlerError, Page, Partition, Poller,
    StopOptions,
    clock::{Clock, SystemClock},
    cursor,
};
use watukuy_store_postgres::{PgPool, PostgresOptions, PostgresStore};

const CHILD_ENV: &str = "WATUKUY_MULTI_INSTANCE_CHILD";
const SCHEMA_ENV: &str = "WATUKUY_MULTI_INSTANCE_SCHEMA";
const URL_ENV: &str = "WATUKUY_TEST_POSTGRES_URL";
const PARTITIONS: [&str; 6] = ["p1", "p2", "p3", "p4", "p5", "p6"];

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Item {
    id: String,
    n: u64,
}

fn database_url() -> Option<String> {
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--url" {
            return args.next();
        }
    }
    std::env::var(URL_ENV).ok().filter(|u| !u.trim().is_empty())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Some(url) = database_url() else {
        println!("multi_instance needs PostgreSQL. Run it with");
        println!(
            "  {URL_ENV}=postgres://user@127.0.0.1/db cargo run -p watukuy-examples --bin multi_instance"
        );
        println!("or pass --url postgres://…");
        return Ok(());
    };
    match std::env::var(CHILD_ENV) {
        Ok(name) => child(&name, &url, &std::env::var(SCHEMA_ENV)?).await,
        Err(_) => parent(&url).await,
    }
}

/// One instance: an engine daemon for `run_for`, printing what it polls and delivers.
async fn child(name: &str, url: &str, schema: &str) -> Result<(), Box<dyn std::error::Error>> {
    let store = PostgresStore::connect(url, PostgresOptions::default().schema(schema)).await?;
    store.migrate().await?; // safe from every instance at once
    let instance = name.to_owned();
    let started = SystemClock.now_ms();
    let items = Poller::builder::<Item>("items")
        .identity(|item: &Item| item.id.clone())
        .cursor(cursor::snapshot_diff())
        .schedule(
            ScheduleOptions::default()
                .min(Duration::from_secs(1))
                .max(Duration::from_secs(1))
                .adaptive(false)
                .jitter(0.0),
        )
        .partitions(
            || async { Ok::<_, BoxError>(PARTITIONS.iter().map(|p| Partition::new(*p)).collect()) },
            Duration::from_secs(300),
        )
        .fetch(move |ctx: FetchContext| {
            let instance = instance.clone();
            async move {
                println!("[{instance}] polls {}", ctx.partition.key);
                // A slow API: the lease is held while this runs.
                SystemClock.sleep(Duration::from_millis(300)).await;
                // One more item per partition every 3 s of the run.
                let count = 1 + (SystemClock.now_ms() - started).max(0) / 3_000;
                let items: Vec<Item> = (1..=count.unsigned_abs())
                    .map(|n| Item {
                        id: format!("{}-{n}", ctx.partition.key),
                        n,
                    })
                    .collect();
                Ok::<_, BoxError>(Page::from_items(&items)?)
            }
        })
        .build()?;
    let engine = Engine::builder(Arc::new(store))
        .poller(items)
        .instance_id(name)
        .lease(Duration::from_secs(2), None)
        .build()?;
    let instance = name.to_owned();
    engine.on("items", move |event: Event, ctx: HandlerContext| {
        let instance = instance.clone();
        async move {
            println!(
                "[{instance}] delivers {} {} ({})",
                event.event_type.as_str(),
                event.subject,
                ctx.partition.key
            );
            Ok::<(), HandlerError>(())
        }
    })?;
    engine.start().await?;
    tokio::select! {
        () = SystemClock.sleep(Duration::from_secs(12)) => {}
        signal = watukuy_examples::shutdown::signal() => println!("[{name}] {}: stopping", signal?),
    }
    engine.stop(StopOptions::default()).await?;
    println!("[{name}] stopped cleanly");
    Ok(())
}

/// Which instances polled each partition.
type Polled = BTreeMap<String, BTreeSet<String>>;

/// Starts three children, kills `b` after 5 s, and summarises who polled what.
async fn parent(url: &str) -> Result<(), Box<dyn std::error::Error>> {
    let schema = format!(
        "wk_multi_{}_{}",
        std::process::id(),
        SystemClock.now_ms() % 1_000_000
    );
    let exe = std::env::current_exe()?;
    let killed = Arc::new(Mutex::new(false));
    // (instance, partition) pairs polled before and after the kill.
    let polls: Arc<Mutex<[Polled; 2]>> = Arc::default();
    let mut children = BTreeMap::new();
    let mut readers = Vec::new();
    for name in ["a", "b", "c"] {
        let mut child = tokio::process::Command::new(&exe)
            .args(["--url", url])
            .env(CHILD_ENV, name)
            .env(SCHEMA_ENV, &schema)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (killed, polls) = (Arc::clone(&killed), Arc::clone(&polls));
        readers.push(tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                println!("{line}");
                if let Some((instance, partition)) = line
                    .strip_prefix('[')
                    .and_then(|rest| rest.split_once("] polls "))
                {
                    let after = usize::from(*killed.lock().unwrap_or_else(PoisonError::into_inner));
                    polls.lock().unwrap_or_else(PoisonError::into_inner)[after]
                        .entry(partition.to_owned())
                        .or_default()
                        .insert(instance.to_owned());
                }
            }
        }));
        children.insert(name, child);
    }
    SystemClock.sleep(Duration::from_secs(5)).await;
    if let Some(b) = children.get_mut("b") {
        b.kill().await?; // SIGKILL: its leases are not released, they expire
    }
    *killed.lock().unwrap_or_else(PoisonError::into_inner) = true;
    println!("--- parent: killed instance b (its leases expire within 2 s) ---");
    let mut failed = false;
    for (name, child) in &mut children {
        let status = child.wait().await?;
        if *name != "b" && !status.success() {
            println!("instance {name} failed: {status}");
            failed = true;
        }
    }
    for reader in readers {
        let _ = reader.await;
    }
    let pool = PgPool::connect(url).await?;
    sqlx::query(&format!(r#"DROP SCHEMA IF EXISTS "{schema}" CASCADE"#))
        .execute(&pool)
        .await?;

    let polls = polls.lock().unwrap_or_else(PoisonError::into_inner).clone();
    for (label, map) in ["before the kill", "after the kill"].iter().zip(&polls) {
        println!("polled {label}:");
        for (partition, instances) in map {
            let list: Vec<&str> = instances.iter().map(String::as_str).collect();
            println!("  {partition}: {}", list.join(", "));
        }
    }
    let after = &polls[1];
    // Only the survivors count (a line b printed just before dying may be read after the kill).
    let all_polled_after = PARTITIONS.iter().all(|p| {
        after
            .get(*p)
            .is_some_and(|i| i.contains("a") || i.contains("c"))
    });
    if failed || !all_polled_after {
        return Err("fail-over did not happen as expected".into());
    }
    println!(
        "fail-over ok: after b was killed, a and c polled all {} keys",
        PARTITIONS.len()
    );
    Ok(())
}
