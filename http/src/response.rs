//! A response, and how it becomes a [`Page`].

use std::collections::BTreeMap;
use std::fmt;

use reqwest::header::HeaderMap;
use reqwest::{Method, StatusCode, Url};
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use watukuy_core::{Error, Page, store::RateLimitInfo};

use crate::items::Items;
use crate::problem::ProblemDetails;
use crate::redact::redact_headers;

/// A response: status, headers, the body (read once and kept), and what was parsed from it.
///
/// On a 304 Not Modified every body accessor is an error; turn the response into a page with
/// [`items_page`](Self::items_page), [`page_with`](Self::page_with) or
/// [`annotate`](Self::annotate), which handle 304 and carry the rate-limit information.
pub struct HttpResponse {
    pub(crate) method: Method,
    pub(crate) url: Url,
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Vec<u8>,
    pub(crate) rate_limit: Option<RateLimitInfo>,
    pub(crate) retry_after_ms: Option<i64>,
    pub(crate) problem: Option<ProblemDetails>,
}

impl fmt::Debug for HttpResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpResponse")
            .field("method", &self.method)
            .field("url", &self.url.as_str())
            .field("status", &self.status.as_u16())
            .field("headers", &redact_headers(&self.headers))
            .field("body_len", &self.body.len())
            .field("rate_limit", &self.rate_limit)
            .field("retry_after_ms", &self.retry_after_ms)
            .field("problem", &self.problem)
            .finish()
    }
}

impl HttpResponse {
    /// The status code.
    pub fn status(&self) -> u16 {
        self.status.as_u16()
    }

    /// 2xx or 304.
    pub fn ok(&self) -> bool {
        self.status.is_success() || self.not_modified()
    }

    /// The server answered 304 Not Modified: an idle cycle, never an empty listing.
    pub fn not_modified(&self) -> bool {
        self.status == StatusCode::NOT_MODIFIED
    }

    /// The request method.
    pub fn method(&self) -> &Method {
        &self.method
    }

    /// The final request URL, query included (the key of the stored validators).
    pub fn url(&self) -> &str {
        self.url.as_str()
    }

    /// The response headers.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// One header's first value as text (`None` if absent or not visible ASCII).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Rate-limit information from the headers; put it into the page to pace the schedule.
    pub fn rate_limit(&self) -> Option<&RateLimitInfo> {
        self.rate_limit.as_ref()
    }

    /// The `Retry-After` delay in milliseconds, if sent and readable.
    pub fn retry_after_ms(&self) -> Option<i64> {
        self.retry_after_ms
    }

    /// The problem details of an error response, if it had any.
    pub fn problem(&self) -> Option<&ProblemDetails> {
        self.problem.as_ref()
    }

    /// 429, or 503 with `Retry-After`: the scheduler waits exactly as told instead of backing off.
    pub fn is_throttle(&self) -> bool {
        self.status == StatusCode::TOO_MANY_REQUESTS
            || (self.status == StatusCode::SERVICE_UNAVAILABLE && self.retry_after_ms.is_some())
    }

    /// The error this response stands for: `None` for 2xx and 304, otherwise [`Error::Http`]
    /// with the message `<METHOD> <url> responded <status>[: <title>][: <detail>]` (the
    /// problem document's title and detail, those that are there).
    pub fn error(&self) -> Option<Error> {
        (!self.ok()).then(|| self.http_error(self.problem.as_ref().and_then(problem_message)))
    }

    /// `Err` with [`error`](Self::error) for an error status, the response otherwise (for
    /// requests sent with `throw_on_error(false)`).
    pub fn error_for_status(self) -> Result<Self, Error> {
        match self.error() {
            Some(error) => Err(error),
            None => Ok(self),
        }
    }

    fn http_error(&self, message: Option<String>) -> Error {
        Error::Http {
            method: self.method.to_string(),
            url: self.url.to_string(),
            status: Some(self.status.as_u16()),
            message,
            retry_after_ms: self.retry_after_ms,
        }
    }

    /// The body. Error responses keep at most 64 KiB of theirs. An error on 304.
    pub fn bytes(&self) -> Result<&[u8], Error> {
        if self.not_modified() {
            return Err(self.http_error(Some("a 304 Not Modified response has no body".to_owned())));
        }
        Ok(&self.body)
    }

    /// The body as text (invalid UTF-8 replaced). An error on 304.
    pub fn text(&self) -> Result<String, Error> {
        Ok(String::from_utf8_lossy(self.bytes()?).into_owned())
    }

    /// The body parsed as JSON. An error on 304 and on a body that does not parse as `T`.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, Error> {
        serde_json::from_slice(self.bytes()?).map_err(|e| self.not_json(&e))
    }

    fn not_json(&self, error: &serde_json::Error) -> Error {
        self.http_error(Some(format!("the body is not the expected JSON: {error}")))
    }

    /// Puts this response's not-modified flag and rate-limit information into `page`.
    #[must_use]
    pub fn annotate(&self, mut page: Page) -> Page {
        page.not_modified |= self.not_modified();
        if self.rate_limit.is_some() {
            page.rate_limit.clone_from(&self.rate_limit);
        }
        page
    }

    /// The page of a body that is a JSON array of items; a not-modified page on 304. Either way
    /// with the rate-limit information.
    ///
    /// Items are decoded one at a time (see [`Items`]): an item that cannot be decoded (a lone
    /// surrogate escape such as `"\ud800"`, nesting past 127 levels) is a rejected item of the
    /// page, with its text and the reason, and the other items go through. A body that is not
    /// a JSON array is an error.
    pub fn items_page(&self) -> Result<Page, Error> {
        self.page_with(Items::into_page)
    }

    /// The page of the JSON array at `pointer` (RFC 6901, e.g. `/data/items`, as
    /// `serde_json::Value::pointer` reads it); a not-modified page on 304. Either way with the
    /// rate-limit information.
    ///
    /// The items are decoded one at a time, as by [`items_page`](Self::items_page); only the
    /// objects and arrays on the way to `pointer` are decoded, not the rest of the body.
    pub fn items_page_at(&self, pointer: &str) -> Result<Page, Error> {
        if self.not_modified() {
            return Ok(self.annotate(Page::not_modified()));
        }
        let body: &RawValue =
            serde_json::from_slice(self.bytes()?).map_err(|e| self.not_json(&e))?;
        let no_array =
            || self.http_error(Some(format!("the body has no JSON array at `{pointer}`")));
        let array = raw_at(body, pointer)
            .map_err(|e| self.not_json(&e))?
            .filter(|raw| raw.get().starts_with('['))
            .ok_or_else(no_array)?;
        let items: Items = serde_json::from_str(array.get()).map_err(|e| self.not_json(&e))?;
        Ok(self.annotate(items.into_page()))
    }

    /// The page `build` makes from the body parsed as `T`, with the rate-limit information; on
    /// 304 a not-modified page (`build` is not called).
    ///
    /// ```no_run
    /// # async fn fetch(http: watukuy_http::HttpClient, ctx: watukuy_core::FetchContext)
    /// # -> Result<watukuy_core::Page, watukuy_core::BoxError> {
    /// #[derive(serde::Deserialize)]
    /// struct Listing {
    ///     // Decoded item by item: an item serde_json cannot take is rejected, not the page.
    ///     data: watukuy_http::Items,
    ///     next: Option<String>,
    /// }
    /// let response = http.get(&ctx, "https://api.example.com/orders").send().await?;
    /// Ok(response.page_with(|body: Listing| {
    ///     let page = body.data.into_page();
    ///     match body.next {
    ///         Some(next) => page.cursor(next).has_more(true),
    ///         None => page.has_more(false),
    ///     }
    /// })?)
    /// # }
    /// ```
    pub fn page_with<T: DeserializeOwned>(
        &self,
        build: impl FnOnce(T) -> Page,
    ) -> Result<Page, Error> {
        if self.not_modified() {
            return Ok(self.annotate(Page::not_modified()));
        }
        let body: T = self.json()?;
        Ok(self.annotate(build(body)))
    }
}

/// `<title>: <detail>`, or the one of them that is there and not blank.
fn problem_message(problem: &ProblemDetails) -> Option<String> {
    let text = |s: &Option<String>| s.clone().filter(|t| !t.trim().is_empty());
    match (text(&problem.title), text(&problem.detail)) {
        (Some(title), Some(detail)) => Some(format!("{title}: {detail}")),
        (title, detail) => title.or(detail),
    }
}

/// The value at `pointer` (RFC 6901) inside `raw`, found as `serde_json::Value::pointer` finds
/// it (`""` is the whole value, a token is unescaped `~1` → `/` then `~0` → `~`, an array index
/// is decimal without leading zeros), decoding only the objects and arrays on the way, one level
/// at a time. `Ok(None)` when there is nothing there; an error when an object on the way has a
/// member name that cannot be decoded.
fn raw_at<'a>(raw: &'a RawValue, pointer: &str) -> Result<Option<&'a RawValue>, serde_json::Error> {
    if pointer.is_empty() {
        return Ok(Some(raw));
    }
    let Some(tokens) = pointer.strip_prefix('/') else {
        return Ok(None);
    };
    let mut current = raw;
    for token in tokens.split('/') {
        let token = token.replace("~1", "/").replace("~0", "~");
        let text = current.get();
        let next = if text.starts_with('{') {
            // A later member of the same name replaces an earlier one, as in a `Value`.
            let mut members: BTreeMap<String, &'a RawValue> = serde_json::from_str(text)?;
            members.remove(&token)
        } else if text.starts_with('[') {
            let elements: Vec<&'a RawValue> = serde_json::from_str(text)?;
            array_index(&token).and_then(|index| elements.get(index).copied())
        } else {
            None
        };
        match next {
            Some(next) => current = next,
            None => return Ok(None),
        }
    }
    Ok(Some(current))
}

/// A JSON pointer token as an array index: decimal digits, no sign, no leading zero.
fn array_index(token: &str) -> Option<usize> {
    if token.starts_with('+') || (token.starts_with('0') && token.len() > 1) {
        return None;
    }
    token.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_at_finds_what_value_pointer_finds() {
        let text = r#"{"data":{"items":[1,[2,{"a/b":{"m~n":[3]}}]],"items":"last"},"":{"":4},
            "0":{"01":5,"1":6},"dup":1,"dup":[7]}"#;
        let value: serde_json::Value = serde_json::from_str(text).unwrap();
        let raw: &RawValue = serde_json::from_str(text).unwrap();
        for pointer in [
            "",
            "/data",
            "/data/items",
            "/data/items/1/1/a~1b/m~0n/0",
            "/data/items/2",
            "/data/items/01",
            "/data/items/+1",
            "/data/items/-",
            "/data/missing",
            "/",
            "//",
            "/0/01",
            "/0/1",
            "/dup",
            "/dup/0/x",
            "data",
        ] {
            let found = raw_at(raw, pointer)
                .unwrap()
                .map(|raw| serde_json::from_str::<serde_json::Value>(raw.get()).unwrap());
            assert_eq!(found.as_ref(), value.pointer(pointer), "{pointer}");
        }
    }
}
