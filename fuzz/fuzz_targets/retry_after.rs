//! `Retry-After` values: any text gives no wait or a wait of zero or more milliseconds, at any
//! present, never a panic. The input is the header value as the server sent it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use watukuy_http::parse_retry_after;

/// Presents to read the value at: the epoch, 2026-01-01, the last millisecond `i64` holds, and
/// one before the epoch (a clock set wrong).
const NOWS: [i64; 4] = [0, 1_767_225_600_000, i64::MAX, -1];

fuzz_target!(|value: &str| {
    for now in NOWS {
        if let Some(wait) = parse_retry_after(value, now) {
            assert!(wait >= 0, "{value:?} at {now} gave {wait}");
        }
    }
});
