//! The SQS sink against moto's SQS (`moto_server`, from PyPI's `moto[server]`), one private
//! server per test on a free loopback port, read back with the AWS SDK:
//!
//! - FIFO queues: body, message attributes, `MessageGroupId` (the subject, or a closure) and
//!   `MessageDeduplicationId` (the event id): an event sent twice is stored once;
//! - standard queues: neither id is sent, so a second send is a second message;
//! - a missing queue, a message larger than the queue allows and refused credentials are
//!   permanent; options that cannot work fail when the sink is built, naming the option;
//! - SQS unreachable is transient, and an engine run with SQS cut off keeps its events in the
//!   outbox (retried, none parked) and sends every one once SQS is back.
//!
//! The clients carry dummy credentials and a region of their own: nothing is read from the
//! process' environment, and nothing leaves the loopback interface.

mod common;

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_sqs::config::retry::RetryConfig;
use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_sqs::types::{Message, MessageSystemAttributeName, QueueAttributeName};
use common::{Outage, Relay, ctx, event, fails_as, free_port};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use watukuy_core::{
    Event, EventType,
    delivery::{Handler, HandlerErrorKind},
    json::Json,
};
use watukuy_sinks::{EventFormat, SqsOptions, SqsSink, serialize_event};

const REGION: &str = "eu-west-1";

/// Credentials moto accepts (it checks none unless told to); never real ones.
fn credentials() -> Credentials {
    Credentials::new(
        "AKIAWATUKUYTEST00001",
        "watukuy-test-secret",
        None,
        None,
        "test",
    )
}

/// A client of the test's own, reading the queues back: moto's endpoint, dummy credentials, a
/// region, plain HTTP, no retries.
fn client(endpoint: &str) -> aws_sdk_sqs::Client {
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(REGION))
        .credentials_provider(credentials())
        .endpoint_url(endpoint)
        .retry_config(RetryConfig::disabled())
        .http_client(aws_smithy_http_client::Builder::new().build_http())
        .build();
    aws_sdk_sqs::Client::from_conf(config)
}

/// The client a sink is given: credentials and a region, but no endpoint (the sink's
/// `endpoint_url` option sets it) and no HTTP client (the sink brings its own: rustls on ring,
/// which speaks plain HTTP to a local server too).
fn bare_client() -> aws_sdk_sqs::Client {
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(REGION))
        .credentials_provider(credentials())
        .retry_config(RetryConfig::disabled())
        .build();
    aws_sdk_sqs::Client::from_conf(config)
}

/// A private `moto_server` on a free loopback port, killed when dropped.
struct Moto {
    _child: Child,
    port: u16,
    log: Arc<Mutex<Vec<String>>>,
}

impl Moto {
    async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// Starts the server with extra environment variables and waits for the line saying it
    /// listens (on stderr: nothing here polls or sleeps).
    async fn start_with(env: &[(&str, &str)]) -> Self {
        let bin = watukuy_testenv::program!("moto_server").unwrap_or_else(|why| panic!("{why}"));
        let port = free_port();
        let mut child = Command::new(bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start `{bin}` ({e}): pip install 'moto[server]'"));
        let stderr = child.stderr.take().expect("stderr is piped");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let lines_log = Arc::clone(&log);
        let ready_line = format!("Running on http://127.0.0.1:{port}");
        tokio::spawn(async move {
            // Keep draining stderr (a line per request) so the server never blocks on it.
            let mut lines = BufReader::new(stderr).lines();
            let mut ready = Some(ready_tx);
            while let Ok(Some(line)) = lines.next_line().await {
                if line.contains(&ready_line)
                    && let Some(tx) = ready.take()
                {
                    let _ = tx.send(());
                }
                lines_log.lock().unwrap().push(line);
            }
        });
        match tokio::time::timeout(Duration::from_secs(60), ready_rx).await {
            Ok(Ok(())) => Self {
                _child: child,
                port,
                log,
            },
            outcome => panic!(
                "moto_server on port {port} did not become ready ({}): {:#?}",
                if outcome.is_err() {
                    "timed out"
                } else {
                    "it exited"
                },
                log.lock().unwrap()
            ),
        }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn client(&self) -> aws_sdk_sqs::Client {
        client(&self.endpoint())
    }

    /// Creates a queue (FIFO when its name ends in `.fifo`); its URL.
    async fn queue(&self, name: &str, attributes: &[(QueueAttributeName, &str)]) -> String {
        let mut request = self.client().create_queue().queue_name(name);
        if name.ends_with(".fifo") {
            request = request.attributes(QueueAttributeName::FifoQueue, "true");
        }
        for (attribute, value) in attributes {
            request = request.attributes(attribute.clone(), *value);
        }
        let output = request
            .send()
            .await
            .unwrap_or_else(|e| panic!("create {name}: {e:?}: {:#?}", self.log.lock().unwrap()));
        output.queue_url.expect("a queue URL")
    }

    /// Every message of the queue, received (all attributes) and deleted, in the order received.
    async fn drain(&self, queue_url: &str) -> Vec<Message> {
        let client = self.client();
        let mut all = Vec::new();
        for _ in 0..100 {
            let output = client
                .receive_message()
                .queue_url(queue_url)
                .max_number_of_messages(10)
                .wait_time_seconds(0)
                .message_system_attribute_names(MessageSystemAttributeName::All)
                .message_attribute_names("All")
                .send()
                .await
                .unwrap();
            let messages = output.messages.unwrap_or_default();
            if messages.is_empty() {
                return all;
            }
            for message in &messages {
                client
                    .delete_message()
                    .queue_url(queue_url)
                    .receipt_handle(message.receipt_handle().unwrap())
                    .send()
                    .await
                    .unwrap();
            }
            all.extend(messages);
        }
        panic!("{queue_url} never ran empty");
    }
}

fn system(message: &Message, name: MessageSystemAttributeName) -> Option<&str> {
    message
        .attributes()
        .and_then(|attributes| attributes.get(&name))
        .map(String::as_str)
}

/// The message attributes, each as `(name, data type, string value)`, sorted.
fn attributes(message: &Message) -> Vec<(String, String, String)> {
    let mut out: Vec<_> = message
        .message_attributes()
        .into_iter()
        .flatten()
        .map(|(name, value)| {
            (
                name.clone(),
                value.data_type().to_owned(),
                value.string_value().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    out.sort();
    out
}

fn expected_attributes(event: &Event, content_type: &str) -> Vec<(String, String, String)> {
    let string = |name: &str, value: &str| (name.to_owned(), "String".to_owned(), value.to_owned());
    vec![
        string("contentType", content_type),
        string("poller", &event.poller),
        string("type", &event.event_type.to_string()),
    ]
}

fn body(event: &Event, format: EventFormat) -> String {
    String::from_utf8(serialize_event(event, format).unwrap().body).unwrap()
}

#[watukuy_testenv::requires(moto_server)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_messages_carry_the_event_and_a_redelivery_is_stored_once() {
    let moto = Moto::start().await;
    let url = moto.queue("orders.fifo", &[]).await;
    let sink = SqsSink::new(
        bare_client(),
        SqsOptions::new(&url).endpoint_url(moto.endpoint()),
    )
    .unwrap();
    assert_eq!(sink.queue_url(), url);

    let first = event("orders", 1, EventType::Created);
    let second = event("orders", 2, EventType::Created);
    // A later change of the first item: same subject, so same message group.
    let mut third = event("orders", 3, EventType::Updated);
    third.subject = first.subject.clone();
    for event in [&first, &second, &third] {
        let context = ctx();
        sink.handle(event.clone(), context.clone()).await.unwrap();
        assert!(!context.ack(), "acknowledged by the sink");
    }
    // The dispatcher redelivers the first event (its outcome was lost): SQS answers with
    // success and stores nothing, the dedup id being the event id.
    let context = ctx();
    sink.handle(first.clone(), context.clone()).await.unwrap();
    assert!(!context.ack(), "acknowledged by the sink");
    let again = sink.send(&first).await.unwrap();
    assert!(again.message_id().is_some());

    let messages = moto.drain(&url).await;
    let received: Vec<(&str, Option<&str>, Option<&str>)> = messages
        .iter()
        .map(|m| {
            (
                m.body().unwrap(),
                system(m, MessageSystemAttributeName::MessageGroupId),
                system(m, MessageSystemAttributeName::MessageDeduplicationId),
            )
        })
        .collect();
    let mut expected: Vec<(String, Option<&str>, Option<&str>)> = [&first, &second, &third]
        .into_iter()
        .map(|e| {
            (
                body(e, EventFormat::CloudEvents),
                Some(&*e.subject),
                Some(&*e.id),
            )
        })
        .collect();
    let mut received_sorted: Vec<(String, Option<&str>, Option<&str>)> = received
        .iter()
        .map(|(b, g, d)| ((*b).to_owned(), *g, *d))
        .collect();
    received_sorted.sort();
    expected.sort();
    assert_eq!(received_sorted, expected, "one message per event");
    // Within the group of item-1, the created event comes before the update.
    let item1: Vec<&str> = received
        .iter()
        .filter(|(_, group, _)| *group == Some(&*first.subject))
        .filter_map(|(_, _, dedup)| *dedup)
        .collect();
    assert_eq!(item1, [&*first.id, &*third.id]);
    for (message, event) in messages.iter().map(|m| {
        let dedup = system(m, MessageSystemAttributeName::MessageDeduplicationId).unwrap();
        let event = [&first, &second, &third]
            .into_iter()
            .find(|e| *e.id == *dedup)
            .unwrap();
        (m, event)
    }) {
        assert_eq!(
            attributes(message),
            expected_attributes(event, "application/cloudevents+json")
        );
    }

    // A group id from a closure, and the raw event as the body.
    let url = moto.queue("by-poller.fifo", &[]).await;
    let sink = SqsSink::new(
        bare_client(),
        SqsOptions::new(&url)
            .endpoint_url(moto.endpoint())
            .group_id(|e| format!("poller-{}", e.poller))
            .format(EventFormat::Raw),
    )
    .unwrap();
    sink.handle(second.clone(), ctx()).await.unwrap();
    let messages = moto.drain(&url).await;
    assert_eq!(messages.len(), 1);
    let message = &messages[0];
    assert_eq!(
        message.body(),
        Some(body(&second, EventFormat::Raw).as_str())
    );
    assert_eq!(
        system(message, MessageSystemAttributeName::MessageGroupId),
        Some("poller-orders")
    );
    assert_eq!(
        system(message, MessageSystemAttributeName::MessageDeduplicationId),
        Some(&*second.id)
    );
    assert_eq!(
        attributes(message),
        expected_attributes(&second, "application/json")
    );
}

#[watukuy_testenv::requires(moto_server)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standard_queue_gets_neither_a_dedup_id_nor_a_group_id() {
    let moto = Moto::start().await;
    let url = moto.queue("plain", &[]).await;
    let sink = SqsSink::new(
        bare_client(),
        SqsOptions::new(&url)
            .standard()
            .endpoint_url(moto.endpoint()),
    )
    .unwrap();
    let first = event("orders", 1, EventType::Deleted);
    sink.handle(first.clone(), ctx()).await.unwrap();
    // No dedup id: a standard queue stores a redelivery as a second message.
    sink.handle(first.clone(), ctx()).await.unwrap();

    let messages = moto.drain(&url).await;
    assert_eq!(messages.len(), 2, "{messages:#?}");
    for message in &messages {
        assert_eq!(
            message.body(),
            Some(body(&first, EventFormat::CloudEvents).as_str())
        );
        assert_eq!(
            attributes(message),
            expected_attributes(&first, "application/cloudevents+json")
        );
        let attributes = message.attributes().unwrap();
        // moto answers the system attributes it has: the send carried neither id.
        assert!(
            attributes.contains_key(&MessageSystemAttributeName::SentTimestamp),
            "{attributes:?}"
        );
        assert!(
            !attributes.contains_key(&MessageSystemAttributeName::MessageGroupId),
            "{attributes:?}"
        );
        assert!(
            !attributes.contains_key(&MessageSystemAttributeName::MessageDeduplicationId),
            "{attributes:?}"
        );
    }
}

#[watukuy_testenv::requires(moto_server)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_queue_and_a_message_too_large_are_permanent() {
    let moto = Moto::start().await;
    let missing = format!("{}/123456789012/missing.fifo", moto.endpoint());
    let sink = SqsSink::new(
        bare_client(),
        SqsOptions::new(&missing).endpoint_url(moto.endpoint()),
    )
    .unwrap();
    let context = ctx();
    let error = sink
        .handle(event("orders", 1, EventType::Created), context.clone())
        .await
        .unwrap_err();
    assert_eq!(error.kind(), &HandlerErrorKind::Permanent, "{error}");
    assert!(
        error
            .to_string()
            .starts_with(&format!("sqs: queue {missing} does not exist (")),
        "{error}"
    );
    assert!(context.ack(), "a failed send is not acknowledged");

    // A queue that takes at most 1 KiB: an event of 4 KiB is refused, which no retry mends.
    let url = moto
        .queue(
            "small.fifo",
            &[(QueueAttributeName::MaximumMessageSize, "1024")],
        )
        .await;
    let sink = SqsSink::new(
        bare_client(),
        SqsOptions::new(&url).endpoint_url(moto.endpoint()),
    )
    .unwrap();
    let mut large = event("orders", 2, EventType::Created);
    large.data = Some(Json::parse(&format!(r#"{{"blob":"{}"}}"#, "x".repeat(4096))).unwrap());
    let error = fails_as(&sink, large, HandlerErrorKind::Permanent).await;
    assert!(
        error.to_string().contains("InvalidParameterValue")
            && error
                .to_string()
                .contains("Message must be shorter than 1024 bytes"),
        "{error}"
    );
    // The queue works for an event that fits.
    sink.handle(event("orders", 3, EventType::Created), ctx())
        .await
        .unwrap();
    assert_eq!(moto.drain(&url).await.len(), 1);
}

#[watukuy_testenv::requires(moto_server)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_the_service_does_not_know_are_permanent() {
    // moto checks credentials after this many requests: the queue is created unchecked, then
    // every request must be signed by an IAM user it knows, which the test's are not.
    let moto = Moto::start_with(&[("INITIAL_NO_AUTH_ACTION_COUNT", "1")]).await;
    let url = moto.queue("guarded.fifo", &[]).await;
    let sink = SqsSink::new(
        bare_client(),
        SqsOptions::new(&url).endpoint_url(moto.endpoint()),
    )
    .unwrap();
    let error = fails_as(
        &sink,
        event("orders", 1, EventType::Created),
        HandlerErrorKind::Permanent,
    )
    .await;
    assert_eq!(
        error.to_string(),
        format!(
            "sqs: SendMessage to {url}: HTTP 403, InvalidClientTokenId: The security token \
             included in the request is invalid."
        )
    );
}

#[watukuy_testenv::requires(moto_server)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_from_a_config_loader_sends_over_its_own_https_client() {
    let moto = Moto::start().await;
    let url = moto.queue("loaded.fifo", &[]).await;
    // What `from_env` does, with the region and credentials given here instead of read from the
    // environment.
    let loader = aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new(REGION))
        .credentials_provider(credentials());
    let sink = SqsSink::from_loader(loader, SqsOptions::new(&url).endpoint_url(moto.endpoint()))
        .await
        .unwrap();
    let first = event("orders", 1, EventType::Created);
    sink.handle(first.clone(), ctx()).await.unwrap();
    let messages = moto.drain(&url).await;
    assert_eq!(messages.len(), 1);
    assert_eq!(
        system(
            &messages[0],
            MessageSystemAttributeName::MessageDeduplicationId
        ),
        Some(&*first.id)
    );
}

#[tokio::test]
async fn options_that_cannot_work_fail_when_the_sink_is_built() {
    let fifo = "http://127.0.0.1:9/123456789012/orders.fifo";
    let cases: Vec<(SqsOptions, &str, &str)> = vec![
        (SqsOptions::new(""), "queue_url", "must not be empty"),
        (
            SqsOptions::new("orders.fifo"),
            "queue_url",
            "is not a queue URL",
        ),
        (
            SqsOptions::new("ftp://127.0.0.1/123456789012/orders.fifo"),
            "queue_url",
            "is not a queue URL",
        ),
        (
            SqsOptions::new("http://127.0.0.1:9/123456789012/orders"),
            "queue_url",
            "use SqsOptions::standard() for a standard queue",
        ),
        (
            SqsOptions::new(fifo).standard(),
            "queue_url",
            "drop SqsOptions::standard()",
        ),
        (
            SqsOptions::new("http://127.0.0.1:9/123456789012/orders")
                .standard()
                .group_id(|e| e.poller.to_string()),
            "group_id",
            "FIFO queues only",
        ),
        (
            SqsOptions::new(fifo).endpoint_url("127.0.0.1:9"),
            "endpoint_url",
            "is not an http(s) URL",
        ),
    ];
    for (options, option, message) in cases {
        let shown = format!("{options:?}");
        let error = SqsSink::new(bare_client(), options.clone()).unwrap_err();
        assert_eq!(error.option, option, "{shown}: {error}");
        assert!(
            error.to_string().starts_with(&format!("sqs.{option}: "))
                && error.to_string().contains(message),
            "{shown}: {error}"
        );
        // `from_env` checks them before it reads anything from the environment.
        let error = SqsSink::from_env(options).await.unwrap_err();
        assert_eq!(error.option, option, "{shown}: {error}");
    }

    // No region anywhere: not on the client, not in the queue URL.
    let no_region = aws_sdk_sqs::Client::from_conf(
        aws_sdk_sqs::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .credentials_provider(credentials())
            .build(),
    );
    let error = SqsSink::new(no_region.clone(), fifo).unwrap_err();
    assert_eq!(error.option, "region", "{error}");
    // An AWS queue URL names its region.
    SqsSink::new(
        no_region,
        "https://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo",
    )
    .unwrap();
}

#[watukuy_testenv::requires(moto_server)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_unreachable_is_transient_until_it_is_back() {
    let moto = Moto::start().await;
    let url = moto.queue("outage.fifo", &[]).await;
    let port = free_port();
    let sink = SqsSink::new(
        bare_client(),
        SqsOptions::new(&url).endpoint_url(format!("http://127.0.0.1:{port}")),
    )
    .unwrap();
    let first = event("orders", 1, EventType::Created);

    // Nothing listens on the sink's endpoint: connection refused.
    let context = ctx();
    let error = sink
        .handle(first.clone(), context.clone())
        .await
        .unwrap_err();
    assert_eq!(error.kind(), &HandlerErrorKind::Transient, "{error}");
    assert!(
        error.to_string().starts_with(&format!(
            "sqs: SendMessage to {url} failed: dispatch failure: "
        )),
        "{error}"
    );
    assert!(context.ack(), "a failed send is not acknowledged");

    // The relay up, then stopped: the pooled connection is cut, and the port refuses again.
    let upstream = format!("127.0.0.1:{}", moto.port);
    let relay = Relay::start(port, upstream.clone()).await;
    sink.handle(first.clone(), ctx()).await.unwrap();
    relay.stop().await;
    fails_as(
        &sink,
        event("orders", 2, EventType::Created),
        HandlerErrorKind::Transient,
    )
    .await;

    // Back: the retried send arrives.
    let relay = Relay::start(port, upstream).await;
    sink.handle(event("orders", 2, EventType::Created), ctx())
        .await
        .unwrap();
    relay.stop().await;
    assert_eq!(moto.drain(&url).await.len(), 2);
}

#[watukuy_testenv::requires(moto_server)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_cut_off_mid_run_keeps_events_in_the_outbox_then_sends_them_all() {
    let moto = Moto::start().await;
    let url = moto.queue("run.fifo", &[]).await;
    let upstream = format!("127.0.0.1:{}", moto.port);
    let port = free_port();
    let relay = Relay::start(port, upstream.clone()).await;
    let sink = SqsSink::new(
        bare_client(),
        SqsOptions::new(&url)
            .endpoint_url(format!("http://127.0.0.1:{port}"))
            .timeout(Duration::from_secs(5)),
    )
    .unwrap();

    // SQS goes away before the run delivers, and comes back: retries deliver everything,
    // nothing is parked.
    let relay = Outage::new(sink).through(relay, port, upstream).await;
    relay.stop().await;
    let messages = moto.drain(&url).await;
    let mut ids: Vec<&str> = messages
        .iter()
        .filter_map(|m| system(m, MessageSystemAttributeName::MessageDeduplicationId))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(messages.len(), 3, "one message per event: {messages:#?}");
    assert_eq!(ids.len(), 3, "{ids:?}");
}
