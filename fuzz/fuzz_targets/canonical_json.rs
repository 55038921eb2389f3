//! Canonical JSON (RFC 8785) of any JSON text: it never panics, and when the text parses, the
//! canonical form parses back to the same value and is its own canonical form, whether it is
//! written from a `serde_json::Value` or from the text itself (`Json`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use watukuy_core::diff::canonicalize;
use watukuy_core::json::Json;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // The text as embedded JSON: an error for what does not parse, never a panic.
    let embedded = Json::parse(text).ok().map(|json| canonicalize(&json));
    let Ok(value) = serde_json::from_str::<Value>(text) else {
        return;
    };
    let Ok(canonical) = canonicalize(&value) else {
        // Too deep, or a number serde_json reads but a double cannot hold: an error, not a form.
        return;
    };
    if let Some(Ok(from_text)) = &embedded {
        assert_eq!(from_text, &canonical, "the text and its value differ");
    }
    let again: Value = serde_json::from_str(&canonical).expect("canonical JSON parses");
    assert_eq!(
        canonicalize(&again).as_deref(),
        Ok(canonical.as_str()),
        "not idempotent"
    );
});
