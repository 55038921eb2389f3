//! The dispatcher: drains a key's outbox to the poller's consumer with per-key ordering,
//! concurrency across keys, retries, parking and hold-key.

use std::collections::{HashMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use futures::{FutureExt, StreamExt};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::acks::AckBatcher;
use super::consumer::{
    Consumer, Delivery, DeliveryOutcome, Handler, HandlerContext, HandlerError, HandlerErrorKind,
    Partition, Subscription, Timeout,
};
use super::options::{AckMode, DeliveryOptions};
use super::policy::{self, FailureDecision, Group};
use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::hooks::{HookContext, Hooks, NoHooks};
use crate::model::{
    AttemptRecord, FailureClass, FailureDetails, Lease, OutboxRow, PKey, ParkReason, ParkedKind,
    ParkedQuery, ParkedRow,
};
use crate::rng::Rng;
use crate::store::Store;

/// The default number of outbox rows loaded per slice.
pub const DEFAULT_DISPATCH_BATCH_SIZE: usize = 100;

/// What one drain did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrainReport {
    /// Events delivered and acknowledged.
    pub delivered: u64,
    /// Events parked (poison).
    pub parked: u64,
    /// Failed attempts recorded for a later retry.
    pub failed: u64,
    /// The earliest time a waiting retry becomes due (epoch ms), so a daemon can wake for it.
    pub next_retry_at: Option<i64>,
    /// A poison event was parked with `halt`: the drain stopped and the circuit should open.
    pub halted: bool,
    /// The drain was cancelled or the subscriber went away; unfinished events stay pending.
    pub aborted: bool,
    /// No consumer is attached: nothing was delivered and events wait in the outbox.
    pub no_consumer: bool,
    /// Pending rows left after the drain.
    pub remaining: u64,
}

/// The caller's side of a drain: the partition handed to handlers and a cancellation token that
/// fires on stop-without-drain or lease loss.
#[derive(Clone, Debug, Default)]
pub struct DrainContext {
    /// The partition, with its transient data.
    pub partition: Partition,
    /// Cancels in-flight deliveries; they are not acknowledged and will be delivered again.
    pub cancel: CancellationToken,
}

/// Detaches a handler registered with [`Dispatcher::on`].
#[derive(Debug)]
pub struct Unsubscribe {
    slot: Arc<Slot>,
    id: u64,
}

impl Unsubscribe {
    /// Detaches the handler; events then wait in the outbox until a consumer attaches.
    pub fn unsubscribe(self) {
        self.slot.detach(self.id);
    }
}

#[derive(Default)]
struct Slot {
    consumer: Mutex<Option<(u64, Consumer)>>,
    next_id: AtomicU64,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot").finish_non_exhaustive()
    }
}

impl Slot {
    fn attach(&self, poller: &str, consumer: Consumer) -> Result<u64> {
        let mut slot = self.consumer.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_some() {
            return Err(Error::config(
                "on/subscribe",
                format!(
                    "poller '{poller}' already has a consumer: `on` and `subscribe` are exclusive, one per poller"
                ),
            ));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        *slot = Some((id, consumer));
        Ok(id)
    }

    fn detach(&self, id: u64) {
        let mut slot = self.consumer.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.as_ref().is_some_and(|(current, _)| *current == id) {
            *slot = None;
        }
    }

    fn current(&self) -> Option<Consumer> {
        self.consumer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|(_, c)| c.clone())
    }
}

/// Delivery counters of one `(poller, partition)` since this engine started (in memory, per
/// engine instance; they restart at zero with the process).
///
/// `received` counts every delivery handed to the consumer (each attempt). A successful attempt
/// counts as `applied`, `deduplicated` or `skipped` according to what the handler reported with
/// [`HandlerContext::report`] (an unreported success is `applied`; `apply_once`'s outcome reports
/// itself with `ApplyOutcome::report`). `failed` counts failed attempts (errors, panics,
/// timeouts, missing manual acks), whether retried or parked. Attempts cut short by cancellation
/// or a vanished subscriber count only as received.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryCounters {
    /// Deliveries handed to the consumer.
    pub received: u64,
    /// Successful deliveries that changed something (or reported nothing).
    pub applied: u64,
    /// Successful deliveries the handler reported as duplicates.
    pub deduplicated: u64,
    /// Successful deliveries the handler reported as skipped.
    pub skipped: u64,
    /// Failed attempts.
    pub failed: u64,
}

#[derive(Default)]
struct Counters {
    received: AtomicU64,
    applied: AtomicU64,
    deduplicated: AtomicU64,
    skipped: AtomicU64,
    failed: AtomicU64,
}

impl Counters {
    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> DeliveryCounters {
        DeliveryCounters {
            received: self.received.load(Ordering::Relaxed),
            applied: self.applied.load(Ordering::Relaxed),
            deduplicated: self.deduplicated.load(Ordering::Relaxed),
            skipped: self.skipped.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
        }
    }
}

/// The most events whose failed attempts are remembered at once, and the most attempts kept per
/// event: the in-memory attempt log stays bounded whatever happens to the events.
const ATTEMPT_LOG_EVENTS: usize = 10_000;
const ATTEMPT_LOG_PER_EVENT: usize = 50;

/// Failed attempts of events still being retried, by `(partition, event id)`, so a parked row
/// can carry its timed attempt history. In memory: attempts made before a restart or by another
/// instance are known only through the outbox row's last error.
#[derive(Default)]
struct AttemptLog {
    entries: Mutex<HashMap<(String, String), Vec<AttemptRecord>>>,
}

impl AttemptLog {
    fn push(&self, partition: &str, event_id: &str, record: AttemptRecord) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (partition.to_owned(), event_id.to_owned());
        if !entries.contains_key(&key) && entries.len() >= ATTEMPT_LOG_EVENTS {
            return;
        }
        let log = entries.entry(key).or_default();
        if log.len() >= ATTEMPT_LOG_PER_EVENT {
            log.remove(0);
        }
        log.push(record);
    }

    fn take(&self, partition: &str, event_id: &str) -> Vec<AttemptRecord> {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(partition.to_owned(), event_id.to_owned()))
            .unwrap_or_default()
    }
}

/// How one attempt ended.
enum Attempt {
    Delivered(DeliveryOutcome),
    Failed {
        error: HandlerError,
        correlation_id: Option<String>,
    },
    /// Cancelled, or the subscriber went away: not acknowledged, no attempt recorded.
    Aborted,
}

fn failure_class(kind: &HandlerErrorKind) -> FailureClass {
    match kind {
        HandlerErrorKind::Transient => FailureClass::Transient,
        HandlerErrorKind::Permanent => FailureClass::Permanent,
        HandlerErrorKind::RetryAfter(_) => FailureClass::RetryAfter,
    }
}

/// What one group's run did.
#[derive(Default)]
struct GroupOutcome {
    delivered: u64,
    parked: u64,
    failed: u64,
    next_retry_at: Option<i64>,
    blocked: bool,
    aborted: bool,
}

/// Delivers a poller's outbox to its consumer (one per poller).
///
/// Within an ordering key events are delivered strictly one after another in sequence order;
/// up to `concurrency` keys are in flight at once. A failed attempt is retried after a
/// full-jitter backoff, during which its key waits and other keys go on. An event that fails
/// every attempt is parked (with its history) and, with `hold_key`, holds its key until the
/// parked row is retried or discarded.
pub struct Dispatcher {
    poller: String,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    rng: Arc<dyn Rng>,
    options: DeliveryOptions,
    batch_size: usize,
    slot: Arc<Slot>,
    hooks: Arc<dyn Hooks>,
    instance_id: String,
    counters: Mutex<HashMap<String, Arc<Counters>>>,
    attempt_log: AttemptLog,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("poller", &self.poller)
            .field("options", &self.options)
            .field("batch_size", &self.batch_size)
            .finish_non_exhaustive()
    }
}

impl Dispatcher {
    /// A dispatcher for `poller`. Fails with a `Config` error naming the option when the options
    /// are invalid (concurrency 0, attempts 0, backoff max below base, batch size 0).
    pub fn new(
        poller: impl Into<String>,
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        rng: Arc<dyn Rng>,
        options: DeliveryOptions,
        batch_size: usize,
    ) -> Result<Self> {
        options.validate()?;
        if batch_size == 0 {
            return Err(Error::config(
                "dispatch_batch_size",
                "must be at least 1, got 0",
            ));
        }
        Ok(Self {
            poller: poller.into(),
            store,
            clock,
            rng,
            options,
            batch_size,
            slot: Arc::default(),
            hooks: Arc::new(NoHooks),
            instance_id: String::new(),
            counters: Mutex::default(),
            attempt_log: AttemptLog::default(),
        })
    }

    /// Reports deliveries, retries and parked events to `hooks`, as instance `instance_id`.
    #[must_use]
    pub fn with_hooks(mut self, hooks: Arc<dyn Hooks>, instance_id: impl Into<String>) -> Self {
        self.hooks = hooks;
        self.instance_id = instance_id.into();
        self
    }

    fn hook_context(&self, event: &crate::event::Event) -> HookContext {
        HookContext {
            poller: self.poller.clone(),
            partition: event.partition.clone(),
            lane: event.lane,
            instance_id: self.instance_id.clone(),
        }
    }

    async fn report_delivered(&self, event: &crate::event::Event, took: i64) {
        self.hooks
            .on_delivered(&self.hook_context(event), event, took)
            .await;
    }

    /// The poller this dispatcher serves.
    pub fn poller(&self) -> &str {
        &self.poller
    }

    /// The delivery options.
    pub fn options(&self) -> &DeliveryOptions {
        &self.options
    }

    /// The delivery counters of `partition` (`""` for an unpartitioned poller) since this
    /// dispatcher was built; zero for a partition it never delivered.
    pub fn counters(&self, partition: &str) -> DeliveryCounters {
        self.counters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(partition)
            .map(|c| c.snapshot())
            .unwrap_or_default()
    }

    fn counters_of(&self, partition: &str) -> Arc<Counters> {
        let mut all = self.counters.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(all.entry(partition.to_owned()).or_default())
    }

    /// Attaches a handler. Fails with a `Config` error if a consumer is already attached.
    pub fn on(&self, handler: impl Handler) -> Result<Unsubscribe> {
        let id = self
            .slot
            .attach(&self.poller, Consumer::Handler(Arc::new(handler)))?;
        Ok(Unsubscribe {
            slot: Arc::clone(&self.slot),
            id,
        })
    }

    /// Attaches a pull-based subscription. Fails with a `Config` error if a consumer is already
    /// attached. Dropping the subscription detaches it.
    pub fn subscribe(&self) -> Result<Subscription> {
        let (tx, rx) = mpsc::channel(1);
        let id = self.slot.attach(&self.poller, Consumer::Subscriber(tx))?;
        let slot = Arc::clone(&self.slot);
        Ok(Subscription::new(rx, Box::new(move || slot.detach(id))))
    }

    /// Ends an attached subscription (its stream returns `None`; an event in hand is not
    /// acknowledged). A handler attached with [`on`](Self::on) stays attached.
    pub fn close_subscription(&self) {
        let mut slot = self
            .slot
            .consumer
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if matches!(slot.as_ref(), Some((_, Consumer::Subscriber(_)))) {
            *slot = None;
        }
    }

    /// True while a handler or a subscription is attached.
    pub fn has_consumer(&self) -> bool {
        self.slot.current().is_some()
    }

    /// Delivers the pending events of `key` under `lease`.
    ///
    /// Loads the outbox a slice at a time (in sequence order), skips keys that are held by a
    /// parked event or already waiting in this drain, and delivers the rest with up to
    /// `concurrency` keys in flight. A row whose next attempt lies in the future blocks its key
    /// for this drain and is reported in `next_retry_at`. Stops when a pass makes no progress,
    /// on a `halt`, on cancellation, or on the first store error (`LeaseLost` included; in-flight
    /// handlers are then cancelled).
    pub async fn drain(
        &self,
        key: &PKey,
        lease: &Lease,
        ctx: &DrainContext,
    ) -> Result<DrainReport> {
        let mut report = DrainReport::default();
        let Some(consumer) = self.slot.current() else {
            report.no_consumer = true;
            report.remaining = self.store.counts(key).await?.pending;
            return Ok(report);
        };
        let cancel = ctx.cancel.child_token();
        let halted = AtomicBool::new(false);
        let mut blocked: HashSet<String> = HashSet::new();
        // Read once per drain: keys parked with `hold_key` during the drain are `blocked` by
        // their group, and a hold released meanwhile is seen by the next drain.
        let mut held: Option<HashSet<String>> = None;
        let mut window = self.batch_size;
        // Known without asking the store when the last slice held every pending row.
        let mut remaining: Option<u64> = None;
        while !cancel.is_cancelled() {
            let rows = self.store.load_pending(key, window).await?;
            if rows.is_empty() {
                remaining = Some(0);
                break;
            }
            let slice_len = rows.len() as u64;
            let slice_full = rows.len() >= window;
            let held = match held {
                Some(ref held) => held,
                None => held.insert(self.store.held_keys(key).await?.into_iter().collect()),
            };
            let groups =
                policy::eligible_groups(rows, |r| self.options.key_of(&r.event), held, &blocked);
            if groups.is_empty() {
                match policy::widened_window(window, self.batch_size, slice_full) {
                    Some(wider) => {
                        window = wider;
                        continue;
                    }
                    None => {
                        remaining = (!slice_full).then_some(slice_len);
                        break;
                    }
                }
            }
            let mut progress = false;
            let mut removed = 0;
            let acks = AckBatcher::new(&*self.store, key, lease);
            let mut runs = futures::stream::iter(groups)
                .map(|group| {
                    let group_key = group.key.clone();
                    self.run_group(
                        key,
                        lease,
                        &acks,
                        group,
                        &consumer,
                        &ctx.partition,
                        &cancel,
                        &halted,
                    )
                    .map(move |outcome| (group_key, outcome))
                })
                .buffer_unordered(self.options.concurrency);
            while let Some((group_key, outcome)) = runs.next().await {
                let outcome = match outcome {
                    Ok(outcome) => outcome,
                    Err(error) => {
                        cancel.cancel();
                        return Err(error);
                    }
                };
                progress |=
                    outcome.delivered + outcome.parked + outcome.failed > 0 || outcome.blocked;
                removed += outcome.delivered + outcome.parked;
                report.delivered += outcome.delivered;
                report.parked += outcome.parked;
                report.failed += outcome.failed;
                report.aborted |= outcome.aborted;
                report.next_retry_at = min_opt(report.next_retry_at, outcome.next_retry_at);
                if outcome.blocked {
                    blocked.insert(group_key);
                }
            }
            drop(runs);
            report.halted = halted.load(Ordering::Acquire);
            if !slice_full {
                remaining = Some(slice_len - removed);
                break;
            }
            if report.halted || report.aborted || !progress {
                break;
            }
        }
        report.aborted |= cancel.is_cancelled() && !report.halted;
        report.remaining = match remaining {
            Some(remaining) => remaining,
            None => self.store.counts(key).await?.pending,
        };
        Ok(report)
    }

    #[allow(clippy::too_many_arguments)]
    async fn run_group(
        &self,
        key: &PKey,
        lease: &Lease,
        acks: &AckBatcher<'_>,
        group: Group,
        consumer: &Consumer,
        partition: &Partition,
        cancel: &CancellationToken,
        halted: &AtomicBool,
    ) -> Result<GroupOutcome> {
        let mut outcome = GroupOutcome::default();
        let counters = self.counters_of(&key.partition);
        for mut row in group.rows {
            if halted.load(Ordering::Acquire) || cancel.is_cancelled() {
                outcome.aborted = cancel.is_cancelled();
                return Ok(outcome);
            }
            if let Some(at) = row.next_attempt_at {
                if at > self.clock.now_ms() {
                    outcome.blocked = true;
                    outcome.next_retry_at = min_opt(outcome.next_retry_at, Some(at));
                    return Ok(outcome);
                }
            }
            let attempt = row.attempts.saturating_add(1);
            let started = self.clock.now_ms();
            // The handler runs inside this span, so its own spans are children of it; the
            // traceparent field links the delivery (and every retry) to the observing poll.
            let span = tracing::info_span!(
                "watukuy.deliver",
                poller = %self.poller,
                partition = %key.partition,
                lane = row.event.lane.as_str(),
                event_id = %row.event_id,
                event_type = %row.event.event_type,
                attempt,
                traceparent = row.event.traceparent.as_deref().unwrap_or(""),
                error = tracing::field::Empty,
            );
            match self
                .attempt(&row, attempt, consumer, partition, cancel, &counters)
                .instrument(span.clone())
                .await
            {
                Attempt::Delivered(delivery) => {
                    Counters::bump(match delivery {
                        DeliveryOutcome::Applied => &counters.applied,
                        DeliveryOutcome::Deduplicated => &counters.deduplicated,
                        DeliveryOutcome::Skipped => &counters.skipped,
                    });
                    if row.attempts > 0 {
                        drop(self.attempt_log.take(&key.partition, &row.event_id));
                    }
                    tracing::debug!(poller = %self.poller, partition = %key.partition, event = %row.event_id, attempt, "delivered");
                    // This key's next event waits until this ack is durable, and so does this
                    // group's slot: at most `concurrency` events are delivered and not yet
                    // acknowledged, which bounds what a crash redelivers (G9). Acks of other
                    // keys finishing meanwhile share the store call.
                    acks.ack(&row.event_id).await?;
                    outcome.delivered += 1;
                    row.event.attempt = attempt;
                    let took = self.clock.now_ms().saturating_sub(started);
                    self.report_delivered(&row.event, took).await;
                }
                Attempt::Aborted => {
                    outcome.aborted = true;
                    return Ok(outcome);
                }
                Attempt::Failed {
                    error,
                    correlation_id,
                } => {
                    Counters::bump(&counters.failed);
                    let serialized = error.to_serialized();
                    span.record("error", serialized.message.as_str());
                    let failed_at = self.clock.now_ms();
                    let mut record = AttemptRecord {
                        attempt,
                        started_at: Some(started),
                        failed_at: Some(failed_at),
                        classification: Some(failure_class(error.kind())),
                        retry_at: None,
                        error: serialized.clone(),
                    };
                    let decision = policy::on_failure(
                        attempt,
                        error.kind(),
                        &self.options,
                        self.rng.next_f64(),
                    );
                    match decision {
                        FailureDecision::Retry { delay_ms } => {
                            let at = failed_at.saturating_add(delay_ms);
                            self.store
                                .record_attempt(key, lease, &row.event_id, &serialized, Some(at))
                                .await?;
                            record.retry_at = Some(at);
                            self.attempt_log.push(&key.partition, &row.event_id, record);
                            tracing::info!(poller = %self.poller, partition = %key.partition, event = %row.event_id, attempt, delay_ms, error = %serialized.message, "delivery failed; will retry");
                            let mut failed = row.event.clone();
                            failed.attempt = attempt;
                            self.hooks
                                .on_retry(
                                    &self.hook_context(&row.event),
                                    &failed,
                                    &serialized,
                                    delay_ms,
                                )
                                .await;
                            outcome.failed += 1;
                            outcome.blocked = true;
                            outcome.next_retry_at = min_opt(outcome.next_retry_at, Some(at));
                            return Ok(outcome);
                        }
                        FailureDecision::Park { hold_key, halt } => {
                            let ctx = self.hook_context(&row.event);
                            let park_reason = if matches!(error.kind(), HandlerErrorKind::Permanent)
                            {
                                ParkReason::Permanent
                            } else {
                                ParkReason::AttemptsExhausted
                            };
                            let mut log = self.attempt_log.take(&key.partition, &row.event_id);
                            log.push(record);
                            let mut event = row.event.clone();
                            let redacted =
                                policy::redact_event(&mut event, &self.options.redaction);
                            let classification = failure_class(error.kind());
                            let mut error =
                                policy::parked_error(row.last_error.as_ref(), serialized);
                            error.details = FailureDetails {
                                classification: Some(classification),
                                park_reason: Some(park_reason),
                                attempt_log: Some(policy::attempt_log(&row, log)),
                                handler_version: self.options.handler_version.clone(),
                                correlation_id: correlation_id.or_else(|| {
                                    self.options
                                        .correlation_id
                                        .as_ref()
                                        .and_then(|f| f(&row.event))
                                }),
                                redacted,
                            };
                            let parked = ParkedRow {
                                id: row.event_id.clone(),
                                kind: ParkedKind::Poison,
                                item: None,
                                error,
                                attempts: attempt,
                                parked_at: failed_at,
                                hold_key: hold_key.then(|| group.key.clone()),
                                event: Some(event),
                            };
                            self.store.park_event(key, lease, &parked).await?;
                            self.hooks.on_parked(&ctx, &parked).await;
                            tracing::warn!(poller = %self.poller, partition = %key.partition, event = %parked.id, attempts = attempt, hold_key, halt, "event parked");
                            outcome.parked += 1;
                            if halt {
                                halted.store(true, Ordering::Release);
                                return Ok(outcome);
                            }
                            if hold_key {
                                outcome.blocked = true;
                                return Ok(outcome);
                            }
                        }
                    }
                }
            }
        }
        Ok(outcome)
    }

    async fn attempt(
        &self,
        row: &OutboxRow,
        attempt: u32,
        consumer: &Consumer,
        partition: &Partition,
        cancel: &CancellationToken,
        counters: &Counters,
    ) -> Attempt {
        let mut event = row.event.clone();
        event.attempt = attempt;
        let handler_cancel = cancel.child_token();
        let ctx = HandlerContext::new(attempt, partition.clone(), handler_cancel.clone());
        let notes = Arc::clone(ctx.notes());
        let failed = |error: HandlerError| Attempt::Failed {
            error,
            correlation_id: notes.correlation_id(),
        };
        match consumer {
            Consumer::Handler(handler) => {
                let ack = ctx.ack_handle().clone();
                Counters::bump(&counters.received);
                let call = AssertUnwindSafe(handler.handle(event, ctx)).catch_unwind();
                let limit = self.options.handler_timeout;
                let expiry = async {
                    match limit {
                        Some(limit) => self.clock.sleep(limit).await,
                        None => futures::future::pending::<()>().await,
                    }
                };
                let result = tokio::select! {
                    biased;
                    () = cancel.cancelled() => return Attempt::Aborted,
                    result = call => result,
                    () = expiry => {
                        // The handler's future is dropped with this select; its token tells any
                        // work it spawned to stop.
                        handler_cancel.cancel();
                        ack.seal();
                        let after = limit.unwrap_or_default();
                        return failed(HandlerError::transient(Timeout { after }));
                    }
                };
                let acked = ack.seal();
                match result {
                    Err(panic) => failed(HandlerError::transient(format!(
                        "handler panicked: {}",
                        panic_message(panic.as_ref())
                    ))),
                    Ok(Err(error)) => failed(error),
                    Ok(Ok(())) if self.options.ack_mode == AckMode::Manual && !acked => {
                        failed(HandlerError::transient(
                            "handler returned without calling ctx.ack() (ack_mode is manual)",
                        ))
                    }
                    Ok(Ok(())) => Attempt::Delivered(notes.outcome()),
                }
            }
            Consumer::Subscriber(tx) => {
                let (reply, outcome) = oneshot::channel();
                let handover = tx.send(Delivery { event, ctx, reply });
                let sent = tokio::select! {
                    biased;
                    () = cancel.cancelled() => return Attempt::Aborted,
                    sent = handover => sent,
                };
                if sent.is_err() {
                    return Attempt::Aborted;
                }
                Counters::bump(&counters.received);
                let outcome = tokio::select! {
                    biased;
                    () = cancel.cancelled() => return Attempt::Aborted,
                    outcome = outcome => outcome,
                };
                match outcome {
                    Ok(Ok(())) => Attempt::Delivered(notes.outcome()),
                    Ok(Err(error)) => failed(error),
                    // The subscription was dropped with the event in hand: not acknowledged.
                    Err(_) => Attempt::Aborted,
                }
            }
        }
    }

    /// Parked rows of `key` (poison and quarantined), oldest first.
    pub async fn list_parked(&self, key: &PKey, query: ParkedQuery) -> Result<Vec<ParkedRow>> {
        self.store.list_parked(key, query).await
    }

    /// Moves parked poison events back to the outbox as pending (releasing their hold); the next
    /// drain delivers them, then their key's successors in order. Returns how many moved.
    pub async fn retry_parked(&self, key: &PKey, ids: &[String]) -> Result<u64> {
        self.store
            .resolve_parked(key, ids, crate::model::ParkedAction::Retry)
            .await
    }

    /// Deletes parked rows (releasing their hold). Returns how many were removed.
    pub async fn discard_parked(&self, key: &PKey, ids: &[String]) -> Result<u64> {
        self.store
            .resolve_parked(key, ids, crate::model::ParkedAction::Discard)
            .await
    }
}

fn min_opt(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}
