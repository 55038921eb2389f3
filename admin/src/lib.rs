#![doc = include_str!("../README.md")]

use std::sync::Arc;

use axum::Router;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use watukuy_core::{
    Engine,
    clock::{Clock, SystemClock},
    ops::ParkedSelection,
    store::{PKey, ParkedKind, ParkedQuery, Store},
};

/// The page: plain HTML with a small inline script, served as is (no build step).
pub const PAGE_HTML: &str = include_str!("page.html");

/// The page's Content-Security-Policy: nothing is loaded from anywhere; the inline script and
/// style run, and the script talks to this router only.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'unsafe-inline'; \
     style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// Whether the page may change anything.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Look only: the retry and discard endpoints answer 403 (the default).
    #[default]
    ReadOnly,
    /// Parked rows may be retried and discarded.
    ReadWrite,
}

/// What the router serves: a store, optionally the engine running on it, the mode and an
/// optional bearer token.
///
/// With an [`Engine`], the page shows what [`Engine::inspect`] reports (lag computed by the
/// pollers' cursor strategies, only active partitions) and retries and discards go through the
/// engine (which validates the partition and wakes its daemon). With a store alone, the page
/// shows every key of the store, the way the `watukuy` command line does, and operations write
/// to the store directly (a daemon in another process picks them up on the key's next run).
#[derive(Clone)]
pub struct AdminState {
    store: Arc<dyn Store>,
    engine: Option<Engine>,
    clock: Arc<dyn Clock>,
    mode: Mode,
    token: Option<String>,
}

impl std::fmt::Debug for AdminState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminState")
            .field("engine", &self.engine)
            .field("mode", &self.mode)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .finish_non_exhaustive()
    }
}

impl AdminState {
    /// The page of `engine`, which runs on `store` (the same store the engine was built with).
    /// Read-only, no token.
    pub fn new(engine: Engine, store: Arc<dyn Store>) -> Self {
        Self {
            store,
            engine: Some(engine),
            clock: Arc::new(SystemClock),
            mode: Mode::ReadOnly,
            token: None,
        }
    }

    /// The page of a store alone, without the pollers' code. Read-only, no token.
    pub fn from_store(store: Arc<dyn Store>) -> Self {
        Self {
            store,
            engine: None,
            clock: Arc::new(SystemClock),
            mode: Mode::ReadOnly,
            token: None,
        }
    }

    /// Sets the mode (default [`Mode::ReadOnly`]).
    #[must_use]
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Requires `Authorization: Bearer <token>` on every API call (the page asks for it once
    /// and keeps it for the browser tab). An empty token is ignored.
    #[must_use]
    pub fn bearer_token(mut self, token: impl Into<String>) -> Self {
        let token = token.into();
        self.token = (!token.is_empty()).then_some(token);
        self
    }

    /// The clock for "now" of store-only reports (default: the system clock; with an engine
    /// the engine's clock is used).
    #[must_use]
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }
}

/// The admin router. Mount it anywhere (`Router::new().nest("/admin", router(state))`):
///
/// | route | |
/// |---|---|
/// | `GET /` | the page |
/// | `GET /api/info` | `{ mode, source, version }` |
/// | `GET /api/pollers` | the inspect report: `{ generatedAt, pollers: [PollerInspect] }` |
/// | `GET /api/pollers/{poller}/parked?partition=&kind=&limit=` | parked rows, oldest first |
/// | `POST /api/pollers/{poller}/parked/retry` | body `{ "partition"?: "…", "ids": ["…"] }` → `{ "retried": n }` |
/// | `POST /api/pollers/{poller}/parked/discard` | same body → `{ "discarded": n }` |
///
/// API calls answer 401 without the right bearer token (when one is set); the POST routes
/// answer 403 in [`Mode::ReadOnly`] and take `application/json` only (415 otherwise), so a
/// cross-site form cannot post to them. Errors are `{ "error": { "code", "message" } }`.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/api/info", get(info))
        .route("/api/pollers", get(pollers))
        .route("/api/pollers/{poller}/parked", get(parked))
        .route("/api/pollers/{poller}/parked/{operation}", post(operate))
        .with_state(Arc::new(state))
}

/// A router with one route, `GET /health`, for liveness and readiness probes: `200` with the
/// [`HealthReport`](watukuy_core::ops::HealthReport) as JSON while `engine` is healthy by
/// `options`, `503` with the same JSON (its `reasons` say why) when it is not, and `503` with
/// `{ "error": … }` when the store cannot be read. It needs no token and changes nothing; merge
/// it into your application's router (or [`router`]'s).
///
/// ```
/// use watukuy_admin::health_router;
/// use watukuy_core::Engine;
/// use watukuy_core::ops::HealthOptions;
///
/// fn app(engine: Engine) -> axum::Router {
///     // Down when the daemon is not running or a circuit is open.
///     health_router(engine, HealthOptions::default().require_running(true))
/// }
/// ```
pub fn health_router(engine: Engine, options: watukuy_core::ops::HealthOptions) -> Router {
    Router::new()
        .route("/health", get(health))
        .with_state(Arc::new((engine, options)))
}

async fn health(State(probe): State<Arc<(Engine, watukuy_core::ops::HealthOptions)>>) -> Response {
    let (engine, options) = &*probe;
    match engine.health(options).await {
        Ok(report) if report.healthy => (StatusCode::OK, axum::Json(report)).into_response(),
        Ok(report) => (StatusCode::SERVICE_UNAVAILABLE, axum::Json(report)).into_response(),
        Err(error) => {
            let mut api = ApiError::from(error);
            api.status = StatusCode::SERVICE_UNAVAILABLE;
            api.into_response()
        }
    }
}

type Shared = Arc<AdminState>;

/// An API error: a status, a stable code and a message.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    code: String,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        Self {
            status,
            code: code.to_owned(),
            message: message.into(),
        }
    }
}

impl From<watukuy_core::Error> for ApiError {
    fn from(error: watukuy_core::Error) -> Self {
        use watukuy_core::ErrorCode;
        let status = match error.code() {
            ErrorCode::UnknownPoller | ErrorCode::UnknownPartition | ErrorCode::NotFound => {
                StatusCode::NOT_FOUND
            }
            ErrorCode::Config => StatusCode::BAD_REQUEST,
            ErrorCode::LeaseLost => StatusCode::CONFLICT,
            ErrorCode::Store if error.is_transient() => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self::new(status, error.code().as_str(), error.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": { "code": self.code, "message": self.message } });
        let mut response = (self.status, axum::Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"watukuy\""),
            );
        }
        no_store(&mut response);
        response
    }
}

fn no_store(response: &mut Response) {
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
}

fn json_ok<T: Serialize>(value: &T) -> Response {
    let mut response = axum::Json(value).into_response();
    no_store(&mut response);
    response
}

/// Byte comparison whose time does not depend on where the inputs differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for (i, x) in a.iter().enumerate() {
        diff |= x ^ b.get(i).copied().unwrap_or(!x);
    }
    diff == 0
}

impl AdminState {
    fn authorize(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let Some(token) = &self.token else {
            return Ok(());
        };
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        match given {
            Some(given) if same(given.as_bytes(), token.as_bytes()) => Ok(()),
            Some(_) => Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "UNAUTHORIZED",
                "the bearer token is not the one this admin page was configured with",
            )),
            None => Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "UNAUTHORIZED",
                "this admin page needs `Authorization: Bearer <token>`",
            )),
        }
    }

    fn writable(&self) -> Result<(), ApiError> {
        match self.mode {
            Mode::ReadWrite => Ok(()),
            Mode::ReadOnly => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "READ_ONLY",
                "this admin page is read-only (AdminState::mode(Mode::ReadWrite) allows retry and discard)",
            )),
        }
    }

    fn now(&self) -> i64 {
        self.clock.now_ms()
    }

    /// The key of `poller`/`partition`, checked against the engine's pollers or the store's
    /// keys.
    async fn key(&self, poller: &str, partition: Option<&str>) -> Result<PKey, ApiError> {
        if let Some(engine) = &self.engine {
            // The engine checks the name and the partitioning; listing nothing is cheap.
            engine
                .list_parked(poller, partition, ParkedQuery::default().limit(0))
                .await?;
            return Ok(PKey::new(poller, partition.unwrap_or_default()));
        }
        Ok(watukuy_core::ops::stored_key(&*self.store, poller, partition).await?)
    }

    async fn store_report(&self) -> Result<serde_json::Value, ApiError> {
        let now = self.now();
        let pollers = watukuy_core::ops::inspect_store(&*self.store, None, None, now).await?;
        Ok(serde_json::json!({ "generatedAt": now, "pollers": pollers }))
    }
}

async fn page() -> Response {
    let mut response = axum::response::Html(PAGE_HTML).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    no_store(&mut response);
    response
}

async fn info(State(state): State<Shared>, headers: HeaderMap) -> Result<Response, ApiError> {
    state.authorize(&headers)?;
    Ok(json_ok(&serde_json::json!({
        "mode": state.mode,
        "source": if state.engine.is_some() { "engine" } else { "store" },
        "version": env!("CARGO_PKG_VERSION"),
    })))
}

async fn pollers(State(state): State<Shared>, headers: HeaderMap) -> Result<Response, ApiError> {
    state.authorize(&headers)?;
    match &state.engine {
        Some(engine) => Ok(json_ok(&engine.inspect().await?)),
        None => Ok(json_ok(&state.store_report().await?)),
    }
}

/// `?partition=&kind=&limit=` of the parked list.
#[derive(Debug, Deserialize)]
struct ParkedParams {
    partition: Option<String>,
    kind: Option<ParkedKind>,
    limit: Option<usize>,
}

async fn parked(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(poller): Path<String>,
    params: Result<Query<ParkedParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    state.authorize(&headers)?;
    let Query(params) =
        params.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "BAD_REQUEST", e.body_text()))?;
    let key = state.key(&poller, params.partition.as_deref()).await?;
    let mut selection = ParkedSelection::all().limit(params.limit.unwrap_or(500).min(5_000));
    if let Some(kind) = params.kind {
        selection = selection.kind(kind);
    }
    let rows = watukuy_core::ops::list_parked(&*state.store, &key, &selection).await?;
    Ok(json_ok(&rows))
}

/// The body of retry and discard.
#[derive(Debug, Deserialize)]
struct IdsBody {
    #[serde(default)]
    partition: Option<String>,
    ids: Vec<String>,
}

/// Retry or discard, the last segment of its path.
#[derive(Clone, Copy)]
enum Operation {
    Retry,
    Discard,
}

impl Operation {
    fn parse(segment: &str) -> Option<Self> {
        match segment {
            "retry" => Some(Self::Retry),
            "discard" => Some(Self::Discard),
            _ => None,
        }
    }

    /// The answer's field: how many rows it moved or removed.
    fn counted(self) -> &'static str {
        match self {
            Self::Retry => "retried",
            Self::Discard => "discarded",
        }
    }
}

async fn operate(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path((poller, operation)): Path<(String, String)>,
    body: Result<axum::Json<IdsBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Some(operation) = Operation::parse(&operation) else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            "no such operation: the parked rows take retry or discard",
        ));
    };
    state.authorize(&headers)?;
    state.writable()?;
    let axum::Json(body) =
        body.map_err(|e| ApiError::new(e.status(), "BAD_REQUEST", e.body_text()))?;
    if body.ids.is_empty() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "BAD_REQUEST",
            "`ids` must name at least one parked row",
        ));
    }
    let partition = body.partition.as_deref();
    let key = state.key(&poller, partition).await?;
    // The same rules either way (`ops`): the engine's methods also wake the key.
    let selection = ParkedSelection::ids(body.ids.iter().cloned());
    let count = match (&state.engine, operation) {
        (Some(engine), Operation::Retry) => {
            engine.retry_parked(&poller, partition, &body.ids).await?
        }
        (Some(engine), Operation::Discard) => {
            engine.discard_parked(&poller, partition, &body.ids).await?
        }
        (None, Operation::Retry) => {
            watukuy_core::ops::retry_parked(&*state.store, &key, &selection)
                .await?
                .len() as u64
        }
        (None, Operation::Discard) => {
            watukuy_core::ops::discard_parked(&*state.store, &key, &selection)
                .await?
                .len() as u64
        }
    };
    Ok(json_ok(&serde_json::json!({ operation.counted(): count })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_comparison() {
        assert!(same(b"secret", b"secret"));
        assert!(!same(b"secret", b"secreT"));
        assert!(!same(b"secret", b"secret2"));
        assert!(!same(b"", b"x"));
        assert!(same(b"", b""));
    }

    #[test]
    fn default_mode_is_read_only() {
        assert_eq!(Mode::default(), Mode::ReadOnly);
        assert_eq!(serde_json::to_value(Mode::ReadWrite).unwrap(), "read-write");
    }
}
