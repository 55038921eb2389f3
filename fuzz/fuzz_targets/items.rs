//! A listing's JSON array read as `Items`: never a panic, and when it reads, every element of
//! the array is either a decoded item or a rejected one: none lost, none invented.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::value::RawValue;
use watukuy_http::Items;

fuzz_target!(|data: &[u8]| {
    let Ok(items) = serde_json::from_slice::<Items>(data) else {
        return;
    };
    let elements: Vec<Box<RawValue>> =
        serde_json::from_slice(data).expect("an array that reads as Items is an array");
    assert_eq!(
        items.items.len() + items.rejected.len(),
        elements.len(),
        "{items:?}"
    );
});
