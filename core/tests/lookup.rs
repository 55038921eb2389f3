//! `DeleteConfirmation::Lookup` end to end on `MemoryStore` and the `FakeApi`, for what the
//! conformance cases (`full_scans::lookups_never_delete_a_live_item_of_a_listing_that_always_shifts`
//! and `full_scans::a_failing_lookup_deletes_nothing`, run on every store) do not cover: a lookup
//! is charged to the poller's rate budget like a fetch and gets a fetch's context, a lookup the
//! budget cannot serve is a deferral that deletes nothing, a listing of one page is trusted
//! without a lookup, and the builder's config errors. A `snapshot_diff` poller over the fake's
//! `/page` listing, 4 items a page, on a manual clock with a fixed seed: no real sleeps.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use watukuy_core::budget::{BudgetStore, MemoryBudgetStore};
use watukuy_core::{
    BoxError, Engine, Error, EventType, FetchContext, Lane, Page, PollerBuilder,
    budget::BudgetPolicy, cursor, poller::DeleteConfirmation, store::Store,
};
use watukuy_store_memory::MemoryStore;
use watukuy_testkit::world::{Recorder, StrategyKind, World, lock};

const PAGE_SIZE: usize = 4;

/// What one lookup call saw.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Call {
    ids: Vec<String>,
    lane: Lane,
    page: u32,
    budget: Option<String>,
    validators: bool,
    clock: bool,
}

/// A `snapshot_diff` poller over the world's `/page` listing (its fetch charges the budget
/// before each page), confirming deletes with a lookup of `batch` identities a call that
/// records its calls and charges the budget before answering from the API's items.
fn poller(
    world: &World,
    batch: usize,
    calls: &Arc<Mutex<Vec<Call>>>,
) -> PollerBuilder<serde_json::Value> {
    let (api, lookup_api) = (world.api.clone(), world.api.clone());
    let calls = Arc::clone(calls);
    world
        .poller(StrategyKind::SnapshotDiff)
        .cursor(cursor::snapshot_diff())
        .fetch(move |ctx: FetchContext| {
            let api = api.clone();
            async move {
                ctx.charge_budget().await?;
                let listing = api.list_page(ctx.page, Some(PAGE_SIZE)).await?;
                let mut page = Page::new(listing.items);
                page.has_more = listing.has_more;
                Ok::<Page, BoxError>(page)
            }
        })
        .lookup(batch, move |ctx: FetchContext, ids: Vec<String>| {
            let (api, calls) = (lookup_api.clone(), Arc::clone(&calls));
            async move {
                lock(&calls).push(Call {
                    ids: ids.clone(),
                    lane: ctx.lane,
                    page: ctx.page,
                    budget: ctx.budget.as_ref().map(|b| b.name().to_owned()),
                    validators: ctx.validators.is_some(),
                    clock: ctx.clock.is_some(),
                });
                ctx.charge_budget().await?;
                Ok::<Page, BoxError>(Page::new(ids.iter().filter_map(|id| api.get(id)).collect()))
            }
        })
}

/// An engine over a fresh memory store with budget `api` (`policy`, its buckets in `buckets`),
/// and a recorder.
fn engine(
    world: &World,
    poller: PollerBuilder<serde_json::Value>,
    policy: BudgetPolicy,
    buckets: &Arc<MemoryBudgetStore>,
) -> (Engine, Recorder) {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let engine = world
        .engine_builder(store, "node-a", poller.budget("api").build().unwrap(), 7)
        .budget("api", policy)
        .budget_store(Arc::clone(buckets) as Arc<dyn BudgetStore>)
        .build()
        .unwrap();
    let recorder = Recorder::attached(&engine).unwrap();
    (engine, recorder)
}

/// The whole tokens left in budget `api` (a refill of much less than one token over the test
/// rounds away).
async fn tokens_left(buckets: &MemoryBudgetStore, policy: &BudgetPolicy, now: i64) -> f64 {
    let left = buckets.peek("api", &policy.bucket(), now).await.unwrap();
    left.round()
}

fn deleted(recorder: &Recorder) -> Vec<String> {
    recorder
        .events()
        .iter()
        .filter(|e| e.event_type == EventType::Deleted)
        .map(|e| e.subject.to_string())
        .collect()
}

#[tokio::test]
async fn a_lookup_is_charged_to_the_budget_with_a_fetch_context() {
    let world = World::new(12, PAGE_SIZE).unwrap();
    let calls = Arc::default();
    // 1,000 tokens refilled over 1,000 days: nothing refills during the test.
    let policy = BudgetPolicy::new(1_000, Duration::from_secs(86_400 * 1_000));
    let buckets = Arc::new(MemoryBudgetStore::new());
    let (engine, recorder) = engine(
        &world,
        poller(&world, 2, &calls).budget_cost(2),
        policy,
        &buckets,
    );

    world.tick(&engine).await.unwrap();
    assert_eq!(recorder.events().len(), 12);
    assert!(
        lock(&calls).is_empty(),
        "nothing missing, nothing looked up"
    );
    assert_eq!(
        tokens_left(&buckets, &policy, world.now()).await,
        1_000.0 - 3.0 * 2.0,
        "3 pages at 2 tokens"
    );

    for id in ["item-002", "item-006", "item-010"] {
        assert!(world.api.remove(id));
    }
    world.advance(Duration::from_secs(60));
    let result = world.tick(&engine).await.unwrap();
    assert!(
        result.polled.iter().all(|p| p.error.is_none()),
        "{result:?}"
    );
    let call = |ids: &[&str], page| Call {
        ids: ids.iter().map(|id| (*id).to_owned()).collect(),
        lane: Lane::Live,
        page,
        budget: Some("api".to_owned()),
        validators: false,
        clock: true,
    };
    assert_eq!(
        *lock(&calls),
        [call(&["item-002", "item-006"], 1), call(&["item-010"], 2)],
        "two batches in the listing's cycle, each with the lane, its number, the budget and \
         the clock, and no validators"
    );
    assert_eq!(
        tokens_left(&buckets, &policy, world.now()).await,
        1_000.0 - (3.0 + 3.0 + 2.0) * 2.0,
        "3 more pages and 2 lookups, each at the poller's cost"
    );
    assert_eq!(deleted(&recorder), ["item-002", "item-006", "item-010"]);
    assert!(engine.caught_up().await.unwrap());
}

#[tokio::test]
async fn a_lookup_the_budget_cannot_serve_is_deferred_and_deletes_nothing() {
    let world = World::new(12, PAGE_SIZE).unwrap();
    let calls = Arc::default();
    // 6 tokens, one back every 1,000 s; no waiting for a token.
    let policy = BudgetPolicy::new(6, Duration::from_secs(6_000)).with_max_wait(Duration::ZERO);
    let buckets = Arc::new(MemoryBudgetStore::new());
    let (engine, recorder) = engine(&world, poller(&world, 10, &calls), policy, &buckets);
    world.tick(&engine).await.unwrap();
    assert_eq!(recorder.events().len(), 12);

    // The listing takes the last 3 tokens; the lookup finds none.
    assert!(world.api.remove("item-006"));
    world.advance(Duration::from_secs(60));
    let result = world.tick(&engine).await.unwrap();
    assert!(
        result.polled.iter().all(|p| p.error.is_none()),
        "a budget timeout is a deferral, not a failure: {result:?}"
    );
    assert_eq!(lock(&calls).len(), 1, "the lookup asked for a token");
    assert!(deleted(&recorder).is_empty(), "deleted without a lookup");
    let inspected = engine.inspect().await.unwrap();
    assert_eq!(inspected.pollers[0].suspects, 1, "kept as a suspect");
    assert_eq!(inspected.pollers[0].schedule.consecutive_failures, 0);
    assert!(!engine.caught_up().await.unwrap());

    // Once the bucket refilled, the next listing and its lookup go through.
    world.advance(Duration::from_secs(4_000));
    let result = world.tick(&engine).await.unwrap();
    assert!(
        result.polled.iter().all(|p| p.error.is_none()),
        "{result:?}"
    );
    assert_eq!(lock(&calls).len(), 2);
    assert_eq!(deleted(&recorder), ["item-006"]);
    assert!(engine.caught_up().await.unwrap());
}

#[tokio::test]
async fn a_listing_of_one_page_deletes_without_a_lookup() {
    let world = World::new(3, PAGE_SIZE).unwrap();
    let calls = Arc::default();
    let policy = BudgetPolicy::new(1_000, Duration::from_secs(86_400 * 1_000));
    let buckets = Arc::new(MemoryBudgetStore::new());
    let (engine, recorder) = engine(&world, poller(&world, 10, &calls), policy, &buckets);
    world.tick(&engine).await.unwrap();
    assert!(world.api.remove("item-002"));
    world.advance(Duration::from_secs(60));
    world.tick(&engine).await.unwrap();
    assert_eq!(deleted(&recorder), ["item-002"]);
    assert!(
        lock(&calls).is_empty(),
        "one response cannot shift under itself"
    );
}

#[test]
fn the_builder_rejects_a_lookup_it_cannot_use() {
    let world = World::new(1, PAGE_SIZE).unwrap();
    let option = |result: Result<watukuy_core::Poller, Error>| match result {
        Ok(poller) => panic!("accepted: {poller:?}"),
        Err(error) => error.config_option().map(str::to_owned),
    };
    let calls = Arc::default();
    assert_eq!(
        option(poller(&world, 0, &calls).build()),
        Some("lookup.batch_size".to_owned())
    );
    assert_eq!(
        option(
            poller(&world, 10, &calls)
                .delete_confirmation(DeleteConfirmation::Immediate)
                .build()
        ),
        Some("delete_confirmation".to_owned())
    );
    assert_eq!(
        option(
            world
                .poller(StrategyKind::SnapshotDiff)
                .delete_confirmation(DeleteConfirmation::Lookup)
                .build()
        ),
        Some("lookup".to_owned()),
        "the rule without a lookup"
    );
    let incremental = world
        .poller(StrategyKind::Timestamp)
        .lookup(10, |_ctx: FetchContext, _ids: Vec<String>| async {
            Ok::<Page, BoxError>(Page::default())
        });
    assert_eq!(
        option(incremental.build()),
        Some("lookup".to_owned()),
        "nothing to confirm without a full scan"
    );
}
