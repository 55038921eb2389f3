//! Helpers to drive engines against the [`FakeApi`] on a manual clock with seeded randomness:
//! what the engine-driven guarantee cases (and users' own engine tests) build on.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use watukuy_core::cursor::{self, Cursor, CursorConfig, CustomAdvance, FnCustomCursor};
use watukuy_core::schedule::ScheduleOptions;
use watukuy_core::{
    BoxError, DeliveryOptions, Engine, EngineBuilder, Event, FetchContext, HandlerContext,
    HandlerError, HandlerResult, Page, Poller, PollerBuilder, Result, TickOptions, TickResult,
    backoff::Backoff,
    clock::{Clock, ManualClock, TokioClock},
    rng::SeededRng,
    store::{PKey, ParkedKind, ParkedQuery, Store, ValidationIssue},
};

use crate::T0;
use crate::fake_api::{FakeApi, FakeApiOptions, fake_items};

/// The cursor strategies a world's poller can use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StrategyKind {
    /// `timestamp` on `updatedAt` with tie-break `id`.
    Timestamp,
    /// `token` over the fake's `/token` listing.
    Token,
    /// `page` over `/page`.
    Page,
    /// `snapshot_diff` over `/page` (full listing every cycle).
    SnapshotDiff,
    /// A `custom` page-number cursor over `/page`.
    Custom,
}

impl StrategyKind {
    /// Every strategy.
    pub const ALL: [StrategyKind; 5] = [
        StrategyKind::Timestamp,
        StrategyKind::Token,
        StrategyKind::Page,
        StrategyKind::SnapshotDiff,
        StrategyKind::Custom,
    ];

    /// Whether the strategy lists everything each cycle (and so sees deletes).
    pub fn sees_deletes(self) -> bool {
        self == StrategyKind::SnapshotDiff
    }

    /// How a world's poller of this kind reads the API (see [`World::poller`]): its cursor and
    /// the request its fetch makes.
    pub fn reader(self) -> (CursorConfig, Fetcher) {
        match self {
            StrategyKind::Timestamp => (
                cursor::timestamp("updatedAt").tie_break("id").into(),
                Fetcher::Since,
            ),
            StrategyKind::Token => (cursor::token(None).into(), Fetcher::Token),
            StrategyKind::Page => (cursor::page(1).into(), Fetcher::Page),
            StrategyKind::SnapshotDiff => (cursor::snapshot_diff().into(), Fetcher::All),
            StrategyKind::Custom => {
                let pages = FnCustomCursor::new(1_u64, |page: &u64, step| {
                    Ok(if step.has_more {
                        CustomAdvance {
                            cursor: page + 1,
                            done: false,
                        }
                    } else {
                        CustomAdvance {
                            cursor: 1,
                            done: true,
                        }
                    })
                });
                match cursor::custom(pages) {
                    Ok(strategy) => (strategy, Fetcher::Custom),
                    Err(_) => (cursor::page(1).into(), Fetcher::Page),
                }
            }
        }
    }
}

/// The poller name every world uses.
pub const POLLER: &str = "items";

/// The key of [`POLLER`]'s one partition (`""`).
pub fn key() -> PKey {
    PKey::new(POLLER, "")
}

/// Locks `mutex`, taking the data over from a holder that panicked.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A fake API on a manual clock: the API a test's engines poll.
#[derive(Clone, Debug)]
pub struct World {
    /// The clock every engine of the world shares.
    pub clock: ManualClock,
    /// The API.
    pub api: FakeApi,
}

impl World {
    /// A world whose API starts with `items` items (see [`fake_items`]: one second apart from
    /// 2026-01-01T00:00:00Z), listing `page_size` items per page. The clock starts one second
    /// after the last item, so no item lies in the future.
    pub fn new(items: usize, page_size: usize) -> std::result::Result<Self, BoxError> {
        let clock = ManualClock::new(after_items(items));
        let api = FakeApi::new(FakeApiOptions::new(Arc::new(clock.clone())).page_size(page_size));
        api.seed(fake_items(items))?;
        Ok(Self { clock, api })
    }

    /// Like [`new`](Self::new), but the API runs on the returned [`TokioClock`] (tokio's paused
    /// time in a test), which starts where `new` starts the manual clock: for engines that run
    /// as daemons on that clock. The world's own manual clock stays at T0, unused.
    pub fn on_tokio_clock(
        items: usize,
        page_size: usize,
    ) -> std::result::Result<(Self, TokioClock), BoxError> {
        let clock = TokioClock::starting_at(after_items(items));
        let api = FakeApi::new(FakeApiOptions::new(Arc::new(clock.clone())).page_size(page_size));
        api.seed(fake_items(items))?;
        let world = Self {
            clock: ManualClock::new(T0),
            api,
        };
        Ok((world, clock))
    }

    /// The schedule of a world's pollers: 5 s to 30 s, without jitter.
    pub fn schedule() -> ScheduleOptions {
        ScheduleOptions::default()
            .min(Duration::from_secs(5))
            .max(Duration::from_secs(30))
            .jitter(0.0)
    }

    /// A poller `items` over the API with the given strategy: identity `id`, schedule 5 s to
    /// 30 s without jitter, 3 delivery attempts with a 1 s to 4 s backoff, no handler timeout.
    pub fn poller(&self, kind: StrategyKind) -> PollerBuilder<serde_json::Value> {
        self.poller_named(POLLER, kind)
    }

    /// Like [`poller`](Self::poller) with another name (several pollers over one API). The
    /// fetch charges the poller's rate budget, if it has one, before each request.
    pub fn poller_named(&self, name: &str, kind: StrategyKind) -> PollerBuilder<serde_json::Value> {
        let api = self.api.clone();
        let builder = Poller::builder::<serde_json::Value>(name)
            .identity_field("id")
            .schedule(Self::schedule())
            // No handler timeout: world tests hold handlers open on purpose (stops, lost
            // leases); the timeout is tested on its own in `tests/handlers.rs`.
            .delivery(
                DeliveryOptions::default()
                    .attempts(3)
                    .backoff(Backoff::new(
                        Duration::from_secs(1),
                        2.0,
                        Duration::from_secs(4),
                    ))
                    .handler_timeout(None),
            );
        let (cursor, fetch) = kind.reader();
        builder.cursor(cursor).fetch(move |ctx: FetchContext| {
            let api = api.clone();
            async move {
                ctx.charge_budget().await?;
                fetch.run(&api, &ctx).await
            }
        })
    }

    /// An engine on `store` named `instance`, with this world's clock and a seeded RNG.
    pub fn engine(
        &self,
        store: Arc<dyn Store>,
        instance: &str,
        poller: Poller,
        seed: u32,
    ) -> Result<Engine> {
        self.engine_builder(store, instance, poller, seed).build()
    }

    /// An [`engine`](Self::engine) on `store` as node-a (rng seed 1), with a [`Recorder`]
    /// attached.
    pub fn recorded_engine(
        &self,
        store: Arc<dyn Store>,
        poller: Poller,
    ) -> Result<(Engine, Recorder)> {
        let engine = self.engine(store, "node-a", poller, 1)?;
        let recorder = Recorder::attached(&engine)?;
        Ok((engine, recorder))
    }

    /// The builder [`engine`](Self::engine) builds, for a test that adds to it (hooks, more
    /// pollers, a budget) before `build()`.
    pub fn engine_builder(
        &self,
        store: Arc<dyn Store>,
        instance: &str,
        poller: Poller,
        seed: u32,
    ) -> EngineBuilder {
        Engine::builder(store)
            .poller(poller)
            .clock(Arc::new(self.clock.clone()))
            .rng(Arc::new(SeededRng::new(seed)))
            .instance_id(instance)
    }

    /// An engine as node-a (rng seed `seed`) polling this world into `store` with a timestamp
    /// poller that keeps a one-day log, `consumer` attached: what an operator's tools (the
    /// command line, the admin page) inspect.
    pub fn consumer_engine(
        &self,
        store: Arc<dyn Store>,
        consumer: &Consumer,
        seed: u32,
    ) -> Result<Engine> {
        let poller = self
            .poller(StrategyKind::Timestamp)
            .log(Duration::from_secs(86_400))
            .build()?;
        let engine = self.engine(store, "node-a", poller, seed)?;
        consumer.attach(&engine)?;
        Ok(engine)
    }

    /// An engine as node-a polling this world (of at least four items) into `store`, whose
    /// first tick parks three rows: `item-001` and `item-003` poison (`consumer`, attached, fails
    /// them: build it with [`Consumer::failing`]), `item-004` quarantined (its check fails with
    /// "value too large"). What the operators' tools retry and discard.
    pub fn parking_engine(&self, store: Arc<dyn Store>, consumer: &Consumer) -> Result<Engine> {
        let poller = self
            .poller(StrategyKind::Timestamp)
            .check(|item: &serde_json::Value| {
                if item["id"] == "item-004" {
                    Err(vec![ValidationIssue {
                        message: "value too large".into(),
                        path: Some(vec!["value".into()]),
                    }])
                } else {
                    Ok(())
                }
            })
            .build()?;
        let engine = self.engine(store, "node-a", poller, 1)?;
        consumer.attach(&engine)?;
        Ok(engine)
    }

    /// A [`parking_engine`](Self::parking_engine) on `store` with a consumer failing `item-001`
    /// and `item-003`, ticked once: two poison rows and one quarantined item, their ids read
    /// back from the store (oldest first). Anything else parked is an error.
    pub async fn park(&self, store: Arc<dyn Store>) -> Result<Parked> {
        let consumer = Consumer::failing("cannot handle", &["item-001", "item-003"]);
        let engine = self.parking_engine(Arc::clone(&store), &consumer)?;
        self.tick(&engine).await?;
        let rows = store.list_parked(&key(), ParkedQuery::default()).await?;
        let ids = |kind: ParkedKind| -> Vec<String> {
            rows.iter()
                .filter(|row| row.kind == kind)
                .map(|row| row.id.clone())
                .collect()
        };
        let (poison, mut invalid) = (ids(ParkedKind::Poison), ids(ParkedKind::Invalid));
        if poison.len() != 2 || invalid.len() != 1 {
            return Err(watukuy_core::Error::config(
                "world",
                format!("expected 2 poison rows and 1 quarantined item, found {rows:?}"),
            ));
        }
        Ok(Parked {
            store,
            engine,
            consumer,
            poison,
            invalid: invalid.remove(0),
        })
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    /// Now on the world's clock.
    pub fn now(&self) -> i64 {
        self.clock.now_ms()
    }

    /// One `tick()` of `engine`.
    pub async fn tick(&self, engine: &Engine) -> Result<TickResult> {
        engine.tick(TickOptions::default()).await
    }
}

/// One second after the last of `items` seeded items: where a world's clock starts.
fn after_items(items: usize) -> i64 {
    let offset = i64::try_from(items).unwrap_or(0).saturating_mul(1_000);
    T0.saturating_add(offset)
}

/// The request a world's poller makes to the [`FakeApi`] (see [`StrategyKind::reader`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fetcher {
    /// `/since`, from the timestamp cursor.
    Since,
    /// `/token`.
    Token,
    /// `/page`, from the page cursor.
    Page,
    /// `/page`, every page (a full listing).
    All,
    /// `/page`, from the custom page-number cursor.
    Custom,
}

impl Fetcher {
    /// The page `ctx` asks for.
    pub async fn run(
        self,
        api: &FakeApi,
        ctx: &FetchContext,
    ) -> std::result::Result<Page, BoxError> {
        match self {
            Fetcher::Since => api.fetch_since(ctx).await,
            Fetcher::Token => api.fetch_token(ctx).await,
            Fetcher::Page => api.fetch_page(ctx).await,
            Fetcher::All => api.fetch_all(ctx).await,
            Fetcher::Custom => {
                let page = match &ctx.cursor {
                    Cursor::Custom(json) => json.decode::<u32>()?,
                    other => return Err(format!("custom fetch got a {other:?} cursor").into()),
                };
                let listing = api.list_page(page, Some(api.page_size())).await?;
                let mut out = Page::new(listing.items);
                out.has_more = listing.has_more;
                Ok(out)
            }
        }
    }
}

/// Records the events a handler received, in order.
#[derive(Clone, Debug)]
pub struct Recorder {
    events: Arc<Mutex<Vec<Event>>>,
    count: Arc<tokio::sync::watch::Sender<usize>>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self {
            events: Arc::default(),
            count: Arc::new(tokio::sync::watch::Sender::new(0)),
        }
    }
}

/// How long [`Recorder::wait_for`] waits before it gives up. It never decides a passing run: it
/// only turns a hang (an engine that never delivers) into a failure.
pub const HANG_GUARD: Duration = Duration::from_secs(120);

impl Recorder {
    /// A handler that records and succeeds.
    pub fn handler(
        &self,
    ) -> impl Fn(Event, HandlerContext) -> futures::future::Ready<HandlerResult> + Send + Sync + 'static
    {
        let (events, count) = (Arc::clone(&self.events), Arc::clone(&self.count));
        move |event: Event, _ctx: HandlerContext| {
            let mut events = events.lock().unwrap_or_else(PoisonError::into_inner);
            events.push(event);
            count.send_replace(events.len());
            futures::future::ready(Ok::<(), HandlerError>(()))
        }
    }

    /// A recorder registered as `engine`'s handler of [`POLLER`].
    pub fn attached(engine: &Engine) -> Result<Self> {
        let recorder = Self::default();
        engine.on(POLLER, recorder.handler())?;
        Ok(recorder)
    }

    /// Waits until at least `n` events were recorded (for engines running on their own, such as
    /// a daemon). Fails after [`HANG_GUARD`] of real time, which only a hang reaches.
    pub async fn wait_for(&self, n: usize) -> std::result::Result<(), String> {
        let mut rx = self.count.subscribe();
        let reached = matches!(
            tokio::time::timeout(HANG_GUARD, rx.wait_for(|count| *count >= n)).await,
            Ok(Ok(_))
        );
        if reached {
            Ok(())
        } else {
            Err(format!(
                "expected {n} events, got {} before the hang guard",
                *rx.borrow()
            ))
        }
    }

    /// Every recorded event.
    pub fn events(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The ids of every recorded event, in order.
    pub fn ids(&self) -> Vec<String> {
        self.events()
            .into_iter()
            .map(|e| e.id.to_string())
            .collect()
    }

    /// Forgets what was recorded.
    pub fn clear(&self) {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        self.count.send_replace(0);
    }
}

/// What [`World::park`] left: the store, the engine, its failing consumer, and the parked rows'
/// ids by kind.
pub struct Parked {
    /// The store holding the rows.
    pub store: Arc<dyn Store>,
    /// The engine that parked them.
    pub engine: Engine,
    /// The consumer failing `item-001` and `item-003` ([`Consumer::heal`] lets them through).
    pub consumer: Consumer,
    /// The poison rows (`item-001`, `item-003`).
    pub poison: Vec<String>,
    /// The quarantined item (`item-004`).
    pub invalid: String,
}

/// A handler for [`POLLER`] that records what it delivered and fails permanently (so the event
/// is parked at once), with the message `"{reason} {subject}"`, for the subjects it is told to
/// fail, until [`heal`](Self::heal)ed: the poison events an operator's tools show.
#[derive(Clone, Default)]
pub struct Consumer {
    delivered: Arc<Mutex<Vec<Event>>>,
    failing: Arc<Mutex<Vec<String>>>,
    reason: Arc<str>,
}

impl Consumer {
    /// A consumer that fails `subjects` with `reason`.
    pub fn failing(reason: &str, subjects: &[&str]) -> Self {
        let consumer = Self {
            reason: reason.into(),
            ..Self::default()
        };
        lock(&consumer.failing).extend(subjects.iter().map(|s| (*s).to_owned()));
        consumer
    }

    /// Every subject is handled from now on.
    pub fn heal(&self) {
        lock(&self.failing).clear();
    }

    /// What it delivered, in order.
    pub fn delivered(&self) -> Vec<Event> {
        lock(&self.delivered).clone()
    }

    /// The ids of what it delivered, in order.
    pub fn delivered_ids(&self) -> Vec<String> {
        lock(&self.delivered)
            .iter()
            .map(|e| e.id.to_string())
            .collect()
    }

    /// Registers it as `engine`'s handler of [`POLLER`].
    pub fn attach(&self, engine: &Engine) -> Result<watukuy_core::delivery::Unsubscribe> {
        let consumer = self.clone();
        engine.on(POLLER, move |event: Event, _ctx: HandlerContext| {
            let fail = lock(&consumer.failing).iter().any(|s| *s == event.subject);
            let result: HandlerResult = if fail {
                Err(HandlerError::permanent(format!(
                    "{} {}",
                    consumer.reason, event.subject
                )))
            } else {
                lock(&consumer.delivered).push(event);
                Ok(())
            };
            futures::future::ready(result)
        })
    }
}
