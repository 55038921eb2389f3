//! The BullMQ sink against the real Redis at `WATUKUY_TEST_REDIS_URL` and real BullMQ releases
//! (npm, pinned in `tests/node-bullmq/package-lock.json`; `npm ci --prefix
//! sinks/tests/node-bullmq` installs them), each run by Node.js:
//!
//! - every key the sink writes equals what that release's own `Queue.add` writes for the same
//!   job (the job hash but its timestamp, the wait list, the marker, the id counter, the queue's
//!   meta but its `version`, every entry of the events stream), a duplicate included;
//! - an unmodified BullMQ `Worker` runs every job the sink added, once, with the event's id,
//!   name and data;
//! - an engine run with Redis cut off keeps its events in the outbox (retried, none parked) and
//!   adds every job once Redis is back.
//!
//! Every test works under a key prefix of its own and deletes it when it passes.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use common::{Outage, Relay, broker_url, ctx, event, fails_as, free_port};
use redis::AsyncCommands;
use serde_json::{Value, json};
use watukuy_core::{
    EventType,
    delivery::{Handler, HandlerErrorKind},
};
use watukuy_sinks::{BULLMQ_VERSIONS, BullMqSink, JobAdded, serialize_event};

fn redis_url() -> String {
    broker_url("WATUKUY_TEST_REDIS_URL", "BullMQ (Redis)")
}

/// A key prefix unique to this process and test.
fn prefix(test: &str) -> String {
    format!("wk-bullmq-{}-{test}", std::process::id())
}

async fn redis() -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(redis_url()).unwrap();
    client.get_multiplexed_async_connection().await.unwrap()
}

/// Deletes every key under `prefix`.
async fn clean(prefix: &str) {
    let mut conn = redis().await;
    let keys: Vec<String> = conn.keys(format!("{prefix}:*")).await.unwrap();
    if !keys.is_empty() {
        let _: () = conn.del(keys).await.unwrap();
    }
}

/// A sink of `queue` on the test's Redis under `prefix`.
async fn sink_at(prefix: &str, queue: &str) -> BullMqSink {
    BullMqSink::connect(&redis_url(), queue)
        .await
        .unwrap()
        .prefix(prefix)
        .unwrap()
}

fn node_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/node-bullmq")
}

/// The npm alias of a BullMQ release (`bullmq-5`, `bullmq-6`).
fn package(version: &str) -> String {
    format!("bullmq-{}", version.split('.').next().unwrap_or_default())
}

/// Runs `node bullmq.js <args>` with `version`'s BullMQ; its stdout lines.
async fn node(version: &str, args: &[&str]) -> Vec<String> {
    let dir = node_dir();
    let installed = dir
        .join("node_modules")
        .join(package(version))
        .join("package.json");
    let manifest = std::fs::read_to_string(&installed).unwrap_or_else(|_| {
        panic!(
            "BullMQ is not installed at {}: run `npm ci --prefix sinks/tests/node-bullmq`",
            installed.display()
        )
    });
    let found: Value = serde_json::from_str(&manifest).unwrap();
    assert_eq!(found["version"], version, "the pinned BullMQ release");
    let program = std::env::var("WATUKUY_TEST_NODE_BIN").unwrap_or_else(|_| "node".to_owned());
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(&program)
            .arg(dir.join("bullmq.js"))
            .args(args)
            .env("BULLMQ_PACKAGE", package(version))
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("node finishes")
    .unwrap_or_else(|e| panic!("cannot run {program}: {e} (install Node.js)"));
    assert!(
        output.status.success(),
        "node bullmq.js {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Everything under `<prefix>:<queue>:`, by key suffix, with what varies from run to run taken
/// out: the job's timestamp (checked to be a time in ms), stream entry ids, the meta `version`
/// a BullMQ client writes when it connects. JSON fields (`data`, `opts`) are parsed.
async fn dump(prefix: &str, queue: &str) -> BTreeMap<String, Value> {
    let mut conn = redis().await;
    let base = format!("{prefix}:{queue}:");
    let mut keys: Vec<String> = conn.keys(format!("{base}*")).await.unwrap();
    keys.sort();
    let mut out = BTreeMap::new();
    for key in keys {
        let suffix = key.strip_prefix(&base).unwrap().to_owned();
        let kind: String = redis::cmd("TYPE")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        let value = match kind.as_str() {
            "string" => json!(conn.get::<_, String>(&key).await.unwrap()),
            "list" => json!(conn.lrange::<_, Vec<String>>(&key, 0, -1).await.unwrap()),
            "zset" => json!(
                conn.zrange_withscores::<_, Vec<(String, String)>>(&key, 0, -1)
                    .await
                    .unwrap()
            ),
            "hash" => {
                let mut hash: BTreeMap<String, String> = conn.hgetall(&key).await.unwrap();
                hash.remove("version");
                let mut fields = serde_json::Map::new();
                for (field, value) in hash {
                    let value = match field.as_str() {
                        "data" | "opts" => serde_json::from_str(&value).unwrap(),
                        "timestamp" => {
                            let ms: i64 = value.parse().unwrap();
                            assert!(ms > 1_700_000_000_000, "{key} timestamp {value}");
                            json!("<ms>")
                        }
                        _ => json!(value),
                    };
                    fields.insert(field, value);
                }
                Value::Object(fields)
            }
            "stream" => {
                let entries: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
                    .arg(&key)
                    .arg("-")
                    .arg("+")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                json!(
                    entries
                        .into_iter()
                        .map(|(_id, mut fields)| {
                            fields.sort();
                            fields
                        })
                        .collect::<Vec<_>>()
                )
            }
            other => json!(format!("<{other}>")),
        };
        out.insert(suffix, value);
    }
    out
}

#[watukuy_testenv::requires(redis, bullmq)]
#[tokio::test]
async fn every_key_is_what_queue_add_writes_for_each_release() {
    for version in BULLMQ_VERSIONS {
        let prefix = prefix(&format!("keys-{}", package(version)));
        clean(&prefix).await;
        let sink = sink_at(&prefix, "sink").await.attempts(3);
        let first = event("orders", 1, EventType::Created);
        let data =
            String::from_utf8(serialize_event(&first, Default::default()).unwrap().body).unwrap();
        for round in ["first", "duplicate"] {
            let expected = if round == "first" {
                JobAdded::Added
            } else {
                JobAdded::Duplicate
            };
            assert_eq!(sink.add(&first).await.unwrap(), expected, "{version}");
            let lines = node(
                version,
                &[
                    "add",
                    &redis_url(),
                    &prefix,
                    "reference",
                    "orders.created",
                    &first.id,
                    &data,
                    "3",
                ],
            )
            .await;
            assert_eq!(lines, [json!({ "id": &*first.id }).to_string()]);
            let ours = dump(&prefix, "sink").await;
            let theirs = dump(&prefix, "reference").await;
            assert_eq!(
                serde_json::to_string_pretty(&ours).unwrap(),
                serde_json::to_string_pretty(&theirs).unwrap(),
                "BullMQ {version}, {round} add: the sink's keys (left) and Queue.add's (right)"
            );
        }
        // What the comparison covered.
        let ours = dump(&prefix, "sink").await;
        let keys: Vec<&str> = ours.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [&*first.id, "events", "id", "marker", "meta", "wait"],
            "{version}"
        );
        assert_eq!(ours["wait"], json!([&*first.id]));
        assert_eq!(ours["id"], json!("2"));
        clean(&prefix).await;
    }
}

#[watukuy_testenv::requires(redis, bullmq)]
#[tokio::test]
async fn an_unmodified_worker_of_each_release_runs_every_job_once() {
    for version in BULLMQ_VERSIONS {
        let prefix = prefix(&format!("worker-{}", package(version)));
        clean(&prefix).await;
        let sink = sink_at(&prefix, "orders").await;
        let events: Vec<_> = (1..=4)
            .map(|n| {
                event(
                    "orders",
                    n,
                    [EventType::Created, EventType::Updated][n as usize % 2],
                )
            })
            .collect();
        for event in &events {
            let context = ctx();
            sink.handle(event.clone(), context.clone()).await.unwrap();
            assert!(!context.ack(), "acknowledged by the sink");
        }
        // A redelivery adds no second job.
        sink.handle(events[0].clone(), ctx()).await.unwrap();

        let lines = node(version, &["work", &redis_url(), &prefix, "orders", "4"]).await;
        let (counts, jobs) = lines.split_last().unwrap();
        let mut seen: Vec<Value> = jobs
            .iter()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        seen.sort_by_key(|job| job["id"].as_str().unwrap_or_default().to_owned());
        let expected: Vec<Value> = events
            .iter()
            .map(|e| {
                json!({
                    "id": &*e.id,
                    "name": format!("orders.{}", e.event_type),
                    "data": serde_json::to_value(e.to_cloud_event()).unwrap(),
                    "attemptsMade": 0,
                })
            })
            .collect();
        assert_eq!(seen, expected, "BullMQ {version}");
        let counts: Value = serde_json::from_str(counts).unwrap();
        let count = |state: &str| counts["counts"][state].as_u64();
        assert_eq!(
            ["waiting", "active", "completed", "failed"].map(count),
            [Some(0), Some(0), Some(4), Some(0)],
            "BullMQ {version}: {counts}"
        );
        clean(&prefix).await;
    }
}

#[watukuy_testenv::requires(redis)]
#[tokio::test]
async fn options_are_checked_when_built_and_redis_errors_are_classified() {
    let error = BullMqSink::connect(&redis_url(), "a:b").await.unwrap_err();
    assert_eq!(error.option, "queue");
    assert!(error.to_string().contains("':'"), "{error}");
    let error = BullMqSink::connect(&redis_url(), "").await.unwrap_err();
    assert_eq!(error.to_string(), "bullmq.queue: must not be empty");
    let sink = BullMqSink::connect(&redis_url(), "q").await.unwrap();
    let error = sink.prefix("").unwrap_err();
    assert_eq!(error.option, "prefix");
    let error = BullMqSink::connect("redis://:hunter2@127.0.0.1:notaport", "q")
        .await
        .unwrap_err();
    assert_eq!(error.option, "url");
    assert!(!error.to_string().contains("hunter2"), "{error}");

    // Something else's key where the queue's wait list goes: Redis answers WRONGTYPE, which no
    // retry mends, so the event parks with Redis' message.
    let prefix = prefix("wrongtype");
    clean(&prefix).await;
    let mut conn = redis().await;
    let _: () = conn.set(format!("{prefix}:q:wait"), "x").await.unwrap();
    let sink = sink_at(&prefix, "q").await;
    let error = fails_as(
        &sink,
        event("orders", 1, EventType::Created),
        HandlerErrorKind::Permanent,
    )
    .await;
    assert!(error.to_string().contains("WRONGTYPE"), "{error}");
    clean(&prefix).await;
}

#[watukuy_testenv::requires(redis)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cut_off_mid_run_keeps_events_in_the_outbox_then_adds_them_all() {
    let prefix = prefix("outage");
    clean(&prefix).await;
    let upstream = redis::parse_redis_url(&redis_url())
        .and_then(|url| {
            Some(format!(
                "{}:{}",
                url.host_str()?,
                url.port().unwrap_or(6379)
            ))
        })
        .expect("host and port in WATUKUY_TEST_REDIS_URL");
    let port = free_port();
    let relay = Relay::start(port, upstream.clone()).await;
    let sink = BullMqSink::connect(&format!("redis://127.0.0.1:{port}"), "orders")
        .await
        .unwrap()
        .prefix(&prefix)
        .unwrap()
        .timeout(Duration::from_secs(2));

    // Redis goes away before the run delivers, and comes back: retries deliver everything,
    // nothing is parked.
    let relay = Outage::new(sink).through(relay, port, upstream).await;
    let mut conn = redis().await;
    let wait: Vec<String> = conn
        .lrange(format!("{prefix}:orders:wait"), 0, -1)
        .await
        .unwrap();
    assert_eq!(wait.len(), 3, "one job per event: {wait:?}");
    relay.stop().await;
    clean(&prefix).await;
}
