//! The `reconcile` example's code: a local HTTP catalog whose listing changes while it is polled,
//! and a poller with two lanes over it — a live `timestamp` lane that reads what changed, and a
//! reconcile lane that lists everything, page by page, to find what was deleted (the live lane
//! cannot see a delete: a deleted item is simply no longer returned).
//!
//! - `GET /items?since=<ts>&after=<id>&limit=<n>`: the live lane's keyset, by `(updatedAt, id)`.
//! - `GET /items/all?offset=<n>&limit=<n>`: the full listing for the reconcile lane, ordered by
//!   `id` and paged by offset, the common shape, and the one that shifts: a delete between two
//!   page requests moves every later item one place up, so the item that moves onto the page
//!   already read is listed by no request, although it still exists.
//! - `GET /items/lookup?ids=<id>,<id>`: the items among `ids` that still exist. An item a
//!   complete listing missed is looked up here in the same cycle
//!   (`DeleteConfirmation::Lookup`, set by `PollerBuilder::lookup`): reported deleted only if
//!   the lookup does not return it, so a shifted listing never deletes a live item; see
//!   `docs/deletes.md`.
//!
//! [`scenario`] runs a fixed script on a manual clock, driving the engine with `tick()` (no
//! sleeps, so it is quick and deterministic), and returns what a consumer saw; the `reconcile`
//! binary runs it with `--scenario`, or runs the engine as a daemon over a catalog that keeps
//! changing until Ctrl-C or SIGTERM.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::Json;
use axum::extract::{Query, State};
use futures::TryStreamExt;
use watukuy_core::clock::format_rfc3339_ms;
use watukuy_core::cursor::{self, Cursor};
use watukuy_core::schedule::ScheduleOptions;
use watukuy_core::{
    BoxError, Engine, Event, EventType, FetchContext, HandlerContext, HandlerError, Lane, Page,
    Poller, TickOptions,
    clock::{Clock, ManualClock},
    store::{PKey, Store},
};
use watukuy_http::HttpClient;
use watukuy_store_memory::MemoryStore;

/// The poller's name.
pub const POLLER: &str = "catalog";

/// Items per page of both listings (small, so a full listing has several pages).
pub const PAGE_SIZE: usize = 3;

/// Identities per lookup request.
pub const LOOKUP_BATCH: usize = 10;

/// How often the reconcile lane lists everything.
pub const RECONCILE_EVERY: Duration = Duration::from_secs(10);

/// The catalog's items at the start: ids and prices.
pub const INITIAL_ITEMS: [(&str, u32); 6] = [
    ("item-01", 100),
    ("item-02", 200),
    ("item-03", 300),
    ("item-04", 400),
    ("item-05", 500),
    ("item-06", 600),
];

/// One catalog item, as the API returns it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Item {
    /// The identity.
    pub id: String,
    /// A name that changes on updates.
    pub name: String,
    /// The price in cents.
    pub price: u32,
    /// When it last changed (RFC 3339, milliseconds, UTC: fixed width, so it sorts as text).
    pub updated_at: String,
}

/// A change to the catalog.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Adds an item with this id and price.
    Add(&'static str, u32),
    /// Renames an item and changes its price.
    Update(&'static str, u32),
    /// Deletes an item.
    Delete(&'static str),
}

/// One lookup the API answered: what it was asked for and what it found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LookedUp {
    /// The ids asked for.
    pub asked: Vec<String>,
    /// Those that still exist.
    pub found: Vec<String>,
}

/// The catalog behind the HTTP server.
pub struct Catalog {
    clock: Arc<dyn Clock>,
    state: Mutex<CatalogState>,
}

#[derive(Default)]
struct CatalogState {
    items: BTreeMap<String, Item>,
    last_write_ms: i64,
    /// Every id ever deleted.
    deleted: BTreeSet<String>,
    /// Changes applied right after the full listing's next page of this number is served: the
    /// listing changes while the reconcile lane reads it.
    during_listing: Option<(usize, Vec<Change>)>,
    /// Every lookup answered, in order.
    lookups: Vec<LookedUp>,
}

impl Catalog {
    /// A catalog stamping writes with `clock`, holding `initial` (id, price) items.
    pub fn new(clock: Arc<dyn Clock>, initial: &[(&'static str, u32)]) -> Arc<Self> {
        let catalog = Arc::new(Self {
            clock,
            state: Mutex::default(),
        });
        for (id, price) in initial {
            catalog.apply(&Change::Add(id, *price));
        }
        catalog
    }

    fn lock(&self) -> MutexGuard<'_, CatalogState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies a change and describes it.
    pub fn apply(&self, change: &Change) -> String {
        let mut state = self.lock();
        apply(&mut state, self.clock.now_ms(), change)
    }

    /// Applies `changes` right after the next full listing serves its page `after_page`.
    pub fn during_next_listing(&self, after_page: usize, changes: Vec<Change>) {
        self.lock().during_listing = Some((after_page, changes));
    }

    /// The items now, by id.
    pub fn items(&self) -> BTreeMap<String, Item> {
        self.lock().items.clone()
    }

    /// Every id deleted so far.
    pub fn deleted(&self) -> BTreeSet<String> {
        self.lock().deleted.clone()
    }

    /// Every lookup answered so far.
    pub fn lookups(&self) -> Vec<LookedUp> {
        self.lock().lookups.clone()
    }
}

fn apply(state: &mut CatalogState, now_ms: i64, change: &Change) -> String {
    let now = now_ms.max(state.last_write_ms);
    state.last_write_ms = now;
    let stamp = format_rfc3339_ms(now);
    match change {
        Change::Add(id, price) => {
            state.items.insert(
                (*id).to_owned(),
                Item {
                    id: (*id).to_owned(),
                    name: format!("{id} v1"),
                    price: *price,
                    updated_at: stamp,
                },
            );
            format!("{id} added (price {price})")
        }
        Change::Update(id, price) => match state.items.get_mut(*id) {
            Some(item) => {
                let version = item
                    .name
                    .rsplit('v')
                    .next()
                    .and_then(|v| v.parse::<u32>().ok());
                item.name = format!("{id} v{}", version.unwrap_or(1) + 1);
                item.price = *price;
                item.updated_at = stamp;
                format!("{id} updated (price {price})")
            }
            None => format!("{id} not updated: it does not exist"),
        },
        Change::Delete(id) => {
            if state.items.remove(*id).is_some() {
                state.deleted.insert((*id).to_owned());
                format!("{id} deleted")
            } else {
                format!("{id} not deleted: it does not exist")
            }
        }
    }
}

#[derive(serde::Deserialize)]
struct SinceQuery {
    since: Option<String>,
    after: Option<String>,
    limit: Option<usize>,
}

#[derive(serde::Deserialize)]
struct AllQuery {
    offset: Option<usize>,
    limit: Option<usize>,
}

#[derive(serde::Deserialize)]
struct LookupQuery {
    ids: String,
}

/// A page of the full listing: the items, and whether more follow.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Listing {
    items: Vec<Item>,
    has_more: bool,
}

/// `GET /items`: items with `(updatedAt, id) > (since, after)` (or `updatedAt >= since` without
/// `after`), oldest first.
async fn changed_since(
    State(catalog): State<Arc<Catalog>>,
    Query(q): Query<SinceQuery>,
) -> Json<Vec<Item>> {
    let state = catalog.lock();
    let mut page: Vec<Item> = state
        .items
        .values()
        .filter(|i| match (&q.since, &q.after) {
            (None, _) => true,
            (Some(since), None) => i.updated_at.as_str() >= since.as_str(),
            (Some(since), Some(after)) => {
                (i.updated_at.as_str(), i.id.as_str()) > (since.as_str(), after.as_str())
            }
        })
        .cloned()
        .collect();
    page.sort_by(|a, b| (&a.updated_at, &a.id).cmp(&(&b.updated_at, &b.id)));
    page.truncate(q.limit.unwrap_or(PAGE_SIZE));
    Json(page)
}

/// `GET /items/all`: `limit` items by id from `offset` (0 by default), and whether more follow.
async fn listing(State(catalog): State<Arc<Catalog>>, Query(q): Query<AllQuery>) -> Json<Listing> {
    let limit = q.limit.unwrap_or(PAGE_SIZE).max(1);
    let offset = q.offset.unwrap_or(0);
    let mut state = catalog.lock();
    let items: Vec<Item> = state
        .items
        .values()
        .skip(offset)
        .take(limit)
        .cloned()
        .collect();
    let has_more = state.items.len() > offset + items.len();
    // Which page of the listing this is: 1 at offset 0.
    let page = offset / limit + 1;
    if let Some((at, _)) = &state.during_listing
        && *at == page
        && let Some((_, changes)) = state.during_listing.take()
    {
        let now = catalog.clock.now_ms();
        for change in &changes {
            let said = apply(&mut state, now, change);
            println!("  api: {said} (while the full listing is read, after its page {page})");
        }
    }
    Json(Listing { items, has_more })
}

/// `GET /items/lookup`: the items among `ids` (comma-separated) that exist, by id.
async fn lookup(
    State(catalog): State<Arc<Catalog>>,
    Query(q): Query<LookupQuery>,
) -> Json<Vec<Item>> {
    let mut state = catalog.lock();
    let asked: Vec<String> = q
        .ids
        .split(',')
        .filter(|id| !id.is_empty())
        .map(str::to_owned)
        .collect();
    let found: Vec<Item> = asked
        .iter()
        .filter_map(|id| state.items.get(id).cloned())
        .collect();
    let found_ids: Vec<String> = found.iter().map(|i| i.id.clone()).collect();
    println!(
        "  api: lookup of {}: {}",
        asked.join(", "),
        if found_ids.is_empty() {
            "none found".to_owned()
        } else {
            format!("{} found", found_ids.join(", "))
        }
    );
    state.lookups.push(LookedUp {
        asked,
        found: found_ids,
    });
    Json(found)
}

/// Serves `catalog` on 127.0.0.1 (a free port) and returns its base URL.
pub async fn serve(catalog: Arc<Catalog>) -> std::io::Result<String> {
    let app = axum::Router::new()
        .route("/items", axum::routing::get(changed_since))
        .route("/items/all", axum::routing::get(listing))
        .route("/items/lookup", axum::routing::get(lookup))
        .with_state(catalog);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(format!("http://{addr}"))
}

/// The poller: a live `timestamp` lane over `/items` and a reconcile lane over `/items/all`
/// (page numbers from 1, as offsets), checking every `reconcile_every`, whose missing items are
/// looked up through `/items/lookup`.
pub fn poller(base: &str, reconcile_every: Duration) -> Result<Poller, BoxError> {
    let http = HttpClient::new()?;
    let (live_http, live_url) = (http.clone(), format!("{base}/items"));
    let (all_http, all_url) = (http.clone(), format!("{base}/items/all"));
    let (lookup_http, lookup_url) = (http, format!("{base}/items/lookup"));
    Ok(Poller::builder::<Item>(POLLER)
        .identity(|item: &Item| item.id.clone())
        .version(|item: &Item| item.updated_at.clone())
        // The lag holds back writes of the current millisecond: a later write with the same
        // timestamp and a smaller id cannot be skipped.
        .cursor(
            cursor::timestamp("updatedAt")
                .tie_break("id")
                .lag(Duration::from_millis(1)),
        )
        .schedule(
            ScheduleOptions::default()
                .min(Duration::from_secs(1))
                .max(Duration::from_secs(2))
                .jitter(0.0),
        )
        .fetch(move |ctx: FetchContext| {
            let (http, url) = (live_http.clone(), live_url.clone());
            async move {
                let Cursor::Timestamp { value, tie_break } = &ctx.cursor else {
                    return Err(format!("the live lane got a {:?} cursor", ctx.cursor).into());
                };
                let page = http
                    .get(&ctx, url)
                    .query("since", value.clone())
                    .query("after", tie_break.clone())
                    .query("limit", PAGE_SIZE)
                    .send()
                    .await?
                    .items_page()?;
                let full = page.items.len() == PAGE_SIZE;
                Ok::<Page, BoxError>(page.has_more(full))
            }
        })
        // The reconcile lane: the whole listing by id, page by page (the default page cursor,
        // from 1 on every listing), as offsets.
        .reconcile(reconcile_every, move |ctx: FetchContext| {
            let (http, url) = (all_http.clone(), all_url.clone());
            async move {
                let Cursor::Page { page } = ctx.cursor else {
                    return Err(format!("the reconcile lane got a {:?} cursor", ctx.cursor).into());
                };
                let offset = usize::try_from(page.saturating_sub(1))? * PAGE_SIZE;
                let listing: Listing = http
                    .get(&ctx, url)
                    .query("offset", offset)
                    .query("limit", PAGE_SIZE)
                    .send()
                    .await?
                    .json()?;
                Ok::<Page, BoxError>(Page::from_items(&listing.items)?.has_more(listing.has_more))
            }
        })
        // An offset listing shifts under a delete: an item a listing missed is looked up (in the
        // same cycle, `LOOKUP_BATCH` ids a request, charged to the budget like a page) and
        // reported deleted only if the API no longer has it. The client answers for the lookup
        // as for a fetch (`ctx` is a fetch's context); a failed lookup deletes nothing.
        .lookup(LOOKUP_BATCH, move |ctx: FetchContext, ids: Vec<String>| {
            let (http, url) = (lookup_http.clone(), lookup_url.clone());
            async move {
                let found = http
                    .get(&ctx, url)
                    .query("ids", ids.join(","))
                    .send()
                    .await?
                    .items_page()?;
                Ok::<Page, BoxError>(found)
            }
        })
        .build()?)
}

/// One delivered event, as a consumer saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct Seen {
    /// Created, updated or deleted.
    pub event_type: EventType,
    /// The item's id.
    pub subject: String,
    /// The lane that found the change (deletes come from the reconcile lane).
    pub lane: Lane,
    /// The item (`None` for a delete).
    pub item: Option<Item>,
}

/// What the consumer of the events keeps: the items, rebuilt from the events alone.
#[derive(Default)]
pub struct Consumer {
    seen: Mutex<Vec<Seen>>,
    model: Mutex<BTreeMap<String, Item>>,
}

impl Consumer {
    /// Applies one event to the read model and prints it.
    pub fn apply(&self, event: &Event) -> Result<(), HandlerError> {
        let item: Option<Item> = event.data_as()?;
        {
            let mut model = self.model.lock().unwrap_or_else(PoisonError::into_inner);
            match (&event.event_type, &item) {
                (EventType::Deleted, _) | (_, None) => model.remove(event.subject.as_str()),
                (_, Some(item)) => model.insert(event.subject.to_string(), item.clone()),
            };
        }
        println!(
            "  {:<7} {} ({} lane){}",
            event.event_type.as_str(),
            event.subject,
            event.lane.as_str(),
            item.as_ref()
                .map(|i| format!(": {} price {}", i.name, i.price))
                .unwrap_or_default()
        );
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Seen {
                event_type: event.event_type,
                subject: event.subject.to_string(),
                lane: event.lane,
                item,
            });
        Ok(())
    }

    /// Every event delivered so far, in delivery order.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The read model.
    pub fn model(&self) -> BTreeMap<String, Item> {
        self.model
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// The engine over a fresh `MemoryStore`, delivering to `consumer`.
pub fn engine(
    poller: Poller,
    clock: Arc<dyn Clock>,
    store: Arc<MemoryStore>,
    consumer: &Arc<Consumer>,
) -> Result<Engine, BoxError> {
    let engine = Engine::builder(store).poller(poller).clock(clock).build()?;
    let consumer = Arc::clone(consumer);
    engine.on(POLLER, move |event: Event, _ctx: HandlerContext| {
        let consumer = Arc::clone(&consumer);
        async move { consumer.apply(&event) }
    })?;
    Ok(engine)
}

/// The identities in the engine's snapshot of the poller's items.
pub async fn snapshot(store: &MemoryStore) -> Result<BTreeSet<String>, BoxError> {
    let key = PKey::new(POLLER, "");
    let batches: Vec<Vec<String>> = store.stream_identities(&key, 1_000).try_collect().await?;
    Ok(batches.into_iter().flatten().collect())
}

/// What [`scenario`] ends with.
#[derive(Debug)]
pub struct Report {
    /// Every event the consumer got, in delivery order.
    pub seen: Vec<Seen>,
    /// The consumer's read model at the end.
    pub model: BTreeMap<String, Item>,
    /// The API's listing at the end.
    pub listing: BTreeMap<String, Item>,
    /// Every id the API deleted.
    pub deleted: BTreeSet<String>,
    /// The identities in the engine's snapshot at the end.
    pub snapshot: BTreeSet<String>,
    /// Every lookup the API answered.
    pub lookups: Vec<LookedUp>,
    /// The ticks it took after the last change until the consumer matched the API.
    pub settle_ticks: u32,
}

impl Report {
    /// True when the consumer's read model and the engine's snapshot equal the API's listing.
    pub fn converged(&self) -> bool {
        self.model == self.listing && self.snapshot.iter().eq(self.listing.keys())
    }
}

/// The fixed script: changes between ticks, and changes while a full listing is read.
fn script() -> Vec<Vec<Change>> {
    use Change::{Add, Delete, Update};
    vec![
        vec![Add("item-07", 700)],
        vec![Update("item-02", 250), Delete("item-03")],
        vec![],
        vec![Add("item-08", 800), Delete("item-05")],
        vec![Update("item-07", 710)],
        vec![Delete("item-07")],
        vec![],
        vec![Add("item-09", 900), Update("item-04", 450)],
        vec![Delete("item-01")],
        vec![],
        vec![Update("item-04", 460)],
        vec![],
    ]
}

/// Runs the fixed scenario on a manual clock: six items, then a change every second (adds,
/// updates, deletes, an item added and deleted again), one more set of changes made while a full
/// listing is being read, then ticks until the consumer's read model equals the API's listing
/// (at most 10 more reconcile periods). Prints the API's changes and every event.
pub async fn scenario() -> Result<Report, BoxError> {
    let clock = ManualClock::new(1_767_225_600_000); // 2026-01-01T00:00:00Z
    let shared_clock: Arc<dyn Clock> = Arc::new(clock.clone());
    let catalog = Catalog::new(Arc::clone(&shared_clock), &INITIAL_ITEMS);
    let base = serve(Arc::clone(&catalog)).await?;
    let store = Arc::new(MemoryStore::new());
    let consumer = Arc::new(Consumer::default());
    let engine = engine(
        poller(&base, RECONCILE_EVERY)?,
        Arc::clone(&shared_clock),
        Arc::clone(&store),
        &consumer,
    )?;
    store.migrate().await?;

    let tick = || async {
        clock.advance(Duration::from_secs(1));
        engine.tick(TickOptions::default()).await.map(|_| ())
    };
    println!("the API starts with 6 items; a change every second:");
    tick().await?;
    for (step, changes) in script().into_iter().enumerate() {
        for change in &changes {
            println!("  api: {}", catalog.apply(change));
        }
        if step == 6 {
            // The listing changes under the next reconcile: after its first page (item-02,
            // item-04, item-06), item-02 (listed already) and item-08 (not listed yet) are
            // deleted, and item-10 is added after the rest. Every later item moves up two
            // places, so page 2 (offset 3) starts at item-10 and no request lists item-09. The
            // lookup that follows the listing finds item-09 (kept) and not item-08 (reported
            // deleted by this listing); item-02 is reported by the next listing, item-10 created
            // by this one.
            catalog.during_next_listing(
                1,
                vec![
                    Change::Delete("item-02"),
                    Change::Delete("item-08"),
                    Change::Add("item-10", 1_000),
                ],
            );
        }
        tick().await?;
    }
    println!("no more changes: ticking until the consumer matches the API");
    let mut settle_ticks = 0;
    let limit = u32::try_from(RECONCILE_EVERY.as_secs() * 10).unwrap_or(100);
    loop {
        let report = Report {
            seen: consumer.seen(),
            model: consumer.model(),
            listing: catalog.items(),
            deleted: catalog.deleted(),
            snapshot: snapshot(&store).await?,
            lookups: catalog.lookups(),
            settle_ticks,
        };
        if report.converged() || settle_ticks >= limit {
            return Ok(report);
        }
        tick().await?;
        settle_ticks += 1;
    }
}
