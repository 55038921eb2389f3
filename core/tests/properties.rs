//! Properties of the parsers and writers of outside data in core that hold for every input:
//! canonical JSON (RFC 8785) and timestamp cursor values. The examples in the docs show the
//! formats; these show nothing else happens (no panic, no drift, no second meaning).

use proptest::prelude::*;
use serde_json::{Map, Number, Value};
use watukuy_core::cursor::{format_timestamp, parse_timestamp};
use watukuy_core::diff::canonicalize;
use watukuy_core::json::Json;

/// Any JSON number: integers across the whole i64 and u64 ranges, and every finite double
/// (subnormals, the edges of the exponent form at 1e21 and 1e-6, negative zero).
fn number() -> impl Strategy<Value = Number> {
    prop_oneof![
        any::<i64>().prop_map(Number::from),
        any::<u64>().prop_map(Number::from),
        any::<f64>().prop_filter_map("finite", Number::from_f64),
        prop_oneof![
            Just(1e21),
            Just(1e-6),
            Just(9.999_999_999_999_999e20),
            Just(-0.0)
        ]
        .prop_filter_map("finite", Number::from_f64),
    ]
}

/// Any JSON value up to a few levels deep, with strings of any characters (controls, quotes,
/// U+2028, astral planes) and keys that sort differently by UTF-16 and by UTF-8.
fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number().prop_map(Value::Number),
        "\\PC{0,12}|[\\x00-\\x1f\"\\\\\u{2028}\u{ffff}\u{10000}]{0,6}".prop_map(Value::String),
    ];
    leaf.prop_recursive(5, 64, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::vec(("[a-zA-Z\u{e9}\u{ff61}\u{10000}]{0,3}", inner), 0..6)
                .prop_map(|members| Value::Object(members.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Two values are the same JSON when their numbers are the same doubles (RFC 8785 reads every
/// number as one) and everything else is equal.
fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_json(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}

/// Epoch milliseconds of the years 0000 to 9999, what ISO 8601 UTC writes with four digits.
fn instant() -> impl Strategy<Value = i64> {
    -62_167_219_200_000_i64..253_402_300_800_000
}

proptest! {
    /// Canonical JSON parses back to the same value, and is its own canonical form: writing it
    /// again (as a value, or as embedded JSON text) gives the same bytes.
    #[test]
    fn canonical_json_is_idempotent_and_faithful(value in value()) {
        let text = canonicalize(&value).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let parsed: Value = serde_json::from_str(&text)
            .map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?;
        prop_assert!(same_json(&parsed, &value), "{text} read back as {parsed}");
        prop_assert_eq!(canonicalize(&parsed).ok(), Some(text.clone()));
        let embedded = Json::parse(&text).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(canonicalize(&embedded).ok(), Some(text));
    }

    /// Any text: `None`, or an instant that prints (as ISO 8601) back to text that parses to the
    /// same instant. Never a panic.
    #[test]
    fn a_parsed_timestamp_prints_back_to_itself(raw in "\\PC{0,40}|[0-9T:+\\-.Z ]{0,30}") {
        if let Some(ms) = parse_timestamp(&raw)
            && let Some(printed) = format_timestamp(ms, "2026-01-01T00:00:00Z")
        {
            prop_assert_eq!(parse_timestamp(&printed), Some(ms), "{:?} printed as {}", raw, printed);
        }
    }

    /// Every instant of the years 0000-9999 round-trips through each shape a server writes:
    /// ISO 8601 exactly, epoch milliseconds exactly (13 digits), epoch seconds floored (10 digits).
    #[test]
    fn every_instant_round_trips_in_each_shape(ms in instant()) {
        let iso = format_timestamp(ms, "2026-01-01T00:00:00.000Z");
        prop_assert_eq!(iso.as_deref().and_then(parse_timestamp), Some(ms));
        if (1_000_000_000_000..10_000_000_000_000).contains(&ms) {
            let millis = format_timestamp(ms, "1767225600000");
            prop_assert_eq!(millis.as_deref().and_then(parse_timestamp), Some(ms));
            let seconds = format_timestamp(ms, "1767225600");
            prop_assert_eq!(
                seconds.as_deref().and_then(parse_timestamp),
                Some(ms.div_euclid(1000) * 1000)
            );
        }
    }
}
