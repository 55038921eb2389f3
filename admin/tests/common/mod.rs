//! An engine with a consumer that fails some subjects until healed: the poison events the admin
//! page shows.

#![allow(dead_code, unreachable_pub)]

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use watukuy_conformance::world::{POLLER, StrategyKind, World};
use watukuy_core::{
    Engine, Event, HandlerContext, HandlerError, HandlerResult, PKey, SeededRng, Store,
};

/// Records what it delivered; fails permanently (parked at once) for the subjects in `failing`.
#[derive(Clone, Default)]
pub struct Consumer {
    delivered: Arc<Mutex<Vec<Event>>>,
    failing: Arc<Mutex<Vec<String>>>,
}

impl Consumer {
    pub fn failing(subjects: &[&str]) -> Self {
        let consumer = Self::default();
        consumer
            .failing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(subjects.iter().map(|s| (*s).to_owned()));
        consumer
    }

    /// Flips the flag: every subject is handled from now on.
    pub fn heal(&self) {
        self.failing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    pub fn delivered_ids(&self) -> Vec<String> {
        self.delivered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|e| e.id.clone())
            .collect()
    }

    fn attach(&self, engine: &Engine) {
        let (delivered, failing) = (Arc::clone(&self.delivered), Arc::clone(&self.failing));
        engine
            .on(POLLER, move |event: Event, _ctx: HandlerContext| {
                let fail = failing
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .contains(&event.subject);
                let result: HandlerResult = if fail {
                    Err(HandlerError::permanent(format!(
                        "downstream rejected {}",
                        event.subject
                    )))
                } else {
                    delivered
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(event);
                    Ok(())
                };
                futures::future::ready(result)
            })
            .expect("attach the consumer");
    }
}

/// A running example: `items` items, an engine polling them into `store` (timestamp strategy,
/// one-day log), `consumer` attached.
pub fn example(items: usize, store: &Arc<dyn Store>, consumer: &Consumer) -> (World, Engine) {
    let world = World::new(items, 10).expect("world");
    let poller = world
        .poller(StrategyKind::Timestamp)
        .log(Duration::from_secs(86_400))
        .build()
        .expect("poller");
    let engine = Engine::builder(Arc::clone(store))
        .poller(poller)
        .clock(Arc::new(world.clock.clone()))
        .rng(Arc::new(SeededRng::new(11)))
        .instance_id("node-a")
        .build()
        .expect("engine");
    consumer.attach(&engine);
    (world, engine)
}

/// The key of the example's poller.
pub fn key() -> PKey {
    PKey::new(POLLER, "")
}
