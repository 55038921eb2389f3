//! The HTTP helper against a real HTTP server (axum on 127.0.0.1), driving a real engine on a
//! `MemoryStore` and a `ManualClock`. Nothing sleeps: time moves only when a test moves it.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use watukuy_core::diff::hash_url;
use watukuy_core::schedule::ScheduleReason;
use watukuy_core::{
    Engine, Error, ErrorCode, EventType, FetchContext, Page, Poller, TickOptions,
    budget::BudgetPolicy,
    clock::ManualClock,
    cursor,
    poller::ValidatorAccess,
    store::{CommitBatch, PKey, ParkedKind, ParkedQuery, RateLimitSource, Store},
};
use watukuy_http::{HttpClient, MAX_ERROR_BODY_BYTES};
use watukuy_store_memory::MemoryStore;

use common::{Harness, Item, POLLER, Reply, Seen, Server, T0, client, context, http_status, items};

// ----- ETag → 304 -----

/// The API of the ETag tests: two pages of two items (`?page=1`, `?page=2`) and an empty page 3,
/// each with an ETag derived from its content (`"p<page>-<version>"`), answering 304 to a
/// matching `If-None-Match`.
fn paged_etag_api(version: &'static str) -> impl Fn(&Seen) -> Reply + Send + Sync + 'static {
    move |seen: &Seen| {
        let page = seen.query("page").unwrap_or_default();
        let body = match (page.as_str(), version) {
            ("1", _) => json!([{ "id": "a", "v": 1 }, { "id": "b", "v": 1 }]),
            ("2", "v1") => json!([{ "id": "c", "v": 1 }, { "id": "d", "v": 1 }]),
            ("2", _) => json!([{ "id": "c", "v": 2 }, { "id": "d", "v": 1 }]),
            _ => json!([]),
        };
        let etag = format!("\"p{page}-{version}\"");
        if page != "1" && page != "2" {
            return Reply::json(200, &body);
        }
        let etag = if page == "1" {
            "\"p1\"".to_owned()
        } else {
            etag
        };
        if seen.header("if-none-match") == Some(etag.as_str()) {
            return Reply::status(304).header("etag", &etag);
        }
        Reply::json(200, &body)
            .header("etag", &etag)
            .header("last-modified", "Wed, 31 Dec 2025 23:00:00 GMT")
    }
}

#[tokio::test]
async fn etag_304_is_an_idle_page_and_never_hides_a_later_page() {
    let server = Server::start(paged_etag_api("v1")).await;
    let h = Harness::with_cursor(server.url("/items"), client(), cursor::page(1).into()).await;

    let first = h.poll().await;
    assert_eq!(first.error, None);
    assert_eq!(h.events().len(), 4);
    let page_1 = format!("{}?page=1", h.url);
    let stored = h
        .store
        .get_validator(&Harness::key(), &hash_url(&page_1))
        .await
        .unwrap()
        .expect("the ETag was committed under the hash of the final URL");
    assert_eq!(stored.etag.as_deref(), Some("\"p1\""));
    assert_eq!(
        stored.last_modified.as_deref(),
        Some("Wed, 31 Dec 2025 23:00:00 GMT")
    );
    assert_eq!(stored.stored_at, T0, "stamped with the engine's clock");

    // Nothing changed: pages 1 and 2 answer 304, page 3 (empty, no ETag) ends the listing.
    let seen_before = server.seen().len();
    let second = h.poll().await;
    assert_eq!(second.error, None);
    let requests = server.seen().split_off(seen_before);
    assert_eq!(requests.len(), 3, "{requests:?}");
    assert_eq!(requests[0].header("if-none-match"), Some("\"p1\""));
    assert_eq!(
        requests[0].header("if-modified-since"),
        Some("Wed, 31 Dec 2025 23:00:00 GMT")
    );
    assert_eq!(requests[1].header("if-none-match"), Some("\"p2-v1\""));
    assert_eq!(h.events().len(), 4, "unchanged pages emit nothing");
    let fetch = h.recorder.fetches.lock().unwrap()[4];
    assert!(fetch.not_modified);

    // Page 2 changes while page 1 does not: page 1's 304 does not hide it.
    server.script(paged_etag_api("v2"));
    h.poll().await;
    assert_eq!(
        h.events().last().unwrap(),
        &(EventType::Updated, "c".to_owned())
    );
    assert_eq!(h.events().len(), 5);
    let report = h.engine.inspect().await.unwrap();
    assert_eq!(report.pollers[0].items, 4);
}

#[tokio::test]
async fn a_full_scan_sends_no_conditional_request() {
    let server = Server::start(|_| Reply::json(200, &items()).header("etag", "\"v1\"")).await;
    let h = Harness::new(server.url("/items"), client()).await;
    h.poll().await;
    h.poll().await;
    assert!(
        server
            .seen()
            .iter()
            .all(|r| r.header("if-none-match").is_none()),
        "a 304 on one page of a full listing would say nothing about the others"
    );
    assert!(
        h.store
            .get_validator(&Harness::key(), &hash_url(&h.url))
            .await
            .unwrap()
            .is_none()
    );
}

// ----- rate-limit headers -----

#[tokio::test]
async fn rate_limit_headers_stretch_the_next_wait() {
    let server = Server::start(|_| {
        Reply::json(200, &json!([]))
            .header("ratelimit", "\"default\";r=2;t=60")
            .header("ratelimit-policy", "\"default\";q=100;w=60")
    })
    .await;
    let h = Harness::new(server.url("/items"), client()).await;
    h.poll().await;
    // Idle would wait 15 s; two requests left for 60 s means one every 30 s.
    assert_eq!(
        h.recorder.last_reason(),
        (ScheduleReason::Paced, T0 + 30_000)
    );
    let schedule = h.schedule().await;
    assert_eq!(schedule.next_due_at, Some(T0 + 30_000));
    let info = schedule.rate_limit.unwrap();
    assert_eq!(info.source, RateLimitSource::Ietf);
    assert_eq!(
        (info.limit, info.remaining, info.reset_at),
        (Some(100), Some(2), Some(T0 + 60_000))
    );

    // Vendor headers with an epoch-seconds reset: nothing left until the reset, 45 s away.
    let reset = (T0 / 1000 + 45).to_string();
    server.script(move |_| {
        Reply::json(200, &json!([]))
            .header("x-ratelimit-limit", "5000")
            .header("x-ratelimit-remaining", "0")
            .header("x-ratelimit-reset", &reset)
    });
    h.poll().await;
    assert_eq!(
        h.recorder.last_reason(),
        (ScheduleReason::Paced, T0 + 45_000)
    );
    let info = h.schedule().await.rate_limit.unwrap();
    assert_eq!(info.source, RateLimitSource::Vendor);
    assert_eq!(info.remaining, Some(0));

    // Plenty left: pacing does not stretch the idle interval.
    server.script(|_| {
        Reply::json(200, &json!([]))
            .header("ratelimit-limit", "100")
            .header("ratelimit-remaining", "99")
            .header("ratelimit-reset", "60")
    });
    h.poll().await;
    let (reason, _) = h.recorder.last_reason();
    assert_eq!(reason, ScheduleReason::IdleBackOff);
    assert_eq!(
        h.schedule().await.rate_limit.unwrap().source,
        RateLimitSource::Legacy
    );
}

// ----- throttles -----

#[tokio::test]
async fn a_429_with_retry_after_throttles_exactly() {
    let server = Server::start(|_| {
        Reply::json(429, &json!({ "message": "slow down" })).header("retry-after", "12")
    })
    .await;
    let h = Harness::new(server.url("/items"), client()).await;
    let result = h.poll().await;
    let error = result.error.expect("a 429 fails the cycle");
    assert_eq!(error.status, Some(429));
    assert_eq!(error.message, format!("GET {} responded 429", h.url));
    assert_eq!(
        h.recorder.last_reason(),
        (ScheduleReason::Throttled, T0 + 12_000)
    );
    let schedule = h.schedule().await;
    assert_eq!(schedule.throttled_until, Some(T0 + 12_000));
    assert_eq!(schedule.next_due_at, Some(T0 + 12_000));
    assert_eq!(
        schedule.consecutive_failures, 0,
        "a throttle is not a failure"
    );

    // Not a millisecond early.
    server.script(|_| Reply::json(200, &items()));
    h.clock.advance(Duration::from_millis(11_999));
    let tick = h.engine.tick(TickOptions::default()).await.unwrap();
    assert!(tick.polled.is_empty());
    assert_eq!(server.seen().len(), 1);
    h.clock.advance(Duration::from_millis(1));
    let tick = h.engine.tick(TickOptions::default()).await.unwrap();
    assert_eq!(tick.polled.len(), 1);
    assert_eq!(tick.polled[0].error, None);
    assert_eq!(server.seen().len(), 2);
    assert_eq!(h.events().len(), 2);
}

#[tokio::test]
async fn a_503_with_retry_after_throttles_too_and_without_it_backs_off() {
    let at = UNIX_EPOCH + Duration::from_millis((T0 + 30_000).try_into().unwrap());
    let date = httpdate_string(at);
    let server = Server::start(move |_| Reply::status(503).header("retry-after", &date)).await;
    let h = Harness::new(server.url("/items"), client()).await;
    let result = h.poll().await;
    assert_eq!(result.error.unwrap().status, Some(503));
    assert_eq!(
        h.recorder.last_reason(),
        (ScheduleReason::Throttled, T0 + 30_000)
    );
    let schedule = h.schedule().await;
    assert_eq!(schedule.throttled_until, Some(T0 + 30_000));
    assert_eq!(schedule.consecutive_failures, 0);

    server.script(|_| Reply::status(503));
    h.clock.advance(Duration::from_secs(30));
    let now = T0 + 30_000;
    h.poll().await;
    h.assert_backed_off_once(now).await;
}

/// Items `a` and `c`: what a page keeps when the item between them is rejected.
fn a_and_c() -> Vec<Value> {
    vec![json!({ "id": "a", "v": 1 }), json!({ "id": "c", "v": 3 })]
}

/// An IMF-fixdate, formatted by hand so the test does not trust the parser it checks.
fn httpdate_string(at: SystemTime) -> String {
    let secs = at.duration_since(UNIX_EPOCH).unwrap().as_secs();
    let days = secs / 86_400;
    let (h, m, s) = (secs % 86_400 / 3600, secs % 3600 / 60, secs % 60);
    assert_eq!(days, 20_454, "the test's date is 2026-01-01");
    format!("Thu, 01 Jan 2026 {h:02}:{m:02}:{s:02} GMT")
}

// ----- failures and problem details -----

#[tokio::test]
async fn a_500_is_a_failure_with_backoff_and_its_problem_details_name_it() {
    let server = Server::start(|_| {
        Reply::status(500)
            .header("content-type", "application/problem+json")
            .body(
                json!({
                    "type": "https://api.example.com/problems/db",
                    "title": "Database unavailable",
                    "detail": "the primary is failing over",
                    "status": 500,
                    "region": "eu-1"
                })
                .to_string(),
            )
    })
    .await;
    let h = Harness::new(server.url("/items"), client()).await;
    let result = h.poll().await;
    let error = result.error.unwrap();
    assert_eq!(
        error.message,
        format!(
            "GET {} responded 500: Database unavailable: the primary is failing over",
            h.url
        )
    );
    assert_eq!(error.code.as_deref(), Some("HTTP"));
    let schedule = h.assert_backed_off_once(T0).await;
    assert_eq!(schedule.last_error.unwrap().status, Some(500));
    assert!(h.events().is_empty());

    // The second failure in a row backs off further (base 1 s x 2: at most 2 s).
    h.poll().await;
    let (reason, next_due_at) = h.recorder.last_reason();
    assert_eq!(reason, ScheduleReason::Backoff);
    assert!((T0..=T0 + 2_000).contains(&next_due_at), "{next_due_at}");
    assert_eq!(h.schedule().await.consecutive_failures, 2);
}

#[tokio::test]
async fn error_responses_keep_problem_details_and_at_most_64_kib() {
    let big = "x".repeat(200 * 1024);
    let server = Server::start(move |seen| match seen.uri.as_str() {
        "/problem" => Reply::status(422)
            .header("content-type", "application/json; charset=utf-8")
            .body(
                json!({ "detail": "name is required", "status": "422", "errors": ["name"] })
                    .to_string(),
            ),
        "/big" => Reply::status(502)
            .header("content-type", "text/plain")
            .body(big.clone()),
        _ => Reply::json(500, &json!({ "error": "not a problem" })),
    })
    .await;
    let http = client();
    let ctx = context(None);

    let response = server
        .get_with(&http, &ctx, "/problem", |request| {
            request.throw_on_error(false)
        })
        .await
        .unwrap();
    assert!(!response.ok());
    assert_eq!(response.status(), 422);
    let problem = response.problem().unwrap();
    assert_eq!(problem.detail.as_deref(), Some("name is required"));
    assert_eq!(problem.status, Some(422));
    assert_eq!(problem.extensions["errors"], json!(["name"]));
    let error = response.error().unwrap();
    assert_eq!(
        error.to_string(),
        format!(
            "GET {} responded 422: name is required",
            server.url("/problem")
        )
    );
    assert!(response.error_for_status().is_err());

    let response = server
        .get_with(&http, &ctx, "/big", |request| request.throw_on_error(false))
        .await
        .unwrap();
    assert_eq!(response.bytes().unwrap().len(), MAX_ERROR_BODY_BYTES);
    assert!(response.problem().is_none());

    let error = server.get(&http, &ctx, "/plain").await.unwrap_err();
    assert_eq!(
        error.to_string(),
        format!("GET {} responded 500", server.url("/plain")),
        "JSON without problem members is not a problem"
    );
}

#[tokio::test]
async fn malformed_headers_and_bodies_never_panic() {
    let server = Server::start(|seen| match seen.uri.as_str() {
        "/garbage-429" => Reply::status(429)
            .header("retry-after", "soon")
            .header("ratelimit", "\"\\")
            .header("x-ratelimit-reset", "1e999")
            .header("content-type", "application/problem+json")
            .body("{\"title\": "),
        "/not-json" => Reply::status(200)
            .header("content-type", "application/json")
            .body("[{\"id\": 1,"),
        "/envelope" => Reply::json(200, &json!({ "data": { "items": [{ "id": "a" }] } })),
        _ => Reply::status(200).body(vec![0xff, 0xfe, 0x00]),
    })
    .await;
    let http = client();
    let ctx = context(None);
    let error = server.get(&http, &ctx, "/garbage-429").await.unwrap_err();
    assert!(matches!(
        error,
        Error::Http {
            status: Some(429),
            retry_after_ms: None,
            message: None,
            ..
        }
    ));
    let response = server.get(&http, &ctx, "/not-json").await.unwrap();
    let error = response.items_page().unwrap_err();
    assert_eq!(http_status(&error), Some(200));
    assert!(
        error.to_string().contains("not the expected JSON"),
        "{error}"
    );
    let response = http.get(&ctx, server.url("/binary")).send().await.unwrap();
    assert_eq!(response.text().unwrap(), "\u{fffd}\u{fffd}\u{0}");
    assert!(response.items_page().is_err());
    let response = server.get(&http, &ctx, "/envelope").await.unwrap();
    assert_eq!(
        response.items_page_at("/data/items").unwrap().items.len(),
        1
    );
    assert!(response.items_page_at("/data/missing").is_err());
}

// ----- items serde_json cannot decode -----

/// A 200 JSON reply with a literal body.
fn raw_json(body: impl Into<Vec<u8>>) -> Reply {
    Reply::status(200)
        .header("content-type", "application/json")
        .body(body)
}

fn nested(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

#[tokio::test]
async fn an_item_with_a_lone_surrogate_escape_is_rejected_and_the_others_go_through() {
    let server = Server::start(|seen| match seen.uri.as_str() {
        "/envelope" => raw_json(
            r#"{"meta":{"note":"\ud800"},"data":{"items":[{"id":"a","v":1},"\udc00",{"id":"c","v":3}]}}"#,
        ),
        _ => raw_json(r#"[{"id":"a","v":1},{"id":"b","name":"x\ud800"},{"id":"c","v":3}]"#),
    })
    .await;
    let http = client();
    let ctx = context(None);
    let response = server.get(&http, &ctx, "/array").await.unwrap();
    let page = response.items_page().unwrap();
    assert_eq!(page.items, a_and_c());
    assert_eq!(page.rejected.len(), 1, "{page:?}");
    assert_eq!(page.rejected[0].text, r#"{"id":"b","name":"x\ud800"}"#);
    assert_eq!(
        page.rejected[0].reason,
        "item 1: the escape `\\ud800` at byte 19 of the item is a lone UTF-16 surrogate, which a \
         Rust string cannot hold"
    );

    // Inside an envelope: the rest of the body (`meta` here) is not decoded at all.
    let response = server.get(&http, &ctx, "/envelope").await.unwrap();
    let page = response.items_page_at("/data/items").unwrap();
    assert_eq!(page.items.len(), 2, "{page:?}");
    assert_eq!(page.rejected.len(), 1, "{page:?}");
    assert_eq!(page.rejected[0].text, r#""\udc00""#);
    assert!(
        page.rejected[0]
            .reason
            .starts_with("item 1: the escape `\\udc00` at byte 1"),
        "{}",
        page.rejected[0].reason
    );
    let error = response.items_page_at("/meta/note").unwrap_err();
    assert!(
        error.to_string().contains("no JSON array at `/meta/note`"),
        "{error}"
    );
}

#[tokio::test]
async fn an_item_nested_200_deep_is_rejected_and_the_others_go_through() {
    let deep = nested(200);
    let body = format!(r#"[{{"id":"a","v":1}},{deep},{{"id":"c","v":3}}]"#);
    let server = Server::start(move |_| raw_json(body.clone())).await;
    let http = client();
    let page = server
        .get(&http, &context(None), "/items")
        .await
        .unwrap()
        .items_page()
        .unwrap();
    assert_eq!(page.items, a_and_c());
    assert_eq!(page.rejected.len(), 1, "{page:?}");
    assert_eq!(page.rejected[0].text, deep);
    assert_eq!(
        page.rejected[0].reason,
        "item 1: arrays and objects nest deeper than 127 levels at byte 127 of the item, past \
         the JSON parser's limit"
    );
}

#[tokio::test]
async fn a_body_of_100000_open_brackets_is_a_clear_error_and_never_a_crash() {
    let server = Server::start(|seen| match seen.uri.as_str() {
        "/balanced" => raw_json(nested(100_000)),
        _ => raw_json("[".repeat(100_000)),
    })
    .await;
    let http = client();
    let ctx = context(None);
    let response = http.get(&ctx, server.url("/open")).send().await.unwrap();
    for error in [
        response.items_page().unwrap_err(),
        response.items_page_at("/0").unwrap_err(),
        response.json::<Value>().unwrap_err(),
    ] {
        assert_eq!(http_status(&error), Some(200));
        let message = error.to_string();
        assert!(
            message.contains("the body is not the expected JSON: "),
            "{message}"
        );
    }
    assert!(
        response
            .items_page()
            .unwrap_err()
            .to_string()
            .ends_with("EOF while parsing a list at line 1 column 100000"),
    );

    // Closed as deep as it opens, the body is one array holding one item 99,999 levels deep:
    // that item is rejected, whole, and nothing recurses.
    let response = server.get(&http, &ctx, "/balanced").await.unwrap();
    let page = response.items_page().unwrap();
    assert!(page.items.is_empty());
    assert_eq!(page.rejected.len(), 1);
    assert_eq!(page.rejected[0].text.len(), 2 * 99_999);
    assert!(page.rejected[0].reason.contains("deeper than 127 levels"));
    let page = response.items_page_at("/0/0").unwrap();
    assert_eq!(page.rejected.len(), 1);
    assert_eq!(page.rejected[0].text.len(), 2 * 99_997);
}

#[tokio::test]
async fn the_engine_commits_the_good_items_and_quarantines_the_undecodable_ones() {
    let deep = nested(200);
    let body =
        format!(r#"[{{"id":"a","v":1}},{{"id":"b","v":"\ud800"}},{deep},{{"id":"c","v":3}}]"#);
    let server = Server::start(move |_| raw_json(body.clone())).await;
    let h = Harness::new(server.url("/items"), client()).await;
    let result = h.poll().await;
    assert!(result.error.is_none(), "{result:?}");
    assert_eq!(
        h.events(),
        vec![
            (EventType::Created, "a".to_owned()),
            (EventType::Created, "c".to_owned())
        ]
    );
    let parked = h
        .store
        .list_parked(&Harness::key(), ParkedQuery::default())
        .await
        .unwrap();
    assert_eq!(parked.len(), 2, "{parked:?}");
    let mut messages: Vec<&str> = parked
        .iter()
        .map(|row| {
            assert_eq!(row.kind, ParkedKind::Invalid);
            row.error.error.message.as_str()
        })
        .collect();
    messages.sort_unstable();
    assert_eq!(
        messages,
        vec![
            "item 1: the escape `\\ud800` at byte 15 of the item is a lone UTF-16 surrogate, \
             which a Rust string cannot hold",
            "item 2: arrays and objects nest deeper than 127 levels at byte 127 of the item, \
             past the JSON parser's limit",
        ]
    );
    // The item is kept as the API sent it, as a JSON string.
    let texts: Vec<Value> = parked
        .iter()
        .map(|row| row.item.as_ref().unwrap().to_value())
        .collect();
    assert!(
        texts.contains(&json!(r#"{"id":"b","v":"\ud800"}"#)),
        "{texts:?}"
    );
    assert!(texts.contains(&json!(deep)));
}

// ----- requests -----

#[tokio::test]
async fn urls_queries_and_default_headers() {
    let server = Server::start(|_| Reply::json(200, &json!([]))).await;
    let http = client();
    let ctx = context(None);
    let response = http
        .get(&ctx, server.url("/search?fixed=1"))
        .query("a", 1)
        .query("skip", None::<&str>)
        .query("tag", ["x y", "z&"])
        .query_pairs([("page", Some(2)), ("none", None)])
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.url(),
        server.url("/search?fixed=1&a=1&tag=x+y&tag=z%26&page=2")
    );
    let seen = server.seen().pop().unwrap();
    assert_eq!(seen.uri, "/search?fixed=1&a=1&tag=x+y&tag=z%26&page=2");
    assert_eq!(
        seen.header("user-agent"),
        Some(concat!("watukuy/", env!("CARGO_PKG_VERSION")))
    );
    assert_eq!(seen.header("accept"), Some("application/json"));

    let http = HttpClient::builder()
        .header("accept", "application/vnd.api+json")
        .build()
        .unwrap();
    http.post(&ctx, server.url("/things"))
        .json(&json!({ "name": "n" }))
        .header("x-trace", "1")
        .header("x-trace", "2")
        .send()
        .await
        .unwrap();
    let seen = server.seen().pop().unwrap();
    assert_eq!(seen.method, "POST");
    assert_eq!(seen.header("accept"), Some("application/vnd.api+json"));
    assert_eq!(seen.header("content-type"), Some("application/json"));
    assert_eq!(seen.headers.get_all("x-trace").iter().count(), 2);

    let before = server.seen().len();
    for url in [
        "/relative",
        "ftp://127.0.0.1/x",
        "mailto:a@example.com",
        "not a url",
    ] {
        let error = http.get(&ctx, url).send().await.unwrap_err();
        assert_eq!(error.code(), ErrorCode::Config, "{url}");
    }
    let error = server
        .get_with(&http, &ctx, "/x", |request| {
            request.header("bad header", "v")
        })
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::Config);
    let error = server
        .get_with(&http, &ctx, "/x", |request| {
            request.header("authorization", "Bearer SECRET\n")
        })
        .await
        .unwrap_err();
    assert!(!error.to_string().contains("SECRET"), "{error}");
    assert!(HttpClient::builder().header("x", "\u{7f}").build().is_err());
    assert_eq!(server.seen().len(), before, "nothing invalid was sent");
}

#[tokio::test]
async fn cancellation_timeouts_and_network_errors() {
    let server = Server::start(|_| Reply {
        hang: true,
        ..Reply::status(200)
    })
    .await;
    let clock = ManualClock::new(T0);
    let http = HttpClient::builder()
        .clock(Arc::new(clock.clone()))
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();

    // A cancelled cycle sends nothing.
    let ctx = context(None);
    ctx.cancel.cancel();
    let error = http.get(&ctx, server.url("/x")).send().await.unwrap_err();
    assert!(error.to_string().contains("aborted"), "{error}");
    assert!(server.seen().is_empty());

    // The timeout runs on the clock: the request hangs until the clock passes it.
    let ctx = context(None);
    let arrived = Arc::clone(&server.state.arrived);
    let (result, ()) = tokio::join!(http.get(&ctx, server.url("/hang")).send(), async {
        arrived.notified().await;
        clock.advance(Duration::from_secs(5));
    });
    let error = result.unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "GET {} responded without a status: timed out after 5000 ms",
            server.url("/hang")
        )
    );
    assert!(error.is_transient());

    // Cancelling mid-flight ends the request.
    let ctx = context(None);
    let arrived = Arc::clone(&server.state.arrived);
    let (result, ()) = tokio::join!(http.get(&ctx, server.url("/hang")).send(), async {
        arrived.notified().await;
        ctx.cancel.cancel();
    });
    assert!(result.unwrap_err().to_string().contains("aborted"));

    // Nobody listening: an error without a status.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = format!("http://{}/x", listener.local_addr().unwrap());
    drop(listener);
    let error = http.get(&context(None), &closed).send().await.unwrap_err();
    assert_eq!(http_status(&error), None);
    assert!(
        error
            .to_string()
            .starts_with(&format!("GET {closed} responded without a status: "))
    );
}

// ----- validators -----

#[tokio::test]
async fn validators_are_staged_and_trusted_only_once_committed() {
    let server = Server::start(|seen| {
        if seen.header("if-none-match") == Some("W/\"7\"") {
            return Reply::status(304).header("ratelimit", "\"q\";r=9;t=1");
        }
        Reply::json(200, &items()).header("etag", "W/\"7\"")
    })
    .await;
    let store = Arc::new(MemoryStore::new());
    let key = PKey::new("direct", "");
    let clock = ManualClock::new(T0);
    let lease = store
        .acquire_lease(&key, "me", 60_000, T0)
        .await
        .unwrap()
        .unwrap();
    let access = ValidatorAccess::new(
        Arc::clone(&store) as Arc<dyn Store>,
        key.clone(),
        Arc::new(clock.clone()),
    );
    let http = client();
    let url = server.url("/items?x=1");
    let ctx = context(Some(access.clone()));

    // A 200 stages its validators and stores nothing: until the page is committed, the next
    // request for the URL is unconditional and gets the whole body again.
    for _ in 0..2 {
        let page = http
            .get(&ctx, &url)
            .send()
            .await
            .unwrap()
            .items_page()
            .unwrap();
        assert_eq!(page.items.len(), 2);
        assert!(
            store
                .get_validator(&key, &hash_url(&url))
                .await
                .unwrap()
                .is_none()
        );
    }
    let staged = access.staged();
    assert_eq!(staged.len(), 1, "one URL staged once: {staged:?}");
    assert_eq!(staged[0].url_hash, hash_url(&url));
    assert_eq!(staged[0].validator.etag.as_deref(), Some("W/\"7\""));
    assert_eq!(staged[0].validator.stored_at, T0);

    // The page's commit makes them durable; now the request is conditional and gets a 304.
    let batch = CommitBatch::default().validators(staged);
    store.commit_poll(&key, &lease, &batch).await.unwrap();
    let response = http.get(&ctx, &url).send().await.unwrap();
    assert!(response.ok() && response.not_modified());
    assert!(response.json::<Value>().is_err(), "a 304 has no body");
    let page = response.items_page().unwrap();
    assert!(page.not_modified && page.items.is_empty());
    assert_eq!(page.rate_limit.unwrap().remaining, Some(9));
    let annotated = response.annotate(Page::default().cursor("c"));
    assert!(annotated.not_modified);

    // Another URL, or validators switched off, sends no conditional header.
    http.get(&ctx, server.url("/items?x=2"))
        .send()
        .await
        .unwrap();
    http.get(&ctx, &url).validators(false).send().await.unwrap();
    let seen = server.seen();
    assert_eq!(seen.len(), 5);
    assert!(
        seen[1].header("if-none-match").is_none(),
        "nothing committed yet"
    );
    assert_eq!(seen[2].header("if-none-match"), Some("W/\"7\""));
    assert!(seen[3].header("if-none-match").is_none());
    assert!(seen[4].header("if-none-match").is_none());
}

// ----- budgets -----

#[tokio::test]
async fn requests_charge_the_budget_before_sending() {
    let server = Server::start(|_| Reply::json(200, &json!([]))).await;
    let http = client();
    let url = server.url("/items");
    let outcome: Arc<Mutex<Option<ErrorCode>>> = Arc::default();
    let poller = Poller::builder::<Item>(POLLER)
        .identity(|item: &Item| item.id.clone())
        .cursor(cursor::snapshot_diff())
        .budget("api")
        .fetch({
            let outcome = Arc::clone(&outcome);
            move |ctx: FetchContext| {
                let (http, url, outcome) = (http.clone(), url.clone(), Arc::clone(&outcome));
                async move {
                    // The only token, then a free request, then one the budget cannot serve.
                    http.get(&ctx, &url).send().await?;
                    http.get(&ctx, &url).cost(0).send().await?;
                    let third = http.get(&ctx, &url).send().await;
                    *outcome.lock().unwrap() = third.err().map(|e| e.code());
                    Ok(Page::new(Vec::new()))
                }
            }
        })
        .build()
        .unwrap();
    let mut policy = BudgetPolicy::new(1, Duration::from_secs(3600));
    policy.max_wait = Some(Duration::ZERO);
    let engine = Engine::builder(Arc::new(MemoryStore::new()))
        .poller(poller)
        .clock(Arc::new(ManualClock::new(T0)))
        .budget("api", policy)
        .build()
        .unwrap();
    engine.migrate().await.unwrap();
    engine.tick(TickOptions::default()).await.unwrap();
    assert_eq!(*outcome.lock().unwrap(), Some(ErrorCode::BudgetTimeout));
    assert_eq!(server.seen().len(), 2, "the third request was never sent");
}

/// `max_body_bytes`: a success body of exactly the cap is read whole; one byte more fails the
/// request with an error naming the limit, and its body never reaches a parser.
#[tokio::test]
async fn a_success_body_past_the_cap_fails_naming_the_limit() {
    let server = Server::start(|seen: &Seen| {
        let size = seen
            .query("size")
            .and_then(|size| size.parse().ok())
            .unwrap_or(0);
        Reply::status(200)
            .header("content-type", "application/json")
            .body(vec![b' '; size])
    })
    .await;
    let http = HttpClient::builder().max_body_bytes(1024).build().unwrap();
    let ctx = context(None);
    let at_cap = server.get(&http, &ctx, "/body?size=1024").await.unwrap();
    assert_eq!(at_cap.bytes().unwrap().len(), 1024);
    let error = server
        .get(&http, &ctx, "/body?size=1025")
        .await
        .unwrap_err();
    assert!(
        matches!(&error, Error::Http { status: None, message: Some(m), .. }
            if m.ends_with("larger than the limit of 1024 bytes")),
        "{error:?}"
    );
}
