//! End to end: an engine (memory store, the conformance suite's fake API on a manual clock)
//! delivering through a `WebhookSink` attached with one line, to a real HTTP receiver that
//! verifies every request.

mod common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use watukuy_core::{
    CloudEvent,
    clock::{Clock, ManualClock},
    store::{ParkedQuery, Store},
};
use watukuy_sinks::{WebhookOptions, WebhookSecret, WebhookSink, verify_webhook_signature};
use watukuy_store_memory::MemoryStore;
use watukuy_testkit::world::{POLLER, StrategyKind, World};

use common::spawn_server;

const SECRET: &str = "whsec_c2lua3MtZW5kLXRvLWVuZA==";

#[derive(Clone)]
struct Receiver {
    clock: ManualClock,
    /// Subjects this receiver answers 404 for.
    gone: Arc<Mutex<HashSet<String>>>,
    /// `(webhook-id, CloudEvent)` of every request that verified.
    accepted: Arc<Mutex<Vec<(String, CloudEvent)>>>,
}

async fn receive(State(r): State<Receiver>, headers: HeaderMap, body: Bytes) -> Response {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let secret = WebhookSecret::new(SECRET).unwrap();
    let verified = verify_webhook_signature(
        &secret,
        &header("webhook-id"),
        &header("webhook-timestamp"),
        &body,
        &header("webhook-signature"),
        r.clock.now_ms() / 1000,
    );
    if verified.is_err() {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let Ok(ce) = serde_json::from_slice::<CloudEvent>(&body) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    if r.gone.lock().unwrap().contains(&ce.subject) {
        return (StatusCode::NOT_FOUND, "unknown item").into_response();
    }
    r.accepted.lock().unwrap().push((header("webhook-id"), ce));
    StatusCode::NO_CONTENT.into_response()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_delivers_signed_events_and_parks_a_permanent_failure() {
    let world = World::new(3, 10).unwrap();
    let receiver = Receiver {
        clock: world.clock.clone(),
        gone: Arc::default(),
        accepted: Arc::default(),
    };
    let app = Router::new()
        .route("/hooks", post(receive))
        .with_state(receiver.clone());
    let url = format!("{}/hooks", spawn_server(app).await);

    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let poller = world.poller(StrategyKind::Timestamp).build().unwrap();
    let engine = world.engine(store, "node-a", poller, 7).unwrap();
    let clock: Arc<dyn Clock> = Arc::new(world.clock.clone());
    engine
        .on(
            POLLER,
            WebhookSink::new(WebhookOptions::new(url, SECRET).clock(clock)).unwrap(),
        )
        .unwrap();

    let result = world.tick(&engine).await.unwrap();
    assert_eq!(result.delivered, 3);
    let accepted = receiver.accepted.lock().unwrap().clone();
    assert_eq!(accepted.len(), 3);
    for (id, ce) in &accepted {
        assert_eq!(id, &ce.id, "webhook-id is the event id");
        assert_eq!(ce.event_type, format!("{POLLER}.created"));
    }

    // The receiver no longer knows a new item: 404 is permanent, so the event is parked at once
    // (the poller allows 3 attempts) instead of being retried.
    receiver.gone.lock().unwrap().insert("item-100".to_owned());
    world
        .api
        .add(serde_json::json!({ "id": "item-100", "value": 100 }))
        .unwrap();
    world.advance(Duration::from_secs(60));
    let result = world.tick(&engine).await.unwrap();
    assert_eq!(result.delivered, 0);
    let parked = engine
        .list_parked(POLLER, None, ParkedQuery::default())
        .await
        .unwrap();
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].attempts, 1);
    assert_eq!(
        parked[0].event.as_ref().map(|e| e.subject.as_str()),
        Some("item-100")
    );
    assert!(
        parked[0].error.error.message.contains("404"),
        "{:?}",
        parked[0].error
    );
    assert_eq!(receiver.accepted.lock().unwrap().len(), 3);
}
