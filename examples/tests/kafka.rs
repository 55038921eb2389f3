//! The kafka example as a user runs it: a private Tansu broker (a Kafka-compatible broker),
//! a topic, `kafka --brokers … --topic orders --for 4` in a temporary working folder, then the
//! topic read back with kafka-python: the ERP's first orders are there, keyed by order id, with
//! their CloudEvents headers and the order as the value.

mod common;
#[path = "../../sinks/tests/kafka/tansu.rs"]
mod tansu;

use std::collections::BTreeSet;

use serde_json::Value;
use tansu::Tansu;

#[watukuy_testenv::requires(kafka_server)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_erp_s_orders_arrive_in_the_topic() {
    let tansu = Tansu::start().await;
    tansu.create_topic("orders", 3).await;
    let dir = tempfile::tempdir().unwrap();
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_kafka"))
        .args([
            "--brokers",
            &tansu.bootstrap(),
            "--topic",
            "orders",
            "--for",
            "4",
        ])
        .current_dir(dir.path())
        .output()
        .await
        .unwrap();
    let stdout = common::printed(
        "kafka",
        &output,
        &[
            "polling http://127.0.0.1:",
            "produced created ord-1001 #1",
            "time is up: stopping",
            "stopped: ",
        ],
    );
    assert!(dir.path().join("kafka.sqlite").exists());

    let records = tansu.read("orders").await;
    let created: BTreeSet<&str> = records
        .iter()
        .filter(|r| r.header("ce_type") == Some("orders.created"))
        .filter_map(|r| r.key.as_deref())
        .collect();
    for id in ["ord-1001", "ord-1002", "ord-1003"] {
        assert!(created.contains(id), "{id} not created in {records:#?}");
    }
    for record in &records {
        let order: Value = serde_json::from_str(record.value.as_deref().unwrap()).unwrap();
        assert_eq!(order["id"].as_str(), record.key.as_deref(), "{record:#?}");
        assert_eq!(record.header("ce_subject"), record.key.as_deref());
        assert_eq!(record.header("content-type"), Some("application/json"));
        assert_eq!(record.partition, record.expected_partition);
    }
    // The example prints a line per record produced.
    let produced = stdout.lines().filter(|l| l.contains("produced ")).count();
    assert_eq!(produced, records.len(), "{stdout}");
}
