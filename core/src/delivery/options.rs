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
    /// The handler must call [`HandlerContext::ack`](super::HandlerContext::ack) before returning
    /// `Ok`; returning without it fails the attempt.
    Manual,
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
            None => event.subject.clone(),
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
