//! Pages of items as an API sends them, through an engine's whole poll cycle on the memory
//! store, with each cursor strategy: identity and version extraction, validation, canonical
//! fingerprints, the diff, the cursor's own reading of the items (timestamps) or of the page
//! (tokens, page numbers). Never a panic; the tick always answers (a poll that fails names its
//! error); events are never more than the items fetched.
//!
//! The input is one byte choosing the strategy, then a JSON array of pages: each page an array
//! of items, or `{"items": [...], "cursor": "...", "hasMore": bool}`.
#![no_main]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use watukuy_core::clock::ManualClock;
use watukuy_core::cursor::{self, CursorConfig};
use watukuy_core::rng::SeededRng;
use watukuy_core::{Engine, FetchContext, Page, Poller, TickOptions};
use watukuy_fuzz::block_on;
use watukuy_store_memory::MemoryStore;

/// 2026-01-01T00:00:00Z.
const T0: i64 = 1_767_225_600_000;

fn strategy(kind: u8) -> CursorConfig {
    match kind % 5 {
        0 => cursor::timestamp("updatedAt").tie_break("id").into(),
        1 => cursor::timestamp("meta.modified").into(),
        2 => cursor::token(None).into(),
        3 => cursor::page(1).into(),
        _ => cursor::snapshot_diff().into(),
    }
}

fn page(value: Value) -> Page {
    match value {
        Value::Array(items) => Page::new(items),
        Value::Object(mut object) => {
            let items = match object.remove("items") {
                Some(Value::Array(items)) => items,
                _ => Vec::new(),
            };
            let mut page = Page::new(items);
            if let Some(Value::String(cursor)) = object.remove("cursor") {
                page = page.cursor(cursor);
            }
            if let Some(Value::Bool(more)) = object.remove("hasMore") {
                page = page.has_more(more);
            }
            page
        }
        other => Page::new(vec![other]),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&kind, text)) = data.split_first() else {
        return;
    };
    let Ok(Value::Array(pages)) = serde_json::from_slice::<Value>(text) else {
        return;
    };
    let pages: VecDeque<Page> = pages.into_iter().map(page).collect();
    let fed: usize = pages.iter().map(|p| p.items.len() + p.rejected.len()).sum();
    let pages = Arc::new(Mutex::new(pages));
    let poller = Poller::builder::<Value>("items")
        .identity_field("id")
        .cursor(strategy(kind))
        .fetch(move |_ctx: FetchContext| {
            let next = pages.lock().map(|mut p| p.pop_front()).ok().flatten();
            async move { Ok(next.unwrap_or_default()) }
        })
        .build()
        .expect("a valid poller");
    let engine = Engine::builder(Arc::new(MemoryStore::new()))
        .poller(poller)
        .clock(Arc::new(ManualClock::new(T0)))
        .rng(Arc::new(SeededRng::new(1)))
        .instance_id("fuzz")
        .build()
        .expect("a valid engine");
    let result = block_on(engine.tick(TickOptions::default()));
    let result = result.expect("a tick answers");
    for poll in &result.polled {
        if let Some(error) = &poll.error {
            assert!(
                !error.message.is_empty(),
                "an error without a message: {error:?}"
            );
        }
    }
    let events: u64 = result.polled.iter().map(|p| p.events).sum();
    assert!(
        events <= u64::try_from(fed).unwrap_or(u64::MAX),
        "{events} events from {fed} items"
    );
});
