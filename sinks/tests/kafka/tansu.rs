//! A private Tansu broker for tests (a Kafka-compatible broker from crates.io, in-memory
//! storage), its topics created with Tansu's own command line and read back with kafka-python
//! (`read.py` beside this file), a client independent of the sink's. Shared by the sink's tests
//! (`sinks/tests/kafka.rs`) and the kafka example's (`examples/tests/kafka.rs`).
#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A TCP port on 127.0.0.1 that nothing listens on right now.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

pub fn program(name: &str) -> &'static str {
    match name {
        "tansu" => watukuy_testenv::program!("tansu"),
        _ => watukuy_testenv::program!("python3"),
    }
    .unwrap_or_else(|why| panic!("{why}"))
}

/// A private Tansu broker with in-memory storage, killed when dropped. It listens on one port
/// and advertises another (the same, or a relay's in front of it): clients reach the broker at
/// the advertised address after their first request.
pub struct Tansu {
    _child: Child,
    pub listener: u16,
    pub advertised: u16,
    log: Arc<Mutex<Vec<String>>>,
}

impl Tansu {
    pub async fn start() -> Self {
        let port = free_port();
        Self::start_on(port, port).await
    }

    /// Starts the broker and waits for the line saying it is ready (on its log: nothing here
    /// polls or sleeps).
    pub async fn start_on(listener: u16, advertised: u16) -> Self {
        let bin = program("tansu");
        let mut child = Command::new(bin)
            .args([
                "broker",
                "--listener-url",
                &format!("tcp://127.0.0.1:{listener}"),
                "--advertised-listener-url",
                &format!("tcp://127.0.0.1:{advertised}"),
                "--storage-engine",
                "memory://tansu/",
            ])
            .env("RUST_LOG", "warn")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start `{bin}` ({e}): cargo install --locked tansu --features dynostore"
                )
            });
        let log = Arc::new(Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = tokio::sync::mpsc::unbounded_channel();
        for stream in [
            Box::pin(child.stdout.take().expect("stdout is piped"))
                as std::pin::Pin<Box<dyn tokio::io::AsyncRead + Send>>,
            Box::pin(child.stderr.take().expect("stderr is piped")),
        ] {
            let log = Arc::clone(&log);
            let ready_tx = ready_tx.clone();
            tokio::spawn(async move {
                // Keep draining the log so the broker never blocks on it.
                let mut lines = BufReader::new(stream).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if line.contains("ready in") {
                        let _ = ready_tx.send(());
                    }
                    log.lock().unwrap().push(line);
                }
            });
        }
        drop(ready_tx);
        let mut ready_rx = ready_rx;
        match tokio::time::timeout(Duration::from_secs(60), ready_rx.recv()).await {
            Ok(Some(())) => Self {
                _child: child,
                listener,
                advertised,
                log,
            },
            outcome => panic!(
                "tansu on port {listener} did not become ready ({}): {:#?}",
                if outcome.is_err() {
                    "timed out"
                } else {
                    "it exited"
                },
                log.lock().unwrap()
            ),
        }
    }

    /// The address clients bootstrap from (the advertised one).
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.advertised)
    }

    /// Creates a topic with Tansu's own command line, straight at the broker's listener.
    pub async fn create_topic(&self, name: &str, partitions: u32) {
        let mut command = Command::new(program("tansu"));
        command.args([
            "topic",
            "create",
            "--broker",
            &format!("tcp://127.0.0.1:{}", self.listener),
            "--partitions",
            &partitions.to_string(),
            name,
        ]);
        let log = format!("{:#?}", self.log.lock().unwrap());
        succeeded(command, &format!("tansu topic create {name}"), &log).await;
    }

    /// Every record of `topic`, read with kafka-python through the advertised address.
    pub async fn read(&self, topic: &str) -> Vec<Read> {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../sinks/tests/kafka/read.py");
        let mut command = Command::new(program("python3"));
        command.args([script, &self.bootstrap(), topic]);
        let output = succeeded(
            command,
            &format!("read.py {topic}"),
            "(pip install kafka-python==3.0.12)",
        )
        .await;
        String::from_utf8(output.stdout)
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .map(|record: Value| Read {
                partition: record["partition"].as_i64().unwrap(),
                offset: record["offset"].as_i64().unwrap(),
                key: record["key"].as_str().map(str::to_owned),
                value: record["value"].as_str().map(str::to_owned),
                headers: record["headers"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|pair| {
                        (
                            pair[0].as_str().unwrap().to_owned(),
                            pair[1].as_str().unwrap_or_default().to_owned(),
                        )
                    })
                    .collect(),
                timestamp: record["timestamp"].as_i64().unwrap(),
                expected_partition: record["expected_partition"].as_i64().unwrap(),
            })
            .collect()
    }
}

/// A record as kafka-python read it.
#[derive(Debug)]
pub struct Read {
    pub partition: i64,
    pub offset: i64,
    pub key: Option<String>,
    pub value: Option<String>,
    pub headers: BTreeMap<String, String>,
    pub timestamp: i64,
    pub expected_partition: i64,
}

impl Read {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

/// Runs `command` without input; its output, once it exited 0 (else a panic naming `what`, with
/// what it printed and `hint`).
async fn succeeded(mut command: Command, what: &str, hint: &str) -> std::process::Output {
    let output = command.stdin(Stdio::null()).output().await.unwrap();
    assert!(
        output.status.success(),
        "{what}: {}\n{}\n{hint}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    output
}
