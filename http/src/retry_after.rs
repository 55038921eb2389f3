//! `Retry-After` (RFC 9110 §10.2.3): delay seconds or an HTTP date.

use std::time::UNIX_EPOCH;

use watukuy_core::clock::duration_ms;

use crate::num::f64_to_i64;

/// Reads a `Retry-After` value as milliseconds from `now_ms`.
///
/// Non-negative (possibly fractional) seconds become milliseconds, whole seconds exactly, and a
/// wait too long for `i64` milliseconds saturates at `i64::MAX` (the engine then waits for good:
/// never a wrapped, negative wait); an HTTP date (IMF-fixdate, RFC 850 or asctime) becomes
/// `max(0, date − now)`; anything else is `None`. `now_ms` comes from the engine's clock, never
/// from the system clock. Never panics.
///
/// ```
/// use watukuy_http::parse_retry_after;
///
/// let now = 1_767_225_600_000; // 2026-01-01T00:00:00Z
/// assert_eq!(parse_retry_after("12", now), Some(12_000));
/// assert_eq!(parse_retry_after("0.25", now), Some(250));
/// assert_eq!(parse_retry_after("Thu, 01 Jan 2026 00:00:30 GMT", now), Some(30_000));
/// assert_eq!(parse_retry_after("Wed, 31 Dec 2025 23:00:00 GMT", now), Some(0));
/// assert_eq!(parse_retry_after("-1", now), None);
/// assert_eq!(parse_retry_after("soon", now), None);
/// ```
pub fn parse_retry_after(value: &str, now_ms: i64) -> Option<i64> {
    let value = value.trim();
    if value.is_empty() {
        return None;
    }
    if value.bytes().all(|b| b.is_ascii_digit()) {
        // Whole seconds, exact (an f64 is not past 2^53 ms); more than u64 holds saturates too.
        let seconds = value.parse::<u64>().unwrap_or(u64::MAX);
        let ms = i64::try_from(seconds).map_or(i64::MAX, |s| s.saturating_mul(1000));
        return Some(ms);
    }
    if value.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        let seconds: f64 = value.parse().ok()?;
        if !seconds.is_finite() || seconds < 0.0 {
            return None;
        }
        let ms = (seconds * 1000.0).round();
        // Saturates as whole seconds do (f64_to_i64 stops short of i64::MAX).
        return if ms >= 9.2e18 {
            Some(i64::MAX)
        } else {
            f64_to_i64(ms)
        };
    }
    let at = httpdate::parse_http_date(value).ok()?;
    let at_ms = at.duration_since(UNIX_EPOCH).map_or(0, duration_ms);
    Some(at_ms.saturating_sub(now_ms).max(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_767_225_600_000;

    #[test]
    fn seconds_and_dates() {
        assert_eq!(parse_retry_after("0", NOW), Some(0));
        assert_eq!(parse_retry_after(" 120 ", NOW), Some(120_000));
        assert_eq!(parse_retry_after("1.0005", NOW), Some(1_001));
        assert_eq!(
            parse_retry_after("Thursday, 01-Jan-26 00:01:00 GMT", NOW),
            Some(60_000),
            "RFC 850"
        );
        assert_eq!(
            parse_retry_after("Thu Jan  1 00:00:05 2026", NOW),
            Some(5_000),
            "asctime"
        );
    }

    #[test]
    fn garbage_is_none() {
        for value in [
            "",
            " ",
            ".",
            "1.2.3",
            "+5",
            "-5",
            "1e3",
            "Thu, 32 Jan 2026 00:00:00 GMT",
            "é",
            "99999999999999999999999999999999999999999999",
        ] {
            let parsed = parse_retry_after(value, NOW);
            assert!(
                parsed.is_none() || value.starts_with("9999"),
                "{value:?} gave {parsed:?}"
            );
        }
        assert_eq!(
            parse_retry_after("99999999999999999999999999999999999999999999", NOW),
            Some(i64::MAX),
            "huge delays saturate"
        );
        assert_eq!(
            parse_retry_after("99999999999999999999999999999999999999999999.5", NOW),
            Some(i64::MAX),
            "fractional ones too"
        );
        assert_eq!(
            parse_retry_after("Thu, 01 Jan 1970 00:00:00 GMT", i64::MAX),
            Some(0)
        );
    }

    /// Found by tests/properties.rs: whole seconds past 2^53 ms were read through an f64 and
    /// came back rounded.
    #[test]
    fn whole_seconds_are_exact() {
        assert_eq!(
            parse_retry_after("97135965052243", NOW),
            Some(97_135_965_052_243_000)
        );
    }
}
