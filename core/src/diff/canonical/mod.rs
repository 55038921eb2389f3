//! RFC 8785 (JSON Canonicalization Scheme) for any `serde::Serialize` value: see [`canonicalize`].

use std::fmt;

use serde::Serialize;
use serde::ser;

/// The struct name (and field name) `serde_json::value::RawValue` serializes under.
const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";
/// The struct name (and field name) `serde_json::Number` serializes under with serde_json's
/// `arbitrary_precision` feature.
const NUMBER_TOKEN: &str = "$serde_json::private::Number";

/// The deepest nesting of arrays and objects [`canonicalize`] writes (the value itself is level 1);
/// a deeper value is an error naming the path where it goes too deep. It bounds the recursion of
/// `Serialize`, and is as deep as JSON parsers commonly read (serde_json reads 127 levels).
pub(crate) const MAX_DEPTH: usize = 128;

/// Why a value has no canonical JSON form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot canonicalize{}: {reason}", if path.is_empty() { String::new() } else { format!(" at {path}") })]
pub struct CanonicalError {
    /// Where in the value (e.g. `$.lines[2].price`).
    pub path: String,
    /// What is wrong (e.g. `NaN is not a JSON number`).
    pub reason: String,
}

/// The RFC 8785 canonical JSON text of `value`.
///
/// It is a [`serde::Serializer`] underneath, so it works directly on user types, on
/// [`serde_json::Value`] and on [`crate::json::Json`] without going through an intermediate `Value`.
/// The output is byte-identical to the reference implementation's `canonicalize` (an ECMAScript
/// JCS), for every value that serde_json would turn into the same JSON text:
///
/// - **Objects** (maps, structs, struct variants): members sorted by the UTF-16 code units of their
///   keys (not by UTF-8 bytes), no whitespace. Keys must be strings: `char`, unit variants and
///   newtype structs around a string are accepted as serde_json accepts them; any other key, and a
///   key that occurs twice in one object, is an error.
/// - **Numbers**: every number is an IEEE-754 double, written as ECMAScript `Number::toString`
///   writes it (shortest round-trip digits; exponent form with `e+`/`e-` for magnitudes `>= 1e21` or
///   `< 1e-6`; `-0` as `0`). Integers beyond 2^53 are rounded to the nearest double first, as
///   `JSON.parse` would (`u64::MAX` → `18446744073709552000`). An `f32` is taken as the decimal it
///   prints as (`0.1f32` → `0.1`), the number a JSON reader of serde_json's output would see. NaN
///   and ±Infinity are errors naming the path (e.g. `$.lines[2].price`).
/// - **Strings**: escaped as `JSON.stringify` does: `\"`, `\\`, `\b`, `\f`, `\n`, `\r`, `\t`, other
///   control characters as `\u00xx` (lower-case hex); everything else, U+2028/U+2029 and non-ASCII
///   included, literally.
/// - **serde's data model** maps as serde_json maps it: `None`, `()` and unit structs are `null`,
///   unit variants are strings, other variants are externally tagged one-member objects, bytes are
///   arrays of numbers.
/// - **`undefined`**: the reference omits object members whose value is `undefined`; Rust has no
///   `undefined`, and `Option::None` is `null` (as in serde_json). Skip a field with
///   `#[serde(skip_serializing_if = "Option::is_none")]` to get the reference's omission.
/// - **Embedded JSON text** ([`crate::json::Json`], `serde_json::value::RawValue`, and
///   `serde_json::Number` with serde_json's `arbitrary_precision`) is parsed and canonicalized like
///   any other value, so a payload hashes the same whether it arrives as text or as a typed value.
/// - **Depth**: arrays and objects nested more than 128 levels deep are an error (serde's
///   `Serialize` recurses once per level, so this bounds the stack however the value was built).
///
/// # Errors
///
/// A [`CanonicalError`] naming the path and the reason when the value holds NaN or ±Infinity, a
/// map key that is not a string, a key twice in one object, embedded JSON text that does not parse,
/// arrays and objects nested more than 128 levels deep, or when the value's own
/// `Serialize` implementation fails.
pub fn canonicalize<T: Serialize + ?Sized>(value: &T) -> Result<String, CanonicalError> {
    let mut out = String::new();
    let mut path = Vec::new();
    match value.serialize(Canon {
        out: &mut out,
        path: &mut path,
    }) {
        Ok(()) => Ok(out),
        Err(error) => {
            let error = error.located(&[]);
            Err(CanonicalError {
                path: error.path.unwrap_or_else(|| render_path(&[])),
                reason: error.reason,
            })
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Errors and paths
// ---------------------------------------------------------------------------------------------

/// The serializer's error: the reason, and the path once the innermost frame has named it.
#[derive(Debug)]
pub(super) struct Error {
    path: Option<String>,
    reason: String,
}

impl Error {
    fn new(reason: impl Into<String>) -> Self {
        Self {
            path: None,
            reason: reason.into(),
        }
    }

    /// Names the path where the error arose, unless a deeper frame already has.
    fn located(mut self, path: &[Seg]) -> Self {
        if self.path.is_none() {
            self.path = Some(render_path(path));
        }
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(path) => write!(f, "at {path}: {}", self.reason),
            None => f.write_str(&self.reason),
        }
    }
}

impl std::error::Error for Error {}

impl ser::Error for Error {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Self::new(msg.to_string())
    }
}

/// One step of the path from the root to the value being written.
#[derive(Debug)]
pub(super) enum Seg {
    /// A struct field or an enum variant's name.
    Field(&'static str),
    /// A map key.
    Key(String),
    /// An array position.
    Index(usize),
}

/// `$`, then `.name` for identifier-like keys, `["key"]` for other keys and `[n]` for positions.
pub(super) fn render_path(path: &[Seg]) -> String {
    let mut rendered = String::from("$");
    for seg in path {
        match seg {
            Seg::Field(key) => push_path_key(&mut rendered, key),
            Seg::Key(key) => push_path_key(&mut rendered, key),
            Seg::Index(index) => {
                rendered.push('[');
                rendered.push_str(&index.to_string());
                rendered.push(']');
            }
        }
    }
    rendered
}

pub(super) fn push_path_key(rendered: &mut String, key: &str) {
    let mut chars = key.chars();
    let identifier = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == '$')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$');
    if identifier {
        rendered.push('.');
        rendered.push_str(key);
    } else {
        rendered.push('[');
        write_string(rendered, key);
        rendered.push(']');
    }
}

/// Writes `value` into `out` one level below the current path, at `seg`, and hands `seg` back.
///
/// The path stack is restored to its depth on entry whatever happens, so a `Serialize`
/// implementation that fails half-way through a compound cannot skew the paths of later errors.
pub(super) fn write_nested<T: Serialize + ?Sized>(
    out: &mut String,
    path: &mut Vec<Seg>,
    seg: Seg,
    value: &T,
) -> Result<Seg, Error> {
    let depth = path.len();
    path.push(seg);
    let result = value
        .serialize(Canon {
            out,
            path: &mut *path,
        })
        .map_err(|error| error.located(path));
    path.truncate(depth + 1);
    let seg = path.pop();
    result?;
    seg.ok_or_else(|| Error::new("internal error: path stack out of balance").located(path))
}

/// An error when opening `levels` more levels of arrays and objects below `path` would nest deeper
/// than [`MAX_DEPTH`]. Every array and object opens here, before its members are serialized, so
/// the recursion stops at that depth.
pub(super) fn check_depth(path: &[Seg], levels: usize) -> Result<(), Error> {
    if path.len() + levels > MAX_DEPTH {
        return Err(Error::new(format!(
            "arrays and objects nest deeper than {MAX_DEPTH} levels"
        ))
        .located(path));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Scalars
// ---------------------------------------------------------------------------------------------

mod serializer;
mod write;

use serializer::*;
use write::*;

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use serde::Serialize;
    use serde_json::json;

    use super::*;
    use crate::json::Json;

    fn canon<T: Serialize + ?Sized>(value: &T) -> String {
        canonicalize(value).unwrap()
    }

    fn text(json: &str) -> String {
        canon(&Json::parse(json).unwrap())
    }

    /// RFC 8785 Appendix B (every finite row), plus extra rows; each expected string was checked
    /// against `String(x)` in node.
    const NUMBERS: &[(u64, &str)] = &[
        // Appendix B.
        (0x0000_0000_0000_0000, "0"),
        (0x8000_0000_0000_0000, "0"),
        (0x0000_0000_0000_0001, "5e-324"),
        (0x8000_0000_0000_0001, "-5e-324"),
        (0x7fef_ffff_ffff_ffff, "1.7976931348623157e+308"),
        (0xffef_ffff_ffff_ffff, "-1.7976931348623157e+308"),
        (0x4340_0000_0000_0000, "9007199254740992"),
        (0xc340_0000_0000_0000, "-9007199254740992"),
        (0x4430_0000_0000_0000, "295147905179352830000"),
        (0x44b5_2d02_c7e1_4af5, "9.999999999999997e+22"),
        (0x44b5_2d02_c7e1_4af6, "1e+23"),
        (0x44b5_2d02_c7e1_4af7, "1.0000000000000001e+23"),
        (0x444b_1ae4_d6e2_ef4e, "999999999999999700000"),
        (0x444b_1ae4_d6e2_ef4f, "999999999999999900000"),
        (0x444b_1ae4_d6e2_ef50, "1e+21"),
        (0x3eb0_c6f7_a0b5_ed8c, "9.999999999999997e-7"),
        (0x3eb0_c6f7_a0b5_ed8d, "0.000001"),
        (0x41b3_de43_5555_5553, "333333333.3333332"),
        (0x41b3_de43_5555_5554, "333333333.33333325"),
        (0x41b3_de43_5555_5555, "333333333.3333333"),
        (0x41b3_de43_5555_5556, "333333333.3333334"),
        (0x41b3_de43_5555_5557, "333333333.33333343"),
        (0xbecb_f647_612f_3696, "-0.0000033333333333333333"),
        (0x4314_3ff3_c1cb_0959, "1424953923781206.2"),
        // More: the exponent thresholds and everyday values.
        (0x3e7a_d7f2_9abc_af48, "1e-7"),
        (0x4012_0000_0000_0000, "4.5"),
        (0x3f60_624d_d2f1_a9fc, "0.002"),
        (0x441a_c53a_7e04_bcda, "123456789012345680000"),
        (0x4629_3e59_39a0_8cea, "1e+30"),
        (0x3a53_ce9a_36f2_3c10, "1e-27"),
        (0x3fb9_9999_9999_999a, "0.1"),
        (0x43f0_0000_0000_0000, "18446744073709552000"),
        (0x43e0_0000_0000_0000, "9223372036854776000"),
        (0x4480_f0cf_064d_d592, "1e+22"),
        (0x3c36_b082_c214_8b8e, "1.23e-18"),
        (0x3eb4_b3fd_5942_cd96, "0.000001234"),
        (0x4059_0000_0000_0000, "100"),
        (0xbff8_0000_0000_0000, "-1.5"),
    ];

    #[test]
    fn numbers_follow_ecmascript() {
        for &(bits, expected) in NUMBERS {
            let value = f64::from_bits(bits);
            assert_eq!(canon(&value), expected, "{bits:016x}");
            // The same number inside JSON text, written the way Rust writes it.
            assert_eq!(
                text(&format!("[{value:e}]")),
                format!("[{expected}]"),
                "{bits:016x}"
            );
        }
    }

    #[test]
    fn non_finite_numbers_are_errors_appendix_b() {
        for (bits, reason) in [
            (0x7fff_ffff_ffff_ffff_u64, "NaN is not a JSON number"),
            (0x7ff0_0000_0000_0000, "Infinity is not a JSON number"),
            (0xfff0_0000_0000_0000, "-Infinity is not a JSON number"),
        ] {
            let error = canonicalize(&f64::from_bits(bits)).unwrap_err();
            assert_eq!(error.path, "$");
            assert_eq!(error.reason, reason);
        }
        assert!(canonicalize(&f32::NAN).is_err());
        assert!(canonicalize(&[1.0, f64::INFINITY]).is_err());
    }

    #[test]
    fn integers_are_doubles() {
        assert_eq!(canon(&0_u8), "0");
        assert_eq!(canon(&-7_i8), "-7");
        assert_eq!(canon(&i32::MIN), "-2147483648");
        assert_eq!(canon(&u32::MAX), "4294967295");
        assert_eq!(canon(&9_007_199_254_740_992_u64), "9007199254740992");
        // 2^53 + 1 is not a double: JSON.parse reads it as 2^53.
        assert_eq!(canon(&9_007_199_254_740_993_u64), "9007199254740992");
        assert_eq!(canon(&-9_007_199_254_740_993_i64), "-9007199254740992");
        assert_eq!(canon(&u64::MAX), "18446744073709552000");
        assert_eq!(canon(&i64::MIN), "-9223372036854776000");
        assert_eq!(canon(&u128::MAX), "3.402823669209385e+38");
        assert_eq!(canon(&i128::MIN), "-1.7014118346046923e+38");
        assert_eq!(
            canon(&123_456_789_012_345_678_901_i128),
            "123456789012345680000"
        );
        assert_eq!(canon(&1_000_000_000_000_000_000_000_u128), "1e+21");
        assert_eq!(
            text("[18446744073709551615, 12345678901234567890123, 1.0, -0, -0.0]"),
            "[18446744073709552000,1.2345678901234568e+22,1,0,0]"
        );
    }

    #[test]
    fn f32_is_the_decimal_it_prints_as() {
        assert_eq!(canon(&0.1_f32), "0.1");
        assert_eq!(canon(&16_777_217_f32), "16777216");
        assert_eq!(canon(&1e-7_f32), "1e-7");
        assert_eq!(canon(&f32::MAX), "3.4028235e+38");
        assert_eq!(canon(&-0.0_f32), "0");
    }

    #[test]
    fn embedded_floats_are_read_exactly() {
        // serde_json's default float parser is off by one ulp for these; `JSON.parse` is not.
        assert_eq!(
            text("[94.039598684196953, 3.8986704482708323e+143, 1.4172977578871475e-179]"),
            "[94.03959868419695,3.8986704482708323e+143,1.4172977578871475e-179]"
        );
    }

    /// RFC 8785 §3.2.2 (input) and §3.2.3 (output).
    const RFC_EXAMPLE_INPUT: &str = r#"{
      "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
      "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
      "literals": [null, true, false]
    }"#;
    const RFC_EXAMPLE_OUTPUT: &str = "{\"literals\":[null,true,false],\"numbers\":[333333333.3333333,\
        1e+30,4.5,0.002,1e-27],\"string\":\"\u{20ac}$\\u000f\\nA'B\\\"\\\\\\\\\\\"/\"}";

    #[test]
    fn rfc_example_object() {
        assert_eq!(text(RFC_EXAMPLE_INPUT), RFC_EXAMPLE_OUTPUT);
        let value: serde_json::Value = serde_json::from_str(RFC_EXAMPLE_INPUT).unwrap();
        assert_eq!(canon(&value), RFC_EXAMPLE_OUTPUT);
        // The RFC's UTF-8 dump of the output.
        let bytes: Vec<u8> = "7b 22 6c 69 74 65 72 61 6c 73 22 3a 5b 6e 75 6c 6c 2c 74 72 \
            75 65 2c 66 61 6c 73 65 5d 2c 22 6e 75 6d 62 65 72 73 22 3a \
            5b 33 33 33 33 33 33 33 33 33 2e 33 33 33 33 33 33 33 2c 31 \
            65 2b 33 30 2c 34 2e 35 2c 30 2e 30 30 32 2c 31 65 2d 32 37 \
            5d 2c 22 73 74 72 69 6e 67 22 3a 22 e2 82 ac 24 5c 75 30 30 \
            30 66 5c 6e 41 27 42 5c 22 5c 5c 5c 5c 5c 22 2f 22 7d"
            .split_whitespace()
            .map(|byte| u8::from_str_radix(byte, 16).unwrap())
            .collect();
        assert_eq!(RFC_EXAMPLE_OUTPUT.as_bytes(), bytes);
    }

    #[test]
    fn rfc_sorting_example() {
        // RFC 8785 §3.2.3.
        let input = r#"{
          "\u20ac": "Euro Sign",
          "\r": "Carriage Return",
          "\ufb33": "Hebrew Letter Dalet With Dagesh",
          "1": "One",
          "\ud83d\ude00": "Emoji: Grinning Face",
          "\u0080": "Control",
          "\u00f6": "Latin Small Letter O With Diaeresis"
        }"#;
        assert_eq!(
            text(input),
            "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\
             \"\u{f6}\":\"Latin Small Letter O With Diaeresis\",\"\u{20ac}\":\"Euro Sign\",\
             \"\u{1f600}\":\"Emoji: Grinning Face\",\
             \"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}"
        );
    }

    #[test]
    fn keys_sort_by_utf16_code_units_not_utf8_bytes() {
        // U+10000 is D800 DC00 in UTF-16, before U+E000 and U+FFFF; in UTF-8 it sorts last.
        let map: BTreeMap<&str, u8> =
            [("\u{ffff}", 3), ("z", 4), ("\u{10000}", 1), ("\u{e000}", 2)]
                .into_iter()
                .collect();
        assert_eq!(
            canon(&map),
            "{\"z\":4,\"\u{10000}\":1,\"\u{e000}\":2,\"\u{ffff}\":3}"
        );
        let hashed: HashMap<String, u8> = map.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect();
        assert_eq!(canon(&hashed), canon(&map));
    }

    #[test]
    fn strings_are_escaped_like_json_stringify() {
        let all_controls: String = (0_u8..0x20).map(char::from).collect();
        assert_eq!(
            canon(&all_controls),
            "\"\\u0000\\u0001\\u0002\\u0003\\u0004\\u0005\\u0006\\u0007\\b\\t\\n\\u000b\\f\\r\
             \\u000e\\u000f\\u0010\\u0011\\u0012\\u0013\\u0014\\u0015\\u0016\\u0017\\u0018\\u0019\
             \\u001a\\u001b\\u001c\\u001d\\u001e\\u001f\""
        );
        assert_eq!(
            canon("\u{7f}\u{2028}\u{2029}\"\\/é😀"),
            "\"\u{7f}\u{2028}\u{2029}\\\"\\\\/é😀\""
        );
        assert_eq!(canon(&'"'), r#""\"""#);
        assert_eq!(canon(""), r#""""#);
    }

    #[derive(Serialize)]
    struct Line {
        sku: String,
        price: f64,
        qty: u32,
    }

    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Order {
        order_id: String,
        lines: Vec<Line>,
        note: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        coupon: Option<String>,
        raw: Json,
        tags: BTreeMap<String, Json>,
        status: Status,
    }

    #[derive(Serialize)]
    enum Status {
        Open,
    }

    fn order(price: f64) -> Order {
        Order {
            order_id: "o1".into(),
            lines: (0..3)
                .map(|i| Line {
                    sku: format!("s{i}"),
                    price: if i == 2 { price } else { 1.5 },
                    qty: i,
                })
                .collect(),
            note: None,
            coupon: None,
            raw: Json::parse(r#"{ "z": 1e0, "a": [ 2.50 ] }"#).unwrap(),
            tags: [("b".to_owned(), Json::parse("true").unwrap())]
                .into_iter()
                .collect(),
            status: Status::Open,
        }
    }

    #[test]
    fn user_types_canonicalize_directly() {
        let expected = "{\"lines\":[{\"price\":1.5,\"qty\":0,\"sku\":\"s0\"},\
            {\"price\":1.5,\"qty\":1,\"sku\":\"s1\"},{\"price\":10,\"qty\":2,\"sku\":\"s2\"}],\
            \"note\":null,\"orderId\":\"o1\",\"raw\":{\"a\":[2.5],\"z\":1},\"status\":\"Open\",\
            \"tags\":{\"b\":true}}";
        let order = order(10.0);
        assert_eq!(canon(&order), expected);
        // The same value as serde_json text, as a `Value` and as `Json` all canonicalize alike.
        assert_eq!(canon(&serde_json::to_value(&order).unwrap()), expected);
        assert_eq!(canon(&Json::encode(&order).unwrap()), expected);
        assert_eq!(
            text(&serde_json::to_string_pretty(&order).unwrap()),
            expected
        );
    }

    #[test]
    fn errors_name_the_path() {
        let error = canonicalize(&order(f64::NAN)).unwrap_err();
        assert_eq!(error.path, "$.lines[2].price");
        assert_eq!(error.reason, "NaN is not a JSON number");
        assert_eq!(
            error.to_string(),
            "cannot canonicalize at $.lines[2].price: NaN is not a JSON number"
        );
        let error = canonicalize(&order(f64::NEG_INFINITY)).unwrap_err();
        assert_eq!(error.path, "$.lines[2].price");
        assert_eq!(error.reason, "-Infinity is not a JSON number");

        let odd_keys = json!({ "a b": [0, { "": [1] }] });
        let mut map: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        map.insert("a b", vec![0.0, f64::INFINITY]);
        let error = canonicalize(&(odd_keys, map)).unwrap_err();
        assert_eq!(error.path, "$[1][\"a b\"][1]");
        assert_eq!(error.reason, "Infinity is not a JSON number");
    }

    #[test]
    fn keys_must_be_strings() {
        let mut map = BTreeMap::new();
        map.insert(1, "one");
        let error = canonicalize(&BTreeMap::from([("m", vec![map])])).unwrap_err();
        assert_eq!(error.path, "$.m[0]");
        assert_eq!(error.reason, "object keys must be strings, got an integer");

        let error = canonicalize(&HashMap::from([(true, 1)])).unwrap_err();
        assert_eq!(error.reason, "object keys must be strings, got a boolean");

        // What serde_json accepts as a string key is accepted here too.
        #[derive(Serialize, PartialEq, Eq, PartialOrd, Ord)]
        enum Kind {
            B,
            A,
        }
        #[derive(Serialize, PartialEq, Eq, PartialOrd, Ord)]
        struct Name(String);
        assert_eq!(
            canon(&BTreeMap::from([(Kind::B, 1), (Kind::A, 2)])),
            r#"{"A":2,"B":1}"#
        );
        assert_eq!(
            canon(&BTreeMap::from([('y', 1), ('x', 2)])),
            r#"{"x":2,"y":1}"#
        );
        assert_eq!(
            canon(&BTreeMap::from([(Name("n".into()), 1)])),
            r#"{"n":1}"#
        );
    }

    #[test]
    fn duplicate_keys_are_errors() {
        #[derive(Serialize)]
        struct Inner {
            a: u8,
        }
        #[derive(Serialize)]
        struct Outer {
            a: u8,
            #[serde(flatten)]
            inner: Inner,
        }
        let error = canonicalize(&vec![Outer {
            a: 1,
            inner: Inner { a: 2 },
        }])
        .unwrap_err();
        assert_eq!(error.path, "$[0]");
        assert_eq!(error.reason, "duplicate object key \"a\"");
    }

    #[test]
    fn serde_data_model_maps_like_serde_json() {
        #[derive(Serialize)]
        struct Unit;
        #[derive(Serialize)]
        struct Newtype(u8);
        #[derive(Serialize)]
        struct Tuple(u8, &'static str);
        #[derive(Serialize)]
        enum E {
            Unit,
            Newtype(f64),
            Tuple(u8, u8),
            Struct { z: u8, a: Option<u8> },
        }
        #[derive(Serialize)]
        #[serde(tag = "type", rename_all = "lowercase")]
        enum Tagged {
            Moved { to: String, at: u32 },
        }
        #[derive(Serialize)]
        #[serde(untagged)]
        enum Untagged {
            Text(&'static str),
        }
        #[derive(Serialize)]
        struct All {
            unit: (),
            unit_struct: Unit,
            newtype: Newtype,
            tuple: Tuple,
            pair: (u8, bool),
            none: Option<u8>,
            some: Option<u8>,
            variants: Vec<E>,
            tagged: Tagged,
            untagged: Untagged,
            #[serde(with = "serde_bytes_like")]
            bytes: Vec<u8>,
            chars: [char; 2],
            empty_seq: Vec<u8>,
            empty_map: BTreeMap<String, u8>,
        }
        mod serde_bytes_like {
            pub(super) fn serialize<S: serde::Serializer>(
                bytes: &[u8],
                serializer: S,
            ) -> Result<S::Ok, S::Error> {
                serializer.serialize_bytes(bytes)
            }
        }
        let all = All {
            unit: (),
            unit_struct: Unit,
            newtype: Newtype(7),
            tuple: Tuple(1, "x"),
            pair: (2, true),
            none: None,
            some: Some(3),
            variants: vec![
                E::Unit,
                E::Newtype(-0.0),
                E::Tuple(4, 5),
                E::Struct { z: 6, a: None },
            ],
            tagged: Tagged::Moved {
                to: "b".into(),
                at: 9,
            },
            untagged: Untagged::Text("u"),
            bytes: vec![0, 255],
            chars: ['\n', 'é'],
            empty_seq: vec![],
            empty_map: BTreeMap::new(),
        };
        let expected = "{\"bytes\":[0,255],\"chars\":[\"\\n\",\"é\"],\"empty_map\":{},\
            \"empty_seq\":[],\"newtype\":7,\"none\":null,\"pair\":[2,true],\"some\":3,\
            \"tagged\":{\"at\":9,\"to\":\"b\",\"type\":\"moved\"},\"tuple\":[1,\"x\"],\
            \"unit\":null,\"unit_struct\":null,\"untagged\":\"u\",\"variants\":[\"Unit\",\
            {\"Newtype\":0},{\"Tuple\":[4,5]},{\"Struct\":{\"a\":null,\"z\":6}}]}";
        assert_eq!(canon(&all), expected);
        assert_eq!(canon(&serde_json::to_value(&all).unwrap()), expected);
        assert_eq!(text(&serde_json::to_string(&all).unwrap()), expected);
    }

    #[test]
    fn errors_inside_variants_and_user_impls_name_the_path() {
        #[derive(Serialize)]
        enum E {
            Struct { x: f64 },
            Tuple(u8, f64),
            Newtype(f64),
        }
        let cases = [
            (E::Struct { x: f64::NAN }, "$[0][0].Struct.x"),
            (E::Tuple(1, f64::NAN), "$[0][0].Tuple[1]"),
            (E::Newtype(f64::NAN), "$[0][0].Newtype"),
        ];
        for (value, path) in cases {
            let error = canonicalize(&(vec![value], 1)).unwrap_err();
            assert_eq!(error.path, path);
        }

        struct Fails;
        impl Serialize for Fails {
            fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
                Err(serde::ser::Error::custom("not today"))
            }
        }
        #[derive(Serialize)]
        struct Holder {
            ok: u8,
            inner: Vec<Fails>,
        }
        let error = canonicalize(&Holder {
            ok: 1,
            inner: vec![Fails],
        })
        .unwrap_err();
        assert_eq!(error.path, "$.inner[0]");
        assert_eq!(error.reason, "not today");
        assert_eq!(canonicalize(&Fails).unwrap_err().path, "$");
    }

    #[test]
    fn embedded_json_text_is_canonicalized() {
        assert_eq!(
            text(" { \"b\" : [ 1 , 2.0 ] , \"a\" : \"\\u0041\" } "),
            r#"{"a":"A","b":[1,2]}"#
        );
        assert_eq!(text("null"), "null");
        assert_eq!(text("\"\\u2028\""), "\"\u{2028}\"");
        let raw = serde_json::value::RawValue::from_string("[3, 1e2]".to_owned()).unwrap();
        assert_eq!(canon(&raw), "[3,100]");
        // Text that is not canonicalizable (an out-of-range number, a lone surrogate) is an error
        // at the place it is embedded.
        #[derive(Serialize)]
        struct Holder {
            payload: Json,
        }
        for bad in ["[1e400]", r#""\ud800""#] {
            // `Json` only checks the syntax, so both are valid `Json`.
            let payload = Json::parse(bad).unwrap();
            let error = canonicalize(&Holder { payload }).unwrap_err();
            assert_eq!(error.path, "$.payload", "{bad}");
            assert!(
                error.reason.starts_with("embedded JSON text"),
                "{bad}: {error}"
            );
        }
    }

    /// `depth` arrays nested around `null`, built without recursion.
    fn nested_arrays(depth: usize) -> serde_json::Value {
        let mut value = serde_json::Value::Null;
        for _ in 0..depth {
            value = serde_json::Value::Array(vec![value]);
        }
        value
    }

    /// `depth` objects nested as `{"a":{"a":...null}}`, built without recursion.
    fn nested_objects(depth: usize) -> serde_json::Value {
        let mut value = serde_json::Value::Null;
        for _ in 0..depth {
            // Not `json!`, which would copy `value` through a recursive `to_value`.
            let mut map = serde_json::Map::new();
            map.insert("a".to_owned(), value);
            value = serde_json::Value::Object(map);
        }
        value
    }

    /// Drops a value without recursion (dropping a `Value` recurses once per level).
    fn dismantle(value: serde_json::Value) {
        let mut stack = vec![value];
        while let Some(value) = stack.pop() {
            match value {
                serde_json::Value::Array(items) => stack.extend(items),
                serde_json::Value::Object(map) => stack.extend(map.into_iter().map(|(_, v)| v)),
                _ => {}
            }
        }
    }

    #[test]
    fn deep_values_are_an_error_and_never_overflow_the_stack() {
        for deep in [nested_arrays(10_000), nested_objects(10_000)] {
            let error = canonicalize(&deep).unwrap_err();
            assert_eq!(
                error.reason,
                "arrays and objects nest deeper than 128 levels"
            );
            let step = if deep.is_array() { "[0]" } else { ".a" };
            assert_eq!(error.path, format!("${}", step.repeat(MAX_DEPTH)));
            assert!(crate::diff::fingerprint(&deep).is_err());
            dismantle(deep);
        }

        // `MAX_DEPTH` levels are written, one more is not.
        let open = "[".repeat(MAX_DEPTH);
        let close = "]".repeat(MAX_DEPTH);
        assert_eq!(
            canon(&nested_arrays(MAX_DEPTH)),
            format!("{open}null{close}")
        );
        assert!(canonicalize(&nested_arrays(MAX_DEPTH + 1)).is_err());
        assert!(canonicalize(&nested_objects(MAX_DEPTH)).is_ok());
        assert!(canonicalize(&nested_objects(MAX_DEPTH + 1)).is_err());
        // Embedded JSON text counts from where it is embedded.
        let text = Json::parse(&format!("{open}{close}")[1..2 * MAX_DEPTH - 1]).unwrap();
        assert!(canonicalize(&vec![text.clone()]).is_ok());
        assert!(canonicalize(&vec![vec![text]]).is_err());

        // A user type counts the objects of its variants too: `{"Node":{"Node":..."Leaf"}}`.
        #[derive(Serialize)]
        enum Tree {
            Leaf,
            Node(Box<Tree>),
        }
        let tree = |depth: usize| {
            let mut tree = Tree::Leaf;
            for _ in 0..depth {
                tree = Tree::Node(Box::new(tree));
            }
            tree
        };
        assert!(canonicalize(&tree(MAX_DEPTH)).is_ok());
        let mut deep = tree(10_000);
        let error = canonicalize(&deep).unwrap_err();
        assert_eq!(error.path, format!("${}", ".Node".repeat(MAX_DEPTH)));
        // Taken apart without recursion, as `dismantle` does.
        while let Tree::Node(next) = deep {
            deep = *next;
        }
    }
}
