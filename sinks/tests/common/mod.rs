//! Shared test helpers: sample events, handler contexts, free ports.
#![allow(dead_code, unreachable_pub)]

use tokio_util::sync::CancellationToken;
use watukuy_core::{Event, EventType, HandlerContext, Partition, json::Json};

/// An event of poller `poller` with the given id suffix (ids are 64 hex characters).
pub fn event(poller: &str, n: u32, event_type: EventType) -> Event {
    let mut event = Event::new(format!("{n:064x}"), event_type, poller, format!("item-{n}"));
    event.time = "2026-01-01T00:00:00.000Z".into();
    event.sequence = i64::from(n);
    event.data = Some(Json::parse(&format!(r#"{{"id":"item-{n}","total":{n}}}"#)).unwrap());
    event.attempt = 1;
    event
}

/// A fresh context for attempt 1 (not cancelled).
pub fn ctx() -> HandlerContext {
    HandlerContext::new(1, Partition::new(""), CancellationToken::new())
}

/// A TCP port on 127.0.0.1 that nothing listens on right now.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// A name unique to this test process (brokers are shared with other developers and runs).
pub fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", std::process::id())
}

/// The URL of a broker from the environment variable `var`; unset or empty, the test fails saying
/// which variable names the `broker` (a test that needs it never passes without it).
pub fn broker_url(var: &str, broker: &str) -> String {
    std::env::var(var)
        .ok()
        .filter(|url| !url.trim().is_empty())
        .unwrap_or_else(|| panic!("{var} is not set, so the {broker} sink cannot be tested"))
}

/// Serves `app` on a free port of 127.0.0.1 for the rest of the test; its `http://` base URL.
pub async fn spawn_server(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    base
}
