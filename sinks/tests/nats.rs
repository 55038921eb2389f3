//! The NATS JetStream sink against real servers: the shared one at `WATUKUY_TEST_NATS_URL`
//! (e.g. `nats://127.0.0.1:4222`, JetStream enabled) for dedup, and a `nats-server` child process
//! of this test, killed and restarted, for the outage case. While the variable is unset, or
//! `nats-server` is not found, the tests that need it are ignored with the reason
//! (docs/testing.md); run anyway, they fail.

mod common;

use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::header::NATS_MESSAGE_ID;
use async_nats::jetstream::{self, stream};
use common::{broker_url, ctx, event, fails_as, free_port, unique};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use watukuy_core::{
    CloudEvent, Event, EventType,
    delivery::{Handler, HandlerErrorKind},
};
use watukuy_sinks::{EventFormat, NatsSink};

/// The test broker's URL.
fn nats_url() -> String {
    broker_url("WATUKUY_TEST_NATS_URL", "NATS")
}

async fn connect(url: &str) -> async_nats::Client {
    async_nats::connect(url).await.unwrap_or_else(|e| {
        panic!(
            "NATS is not reachable at {url} ({e}). Start it with JetStream: `nats-server -a \
             127.0.0.1 -p 4222 -js -sd /var/lib/nats-server`, or point WATUKUY_TEST_NATS_URL at one"
        )
    })
}

/// A fresh stream `name` capturing `<poller>.>` with a 2-minute duplicate window.
async fn fresh_stream(
    js: &jetstream::Context,
    name: &str,
    poller: &str,
    storage: stream::StorageType,
) -> stream::Stream {
    let _ = js.delete_stream(name).await;
    js.create_stream(stream::Config {
        name: name.to_owned(),
        subjects: vec![format!("{poller}.>")],
        duplicate_window: Duration::from_secs(120),
        storage,
        ..Default::default()
    })
    .await
    .unwrap()
}

/// A client of the test server, its JetStream context, a poller name unique to this process
/// (from `name`) and a fresh in-memory stream of that name capturing the poller's subjects.
async fn memory_stream(
    name: &str,
) -> (
    async_nats::Client,
    jetstream::Context,
    String,
    stream::Stream,
) {
    let client = connect(&nats_url()).await;
    let js = jetstream::new(client.clone());
    let poller = unique(name);
    let stream = fresh_stream(&js, &poller, &poller, stream::StorageType::Memory).await;
    (client, js, poller, stream)
}

async fn message_count(stream: &mut stream::Stream) -> u64 {
    stream.info().await.unwrap().state.messages
}

#[watukuy_testenv::requires(nats)]
#[tokio::test]
async fn the_same_event_twice_is_one_message_in_the_stream() {
    let (client, js, poller, mut stream) = memory_stream("sinks_nats_dedup").await;
    let sink = NatsSink::new(client);

    let first = event(&poller, 1, EventType::Created);
    let ctx1 = ctx();
    sink.handle(first.clone(), ctx1.clone()).await.unwrap();
    assert!(!ctx1.ack(), "the sink acknowledged the event");
    // The dispatcher delivers the same event again (at least once): the stream dedups it.
    sink.handle(first.clone(), ctx()).await.unwrap();
    let ack = sink.publish(&first).await.unwrap();
    assert!(
        ack.duplicate,
        "JetStream reports the third publish as a duplicate"
    );
    assert_eq!(message_count(&mut stream).await, 1);

    let stored = stream.get_raw_message(1).await.unwrap();
    assert_eq!(stored.subject.as_str(), format!("{poller}.created"));
    assert_eq!(
        stored.headers.get(NATS_MESSAGE_ID).map(|v| v.as_str()),
        Some(first.id.as_str())
    );
    assert_eq!(
        stored.headers.get("Content-Type").map(|v| v.as_str()),
        Some("application/cloudevents+json")
    );
    let ce: CloudEvent = serde_json::from_slice(&stored.payload).unwrap();
    assert_eq!(ce, first.to_cloud_event());

    let second = event(&poller, 2, EventType::Updated);
    sink.handle(second, ctx()).await.unwrap();
    assert_eq!(
        message_count(&mut stream).await,
        2,
        "another event is another message"
    );

    js.delete_stream(&poller).await.unwrap();
}

#[watukuy_testenv::requires(nats)]
#[tokio::test]
async fn raw_format_and_a_custom_subject() {
    let (client, js, poller, stream) = memory_stream("sinks_nats_raw").await;
    let subject_root = poller.clone();
    let sink = NatsSink::new(client)
        .format(EventFormat::Raw)
        .subject(move |e: &Event| format!("{subject_root}.by-subject.{}", e.subject));
    let event = event(&poller, 3, EventType::Deleted);
    sink.handle(event.clone(), ctx()).await.unwrap();
    let stored = stream.get_raw_message(1).await.unwrap();
    assert_eq!(
        stored.subject.as_str(),
        format!("{poller}.by-subject.item-3")
    );
    assert_eq!(
        stored.headers.get("Content-Type").map(|v| v.as_str()),
        Some("application/json")
    );
    let back: Event = serde_json::from_slice(&stored.payload).unwrap();
    assert_eq!(back, event);
    js.delete_stream(&poller).await.unwrap();
}

#[watukuy_testenv::requires(nats)]
#[tokio::test]
async fn no_stream_for_the_subject_is_a_transient_error() {
    let client = connect(&nats_url()).await;
    let sink = NatsSink::new(client).ack_timeout(Duration::from_secs(2));
    fails_as(
        &sink,
        event(&unique("sinks_nats_nostream"), 4, EventType::Created),
        HandlerErrorKind::Transient,
    )
    .await;
}

/// A `nats-server` child process with JetStream, storing in `dir`.
struct ChildServer {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl ChildServer {
    /// Starts the server and waits until it logs that it is ready (it reports readiness on
    /// stderr, so nothing here polls or sleeps).
    async fn start(port: u16, dir: &Path) -> Self {
        let bin = watukuy_testenv::program!("nats-server").unwrap_or_else(|why| panic!("{why}"));
        let mut child = Command::new(bin)
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start `{bin}` ({e})"));
        let stderr = child.stderr.take().expect("stderr is piped");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let lines_log = Arc::clone(&log);
        tokio::spawn(async move {
            // Keep draining stderr after readiness so the server never blocks on a full pipe.
            let mut lines = BufReader::new(stderr).lines();
            let mut ready = Some(ready_tx);
            while let Ok(Some(line)) = lines.next_line().await {
                if line.contains("Server is ready")
                    && let Some(tx) = ready.take()
                {
                    let _ = tx.send(());
                }
                lines_log.lock().unwrap().push(line);
            }
        });
        match tokio::time::timeout(Duration::from_secs(60), ready_rx).await {
            Ok(Ok(())) => Self { child, log },
            outcome => panic!(
                "nats-server on port {port} did not become ready ({}): {:#?}",
                if outcome.is_err() {
                    "timed out"
                } else {
                    "it exited"
                },
                log.lock().unwrap()
            ),
        }
    }

    async fn kill(mut self) {
        self.child.kill().await.unwrap();
        drop(self.log);
    }
}

#[watukuy_testenv::requires(nats_server)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_down_fails_transiently_then_delivers_when_back() {
    let port = free_port();
    let url = format!("nats://127.0.0.1:{port}");
    let dir = tempfile::tempdir().unwrap();
    let poller = "outage";
    let sink = NatsSink::connect(&url)
        .await
        .expect("connecting in the background never fails for a valid url")
        .ack_timeout(Duration::from_secs(2));
    let a = event(poller, 1, EventType::Created);
    let b = event(poller, 2, EventType::Created);

    // 1. Nothing listens yet: the delivery fails, transiently.
    fails_as(&sink, a.clone(), HandlerErrorKind::Transient).await;

    // 2. The server comes up (file storage, so the stream survives restarts).
    let server = ChildServer::start(port, dir.path()).await;
    let admin = connect(&url).await;
    let js = jetstream::new(admin);
    fresh_stream(&js, "OUTAGE", poller, stream::StorageType::File).await;
    deliver_with_retries(&sink, &a).await;

    // 3. The server dies: the next delivery fails, transiently.
    server.kill().await;
    fails_as(&sink, b.clone(), HandlerErrorKind::Transient).await;

    // 4. It comes back on the same port and store: the retried delivery succeeds.
    let server = ChildServer::start(port, dir.path()).await;
    deliver_with_retries(&sink, &b).await;
    // The publish that failed during the outage may have been flushed after the reconnect; with
    // `Nats-Msg-Id` the stream still holds each event once.
    let admin = connect(&url).await;
    let js = jetstream::new(admin);
    let mut stream = js.get_stream("OUTAGE").await.unwrap();
    assert_eq!(message_count(&mut stream).await, 2);
    server.kill().await;
}

/// Delivers like the dispatcher would: retrying transient failures, a bounded number of times
/// (each attempt is bounded by the ack timeout, so this needs no sleep of its own).
async fn deliver_with_retries(sink: &NatsSink, event: &Event) {
    let mut errors = Vec::new();
    for _ in 0..15 {
        match sink.handle(event.clone(), ctx()).await {
            Ok(()) => {
                eprintln!(
                    "delivered after {} failed attempts: {errors:?}",
                    errors.len()
                );
                return;
            }
            Err(err) => {
                assert_eq!(err.kind(), &HandlerErrorKind::Transient, "{err}");
                errors.push(err.to_string());
            }
        }
    }
    panic!("the delivery never succeeded: {errors:#?}");
}
