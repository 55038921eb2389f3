//! The manager's behaviour under tokio's paused clock (and a manual clock): the pinned bucket
//! examples, fairness, lane priority, wait limits and cancellation, and guarantee G6. Time only moves when every task waits, so grant times are exact.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::*;
use crate::clock::{Clock, ManualClock, TokioClock};
use crate::error::{Error, ErrorCode};
use crate::model::Lane;

type Log = Arc<Mutex<Vec<(String, i64)>>>;

fn manager(policy: BudgetPolicy) -> (Arc<BudgetManager>, Arc<TokioClock>) {
    let clock = Arc::new(TokioClock::starting_at(0));
    let manager = BudgetManager::new(Arc::new(MemoryBudgetStore::new()), clock.clone())
        .with_budget("api", policy)
        .unwrap();
    (Arc::new(manager), clock)
}

fn per_second(requests: u64) -> BudgetPolicy {
    BudgetPolicy::new(requests, Duration::from_secs(1))
}

/// Spawns a requester asking `count` times, logging `(requester, grant time)`.
fn spawn_requester(
    manager: &Arc<BudgetManager>,
    clock: &Arc<TokioClock>,
    log: &Log,
    request: Request,
    count: usize,
) -> tokio::task::JoinHandle<()> {
    let (manager, clock, log) = (manager.clone(), clock.clone(), log.clone());
    tokio::spawn(async move {
        for _ in 0..count {
            manager.acquire("api", request.clone()).await.unwrap();
            let at = clock.now_ms();
            log.lock().unwrap().push((request.requester.clone(), at));
        }
    })
}

/// Lets spawned tasks run until they all wait (paused time does not move meanwhile).
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// Drains the bucket at t=0 so every later request has to wait.
async fn drain(manager: &BudgetManager, tokens: u64) {
    manager
        .acquire("api", Request::new("drain/x").with_cost(tokens))
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn round_robin_interleaves_two_requesters() {
    let (manager, clock) = manager(per_second(1));
    let log = Log::default();
    let a = spawn_requester(&manager, &clock, &log, Request::new("p/a"), 6);
    let b = spawn_requester(&manager, &clock, &log, Request::new("p/b"), 6);
    a.await.unwrap();
    b.await.unwrap();
    let log = log.lock().unwrap().clone();
    let who: Vec<&str> = log.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(
        who,
        [
            "p/a", "p/b", "p/a", "p/b", "p/a", "p/b", "p/a", "p/b", "p/a", "p/b", "p/a", "p/b"
        ]
    );
    let times: Vec<i64> = log.iter().map(|(_, t)| *t).collect();
    assert_eq!(times, (0..12).map(|s| s * 1000).collect::<Vec<_>>());
    assert_eq!(manager.active_drivers(), 0);
}

#[tokio::test(start_paused = true)]
async fn weighted_three_to_one_gives_about_three_quarters() {
    let (manager, clock) = manager(per_second(1).with_fairness(Fairness::Weighted));
    let log = Log::default();
    let heavy = spawn_requester(
        &manager,
        &clock,
        &log,
        Request::new("p/heavy").with_weight(3.0),
        60,
    );
    let light = spawn_requester(&manager, &clock, &log, Request::new("p/light"), 60);
    heavy.await.unwrap();
    light.await.unwrap();
    let log = log.lock().unwrap().clone();
    let heavy_share = log[..60].iter().filter(|(r, _)| r == "p/heavy").count();
    assert!(
        (42..=48).contains(&heavy_share),
        "heavy got {heavy_share} of 60"
    );
}

#[tokio::test(start_paused = true)]
async fn a_late_requester_starts_at_the_minimum_and_cannot_monopolize() {
    let (manager, clock) = manager(per_second(1).with_fairness(Fairness::Weighted));
    let log = Log::default();
    let early = spawn_requester(&manager, &clock, &log, Request::new("p/early"), 30);
    // `early` is served alone for 10 s before `late` shows up.
    clock.sleep_until(9_500).await;
    let late = spawn_requester(&manager, &clock, &log, Request::new("p/late"), 30);
    clock.sleep_until(29_500).await;
    let next: Vec<String> = log.lock().unwrap()[10..30]
        .iter()
        .map(|(r, _)| r.clone())
        .collect();
    let late_share = next.iter().filter(|r| *r == "p/late").count();
    assert!(
        (9..=11).contains(&late_share),
        "late got {late_share} of 20: {next:?}"
    );
    assert!(
        next.windows(3).all(|w| !(w[0] == w[1] && w[1] == w[2])),
        "nobody is served three times in a row: {next:?}"
    );
    early.await.unwrap();
    late.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn lanes_are_served_live_then_reconcile_then_backfill_then_replay() {
    let (manager, clock) = manager(per_second(1));
    drain(&manager, 1).await;
    let log = Log::default();
    let tasks: Vec<_> = [Lane::Replay, Lane::Backfill, Lane::Reconcile, Lane::Live]
        .into_iter()
        .map(|lane| {
            let request = Request::new(lane.as_str()).with_lane(lane);
            spawn_requester(&manager, &clock, &log, request, 1)
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(
        log.lock().unwrap().clone(),
        [
            ("live".to_owned(), 1000),
            ("reconcile".to_owned(), 2000),
            ("backfill".to_owned(), 3000),
            ("replay".to_owned(), 4000)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn the_head_is_never_skipped_for_a_smaller_request() {
    let (manager, clock) = manager(per_second(1).with_burst(3));
    drain(&manager, 3).await;
    let log = Log::default();
    let big = spawn_requester(
        &manager,
        &clock,
        &log,
        Request::new("p/big").with_cost(3),
        1,
    );
    settle().await;
    let small = spawn_requester(&manager, &clock, &log, Request::new("p/small"), 1);
    big.await.unwrap();
    small.await.unwrap();
    assert_eq!(
        log.lock().unwrap().clone(),
        [("p/big".to_owned(), 3000), ("p/small".to_owned(), 4000)]
    );
}

#[tokio::test(start_paused = true)]
async fn max_wait_zero_fails_fast() {
    let (manager, clock) = manager(per_second(1).with_burst(2));
    let now = Request::new("p/a").with_max_wait(Duration::ZERO);
    // Tokens available right now: granted.
    assert_eq!(
        manager.acquire("api", now.clone()).await.unwrap(),
        Grant { waited_ms: 0 }
    );
    drain(&manager, 1).await;
    let err = manager.acquire("api", now.clone()).await.unwrap_err();
    assert!(
        matches!(&err, Error::BudgetTimeout { budget, waited_ms: 0 } if budget == "api"),
        "{err}"
    );
    assert_eq!(err.code(), ErrorCode::BudgetTimeout);

    // Behind a waiting request it fails at once too, and the waiter is unaffected.
    let log = Log::default();
    let waiter = spawn_requester(&manager, &clock, &log, Request::new("p/b"), 1);
    settle().await;
    assert_eq!(manager.waiting("api"), 1);
    let err = manager.acquire("api", now).await.unwrap_err();
    assert!(
        matches!(err, Error::BudgetTimeout { waited_ms: 0, .. }),
        "{err}"
    );
    assert_eq!(clock.now_ms(), 0);
    waiter.await.unwrap();
    assert_eq!(log.lock().unwrap().clone(), [("p/b".to_owned(), 1000)]);
}

#[tokio::test(start_paused = true)]
async fn the_policy_max_wait_applies_unless_the_request_sets_its_own() {
    let (manager, clock) = manager(per_second(1).with_max_wait(Duration::ZERO));
    drain(&manager, 1).await;
    let err = manager
        .acquire("api", Request::new("p/a"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::BudgetTimeout { waited_ms: 0, .. }),
        "{err}"
    );
    let grant = manager
        .acquire(
            "api",
            Request::new("p/a").with_max_wait(Duration::from_secs(5)),
        )
        .await
        .unwrap();
    assert_eq!(grant, Grant { waited_ms: 1000 });
    assert_eq!(clock.now_ms(), 1000);
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_waiter_does_not_block_others() {
    let (manager, clock) = manager(per_second(1));
    drain(&manager, 1).await;
    // The live request is the head, and needs 100 tokens: it would wait 100 s.
    let head = {
        let manager = manager.clone();
        tokio::spawn(async move {
            let request = Request::new("p/big")
                .with_cost(100)
                .with_max_wait(Duration::from_millis(2_500));
            manager.acquire("api", request).await
        })
    };
    settle().await;
    let log = Log::default();
    let other = Request::new("p/small").with_lane(Lane::Replay);
    let other = spawn_requester(&manager, &clock, &log, other, 1);
    let err = head.await.unwrap().unwrap_err();
    assert!(
        matches!(
            err,
            Error::BudgetTimeout {
                waited_ms: 2_500,
                ..
            }
        ),
        "{err}"
    );
    other.await.unwrap();
    assert_eq!(log.lock().unwrap().clone(), [("p/small".to_owned(), 2_500)]);
    assert_eq!(manager.active_drivers(), 0);
}

#[tokio::test(start_paused = true)]
async fn timeouts_are_measured_from_the_request() {
    let (manager, _clock) = manager(per_second(1));
    drain(&manager, 1).await;
    // Waits for 400 ms although the budget's timer is set for 1000 ms.
    let err = manager
        .acquire(
            "api",
            Request::new("p/a").with_max_wait(Duration::from_millis(400)),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::BudgetTimeout { waited_ms: 400, .. }),
        "{err}"
    );
    assert_eq!(manager.waiting("api"), 0);
    assert_eq!(manager.active_drivers(), 0);
}

#[tokio::test(start_paused = true)]
async fn cancellation_withdraws_the_request_and_others_go_on() {
    let (manager, clock) = manager(per_second(1));
    drain(&manager, 1).await;
    let cancel = CancellationToken::new();
    let cancelled = {
        let (manager, cancel) = (manager.clone(), cancel.clone());
        tokio::spawn(async move {
            let request = Request::new("p/a").with_cancel(cancel);
            manager.acquire("api", request).await
        })
    };
    settle().await;
    let log = Log::default();
    let other = spawn_requester(&manager, &clock, &log, Request::new("p/b"), 1);
    clock.sleep_until(300).await;
    cancel.cancel();
    let err = cancelled.await.unwrap().unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotRunning, "{err}");
    assert_eq!(clock.now_ms(), 300);
    assert_eq!(manager.waiting("api"), 1);
    other.await.unwrap();
    assert_eq!(log.lock().unwrap().clone(), [("p/b".to_owned(), 1000)]);

    // Already cancelled: refused without touching the budget.
    let err = manager
        .acquire("api", Request::new("p/c").with_cancel(cancel))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotRunning);
    assert_eq!(clock.now_ms(), 1000);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_request_leaves_the_queue() {
    let (manager, clock) = manager(per_second(1));
    drain(&manager, 1).await;
    tokio::select! {
        _ = manager.acquire("api", Request::new("p/a")) => panic!("no token before 1 s"),
        () = clock.sleep_until(500) => {}
    }
    assert_eq!(manager.waiting("api"), 0);
    settle().await;
    assert_eq!(
        manager.active_drivers(),
        0,
        "the driver ends with its queue"
    );
    assert_eq!(alive_tasks(), 0);
    // The budget still works, and the abandoned request took nothing.
    let grant = manager.acquire("api", Request::new("p/b")).await.unwrap();
    assert_eq!((grant.waited_ms, clock.now_ms()), (500, 1000));
}

/// G6: two requesters share `2 per 10s` for 6 requests: exactly 6 grants, and no window of
/// `per` ever sees more than the bucket allows.
#[tokio::test(start_paused = true)]
async fn g6_two_per_ten_seconds_is_never_exceeded() {
    let policy = BudgetPolicy::new(2, Duration::from_secs(10));
    let (manager, clock) = manager(policy);
    let log = Log::default();
    let a = spawn_requester(&manager, &clock, &log, Request::new("p/a"), 3);
    let b = spawn_requester(&manager, &clock, &log, Request::new("p/b"), 3);
    a.await.unwrap();
    b.await.unwrap();
    let times: Vec<i64> = log.lock().unwrap().iter().map(|(_, t)| *t).collect();
    assert_eq!(times.len(), 6);
    // A window of `per` ms (both ends included) holds at most the bucket's content at its start
    // (`burst`) plus what refills during it (`requests · window / per`).
    let per_ms = policy.per_ms();
    let bound = policy.burst() + policy.requests;
    for &start in &times {
        let end = start + i64::try_from(per_ms).unwrap();
        let inside = times.iter().filter(|&&t| t >= start && t <= end).count();
        assert!(
            u64::try_from(inside).unwrap() <= bound,
            "{inside} grants in [{start}, {end}]: {times:?}"
        );
    }
    // The requests had to wait for virtual time, and the bucket's schedule is exact.
    assert_eq!(times, [0, 0, 5_000, 10_000, 15_000, 20_000]);
    settle().await;
    assert_eq!(manager.active_drivers(), 0);
    assert_eq!(alive_tasks(), 0, "no driver (and so no timer) remains");
}

#[tokio::test(start_paused = true)]
async fn cost_zero_is_granted_without_touching_the_budget() {
    let (manager, _clock) = manager(per_second(1));
    drain(&manager, 1).await;
    let grant = manager
        .acquire("api", Request::new("p/a").with_cost(0))
        .await
        .unwrap();
    assert_eq!(grant, Grant { waited_ms: 0 });
    assert_eq!(manager.active_drivers(), 0);
}

#[tokio::test(start_paused = true)]
async fn bad_requests_are_config_errors() {
    /// `result` failed with a configuration error naming `option`.
    fn names<T: std::fmt::Debug>(result: Result<T, Error>, option: &str) {
        let err = result.expect_err("a configuration error");
        assert_eq!(err.config_option(), Some(option), "{err}");
    }
    let (manager, _clock) = manager(per_second(1));
    names(manager.acquire("nope", Request::new("p/a")).await, "budget");
    for weight in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let request = Request::new("p/a").with_weight(weight);
        names(manager.acquire("api", request).await, "budget_weight");
    }
    let request = Request::new("p/a").with_cost(u64::MAX);
    names(manager.acquire("api", request).await, "budget_cost");
    let fresh = || {
        BudgetManager::new(
            Arc::new(MemoryBudgetStore::new()),
            Arc::new(TokioClock::starting_at(0)),
        )
    };
    let twice = fresh().with_budget("api", per_second(1)).unwrap();
    names(twice.with_budget("api", per_second(2)), "budgets.api");
    names(
        fresh().with_budget("api", per_second(0)),
        "budgets.api.requests",
    );
}

#[tokio::test]
async fn next_refill_at_tells_a_daemon_when_to_wake() {
    let clock = Arc::new(ManualClock::new(10_000));
    let manager = Arc::new(
        BudgetManager::new(Arc::new(MemoryBudgetStore::new()), clock.clone())
            .with_budget("api", per_second(2).with_burst(1))
            .unwrap(),
    );
    assert_eq!(manager.names().collect::<Vec<_>>(), ["api"]);
    assert!(manager.contains("api"));
    assert_eq!(manager.policy("api").map(BudgetPolicy::burst), Some(1));
    assert_eq!(manager.next_refill_at("api"), None);
    assert_eq!(manager.ready_in_ms("api", 1).await.unwrap(), 0);
    drain(&manager, 1).await;
    assert_eq!(manager.ready_in_ms("api", 1).await.unwrap(), 500);
    let waiter = {
        let manager = manager.clone();
        tokio::spawn(async move { manager.acquire("api", Request::new("p/a")).await })
    };
    while manager.next_refill_at("api").is_none() {
        tokio::task::yield_now().await;
    }
    assert_eq!(manager.next_refill_at("api"), Some(10_500));
    assert_eq!(manager.waiting("api"), 1);
    // The queue's next refill bounds the estimate for anyone else.
    assert_eq!(manager.ready_in_ms("api", 1).await.unwrap(), 500);
    clock.advance(Duration::from_millis(499));
    settle().await;
    assert!(!waiter.is_finished());
    clock.advance(Duration::from_millis(1));
    assert_eq!(waiter.await.unwrap().unwrap(), Grant { waited_ms: 500 });
    assert_eq!(manager.next_refill_at("api"), None);
    settle().await;
    assert_eq!(manager.active_drivers(), 0);
}

/// A store that fails every take after the first.
struct BrokenStore(MemoryBudgetStore, Mutex<u32>);

#[async_trait::async_trait]
impl BudgetStore for BrokenStore {
    async fn take(
        &self,
        name: &str,
        cost: u64,
        policy: &BucketPolicy,
        now_ms: i64,
    ) -> crate::Result<Take> {
        let calls = {
            let mut calls = self.1.lock().unwrap();
            *calls += 1;
            *calls
        };
        if calls == 1 {
            self.0.take(name, cost, policy, now_ms).await
        } else {
            Err(Error::store(
                crate::store::StoreErrorKind::Connection,
                true,
                "budget store down",
            ))
        }
    }

    async fn peek(&self, name: &str, policy: &BucketPolicy, now_ms: i64) -> crate::Result<f64> {
        self.0.peek(name, policy, now_ms).await
    }
}

#[tokio::test(start_paused = true)]
async fn store_failures_reach_the_requests_and_leave_no_driver() {
    let store = Arc::new(BrokenStore(MemoryBudgetStore::new(), Mutex::new(0)));
    let manager = Arc::new(
        BudgetManager::new(store, Arc::new(TokioClock::starting_at(0)))
            .with_budget("api", per_second(1))
            .unwrap(),
    );
    drain(&manager, 1).await;
    let tasks: Vec<_> = ["p/a", "p/b"]
        .into_iter()
        .map(|who| {
            let manager = manager.clone();
            tokio::spawn(async move { manager.acquire("api", Request::new(who)).await })
        })
        .collect();
    for task in tasks {
        let err = task.await.unwrap().unwrap_err();
        assert_eq!(err.code(), ErrorCode::Store, "{err}");
    }
    settle().await;
    assert_eq!(manager.active_drivers(), 0);
    assert_eq!(alive_tasks(), 0);
}

#[test]
fn waiting_outside_a_tokio_runtime_is_an_error_not_a_panic() {
    let manager = BudgetManager::new(
        Arc::new(MemoryBudgetStore::new()),
        Arc::new(ManualClock::new(0)),
    )
    .with_budget("api", per_second(1))
    .unwrap();
    let request = Request::new("p/a").with_cost(2);
    // Polled by hand: no runtime exists. The memory store answers at once, so one poll decides.
    let mut acquire = std::pin::pin!(manager.acquire("api", request));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let std::task::Poll::Ready(result) = acquire.as_mut().poll(&mut cx) else {
        panic!("the memory store answers without waiting");
    };
    assert_eq!(result.unwrap_err().code(), ErrorCode::Unsupported);
}

/// Records the time of every take the store granted: the calls the API would see.
#[derive(Default)]
struct RecordingStore {
    inner: MemoryBudgetStore,
    granted_at: Mutex<Vec<i64>>,
}

#[async_trait::async_trait]
impl BudgetStore for RecordingStore {
    async fn take(
        &self,
        name: &str,
        cost: u64,
        policy: &BucketPolicy,
        now_ms: i64,
    ) -> crate::Result<Take> {
        let take = self.inner.take(name, cost, policy, now_ms).await?;
        if matches!(take, Take::Granted { .. }) {
            let mut granted = self.granted_at.lock().unwrap();
            granted.extend(std::iter::repeat_n(now_ms, usize::try_from(cost).unwrap()));
        }
        Ok(take)
    }

    async fn peek(&self, name: &str, policy: &BucketPolicy, now_ms: i64) -> crate::Result<f64> {
        self.inner.peek(name, policy, now_ms).await
    }
}

/// G6 with real threads: many requesters (some giving up, some cancelled) race on two workers
/// while a manual clock moves in steps. Whatever the interleaving, every request is answered and
/// no window of `per` sees more tokens taken than the bucket allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g6_holds_under_contention_on_threads() {
    let clock = Arc::new(ManualClock::new(0));
    let store = Arc::new(RecordingStore::default());
    let policy = BudgetPolicy::new(5, Duration::from_secs(1)).with_burst(3);
    let manager = Arc::new(
        BudgetManager::new(store.clone(), clock.clone())
            .with_budget("api", policy)
            .unwrap(),
    );
    let cancel = CancellationToken::new();
    let lanes = Lane::ALL;
    let tasks: Vec<_> = (0..8_usize)
        .map(|i| {
            let (manager, cancel) = (manager.clone(), cancel.clone());
            tokio::spawn(async move {
                let mut request = Request::new(format!("p/{i}"))
                    .with_lane(lanes[i % 4])
                    .with_cost(1 + u64::try_from(i % 2).unwrap());
                if i == 6 {
                    request = request.with_max_wait(Duration::from_millis(300));
                }
                if i == 7 {
                    request = request.with_cancel(cancel);
                }
                let mut granted = 0_u64;
                for _ in 0..10 {
                    if manager.acquire("api", request.clone()).await.is_ok() {
                        granted += request.cost;
                    }
                }
                granted
            })
        })
        .collect();
    let mut steps = 0;
    while !tasks.iter().all(tokio::task::JoinHandle::is_finished) {
        steps += 1;
        assert!(
            steps < 100_000,
            "requests are still waiting after {steps} steps"
        );
        if steps == 50 {
            cancel.cancel();
        }
        clock.advance(Duration::from_millis(50));
        for _ in 0..5 {
            tokio::task::yield_now().await;
        }
    }
    let mut granted = 0;
    for (i, task) in tasks.into_iter().enumerate() {
        let tokens = task.await.unwrap();
        if i < 6 {
            // Neither limited in time nor cancelled: served in full.
            assert_eq!(
                tokens,
                10 * (1 + u64::try_from(i % 2).unwrap()),
                "requester {i}"
            );
        }
        granted += tokens;
    }
    let times = store.granted_at.lock().unwrap().clone();
    // A token granted to a request withdrawn in the same instant is taken but never used.
    assert!(u64::try_from(times.len()).unwrap() >= granted);
    let per_ms = i64::try_from(policy.per_ms()).unwrap();
    let bound = usize::try_from(policy.burst() + policy.requests).unwrap();
    for &start in &times {
        let inside = times
            .iter()
            .filter(|&&t| t >= start && t <= start + per_ms)
            .count();
        assert!(
            inside <= bound,
            "{inside} tokens within {per_ms} ms of {start}"
        );
    }
    for _ in 0..100 {
        if manager.active_drivers() == 0 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(manager.active_drivers(), 0);
}
