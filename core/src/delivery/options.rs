//! Delivery options: ordering, concurrency, retries, poison handling and acknowledgement.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::backoff::Backoff;
use crate::error::{Error, Result};
use crate::event::Event;

/// Maps an event to its ordering key. Events with the same key are delivered strictly in
/// sequence order; different keys are independent.
pub type OrderingKeyFn = Arc<dyn Fn(&Event) -> String + Send + Sync>;

/// Derives a correlation id from an event, recorded on its parked row.
pub type CorrelationIdFn = Arc<dyn Fn(&Event) -> Option<String> + Send + Sync>;

/// The default [`DeliveryOptions::handler_timeout`]: 15 seconds.
pub const DEFAULT_HANDLER_TIMEOUT: Duration = Duration::from_secs(15);

/// What to keep out of the copy of an event stored on its parked row (secrets, personal data).
///
/// Only the parked copy is redacted: the outbox row and the log keep the event as it was. A
/// redacted parked event that is retried is delivered *as redacted*; rebuild it from the source
/// (backfill) or the log (replay) instead when the handler needs the payload.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Redaction {
    /// Keep the whole event (the default).
    #[default]
    None,
    /// Drop `data` and `previous` entirely.
    Payload,
    /// Replace these fields of `data` and `previous` with the string `"[redacted]"`; each is a
    /// JSON pointer into the payload (RFC 6901, e.g. `/card/number`, `/lines/0/email`). Fields
    /// a payload does not have are left alone.
    Fields(Vec<String>),
}

/// What to do with an event whose handler failed every attempt.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PoisonAction {
    /// Park it and keep delivering other keys.
    #[default]
    Park,
    /// Park it and stop the drain; the runner opens the poller's circuit.
    Halt,
}

/// How a handler acknowledges an event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AckMode {
    /// Returning `Ok` acknowledges.
    #[default]
    Auto,
    /// The handler must call [`HandlerContext::ack`](crate::HandlerContext::ack) before returning
    /// `Ok`; returning without it fails the attempt.
    Manual,
}

/// Acknowledgements flushed in batches: see [`DeliveryOptions::ack_window`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AckWindow {
    pub(crate) max_events: usize,
    pub(crate) max_delay: Duration,
}

impl AckWindow {
    /// The most acks queued before a flush.
    pub fn max_events(&self) -> usize {
        self.max_events
    }

    /// The longest an ack waits for its flush.
    pub fn max_delay(&self) -> Duration {
        self.max_delay
    }
}

/// How events are delivered to a poller's consumer.
///
/// Defaults: ordering key = subject, concurrency 1, 5 attempts with backoff 1 s × 2 up to 2 min
/// (full jitter), poison parked with its key held, automatic acknowledgement.
#[derive(Clone)]
pub struct DeliveryOptions {
    pub(crate) ordering_key: Option<OrderingKeyFn>,
    pub(crate) concurrency: usize,
    pub(crate) attempts: u32,
    pub(crate) backoff: Backoff,
    pub(crate) poison: PoisonAction,
    pub(crate) hold_key: bool,
    pub(crate) ack_mode: AckMode,
    pub(crate) handler_timeout: Option<Duration>,
    pub(crate) handler_version: Option<String>,
    pub(crate) correlation_id: Option<CorrelationIdFn>,
    pub(crate) redaction: Redaction,
    pub(crate) ack_window: Option<AckWindow>,
}

impl Default for DeliveryOptions {
    fn default() -> Self {
        Self {
            ordering_key: None,
            concurrency: 1,
            attempts: 5,
            backoff: Backoff::new(Duration::from_secs(1), 2.0, Duration::from_secs(120)),
            poison: PoisonAction::Park,
            hold_key: true,
            ack_mode: AckMode::Auto,
            handler_timeout: Some(DEFAULT_HANDLER_TIMEOUT),
            handler_version: None,
            correlation_id: None,
            redaction: Redaction::None,
            ack_window: None,
        }
    }
}

impl fmt::Debug for DeliveryOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeliveryOptions")
            .field(
                "ordering_key",
                &if self.ordering_key.is_some() {
                    "custom"
                } else {
                    "subject"
                },
            )
            .field("concurrency", &self.concurrency)
            .field("attempts", &self.attempts)
            .field("backoff", &self.backoff)
            .field("poison", &self.poison)
            .field("hold_key", &self.hold_key)
            .field("ack_mode", &self.ack_mode)
            .field("handler_timeout", &self.handler_timeout)
            .field("handler_version", &self.handler_version)
            .field("correlation_id", &self.correlation_id.is_some())
            .field("redaction", &self.redaction)
            .field("ack_window", &self.ack_window)
            .finish()
    }
}

impl DeliveryOptions {
    /// Sets the ordering-key function (default: the event's subject).
    #[must_use]
    pub fn ordering_key(mut self, f: impl Fn(&Event) -> String + Send + Sync + 'static) -> Self {
        self.ordering_key = Some(Arc::new(f));
        self
    }

    /// Sets how many ordering keys may be in flight at once (at least 1).
    #[must_use]
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency;
        self
    }

    /// Sets the total number of attempts, the first included (at least 1; 1 means no retry).
    #[must_use]
    pub fn attempts(mut self, attempts: u32) -> Self {
        self.attempts = attempts;
        self
    }

    /// Sets the retry backoff (full jitter).
    #[must_use]
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Sets what happens to an event that failed every attempt.
    #[must_use]
    pub fn poison(mut self, action: PoisonAction) -> Self {
        self.poison = action;
        self
    }

    /// Sets whether a parked event holds back later events of its ordering key (default true).
    #[must_use]
    pub fn hold_key(mut self, hold: bool) -> Self {
        self.hold_key = hold;
        self
    }

    /// Sets the acknowledgement mode.
    #[must_use]
    pub fn ack_mode(mut self, mode: AckMode) -> Self {
        self.ack_mode = mode;
        self
    }

    /// Sets how long one attempt of a handler registered with `on` may run (default 15 s;
    /// `None`: no limit; `Some` must be more than zero). On expiry the handler's cancellation
    /// token fires, its future is dropped, and the attempt fails as transient with a
    /// [`Timeout`](super::Timeout) error (retried with backoff, its key held meanwhile). The
    /// timer runs on the engine's clock. Subscriptions are not timed: their consumer sets the
    /// pace.
    #[must_use]
    pub fn handler_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.handler_timeout = timeout;
        self
    }

    /// Sets the handler version recorded on parked rows (e.g. a release or git hash), so an
    /// operator can tell which code failed.
    #[must_use]
    pub fn handler_version(mut self, version: impl Into<String>) -> Self {
        self.handler_version = Some(version.into());
        self
    }

    /// Derives the correlation id recorded on parked rows from the event (e.g. an order number
    /// in the payload). An id set by the handler with
    /// [`HandlerContext::set_correlation_id`](crate::HandlerContext::set_correlation_id) wins.
    #[must_use]
    pub fn correlation_id(
        mut self,
        f: impl Fn(&Event) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.correlation_id = Some(Arc::new(f));
        self
    }

    /// Sets what to keep out of the event copy stored on parked rows (default: nothing).
    #[must_use]
    pub fn redact(mut self, redaction: Redaction) -> Self {
        self.redaction = redaction;
        self
    }

    /// Flushes acknowledgements in batches of up to `max_events`, each ack waiting at most
    /// `max_delay` (on the engine's clock) for its batch. Off by default.
    ///
    /// Without a window, a delivered event's key and its concurrency slot wait until its ack is
    /// durable; acks of keys finishing together share a store call, so at most `concurrency`
    /// events are delivered and not yet acknowledged, and a crash redelivers at most that many.
    /// With a window, a key whose ack is queued gives its turn to other keys, and the queued
    /// acks go to the store together when `max_events` are queued, when the oldest has waited
    /// `max_delay`, or when every key of the drain waits on the window. Fewer store calls, and
    /// a crash may redeliver up to `max(concurrency, max_events)` events (each once, with its
    /// id; a handler that deduplicates by id sees no difference).
    ///
    /// Per-key order is the same in both modes: a key's next event is delivered only once its
    /// previous ack is durable, so a crash only ever redelivers each key's newest event.
    /// `max_events` must be at least 1 and `max_delay` more than zero.
    #[must_use]
    pub fn ack_window(mut self, max_events: usize, max_delay: Duration) -> Self {
        self.ack_window = Some(AckWindow {
            max_events,
            max_delay,
        });
        self
    }

    /// The configured ack window (`None`: off).
    pub fn ack_window_value(&self) -> Option<AckWindow> {
        self.ack_window
    }

    /// The most events delivered and not yet acknowledged at once, which is also the most one
    /// crash can redeliver: `concurrency` without an ack window, `max(concurrency, max_events)`
    /// with one.
    pub fn unacked_bound(&self) -> usize {
        match self.ack_window {
            Some(window) => self.concurrency.max(window.max_events),
            None => self.concurrency,
        }
    }

    /// The configured handler timeout.
    pub fn handler_timeout_value(&self) -> Option<Duration> {
        self.handler_timeout
    }

    /// The configured concurrency.
    pub fn concurrency_value(&self) -> usize {
        self.concurrency
    }

    /// The configured attempts.
    pub fn attempts_value(&self) -> u32 {
        self.attempts
    }

    /// The ordering key of `event`.
    pub fn key_of(&self, event: &Event) -> String {
        match &self.ordering_key {
            Some(f) => f(event),
            None => event.subject.to_string(),
        }
    }

    /// Checks every option; the error names the first bad one (`delivery.<option>`).
    pub fn validate(&self) -> Result<()> {
        if self.concurrency == 0 {
            return Err(Error::config(
                "delivery.concurrency",
                "must be at least 1, got 0",
            ));
        }
        if self.attempts == 0 {
            return Err(Error::config(
                "delivery.retry.attempts",
                "must be at least 1, got 0",
            ));
        }
        if self.handler_timeout.is_some_and(|t| t.is_zero()) {
            return Err(Error::config(
                "delivery.handler_timeout",
                "must be more than zero (use None for no timeout)",
            ));
        }
        if let Some(window) = &self.ack_window {
            if window.max_events == 0 {
                return Err(Error::config(
                    "delivery.ack_window.max_events",
                    "must be at least 1, got 0",
                ));
            }
            if window.max_delay.is_zero() {
                return Err(Error::config(
                    "delivery.ack_window.max_delay",
                    "must be more than zero",
                ));
            }
        }
        if let Redaction::Fields(fields) = &self.redaction
            && let Some(bad) = fields.iter().find(|f| !f.starts_with('/'))
        {
            return Err(Error::config(
                "delivery.redact",
                format!("{bad:?} is not a JSON pointer (it must start with '/')"),
            ));
        }
        self.backoff.validate("delivery.retry.backoff")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;

    #[test]
    fn defaults_are_valid() {
        DeliveryOptions::default().validate().unwrap();
        assert_eq!(
            DeliveryOptions::default().handler_timeout_value(),
            Some(Duration::from_secs(15))
        );
        DeliveryOptions::default()
            .handler_timeout(None)
            .redact(Redaction::Fields(vec!["/card/number".into()]))
            .validate()
            .unwrap();
        let windowed = DeliveryOptions::default()
            .concurrency(16)
            .ack_window(100, Duration::from_millis(5));
        windowed.validate().unwrap();
        assert_eq!(windowed.unacked_bound(), 100);
        assert_eq!(
            DeliveryOptions::default().concurrency(16).unacked_bound(),
            16
        );
        assert_eq!(
            windowed.concurrency(200).unacked_bound(),
            200,
            "the bound is max(concurrency, max_events)"
        );
    }

    #[test]
    fn invalid_options_name_the_option() {
        let cases = [
            (
                DeliveryOptions::default().concurrency(0),
                "delivery.concurrency",
            ),
            (
                DeliveryOptions::default().attempts(0),
                "delivery.retry.attempts",
            ),
            (
                DeliveryOptions::default().backoff(Backoff::new(
                    Duration::from_secs(5),
                    2.0,
                    Duration::from_secs(1),
                )),
                "delivery.retry.backoff.max",
            ),
            (
                DeliveryOptions::default().handler_timeout(Some(Duration::ZERO)),
                "delivery.handler_timeout",
            ),
            (
                DeliveryOptions::default().redact(Redaction::Fields(vec!["card".into()])),
                "delivery.redact",
            ),
            (
                DeliveryOptions::default().ack_window(0, Duration::from_millis(5)),
                "delivery.ack_window.max_events",
            ),
            (
                DeliveryOptions::default().ack_window(100, Duration::ZERO),
                "delivery.ack_window.max_delay",
            ),
        ];
        for (options, option) in cases {
            let err = options.validate().unwrap_err();
            assert_eq!(err.code(), ErrorCode::Config);
            match err {
                Error::Config { option: named, .. } => assert_eq!(named, option),
                other => panic!("expected a config error, got {other}"),
            }
        }
    }
}
