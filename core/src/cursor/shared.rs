//! Helpers shared by the strategies: field paths, JS-like string order, the persisted shapes and
//! the errors.

use std::cmp::Ordering;

use serde_json::{Map, Value};

use super::Cursor;
use crate::error::Error;

/// Reads a dot-path field (`a.b.c`) from an item: strings verbatim, numbers stringified the way
/// JavaScript's `String(n)` writes integers; anything else (missing, `null`, booleans, objects,
/// arrays) is `None`. A numeric segment indexes an array (`lines.0.sku`), as a JS property
/// access would.
pub(crate) fn read_field(item: &Value, path: &str) -> Option<String> {
    let mut node = item;
    for segment in path.split('.') {
        node = match node {
            Value::Object(map) => map.get(segment)?,
            Value::Array(list) => list.get(segment.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    match node {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(js_number(n)),
        _ => None,
    }
}

/// A JSON number as JavaScript's `String(n)` writes it, for the values that matter here:
/// integers print without a fraction (`1700000000.0` → `1700000000`), other finite numbers in
/// their shortest round-trip form.
fn js_number(n: &serde_json::Number) -> String {
    if let Some(i) = n.as_i64() {
        return i.to_string();
    }
    if let Some(u) = n.as_u64() {
        return u.to_string();
    }
    // `Display` for f64 prints integral values without `.0` and never uses an exponent; the
    // only difference from JS is for |x| >= 1e21 or < 1e-6, which no timestamp takes.
    n.as_f64().map_or_else(|| n.to_string(), |f| f.to_string())
}

/// Checks a dot path: non-empty, without empty segments.
pub(crate) fn check_path(option: &str, path: &str) -> Result<(), Error> {
    if path.is_empty() {
        return Err(Error::config(option, "must be a non-empty dot path"));
    }
    if path.split('.').any(str::is_empty) {
        return Err(Error::config(
            option,
            format!("`{path}` has an empty segment (expected a dot path like `a.b.c`)"),
        ));
    }
    Ok(())
}

/// Compares two strings as sequences of UTF-16 code units, like JavaScript's `<`.
pub(crate) fn cmp_utf16(a: &str, b: &str) -> Ordering {
    a.encode_utf16().cmp(b.encode_utf16())
}

/// A string (or `null`) as JSON text; infallible.
fn json_string(value: Option<&str>) -> String {
    value.map_or_else(
        || "null".to_owned(),
        |s| Value::String(s.to_owned()).to_string(),
    )
}

/// Any cursor in its persisted JSON shape (`{"value":…,"tieBreak":…}`, `{"value":…}`, `{"page":n}`,
/// `null`, or the custom JSON text).
pub(crate) fn encode(cursor: &Cursor) -> String {
    match cursor {
        Cursor::Timestamp { value, tie_break } => format!(
            "{{\"value\":{},\"tieBreak\":{}}}",
            json_string(value.as_deref()),
            json_string(tie_break.as_deref())
        ),
        Cursor::Token { value } => format!("{{\"value\":{}}}", json_string(value.as_deref())),
        Cursor::Page { page } => format!("{{\"page\":{page}}}"),
        Cursor::Snapshot => "null".to_owned(),
        Cursor::Custom(json) => json.as_str().to_owned(),
    }
}

/// The variant name of a cursor, for error messages.
pub(crate) fn kind(cursor: &Cursor) -> &'static str {
    match cursor {
        Cursor::Timestamp { .. } => "timestamp",
        Cursor::Token { .. } => "token",
        Cursor::Page { .. } => "page",
        Cursor::Snapshot => "snapshot_diff",
        Cursor::Custom(_) => "custom",
    }
}

/// A strategy was handed a cursor of another strategy (a wiring bug, reported, never a panic).
pub(crate) fn wrong_cursor(strategy: &str, cursor: &Cursor) -> Error {
    Error::config(
        "cursor",
        format!(
            "the {strategy} strategy was given a {} cursor ({})",
            kind(cursor),
            shorten(&encode(cursor))
        ),
    )
}

/// Persisted cursor text that cannot be read back.
pub(crate) fn corrupt(strategy: &str, text: &str, reason: impl Into<String>) -> Error {
    Error::corrupt(
        format!("{strategy} cursor {}", shorten(text)),
        reason.into(),
    )
}

/// Text cut to a readable length for messages (on a char boundary), quoted.
pub(crate) fn shorten(text: &str) -> String {
    const MAX_CHARS: usize = 200;
    match text.char_indices().nth(MAX_CHARS) {
        Some((end, _)) => format!("{:?}…", text.get(..end).unwrap_or_default()),
        None => format!("{text:?}"),
    }
}

/// Parses persisted text as a JSON object with exactly the keys `keys`.
pub(crate) fn object_with_keys(
    strategy: &str,
    text: &str,
    keys: &[&str],
) -> Result<Map<String, Value>, Error> {
    let value: Value = serde_json::from_str(text)
        .map_err(|e| corrupt(strategy, text, format!("not JSON: {e}")))?;
    let Value::Object(map) = value else {
        return Err(corrupt(strategy, text, "expected a JSON object"));
    };
    for key in keys {
        if !map.contains_key(*key) {
            return Err(corrupt(strategy, text, format!("missing key `{key}`")));
        }
    }
    if let Some(extra) = map.keys().find(|k| !keys.contains(&k.as_str())) {
        return Err(corrupt(strategy, text, format!("unexpected key `{extra}`")));
    }
    Ok(map)
}

/// Reads a `string | null` member of a persisted object.
pub(crate) fn string_or_null(
    strategy: &str,
    text: &str,
    map: &Map<String, Value>,
    key: &str,
) -> Result<Option<String>, Error> {
    match map.get(key) {
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Null) | None => Ok(None),
        Some(_) => Err(corrupt(
            strategy,
            text,
            format!("`{key}` must be a string or null"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_dot_paths_strings_and_numbers() {
        let item = json!({
            "a": { "b": { "c": "2026-01-01T00:00:00Z" } },
            "n": 1_700_000_000,
            "f": 1_700_000_000_000.0,
            "x": 1.5,
            "t": true,
            "z": null,
            "o": {},
            "l": [{ "id": "first" }, 7],
        });
        assert_eq!(
            read_field(&item, "a.b.c").as_deref(),
            Some("2026-01-01T00:00:00Z")
        );
        assert_eq!(read_field(&item, "n").as_deref(), Some("1700000000"));
        assert_eq!(read_field(&item, "f").as_deref(), Some("1700000000000"));
        assert_eq!(read_field(&item, "x").as_deref(), Some("1.5"));
        assert_eq!(read_field(&item, "l.0.id").as_deref(), Some("first"));
        assert_eq!(read_field(&item, "l.1").as_deref(), Some("7"));
        for missing in [
            "t", "z", "o", "l", "a.b", "a.b.c.d", "nope", "l.2", "l.x", "n.m",
        ] {
            assert_eq!(read_field(&item, missing), None, "{missing}");
        }
    }

    #[test]
    fn utf16_order_matches_javascript() {
        // U+FF5E (one unit 0xFF5E) sorts after U+1F600 (surrogates 0xD83D..) in UTF-16,
        // although its scalar value is smaller.
        assert_eq!(cmp_utf16("\u{FF5E}", "\u{1F600}"), Ordering::Greater);
        assert_eq!("\u{FF5E}".cmp("\u{1F600}"), Ordering::Less);
        assert_eq!(cmp_utf16("9", "10"), Ordering::Greater);
        assert_eq!(cmp_utf16("a", "ab"), Ordering::Less);
    }

    #[test]
    fn paths_are_checked() {
        assert!(check_path("cursor.field", "a.b").is_ok());
        for bad in ["", ".a", "a.", "a..b"] {
            let err = check_path("cursor.field", bad).unwrap_err();
            assert!(err.to_string().contains("`cursor.field`"), "{err}");
        }
    }

    #[test]
    fn encodes_every_shape() {
        assert_eq!(
            encode(&Cursor::Timestamp {
                value: Some("a\"b".into()),
                tie_break: None
            }),
            r#"{"value":"a\"b","tieBreak":null}"#
        );
        assert_eq!(encode(&Cursor::Token { value: None }), r#"{"value":null}"#);
        assert_eq!(encode(&Cursor::Page { page: 3 }), r#"{"page":3}"#);
        assert_eq!(encode(&Cursor::Snapshot), "null");
    }

    #[test]
    fn long_text_is_shortened_on_a_char_boundary() {
        let text = "é".repeat(300);
        let short = shorten(&text);
        assert_eq!(short.chars().filter(|c| *c == 'é').count(), 200);
        assert!(short.ends_with('…'));
        assert_eq!(shorten("ab"), "\"ab\"");
    }
}
