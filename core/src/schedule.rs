//! The scheduler: pure functions over a key's persisted [`ScheduleState`] and lane cursors —
//! when a key and each of its lanes is due, the adaptive interval (AIMD), jitter, pacing by
//! rate-limit headers, throttles, backoff, the circuit, and a failing lane's own backoff
//! (`docs/operations.md` describes the behaviour in prose).

use std::time::Duration;

use crate::backoff::{Backoff, f64_to_ms, ms_f64};
use crate::clock::duration_ms;
use crate::error::{Error, Result};
use crate::model::{
    Circuit, LaneCursor, PollSummary, PollerState, RateLimitInfo, ScheduleState, SerializedError,
};

/// When and how often a poller runs: `ScheduleOptions::default()`, then the setters.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct ScheduleOptions {
    /// The shortest interval (default 30 s).
    pub min: Duration,
    /// The longest interval (default 5 min).
    pub max: Duration,
    /// Adapt the interval to activity (AIMD); `false` pins `min` (default true).
    pub adaptive: bool,
    /// Symmetric jitter in `[0, 1)` applied to every wait (default 0.1).
    pub jitter: f64,
    /// Backoff after failures (default 1 s × 2 up to 10 min, full jitter).
    pub backoff: Backoff,
}

/// When the circuit opens and how often an open circuit is probed: `CircuitOptions::default()`,
/// then the setters.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct CircuitOptions {
    /// Consecutive failures that open the circuit (default 5).
    pub failures: u32,
    /// How often an open circuit is probed (default: the schedule's `max`).
    pub probe_every: Option<Duration>,
}

/// Why the schedule changed, as reported to the schedule-change hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ScheduleReason {
    /// Events were found: the interval halves (down to `min`).
    EventsSpeedUp,
    /// No events: the interval grows by 1.5 (up to `max`).
    IdleBackOff,
    /// The API answered 304: like idle.
    NotModified,
    /// `adaptive: false`: always `min`.
    Fixed,
    /// The cycle was truncated: run again at once.
    CatchUp,
    /// Rate-limit pacing stretched the wait.
    Paced,
    /// 429 (or 503 with Retry-After): wait exactly as told.
    Throttled,
    /// A failure below the circuit threshold: exponential backoff with full jitter.
    Backoff,
    /// The circuit opened.
    CircuitOpen,
    /// A half-open probe failed: the circuit stays open.
    ProbeFailed,
}

/// The outcome of a successful live cycle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SuccessOutcome {
    /// Events were committed.
    pub had_events: bool,
    /// The API answered 304 and nothing was seen.
    pub not_modified: bool,
    /// The cycle stopped before the listing ended.
    pub truncated: bool,
    /// The last rate-limit information seen.
    pub rate_limit: Option<RateLimitInfo>,
    /// What the cycle did.
    pub summary: PollSummary,
}

/// The outcome of a failed live cycle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FailureOutcome {
    /// The failure.
    pub error: SerializedError,
    /// The server's Retry-After, if any.
    pub retry_after_ms: Option<i64>,
    /// 429, or 503 with Retry-After: a throttle, not a failure.
    pub is_throttle: bool,
    /// The last rate-limit information seen.
    pub rate_limit: Option<RateLimitInfo>,
}

/// A new schedule and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ScheduleChange {
    /// The new state.
    pub state: ScheduleState,
    /// Why.
    pub reason: ScheduleReason,
    /// The circuit opened with this change.
    pub circuit_opened: bool,
    /// The circuit closed with this change.
    pub circuit_closed: bool,
}

/// Growth of the interval after an idle cycle (no events, or 304).
const GROWTH_FACTOR: f64 = 1.5;
/// Shrinkage of the interval after a cycle with events.
const SPEED_UP_DIVISOR: f64 = 2.0;

impl Default for ScheduleOptions {
    /// `min` 30 s, `max` 5 min, adaptive, jitter 0.1, backoff 1 s × 2 up to 10 min.
    fn default() -> Self {
        Self {
            min: Duration::from_secs(30),
            max: Duration::from_secs(5 * 60),
            adaptive: true,
            jitter: 0.1,
            backoff: Backoff::new(Duration::from_secs(1), 2.0, Duration::from_secs(10 * 60)),
        }
    }
}

impl ScheduleOptions {
    /// Sets the shortest interval.
    #[must_use]
    pub fn min(mut self, min: Duration) -> Self {
        self.min = min;
        self
    }

    /// Sets the longest interval.
    #[must_use]
    pub fn max(mut self, max: Duration) -> Self {
        self.max = max;
        self
    }

    /// Sets whether the interval adapts to activity (`false` pins `min`).
    #[must_use]
    pub fn adaptive(mut self, adaptive: bool) -> Self {
        self.adaptive = adaptive;
        self
    }

    /// Sets the symmetric jitter applied to every wait, in `[0, 1)`.
    #[must_use]
    pub fn jitter(mut self, jitter: f64) -> Self {
        self.jitter = jitter;
        self
    }

    /// Sets the backoff after failures.
    #[must_use]
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Checks the options; errors name `schedule.<option>`.
    pub fn validate(&self) -> Result<()> {
        if duration_ms(self.min) <= 0 {
            return Err(Error::config(
                "schedule.min",
                format!("must be at least 1ms, got {:?}", self.min),
            ));
        }
        if self.max < self.min {
            return Err(Error::config(
                "schedule.max",
                format!("must be >= min ({:?}), got {:?}", self.min, self.max),
            ));
        }
        if !self.jitter.is_finite() || !(0.0..1.0).contains(&self.jitter) {
            return Err(Error::config(
                "schedule.jitter",
                format!("must be a finite number in [0, 1), got {}", self.jitter),
            ));
        }
        self.backoff.validate("schedule.backoff")
    }

    /// `min` in milliseconds.
    fn min_ms(&self) -> i64 {
        duration_ms(self.min)
    }

    /// `max` in milliseconds.
    fn max_ms(&self) -> i64 {
        duration_ms(self.max)
    }

    /// `interval` (or `min` when there is none) clamped to `[min, max]`; never panics, even on
    /// options that fail validation.
    fn clamp_interval(&self, interval_ms: Option<i64>) -> i64 {
        interval_ms
            .unwrap_or_else(|| self.min_ms())
            .max(self.min_ms())
            .min(self.max_ms())
    }
}

impl CircuitOptions {
    /// Sets how many consecutive failures open the circuit.
    #[must_use]
    pub fn failures(mut self, failures: u32) -> Self {
        self.failures = failures;
        self
    }

    /// Sets how often an open circuit is probed.
    #[must_use]
    pub fn probe_every(mut self, every: Duration) -> Self {
        self.probe_every = Some(every);
        self
    }
}

impl Default for CircuitOptions {
    /// 5 failures; probes every schedule `max`.
    fn default() -> Self {
        Self {
            failures: 5,
            probe_every: None,
        }
    }
}

impl CircuitOptions {
    /// Checks the options; errors name `circuit.<option>`.
    pub fn validate(&self) -> Result<()> {
        if self.failures == 0 {
            return Err(Error::config(
                "circuit.failures",
                "must be at least 1, got 0",
            ));
        }
        if self.probe_every.is_some_and(|d| d.is_zero()) {
            // A zero period would re-probe an open circuit on every check.
            return Err(Error::config(
                "circuit.probe_every",
                "must be greater than zero",
            ));
        }
        Ok(())
    }

    /// How often an open circuit is probed, in milliseconds: `probe_every`, or the schedule's
    /// `max` when unset.
    pub fn probe_every_ms(&self, schedule: &ScheduleOptions) -> i64 {
        self.probe_every
            .map_or_else(|| schedule.max_ms(), duration_ms)
    }
}

impl ScheduleReason {
    /// The reason as reported to hooks: `events:speed-up`, `idle:back-off`, `not-modified`,
    /// `fixed`, `catch-up`, `paced`, `throttled`, `backoff`, `circuit-open`, `probe-failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            ScheduleReason::EventsSpeedUp => "events:speed-up",
            ScheduleReason::IdleBackOff => "idle:back-off",
            ScheduleReason::NotModified => "not-modified",
            ScheduleReason::Fixed => "fixed",
            ScheduleReason::CatchUp => "catch-up",
            ScheduleReason::Paced => "paced",
            ScheduleReason::Throttled => "throttled",
            ScheduleReason::Backoff => "backoff",
            ScheduleReason::CircuitOpen => "circuit-open",
            ScheduleReason::ProbeFailed => "probe-failed",
        }
    }
}

impl std::fmt::Display for ScheduleReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The schedule of a key seen for the first time: due at `now_ms`, interval `min`, circuit
/// closed, no failures and no history.
pub(crate) fn initial_schedule(options: &ScheduleOptions, now_ms: i64) -> ScheduleState {
    ScheduleState {
        next_due_at: Some(now_ms),
        interval_ms: Some(options.min_ms()),
        ..ScheduleState::default()
    }
}

/// Symmetric jitter: `round(interval · (1 + (2u − 1) · jitter))`, never negative, where `u` is a
/// uniform draw in `[0, 1)`.
///
/// A jitter of 0 (or one that is not a finite positive number) returns the interval exactly; a
/// `u` that is not finite counts as 0.5 (no jitter), and `u` is clamped to `[0, 1]`.
pub(crate) fn jittered(interval_ms: i64, jitter: f64, u: f64) -> i64 {
    let interval_ms = interval_ms.max(0);
    if !jitter.is_finite() || jitter <= 0.0 {
        return interval_ms;
    }
    let u = if u.is_finite() {
        u.clamp(0.0, 1.0)
    } else {
        0.5
    };
    let spread = (2.0 * u - 1.0) * jitter;
    f64_to_ms((ms_f64(interval_ms) * (1.0 + spread)).round())
}

/// Rate-limit pacing: when `remaining` and `reset_at` are known and the reset is after `now_ms`,
/// spaces requests so the remaining ones last until the reset.
///
/// With `window = reset_at − now`, the spacing is the whole window when nothing remains and
/// `window / remaining` otherwise; the result is `max(wait, ceil(spacing))`. Without usable
/// information the wait is returned unchanged (never negative).
pub fn apply_pacing(wait_ms: i64, rate_limit: Option<&RateLimitInfo>, now_ms: i64) -> i64 {
    let wait_ms = wait_ms.max(0);
    let Some(RateLimitInfo {
        remaining: Some(remaining),
        reset_at: Some(reset_at),
        ..
    }) = rate_limit
    else {
        return wait_ms;
    };
    let window = reset_at.saturating_sub(now_ms);
    if window <= 0 {
        return wait_ms;
    }
    let spacing = if *remaining <= 0 {
        window
    } else {
        // Both positive: an exact integer ceiling division.
        let quotient = window / remaining;
        if window % remaining == 0 {
            quotient
        } else {
            quotient + 1
        }
    };
    wait_ms.max(spacing)
}

/// Plans the next run after a successful live cycle (AIMD, jitter, then pacing).
///
/// The previous interval is the state's (or `min`) clamped to `[min, max]`. A truncated cycle keeps
/// it and is due at once (`catch-up`); `adaptive: false` pins `min` (`fixed`); an idle cycle (no
/// events, or 304) grows it by 1.5 up to `max` (`not-modified` / `idle:back-off`); events halve it
/// down to `min` (`events:speed-up`). The wait is the jittered interval (0 when truncated),
/// stretched by [`apply_pacing`]; when pacing stretched it the reason is `paced`.
///
/// Failures reset to 0, the circuit closes (`circuit_closed` when it was open or half-open), the
/// throttle and the last error are cleared, and `last_poll_at`, `rate_limit` and `last_poll` are
/// recorded.
pub(crate) fn after_success(
    state: &ScheduleState,
    options: &ScheduleOptions,
    circuit: &CircuitOptions,
    outcome: &SuccessOutcome,
    now_ms: i64,
    u: f64,
) -> ScheduleChange {
    // The circuit options are not needed to close the circuit; taken for symmetry.
    let _ = circuit;
    let previous = options.clamp_interval(state.interval_ms);
    let idle = outcome.not_modified || !outcome.had_events;
    let (interval_ms, mut reason) = if outcome.truncated {
        (previous, ScheduleReason::CatchUp)
    } else if !options.adaptive {
        (options.min_ms(), ScheduleReason::Fixed)
    } else if idle {
        let grown = f64_to_ms((ms_f64(previous) * GROWTH_FACTOR).round());
        let reason = if outcome.not_modified {
            ScheduleReason::NotModified
        } else {
            ScheduleReason::IdleBackOff
        };
        (grown.min(options.max_ms()), reason)
    } else {
        let halved = f64_to_ms((ms_f64(previous) / SPEED_UP_DIVISOR).round());
        (halved.max(options.min_ms()), ScheduleReason::EventsSpeedUp)
    };

    let base_wait = if outcome.truncated {
        0
    } else {
        jittered(interval_ms, options.jitter, u)
    };
    let wait = apply_pacing(base_wait, outcome.rate_limit.as_ref(), now_ms);
    if wait > base_wait {
        reason = ScheduleReason::Paced;
    }

    let circuit_closed = state.circuit != Circuit::Closed;
    ScheduleChange {
        state: ScheduleState {
            next_due_at: Some(now_ms.saturating_add(wait)),
            interval_ms: Some(interval_ms),
            consecutive_failures: 0,
            circuit: Circuit::Closed,
            circuit_opened_at: None,
            throttled_until: None,
            rate_limit: outcome.rate_limit.clone(),
            last_poll_at: Some(now_ms),
            last_poll: Some(outcome.summary.clone()),
            last_error: None,
        },
        reason,
        circuit_opened: false,
        circuit_closed,
    }
}

/// Plans the next run after a failed live cycle.
///
/// A throttle (429, or 503 with Retry-After) waits exactly `retry_after_ms` (or the current
/// interval, clamped to `[min, max]`, when absent): `next_due_at = throttled_until = now + wait`;
/// failures and the circuit are untouched (`throttled`).
///
/// Any other failure counts: when the circuit is not closed it is (or stays) open and the next
/// probe is at `now + probe_every` (`probe-failed`); when the count reaches `circuit.failures` the
/// circuit opens, `circuit_opened_at = now`, the probe is at `now + probe_every` and
/// `circuit_opened` is set (`circuit-open`); otherwise the key backs off with full jitter
/// (`backoff`). A throttle window that has already passed is cleared.
///
/// `last_error` is always recorded; `rate_limit` is replaced when the outcome carries one.
pub(crate) fn after_failure(
    state: &ScheduleState,
    options: &ScheduleOptions,
    circuit: &CircuitOptions,
    outcome: &FailureOutcome,
    now_ms: i64,
    u: f64,
) -> ScheduleChange {
    let rate_limit = outcome
        .rate_limit
        .clone()
        .or_else(|| state.rate_limit.clone());

    if outcome.is_throttle {
        let wait = outcome
            .retry_after_ms
            .unwrap_or_else(|| options.clamp_interval(state.interval_ms))
            .max(0);
        let until = now_ms.saturating_add(wait);
        return ScheduleChange {
            state: ScheduleState {
                next_due_at: Some(until),
                throttled_until: Some(until),
                rate_limit,
                last_error: Some(outcome.error.clone()),
                ..state.clone()
            },
            reason: ScheduleReason::Throttled,
            circuit_opened: false,
            circuit_closed: false,
        };
    }

    let failures = state.consecutive_failures.saturating_add(1);
    let probe_at = now_ms.saturating_add(circuit.probe_every_ms(options));
    let common = ScheduleState {
        consecutive_failures: failures,
        throttled_until: state.throttled_until.filter(|until| *until > now_ms),
        rate_limit,
        last_error: Some(outcome.error.clone()),
        ..state.clone()
    };

    let (state, reason, circuit_opened) = if state.circuit != Circuit::Closed {
        let next = ScheduleState {
            circuit: Circuit::Open,
            next_due_at: Some(probe_at),
            ..common
        };
        (next, ScheduleReason::ProbeFailed, false)
    } else if failures >= circuit.failures {
        let next = ScheduleState {
            circuit: Circuit::Open,
            circuit_opened_at: Some(now_ms),
            next_due_at: Some(probe_at),
            ..common
        };
        (next, ScheduleReason::CircuitOpen, true)
    } else {
        let delay = options.backoff.full_jitter_ms(failures, u);
        let next = ScheduleState {
            next_due_at: Some(now_ms.saturating_add(delay)),
            ..common
        };
        (next, ScheduleReason::Backoff, false)
    };
    ScheduleChange {
        state,
        reason,
        circuit_opened,
        circuit_closed: false,
    }
}

/// Opens the circuit after a poison event with action `halt`.
///
/// The circuit opens at `now` with the next probe at `now + probe_every`, the failure count
/// becomes at least `circuit.failures`, and `error` (the caller's `PoisonHalt` error) is recorded
/// as the last error. The change always reports `circuit_opened` with reason `circuit-open`, so
/// the circuit-open hook fires for every halt. The interval, throttle and history are untouched.
pub(crate) fn poison_halt(
    state: &ScheduleState,
    options: &ScheduleOptions,
    circuit: &CircuitOptions,
    error: SerializedError,
    now_ms: i64,
) -> ScheduleChange {
    ScheduleChange {
        state: ScheduleState {
            circuit: Circuit::Open,
            circuit_opened_at: Some(now_ms),
            next_due_at: Some(now_ms.saturating_add(circuit.probe_every_ms(options))),
            consecutive_failures: state.consecutive_failures.max(circuit.failures),
            last_error: Some(error),
            ..state.clone()
        },
        reason: ScheduleReason::CircuitOpen,
        circuit_opened: true,
        circuit_closed: false,
    }
}

/// Defers the key after a budget timeout (a deferral, not a failure): due again at
/// `now + retry_in_ms` (a negative delay counts as 0). Failures, the circuit and the last error
/// are untouched: a deferral is not a failure.
pub(crate) fn deferred(state: &ScheduleState, retry_in_ms: i64, now_ms: i64) -> ScheduleState {
    ScheduleState {
        next_due_at: Some(now_ms.saturating_add(retry_in_ms.max(0))),
        ..state.clone()
    }
}

/// Whether the key should run at `now_ms`: `next_due_at` is unset or has passed, and no
/// Retry-After window (`throttled_until`) is still active.
///
/// An open circuit is due once its probe time passes; that run is the half-open probe.
pub fn is_due(state: &ScheduleState, now_ms: i64) -> bool {
    let scheduled = state.next_due_at.is_none_or(|due| due <= now_ms);
    let throttled = state.throttled_until.is_some_and(|until| until > now_ms);
    scheduled && !throttled
}

/// Marks the start of a probe: an open circuit becomes half-open; any other state is returned
/// unchanged.
pub(crate) fn begin_probe(state: &ScheduleState) -> ScheduleState {
    let mut next = state.clone();
    if next.circuit == Circuit::Open {
        next.circuit = Circuit::HalfOpen;
    }
    next
}

/// Makes the key due at `now_ms` (a manual trigger): clears any throttle window; an open circuit
/// stays open, so the forced run is a probe.
pub(crate) fn make_due(state: &ScheduleState, now_ms: i64) -> ScheduleState {
    ScheduleState {
        next_due_at: Some(now_ms),
        throttled_until: None,
        ..state.clone()
    }
}

/// Milliseconds until the key is due: `max(0, max(next_due_at, throttled_until) − now)` over the
/// times that are set, 0 when neither is. Agrees with [`is_due`]: 0 exactly when the key is due.
pub(crate) fn time_until_due(state: &ScheduleState, now_ms: i64) -> i64 {
    match state
        .next_due_at
        .into_iter()
        .chain(state.throttled_until)
        .max()
    {
        Some(due) => due.saturating_sub(now_ms).max(0),
        None => 0,
    }
}

/// A cycle that succeeded after a poison `halt` opened the circuit during it (and announced
/// it): the success must not close the circuit again; the probe time and the error stay the
/// halt's.
pub(crate) fn keep_halt(mut change: ScheduleChange, halted: &ScheduleState) -> ScheduleChange {
    change.state = ScheduleState {
        circuit: halted.circuit,
        circuit_opened_at: halted.circuit_opened_at,
        next_due_at: halted.next_due_at,
        consecutive_failures: halted.consecutive_failures,
        last_error: halted.last_error.clone(),
        ..change.state
    };
    change.reason = ScheduleReason::CircuitOpen;
    change.circuit_closed = false;
    change
}

/// A reconcile or backfill cycle failed: the lane counts the failure and waits a full-jitter
/// backoff (the poller's `backoff`, `u` in `[0, 1)`), never touching the live schedule.
pub(crate) fn lane_failed(lane: &mut LaneCursor, options: &ScheduleOptions, u: f64, now_ms: i64) {
    let failures = lane.failures.unwrap_or(0).saturating_add(1);
    let delay = options.backoff.full_jitter_ms(failures, u);
    lane.failures = Some(failures);
    lane.retry_at = Some(now_ms.saturating_add(delay.max(1)));
}

/// When the reconcile lane is next due, if the poller has one (`every`: its interval): `every`
/// after its last complete (or page-capped) listing, and not before a failure's backoff ends.
pub(crate) fn reconcile_due_at(every: Option<Duration>, state: &PollerState) -> Option<i64> {
    let every = crate::clock::duration_ms(every?);
    let lane = state.lanes.reconcile.as_ref();
    let after_last = lane
        .and_then(|l| l.last_run_at)
        .map_or(i64::MIN, |t| t.saturating_add(every));
    let retry = lane.and_then(|l| l.retry_at).unwrap_or(i64::MIN);
    Some(after_last.max(retry))
}

/// When an unfinished backfill may run next (not before a failure's backoff ends).
pub(crate) fn backfill_due_at(state: &PollerState) -> Option<i64> {
    let lane = state
        .lanes
        .backfill
        .as_ref()
        .filter(|l| l.done != Some(true))?;
    Some(lane.retry_at.unwrap_or(i64::MIN))
}

/// Whether the reconcile lane is due at `now_ms`.
pub(crate) fn reconcile_due(every: Option<Duration>, state: &PollerState, now_ms: i64) -> bool {
    reconcile_due_at(every, state).is_some_and(|at| at <= now_ms)
}

/// Whether an unfinished backfill may run at `now_ms`.
pub(crate) fn backfill_due(state: &PollerState, now_ms: i64) -> bool {
    backfill_due_at(state).is_some_and(|at| at <= now_ms)
}

/// Whether any lane of the key is due at `now_ms`: the live schedule, the reconcile lane or an
/// unfinished backfill (`reconcile_every`: the reconcile lane's interval, if the poller has one).
pub(crate) fn key_due(reconcile_every: Option<Duration>, state: &PollerState, now_ms: i64) -> bool {
    is_due(&state.schedule, now_ms)
        || reconcile_due(reconcile_every, state, now_ms)
        || backfill_due(state, now_ms)
}

/// When the key's earliest lane is next due (never before `now_ms`).
pub(crate) fn key_due_at(
    reconcile_every: Option<Duration>,
    state: &PollerState,
    now_ms: i64,
) -> i64 {
    let live = now_ms.saturating_add(time_until_due(&state.schedule, now_ms));
    [
        reconcile_due_at(reconcile_every, state),
        backfill_due_at(state),
    ]
    .into_iter()
    .flatten()
    .fold(live, |due, at| due.min(at.max(now_ms)))
}

/// The earlier of two optional times (either, when only one is set).
pub(crate) fn earliest(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{EventCounts, Lane, RateLimitSource};

    const NOW: i64 = 1_767_225_600_000;

    /// The pinned AIMD options: min 5 s, max 40 s, jitter 0.
    fn aimd() -> ScheduleOptions {
        ScheduleOptions {
            min: Duration::from_secs(5),
            max: Duration::from_secs(40),
            jitter: 0.0,
            ..ScheduleOptions::default()
        }
    }

    fn summary() -> PollSummary {
        PollSummary {
            lane: Lane::Live,
            started_at: NOW - 120,
            duration_ms: 120,
            pages: 1,
            items: 3,
            events: EventCounts::default(),
            not_modified: false,
            truncated: false,
            quarantined: 0,
        }
    }

    fn success(had_events: bool, not_modified: bool, truncated: bool) -> SuccessOutcome {
        SuccessOutcome {
            had_events,
            not_modified,
            truncated,
            rate_limit: None,
            summary: summary(),
        }
    }

    fn idle() -> SuccessOutcome {
        success(false, false, false)
    }

    fn busy() -> SuccessOutcome {
        success(true, false, false)
    }

    fn failure() -> FailureOutcome {
        FailureOutcome {
            error: SerializedError::new("HttpError", "500 Internal Server Error"),
            retry_after_ms: None,
            is_throttle: false,
            rate_limit: None,
        }
    }

    fn throttle(retry_after_ms: Option<i64>) -> FailureOutcome {
        FailureOutcome {
            error: SerializedError::new("HttpError", "429 Too Many Requests"),
            retry_after_ms,
            is_throttle: true,
            rate_limit: None,
        }
    }

    fn rate_limit(remaining: Option<i64>, reset_at: Option<i64>) -> RateLimitInfo {
        RateLimitInfo {
            limit: Some(100),
            remaining,
            reset_at,
            policy: None,
            source: RateLimitSource::Ietf,
        }
    }

    fn with_interval(interval_ms: i64) -> ScheduleState {
        ScheduleState {
            interval_ms: Some(interval_ms),
            ..initial_schedule(&aimd(), NOW - 1_000)
        }
    }

    #[test]
    fn defaults_follow_the_spec() {
        let schedule = ScheduleOptions::default();
        assert_eq!(schedule.min, Duration::from_secs(30));
        assert_eq!(schedule.max, Duration::from_secs(300));
        assert!(schedule.adaptive);
        assert!((schedule.jitter - 0.1).abs() < f64::EPSILON);
        assert_eq!(
            schedule.backoff,
            Backoff::new(Duration::from_secs(1), 2.0, Duration::from_secs(600))
        );
        schedule.validate().unwrap();

        let circuit = CircuitOptions::default();
        assert_eq!(circuit.failures, 5);
        assert_eq!(circuit.probe_every, None);
        circuit.validate().unwrap();
        assert_eq!(circuit.probe_every_ms(&schedule), 300_000);
        assert_eq!(circuit.probe_every_ms(&aimd()), 40_000);
        let explicit = CircuitOptions {
            probe_every: Some(Duration::from_secs(90)),
            ..circuit
        };
        assert_eq!(explicit.probe_every_ms(&schedule), 90_000);
    }

    #[test]
    fn reasons_have_the_reference_names() {
        let names = [
            (ScheduleReason::EventsSpeedUp, "events:speed-up"),
            (ScheduleReason::IdleBackOff, "idle:back-off"),
            (ScheduleReason::NotModified, "not-modified"),
            (ScheduleReason::Fixed, "fixed"),
            (ScheduleReason::CatchUp, "catch-up"),
            (ScheduleReason::Paced, "paced"),
            (ScheduleReason::Throttled, "throttled"),
            (ScheduleReason::Backoff, "backoff"),
            (ScheduleReason::CircuitOpen, "circuit-open"),
            (ScheduleReason::ProbeFailed, "probe-failed"),
        ];
        for (reason, name) in names {
            assert_eq!(reason.as_str(), name);
            assert_eq!(reason.to_string(), name);
        }
    }

    #[test]
    fn initial_schedule_is_due_now_at_min() {
        let state = initial_schedule(&aimd(), NOW);
        assert_eq!(state.next_due_at, Some(NOW));
        assert_eq!(state.interval_ms, Some(5_000));
        assert_eq!(state.consecutive_failures, 0);
        assert_eq!(state.circuit, Circuit::Closed);
        assert_eq!(state.circuit_opened_at, None);
        assert_eq!(state.throttled_until, None);
        assert_eq!(state.last_error, None);
        assert!(is_due(&state, NOW));
        assert!(!is_due(&state, NOW - 1));
    }

    #[test]
    fn jitter_is_pinned_for_fixed_draws() {
        assert_eq!(jittered(10_000, 0.1, 0.0), 9_000);
        assert_eq!(jittered(10_000, 0.1, 0.25), 9_500);
        assert_eq!(jittered(10_000, 0.1, 0.5), 10_000);
        assert_eq!(jittered(10_000, 0.1, 0.75), 10_500);
        assert_eq!(jittered(10_000, 0.1, 0.999_999), 11_000);
        assert_eq!(
            jittered(7_777, 0.2, 0.1),
            6_533,
            "round(7777 * (1 + (2 * 0.1 - 1) * 0.2)) = round(6532.68)"
        );
    }

    #[test]
    fn zero_jitter_is_exact_and_bad_inputs_do_not_panic() {
        for u in [0.0, 0.3, 0.999] {
            assert_eq!(jittered(11_250, 0.0, u), 11_250);
        }
        assert_eq!(jittered(-5, 0.1, 0.0), 0, "never negative");
        assert_eq!(
            jittered(10_000, 0.1, f64::NAN),
            10_000,
            "a NaN draw counts as no jitter"
        );
        assert_eq!(jittered(10_000, f64::NAN, 0.0), 10_000);
        assert_eq!(
            jittered(10_000, 0.1, 7.0),
            11_000,
            "draws are clamped to [0, 1]"
        );
    }

    #[test]
    fn aimd_sequence_is_pinned() {
        let options = aimd();
        let circuit = CircuitOptions::default();
        let start = initial_schedule(&options, NOW);
        assert_eq!(start.interval_ms, Some(5_000));

        let first = after_success(&start, &options, &circuit, &idle(), NOW, 0.9);
        assert_eq!(first.state.interval_ms, Some(7_500));
        assert_eq!(first.state.next_due_at, Some(NOW + 7_500));
        assert_eq!(first.reason, ScheduleReason::IdleBackOff);

        let later = NOW + 7_500;
        let second = after_success(&first.state, &options, &circuit, &idle(), later, 0.1);
        assert_eq!(second.state.interval_ms, Some(11_250));
        assert_eq!(second.state.next_due_at, Some(later + 11_250));
        assert_eq!(second.reason, ScheduleReason::IdleBackOff);

        let third = after_success(&second.state, &options, &circuit, &busy(), later, 0.5);
        assert_eq!(third.state.interval_ms, Some(5_625));
        assert_eq!(third.state.next_due_at, Some(later + 5_625));
        assert_eq!(third.reason, ScheduleReason::EventsSpeedUp);
        assert!(!third.circuit_closed && !third.circuit_opened);
    }

    #[test]
    fn jitter_applies_to_the_wait_not_the_interval() {
        let options = ScheduleOptions {
            jitter: 0.1,
            ..aimd()
        };
        let change = after_success(
            &with_interval(10_000),
            &options,
            &CircuitOptions::default(),
            &idle(),
            NOW,
            0.0,
        );
        assert_eq!(change.state.interval_ms, Some(15_000));
        assert_eq!(change.state.next_due_at, Some(NOW + 13_500));
    }

    #[test]
    fn the_interval_is_clamped_to_min_and_max() {
        let options = aimd();
        let circuit = CircuitOptions::default();
        let grow = |interval| {
            after_success(
                &with_interval(interval),
                &options,
                &circuit,
                &idle(),
                NOW,
                0.5,
            )
        };
        let shrink = |interval| {
            after_success(
                &with_interval(interval),
                &options,
                &circuit,
                &busy(),
                NOW,
                0.5,
            )
        };

        assert_eq!(
            grow(30_000).state.interval_ms,
            Some(40_000),
            "capped at max"
        );
        assert_eq!(grow(40_000).state.interval_ms, Some(40_000));
        assert_eq!(
            grow(100_000).state.interval_ms,
            Some(40_000),
            "a stored interval above max is clamped first"
        );
        assert_eq!(
            grow(1_000).state.interval_ms,
            Some(7_500),
            "a stored interval below min is clamped first"
        );
        assert_eq!(
            shrink(6_000).state.interval_ms,
            Some(5_000),
            "floored at min"
        );
        assert_eq!(shrink(5_000).state.interval_ms, Some(5_000));
        assert_eq!(shrink(100_000).state.interval_ms, Some(20_000));
        assert_eq!(
            shrink(9_999).state.interval_ms,
            Some(5_000),
            "round(4999.5) = 5000, then min"
        );

        let unset = ScheduleState::default();
        let change = after_success(&unset, &options, &circuit, &idle(), NOW, 0.5);
        assert_eq!(
            change.state.interval_ms,
            Some(7_500),
            "no interval counts as min"
        );
    }

    #[test]
    fn a_truncated_cycle_catches_up_at_once() {
        let options = aimd();
        let circuit = CircuitOptions::default();
        for outcome in [success(true, false, true), success(false, false, true)] {
            let change = after_success(
                &with_interval(11_250),
                &options,
                &circuit,
                &outcome,
                NOW,
                0.9,
            );
            assert_eq!(change.reason, ScheduleReason::CatchUp);
            assert_eq!(
                change.state.interval_ms,
                Some(11_250),
                "the interval is unchanged"
            );
            assert_eq!(change.state.next_due_at, Some(NOW));
            assert!(is_due(&change.state, NOW));
        }
        let jittery = ScheduleOptions {
            jitter: 0.5,
            ..options
        };
        let change = after_success(
            &with_interval(100_000),
            &jittery,
            &circuit,
            &success(false, false, true),
            NOW,
            0.9,
        );
        assert_eq!(change.state.interval_ms, Some(40_000), "clamped, not grown");
        assert_eq!(
            change.state.next_due_at,
            Some(NOW),
            "no jitter on a catch-up"
        );
    }

    #[test]
    fn a_fixed_schedule_always_uses_min() {
        let options = ScheduleOptions {
            adaptive: false,
            ..aimd()
        };
        let circuit = CircuitOptions::default();
        for outcome in [idle(), busy(), success(false, true, false)] {
            let change = after_success(
                &with_interval(20_000),
                &options,
                &circuit,
                &outcome,
                NOW,
                0.5,
            );
            assert_eq!(change.reason, ScheduleReason::Fixed);
            assert_eq!(change.state.interval_ms, Some(5_000));
            assert_eq!(change.state.next_due_at, Some(NOW + 5_000));
        }
    }

    #[test]
    fn not_modified_is_idle_with_its_own_reason() {
        let options = aimd();
        let change = after_success(
            &with_interval(8_000),
            &options,
            &CircuitOptions::default(),
            &success(false, true, false),
            NOW,
            0.5,
        );
        assert_eq!(change.reason, ScheduleReason::NotModified);
        assert_eq!(change.state.interval_ms, Some(12_000));
        assert_eq!(change.state.next_due_at, Some(NOW + 12_000));
    }

    #[test]
    fn pacing_spreads_the_remaining_requests_over_the_window() {
        let reset = NOW + 10_000;
        let none_left = rate_limit(Some(0), Some(reset));
        assert_eq!(
            apply_pacing(1_000, Some(&none_left), NOW),
            10_000,
            "nothing left: the whole window"
        );
        let negative = rate_limit(Some(-3), Some(reset));
        assert_eq!(apply_pacing(1_000, Some(&negative), NOW), 10_000);
        let four = rate_limit(Some(4), Some(reset));
        assert_eq!(apply_pacing(1_000, Some(&four), NOW), 2_500);
        let three = rate_limit(Some(3), Some(reset));
        assert_eq!(
            apply_pacing(1_000, Some(&three), NOW),
            3_334,
            "the spacing is rounded up"
        );
        assert_eq!(
            apply_pacing(4_000, Some(&four), NOW),
            4_000,
            "never shortens the wait"
        );
    }

    #[test]
    fn pacing_ignores_unusable_information() {
        let past = rate_limit(Some(0), Some(NOW - 1));
        assert_eq!(
            apply_pacing(1_000, Some(&past), NOW),
            1_000,
            "reset in the past"
        );
        let now = rate_limit(Some(0), Some(NOW));
        assert_eq!(apply_pacing(1_000, Some(&now), NOW), 1_000, "reset now");
        let no_remaining = rate_limit(None, Some(NOW + 10_000));
        assert_eq!(apply_pacing(1_000, Some(&no_remaining), NOW), 1_000);
        let no_reset = rate_limit(Some(0), None);
        assert_eq!(apply_pacing(1_000, Some(&no_reset), NOW), 1_000);
        assert_eq!(apply_pacing(1_000, None, NOW), 1_000);
        assert_eq!(apply_pacing(-1, None, NOW), 0, "never negative");
        let far = rate_limit(Some(1), Some(i64::MAX));
        assert_eq!(apply_pacing(0, Some(&far), i64::MIN), i64::MAX, "saturates");
    }

    #[test]
    fn pacing_that_stretches_the_wait_reports_paced() {
        let options = aimd();
        let circuit = CircuitOptions::default();
        let mut outcome = idle();
        outcome.rate_limit = Some(rate_limit(Some(0), Some(NOW + 60_000)));
        let change = after_success(
            &with_interval(5_000),
            &options,
            &circuit,
            &outcome,
            NOW,
            0.5,
        );
        assert_eq!(change.reason, ScheduleReason::Paced);
        assert_eq!(
            change.state.interval_ms,
            Some(7_500),
            "pacing stretches the wait, not the interval"
        );
        assert_eq!(change.state.next_due_at, Some(NOW + 60_000));
        assert_eq!(change.state.rate_limit, outcome.rate_limit);

        let mut truncated = success(true, false, true);
        truncated.rate_limit = Some(rate_limit(Some(4), Some(NOW + 10_000)));
        let change = after_success(
            &with_interval(5_000),
            &options,
            &circuit,
            &truncated,
            NOW,
            0.5,
        );
        assert_eq!(
            change.reason,
            ScheduleReason::Paced,
            "a catch-up is paced too"
        );
        assert_eq!(change.state.next_due_at, Some(NOW + 2_500));

        let mut relaxed = idle();
        relaxed.rate_limit = Some(rate_limit(Some(50), Some(NOW + 10_000)));
        let change = after_success(
            &with_interval(5_000),
            &options,
            &circuit,
            &relaxed,
            NOW,
            0.5,
        );
        assert_eq!(
            change.reason,
            ScheduleReason::IdleBackOff,
            "pacing that does not stretch is silent"
        );
        assert_eq!(change.state.next_due_at, Some(NOW + 7_500));
    }

    #[test]
    fn success_resets_failures_and_records_the_poll() {
        let options = aimd();
        let circuit = CircuitOptions::default();
        let troubled = ScheduleState {
            consecutive_failures: 3,
            throttled_until: Some(NOW + 5_000),
            rate_limit: Some(rate_limit(Some(1), Some(NOW - 10))),
            last_error: Some(SerializedError::new("HttpError", "boom")),
            last_poll_at: Some(NOW - 60_000),
            ..with_interval(10_000)
        };
        let change = after_success(&troubled, &options, &circuit, &busy(), NOW, 0.5);
        let state = &change.state;
        assert_eq!(state.consecutive_failures, 0);
        assert_eq!(state.circuit, Circuit::Closed);
        assert_eq!(state.throttled_until, None);
        assert_eq!(state.last_error, None);
        assert_eq!(state.rate_limit, None, "replaced by the outcome's");
        assert_eq!(state.last_poll_at, Some(NOW));
        assert_eq!(state.last_poll, Some(summary()));
        assert!(!change.circuit_closed, "it was already closed");
    }

    #[test]
    fn a_successful_probe_closes_the_circuit() {
        let options = aimd();
        let circuit = CircuitOptions::default();
        for position in [Circuit::Open, Circuit::HalfOpen] {
            let open = ScheduleState {
                circuit: position,
                circuit_opened_at: Some(NOW - 40_000),
                consecutive_failures: 6,
                last_error: Some(SerializedError::new("HttpError", "boom")),
                ..with_interval(10_000)
            };
            let change = after_success(&open, &options, &circuit, &idle(), NOW, 0.5);
            assert!(change.circuit_closed);
            assert!(!change.circuit_opened);
            assert_eq!(change.state.circuit, Circuit::Closed);
            assert_eq!(change.state.circuit_opened_at, None);
            assert_eq!(change.state.consecutive_failures, 0);
            assert_eq!(change.state.last_error, None);
            assert_eq!(change.reason, ScheduleReason::IdleBackOff);
        }
    }

    #[test]
    fn a_throttle_waits_exactly_retry_after() {
        let options = aimd();
        let circuit = CircuitOptions::default();
        let before = ScheduleState {
            consecutive_failures: 2,
            ..with_interval(10_000)
        };
        let mut outcome = throttle(Some(7_000));
        outcome.rate_limit = Some(rate_limit(Some(0), Some(NOW + 7_000)));
        let change = after_failure(&before, &options, &circuit, &outcome, NOW, 0.9);
        assert_eq!(change.reason, ScheduleReason::Throttled);
        assert_eq!(change.state.next_due_at, Some(NOW + 7_000));
        assert_eq!(change.state.throttled_until, Some(NOW + 7_000));
        assert_eq!(
            change.state.consecutive_failures, 2,
            "a throttle is not a failure"
        );
        assert_eq!(change.state.circuit, Circuit::Closed);
        assert_eq!(change.state.interval_ms, Some(10_000));
        assert_eq!(change.state.last_error, Some(outcome.error.clone()));
        assert_eq!(change.state.rate_limit, outcome.rate_limit);
        assert!(!change.circuit_opened && !change.circuit_closed);
        assert!(!is_due(&change.state, NOW + 6_999));
        assert!(is_due(&change.state, NOW + 7_000));

        let half_open = ScheduleState {
            circuit: Circuit::HalfOpen,
            circuit_opened_at: Some(NOW - 1),
            ..before
        };
        let change = after_failure(&half_open, &options, &circuit, &throttle(Some(0)), NOW, 0.9);
        assert_eq!(
            change.state.circuit,
            Circuit::HalfOpen,
            "the circuit is untouched"
        );
        assert_eq!(change.state.circuit_opened_at, Some(NOW - 1));
        assert_eq!(change.state.consecutive_failures, 2);
        assert_eq!(change.state.next_due_at, Some(NOW));
        assert!(!change.circuit_opened);
    }

    #[test]
    fn a_throttle_without_retry_after_waits_one_interval() {
        let options = aimd();
        let circuit = CircuitOptions::default();
        let wait = |state: &ScheduleState| {
            let change = after_failure(state, &options, &circuit, &throttle(None), NOW, 0.9);
            assert_eq!(change.reason, ScheduleReason::Throttled);
            assert_eq!(
                change.state.consecutive_failures,
                state.consecutive_failures
            );
            assert_eq!(change.state.throttled_until, change.state.next_due_at);
            change.state.next_due_at.map(|due| due - NOW)
        };
        assert_eq!(wait(&with_interval(10_000)), Some(10_000));
        assert_eq!(
            wait(&with_interval(100_000)),
            Some(40_000),
            "clamped to max"
        );
        assert_eq!(
            wait(&ScheduleState::default()),
            Some(5_000),
            "min when unset"
        );
        let negative = after_failure(
            &with_interval(10_000),
            &options,
            &circuit,
            &throttle(Some(-50)),
            NOW,
            0.9,
        );
        assert_eq!(
            negative.state.next_due_at,
            Some(NOW),
            "a negative Retry-After is 0"
        );
    }

    #[test]
    fn failures_below_the_threshold_back_off_with_full_jitter() {
        let options = ScheduleOptions::default();
        let circuit = CircuitOptions::default();
        let first = after_failure(
            &initial_schedule(&options, NOW),
            &options,
            &circuit,
            &failure(),
            NOW,
            0.5,
        );
        assert_eq!(first.reason, ScheduleReason::Backoff);
        assert_eq!(first.state.consecutive_failures, 1);
        assert_eq!(
            first.state.next_due_at,
            Some(NOW + 500),
            "round(0.5 * 1000)"
        );
        assert_eq!(first.state.circuit, Circuit::Closed);
        assert_eq!(first.state.last_error, Some(failure().error));
        assert!(!first.circuit_opened);

        let third_state = ScheduleState {
            consecutive_failures: 2,
            ..first.state.clone()
        };
        let third = after_failure(&third_state, &options, &circuit, &failure(), NOW, 0.3);
        assert_eq!(third.state.consecutive_failures, 3);
        assert_eq!(
            third.state.next_due_at,
            Some(NOW + 1_200),
            "round(0.3 * 4000)"
        );
        assert_eq!(
            third.state.interval_ms, first.state.interval_ms,
            "the interval is untouched"
        );
    }

    #[test]
    fn failures_keep_an_active_throttle_and_the_stored_rate_limit() {
        let options = aimd();
        let circuit = CircuitOptions::default();
        let stored = Some(rate_limit(Some(9), Some(NOW + 1_000)));
        let active = ScheduleState {
            throttled_until: Some(NOW + 3_000),
            rate_limit: stored.clone(),
            ..with_interval(10_000)
        };
        let change = after_failure(&active, &options, &circuit, &failure(), NOW, 0.0);
        assert_eq!(change.state.throttled_until, Some(NOW + 3_000));
        assert_eq!(
            change.state.rate_limit, stored,
            "kept when the outcome has none"
        );
        assert!(!is_due(&change.state, NOW + 2_999));

        let stale = ScheduleState {
            throttled_until: Some(NOW - 1),
            ..active
        };
        let mut outcome = failure();
        outcome.rate_limit = Some(rate_limit(Some(1), None));
        let change = after_failure(&stale, &options, &circuit, &outcome, NOW, 0.0);
        assert_eq!(
            change.state.throttled_until, None,
            "a passed throttle is cleared"
        );
        assert_eq!(
            change.state.rate_limit, outcome.rate_limit,
            "replaced when given"
        );
    }

    #[test]
    fn the_circuit_opens_at_exactly_the_threshold_and_once() {
        let options = aimd();
        let circuit = CircuitOptions {
            failures: 3,
            probe_every: Some(Duration::from_secs(90)),
        };
        let mut state = initial_schedule(&options, NOW);
        let mut opened = 0;
        let mut reasons = Vec::new();
        for n in 1..=5_i64 {
            let now = NOW + n * 100_000;
            let change = after_failure(&state, &options, &circuit, &failure(), now, 0.5);
            if change.circuit_opened {
                opened += 1;
                assert_eq!(change.state.consecutive_failures, 3);
                assert_eq!(change.state.circuit_opened_at, Some(now));
            }
            if change.state.circuit == Circuit::Open {
                assert_eq!(change.state.next_due_at, Some(now + 90_000));
            }
            reasons.push(change.reason);
            state = change.state;
        }
        assert_eq!(opened, 1);
        assert_eq!(
            reasons,
            vec![
                ScheduleReason::Backoff,
                ScheduleReason::Backoff,
                ScheduleReason::CircuitOpen,
                ScheduleReason::ProbeFailed,
                ScheduleReason::ProbeFailed,
            ]
        );
        assert_eq!(state.consecutive_failures, 5);
        assert_eq!(
            state.circuit_opened_at,
            Some(NOW + 300_000),
            "when it first opened"
        );
    }

    #[test]
    fn a_failed_probe_keeps_the_circuit_open() {
        let options = aimd();
        let circuit = CircuitOptions::default();
        let open = ScheduleState {
            circuit: Circuit::Open,
            circuit_opened_at: Some(NOW - 40_000),
            consecutive_failures: 5,
            next_due_at: Some(NOW),
            ..with_interval(10_000)
        };
        assert!(is_due(&open, NOW));
        let probing = begin_probe(&open);
        assert_eq!(probing.circuit, Circuit::HalfOpen);
        let change = after_failure(&probing, &options, &circuit, &failure(), NOW, 0.5);
        assert_eq!(change.reason, ScheduleReason::ProbeFailed);
        assert_eq!(change.state.circuit, Circuit::Open);
        assert_eq!(change.state.consecutive_failures, 6);
        assert_eq!(
            change.state.next_due_at,
            Some(NOW + 40_000),
            "probe_every defaults to max"
        );
        assert_eq!(change.state.circuit_opened_at, Some(NOW - 40_000));
        assert!(!change.circuit_opened && !change.circuit_closed);
    }

    #[test]
    fn a_poison_halt_opens_the_circuit() {
        let options = aimd();
        let circuit = CircuitOptions::default();
        let error = SerializedError::new(
            "PoisonHalt",
            "poison event with action \"halt\"; circuit opened",
        );
        let before = ScheduleState {
            consecutive_failures: 1,
            throttled_until: Some(NOW + 1_000),
            ..with_interval(10_000)
        };
        let change = poison_halt(&before, &options, &circuit, error.clone(), NOW);
        assert_eq!(change.reason, ScheduleReason::CircuitOpen);
        assert!(change.circuit_opened && !change.circuit_closed);
        assert_eq!(change.state.circuit, Circuit::Open);
        assert_eq!(change.state.circuit_opened_at, Some(NOW));
        assert_eq!(change.state.next_due_at, Some(NOW + 40_000));
        assert_eq!(
            change.state.consecutive_failures, 5,
            "raised to circuit.failures"
        );
        assert_eq!(
            change.state.last_error.as_ref().map(|e| e.name.as_str()),
            Some("PoisonHalt")
        );
        assert_eq!(change.state.interval_ms, Some(10_000));
        assert_eq!(change.state.throttled_until, Some(NOW + 1_000));

        let many = ScheduleState {
            consecutive_failures: 7,
            ..before
        };
        let change = poison_halt(&many, &options, &circuit, error, NOW);
        assert_eq!(change.state.consecutive_failures, 7, "never lowered");
    }

    #[test]
    fn a_deferral_is_not_a_failure() {
        let before = ScheduleState {
            consecutive_failures: 2,
            circuit: Circuit::HalfOpen,
            last_error: Some(SerializedError::new("HttpError", "boom")),
            ..with_interval(10_000)
        };
        let after = deferred(&before, 2_500, NOW);
        assert_eq!(after.next_due_at, Some(NOW + 2_500));
        assert_eq!(
            ScheduleState {
                next_due_at: before.next_due_at,
                ..after
            },
            before,
            "nothing else changes"
        );
        assert_eq!(deferred(&before, -10, NOW).next_due_at, Some(NOW));
    }

    #[test]
    fn is_due_honours_next_due_at_and_the_throttle() {
        let unscheduled = ScheduleState::default();
        assert!(is_due(&unscheduled, NOW), "no next_due_at is due");
        assert_eq!(time_until_due(&unscheduled, NOW), 0);

        let scheduled = ScheduleState {
            next_due_at: Some(NOW + 1_000),
            ..ScheduleState::default()
        };
        assert!(!is_due(&scheduled, NOW));
        assert!(!is_due(&scheduled, NOW + 999));
        assert!(is_due(&scheduled, NOW + 1_000));
        assert!(is_due(&scheduled, NOW + 5_000));
        assert_eq!(time_until_due(&scheduled, NOW), 1_000);
        assert_eq!(time_until_due(&scheduled, NOW + 5_000), 0);

        let throttled = ScheduleState {
            next_due_at: Some(NOW - 1_000),
            throttled_until: Some(NOW + 2_000),
            ..ScheduleState::default()
        };
        assert!(!is_due(&throttled, NOW), "an active throttle wins");
        assert!(is_due(&throttled, NOW + 2_000));
        assert_eq!(time_until_due(&throttled, NOW), 2_000);

        let throttled_unscheduled = ScheduleState {
            throttled_until: Some(NOW + 3_000),
            ..ScheduleState::default()
        };
        assert!(!is_due(&throttled_unscheduled, NOW));
        assert_eq!(time_until_due(&throttled_unscheduled, NOW), 3_000);

        for state in [&unscheduled, &scheduled, &throttled, &throttled_unscheduled] {
            for now in [
                NOW - 5_000,
                NOW,
                NOW + 999,
                NOW + 1_000,
                NOW + 2_000,
                NOW + 3_000,
            ] {
                assert_eq!(
                    is_due(state, now),
                    time_until_due(state, now) == 0,
                    "{state:?} at {now}"
                );
            }
        }
    }

    #[test]
    fn begin_probe_only_moves_an_open_circuit() {
        for (from, to) in [
            (Circuit::Open, Circuit::HalfOpen),
            (Circuit::HalfOpen, Circuit::HalfOpen),
            (Circuit::Closed, Circuit::Closed),
        ] {
            let state = ScheduleState {
                circuit: from,
                ..with_interval(10_000)
            };
            let next = begin_probe(&state);
            assert_eq!(next.circuit, to);
            assert_eq!(
                ScheduleState {
                    circuit: from,
                    ..next
                },
                state
            );
        }
    }

    #[test]
    fn make_due_clears_the_throttle_but_not_the_circuit() {
        let state = ScheduleState {
            next_due_at: Some(NOW + 60_000),
            throttled_until: Some(NOW + 60_000),
            circuit: Circuit::Open,
            circuit_opened_at: Some(NOW - 1),
            consecutive_failures: 5,
            ..with_interval(10_000)
        };
        let due = make_due(&state, NOW);
        assert_eq!(due.next_due_at, Some(NOW));
        assert_eq!(due.throttled_until, None);
        assert_eq!(due.circuit, Circuit::Open);
        assert_eq!(due.circuit_opened_at, Some(NOW - 1));
        assert_eq!(due.consecutive_failures, 5);
        assert!(is_due(&due, NOW));
    }

    #[test]
    fn invalid_options_name_the_option() {
        let base = ScheduleOptions::default();
        let cases = [
            (
                ScheduleOptions {
                    min: Duration::ZERO,
                    ..base
                },
                "schedule.min",
            ),
            (
                ScheduleOptions {
                    min: Duration::from_micros(500),
                    ..base
                },
                "schedule.min",
            ),
            (
                ScheduleOptions {
                    max: Duration::from_secs(10),
                    ..base
                },
                "schedule.max",
            ),
            (
                ScheduleOptions {
                    jitter: 1.0,
                    ..base
                },
                "schedule.jitter",
            ),
            (
                ScheduleOptions {
                    jitter: -0.1,
                    ..base
                },
                "schedule.jitter",
            ),
            (
                ScheduleOptions {
                    jitter: f64::NAN,
                    ..base
                },
                "schedule.jitter",
            ),
            (
                ScheduleOptions {
                    jitter: f64::INFINITY,
                    ..base
                },
                "schedule.jitter",
            ),
            (
                ScheduleOptions {
                    backoff: Backoff::new(Duration::from_secs(1), 0.5, Duration::from_secs(10)),
                    ..base
                },
                "schedule.backoff.factor",
            ),
            (
                ScheduleOptions {
                    backoff: Backoff::new(Duration::from_secs(10), 2.0, Duration::from_secs(1)),
                    ..base
                },
                "schedule.backoff.max",
            ),
        ];
        for (options, option) in cases {
            assert_eq!(
                options.validate().unwrap_err().config_option(),
                Some(option)
            );
        }
        let circuit = CircuitOptions {
            failures: 0,
            probe_every: None,
        };
        assert_eq!(
            circuit.validate().unwrap_err().config_option(),
            Some("circuit.failures")
        );
    }

    #[test]
    fn boundary_options_are_valid() {
        let equal = ScheduleOptions {
            min: Duration::from_secs(5),
            max: Duration::from_secs(5),
            jitter: 0.0,
            ..ScheduleOptions::default()
        };
        equal.validate().unwrap();
        ScheduleOptions {
            jitter: 0.999,
            ..equal
        }
        .validate()
        .unwrap();
        ScheduleOptions {
            min: Duration::from_millis(1),
            ..equal
        }
        .validate()
        .unwrap();
        CircuitOptions {
            failures: 1,
            probe_every: Some(Duration::from_millis(1)),
        }
        .validate()
        .unwrap();
        let zero = CircuitOptions {
            failures: 1,
            probe_every: Some(Duration::ZERO),
        };
        let err = zero.validate().unwrap_err();
        assert!(err.to_string().contains("circuit.probe_every"), "{err}");
    }

    #[test]
    fn invalid_options_never_panic() {
        let inverted = ScheduleOptions {
            min: Duration::from_secs(60),
            max: Duration::from_secs(10),
            jitter: f64::NAN,
            ..ScheduleOptions::default()
        };
        let circuit = CircuitOptions {
            failures: 0,
            probe_every: Some(Duration::MAX),
        };
        let state = ScheduleState {
            interval_ms: Some(i64::MAX),
            consecutive_failures: u32::MAX,
            ..ScheduleState::default()
        };
        let change = after_success(&state, &inverted, &circuit, &idle(), i64::MAX - 1, f64::NAN);
        assert!(change.state.next_due_at.is_some());
        let change = after_failure(
            &state,
            &inverted,
            &circuit,
            &failure(),
            i64::MAX - 1,
            f64::NAN,
        );
        assert_eq!(change.state.next_due_at, Some(i64::MAX), "saturates");
        assert_eq!(change.state.consecutive_failures, u32::MAX);
        let change = after_failure(
            &state,
            &inverted,
            &circuit,
            &throttle(Some(i64::MAX)),
            5,
            0.5,
        );
        assert_eq!(change.state.throttled_until, Some(i64::MAX));
    }

    #[test]
    fn lanes_are_due_after_every_and_after_their_backoff_and_the_key_at_the_earliest() {
        let def = Some(Duration::from_secs(60));
        let mut state = PollerState::zero(0);
        state.schedule.next_due_at = Some(50_000);
        // Never ran: the reconcile is due at once.
        assert!(reconcile_due(def, &state, 0));
        assert_eq!(key_due_at(def, &state, 10), 10);
        let lane = state
            .lanes
            .reconcile
            .get_or_insert_with(LaneCursor::default);
        lane.last_run_at = Some(1_000);
        assert_eq!(reconcile_due_at(def, &state), Some(61_000));
        assert!(!key_due(def, &state, 49_999));
        assert_eq!(key_due_at(def, &state, 0), 50_000, "the live lane first");
        // A failure's backoff pushes the lane past `every`.
        let lane = state
            .lanes
            .reconcile
            .get_or_insert_with(LaneCursor::default);
        lane.retry_at = Some(70_000);
        assert_eq!(reconcile_due_at(def, &state), Some(70_000));
        // An unfinished backfill is due unless it backs off; a finished one never.
        let backfill = state.lanes.backfill.get_or_insert_with(LaneCursor::default);
        backfill.retry_at = Some(20_000);
        assert_eq!(key_due_at(def, &state, 0), 20_000);
        assert!(backfill_due(&state, 20_000) && !backfill_due(&state, 19_999));
        state
            .lanes
            .backfill
            .get_or_insert_with(LaneCursor::default)
            .done = Some(true);
        assert_eq!(backfill_due_at(&state), None);
    }

    #[test]
    fn a_failing_lane_counts_and_backs_off_with_full_jitter() {
        let options = ScheduleOptions::default();
        let mut lane = LaneCursor::default();
        lane_failed(&mut lane, &options, 0.0, 1_000);
        assert_eq!(
            (lane.failures, lane.retry_at),
            (Some(1), Some(1_001)),
            "at least 1 ms"
        );
        lane_failed(&mut lane, &options, 0.999_999, 1_000);
        let cap = options.backoff.full_jitter_ms(2, 0.999_999);
        assert_eq!((lane.failures, lane.retry_at), (Some(2), Some(1_000 + cap)));
    }

    #[test]
    fn a_halt_during_a_successful_cycle_keeps_the_circuit_open() {
        let options = ScheduleOptions::default();
        let circuit = CircuitOptions::default();
        let halt = poison_halt(
            &ScheduleState::default(),
            &options,
            &circuit,
            SerializedError::new("PoisonHalt", "halt"),
            1_000,
        );
        let success = SuccessOutcome {
            had_events: true,
            not_modified: false,
            truncated: false,
            rate_limit: None,
            summary: PollSummary {
                lane: crate::model::Lane::Live,
                started_at: 1_000,
                duration_ms: 5,
                pages: 1,
                items: 1,
                events: crate::model::EventCounts::default(),
                not_modified: false,
                truncated: false,
                quarantined: 0,
            },
        };
        let change = after_success(&halt.state, &options, &circuit, &success, 1_005, 0.5);
        let kept = keep_halt(change, &halt.state);
        assert_eq!(kept.state.circuit, halt.state.circuit);
        assert_eq!(kept.state.next_due_at, halt.state.next_due_at);
        assert_eq!(kept.reason, ScheduleReason::CircuitOpen);
        assert!(!kept.circuit_closed);
    }
}
