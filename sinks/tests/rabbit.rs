//! The RabbitMQ sink against the real broker at `WATUKUY_TEST_AMQP_URL` (e.g.
//! `amqp://guest:guest@127.0.0.1:5672/%2f`). While it is unset the tests are ignored with the
//! reason (docs/testing.md); run anyway, they fail.
//!
//! The outage case does not stop the shared broker (other developers use it, and a second
//! RabbitMQ node is heavy): the sink talks to the broker through a TCP relay this test owns on a
//! port of its own. Before the relay starts nothing listens there (connection refused); stopping
//! the relay cuts the sink's live connection as a broker crash would; starting it again on the
//! same port is the broker coming back.

mod common;

use common::{Relay, broker_url, ctx, event, fails_as, free_port, unique};
use futures::StreamExt as _;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicGetOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties};
use watukuy_core::{
    CloudEvent, Event, EventType,
    delivery::{Handler, HandlerErrorKind},
};
use watukuy_sinks::{EventFormat, RabbitSink};

/// The test broker's URL.
fn amqp_url() -> String {
    broker_url("WATUKUY_TEST_AMQP_URL", "RabbitMQ")
}

async fn channel() -> (Connection, Channel) {
    let url = amqp_url();
    let connection = Connection::connect(&url, ConnectionProperties::default())
        .await
        .unwrap_or_else(|e| {
            panic!(
                "RabbitMQ is not reachable at {url} ({e}). Start it with `rabbitmq-server \
                 -detached`, or point WATUKUY_TEST_AMQP_URL at one"
            )
        });
    let channel = connection.create_channel().await.unwrap();
    (connection, channel)
}

/// A fresh durable queue `name` (deleted first if a previous run left it).
async fn fresh_queue(channel: &Channel, name: &str) {
    let _ = channel
        .queue_delete(name.into(), QueueDeleteOptions::default())
        .await;
    channel
        .queue_declare(
            name.into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
}

/// Takes every message in `queue`, in order.
async fn drain(channel: &Channel, queue: &str) -> Vec<lapin::message::BasicGetMessage> {
    let mut messages = Vec::new();
    while let Some(message) = channel
        .basic_get(queue.into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
    {
        messages.push(message);
    }
    messages
}

fn message_id(message: &lapin::message::BasicGetMessage) -> Option<String> {
    message
        .delivery
        .properties
        .message_id()
        .as_ref()
        .map(|id| id.as_str().to_owned())
}

#[watukuy_testenv::requires(rabbitmq)]
#[tokio::test]
async fn messages_carry_the_event_id_and_are_confirmed() {
    let (_connection, admin) = channel().await;
    let queue = unique("watukuy_sinks_rabbit_props");
    fresh_queue(&admin, &queue).await;
    let target = queue.clone();
    let sink = RabbitSink::new(amqp_url()).routing_key(move |_: &Event| target.clone());

    let event = event("orders", 1, EventType::Updated);
    let ctx1 = ctx();
    sink.handle(event.clone(), ctx1.clone()).await.unwrap();
    assert!(!ctx1.ack(), "the sink acknowledged the event");

    let messages = drain(&admin, &queue).await;
    assert_eq!(messages.len(), 1);
    let props = &messages[0].delivery.properties;
    assert_eq!(message_id(&messages[0]), Some(event.id.to_string()));
    assert_eq!(
        props.content_type().as_ref().map(|c| c.as_str()),
        Some("application/cloudevents+json")
    );
    assert_eq!(*props.delivery_mode(), Some(2), "persistent");
    assert_eq!(
        props.kind().as_ref().map(|k| k.as_str()),
        Some("orders.updated")
    );
    let ce: CloudEvent = serde_json::from_slice(&messages[0].delivery.data).unwrap();
    assert_eq!(ce, event.to_cloud_event());

    // A redelivery of the same event carries the same id, for the consumer to deduplicate on.
    sink.handle(event.clone(), ctx()).await.unwrap();
    let again = drain(&admin, &queue).await;
    assert_eq!(again.len(), 1);
    assert_eq!(message_id(&again[0]), Some(event.id.to_string()));

    admin
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
}

#[watukuy_testenv::requires(rabbitmq)]
#[tokio::test]
async fn a_consumer_sees_raw_events_with_their_ids() {
    let (_connection, admin) = channel().await;
    // The default routing key is `<poller>.<type>`; the default exchange routes it to the queue
    // of that name.
    let poller = unique("watukuy_sinks_rabbit_raw");
    let queue = format!("{poller}.created");
    fresh_queue(&admin, &queue).await;
    let sink = RabbitSink::new(amqp_url()).format(EventFormat::Raw);
    let events: Vec<Event> = (1..=3)
        .map(|n| event(&poller, n, EventType::Created))
        .collect();
    for event in &events {
        sink.handle(event.clone(), ctx()).await.unwrap();
    }

    let mut consumer = admin
        .basic_consume(
            queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    for expected in &events {
        let delivery = consumer.next().await.unwrap().unwrap();
        assert_eq!(
            delivery
                .properties
                .message_id()
                .as_ref()
                .map(|id| id.as_str()),
            Some(expected.id.as_str())
        );
        assert_eq!(
            delivery
                .properties
                .content_type()
                .as_ref()
                .map(|c| c.as_str()),
            Some("application/json")
        );
        let back: Event = serde_json::from_slice(&delivery.data).unwrap();
        assert_eq!(&back, expected);
        delivery.ack(BasicAckOptions::default()).await.unwrap();
    }
    admin
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
}

/// Refused before any connection: needs no broker (the URL names a closed port).
#[tokio::test]
async fn a_routing_key_longer_than_amqp_allows_is_permanent() {
    let sink = RabbitSink::new("amqp://guest:guest@127.0.0.1:1/%2f")
        .routing_key(|_: &Event| "k".repeat(300));
    fails_as(
        &sink,
        event("orders", 9, EventType::Created),
        HandlerErrorKind::Permanent,
    )
    .await;
}

#[watukuy_testenv::requires(rabbitmq)]
#[tokio::test]
async fn a_publish_the_broker_cannot_route_fails_when_mandatory() {
    let sink = RabbitSink::new(amqp_url())
        .mandatory(true)
        .routing_key(|_: &Event| unique("watukuy_sinks_no_such_queue"));
    let err = fails_as(
        &sink,
        event("orders", 8, EventType::Created),
        HandlerErrorKind::Transient,
    )
    .await;
    assert!(err.to_string().contains("unroutable"), "{err}");
}

/// The broker's `host:port`, from the AMQP URL.
fn broker_address() -> String {
    let url = amqp_url();
    let after_scheme = url.split("://").nth(1).unwrap_or("");
    let authority = after_scheme.split('/').next().unwrap_or("");
    let host_port = authority.rsplit('@').next().unwrap_or("");
    if host_port.contains(':') {
        host_port.to_owned()
    } else {
        format!("{host_port}:5672")
    }
}

/// The AMQP URL with the broker's address replaced by `127.0.0.1:port`.
fn url_via(port: u16) -> String {
    amqp_url().replacen(&broker_address(), &format!("127.0.0.1:{port}"), 1)
}

#[watukuy_testenv::requires(rabbitmq)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_that_is_down_fails_transiently_then_delivers_when_back() {
    let (_connection, admin) = channel().await;
    let queue = unique("watukuy_sinks_rabbit_outage");
    fresh_queue(&admin, &queue).await;
    let port = free_port();
    let target = queue.clone();
    let sink = RabbitSink::new(url_via(port))
        .routing_key(move |_: &Event| target.clone())
        .timeout(std::time::Duration::from_secs(5));
    let [a, b, c] = [1, 2, 3].map(|n| event("orders", n, EventType::Created));

    // 1. Nothing listens on the port: connection refused, a transient failure.
    fails_as(&sink, a.clone(), HandlerErrorKind::Transient).await;

    // 2. The broker is reachable: the retried delivery succeeds.
    let relay = Relay::start(port, broker_address()).await;
    sink.handle(a.clone(), ctx()).await.unwrap();
    sink.handle(b.clone(), ctx()).await.unwrap();

    // 3. The connection drops (as in a broker crash): the next delivery fails, transiently.
    relay.stop().await;
    fails_as(&sink, c.clone(), HandlerErrorKind::Transient).await;

    // 4. The broker is back: the sink reconnects on the retried delivery.
    let relay = Relay::start(port, broker_address()).await;
    sink.handle(c.clone(), ctx()).await.unwrap();
    relay.stop().await;

    let ids: Vec<_> = drain(&admin, &queue)
        .await
        .iter()
        .filter_map(message_id)
        .collect();
    assert_eq!(ids, vec![a.id, b.id, c.id]);
    admin
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
}
