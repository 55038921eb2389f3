//! The admin page under any request: a status below 500 for everything a client can send
//! (methods, paths, query strings, bodies, content types, tokens), and with a token set,
//! nothing changes for a request that does not carry it.

mod common;

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use common::parked_example;
use proptest::prelude::*;
use tower::ServiceExt as _;
use watukuy_admin::{AdminState, Mode, router};
use watukuy_core::store::{ParkedQuery, Store};
use watukuy_testkit::world::key;

const TOKEN: &str = "s3cret";

/// A request as a browser, a script or an attacker might send it.
#[derive(Debug, Clone)]
struct Sent {
    method: Method,
    path: String,
    content_type: Option<String>,
    authorization: Option<String>,
    body: Vec<u8>,
}

fn sent() -> impl Strategy<Value = Sent> {
    let method = prop_oneof![
        Just(Method::GET),
        Just(Method::POST),
        Just(Method::PUT),
        Just(Method::DELETE),
        Just(Method::HEAD),
    ];
    let poller = prop_oneof![
        Just("items".to_owned()),
        "[a-z%0-9.~-]{0,12}",
        Just("%FF%00".to_owned()),
    ];
    let route = prop_oneof![
        Just("".to_owned()),
        Just("api/info".to_owned()),
        Just("api/pollers".to_owned()),
        Just("api/pollers/{p}/parked".to_owned()),
        Just("api/pollers/{p}/parked/retry".to_owned()),
        Just("api/pollers/{p}/parked/discard".to_owned()),
        "[a-z/{}%.]{0,30}",
    ];
    let query = prop_oneof![
        Just(String::new()),
        "\\?(partition|kind|limit|ids)=[a-z0-9%,&=+-]{0,20}",
        "\\?[a-z0-9%&=]{0,30}",
    ];
    let path = (route, poller, query)
        .prop_map(|(route, poller, query)| format!("/{}{query}", route.replace("{p}", &poller)));
    let content_type = proptest::option::of(prop_oneof![
        Just("application/json".to_owned()),
        Just("text/plain".to_owned()),
        Just("application/x-www-form-urlencoded".to_owned()),
        "[a-z/+;= -]{0,30}",
    ]);
    let authorization = proptest::option::of(prop_oneof![
        Just(format!("Bearer {TOKEN}")),
        Just("Bearer s3creT".to_owned()),
        Just(format!("bearer {TOKEN}")),
        Just(format!("Basic {TOKEN}")),
        "[ -~]{0,30}",
    ]);
    let body = prop_oneof![
        Just(b"{\"ids\":[\"item-001\"]}".to_vec()),
        Just(b"{\"ids\":[],\"partition\":\"\"}".to_vec()),
        "\\{\"ids\":\\[\"[a-z0-9-]{0,10}\"\\](,\"partition\":\"[a-z]{0,4}\")?\\}"
            .prop_map(String::into_bytes),
        proptest::collection::vec(any::<u8>(), 0..64),
    ];
    (method, path, content_type, authorization, body).prop_map(
        |(method, path, content_type, authorization, body)| Sent {
            method,
            path,
            content_type,
            authorization,
            body,
        },
    )
}

/// The request, or `None` when the HTTP library itself refuses to build it (no server sees it).
fn request(sent: &Sent) -> Option<Request<Body>> {
    let mut builder = Request::builder()
        .method(sent.method.clone())
        .uri(&sent.path);
    if let Some(content_type) = &sent.content_type {
        builder = builder.header(header::CONTENT_TYPE, content_type);
    }
    if let Some(authorization) = &sent.authorization {
        builder = builder.header(header::AUTHORIZATION, authorization);
    }
    builder.body(Body::from(sent.body.clone())).ok()
}

/// The parked rows of the example's key: what a retry or a discard changes.
async fn parked(store: &Arc<dyn Store>) -> usize {
    store
        .list_parked(&key(), ParkedQuery::default())
        .await
        .map(|rows| rows.len())
        .unwrap_or(usize::MAX)
}

#[test]
fn every_request_is_answered_below_500_and_nothing_moves_without_the_token() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let (app, store): (Router, Arc<dyn Store>) = runtime.block_on(async {
        let (store, _consumer, world, _engine) =
            parked_example(3, &["item-001", "item-002", "item-003"]).await;
        let app = router(
            AdminState::from_store(Arc::clone(&store))
                .clock(Arc::new(world.clock.clone()))
                .mode(Mode::ReadWrite)
                .bearer_token(TOKEN),
        );
        (app, store)
    });
    assert_eq!(
        runtime.block_on(parked(&store)),
        3,
        "the example parks three rows"
    );
    proptest!(ProptestConfig::with_cases(512), |(sent in sent())| {
        let Some(request) = request(&sent) else {
            return Ok(());
        };
        let authorized = sent.authorization.as_deref() == Some(&format!("Bearer {TOKEN}"));
        let (status, before, after) = runtime.block_on(async {
            let before = parked(&store).await;
            let response = app.clone().oneshot(request).await.expect("infallible");
            (response.status(), before, parked(&store).await)
        });
        prop_assert!(status < StatusCode::INTERNAL_SERVER_ERROR, "{sent:?} answered {status}");
        if !authorized {
            prop_assert_eq!(before, after, "{:?} changed the parked rows without the token", sent);
        }
    });
}
