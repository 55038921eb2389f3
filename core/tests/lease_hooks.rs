//! `on_lease_acquired` fires when an engine takes a key's lease anew (the key's first run since
//! the engine started, after another instance held the key, after a lost lease), not on every
//! run of a key it keeps re-taking. On `MemoryStore` and a manual clock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use watukuy_core::hooks::{HookContext, Hooks};
use watukuy_core::{
    Engine, FetchContext,
    clock::Clock,
    store::{Lease, PKey, Store},
};
use watukuy_store_memory::MemoryStore;
use watukuy_testkit::world::{POLLER, StrategyKind, World};

/// What the lease hooks saw: `acquired <owner> <epoch>` and `lost <epoch>`.
#[derive(Default)]
struct LeaseHooks(Mutex<Vec<String>>);

impl LeaseHooks {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn push(&self, line: String) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(line);
    }
}

#[async_trait]
impl Hooks for LeaseHooks {
    async fn on_lease_acquired(&self, _ctx: &HookContext, lease: &Lease) {
        self.push(format!("acquired {} {}", lease.owner, lease.epoch));
    }
    async fn on_lease_lost(&self, _ctx: &HookContext, epoch: i64) {
        self.push(format!("lost {epoch}"));
    }
}

fn engine(world: &World, store: &Arc<MemoryStore>, name: &str, hooks: &Arc<LeaseHooks>) -> Engine {
    let poller = world.poller(StrategyKind::Timestamp).build().unwrap();
    world
        .engine_builder(Arc::clone(store) as Arc<dyn Store>, name, poller, 1)
        .hooks(hooks.clone())
        .build()
        .unwrap()
}

/// One tick of `engine`, then a minute later: how many lane cycles it ran.
async fn ran(world: &World, engine: &Engine) -> usize {
    let result = world.tick(engine).await.unwrap();
    world.advance(Duration::from_secs(60));
    result.polled.len()
}

#[tokio::test]
async fn an_engine_that_keeps_its_key_reports_the_lease_once() {
    let world = World::new(3, 10).unwrap();
    let store = Arc::new(MemoryStore::new());
    let hooks = Arc::new(LeaseHooks::default());
    let a = engine(&world, &store, "node-a", &hooks);

    for _ in 0..4 {
        assert_eq!(ran(&world, &a).await, 1, "every tick runs the key");
    }
    // Four runs, four acquisitions (epochs 1 to 4, each released at the end of its run), one
    // new lease.
    assert_eq!(hooks.take(), ["acquired node-a 1"]);
    let key = PKey::new(POLLER, "");
    let probe = store
        .acquire_lease(&key, "probe", 1_000, world.now())
        .await
        .unwrap()
        .expect("the engine released the key");
    assert_eq!(probe.epoch, 5, "the engine re-took the lease on every run");
}

#[tokio::test]
async fn a_key_that_moves_between_instances_reports_each_new_holder() {
    let world = World::new(3, 10).unwrap();
    let store = Arc::new(MemoryStore::new());
    let (hooks_a, hooks_b) = (
        Arc::new(LeaseHooks::default()),
        Arc::new(LeaseHooks::default()),
    );
    let a = engine(&world, &store, "node-a", &hooks_a);
    let b = engine(&world, &store, "node-b", &hooks_b);

    ran(&world, &a).await; // epoch 1: new
    ran(&world, &a).await; // epoch 2: a keeps the key
    ran(&world, &b).await; // epoch 3: b takes it
    ran(&world, &b).await; // epoch 4: b keeps it
    ran(&world, &a).await; // epoch 5: back to a, anew
    ran(&world, &a).await; // epoch 6
    assert_eq!(hooks_a.take(), ["acquired node-a 1", "acquired node-a 5"]);
    assert_eq!(hooks_b.take(), ["acquired node-b 3"]);
}

#[tokio::test]
async fn a_lost_lease_is_reported_lost_and_the_next_one_acquired() {
    let world = World::new(3, 10).unwrap();
    let store = Arc::new(MemoryStore::new());
    let hooks = Arc::new(LeaseHooks::default());
    // The fetch lets an intruder take the lease once (as if the run had stalled past its ttl),
    // so the page's commit fails the fence.
    let steal = Arc::new(AtomicBool::new(false));
    let (api, intruder_store, clock, armed) = (
        world.api.clone(),
        Arc::clone(&store),
        world.clock.clone(),
        Arc::clone(&steal),
    );
    let poller = world
        .poller(StrategyKind::Timestamp)
        .fetch(move |ctx: FetchContext| {
            let (api, store, armed) =
                (api.clone(), Arc::clone(&intruder_store), Arc::clone(&armed));
            let later = clock.now_ms() + 120_000;
            async move {
                if armed.swap(false, Ordering::SeqCst) {
                    let key = PKey::new(POLLER, "");
                    let stolen = store.acquire_lease(&key, "intruder", 1_000, later).await?;
                    assert!(stolen.is_some(), "the intruder takes the expired lease");
                }
                api.fetch_since(&ctx).await
            }
        })
        .build()
        .unwrap();
    let a = world
        .engine_builder(Arc::clone(&store) as Arc<dyn Store>, "node-a", poller, 1)
        .hooks(hooks.clone())
        .build()
        .unwrap();

    ran(&world, &a).await; // epoch 1
    ran(&world, &a).await; // epoch 2
    assert_eq!(hooks.take(), ["acquired node-a 1"]);

    steal.store(true, Ordering::SeqCst);
    ran(&world, &a).await; // epoch 3, stolen (epoch 4) before the commit
    assert_eq!(hooks.take(), ["lost 3"]);

    // The intruder's short lease has expired by now: the engine takes the key anew.
    world.advance(Duration::from_secs(300));
    ran(&world, &a).await; // epoch 5
    ran(&world, &a).await; // epoch 6
    assert_eq!(hooks.take(), ["acquired node-a 5"]);
}
