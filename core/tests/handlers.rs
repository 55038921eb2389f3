//! Consumer-side reliability in the dispatcher (issue 9): error classification (permanent parks
//! after one attempt, retry-after waits exactly as told), the handler timeout (a hanging handler
//! is cancelled, fails as a transient `Timeout` and is retried), the failed-event record
//! (classification, timed attempt log, handler version, correlation id, redaction) and the
//! delivery counters. Runs on `MemoryStore` with a manual clock; nothing sleeps.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use watukuy_conformance::cases::fixtures::{event, key};
use watukuy_core::delivery::{
    DeliveryCounters, DeliveryOutcome, LiveOnly, Redaction, Timeout, TransientStatuses,
    classify_http_response,
};
use watukuy_core::store::{FailureClass, ParkReason};
use watukuy_core::{
    DeliveryOptions, Event, HandlerContext, HandlerError, Lane,
    backoff::Backoff,
    delivery::{Dispatcher, DrainContext, DrainReport},
    json::Json,
    store::{ParkedError, ParkedQuery, ParkedRow, Store},
};
use watukuy_testkit::T0;

mod common;
use common::Setup;

async fn setup(events: Vec<Event>) -> Setup {
    Setup::with_events(events).await
}

fn one(subject: &str) -> Vec<Event> {
    vec![event(&key(), "e1", 1, subject)]
}

impl Setup {
    async fn drain(&self, d: &Dispatcher) -> DrainReport {
        d.drain(&self.key, &self.lease, &DrainContext::default())
            .await
            .unwrap()
    }

    async fn parked(&self) -> Vec<ParkedRow> {
        self.store
            .list_parked(&self.key, ParkedQuery::default())
            .await
            .unwrap()
    }
}

/// A handler counting its calls and answering with `answer(call)` (1-based).
fn counting(
    calls: &Arc<AtomicU32>,
    answer: impl Fn(u32) -> Result<(), HandlerError> + Send + Sync + 'static,
) -> impl Fn(Event, HandlerContext) -> std::future::Ready<Result<(), HandlerError>> + Send + Sync + 'static
{
    let calls = calls.clone();
    move |_event: Event, _ctx: HandlerContext| {
        let call = calls.fetch_add(1, Ordering::SeqCst) + 1;
        std::future::ready(answer(call))
    }
}

#[tokio::test]
async fn a_permanent_error_parks_after_one_attempt_and_says_why() {
    let s = setup(one("a")).await;
    let d = s.dispatcher(
        DeliveryOptions::default()
            .attempts(5)
            .handler_version("orders-projector@1.4.2"),
    );
    let calls = Arc::new(AtomicU32::new(0));
    d.on(counting(&calls, |_| {
        Err(HandlerError::permanent("order references unknown product"))
    }))
    .unwrap();
    let report = s.drain(&d).await;
    assert_eq!((report.parked, report.failed, report.delivered), (1, 0, 0));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the remaining attempts were burned"
    );
    let parked = s.parked().await;
    assert_eq!(parked.len(), 1);
    let row = &parked[0];
    assert_eq!(row.attempts, 1);
    let details = &row.error.details;
    assert_eq!(details.classification, Some(FailureClass::Permanent));
    assert_eq!(details.park_reason, Some(ParkReason::Permanent));
    assert_eq!(
        details.handler_version.as_deref(),
        Some("orders-projector@1.4.2")
    );
    let log = details.attempt_log.as_ref().unwrap();
    assert_eq!(log.len(), 1);
    assert_eq!(
        (log[0].attempt, log[0].started_at, log[0].failed_at),
        (1, Some(T0), Some(T0))
    );
    assert_eq!(log[0].error.message, "order references unknown product");
    assert_eq!(
        serde_json::to_value(d.counters("")).unwrap(),
        serde_json::json!({"received": 1, "applied": 0, "deduplicated": 0, "skipped": 0, "failed": 1})
    );
}

#[tokio::test]
async fn a_retry_after_error_waits_exactly_that_long() {
    let s = setup(one("a")).await;
    // A backoff that would never pick 7 s, to show the delay overrides it.
    let d = s.dispatcher(DeliveryOptions::default().backoff(Backoff::new(
        Duration::from_secs(60),
        2.0,
        Duration::from_secs(600),
    )));
    let calls = Arc::new(AtomicU32::new(0));
    d.on(counting(&calls, |call| {
        if call == 1 {
            let kind = classify_http_response(
                429,
                Some(Duration::from_secs(7)),
                &TransientStatuses::default(),
            );
            Err(HandlerError::new(
                kind,
                "downstream said 429, Retry-After: 7",
            ))
        } else {
            Ok(())
        }
    }))
    .unwrap();
    let report = s.drain(&d).await;
    assert_eq!(report.failed, 1);
    assert_eq!(report.next_retry_at, Some(T0 + 7_000));
    let row = &s.store.load_pending(&s.key, 10).await.unwrap()[0];
    assert_eq!(row.next_attempt_at, Some(T0 + 7_000));

    s.clock.advance(Duration::from_millis(6_999));
    let early = s.drain(&d).await;
    assert_eq!(
        (early.delivered, calls.load(Ordering::SeqCst)),
        (0, 1),
        "retried before the delay"
    );
    s.clock.advance(Duration::from_millis(1));
    let due = s.drain(&d).await;
    assert_eq!((due.delivered, due.remaining), (1, 0));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_hanging_handler_is_timed_out_cancelled_and_retried() {
    let s = setup(one("a")).await;
    let d = s.dispatcher(DeliveryOptions::default().backoff(Backoff::new(
        Duration::from_secs(1),
        2.0,
        Duration::from_secs(1),
    )));
    assert_eq!(
        d.options().handler_timeout_value(),
        Some(Duration::from_secs(15))
    );
    let started = Arc::new(Notify::new());
    let token_fired = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU32::new(0));
    d.on({
        let (started, token_fired, calls) = (started.clone(), token_fired.clone(), calls.clone());
        move |_event: Event, ctx: HandlerContext| {
            let (started, token_fired, calls) =
                (started.clone(), token_fired.clone(), calls.clone());
            async move {
                if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                    // Hang; a spawned watcher records that the token fired on expiry.
                    let cancel = ctx.cancel.clone();
                    tokio::spawn(async move {
                        cancel.cancelled().await;
                        token_fired.store(true, Ordering::SeqCst);
                    });
                    started.notify_one();
                    std::future::pending::<()>().await;
                }
                Ok::<(), HandlerError>(())
            }
        }
    })
    .unwrap();

    let clock = s.clock.clone();
    let (report, ()) = tokio::join!(s.drain(&d), async {
        started.notified().await;
        clock.advance(Duration::from_millis(14_999));
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!token_fired.load(Ordering::SeqCst), "timed out before 15 s");
        clock.advance(Duration::from_millis(1));
    });
    assert_eq!((report.failed, report.delivered), (1, 0), "{report:?}");
    let row = &s.store.load_pending(&s.key, 10).await.unwrap()[0];
    let error = row.last_error.as_ref().unwrap();
    assert_eq!(error.name, "Timeout");
    assert_eq!(error.code.as_deref(), Some("TIMEOUT"));
    assert_eq!(
        error.message,
        Timeout {
            after: Duration::from_secs(15)
        }
        .to_string()
    );
    for _ in 0..10 {
        if token_fired.load(Ordering::SeqCst) {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(
        token_fired.load(Ordering::SeqCst),
        "the handler's token did not fire"
    );

    // Held like any failure until its backoff passes, then retried.
    let blocked = s.drain(&d).await;
    assert_eq!(blocked.delivered, 0);
    s.clock.advance(Duration::from_secs(1));
    let retried = s.drain(&d).await;
    assert_eq!((retried.delivered, retried.remaining), (1, 0));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(
        serde_json::to_value(d.counters("")).unwrap(),
        serde_json::json!({"received": 2, "applied": 1, "deduplicated": 0, "skipped": 0, "failed": 1})
    );
}

#[tokio::test]
async fn no_timeout_lets_a_slow_handler_finish() {
    let s = setup(one("a")).await;
    let d = s.dispatcher(DeliveryOptions::default().handler_timeout(None));
    let release = Arc::new(Notify::new());
    d.on({
        let release = release.clone();
        move |_event: Event, _ctx: HandlerContext| {
            let release = release.clone();
            async move {
                release.notified().await;
                Ok::<(), HandlerError>(())
            }
        }
    })
    .unwrap();
    let clock = s.clock.clone();
    let (report, ()) = tokio::join!(s.drain(&d), async {
        clock.advance(Duration::from_secs(3_600));
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        release.notify_one();
    });
    assert_eq!((report.delivered, report.failed), (1, 0));
}

#[tokio::test]
async fn the_parked_record_carries_the_timed_history_version_correlation_and_redactions() {
    let mut e = event(&key(), "e1", 1, "a");
    e.data = Some(
        Json::parse(
            r#"{"id":"a","card":{"number":"4242424242424242","exp":"12/30"},"email":"x@y"}"#,
        )
        .unwrap(),
    );
    let s = setup(vec![e]).await;
    let d = s.dispatcher(
        DeliveryOptions::default()
            .attempts(3)
            .backoff(Backoff::new(
                Duration::from_secs(2),
                1.0,
                Duration::from_secs(2),
            ))
            .handler_version("v7")
            .correlation_id(|event: &Event| Some(format!("order:{}", event.subject)))
            .redact(Redaction::Fields(vec![
                "/card/number".into(),
                "/email".into(),
            ])),
    );
    let calls = Arc::new(AtomicU32::new(0));
    d.on({
        let calls = calls.clone();
        move |_event: Event, ctx: HandlerContext| {
            let call = calls.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                if call == 3 {
                    ctx.set_correlation_id("req-3");
                }
                Err::<(), _>(HandlerError::transient(format!("failure {call}")))
            }
        }
    })
    .unwrap();
    let mut retry_times = Vec::new();
    for _ in 0..3 {
        let report = s.drain(&d).await;
        if let Some(at) = report.next_retry_at {
            retry_times.push(at);
            s.clock.set(at);
        }
    }
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let parked = s.parked().await;
    assert_eq!(parked.len(), 1);
    let row = &parked[0];
    let details = &row.error.details;
    assert_eq!(details.park_reason, Some(ParkReason::AttemptsExhausted));
    assert_eq!(details.classification, Some(FailureClass::Transient));
    assert_eq!(details.handler_version.as_deref(), Some("v7"));
    assert_eq!(
        details.correlation_id.as_deref(),
        Some("req-3"),
        "the id the handler set wins over the options' function"
    );
    let log = details.attempt_log.as_ref().unwrap();
    let shape: Vec<_> = log
        .iter()
        .map(|r| (r.attempt, r.started_at, r.failed_at, r.retry_at))
        .collect();
    let (t1, t2) = (retry_times[0], retry_times[1]);
    assert!((T0..=T0 + 2_000).contains(&t1) && (t1..=t1 + 2_000).contains(&t2));
    assert_eq!(
        shape,
        vec![
            (1, Some(T0), Some(T0), Some(t1)),
            (2, Some(t1), Some(t1), Some(t2)),
            (3, Some(t2), Some(t2), None),
        ]
    );
    assert_eq!(
        log.iter()
            .map(|r| r.error.message.as_str())
            .collect::<Vec<_>>(),
        ["failure 1", "failure 2", "failure 3"]
    );
    // The parked copy is redacted; the classic history is still there.
    assert_eq!(
        details.redacted.as_deref(),
        Some(&["/data/card/number".to_owned(), "/data/email".to_owned()][..])
    );
    let data = row
        .event
        .as_ref()
        .unwrap()
        .data
        .as_ref()
        .unwrap()
        .to_value();
    assert_eq!(data["card"]["number"], "[redacted]");
    assert_eq!(data["email"], "[redacted]");
    assert_eq!(data["card"]["exp"], "12/30");
    assert_eq!(row.error.history.as_ref().map(Vec::len), Some(2));

    // The options' function is used when the handler sets nothing; the whole payload can go.
    let s = setup(one("b")).await;
    let d = s.dispatcher(
        DeliveryOptions::default()
            .correlation_id(|event: &Event| Some(format!("order:{}", event.subject)))
            .redact(Redaction::Payload),
    );
    d.on(|_e: Event, _c: HandlerContext| async { Err::<(), _>(HandlerError::permanent("no")) })
        .unwrap();
    s.drain(&d).await;
    let row = &s.parked().await[0];
    assert_eq!(row.error.details.correlation_id.as_deref(), Some("order:b"));
    assert!(row.event.as_ref().unwrap().data.is_none());
    assert_eq!(
        row.error.details.redacted.as_deref(),
        Some(&["data".to_owned()][..])
    );
}

#[test]
fn parked_errors_stay_backward_compatible_json() {
    // A record written before the new fields reads back with all of them empty ...
    let old = r#"{"name":"HandlerError","message":"boom","history":[{"name":"HandlerError","message":"boom"}]}"#;
    let parsed: ParkedError = serde_json::from_str(old).unwrap();
    assert!(parsed.details.is_empty());
    // ... and writes back byte for byte.
    assert_eq!(serde_json::to_string(&parsed).unwrap(), old);
    // New fields are flat, optional keys.
    let mut with = parsed.clone();
    with.details.park_reason = Some(ParkReason::Permanent);
    with.details.handler_version = Some("v1".into());
    let text = serde_json::to_string(&with).unwrap();
    assert!(text.contains(r#""parkReason":"permanent""#), "{text}");
    assert!(text.contains(r#""handlerVersion":"v1""#), "{text}");
    assert!(!text.contains("correlationId"), "{text}");
    let back: ParkedError = serde_json::from_str(&text).unwrap();
    assert_eq!(back, with);
}

#[tokio::test]
async fn counters_follow_what_handlers_report() {
    let mut events: Vec<Event> = (1..=4)
        .map(|n| event(&key(), &format!("e{n}"), n, &format!("s{n}")))
        .collect();
    events[3].lane = Lane::Replay;
    let s = setup(events).await;
    let d = s.dispatcher(DeliveryOptions::default().concurrency(4));
    let seen = Arc::new(Mutex::new(Vec::new()));
    d.on(LiveOnly::new({
        let seen = seen.clone();
        move |event: Event, ctx: HandlerContext| {
            seen.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(event.id.clone());
            async move {
                match event.id.as_str() {
                    "e1" => ctx.report(DeliveryOutcome::Applied),
                    "e2" => ctx.mark_deduplicated(),
                    _ => {}
                }
                Ok::<(), HandlerError>(())
            }
        }
    }))
    .unwrap();
    let report = s.drain(&d).await;
    assert_eq!(report.delivered, 4);
    let mut seen = seen.lock().unwrap_or_else(PoisonError::into_inner).clone();
    seen.sort();
    assert_eq!(
        seen,
        ["e1", "e2", "e3"],
        "the replayed event reached the handler"
    );
    assert_eq!(
        serde_json::to_value(d.counters("")).unwrap(),
        serde_json::json!({"received": 4, "applied": 2, "deduplicated": 1, "skipped": 1, "failed": 0})
    );
    assert_eq!(d.counters("other-partition"), DeliveryCounters::default());
}
