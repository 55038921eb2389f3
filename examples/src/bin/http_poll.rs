//! Poll a real HTTP API with the HTTP helper and forward every change to a signed webhook.
//!
//! Run it with `cargo run -p watukuy-examples --bin http_poll`.
//!
//! Two small local servers (axum on 127.0.0.1) stand in for the outside world: an "orders" API
//! that sends ETags and IETF rate-limit headers and answers one request with 429, and a webhook
//! receiver that checks each delivery's Standard Webhooks signature. The poller lists the API with
//! `watukuy_http::HttpClient`; the engine forwards its events with `watukuy_sinks::WebhookSink`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use watukuy_core::schedule::ScheduleOptions;
use watukuy_core::{
    Engine, FetchContext, Poller, StopOptions, TickOptions,
    clock::{Clock, SystemClock},
    cursor,
};
use watukuy_http::HttpClient;
use watukuy_sinks::{WebhookOptions, WebhookSecret, WebhookSink, verify_webhook_signature};
use watukuy_store_memory::MemoryStore;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Order {
    id: String,
    status: String,
}

/// The orders API: a version number that is the ETag, and a switch for one 429.
#[derive(Default)]
struct Api {
    orders: Vec<serde_json::Value>,
    version: u32,
    throttle_next: bool,
    remaining: u32,
}

type ApiState = Arc<Mutex<Api>>;

async fn list_orders(State(api): State<ApiState>, headers: HeaderMap) -> Response {
    let mut api = api
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if std::mem::take(&mut api.throttle_next) {
        println!("  api: 429 Too Many Requests, Retry-After: 1");
        return (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "1")]).into_response();
    }
    api.remaining = api.remaining.saturating_sub(1);
    let etag = format!("\"v{}\"", api.version);
    let rate_limit = [
        ("etag", etag.clone()),
        ("ratelimit", format!("\"default\";r={};t=60", api.remaining)),
        ("ratelimit-policy", "\"default\";q=100;w=60".to_owned()),
    ];
    let if_none_match = headers.get("if-none-match").and_then(|v| v.to_str().ok());
    if if_none_match == Some(etag.as_str()) {
        println!("  api: 304 Not Modified (If-None-Match: {etag})");
        return (StatusCode::NOT_MODIFIED, rate_limit).into_response();
    }
    println!("  api: 200 with {} orders, ETag {etag}", api.orders.len());
    let body = serde_json::Value::Array(api.orders.clone()).to_string();
    let mut response = (rate_limit, body).into_response();
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().expect("static"));
    response
}

/// The webhook receiver: checks the signature and prints the event.
async fn receive(headers: HeaderMap, body: Bytes) -> StatusCode {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let Ok(secret) = WebhookSecret::new(SECRET) else {
        return StatusCode::INTERNAL_SERVER_ERROR;
    };
    let now_secs = SystemClock.now_ms() / 1000;
    let verified = verify_webhook_signature(
        &secret,
        &header("webhook-id"),
        &header("webhook-timestamp"),
        &body,
        &header("webhook-signature"),
        now_secs,
    );
    let event: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    println!(
        "  webhook: {} {} (signature {})",
        event["type"].as_str().unwrap_or("?"),
        event["subject"].as_str().unwrap_or("?"),
        if verified.is_ok() { "ok" } else { "INVALID" },
    );
    if verified.is_ok() {
        StatusCode::NO_CONTENT
    } else {
        StatusCode::UNAUTHORIZED
    }
}

async fn serve(app: axum::Router) -> Result<String, Box<dyn std::error::Error>> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(format!("http://{addr}"))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let api: ApiState = Arc::new(Mutex::new(Api {
        orders: vec![
            serde_json::json!({ "id": "order-1", "status": "open" }),
            serde_json::json!({ "id": "order-2", "status": "open" }),
            serde_json::json!({ "id": "order-3", "status": "open" }),
        ],
        version: 1,
        remaining: 100,
        ..Api::default()
    }));
    let api_url = serve(
        axum::Router::new()
            .route("/orders", axum::routing::get(list_orders))
            .with_state(Arc::clone(&api)),
    )
    .await?;
    let hook_url = serve(axum::Router::new().route("/hooks", axum::routing::post(receive))).await?;

    // The poller lists every order (a full scan finds deletes) through the HTTP helper: ETags,
    // rate-limit headers, Retry-After and problem details are handled per request.
    let http = HttpClient::builder().bearer_auth("demo-token").build()?;
    let orders_url = format!("{api_url}/orders");
    let orders = Poller::builder::<Order>("orders")
        .identity(|order: &Order| order.id.clone())
        .cursor(cursor::snapshot_diff())
        .schedule(
            ScheduleOptions::default()
                .min(Duration::from_secs(5))
                .jitter(0.0),
        )
        .fetch(move |ctx: FetchContext| {
            let (http, url) = (http.clone(), orders_url.clone());
            async move { Ok(http.get(&ctx, url).send().await?.items_page()?) }
        })
        .build()?;

    let engine = Engine::builder(Arc::new(MemoryStore::new()))
        .poller(orders)
        .build()?;
    engine.migrate().await?;
    engine.on(
        "orders",
        WebhookSink::new(WebhookOptions::new(format!("{hook_url}/hooks"), SECRET))?,
    )?;

    let show = |label: &str| {
        let engine = &engine;
        let label = label.to_owned();
        async move {
            let report = engine.inspect().await?;
            let key = &report.pollers[0];
            let now = SystemClock.now_ms();
            let schedule = &key.schedule;
            let next = schedule.next_due_at.map_or(0, |at| at - now);
            let remaining = schedule.rate_limit.as_ref().and_then(|r| r.remaining);
            println!(
                "  {label}: {} items; next poll in {} ms; throttled: {}; rate limit remaining: {}",
                key.items,
                next,
                schedule.throttled_until.is_some_and(|t| t > now),
                remaining.map_or_else(|| "-".to_owned(), |r| r.to_string()),
            );
            Ok::<_, Box<dyn std::error::Error>>(())
        }
    };

    // The scenario runs until it ends, or until Ctrl-C / SIGTERM; either way the engine is
    // stopped cleanly (a running delivery finishes).
    let scenario = async {
        println!("1. first poll: three orders, each forwarded to the webhook");
        engine.tick(TickOptions::default()).await?;
        show("inspect").await?;

        println!("2. nothing changed: the API answers 304, an idle cycle (and no deletes)");
        engine.trigger("orders", None).await?;
        engine.tick(TickOptions::default()).await?;
        show("inspect").await?;

        println!("3. order-2 is paid, order-3 is gone, and the API throttles the next request");
        {
            let mut api = api
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            api.orders = vec![
                serde_json::json!({ "id": "order-1", "status": "open" }),
                serde_json::json!({ "id": "order-2", "status": "paid" }),
            ];
            api.version = 2;
            api.throttle_next = true;
            api.remaining = 2;
        }
        engine.trigger("orders", None).await?;
        let result = engine.tick(TickOptions::default()).await?;
        for polled in &result.polled {
            if let Some(error) = &polled.error {
                println!("  cycle failed: {}", error.message);
            }
        }
        show("inspect").await?;
        let early = engine.tick(TickOptions::default()).await?;
        println!(
            "  an immediate tick polls nothing: {} key(s) not due",
            early.skipped_not_due
        );

        println!(
            "4. after Retry-After the poll goes through; few requests left stretch the next wait"
        );
        SystemClock.sleep(Duration::from_millis(1_000)).await;
        engine.tick(TickOptions::default()).await?;
        show("inspect").await?;
        Ok::<(), Box<dyn std::error::Error>>(())
    };
    tokio::select! {
        done = scenario => done?,
        signal = watukuy_examples::shutdown::signal() => println!("{}: stopping", signal?),
    }
    engine.stop(StopOptions::default()).await?;
    Ok(())
}
