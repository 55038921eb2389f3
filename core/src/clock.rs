//! Time, injected: every reading of the wall clock and every sleep goes through [`Clock`].
//!
//! This is one of the two modules allowed to touch ambient time (see `clippy.toml`).
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

/// Wall time in epoch milliseconds, and sleeping.
///
/// The engine never reads time any other way, and stores receive the time as a parameter, so a
/// test can drive everything (against real databases too) with [`ManualClock`] or [`TokioClock`]
/// on tokio's paused clock.
#[async_trait]
pub trait Clock: Send + Sync + 'static {
    /// Now, in epoch milliseconds.
    fn now_ms(&self) -> i64;

    /// Resolves once `now_ms() >= deadline_ms`.
    async fn sleep_until(&self, deadline_ms: i64);

    /// Resolves after `duration` has passed on this clock.
    async fn sleep(&self, duration: Duration) {
        let deadline = self.now_ms().saturating_add(duration_ms(duration));
        self.sleep_until(deadline).await;
    }
}

/// A duration in whole milliseconds, saturating at `i64::MAX`.
pub fn duration_ms(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// A non-negative millisecond count as a duration (negative counts are zero).
pub fn ms_duration(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// The operating system's clock and tokio's timer.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

#[async_trait]
impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        duration_ms(since)
    }

    async fn sleep_until(&self, deadline_ms: i64) {
        let wait = deadline_ms.saturating_sub(self.now_ms());
        if wait > 0 {
            tokio::time::sleep(ms_duration(wait)).await;
        }
    }
}

/// Wall time derived from tokio's clock: a fixed origin plus tokio's elapsed time.
///
/// Under `#[tokio::test(start_paused = true)]` tokio's clock only moves when every task is idle
/// (or when the test advances it), so code sleeping on this clock runs instantly and
/// deterministically.
#[derive(Clone, Debug)]
pub struct TokioClock {
    origin_ms: i64,
    start: tokio::time::Instant,
}

impl TokioClock {
    /// A clock reading `origin_ms` now and moving with tokio's time.
    pub fn starting_at(origin_ms: i64) -> Self {
        Self {
            origin_ms,
            start: tokio::time::Instant::now(),
        }
    }
}

#[async_trait]
impl Clock for TokioClock {
    fn now_ms(&self) -> i64 {
        self.origin_ms
            .saturating_add(duration_ms(self.start.elapsed()))
    }

    async fn sleep_until(&self, deadline_ms: i64) {
        let wait = deadline_ms.saturating_sub(self.now_ms());
        if wait > 0 {
            tokio::time::sleep(ms_duration(wait)).await;
        }
    }
}

/// A clock that moves only when told to; sleepers wake when it passes their deadline.
#[derive(Clone, Debug)]
pub struct ManualClock {
    now: Arc<tokio::sync::watch::Sender<i64>>,
}

impl ManualClock {
    /// A clock reading `now_ms`.
    pub fn new(now_ms: i64) -> Self {
        Self {
            now: Arc::new(tokio::sync::watch::Sender::new(now_ms)),
        }
    }

    /// Moves time forward by `duration`, waking every sleeper whose deadline passed.
    pub fn advance(&self, duration: Duration) {
        let step = duration_ms(duration);
        self.now.send_modify(|now| *now = now.saturating_add(step));
    }

    /// Sets the time; a time earlier than now is ignored (the clock never goes back).
    pub fn set(&self, now_ms: i64) {
        self.now.send_if_modified(|now| {
            if now_ms > *now {
                *now = now_ms;
                true
            } else {
                false
            }
        });
    }
}

#[async_trait]
impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        *self.now.borrow()
    }

    async fn sleep_until(&self, deadline_ms: i64) {
        let mut rx = self.now.subscribe();
        // `wait_for` checks the current value first, so a deadline already passed returns at once.
        // The sender lives as long as `self`, so the wait cannot fail while we are borrowed.
        let _ = rx.wait_for(|now| *now >= deadline_ms).await;
    }
}

/// Formats epoch milliseconds as RFC 3339 in UTC with milliseconds: `2026-01-01T00:00:00.000Z`.
pub fn format_rfc3339_ms(epoch_ms: i64) -> String {
    let days = epoch_ms.div_euclid(86_400_000);
    let ms_of_day = epoch_ms.rem_euclid(86_400_000);
    let (year, month, day) = civil_from_days(days);
    let (h, rest) = (ms_of_day / 3_600_000, ms_of_day % 3_600_000);
    let (m, rest) = (rest / 60_000, rest % 60_000);
    let (s, ms) = (rest / 1000, rest % 1000);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{ms:03}Z")
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_rfc3339() {
        assert_eq!(format_rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            format_rfc3339_ms(1_767_225_600_000),
            "2026-01-01T00:00:00.000Z"
        );
        assert_eq!(
            format_rfc3339_ms(951_782_400_123),
            "2000-02-29T00:00:00.123Z"
        );
        assert_eq!(format_rfc3339_ms(-1), "1969-12-31T23:59:59.999Z");
    }

    #[tokio::test]
    async fn manual_clock_wakes_sleepers_when_advanced() {
        let clock = ManualClock::new(1_000);
        let sleeper = {
            let clock = clock.clone();
            tokio::spawn(async move {
                clock.sleep(Duration::from_millis(500)).await;
                clock.now_ms()
            })
        };
        tokio::task::yield_now().await;
        clock.advance(Duration::from_millis(499));
        tokio::task::yield_now().await;
        assert!(!sleeper.is_finished());
        clock.advance(Duration::from_millis(1));
        assert_eq!(sleeper.await.unwrap(), 1_500);
        clock.set(10);
        assert_eq!(clock.now_ms(), 1_500, "a manual clock never goes back");
    }

    #[tokio::test(start_paused = true)]
    async fn tokio_clock_follows_paused_time() {
        let clock = TokioClock::starting_at(5_000);
        clock.sleep(Duration::from_secs(60)).await;
        assert_eq!(clock.now_ms(), 65_000);
    }
}
