//! Building blocks for reliable handlers: the outcome of an idempotent apply (shared by the
//! stores' `apply_once`), idempotency keys for outgoing calls, and replay-safe side effects.
//!
//! Delivery is at least once: a handler may see the same event again after a crash, a lost
//! lease, a timeout, or on purpose (backfill, replay). See the guide `docs/reliable-handlers.md`
//! for which recipe fits which handler.

use async_trait::async_trait;

use super::consumer::{DeliveryOutcome, Handler, HandlerContext, HandlerError, HandlerResult};
use super::idempotent::{ApplyError, ApplyOutcome};
use crate::diff::sha256_hex;
use crate::event::{Event, EventType};
use crate::model::Lane;

/// How an apply's outcome reaches the dispatcher (here, beside the handler's types, so the
/// idempotent apply does not depend on them).
impl<T> ApplyOutcome<T> {
    /// The matching [`DeliveryOutcome`].
    pub fn delivery_outcome(&self) -> DeliveryOutcome {
        match self {
            ApplyOutcome::Applied(_) => DeliveryOutcome::Applied,
            ApplyOutcome::Deduplicated => DeliveryOutcome::Deduplicated,
        }
    }

    /// Reports this outcome to the dispatcher through `ctx` (so `inspect()` counts it as
    /// applied or deduplicated) and returns it.
    pub fn report(self, ctx: &HandlerContext) -> Self {
        ctx.report(self.delivery_outcome());
        self
    }
}

/// A projection error keeps its classification (a [`HandlerError::permanent`] returned by the
/// projection parks the event at once; any other error is transient); a store failure is
/// transient (the attempt budget still bounds it).
impl<E: Into<HandlerError>> From<ApplyError<E>> for HandlerError {
    fn from(error: ApplyError<E>) -> Self {
        match error {
            ApplyError::Projection(e) => e.into(),
            ApplyError::Store(e) => HandlerError::transient(e),
        }
    }
}

/// The idempotency key for the one outgoing call an event causes: the event id (64 hex
/// characters, identical across restarts, instances, retries and replays).
///
/// Pass it as the downstream's idempotency key (`Idempotency-Key` header, a queue's job id, a
/// payment's idempotency key) so a redelivered event cannot act twice.
pub fn idempotency_key(event: &Event) -> &str {
    &event.id
}

/// The idempotency key for one of several outgoing calls an event causes: 64 hex characters
/// derived from the event id and `scope` (e.g. `"email:welcome"`, `"charge"`), stable across
/// redeliveries and distinct per scope.
pub fn scoped_idempotency_key(event: &Event, scope: &str) -> String {
    sha256_hex(format!("{}\n{scope}", event.id).as_bytes())
}

/// Whether a side effect (email, payment, webhook) should run for an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SideEffectGate {
    /// The event comes from an allowed lane: perform the side effect.
    Perform,
    /// The event comes from a lane that re-delivers history (backfill, replay, or any lane not
    /// allowed): update state if needed, but do not send.
    Suppress {
        /// The event's lane.
        lane: Lane,
    },
}

/// Decides whether `event` may trigger side effects: [`SideEffectGate::Perform`] when its lane
/// is in `allowed`, else [`SideEffectGate::Suppress`]. Use it to *flag* non-live events inside a
/// handler that also maintains state; use [`LiveOnly`] to *skip* them outright.
///
/// Lanes: `live` is new change; `reconcile` finds changes the live lane missed (often deletes),
/// which are new to consumers too, so allow it when those deserve a side effect; `backfill` and
/// `replay` re-deliver history and should normally be suppressed.
pub fn side_effect_gate(event: &Event, allowed: &[Lane]) -> SideEffectGate {
    if allowed.contains(&event.lane) {
        SideEffectGate::Perform
    } else {
        SideEffectGate::Suppress { lane: event.lane }
    }
}

/// A handler wrapper for handlers with side effects: events from lanes it does not allow
/// (default: every lane but `live`) are acknowledged without calling the inner handler and
/// reported as [`DeliveryOutcome::Skipped`].
///
/// ```
/// use watukuy_core::delivery::LiveOnly;
/// use watukuy_core::{Event, HandlerContext, HandlerError, Lane};
///
/// let send_welcome_email = LiveOnly::new(|event: Event, _ctx: HandlerContext| async move {
///     // ... call the mail API with `watukuy_core::delivery::idempotency_key(&event)` ...
///     let _ = event;
///     Ok::<(), HandlerError>(())
/// })
/// .allow(Lane::Reconcile);
/// # let _ = send_welcome_email;
/// ```
#[derive(Clone, Debug)]
pub struct LiveOnly<H> {
    inner: H,
    allowed: Vec<Lane>,
}

impl<H: Handler> LiveOnly<H> {
    /// Wraps `inner`; only `live` events reach it.
    pub fn new(inner: H) -> Self {
        Self {
            inner,
            allowed: vec![Lane::Live],
        }
    }

    /// Also lets events of `lane` through.
    #[must_use]
    pub fn allow(mut self, lane: Lane) -> Self {
        if !self.allowed.contains(&lane) {
            self.allowed.push(lane);
        }
        self
    }
}

#[async_trait]
impl<H: Handler> Handler for LiveOnly<H> {
    async fn handle(&self, event: Event, ctx: HandlerContext) -> HandlerResult {
        match side_effect_gate(&event, &self.allowed) {
            SideEffectGate::Perform => self.inner.handle(event, ctx).await,
            SideEffectGate::Suppress { lane } => {
                tracing::debug!(event = %event.id, %lane, "side effect skipped on a non-live lane");
                ctx.report(DeliveryOutcome::Skipped);
                ctx.ack();
                Ok(())
            }
        }
    }
}

/// The last event an idempotent consumer applied for a subject, as it keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LastApplied<'a> {
    /// Its id.
    pub id: &'a str,
    /// Its type, as [`EventType::as_str`] writes it.
    pub event_type: &'a str,
    /// Its sequence; `None` when the record predates sequences.
    pub sequence: Option<i64>,
}

impl<'a> LastApplied<'a> {
    /// The record of an applied event.
    pub fn new(id: &'a str, event_type: &'a str, sequence: Option<i64>) -> Self {
        Self {
            id,
            event_type,
            sequence,
        }
    }
}

/// Whether an event whose id an idempotent consumer already recorded is a new change to apply
/// again, given the last event the consumer applied for the same subject (`None` when it keeps
/// no such record).
///
/// Event ids are stable per identity, version-or-hash and type (byte-identical to the
/// reference), so an id can come back as a new change: a delete and a re-create with the same
/// content give the re-create the original `created` id (and a second delete the first one's
/// `deleted` id); an item changed back to an earlier content gets that content's `updated` id
/// again. Such a change is committed after the subject's earlier events, so it carries a higher
/// sequence than any of them. A redelivery, on the other hand, is the same outbox row: the same
/// sequence. So:
///
/// - the subject's last applied event is this id, or unknown: a duplicate;
/// - this delivery's sequence is not above the last applied event's: a late redelivery (an
///   instance that was frozen past its lease waking up after the new holder went further), a
///   duplicate;
/// - otherwise, on the live, reconcile and backfill lanes: a new change;
/// - on the replay lane, which replays history a read model may already hold, only a state
///   change is applied again: a `created` after the subject's `deleted`, a `deleted` after
///   anything else; a repeated `updated` id is a duplicate. A read model rebuilt from the log
///   ends as the live one; one that already held the history may see a re-created and deleted
///   item created and deleted again.
///
/// The SQL stores' `apply_once` uses it; a consumer of your own that deduplicates by event id
/// should keep the last applied event per subject and ask it too.
pub fn reapplies(event: &Event, last: Option<LastApplied<'_>>) -> bool {
    let Some(last) = last else {
        return false;
    };
    if last.id == event.id || last.sequence.is_some_and(|seq| event.sequence <= seq) {
        return false;
    }
    if event.lane != Lane::Replay {
        return true;
    }
    let last_deleted = last.event_type == EventType::Deleted.as_str();
    match event.event_type {
        EventType::Created => last_deleted,
        EventType::Deleted => !last_deleted,
        EventType::Updated => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::{HandlerErrorKind, Partition};
    use crate::event::EventType;
    use tokio_util::sync::CancellationToken;

    fn event(lane: Lane) -> Event {
        Event {
            lane,
            sequence: 1,
            attempt: 1,
            ..Event::new("a".repeat(64), EventType::Created, "t", "s")
        }
    }

    #[test]
    fn keys_are_the_event_id_or_stable_per_scope() {
        let e = event(Lane::Live);
        assert_eq!(idempotency_key(&e), e.id);
        let charge = scoped_idempotency_key(&e, "charge");
        assert_eq!(charge.len(), 64);
        assert_eq!(charge, scoped_idempotency_key(&e, "charge"));
        assert_ne!(charge, scoped_idempotency_key(&e, "email"));
        let mut replayed = event(Lane::Replay);
        replayed.sequence = 99;
        assert_eq!(charge, scoped_idempotency_key(&replayed, "charge"));
    }

    #[test]
    fn the_gate_flags_lanes_that_are_not_allowed() {
        assert_eq!(
            side_effect_gate(&event(Lane::Live), &[Lane::Live]),
            SideEffectGate::Perform
        );
        assert_eq!(
            side_effect_gate(&event(Lane::Replay), &[Lane::Live]),
            SideEffectGate::Suppress { lane: Lane::Replay }
        );
        assert_eq!(
            side_effect_gate(&event(Lane::Reconcile), &[Lane::Live, Lane::Reconcile]),
            SideEffectGate::Perform
        );
    }

    #[tokio::test]
    async fn live_only_skips_other_lanes_and_reports_it() {
        let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let handler = LiveOnly::new({
            let calls = calls.clone();
            move |_e: Event, _c: HandlerContext| {
                let calls = calls.clone();
                async move {
                    calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    Ok::<(), HandlerError>(())
                }
            }
        });
        for lane in Lane::ALL {
            let ctx = HandlerContext::new(1, Partition::default(), CancellationToken::new());
            handler.handle(event(lane), ctx.clone()).await.unwrap();
            let expected = if lane == Lane::Live {
                DeliveryOutcome::Applied
            } else {
                DeliveryOutcome::Skipped
            };
            assert_eq!(ctx.outcome(), expected, "{lane:?}");
        }
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[test]
    fn apply_errors_keep_the_projection_classification() {
        let permanent: ApplyError<HandlerError> =
            ApplyError::Projection(HandlerError::permanent("bad row"));
        assert_eq!(
            HandlerError::from(permanent).kind(),
            &HandlerErrorKind::Permanent
        );
        let io: ApplyError<std::io::Error> = ApplyError::Projection(std::io::Error::other("x"));
        assert_eq!(HandlerError::from(io).kind(), &HandlerErrorKind::Transient);
        let store: ApplyError<HandlerError> = ApplyError::Store(crate::Error::config("a", "b"));
        assert_eq!(
            HandlerError::from(store).kind(),
            &HandlerErrorKind::Transient
        );
        let ctx = HandlerContext::new(1, Partition::default(), CancellationToken::new());
        let outcome: ApplyOutcome<()> = ApplyOutcome::Deduplicated;
        assert!(outcome.report(&ctx).is_deduplicated());
        assert_eq!(ctx.outcome(), DeliveryOutcome::Deduplicated);
    }

    #[test]
    fn a_known_id_is_reapplied_only_after_another_event_of_its_subject() {
        let last = |id, kind| Some(LastApplied::new(id, kind, None));
        let mut created = event(Lane::Live);
        created.event_type = EventType::Created;
        created.sequence = 10;
        let id = created.id.clone();
        assert!(!reapplies(&created, None), "no record: a duplicate");
        assert!(
            !reapplies(&created, last(&id, "created")),
            "still the subject's last event: a redelivery"
        );
        assert!(reapplies(&created, last("the-delete", "deleted")));
        assert!(reapplies(&created, last("an-update", "updated")));

        let mut replayed = created.clone();
        replayed.lane = Lane::Replay;
        assert!(reapplies(&replayed, last("the-delete", "deleted")));
        assert!(
            !reapplies(&replayed, last("an-update", "updated")),
            "a replayed create of a live item changes nothing"
        );
        replayed.event_type = EventType::Deleted;
        assert!(reapplies(&replayed, last("the-re-create", "created")));
        assert!(!reapplies(&replayed, last("another-delete", "deleted")));
        replayed.event_type = EventType::Updated;
        assert!(!reapplies(&replayed, last("a-later-update", "updated")));
    }

    #[test]
    fn a_delivery_not_newer_than_the_subjects_last_event_is_a_late_redelivery() {
        let mut created = event(Lane::Live);
        created.sequence = 10;
        let after = |seq| Some(LastApplied::new("the-delete", "deleted", Some(seq)));
        assert!(
            reapplies(&created, after(9)),
            "a re-create after the delete"
        );
        assert!(
            !reapplies(&created, after(11)),
            "the subject went further: this delivery is a late copy"
        );
        assert!(!reapplies(&created, after(10)), "the same sequence");
        created.lane = Lane::Replay;
        assert!(!reapplies(&created, after(11)));
    }
}
