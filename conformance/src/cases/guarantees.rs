//! Delivery guarantees, driven through the [`Dispatcher`] on events committed to the store under
//! test: G1 (at-least-once), G2 (stable ids), G3 (per-key order), G7 (failure isolation) and G10
//! (bounded memory, backpressure).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use watukuy_core::{
    DeliveryOptions, Event, HandlerContext, HandlerError, HandlerResult, Partition,
    backoff::Backoff,
    clock::ManualClock,
    delivery::{Dispatcher, DrainContext, DrainReport},
    rng::SeededRng,
    store::{CommitBatch, Lease, OutboxRow, PKey, ParkedKind, ParkedQuery, StatePatch, Store},
};

use super::fixtures::{NODE_A, T0, acquire, event, key, poison};
use crate::harness::{CaseError, CaseResult, Env};
use crate::{check, check_eq};
use watukuy_testkit::{FaultyStore, Op, Timing};

/// A store with committed events, a lease on the key and a manual clock.
struct World {
    store: Arc<dyn Store>,
    clock: ManualClock,
    key: PKey,
    lease: Lease,
}

impl World {
    async fn new(store: Arc<dyn Store>) -> Result<Self, CaseError> {
        let key = key();
        let lease = acquire(&*store, &key, NODE_A, T0).await?;
        Ok(Self {
            store,
            clock: ManualClock::new(T0),
            key,
            lease,
        })
    }

    /// Commits one event per subject, with sequences following on from `first_sequence`.
    async fn commit(
        &self,
        subjects: &[&str],
        first_sequence: i64,
    ) -> Result<Vec<Event>, CaseError> {
        let events: Vec<Event> = subjects
            .iter()
            .zip(first_sequence..)
            .map(|(subject, seq)| {
                event(&self.key, &format!("evt-{seq:04}-{subject}"), seq, subject)
            })
            .collect();
        let batch = CommitBatch::default()
            .state_patch(StatePatch {
                sequence: Some(first_sequence + i64::try_from(subjects.len()).unwrap_or(0) - 1),
                updated_at: Some(T0),
                ..StatePatch::default()
            })
            .events(
                events
                    .iter()
                    .map(|e| OutboxRow::pending(e.clone(), T0))
                    .collect(),
            );
        self.store
            .commit_poll(&self.key, &self.lease, &batch)
            .await?;
        Ok(events)
    }

    fn dispatcher(
        &self,
        store: Arc<dyn Store>,
        options: DeliveryOptions,
        batch: usize,
    ) -> Result<Dispatcher, CaseError> {
        Ok(Dispatcher::new(
            self.key.poller.clone(),
            store,
            Arc::new(self.clock.clone()),
            Arc::new(SeededRng::new(7)),
            options,
            batch,
        )?)
    }

    async fn drain(&self, dispatcher: &Dispatcher) -> Result<DrainReport, CaseError> {
        Ok(dispatcher
            .drain(&self.key, &self.lease, &DrainContext::default())
            .await?)
    }

    async fn pending_ids(&self) -> Result<Vec<String>, CaseError> {
        Ok(self
            .store
            .load_pending(&self.key, 1_000)
            .await?
            .into_iter()
            .map(|r| r.event_id.to_string())
            .collect())
    }
}

/// Every event a handler saw, in the order it saw them, with whether it succeeded.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<(Event, bool)>>>);

impl Seen {
    fn push(&self, event: &Event, ok: bool) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((event.clone(), ok));
    }

    fn all(&self) -> Vec<(Event, bool)> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn delivered_ids(&self) -> Vec<String> {
        self.all()
            .into_iter()
            .filter(|(_, ok)| *ok)
            .map(|(e, _)| e.id.to_string())
            .collect()
    }

    /// A handler that succeeds when `ok` says so and otherwise fails with
    /// `"{why} (attempt n)"`, recording each delivery and its outcome here.
    fn judge(
        &self,
        why: &'static str,
        ok: impl Fn(&Event, &HandlerContext) -> bool + Send + Sync + 'static,
    ) -> impl Fn(Event, HandlerContext) -> futures::future::Ready<HandlerResult> + Send + Sync + 'static
    {
        let seen = self.clone();
        move |event: Event, ctx: HandlerContext| {
            let ok = ok(&event, &ctx);
            seen.push(&event, ok);
            futures::future::ready(if ok {
                Ok(())
            } else {
                Err(HandlerError::from(format!(
                    "{why} (attempt {})",
                    ctx.attempt
                )))
            })
        }
    }
}

fn ids(events: &[Event]) -> Vec<String> {
    events.iter().map(|e| e.id.to_string()).collect()
}

fn fast_retries(attempts: u32) -> DeliveryOptions {
    DeliveryOptions::default()
        .attempts(attempts)
        .backoff(Backoff::new(
            Duration::from_secs(1),
            2.0,
            Duration::from_secs(4),
        ))
}

/// A handler that records every event and succeeds.
fn recording(
    seen: &Seen,
) -> impl Fn(Event, HandlerContext) -> futures::future::Ready<HandlerResult> + use<> {
    let seen = seen.clone();
    move |event: Event, _ctx: HandlerContext| {
        seen.push(&event, true);
        futures::future::ready(Ok(()))
    }
}

/// G1: an event committed and handed to a handler, then interrupted before its ack (the
/// process stops without draining), is delivered again later with the same id.
pub async fn g1_interrupted_delivery_is_redelivered_with_same_id(env: Env) -> CaseResult {
    let w = World::new(Arc::clone(&env.store)).await?;
    let events = w.commit(&["a", "b", "c"], 1).await?;
    let first = w.dispatcher(Arc::clone(&w.store), DeliveryOptions::default(), 100)?;
    let seen = Seen::default();
    let started = Arc::new(Notify::new());
    first.on({
        let (seen, started) = (seen.clone(), Arc::clone(&started));
        move |event: Event, ctx: HandlerContext| {
            let (seen, started) = (seen.clone(), Arc::clone(&started));
            async move {
                if event.subject == "b" {
                    // The process dies while this handler runs.
                    seen.push(&event, false);
                    started.notify_one();
                    ctx.cancel.cancelled().await;
                } else {
                    seen.push(&event, true);
                }
                Ok::<(), HandlerError>(())
            }
        }
    })?;
    let cancel = CancellationToken::new();
    let ctx = DrainContext {
        partition: Partition::new(""),
        cancel: cancel.clone(),
    };
    let (report, ()) = tokio::join!(first.drain(&w.key, &w.lease, &ctx), async {
        started.notified().await;
        cancel.cancel();
    });
    let report = report?;
    check!(
        report.aborted,
        "the drain must report it was interrupted: {report:?}"
    );
    check_eq!(
        report.delivered,
        1,
        "only `a` was acknowledged before the interruption"
    );
    check_eq!(
        w.pending_ids().await?,
        ids(&events[1..]),
        "b (in flight) and c stay pending"
    );
    let b_row = &w.store.load_pending(&w.key, 1).await?[0];
    check_eq!(
        b_row.attempts,
        0,
        "an interrupted delivery is not a failed attempt"
    );

    // A new process attaches and drains: b is delivered again, with the same id and payload.
    let second = w.dispatcher(Arc::clone(&w.store), DeliveryOptions::default(), 100)?;
    let again = Seen::default();
    second.on(recording(&again))?;
    let report = w.drain(&second).await?;
    check_eq!(report.delivered, 2);
    check_eq!(again.delivered_ids(), ids(&events[1..]));
    let redelivered = &again.all()[0].0;
    check_eq!(redelivered.data, events[1].data, "same payload");
    check_eq!(redelivered.sequence, events[1].sequence, "same sequence");
    check!(
        w.pending_ids().await?.is_empty(),
        "the outbox is empty once everything is acknowledged"
    );
    Ok(())
}

/// G1: a handler that fails is retried after a full-jitter backoff, until it succeeds; while the
/// retry is not due, the event's key waits.
pub async fn g1_failing_handler_is_retried(env: Env) -> CaseResult {
    let w = World::new(Arc::clone(&env.store)).await?;
    let events = w.commit(&["a"], 1).await?;
    let dispatcher = w.dispatcher(Arc::clone(&w.store), fast_retries(5), 100)?;
    let seen = Seen::default();
    dispatcher.on(seen.judge("downstream unavailable", |_, ctx| ctx.attempt >= 3))?;
    for attempt in 1..=2u32 {
        let now = w.clock_now();
        let report = w.drain(&dispatcher).await?;
        check_eq!(
            (report.delivered, report.failed),
            (0, 1),
            "attempt {attempt} fails"
        );
        let retry_at = report.next_retry_at.ok_or_else(|| {
            CaseError::failed("a failed attempt must report when its retry is due")
        })?;
        let cap = 1_000 * 2_i64.pow(attempt - 1);
        check!(
            (now..=now + cap).contains(&retry_at),
            "retry at {retry_at} must be within the full-jitter cap {cap} ms of {now}"
        );
        let row = &w.store.load_pending(&w.key, 1).await?[0];
        check_eq!(row.attempts, attempt);
        check_eq!(row.next_attempt_at, Some(retry_at));
        check_eq!(
            row.last_error.as_ref().map(|e| e.message.clone()),
            Some(format!("downstream unavailable (attempt {attempt})"))
        );
        if retry_at > now {
            let early = w.drain(&dispatcher).await?;
            check_eq!(
                (early.delivered, early.failed),
                (0, 0),
                "a retry that is not due blocks its key"
            );
            check_eq!(early.next_retry_at, Some(retry_at));
        }
        w.clock.set(retry_at);
    }
    let report = w.drain(&dispatcher).await?;
    check_eq!(report.delivered, 1);
    let attempts: Vec<(u32, bool)> = seen
        .all()
        .into_iter()
        .map(|(e, ok)| (e.attempt, ok))
        .collect();
    check_eq!(
        attempts,
        vec![(1, false), (2, false), (3, true)],
        "the event carries its 1-based attempt"
    );
    check!(
        seen.all().iter().all(|(e, _)| e.id == events[0].id),
        "every attempt carries the same id"
    );
    check!(w.pending_ids().await?.is_empty());
    Ok(())
}

impl World {
    fn clock_now(&self) -> i64 {
        use watukuy_core::clock::Clock;
        self.clock.now_ms()
    }
}

/// G2: a crash between the handler and the ack (the ack never reaches the store) leads to a
/// duplicate delivery that carries the same id, sequence and payload.
pub async fn g2_redelivery_carries_the_same_id_and_payload(env: Env) -> CaseResult {
    let w = World::new(Arc::clone(&env.store)).await?;
    let events = w.commit(&["a"], 1).await?;
    let faulty = Arc::new(FaultyStore::new(Arc::clone(&w.store)));
    faulty.fail(Op::AckEvents, Timing::Before, 1);
    let crashing = w.dispatcher(faulty.clone(), DeliveryOptions::default(), 100)?;
    let first = Seen::default();
    crashing.on(recording(&first))?;
    let crash = crashing
        .drain(&w.key, &w.lease, &DrainContext::default())
        .await;
    check!(
        crash.is_err(),
        "the injected ack failure must surface: {crash:?}"
    );
    check_eq!(first.delivered_ids(), ids(&events));

    let recovered = w.dispatcher(Arc::clone(&w.store), DeliveryOptions::default(), 100)?;
    let second = Seen::default();
    recovered.on(recording(&second))?;
    check_eq!(w.drain(&recovered).await?.delivered, 1);
    let (a, b) = (&first.all()[0].0, &second.all()[0].0);
    check_eq!(
        (&a.id, a.sequence, &a.data, &a.subject),
        (&b.id, b.sequence, &b.data, &b.subject),
        "a duplicate is the same event"
    );
    check_eq!(a.id, events[0].id);
    Ok(())
}

/// Deterministic "random" failure: the first attempt of about a quarter of the events fails.
fn flaky(id: &str) -> bool {
    let hash = id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    hash % 4 == 0
}

/// G3: per ordering key, events are delivered in sequence order, with 32 keys in flight, random
/// handler failures and retries, and a parked key holding its successors; keys without failures
/// never wait for the others.
pub async fn g3_per_key_order_under_concurrency_and_failures(env: Env) -> CaseResult {
    let w = World::new(Arc::clone(&env.store)).await?;
    let keys: Vec<String> = (0..16).map(|k| format!("k{k:02}")).collect();
    let subjects: Vec<&str> = (0..4)
        .flat_map(|_| keys.iter().map(String::as_str))
        .collect();
    let events = w.commit(&subjects, 1).await?;
    let poison_id = events
        .iter()
        .find(|e| e.subject == "k07")
        .map(|e| e.id.clone())
        .unwrap_or_default();
    let dispatcher = w.dispatcher(
        Arc::clone(&w.store),
        fast_retries(3).concurrency(32).hold_key(true),
        100,
    )?;
    let seen = Seen::default();
    let in_flight: Arc<Mutex<HashSet<String>>> = Arc::default();
    let overlap = Arc::new(AtomicBool::new(false));
    let (current, max_in_flight) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    dispatcher.on({
        let shared = (
            seen.clone(),
            Arc::clone(&in_flight),
            Arc::clone(&overlap),
            Arc::clone(&current),
            Arc::clone(&max_in_flight),
            poison_id.clone(),
        );
        move |event: Event, ctx: HandlerContext| {
            let (seen, in_flight, overlap, current, max_in_flight, poison_id) = shared.clone();
            async move {
                if !in_flight
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(event.subject.to_string())
                {
                    overlap.store(true, Ordering::SeqCst);
                }
                let now = current.fetch_add(1, Ordering::SeqCst) + 1;
                max_in_flight.fetch_max(now, Ordering::SeqCst);
                for _ in 0..3 {
                    tokio::task::yield_now().await;
                }
                let ok = event.id != poison_id && !(flaky(&event.id) && ctx.attempt == 1);
                seen.push(&event, ok);
                current.fetch_sub(1, Ordering::SeqCst);
                in_flight
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(event.subject.as_str());
                if ok {
                    Ok(())
                } else {
                    Err(HandlerError::from("random failure"))
                }
            }
        }
    })?;

    let mut report = w.drain(&dispatcher).await?;
    let clean: Vec<&String> = keys
        .iter()
        .filter(|k| *k != "k07" && !events.iter().any(|e| e.subject == *k && flaky(&e.id)))
        .collect();
    check!(
        !clean.is_empty() && clean.len() < keys.len() - 1,
        "the fixture needs both clean and flaky keys"
    );
    let delivered_first: HashSet<String> = seen.delivered_ids().into_iter().collect();
    for k in &clean {
        for e in events.iter().filter(|e| e.subject == *k) {
            check!(
                delivered_first.contains(e.id.as_str()),
                "key {k} has no failures and must not wait: {} undelivered after the first drain",
                e.id
            );
        }
    }
    for _ in 0..20 {
        let Some(at) = report.next_retry_at else {
            break;
        };
        w.clock.set(at);
        report = w.drain(&dispatcher).await?;
    }
    check!(
        !overlap.load(Ordering::SeqCst),
        "two events of one key were in flight at once"
    );
    check!(
        max_in_flight.load(Ordering::SeqCst) > 1,
        "keys must be delivered concurrently"
    );
    check!(
        max_in_flight.load(Ordering::SeqCst) <= 32,
        "never more than `concurrency` keys in flight"
    );

    let mut per_key: BTreeMap<String, Vec<(i64, bool)>> = BTreeMap::new();
    for (e, ok) in seen.all() {
        per_key
            .entry(e.subject.to_string())
            .or_default()
            .push((e.sequence, ok));
    }
    for (k, attempts) in &per_key {
        let sequences: Vec<i64> = attempts.iter().map(|(s, _)| *s).collect();
        check!(
            sequences.windows(2).all(|w| w[0] <= w[1]),
            "key {k}: attempts went back in sequence: {sequences:?}"
        );
        let delivered: Vec<i64> = attempts
            .iter()
            .filter(|(_, ok)| *ok)
            .map(|(s, _)| *s)
            .collect();
        check!(
            delivered.windows(2).all(|w| w[0] < w[1]),
            "key {k}: deliveries out of order or repeated: {delivered:?}"
        );
    }
    let mut delivered_count: HashMap<String, usize> = HashMap::new();
    for id in seen.delivered_ids() {
        *delivered_count.entry(id).or_default() += 1;
    }
    for e in &events {
        let expected = usize::from(e.subject != "k07");
        check_eq!(
            delivered_count.get(e.id.as_str()).copied().unwrap_or(0),
            expected,
            "deliveries of {} ({})",
            e.id,
            e.subject
        );
    }
    let parked = w.store.list_parked(&w.key, ParkedQuery::default()).await?;
    check_eq!(parked.len(), 1);
    check_eq!(parked[0].hold_key.as_deref(), Some("k07"));
    check_eq!(
        w.store.counts(&w.key).await.map(|c| c.pending)?,
        3,
        "k07's three successors wait behind the parked event"
    );
    Ok(())
}

/// Sets up G7: keys a–d with two events each; every attempt of `b`'s first event fails while
/// `failing` is set; drains (advancing the clock to each retry) until it is parked.
async fn poisoned(
    env: &Env,
) -> Result<
    (
        World,
        Dispatcher,
        Seen,
        Arc<AtomicBool>,
        Vec<Event>,
        DrainReport,
    ),
    CaseError,
> {
    let w = World::new(Arc::clone(&env.store)).await?;
    let events = w
        .commit(&["a", "b", "c", "d", "a", "b", "c", "d"], 1)
        .await?;
    let dispatcher = w.dispatcher(Arc::clone(&w.store), fast_retries(3).concurrency(4), 100)?;
    let seen = Seen::default();
    let failing = Arc::new(AtomicBool::new(true));
    let poison_id = events[1].id.clone();
    dispatcher.on(seen.judge("cannot handle b", {
        let failing = Arc::clone(&failing);
        move |event, _| !(event.id == poison_id && failing.load(Ordering::SeqCst))
    }))?;
    let first = w.drain(&dispatcher).await?;
    let mut report = first;
    for _ in 0..10 {
        let Some(at) = report.next_retry_at else {
            break;
        };
        w.clock.set(at);
        report = w.drain(&dispatcher).await?;
    }
    Ok((w, dispatcher, seen, failing, events, first))
}

/// G7: one poison key never blocks the others: they are all delivered in the first drain; the
/// poison event is parked after `attempts` with its error, history and hold key, and holds its
/// key's successor.
pub async fn g7_poison_key_does_not_block_others(env: Env) -> CaseResult {
    let (w, dispatcher, seen, _failing, events, first) = poisoned(&env).await?;
    check_eq!(
        first.delivered,
        6,
        "every other key is delivered in the first drain"
    );
    let others: Vec<String> = events
        .iter()
        .filter(|e| e.subject != "b")
        .map(|e| e.id.to_string())
        .collect();
    let mut delivered = seen.delivered_ids();
    delivered.sort();
    let mut expected = others.clone();
    expected.sort();
    check_eq!(delivered, expected);
    let parked = w.store.list_parked(&w.key, ParkedQuery::default()).await?;
    check_eq!(parked.len(), 1);
    let row = &parked[0];
    check_eq!(row.id, events[1].id);
    check_eq!(row.kind, ParkedKind::Poison);
    check_eq!(row.attempts, 3, "parked after exactly `attempts` attempts");
    check_eq!(row.hold_key.as_deref(), Some("b"));
    check_eq!(
        row.event.as_ref().map(|e| e.id.clone()),
        Some(events[1].id.clone())
    );
    check_eq!(row.error.error.message, "cannot handle b (attempt 3)");
    let history: Vec<String> = row
        .error
        .history
        .iter()
        .flatten()
        .map(|e| e.message.clone())
        .collect();
    check_eq!(
        history,
        vec![
            "cannot handle b (attempt 2)".to_owned(),
            "cannot handle b (attempt 3)".to_owned()
        ]
    );
    check_eq!(
        w.pending_ids().await?,
        vec![events[5].id.clone()],
        "b's successor waits, held"
    );
    let again = w.drain(&dispatcher).await?;
    check_eq!(
        (again.delivered, again.remaining),
        (0, 1),
        "a held key stays held"
    );
    Ok(())
}

/// G7: retrying a parked event delivers it, then its key's successors, in order.
pub async fn g7_retry_delivers_poison_then_successors_in_order(env: Env) -> CaseResult {
    let (w, dispatcher, seen, failing, events, _) = poisoned(&env).await?;
    failing.store(false, Ordering::SeqCst);
    check_eq!(
        dispatcher
            .retry_parked(&w.key, &[events[1].id.to_string()])
            .await?,
        1
    );
    let before = seen.all().len();
    let report = w.drain(&dispatcher).await?;
    check_eq!(report.delivered, 2);
    let after: Vec<String> = seen.all()[before..]
        .iter()
        .map(|(e, _)| e.id.to_string())
        .collect();
    check_eq!(
        after,
        vec![events[1].id.clone(), events[5].id.clone()],
        "the parked event first, then its successor"
    );
    check_eq!(w.store.counts(&w.key).await.map(|c| c.parked)?, 0);
    check_eq!(w.store.counts(&w.key).await.map(|c| c.pending)?, 0);
    Ok(())
}

/// G7: discarding a parked event releases its key: the successor is delivered, the discarded
/// event never is.
pub async fn g7_discard_releases_the_key(env: Env) -> CaseResult {
    let (w, dispatcher, seen, _failing, events, _) = poisoned(&env).await?;
    check_eq!(
        dispatcher
            .discard_parked(&w.key, &[events[1].id.to_string()])
            .await?,
        1
    );
    let report = w.drain(&dispatcher).await?;
    check_eq!(report.delivered, 1);
    check!(
        seen.delivered_ids().contains(&events[5].id.to_string()),
        "the successor is delivered"
    );
    check!(
        !seen.delivered_ids().contains(&events[1].id.to_string()),
        "the discarded event is never delivered"
    );
    check_eq!(w.store.counts(&w.key).await.map(|c| c.pending)?, 0);
    Ok(())
}

/// G10: `subscribe` hands over an event only when asked, acknowledges it when the next one is
/// asked for, and a dropped subscription leaves its event in hand unacknowledged.
pub async fn g10_subscribe_never_pulls_more_than_asked(env: Env) -> CaseResult {
    let w = World::new(Arc::clone(&env.store)).await?;
    let events = w.commit(&["a", "b", "c", "d", "e"], 1).await?;
    let faulty = Arc::new(FaultyStore::new(Arc::clone(&w.store)));
    let dispatcher = w.dispatcher(faulty.clone(), DeliveryOptions::default(), 100)?;

    let mut subscription = dispatcher.subscribe()?;
    let consumer = async {
        let first = subscription.next().await;
        let second = subscription.next().await;
        let pending = w.store.counts(&w.key).await.map(|c| c.pending);
        let acks = faulty.calls(Op::AckEvents);
        drop(subscription);
        (first, second, pending, acks)
    };
    let (report, (first, second, pending, acks)) = tokio::join!(w.drain(&dispatcher), consumer);
    let report = report?;
    check_eq!(first.map(|e| e.id), Some(events[0].id.clone()));
    check_eq!(second.map(|e| e.id), Some(events[1].id.clone()));
    check_eq!(
        pending?,
        4,
        "asking for the second event acknowledged the first, and nothing else"
    );
    check_eq!(
        acks,
        1,
        "exactly one acknowledgement while the consumer holds the second event"
    );
    check!(
        report.aborted,
        "a dropped subscription ends the drain: {report:?}"
    );
    check_eq!(report.delivered, 1);
    check_eq!(
        w.pending_ids().await?,
        ids(&events[1..]),
        "the event in hand when dropped is not acknowledged"
    );

    let mut subscription = dispatcher.subscribe()?;
    let consumer = async {
        let mut got = Vec::new();
        for _ in 0..4 {
            got.extend(subscription.next().await.map(|e| e.id));
        }
        let before_last_ack = w.store.counts(&w.key).await.map(|c| c.pending);
        // Asking once more acknowledges the last event; nothing further arrives.
        let mut next = std::pin::pin!(subscription.next());
        let more = futures::poll!(next.as_mut());
        (got, before_last_ack, more.is_pending())
    };
    let (report, (got, before_last_ack, nothing_more)) =
        tokio::join!(w.drain(&dispatcher), consumer);
    check_eq!(
        got,
        ids(&events[1..]),
        "the dropped event comes first, then the rest in order"
    );
    check_eq!(
        before_last_ack?,
        1,
        "the outbox empties only after the consumer asks past the last event"
    );
    check!(nothing_more);
    check_eq!(report?.delivered, 4);
    check_eq!(w.store.counts(&w.key).await.map(|c| c.pending)?, 0);
    Ok(())
}

/// G10: the dispatcher loads one slice of `dispatch_batch_size` rows at a time (widening up to
/// 16 slices only while held keys fill the window) and runs at most `concurrency` handlers.
pub async fn g10_dispatcher_holds_at_most_one_slice(env: Env) -> CaseResult {
    let w = World::new(Arc::clone(&env.store)).await?;
    let subjects: Vec<String> = (0..10).map(|i| format!("s{i}")).collect();
    w.commit(&subjects.iter().map(String::as_str).collect::<Vec<_>>(), 1)
        .await?;
    let faulty = Arc::new(FaultyStore::new(Arc::clone(&w.store)));
    let dispatcher = w.dispatcher(faulty.clone(), DeliveryOptions::default().concurrency(2), 4)?;
    let (current, max_in_flight) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    dispatcher.on({
        let (current, max_in_flight) = (Arc::clone(&current), Arc::clone(&max_in_flight));
        move |_event: Event, _ctx: HandlerContext| {
            let (current, max_in_flight) = (Arc::clone(&current), Arc::clone(&max_in_flight));
            async move {
                let now = current.fetch_add(1, Ordering::SeqCst) + 1;
                max_in_flight.fetch_max(now, Ordering::SeqCst);
                tokio::task::yield_now().await;
                current.fetch_sub(1, Ordering::SeqCst);
                Ok::<(), HandlerError>(())
            }
        }
    })?;
    check_eq!(w.drain(&dispatcher).await?.delivered, 10);
    check_eq!(
        faulty.max_load_pending_limit(),
        5,
        "one slice of dispatch_batch_size rows, plus one that tells whether more follow"
    );
    check!(faulty.max_load_pending_rows() <= 5);
    check!(
        max_in_flight.load(Ordering::SeqCst) <= 2,
        "never more than `concurrency` handlers"
    );

    // A held key fills the first 12 rows: the window widens (4 -> 8 -> 16, each read one row
    // longer) to reach the others.
    let held: Vec<&str> = std::iter::repeat_n("held", 12)
        .chain(["x1", "x2", "x3", "x4"])
        .collect();
    let events = w.commit(&held, 100).await?;
    let parked = poison(event(&w.key, "evt-old-held", 99, "held"), Some("held"), T0);
    w.store.park_event(&w.key, &w.lease, &parked).await?;
    let report = w.drain(&dispatcher).await?;
    check_eq!(
        report.delivered,
        4,
        "the keys behind the held one are delivered"
    );
    check_eq!(
        faulty.max_load_pending_limit(),
        17,
        "the window widened only as far as needed"
    );
    check!(faulty.max_load_pending_rows() <= 17);
    check_eq!(w.store.counts(&w.key).await.map(|c| c.pending)?, 12);
    check_eq!(w.pending_ids().await?, ids(&events[..12]));
    Ok(())
}
