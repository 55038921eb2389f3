//! Full scans in bounded memory (issue #12): the runner merges a `snapshot_diff` listing
//! against the stored identities page by page, keeping only the candidates for deletion while
//! the API lists in identity order, and falls back to a set of what it lists once the order
//! breaks. The engine end to end on `MemoryStore`, with a listing whose order each test
//! controls, a manual clock and seeded randomness.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::thread::ThreadId;

use serde_json::json;
use tracing::Metadata;
use tracing::field::{Field, Visit};
use tracing::subscriber::Interest;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use watukuy_core::{
    BoxError, Engine, Event, EventType, FetchContext, Page, Poller, TickOptions,
    clock::ManualClock,
    cursor,
    poller::{DeleteConfirmation, OnInvalid},
    rng::SeededRng,
    store::Store,
};
use watukuy_store_memory::MemoryStore;
use watukuy_testkit::world::{POLLER, Recorder};

/// The message of the runner's summary of a full scan's merge.
const MERGED: &str = "full scan merged against the stored identities";

/// An API that lists `ids` in the order given, `page_size` a page (page numbers from 1), and
/// applies the changes queued for a page right before it answers it.
#[derive(Clone)]
struct Listing(Arc<Mutex<ListingState>>);

struct ListingState {
    ids: Vec<String>,
    page_size: usize,
    /// Changes to apply when the page with this number is fetched (once).
    before_page: BTreeMap<u32, Vec<Change>>,
    /// Items answered with an invalid `value` (they fail validation).
    invalid: BTreeSet<String>,
}

enum Change {
    /// Insert at this position of the listing.
    Insert(usize, String),
}

impl Listing {
    fn new(ids: Vec<String>, page_size: usize) -> Self {
        Self(Arc::new(Mutex::new(ListingState {
            ids,
            page_size,
            before_page: BTreeMap::new(),
            invalid: BTreeSet::new(),
        })))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ListingState> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set(&self, ids: Vec<String>) {
        self.state().ids = ids;
    }

    fn page(&self, page: u32) -> Page {
        let mut state = self.state();
        for change in state.before_page.remove(&page).unwrap_or_default() {
            match change {
                Change::Insert(at, id) => state.ids.insert(at, id),
            }
        }
        let size = state.page_size;
        let start = (page as usize - 1) * size;
        let end = (start + size).min(state.ids.len());
        let items = state.ids[start.min(end)..end]
            .iter()
            .map(|id| {
                if state.invalid.contains(id) {
                    json!({ "id": id, "value": "not a number" })
                } else {
                    json!({ "id": id, "value": 1 })
                }
            })
            .collect();
        Page::new(items).has_more(end < state.ids.len())
    }
}

#[derive(serde::Deserialize, serde::Serialize)]
struct Item {
    id: String,
    value: i64,
}

/// An engine with a `snapshot_diff` poller over `listing` and a recorder on it. Invalid items
/// are quarantined; their identity is read from the raw `id`.
fn engine(listing: &Listing, store: Arc<dyn Store>) -> (Engine, Recorder) {
    let api = listing.clone();
    let poller = Poller::builder::<Item>(POLLER)
        .identity_field("id")
        .on_invalid(OnInvalid::Quarantine)
        .cursor(cursor::snapshot_diff())
        // These tests prove the merge: what one listing did not name. Whether a missing item is
        // reported at once or after a second listing is `DeleteConfirmation`'s job, proven by
        // the conformance case `lanes::a_shifting_listing_never_deletes_a_live_item`.
        .delete_confirmation(DeleteConfirmation::Immediate)
        .fetch(move |ctx: FetchContext| {
            let page = api.page(ctx.page);
            async move { Ok::<Page, BoxError>(page) }
        })
        .build()
        .unwrap();
    let engine = Engine::builder(store)
        .poller(poller)
        .clock(Arc::new(ManualClock::new(1_767_225_600_000)))
        .rng(Arc::new(SeededRng::new(1)))
        .instance_id("node-a")
        .build()
        .unwrap();
    let recorder = Recorder::attached(&engine).unwrap();
    (engine, recorder)
}

/// One forced cycle; the events it delivered, by type and subject.
async fn scan(engine: &Engine, recorder: &Recorder) -> Vec<(EventType, String)> {
    recorder.clear();
    engine.trigger(POLLER, None).await.unwrap();
    let result = engine.tick(TickOptions::default()).await.unwrap();
    for polled in &result.polled {
        assert!(polled.error.is_none(), "cycle failed: {:?}", polled.error);
    }
    recorder
        .events()
        .iter()
        .map(|e: &Event| (e.event_type, e.subject.to_string()))
        .collect()
}

fn of_type(events: &[(EventType, String)], event_type: EventType) -> Vec<String> {
    events
        .iter()
        .filter(|(t, _)| *t == event_type)
        .map(|(_, s)| s.clone())
        .collect()
}

fn id(i: usize) -> String {
    format!("id-{i:05}")
}

/// The events of `watukuy_core::full_scan` (the merge's summary, its warnings), recorded by
/// a process-wide subscriber with the thread that logged them. A global subscriber rather than
/// `set_default`: a callsite first hit on another test's thread while a scoped subscriber is
/// being installed can be cached as uninteresting, and its events lost.
static LOGGED: OnceLock<Recorded> = OnceLock::new();

/// Each recorded event's thread and fields.
type Recorded = Arc<Mutex<Vec<(ThreadId, HashMap<String, String>)>>>;

fn logged() -> &'static Recorded {
    LOGGED.get_or_init(|| {
        let events = Recorded::default();
        let layer = Recording(Arc::clone(&events));
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
            .expect("no other global subscriber in this test binary");
        events
    })
}

struct Recording(Recorded);

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }
}

impl<S: tracing::Subscriber> Layer<S> for Recording {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        if metadata.target() == "watukuy_core::full_scan" {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        let mut fields = HashMap::new();
        event.record(&mut Fields(&mut fields));
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((std::thread::current().id(), fields));
    }
}

/// The summaries of the merges this thread's engines logged (tests run their engines on a
/// current-thread runtime), oldest first.
fn merges() -> Vec<HashMap<String, String>> {
    let me = std::thread::current().id();
    logged()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .filter(|(thread, f)| *thread == me && f.get("message").is_some_and(|m| m == MERGED))
        .map(|(_, f)| f.clone())
        .collect()
}

fn number(fields: &HashMap<String, String>, name: &str) -> usize {
    fields[name].parse().unwrap()
}

/// Where a removed identity sat in the second listing.
#[derive(Debug, PartialEq, Eq)]
enum Position {
    Start,
    InsidePage,
    BetweenPages,
    End,
}

fn position(listing: &[String], page_size: usize, removed: &str) -> Position {
    let after = listing.partition_point(|id| id.as_str() < removed);
    if after == 0 {
        Position::Start
    } else if after == listing.len() {
        Position::End
    } else if after % page_size == 0 {
        Position::BetweenPages
    } else {
        Position::InsidePage
    }
}

#[tokio::test]
async fn a_sorted_listing_finds_deletes_at_the_start_inside_and_between_pages_and_at_the_end() {
    // 2,500 stored identities (three stored batches of 1,000), listed 100 a page.
    let all: Vec<String> = (0..2500).map(id).collect();
    let listing = Listing::new(all.clone(), 100);
    let (engine, recorder) = engine(&listing, Arc::new(MemoryStore::new()));
    assert_eq!(
        of_type(&scan(&engine, &recorder).await, EventType::Created).len(),
        2500
    );

    // Removing 0 and 1 shifts the rest by two, 555 by one more: the item after 1003 then
    // starts page 11, so 1003 sits between pages 10 and 11 (and in the second stored batch).
    let removed: Vec<String> = [0, 1, 555, 1003, 2499].into_iter().map(id).collect();
    let second: Vec<String> = all
        .iter()
        .filter(|i| !removed.contains(i))
        .cloned()
        .collect();
    let positions: Vec<Position> = removed.iter().map(|r| position(&second, 100, r)).collect();
    assert_eq!(
        positions,
        [
            Position::Start,
            Position::Start,
            Position::InsidePage,
            Position::BetweenPages,
            Position::End
        ]
    );
    listing.set(second);
    let events = scan(&engine, &recorder).await;
    assert_eq!(of_type(&events, EventType::Deleted), removed, "{events:?}");
    assert_eq!(events.len(), removed.len(), "nothing but the deletes");

    // Nothing changed: nothing is emitted.
    assert!(scan(&engine, &recorder).await.is_empty());
}

#[tokio::test]
async fn an_unsorted_listing_falls_back_and_deletes_on_both_sides_of_the_high_water_mark() {
    logged();
    let all: Vec<String> = (0..30).map(id).collect();
    let listing = Listing::new(all, 4);
    let (engine, recorder) = engine(&listing, Arc::new(MemoryStore::new()));
    assert_eq!(scan(&engine, &recorder).await.len(), 30);

    // Pages of 4: [1 2 4 5] [6 8 9 10] in order (0, 3 and 7 passed: candidates; hi = 10),
    // then [3 20 21 22] breaks the order and lists 3 again, then [11 13 25 26] [27 29 12].
    let order = [
        1, 2, 4, 5, 6, 8, 9, 10, 3, 20, 21, 22, 11, 13, 25, 26, 27, 29, 12,
    ];
    listing.set(order.into_iter().map(id).collect());
    let events = scan(&engine, &recorder).await;
    // At or below hi: candidates not listed again (0, 7). Above: not listed after the break.
    let expected: Vec<String> = [0, 7, 14, 15, 16, 17, 18, 19, 23, 24, 28]
        .into_iter()
        .map(id)
        .collect();
    assert_eq!(of_type(&events, EventType::Deleted), expected, "{events:?}");
    assert_eq!(events.len(), expected.len());
    let merges = merges();
    let last = merges.last().expect("the runner summarises the merge");
    assert_eq!(last["in_order"], "false", "{last:?}");
    // It held the identities listed from the break on (11 of them), at least.
    assert!(number(last, "held_peak") >= 11, "{last:?}");
}

#[tokio::test]
async fn items_added_during_the_scan_are_created_and_never_deleted() {
    // 2,000 stored identities with even numbers; the second listing adds every odd number
    // below 2,400 (new identities between stored ones, across the stored batches of 1,000)
    // and drops every tenth stored one.
    let stored: Vec<String> = (0..2000).map(|i| id(2 * i)).collect();
    let listing = Listing::new(stored.clone(), 150);
    let (engine, recorder) = engine(&listing, Arc::new(MemoryStore::new()));
    assert_eq!(scan(&engine, &recorder).await.len(), 2000);

    let second: Vec<String> = (0..4000)
        .filter(|n| (n % 2 == 1 && *n < 2400) || (n % 2 == 0 && n % 20 != 0))
        .map(id)
        .collect();
    listing.set(second.clone());
    // While the scan runs, the API gains one item behind it (on page 6, before what page 6
    // lists: not listed this cycle, and the page window shifts, so page 6 lists the last item
    // of page 5 again) and one ahead of it (listed later in this cycle).
    let behind = "id-00000x".to_owned();
    let ahead = id(3999);
    listing
        .state()
        .before_page
        .insert(6, vec![Change::Insert(0, behind.clone())]);
    let at = second.partition_point(|i| i < &ahead);
    listing
        .state()
        .before_page
        .insert(7, vec![Change::Insert(at + 1, ahead.clone())]);

    let events = scan(&engine, &recorder).await;
    let deleted = of_type(&events, EventType::Deleted);
    let expected_deleted: Vec<String> = (0..2000)
        .map(|i| 2 * i)
        .filter(|i| *i % 20 == 0)
        .map(id)
        .collect();
    assert_eq!(deleted, expected_deleted);
    let created: BTreeSet<String> = of_type(&events, EventType::Created).into_iter().collect();
    let new: BTreeSet<String> = second
        .iter()
        .filter(|i| !stored.contains(i))
        .cloned()
        .chain([ahead.clone()])
        .collect();
    assert_eq!(created, new);
    assert!(!created.contains(&behind), "not listed in this cycle");

    // The next cycle lists the item that arrived behind the scan; nothing is deleted.
    let events = scan(&engine, &recorder).await;
    assert_eq!(events, vec![(EventType::Created, behind)]);
}

#[tokio::test]
async fn invalid_items_with_an_identity_still_count_as_listed() {
    let all: Vec<String> = (0..50).map(id).collect();
    let listing = Listing::new(all.clone(), 7);
    let (engine, recorder) = engine(&listing, Arc::new(MemoryStore::new()));
    assert_eq!(scan(&engine, &recorder).await.len(), 50);
    // 10 starts failing validation (quarantined, still listed); 20 disappears.
    listing.state().invalid.insert(id(10));
    listing.set(all.into_iter().filter(|i| *i != id(20)).collect());
    let events = scan(&engine, &recorder).await;
    assert_eq!(events, vec![(EventType::Deleted, id(20))]);
}

#[tokio::test]
async fn a_sorted_scan_holds_one_stored_batch_and_the_deletes_not_a_set_of_the_listing() {
    logged();
    let n = 10_000;
    let all: Vec<String> = (0..n).map(id).collect();
    let listing = Listing::new(all.clone(), 500);
    let (engine, recorder) = engine(&listing, Arc::new(MemoryStore::new()));
    assert_eq!(scan(&engine, &recorder).await.len(), n);

    listing.set(all.into_iter().filter(|i| !i.ends_with("000")).collect());
    let events = scan(&engine, &recorder).await;
    assert_eq!(events.len(), 10, "ten deletes");
    let merges = merges();
    let [first, second] = merges.as_slice() else {
        panic!("one merge per cycle: {merges:?}");
    };
    for merge in [first, second] {
        assert_eq!(merge["in_order"], "true", "{merge:?}");
    }
    assert_eq!(number(second, "listed"), n - 10);
    let held = number(second, "held_peak");
    // The old scan held a set of all 9,990 listed identities; the merge holds at most one
    // stored batch (1,000) plus the 10 deletes.
    assert!(
        held <= 1000 + 10,
        "a sorted scan over {n} items held {held}"
    );
    // The first scan, over an empty snapshot, holds nothing at all.
    assert_eq!(number(first, "held_peak"), 0);
}

/// Seeded random listings (in order, nearly in order, shuffled; with new, repeated and
/// removed identities; pages of random sizes; several stored batches) delete exactly the
/// stored identities the listing did not name, and create exactly the new ones.
#[tokio::test]
async fn random_listings_delete_exactly_what_was_not_listed() {
    for seed in 1..=24_u32 {
        let rng = SeededRng::new(seed);
        let pick = |n: usize| rng.next_u32() as usize % n.max(1);
        let stored: BTreeSet<String> = (0..pick(2500)).map(|_| id(pick(5000))).collect();
        let listing = Listing::new(stored.iter().cloned().collect(), 1 + pick(300));
        let (engine, recorder) = engine(&listing, Arc::new(MemoryStore::new()));
        let label = format!("seed {seed}");
        assert_eq!(
            scan(&engine, &recorder).await.len(),
            stored.len(),
            "{label}"
        );

        let mut second: Vec<String> = stored
            .iter()
            .filter(|_| pick(20) != 0)
            .cloned()
            .chain((0..pick(100)).map(|_| format!("{}n", id(pick(5000)))))
            .collect();
        second.sort();
        second.dedup();
        let mut listed = second.clone();
        match pick(4) {
            0 => {}
            1 => {
                for _ in 0..=pick(3) {
                    if listed.len() > 1 {
                        let (i, j) = (pick(listed.len()), pick(listed.len()));
                        listed.swap(i, j);
                    }
                }
            }
            2 => {
                for _ in 0..pick(5) {
                    if !listed.is_empty() {
                        let again = listed[pick(listed.len())].clone();
                        let at = pick(listed.len() + 1);
                        listed.insert(at, again);
                    }
                }
            }
            _ => {
                for i in (1..listed.len()).rev() {
                    listed.swap(i, pick(i + 1));
                }
            }
        }
        listing.set(listed);
        let events = scan(&engine, &recorder).await;
        let expected_deleted: Vec<String> = stored
            .iter()
            .filter(|i| second.binary_search(i).is_err())
            .cloned()
            .collect();
        assert_eq!(
            of_type(&events, EventType::Deleted),
            expected_deleted,
            "{label}"
        );
        let created: BTreeSet<String> = of_type(&events, EventType::Created).into_iter().collect();
        let expected_created: BTreeSet<String> = second
            .iter()
            .filter(|i| !stored.contains(*i))
            .cloned()
            .collect();
        assert_eq!(created, expected_created, "{label}");
    }
}
