//! The lanes and the live schedule driven through the engine against the
//! [`FakeApi`](watukuy_testkit::FakeApi), on the store under test: the pinned
//! AIMD sequence, a 429's Retry-After, the circuit through an outage, reconcile deletes, a forced
//! backfill, a failing backfill's lane backoff, replay with the original ids, and log retention.
//!
//! Everything runs on the world's manual clock with fixed seeds and a handful of ticks, so the
//! cases are deterministic and cheap on every backend. (`core/tests/lanes.rs` keeps what
//! these do not cover: a page-capped reconcile, the daemon, backfill targets and config errors.)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use watukuy_core::BackfillOptions;
use watukuy_core::cursor::Cursor;
use watukuy_core::hooks::{HookContext, Hooks};
use watukuy_core::schedule::{CircuitOptions, ScheduleOptions, ScheduleReason};
use watukuy_core::{
    BoxError, Engine, Event, EventType, FetchContext, Lane, Page, Poller, TickResult,
    clock::Clock,
    store::{Circuit, LaneCursor, Lanes, LogQuery, LoggedEvent},
};

use crate::harness::{CaseError, CaseResult, Env};
use crate::{check, check_eq};
use watukuy_testkit::world::{POLLER, Recorder, StrategyKind, World, key, lock};
use watukuy_testkit::{FakeApiError, Fault};

// ----- helpers -----

fn world(items: usize, page_size: usize) -> Result<World, CaseError> {
    World::new(items, page_size)
        .map_err(|e| CaseError::failed(format!("cannot build the fake API: {e}")))
}

fn api_error(error: FakeApiError) -> CaseError {
    CaseError::failed(format!("fake API: {error}"))
}

/// `ms` milliseconds as a duration (nothing for a negative wait).
fn ms(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// An engine on the case's store with the world's clock, a fixed seed and optional hooks, with
/// a recording handler attached.
fn engine(
    w: &World,
    env: &Env,
    poller: Poller,
    hooks: Option<Arc<dyn Hooks>>,
) -> Result<(Engine, Recorder), CaseError> {
    let mut builder = w.engine_builder(Arc::clone(&env.store), "node-a", poller, 7);
    if let Some(hooks) = hooks {
        builder = builder.hooks(hooks);
    }
    let engine = builder.build()?;
    let recorder = Recorder::attached(&engine)?;
    Ok((engine, recorder))
}

/// A timestamp poller over three items with [`pinned_schedule`], on an [`engine`] whose schedule
/// changes go to the returned [`ScheduleLog`].
fn scheduled(env: &Env) -> Result<(World, Engine, Recorder, Arc<ScheduleLog>), CaseError> {
    let w = world(3, 10)?;
    let hooks = Arc::new(ScheduleLog::default());
    let poller = w
        .poller(StrategyKind::Timestamp)
        .schedule(pinned_schedule())
        .build()?;
    let (engine, recorder) = engine(&w, env, poller, Some(hooks.clone()))?;
    Ok((w, engine, recorder, hooks))
}

/// A timestamp poller over three items that logs its events for an hour, on an [`engine`].
fn logged(env: &Env) -> Result<(World, Engine, Recorder), CaseError> {
    let w = world(3, 10)?;
    let poller = w
        .poller(StrategyKind::Timestamp)
        .log(Duration::from_secs(3_600))
        .build()?;
    let (engine, recorder) = engine(&w, env, poller, None)?;
    Ok((w, engine, recorder))
}

/// Changes item `id` in the fake API (`change` is merged into it).
fn update(w: &World, id: &str, change: Value) -> CaseResult {
    w.api.update(id, change).map_err(api_error)?;
    Ok(())
}

/// The one `(poller, partition)` the engine reports.
async fn only(engine: &Engine) -> Result<watukuy_core::ops::KeyInspect, CaseError> {
    let report = engine.inspect().await?;
    check_eq!(report.pollers.len(), 1, "{report:?}");
    report
        .pollers
        .into_iter()
        .next()
        .map(|p| p.key)
        .ok_or_else(|| CaseError::failed("inspect reports no poller"))
}

/// The lanes as the store persisted them.
async fn lanes(env: &Env) -> Result<Lanes, CaseError> {
    env.store
        .load_state(&key())
        .await?
        .map(|state| state.lanes)
        .ok_or_else(|| CaseError::failed("the key has no stored state"))
}

async fn backfill_lane(env: &Env) -> Result<LaneCursor, CaseError> {
    lanes(env)
        .await?
        .backfill
        .ok_or_else(|| CaseError::failed("the stored state has no backfill lane"))
}

/// The whole log of the key, as the store reads it.
async fn read_log(env: &Env) -> Result<Vec<LoggedEvent>, CaseError> {
    Ok(env.store.read_log(&key(), LogQuery::default(), 100).await?)
}

/// Requests the fake API answered on a route (`/page`, `/token`, `/since`).
fn calls_to(w: &World, route: &str) -> usize {
    w.api.log().iter().filter(|e| e.route == route).count()
}

/// The lane of every cycle a tick ran, in order.
fn lanes_of(result: &TickResult) -> Vec<Lane> {
    result.polled.iter().map(|p| p.lane).collect()
}

/// One tick that must not fail any cycle.
async fn clean_tick(w: &World, engine: &Engine) -> Result<TickResult, CaseError> {
    let result = w.tick(engine).await?;
    check!(
        result.polled.iter().all(|p| p.error.is_none()),
        "a cycle failed unexpectedly: {result:?}"
    );
    Ok(result)
}

/// The HTTP status the first cycle of a tick failed with.
fn status_of(result: &TickResult) -> Option<u16> {
    result
        .polled
        .first()
        .and_then(|p| p.error.as_ref())
        .and_then(|e| e.status)
}

/// The events after the first `n` (none if there are fewer).
fn after_first(events: &[Event], n: usize) -> &[Event] {
    events.get(n..).unwrap_or_default()
}

fn data_of(event: &Event) -> Value {
    event.data.as_ref().map_or(Value::Null, |d| d.to_value())
}

/// `(type, subject, lane)` of each event.
fn summary(events: &[Event]) -> Vec<(EventType, String, Lane)> {
    events
        .iter()
        .map(|e| (e.event_type, e.subject.to_string(), e.lane))
        .collect()
}

/// Schedule `min 5 s, max 40 s, jitter 0` (the AIMD example both implementations pin), default
/// backoff.
fn pinned_schedule() -> ScheduleOptions {
    ScheduleOptions::default()
        .min(Duration::from_secs(5))
        .max(Duration::from_secs(40))
        .jitter(0.0)
}

/// The largest full-jitter backoff after `failures` failures with the default backoff (1 s × 2,
/// at most 10 min).
fn backoff_cap_ms(failures: u32) -> i64 {
    (1_000_i64 << failures.saturating_sub(1).min(20)).min(600_000)
}

/// Records schedule changes (with the lane that made them) and circuit transitions.
#[derive(Default)]
struct ScheduleLog {
    changes: Mutex<Vec<(Lane, i64, i64, ScheduleReason)>>,
    opened: Mutex<Vec<(u32, i64)>>,
    closed: Mutex<usize>,
}

impl ScheduleLog {
    /// `(interval, reason)` of every change so far; fails if a lane other than live changed
    /// the schedule.
    fn changes(&self) -> Result<Vec<(i64, i64, ScheduleReason)>, CaseError> {
        let changes = lock(&self.changes).clone();
        check!(
            changes.iter().all(|c| c.0 == Lane::Live),
            "only the live lane drives the schedule: {changes:?}"
        );
        Ok(changes.into_iter().map(|c| (c.1, c.2, c.3)).collect())
    }

    fn reasons(&self) -> Result<Vec<ScheduleReason>, CaseError> {
        Ok(self.changes()?.into_iter().map(|c| c.2).collect())
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
        lock(&self.changes).push((ctx.lane, interval_ms, next_due_at, reason));
    }

    async fn on_circuit_open(&self, _ctx: &HookContext, failures: u32, probe_at: i64) {
        lock(&self.opened).push((failures, probe_at));
    }

    async fn on_circuit_close(&self, _ctx: &HookContext) {
        *lock(&self.closed) += 1;
    }
}

/// Advances to the key's `next_due_at` and ticks there, after checking that a tick 1 ms earlier
/// runs nothing and sends no request. Returns the due tick's result.
async fn tick_when_due(w: &World, engine: &Engine) -> Result<TickResult, CaseError> {
    let before = only(engine).await?.schedule;
    let due = before
        .next_due_at
        .ok_or_else(|| CaseError::failed(format!("no next_due_at: {before:?}")))?;
    let calls = w.api.calls();
    if due - 1 > w.now() {
        w.advance(ms(due - 1 - w.now()));
        let early = w.tick(engine).await?;
        check_eq!(
            (early.polled.len(), early.skipped_not_due),
            (0, 1),
            "not due 1 ms before {due}: {early:?}"
        );
        check_eq!(w.api.calls(), calls, "no request before the key is due");
    }
    w.advance(ms(due - w.now()));
    let result = w.tick(engine).await?;
    check_eq!(
        w.api.calls(),
        calls + 1,
        "exactly one request when due at {due}: {result:?}"
    );
    Ok(result)
}

// ----- the live schedule -----

/// One live cycle exactly when the key is due (see [`tick_when_due`]): it must run the live lane
/// alone and succeed, and with jitter 0 the next wait is the interval. Returns the interval.
async fn live_interval_when_due(w: &World, engine: &Engine) -> Result<i64, CaseError> {
    let result = tick_when_due(w, engine).await?;
    check_eq!(lanes_of(&result), [Lane::Live], "{result:?}");
    check!(
        result.polled.iter().all(|p| p.error.is_none()),
        "{result:?}"
    );
    let schedule = only(engine).await?.schedule;
    let interval = schedule
        .interval_ms
        .ok_or_else(|| CaseError::failed("no interval after a cycle"))?;
    check_eq!(
        schedule.next_due_at,
        Some(w.now() + interval),
        "jitter 0: the wait is the interval"
    );
    Ok(interval)
}

/// AIMD: with `min 5 s, max 40 s, jitter 0`, the live interval goes 5 s (events,
/// halved but never below min) → 7.5 s → 11.25 s (idle, × 1.5) → 5.625 s (events, halved); each
/// cycle runs exactly when due, and the schedule hook reports each change with its reason. Idle
/// from there on, it grows (rounded) up to max and stays there.
pub async fn aimd_sequence(env: Env) -> CaseResult {
    let (w, engine, recorder, hooks) = scheduled(&env)?;
    check_eq!(only(&engine).await?.schedule.interval_ms, Some(5_000));

    let mut intervals = Vec::new();
    for step in 0..4 {
        if step == 3 {
            update(&w, "item-001", json!({ "value": 10 }))?;
        }
        intervals.push(live_interval_when_due(&w, &engine).await?);
    }
    check_eq!(intervals, [5_000, 7_500, 11_250, 5_625]);
    let changes = hooks.changes()?;
    check_eq!(
        changes.iter().map(|c| (c.0, c.2)).collect::<Vec<_>>(),
        [
            (5_000, ScheduleReason::EventsSpeedUp),
            (7_500, ScheduleReason::IdleBackOff),
            (11_250, ScheduleReason::IdleBackOff),
            (5_625, ScheduleReason::EventsSpeedUp),
        ]
    );
    check_eq!(
        changes.last().map(|c| c.1),
        Some(w.now() + 5_625),
        "the hook reports the next due time"
    );

    let mut grown = Vec::new();
    for _ in 0..6 {
        grown.push(live_interval_when_due(&w, &engine).await?);
    }
    check_eq!(
        grown,
        [8_438, 12_657, 18_986, 28_479, 40_000, 40_000],
        "idle: × 1.5 (rounded) up to max, then max"
    );
    check_eq!(recorder.ids().len(), 4, "3 created, 1 updated");
    Ok(())
}

/// Throttling: a 429 with Retry-After 12 s makes the key due exactly 12 s later (not
/// at 11.999 s) and records `throttled_until`, without counting as a failure (an earlier 500's
/// count is left alone); the next success clears the failures and the throttle.
pub async fn throttle_waits_exactly_retry_after(env: Env) -> CaseResult {
    let (w, engine, recorder, hooks) = scheduled(&env)?;
    clean_tick(&w, &engine).await?;
    check_eq!(recorder.ids().len(), 3);

    // One ordinary failure first, so "left alone" is visible: the count stays at 1.
    w.api.fail_next(Fault::http(500), 1);
    w.api.fail_next(Fault::http_retry_after(429, 12_000), 1);
    let result = tick_when_due(&w, &engine).await?;
    check_eq!(status_of(&result), Some(500), "{result:?}");
    check_eq!(only(&engine).await?.schedule.consecutive_failures, 1);

    hooks.clear();
    let result = tick_when_due(&w, &engine).await?;
    check_eq!(status_of(&result), Some(429), "{result:?}");
    let throttled_at = w.now();
    let throttled = only(&engine).await?.schedule;
    check_eq!(
        (throttled.next_due_at, throttled.throttled_until),
        (Some(throttled_at + 12_000), Some(throttled_at + 12_000))
    );
    check_eq!(
        (throttled.consecutive_failures, throttled.circuit),
        (1, Circuit::Closed),
        "a throttle is not a failure"
    );
    check_eq!(hooks.reasons()?, [ScheduleReason::Throttled]);

    // Not due at +11.999 s, due at exactly +12 s.
    let result = tick_when_due(&w, &engine).await?;
    check!(
        result.polled.iter().all(|p| p.error.is_none()),
        "{result:?}"
    );
    check_eq!(w.now(), throttled_at + 12_000);
    let recovered = only(&engine).await?.schedule;
    check_eq!(
        (
            recovered.consecutive_failures,
            recovered.circuit,
            recovered.throttled_until
        ),
        (0, Circuit::Closed, None)
    );
    Ok(())
}

/// Backoff and circuit: API failures back the key off (full jitter within the cap),
/// the third consecutive failure opens the circuit (hook with the probe time), an open circuit
/// sends nothing but a probe every `probe_every`, a failed probe keeps it open (twice, the time
/// it opened unchanged), a successful one closes it; every change made during the outage is
/// delivered afterwards, once per item with its latest state.
pub async fn circuit_opens_probes_and_closes(env: Env) -> CaseResult {
    let w = world(3, 10)?;
    let hooks = Arc::new(ScheduleLog::default());
    let poller = w
        .poller(StrategyKind::Timestamp)
        .schedule(pinned_schedule())
        .circuit(
            CircuitOptions::default()
                .failures(3)
                .probe_every(Duration::from_secs(60)),
        )
        .build()?;
    let (engine, recorder) = engine(&w, &env, poller, Some(hooks.clone()))?;
    clean_tick(&w, &engine).await?;
    check_eq!(recorder.ids().len(), 3);
    hooks.clear();

    // Five failing requests: two backoffs, the third opens the circuit, the first two probes
    // fail, the third probe succeeds.
    w.api.fail_next(Fault::http(500), 5);
    let (mut at, mut statuses, mut after) = (Vec::new(), Vec::new(), Vec::new());
    for request in 0..6 {
        let result = tick_when_due(&w, &engine).await?;
        at.push(w.now());
        statuses.push(status_of(&result));
        after.push(only(&engine).await?.schedule);
        // Changes keep happening during the outage.
        match request {
            0 => drop(
                w.api
                    .add(json!({ "id": "new-1", "name": "New 1", "value": 100 }))
                    .map_err(api_error)?,
            ),
            3 => drop(
                w.api
                    .update("item-002", json!({ "value": 20 }))
                    .map_err(api_error)?,
            ),
            4 => {
                drop(
                    w.api
                        .add(json!({ "id": "new-2", "name": "New 2", "value": 200 }))
                        .map_err(api_error)?,
                );
                update(&w, "item-002", json!({ "value": 21 }))?;
            }
            _ => {}
        }
        if request < 5 {
            check_eq!(
                recorder.ids().len(),
                3,
                "nothing is delivered during the outage"
            );
        }
    }
    check_eq!(
        statuses,
        [Some(500), Some(500), Some(500), Some(500), Some(500), None],
        "failures, then the successful probe"
    );
    check_eq!(
        hooks.reasons()?,
        [
            ScheduleReason::Backoff,
            ScheduleReason::Backoff,
            ScheduleReason::CircuitOpen,
            ScheduleReason::ProbeFailed,
            ScheduleReason::ProbeFailed,
            ScheduleReason::EventsSpeedUp,
        ]
    );
    for (i, failures) in [(0_usize, 1_u32), (1, 2)] {
        let state = &after[i];
        check_eq!(
            (state.consecutive_failures, state.circuit),
            (failures, Circuit::Closed),
            "{state:?}"
        );
        let delay = state.next_due_at.unwrap_or(i64::MIN) - at[i];
        check!(
            (0..=backoff_cap_ms(failures)).contains(&delay),
            "backoff after failure {failures}: {delay} ms"
        );
    }
    let opened_at = at[2];
    check_eq!(
        (
            after[2].circuit,
            after[2].consecutive_failures,
            after[2].circuit_opened_at,
            after[2].next_due_at
        ),
        (Circuit::Open, 3, Some(opened_at), Some(opened_at + 60_000)),
        "the third failure opens the circuit; the probe is `probe_every` later"
    );
    check_eq!(*lock(&hooks.opened), [(3, opened_at + 60_000)]);
    check_eq!(
        (at[3], at[4], at[5]),
        (opened_at + 60_000, opened_at + 120_000, opened_at + 180_000),
        "only probes, `probe_every` apart"
    );
    for (state, failures) in after[3..5].iter().zip([4, 5]) {
        check_eq!(
            (
                state.circuit,
                state.consecutive_failures,
                state.circuit_opened_at
            ),
            (Circuit::Open, failures, Some(opened_at)),
            "a failed probe keeps the circuit open"
        );
    }
    check_eq!(
        (
            after[5].circuit,
            after[5].consecutive_failures,
            after[5].last_error.clone()
        ),
        (Circuit::Closed, 0, None),
        "a successful probe closes the circuit"
    );
    check_eq!(lock(&hooks.opened).len(), 1, "the circuit opened once");
    check_eq!(*lock(&hooks.closed), 1);

    // Nothing was lost: one event per changed item, with its latest state.
    let events = recorder.events();
    let mut late: Vec<(String, EventType, Value)> = after_first(&events, 3)
        .iter()
        .map(|e| {
            (
                e.subject.to_string(),
                e.event_type,
                data_of(e)["value"].clone(),
            )
        })
        .collect();
    late.sort_by(|a, b| a.0.cmp(&b.0));
    check_eq!(
        late,
        [
            ("item-002".to_owned(), EventType::Updated, json!(21)),
            ("new-1".to_owned(), EventType::Created, json!(100)),
            ("new-2".to_owned(), EventType::Created, json!(200)),
        ],
        "{:?}",
        summary(&events)
    );
    Ok(())
}

// ----- reconcile -----

/// Reconcile: a `token` cursor cannot see deletes; the reconcile lane lists
/// everything through its own fetch at once, then not before `every` has elapsed since its last
/// complete listing, and reports the deleted item exactly once, as `deleted` on the reconcile
/// lane, once a second listing of several pages confirmed it missing (the suspect is kept in
/// the lane's state between the two); the lane's `last_run_at` and `done` are persisted.
pub async fn reconcile_finds_deletes(env: Env) -> CaseResult {
    let w = world(5, 2)?;
    // What the reconcile's fetch was asked for: `(lane, cursor)` per call.
    let asked: Arc<Mutex<Vec<(Lane, Cursor)>>> = Arc::default();
    let poller = w
        .poller(StrategyKind::Token)
        .reconcile(Duration::from_secs(60), {
            let (api, asked) = (w.api.clone(), Arc::clone(&asked));
            move |ctx: FetchContext| {
                let api = api.clone();
                lock(&asked).push((ctx.lane, ctx.cursor.clone()));
                async move { api.fetch_page(&ctx).await }
            }
        })
        .build()?;
    let (engine, recorder) = engine(&w, &env, poller, None)?;
    let t0 = w.now();
    let pages = |pages: &[u32]| -> Vec<(Lane, Cursor)> {
        pages
            .iter()
            .map(|page| (Lane::Reconcile, Cursor::Page { page: *page }))
            .collect()
    };

    // The first run: the live lane creates everything, then the reconcile lists 3 pages through
    // its own fetch, page cursors from 1, and finds nothing to delete.
    let result = clean_tick(&w, &engine).await?;
    check_eq!(lanes_of(&result), [Lane::Live, Lane::Reconcile]);
    check_eq!(*lock(&asked), pages(&[1, 2, 3]));
    check_eq!(
        only(&engine).await?.cursors.reconcile,
        None,
        "a complete listing leaves no reconcile cursor"
    );
    let created = recorder.events();
    check!(
        created.len() == 5
            && created
                .iter()
                .all(|e| e.event_type == EventType::Created && e.lane == Lane::Live),
        "{:?}",
        summary(&created)
    );
    check_eq!(calls_to(&w, "/page"), 3);
    let reconcile = lanes(&env).await?.reconcile;
    check_eq!(
        reconcile.map(|r| (r.last_run_at, r.done, r.cursor)),
        Some((Some(t0), Some(true), None))
    );

    // item-003 disappears; 1 ms before `every` the live lane runs but cannot tell, and the
    // reconcile does not run.
    check!(w.api.remove("item-003"));
    w.advance(ms(59_999));
    let result = clean_tick(&w, &engine).await?;
    check_eq!(lanes_of(&result), [Lane::Live], "{result:?}");
    check_eq!(calls_to(&w, "/page"), 3, "the reconcile waits `every`");
    check_eq!(recorder.ids().len(), 5, "no delete from the live lane");

    // At `every`: the listing of 2 pages misses item-003, which becomes a suspect
    // (`DeleteConfirmation::NextListing`): nothing is reported yet.
    w.advance(ms(1));
    let result = clean_tick(&w, &engine).await?;
    check!(lanes_of(&result).contains(&Lane::Reconcile), "{result:?}");
    check_eq!(calls_to(&w, "/page"), 3 + 2, "4 items: 2 pages");
    check_eq!(
        *lock(&asked),
        pages(&[1, 2, 3, 1, 2]),
        "every listing starts again at page 1"
    );
    check_eq!(recorder.ids().len(), 5, "a suspect is not a delete");
    check_eq!(
        lanes(&env).await?.reconcile.and_then(|r| r.suspects),
        Some(vec!["item-003".to_owned()])
    );

    // `every` later the next listing misses it again: exactly one delete, from the reconcile
    // lane, and the suspect is gone.
    w.advance(Duration::from_secs(60));
    let result = clean_tick(&w, &engine).await?;
    check!(lanes_of(&result).contains(&Lane::Reconcile), "{result:?}");
    check_eq!(calls_to(&w, "/page"), 3 + 2 + 2);
    check_eq!(lanes(&env).await?.reconcile.and_then(|r| r.suspects), None);
    let events = recorder.events();
    check_eq!(
        summary(after_first(&events, 5)),
        [(EventType::Deleted, "item-003".to_owned(), Lane::Reconcile)]
    );
    check_eq!(
        events.get(5).map(|e| (e.sequence, e.data.is_none())),
        Some((6, true)),
        "a fresh sequence; retain `hash` keeps no payload"
    );
    check_eq!(only(&engine).await?.items, 4);
    let reconcile = lanes(&env).await?.reconcile;
    check_eq!(
        reconcile.map(|r| (r.last_run_at, r.done)),
        Some((Some(t0 + 120_000), Some(true)))
    );

    // The next listing, `every` later, finds nothing more to delete.
    w.advance(Duration::from_secs(60));
    let result = clean_tick(&w, &engine).await?;
    check!(lanes_of(&result).contains(&Lane::Reconcile), "{result:?}");
    check_eq!(recorder.ids().len(), 6, "a deleted item is deleted once");
    Ok(())
}

// ----- backfill -----

/// Backfill: a forced backfill persists its lane (target = the live cursor at the
/// call, not done, force), then re-emits every known item as `updated` on the backfill lane with
/// the same data and fresh sequences, ends at its target and is done: nothing more is emitted.
pub async fn backfill_force_reemits_and_finishes(env: Env) -> CaseResult {
    let w = world(5, 10)?;
    let poller = w.poller(StrategyKind::Timestamp).build()?;
    let (engine, recorder) = engine(&w, &env, poller, None)?;
    clean_tick(&w, &engine).await?;
    let created = recorder.events();
    check_eq!(created.len(), 5);
    let live = only(&engine).await?.cursors.live;
    check!(live.is_some(), "the live lane has a cursor");

    engine
        .backfill(POLLER, None, BackfillOptions::default().force(true))
        .await?;
    let lane = backfill_lane(&env).await?;
    check_eq!(
        (lane.done, lane.force),
        (Some(false), Some(true)),
        "{lane:?}"
    );
    let target = lane
        .target
        .as_deref()
        .map(serde_json::from_str::<Value>)
        .transpose()
        .map_err(|e| CaseError::failed(format!("the stored target is not JSON: {e}")))?;
    check_eq!(target, live, "`to: None` targets the live cursor");
    check_eq!(
        only(&engine).await?.cursors.backfill,
        Some(json!({ "value": null, "tieBreak": null })),
        "`from: None` is the beginning"
    );

    // The live lane is not due: the next tick runs the backfill alone.
    let result = clean_tick(&w, &engine).await?;
    check_eq!(lanes_of(&result), [Lane::Backfill], "{result:?}");
    let events = recorder.events();
    check_eq!(events.len(), 10);
    let backfilled = after_first(&events, 5);
    check_eq!(
        summary(backfilled),
        created
            .iter()
            .map(|e| (EventType::Updated, e.subject.to_string(), Lane::Backfill))
            .collect::<Vec<_>>()
    );
    check_eq!(
        backfilled.iter().map(|e| e.sequence).collect::<Vec<_>>(),
        [6, 7, 8, 9, 10]
    );
    check_eq!(
        backfilled.iter().map(data_of).collect::<Vec<_>>(),
        created.iter().map(data_of).collect::<Vec<_>>(),
        "the same data again"
    );

    let lane = backfill_lane(&env).await?;
    check_eq!(lane.done, Some(true), "{lane:?}");
    let cursors = only(&engine).await?.cursors;
    check_eq!(
        cursors.backfill,
        cursors.live,
        "the backfill reached its target"
    );
    let result = clean_tick(&w, &engine).await?;
    check!(result.polled.is_empty(), "{result:?}");
    w.advance(Duration::from_secs(31));
    let result = clean_tick(&w, &engine).await?;
    check_eq!(
        lanes_of(&result),
        [Lane::Live],
        "a done backfill never runs again"
    );
    check_eq!(recorder.ids().len(), 10);
    Ok(())
}

/// Lane backoff (`docs/decisions.md`): a failing backfill records `failures` and `retry_at` (full jitter
/// within the cap) in its persisted lane and runs again exactly when `retry_at` comes, never
/// sooner, over six failures, one attempt each; the live lane keeps polling and delivering, its
/// schedule untouched and due within its max; once the fetch works the backfill completes and
/// its backoff is cleared.
pub async fn failing_backfill_backs_off(env: Env) -> CaseResult {
    let w = world(5, 10)?;
    let failing = Arc::new(AtomicBool::new(false));
    let fetched: Arc<Mutex<Vec<(Lane, i64)>>> = Arc::default();
    let fetch = {
        let (api, clock) = (w.api.clone(), w.clock.clone());
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
    let backfill_fetches = || {
        lock(&fetched)
            .iter()
            .filter(|(lane, _)| *lane == Lane::Backfill)
            .count()
    };
    let poller = w.poller(StrategyKind::Timestamp).fetch(fetch).build()?;
    let (engine, recorder) = engine(&w, &env, poller, None)?;
    clean_tick(&w, &engine).await?;
    check_eq!(recorder.ids().len(), 5);

    failing.store(true, Ordering::SeqCst);
    engine
        .backfill(POLLER, None, BackfillOptions::default())
        .await?;
    // The first attempt runs at once and fails: the lane backs off.
    let result = w.tick(&engine).await?;
    check_eq!(lanes_of(&result), [Lane::Backfill], "{result:?}");
    check!(
        result.polled.iter().all(|p| p.error.is_some()),
        "{result:?}"
    );
    let mut lane = backfill_lane(&env).await?;
    check_eq!(lane.failures, Some(1), "{lane:?}");

    for failures in 2..=6_u32 {
        let retry_at = lane
            .retry_at
            .ok_or_else(|| CaseError::failed(format!("no retry_at: {lane:?}")))?;
        let delay = retry_at - w.now();
        check!(
            (1..=backoff_cap_ms(failures - 1)).contains(&delay),
            "backoff after failure {}: {delay} ms",
            failures - 1
        );
        if failures % 2 == 0 && failures > 2 {
            // A live change while the backfill is failing; past the live lane's `max`, both
            // lanes are due.
            let id = if failures == 4 {
                "item-001"
            } else {
                "item-002"
            };
            drop(
                w.api
                    .update(id, json!({ "value": failures }))
                    .map_err(api_error)?,
            );
            w.advance(Duration::from_secs(31));
        } else {
            // 1 ms early: no backfill attempt.
            let before = backfill_fetches();
            w.advance(ms(delay - 1));
            let early = w.tick(&engine).await?;
            check!(!lanes_of(&early).contains(&Lane::Backfill), "{early:?}");
            check_eq!(backfill_fetches(), before, "no attempt before retry_at");
            w.advance(ms(1));
        }
        let before = backfill_fetches();
        let result = w.tick(&engine).await?;
        check_eq!(backfill_fetches(), before + 1, "due: one attempt");
        check!(
            result
                .polled
                .iter()
                .all(|p| (p.lane == Lane::Backfill) == p.error.is_some()),
            "only the backfill fails: {result:?}"
        );
        lane = backfill_lane(&env).await?;
        check_eq!(
            (lane.failures, lane.done),
            (Some(failures), Some(false)),
            "{lane:?}"
        );
        let schedule = only(&engine).await?.schedule;
        check!(
            schedule.consecutive_failures == 0
                && schedule.circuit == Circuit::Closed
                && schedule.last_error.is_none()
                && schedule
                    .next_due_at
                    .is_some_and(|due| due <= w.now() + 30_000),
            "the live lane is not affected (due within its max): {schedule:?}"
        );
    }
    check_eq!(backfill_fetches(), 6, "one attempt per failure");
    let events = recorder.events();
    check_eq!(
        summary(after_first(&events, 5)),
        [
            (EventType::Updated, "item-001".to_owned(), Lane::Live),
            (EventType::Updated, "item-002".to_owned(), Lane::Live),
        ],
        "the live lane delivered while the backfill failed"
    );

    // The archive is back: the next attempt completes the backfill and clears the backoff.
    failing.store(false, Ordering::SeqCst);
    let retry_at = lane.retry_at.unwrap_or(i64::MIN);
    w.advance(ms(retry_at - w.now()));
    let result = clean_tick(&w, &engine).await?;
    check!(lanes_of(&result).contains(&Lane::Backfill), "{result:?}");
    let lane = backfill_lane(&env).await?;
    check_eq!(
        (lane.done, lane.failures, lane.retry_at),
        (Some(true), None, None)
    );
    check_eq!(
        recorder.ids().len(),
        7,
        "nothing changed: nothing re-emitted"
    );
    Ok(())
}

// ----- replay and the log -----

/// Replay: replaying a time range of the log re-delivers those events with their
/// original ids, types and data on the replay lane, with fresh sequences after everything
/// committed; copies are not logged again and later events continue the sequence.
pub async fn replay_redelivers_with_same_ids(env: Env) -> CaseResult {
    let (w, engine, recorder) = logged(&env)?;
    let t0 = w.now();
    let result = clean_tick(&w, &engine).await?;
    check_eq!(result.delivered, 3, "{result:?}");
    let originals = recorder.events();
    check_eq!(originals.len(), 3);

    // A later change, outside the replayed range.
    w.advance(Duration::from_secs(10));
    update(&w, "item-002", json!({ "value": 20 }))?;
    clean_tick(&w, &engine).await?;
    let events = recorder.events();
    check_eq!(
        events.iter().map(|e| e.sequence).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );

    check_eq!(engine.replay(POLLER, None, t0, Some(t0)).await?, 3);
    check_eq!(only(&engine).await?.outbox_pending, 3);
    let result = clean_tick(&w, &engine).await?;
    check_eq!(result.delivered, 3, "{result:?}");
    let events = recorder.events();
    let copies = after_first(&events, 4);
    check_eq!(
        copies.iter().map(|e| e.id.clone()).collect::<Vec<_>>(),
        originals.iter().map(|e| e.id.clone()).collect::<Vec<_>>(),
        "the original ids"
    );
    check!(copies.iter().all(|e| e.lane == Lane::Replay), "{copies:?}");
    check_eq!(
        copies.iter().map(|e| e.sequence).collect::<Vec<_>>(),
        [5, 6, 7]
    );
    check_eq!(
        copies
            .iter()
            .map(|e| (e.event_type, e.subject.clone(), data_of(e)))
            .collect::<Vec<_>>(),
        originals
            .iter()
            .map(|e| (e.event_type, e.subject.clone(), data_of(e)))
            .collect::<Vec<_>>()
    );
    check_eq!(only(&engine).await?.outbox_pending, 0);

    let logged = read_log(&env).await?;
    check_eq!(logged.len(), 4, "copies are not logged again");
    check!(
        logged.iter().all(|l| l.event.lane == Lane::Live),
        "{logged:?}"
    );
    w.advance(Duration::from_secs(60));
    update(&w, "item-003", json!({ "value": 30 }))?;
    clean_tick(&w, &engine).await?;
    let last = recorder.events().last().cloned();
    check_eq!(
        last.map(|e| (e.subject.to_string(), e.lane, e.sequence)),
        Some(("item-003".to_owned(), Lane::Live, 8))
    );
    check_eq!(
        engine.replay(POLLER, None, t0, None).await?,
        5,
        "without `to`: everything logged up to now"
    );
    Ok(())
}

/// Log retention (`docs/decisions.md`): a run of the key prunes log entries strictly older than
/// `now - retention` (an entry exactly `retention` old is kept), and pruned entries can no
/// longer be replayed.
pub async fn log_retention_prunes(env: Env) -> CaseResult {
    let (w, engine, recorder) = logged(&env)?;
    let t0 = w.now();
    clean_tick(&w, &engine).await?;
    let logged_at =
        |log: &[LoggedEvent]| -> Vec<i64> { log.iter().map(|l| l.created_at).collect() };
    check_eq!(logged_at(&read_log(&env).await?), [t0; 3]);

    // Exactly the retention later: nothing is strictly older than `now - retention` yet.
    w.advance(Duration::from_secs(3_600));
    update(&w, "item-001", json!({ "value": 10 }))?;
    clean_tick(&w, &engine).await?;
    check_eq!(recorder.ids().len(), 4);
    check_eq!(
        logged_at(&read_log(&env).await?),
        [t0, t0, t0, t0 + 3_600_000]
    );

    // One millisecond more, and a run of the key prunes the first three.
    w.advance(ms(1));
    engine.trigger(POLLER, None).await?;
    let result = clean_tick(&w, &engine).await?;
    check_eq!(lanes_of(&result), [Lane::Live]);
    let log = read_log(&env).await?;
    check_eq!(logged_at(&log), [t0 + 3_600_000]);
    check_eq!(
        log.first().map(|l| l.event.subject.to_string()),
        Some("item-001".to_owned())
    );
    check_eq!(
        engine.replay(POLLER, None, 0, None).await?,
        1,
        "pruned entries cannot be replayed"
    );
    Ok(())
}
