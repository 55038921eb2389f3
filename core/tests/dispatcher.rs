//! Dispatcher behaviour that does not depend on the store: panics, acknowledgement modes,
//! consumer exclusivity, halting, lease loss, error classification and option validation.
//! Runs on `MemoryStore` with a manual clock; nothing sleeps.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use watukuy_conformance::cases::fixtures::{NODE_B, TTL, event, key};
use watukuy_core::{
    DeliveryOptions, Error, ErrorCode, Event, HandlerContext, HandlerError,
    backoff::Backoff,
    clock::{Clock, ManualClock},
    delivery::{AckMode, Dispatcher, DrainContext, PoisonAction},
    rng::SeededRng,
    store::{Lease, PKey, ParkedQuery, Store},
};
use watukuy_store_memory::MemoryStore;
use watukuy_testkit::T0;

mod common;
use common::Setup;

async fn setup(subjects: &[&str]) -> Setup {
    let key = key();
    let events = subjects.iter().zip(1..);
    Setup::with_events(
        events
            .map(|(s, seq)| event(&key, &format!("e{seq}"), seq, s))
            .collect(),
    )
    .await
}

impl Setup {
    async fn drain(
        &self,
        d: &Dispatcher,
    ) -> watukuy_core::Result<watukuy_core::delivery::DrainReport> {
        d.drain(&self.key, &self.lease, &DrainContext::default())
            .await
    }
}

fn config_option(err: Error) -> String {
    assert_eq!(err.code(), ErrorCode::Config, "{err}");
    match err {
        Error::Config { option, .. } => option,
        other => panic!("not a config error: {other}"),
    }
}

#[test]
fn invalid_options_are_rejected_when_built_naming_the_option() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let build = |options: DeliveryOptions, batch: usize| {
        Dispatcher::new(
            "orders",
            store.clone(),
            Arc::new(ManualClock::new(0)),
            Arc::new(SeededRng::new(1)),
            options,
            batch,
        )
    };
    let backwards = Backoff::new(Duration::from_secs(10), 2.0, Duration::from_secs(1));
    assert_eq!(
        config_option(build(DeliveryOptions::default().concurrency(0), 100).unwrap_err()),
        "delivery.concurrency"
    );
    assert_eq!(
        config_option(build(DeliveryOptions::default().attempts(0), 100).unwrap_err()),
        "delivery.retry.attempts"
    );
    assert_eq!(
        config_option(build(DeliveryOptions::default().backoff(backwards), 100).unwrap_err()),
        "delivery.retry.backoff.max"
    );
    assert_eq!(
        config_option(build(DeliveryOptions::default(), 0).unwrap_err()),
        "dispatch_batch_size"
    );
}

#[tokio::test]
async fn a_panicking_handler_is_a_failed_attempt_not_a_crashed_dispatcher() {
    let s = setup(&["a", "b"]).await;
    let d = s.dispatcher(DeliveryOptions::default());
    d.on(|event: Event, _ctx: HandlerContext| async move {
        assert!(event.subject != "a", "cannot handle {}", event.subject);
        Ok::<(), HandlerError>(())
    })
    .unwrap();
    let report = s.drain(&d).await.unwrap();
    assert_eq!((report.delivered, report.failed), (1, 1));
    let row = &s.store.load_pending(&s.key, 10).await.unwrap()[0];
    assert_eq!(row.event_id, "e1");
    let message = &row.last_error.as_ref().unwrap().message;
    assert!(
        message.starts_with("handler panicked: cannot handle a"),
        "{message}"
    );
}

#[tokio::test]
async fn manual_ack_is_required_and_a_late_ack_has_no_effect() {
    let s = setup(&["a", "b"]).await;
    let d = s.dispatcher(DeliveryOptions::default().ack_mode(AckMode::Manual));
    let kept: Arc<Mutex<Option<HandlerContext>>> = Arc::default();
    d.on({
        let kept = kept.clone();
        move |event: Event, ctx: HandlerContext| {
            let kept = kept.clone();
            async move {
                if event.subject == "a" {
                    // Returns without acknowledging; keeps the context to ack too late.
                    *kept.lock().unwrap() = Some(ctx);
                } else {
                    assert!(ctx.ack());
                }
                Ok::<(), HandlerError>(())
            }
        }
    })
    .unwrap();
    let report = s.drain(&d).await.unwrap();
    assert_eq!((report.delivered, report.failed), (1, 1));
    let late = kept.lock().unwrap().take().unwrap();
    assert!(
        !late.ack(),
        "an ack after the handler returned has no effect"
    );
    let row = &s.store.load_pending(&s.key, 10).await.unwrap()[0];
    assert_eq!(row.event_id, "e1");
    assert_eq!(
        row.last_error.as_ref().unwrap().message,
        "handler returned without calling ctx.ack() (ack_mode is manual)"
    );
}

#[tokio::test]
async fn on_and_subscribe_are_exclusive_and_events_wait_without_a_consumer() {
    let s = setup(&["a", "b"]).await;
    let d = s.dispatcher(DeliveryOptions::default());
    let report = s.drain(&d).await.unwrap();
    assert!(report.no_consumer);
    assert_eq!(
        (report.delivered, report.remaining),
        (0, 2),
        "events wait in the outbox"
    );

    let handle = d
        .on(|_: Event, _: HandlerContext| async { Ok::<(), HandlerError>(()) })
        .unwrap();
    assert_eq!(config_option(d.subscribe().unwrap_err()), "on/subscribe");
    assert_eq!(
        config_option(
            d.on(|_: Event, _: HandlerContext| async { Ok::<(), HandlerError>(()) })
                .unwrap_err()
        ),
        "on/subscribe"
    );
    handle.unsubscribe();
    assert!(!d.has_consumer());
    let subscription = d.subscribe().unwrap();
    assert!(
        d.on(|_: Event, _: HandlerContext| async { Ok::<(), HandlerError>(()) })
            .is_err()
    );
    drop(subscription);
    assert!(!d.has_consumer(), "dropping the subscription detaches it");
}

#[tokio::test]
async fn halt_parks_and_stops_the_whole_drain() {
    let s = setup(&["a", "b", "c"]).await;
    let d = s.dispatcher(
        DeliveryOptions::default()
            .attempts(1)
            .poison(PoisonAction::Halt),
    );
    d.on(|event: Event, _: HandlerContext| async move {
        if event.subject == "b" {
            Err(HandlerError::from("poison"))
        } else {
            Ok(())
        }
    })
    .unwrap();
    let report = s.drain(&d).await.unwrap();
    assert!(report.halted);
    assert_eq!(
        (report.delivered, report.parked, report.remaining),
        (1, 1, 1),
        "c is not delivered after a halt"
    );
    let parked = s
        .store
        .list_parked(&s.key, ParkedQuery::default())
        .await
        .unwrap();
    assert_eq!(parked[0].id, "e2");
}

#[tokio::test]
async fn permanent_errors_park_at_once_and_retry_after_waits_as_told() {
    let s = setup(&["a", "b"]).await;
    let d = s.dispatcher(DeliveryOptions::default().attempts(5).hold_key(false));
    d.on(|event: Event, _: HandlerContext| async move {
        match event.subject.as_str() {
            "a" => Err(HandlerError::permanent("schema mismatch")),
            _ => Err(HandlerError::retry_after(
                Duration::from_secs(42),
                "rate limited",
            )),
        }
    })
    .unwrap();
    let report = s.drain(&d).await.unwrap();
    assert_eq!((report.parked, report.failed), (1, 1));
    let parked = s
        .store
        .list_parked(&s.key, ParkedQuery::default())
        .await
        .unwrap();
    assert_eq!(
        (
            parked[0].id.as_str(),
            parked[0].attempts,
            parked[0].hold_key.as_deref()
        ),
        ("e1", 1, None)
    );
    assert_eq!(report.next_retry_at, Some(s.clock.now_ms() + 42_000));
}

#[tokio::test]
async fn lease_loss_fails_the_drain_and_cancels_in_flight_handlers() {
    let s = setup(&["slow", "fast"]).await;
    s.store
        .acquire_lease(&s.key, NODE_B, TTL, T0 + TTL)
        .await
        .unwrap()
        .unwrap();
    let d = s.dispatcher(DeliveryOptions::default().concurrency(2));
    let token: Arc<Mutex<Option<CancellationToken>>> = Arc::default();
    d.on({
        let token = token.clone();
        move |event: Event, ctx: HandlerContext| {
            let token = token.clone();
            async move {
                if event.subject == "slow" {
                    *token.lock().unwrap() = Some(ctx.cancel.clone());
                    ctx.cancel.cancelled().await;
                }
                Ok::<(), HandlerError>(())
            }
        }
    })
    .unwrap();
    let err = s.drain(&d).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::LeaseLost, "{err}");
    let token = token
        .lock()
        .unwrap()
        .take()
        .expect("the slow handler started");
    assert!(
        token.is_cancelled(),
        "in-flight handlers are told the lease is gone"
    );
    assert_eq!(
        s.store.counts(&s.key).await.map(|c| c.pending).unwrap(),
        2,
        "nothing was acknowledged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_of_different_keys_share_store_calls_without_reordering_a_key() {
    use watukuy_testkit::{FaultyStore, Op};
    // 8 keys × 4 events, interleaved, 8 keys in flight.
    let subjects: Vec<String> = (0..32).map(|i| format!("k{}", i % 8)).collect();
    let refs: Vec<&str> = subjects.iter().map(String::as_str).collect();
    let s = setup(&refs).await;
    let faulty = Arc::new(FaultyStore::new(s.store.clone()));
    let d = s.dispatcher_over(faulty.clone(), DeliveryOptions::default().concurrency(8));
    let seen: Arc<Mutex<Vec<(String, i64)>>> = Arc::default();
    d.on({
        let seen = seen.clone();
        move |event: Event, _ctx: HandlerContext| {
            let seen = seen.clone();
            async move {
                tokio::task::yield_now().await;
                seen.lock()
                    .unwrap()
                    .push((event.subject.to_string(), event.sequence));
                Ok::<(), HandlerError>(())
            }
        }
    })
    .unwrap();
    let report = d
        .drain(&s.key, &s.lease, &DrainContext::default())
        .await
        .unwrap();
    assert_eq!(report.delivered, 32);
    assert_eq!(s.store.counts(&s.key).await.map(|c| c.pending).unwrap(), 0);
    let calls = faulty.calls(Op::AckEvents);
    assert!(
        calls <= 16,
        "acks of concurrent keys are coalesced: {calls} store calls for 32 events"
    );
    println!("{calls} ack calls for 32 events over 8 keys");
    let seen = seen.lock().unwrap().clone();
    for k in 0..8 {
        let key = format!("k{k}");
        let order: Vec<i64> = seen
            .iter()
            .filter(|(s, _)| *s == key)
            .map(|(_, q)| *q)
            .collect();
        assert!(
            order.windows(2).all(|w| w[0] < w[1]),
            "{key} out of order: {order:?}"
        );
        assert_eq!(order.len(), 4);
    }
}

/// A drain reads the held keys with its first slice, loads each slice once, and knows what is
/// left without counting when its last slice was not full: store round trips are what bound
/// throughput.
#[tokio::test]
async fn a_drain_reads_the_store_once_per_slice() {
    use watukuy_testkit::{FaultyStore, Op};
    // `n` events of distinct keys drained through a counting store by a handler that succeeds.
    async fn drained(n: u64) -> Arc<FaultyStore<dyn Store>> {
        let subjects: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
        let refs: Vec<&str> = subjects.iter().map(String::as_str).collect();
        let s = setup(&refs).await;
        let faulty: Arc<FaultyStore<dyn Store>> = Arc::new(FaultyStore::new(s.store.clone()));
        let d = s.dispatcher_over(faulty.clone(), DeliveryOptions::default());
        d.on(|_event: Event, _ctx: HandlerContext| async { Ok::<(), HandlerError>(()) })
            .unwrap();
        let report = s.drain(&d).await.unwrap();
        assert_eq!((report.delivered, report.remaining), (n, 0));
        faulty
    }
    let faulty = drained(250).await;
    assert_eq!(
        (
            faulty.calls(Op::LoadPending),
            faulty.calls(Op::HeldKeys),
            faulty.calls(Op::Counts)
        ),
        (3, 0, 0),
        "slices of 101, 101 and 48: one load each, the held keys with the first, no count"
    );

    // Exactly one slice of rows: the extra row the load asks for is not there, so the drain
    // knows it is done without a second read.
    let faulty = drained(100).await;
    assert_eq!(
        faulty.calls(Op::LoadPending),
        1,
        "one read for a page of 100"
    );

    // A key waiting for a retry keeps its rows pending, and `remaining` says so without a count.
    let s = setup(&["a", "b", "a", "c"]).await;
    let faulty = Arc::new(FaultyStore::new(s.store.clone()));
    let d = s.dispatcher_over(faulty.clone(), DeliveryOptions::default());
    d.on(|event: Event, _ctx: HandlerContext| async move {
        if event.subject == "a" {
            Err(HandlerError::transient("a is down"))
        } else {
            Ok(())
        }
    })
    .unwrap();
    let report = s.drain(&d).await.unwrap();
    assert_eq!(
        (report.delivered, report.failed, report.remaining),
        (2, 1, 2)
    );
    assert_eq!(
        report.remaining,
        s.store.counts(&s.key).await.map(|c| c.pending).unwrap()
    );
    assert_eq!(faulty.calls(Op::Counts), 0);
}

/// Records the ids of every `ack_events` call, and a log that handlers may write to as well.
#[derive(Default)]
struct AckCalls {
    calls: Mutex<Vec<Vec<String>>>,
    log: Mutex<Vec<String>>,
}

impl AckCalls {
    fn log(&self, line: String) {
        self.log.lock().unwrap().push(line);
    }

    fn calls(&self) -> Vec<Vec<String>> {
        self.calls.lock().unwrap().clone()
    }
}

#[async_trait::async_trait]
impl watukuy_testkit::Defect<MemoryStore> for AckCalls {
    async fn ack_events(
        &self,
        inner: &MemoryStore,
        key: &PKey,
        lease: &Lease,
        ids: &[String],
    ) -> watukuy_core::Result<()> {
        self.calls.lock().unwrap().push(ids.to_vec());
        let result = inner.ack_events(key, lease, ids).await;
        for id in ids {
            self.log(format!("ack {id}"));
        }
        result
    }
}

fn windowed(s: &Setup, options: DeliveryOptions) -> (Dispatcher, Arc<AckCalls>) {
    let calls = Arc::new(AckCalls::default());
    let store = watukuy_testkit::FaultyStore::new(s.store.clone()).with_defect(calls.clone());
    (s.dispatcher_over(Arc::new(store), options), calls)
}

#[tokio::test]
async fn an_ack_window_flushes_many_keys_at_once_but_never_two_events_of_one_key() {
    // 100 keys × 2 events (event `e{n}` has subject `k{(n-1) % 100}`); 4 handlers at once, a
    // window of 100.
    let subjects: Vec<String> = (0..200).map(|i| format!("k{}", i % 100)).collect();
    let refs: Vec<&str> = subjects.iter().map(String::as_str).collect();
    let s = setup(&refs).await;
    let (d, calls) = windowed(
        &s,
        DeliveryOptions::default()
            .concurrency(4)
            .ack_window(100, Duration::from_secs(1)),
    );
    d.on({
        let calls = calls.clone();
        move |event: Event, _: HandlerContext| {
            let calls = calls.clone();
            async move {
                tokio::task::yield_now().await;
                calls.log(format!("deliver {}", event.id));
                Ok::<(), HandlerError>(())
            }
        }
    })
    .unwrap();
    let report = s.drain(&d).await.unwrap();
    assert_eq!((report.delivered, report.remaining), (200, 0));
    let sizes: Vec<usize> = calls.calls().iter().map(Vec::len).collect();
    assert!(
        sizes.len() <= 3 && sizes.contains(&100),
        "the first events of 100 keys share one flush, not one per handler turn: {sizes:?}"
    );
    let key_of = |id: &str| (id[1..].parse::<u64>().unwrap() - 1) % 100;
    for call in &calls.calls() {
        let keys: std::collections::HashSet<u64> = call.iter().map(|id| key_of(id)).collect();
        assert_eq!(keys.len(), call.len(), "two events of one key in {call:?}");
    }
    let log = calls.log.lock().unwrap().clone();
    let at = |line: String| log.iter().position(|l| *l == line).unwrap();
    for n in 1..=100 {
        assert!(
            at(format!("ack e{n}")) < at(format!("deliver e{}", n + 100)),
            "k{}'s second event was delivered before its first was acknowledged",
            n - 1
        );
    }
}

#[tokio::test]
async fn an_ack_window_flushes_after_its_delay_while_a_handler_keeps_running() {
    let s = setup(&["slow", "fast"]).await;
    let (d, calls) = windowed(
        &s,
        DeliveryOptions::default()
            .concurrency(2)
            .handler_timeout(None)
            .ack_window(100, Duration::from_millis(50)),
    );
    let release = Arc::new(tokio::sync::Notify::new());
    d.on({
        let release = release.clone();
        move |event: Event, _: HandlerContext| {
            let release = release.clone();
            async move {
                if event.subject == "slow" {
                    release.notified().await;
                }
                Ok::<(), HandlerError>(())
            }
        }
    })
    .unwrap();
    let d = Arc::new(d);
    let drain = tokio::spawn({
        let (d, key, lease) = (d.clone(), s.key.clone(), s.lease.clone());
        async move { d.drain(&key, &lease, &DrainContext::default()).await }
    });
    let settle = || async {
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
    };
    settle().await;
    s.clock.advance(Duration::from_millis(49));
    settle().await;
    assert!(
        calls.calls().is_empty(),
        "fast's ack waits for the window while slow still runs"
    );
    s.clock.advance(Duration::from_millis(1));
    settle().await;
    assert_eq!(
        calls.calls(),
        [vec!["e2".to_owned()]],
        "50 ms later fast's ack is flushed alone"
    );
    assert_eq!(s.store.counts(&s.key).await.unwrap().pending, 1);
    release.notify_one();
    let report = drain.await.unwrap().unwrap();
    assert_eq!((report.delivered, report.remaining), (2, 0));
    assert_eq!(calls.calls().len(), 2);
}
