//! Properties of the header parsers that hold for every input, not only for the examples in
//! their docs: whatever an API sends, they never panic, never give a negative or overflowing
//! wait, and read what they accept the way the RFCs mean it.

use std::time::{Duration, UNIX_EPOCH};

use proptest::prelude::*;
use watukuy_http::header::{HeaderMap, HeaderName, HeaderValue};
use watukuy_http::{parse_rate_limit, parse_retry_after};

/// Around the tests' present: 2001 to 2286, in epoch milliseconds.
fn now() -> impl Strategy<Value = i64> {
    1_000_000_000_000_i64..10_000_000_000_000
}

/// The header names the rate-limit parser reads.
const RATE_LIMIT_HEADERS: [&str; 12] = [
    "ratelimit",
    "ratelimit-policy",
    "ratelimit-limit",
    "ratelimit-remaining",
    "ratelimit-reset",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "x-ratelimit-reset-after",
    "x-rate-limit-limit",
    "x-rate-limit-remaining",
    "x-rate-limit-reset",
];

/// A header value as an API might send it: numbers of every size and sign, structured-field
/// pieces, quotes, or any bytes a header value may hold.
fn value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        any::<i64>().prop_map(|n| n.to_string().into_bytes()),
        any::<f64>().prop_map(|n| n.to_string().into_bytes()),
        "[-+0-9.eE\"]{1,24}".prop_map(String::into_bytes),
        "(\"[a-z]{0,4}\"|[a-z]{1,4})(;[qrtw]=[-0-9.eE]{0,22}){0,4}(, ?[a-z=0-9;\"]{0,12}){0,2}"
            .prop_map(String::into_bytes),
        "(limit|remaining|reset)=[-0-9.]{1,22}(, ?(limit|remaining|reset)=[-0-9.]{1,22}){0,2}"
            .prop_map(String::into_bytes),
        proptest::collection::vec(any::<u8>(), 0..40),
    ]
}

fn headers(pairs: &[(usize, Vec<u8>)]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, bytes) in pairs {
        let name = HeaderName::from_static(RATE_LIMIT_HEADERS[name % RATE_LIMIT_HEADERS.len()]);
        if let Ok(value) = HeaderValue::from_bytes(bytes) {
            headers.append(name, value);
        }
    }
    headers
}

proptest! {
    /// Any text: `None` or a wait of zero or more milliseconds, never a panic.
    #[test]
    fn retry_after_is_never_negative(value in "\\PC{0,40}", now in now()) {
        if let Some(wait) = parse_retry_after(&value, now) {
            prop_assert!(wait >= 0, "{value:?} gave {wait}");
        }
    }

    /// Whole seconds are exactly that many seconds; past what `i64` milliseconds hold, the wait
    /// saturates at `i64::MAX`, never wraps.
    #[test]
    fn retry_after_seconds_are_seconds(seconds in any::<u64>(), now in now()) {
        let expected = i64::try_from(seconds).map_or(i64::MAX, |s| s.saturating_mul(1000));
        prop_assert_eq!(parse_retry_after(&seconds.to_string(), now), Some(expected));
    }

    /// An HTTP date is the time until it, in whole seconds, or zero once it has passed.
    #[test]
    fn retry_after_dates_are_the_time_until_them(at_secs in 0_u64..253_402_300_799, now in now()) {
        let at = UNIX_EPOCH + Duration::from_secs(at_secs);
        let text = httpdate::fmt_http_date(at);
        let at_ms = i64::try_from(at_secs).unwrap_or(i64::MAX).saturating_mul(1000);
        prop_assert_eq!(parse_retry_after(&text, now), Some((at_ms - now).max(0)));
    }

    /// Whatever the rate-limit headers say: counts are never negative and a reset is never
    /// before 1970 (a delta never wraps), never a panic.
    #[test]
    fn rate_limits_are_never_negative(
        pairs in proptest::collection::vec((any::<usize>(), value()), 0..6),
        now in now(),
    ) {
        let headers = headers(&pairs);
        if let Some(info) = parse_rate_limit(&headers, now) {
            prop_assert!(info.limit.is_none_or(|n| n >= 0), "limit {:?} from {headers:?}", info.limit);
            prop_assert!(info.remaining.is_none_or(|n| n >= 0), "remaining {:?} from {headers:?}", info.remaining);
            prop_assert!(
                info.reset_at.is_none_or(|at| at >= 0),
                "reset_at {:?} (now {now}) from {headers:?}", info.reset_at
            );
        }
    }
}
