//! Timestamp cursor values: any text either does not parse, or parses to an instant that
//! prints back (in each shape a server writes) to text that parses to the same instant.
#![no_main]

use libfuzzer_sys::fuzz_target;
use watukuy_core::cursor::{format_timestamp, parse_timestamp};

fuzz_target!(|raw: &str| {
    let Some(ms) = parse_timestamp(raw) else {
        return;
    };
    if let Some(iso) = format_timestamp(ms, "2026-01-01T00:00:00.000Z") {
        assert_eq!(parse_timestamp(&iso), Some(ms), "{raw:?} printed as {iso}");
    }
    // Epoch milliseconds are read back as such when they are 13 digits (2001 to 2286).
    if let Some(millis) = format_timestamp(ms, "1767225600000")
        && millis.len() == 13
        && millis.bytes().all(|b| b.is_ascii_digit())
    {
        assert_eq!(
            parse_timestamp(&millis),
            Some(ms),
            "{raw:?} printed as {millis}"
        );
    }
});
