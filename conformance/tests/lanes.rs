//! The lanes and the scheduler end to end on `MemoryStore` and the `FakeApi`: reconcile finds the deletes an incremental cursor cannot see, backfill re-reads
//! history (and backs off while it fails), replay re-delivers the log with the original ids, log
//! retention prunes, and the live schedule (AIMD, backoff and the circuit through an outage,
//! Retry-After) is driven through the engine. Everything runs on a manual clock (tokio's paused
//! clock for the daemon) with fixed seeds: no real sleeps, no wall-clock assertions.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use watukuy_conformance::cases::fixtures::T0;
use watukuy_conformance::world::{POLLER, Recorder, StrategyKind, World};
use watukuy_conformance::{FakeApi, FakeApiOptions, Fault, fake_items};
use watukuy_core::cursor::Cursor;
use watukuy_core::engine::BackfillOptions;
use watukuy_core::hooks::{HookContext, Hooks};
use watukuy_core::poller::Fetch;
use watukuy_core::schedule::{self, CircuitOptions, ScheduleOptions, ScheduleReason};
use watukuy_core::{
    BoxError, Circuit, Clock, Engine, Error, ErrorCode, Event, EventType, FetchContext, Lane,
    LaneCursor, Lanes, LogQuery, ManualClock, PKey, Page, Poller, ScheduleState, SeededRng,
    StopOptions, Store, TickResult, TokioClock,
};
use watukuy_store_memory::MemoryStore;

// ----- helpers -----

fn key() -> PKey {
    PKey::new(POLLER, "")
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The option a `Config` error names.
fn option_of(error: Error) -> String {
    match error {
        Error::Config { option, .. } => option,
        other => panic!("expected a Config error, got {other:?}"),
    }
}

/// An engine over `store` on the world's clock, seeded, instance `node-a`.
fn engine_with(
    world: &World,
    store: &Arc<MemoryStore>,
    poller: Poller,
    hooks: Option<Arc<dyn Hooks>>,
) -> Engine {
    let store: Arc<dyn Store> = Arc::clone(store) as Arc<dyn Store>;
    let mut builder = Engine::builder(store)
        .poller(poller)
        .clock(Arc::new(world.clock.clone()))
        .rng(Arc::new(SeededRng::new(7)))
        .instance_id("node-a");
    if let Some(hooks) = hooks {
        builder = builder.hooks(hooks);
    }
    builder.build().unwrap()
}

/// An engine with a recording handler attached.
fn engine(world: &World, store: &Arc<MemoryStore>, poller: Poller) -> (Engine, Recorder) {
    let engine = engine_with(world, store, poller, None);
    let recorder = Recorder::default();
    engine.on(POLLER, recorder.handler()).unwrap();
    (engine, recorder)
}

/// The one `(poller, partition)` the engine reports.
async fn only(engine: &Engine) -> watukuy_core::ops::KeyInspect {
    let report = engine.inspect().await.unwrap();
    assert_eq!(report.pollers.len(), 1, "{report:?}");
    report.pollers.into_iter().next().unwrap().key
}

/// The lanes as persisted.
async fn lanes(store: &MemoryStore) -> Lanes {
    store.load_state(&key()).await.unwrap().unwrap().lanes
}

async fn backfill_lane(store: &MemoryStore) -> LaneCursor {
    lanes(store).await.backfill.expect("a backfill lane")
}

/// Requests the fake API answered on a route (`/page`, `/token`, `/since`).
fn calls_to(world: &World, route: &str) -> usize {
    world.api.log().iter().filter(|e| e.route == route).count()
}

/// The lane of every cycle a tick ran, in order.
fn lanes_of(result: &TickResult) -> Vec<Lane> {
    result.polled.iter().map(|p| p.lane).collect()
}

fn assert_no_errors(result: &TickResult) {
    for polled in &result.polled {
        assert!(polled.error.is_none(), "unexpected failure: {result:?}");
    }
}

fn data_of(event: &Event) -> Value {
    event.data.as_ref().map_or(Value::Null, |d| d.to_value())
}

/// `(type, subject, lane)` of each event.
fn summary(events: &[Event]) -> Vec<(EventType, String, Lane)> {
    events
        .iter()
        .map(|e| (e.event_type, e.subject.clone(), e.lane))
        .collect()
}

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// The `updatedAt` the fake API stamped on an item.
fn updated_at(world: &World, id: &str) -> String {
    world.api.get(id).unwrap()["updatedAt"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// What a fetch was asked for: `(lane, cursor)` per call.
type Asked = Arc<Mutex<Vec<(Lane, Cursor)>>>;

/// A reconcile fetch over the fake's `/page` listing that records what it was asked for.
fn recording_page_fetch(world: &World, asked: &Asked) -> impl Fetch {
    let (api, asked) = (world.api.clone(), Arc::clone(asked));
    move |ctx: FetchContext| {
        let api = api.clone();
        lock(&asked).push((ctx.lane, ctx.cursor.clone()));
        async move { api.fetch_page(&ctx).await }
    }
}

/// A `token` poller (it cannot see deletes) with a reconcile every 60 s over `/page`.
/// The lane's timing is under test here, so a missing item is deleted by the listing that
/// misses it (`Immediate`); the default second-listing confirmation is proven by the conformance
/// cases `lanes::reconcile_finds_deletes` and `lanes::a_shifting_listing_never_deletes_a_live_item`.
fn token_with_reconcile(world: &World, asked: &Asked) -> watukuy_core::PollerBuilder<Value> {
    world
        .poller(StrategyKind::Token)
        .delete_confirmation(watukuy_core::DeleteConfirmation::Immediate)
        .reconcile(Duration::from_secs(60), recording_page_fetch(world, asked))
}

/// One schedule change as the hook saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Change {
    interval_ms: i64,
    next_due_at: i64,
    reason: ScheduleReason,
}

/// Records schedule changes and circuit transitions.
#[derive(Default)]
struct ScheduleLog {
    changes: Mutex<Vec<Change>>,
    opened: Mutex<Vec<(u32, i64)>>,
    closed: Mutex<usize>,
}

impl ScheduleLog {
    fn changes(&self) -> Vec<Change> {
        lock(&self.changes).clone()
    }

    fn reasons(&self) -> Vec<ScheduleReason> {
        self.changes().into_iter().map(|c| c.reason).collect()
    }

    fn clear(&self) {
        lock(&self.changes).clear();
    }
}

#[async_trait]
impl Hooks for ScheduleLog {
    async fn on_schedule_change(
        &self,
        ctx: &HookContext,
        interval_ms: i64,
        next_due_at: i64,
        reason: ScheduleReason,
    ) {
        assert_eq!(
            ctx.lane,
            Lane::Live,
            "only the live lane drives the schedule"
        );
        lock(&self.changes).push(Change {
            interval_ms,
            next_due_at,
            reason,
        });
    }

    async fn on_circuit_open(&self, _ctx: &HookContext, failures: u32, probe_at: i64) {
        lock(&self.opened).push((failures, probe_at));
    }

    async fn on_circuit_close(&self, _ctx: &HookContext) {
        *lock(&self.closed) += 1;
    }
}

/// Schedule `min 5 s, max 40 s, jitter 0` (the AIMD example both implementations pin), default
/// backoff.
fn pinned_schedule() -> ScheduleOptions {
    ScheduleOptions {
        min: Duration::from_secs(5),
        max: Duration::from_secs(40),
        jitter: 0.0,
        ..ScheduleOptions::default()
    }
}

// ----- reconcile -----

#[tokio::test]
async fn reconcile_reports_the_delete_a_token_cursor_cannot_see_once_every_elapsed() {
    let world = World::new(5, 2).unwrap();
    let store = Arc::new(MemoryStore::new());
    let asked = Asked::default();
    let poller = token_with_reconcile(&world, &asked).build().unwrap();
    let (engine, recorder) = engine(&world, &store, poller);
    let t0 = world.now();

    // The first run: the live lane creates everything, then the reconcile runs at once: a
    // complete listing through its own fetch, page cursors from 1, nothing to delete.
    let result = world.tick(&engine).await.unwrap();
    assert_no_errors(&result);
    assert_eq!(lanes_of(&result), [Lane::Live, Lane::Reconcile]);
    let created = recorder.events();
    assert_eq!(created.len(), 5);
    assert!(
        created
            .iter()
            .all(|e| e.event_type == EventType::Created && e.lane == Lane::Live),
        "{:?}",
        summary(&created)
    );
    assert_eq!(
        *lock(&asked),
        [1, 2, 3].map(|page| (Lane::Reconcile, Cursor::Page { page }))
    );
    assert_eq!(calls_to(&world, "/page"), 3);
    let reconcile = lanes(&store).await.reconcile.unwrap();
    assert_eq!(
        (reconcile.last_run_at, reconcile.done, reconcile.cursor),
        (Some(t0), Some(true), None)
    );
    assert_eq!(only(&engine).await.cursors.reconcile, None);

    // item-003 disappears. The live lane keeps listing (the token listing restarts every
    // cycle) but cannot tell; the reconcile is not due before 60 s.
    assert!(world.api.remove("item-003"));
    let token_calls = calls_to(&world, "/token");
    for _ in 0..11 {
        world.advance(Duration::from_secs(5));
        let result = world.tick(&engine).await.unwrap();
        assert_no_errors(&result);
        assert!(!lanes_of(&result).contains(&Lane::Reconcile), "{result:?}");
    }
    world.advance(ms(4_999));
    assert_eq!(world.now(), t0 + 59_999);
    let result = world.tick(&engine).await.unwrap();
    assert!(!lanes_of(&result).contains(&Lane::Reconcile), "{result:?}");
    assert!(
        calls_to(&world, "/token") > token_calls,
        "the live lane kept polling"
    );
    assert_eq!(recorder.events().len(), 5, "no delete from the live lane");
    assert_eq!(
        calls_to(&world, "/page"),
        3,
        "the reconcile does not run again before `every`"
    );

    // 60 s after the last complete listing: exactly one delete, from the reconcile lane.
    world.advance(ms(1));
    let result = world.tick(&engine).await.unwrap();
    assert_no_errors(&result);
    assert!(lanes_of(&result).contains(&Lane::Reconcile), "{result:?}");
    let events = recorder.events();
    assert_eq!(events.len(), 6, "{:?}", summary(&events));
    let deleted = &events[5];
    assert_eq!(
        (deleted.event_type, deleted.subject.as_str(), deleted.lane),
        (EventType::Deleted, "item-003", Lane::Reconcile)
    );
    assert_eq!(deleted.sequence, 6);
    assert_eq!(deleted.data, None, "retain `hash` keeps no payload");
    assert_eq!(calls_to(&world, "/page"), 3 + 2, "4 items: 2 pages");
    assert_eq!(only(&engine).await.items, 4);
    let reconcile = lanes(&store).await.reconcile.unwrap();
    assert_eq!(reconcile.last_run_at, Some(t0 + 60_000));

    // The next listing again waits a full `every`, and finds nothing more to delete.
    world.advance(ms(59_999));
    world.tick(&engine).await.unwrap();
    assert_eq!(calls_to(&world, "/page"), 5);
    world.advance(ms(1));
    let result = world.tick(&engine).await.unwrap();
    assert_no_errors(&result);
    assert_eq!(calls_to(&world, "/page"), 7);
    assert_eq!(recorder.events().len(), 6, "a deleted item is deleted once");
}

#[tokio::test]
async fn a_reconcile_truncated_by_the_full_scan_page_cap_emits_no_deletes() {
    // 7 items, 2 a page: 4 pages, over a cap of 2.
    let world = World::new(7, 2).unwrap();
    let store = Arc::new(MemoryStore::new());
    let asked = Asked::default();
    let poller = token_with_reconcile(&world, &asked)
        .full_scan_page_cap(2)
        .build()
        .unwrap();
    let (engine, recorder) = engine(&world, &store, poller);
    let t0 = world.now();

    let result = world.tick(&engine).await.unwrap();
    assert_no_errors(&result);
    assert_eq!(lanes_of(&result), [Lane::Live, Lane::Reconcile]);
    assert_eq!(recorder.events().len(), 7);
    assert_eq!(calls_to(&world, "/page"), 2, "the cap stopped the listing");
    let reconcile = lanes(&store).await.reconcile.unwrap();
    assert_eq!(
        (reconcile.done, reconcile.last_run_at),
        (Some(false), Some(t0)),
        "not complete, but it counts as a run: the next listing waits `every`"
    );
    // The live lane runs again 5 s later; the capped reconcile does not (it would only be cut
    // short again).
    world.advance(Duration::from_secs(5));
    let result = world.tick(&engine).await.unwrap();
    assert_eq!(lanes_of(&result), [Lane::Live]);
    assert_eq!(calls_to(&world, "/page"), 2);

    // item-007 disappears; the listing (6 items, 3 pages) is still over the cap: the reconcile
    // runs, is cut short, and must not report anything it did not reach as deleted.
    assert!(world.api.remove("item-007"));
    world.advance(Duration::from_secs(61));
    let result = world.tick(&engine).await.unwrap();
    assert_no_errors(&result);
    let reconcile = result
        .polled
        .iter()
        .find(|p| p.lane == Lane::Reconcile)
        .expect("the reconcile ran");
    assert_eq!((reconcile.items, reconcile.events), (4, 0), "{result:?}");
    assert_eq!(
        recorder.events().len(),
        7,
        "no delete from a truncated scan"
    );
    assert_eq!(only(&engine).await.items, 7);

    // Once the listing fits the cap (4 items, 2 pages) it completes and the deletes come.
    assert!(world.api.remove("item-005"));
    assert!(world.api.remove("item-006"));
    world.advance(Duration::from_secs(61));
    let result = world.tick(&engine).await.unwrap();
    assert_no_errors(&result);
    let events = recorder.events();
    assert_eq!(
        summary(&events[7..]),
        ["item-005", "item-006", "item-007"].map(|id| (
            EventType::Deleted,
            id.to_owned(),
            Lane::Reconcile
        ))
    );
    let reconcile = lanes(&store).await.reconcile.unwrap();
    assert_eq!(
        (reconcile.done, reconcile.last_run_at),
        (Some(true), Some(world.now()))
    );
}

/// A world whose fake API runs on a `TokioClock` (tokio's paused time), and that clock.
fn tokio_world(items: usize, page_size: usize) -> (World, TokioClock) {
    let offset = i64::try_from(items).unwrap() * 1_000;
    let clock = TokioClock::starting_at(T0 + offset);
    let api = FakeApi::new(FakeApiOptions::new(Arc::new(clock.clone())).page_size(page_size));
    api.seed(fake_items(items)).unwrap();
    let world = World {
        // Unused: the engine below runs on `clock`.
        clock: ManualClock::new(T0),
        api,
    };
    (world, clock)
}

#[tokio::test(start_paused = true)]
async fn the_daemon_does_not_re_list_a_capped_reconcile_in_a_hot_loop() {
    // 7 items, 2 a page: 4 pages, over a cap of 2, so no listing ever completes.
    let (world, clock) = tokio_world(7, 2);
    // When each reconcile fetch happened. A guard fails the fetch after 40 calls at one virtual
    // instant (a failure backs the lane off), so a hot loop fails this test instead of hanging
    // it: in a hot loop virtual time never advances.
    let fetched: Arc<Mutex<Vec<i64>>> = Arc::default();
    let fetch = {
        let (api, clock, fetched) = (world.api.clone(), clock.clone(), Arc::clone(&fetched));
        move |ctx: FetchContext| {
            let api = api.clone();
            let now = clock.now_ms();
            let same_instant = {
                let mut fetched = lock(&fetched);
                fetched.push(now);
                fetched.iter().filter(|at| **at == now).count()
            };
            async move {
                if same_instant > 40 {
                    return Err::<Page, BoxError>("hot loop guard".into());
                }
                api.fetch_page(&ctx).await
            }
        }
    };
    let poller = world
        .poller(StrategyKind::Token)
        .reconcile(Duration::from_secs(60), fetch)
        .full_scan_page_cap(2)
        .build()
        .unwrap();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let engine = Engine::builder(store)
        .poller(poller)
        .clock(Arc::new(clock.clone()))
        .rng(Arc::new(SeededRng::new(7)))
        .instance_id("daemon")
        .build()
        .unwrap();
    let recorder = Recorder::default();
    engine.on(POLLER, recorder.handler()).unwrap();
    let t0 = clock.now_ms();
    engine.start().await.unwrap();
    // Five virtual minutes, a second at a time.
    for _ in 0..300 {
        clock.sleep(Duration::from_secs(1)).await;
    }
    engine.stop(StopOptions::default()).await.unwrap();

    // One capped listing (two pages, at one instant) every `every`, not one after the other.
    let fetched = lock(&fetched).clone();
    let mut listings: BTreeMap<i64, usize> = BTreeMap::new();
    for at in &fetched {
        *listings.entry(*at).or_default() += 1;
    }
    assert!(
        listings.values().all(|pages| *pages == 2),
        "{} reconcile fetches in {} bursts, first ones: {:?}",
        fetched.len(),
        listings.len(),
        listings.iter().take(5).collect::<Vec<_>>()
    );
    let starts: Vec<i64> = listings.keys().map(|at| at - t0).collect();
    assert_eq!(starts.first(), Some(&0), "{starts:?}");
    assert!(
        starts.windows(2).all(|w| w[1] - w[0] == 60_000),
        "a listing every 60 s: {starts:?}"
    );
    assert!((5..=6).contains(&starts.len()), "{starts:?}");
    assert_eq!(recorder.events().len(), 7, "created only: no deletes");
}

#[tokio::test]
async fn reconcile_on_a_snapshot_diff_poller_is_a_config_error() {
    let world = World::new(1, 10).unwrap();
    let asked = Asked::default();
    let error = world
        .poller(StrategyKind::SnapshotDiff)
        .reconcile(
            Duration::from_secs(60),
            recording_page_fetch(&world, &asked),
        )
        .build()
        .unwrap_err();
    assert_eq!(option_of(error), "reconcile");
}

// ----- backfill -----

#[tokio::test]
async fn a_forced_backfill_re_emits_every_known_item_then_is_done() {
    let world = World::new(5, 10).unwrap();
    let store = Arc::new(MemoryStore::new());
    let poller = world.poller(StrategyKind::Timestamp).build().unwrap();
    let (engine, recorder) = engine(&world, &store, poller);
    world.tick(&engine).await.unwrap();
    let created = recorder.events();
    assert_eq!(created.len(), 5);
    let live = only(&engine).await.cursors.live;
    assert!(live.is_some());

    engine
        .backfill(
            POLLER,
            None,
            BackfillOptions {
                from: None,
                to: None,
                force: true,
            },
        )
        .await
        .unwrap();
    let lane = backfill_lane(&store).await;
    assert_eq!(
        (lane.done, lane.force),
        (Some(false), Some(true)),
        "{lane:?}"
    );
    assert_eq!(
        lane.target
            .as_deref()
            .map(|t| serde_json::from_str::<Value>(t).unwrap()),
        live,
        "`to: None` targets the live cursor at the time of the call"
    );
    assert_eq!(
        only(&engine).await.cursors.backfill,
        Some(json!({ "value": null, "tieBreak": null })),
        "`from: None` is the beginning"
    );

    // The next tick (the live lane is not due) runs the backfill: every known item again, as
    // `updated`, on the backfill lane, with fresh sequences.
    let result = world.tick(&engine).await.unwrap();
    assert_no_errors(&result);
    assert_eq!(lanes_of(&result), [Lane::Backfill]);
    let events = recorder.events();
    assert_eq!(events.len(), 10);
    let backfilled = &events[5..];
    assert_eq!(
        summary(backfilled),
        created
            .iter()
            .map(|e| (EventType::Updated, e.subject.clone(), Lane::Backfill))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        backfilled.iter().map(|e| e.sequence).collect::<Vec<_>>(),
        [6, 7, 8, 9, 10]
    );
    for (again, first) in backfilled.iter().zip(&created) {
        assert_eq!(data_of(again), data_of(first));
    }

    // Done: inspect shows the backfill cursor at the target, the lane says done, and later
    // ticks (the live lane's included) emit nothing more.
    let lane = backfill_lane(&store).await;
    assert_eq!(lane.done, Some(true), "{lane:?}");
    let inspected = only(&engine).await;
    assert_eq!(inspected.cursors.backfill, inspected.cursors.live);
    let result = world.tick(&engine).await.unwrap();
    assert!(result.polled.is_empty(), "{result:?}");
    world.advance(Duration::from_secs(31));
    let result = world.tick(&engine).await.unwrap();
    assert_no_errors(&result);
    assert_eq!(lanes_of(&result), [Lane::Live]);
    assert_eq!(recorder.events().len(), 10);
}

#[tokio::test]
async fn a_backfill_without_force_over_unchanged_items_emits_nothing() {
    let world = World::new(5, 10).unwrap();
    let store = Arc::new(MemoryStore::new());
    let poller = world.poller(StrategyKind::Timestamp).build().unwrap();
    let (engine, recorder) = engine(&world, &store, poller);
    world.tick(&engine).await.unwrap();
    assert_eq!(recorder.events().len(), 5);

    engine
        .backfill(POLLER, None, BackfillOptions::default())
        .await
        .unwrap();
    let result = world.tick(&engine).await.unwrap();
    assert_no_errors(&result);
    assert_eq!(lanes_of(&result), [Lane::Backfill]);
    assert_eq!((result.polled[0].items, result.polled[0].events), (5, 0));
    assert_eq!(
        recorder.events().len(),
        5,
        "known, unchanged items are suppressed"
    );
    assert_eq!(backfill_lane(&store).await.done, Some(true));
}

#[tokio::test]
async fn a_backfill_with_a_target_stops_once_it_reached_it() {
    // 10 items, 2 a page.
    let world = World::new(10, 2).unwrap();
    let store = Arc::new(MemoryStore::new());
    let poller = world.poller(StrategyKind::Timestamp).build().unwrap();
    let (engine, recorder) = engine(&world, &store, poller);
    world.tick(&engine).await.unwrap();
    assert_eq!(recorder.events().len(), 10);

    let target = updated_at(&world, "item-004");
    engine
        .backfill(
            POLLER,
            None,
            BackfillOptions {
                from: None,
                to: Some(target.clone()),
                force: true,
            },
        )
        .await
        .unwrap();
    let since = calls_to(&world, "/since");
    let result = world.tick(&engine).await.unwrap();
    assert_no_errors(&result);
    assert_eq!(lanes_of(&result), [Lane::Backfill]);
    assert_eq!(
        calls_to(&world, "/since") - since,
        2,
        "two pages reach item-004; nothing after them is fetched"
    );
    assert_eq!(
        summary(&recorder.events()[10..]),
        ["item-001", "item-002", "item-003", "item-004"].map(|id| (
            EventType::Updated,
            id.to_owned(),
            Lane::Backfill
        ))
    );
    let lane = backfill_lane(&store).await;
    assert_eq!(lane.done, Some(true), "{lane:?}");
    assert_eq!(
        only(&engine).await.cursors.backfill,
        Some(json!({ "value": target, "tieBreak": "item-004" }))
    );
    // Nothing more, ever.
    world.advance(Duration::from_secs(31));
    world.tick(&engine).await.unwrap();
    assert_eq!(recorder.events().len(), 14);
}

#[tokio::test]
async fn backfill_on_a_snapshot_diff_poller_is_a_config_error() {
    let world = World::new(1, 10).unwrap();
    let store = Arc::new(MemoryStore::new());
    let poller = world.poller(StrategyKind::SnapshotDiff).build().unwrap();
    let (engine, _recorder) = engine(&world, &store, poller);
    let error = engine
        .backfill(POLLER, None, BackfillOptions::default())
        .await
        .unwrap_err();
    assert_eq!(option_of(error), "backfill");
    assert_eq!(
        store.load_state(&key()).await.unwrap(),
        None,
        "nothing written"
    );
}

/// The largest full-jitter backoff after `failures` failures with the default schedule backoff
/// (1 s × 2, at most 10 min).
fn backoff_cap_ms(failures: u32) -> i64 {
    (1_000_i64 << (failures - 1).min(20)).min(600_000)
}

#[tokio::test]
async fn a_failing_backfill_backs_off_and_live_polling_keeps_working() {
    const STEP_MS: i64 = 250;
    let world = World::new(5, 10).unwrap();
    let store = Arc::new(MemoryStore::new());
    let failing = Arc::new(AtomicBool::new(false));
    let fetched: Arc<Mutex<Vec<(Lane, i64)>>> = Arc::default();
    let fetch = {
        let (api, clock) = (world.api.clone(), world.clock.clone());
        let (failing, fetched) = (Arc::clone(&failing), Arc::clone(&fetched));
        move |ctx: FetchContext| {
            let api = api.clone();
            lock(&fetched).push((ctx.lane, clock.now_ms()));
            let fail = ctx.lane == Lane::Backfill && failing.load(Ordering::SeqCst);
            async move {
                if fail {
                    return Err::<Page, BoxError>("the archive is down".into());
                }
                api.fetch_since(&ctx).await
            }
        }
    };
    let poller = world
        .poller(StrategyKind::Timestamp)
        .fetch(fetch)
        .build()
        .unwrap();
    let (engine, recorder) = engine(&world, &store, poller);
    world.tick(&engine).await.unwrap();
    assert_eq!(recorder.events().len(), 5);

    failing.store(true, Ordering::SeqCst);
    engine
        .backfill(POLLER, None, BackfillOptions::default())
        .await
        .unwrap();
    let backfill_fetches = || {
        lock(&fetched)
            .iter()
            .filter(|(lane, _)| *lane == Lane::Backfill)
            .map(|(_, at)| *at)
            .collect::<Vec<_>>()
    };
    let live_fetches = || {
        lock(&fetched)
            .iter()
            .filter(|(lane, _)| *lane == Lane::Live)
            .map(|(_, at)| *at)
            .collect::<Vec<_>>()
    };

    // The first attempt runs at once and fails: the lane backs off.
    let result = world.tick(&engine).await.unwrap();
    assert_eq!(lanes_of(&result), [Lane::Backfill]);
    assert!(result.polled[0].error.is_some(), "{result:?}");
    let mut lane = backfill_lane(&store).await;
    let mut retry_at = lane.retry_at.expect("a failed backfill records retry_at");
    assert_eq!(lane.failures, Some(1));
    assert!((1..=backoff_cap_ms(1)).contains(&(retry_at - world.now())));

    // Six minutes in quarter-second steps, a tick each step. The backfill runs exactly when its
    // recorded `retry_at` has come (the first step at or after it), never sooner; meanwhile
    // the live lane polls on its own schedule, untouched, and delivers a change every minute.
    let mut updates: Vec<(i64, String, i64)> = Vec::new();
    for step in 1..=(6 * 60 * 1_000 / STEP_MS) {
        let now = world.now() + STEP_MS;
        if step % (60_000 / STEP_MS) == 1 {
            let value = step;
            let id = format!("item-00{}", step / (60_000 / STEP_MS) % 5 + 1);
            world.api.update(&id, json!({ "value": value })).unwrap();
            updates.push((world.now(), id, value));
        }
        let before = backfill_fetches().len();
        world.advance(ms(u64::try_from(STEP_MS).unwrap()));
        assert_eq!(world.now(), now);
        let result = world.tick(&engine).await.unwrap();
        let ran = backfill_fetches().len() - before;
        if now >= retry_at {
            assert_eq!(
                ran, 1,
                "due at {retry_at}, now {now}: the backfill must run"
            );
            assert!(
                now < retry_at + STEP_MS,
                "the first tick at or after retry_at runs it"
            );
            let failed = result
                .polled
                .iter()
                .find(|p| p.lane == Lane::Backfill)
                .expect("a backfill cycle");
            assert!(failed.error.is_some(), "{result:?}");
            let previous = lane.failures.unwrap();
            lane = backfill_lane(&store).await;
            assert_eq!(lane.failures, Some(previous + 1), "{lane:?}");
            assert_eq!(lane.done, Some(false));
            retry_at = lane.retry_at.unwrap();
            let delay = retry_at - now;
            assert!(
                (1..=backoff_cap_ms(previous + 1)).contains(&delay),
                "failure {}: delay {delay} ms",
                previous + 1
            );
        } else {
            assert_eq!(ran, 0, "before retry_at {retry_at}, now {now}: no backfill");
            assert!(!lanes_of(&result).contains(&Lane::Backfill));
        }
        // The live lane is not affected by the backfill's failures.
        let schedule = only(&engine).await.schedule;
        assert_eq!(
            (schedule.consecutive_failures, schedule.circuit),
            (0, Circuit::Closed)
        );
        assert!(schedule.last_error.is_none(), "{schedule:?}");
        for (at, id, value) in &updates {
            if now >= at + 31_000 {
                assert!(
                    recorder.events().iter().any(|e| e.subject == *id
                        && e.lane == Lane::Live
                        && data_of(e)["value"] == json!(value)),
                    "the live lane delivers the change to {id} made at {at}"
                );
            }
        }
    }
    let attempts = backfill_fetches();
    let failures = lane.failures.unwrap();
    assert_eq!(attempts.len(), usize::try_from(failures).unwrap());
    assert!(
        failures >= 6,
        "several attempts over six minutes: {attempts:?}"
    );
    assert!(
        attempts.windows(2).all(|w| w[1] - w[0] >= 1),
        "{attempts:?}"
    );
    let live = live_fetches();
    assert!(
        live.windows(2).all(|w| w[1] - w[0] <= 30_000 + STEP_MS),
        "live polls at most `max` apart: {live:?}"
    );
    assert_eq!(updates.len(), 6);

    // The archive is back: the next attempt completes the backfill and clears the backoff.
    failing.store(false, Ordering::SeqCst);
    let wait = retry_at - world.now();
    world.advance(ms(u64::try_from(wait.max(0)).unwrap()));
    let events = recorder.events().len();
    let result = world.tick(&engine).await.unwrap();
    assert_no_errors(&result);
    assert!(lanes_of(&result).contains(&Lane::Backfill), "{result:?}");
    let lane = backfill_lane(&store).await;
    assert_eq!(
        (lane.done, lane.failures, lane.retry_at),
        (Some(true), None, None)
    );
    assert_eq!(
        recorder.events().len(),
        events,
        "nothing changed: nothing to re-emit {:?}",
        summary(&recorder.events()[events..])
    );
}

// ----- replay and the log -----

#[tokio::test]
async fn replay_redelivers_logged_events_with_their_ids_on_the_replay_lane() {
    let world = World::new(3, 10).unwrap();
    let store = Arc::new(MemoryStore::new());
    let poller = world
        .poller(StrategyKind::Timestamp)
        .log(Duration::from_secs(3_600))
        .build()
        .unwrap();
    let (engine, recorder) = engine(&world, &store, poller);
    let t0 = world.now();
    let result = world.tick(&engine).await.unwrap();
    assert_eq!(result.delivered, 3);
    let originals = recorder.events();
    assert_eq!(originals.len(), 3);

    // A later change, outside the replayed range.
    world.advance(Duration::from_secs(10));
    world
        .api
        .update("item-002", json!({ "value": 20 }))
        .unwrap();
    world.tick(&engine).await.unwrap();
    assert_eq!(recorder.events().len(), 4);
    assert_eq!(recorder.events()[3].sequence, 4);

    let replayed = engine.replay(POLLER, None, t0, Some(t0)).await.unwrap();
    assert_eq!(replayed, 3);
    assert_eq!(only(&engine).await.outbox_pending, 3);

    // The next tick delivers the copies: the same ids (and events), lane `replay`, fresh
    // sequences after everything committed so far.
    let result = world.tick(&engine).await.unwrap();
    assert_eq!(result.delivered, 3, "{result:?}");
    let copies = recorder.events()[4..].to_vec();
    assert_eq!(
        copies.iter().map(|e| e.id.clone()).collect::<Vec<_>>(),
        originals.iter().map(|e| e.id.clone()).collect::<Vec<_>>()
    );
    assert!(copies.iter().all(|e| e.lane == Lane::Replay));
    assert_eq!(
        copies.iter().map(|e| e.sequence).collect::<Vec<_>>(),
        [5, 6, 7]
    );
    for (copy, original) in copies.iter().zip(&originals) {
        assert_eq!(
            (copy.event_type, &copy.subject, data_of(copy)),
            (original.event_type, &original.subject, data_of(original))
        );
    }
    assert_eq!(only(&engine).await.outbox_pending, 0);

    // Copies are not logged again, and later events continue the sequence.
    let logged = store
        .read_log(&key(), LogQuery::default(), 100)
        .await
        .unwrap();
    assert_eq!(logged.len(), 4);
    assert!(logged.iter().all(|l| l.event.lane == Lane::Live));
    world.advance(Duration::from_secs(60));
    world
        .api
        .update("item-003", json!({ "value": 30 }))
        .unwrap();
    world.tick(&engine).await.unwrap();
    let last = recorder.events().last().cloned().unwrap();
    assert_eq!(
        (last.subject.as_str(), last.lane, last.sequence),
        ("item-003", Lane::Live, 8)
    );

    // Without `to`, up to now: everything logged.
    assert_eq!(engine.replay(POLLER, None, t0, None).await.unwrap(), 5);
}

#[tokio::test]
async fn replay_without_a_log_is_replay_unavailable() {
    let world = World::new(3, 10).unwrap();
    let store = Arc::new(MemoryStore::new());
    let poller = world.poller(StrategyKind::Timestamp).build().unwrap();
    let (engine, recorder) = engine(&world, &store, poller);
    world.tick(&engine).await.unwrap();
    assert_eq!(recorder.events().len(), 3);
    let error = engine.replay(POLLER, None, 0, None).await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::ReplayUnavailable, "{error}");
    let logged = store
        .read_log(&key(), LogQuery::default(), 100)
        .await
        .unwrap();
    assert!(logged.is_empty(), "no log without `log`");
}

#[tokio::test]
async fn log_retention_prunes_entries_older_than_the_retention() {
    let world = World::new(3, 10).unwrap();
    let store = Arc::new(MemoryStore::new());
    let poller = world
        .poller(StrategyKind::Timestamp)
        .log(Duration::from_secs(3_600))
        .build()
        .unwrap();
    let (engine, recorder) = engine(&world, &store, poller);
    let t0 = world.now();
    world.tick(&engine).await.unwrap();
    let logged_at = |log: &[watukuy_core::LoggedEvent]| -> Vec<i64> {
        log.iter().map(|l| l.created_at).collect()
    };
    let log = store
        .read_log(&key(), LogQuery::default(), 100)
        .await
        .unwrap();
    assert_eq!(logged_at(&log), [t0; 3]);

    // Exactly the retention later: nothing is strictly older than `now - retention` yet.
    world.advance(Duration::from_secs(3_600));
    world
        .api
        .update("item-001", json!({ "value": 10 }))
        .unwrap();
    let result = world.tick(&engine).await.unwrap();
    assert_no_errors(&result);
    assert_eq!(recorder.events().len(), 4);
    let log = store
        .read_log(&key(), LogQuery::default(), 100)
        .await
        .unwrap();
    assert_eq!(logged_at(&log), [t0, t0, t0, t0 + 3_600_000]);

    // One millisecond more, and a run of the key prunes the first three.
    world.advance(ms(1));
    engine.trigger(POLLER, None).await.unwrap();
    let result = world.tick(&engine).await.unwrap();
    assert_eq!(lanes_of(&result), [Lane::Live]);
    let log = store
        .read_log(&key(), LogQuery::default(), 100)
        .await
        .unwrap();
    assert_eq!(logged_at(&log), [t0 + 3_600_000]);
    assert_eq!(log[0].event.subject, "item-001");
    assert_eq!(
        engine.replay(POLLER, None, 0, None).await.unwrap(),
        1,
        "pruned entries cannot be replayed"
    );
}

// ----- the schedule, driven through the engine -----

#[tokio::test]
async fn the_live_interval_follows_the_pinned_aimd_sequence() {
    let world = World::new(3, 10).unwrap();
    let store = Arc::new(MemoryStore::new());
    let hooks = Arc::new(ScheduleLog::default());
    let poller = world
        .poller(StrategyKind::Timestamp)
        .schedule(pinned_schedule())
        .build()
        .unwrap();
    let engine = engine_with(&world, &store, poller, Some(hooks.clone()));
    let recorder = Recorder::default();
    engine.on(POLLER, recorder.handler()).unwrap();
    assert_eq!(only(&engine).await.schedule.interval_ms, Some(5_000));

    /// Ticks when the key is due (and checks it was not due a millisecond before), returning
    /// the interval inspect then shows.
    async fn run_when_due(world: &World, engine: &Engine) -> i64 {
        let due = only(engine).await.schedule.next_due_at.unwrap();
        let wait = due - world.now();
        if wait > 0 {
            world.advance(ms(u64::try_from(wait - 1).unwrap()));
            let result = world.tick(engine).await.unwrap();
            assert_eq!(
                (result.polled.len(), result.skipped_not_due),
                (0, 1),
                "not due 1 ms early"
            );
            world.advance(ms(1));
        }
        let result = world.tick(engine).await.unwrap();
        assert_eq!(lanes_of(&result), [Lane::Live]);
        assert_no_errors(&result);
        let schedule = only(engine).await.schedule;
        let interval = schedule.interval_ms.unwrap();
        assert_eq!(
            schedule.next_due_at,
            Some(world.now() + interval),
            "jitter 0: the wait is the interval"
        );
        interval
    }

    // Events (the first listing): halved, but never below min.
    assert_eq!(run_when_due(&world, &engine).await, 5_000);
    // Idle twice: × 1.5 each time.
    assert_eq!(run_when_due(&world, &engine).await, 7_500);
    assert_eq!(run_when_due(&world, &engine).await, 11_250);
    // Events again: halved.
    world
        .api
        .update("item-001", json!({ "value": 10 }))
        .unwrap();
    assert_eq!(run_when_due(&world, &engine).await, 5_625);
    let changes = hooks.changes();
    assert_eq!(
        changes
            .iter()
            .map(|c| (c.interval_ms, c.reason))
            .collect::<Vec<_>>(),
        [
            (5_000, ScheduleReason::EventsSpeedUp),
            (7_500, ScheduleReason::IdleBackOff),
            (11_250, ScheduleReason::IdleBackOff),
            (5_625, ScheduleReason::EventsSpeedUp),
        ]
    );
    assert_eq!(
        changes.last().unwrap().next_due_at,
        world.now() + 5_625,
        "the hook reports the next due time"
    );
    // Idle from there on grows (rounded) up to max and stays there.
    let mut grown = Vec::new();
    for _ in 0..6 {
        grown.push(run_when_due(&world, &engine).await);
    }
    assert_eq!(grown, [8_438, 12_657, 18_986, 28_479, 40_000, 40_000]);
    assert_eq!(recorder.events().len(), 4);
}

#[tokio::test]
async fn an_outage_backs_off_opens_the_circuit_probes_and_loses_nothing() {
    const STEP_MS: i64 = 500;
    let world = World::new(3, 10).unwrap();
    let store = Arc::new(MemoryStore::new());
    let hooks = Arc::new(ScheduleLog::default());
    let poller = world
        .poller(StrategyKind::Timestamp)
        .schedule(pinned_schedule())
        .circuit(CircuitOptions {
            failures: 5,
            probe_every: Some(Duration::from_secs(60)),
        })
        .build()
        .unwrap();
    let engine = engine_with(&world, &store, poller, Some(hooks.clone()));
    let recorder = Recorder::default();
    engine.on(POLLER, recorder.handler()).unwrap();
    world.tick(&engine).await.unwrap();
    assert_eq!(recorder.events().len(), 3);
    hooks.clear();

    // The API fails the next 7 requests.
    world.api.fail_next(Fault::http(500), 7);
    // `(time, status)` of every request from here on, and the schedule after each.
    let mut requests: Vec<(i64, Option<u16>)> = Vec::new();
    let mut after: Vec<ScheduleState> = Vec::new();
    let mut steps = 0;
    while requests.len() < 8 {
        steps += 1;
        assert!(
            steps <= 20 * 60 * 1_000 / STEP_MS,
            "no recovery: {requests:?}"
        );
        let before = only(&engine).await.schedule;
        world.advance(ms(u64::try_from(STEP_MS).unwrap()));
        let now = world.now();
        let calls = world.api.calls();
        let result = world.tick(&engine).await.unwrap();
        let sent = world.api.calls() - calls;
        // A request goes out exactly when the schedule says the key is due: backoff waits,
        // and an open circuit sends nothing but its probes.
        assert_eq!(
            sent,
            u64::from(schedule::is_due(&before, now)),
            "at {now}: schedule {before:?}"
        );
        if sent == 0 {
            assert!(result.polled.is_empty(), "{result:?}");
            continue;
        }
        let status = result.polled[0].error.as_ref().and_then(|e| e.status);
        requests.push((now, status));
        after.push(only(&engine).await.schedule);
        // Changes keep happening during the outage.
        match requests.len() {
            1 => {
                world
                    .api
                    .add(json!({ "id": "new-1", "name": "New 1", "value": 100 }))
                    .unwrap();
            }
            5 => {
                world
                    .api
                    .update("item-002", json!({ "value": 20 }))
                    .unwrap();
            }
            6 => {
                world
                    .api
                    .add(json!({ "id": "new-2", "name": "New 2", "value": 200 }))
                    .unwrap();
                world
                    .api
                    .update("item-002", json!({ "value": 21 }))
                    .unwrap();
            }
            _ => {}
        }
        if requests.len() < 8 {
            assert_eq!(
                recorder.events().len(),
                3,
                "nothing is delivered during the outage"
            );
        }
    }

    assert_eq!(
        requests.iter().map(|r| r.1).collect::<Vec<_>>(),
        [Some(500); 7].into_iter().chain([None]).collect::<Vec<_>>()
    );
    assert_eq!(
        hooks.reasons(),
        [
            ScheduleReason::Backoff,
            ScheduleReason::Backoff,
            ScheduleReason::Backoff,
            ScheduleReason::Backoff,
            ScheduleReason::CircuitOpen,
            ScheduleReason::ProbeFailed,
            ScheduleReason::ProbeFailed,
            ScheduleReason::EventsSpeedUp,
        ]
    );
    // Failures 1–4 back off (full jitter, 1 s × 2): the next request is the first step at or
    // after the backoff, and the backoff grows within its cap.
    for (i, state) in after.iter().take(4).enumerate() {
        let failures = u32::try_from(i + 1).unwrap();
        assert_eq!(
            (state.consecutive_failures, state.circuit),
            (failures, Circuit::Closed)
        );
        let due = state.next_due_at.unwrap();
        let delay = due - requests[i].0;
        assert!(
            (0..=backoff_cap_ms(failures)).contains(&delay),
            "backoff {failures}: {delay}"
        );
        let next = requests[i + 1].0;
        assert!(
            next >= due && next < due + STEP_MS,
            "request {} at {next}, due {due}",
            i + 2
        );
    }
    // The fifth failure opens the circuit: the probe is `probe_every` later.
    let opened_at = requests[4].0;
    assert_eq!(
        (
            after[4].circuit,
            after[4].consecutive_failures,
            after[4].circuit_opened_at,
            after[4].next_due_at
        ),
        (Circuit::Open, 5, Some(opened_at), Some(opened_at + 60_000))
    );
    assert_eq!(*lock(&hooks.opened), [(5, opened_at + 60_000)]);
    // While open, nothing but the probes, each `probe_every` after the previous: the first
    // probe fails (the circuit stays open), so does the second, the third succeeds.
    assert_eq!(
        requests[5..].iter().map(|r| r.0).collect::<Vec<_>>(),
        [opened_at + 60_000, opened_at + 120_000, opened_at + 180_000]
    );
    for (state, failures) in after[5..7].iter().zip([6, 7]) {
        assert_eq!(
            (state.circuit, state.consecutive_failures),
            (Circuit::Open, failures)
        );
        assert_eq!(state.circuit_opened_at, Some(opened_at));
    }
    assert_eq!(lock(&hooks.opened).len(), 1, "the circuit opened once");
    let closed = &after[7];
    assert_eq!(
        (
            closed.circuit,
            closed.consecutive_failures,
            closed.last_error.clone()
        ),
        (Circuit::Closed, 0, None)
    );
    assert_eq!(*lock(&hooks.closed), 1);

    // Nothing was lost: every change made during the outage arrives, once, in order per item.
    let events = recorder.events();
    let late: BTreeMap<String, (EventType, Value)> = events[3..]
        .iter()
        .map(|e| {
            (
                e.subject.clone(),
                (e.event_type, data_of(e)["value"].clone()),
            )
        })
        .collect();
    assert_eq!(events.len(), 6, "{:?}", summary(&events));
    assert_eq!(
        late,
        BTreeMap::from([
            ("item-002".to_owned(), (EventType::Updated, json!(21))),
            ("new-1".to_owned(), (EventType::Created, json!(100))),
            ("new-2".to_owned(), (EventType::Created, json!(200))),
        ])
    );
}

#[tokio::test]
async fn a_429_with_retry_after_sleeps_exactly_that_long_and_leaves_failures_alone() {
    let world = World::new(3, 10).unwrap();
    let store = Arc::new(MemoryStore::new());
    let hooks = Arc::new(ScheduleLog::default());
    let poller = world
        .poller(StrategyKind::Timestamp)
        .schedule(pinned_schedule())
        .build()
        .unwrap();
    let engine = engine_with(&world, &store, poller, Some(hooks.clone()));
    let recorder = Recorder::default();
    engine.on(POLLER, recorder.handler()).unwrap();
    world.tick(&engine).await.unwrap();

    // One ordinary failure first, so "untouched" is visible: the count stays at 1.
    world.api.fail_next(Fault::http(500), 1);
    world.api.fail_next(Fault::http_retry_after(429, 12_000), 1);
    world.advance(Duration::from_secs(5));
    let result = world.tick(&engine).await.unwrap();
    assert_eq!(
        result.polled[0].error.as_ref().and_then(|e| e.status),
        Some(500)
    );
    let failed = only(&engine).await.schedule;
    assert_eq!(failed.consecutive_failures, 1);
    let due = failed.next_due_at.unwrap();
    world.advance(ms(u64::try_from(due - world.now()).unwrap()));

    hooks.clear();
    let result = world.tick(&engine).await.unwrap();
    assert_eq!(
        result.polled[0].error.as_ref().and_then(|e| e.status),
        Some(429)
    );
    let throttled_at = world.now();
    let throttled = only(&engine).await.schedule;
    assert_eq!(
        (throttled.next_due_at, throttled.throttled_until),
        (Some(throttled_at + 12_000), Some(throttled_at + 12_000))
    );
    assert_eq!(
        (throttled.consecutive_failures, throttled.circuit),
        (1, Circuit::Closed),
        "a throttle is not a failure"
    );
    assert_eq!(hooks.reasons(), [ScheduleReason::Throttled]);

    // Not due at +11.999 s: no request.
    world.advance(ms(11_999));
    let calls = world.api.calls();
    let result = world.tick(&engine).await.unwrap();
    assert_eq!((result.polled.len(), result.skipped_not_due), (0, 1));
    assert_eq!(world.api.calls(), calls);

    // Due at exactly +12 s.
    world.advance(ms(1));
    let result = world.tick(&engine).await.unwrap();
    assert_no_errors(&result);
    assert_eq!(world.api.calls(), calls + 1);
    assert_eq!(world.now(), throttled_at + 12_000);
    let recovered = only(&engine).await.schedule;
    assert_eq!(
        (
            recovered.consecutive_failures,
            recovered.circuit,
            recovered.throttled_until
        ),
        (0, Circuit::Closed, None)
    );
}
