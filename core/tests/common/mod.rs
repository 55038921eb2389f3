//! The set-up the dispatcher tests share: a memory store holding one leased key whose outbox
//! has the given events pending, and a manual clock at `T0`.

use std::sync::Arc;

use watukuy_conformance::cases::fixtures::{NODE_A, acquire, key};
use watukuy_core::{
    DeliveryOptions, Event,
    clock::ManualClock,
    delivery::Dispatcher,
    rng::SeededRng,
    store::{CommitBatch, Lease, OutboxRow, PKey, Store},
};
use watukuy_store_memory::MemoryStore;
use watukuy_testkit::T0;

/// A leased key with pending events, on a manual clock.
pub(crate) struct Setup {
    /// The store holding the key.
    pub(crate) store: Arc<MemoryStore>,
    /// The clock of every dispatcher built here, at `T0` to begin with.
    pub(crate) clock: ManualClock,
    /// The key.
    pub(crate) key: PKey,
    /// The key's lease, held by `NODE_A`.
    pub(crate) lease: Lease,
}

impl Setup {
    /// `events` committed as pending rows of a fresh key, leased by `NODE_A` at `T0`.
    pub(crate) async fn with_events(events: Vec<Event>) -> Setup {
        let store = Arc::new(MemoryStore::new());
        let key = key();
        let lease = acquire(&*store, &key, NODE_A, T0).await.unwrap();
        let rows = events.into_iter().map(|e| OutboxRow::pending(e, T0));
        let batch = CommitBatch::default().events(rows.collect());
        store.commit_poll(&key, &lease, &batch).await.unwrap();
        Setup {
            store,
            clock: ManualClock::new(T0),
            key,
            lease,
        }
    }

    /// A dispatcher of poller `orders` over the store, on this set-up's clock.
    pub(crate) fn dispatcher(&self, options: DeliveryOptions) -> Dispatcher {
        self.dispatcher_over(self.store.clone(), options)
    }

    /// A dispatcher over `store` (a wrapper of this set-up's store), on this set-up's clock.
    pub(crate) fn dispatcher_over(
        &self,
        store: Arc<dyn Store>,
        options: DeliveryOptions,
    ) -> Dispatcher {
        Dispatcher::new(
            "orders",
            store,
            Arc::new(self.clock.clone()),
            Arc::new(SeededRng::new(1)),
            options,
            100,
        )
        .unwrap()
    }
}
