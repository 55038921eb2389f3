//! A JSON array of items, decoded one item at a time.

use std::fmt;

use serde::de::{Deserialize, Deserializer, SeqAccess, Visitor};
use serde_json::value::RawValue;
use watukuy_core::{Page, poller::RejectedItem};

/// The deepest nesting of arrays and objects serde_json decodes (its recursion limit, 128,
/// counts the level that fails); `tests::the_parser_limit_is_what_serde_json_does` checks it.
const PARSER_MAX_DEPTH: usize = 127;

/// The items of a JSON array, decoded one at a time: an item that cannot be decoded into a
/// [`serde_json::Value`] becomes a [`RejectedItem`] (its text as sent and the reason), and the
/// other items go through. The engine quarantines rejected items (see
/// [`Page::reject`](watukuy_core::Page::reject)); one of them never fails the page.
///
/// Two kinds of valid JSON cannot be decoded:
///
/// - a **lone UTF-16 surrogate escape** (`"\ud800"`, `"\udc00"`: an escape in `\ud800` to
///   `\udfff` without its pair), because a Rust string is UTF-8 and cannot hold one;
/// - arrays and objects nested **more than 127 levels** deep, serde_json's recursion limit.
///
/// The array is split into items without recursion (serde_json's raw values), so however deep
/// an item nests it costs no stack; text that is not JSON at all still fails the whole array.
///
/// [`HttpResponse::items_page`](crate::HttpResponse::items_page) and
/// [`items_page_at`](crate::HttpResponse::items_page_at) decode their items this way; use
/// `Items` as the type of the items in a listing read with
/// [`page_with`](crate::HttpResponse::page_with). It can only be read from JSON text by
/// serde_json (`from_slice`, `from_str`, `from_reader`), which hands out each item's raw text;
/// other deserializers (`serde_json::from_value` among them) fail.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Items {
    /// The decoded items, in the order of the array.
    pub items: Vec<serde_json::Value>,
    /// The items that could not be decoded, in the order of the array.
    pub rejected: Vec<RejectedItem>,
}

impl Items {
    /// A page of these items: the decoded ones as its `items`, the others as its `rejected`.
    pub fn into_page(self) -> Page {
        let mut page = Page::new(self.items);
        page.rejected = self.rejected;
        page
    }
}

impl From<Items> for Page {
    fn from(items: Items) -> Self {
        items.into_page()
    }
}

impl<'de> Deserialize<'de> for Items {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_seq(ItemsVisitor)
    }
}

struct ItemsVisitor;

impl<'de> Visitor<'de> for ItemsVisitor {
    type Value = Items;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON array of items")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Items, A::Error> {
        let mut items = Items::default();
        let mut index = 0_usize;
        // A raw value is only checked for syntax (iteratively, at any depth); decoding it is a
        // separate step whose failure stays with this one item.
        while let Some(raw) = seq.next_element::<Box<RawValue>>()? {
            match serde_json::from_str(raw.get()) {
                Ok(item) => items.items.push(item),
                Err(error) => {
                    let reason = match undecodable(raw.get()) {
                        Some(cause) => format!("item {index}: {cause}"),
                        None => format!("item {index} cannot be decoded: {error}"),
                    };
                    items.rejected.push(RejectedItem {
                        text: String::from(Box::<str>::from(raw)),
                        reason,
                    });
                }
            }
            index += 1;
        }
        Ok(items)
    }
}

/// Why valid JSON text cannot be decoded into a `serde_json::Value`: the first lone surrogate
/// escape or the first level past [`PARSER_MAX_DEPTH`], in text order (as the parser meets them),
/// with its byte offset. `None` when neither is found. One pass, no recursion.
fn undecodable(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut depth = 0_usize;
    let mut in_string = false;
    let mut at = 0;
    while let Some(&byte) = bytes.get(at) {
        if in_string {
            match byte {
                b'"' => in_string = false,
                b'\\' if bytes.get(at + 1) == Some(&b'u') => {
                    let unit = hex_escape(bytes, at)?;
                    let paired = (0xD800..=0xDBFF).contains(&unit)
                        && hex_escape(bytes, at + 6)
                            .is_some_and(|next| (0xDC00..=0xDFFF).contains(&next));
                    if paired {
                        at += 12;
                        continue;
                    }
                    if (0xD800..=0xDFFF).contains(&unit) {
                        let escape = text.get(at..at + 6).unwrap_or("\\u????");
                        return Some(format!(
                            "the escape `{escape}` at byte {at} of the item is a lone UTF-16 \
                             surrogate, which a Rust string cannot hold"
                        ));
                    }
                    at += 6;
                    continue;
                }
                b'\\' => {
                    at += 2;
                    continue;
                }
                _ => {}
            }
        } else {
            match byte {
                b'"' => in_string = true,
                b'[' | b'{' => {
                    depth += 1;
                    if depth > PARSER_MAX_DEPTH {
                        return Some(format!(
                            "arrays and objects nest deeper than {PARSER_MAX_DEPTH} levels at byte \
                             {at} of the item, past the JSON parser's limit"
                        ));
                    }
                }
                b']' | b'}' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        at += 1;
    }
    None
}

/// The UTF-16 code unit of the `\uXXXX` escape starting at `at`, if there is one.
fn hex_escape(bytes: &[u8], at: usize) -> Option<u16> {
    let escape = bytes.get(at..at + 6)?;
    let (prefix, digits) = escape.split_at(2);
    if prefix != b"\\u" || !digits.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    u16::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(depth: usize) -> String {
        format!("{}{}", "[".repeat(depth), "]".repeat(depth))
    }

    #[test]
    fn the_parser_limit_is_what_serde_json_does() {
        assert!(serde_json::from_str::<serde_json::Value>(&nested(PARSER_MAX_DEPTH)).is_ok());
        assert!(serde_json::from_str::<serde_json::Value>(&nested(PARSER_MAX_DEPTH + 1)).is_err());
        assert_eq!(undecodable(&nested(PARSER_MAX_DEPTH)), None);
        assert_eq!(
            undecodable(&nested(PARSER_MAX_DEPTH + 1)).unwrap(),
            "arrays and objects nest deeper than 127 levels at byte 127 of the item, past the \
             JSON parser's limit"
        );
    }

    #[test]
    fn good_items_go_through_and_bad_ones_are_rejected_with_the_reason() {
        let deep = nested(200);
        let body = format!(
            r#"[{{"id":"a"}}, {{"id":"b","name":"\ud800"}}, "\uDC00", {deep}, "\ud83d\ude00", {{"id":"c"}}]"#
        );
        let items: Items = serde_json::from_str(&body).unwrap();
        assert_eq!(
            items.items,
            vec![
                serde_json::json!({ "id": "a" }),
                serde_json::json!("\u{1f600}"),
                serde_json::json!({ "id": "c" }),
            ]
        );
        let rejected: Vec<(&str, &str)> = items
            .rejected
            .iter()
            .map(|r| (r.text.as_str(), r.reason.as_str()))
            .collect();
        assert_eq!(
            rejected,
            vec![
                (
                    r#"{"id":"b","name":"\ud800"}"#,
                    "item 1: the escape `\\ud800` at byte 18 of the item is a lone UTF-16 \
                     surrogate, which a Rust string cannot hold"
                ),
                (
                    r#""\uDC00""#,
                    "item 2: the escape `\\uDC00` at byte 1 of the item is a lone UTF-16 \
                     surrogate, which a Rust string cannot hold"
                ),
                (
                    deep.as_str(),
                    "item 3: arrays and objects nest deeper than 127 levels at byte 127 of the \
                     item, past the JSON parser's limit"
                ),
            ]
        );
    }

    #[test]
    fn surrogate_scan_follows_escapes_as_the_parser_does() {
        // An escaped backslash before `u` is no escape; a pair is fine; a leading surrogate
        // followed by anything but a trailing one is lone; the first problem in text order wins.
        assert_eq!(undecodable(r#"["\\ud800", "\ud800\udfff", "\"{["]"#), None);
        for (text, at) in [
            (r#""\ud800\u0041""#, 1),
            (r#""\ud800\ud800""#, 1),
            (r#"["x\ud800"]"#, 3),
            (r#"{"\udfff":1}"#, 2),
        ] {
            let cause = undecodable(text).unwrap();
            assert!(cause.contains(&format!("at byte {at} ")), "{text}: {cause}");
            assert!(serde_json::from_str::<serde_json::Value>(text).is_err());
        }
        let first = format!("[\"\\ud800\", {}]", nested(130));
        assert!(undecodable(&first).unwrap().contains("surrogate"));
    }

    #[test]
    fn a_body_that_is_not_an_array_is_an_error() {
        let error = serde_json::from_str::<Items>(r#"{"id":"a"}"#).unwrap_err();
        assert!(
            error.to_string().contains("expected a JSON array of items"),
            "{error}"
        );
        let error = serde_json::from_str::<Items>(&"[".repeat(100_000)).unwrap_err();
        assert!(error.to_string().contains("EOF while parsing"), "{error}");
    }
}
