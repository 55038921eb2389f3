//! Timestamp parsing and formatting for the timestamp strategy.

use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};

/// Parses a timestamp the way the timestamp strategy does by default, into epoch milliseconds.
///
/// - exactly 10 ASCII digits: epoch seconds;
/// - exactly 13 ASCII digits: epoch milliseconds;
/// - otherwise an ISO 8601 / RFC 3339 date-time: `Z` or a `±HH:MM` / `±HHMM` / `±HH` offset,
///   optional fractional seconds, optional seconds, `T` or a space between date and time. A
///   date-time without an offset is read as UTC (JavaScript would use the machine's zone; a
///   poller must not depend on it). `YYYY-MM-DD`, `YYYY-MM` and `YYYY` are midnight UTC on the
///   first day. RFC 2822 dates (`Tue, 1 Jul 2003 10:52:37 +0200`) are accepted too.
///
/// Anything else is `None`.
///
/// ```
/// use watukuy_core::cursor::parse_timestamp;
///
/// assert_eq!(parse_timestamp("1767225600"), Some(1_767_225_600_000));
/// assert_eq!(parse_timestamp("1767225600123"), Some(1_767_225_600_123));
/// assert_eq!(parse_timestamp("2026-01-01T00:00:00.123Z"), Some(1_767_225_600_123));
/// assert_eq!(parse_timestamp("2026-01-01T02:00:00+02:00"), Some(1_767_225_600_000));
/// assert_eq!(parse_timestamp("2026-01-01"), Some(1_767_225_600_000));
/// assert_eq!(parse_timestamp("yesterday"), None);
/// ```
pub fn parse_timestamp(raw: &str) -> Option<i64> {
    if is_digits(raw, 10) {
        // At most 9_999_999_999 * 1000: far inside i64.
        return raw.parse::<i64>().ok()?.checked_mul(1000);
    }
    if is_digits(raw, 13) {
        return raw.parse::<i64>().ok();
    }
    parse_iso(raw.trim())
}

/// Formats epoch milliseconds in the shape of `sample` (a timestamp as the server wrote it):
/// 10 digits → epoch seconds (floored), 13 digits → epoch milliseconds, anything else → ISO 8601
/// UTC with milliseconds (`2026-01-01T00:00:00.000Z`). `None` only when `ms` is outside the
/// range of dates (about ±262,000 years).
///
/// ```
/// use watukuy_core::cursor::format_timestamp;
///
/// assert_eq!(format_timestamp(1_767_225_599_500, "1767225600").as_deref(), Some("1767225599"));
/// assert_eq!(format_timestamp(1_767_225_599_500, "1767225600000").as_deref(), Some("1767225599500"));
/// assert_eq!(
///     format_timestamp(1_767_225_599_500, "2026-01-01T00:00:00Z").as_deref(),
///     Some("2025-12-31T23:59:59.500Z")
/// );
/// ```
pub fn format_timestamp(ms: i64, sample: &str) -> Option<String> {
    if is_digits(sample, 10) {
        Some(ms.div_euclid(1000).to_string())
    } else if is_digits(sample, 13) {
        Some(ms.to_string())
    } else {
        iso_ms(ms)
    }
}

/// Epoch milliseconds as ISO 8601 UTC with milliseconds (JavaScript's `toISOString` for years
/// 0000–9999).
pub(crate) fn iso_ms(ms: i64) -> Option<String> {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .map(|dt| dt.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
}

fn is_digits(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_digit())
}

fn parse_iso(s: &str) -> Option<i64> {
    if let Ok(dt) = DateTime::parse_from_rfc3339(s) {
        return Some(dt.timestamp_millis());
    }
    if let Some(ms) = parse_lenient(s) {
        return Some(ms);
    }
    DateTime::parse_from_rfc2822(s)
        .ok()
        .map(|dt| dt.timestamp_millis())
}

/// ISO 8601 forms RFC 3339 does not cover: no seconds, no offset, compact offsets, date only.
fn parse_lenient(s: &str) -> Option<i64> {
    let (local, offset_ms) = split_offset(s)?;
    const DATE_TIME: [&str; 4] = [
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y-%m-%dT%H:%M",
        "%Y-%m-%d %H:%M",
    ];
    for fmt in DATE_TIME {
        if let Ok(naive) = NaiveDateTime::parse_from_str(local, fmt) {
            return naive
                .and_utc()
                .timestamp_millis()
                .checked_sub(offset_ms.unwrap_or(0));
        }
    }
    if offset_ms.is_some() {
        return None;
    }
    let date = match local.len() {
        4 if is_digits(local, 4) => {
            NaiveDate::parse_from_str(&format!("{local}-01-01"), "%Y-%m-%d")
        }
        7 => NaiveDate::parse_from_str(&format!("{local}-01"), "%Y-%m-%d"),
        _ => NaiveDate::parse_from_str(local, "%Y-%m-%d"),
    }
    .ok()?;
    Some(date.and_hms_opt(0, 0, 0)?.and_utc().timestamp_millis())
}

/// Splits a trailing `Z` or `±HH[:MM]` offset (only after a time part) from a date-time:
/// `(local part, offset in ms)`. `None` when an offset is present but malformed.
fn split_offset(s: &str) -> Option<(&str, Option<i64>)> {
    if let Some(local) = s.strip_suffix(['Z', 'z']) {
        return Some((local, Some(0)));
    }
    // The time part starts after the date (`YYYY-MM-DD` + separator); a sign before it is part
    // of the date.
    let Some(time_start) = s.find(['T', 't', ' ']) else {
        return Some((s, None));
    };
    let time = s.get(time_start..)?;
    let Some(sign_at) = time.rfind(['+', '-']) else {
        return Some((s, None));
    };
    let (local, offset) = s.split_at(time_start + sign_at);
    let negative = offset.starts_with('-');
    let digits: String = offset.get(1..)?.chars().filter(|c| *c != ':').collect();
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (hours, minutes) = match digits.len() {
        2 => (digits.parse::<i64>().ok()?, 0),
        4 => (
            digits.get(..2)?.parse::<i64>().ok()?,
            digits.get(2..)?.parse::<i64>().ok()?,
        ),
        _ => return None,
    };
    if hours > 23 || minutes > 59 {
        return None;
    }
    let ms = (hours * 60 + minutes) * 60_000;
    Some((local, Some(if negative { -ms } else { ms })))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEW_YEAR_2026_MS: i64 = 1_767_225_600_000;

    #[test]
    fn epoch_digits() {
        assert_eq!(parse_timestamp("1767225600"), Some(NEW_YEAR_2026_MS));
        assert_eq!(
            parse_timestamp("1767225600123"),
            Some(NEW_YEAR_2026_MS + 123)
        );
        assert_eq!(parse_timestamp("0000000000"), Some(0));
        assert_eq!(parse_timestamp("9999999999"), Some(9_999_999_999_000));
        // Not exactly 10 or 13 digits: not an epoch (and not a date either).
        assert_eq!(parse_timestamp("176722560"), None);
        assert_eq!(parse_timestamp("17672256001"), None);
        assert_eq!(parse_timestamp("+767225600"), None);
        assert_eq!(parse_timestamp(" 1767225600"), None);
    }

    #[test]
    fn iso_forms() {
        let cases = [
            ("2026-01-01T00:00:00Z", NEW_YEAR_2026_MS),
            ("2026-01-01T00:00:00.000Z", NEW_YEAR_2026_MS),
            ("2026-01-01T00:00:00.5Z", NEW_YEAR_2026_MS + 500),
            ("2026-01-01T00:00:00.123456789Z", NEW_YEAR_2026_MS + 123),
            ("2026-01-01t00:00:00z", NEW_YEAR_2026_MS),
            ("2026-01-01 00:00:00Z", NEW_YEAR_2026_MS),
            ("2026-01-01T01:00:00+01:00", NEW_YEAR_2026_MS),
            ("2025-12-31T19:00:00-05:00", NEW_YEAR_2026_MS),
            ("2026-01-01T01:00:00+0100", NEW_YEAR_2026_MS),
            ("2026-01-01T01:00:00+01", NEW_YEAR_2026_MS),
            ("2026-01-01T01:30+01:30", NEW_YEAR_2026_MS),
            ("2026-01-01T00:00Z", NEW_YEAR_2026_MS),
            ("2026-01-01T00:00:00", NEW_YEAR_2026_MS),
            ("2026-01-01T00:00:00.250", NEW_YEAR_2026_MS + 250),
            ("2026-01-01 00:00", NEW_YEAR_2026_MS),
            ("2026-01-01", NEW_YEAR_2026_MS),
            ("2026-01", NEW_YEAR_2026_MS),
            ("2026", NEW_YEAR_2026_MS),
            (" 2026-01-01T00:00:00Z ", NEW_YEAR_2026_MS),
            ("Thu, 01 Jan 2026 00:00:00 GMT", NEW_YEAR_2026_MS),
            ("Thu, 1 Jan 2026 02:00:00 +0200", NEW_YEAR_2026_MS),
            ("1970-01-01T00:00:00Z", 0),
            ("1969-12-31T23:59:59.999Z", -1),
        ];
        for (raw, want) in cases {
            assert_eq!(parse_timestamp(raw), Some(want), "{raw}");
        }
    }

    #[test]
    fn garbage_is_none() {
        for raw in [
            "",
            "   ",
            "yesterday",
            "2026-13-01",
            "2026-02-30",
            "2026-01-01T25:00:00Z",
            "2026-01-01T00:00:00+25:00",
            "2026-01-01T00:00:00+1",
            "2026-01-01T00:00:00+ab:cd",
            "2026-01-01Z",
            "20260101",
            "NaN",
            "1.5",
        ] {
            assert_eq!(parse_timestamp(raw), None, "{raw:?}");
        }
    }

    #[test]
    fn formats_in_the_sample_shape() {
        let ms = NEW_YEAR_2026_MS - 1;
        assert_eq!(
            format_timestamp(ms, "1767225600").as_deref(),
            Some("1767225599")
        );
        assert_eq!(
            format_timestamp(ms, "1767225600000").as_deref(),
            Some("1767225599999")
        );
        assert_eq!(
            format_timestamp(ms, "2026-01-01").as_deref(),
            Some("2025-12-31T23:59:59.999Z")
        );
        // Seconds are floored, also before the epoch.
        assert_eq!(format_timestamp(-1, "0000000000").as_deref(), Some("-1"));
        assert_eq!(
            format_timestamp(0, "x").as_deref(),
            Some("1970-01-01T00:00:00.000Z")
        );
        assert_eq!(format_timestamp(i64::MAX, "x"), None);
    }

    #[test]
    fn iso_output_parses_back() {
        for ms in [0, 1, NEW_YEAR_2026_MS + 7, -86_400_001] {
            let text = iso_ms(ms).unwrap();
            assert_eq!(parse_timestamp(&text), Some(ms), "{text}");
        }
    }
}
