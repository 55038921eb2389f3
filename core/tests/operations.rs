//! The engine's operations end to end on `MemoryStore` and the `FakeApi`: `trigger`, `pause` /
//! `resume`, `reset_cursor`, partitions, `inspect`, `subscribe`, the daemon (`start` / `stop`),
//! hooks and builder validation. Everything runs on a manual clock, or on tokio's paused clock
//! for the daemon: no real sleeps.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use futures::future::BoxFuture;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use watukuy_core::cursor;
use watukuy_core::hooks::{CommitInfo, FetchInfo, HookContext, Hooks, Phase};
use watukuy_core::schedule::{CircuitOptions, ScheduleOptions, ScheduleReason};
use watukuy_core::{
    BoxError, Engine, EngineBuilder, Error, ErrorCode, Event, EventType, FetchContext,
    HandlerContext, HandlerError, Lane, Page, Partition, Poller, PollerBuilder, Status,
    StopOptions, TickOptions, TickResult,
    clock::{Clock, ManualClock, TokioClock},
    json::Json,
    rng::SeededRng,
    store::{
        Circuit, Lease, LogQuery, PKey, ParkedKind, ParkedQuery, ParkedRow, PollSummary,
        SerializedError, Store, ValidationIssue,
    },
};
use watukuy_store_memory::MemoryStore;
use watukuy_testkit::T0;
use watukuy_testkit::world::{POLLER, Recorder, StrategyKind, World, key, lock};
use watukuy_testkit::{FakeApi, FakeApiOptions, Fault, FaultyStore, Op, Timing, fake_items};

// ----- helpers -----

fn memory() -> Arc<dyn Store> {
    Arc::new(MemoryStore::new())
}

/// The option a `Config` error names.
fn option_of(error: Error) -> String {
    error
        .config_option()
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("expected a Config error, got {error:?}"))
}

/// An engine on a fresh memory store as node-a (rng seed 1) whose hooks go to a [`HookLog`].
fn hooked(world: &World, poller: Poller) -> (Engine, Arc<HookLog>) {
    let hooks = Arc::new(HookLog::default());
    let engine = world
        .engine_builder(memory(), "node-a", poller, 1)
        .hooks(hooks.clone())
        .build()
        .unwrap();
    (engine, hooks)
}

fn timestamp_engine(world: &World, store: Arc<dyn Store>) -> Engine {
    let poller = world.poller(StrategyKind::Timestamp).build().unwrap();
    world.engine(store, "node-a", poller, 1).unwrap()
}

/// The one `(poller, partition)` the engine reports.
async fn only(engine: &Engine) -> watukuy_core::ops::KeyInspect {
    let report = engine.inspect().await.unwrap();
    assert_eq!(report.pollers.len(), 1, "{report:?}");
    report.pollers.into_iter().next().unwrap().key
}

fn types_and_subjects(events: &[Event]) -> Vec<(EventType, String)> {
    events
        .iter()
        .map(|e| (e.event_type, e.subject.to_string()))
        .collect()
}

/// Rejects one item by id (it is quarantined).
fn reject(id: &'static str) -> impl Fn(&Value) -> Result<(), Vec<ValidationIssue>> {
    move |item: &Value| {
        if item["id"] == id {
            Err(vec![ValidationIssue {
                message: format!("{id} is broken"),
                path: None,
            }])
        } else {
            Ok(())
        }
    }
}

/// One hook call: which hook, where, and a short detail.
#[derive(Clone, Debug)]
struct Call {
    name: &'static str,
    ctx: HookContext,
    detail: String,
}

/// Records every hook call, in order.
#[derive(Default)]
struct HookLog(Mutex<Vec<Call>>);

impl HookLog {
    fn push(&self, name: &'static str, ctx: &HookContext, detail: impl Into<String>) {
        lock(&self.0).push(Call {
            name,
            ctx: ctx.clone(),
            detail: detail.into(),
        });
    }

    fn calls(&self) -> Vec<Call> {
        lock(&self.0).clone()
    }

    fn names(&self) -> Vec<&'static str> {
        lock(&self.0).iter().map(|c| c.name).collect()
    }

    fn details(&self, name: &str) -> Vec<String> {
        lock(&self.0)
            .iter()
            .filter(|c| c.name == name)
            .map(|c| c.detail.clone())
            .collect()
    }

    fn clear(&self) {
        lock(&self.0).clear();
    }
}

#[async_trait]
impl Hooks for HookLog {
    async fn on_page_quarantined(&self, ctx: &HookContext, page: u32, items: usize) {
        self.push(
            "page_quarantined",
            ctx,
            format!("page {page}: {items} items"),
        );
    }
    async fn on_lease_acquired(&self, ctx: &HookContext, lease: &Lease) {
        self.push("lease_acquired", ctx, lease.owner.clone());
    }
    async fn on_poll_start(&self, ctx: &HookContext, _started_at: i64) {
        self.push("poll_start", ctx, "");
    }
    async fn on_fetch(&self, ctx: &HookContext, info: &FetchInfo) {
        self.push(
            "fetch",
            ctx,
            format!("page {} items {}", info.page, info.items),
        );
    }
    async fn on_commit(&self, ctx: &HookContext, info: &CommitInfo) {
        self.push("commit", ctx, format!("events {}", info.events));
    }
    async fn on_event(&self, ctx: &HookContext, event: &Event) {
        self.push("event", ctx, event.subject.clone());
    }
    async fn on_delivered(&self, ctx: &HookContext, event: &Event, _duration_ms: i64) {
        self.push("delivered", ctx, event.subject.clone());
    }
    async fn on_retry(
        &self,
        ctx: &HookContext,
        event: &Event,
        _error: &SerializedError,
        _delay_ms: i64,
    ) {
        self.push("retry", ctx, event.subject.clone());
    }
    async fn on_parked(&self, ctx: &HookContext, row: &ParkedRow) {
        self.push("parked", ctx, row.id.clone());
    }
    async fn on_invalid(&self, ctx: &HookContext, item: &Json, issues: &[ValidationIssue]) {
        let id = item.to_value()["id"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let messages: Vec<&str> = issues.iter().map(|i| i.message.as_str()).collect();
        self.push("invalid", ctx, format!("{id}: {}", messages.join("; ")));
    }
    async fn on_error(&self, ctx: &HookContext, error: &SerializedError, phase: Phase) {
        let status = error.status.map(|s| s.to_string()).unwrap_or_default();
        self.push("error", ctx, format!("{} {status}", phase.as_str()));
    }
    async fn on_lease_lost(&self, ctx: &HookContext, epoch: i64) {
        self.push("lease_lost", ctx, epoch.to_string());
    }
    async fn on_circuit_open(&self, ctx: &HookContext, failures: u32, _probe_at: i64) {
        self.push("circuit_open", ctx, failures.to_string());
    }
    async fn on_circuit_close(&self, ctx: &HookContext) {
        self.push("circuit_close", ctx, "");
    }
    async fn on_budget_wait(&self, ctx: &HookContext, budget: &str, _wait_ms: i64) {
        self.push("budget_wait", ctx, budget);
    }
    async fn on_schedule_change(
        &self,
        ctx: &HookContext,
        _interval_ms: i64,
        _next_due_at: i64,
        reason: ScheduleReason,
    ) {
        self.push("schedule_change", ctx, reason.as_str());
    }
    async fn on_poll_end(&self, ctx: &HookContext, summary: &PollSummary) {
        self.push("poll_end", ctx, format!("items {}", summary.items));
    }
}

// ----- trigger -----

#[tokio::test]
async fn trigger_runs_a_key_that_is_not_due_on_the_next_tick() {
    let world = World::new(3, 10).unwrap();
    let engine = timestamp_engine(&world, memory());
    let recorder = Recorder::attached(&engine).unwrap();
    world.tick(&engine).await.unwrap();
    assert_eq!(recorder.events().len(), 3);

    world
        .api
        .update("item-002", json!({ "value": 20 }))
        .unwrap();
    let calls = world.api.calls();
    let result = world.tick(&engine).await.unwrap();
    assert_eq!(
        (result.polled.len(), result.skipped_not_due),
        (0, 1),
        "not due yet: {result:?}"
    );
    assert_eq!(
        world.api.calls(),
        calls,
        "a key that is not due is not fetched"
    );

    engine.trigger(POLLER, None).await.unwrap();
    assert_eq!(
        only(&engine).await.schedule.next_due_at,
        Some(world.now()),
        "a trigger makes the key due now"
    );
    let result = world.tick(&engine).await.unwrap();
    assert_eq!(result.polled.len(), 1, "{result:?}");
    assert!(result.polled[0].error.is_none(), "{result:?}");
    let events = recorder.events();
    assert_eq!(events.len(), 4);
    assert_eq!(
        (events[3].event_type, events[3].subject.as_str()),
        (EventType::Updated, "item-002")
    );

    // The trigger is used up by that run.
    let result = world.tick(&engine).await.unwrap();
    assert_eq!((result.polled.len(), result.skipped_not_due), (0, 1));

    let error = engine.trigger("nope", None).await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::UnknownPoller, "{error}");
}

#[tokio::test]
async fn trigger_keeps_an_open_circuit_open_and_the_forced_run_is_a_probe() {
    let world = World::new(3, 10).unwrap();
    let poller = world
        .poller(StrategyKind::Timestamp)
        .circuit(
            CircuitOptions::default()
                .failures(3)
                .probe_every(Duration::from_secs(600)),
        )
        .build()
        .unwrap();
    let (engine, hooks) = hooked(&world, poller);
    let recorder = Recorder::attached(&engine).unwrap();

    // `circuit.failures` failing cycles open the circuit.
    world.api.fail_next(Fault::http(500), 3);
    for _ in 0..3 {
        let result = world.tick(&engine).await.unwrap();
        assert_eq!(result.polled.len(), 1, "{result:?}");
        assert_eq!(
            result.polled[0].error.as_ref().and_then(|e| e.status),
            Some(500)
        );
        // Past the backoff (full jitter below 1 s, then 2 s), well before the probe.
        world.advance(Duration::from_secs(60));
    }
    let open = only(&engine).await.schedule;
    assert_eq!(open.circuit, Circuit::Open, "{open:?}");
    assert_eq!(open.consecutive_failures, 3);
    let opened_at = open.circuit_opened_at.unwrap();
    assert_eq!(open.next_due_at, Some(opened_at + 600_000));
    assert_eq!(hooks.details("circuit_open"), ["3"]);

    // Open: nothing runs before the probe time.
    let calls = world.api.calls();
    let result = world.tick(&engine).await.unwrap();
    assert_eq!((result.polled.len(), result.skipped_not_due), (0, 1));
    assert_eq!(world.api.calls(), calls);

    // A trigger makes the key due now; the circuit stays open.
    engine.trigger(POLLER, None).await.unwrap();
    let triggered = only(&engine).await.schedule;
    assert_eq!(triggered.circuit, Circuit::Open);
    assert_eq!(triggered.next_due_at, Some(world.now()));
    assert_eq!(triggered.consecutive_failures, 3);
    assert_eq!(triggered.circuit_opened_at, Some(opened_at));

    // The forced run is a half-open probe: it fetches; failing, the circuit stays open
    // (`probe-failed`, no second `circuit_open`) and the next probe is `probe_every` away.
    world.api.fail_next(Fault::http(500), 1);
    hooks.clear();
    let result = world.tick(&engine).await.unwrap();
    assert_eq!(
        world.api.calls(),
        calls + 1,
        "the triggered tick ran the probe"
    );
    assert!(result.polled[0].error.is_some(), "{result:?}");
    assert_eq!(hooks.details("schedule_change"), ["probe-failed"]);
    assert!(hooks.details("circuit_open").is_empty());
    let failed = only(&engine).await.schedule;
    assert_eq!(failed.circuit, Circuit::Open);
    assert_eq!(failed.next_due_at, Some(world.now() + 600_000));
    assert_eq!(failed.consecutive_failures, 4);

    // Triggered again, a succeeding probe closes the circuit and the events flow.
    engine.trigger(POLLER, None).await.unwrap();
    hooks.clear();
    let result = world.tick(&engine).await.unwrap();
    assert!(result.polled[0].error.is_none(), "{result:?}");
    assert_eq!(
        hooks
            .names()
            .iter()
            .filter(|n| **n == "circuit_close")
            .count(),
        1
    );
    let closed = only(&engine).await.schedule;
    assert_eq!(
        (closed.circuit, closed.consecutive_failures),
        (Circuit::Closed, 0)
    );
    assert_eq!(recorder.events().len(), 3);
}

// ----- pause / resume -----

/// `Engine::caught_up`: false before the first poll, while a cycle was cut short by
/// `max_pages_per_cycle`, and while events wait in the outbox; true once everything seen is
/// delivered, and still true after the API changed (not seen yet) until a poll sees it.
#[tokio::test]
async fn caught_up_says_whether_everything_seen_is_delivered() {
    // 5 items, 2 a page, 2 pages a cycle: the first cycle is cut short.
    let world = World::new(5, 2).unwrap();
    let poller = world
        .poller(StrategyKind::Timestamp)
        .max_pages_per_cycle(2)
        .build()
        .unwrap();
    let engine = world.engine(memory(), "node-a", poller, 1).unwrap();
    assert!(!engine.caught_up().await.unwrap(), "never polled");

    // No consumer: the first cycle's events stay pending.
    world.tick(&engine).await.unwrap();
    assert!(!engine.caught_up().await.unwrap(), "truncated, and pending");
    let recorder = Recorder::attached(&engine).unwrap();
    world.tick(&engine).await.unwrap();
    assert_eq!(recorder.ids().len(), 5);
    assert!(engine.caught_up().await.unwrap());

    world
        .api
        .update("item-001", json!({ "value": 10 }))
        .unwrap();
    assert!(
        engine.caught_up().await.unwrap(),
        "a change not polled yet is not seen"
    );
    world.advance(Duration::from_secs(600));
    world.tick(&engine).await.unwrap();
    assert_eq!(recorder.ids().len(), 6);
    assert!(engine.caught_up().await.unwrap());
}

#[tokio::test]
async fn pause_skips_the_key_and_keeps_its_outbox_until_resume() {
    let world = World::new(3, 10).unwrap();
    let store = memory();
    let engine = timestamp_engine(&world, Arc::clone(&store));

    // No consumer yet: the committed events wait in the outbox.
    let result = world.tick(&engine).await.unwrap();
    assert_eq!(result.polled[0].events, 3);
    assert_eq!(store.counts(&key()).await.map(|c| c.pending).unwrap(), 3);

    engine.pause(POLLER, None).await.unwrap();
    assert!(only(&engine).await.paused);
    let recorder = Recorder::attached(&engine).unwrap();
    world
        .api
        .update("item-001", json!({ "value": 10 }))
        .unwrap();
    world.advance(Duration::from_secs(600));
    let calls = world.api.calls();
    let result = world.tick(&engine).await.unwrap();
    assert_eq!(
        (
            result.polled.len(),
            result.delivered,
            result.skipped_not_due
        ),
        (0, 0, 1),
        "{result:?}"
    );
    assert_eq!(world.api.calls(), calls, "a paused key is not polled");
    assert!(
        recorder.events().is_empty(),
        "a paused key's outbox is not drained, even with a consumer attached"
    );
    let inspect = only(&engine).await;
    assert_eq!((inspect.paused, inspect.outbox_pending), (true, 3));

    engine.resume(POLLER, None).await.unwrap();
    let inspect = only(&engine).await;
    assert!(!inspect.paused);
    assert_eq!(inspect.schedule.next_due_at, Some(world.now()));
    let result = world.tick(&engine).await.unwrap();
    assert_eq!(result.delivered, 4, "{result:?}");
    // The outbox goes first, then the poll finds the update.
    assert_eq!(
        types_and_subjects(&recorder.events()),
        [
            (EventType::Created, "item-001".to_owned()),
            (EventType::Created, "item-002".to_owned()),
            (EventType::Created, "item-003".to_owned()),
            (EventType::Updated, "item-001".to_owned()),
        ]
    );
    assert_eq!(store.counts(&key()).await.map(|c| c.pending).unwrap(), 0);

    // `resume` makes a key due even when its schedule says otherwise.
    let result = world.tick(&engine).await.unwrap();
    assert_eq!(result.skipped_not_due, 1, "not due right after a run");
    engine.pause(POLLER, None).await.unwrap();
    engine.resume(POLLER, None).await.unwrap();
    let result = world.tick(&engine).await.unwrap();
    assert_eq!(result.polled.len(), 1, "{result:?}");

    let error = engine.pause("nope", None).await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::UnknownPoller);
}

// ----- reset_cursor -----

#[tokio::test]
async fn reset_cursor_with_a_cleared_snapshot_recreates_every_item_with_the_same_ids() {
    for kind in StrategyKind::ALL {
        let world = World::new(5, 2).unwrap();
        let poller = world.poller(kind).build().unwrap();
        let engine = world.engine(memory(), "node-a", poller, 1).unwrap();
        let recorder = Recorder::attached(&engine).unwrap();
        world.tick(&engine).await.unwrap();
        let first = recorder.events();
        assert_eq!(first.len(), 5, "{kind:?}");

        // Keeping the snapshot: the API is read from the beginning, nothing is re-emitted.
        engine
            .reset_cursor(POLLER, None, None, false)
            .await
            .unwrap();
        assert_eq!(only(&engine).await.cursors.live, None, "{kind:?}");
        world.api.reset_stats();
        world.tick(&engine).await.unwrap();
        assert_eq!(world.api.calls(), 3, "{kind:?}: three pages from the start");
        assert_eq!(
            recorder.events().len(),
            5,
            "{kind:?}: known items emit nothing"
        );

        // Clearing it: everything is created again, with the same ids (G2).
        engine.reset_cursor(POLLER, None, None, true).await.unwrap();
        let inspect = only(&engine).await;
        assert_eq!(inspect.items, 0, "{kind:?}");
        assert_eq!(inspect.schedule.next_due_at, Some(world.now()), "{kind:?}");
        world.tick(&engine).await.unwrap();
        let again = recorder.events()[5..].to_vec();
        assert!(
            again.iter().all(|e| e.event_type == EventType::Created),
            "{kind:?}: {:?}",
            types_and_subjects(&again)
        );
        let ids = |events: &[Event]| events.iter().map(|e| e.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(&again), ids(&first), "{kind:?}");
        assert_eq!(only(&engine).await.items, 5, "{kind:?}");
    }
}

#[tokio::test]
async fn reset_cursor_to_a_raw_value_moves_the_live_cursor() {
    let world = World::new(5, 10).unwrap();
    let engine = timestamp_engine(&world, memory());
    let recorder = Recorder::attached(&engine).unwrap();
    world.tick(&engine).await.unwrap();
    assert_eq!(
        only(&engine).await.cursors.live,
        Some(json!({ "value": "2026-01-01T00:00:04.000Z", "tieBreak": "item-005" }))
    );

    engine
        .reset_cursor(POLLER, None, Some("2026-01-01T00:00:02.000Z"), false)
        .await
        .unwrap();
    let inspect = only(&engine).await;
    assert_eq!(
        inspect.cursors.live,
        Some(json!({ "value": "2026-01-01T00:00:02.000Z", "tieBreak": null }))
    );
    assert_eq!(inspect.schedule.next_due_at, Some(world.now()));

    // The next cycle reads from there.
    world.api.reset_stats();
    world.tick(&engine).await.unwrap();
    let log = world.api.log();
    assert_eq!(
        log[0].params.get("since").map(String::as_str),
        Some("2026-01-01T00:00:02.000Z"),
        "{log:?}"
    );
    assert_eq!(recorder.events().len(), 5, "the items there are known");

    // A value the strategy cannot read is a `Config` error naming the cursor; nothing moves.
    let before = only(&engine).await.cursors.live;
    let error = engine
        .reset_cursor(POLLER, None, Some("last tuesday"), false)
        .await
        .unwrap_err();
    assert_eq!(option_of(error), "cursor");
    assert_eq!(only(&engine).await.cursors.live, before);
}

// ----- partitions -----

const TENANTS: &str = "tenants";

/// A partition whose data carries a secret.
fn tenant(key: &str) -> Partition {
    Partition {
        key: key.to_owned(),
        data: Some(Arc::new(secret_of(key))),
    }
}

fn secret_of(key: &str) -> Value {
    json!({ "token": format!("secret-token-{key}") })
}

/// A partitioned poller `tenants` over one fake API per tenant (`a`: 2 items, `b`: 3, `c`: 1),
/// listing partitions from a list the test changes, refreshed every minute.
struct Tenants {
    clock: ManualClock,
    store: Arc<dyn Store>,
    apis: Arc<HashMap<String, FakeApi>>,
    list: Arc<Mutex<Vec<Partition>>>,
    /// `(partition key, partition data)` of every fetch.
    fetched: Arc<Mutex<Vec<Fetched>>>,
}

/// The partition key and data one fetch received.
type Fetched = (String, Option<Value>);

impl Tenants {
    fn new(keys: &[&str]) -> Self {
        let clock = ManualClock::new(T0 + 60_000);
        let apis = [("a", 2), ("b", 3), ("c", 1)]
            .into_iter()
            .map(|(key, items)| {
                let api = FakeApi::new(FakeApiOptions::new(Arc::new(clock.clone())).page_size(10));
                api.seed(fake_items(items)).unwrap();
                (key.to_owned(), api)
            })
            .collect();
        let tenants = Self {
            clock,
            store: memory(),
            apis: Arc::new(apis),
            list: Arc::default(),
            fetched: Arc::default(),
        };
        tenants.set(keys);
        tenants
    }

    fn set(&self, keys: &[&str]) {
        *lock(&self.list) = keys.iter().map(|k| tenant(k)).collect();
    }

    fn api(&self, key: &str) -> &FakeApi {
        &self.apis[key]
    }

    fn poller(&self) -> Poller {
        let (apis, fetched, list) = (
            Arc::clone(&self.apis),
            Arc::clone(&self.fetched),
            Arc::clone(&self.list),
        );
        Poller::builder::<Value>(TENANTS)
            .identity_field("id")
            .cursor(cursor::snapshot_diff())
            .schedule(
                ScheduleOptions::default()
                    .min(Duration::from_secs(5))
                    .max(Duration::from_secs(30))
                    .jitter(0.0),
            )
            .fetch(move |ctx: FetchContext| {
                let (apis, fetched) = (Arc::clone(&apis), Arc::clone(&fetched));
                async move {
                    lock(&fetched).push((
                        ctx.partition.key.clone(),
                        ctx.partition.data.as_deref().cloned(),
                    ));
                    match apis.get(&ctx.partition.key) {
                        Some(api) => api.fetch_all(&ctx).await,
                        None => Err(BoxError::from(format!("no tenant {:?}", ctx.partition.key))),
                    }
                }
            })
            .partitions(
                move || {
                    let list = Arc::clone(&list);
                    async move { Ok::<_, BoxError>(lock(&list).clone()) }
                },
                Duration::from_secs(60),
            )
            .build()
            .unwrap()
    }

    fn engine(&self) -> Engine {
        Engine::builder(Arc::clone(&self.store))
            .poller(self.poller())
            .clock(Arc::new(self.clock.clone()))
            .rng(Arc::new(SeededRng::new(7)))
            .instance_id("node-a")
            .build()
            .unwrap()
    }

    async fn tick(&self, engine: &Engine) -> TickResult {
        engine.tick(TickOptions::default()).await.unwrap()
    }

    /// Past the partition refresh period and every key's schedule.
    fn advance(&self) {
        self.clock.advance(Duration::from_secs(61));
    }

    fn key(partition: &str) -> PKey {
        PKey::new(TENANTS, partition)
    }
}

/// The partitions a tick polled, sorted.
fn polled(result: &TickResult) -> Vec<String> {
    let mut partitions: Vec<String> = result.polled.iter().map(|p| p.partition.clone()).collect();
    partitions.sort();
    partitions
}

/// The partitions `inspect()` reports, sorted.
async fn inspected(engine: &Engine) -> Vec<String> {
    let mut partitions: Vec<String> = engine
        .inspect()
        .await
        .unwrap()
        .pollers
        .into_iter()
        .map(|p| p.key.partition)
        .collect();
    partitions.sort();
    partitions
}

/// Everything the store holds for `poller`, as text.
async fn dump(store: &dyn Store, poller: &str) -> String {
    let mut text = String::new();
    let keys = store.list_keys(Some(poller)).await.unwrap();
    for key in keys {
        let identities: Vec<String> = store
            .stream_identities(&key, 100)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .flat_map(|batch| batch.unwrap())
            .collect();
        text.push_str(&format!(
            "{key}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n",
            store.load_state(&key).await.unwrap(),
            store.get_lease(&key).await.unwrap(),
            store.load_pending(&key, 10_000).await.unwrap(),
            store
                .list_parked(&key, ParkedQuery::default())
                .await
                .unwrap(),
            store.load_versions(&key, &identities).await.unwrap(),
            store
                .read_log(&key, LogQuery::default(), 10_000)
                .await
                .unwrap(),
        ));
    }
    text
}

#[tokio::test]
async fn partition_data_reaches_fetch_and_handler_and_is_never_stored() {
    let t = Tenants::new(&["a", "b"]);
    let engine = t.engine();

    // No consumer yet: the events wait in the outbox (where a leak would show).
    let result = t.tick(&engine).await;
    assert_eq!(polled(&result), ["a", "b"]);
    let fetched = lock(&t.fetched).clone();
    assert_eq!(fetched.len(), 2, "{fetched:?}");
    for (key, data) in &fetched {
        assert_eq!(data.as_ref(), Some(&secret_of(key)), "fetch of {key}");
    }
    let mut keys = t.store.list_keys(Some(TENANTS)).await.unwrap();
    keys.sort_by(|x, y| x.partition.cmp(&y.partition));
    assert_eq!(keys, [Tenants::key("a"), Tenants::key("b")]);
    let stored = dump(&*t.store, TENANTS).await;
    assert!(
        stored.contains("item-003"),
        "the dump reads the rows: {stored}"
    );
    assert!(!stored.contains("secret-token"), "{stored}");

    let seen: Arc<Mutex<Vec<(Event, Partition)>>> = Arc::default();
    {
        let seen = Arc::clone(&seen);
        engine
            .on(TENANTS, move |event: Event, ctx: HandlerContext| {
                lock(&seen).push((event, ctx.partition.clone()));
                async { Ok::<(), HandlerError>(()) }
            })
            .unwrap();
    }
    let result = t.tick(&engine).await;
    assert_eq!(result.delivered, 5, "{result:?}");
    let seen = lock(&seen).clone();
    assert_eq!(seen.len(), 5);
    for (event, partition) in &seen {
        assert_eq!(event.poller, TENANTS);
        assert_eq!(partition.key, event.partition, "{event:?}");
        assert_eq!(
            partition.data.as_deref(),
            Some(&secret_of(&event.partition)),
            "the handler gets the partition's data"
        );
    }
    let in_a: Vec<&str> = seen
        .iter()
        .filter(|(e, _)| e.partition == "a")
        .map(|(e, _)| e.subject.as_str())
        .collect();
    assert_eq!(in_a, ["item-001", "item-002"]);
    let id_of = |partition: &str| {
        seen.iter()
            .find(|(e, _)| e.partition == partition && e.subject == "item-001")
            .map(|(e, _)| e.id.clone())
            .unwrap()
    };
    assert_ne!(
        id_of("a"),
        id_of("b"),
        "the event id includes the partition"
    );

    let stored = dump(&*t.store, TENANTS).await;
    assert!(!stored.contains("secret-token"), "{stored}");
}

#[tokio::test]
async fn operations_on_a_partitioned_poller_need_a_partition() {
    let t = Tenants::new(&["a"]);
    let engine = t.engine();
    let errors = [
        engine.trigger(TENANTS, None).await.unwrap_err(),
        engine.pause(TENANTS, None).await.unwrap_err(),
        engine.resume(TENANTS, None).await.unwrap_err(),
        engine
            .reset_cursor(TENANTS, None, None, false)
            .await
            .unwrap_err(),
        engine
            .list_parked(TENANTS, None, ParkedQuery::default())
            .await
            .unwrap_err(),
        engine.retry_parked(TENANTS, None, &[]).await.unwrap_err(),
        engine.discard_parked(TENANTS, None, &[]).await.unwrap_err(),
    ];
    for error in errors {
        assert!(error.to_string().contains("partitioned"), "{error}");
        assert_eq!(option_of(error), "partition");
    }
    // With one, they work.
    engine.pause(TENANTS, Some("a")).await.unwrap();
    engine.resume(TENANTS, Some("a")).await.unwrap();
    engine.trigger(TENANTS, Some("a")).await.unwrap();
    assert!(
        engine
            .list_parked(TENANTS, Some("a"), ParkedQuery::default())
            .await
            .unwrap()
            .is_empty()
    );

    // An unpartitioned poller refuses a partition.
    let world = World::new(1, 10).unwrap();
    let single = timestamp_engine(&world, memory());
    let error = single.trigger(POLLER, Some("a")).await.unwrap_err();
    assert_eq!(option_of(error), "partition");
    single.trigger(POLLER, Some("")).await.unwrap();
}

#[tokio::test]
async fn an_unknown_poller_name_is_unknown_poller() {
    let t = Tenants::new(&["a"]);
    let engine = t.engine();
    let errors = [
        engine.trigger("nope", None).await.unwrap_err(),
        engine.pause("nope", None).await.unwrap_err(),
        engine.resume("nope", None).await.unwrap_err(),
        engine
            .reset_cursor("nope", None, None, true)
            .await
            .unwrap_err(),
        engine
            .list_parked("nope", None, ParkedQuery::default())
            .await
            .unwrap_err(),
        engine.retry_parked("nope", None, &[]).await.unwrap_err(),
        engine.discard_parked("nope", None, &[]).await.unwrap_err(),
        engine.partitions("nope").await.unwrap_err(),
        engine.remove_partition("nope", "a").await.unwrap_err(),
        engine
            .on("nope", Recorder::default().handler())
            .map(|_| ())
            .unwrap_err(),
        engine.subscribe("nope").map(|_| ()).unwrap_err(),
    ];
    for error in errors {
        assert_eq!(error.code(), ErrorCode::UnknownPoller, "{error}");
        assert_eq!(
            error.to_string(),
            format!("unknown poller 'nope' (known pollers: '{TENANTS}')")
        );
    }
    // A tick limited to a name the engine does not know fails the same way, before polling.
    let error = engine
        .tick(TickOptions::default().only(["nope"]))
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::UnknownPoller, "{error}");
    assert!(lock(&t.fetched).is_empty(), "nothing was fetched");
}

#[tokio::test]
async fn a_tick_limited_to_one_partition_runs_that_key_only() {
    let t = Tenants::new(&["a", "b", "c"]);
    let engine = t.engine();
    let result = engine
        .tick(TickOptions::default().only([TENANTS]).partition("b"))
        .await
        .unwrap();
    assert_eq!(polled(&result), ["b"]);
    assert_eq!(result.skipped_not_due, 0);
    let result = t.tick(&engine).await;
    assert_eq!(polled(&result), ["a", "c"], "the others were still due");
}

#[tokio::test]
async fn a_dropped_partition_stops_being_polled_and_resumes_by_itself_when_it_returns() {
    let t = Tenants::new(&["a", "b"]);
    let engine = t.engine();
    let recorder = Recorder::default();
    engine.on(TENANTS, recorder.handler()).unwrap();
    let result = t.tick(&engine).await;
    assert_eq!(polled(&result), ["a", "b"]);
    assert_eq!(recorder.events().len(), 5);
    assert_eq!(inspected(&engine).await, ["a", "b"]);
    let b_state = t.store.load_state(&Tenants::key("b")).await.unwrap();

    // `b` leaves the list; it changes meanwhile.
    t.set(&["a"]);
    t.api("b")
        .update("item-001", json!({ "value": 100 }))
        .unwrap();
    let b_calls = t.api("b").calls();
    for _ in 0..3 {
        t.advance();
        let result = t.tick(&engine).await;
        assert_eq!(polled(&result), ["a"], "{result:?}");
    }
    assert_eq!(
        t.api("b").calls(),
        b_calls,
        "a dropped partition is not fetched"
    );
    assert_eq!(inspected(&engine).await, ["a"]);
    assert_eq!(engine.partitions(TENANTS).await.unwrap(), ["a"]);
    assert_eq!(
        t.store.load_state(&Tenants::key("b")).await.unwrap(),
        b_state,
        "nothing is written for a dropped partition"
    );
    assert_eq!(recorder.events().len(), 5);

    // Back in the list: it resumes by itself, from where it was.
    t.set(&["a", "b"]);
    t.advance();
    let result = t.tick(&engine).await;
    assert_eq!(polled(&result), ["a", "b"], "{result:?}");
    let events = recorder.events();
    assert_eq!(events.len(), 6, "{:?}", types_and_subjects(&events));
    assert_eq!(
        (
            events[5].event_type,
            events[5].subject.as_str(),
            events[5].partition.as_str()
        ),
        (EventType::Updated, "item-001", "b")
    );
    assert_eq!(inspected(&engine).await, ["a", "b"]);
    let report = engine.inspect().await.unwrap();
    assert!(report.pollers.iter().all(|p| !p.paused), "{report:?}");
}

#[tokio::test]
async fn a_partition_that_appears_is_polled_at_once() {
    let t = Tenants::new(&["a"]);
    let engine = t.engine();
    let recorder = Recorder::default();
    engine.on(TENANTS, recorder.handler()).unwrap();
    assert_eq!(polled(&t.tick(&engine).await), ["a"]);

    // A forced refresh picks it up before the refresh period; it is due at once.
    t.set(&["a", "c"]);
    assert_eq!(engine.partitions(TENANTS).await.unwrap(), ["a", "c"]);
    let result = t.tick(&engine).await;
    assert_eq!(polled(&result), ["c"], "{result:?}");
    assert_eq!(result.skipped_not_due, 1, "a is not due yet");
    let in_c: Vec<Event> = recorder
        .events()
        .into_iter()
        .filter(|e| e.partition == "c")
        .collect();
    assert_eq!(
        types_and_subjects(&in_c),
        [(EventType::Created, "item-001".to_owned())]
    );
}

#[tokio::test]
async fn remove_partition_deletes_every_row_of_the_partition() {
    let t = Tenants::new(&["a", "b"]);
    let engine = t.engine();
    // No consumer: state, items and pending events for both.
    t.tick(&engine).await;
    let (a, b) = (Tenants::key("a"), Tenants::key("b"));
    assert_eq!(t.store.counts(&b).await.map(|c| c.pending).unwrap(), 3);
    assert_eq!(t.store.counts(&b).await.map(|c| c.items).unwrap(), 3);

    t.set(&["a"]);
    assert_eq!(engine.partitions(TENANTS).await.unwrap(), ["a"]);
    engine.remove_partition(TENANTS, "b").await.unwrap();
    assert_eq!(t.store.load_state(&b).await.unwrap(), None);
    assert_eq!(t.store.get_lease(&b).await.unwrap(), None);
    assert_eq!(t.store.counts(&b).await.map(|c| c.items).unwrap(), 0);
    assert_eq!(t.store.counts(&b).await.map(|c| c.pending).unwrap(), 0);
    assert_eq!(t.store.counts(&b).await.map(|c| c.parked).unwrap(), 0);
    assert_eq!(
        t.store.list_keys(Some(TENANTS)).await.unwrap(),
        std::slice::from_ref(&a)
    );
    // The other partition is untouched.
    assert_eq!(t.store.counts(&a).await.map(|c| c.items).unwrap(), 2);
    assert_eq!(t.store.counts(&a).await.map(|c| c.pending).unwrap(), 2);
    assert!(t.store.load_state(&a).await.unwrap().is_some());
}

#[tokio::test]
async fn an_invalid_partition_list_is_rejected_and_the_previous_one_kept() {
    let t = Tenants::new(&["a", "b"]);
    let engine = t.engine();
    let recorder = Recorder::default();
    engine.on(TENANTS, recorder.handler()).unwrap();
    assert_eq!(polled(&t.tick(&engine).await), ["a", "b"]);

    for bad in [&["a", "a"][..], &["a", ""][..], &[][..]] {
        t.set(bad);
        let error = engine.partitions(TENANTS).await.unwrap_err();
        assert_eq!(option_of(error), "partitions", "{bad:?}");
        t.advance();
        let result = t.tick(&engine).await;
        assert_eq!(
            polled(&result),
            ["a", "b"],
            "{bad:?}: the previous list runs"
        );
        assert!(
            result.polled.iter().all(|p| p.error.is_none()),
            "{result:?}"
        );
        assert_eq!(inspected(&engine).await, ["a", "b"], "{bad:?}");
    }
    assert_eq!(recorder.events().len(), 5);
}

#[tokio::test]
async fn a_partitioned_poller_whose_first_list_is_invalid_polls_nothing() {
    let t = Tenants::new(&["a", "a"]);
    let engine = t.engine();
    let result = t.tick(&engine).await;
    assert!(result.polled.is_empty(), "{result:?}");
    assert!(lock(&t.fetched).is_empty(), "{:?}", lock(&t.fetched));
    assert!(t.store.list_keys(Some(TENANTS)).await.unwrap().is_empty());
    assert!(engine.inspect().await.unwrap().pollers.is_empty());

    // Once the list is valid, its partitions run.
    t.set(&["a", "b"]);
    t.advance();
    assert_eq!(polled(&t.tick(&engine).await), ["a", "b"]);
}

// ----- inspect -----

#[tokio::test]
async fn inspect_is_plain_json_with_every_documented_field() {
    let world = World::new(7, 3).unwrap();
    let store = memory();
    let poller = world
        .poller(StrategyKind::Timestamp)
        .check(reject("item-004"))
        .build()
        .unwrap();
    let engine = world
        .engine(Arc::clone(&store), "node-a", poller, 1)
        .unwrap();
    let now = world.now();

    // Never run: the initial schedule, nothing else.
    let report = serde_json::to_value(engine.inspect().await.unwrap()).unwrap();
    assert_eq!(report["instanceId"], "node-a");
    assert_eq!(report["status"], "idle");
    assert_eq!(report["generatedAt"], now);
    let pollers = report["pollers"].as_array().unwrap();
    assert_eq!(pollers.len(), 1);
    let fresh = &pollers[0];
    for field in [
        "poller",
        "partition",
        "paused",
        "lease",
        "cursors",
        "schedule",
        "lastPoll",
        "outboxPending",
        "parked",
        "items",
        "lagMs",
    ] {
        assert!(fresh.get(field).is_some(), "missing {field}: {fresh}");
    }
    assert_eq!(fresh["poller"], "items");
    assert_eq!(fresh["partition"], "");
    assert_eq!(fresh["paused"], false);
    assert_eq!(fresh["lease"], Value::Null);
    assert_eq!(fresh["cursors"]["live"], Value::Null);
    assert_eq!(fresh["lastPoll"], Value::Null);
    assert_eq!(fresh["lagMs"], Value::Null);
    assert_eq!(
        (&fresh["outboxPending"], &fresh["parked"], &fresh["items"]),
        (&json!(0), &json!(0), &json!(0))
    );
    assert_eq!(fresh["schedule"]["nextDueAt"], now, "due at once");
    assert_eq!(fresh["schedule"]["intervalMs"], 5_000);
    assert_eq!(fresh["schedule"]["circuit"], "closed");
    assert_eq!(fresh["schedule"]["consecutiveFailures"], 0);

    // One cycle without a consumer: 6 events pending, 1 item quarantined.
    world.tick(&engine).await.unwrap();
    let report = serde_json::to_value(engine.inspect().await.unwrap()).unwrap();
    let p = &report["pollers"][0];
    assert_eq!(p["outboxPending"], 6, "{p}");
    assert_eq!(p["parked"], 1, "{p}");
    assert_eq!(p["items"], 6, "{p}");
    assert_eq!(p["lease"], Value::Null, "released after the run");
    assert_eq!(
        p["cursors"]["live"],
        json!({ "value": "2026-01-01T00:00:06.000Z", "tieBreak": "item-007" })
    );
    assert_eq!(p["lagMs"], 1_000, "now minus the last item's timestamp");
    let last_poll = &p["lastPoll"];
    assert_eq!(last_poll["lane"], "live", "{last_poll}");
    assert_eq!(last_poll["pages"], 3);
    assert_eq!(last_poll["items"], 7);
    assert_eq!(
        last_poll["events"],
        json!({ "created": 6, "updated": 0, "deleted": 0 })
    );
    assert_eq!(last_poll["notModified"], false);
    assert_eq!(last_poll["truncated"], false);
    assert_eq!(p["schedule"]["lastPoll"], *last_poll);
    assert_eq!(p["schedule"]["lastPollAt"], now);

    // The lag grows with time; a lease held elsewhere shows.
    world.advance(Duration::from_secs(1));
    let lease = store
        .acquire_lease(&key(), "node-b", 30_000, world.now())
        .await
        .unwrap()
        .unwrap();
    let report = serde_json::to_value(engine.inspect().await.unwrap()).unwrap();
    let p = &report["pollers"][0];
    assert_eq!(p["lagMs"], 2_000);
    assert_eq!(
        p["lease"],
        json!({ "owner": "node-b", "epoch": lease.epoch, "expiresAt": world.now() + 30_000 })
    );
    world.advance(Duration::from_secs(10));
    let result = world.tick(&engine).await.unwrap();
    assert_eq!(result.skipped_leased, 1, "{result:?}");

    // The whole report is plain JSON: it survives a round trip through text.
    let text = serde_json::to_string(&report).unwrap();
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), report);

    // No lag for strategies without a time watermark.
    let world = World::new(2, 10).unwrap();
    let page = world
        .engine(
            memory(),
            "node-a",
            world.poller(StrategyKind::Page).build().unwrap(),
            1,
        )
        .unwrap();
    world.tick(&page).await.unwrap();
    let inspect = only(&page).await;
    assert_eq!(inspect.lag_ms, None);
    assert!(inspect.cursors.live.is_some());
}

// ----- subscribe -----

#[tokio::test]
async fn subscribe_works_with_tick_and_excludes_on() {
    let world = World::new(5, 2).unwrap();
    let store = memory();
    let engine = timestamp_engine(&world, Arc::clone(&store));
    let mut subscription = engine.subscribe(POLLER).unwrap();
    let error = engine
        .on(POLLER, Recorder::default().handler())
        .map(|_| ())
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::Config, "{error}");
    let error = engine.subscribe(POLLER).map(|_| ()).unwrap_err();
    assert_eq!(error.code(), ErrorCode::Config, "{error}");

    let done = CancellationToken::new();
    let (result, (events, pending_with_first_in_hand)) = tokio::join!(
        async {
            let result = world.tick(&engine).await;
            done.cancel();
            result
        },
        async {
            let mut events = Vec::new();
            let mut pending = None;
            loop {
                tokio::select! {
                    biased;
                    next = subscription.next() => match next {
                        Some(event) => {
                            if events.is_empty() {
                                pending = Some(store.counts(&key()).await.map(|c| c.pending).unwrap());
                            }
                            events.push(event);
                        }
                        None => break,
                    },
                    () = done.cancelled() => break,
                }
            }
            (events, pending)
        }
    );
    let result = result.unwrap();
    assert_eq!(result.delivered, 5, "{result:?}");
    assert_eq!(
        types_and_subjects(&events),
        (1..=5)
            .map(|i| (EventType::Created, format!("item-00{i}")))
            .collect::<Vec<_>>()
    );
    assert!(events.windows(2).all(|w| w[0].sequence < w[1].sequence));
    assert_eq!(
        pending_with_first_in_hand,
        Some(2),
        "the event in hand is acknowledged only when the next one is pulled"
    );
    assert_eq!(store.counts(&key()).await.map(|c| c.pending).unwrap(), 0);

    // Dropping the subscription detaches it: `on` works again.
    drop(subscription);
    engine.on(POLLER, Recorder::default().handler()).unwrap();
}

// ----- the daemon -----

/// A world whose fake API runs on a `TokioClock` (tokio's paused time), and that clock.
fn tokio_world(items: usize, page_size: usize) -> (World, TokioClock) {
    World::on_tokio_clock(items, page_size).unwrap()
}

/// A timestamp engine on `clock` (rng seed 5) as `id`, for the daemon tests.
fn daemon_builder(
    world: &World,
    clock: &TokioClock,
    store: Arc<dyn Store>,
    id: &str,
) -> EngineBuilder {
    Engine::builder(store)
        .poller(world.poller(StrategyKind::Timestamp).build().unwrap())
        .clock(Arc::new(clock.clone()))
        .rng(Arc::new(SeededRng::new(5)))
        .instance_id(id)
}

fn daemon_engine(world: &World, clock: &TokioClock, store: Arc<dyn Store>, id: &str) -> Engine {
    daemon_builder(world, clock, store, id).build().unwrap()
}

/// A daemon engine as node-a whose hooks go to a [`HookLog`].
fn hooked_daemon(
    world: &World,
    clock: &TokioClock,
    store: Arc<dyn Store>,
) -> (Engine, Arc<HookLog>) {
    let hooks = Arc::new(HookLog::default());
    let engine = daemon_builder(world, clock, store, "node-a")
        .hooks(hooks.clone())
        .build()
        .unwrap();
    (engine, hooks)
}

/// Lets virtual time pass a second at a time until `done` holds, at most `seconds` seconds.
async fn run_until(clock: &TokioClock, seconds: u32, done: impl Fn() -> bool) -> bool {
    for _ in 0..seconds {
        if done() {
            return true;
        }
        clock.sleep(Duration::from_secs(1)).await;
    }
    done()
}

fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

#[tokio::test(start_paused = true)]
async fn the_daemon_delivers_changes_on_its_own_and_stops_cleanly() {
    let (world, clock) = tokio_world(3, 10);
    let engine = daemon_engine(&world, &clock, memory(), "node-a");
    let recorder = Recorder::attached(&engine).unwrap();
    assert_eq!(engine.status(), Status::Idle);

    engine.start().await.unwrap();
    engine.start().await.unwrap();
    assert_eq!(engine.status(), Status::Running, "starting twice is fine");
    assert!(run_until(&clock, 60, || recorder.events().len() >= 3).await);

    world
        .api
        .update("item-002", json!({ "value": 20 }))
        .unwrap();
    assert!(
        run_until(&clock, 120, || recorder.events().len() >= 4).await,
        "{:?}",
        types_and_subjects(&recorder.events())
    );
    let events = recorder.events();
    assert_eq!(events.len(), 4);
    assert_eq!(
        (events[3].event_type, events[3].subject.as_str()),
        (EventType::Updated, "item-002")
    );
    assert_eq!(engine.inspect().await.unwrap().status, Status::Running);

    engine
        .stop(StopOptions::default().drain(true))
        .await
        .unwrap();
    assert_eq!(engine.status(), Status::Stopped);
    assert_eq!(alive_tasks(), 0, "no engine task outlives stop()");
    let calls = world.api.calls();
    world
        .api
        .update("item-003", json!({ "value": 30 }))
        .unwrap();
    clock.sleep(Duration::from_secs(600)).await;
    assert_eq!(world.api.calls(), calls, "nothing polls after stop()");
    assert_eq!(
        recorder.events().len(),
        4,
        "nothing is delivered after stop()"
    );

    // Started again, it catches up with what changed meanwhile.
    engine.start().await.unwrap();
    assert_eq!(engine.status(), Status::Running);
    assert!(run_until(&clock, 120, || recorder.events().len() >= 5).await);
    assert_eq!(
        (
            recorder.events()[4].event_type,
            recorder.events()[4].subject.as_str()
        ),
        (EventType::Updated, "item-003")
    );
    engine.stop(StopOptions::default()).await.unwrap();
    assert_eq!(engine.status(), Status::Stopped);
    assert_eq!(alive_tasks(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_trigger_wakes_the_daemon() {
    let (world, clock) = tokio_world(2, 10);
    let engine = daemon_engine(&world, &clock, memory(), "node-a");
    let recorder = Recorder::attached(&engine).unwrap();
    engine.start().await.unwrap();
    assert!(run_until(&clock, 60, || recorder.events().len() >= 2).await);
    // Let the schedule grow to its maximum (30 s): idle cycles back off.
    clock.sleep(Duration::from_secs(300)).await;
    let interval = only(&engine).await.schedule.interval_ms;
    assert_eq!(interval, Some(30_000));

    world
        .api
        .update("item-001", json!({ "value": 10 }))
        .unwrap();
    let calls = world.api.calls();
    let scheduled = only(&engine).await.schedule.next_due_at.unwrap();
    assert!(scheduled > clock.now_ms(), "not due by its schedule");
    engine.trigger(POLLER, None).await.unwrap();
    assert!(run_until(&clock, 60, || recorder.events().len() >= 3).await);
    assert_eq!(world.api.calls(), calls + 1);
    let fetched_at = world.api.log().last().unwrap().at;
    assert!(
        fetched_at < scheduled,
        "the trigger woke the daemon: fetched at {fetched_at}, scheduled for {scheduled}"
    );
    engine.stop(StopOptions::default()).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn stop_with_drain_lets_the_cycle_in_flight_finish() {
    let (world, clock) = tokio_world(2, 10);
    let store = memory();
    let engine = daemon_engine(&world, &clock, Arc::clone(&store), "node-a");
    let handled: Arc<Mutex<Vec<String>>> = Arc::default();
    {
        let (handled, clock) = (Arc::clone(&handled), clock.clone());
        engine
            .on(POLLER, move |event: Event, _ctx: HandlerContext| {
                let (handled, clock) = (Arc::clone(&handled), clock.clone());
                async move {
                    lock(&handled).push(event.subject.to_string());
                    // A slow handler: 5 s of virtual time.
                    clock.sleep(Duration::from_secs(5)).await;
                    Ok::<(), HandlerError>(())
                }
            })
            .unwrap();
    }
    engine.start().await.unwrap();
    assert!(run_until(&clock, 60, || !lock(&handled).is_empty()).await);
    engine.stop(StopOptions::default()).await.unwrap();
    assert_eq!(engine.status(), Status::Stopped);
    assert_eq!(
        *lock(&handled),
        ["item-001", "item-002"],
        "the cycle finished"
    );
    assert_eq!(
        store.counts(&key()).await.map(|c| c.pending).unwrap(),
        0,
        "and was acknowledged"
    );
    assert_eq!(store.get_lease(&key()).await.unwrap(), None);
    assert_eq!(alive_tasks(), 0);
}

#[tokio::test(start_paused = true)]
async fn stop_with_drain_aborts_what_outlasts_the_timeout() {
    let (world, clock) = tokio_world(2, 10);
    let store = memory();
    let engine = daemon_engine(&world, &clock, Arc::clone(&store), "node-a");
    let (id, cancel) = stop_while_a_handler_hangs(&engine, &clock, true).await;
    assert!(cancel.is_cancelled(), "the timeout aborted the handler");
    let pending = store.load_pending(&key(), 10).await.unwrap();
    assert_eq!(pending.len(), 2);
    assert_eq!(
        (pending[0].event_id.as_str(), pending[0].attempts),
        (id.as_str(), 0)
    );
    assert_eq!(store.get_lease(&key()).await.unwrap(), None);
    assert_eq!(alive_tasks(), 0);
}

#[tokio::test]
async fn stop_without_start_is_fine() {
    let world = World::new(1, 10).unwrap();
    let engine = timestamp_engine(&world, memory());
    engine.stop(StopOptions::default()).await.unwrap();
    assert_eq!(engine.status(), Status::Stopped);
    engine.stop(StopOptions::default()).await.unwrap();
    assert_eq!(engine.status(), Status::Stopped);
}

/// The id and `ctx.cancel` of the delivery a [`hanging_handler`] holds.
type InFlight = Arc<Mutex<Option<(String, CancellationToken)>>>;

/// A handler that records its delivery in `in_flight`, then hangs until `ctx.cancel` fires.
/// The hour of virtual time only turns an engine that never cancels into a failed assertion
/// instead of a hung test.
fn hanging_handler(
    in_flight: &InFlight,
    clock: &TokioClock,
) -> impl Fn(Event, HandlerContext) -> BoxFuture<'static, Result<(), HandlerError>> + Send + Sync + 'static
{
    let (in_flight, clock) = (Arc::clone(in_flight), clock.clone());
    move |event: Event, ctx: HandlerContext| {
        *lock(&in_flight) = Some((event.id.to_string(), ctx.cancel.clone()));
        let clock = clock.clone();
        Box::pin(async move {
            tokio::select! {
                () = ctx.cancel.cancelled() => Err(HandlerError::transient("cancelled")),
                () = clock.sleep(Duration::from_secs(3_600)) => Ok(()),
            }
        })
    }
}

/// Starts the engine with a [`hanging_handler`], waits for its delivery, stops the engine
/// (`drain` as given, a 30 s timeout) and checks it stopped; returns the id and `ctx.cancel` of
/// the delivery in flight.
async fn stop_while_a_handler_hangs(
    engine: &Engine,
    clock: &TokioClock,
    drain: bool,
) -> (String, CancellationToken) {
    let in_flight = InFlight::default();
    engine
        .on(POLLER, hanging_handler(&in_flight, clock))
        .unwrap();
    engine.start().await.unwrap();
    assert!(run_until(clock, 60, || lock(&in_flight).is_some()).await);
    engine
        .stop(
            StopOptions::default()
                .drain(drain)
                .timeout(Duration::from_secs(30)),
        )
        .await
        .unwrap();
    assert_eq!(engine.status(), Status::Stopped);
    lock(&in_flight).clone().unwrap()
}

#[tokio::test(start_paused = true)]
async fn stop_without_drain_aborts_the_handler_in_flight_and_a_fresh_engine_redelivers_it() {
    let (world, clock) = tokio_world(2, 10);
    let store = memory();
    let (engine, hooks) = hooked_daemon(&world, &clock, Arc::clone(&store));
    let (id, cancel) = stop_while_a_handler_hangs(&engine, &clock, false).await;
    assert!(cancel.is_cancelled(), "the handler's ctx.cancel fired");
    assert_eq!(alive_tasks(), 0, "no engine task outlives stop()");
    assert!(
        hooks.details("lease_lost").is_empty(),
        "a stop is not a lost lease: {:?}",
        hooks.names()
    );
    assert!(hooks.details("delivered").is_empty());
    let pending = store.load_pending(&key(), 10).await.unwrap();
    assert_eq!(
        pending.len(),
        2,
        "the aborted delivery was not acknowledged"
    );
    assert_eq!(pending[0].event_id, id);
    assert_eq!(
        pending[0].attempts, 0,
        "an aborted delivery is not an attempt"
    );
    assert_eq!(
        store.get_lease(&key()).await.unwrap(),
        None,
        "the aborted run released its lease"
    );

    // A fresh engine on the same store delivers it again at once, with the same id.
    let fresh = daemon_engine(&world, &clock, Arc::clone(&store), "node-b");
    let recorder = Recorder::default();
    fresh.on(POLLER, recorder.handler()).unwrap();
    let result = fresh.tick(TickOptions::default()).await.unwrap();
    assert_eq!(result.skipped_leased, 0, "{result:?}");
    let ids = recorder.ids();
    assert_eq!(ids.len(), 2, "{result:?}");
    assert_eq!(ids[0], id);
    assert_eq!(recorder.events()[0].attempt, 1);
    assert_eq!(store.counts(&key()).await.map(|c| c.pending).unwrap(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_lost_lease_cancels_the_handler_in_flight() {
    let (world, clock) = tokio_world(2, 10);
    let inner = memory();
    // Every renewal fails: the lease is lost once it expires (ttl 30 s).
    let faulty = Arc::new(FaultyStore::new(Arc::clone(&inner)));
    faulty.fail(Op::RenewLease, Timing::Before, 1_000);
    let (engine, hooks) = hooked_daemon(&world, &clock, faulty);
    let in_flight = InFlight::default();
    engine
        .on(POLLER, hanging_handler(&in_flight, &clock))
        .unwrap();
    let result = engine.tick(TickOptions::default()).await.unwrap();
    let (id, cancel) = lock(&in_flight).clone().unwrap();
    assert!(
        cancel.is_cancelled(),
        "losing the lease cancels the handler in flight"
    );
    assert_eq!(result.delivered, 0, "{result:?}");
    assert_eq!(hooks.details("lease_lost").len(), 1, "{:?}", hooks.names());
    assert!(hooks.details("delivered").is_empty(), "{:?}", hooks.names());
    let pending = inner.load_pending(&key(), 10).await.unwrap();
    assert_eq!(pending.len(), 2);
    assert_eq!(pending[0].event_id, id);
    assert_eq!(pending[0].attempts, 0);
}

// ----- hooks -----

#[tokio::test]
async fn hooks_follow_the_lifecycle_order_over_several_pages() {
    let world = World::new(5, 2).unwrap();
    let poller = world.poller(StrategyKind::Timestamp).build().unwrap();
    let (engine, hooks) = hooked(&world, poller);
    let _recorder = Recorder::attached(&engine).unwrap();
    world.tick(&engine).await.unwrap();

    // Pages of 2, 2 and 1 items: each fetched, committed, its events observed, then delivered.
    let page = |events: usize| {
        let observed = std::iter::repeat_n("event", events);
        let delivered = std::iter::repeat_n("delivered", events);
        ["fetch", "commit"]
            .into_iter()
            .chain(observed)
            .chain(delivered)
    };
    let expected: Vec<&str> = ["lease_acquired", "poll_start"]
        .into_iter()
        .chain(page(2))
        .chain(page(2))
        .chain(page(1))
        .chain(["schedule_change", "poll_end"])
        .collect();
    assert_eq!(hooks.names(), expected);
    let calls = hooks.calls();
    for call in &calls {
        assert_eq!(call.ctx.lane, Lane::Live, "{call:?}");
        assert_eq!(
            (
                call.ctx.poller.as_str(),
                call.ctx.partition.as_str(),
                call.ctx.instance_id.as_str()
            ),
            (POLLER, "", "node-a"),
            "{call:?}"
        );
    }
    let subjects: Vec<String> = (1..=5).map(|i| format!("item-00{i}")).collect();
    assert_eq!(hooks.details("event"), subjects);
    assert_eq!(hooks.details("delivered"), subjects);
    assert_eq!(hooks.details("lease_acquired"), ["node-a"]);
    assert_eq!(hooks.details("schedule_change"), ["events:speed-up"]);
    assert_eq!(hooks.details("poll_end"), ["items 5"]);
}

/// A page whose every item fails validation is not silent: `on_page_quarantined` fires for it
/// (not for a page with one valid item), the cycle's summary counts the quarantined items, and
/// `inspect` shows them; the items are parked as `invalid`.
#[tokio::test]
async fn a_page_whose_every_item_is_quarantined_is_reported() {
    // 4 items, 2 a page; every item fails but item-003, so page 1 is all quarantined and page 2
    // is not.
    let world = World::new(4, 2).unwrap();
    let poller = world
        .poller(StrategyKind::Timestamp)
        .check(|item: &Value| {
            if item["id"] == "item-003" {
                Ok(())
            } else {
                Err(vec![ValidationIssue {
                    message: "wrong type".into(),
                    path: None,
                }])
            }
        })
        .build()
        .unwrap();
    let (engine, hooks) = hooked(&world, poller);
    world.tick(&engine).await.unwrap();
    assert_eq!(hooks.details("page_quarantined"), ["page 1: 2 items"]);
    let key = only(&engine).await;
    let last = key.last_poll.expect("a poll");
    assert_eq!((last.items, last.quarantined), (4, 3), "{last:?}");
    let parked = engine
        .list_parked(POLLER, None, ParkedQuery::default())
        .await
        .unwrap();
    assert_eq!(parked.len(), 3);
}

#[tokio::test]
async fn on_error_reports_the_fetch_phase_and_on_invalid_a_quarantined_item() {
    let world = World::new(3, 10).unwrap();
    let poller = world
        .poller(StrategyKind::Timestamp)
        .check(reject("item-002"))
        .build()
        .unwrap();
    let (engine, hooks) = hooked(&world, poller);
    let recorder = Recorder::attached(&engine).unwrap();

    world.api.fail_next(Fault::http(500), 1);
    let result = world.tick(&engine).await.unwrap();
    assert_eq!(
        result.polled[0].error.as_ref().and_then(|e| e.status),
        Some(500)
    );
    assert_eq!(
        hooks.names(),
        [
            "lease_acquired",
            "poll_start",
            "error",
            "schedule_change",
            "poll_end"
        ]
    );
    assert_eq!(hooks.details("error"), ["fetch 500"]);
    assert_eq!(hooks.details("schedule_change"), ["backoff"]);
    assert!(hooks.calls().iter().all(|c| c.ctx.lane == Lane::Live));

    hooks.clear();
    world.advance(Duration::from_secs(60));
    world.tick(&engine).await.unwrap();
    // The engine takes the key's lease again, but it held the key last: no `lease_acquired`.
    assert_eq!(
        hooks.names(),
        [
            "poll_start",
            "fetch",
            "commit",
            "event",
            "event",
            "invalid",
            "delivered",
            "delivered",
            "schedule_change",
            "poll_end",
        ]
    );
    assert_eq!(hooks.details("invalid"), ["item-002: item-002 is broken"]);
    let parked = engine
        .list_parked(POLLER, None, ParkedQuery::default())
        .await
        .unwrap();
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].kind, ParkedKind::Invalid);
    assert_eq!(
        parked[0].item.as_ref().map(|i| i.to_value()["id"].clone()),
        Some(json!("item-002"))
    );
    assert_eq!(
        types_and_subjects(&recorder.events()),
        [
            (EventType::Created, "item-001".to_owned()),
            (EventType::Created, "item-003".to_owned()),
        ]
    );
}

// ----- builder validation -----

#[test]
fn engine_builder_options_are_validated() {
    let world = World::new(1, 10).unwrap();
    let poller = || world.poller(StrategyKind::Timestamp).build().unwrap();

    let error = world
        .engine_builder(memory(), "node-a", poller(), 1)
        .poller(poller())
        .build()
        .unwrap_err();
    assert!(error.to_string().contains("duplicate"), "{error}");
    assert_eq!(option_of(error), "pollers");

    for renew in [30, 31] {
        let error = world
            .engine_builder(memory(), "node-a", poller(), 1)
            .lease(Duration::from_secs(30), Some(Duration::from_secs(renew)))
            .build()
            .unwrap_err();
        assert_eq!(option_of(error), "lease.renew_every", "renew {renew}s");
    }
    world
        .engine_builder(memory(), "node-a", poller(), 1)
        .lease(Duration::from_secs(30), Some(Duration::from_secs(29)))
        .build()
        .unwrap();

    let error = world
        .engine_builder(memory(), "node-a", poller(), 1)
        .dispatch_batch_size(0)
        .build()
        .unwrap_err();
    assert_eq!(option_of(error), "dispatch_batch_size");
}

fn empty_fetch(_ctx: FetchContext) -> futures::future::Ready<std::result::Result<Page, BoxError>> {
    futures::future::ready(Ok(Page::new(Vec::new())))
}

/// A valid poller builder but for what the test removes.
fn complete(name: &str) -> PollerBuilder<Value> {
    Poller::builder::<Value>(name)
        .identity_field("id")
        .cursor(cursor::page(1))
        .fetch(empty_fetch)
}

#[test]
fn poller_options_are_validated_at_build() {
    complete("orders.v2_eu-1").build().unwrap();
    for name in [
        String::new(),
        "-leading-dash".to_owned(),
        "has space".to_owned(),
        "slash/name".to_owned(),
        "x".repeat(129),
    ] {
        let error = complete(&name).build().unwrap_err();
        assert_eq!(option_of(error), "name", "{name:?}");
    }

    let no_cursor = Poller::builder::<Value>("p")
        .identity_field("id")
        .fetch(empty_fetch);
    assert_eq!(option_of(no_cursor.build().unwrap_err()), "cursor");

    let no_fetch = Poller::builder::<Value>("p")
        .identity_field("id")
        .cursor(cursor::page(1));
    assert_eq!(option_of(no_fetch.build().unwrap_err()), "fetch");

    let no_identity = Poller::builder::<Value>("p")
        .cursor(cursor::page(1))
        .fetch(empty_fetch);
    assert_eq!(option_of(no_identity.build().unwrap_err()), "identity");

    let error = complete("p").schema_version(0).build().unwrap_err();
    assert_eq!(option_of(error), "schema_version");

    let error = complete("p").max_pages_per_cycle(0).build().unwrap_err();
    assert_eq!(option_of(error), "max_pages_per_cycle");
}

/// `TickOptions::concurrency` bounds the keys a tick runs at once: eight partitions whose
/// fetches stay in flight until every started one has yielded show at most that many at once,
/// and `0` is a `Config` error naming the option.
#[tokio::test]
async fn tick_runs_as_many_keys_at_once_as_asked() {
    use std::sync::atomic::{AtomicUsize, Ordering};

    let in_flight = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let poller = Poller::builder::<Value>("tenants")
        .identity(|item: &Value| item["id"].as_str().unwrap_or_default().to_owned())
        .cursor(cursor::snapshot_diff())
        .schedule(ScheduleOptions::default().jitter(0.0))
        .fetch({
            let (in_flight, most) = (Arc::clone(&in_flight), Arc::clone(&most));
            move |_ctx: FetchContext| {
                let (in_flight, most) = (Arc::clone(&in_flight), Arc::clone(&most));
                async move {
                    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    // Let every other started fetch run before this one ends.
                    for _ in 0..16 {
                        tokio::task::yield_now().await;
                    }
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    Ok::<_, BoxError>(Page::default())
                }
            }
        })
        .partitions(
            || async {
                Ok::<_, BoxError>((0..8).map(|n| Partition::new(format!("p{n}"))).collect())
            },
            Duration::from_secs(60),
        )
        .build()
        .unwrap();
    let clock = ManualClock::new(T0);
    let engine = Engine::builder(Arc::new(MemoryStore::new()))
        .poller(poller)
        .clock(Arc::new(clock.clone()))
        .build()
        .unwrap();
    for (asked, expected) in [(None, 4), (Some(1), 1), (Some(8), 8)] {
        most.store(0, Ordering::SeqCst);
        let options = match asked {
            Some(n) => TickOptions::default().concurrency(n),
            None => TickOptions::default(),
        };
        let result = engine.tick(options).await.unwrap();
        assert_eq!(result.polled.len(), 8, "asked {asked:?}: {result:?}");
        assert_eq!(most.load(Ordering::SeqCst), expected, "asked {asked:?}");
        clock.advance(Duration::from_secs(3_600));
    }
    let err = engine
        .tick(TickOptions::default().concurrency(0))
        .await
        .unwrap_err();
    assert_eq!(err.config_option(), Some("tick.concurrency"), "{err}");
}

/// A poller of `n` partitions (`p0`…, polled at most every minute) whose fetch counts the
/// fetches in flight (`most` keeps the highest count) and per partition, each staying in flight
/// for `hold` of the clock.
fn counted_tenants(
    n: usize,
    hold: Duration,
    clock: &TokioClock,
    in_flight: &Arc<std::sync::atomic::AtomicUsize>,
    most: &Arc<std::sync::atomic::AtomicUsize>,
    fetched: &Arc<Mutex<HashMap<String, usize>>>,
) -> Poller {
    use std::sync::atomic::Ordering;
    let (clock, in_flight, most, fetched) = (
        clock.clone(),
        Arc::clone(in_flight),
        Arc::clone(most),
        Arc::clone(fetched),
    );
    Poller::builder::<Value>("tenants")
        .identity(|item: &Value| item["id"].as_str().unwrap_or_default().to_owned())
        .cursor(cursor::snapshot_diff())
        .schedule(
            ScheduleOptions::default()
                .min(Duration::from_secs(60))
                .max(Duration::from_secs(600))
                .jitter(0.0),
        )
        .fetch(move |ctx: FetchContext| {
            let (clock, in_flight, most, fetched) = (
                clock.clone(),
                Arc::clone(&in_flight),
                Arc::clone(&most),
                Arc::clone(&fetched),
            );
            async move {
                *lock(&fetched).entry(ctx.partition.key.clone()).or_default() += 1;
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                clock.sleep(hold).await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, BoxError>(Page::default())
            }
        })
        .partitions(
            move || async move {
                Ok::<_, BoxError>((0..n).map(|i| Partition::new(format!("p{i}"))).collect())
            },
            Duration::from_secs(3_600),
        )
        .build()
        .unwrap()
}

/// A daemon on tokio's paused clock running 12 [`counted_tenants`] (each fetch in flight for
/// `hold`), `max` keys at once, started: the engine, its clock, the most fetches seen in flight
/// at once, and the fetches per partition.
#[allow(clippy::type_complexity)]
async fn tenant_daemon(
    store: Arc<dyn Store>,
    hold: Duration,
    max: usize,
) -> (
    Engine,
    TokioClock,
    Arc<std::sync::atomic::AtomicUsize>,
    Arc<Mutex<HashMap<String, usize>>>,
) {
    use std::sync::atomic::AtomicUsize;
    let clock = TokioClock::starting_at(T0);
    let (in_flight, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let fetched = Arc::new(Mutex::new(HashMap::new()));
    let engine = Engine::builder(store)
        .poller(counted_tenants(
            12, hold, &clock, &in_flight, &most, &fetched,
        ))
        .clock(Arc::new(clock.clone()))
        .rng(Arc::new(SeededRng::new(5)))
        .max_concurrent_keys(max)
        .build()
        .unwrap();
    engine.start().await.unwrap();
    (engine, clock, most, fetched)
}

/// The daemon runs at most `max_concurrent_keys` keys at once, and every partition gets its
/// turn; a trigger of one tenant wakes that tenant alone: it is polled at once, and the daemon
/// reads no other key's state for it.
#[tokio::test(start_paused = true)]
async fn the_daemon_runs_a_bounded_number_of_keys_and_a_trigger_wakes_one() {
    use std::sync::atomic::Ordering;
    let store = Arc::new(FaultyStore::new(Arc::new(MemoryStore::new())));
    let (engine, clock, most, fetched) =
        tenant_daemon(store.clone(), Duration::from_secs(1), 3).await;
    assert!(run_until(&clock, 60, || lock(&fetched).len() == 12).await);
    assert_eq!(most.load(Ordering::SeqCst), 3, "keys in flight at once");
    // Idle until every key's first run is over and none is due (min interval 60 s).
    clock.sleep(Duration::from_secs(10)).await;
    let reads = store.calls(Op::LoadState);
    let polls = lock(&fetched).clone();
    engine.trigger("tenants", Some("p7")).await.unwrap();
    assert!(run_until(&clock, 5, || lock(&fetched)["p7"] == polls["p7"] + 1).await);
    let others: usize = lock(&fetched)
        .iter()
        .filter(|(k, _)| *k != "p7")
        .map(|(_, n)| n)
        .sum();
    assert_eq!(
        others,
        polls.values().sum::<usize>() - polls["p7"],
        "only p7 was polled"
    );
    let read = store.calls(Op::LoadState) - reads;
    assert!(
        read <= 4,
        "the trigger made the daemon read {read} states (of 12 keys)"
    );
    engine.stop(StopOptions::default()).await.unwrap();

    let zero = Engine::builder(memory())
        .max_concurrent_keys(0)
        .build()
        .unwrap_err();
    assert_eq!(option_of(zero), "max_concurrent_keys");
}

/// A daemon behind its schedule (12 tenants due every minute, one at a time, 10 s per poll:
/// a round takes two minutes) serves a trigger next: the triggered tenant, which just ran and is
/// otherwise due behind every other one, is polled as soon as the poll in flight ends.
#[tokio::test(start_paused = true)]
async fn a_trigger_goes_before_the_backlog() {
    let (engine, clock, _, fetched) = tenant_daemon(memory(), Duration::from_secs(10), 1).await;
    // Two minutes in, every tenant ran once and the daemon works through an overdue backlog
    // (the last one's poll started; 15 s later it ended and the next one is in flight).
    assert!(run_until(&clock, 200, || lock(&fetched).len() == 12).await);
    clock.sleep(Duration::from_secs(15)).await;
    let polls = lock(&fetched).clone();
    let total: usize = polls.values().sum();
    // The tenant polled last (not in flight: a trigger during a run is overwritten by the run's
    // own schedule): the latest due of all.
    let last = polls
        .iter()
        .min_by_key(|(k, n)| (**n, std::cmp::Reverse((*k).clone())))
        .map(|(k, _)| k.clone())
        .unwrap();
    let before = polls[&last];
    engine.trigger("tenants", Some(&last)).await.unwrap();
    // The poll in flight ends within 10 s, then the triggered tenant runs (10 s more at most).
    assert!(
        run_until(&clock, 21, || lock(&fetched)[&last] > before).await,
        "the triggered tenant {last} waited behind the backlog: before {polls:?}, after {:?}",
        lock(&fetched)
    );
    let after = lock(&fetched).clone();
    let others = after.values().sum::<usize>() - after[&last];
    assert!(
        others <= total - before + 1,
        "at most the poll in flight ran before the trigger: {others} vs {total}"
    );
    engine.stop(StopOptions::default()).await.unwrap();
}
