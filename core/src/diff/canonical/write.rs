//! Strings and numbers written as ECMAScript writes them.

use super::Error;

/// Writes `s` as a JSON string literal the way `JSON.stringify` does.
pub(super) fn write_string(out: &mut String, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.reserve(s.len() + 2);
    out.push('"');
    let mut start = 0;
    for (at, byte) in s.bytes().enumerate() {
        let escape = match byte {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            0x08 => "\\b",
            0x0c => "\\f",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x00..=0x1f => "",
            _ => continue,
        };
        // `at` is the position of an ASCII byte, so both slices end on char boundaries.
        out.push_str(&s[start..at]);
        if escape.is_empty() {
            out.push_str("\\u00");
            // Both nibbles are below 16, the length of HEX.
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0x0f)]));
        } else {
            out.push_str(escape);
        }
        start = at + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

/// Writes `value` as ECMAScript `Number::prototype.toString` does; NaN and ±Infinity are errors.
pub(super) fn write_f64(out: &mut String, value: f64) -> Result<(), Error> {
    if value.is_nan() {
        return Err(Error::new("NaN is not a JSON number"));
    }
    if value.is_infinite() {
        return Err(Error::new(if value > 0.0 {
            "Infinity is not a JSON number"
        } else {
            "-Infinity is not a JSON number"
        }));
    }
    // `ryu_js` implements ECMAScript's Number::toString (shortest round-trip digits, `e+`/`e-`
    // exponent form outside [1e-6, 1e21), `-0` as `0`).
    out.push_str(ryu_js::Buffer::new().format_finite(value));
    Ok(())
}

/// The largest integer up to which every integer is exactly a double (2^53).
pub(super) const MAX_SAFE: u128 = 1 << 53;

/// Writes an integer as the double `JSON.parse` would read it as.
pub(super) fn write_i128(out: &mut String, value: i128) -> Result<(), Error> {
    if value.unsigned_abs() <= MAX_SAFE {
        // Exactly representable: ECMAScript prints it with all its digits and no exponent.
        out.push_str(&value.to_string());
        Ok(())
    } else {
        // Rounding to the nearest double (ties to even) is what a correctly rounded JSON reader
        // does with the decimal digits of this integer; that is the point of the conversion.
        #[allow(clippy::cast_precision_loss)]
        let double = value as f64;
        write_f64(out, double)
    }
}

/// [`write_i128`] for the one integer type that does not fit in an `i128`.
pub(super) fn write_u128(out: &mut String, value: u128) -> Result<(), Error> {
    match i128::try_from(value) {
        Ok(value) => write_i128(out, value),
        Err(_) => {
            // See `write_i128`: rounding to the nearest double is the intended semantics.
            #[allow(clippy::cast_precision_loss)]
            let double = value as f64;
            write_f64(out, double)
        }
    }
}

/// Writes an `f32` as the decimal it prints as, read back as a double.
///
/// serde_json writes `0.1f32` as `0.1`, and a JSON reader (the reference included) sees the double
/// nearest to 0.1, not the widened `0.10000000149011612`.
pub(super) fn write_f32(out: &mut String, value: f32) -> Result<(), Error> {
    if !value.is_finite() {
        return write_f64(out, f64::from(value));
    }
    // Rust prints floats with the shortest digits that round-trip.
    let double: f64 = value
        .to_string()
        .parse()
        .map_err(|error| Error::new(format!("cannot read back f32 {value}: {error}")))?;
    write_f64(out, double)
}
