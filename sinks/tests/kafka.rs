//! The Kafka sink against Tansu (a Kafka-compatible broker from crates.io), one private broker
//! per test on free loopback ports, with topics created by Tansu's own command line and records
//! read back with kafka-python (`tests/kafka/read.py`), a client independent of the sink's:
//!
//! - binary records: key = subject, value = the data (`null` for a delete), the `ce_*` headers
//!   and `content-type`, the event's time as the timestamp, the partition kafka-python's default
//!   partitioner picks for the key, and one key's records in the order sent;
//! - structured records: the CloudEvent as the value;
//! - a topic that does not exist is permanent, and delivered to once it exists; options that
//!   cannot work fail when the sink is built, naming the option;
//! - an engine run with the broker cut off keeps its events in the outbox (retried, none parked)
//!   and produces every one once the broker is back.

mod common;
#[path = "kafka/tansu.rs"]
mod tansu;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{Outage, Relay, ctx, event, fails_as, free_port};
use serde_json::Value;
use tansu::{Read, Tansu};
use watukuy_core::{
    Event, EventType,
    delivery::{Handler, HandlerErrorKind},
};
use watukuy_sinks::{KafkaFormat, KafkaOptions, KafkaSink};

/// `2026-01-01T00:00:00.000Z`, the time of `common::event`, in milliseconds.
const EVENT_TIME_MS: i64 = 1_767_225_600_000;

/// The headers of a binary record of `event` (as `common::event` builds it).
fn binary_headers(event: &Event) -> BTreeMap<String, String> {
    let kind = event.event_type.to_string();
    [
        ("ce_id", event.id.to_string()),
        ("ce_source", "urn:watukuy:orders".to_owned()),
        ("ce_specversion", "1.0".to_owned()),
        ("ce_subject", event.subject.to_string()),
        ("ce_time", "2026-01-01T00:00:00.000Z".to_owned()),
        ("ce_type", format!("orders.{kind}")),
        ("ce_watukuylane", "live".to_owned()),
        ("ce_watukuypartition", String::new()),
        ("ce_watukuypoller", "orders".to_owned()),
        ("ce_watukuysequence", event.sequence.to_string()),
        ("content-type", "application/json".to_owned()),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_owned(), value))
    .collect()
}

#[watukuy_testenv::requires(kafka_server)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_records_carry_key_data_and_headers_in_order_per_key() {
    let tansu = Tansu::start().await;
    tansu.create_topic("orders", 3).await;
    let sink = KafkaSink::new(KafkaOptions::new([tansu.bootstrap()], "orders")).unwrap();
    assert_eq!(sink.topic(), "orders");

    // Six items, then later changes of two of them, and a delete.
    let mut sent: Vec<Event> = (1..=6)
        .map(|n| event("orders", n, EventType::Created))
        .collect();
    for (n, of, kind) in [
        (7, 1, EventType::Updated),
        (8, 2, EventType::Updated),
        (9, 1, EventType::Updated),
        (10, 2, EventType::Deleted),
    ] {
        let mut later = event("orders", n, kind);
        later.subject = format!("item-{of}").into();
        if kind == EventType::Deleted {
            later.data = None;
        }
        sent.push(later);
    }
    let mut acks = BTreeMap::new();
    for event in &sent {
        let context = ctx();
        sink.handle(event.clone(), context.clone()).await.unwrap();
        assert!(!context.ack(), "acknowledged by the sink");
        let ack = sink.send(event).await.unwrap();
        acks.insert(event.id.to_string(), ack);
    }

    // Each event was sent twice (the handler, then `send`): the client has no idempotent
    // producer, so both are in the log, with the same `ce_id` for consumers to deduplicate.
    let records = tansu.read("orders").await;
    assert_eq!(records.len(), 2 * sent.len(), "{records:#?}");
    let partitions: std::collections::BTreeSet<i64> = records.iter().map(|r| r.partition).collect();
    assert!(
        partitions.len() > 1,
        "ten keys over one partition: {records:#?}"
    );
    for record in &records {
        let id = record.header("ce_id").unwrap();
        let event = sent.iter().find(|e| *e.id == *id).unwrap();
        assert_eq!(record.key.as_deref(), Some(&*event.subject));
        assert_eq!(
            record.value.as_deref(),
            Some(event.data.as_ref().map_or("null", |d| d.as_str()))
        );
        assert_eq!(record.headers, binary_headers(event), "{record:#?}");
        assert_eq!(record.timestamp, EVENT_TIME_MS);
        // The partition Kafka's default partitioner (kafka-python's, here) picks for the key.
        assert_eq!(record.partition, record.expected_partition, "{record:#?}");
    }
    // What `send` answered is where the second copy is.
    for (id, ack) in &acks {
        let copies: Vec<&Read> = records
            .iter()
            .filter(|r| r.header("ce_id") == Some(id.as_str()))
            .collect();
        assert_eq!(copies.len(), 2);
        assert_eq!(
            (copies[1].partition, copies[1].offset),
            (i64::from(ack.partition), ack.offset)
        );
    }
    // One item's changes, in the order they were sent.
    for subject in ["item-1", "item-2"] {
        let order: Vec<&str> = records
            .iter()
            .filter(|r| r.key.as_deref() == Some(subject))
            .map(|r| r.header("ce_type").unwrap())
            .collect();
        let expected: Vec<String> = sent
            .iter()
            .filter(|e| *e.subject == *subject)
            .flat_map(|e| {
                let kind = format!("orders.{}", e.event_type);
                [kind.clone(), kind]
            })
            .collect();
        assert_eq!(order, expected, "{subject}");
    }
}

#[watukuy_testenv::requires(kafka_server)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_records_carry_the_cloud_event() {
    let tansu = Tansu::start().await;
    tansu.create_topic("structured", 1).await;
    let sink = KafkaSink::new(
        KafkaOptions::new([tansu.bootstrap()], "structured")
            .format(KafkaFormat::Structured)
            .key(|e| format!("{}/{}", e.poller, e.subject)),
    )
    .unwrap();
    let created = event("orders", 1, EventType::Created);
    let mut deleted = event("orders", 2, EventType::Deleted);
    deleted.data = None;
    for event in [&created, &deleted] {
        sink.handle(event.clone(), ctx()).await.unwrap();
    }
    let records = tansu.read("structured").await;
    assert_eq!(records.len(), 2, "{records:#?}");
    for (record, event) in records.iter().zip([&created, &deleted]) {
        assert_eq!(
            record.key.as_deref(),
            Some(format!("orders/{}", event.subject).as_str())
        );
        let value: Value = serde_json::from_str(record.value.as_deref().unwrap()).unwrap();
        assert_eq!(
            value,
            serde_json::to_value(event.to_cloud_event()).unwrap(),
            "{record:#?}"
        );
        assert_eq!(value["id"], *event.id);
        assert_eq!(
            record.headers,
            BTreeMap::from([(
                "content-type".to_owned(),
                "application/cloudevents+json".to_owned()
            )])
        );
    }
}

#[watukuy_testenv::requires(kafka_server)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_topic_is_permanent_until_it_exists() {
    let tansu = Tansu::start().await;
    let sink = KafkaSink::new(KafkaOptions::new([tansu.bootstrap()], "later")).unwrap();
    let first = event("orders", 1, EventType::Created);
    let context = ctx();
    let error = sink
        .handle(first.clone(), context.clone())
        .await
        .unwrap_err();
    assert_eq!(error.kind(), &HandlerErrorKind::Permanent, "{error}");
    assert_eq!(
        error.to_string(),
        format!(
            "kafka: topic later does not exist on the cluster at {} (create it; the sink does \
             not)",
            tansu.bootstrap()
        )
    );
    assert!(context.ack(), "a failed produce is not acknowledged");

    // An operator creates the topic and retries the parked event: it is produced.
    tansu.create_topic("later", 2).await;
    sink.handle(first.clone(), ctx()).await.unwrap();
    let records = tansu.read("later").await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].header("ce_id"), Some(&*first.id));
}

#[tokio::test]
async fn options_that_cannot_work_fail_when_the_sink_is_built() {
    let no_brokers: [&str; 0] = [];
    let cases = [
        (
            KafkaOptions::new(no_brokers, "orders"),
            "kafka.brokers: must name at least one broker (host:port)",
        ),
        (
            KafkaOptions::new(["tcp://127.0.0.1:9092"], "orders"),
            r#"kafka.brokers: "tcp://127.0.0.1:9092" is not host:port (for example 127.0.0.1:9092)"#,
        ),
        (
            KafkaOptions::new(["127.0.0.1"], "orders"),
            r#"kafka.brokers: "127.0.0.1" is not host:port (for example 127.0.0.1:9092)"#,
        ),
        (
            KafkaOptions::new(["127.0.0.1:9092"], ""),
            "kafka.topic: must not be empty",
        ),
        (
            KafkaOptions::new(["127.0.0.1:9092"], "orders/eu"),
            r#"kafka.topic: "orders/eu" contains '/'; Kafka allows ASCII letters, digits, '.', '_' and '-'"#,
        ),
        (
            KafkaOptions::new(["127.0.0.1:9092"], ".."),
            r#"kafka.topic: ".." is not a topic name Kafka allows"#,
        ),
        (
            KafkaOptions::new(["127.0.0.1:9092"], "x".repeat(250)),
            "kafka.topic: is 250 characters long; Kafka allows at most 249",
        ),
        (
            KafkaOptions::new(["127.0.0.1:9092"], "orders").timeout(Duration::ZERO),
            "kafka.timeout: must be more than zero",
        ),
    ];
    for (options, expected) in cases {
        let error = KafkaSink::new(options).unwrap_err();
        assert_eq!(error.to_string(), expected);
    }
}

#[tokio::test]
async fn a_broker_that_is_not_there_is_transient() {
    let port = free_port();
    let sink = KafkaSink::new(
        KafkaOptions::new([format!("127.0.0.1:{port}")], "orders").timeout(Duration::from_secs(5)),
    )
    .unwrap();
    let error = fails_as(
        &sink,
        event("orders", 1, EventType::Created),
        HandlerErrorKind::Transient,
    )
    .await;
    assert!(
        error.to_string().starts_with("kafka: topic orders: ")
            && error.to_string().contains(&format!("127.0.0.1:{port}")),
        "{error}"
    );
}

#[watukuy_testenv::requires(kafka_server)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_cut_off_mid_run_keeps_events_in_the_outbox_then_produces_them_all() {
    // The broker advertises the relay's port: every connection of the sink, the bootstrap one
    // and the partition leader's, goes through the relay.
    let port = free_port();
    let tansu = Tansu::start_on(free_port(), port).await;
    let upstream = format!("127.0.0.1:{}", tansu.listener);
    tansu.create_topic("outage", 2).await;
    let relay = Relay::start(port, upstream.clone()).await;
    let sink = KafkaSink::new(
        KafkaOptions::new([tansu.bootstrap()], "outage").timeout(Duration::from_secs(5)),
    )
    .unwrap();

    // The broker goes away before the run delivers, and comes back: retries deliver everything,
    // nothing is parked.
    let relay = Outage::new(sink).through(relay, port, upstream).await;
    let records = tansu.read("outage").await;
    let mut ids: Vec<&str> = records.iter().filter_map(|r| r.header("ce_id")).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 3, "every event produced: {records:#?}");
    assert_eq!(records.len(), 3, "each once: {records:#?}");
    relay.stop().await;
}
