//! Lenient number parsing shared by the header parsers.

/// A finite number from a header value: trimmed, optionally double-quoted.
pub(crate) fn parse_number(text: &str) -> Option<f64> {
    let text = text.trim();
    let text = text
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(text)
        .trim();
    let valid = !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'+' | b'e' | b'E'));
    if !valid {
        return None;
    }
    text.parse::<f64>().ok().filter(|v| v.is_finite())
}

/// A finite float as an integer, saturating at the `i64` range; `None` for NaN and infinities.
#[allow(clippy::cast_possible_truncation)] // saturating by construction
pub(crate) fn f64_to_i64(value: f64) -> Option<i64> {
    if !value.is_finite() {
        return None;
    }
    // `as` saturates at the bounds; the clamp documents it.
    Some(value.clamp(-9.2e18, 9.2e18) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers() {
        assert_eq!(parse_number(" 12 "), Some(12.0));
        assert_eq!(parse_number("\"1.5\""), Some(1.5));
        assert_eq!(parse_number("1e3"), Some(1000.0));
        assert_eq!(parse_number("1e400"), None);
        assert_eq!(parse_number("inf"), None);
        assert_eq!(parse_number("NaN"), None);
        assert_eq!(parse_number(""), None);
        assert_eq!(parse_number("12abc"), None);
        assert_eq!(f64_to_i64(1e300), Some(9_200_000_000_000_000_000));
        assert_eq!(f64_to_i64(-1e300), Some(-9_200_000_000_000_000_000));
        assert_eq!(f64_to_i64(f64::NAN), None);
    }
}
