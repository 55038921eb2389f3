//! Secret headers never reach the logs. In a test binary of its own: the capture uses a
//! thread-local subscriber, and tracing caches per-callsite interest across threads, so tests
//! logging concurrently on other threads could hide events from it.

mod common;

use std::sync::{Arc, Mutex};

use serde_json::json;
use watukuy_http::{HttpClient, REDACTED};

use common::{Harness, Reply, Server, context, items};

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn redacted_headers_never_appear_in_logs() {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer({
            let captured = captured.clone();
            move || captured.clone()
        })
        .finish();
    // Everything in this test runs on this thread (current-thread runtime): the engine, the
    // client and the server all log into `captured`.
    let _guard = tracing::subscriber::set_default(subscriber);

    let server = Server::start(|seen| {
        let reply = if seen.uri.starts_with("/denied") {
            Reply::json(401, &json!({ "title": "bad token" }))
        } else {
            Reply::json(200, &items())
        };
        reply
            .header("set-cookie", "session=SECRET-SET-COOKIE")
            .header("x-request-id", "visible-id")
    })
    .await;
    let http = HttpClient::builder()
        .bearer_auth("SECRET-BEARER")
        .header("X-Api-Key", "SECRET-API-KEY")
        .redact_header("x-extra-secret")
        .build()
        .unwrap();
    assert!(!format!("{http:?}").contains("SECRET"));
    let ctx = context(None);
    let response = http
        .get(&ctx, server.url("/items"))
        .header("Cookie", "sid=SECRET-COOKIE")
        .header("Proxy-Authorization", "Basic SECRET-PROXY")
        .header("X-Extra-Secret", "SECRET-EXTRA")
        .send()
        .await
        .unwrap();
    assert!(!format!("{response:?}").contains("SECRET"));
    let error = http
        .get(&ctx, server.url("/denied"))
        .bearer_auth("SECRET-OTHER-BEARER")
        .send()
        .await
        .unwrap_err();
    assert!(!error.to_string().contains("SECRET"));
    let h = Harness::new(server.url("/items"), http.clone()).await;
    h.poll().await;

    // The secrets were sent...
    let seen = server.seen();
    assert_eq!(
        seen[0].header("authorization"),
        Some("Bearer SECRET-BEARER")
    );
    assert_eq!(seen[0].header("x-api-key"), Some("SECRET-API-KEY"));
    assert_eq!(seen[0].header("cookie"), Some("sid=SECRET-COOKIE"));
    assert_eq!(
        seen[1].header("authorization"),
        Some("Bearer SECRET-OTHER-BEARER")
    );
    // ...and logged only as `***`.
    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("watukuy.http"), "{logs}");
    assert!(logs.contains("authorization: ***"), "{logs}");
    assert!(logs.contains("set-cookie: ***"), "{logs}");
    assert!(logs.contains("x-extra-secret: ***"), "{logs}");
    assert!(logs.contains("x-request-id: visible-id"), "{logs}");
    assert!(logs.contains(REDACTED));
    assert!(
        !logs.contains("SECRET"),
        "a secret leaked into the logs:\n{logs}"
    );
}
