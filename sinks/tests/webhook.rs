//! The webhook sink against a real HTTP server (axum on 127.0.0.1:0): headers, body, the
//! receiver's verification, and how statuses are classified.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use common::{ctx, event, fails_as, free_port, spawn_server};
use watukuy_core::{
    CloudEvent, Event, EventType,
    clock::ManualClock,
    delivery::{Handler, HandlerErrorKind},
};
use watukuy_sinks::{
    EventFormat, MAX_WEBHOOK_ERROR_BODY_CHARS, WebhookConfigError, WebhookDeliveryError,
    WebhookOptions, WebhookSecret, WebhookSecretError, WebhookSink, verify_webhook_signature,
};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// The sender's clock: 2023-11-14T22:13:20Z.
const NOW_MS: i64 = 1_700_000_000_000;

#[derive(Clone, Debug)]
struct Received {
    path: String,
    headers: HeaderMap,
    body: Bytes,
}

#[derive(Clone, Default)]
struct Receiver {
    requests: Arc<Mutex<Vec<Received>>>,
}

impl Receiver {
    fn requests(&self) -> Vec<Received> {
        self.requests.lock().unwrap().clone()
    }

    fn last(&self) -> Received {
        self.requests().pop().expect("the receiver got a request")
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> &'a str {
    headers
        .get(name)
        .unwrap_or_else(|| panic!("missing header {name}"))
        .to_str()
        .unwrap()
}

/// Verifies a request as a receiver would, 10 seconds after it was signed.
fn receiver_verifies(received: &Received, secret: &str) -> bool {
    verify_webhook_signature(
        &WebhookSecret::new(secret).unwrap(),
        header(&received.headers, "webhook-id"),
        header(&received.headers, "webhook-timestamp"),
        &received.body,
        header(&received.headers, "webhook-signature"),
        NOW_MS / 1000 + 10,
    )
    .is_ok()
}

async fn answer(
    State(receiver): State<Receiver>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let received = Received {
        path: uri.path().to_owned(),
        headers,
        body,
    };
    receiver.requests.lock().unwrap().push(received.clone());
    match received.path.as_str() {
        "/ok" => (StatusCode::OK, "thanks").into_response(),
        "/accepted" => StatusCode::ACCEPTED.into_response(),
        "/verify" => {
            if receiver_verifies(&received, SECRET) {
                StatusCode::NO_CONTENT.into_response()
            } else {
                (StatusCode::UNAUTHORIZED, "bad signature").into_response()
            }
        }
        "/missing" => (StatusCode::NOT_FOUND, "no such hook").into_response(),
        "/timeout" => StatusCode::REQUEST_TIMEOUT.into_response(),
        "/busy" => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "7")],
            "busy",
        )
            .into_response(),
        "/throttled" => (
            StatusCode::TOO_MANY_REQUESTS,
            // 30 seconds after the sender's clock.
            [(header::RETRY_AFTER, "Tue, 14 Nov 2023 22:13:50 GMT")],
        )
            .into_response(),
        "/boom" => (StatusCode::INTERNAL_SERVER_ERROR, "é".repeat(10_000)).into_response(),
        "/redirect" => (StatusCode::FOUND, [(header::LOCATION, "/ok")]).into_response(),
        "/hang" => std::future::pending::<Response>().await,
        _ => StatusCode::IM_A_TEAPOT.into_response(),
    }
}

async fn serve() -> (String, Receiver) {
    let receiver = Receiver::default();
    let app = Router::new()
        .route("/{*path}", post(answer))
        .with_state(receiver.clone());
    (spawn_server(app).await, receiver)
}

fn options(url: String) -> WebhookOptions {
    WebhookOptions::new(url, SECRET).clock(Arc::new(ManualClock::new(NOW_MS)))
}

fn sink(url: String) -> WebhookSink {
    WebhookSink::new(options(url)).unwrap()
}

fn delivery_error(err: &watukuy_core::HandlerError) -> &WebhookDeliveryError {
    err.source()
        .downcast_ref::<WebhookDeliveryError>()
        .expect("a WebhookDeliveryError")
}

#[tokio::test]
async fn posts_a_signed_cloud_event_and_acks() {
    let (base, receiver) = serve().await;
    let sink =
        WebhookSink::new(options(format!("{base}/ok")).header("authorization", "Bearer t0ken"))
            .unwrap();
    let event = event("orders", 1, EventType::Updated);
    let ctx = ctx();
    sink.handle(event.clone(), ctx.clone()).await.unwrap();
    assert!(!ctx.ack(), "the sink acknowledged the event");

    let got = receiver.last();
    assert_eq!(got.path, "/ok");
    assert_eq!(
        header(&got.headers, "content-type"),
        "application/cloudevents+json"
    );
    assert_eq!(header(&got.headers, "webhook-id"), event.id);
    assert_eq!(header(&got.headers, "webhook-timestamp"), "1700000000");
    assert!(header(&got.headers, "webhook-signature").starts_with("v1,"));
    assert_eq!(header(&got.headers, "authorization"), "Bearer t0ken");
    assert!(receiver_verifies(&got, SECRET));
    assert!(!receiver_verifies(&got, "whsec_d3Jvbmctc2VjcmV0"));
    let ce: CloudEvent = serde_json::from_slice(&got.body).unwrap();
    assert_eq!(ce, event.to_cloud_event());
    assert_eq!(ce.event_type, "orders.updated");
}

#[tokio::test]
async fn raw_format_posts_the_event_as_json() {
    let (base, receiver) = serve().await;
    let sink = WebhookSink::new(options(format!("{base}/ok")).format(EventFormat::Raw)).unwrap();
    let event = event("orders", 2, EventType::Created);
    sink.handle(event.clone(), ctx()).await.unwrap();
    let got = receiver.last();
    assert_eq!(header(&got.headers, "content-type"), "application/json");
    let back: Event = serde_json::from_slice(&got.body).unwrap();
    assert_eq!(back, event);
    assert!(receiver_verifies(&got, SECRET));
}

#[tokio::test]
async fn a_verifying_receiver_accepts_the_right_secret_only() {
    let (base, receiver) = serve().await;
    let event = event("orders", 3, EventType::Deleted);
    sink(format!("{base}/verify"))
        .handle(event.clone(), ctx())
        .await
        .unwrap();

    let wrong = WebhookSink::new(
        WebhookOptions::new(format!("{base}/verify"), "some-other-secret")
            .clock(Arc::new(ManualClock::new(NOW_MS))),
    )
    .unwrap();
    let ctx = ctx();
    let err = wrong.handle(event.clone(), ctx.clone()).await.unwrap_err();
    assert_eq!(err.kind(), &HandlerErrorKind::Permanent, "401 is permanent");
    assert_eq!(delivery_error(&err).status, 401);
    assert_eq!(delivery_error(&err).body_text, "bad signature");
    assert!(ctx.ack(), "a failed delivery is not acknowledged");

    // A sender whose clock is an hour behind signs a timestamp the receiver refuses.
    let stale = WebhookSink::new(
        WebhookOptions::new(format!("{base}/verify"), SECRET)
            .clock(Arc::new(ManualClock::new(NOW_MS - 3_600_000))),
    )
    .unwrap();
    let err = stale.handle(event, self::ctx()).await.unwrap_err();
    assert_eq!(delivery_error(&err).status, 401);
    assert_eq!(receiver.requests().len(), 3);
}

#[tokio::test]
async fn statuses_are_classified_for_the_dispatcher() {
    let (base, receiver) = serve().await;
    let event = event("orders", 4, EventType::Updated);
    let fail = |path: &'static str| {
        let sink = sink(format!("{base}{path}"));
        let event = event.clone();
        async move { sink.handle(event, ctx()).await.unwrap_err() }
    };

    let err = fail("/missing").await;
    assert_eq!(err.kind(), &HandlerErrorKind::Permanent);
    let delivery = delivery_error(&err);
    assert_eq!(delivery.status, 404);
    assert_eq!(delivery.body_text, "no such hook");
    assert_eq!(delivery.url, format!("{base}/missing"));
    assert!(err.to_string().contains("404"), "{err}");

    let err = fail("/busy").await;
    assert_eq!(
        err.kind(),
        &HandlerErrorKind::RetryAfter(Duration::from_secs(7))
    );
    assert!(delivery_error(&err).is_throttle());

    let err = fail("/throttled").await;
    assert_eq!(
        err.kind(),
        &HandlerErrorKind::RetryAfter(Duration::from_secs(30)),
        "an HTTP-date Retry-After is measured on the sink's clock"
    );

    let err = fail("/boom").await;
    assert_eq!(err.kind(), &HandlerErrorKind::Transient);
    let delivery = delivery_error(&err);
    assert_eq!(delivery.status, 500);
    assert_eq!(
        delivery.body_text.chars().count(),
        MAX_WEBHOOK_ERROR_BODY_CHARS
    );
    assert!(delivery.body_text.chars().all(|c| c == 'é'));

    let err = fail("/timeout").await;
    assert_eq!(err.kind(), &HandlerErrorKind::Transient, "408 is transient");

    let err = fail("/teapot").await;
    assert_eq!(err.kind(), &HandlerErrorKind::Permanent, "418 is permanent");

    let err = fail("/redirect").await;
    assert_eq!(err.kind(), &HandlerErrorKind::Transient);
    assert_eq!(delivery_error(&err).status, 302);
    assert!(
        receiver.requests().iter().all(|r| r.path != "/ok"),
        "redirects are not followed"
    );
}

#[tokio::test]
async fn success_statuses_are_configurable() {
    let (base, _receiver) = serve().await;
    let only_202 = |path: &str| {
        WebhookSink::new(options(format!("{base}{path}")).success_statuses([202])).unwrap()
    };
    only_202("/accepted")
        .handle(event("orders", 5, EventType::Created), ctx())
        .await
        .unwrap();
    let err = only_202("/ok")
        .handle(event("orders", 5, EventType::Created), ctx())
        .await
        .unwrap_err();
    assert_eq!(delivery_error(&err).status, 200);
    assert_eq!(err.kind(), &HandlerErrorKind::Transient);
}

#[tokio::test]
async fn network_errors_and_timeouts_are_transient() {
    let refused = sink(format!("http://127.0.0.1:{}/hook", free_port()));
    fails_as(
        &refused,
        event("orders", 6, EventType::Created),
        HandlerErrorKind::Transient,
    )
    .await;

    // The server never answers /hang: the request's timeout ends the attempt.
    let (base, _receiver) = serve().await;
    let hanging =
        WebhookSink::new(options(format!("{base}/hang")).timeout(Duration::from_millis(200)))
            .unwrap();
    fails_as(
        &hanging,
        event("orders", 6, EventType::Created),
        HandlerErrorKind::Transient,
    )
    .await;
}

#[tokio::test]
async fn a_cancelled_attempt_fails_without_acking() {
    let (base, _receiver) = serve().await;
    let ctx = ctx();
    ctx.cancel.cancel();
    let err = sink(format!("{base}/hang"))
        .handle(event("orders", 7, EventType::Created), ctx.clone())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), &HandlerErrorKind::Transient);
    assert!(ctx.ack());
}

#[test]
fn bad_options_are_refused_up_front() {
    let build = |options: WebhookOptions| WebhookSink::new(options).unwrap_err();
    assert!(matches!(
        build(WebhookOptions::new("not a url", SECRET)),
        WebhookConfigError::InvalidUrl { .. }
    ));
    assert!(matches!(
        build(WebhookOptions::new("ftp://example.com/x", SECRET)),
        WebhookConfigError::InvalidUrl { .. }
    ));
    assert!(matches!(
        build(WebhookOptions::new("https://example.com", "whsec_%%%")),
        WebhookConfigError::Secret(WebhookSecretError::InvalidBase64(_))
    ));
    assert!(matches!(
        build(WebhookOptions::new("https://example.com", "")),
        WebhookConfigError::Secret(WebhookSecretError::Empty)
    ));
    assert!(matches!(
        build(WebhookOptions::new("https://example.com", SECRET).header("Webhook-Signature", "x")),
        WebhookConfigError::InvalidHeader { .. }
    ));
    assert!(matches!(
        build(WebhookOptions::new("https://example.com", SECRET).header("x-bad", "a\nb")),
        WebhookConfigError::InvalidHeader { .. }
    ));
    assert!(matches!(
        build(WebhookOptions::new("https://example.com", SECRET).success_statuses([])),
        WebhookConfigError::NoSuccessStatus
    ));
    // An https URL builds (the TLS configuration is valid) without connecting anywhere.
    let sink = WebhookSink::new(WebhookOptions::new("https://example.com/hooks", SECRET)).unwrap();
    assert_eq!(sink.url(), "https://example.com/hooks");
    assert!(
        !format!("{sink:?}").contains("MfKQ9r8"),
        "Debug never shows the secret"
    );
}
