//! The admin page (read-write, with a bearer token) under any request: every answer has a status
//! below 500, and a request without the token changes no parked row.
//!
//! The input is a request as text: `METHOD target` on the first line, the `Content-Type` on the
//! second and the `Authorization` on the third (an empty line: no such header), the body after.
//! Each input gets a fresh memory store holding one of everything (`populate_one_of_everything`):
//! on key `orders`, the poison row `evt-2` and the quarantined item `invalid:x`.
#![no_main]

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt as _;
use watukuy_admin::{AdminState, Mode, router};
use watukuy_conformance::cases::fixtures::{key, populate_one_of_everything};
use watukuy_core::clock::ManualClock;
use watukuy_core::store::{ParkedQuery, Store};
use watukuy_fuzz::block_on;
use watukuy_store_memory::MemoryStore;
use watukuy_testkit::T0;

const TOKEN: &str = "s3cret";

/// A memory store holding one of everything on `orders`, a poison row and a quarantined item
/// among them.
async fn populated() -> Arc<dyn Store> {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    populate_one_of_everything(&*store).await.expect("memory");
    store
}

async fn parked(store: &dyn Store) -> usize {
    store
        .list_parked(&key(), ParkedQuery::default())
        .await
        .expect("memory")
        .len()
}

/// The request the text describes, or `None` where the HTTP library refuses to build it (no
/// server would see it).
fn request(text: &str) -> Option<(Request<Body>, bool)> {
    let mut parts = text.splitn(4, '\n');
    let (method, target) = parts.next()?.split_once(' ')?;
    let content_type = parts.next().unwrap_or_default();
    let authorization = parts.next().unwrap_or_default();
    let body = parts.next().unwrap_or_default().to_owned();
    let mut builder = Request::builder()
        .method(Method::from_bytes(method.as_bytes()).ok()?)
        .uri(target);
    if !content_type.is_empty() {
        builder = builder.header(header::CONTENT_TYPE, content_type);
    }
    if !authorization.is_empty() {
        builder = builder.header(header::AUTHORIZATION, authorization);
    }
    let authorized = authorization == format!("Bearer {TOKEN}");
    Some((builder.body(Body::from(body)).ok()?, authorized))
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Some((request, authorized)) = request(text) else {
        return;
    };
    block_on(async {
        let store = populated().await;
        let before = parked(&*store).await;
        let app = router(
            AdminState::from_store(Arc::clone(&store))
                .clock(Arc::new(ManualClock::new(T0)))
                .mode(Mode::ReadWrite)
                .bearer_token(TOKEN),
        );
        let response = app.oneshot(request).await.expect("infallible");
        let status = response.status();
        assert!(
            status < StatusCode::INTERNAL_SERVER_ERROR,
            "{text:?} answered {status}"
        );
        if !authorized {
            assert_eq!(
                parked(&*store).await,
                before,
                "{text:?} moved rows without the token"
            );
        }
    });
});
