//! Consumers: handlers registered with `on`, and the backpressured [`Subscription`] stream.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use futures::Stream;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::error::BoxError;
use crate::event::Event;
use crate::model::SerializedError;

use super::idempotent::Fence;

/// How a handler failure should be treated.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HandlerErrorKind {
    /// Worth retrying with backoff (the default for any error).
    Transient,
    /// Retrying cannot help: park the event now.
    Permanent,
    /// Retry no earlier than this delay (e.g. a downstream `Retry-After`).
    RetryAfter(Duration),
}

/// The error a handler returns. Any error converts into a transient one with `?`; use
/// [`HandlerError::permanent`] or [`HandlerError::retry_after`] to classify.
pub struct HandlerError {
    kind: HandlerErrorKind,
    source: BoxError,
}

impl HandlerError {
    /// A failure worth retrying with backoff.
    pub fn transient(error: impl Into<BoxError>) -> Self {
        Self {
            kind: HandlerErrorKind::Transient,
            source: error.into(),
        }
    }

    /// A failure retrying cannot fix: the event is parked at once.
    pub fn permanent(error: impl Into<BoxError>) -> Self {
        Self {
            kind: HandlerErrorKind::Permanent,
            source: error.into(),
        }
    }

    /// A failure to retry no earlier than `delay` from now.
    pub fn retry_after(delay: Duration, error: impl Into<BoxError>) -> Self {
        Self {
            kind: HandlerErrorKind::RetryAfter(delay),
            source: error.into(),
        }
    }

    /// A failure with the given classification, e.g. from
    /// [`classify_http_status`](super::classify_http_status) or
    /// [`classify_network_error`](super::classify_network_error).
    pub fn new(kind: HandlerErrorKind, error: impl Into<BoxError>) -> Self {
        Self {
            kind,
            source: error.into(),
        }
    }

    /// The classification.
    pub fn kind(&self) -> &HandlerErrorKind {
        &self.kind
    }

    /// The underlying error.
    pub fn source(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.source
    }

    /// This failure as plain data: name `HandlerError` (`Timeout` for a handler timeout), the
    /// message and its cause chain.
    pub fn to_serialized(&self) -> SerializedError {
        let source: &(dyn std::error::Error + 'static) = &*self.source;
        if source.is::<Timeout>() {
            return SerializedError::from_error("Timeout", source).with_code("TIMEOUT");
        }
        SerializedError::from_error("HandlerError", source)
    }
}

impl<E: Into<BoxError>> From<E> for HandlerError {
    fn from(error: E) -> Self {
        Self::transient(error)
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerError")
            .field("kind", &self.kind)
            .field("source", &self.source)
            .finish()
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.source, f)
    }
}

/// The result a handler returns.
pub type HandlerResult = Result<(), HandlerError>;

/// The error of an attempt whose handler ran past the poller's
/// [`handler_timeout`](super::DeliveryOptions::handler_timeout): a transient failure, serialized
/// with name `Timeout` and code `TIMEOUT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeout {
    /// The configured timeout that expired.
    pub after: Duration,
}

impl fmt::Display for Timeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "handler timed out after {} ms", self.after.as_millis())
    }
}

impl std::error::Error for Timeout {}

/// What a successful delivery did, as the handler reports it with
/// [`HandlerContext::report`]; it feeds the poller's counters in `inspect()`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DeliveryOutcome {
    /// The event changed something (the default when a handler reports nothing).
    #[default]
    Applied,
    /// The event had been applied before (e.g. `apply_once` found its marker): nothing changed.
    Deduplicated,
    /// The handler chose not to act (e.g. a side effect suppressed on a replay lane).
    Skipped,
}

impl DeliveryOutcome {
    fn to_u8(self) -> u8 {
        match self {
            DeliveryOutcome::Applied => 0,
            DeliveryOutcome::Deduplicated => 1,
            DeliveryOutcome::Skipped => 2,
        }
    }

    fn from_u8(value: u8) -> Self {
        match value {
            1 => DeliveryOutcome::Deduplicated,
            2 => DeliveryOutcome::Skipped,
            _ => DeliveryOutcome::Applied,
        }
    }
}

/// What a handler reported during one attempt: its outcome and a correlation id.
#[derive(Debug, Default)]
pub(crate) struct AttemptNotes {
    outcome: AtomicU8,
    correlation_id: Mutex<Option<String>>,
}

impl AttemptNotes {
    pub(crate) fn outcome(&self) -> DeliveryOutcome {
        DeliveryOutcome::from_u8(self.outcome.load(Ordering::Acquire))
    }

    pub(crate) fn correlation_id(&self) -> Option<String> {
        self.correlation_id
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// The partition an event belongs to, with its transient data (never stored).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Partition {
    /// The partition key (`""` for an unpartitioned poller).
    pub key: String,
    /// Data the partition list attached (credentials, tenant settings); not persisted.
    pub data: Option<Arc<serde_json::Value>>,
}

impl Partition {
    /// A partition without data.
    pub fn new(key: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            data: None,
        }
    }
}

const ACK_OPEN: u8 = 0;
const ACK_DONE: u8 = 1;
const ACK_SEALED: u8 = 2;

/// The acknowledgement of one delivery attempt (see [`AckMode`](super::AckMode)).
#[derive(Clone, Debug, Default)]
pub struct AckHandle(Arc<AtomicU8>);

impl AckHandle {
    /// Acknowledges; returns `false` when it had no effect (already acknowledged, or too late:
    /// the attempt has finished).
    pub fn ack(&self) -> bool {
        self.0
            .compare_exchange(ACK_OPEN, ACK_DONE, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Ends the attempt: later acks have no effect. Returns whether it was acknowledged.
    pub(crate) fn seal(&self) -> bool {
        self.0.swap(ACK_SEALED, Ordering::AcqRel) == ACK_DONE
    }
}

/// What a handler knows about the delivery it is handling.
#[derive(Clone, Debug)]
pub struct HandlerContext {
    /// The attempt, 1-based.
    pub attempt: u32,
    /// The partition, with its transient data.
    pub partition: Partition,
    /// Fires when the engine stops without draining or loses the key's lease; the attempt's
    /// result is then ignored and the event delivered again later.
    pub cancel: CancellationToken,
    fence: Option<Fence>,
    ack: AckHandle,
    notes: Arc<AttemptNotes>,
}

impl HandlerContext {
    /// Builds a context (the dispatcher does this; public for handler unit tests).
    pub fn new(attempt: u32, partition: Partition, cancel: CancellationToken) -> Self {
        Self {
            attempt,
            partition,
            cancel,
            fence: None,
            ack: AckHandle::default(),
            notes: Arc::default(),
        }
    }

    /// This context with the lease the delivery runs under (the dispatcher sets it; for
    /// handler unit tests).
    #[must_use]
    pub fn with_fence(mut self, fence: Fence) -> Self {
        self.fence = Some(fence);
        self
    }

    /// The lease this delivery runs under: its key, holder and fencing epoch. A consumer store
    /// whose projection shares the engine store's database checks it in the projection's own
    /// transaction (see [`ConsumerStore::check_fence`](super::ConsumerStore::check_fence)), so
    /// an instance that lost its lease while the handler ran cannot commit. `None` only for a
    /// context built by hand.
    pub fn fence(&self) -> Option<&Fence> {
        self.fence.as_ref()
    }

    /// Acknowledges the event. Required before returning `Ok` in manual mode; a no-op in auto
    /// mode. Returns `false` when it had no effect (a second call, or a call after the attempt
    /// finished).
    pub fn ack(&self) -> bool {
        self.ack.ack()
    }

    pub(crate) fn ack_handle(&self) -> &AckHandle {
        &self.ack
    }

    /// Reports what a successful attempt did (default [`DeliveryOutcome::Applied`]); the
    /// dispatcher counts it in the poller's `applied`/`deduplicated`/`skipped` counters when the
    /// attempt succeeds, and ignores it when the attempt fails. The last report wins.
    pub fn report(&self, outcome: DeliveryOutcome) {
        self.notes.outcome.store(outcome.to_u8(), Ordering::Release);
    }

    /// Shorthand for `report(DeliveryOutcome::Deduplicated)`.
    pub fn mark_deduplicated(&self) {
        self.report(DeliveryOutcome::Deduplicated);
    }

    /// The outcome reported so far in this attempt.
    pub fn outcome(&self) -> DeliveryOutcome {
        self.notes.outcome()
    }

    /// Attaches a correlation id (e.g. the downstream request id) to this attempt; if the event
    /// is parked, its record carries the last one set (over the poller's
    /// [`correlation_id`](super::DeliveryOptions::correlation_id) function).
    pub fn set_correlation_id(&self, id: impl Into<String>) {
        *self
            .notes
            .correlation_id
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(id.into());
    }

    pub(crate) fn notes(&self) -> &Arc<AttemptNotes> {
        &self.notes
    }
}

/// Handles one event at a time. Implemented for every
/// `Fn(Event, HandlerContext) -> impl Future<Output = HandlerResult>`.
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Handles one delivery. Returning `Err` fails the attempt (retry, park, per the options).
    async fn handle(&self, event: Event, ctx: HandlerContext) -> HandlerResult;
}

#[async_trait]
impl<F, Fut> Handler for F
where
    F: Fn(Event, HandlerContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = HandlerResult> + Send + 'static,
{
    async fn handle(&self, event: Event, ctx: HandlerContext) -> HandlerResult {
        (self)(event, ctx).await
    }
}

/// One event handed to a subscriber, with the channel its outcome travels back on.
pub(crate) struct Delivery {
    pub(crate) event: Event,
    pub(crate) ctx: HandlerContext,
    pub(crate) reply: oneshot::Sender<HandlerResult>,
}

/// The consumer attached to a dispatcher.
#[derive(Clone)]
pub(crate) enum Consumer {
    Handler(Arc<dyn Handler>),
    Subscriber(mpsc::Sender<Delivery>),
}

/// A pull-based stream of a poller's events with backpressure.
///
/// The dispatcher hands over one event only when the subscription asks for it. The event in hand
/// is acknowledged when the next one is asked for; if the subscription is dropped, or
/// [`fail`](Subscription::fail)s the event, it is not acknowledged and will be delivered again.
pub struct Subscription {
    rx: mpsc::Receiver<Delivery>,
    in_flight: Option<(HandlerContext, oneshot::Sender<HandlerResult>)>,
    detach: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("in_flight", &self.in_flight.is_some())
            .finish()
    }
}

impl Subscription {
    pub(crate) fn new(
        rx: mpsc::Receiver<Delivery>,
        detach: Box<dyn FnOnce() + Send + Sync>,
    ) -> Self {
        Self {
            rx,
            in_flight: None,
            detach: Some(detach),
        }
    }

    /// Acknowledges the event in hand (if any) and waits for the next one. `None` once the
    /// dispatcher is gone.
    pub async fn next(&mut self) -> Option<Event> {
        futures::future::poll_fn(|cx| Pin::new(&mut *self).poll_next(cx)).await
    }

    /// Fails the event in hand: it is not acknowledged, and the failure counts as an attempt
    /// (retried with backoff, parked when attempts run out).
    pub fn fail(&mut self, error: impl Into<HandlerError>) {
        if let Some((_, reply)) = self.in_flight.take() {
            let _ = reply.send(Err(error.into()));
        }
    }

    /// The context of the event in hand (attempt, partition, cancellation).
    pub fn context(&self) -> Option<&HandlerContext> {
        self.in_flight.as_ref().map(|(ctx, _)| ctx)
    }

    fn ack_in_flight(&mut self) {
        if let Some((ctx, reply)) = self.in_flight.take() {
            ctx.ack();
            let _ = reply.send(Ok(()));
        }
    }
}

impl Stream for Subscription {
    type Item = Event;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        self.ack_in_flight();
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(delivery)) => {
                self.in_flight = Some((delivery.ctx, delivery.reply));
                Poll::Ready(Some(delivery.event))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        // The event in hand is dropped unacknowledged (its reply sender goes with it), so the
        // dispatcher delivers it again later.
        if let Some(detach) = self.detach.take() {
            detach();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ack_counts_once_and_not_after_seal() {
        let ack = AckHandle::default();
        assert!(ack.ack());
        assert!(!ack.ack());
        assert!(ack.seal());
        let late = AckHandle::default();
        assert!(!late.seal());
        assert!(!late.ack(), "an ack after the attempt ended has no effect");
    }

    #[test]
    fn any_error_converts_to_a_transient_handler_error() {
        fn fails() -> HandlerResult {
            Err(std::io::Error::other("disk full"))?;
            Ok(())
        }
        let err = fails().unwrap_err();
        assert_eq!(err.kind(), &HandlerErrorKind::Transient);
        assert_eq!(err.to_serialized().message, "disk full");
        let err = HandlerError::permanent("bad payload");
        assert_eq!(err.kind(), &HandlerErrorKind::Permanent);
    }
}
