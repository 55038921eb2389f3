//! The admin router's HTTP surface, in-process: the page, the JSON endpoints, modes and tokens,
//! with an engine and with a store alone.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use common::{example, parked_example};
use serde_json::{Value, json};
use tower::ServiceExt as _;
use watukuy_admin::{AdminState, Mode, health_router, router};
use watukuy_core::clock::ManualClock;
use watukuy_core::ops::HealthOptions;
use watukuy_core::schedule::CircuitOptions;
use watukuy_core::store::{PKey, StatePatch, Store};
use watukuy_core::{BoxError, Engine, FetchContext, Page, Poller, TickOptions, cursor};
use watukuy_store_memory::MemoryStore;
use watukuy_testkit::world::POLLER;
use watukuy_testkit::world::{Consumer, key};

struct Reply {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: Value,
    text: String,
}

async fn send(app: &Router, request: Request<Body>) -> Reply {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let body = serde_json::from_str(&text).unwrap_or(Value::Null);
    Reply {
        status,
        headers,
        body,
        text,
    }
}

fn get(uri: &str) -> Request<Body> {
    Request::get(uri).body(Body::empty()).unwrap()
}

fn post(uri: &str, body: &Value) -> Request<Body> {
    Request::post(uri)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

fn with_token(mut request: Request<Body>, token: &str) -> Request<Body> {
    request.headers_mut().insert(
        header::AUTHORIZATION,
        format!("Bearer {token}").parse().unwrap(),
    );
    request
}

fn memory() -> Arc<dyn Store> {
    Arc::new(MemoryStore::new())
}

#[tokio::test]
async fn the_page_is_plain_html_with_a_strict_policy() {
    let store = memory();
    let (_world, engine) = example(1, &store, &Consumer::default());
    let app = router(AdminState::new(engine, store));
    let reply = send(&app, get("/")).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(
        reply.headers[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    let csp = reply.headers[header::CONTENT_SECURITY_POLICY]
        .to_str()
        .unwrap();
    assert!(csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"));
    assert!(reply.text.contains("<script>") && reply.text.contains("call(\"pollers\")"));
    assert!(
        !reply.text.contains("innerHTML"),
        "server data is inserted as text only"
    );
    assert!(
        !reply.text.contains("src=\"http"),
        "nothing is loaded from elsewhere"
    );
}

#[tokio::test]
async fn an_engine_page_shows_pollers_and_parked_rows_and_retries_in_read_write_mode() {
    let (store, consumer, world, engine) = parked_example(3, &["item-002"]).await;
    let app = router(AdminState::new(engine.clone(), Arc::clone(&store)).mode(Mode::ReadWrite));

    let info = send(&app, get("/api/info")).await;
    assert_eq!(info.body["mode"], "read-write");
    assert_eq!(info.body["source"], "engine");

    let report = send(&app, get("/api/pollers")).await;
    assert_eq!(report.status, StatusCode::OK);
    assert_eq!(report.headers[header::CACHE_CONTROL], "no-store");
    let p = &report.body["pollers"][0];
    assert_eq!(p["poller"], POLLER);
    assert_eq!(p["parked"], 1);
    assert_eq!(p["items"], 3);
    assert_eq!(p["schedule"]["circuit"], "closed");
    assert_eq!(p["lagMs"], 1_000);
    assert_eq!(report.body["generatedAt"], world.now());

    let rows = send(&app, get("/api/pollers/items/parked")).await;
    let rows = rows.body.as_array().unwrap().clone();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["event"]["subject"], "item-002");
    assert_eq!(rows[0]["kind"], "poison");
    let id = rows[0]["id"].as_str().unwrap().to_owned();
    let invalid_only = send(&app, get("/api/pollers/items/parked?kind=invalid")).await;
    assert_eq!(invalid_only.body, json!([]));

    // An operation the parked rows do not take is not found, and changes nothing.
    let unknown = send(
        &app,
        post("/api/pollers/items/parked/requeue", &json!({ "ids": [id] })),
    )
    .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(unknown.body["error"]["code"], "NOT_FOUND");
    assert_eq!(store.counts(&key()).await.map(|c| c.parked).unwrap(), 1);

    consumer.heal();
    let retried = send(
        &app,
        post("/api/pollers/items/parked/retry", &json!({ "ids": [id] })),
    )
    .await;
    assert_eq!(
        (retried.status, &retried.body),
        (StatusCode::OK, &json!({ "retried": 1 }))
    );
    assert_eq!(store.counts(&key()).await.map(|c| c.parked).unwrap(), 0);
    world.tick(&engine).await.unwrap();
    assert!(consumer.delivered_ids().contains(&id));
    assert_eq!(store.counts(&key()).await.map(|c| c.pending).unwrap(), 0);

    // Discarding what is no longer parked is refused, naming the id (as the command line does).
    let discarded = send(
        &app,
        post("/api/pollers/items/parked/discard", &json!({ "ids": [id] })),
    )
    .await;
    assert_eq!(discarded.status, StatusCode::NOT_FOUND);
    assert_eq!(discarded.body["error"]["code"], "NOT_FOUND");
    assert_eq!(
        discarded.body["error"]["message"],
        format!(
            "nothing was discarded: this id does not apply on items/: {id} (no such parked row)"
        )
    );
}

#[tokio::test]
async fn read_only_is_the_default_and_refuses_changes() {
    let (store, _consumer, _world, engine) = parked_example(1, &["item-001"]).await;
    let app = router(AdminState::new(engine, Arc::clone(&store)));
    assert_eq!(send(&app, get("/api/info")).await.body["mode"], "read-only");
    for action in ["retry", "discard"] {
        let reply = send(
            &app,
            post(
                &format!("/api/pollers/items/parked/{action}"),
                &json!({ "ids": ["x"] }),
            ),
        )
        .await;
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{action}");
        assert_eq!(reply.body["error"]["code"], "READ_ONLY");
    }
    assert_eq!(
        store.counts(&key()).await.map(|c| c.parked).unwrap(),
        1,
        "nothing changed"
    );
    assert_eq!(send(&app, get("/api/pollers")).await.status, StatusCode::OK);
}

#[tokio::test]
async fn a_bearer_token_guards_every_api_call_but_not_the_page() {
    let store = memory();
    let (_world, engine) = example(1, &store, &Consumer::default());
    let app = router(
        AdminState::new(engine, store)
            .mode(Mode::ReadWrite)
            .bearer_token("s3cret"),
    );
    assert_eq!(send(&app, get("/")).await.status, StatusCode::OK);
    for request in [
        get("/api/info"),
        get("/api/pollers"),
        get("/api/pollers/items/parked"),
        post("/api/pollers/items/parked/retry", &json!({ "ids": ["x"] })),
    ] {
        let uri = request.uri().to_string();
        let reply = send(&app, request).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{uri}");
        assert_eq!(
            reply.headers[header::WWW_AUTHENTICATE],
            "Bearer realm=\"watukuy\""
        );
        assert_eq!(reply.body["error"]["code"], "UNAUTHORIZED");
    }
    let wrong = send(&app, with_token(get("/api/pollers"), "s3creT")).await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    let right = send(&app, with_token(get("/api/pollers"), "s3cret")).await;
    assert_eq!(right.status, StatusCode::OK);
    // 401 comes before 403: a read-only page does not tell strangers it is read-only.
    let store = memory();
    let (_world, engine) = example(1, &store, &Consumer::default());
    let read_only = router(AdminState::new(engine, store).bearer_token("s3cret"));
    let reply = send(
        &read_only,
        post("/api/pollers/items/parked/retry", &json!({ "ids": ["x"] })),
    )
    .await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn bad_requests_are_json_errors() {
    let store = memory();
    let (_world, engine) = example(1, &store, &Consumer::default());
    let app = router(AdminState::new(engine, store).mode(Mode::ReadWrite));

    let unknown = send(&app, get("/api/pollers/nope/parked")).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(unknown.body["error"]["code"], "UNKNOWN_POLLER");

    let partitioned = send(&app, get("/api/pollers/items/parked?partition=acme")).await;
    assert_eq!(partitioned.status, StatusCode::BAD_REQUEST);
    assert_eq!(partitioned.body["error"]["code"], "CONFIG");

    let bad_kind = send(&app, get("/api/pollers/items/parked?kind=weird")).await;
    assert_eq!(bad_kind.status, StatusCode::BAD_REQUEST);

    let empty = send(
        &app,
        post("/api/pollers/items/parked/retry", &json!({ "ids": [] })),
    )
    .await;
    assert_eq!(empty.status, StatusCode::BAD_REQUEST);

    // A cross-site form can only send form or text bodies: refused.
    let form = Request::post("/api/pollers/items/parked/discard")
        .header(header::CONTENT_TYPE, "text/plain")
        .body(Body::from(r#"{"ids":["x"]}"#))
        .unwrap();
    let reply = send(&app, form).await;
    assert_eq!(reply.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(reply.body["error"]["code"], "BAD_REQUEST");
}

#[tokio::test]
async fn a_store_alone_shows_every_key_and_operates_on_the_store() {
    let (store, consumer, world, engine) = parked_example(2, &["item-001", "item-002"]).await;
    store
        .save_state_unfenced(
            &PKey::new("tenants", "acme"),
            &StatePatch {
                paused: Some(true),
                updated_at: Some(world.now()),
                ..StatePatch::default()
            },
        )
        .await
        .unwrap();
    let app = router(
        AdminState::from_store(Arc::clone(&store))
            .clock(Arc::new(world.clock.clone()))
            .mode(Mode::ReadWrite),
    );
    assert_eq!(send(&app, get("/api/info")).await.body["source"], "store");

    let report = send(&app, get("/api/pollers")).await.body;
    let ours = report["pollers"].as_array().unwrap();
    assert_eq!(ours.len(), 2);
    assert_eq!(
        (&ours[0]["poller"], &ours[1]["poller"]),
        (&json!("items"), &json!("tenants"))
    );
    assert_eq!(ours[1]["paused"], true);
    // What the engine reports, field for field, from the store alone.
    let engine_report = serde_json::to_value(engine.inspect().await.unwrap()).unwrap();
    for (field, value) in ours[0].as_object().unwrap() {
        assert_eq!(value, &engine_report["pollers"][0][field], "field {field}");
    }

    let rows = send(&app, get("/api/pollers/items/parked")).await.body;
    let ids: Vec<String> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 2);
    let reply = send(
        &app,
        post(
            "/api/pollers/items/parked/discard",
            &json!({ "ids": [ids[0]] }),
        ),
    )
    .await;
    assert_eq!(reply.body, json!({ "discarded": 1 }));
    consumer.heal();
    let reply = send(
        &app,
        post(
            "/api/pollers/items/parked/retry",
            &json!({ "partition": "", "ids": [ids[1]] }),
        ),
    )
    .await;
    assert_eq!(reply.body, json!({ "retried": 1 }));
    world.tick(&engine).await.unwrap();
    let delivered = consumer.delivered_ids();
    assert!(delivered.contains(&ids[1]) && !delivered.contains(&ids[0]));

    let missing = send(&app, get("/api/pollers/tenants/parked?partition=globex")).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.body["error"]["code"], "UNKNOWN_PARTITION");
    let present = send(&app, get("/api/pollers/tenants/parked?partition=acme")).await;
    assert_eq!((present.status, present.body), (StatusCode::OK, json!([])));
    let unknown = send(&app, get("/api/pollers/nope/parked")).await;
    assert_eq!(unknown.body["error"]["code"], "UNKNOWN_POLLER");
}

#[tokio::test]
async fn it_nests_under_a_prefix() {
    let store = memory();
    let (_world, engine) = example(1, &store, &Consumer::default());
    let app = Router::new().nest("/admin", router(AdminState::new(engine, store)));
    assert_eq!(
        send(&app, get("/admin/api/pollers")).await.status,
        StatusCode::OK
    );
    assert_eq!(send(&app, get("/admin")).await.status, StatusCode::OK);
}

/// A poller whose API fails while `down` is set, with a circuit that opens at the first failure.
fn flaky_engine(down: &Arc<AtomicBool>, clock: &Arc<ManualClock>) -> Engine {
    let down = Arc::clone(down);
    let poller = Poller::builder::<Value>("orders")
        .identity(|order: &Value| order["id"].as_str().unwrap_or_default().to_owned())
        .cursor(cursor::page(1))
        .circuit(
            CircuitOptions::default()
                .failures(1)
                .probe_every(Duration::from_secs(60)),
        )
        .fetch(move |_ctx: FetchContext| {
            let down = down.load(Ordering::SeqCst);
            async move {
                if down {
                    Err(BoxError::from("the API answered 500"))
                } else {
                    Ok(Page::new(vec![json!({ "id": "o-1" })]))
                }
            }
        })
        .build()
        .unwrap();
    engine_on_clock(poller, clock)
}

/// An engine on a fresh memory store, reading time from `clock`.
fn engine_on_clock(poller: Poller, clock: &Arc<ManualClock>) -> Engine {
    Engine::builder(memory())
        .poller(poller)
        .clock(Arc::clone(clock) as Arc<dyn watukuy_core::clock::Clock>)
        .build()
        .unwrap()
}

#[tokio::test]
async fn health_is_503_with_the_reason_while_a_circuit_is_open_and_200_once_it_closes() {
    let clock = Arc::new(ManualClock::new(1_767_225_600_000));
    let down = Arc::new(AtomicBool::new(true));
    let engine = flaky_engine(&down, &clock);
    let app = health_router(engine.clone(), HealthOptions::default());

    engine.tick(TickOptions::default()).await.unwrap();
    let reply = send(&app, get("/health")).await;
    assert_eq!(
        reply.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        reply.text
    );
    assert_eq!(reply.body["healthy"], json!(false));
    assert_eq!(
        reply.body["reasons"],
        json!([
            "orders: the circuit is open after 1 failed poll; the last error: fetch failed: the API answered 500"
        ])
    );
    assert_eq!(reply.body["pollers"][0]["circuit"], json!("open"));

    // An open circuit the service accepts is on its row, and the check passes.
    let tolerant = health_router(
        engine.clone(),
        HealthOptions::default().allow_open_circuit(true),
    );
    assert_eq!(send(&tolerant, get("/health")).await.status, StatusCode::OK);

    // The API is back; the probe after `probe_every` succeeds and closes the circuit.
    down.store(false, Ordering::SeqCst);
    clock.advance(Duration::from_secs(61));
    engine.tick(TickOptions::default()).await.unwrap();
    let reply = send(&app, get("/health")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(reply.body["healthy"], json!(true));
    assert_eq!(reply.body["reasons"], json!([]));
    assert_eq!(reply.body["pollers"][0]["circuit"], json!("closed"));
}

#[tokio::test]
async fn health_requires_a_running_daemon_when_asked() {
    let clock = Arc::new(ManualClock::new(1_767_225_600_000));
    let engine = flaky_engine(&Arc::new(AtomicBool::new(false)), &clock);
    let daemon = health_router(
        engine.clone(),
        HealthOptions::default().require_running(true),
    );
    let reply = send(&daemon, get("/health")).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        reply.body["reasons"],
        json!(["the engine is not running (it is idle)"])
    );
    let cron = health_router(engine, HealthOptions::default());
    assert_eq!(send(&cron, get("/health")).await.status, StatusCode::OK);
}

#[tokio::test]
async fn health_is_503_when_a_timestamp_cursor_lags_past_the_maximum() {
    // The API's newest change is an hour old when the engine polls it.
    let clock = Arc::new(ManualClock::new(1_767_229_200_000)); // 2026-01-01T01:00:00Z
    let poller = Poller::builder::<Value>("orders")
        .identity(|order: &Value| order["id"].as_str().unwrap_or_default().to_owned())
        .cursor(cursor::timestamp("updatedAt"))
        .fetch(|_ctx: FetchContext| async {
            Ok(Page::new(vec![
                json!({ "id": "o-1", "updatedAt": "2026-01-01T00:00:00Z" }),
            ]))
        })
        .build()
        .unwrap();
    let engine = engine_on_clock(poller, &clock);
    engine.tick(TickOptions::default()).await.unwrap();
    let strict = health_router(
        engine.clone(),
        HealthOptions::default().max_lag(Duration::from_secs(600)),
    );
    let reply = send(&strict, get("/health")).await;
    assert_eq!(
        reply.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        reply.text
    );
    assert_eq!(
        reply.body["reasons"],
        json!(["orders: the cursor lags 3600 s behind, more than the 600 s allowed"])
    );
    assert_eq!(reply.body["pollers"][0]["lagMs"], json!(3_600_000));
    let relaxed = health_router(
        engine,
        HealthOptions::default().max_lag(Duration::from_secs(7200)),
    );
    assert_eq!(send(&relaxed, get("/health")).await.status, StatusCode::OK);
}
