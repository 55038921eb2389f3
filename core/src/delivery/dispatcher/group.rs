//! One ordering key's group of events, delivered strictly in order, and one delivery attempt
//! (handler timeout, panics, retry, park, halt).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::FutureExt;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::delivery::acks::Acks;
use crate::delivery::consumer::{
    Consumer, Delivery, DeliveryOutcome, HandlerContext, HandlerError, HandlerErrorKind, Partition,
    Timeout,
};
use crate::delivery::dispatcher::Dispatcher;
use crate::delivery::dispatcher::counters::Counters;
use crate::delivery::idempotent::Fence;
use crate::delivery::options::AckMode;
use crate::delivery::policy;
use crate::delivery::policy::{FailureDecision, Group};
use crate::error::Result;
use crate::model::{
    AttemptRecord, FailureClass, FailureDetails, Lease, OutboxRow, PKey, ParkReason, ParkedKind,
    ParkedRow,
};

impl Dispatcher {
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn run_group(
        &self,
        key: &PKey,
        lease: &Lease,
        acks: &Acks<'_>,
        group: Group,
        consumer: &Consumer,
        partition: &Partition,
        cancel: &CancellationToken,
        halted: &AtomicBool,
    ) -> Result<GroupOutcome> {
        let mut outcome = GroupOutcome::default();
        let counters = self.counters_of(&key.partition);
        let fence = Fence::new(key.clone(), lease.owner.as_str(), lease.epoch);
        let _live = acks.group();
        for mut row in group.rows {
            if halted.load(Ordering::Acquire) || cancel.is_cancelled() {
                outcome.aborted = cancel.is_cancelled();
                return Ok(outcome);
            }
            if let Some(at) = row.next_attempt_at
                && at > self.clock.now_ms()
            {
                outcome.blocked = true;
                outcome.next_retry_at = crate::schedule::earliest(outcome.next_retry_at, Some(at));
                return Ok(outcome);
            }
            let turn = acks.handler_turn().await;
            // Another group may have halted the drain while this one waited for its turn.
            if halted.load(Ordering::Acquire) || cancel.is_cancelled() {
                outcome.aborted = cancel.is_cancelled();
                return Ok(outcome);
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
            // The handler's own token: a timeout cancels it without cancelling the drain.
            let ctx = HandlerContext::new(attempt, partition.clone(), cancel.child_token())
                .with_fence(fence.clone());
            let attempt_result = self
                .attempt(&row, ctx, consumer, cancel, &counters)
                .instrument(span.clone())
                .await;
            drop(turn);
            match attempt_result {
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
                    // This key's next event waits until this ack is durable, so a crash only
                    // redelivers a key's newest event (G3). Acks of other keys finishing
                    // meanwhile share the store call.
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
                            outcome.next_retry_at =
                                crate::schedule::earliest(outcome.next_retry_at, Some(at));
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
                                id: row.event_id.to_string(),
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

    pub(super) async fn attempt(
        &self,
        row: &OutboxRow,
        ctx: HandlerContext,
        consumer: &Consumer,
        cancel: &CancellationToken,
        counters: &Counters,
    ) -> Attempt {
        let mut event = row.event.clone();
        event.attempt = ctx.attempt;
        let handler_cancel = ctx.cancel.clone();
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
}

/// How one attempt ended.
pub(super) enum Attempt {
    Delivered(DeliveryOutcome),
    Failed {
        error: HandlerError,
        correlation_id: Option<String>,
    },
    /// Cancelled, or the subscriber went away: not acknowledged, no attempt recorded.
    Aborted,
}

pub(super) fn failure_class(kind: &HandlerErrorKind) -> FailureClass {
    match kind {
        HandlerErrorKind::Transient => FailureClass::Transient,
        HandlerErrorKind::Permanent => FailureClass::Permanent,
        HandlerErrorKind::RetryAfter(_) => FailureClass::RetryAfter,
    }
}

/// What one group's run did.
#[derive(Default)]
pub(super) struct GroupOutcome {
    pub(super) delivered: u64,
    pub(super) parked: u64,
    pub(super) failed: u64,
    pub(super) next_retry_at: Option<i64>,
    pub(super) blocked: bool,
    pub(super) aborted: bool,
}

pub(super) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}
