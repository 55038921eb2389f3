//! `PollerBuilder::overlap_delivery`: a page's events are delivered while the next page is
//! fetched and committed. On `MemoryStore` with a manual clock; nothing sleeps (a deadlock
//! would end in tokio's paused-clock timeout, not in a hang).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use watukuy_core::hooks::{FetchInfo, HookContext, Hooks};
use watukuy_core::{
    DeliveryOptions, Engine, Event, HandlerContext, HandlerError,
    delivery::PoisonAction,
    store::{Circuit, PKey, Store},
};
use watukuy_store_memory::MemoryStore;
use watukuy_testkit::world::{POLLER, StrategyKind, World};

/// Records fetches and deliveries in one log, and opens `second_page` when page 2 is fetched.
#[derive(Default)]
struct Log {
    lines: Mutex<Vec<String>>,
    second_page: Notify,
}

impl Log {
    fn push(&self, line: String) {
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(line);
    }

    fn lines(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn position(&self, line: &str) -> usize {
        self.lines()
            .iter()
            .position(|l| l == line)
            .unwrap_or_else(|| panic!("{line:?} not in {:?}", self.lines()))
    }
}

#[async_trait]
impl Hooks for Log {
    async fn on_fetch(&self, _ctx: &HookContext, info: &FetchInfo) {
        self.push(format!("fetch {}", info.page));
        if info.page == 2 {
            self.second_page.notify_one();
        }
    }

    async fn on_delivered(&self, _ctx: &HookContext, event: &Event, _duration_ms: i64) {
        self.push(format!("delivered {}", event.subject));
    }
}

fn engine(
    world: &World,
    store: Arc<dyn Store>,
    log: &Arc<Log>,
    poison: PoisonAction,
    overlap: bool,
) -> Engine {
    let poller = world
        .poller(StrategyKind::Timestamp)
        .delivery(
            DeliveryOptions::default()
                .attempts(1)
                .poison(poison)
                .handler_timeout(None),
        )
        .overlap_delivery(overlap)
        .build()
        .unwrap();
    world
        .engine_builder(store, "node-a", poller, 1)
        .hooks(Arc::clone(log) as Arc<dyn Hooks>)
        .build()
        .unwrap()
}

/// Registers the handler: item-001's delivery waits until page 2 has been fetched when `wait`,
/// and is poison (a permanent failure) when `poison`; every other delivery succeeds.
fn handle_item_001(engine: &Engine, log: &Arc<Log>, wait: bool, poison: bool) {
    let log = Arc::clone(log);
    engine
        .on(POLLER, move |event: Event, _ctx: HandlerContext| {
            let log = Arc::clone(&log);
            async move {
                if event.subject == "item-001" {
                    if wait {
                        log.second_page.notified().await;
                    }
                    if poison {
                        return Err(HandlerError::permanent("item-001 is poison"));
                    }
                }
                Ok(())
            }
        })
        .unwrap();
}

/// The first event's handler waits until page 2 has been fetched: only an overlapped drain
/// lets the cycle go on (the reference lifecycle would wait for the handler forever). Every
/// event is still delivered once, in order, and the last page is drained before the tick ends.
#[tokio::test(start_paused = true)]
async fn a_page_drains_while_the_next_is_fetched() {
    let world = World::new(6, 2).unwrap();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let log = Arc::new(Log::default());
    let engine = engine(&world, Arc::clone(&store), &log, PoisonAction::Park, true);
    handle_item_001(&engine, &log, true, false);

    let tick = tokio::time::timeout(Duration::from_secs(3_600), world.tick(&engine))
        .await
        .expect("the first page's drain must not hold back the second page's fetch")
        .unwrap();
    assert_eq!(tick.polled[0].error, None, "{tick:?}");
    assert_eq!(tick.delivered, 6, "{tick:?}");
    assert!(
        log.position("fetch 2") < log.position("delivered item-001"),
        "{:?}",
        log.lines()
    );
    let delivered: Vec<String> = log
        .lines()
        .into_iter()
        .filter_map(|l| l.strip_prefix("delivered ").map(str::to_owned))
        .collect();
    let subjects: Vec<String> = (1..=6).map(|i| format!("item-00{i}")).collect();
    let mut sorted = delivered.clone();
    sorted.sort();
    assert_eq!(sorted, subjects, "each event once: {delivered:?}");
    let key = PKey::new(POLLER, "");
    assert_eq!(store.counts(&key).await.map(|c| c.pending).unwrap(), 0);
}

/// A poison `halt` in page 1's drain stops the cycle and keeps the circuit open. Overlapped,
/// the page committed meanwhile (page 2) is the last: its events wait in the outbox and page 3
/// is never fetched; in the reference lifecycle page 2 is never fetched.
#[tokio::test(start_paused = true)]
async fn a_halt_stops_the_cycle_and_keeps_the_circuit_open() {
    for overlap in [true, false] {
        let world = World::new(6, 2).unwrap();
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let log = Arc::new(Log::default());
        let engine = engine(
            &world,
            Arc::clone(&store),
            &log,
            PoisonAction::Halt,
            overlap,
        );
        handle_item_001(&engine, &log, overlap, true);

        let tick = tokio::time::timeout(Duration::from_secs(3_600), world.tick(&engine))
            .await
            .expect("the tick ends")
            .unwrap();
        let fetched: Vec<String> = log
            .lines()
            .into_iter()
            .filter(|l| l.starts_with("fetch"))
            .collect();
        let expected = if overlap {
            vec!["fetch 1", "fetch 2"]
        } else {
            vec!["fetch 1"]
        };
        assert_eq!(fetched, expected, "overlap {overlap}");
        let key = PKey::new(POLLER, "");
        let pending: Vec<String> = store
            .load_pending(&key, 100)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.event.subject.to_string())
            .collect();
        let expected = if overlap {
            vec!["item-002", "item-003", "item-004"]
        } else {
            vec!["item-002"]
        };
        assert_eq!(pending, expected, "overlap {overlap}");
        let schedule = store.load_state(&key).await.unwrap().unwrap().schedule;
        assert_eq!(
            (schedule.circuit, schedule.last_error.map(|e| e.name)),
            (Circuit::Open, Some("PoisonHalt".to_owned())),
            "overlap {overlap}: {tick:?}"
        );
    }
}
