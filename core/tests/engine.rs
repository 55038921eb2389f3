//! The engine end to end on `MemoryStore` and the `FakeApi`, on a manual clock.

use std::sync::Arc;
use std::time::Duration;

use watukuy_core::{EventType, store::Store};
use watukuy_store_memory::MemoryStore;
use watukuy_testkit::world::{StrategyKind, World};

#[tokio::test]
async fn a_tick_polls_commits_and_delivers_for_every_strategy() {
    for kind in StrategyKind::ALL {
        let world = World::new(7, 3).unwrap();
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let (engine, recorder) = world
            .recorded_engine(store, world.poller(kind).build().unwrap())
            .unwrap();
        let result = world.tick(&engine).await.unwrap();
        let events = recorder.events();
        assert_eq!(events.len(), 7, "{kind:?}: {result:?}");
        assert!(
            events.iter().all(|e| e.event_type == EventType::Created),
            "{kind:?}"
        );
        assert_eq!(result.polled.len(), 1, "{kind:?}");
        assert!(
            result.polled[0].error.is_none(),
            "{kind:?}: {:?}",
            result.polled[0].error
        );

        // Nothing changed: the next due tick emits nothing.
        world.advance(Duration::from_secs(60));
        world.tick(&engine).await.unwrap();
        assert_eq!(
            recorder.events().len(),
            7,
            "{kind:?}: unchanged items emit nothing"
        );

        world
            .api
            .update("item-002", serde_json::json!({ "value": 99 }))
            .unwrap();
        world.advance(Duration::from_secs(60));
        world.tick(&engine).await.unwrap();
        let events = recorder.events();
        assert_eq!(events.len(), 8, "{kind:?}: one update");
        assert_eq!(
            (events[7].event_type, events[7].subject.as_str()),
            (EventType::Updated, "item-002")
        );
    }
}

#[tokio::test]
async fn a_stream_of_pages_is_processed_page_by_page_until_it_ends() {
    use futures::StreamExt;
    use watukuy_core::{BoxError, FetchContext, Page, cursor};

    let world = World::new(10, 4).unwrap();
    let api = world.api.clone();
    let poller = world
        .poller(StrategyKind::SnapshotDiff)
        .cursor(cursor::snapshot_diff())
        .fetch_stream(move |_ctx: FetchContext| {
            let api = api.clone();
            // Three pages of 4, 4 and 2 items, then the stream ends (no has_more needed).
            futures::stream::iter(1..=3_u32)
                .then(move |page| {
                    let api = api.clone();
                    async move {
                        let listing = api.list_page(page, Some(4)).await?;
                        Ok::<Page, BoxError>(Page::new(listing.items))
                    }
                })
                .boxed()
        })
        .build()
        .unwrap();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let (engine, recorder) = world.recorded_engine(Arc::clone(&store), poller).unwrap();
    let result = world.tick(&engine).await.unwrap();
    assert_eq!(recorder.events().len(), 10, "{result:?}");
    let sequences: Vec<i64> = recorder.events().iter().map(|e| e.sequence).collect();
    assert_eq!(sequences, (1..=10).collect::<Vec<_>>());

    // A full listing through the stream detects deletes: a listing of three pages reports an
    // item missing once the next listing misses it too (`DeleteConfirmation::NextListing`).
    world.api.remove("item-003");
    world.advance(Duration::from_secs(60));
    world.tick(&engine).await.unwrap();
    assert_eq!(recorder.events().len(), 10, "a suspect, not yet a delete");
    world.advance(Duration::from_secs(60));
    world.tick(&engine).await.unwrap();
    assert_eq!(recorder.events().len(), 11);
    let last = recorder.events().pop().unwrap();
    assert_eq!(
        (last.event_type, last.subject.as_str()),
        (EventType::Deleted, "item-003")
    );
}
