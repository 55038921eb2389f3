//! The engine end to end on `MemoryStore` and the `FakeApi`, on a manual clock.

use std::sync::Arc;
use std::time::Duration;

use watukuy_conformance::world::{POLLER, Recorder, StrategyKind, World};
use watukuy_core::{EventType, Store};
use watukuy_store_memory::MemoryStore;

#[tokio::test]
async fn a_tick_polls_commits_and_delivers_for_every_strategy() {
    for kind in StrategyKind::ALL {
        let world = World::new(7, 3).unwrap();
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let engine = world
            .engine(store, "node-a", world.poller(kind).build().unwrap(), 1)
            .unwrap();
        let recorder = Recorder::default();
        engine.on(POLLER, recorder.handler()).unwrap();
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
