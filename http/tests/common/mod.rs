//! What the server tests share: a real HTTP server (axum on 127.0.0.1) whose answers a test
//! scripts, and a real engine (`MemoryStore`, `ManualClock`) polling it through the helper.
#![allow(dead_code)] // each test binary uses a different part

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Method, Uri};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::Notify;
use watukuy_core::hooks::{FetchInfo, HookContext, Hooks};
use watukuy_core::schedule::{ScheduleOptions, ScheduleReason};
use watukuy_core::{
    Engine, Error, Event, EventType, FetchContext, HandlerContext, HandlerError, Partition,
    PollResult, Poller, TickOptions,
    backoff::Backoff,
    clock::ManualClock,
    cursor,
    poller::ValidatorAccess,
    rng::SeededRng,
    store::{PKey, Store},
};
use watukuy_http::{HttpClient, HttpResponse, RequestBuilder};
use watukuy_store_memory::MemoryStore;

/// 2026-01-01T00:00:00Z.
pub(crate) const T0: i64 = 1_767_225_600_000;
pub(crate) const POLLER: &str = "items";

// ----- the server -----

/// One request as the server saw it.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub(crate) method: String,
    pub(crate) uri: String,
    pub(crate) headers: HeaderMap,
}

impl Seen {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The first value of a query parameter (no percent-decoding: the tests send plain values).
    pub(crate) fn query(&self, name: &str) -> Option<String> {
        let query = self.uri.split_once('?')?.1;
        query.split('&').find_map(|pair| {
            let (key, value) = pair.split_once('=')?;
            (key == name).then(|| value.to_owned())
        })
    }
}

/// What the server answers.
#[derive(Clone, Debug, Default)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
    /// Never answer (the timeout test).
    pub(crate) hang: bool,
}

impl Reply {
    pub(crate) fn status(status: u16) -> Self {
        Self {
            status,
            ..Self::default()
        }
    }

    pub(crate) fn json(status: u16, body: &Value) -> Self {
        Self::status(status)
            .header("content-type", "application/json")
            .body(body.to_string())
    }

    pub(crate) fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    pub(crate) fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }
}

pub(crate) type Script = Arc<dyn Fn(&Seen) -> Reply + Send + Sync>;

#[derive(Clone)]
pub(crate) struct ServerState {
    pub(crate) seen: Arc<Mutex<Vec<Seen>>>,
    pub(crate) script: Arc<Mutex<Script>>,
    pub(crate) arrived: Arc<Notify>,
}

pub(crate) struct Server {
    pub(crate) addr: SocketAddr,
    pub(crate) state: ServerState,
}

impl Server {
    pub(crate) async fn start(script: impl Fn(&Seen) -> Reply + Send + Sync + 'static) -> Self {
        let state = ServerState {
            seen: Arc::default(),
            script: Arc::new(Mutex::new(Arc::new(script))),
            arrived: Arc::new(Notify::new()),
        };
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { addr, state }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// `GET path` on this server through `http`, as `ctx`.
    pub(crate) async fn get(
        &self,
        http: &HttpClient,
        ctx: &FetchContext,
        path: &str,
    ) -> Result<HttpResponse, Error> {
        self.get_with(http, ctx, path, |request| request).await
    }

    /// Like [`get`](Self::get), with the request changed by `adjust` (a header, error statuses
    /// returned as responses) before it is sent.
    pub(crate) async fn get_with<'a>(
        &self,
        http: &'a HttpClient,
        ctx: &'a FetchContext,
        path: &str,
        adjust: impl FnOnce(RequestBuilder<'a>) -> RequestBuilder<'a>,
    ) -> Result<HttpResponse, Error> {
        adjust(http.get(ctx, self.url(path))).send().await
    }

    pub(crate) fn script(&self, script: impl Fn(&Seen) -> Reply + Send + Sync + 'static) {
        *self.state.script.lock().unwrap() = Arc::new(script);
    }

    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }
}

pub(crate) async fn handle(
    State(state): State<ServerState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let seen = Seen {
        method: method.to_string(),
        uri: uri.to_string(),
        headers,
    };
    state.seen.lock().unwrap().push(seen.clone());
    let script = Arc::clone(&state.script.lock().unwrap());
    let reply = script(&seen);
    if reply.hang {
        state.arrived.notify_one();
        std::future::pending::<()>().await;
    }
    let mut response = Response::builder().status(reply.status);
    for (name, value) in &reply.headers {
        response = response.header(name, value);
    }
    response.body(Body::from(reply.body)).unwrap()
}

// ----- the engine -----

/// Records schedule changes and fetches.
#[derive(Default)]
pub(crate) struct Recorder {
    pub(crate) schedule: Mutex<Vec<(ScheduleReason, i64)>>,
    pub(crate) fetches: Mutex<Vec<FetchInfo>>,
}

#[async_trait]
impl Hooks for Recorder {
    async fn on_fetch(&self, _ctx: &HookContext, info: &FetchInfo) {
        self.fetches.lock().unwrap().push(*info);
    }

    async fn on_schedule_change(
        &self,
        _ctx: &HookContext,
        _interval_ms: i64,
        next_due_at: i64,
        reason: ScheduleReason,
    ) {
        self.schedule.lock().unwrap().push((reason, next_due_at));
    }
}

impl Recorder {
    pub(crate) fn last_reason(&self) -> (ScheduleReason, i64) {
        *self
            .schedule
            .lock()
            .unwrap()
            .last()
            .expect("a schedule change")
    }
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Item {
    pub(crate) id: String,
    pub(crate) v: i64,
}

pub(crate) struct Harness {
    pub(crate) engine: Engine,
    pub(crate) store: Arc<MemoryStore>,
    pub(crate) clock: ManualClock,
    pub(crate) recorder: Arc<Recorder>,
    pub(crate) events: Arc<Mutex<Vec<Event>>>,
    pub(crate) url: String,
}

impl Harness {
    /// A snapshot-diff poller listing `url` with the helper; schedule 10 s to 60 s, no jitter,
    /// backoff 1 s x 2.
    pub(crate) async fn new(url: String, http: HttpClient) -> Self {
        Self::with_cursor(url, http, cursor::snapshot_diff().into()).await
    }

    /// Like [`new`](Self::new) with another cursor; with the page strategy, the fetch sends the
    /// page number as `?page=N` and a page is the last unless it is full (two items).
    pub(crate) async fn with_cursor(
        url: String,
        http: HttpClient,
        strategy: cursor::CursorConfig,
    ) -> Self {
        let store = Arc::new(MemoryStore::new());
        let clock = ManualClock::new(T0);
        let recorder = Arc::new(Recorder::default());
        let poller = Poller::builder::<Item>(POLLER)
            .identity(|item: &Item| item.id.clone())
            .cursor(strategy)
            .schedule(
                ScheduleOptions::default()
                    .min(Duration::from_secs(10))
                    .max(Duration::from_secs(60))
                    .adaptive(true)
                    .jitter(0.0)
                    .backoff(Backoff::new(
                        Duration::from_secs(1),
                        2.0,
                        Duration::from_secs(60),
                    )),
            )
            .fetch({
                let url = url.clone();
                move |ctx: FetchContext| {
                    let (http, url) = (http.clone(), url.clone());
                    async move {
                        let request = http.get(&ctx, url);
                        let cursor::Cursor::Page { page } = ctx.cursor else {
                            return Ok(request.send().await?.items_page()?);
                        };
                        let page = request.query("page", page).send().await?.items_page()?;
                        let full = page.items.len() == 2;
                        Ok(page.has_more(full))
                    }
                }
            })
            .build()
            .unwrap();
        let engine = Engine::builder(Arc::clone(&store) as Arc<dyn Store>)
            .poller(poller)
            .clock(Arc::new(clock.clone()))
            .rng(Arc::new(SeededRng::new(7)))
            .hooks(Arc::clone(&recorder) as Arc<dyn Hooks>)
            .instance_id("node-a")
            .build()
            .unwrap();
        engine.migrate().await.unwrap();
        let events = collect_events(&engine, POLLER);
        Self {
            engine,
            store,
            clock,
            recorder,
            events,
            url,
        }
    }

    /// Triggers the poller (due now) and runs one tick; returns its one poll result.
    pub(crate) async fn poll(&self) -> PollResult {
        self.engine.trigger(POLLER, None).await.unwrap();
        let mut tick = self.engine.tick(TickOptions::default()).await.unwrap();
        assert_eq!(tick.polled.len(), 1, "{tick:?}");
        tick.polled.remove(0)
    }

    /// Checks the schedule after a poll at `at` failed for the first time: the next poll is due
    /// by backoff within a second, after one failure, and nothing throttles it. The schedule.
    pub(crate) async fn assert_backed_off_once(
        &self,
        at: i64,
    ) -> watukuy_core::store::ScheduleState {
        let (reason, next_due_at) = self.recorder.last_reason();
        assert_eq!(reason, ScheduleReason::Backoff);
        assert!((at..=at + 1_000).contains(&next_due_at), "{next_due_at}");
        let schedule = self.schedule().await;
        assert_eq!(schedule.consecutive_failures, 1);
        assert_eq!(schedule.throttled_until, None);
        schedule
    }

    pub(crate) async fn schedule(&self) -> watukuy_core::store::ScheduleState {
        let report = self.engine.inspect().await.unwrap();
        report.pollers[0].schedule.clone()
    }

    pub(crate) fn events(&self) -> Vec<(EventType, String)> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .map(|e| (e.event_type, e.subject.to_string()))
            .collect()
    }

    pub(crate) fn key() -> PKey {
        PKey::new(POLLER, "")
    }
}

pub(crate) fn client() -> HttpClient {
    HttpClient::new().unwrap()
}

/// A fetch context outside an engine run, optionally with validators.
pub(crate) fn context(validators: Option<ValidatorAccess>) -> FetchContext {
    let mut ctx = FetchContext::new(cursor::Cursor::Snapshot, Partition::new(""));
    ctx.clock = validators.as_ref().map(|v| Arc::clone(v.clock()));
    ctx.validators = validators;
    ctx
}

pub(crate) fn items() -> Value {
    json!([{ "id": "a", "v": 1 }, { "id": "b", "v": 2 }])
}

pub(crate) fn http_status(error: &Error) -> Option<u16> {
    match error {
        Error::Http { status, .. } => *status,
        _ => None,
    }
}

/// Registers a handler of `poller` on `engine` that keeps every event it is delivered, in
/// order; returns them.
pub(crate) fn collect_events(engine: &Engine, poller: &str) -> Arc<Mutex<Vec<Event>>> {
    let events = Arc::new(Mutex::new(Vec::new()));
    engine
        .on(poller, {
            let events = Arc::clone(&events);
            move |event: Event, _ctx: HandlerContext| {
                events.lock().unwrap().push(event);
                async { Ok::<(), HandlerError>(()) }
            }
        })
        .unwrap();
    events
}
