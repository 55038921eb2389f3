#![doc = include_str!("../README.md")]

mod client;
mod items;
mod num;
mod problem;
mod query;
mod rate_limit;
mod redact;
mod response;
mod retry_after;

pub use client::{
    DEFAULT_MAX_BODY_BYTES, DEFAULT_TIMEOUT, DEFAULT_USER_AGENT, HttpClient, HttpClientBuilder,
    MAX_ERROR_BODY_BYTES, RequestBuilder,
};
pub use items::Items;
pub use problem::ProblemDetails;
pub use query::QueryValue;
pub use rate_limit::parse_rate_limit;
pub use redact::{REDACTED, REDACTED_HEADERS, RedactedHeaders, Redactor, redact_headers};
pub use response::HttpResponse;
pub use retry_after::parse_retry_after;

/// HTTP methods (re-exported from `reqwest`/`http`).
pub use reqwest::Method;
/// Header names and values (re-exported from `reqwest`/`http`).
pub use reqwest::header;
