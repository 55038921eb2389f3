//! An engine with a consumer that fails some subjects until healed: the poison events the admin
//! page shows.

#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;

use watukuy_core::{Engine, store::Store};
use watukuy_store_memory::MemoryStore;
use watukuy_testkit::world::Consumer;
use watukuy_testkit::world::World;

/// The admin tests' consumer: it fails the given subjects with "downstream rejected".
pub fn failing(subjects: &[&str]) -> Consumer {
    Consumer::failing("downstream rejected", subjects)
}

/// A running example: `items` items, an engine polling them into `store` (timestamp strategy,
/// one-day log), `consumer` attached.
pub fn example(items: usize, store: &Arc<dyn Store>, consumer: &Consumer) -> (World, Engine) {
    let world = World::new(items, 10).expect("world");
    let engine = world
        .consumer_engine(Arc::clone(store), consumer, 11)
        .expect("engine");
    (world, engine)
}

/// An example of `items` items on a new memory store, ticked once with a consumer failing
/// `failing_subjects`: their events are parked as poison.
pub async fn parked_example(
    items: usize,
    failing_subjects: &[&str],
) -> (Arc<dyn Store>, Consumer, World, Engine) {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let consumer = failing(failing_subjects);
    let (world, engine) = example(items, &store, &consumer);
    world.tick(&engine).await.expect("a tick");
    (store, consumer, world, engine)
}
