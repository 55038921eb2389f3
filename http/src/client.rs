//! The client, its builder, and one request.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{
    ACCEPT, AUTHORIZATION, CONTENT_TYPE, ETAG, HeaderMap, HeaderName, HeaderValue,
    IF_MODIFIED_SINCE, IF_NONE_MATCH, LAST_MODIFIED, RETRY_AFTER, USER_AGENT,
};
use reqwest::{Method, StatusCode, Url};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use watukuy_core::clock::duration_ms;
use watukuy_core::diff::hash_url;
use watukuy_core::{
    Error, FetchContext,
    clock::{Clock, SystemClock},
    poller::ValidatorAccess,
};

use crate::problem::ProblemDetails;
use crate::query::QueryValue;
use crate::rate_limit::parse_rate_limit;
use crate::redact::Redactor;
use crate::response::HttpResponse;
use crate::retry_after::parse_retry_after;

/// The `user-agent` sent unless overridden: `watukuy/<version>`.
pub const DEFAULT_USER_AGENT: &str = concat!("watukuy/", env!("CARGO_PKG_VERSION"));

/// The timeout of a request unless configured otherwise (send and body read together).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// How much of an error response's body is read (64 KiB); the rest is dropped.
pub const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;

/// The largest successful response body read unless configured otherwise (32 MiB); a larger one
/// is an error.
pub const DEFAULT_MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// The HTTP client a poller's fetch uses: build it once per poller and clone it freely.
///
/// Every request it sends charges the poller's rate budget, sends conditional headers from the
/// stored validators, is sent exactly once (never retried), and reads rate-limit headers,
/// `Retry-After` and problem details from the response. See the crate documentation.
#[derive(Clone)]
pub struct HttpClient {
    inner: Arc<Inner>,
}

struct Inner {
    client: reqwest::Client,
    headers: HeaderMap,
    timeout: Option<Duration>,
    max_body: usize,
    clock: Arc<dyn Clock>,
    redactor: Redactor,
}

impl fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &self.inner;
        f.debug_struct("HttpClient")
            .field("headers", &inner.redactor.headers(&inner.headers))
            .field("timeout", &inner.timeout)
            .field("max_body", &inner.max_body)
            .finish_non_exhaustive()
    }
}

impl HttpClient {
    /// A client with the defaults: `user-agent: watukuy/<version>`, `accept: application/json`,
    /// a 30 s timeout, rustls with the platform's certificate verifier.
    pub fn new() -> Result<Self, Error> {
        Self::builder().build()
    }

    /// A builder to set default headers, the timeout, the clock and extra redacted headers.
    pub fn builder() -> HttpClientBuilder {
        HttpClientBuilder::default()
    }

    /// A `GET` request to an absolute URL.
    pub fn get<'a>(&'a self, ctx: &'a FetchContext, url: impl Into<String>) -> RequestBuilder<'a> {
        self.request(ctx, Method::GET, url)
    }

    /// A `HEAD` request to an absolute URL.
    pub fn head<'a>(&'a self, ctx: &'a FetchContext, url: impl Into<String>) -> RequestBuilder<'a> {
        self.request(ctx, Method::HEAD, url)
    }

    /// A `POST` request to an absolute URL (no conditional headers unless asked).
    pub fn post<'a>(&'a self, ctx: &'a FetchContext, url: impl Into<String>) -> RequestBuilder<'a> {
        self.request(ctx, Method::POST, url)
    }

    /// A request with any method to an absolute URL. Conditional headers are on by default for
    /// `GET` and `HEAD` only.
    pub fn request<'a>(
        &'a self,
        ctx: &'a FetchContext,
        method: Method,
        url: impl Into<String>,
    ) -> RequestBuilder<'a> {
        RequestBuilder {
            client: self,
            ctx,
            method,
            url: url.into(),
            query: Vec::new(),
            headers: Vec::new(),
            body: None,
            cost: None,
            validators: None,
            timeout: None,
            throw_on_error: true,
            cancel: None,
            error: None,
        }
    }

    /// Which headers this client redacts in logs and spans.
    pub fn redactor(&self) -> &Redactor {
        &self.inner.redactor
    }
}

/// Configures an [`HttpClient`].
#[must_use]
pub struct HttpClientBuilder {
    headers: Vec<(String, String)>,
    timeout: Option<Duration>,
    max_body: usize,
    clock: Option<Arc<dyn Clock>>,
    redact: Vec<String>,
    client: Option<reqwest::Client>,
}

impl Default for HttpClientBuilder {
    fn default() -> Self {
        Self {
            headers: Vec::new(),
            timeout: Some(DEFAULT_TIMEOUT),
            max_body: DEFAULT_MAX_BODY_BYTES,
            clock: None,
            redact: Vec::new(),
            client: None,
        }
    }
}

impl fmt::Debug for HttpClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpClientBuilder")
            .field("timeout", &self.timeout)
            .field("max_body", &self.max_body)
            .finish_non_exhaustive()
    }
}

impl HttpClientBuilder {
    /// A header sent with every request (replacing the default of the same name). An invalid
    /// name or value is a `Config` error from [`build`](Self::build).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// `authorization: Bearer <token>` on every request (redacted in logs).
    pub fn bearer_auth(self, token: impl fmt::Display) -> Self {
        self.header(AUTHORIZATION.as_str(), format!("Bearer {token}"))
    }

    /// The timeout of every request, covering the send and the body read (default 30 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// No timeout (a request still ends when the cycle is cancelled).
    pub fn no_timeout(mut self) -> Self {
        self.timeout = None;
        self
    }

    /// The largest successful response body read (default 32 MiB); a larger one is an error.
    pub fn max_body_bytes(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    /// The clock for timeouts and HTTP dates when a request's fetch context carries none (inside
    /// an engine run the engine's clock is used). Default: the system clock.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Another header whose value is redacted in logs and spans, besides the default list.
    pub fn redact_header(mut self, name: impl Into<String>) -> Self {
        self.redact.push(name.into());
        self
    }

    /// Sends through this `reqwest` client instead of the default one (proxies, extra root
    /// certificates, connection pool settings). Its own default headers and timeout still
    /// apply underneath this builder's.
    pub fn reqwest_client(mut self, client: reqwest::Client) -> Self {
        self.client = Some(client);
        self
    }

    /// Builds the client.
    pub fn build(self) -> Result<HttpClient, Error> {
        let mut headers = HeaderMap::new();
        headers.insert(USER_AGENT, HeaderValue::from_static(DEFAULT_USER_AGENT));
        headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
        let redactor = Redactor::with_extra(&self.redact);
        merge_headers(&mut headers, &self.headers, &redactor, "http.headers")?;
        let client = match self.client {
            Some(client) => client,
            None => default_client()?,
        };
        Ok(HttpClient {
            inner: Arc::new(Inner {
                client,
                headers,
                timeout: self.timeout,
                max_body: self.max_body,
                clock: self.clock.unwrap_or_else(|| Arc::new(SystemClock)),
                redactor,
            }),
        })
    }
}

/// reqwest on rustls with the ring provider and the platform's certificate verifier.
fn default_client() -> Result<reqwest::Client, Error> {
    use rustls_platform_verifier::BuilderVerifierExt;
    let tls_error = |e: rustls::Error| Error::config("http.tls", e.to_string());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(tls_error)?
        .with_platform_verifier()
        .map_err(tls_error)?
        .with_no_client_auth();
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .build()
        .map_err(|e| Error::config("http.client", error_chain(&e)))
}

/// Applies `(name, value)` pairs: the first of a name replaces what `headers` had, later ones
/// of the same name add values. Errors never show a value (it may be a secret).
fn merge_headers(
    headers: &mut HeaderMap,
    pairs: &[(String, String)],
    redactor: &Redactor,
    option: &str,
) -> Result<(), Error> {
    let mut seen: Vec<HeaderName> = Vec::new();
    for (name, value) in pairs {
        let header = HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|_| Error::config(option, format!("invalid header name `{name}`")))?;
        let parsed = HeaderValue::from_str(value).map_err(|_| {
            Error::config(
                option,
                format!(
                    "invalid value for header `{header}`: {}",
                    redactor.value(header.as_str(), value)
                ),
            )
        })?;
        if seen.contains(&header) {
            headers.append(header, parsed);
        } else {
            headers.insert(header.clone(), parsed);
            seen.push(header);
        }
    }
    Ok(())
}

/// An error and its sources, joined with `: `.
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// One request, built with chained calls and sent with [`send`](Self::send).
#[must_use = "a request does nothing until it is sent"]
pub struct RequestBuilder<'a> {
    client: &'a HttpClient,
    ctx: &'a FetchContext,
    method: Method,
    url: String,
    query: Vec<(String, String)>,
    headers: Vec<(String, String)>,
    body: Option<Vec<u8>>,
    cost: Option<u64>,
    validators: Option<bool>,
    timeout: Option<Option<Duration>>,
    throw_on_error: bool,
    cancel: Option<CancellationToken>,
    error: Option<Error>,
}

impl fmt::Debug for RequestBuilder<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestBuilder")
            .field("method", &self.method)
            .field("url", &self.url)
            .field("query", &self.query)
            .finish_non_exhaustive()
    }
}

impl RequestBuilder<'_> {
    /// Adds query parameter `key`: `None` is skipped, sequences repeat the key (see
    /// [`QueryValue`]). Parameters already in the URL are kept.
    pub fn query(mut self, key: impl Into<String>, value: impl QueryValue) -> Self {
        let key = key.into();
        let mut values = Vec::new();
        value.append_values(&mut values);
        self.query
            .extend(values.into_iter().map(|v| (key.clone(), v)));
        self
    }

    /// Adds several query parameters (see [`query`](Self::query)).
    pub fn query_pairs<K, V>(mut self, pairs: impl IntoIterator<Item = (K, V)>) -> Self
    where
        K: Into<String>,
        V: QueryValue,
    {
        for (key, value) in pairs {
            self = self.query(key, value);
        }
        self
    }

    /// Sets a header (replacing the client's default of the same name; calling it again with the
    /// same name adds a value). An invalid name or value is a `Config` error from `send`.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// `authorization: Bearer <token>` (redacted in logs).
    pub fn bearer_auth(self, token: impl fmt::Display) -> Self {
        self.header(AUTHORIZATION.as_str(), format!("Bearer {token}"))
    }

    /// A JSON body (`content-type: application/json` unless set).
    pub fn json<T: serde::Serialize + ?Sized>(mut self, body: &T) -> Self {
        match serde_json::to_vec(body) {
            Ok(bytes) => {
                self.body = Some(bytes);
                if !self
                    .headers
                    .iter()
                    .any(|(n, _)| n.eq_ignore_ascii_case(CONTENT_TYPE.as_str()))
                {
                    self.headers.push((
                        CONTENT_TYPE.as_str().to_owned(),
                        "application/json".to_owned(),
                    ));
                }
            }
            Err(e) => {
                self.error = Some(Error::config(
                    "http.body",
                    format!("cannot serialize the JSON body: {e}"),
                ));
            }
        }
        self
    }

    /// A raw body.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = Some(body.into());
        self
    }

    /// Tokens this request takes from the poller's rate budget (default: the poller's
    /// `budget_cost`); `0` skips the budget.
    pub fn cost(mut self, cost: u64) -> Self {
        self.cost = Some(cost);
        self
    }

    /// Whether to send conditional headers from the stored validators and store the response's
    /// `ETag` / `Last-Modified` (default: on for `GET` and `HEAD`).
    pub fn validators(mut self, on: bool) -> Self {
        self.validators = Some(on);
        self
    }

    /// This request's timeout (send and body read), instead of the client's.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(Some(timeout));
        self
    }

    /// No timeout for this request (it still ends when the cycle is cancelled).
    pub fn no_timeout(mut self) -> Self {
        self.timeout = Some(None);
        self
    }

    /// `false`: an error status returns the response (`ok() == false`) instead of an error.
    pub fn throw_on_error(mut self, throw: bool) -> Self {
        self.throw_on_error = throw;
        self
    }

    /// Another cancellation for this request, besides the cycle's.
    pub fn cancel(mut self, token: CancellationToken) -> Self {
        self.cancel = Some(token);
        self
    }

    /// The final URL: absolute http(s) only, with the query parameters appended.
    fn final_url(&self) -> Result<Url, Error> {
        let mut url = Url::parse(self.url.trim()).map_err(|e| {
            Error::config(
                "http.url",
                format!("`{}` is not an absolute URL: {e}", self.url),
            )
        })?;
        if !matches!(url.scheme(), "http" | "https") || url.cannot_be_a_base() {
            return Err(Error::config(
                "http.url",
                format!("`{}` is not an http(s) URL", self.url),
            ));
        }
        if !self.query.is_empty() {
            url.query_pairs_mut().extend_pairs(&self.query);
        }
        Ok(url)
    }

    fn is_cancelled(&self) -> bool {
        self.ctx.cancel.is_cancelled() || self.cancel.as_ref().is_some_and(|c| c.is_cancelled())
    }

    /// Sends the request once. In order: build the URL (absolute only), stop if the cycle was
    /// cancelled, charge the rate budget, add conditional headers from the stored validator,
    /// send (raced against the timeout and cancellation), read rate-limit headers; then 304 →
    /// a not-modified response, 2xx → stage `ETag` / `Last-Modified` for the page's commit and return the response,
    /// anything else → read up to 64 KiB of the body, parse problem details and `Retry-After`,
    /// and return [`Error::Http`] (or the response, with `throw_on_error(false)`).
    ///
    /// Never retries. Network errors, timeouts and cancellation are [`Error::Http`] without a
    /// status; a budget that cannot serve the request returns its own error.
    pub async fn send(self) -> Result<HttpResponse, Error> {
        if let Some(error) = self.error {
            return Err(error);
        }
        let url = self.final_url()?;
        let span = tracing::info_span!(
            "watukuy.http",
            method = %self.method,
            url = %url,
            status = tracing::field::Empty,
        );
        self.run(url, span.clone()).instrument(span).await
    }

    async fn run(self, url: Url, span: tracing::Span) -> Result<HttpResponse, Error> {
        let inner = &*self.client.inner;
        let ctx = self.ctx;
        let method = self.method.clone();
        let clock = Arc::clone(ctx.clock.as_ref().unwrap_or(&inner.clock));
        let fail = |message: String| Error::Http {
            method: method.to_string(),
            url: url.to_string(),
            status: None,
            message: Some(message),
            retry_after_ms: None,
        };

        let mut headers = inner.headers.clone();
        merge_headers(&mut headers, &self.headers, &inner.redactor, "http.headers")?;
        if self.is_cancelled() {
            return Err(fail(
                "aborted: the request was cancelled before it was sent".into(),
            ));
        }
        match self.cost {
            None => ctx.charge_budget().await?,
            Some(0) => {}
            Some(cost) => {
                if let Some(budget) = &ctx.budget {
                    budget.charge(cost, &ctx.cancel).await?;
                }
            }
        }

        let use_validators = self
            .validators
            .unwrap_or(matches!(method, Method::GET | Method::HEAD));
        let access = ctx.validators.as_ref().filter(|_| use_validators);
        let url_hash = hash_url(url.as_str());
        if let Some(access) = access {
            conditional_headers(access, &url_hash, &mut headers).await;
        }

        tracing::debug!(headers = %inner.redactor.headers(&headers), "sending request");
        let mut request = reqwest::Request::new(method.clone(), url.clone());
        *request.headers_mut() = headers;
        if let Some(body) = self.body {
            *request.body_mut() = Some(body.into());
        }
        let timeout = self.timeout.unwrap_or(inner.timeout);
        let started = clock.now_ms();
        let extra_cancel = self.cancel.clone();
        let exchanged = tokio::select! {
            biased;
            () = ctx.cancel.cancelled() => Err(Exchange::Cancelled),
            () = cancelled(extra_cancel.as_ref()) => Err(Exchange::Cancelled),
            () = expire(clock.as_ref(), timeout) => Err(Exchange::TimedOut),
            result = exchange(&inner.client, request, &method, inner.max_body) => result,
        };
        let (status, response_headers, body) = match exchanged {
            Ok(parts) => parts,
            Err(Exchange::Cancelled) => {
                return Err(fail("aborted: the request was cancelled".into()));
            }
            Err(Exchange::TimedOut) => {
                let ms = timeout.map_or(0, duration_ms);
                return Err(fail(format!("timed out after {ms} ms")));
            }
            Err(Exchange::Failed(message)) => return Err(fail(message)),
            Err(Exchange::Body(status, message)) => {
                return Err(fail(format!(
                    "the body of the {status} response: {message}"
                )));
            }
        };

        let now = clock.now_ms();
        span.record("status", status.as_u16());
        tracing::debug!(
            status = status.as_u16(),
            headers = %inner.redactor.headers(&response_headers),
            duration_ms = now.saturating_sub(started),
            "response received",
        );
        let rate_limit = parse_rate_limit(&response_headers, now);
        let retry_after_ms = response_headers
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, now));
        let ok = status.is_success() || status == StatusCode::NOT_MODIFIED;
        let problem = if ok {
            None
        } else {
            let content_type = response_headers
                .get(CONTENT_TYPE)
                .and_then(|v| v.to_str().ok());
            ProblemDetails::parse(content_type, &body)
        };
        if let (true, Some(access)) = (status.is_success(), access) {
            stage_validators(access, &url_hash, &response_headers);
        }
        let response = HttpResponse {
            method,
            url,
            status,
            headers: response_headers,
            body,
            rate_limit,
            retry_after_ms,
            problem,
        };
        match response.error() {
            Some(error) if self.throw_on_error => {
                tracing::debug!(%error, "error response");
                Err(error)
            }
            _ => Ok(response),
        }
    }
}

/// Adds `If-None-Match` / `If-Modified-Since` from the stored validator, unless the request set
/// them itself. A failed load only warns.
async fn conditional_headers(access: &ValidatorAccess, url_hash: &str, headers: &mut HeaderMap) {
    let validator = match access.get(url_hash).await {
        Ok(Some(validator)) => validator,
        Ok(None) => return,
        Err(error) => {
            tracing::warn!(%error, "could not load the stored validators; sending an unconditional request");
            return;
        }
    };
    let pairs = [
        (IF_NONE_MATCH, validator.etag),
        (IF_MODIFIED_SINCE, validator.last_modified),
    ];
    for (name, value) in pairs {
        let Some(value) = value else { continue };
        if headers.contains_key(&name) {
            continue;
        }
        match HeaderValue::from_str(&value) {
            Ok(value) => {
                headers.insert(name, value);
            }
            Err(_) => {
                tracing::warn!(header = %name, "a stored validator is not a valid header value; not sent")
            }
        }
    }
}

/// Stages the response's `ETag` / `Last-Modified` for the commit of the page this fetch
/// returns: they become durable with that page or not at all.
fn stage_validators(access: &ValidatorAccess, url_hash: &str, headers: &HeaderMap) {
    let value = |name: HeaderName| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let (etag, last_modified) = (value(ETAG), value(LAST_MODIFIED));
    if etag.is_none() && last_modified.is_none() {
        return;
    }
    access.stage(url_hash, etag, last_modified);
}

async fn cancelled(token: Option<&CancellationToken>) {
    match token {
        Some(token) => token.cancelled().await,
        None => std::future::pending().await,
    }
}

async fn expire(clock: &dyn Clock, timeout: Option<Duration>) {
    match timeout {
        Some(timeout) => clock.sleep(timeout).await,
        None => std::future::pending().await,
    }
}

enum Exchange {
    Cancelled,
    TimedOut,
    Failed(String),
    Body(StatusCode, String),
}

/// Sends the request and reads the body: all of a 2xx body up to `max_body`, at most
/// [`MAX_ERROR_BODY_BYTES`] of any other, none of a 304 or a `HEAD` response.
async fn exchange(
    client: &reqwest::Client,
    request: reqwest::Request,
    method: &Method,
    max_body: usize,
) -> Result<(StatusCode, HeaderMap, Vec<u8>), Exchange> {
    let mut response = client
        .execute(request)
        .await
        .map_err(|e| Exchange::Failed(error_chain(&e.without_url())))?;
    let status = response.status();
    let headers = std::mem::take(response.headers_mut());
    if status == StatusCode::NOT_MODIFIED || *method == Method::HEAD {
        return Ok((status, headers, Vec::new()));
    }
    if status.is_success() {
        return match read_body(&mut response, max_body).await {
            Ok((body, false)) => Ok((status, headers, body)),
            Ok((_, true)) => Err(Exchange::Body(
                status,
                format!("larger than the limit of {max_body} bytes"),
            )),
            Err(e) => Err(Exchange::Body(status, error_chain(&e.without_url()))),
        };
    }
    // An error body is best effort: whatever arrived before a failure is kept.
    let mut body = Vec::new();
    let _ = read_into(&mut response, &mut body, MAX_ERROR_BODY_BYTES).await;
    Ok((status, headers, body))
}

async fn read_body(
    response: &mut reqwest::Response,
    limit: usize,
) -> Result<(Vec<u8>, bool), reqwest::Error> {
    let mut body = Vec::new();
    let truncated = read_into(response, &mut body, limit).await?;
    Ok((body, truncated))
}

/// Reads chunks into `body` up to `limit` bytes; `true` when more was left unread.
async fn read_into(
    response: &mut reqwest::Response,
    body: &mut Vec<u8>,
    limit: usize,
) -> Result<bool, reqwest::Error> {
    while let Some(chunk) = response.chunk().await? {
        let room = limit.saturating_sub(body.len());
        if chunk.len() > room {
            body.extend_from_slice(chunk.get(..room).unwrap_or_default());
            return Ok(true);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(false)
}
