//! The lanes end to end on `MemoryStore` and the `FakeApi`, for what the conformance cases
//! (`conformance/src/cases/lanes.rs`, run on every store) do not cover: a reconcile cut short by
//! the full-scan page cap, the daemon not re-listing a capped reconcile in a hot loop, a reconcile
//! listing with a token cursor or as a stream (and its cursor's config errors), a backfill
//! without force or with a target, replay without a log, and the config errors of reconcile and
//! backfill on a `snapshot_diff` poller. Everything runs on a manual clock (tokio's paused clock
//! for the daemon) with fixed seeds: no real sleeps, no wall-clock assertions.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use watukuy_core::BackfillOptions;
use watukuy_core::cursor::Cursor;
use watukuy_core::poller::Fetch;
use watukuy_core::{
    BoxError, Engine, Error, ErrorCode, Event, EventType, FetchContext, Lane, Page, Poller,
    StopOptions, TickResult,
    clock::{Clock, TokioClock},
    rng::SeededRng,
    store::{LaneCursor, Lanes, LogQuery, Store},
};
use watukuy_store_memory::MemoryStore;
use watukuy_testkit::world::{POLLER, Recorder, StrategyKind, World, key, lock};

// ----- helpers -----

/// The option a `Config` error names.
fn option_of(error: Error) -> String {
    error
        .config_option()
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("expected a Config error, got {error:?}"))
}

/// An engine over `store` on the world's clock, seeded, instance `node-a`, with a recording
/// handler attached.
fn engine(world: &World, store: &Arc<MemoryStore>, poller: Poller) -> (Engine, Recorder) {
    let store: Arc<dyn Store> = Arc::clone(store) as Arc<dyn Store>;
    let engine = world.engine(store, "node-a", poller, 7).unwrap();
    let recorder = Recorder::attached(&engine).unwrap();
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

/// `(type, subject, lane)` of each event.
fn summary(events: &[Event]) -> Vec<(EventType, String, Lane)> {
    events
        .iter()
        .map(|e| (e.event_type, e.subject.to_string(), e.lane))
        .collect()
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
/// cases `lanes::reconcile_finds_deletes` and
/// `full_scans::a_shifting_listing_never_deletes_a_live_item`.
fn token_with_reconcile(world: &World, asked: &Asked) -> watukuy_core::PollerBuilder<Value> {
    world
        .poller(StrategyKind::Token)
        .delete_confirmation(watukuy_core::poller::DeleteConfirmation::Immediate)
        .reconcile(Duration::from_secs(60), recording_page_fetch(world, asked))
}

// ----- reconcile -----

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
    World::on_tokio_clock(items, page_size).unwrap()
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
    let recorder = Recorder::attached(&engine).unwrap();
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

/// A reconcile fetch over the fake's `/token` listing that records what it was asked for and
/// fails the request number `fail_at` (1-based, counted over every reconcile request) once.
fn recording_token_fetch(world: &World, asked: &Asked, fail_at: usize) -> impl Fetch {
    let (api, asked) = (world.api.clone(), Arc::clone(asked));
    move |ctx: FetchContext| {
        let api = api.clone();
        let call = {
            let mut asked = lock(&asked);
            asked.push((ctx.lane, ctx.cursor.clone()));
            asked.len()
        };
        async move {
            if call == fail_at {
                return Err(BoxError::from("the listing's second request failed"));
            }
            api.fetch_token(&ctx).await
        }
    }
}

/// The cursors the reconcile fetch was asked for, as `None` (first page) or the token.
fn tokens(asked: &Asked) -> Vec<Option<String>> {
    lock(asked)
        .iter()
        .map(|(lane, cursor)| match cursor {
            Cursor::Token { value } if *lane == Lane::Reconcile => value.clone(),
            other => panic!("a {lane:?} request with {other:?}"),
        })
        .collect()
}

#[tokio::test]
async fn a_reconcile_with_a_token_cursor_lists_from_the_first_token_every_time() {
    // 5 items, 2 a page: a listing is 3 token pages. The live lane is `timestamp` (its own
    // fetch), the reconcile lists `/token` with the `token` cursor.
    let world = World::new(5, 2).unwrap();
    let store = Arc::new(MemoryStore::new());
    let asked = Asked::default();
    // The second listing's second request fails (request 3 + 2 = 5).
    let poller = world
        .poller(StrategyKind::Timestamp)
        .delete_confirmation(watukuy_core::poller::DeleteConfirmation::Immediate)
        .reconcile(
            Duration::from_secs(60),
            recording_token_fetch(&world, &asked, 5),
        )
        .reconcile_cursor(watukuy_core::cursor::token(None))
        .build()
        .unwrap();
    let (engine, recorder) = engine(&world, &store, poller);

    let result = world.tick(&engine).await.unwrap();
    assert_no_errors(&result);
    assert_eq!(lanes_of(&result), [Lane::Live, Lane::Reconcile]);
    let first = tokens(&asked);
    assert_eq!(first.len(), 3, "{first:?}");
    assert_eq!(first[0], None, "a listing starts from the first token");
    assert!(first[1..].iter().all(Option::is_some), "{first:?}");

    // item-002 (on the listing's first page) goes; the next listing fails at its second
    // request: nothing may be reported deleted from a listing that did not end.
    assert!(world.api.remove("item-002"));
    world.advance(Duration::from_secs(61));
    let result = world.tick(&engine).await.unwrap();
    let reconcile = result
        .polled
        .iter()
        .find(|p| p.lane == Lane::Reconcile)
        .expect("the reconcile ran");
    assert!(reconcile.error.is_some(), "{result:?}");
    assert_eq!(tokens(&asked)[3], None);
    assert!(
        recorder
            .events()
            .iter()
            .all(|e| e.event_type != EventType::Deleted),
        "a delete from an interrupted listing"
    );

    // The lane backs off and runs again: from the first token, not from where it failed, and
    // this complete listing reports the delete.
    world.advance(Duration::from_secs(600));
    let result = world.tick(&engine).await.unwrap();
    assert_no_errors(&result);
    let asked_now = tokens(&asked);
    assert_eq!(asked_now[5], None, "{asked_now:?}");
    assert_eq!(
        asked_now.len(),
        5 + 2,
        "two pages of 4 items: {asked_now:?}"
    );
    let deleted: Vec<_> = recorder
        .events()
        .into_iter()
        .filter(|e| e.event_type == EventType::Deleted)
        .map(|e| (e.subject, e.lane))
        .collect();
    assert_eq!(deleted, [("item-002".into(), Lane::Reconcile)]);
}

#[tokio::test]
async fn a_reconcile_fetched_as_a_stream_lists_every_page() {
    // 5 items, 2 a page; the stream pages `/page` itself from the context it was given.
    let world = World::new(5, 2).unwrap();
    let store = Arc::new(MemoryStore::new());
    let streams = Arc::new(Mutex::new(Vec::new()));
    let (api, seen) = (world.api.clone(), Arc::clone(&streams));
    let stream = move |ctx: FetchContext| {
        lock(&seen).push((ctx.lane, ctx.page));
        let api = api.clone();
        futures::stream::unfold(Some(1_u32), move |page| {
            let (api, ctx) = (api.clone(), ctx.clone());
            async move {
                let page = page?;
                let mut ctx = ctx;
                ctx.cursor = Cursor::Page { page };
                let result = api.fetch_page(&ctx).await;
                let next = match &result {
                    Ok(p) if p.has_more == Some(true) => Some(page + 1),
                    _ => None,
                };
                Some((result, next))
            }
        })
        .boxed()
    };
    let poller = world
        .poller(StrategyKind::Token)
        .delete_confirmation(watukuy_core::poller::DeleteConfirmation::Immediate)
        .reconcile_stream(Duration::from_secs(60), stream)
        .build()
        .unwrap();
    let (engine, recorder) = engine(&world, &store, poller);
    world.tick(&engine).await.unwrap();
    assert!(world.api.remove("item-004"));
    world.advance(Duration::from_secs(61));
    let result = world.tick(&engine).await.unwrap();
    assert_no_errors(&result);
    assert_eq!(
        *lock(&streams),
        [(Lane::Reconcile, 1), (Lane::Reconcile, 1)],
        "one stream per listing, from its first page"
    );
    let events = recorder.events();
    assert_eq!(
        summary(&events[5..]),
        [(EventType::Deleted, "item-004".to_owned(), Lane::Reconcile)]
    );
}

#[tokio::test]
async fn a_reconcile_cursor_is_checked_when_the_poller_is_built() {
    let world = World::new(1, 10).unwrap();
    let asked = Asked::default();
    let lonely = world
        .poller(StrategyKind::Token)
        .reconcile_cursor(watukuy_core::cursor::token(None))
        .build()
        .unwrap_err();
    assert_eq!(option_of(lonely), "reconcile_cursor");
    let invalid = world
        .poller(StrategyKind::Token)
        .reconcile(
            Duration::from_secs(60),
            recording_page_fetch(&world, &asked),
        )
        .reconcile_cursor(watukuy_core::cursor::timestamp(""))
        .build()
        .unwrap_err();
    assert!(
        option_of(invalid).starts_with("reconcile_cursor"),
        "the error names the reconcile's cursor"
    );
    // A keyset that holds recent items back would leave them out of the listing.
    let lagging = world
        .poller(StrategyKind::Token)
        .reconcile(
            Duration::from_secs(60),
            recording_page_fetch(&world, &asked),
        )
        .reconcile_cursor(
            watukuy_core::cursor::timestamp("updatedAt")
                .tie_break("id")
                .lag(Duration::from_secs(5)),
        )
        .build()
        .unwrap_err();
    assert_eq!(option_of(lagging), "reconcile_cursor");
}

// ----- backfill -----

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
            BackfillOptions::default()
                .to_cursor(target.clone())
                .force(true),
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
    let reached = json!({ "value": target, "tieBreak": "item-004" });
    let inspect = only(&engine).await;
    assert_eq!(inspect.cursors.backfill, Some(reached.clone()));
    let progress = inspect.backfill.expect("the backfill's progress");
    assert_eq!(
        (
            progress.cursor,
            progress.done,
            progress.force,
            progress.failures
        ),
        (Some(reached), true, true, 0)
    );
    assert_eq!(
        progress.target.and_then(|t| t.get("value").cloned()),
        Some(json!(target))
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

// ----- replay and the log -----

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
