//! Exponential backoff with full jitter: one pure function shared by delivery retries and the
//! scheduler.

use std::time::Duration;

use crate::clock::duration_ms;
use crate::error::{Error, Result};

/// An exponential backoff: the delay after failed attempt `n` is at most
/// `min(max, base * factor^(n-1))`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Backoff {
    /// The first delay's cap.
    pub base: Duration,
    /// Growth per attempt (at least 1).
    pub factor: f64,
    /// The largest delay.
    pub max: Duration,
}

impl Backoff {
    /// A backoff from its three parameters.
    pub fn new(base: Duration, factor: f64, max: Duration) -> Self {
        Self { base, factor, max }
    }

    /// Checks the parameters, naming `option` (e.g. `delivery.retry.backoff`) in the error.
    pub fn validate(&self, option: &str) -> Result<()> {
        if !self.factor.is_finite() || self.factor < 1.0 {
            return Err(Error::config(
                format!("{option}.factor"),
                format!("must be a finite number >= 1, got {}", self.factor),
            ));
        }
        if self.max < self.base {
            return Err(Error::config(
                format!("{option}.max"),
                format!("must be >= base ({:?}), got {:?}", self.base, self.max),
            ));
        }
        Ok(())
    }

    /// The cap for failed attempt `attempt` (1-based): `min(max, base * factor^(attempt-1))`, in ms.
    pub fn cap_ms(&self, attempt: u32) -> i64 {
        let max = duration_ms(self.max);
        let base = duration_ms(self.base);
        let exponent = i32::try_from(attempt.saturating_sub(1)).unwrap_or(i32::MAX);
        let raw = ms_f64(base) * self.factor.powi(exponent);
        if raw.is_finite() && raw < ms_f64(max) {
            f64_to_ms(raw)
        } else {
            max
        }
    }

    /// The delay after failed attempt `attempt` with full jitter: `round(u * cap)`, where `u` is a
    /// uniform draw in `[0, 1)`.
    pub fn full_jitter_ms(&self, attempt: u32, u: f64) -> i64 {
        f64_to_ms((u.clamp(0.0, 1.0) * ms_f64(self.cap_ms(attempt))).round())
    }
}

/// Milliseconds as `f64` (exact below 2^53, far beyond any delay).
#[allow(clippy::cast_precision_loss)]
pub(crate) fn ms_f64(ms: i64) -> f64 {
    ms as f64
}

/// A finite non-negative `f64` of milliseconds to `i64`, saturating.
#[allow(clippy::cast_possible_truncation)]
pub(crate) fn f64_to_ms(x: f64) -> i64 {
    if x.is_nan() || x <= 0.0 {
        0
    } else if x >= 9.0e18 {
        i64::MAX
    } else {
        x as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Rng, SeededRng};

    fn delivery_default() -> Backoff {
        Backoff::new(Duration::from_secs(1), 2.0, Duration::from_secs(120))
    }

    #[test]
    fn caps_grow_exponentially_up_to_max() {
        let b = delivery_default();
        let caps: Vec<i64> = (1..=9).map(|n| b.cap_ms(n)).collect();
        assert_eq!(
            caps,
            vec![
                1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 120_000, 120_000
            ]
        );
        assert_eq!(b.cap_ms(10_000), 120_000, "huge attempts saturate at max");
    }

    #[test]
    fn full_jitter_sequence_is_pinned_for_a_seed() {
        let b = delivery_default();
        let rng = SeededRng::new(42);
        let delays: Vec<i64> = (1..=6)
            .map(|n| b.full_jitter_ms(n, rng.next_f64()))
            .collect();
        let again = SeededRng::new(42);
        let replay: Vec<i64> = (1..=6)
            .map(|n| b.full_jitter_ms(n, again.next_f64()))
            .collect();
        assert_eq!(delays, replay);
        for (n, d) in (1..=6).zip(&delays) {
            assert!((0..=b.cap_ms(n)).contains(d), "attempt {n}: {d}");
        }
        // The same numbers as mulberry32(42) with Math.round in the reference implementation.
        assert_eq!(delays, vec![601, 897, 3_410, 5_358, 2_797, 16_851]);
    }

    #[test]
    fn jitter_bounds() {
        let b = delivery_default();
        assert_eq!(b.full_jitter_ms(3, 0.0), 0);
        assert_eq!(b.full_jitter_ms(3, 0.999_999_9), 4_000);
    }

    #[test]
    fn validation_names_the_option() {
        let bad = Backoff::new(Duration::from_secs(10), 2.0, Duration::from_secs(1));
        let err = bad.validate("delivery.retry.backoff").unwrap_err();
        assert!(
            err.to_string().contains("delivery.retry.backoff.max"),
            "{err}"
        );
        let bad = Backoff::new(Duration::from_secs(1), 0.5, Duration::from_secs(1));
        assert!(
            bad.validate("x")
                .unwrap_err()
                .to_string()
                .contains("x.factor")
        );
    }
}
