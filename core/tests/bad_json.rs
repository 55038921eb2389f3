//! Items the engine cannot take, end to end on a manual clock: an item nested deeper than
//! `MAX_ITEM_DEPTH` and an item the fetch could not decode (`Page::reject`) are quarantined with
//! their reason while the rest of the page commits; an item exactly `MAX_ITEM_DEPTH` deep is
//! taken, and its event reads back byte for byte from the outbox of `MemoryStore` and of
//! `SqliteStore`.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use watukuy_core::{
    Engine, EventType, FetchContext, Page, Poller, TickOptions, TickResult,
    clock::ManualClock,
    cursor,
    poller::MAX_ITEM_DEPTH,
    rng::SeededRng,
    store::{ParkedKind, ParkedQuery, Store},
};
use watukuy_store_memory::MemoryStore;
use watukuy_store_sqlite::{SqliteOptions, SqliteStore};
use watukuy_testkit::world::{POLLER, Recorder, key};

/// 2026-01-01T00:00:00Z.
const T0: i64 = 1_767_225_600_000;

/// The object `{"id": id, "x": [[...null]]}`, nested `depth` levels deep in all (the object is
/// level 1). Built without `json!`, which copies interpolated values recursively.
fn deep_item(id: &str, depth: usize) -> Value {
    let mut x = Value::Null;
    for _ in 1..depth {
        x = Value::Array(vec![x]);
    }
    let mut item = serde_json::Map::new();
    item.insert("id".to_owned(), Value::String(id.to_owned()));
    item.insert("x".to_owned(), x);
    Value::Object(item)
}

/// An engine on `store` and `clock` whose one poller (a full scan by `id`) is handed `page` by
/// every fetch.
async fn engine(store: Arc<dyn Store>, clock: &ManualClock, page: Page) -> Engine {
    let poller = Poller::builder::<Value>(POLLER)
        .identity_field("id")
        .cursor(cursor::snapshot_diff())
        .fetch(move |_ctx: FetchContext| {
            let page = page.clone();
            async move { Ok(page) }
        })
        .build()
        .unwrap();
    let engine = Engine::builder(store)
        .poller(poller)
        .clock(Arc::new(clock.clone()))
        .rng(Arc::new(SeededRng::new(7)))
        .instance_id("node-a")
        .build()
        .unwrap();
    engine.migrate().await.unwrap();
    engine
}

async fn tick(engine: &Engine) -> TickResult {
    let result = engine.tick(TickOptions::default()).await.unwrap();
    assert_eq!(result.polled.len(), 1, "{result:?}");
    assert_eq!(result.polled[0].error, None, "{result:?}");
    result
}

#[tokio::test]
async fn a_too_deep_item_and_an_undecodable_item_are_quarantined_and_the_good_item_commits() {
    let store = Arc::new(MemoryStore::new());
    let clock = ManualClock::new(T0);
    let too_deep = deep_item("too-deep", MAX_ITEM_DEPTH + 1);
    let undecodable = r#"{"id":"bad","name":"\ud800"}"#;
    let reason = "item 2: the escape `\\ud800` at byte 20 of the item is a lone UTF-16 \
                  surrogate, which a Rust string cannot hold";
    let page = Page::new(vec![json!({ "id": "good", "v": 1 }), too_deep.clone()])
        .reject(undecodable, reason)
        .has_more(false);
    let engine = engine(Arc::clone(&store) as Arc<dyn Store>, &clock, page).await;
    let recorder = Recorder::attached(&engine).unwrap();

    let result = tick(&engine).await;
    assert_eq!(result.polled[0].events, 1, "{result:?}");
    let events = recorder.events();
    assert_eq!(events.len(), 1);
    assert_eq!(
        (events[0].event_type, events[0].subject.as_str()),
        (EventType::Created, "good")
    );

    let parked = store
        .list_parked(&key(), ParkedQuery::default().kind(ParkedKind::Invalid))
        .await
        .unwrap();
    assert_eq!(parked.len(), 2, "{parked:?}");
    let row_of = |message: &str| {
        parked
            .iter()
            .find(|row| row.error.error.message == message)
            .unwrap_or_else(|| panic!("no parked row says {message:?}: {parked:?}"))
    };
    let deep_row = row_of(
        "the item is nested deeper than 100 levels of arrays and objects, which watukuy does \
         not store",
    );
    assert_eq!(deep_row.item.as_ref().unwrap().to_value(), too_deep);
    let rejected_row = row_of(reason);
    // The undecodable item is kept as the text the API sent, in a JSON string.
    assert_eq!(
        rejected_row.item.as_ref().unwrap().to_value(),
        Value::String(undecodable.to_owned())
    );
    for row in [deep_row, rejected_row] {
        assert!(row.event.is_none());
        assert_eq!(row.error.error.name, "ValidationError");
        assert_eq!(row.error.error.code.as_deref(), Some("VALIDATION"));
    }

    // The same page again parks nothing new and emits nothing: the rows are keyed by the item.
    clock.advance(Duration::from_secs(120));
    tick(&engine).await;
    assert_eq!(recorder.events().len(), 1);
    assert_eq!(store.counts(&key()).await.map(|c| c.parked).unwrap(), 2);
}

#[tokio::test]
async fn an_item_exactly_max_item_depth_deep_reads_back_byte_for_byte_from_every_outbox() {
    assert_eq!(MAX_ITEM_DEPTH, 100);
    let item = deep_item("deep", MAX_ITEM_DEPTH);
    let text = serde_json::to_string(&item).unwrap();
    let sqlite = SqliteStore::open(SqliteOptions::in_memory()).unwrap();
    let stores: [(&str, Arc<dyn Store>); 2] = [
        ("memory", Arc::new(MemoryStore::new())),
        ("sqlite", Arc::new(sqlite)),
    ];
    for (label, store) in stores {
        let clock = ManualClock::new(T0);
        let page = Page::new(vec![item.clone()]).has_more(false);
        let engine = engine(Arc::clone(&store), &clock, page).await;

        // No handler yet: the event stays in the outbox, read back from the store here.
        let result = tick(&engine).await;
        assert_eq!(result.polled[0].events, 1, "{label}: {result:?}");
        let pending = store.load_pending(&key(), 10).await.unwrap();
        assert_eq!(pending.len(), 1, "{label}");
        let data = pending[0].event.data.as_ref().unwrap();
        assert_eq!(data.as_str(), text, "{label}: the stored text");
        assert_eq!(data.to_value(), item, "{label}: a consumer can decode it");
        assert!(
            store
                .list_parked(&key(), ParkedQuery::default())
                .await
                .unwrap()
                .is_empty()
        );

        // Delivered from the store to a handler, still byte for byte.
        let recorder = Recorder::attached(&engine).unwrap();
        clock.advance(Duration::from_secs(120));
        tick(&engine).await;
        let events = recorder.events();
        assert_eq!(events.len(), 1, "{label}");
        assert_eq!(
            events[0].data.as_ref().map(|d| d.as_str()),
            Some(text.as_str()),
            "{label}: the delivered text"
        );
        assert_eq!(
            store.counts(&key()).await.map(|c| c.pending).unwrap(),
            0,
            "{label}"
        );
    }
}
