//! Conformance cases: `full_scans` — a full scan (`snapshot_diff`, the reconcile lane) reports an
//! item deleted only when it is gone, whatever happens to the listing while it is paged through.
//!
//! The API here pages by offset (`/page?page=N`, items in id order), the common shape and the
//! one that shifts: an item deleted from a page already fetched moves every later item one place
//! up, so the first item of the next page lands on the page already fetched and no request lists
//! it. Some cases confirm deletes by looking the missing items up (`DeleteConfirmation::Lookup`)
//! through the API's lookup by identity (`GET /items?ids=…`, answered from the fake's items).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::json;
use watukuy_core::cursor::{self, Cursor};
use watukuy_core::{
    BoxError, Engine, Event, EventType, FetchContext, Lane, Page, Poller,
    poller::DeleteConfirmation, rng::SeededRng, store::Store,
};

use crate::harness::{CaseError, CaseResult, Env, OrFail};
use crate::{check, check_eq};
use watukuy_testkit::FakeApi;
use watukuy_testkit::world::{Recorder, StrategyKind, World};
use watukuy_testkit::{FaultyStore, KillPoint, KillSwitch};

/// Items of the API and items a page.
const ITEMS: usize = 12;
const PAGE_SIZE: usize = 4;

/// A change the API makes right after it answered a page, before the next request.
#[derive(Clone)]
struct Shift {
    after_page: u32,
    remove: &'static str,
    add: &'static str,
}

/// At every page boundary of one listing (after page 1 and after page 2 of 3): an item already
/// listed is deleted and a new one appears after the boundary. Each delete shifts the next
/// page's first item onto the page already fetched.
const SHIFTS: [Shift; 2] = [
    Shift {
        after_page: 1,
        remove: "item-002",
        add: "item-009a",
    },
    Shift {
        after_page: 2,
        remove: "item-006",
        add: "item-011a",
    },
];

/// Where the full scan runs.
#[derive(Clone, Copy, Debug)]
enum Scan {
    /// The live lane of a `snapshot_diff` poller.
    SnapshotDiff,
    /// The reconcile lane of a `token` poller.
    Reconcile,
}

impl Scan {
    fn lane(self) -> Lane {
        match self {
            Scan::SnapshotDiff => Lane::Live,
            Scan::Reconcile => Lane::Reconcile,
        }
    }
}

/// How the next listing is interrupted at one page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Interrupt {
    /// The request for the page fails (the process lives on).
    Fail,
    /// The process dies before the page's commit (the `after-fetch` kill).
    Crash,
}

/// What the API does to the next listing.
#[derive(Default)]
struct Plan {
    shifts: Vec<Shift>,
    /// Interrupt the listing at this page, once.
    interrupt: Option<(u32, Interrupt)>,
    kills: Option<Arc<KillSwitch>>,
    /// Every listing shifts across the same item (see [`ROLLING`]).
    rolling: bool,
    /// The items `rolling` added so far.
    added: u32,
    /// The items `rolling` removed so far.
    removed: Vec<String>,
}

/// A shift in every listing, across the same item each time: after page 1 the first item of the
/// listing (already listed) is deleted, so the first item of page 2 moves onto page 1 and no
/// request lists it; after page 2 a new item is added in front of everything, so the same item
/// is back at the start of page 2 when the next listing begins. With 4 items a page that item
/// is `item-005`, in every listing.
const ROLLING: &str = "item-005";

/// The API's lookup by identity: the items it still has among those asked for. Records what it
/// was asked and fails while told to.
#[derive(Default)]
struct Lookups {
    asked: Mutex<Vec<Vec<String>>>,
    /// Fail the next calls, this many.
    fail_next: Mutex<u32>,
}

impl Lookups {
    fn asked(&self) -> Vec<Vec<String>> {
        self.asked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn fail_next(&self, times: u32) {
        *self
            .fail_next
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = times;
    }

    /// A `lookup` over `api`, charging the poller's budget before each call as a fetch does.
    fn over(
        self: &Arc<Self>,
        api: &FakeApi,
    ) -> impl Fn(FetchContext, Vec<String>) -> BoxFuture<'static, Result<Page, BoxError>>
    + Send
    + Sync
    + 'static {
        let (lookups, api) = (Arc::clone(self), api.clone());
        move |ctx: FetchContext, ids: Vec<String>| {
            let (lookups, api) = (Arc::clone(&lookups), api.clone());
            Box::pin(async move {
                ctx.charge_budget().await?;
                lookups
                    .asked
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(ids.clone());
                {
                    let mut fail = lookups
                        .fail_next
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner);
                    if *fail > 0 {
                        *fail -= 1;
                        return Err(format!("GET /items?ids= ({} ids) failed", ids.len()).into());
                    }
                }
                Ok::<Page, BoxError>(Page::new(ids.iter().filter_map(|id| api.get(id)).collect()))
            })
        }
    }
}

/// Lists page `page` of the API, interrupted when the plan says so, and then applies the shifts
/// armed for after it.
async fn shifting_page(api: &FakeApi, plan: &Mutex<Plan>, page: u32) -> Result<Page, BoxError> {
    let interrupt = {
        let mut plan = plan.lock().unwrap_or_else(PoisonError::into_inner);
        match plan.interrupt {
            Some((at, how)) if at == page => {
                plan.interrupt = None;
                Some((how, plan.kills.clone()))
            }
            _ => None,
        }
    };
    match interrupt {
        Some((Interrupt::Fail, _)) => return Err(format!("page {page} failed").into()),
        Some((Interrupt::Crash, Some(kills))) => {
            kills.arm(KillPoint::AfterFetch);
        }
        _ => {}
    }
    let listing = api.list_page(page, Some(PAGE_SIZE)).await?;
    let mut out = Page::new(listing.items);
    out.has_more = listing.has_more;
    let due: Vec<Shift> = {
        let mut plan = plan.lock().unwrap_or_else(PoisonError::into_inner);
        let (due, rest) = plan.shifts.drain(..).partition(|s| s.after_page == page);
        plan.shifts = rest;
        due
    };
    for shift in due {
        api.remove(shift.remove);
        api.add(json!({ "id": shift.add, "name": shift.add, "value": 0 }))?;
    }
    let rolling = {
        let mut plan = plan.lock().unwrap_or_else(PoisonError::into_inner);
        if plan.rolling && page == 2 {
            plan.added += 1;
        }
        plan.rolling.then_some(plan.added)
    };
    match (rolling, page) {
        (Some(_), 1) => {
            let first = api
                .all()
                .first()
                .and_then(|i| i["id"].as_str().map(str::to_owned));
            if let Some(first) = first {
                api.remove(&first);
                let mut plan = plan.lock().unwrap_or_else(PoisonError::into_inner);
                plan.removed.push(first);
            }
        }
        (Some(added), 2) => {
            // Sorts before `item-001`, so in front of everything.
            let id = format!("item-000-{added:02}");
            api.add(json!({ "id": id, "name": id, "value": 0 }))?;
        }
        _ => {}
    }
    Ok(out)
}

/// One poller named `name` whose full scan (`scan`) lists through the shifting API, confirming
/// its deletes by `rule` (with `DeleteConfirmation::Lookup`, through [`Lookups`]).
fn poller(
    w: &World,
    name: &str,
    scan: Scan,
    rule: DeleteConfirmation,
    plan: &Arc<Mutex<Plan>>,
) -> Result<Poller, CaseError> {
    poller_looking_up(w, name, scan, rule, plan, &Arc::default())
}

/// [`poller`], looking up through `lookups`, one identity a call (so a confirmation makes
/// several calls), when `rule` is `Lookup`.
fn poller_looking_up(
    w: &World,
    name: &str,
    scan: Scan,
    rule: DeleteConfirmation,
    plan: &Arc<Mutex<Plan>>,
    lookups: &Arc<Lookups>,
) -> Result<Poller, CaseError> {
    let (api, shifts) = (w.api.clone(), Arc::clone(plan));
    let builder = match scan {
        Scan::SnapshotDiff => w
            .poller_named(name, StrategyKind::SnapshotDiff)
            .cursor(cursor::snapshot_diff())
            .fetch(move |ctx: FetchContext| {
                let (api, shifts) = (api.clone(), Arc::clone(&shifts));
                async move { shifting_page(&api, &shifts, ctx.page).await }
            }),
        Scan::Reconcile => w.poller_named(name, StrategyKind::Token).reconcile(
            Duration::from_secs(60),
            move |ctx: FetchContext| {
                let (api, shifts) = (api.clone(), Arc::clone(&shifts));
                async move {
                    let Cursor::Page { page } = ctx.cursor else {
                        return Err(format!("a reconcile got a {:?} cursor", ctx.cursor).into());
                    };
                    shifting_page(&api, &shifts, page).await
                }
            },
        ),
    };
    let builder = builder.delete_confirmation(rule);
    Ok(if rule == DeleteConfirmation::Lookup {
        builder.lookup(1, lookups.over(&w.api))
    } else {
        builder
    }
    .build()?)
}

/// An engine on `store` with the world's clock, and a recorder attached to `name`.
fn start_engine(
    w: &World,
    store: Arc<dyn Store>,
    poller: Poller,
    name: &str,
    instance: &str,
) -> Result<(Engine, Recorder), CaseError> {
    let engine = Engine::builder(store)
        .poller(poller)
        .clock(Arc::new(w.clock.clone()))
        .rng(Arc::new(SeededRng::new(7)))
        .instance_id(instance)
        .build()?;
    let recorder = Recorder::default();
    engine.on(name, recorder.handler())?;
    Ok((engine, recorder))
}

/// One listing: the clock moves past the live schedule's max (30 s), the reconcile's `every`
/// (60 s) and the lease TTL (30 s), and one tick runs. With `clean`, no cycle may fail and the
/// full scan must have run.
async fn listing(
    w: &World,
    engine: &Engine,
    name: &str,
    scan: Scan,
    clean: bool,
) -> Result<(), CaseError> {
    w.advance(Duration::from_secs(61));
    let result = w.tick(engine).await?;
    if clean {
        check!(
            result.polled.iter().all(|p| p.error.is_none()),
            "{name}: a cycle failed: {result:?}"
        );
        check!(
            result.polled.iter().any(|p| p.lane == scan.lane()),
            "{name}: the full scan did not run: {result:?}"
        );
    }
    Ok(())
}

/// The subjects of the `deleted` events.
fn deleted(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.event_type == EventType::Deleted)
        .map(|e| e.subject.to_string())
        .collect()
}

/// What one run of the scenario saw.
struct Outcome {
    /// Subjects of `deleted` events for items the API still has.
    live_deleted: Vec<String>,
    /// Subjects of `deleted` events, in order.
    deleted: Vec<String>,
    /// The events delivered.
    events: Vec<Event>,
    /// The API's items at the end.
    api_ids: Vec<String>,
}

impl Outcome {
    /// The events delivered against the API's items at the end.
    fn of(w: &World, events: Vec<Event>) -> Self {
        let api_ids: Vec<String> = w
            .api
            .all()
            .iter()
            .filter_map(|item| item["id"].as_str().map(str::to_owned))
            .collect();
        let deleted = deleted(&events);
        let live_deleted = deleted
            .iter()
            .filter(|s| api_ids.contains(s))
            .cloned()
            .collect();
        Self {
            live_deleted,
            deleted,
            events,
            api_ids,
        }
    }
}

/// Learns the listing, runs one listing that shifts at every page boundary, then quiet
/// listings, on the case's store under its own poller name.
async fn run(
    env: &Env,
    name: &str,
    scan: Scan,
    rule: DeleteConfirmation,
) -> Result<Outcome, CaseError> {
    let w = World::new(ITEMS, PAGE_SIZE)
        .map_err(|e| CaseError::failed(format!("cannot build the fake API: {e}")))?;
    let plan = Arc::new(Mutex::new(Plan::default()));
    let poller = poller(&w, name, scan, rule, &plan)?;
    let (engine, recorder) = start_engine(&w, Arc::clone(&env.store), poller, name, "node-a")?;
    listing(&w, &engine, name, scan, true).await?;
    check_eq!(
        recorder.events().len(),
        ITEMS,
        "{name}: the listing learned"
    );
    plan.lock().unwrap_or_else(PoisonError::into_inner).shifts = SHIFTS.to_vec();
    listing(&w, &engine, name, scan, true).await?;
    check!(
        plan.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .shifts
            .is_empty(),
        "{name}: every shift happened during the listing"
    );
    for _ in 0..3 {
        listing(&w, &engine, name, scan, true).await?;
    }
    Ok(Outcome::of(&w, recorder.events()))
}

/// `DeleteConfirmation::NextListing` (the default): an offset-paged listing that shifts at
/// every page boundary (a delete of an item already listed and an insert after the boundary,
/// between two page requests) never commits a `deleted` event for a live item, in a
/// `snapshot_diff` live lane and in a reconcile lane; the real deletes are reported exactly
/// once (after the next listing confirmed them), the inserts are created, and the snapshot ends
/// equal to the API. The control, `Immediate` (the reference's rule), reports a live item
/// deleted in the same scenario, which proves the listing did shift.
pub async fn a_shifting_listing_never_deletes_a_live_item(env: Env) -> CaseResult {
    for scan in [Scan::SnapshotDiff, Scan::Reconcile] {
        let name = format!("shifting-{scan:?}").to_lowercase();
        let out = run(&env, &name, scan, DeleteConfirmation::NextListing).await?;
        check!(
            out.live_deleted.is_empty(),
            "{scan:?}: live items reported deleted: {:?}",
            out.live_deleted
        );
        let mut deleted = out.deleted.clone();
        deleted.sort();
        check_eq!(
            deleted,
            ["item-002", "item-006"],
            "{scan:?}: each real delete exactly once"
        );
        let mut created: Vec<&str> = out
            .events
            .iter()
            .filter(|e| e.event_type == EventType::Created)
            .map(|e| e.subject.as_str())
            .skip(ITEMS)
            .collect();
        created.sort_unstable();
        check_eq!(created, ["item-009a", "item-011a"], "{scan:?}: the inserts");
        let key = watukuy_core::store::PKey::new(name.as_str(), "");
        check_eq!(
            env.store.counts(&key).await.map(|c| c.items)?,
            out.api_ids.len() as u64,
            "{scan:?}: the snapshot ends equal to the API"
        );
        check_eq!(
            env.store
                .load_state(&key)
                .await?
                .and_then(|s| s.lanes.get(scan.lane()).and_then(|l| l.suspects.clone())),
            None,
            "{scan:?}: no suspect left once the listing is quiet"
        );

        let control = format!("{name}-immediate");
        let out = run(&env, &control, scan, DeleteConfirmation::Immediate).await?;
        check!(
            !out.live_deleted.is_empty(),
            "{scan:?}: the control (Immediate) reported no live item deleted, so the listing never shifted"
        );
    }
    Ok(())
}

/// A full scan's deletes come from one complete listing: a listing of 3 pages interrupted after
/// page k, for k = 1 and 2, by a failed request for page k + 1 (the process lives on) and by a
/// crash before page k + 1's commit (a fresh instance takes over after the lease TTL), in a
/// `snapshot_diff` live lane and in a reconcile lane, never commits a `deleted` event, although
/// nothing was deleted: the next listing starts again from page 1 instead of resuming at page
/// k + 1 with pages 1..k unseen. `DeleteConfirmation::Immediate`, so that no second listing
/// could hide such a delete.
pub async fn an_interrupted_listing_never_deletes_a_live_item(env: Env) -> CaseResult {
    for scan in [Scan::SnapshotDiff, Scan::Reconcile] {
        for k in 1..=2_u32 {
            for how in [Interrupt::Fail, Interrupt::Crash] {
                let name = format!("interrupted-{scan:?}-{k}-{how:?}").to_lowercase();
                let w = World::new(ITEMS, PAGE_SIZE)
                    .map_err(|e| CaseError::failed(format!("cannot build the fake API: {e}")))?;
                let kills = Arc::new(KillSwitch::new());
                let plan = Arc::new(Mutex::new(Plan {
                    kills: Some(Arc::clone(&kills)),
                    ..Plan::default()
                }));
                let rule = DeleteConfirmation::Immediate;
                let faulty: Arc<dyn Store> = Arc::new(
                    FaultyStore::new(Arc::clone(&env.store)).with_kills(Arc::clone(&kills)),
                );
                let (node_a, recorder) = start_engine(
                    &w,
                    faulty,
                    poller(&w, &name, scan, rule, &plan)?,
                    &name,
                    "node-a",
                )?;
                listing(&w, &node_a, &name, scan, true).await?;
                check_eq!(
                    recorder.events().len(),
                    ITEMS,
                    "{name}: the listing learned"
                );

                plan.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .interrupt = Some((k + 1, how));
                listing(&w, &node_a, &name, scan, false).await?;
                check!(
                    plan.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .interrupt
                        .is_none(),
                    "{name}: the listing never reached page {}",
                    k + 1
                );
                let (running, recorder) = match how {
                    Interrupt::Fail => (node_a, recorder),
                    Interrupt::Crash => {
                        check_eq!(kills.fired(KillPoint::AfterFetch), 1, "{name}");
                        drop(node_a);
                        let poller = poller(&w, &name, scan, rule, &plan)?;
                        start_engine(&w, Arc::clone(&env.store), poller, &name, "node-b")?
                    }
                };
                for _ in 0..2 {
                    listing(&w, &running, &name, scan, true).await?;
                }
                let deleted = deleted(&recorder.events());
                check!(
                    deleted.is_empty(),
                    "{name}: live items reported deleted after an interrupted listing: {deleted:?}"
                );
                let key = watukuy_core::store::PKey::new(name.as_str(), "");
                check_eq!(
                    env.store.counts(&key).await.map(|c| c.items)?,
                    ITEMS as u64,
                    "{name}: the snapshot still holds every item"
                );
            }
        }
    }
    Ok(())
}

/// The suspects of `name`'s key on the lane of `scan`, as its store holds them.
async fn suspects(env: &Env, name: &str, scan: Scan) -> Result<Option<Vec<String>>, CaseError> {
    let key = watukuy_core::store::PKey::new(name, "");
    Ok(env
        .store
        .load_state(&key)
        .await?
        .and_then(|s| s.lanes.get(scan.lane()).and_then(|l| l.suspects.clone())))
}

/// `inspect()`'s suspect count of the engine's one key.
async fn inspected_suspects(engine: &Engine) -> Result<Vec<u64>, CaseError> {
    Ok(engine
        .inspect()
        .await?
        .pollers
        .iter()
        .map(|key| key.suspects)
        .collect())
}

/// `Engine::caught_up` is false while a full scan's suspect waits for its confirmation, and
/// true once its delete is delivered: an item deleted between two listings of several pages is
/// a suspect after the first listing that misses it (`DeleteConfirmation::NextListing`: the
/// lane's suspects in the store, `suspects` in `inspect()`), with no event pending; the next
/// listing reports it deleted and clears it. In a `snapshot_diff` live lane and in a reconcile
/// lane.
pub async fn caught_up_waits_for_the_suspects(env: Env) -> CaseResult {
    for scan in [Scan::SnapshotDiff, Scan::Reconcile] {
        let name = format!("caught-up-{scan:?}").to_lowercase();
        let w = World::new(ITEMS, PAGE_SIZE)
            .map_err(|e| CaseError::failed(format!("cannot build the fake API: {e}")))?;
        let plan = Arc::new(Mutex::new(Plan::default()));
        let poller = poller(&w, &name, scan, DeleteConfirmation::NextListing, &plan)?;
        let (engine, recorder) = start_engine(&w, Arc::clone(&env.store), poller, &name, "node-a")?;
        listing(&w, &engine, &name, scan, true).await?;
        check_eq!(
            recorder.events().len(),
            ITEMS,
            "{name}: the listing learned"
        );
        check!(
            engine.caught_up().await?,
            "{name}: caught up after learning"
        );

        check!(w.api.remove("item-006"), "{name}");
        listing(&w, &engine, &name, scan, true).await?;
        check_eq!(
            suspects(&env, &name, scan).await?,
            Some(vec!["item-006".to_owned()]),
            "{name}: a suspect after one listing"
        );
        check!(
            deleted(&recorder.events()).is_empty(),
            "{name}: a suspect is not a delete"
        );
        check_eq!(
            inspected_suspects(&engine).await?,
            [1],
            "{name}: inspect shows it"
        );
        check!(
            !engine.caught_up().await?,
            "{name}: caught up while a delete waits for its confirmation"
        );

        listing(&w, &engine, &name, scan, true).await?;
        check_eq!(
            deleted(&recorder.events()),
            ["item-006"],
            "{name}: confirmed"
        );
        check_eq!(suspects(&env, &name, scan).await?, None, "{name}");
        check_eq!(inspected_suspects(&engine).await?, [0], "{name}");
        check!(
            engine.caught_up().await?,
            "{name}: not caught up after the delete was delivered"
        );
    }
    Ok(())
}

/// What one run of [`run_rolling`] saw.
struct Rolling {
    outcome: Outcome,
    /// Every batch the lookup was asked for.
    asked: Vec<Vec<String>>,
    /// The items the API deleted.
    removed: Vec<String>,
}

/// Shifting listings in a row, each across [`ROLLING`] (see [`Plan::rolling`]), the rolling
/// item updated between the second and the third, then two quiet listings.
async fn run_rolling(
    env: &Env,
    name: &str,
    scan: Scan,
    rule: DeleteConfirmation,
    listings: usize,
) -> Result<Rolling, CaseError> {
    let w = World::new(ITEMS, PAGE_SIZE)
        .map_err(|e| CaseError::failed(format!("cannot build the fake API: {e}")))?;
    let plan = Arc::new(Mutex::new(Plan::default()));
    let lookups = Arc::new(Lookups::default());
    let poller = poller_looking_up(&w, name, scan, rule, &plan, &lookups)?;
    let (engine, recorder) = start_engine(&w, Arc::clone(&env.store), poller, name, "node-a")?;
    listing(&w, &engine, name, scan, true).await?;
    check_eq!(
        recorder.events().len(),
        ITEMS,
        "{name}: the listing learned"
    );
    check!(lookups.asked().is_empty(), "{name}: nothing to look up yet");
    plan.lock().unwrap_or_else(PoisonError::into_inner).rolling = true;
    for n in 0..listings {
        if n == 2 {
            w.api.update(ROLLING, json!({ "value": 55 }))?;
        }
        listing(&w, &engine, name, scan, true).await?;
    }
    let removed = {
        let mut plan = plan.lock().unwrap_or_else(PoisonError::into_inner);
        plan.rolling = false;
        plan.removed.clone()
    };
    check_eq!(removed.len(), listings, "{name}: one delete a listing");
    for _ in 0..2 {
        listing(&w, &engine, name, scan, true).await?;
    }
    let outcome = Outcome::of(&w, recorder.events());
    if rule == DeleteConfirmation::Lookup {
        check_eq!(
            suspects(env, name, scan).await?,
            None,
            "{name}: no suspect left"
        );
        check!(engine.caught_up().await?, "{name}: caught up at the end");
    }
    Ok(Rolling {
        outcome,
        asked: lookups.asked(),
        removed,
    })
}

/// `DeleteConfirmation::Lookup`: an offset-paged listing that shifts across the same live item
/// in every listing (4 in a row: an item already listed is deleted after page 1, and an item is
/// added in front after page 2) never commits a `deleted` event for it, since the lookup finds
/// it each time; its change, which no listing shows, arrives as an `updated` event from the
/// lookup; every item really deleted is reported deleted exactly once, by the first listing
/// that misses it (the lookup runs in the same cycle); the snapshot ends equal to the API, with
/// no suspect left. In a `snapshot_diff` live lane and in a reconcile lane. The control,
/// `NextListing` in the same scenario, reports the live item deleted, which proves the listing
/// shifted across it twice in a row.
pub async fn lookups_never_delete_a_live_item_of_a_listing_that_always_shifts(
    env: Env,
) -> CaseResult {
    const LISTINGS: usize = 4;
    for scan in [Scan::SnapshotDiff, Scan::Reconcile] {
        let name = format!("rolling-{scan:?}").to_lowercase();
        let run = run_rolling(&env, &name, scan, DeleteConfirmation::Lookup, LISTINGS).await?;
        let out = &run.outcome;
        check!(
            out.live_deleted.is_empty(),
            "{name}: live items reported deleted: {:?}",
            out.live_deleted
        );
        let looked_up_rolling = run
            .asked
            .iter()
            .flatten()
            .filter(|id| *id == ROLLING)
            .count();
        check_eq!(
            looked_up_rolling,
            LISTINGS,
            "{name}: {ROLLING} was missed, and looked up, by every shifting listing: {:?}",
            run.asked
        );
        check!(
            run.asked.iter().all(|batch| batch.len() == 1),
            "{name}: batches of one: {:?}",
            run.asked
        );
        let mut deleted = out.deleted.clone();
        deleted.sort();
        let mut removed = run.removed.clone();
        removed.sort();
        check_eq!(deleted, removed, "{name}: each real delete exactly once");
        let updates: Vec<&Event> = out
            .events
            .iter()
            .filter(|e| e.event_type == EventType::Updated && e.subject == ROLLING)
            .collect();
        check_eq!(updates.len(), 1, "{name}: the change found by a lookup");
        check_eq!(
            updates[0]
                .data_as::<serde_json::Value>()
                .or_fail_with("the update's data")?
                .map(|v| v["value"].clone()),
            Some(json!(55)),
            "{name}"
        );
        let key = watukuy_core::store::PKey::new(name.as_str(), "");
        check_eq!(
            env.store.counts(&key).await.map(|c| c.items)?,
            out.api_ids.len() as u64,
            "{name}: the snapshot ends equal to the API"
        );

        let control = format!("{name}-next-listing");
        let run = run_rolling(
            &env,
            &control,
            scan,
            DeleteConfirmation::NextListing,
            LISTINGS,
        )
        .await?;
        check!(
            run.outcome.live_deleted.contains(&ROLLING.to_owned()),
            "{control}: the control (NextListing) did not report {ROLLING} deleted, so the \
             listing never shifted across it twice in a row: {:?}",
            run.outcome.deleted
        );
    }
    Ok(())
}

/// `DeleteConfirmation::Lookup`: a lookup that fails deletes nothing. An item deleted between
/// two listings of several pages is missed and looked up in the same cycle; the lookup fails,
/// so the cycle fails like a failed fetch, no `deleted` event is committed, the item stays in
/// the snapshot and is kept as the lane's suspect (so `caught_up()` is false and `inspect()`
/// shows it); the next listing looks it up again and reports it deleted, once, and clears the
/// suspect. In a `snapshot_diff` live lane and in a reconcile lane.
pub async fn a_failing_lookup_deletes_nothing(env: Env) -> CaseResult {
    for scan in [Scan::SnapshotDiff, Scan::Reconcile] {
        let name = format!("failing-lookup-{scan:?}").to_lowercase();
        let w = World::new(ITEMS, PAGE_SIZE)
            .map_err(|e| CaseError::failed(format!("cannot build the fake API: {e}")))?;
        let plan = Arc::new(Mutex::new(Plan::default()));
        let lookups = Arc::new(Lookups::default());
        let rule = DeleteConfirmation::Lookup;
        let poller = poller_looking_up(&w, &name, scan, rule, &plan, &lookups)?;
        let (engine, recorder) = start_engine(&w, Arc::clone(&env.store), poller, &name, "node-a")?;
        listing(&w, &engine, &name, scan, true).await?;
        check_eq!(
            recorder.events().len(),
            ITEMS,
            "{name}: the listing learned"
        );

        check!(w.api.remove("item-006"), "{name}");
        lookups.fail_next(1);
        w.advance(Duration::from_secs(61));
        let result = w.tick(&engine).await?;
        let failed: Vec<_> = result
            .polled
            .iter()
            .filter(|p| p.lane == scan.lane())
            .filter_map(|p| p.error.as_ref())
            .collect();
        check_eq!(
            failed.len(),
            1,
            "{name}: the scan's cycle fails: {result:?}"
        );
        check_eq!(
            failed[0].code.as_deref(),
            Some("FETCH"),
            "{name}: {result:?}"
        );
        check_eq!(lookups.asked(), [vec!["item-006".to_owned()]], "{name}");
        check!(
            deleted(&recorder.events()).is_empty(),
            "{name}: a failed lookup deleted something"
        );
        let key = watukuy_core::store::PKey::new(name.as_str(), "");
        check_eq!(
            env.store.counts(&key).await.map(|c| c.items)?,
            ITEMS as u64,
            "{name}: the snapshot still holds the item"
        );
        check_eq!(
            suspects(&env, &name, scan).await?,
            Some(vec!["item-006".to_owned()]),
            "{name}: kept as a suspect"
        );
        check_eq!(inspected_suspects(&engine).await?, [1], "{name}");
        check!(
            !engine.caught_up().await?,
            "{name}: caught up with a suspect"
        );

        listing(&w, &engine, &name, scan, true).await?;
        check_eq!(lookups.asked().len(), 2, "{name}: looked up again");
        check_eq!(
            deleted(&recorder.events()),
            ["item-006"],
            "{name}: deleted once"
        );
        check_eq!(suspects(&env, &name, scan).await?, None, "{name}");
        check!(engine.caught_up().await?, "{name}: caught up at the end");
    }
    Ok(())
}
