//! The `FakeApi` the engine tests run against: dataset, listings, faults, rate limits, ETags,
//! latency on a manual clock, and the per-strategy fetch adapters. Nothing sleeps in real time.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use watukuy_core::clock::format_rfc3339_ms;
use watukuy_core::cursor::Cursor;
use watukuy_core::{
    BoxError, Error, FetchContext, Page, Partition,
    clock::ManualClock,
    poller::ValidatorAccess,
    store::{CommitBatch, PKey, RateLimitSource, Store},
};
use watukuy_store_memory::MemoryStore;
use watukuy_testkit::{
    FakeApi, FakeApiError, FakeApiOptions, Fault, Query, RateLimitSpec, RequestOptions, fake_items,
};

/// 2026-01-01T00:00:00Z.
const T0: i64 = 1_767_225_600_000;

fn setup() -> (FakeApi, ManualClock) {
    let clock = ManualClock::new(T0);
    let api = FakeApi::new(FakeApiOptions::new(Arc::new(clock.clone())));
    (api, clock)
}

fn setup_with(page_size: usize) -> (FakeApi, ManualClock) {
    let clock = ManualClock::new(T0);
    let api = FakeApi::new(FakeApiOptions::new(Arc::new(clock.clone())).page_size(page_size));
    (api, clock)
}

fn ids(items: &[Value]) -> Vec<String> {
    items
        .iter()
        .map(|item| item["id"].as_str().unwrap_or("?").to_owned())
        .collect()
}

fn http_status(err: &BoxError) -> Option<u16> {
    match err.downcast_ref::<Error>() {
        Some(Error::Http { status, .. }) => *status,
        _ => None,
    }
}

fn ctx(cursor: Cursor, page: u32) -> FetchContext {
    let mut ctx = FetchContext::new(cursor, Partition::new(""));
    ctx.page = page;
    ctx
}

// ----- dataset -----

#[test]
fn add_stamps_the_timestamp_and_rejects_bad_items() {
    let (api, clock) = setup();
    let stored = api.add(json!({ "id": "a", "name": "A" })).unwrap();
    assert_eq!(stored["updatedAt"], "2026-01-01T00:00:00.000Z");
    clock.advance(Duration::from_millis(1_234));
    let stored = api
        .add(json!({ "id": "b", "updatedAt": "ignored" }))
        .unwrap();
    assert_eq!(stored["updatedAt"], format_rfc3339_ms(T0 + 1_234));
    assert_eq!(api.get("b"), Some(stored));

    assert_eq!(
        api.add(json!({ "id": "a" })),
        Err(FakeApiError::DuplicateId("a".into()))
    );
    assert_eq!(api.add(json!([1, 2])), Err(FakeApiError::NotAnObject));
    assert_eq!(
        api.add(json!({ "name": "no id" })),
        Err(FakeApiError::MissingId { field: "id".into() })
    );
    assert_eq!(
        api.add(json!({ "id": true })),
        Err(FakeApiError::MissingId { field: "id".into() })
    );
    assert_eq!(api.size(), 2);
    // Numeric ids are keyed by their decimal text.
    api.add(json!({ "id": 7 })).unwrap();
    assert!(api.get("7").is_some());
}

#[test]
fn update_merges_bumps_and_guards_the_id() {
    let (api, clock) = setup();
    api.add(json!({ "id": "a", "name": "A", "value": 1 }))
        .unwrap();
    clock.advance(Duration::from_secs(5));
    let updated = api
        .update(
            "a",
            json!({ "value": 2, "extra": null, "id": "a", "updatedAt": "x" }),
        )
        .unwrap();
    assert_eq!(
        updated,
        json!({ "id": "a", "name": "A", "value": 2, "extra": null, "updatedAt": "2026-01-01T00:00:05.000Z" })
    );
    assert_eq!(api.get("a"), Some(updated.clone()));

    assert_eq!(
        api.update("a", json!({ "id": "b" })),
        Err(FakeApiError::IdChanged {
            id: "a".into(),
            to: json!("b")
        })
    );
    assert_eq!(
        api.update("zzz", json!({ "value": 3 })),
        Err(FakeApiError::UnknownId("zzz".into()))
    );
    assert_eq!(api.update("a", json!(3)), Err(FakeApiError::NotAnObject));
    assert_eq!(api.get("a"), Some(updated), "failed updates change nothing");
}

#[test]
fn remove_get_and_all_sorted_by_id() {
    let (api, _clock) = setup();
    for id in ["c", "a", "b"] {
        api.add(json!({ "id": id })).unwrap();
    }
    assert_eq!(ids(&api.all()), ["a", "b", "c"]);
    assert!(api.remove("b"));
    assert!(!api.remove("b"));
    assert_eq!(api.get("b"), None);
    assert_eq!(ids(&api.all()), ["a", "c"]);
    assert_eq!(api.size(), 2);
}

#[test]
fn seed_keeps_timestamps_and_is_all_or_nothing() {
    let (api, _clock) = setup();
    api.seed(fake_items(3)).unwrap();
    assert_eq!(api.all(), fake_items(3));

    let err = api.seed(vec![json!({ "id": "new" }), json!({ "id": "item-002" })]);
    assert_eq!(err, Err(FakeApiError::DuplicateId("item-002".into())));
    let err = api.seed(vec![json!({ "id": "x" }), json!({ "id": "x" })]);
    assert_eq!(err, Err(FakeApiError::DuplicateId("x".into())));
    let err = api.seed(vec![json!({ "id": "y" }), json!("garbage")]);
    assert_eq!(err, Err(FakeApiError::NotAnObject));
    assert_eq!(api.size(), 3, "a failed seed adds nothing");

    api.seed(vec![json!({ "id": "z" })]).unwrap();
    assert_eq!(
        api.get("z").unwrap()["updatedAt"],
        "2026-01-01T00:00:00.000Z",
        "an item without a timestamp is stamped"
    );
}

#[test]
fn fake_items_shape() {
    let items = fake_items(3);
    assert_eq!(
        items,
        vec![
            json!({ "id": "item-001", "name": "Item 1", "value": 1, "updatedAt": "2026-01-01T00:00:00.000Z" }),
            json!({ "id": "item-002", "name": "Item 2", "value": 2, "updatedAt": "2026-01-01T00:00:01.000Z" }),
            json!({ "id": "item-003", "name": "Item 3", "value": 3, "updatedAt": "2026-01-01T00:00:02.000Z" }),
        ]
    );
    let many = fake_items(1_000);
    assert_eq!(many[0]["id"], "item-0001");
    assert_eq!(many[999]["id"], "item-1000");
    assert!(fake_items(0).is_empty());
}

// ----- listings -----

#[tokio::test]
async fn since_is_a_keyset_over_timestamp_and_id() {
    let (api, clock) = setup();
    // Five items at the same instant, then two later ones.
    for id in ["e", "c", "a", "d", "b"] {
        api.add(json!({ "id": id })).unwrap();
    }
    clock.advance(Duration::from_millis(1));
    api.add(json!({ "id": "0-later" })).unwrap();
    clock.advance(Duration::from_millis(1));
    api.add(json!({ "id": "1-latest" })).unwrap();

    let first = api.list_since(None, None, Some(2)).await.unwrap();
    assert_eq!(ids(&first.items), ["a", "b"]);
    assert_eq!(first.has_more, Some(true));

    let t0 = format_rfc3339_ms(T0);
    let next = api.list_since(Some(&t0), Some("b"), Some(2)).await.unwrap();
    assert_eq!(
        ids(&next.items),
        ["c", "d"],
        "equal timestamps continue after the id"
    );
    let all_at_t0 = api.list_since(Some(&t0), None, None).await.unwrap();
    assert_eq!(all_at_t0.items.len(), 7, "ts >= since includes since");
    let later = api
        .list_since(Some(&format_rfc3339_ms(T0 + 1)), Some("0-later"), None)
        .await
        .unwrap();
    assert_eq!(ids(&later.items), ["1-latest"]);
    assert_eq!(later.has_more, Some(false));

    // Instants are compared parsed: other spellings of the same instant are equal.
    for spelling in [
        "2026-01-01T00:00:00Z",
        "2026-01-01T01:00:00+01:00",
        "1767225600",
    ] {
        let listing = api
            .list_since(Some(spelling), Some("d"), None)
            .await
            .unwrap();
        assert_eq!(
            ids(&listing.items),
            ["e", "0-later", "1-latest"],
            "{spelling}"
        );
    }

    // Walking the keyset page by page sees every item exactly once, in (ts, id) order.
    let mut seen = Vec::new();
    let (mut since, mut after): (Option<String>, Option<String>) = (None, None);
    loop {
        let page = api
            .list_since(since.as_deref(), after.as_deref(), Some(3))
            .await
            .unwrap();
        let Some(last) = page.items.last() else { break };
        since = last["updatedAt"].as_str().map(str::to_owned);
        after = last["id"].as_str().map(str::to_owned);
        seen.extend(ids(&page.items));
        if page.has_more != Some(true) {
            break;
        }
    }
    assert_eq!(seen, ["a", "b", "c", "d", "e", "0-later", "1-latest"]);
}

#[tokio::test]
async fn bad_listing_parameters_are_400() {
    let (api, _clock) = setup();
    api.seed(fake_items(3)).unwrap();
    let err = api
        .list_since(Some("yesterday"), None, None)
        .await
        .unwrap_err();
    assert_eq!(http_status(&err), Some(400));
    assert!(err.to_string().contains("invalid since"), "{err}");
    let err = api.list_since(None, None, Some(0)).await.unwrap_err();
    assert_eq!(http_status(&err), Some(400));
    let err = api.list_page(0, None).await.unwrap_err();
    assert_eq!(http_status(&err), Some(400));
    let err = api.list_token(Some("not-a-token"), None).await.unwrap_err();
    assert_eq!(http_status(&err), Some(400));
    let err = api
        .list_token(Some("6f66667365743a"), None)
        .await
        .unwrap_err();
    assert_eq!(
        http_status(&err),
        Some(400),
        "`offset:` without digits is rejected"
    );
    assert_eq!(api.calls(), 5, "bad requests still count");
    assert!(api.log().iter().all(|entry| entry.status == Some(400)));

    let clock = ManualClock::new(T0);
    let untimed =
        FakeApi::new(FakeApiOptions::new(Arc::new(clock)).timestamp_field(None::<String>));
    let item = untimed.add(json!({ "id": "a" })).unwrap();
    assert_eq!(item, json!({ "id": "a" }), "no timestamp field, no stamp");
    let err = untimed.list_since(None, None, None).await.unwrap_err();
    assert_eq!(http_status(&err), Some(400));
}

#[tokio::test]
async fn page_listing_covers_everything_once() {
    let (api, _clock) = setup();
    api.seed(fake_items(25)).unwrap();
    let mut seen = Vec::new();
    for page in 1..=3 {
        let listing = api.list_page(page, Some(10)).await.unwrap();
        assert_eq!(listing.pages, Some(3));
        assert_eq!(listing.has_more, Some(page < 3));
        seen.extend(ids(&listing.items));
    }
    assert_eq!(seen, ids(&api.all()));
    let past = api.list_page(4, Some(10)).await.unwrap();
    assert!(past.items.is_empty());
    assert_eq!(past.has_more, Some(false));
    let huge = api.list_page(u32::MAX, None).await.unwrap();
    assert!(huge.items.is_empty());
    let default = api.list_page(1, None).await.unwrap();
    assert_eq!(default.items.len(), 25, "default limit is the page size");
    assert_eq!(default.pages, Some(1));
}

#[tokio::test]
async fn token_listing_covers_everything_once() {
    let (api, _clock) = setup();
    api.seed(fake_items(23)).unwrap();
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    let mut requests = 0;
    loop {
        let listing = api.list_token(token.as_deref(), Some(5)).await.unwrap();
        requests += 1;
        seen.extend(ids(&listing.items));
        assert_eq!(listing.has_more, Some(listing.next.is_some()));
        match listing.next {
            Some(next) => token = Some(next),
            None => break,
        }
    }
    assert_eq!(requests, 5);
    assert_eq!(seen, ids(&api.all()));
    assert_eq!(seen.iter().collect::<BTreeSet<_>>().len(), 23);

    let empty_token = api.list_token(Some(""), Some(5)).await.unwrap();
    assert_eq!(ids(&empty_token.items), ids(&api.all()[..5]));
    let exact = api.list_token(None, Some(23)).await.unwrap();
    assert_eq!(exact.next, None, "no token after the last item");
}

#[tokio::test]
async fn list_all_returns_everything_and_logs() {
    let (api, clock) = setup();
    api.seed(fake_items(4)).unwrap();
    clock.advance(Duration::from_secs(1));
    let listing = api.list_all().await.unwrap();
    assert_eq!(listing.status, 200);
    assert_eq!(listing.items, api.all());
    assert_eq!(listing.has_more, Some(false));
    api.list_page(2, Some(3)).await.unwrap();
    let log = api.log();
    assert_eq!(log.len(), 2);
    assert_eq!(log[0].route, "/all");
    assert_eq!(log[0].at, T0 + 1_000);
    assert!(log[0].params.is_empty());
    assert_eq!(log[1].route, "/page");
    assert_eq!(log[1].params["page"], "2");
    assert_eq!(log[1].params["limit"], "3");
    assert_eq!(log[1].status, Some(200));
    assert_eq!(api.calls(), 2);
    api.reset_stats();
    assert_eq!(api.calls(), 0);
    assert!(api.log().is_empty());
    assert_eq!(api.size(), 4, "reset_stats keeps the data");
}

// ----- faults -----

#[tokio::test]
async fn faults_are_consumed_in_order_and_counted() {
    let (api, _clock) = setup();
    api.seed(fake_items(2)).unwrap();
    api.fail_next(Fault::http_retry_after(503, 1_500), 2);
    api.fail_next(Fault::Network, 1);
    api.fail_next(Fault::Timeout, 1);
    api.fail_next(Fault::Malformed, 1);
    api.fail_next(
        Fault::Http {
            status: 429,
            retry_after_ms: None,
            body: Some(r#"{"type":"about:blank","title":"Too Many Requests"}"#.into()),
        },
        1,
    );
    api.fail_next(Fault::http(500), 0);
    assert_eq!(api.pending_faults(), 6);

    for remaining in [5, 4] {
        let err = api.list_all().await.unwrap_err();
        match err.downcast_ref::<Error>() {
            Some(Error::Http {
                status,
                retry_after_ms,
                method,
                url,
                ..
            }) => {
                assert_eq!(*status, Some(503));
                assert_eq!(*retry_after_ms, Some(1_500));
                assert_eq!(method, "GET");
                assert_eq!(url, "https://fake.api/all");
            }
            other => panic!("expected an HTTP error, got {other:?}"),
        }
        assert_eq!(api.pending_faults(), remaining);
    }
    let err = api.list_all().await.unwrap_err();
    let io = err.downcast_ref::<std::io::Error>().unwrap();
    assert_eq!(io.kind(), std::io::ErrorKind::ConnectionReset);
    let err = api.list_all().await.unwrap_err();
    let io = err.downcast_ref::<std::io::Error>().unwrap();
    assert_eq!(io.kind(), std::io::ErrorKind::TimedOut);

    let garbage = api.list_page(1, None).await.unwrap();
    assert_eq!(
        garbage.items,
        vec![json!(42), json!("x"), json!({ "no-id": true })]
    );
    assert_eq!(garbage.has_more, Some(false));

    let err = api.list_all().await.unwrap_err();
    assert_eq!(http_status(&err), Some(429));
    assert!(err.to_string().ends_with(": Too Many Requests"), "{err}");
    assert_eq!(api.pending_faults(), 0);

    let ok = api.list_all().await.unwrap();
    assert_eq!(ok.items.len(), 2);
    assert_eq!(api.calls(), 7);
    let statuses: Vec<Option<u16>> = api.log().iter().map(|entry| entry.status).collect();
    assert_eq!(
        statuses,
        [
            Some(503),
            Some(503),
            None,
            None,
            Some(200),
            Some(429),
            Some(200)
        ]
    );

    api.fail_next(Fault::Network, 3);
    api.clear_faults();
    assert_eq!(api.pending_faults(), 0);
    assert!(api.list_all().await.is_ok());
}

// ----- rate limits and ETags -----

#[tokio::test]
async fn rate_limit_info_decrements_per_request() {
    let (api, clock) = setup();
    assert_eq!(api.list_all().await.unwrap().rate_limit, None);
    api.set_rate_limit(Some(RateLimitSpec::new(
        10,
        2,
        60_000,
        RateLimitSource::Ietf,
    )));
    let first = api.list_all().await.unwrap().rate_limit.unwrap();
    assert_eq!(first.limit, Some(10));
    assert_eq!(first.remaining, Some(1));
    assert_eq!(first.reset_at, Some(T0 + 60_000));
    assert_eq!(first.source, RateLimitSource::Ietf);
    assert_eq!(first.policy.as_deref(), Some("\"fake\";q=10;w=60"));
    clock.advance(Duration::from_secs(1));
    let second = api.list_all().await.unwrap().rate_limit.unwrap();
    assert_eq!(second.remaining, Some(0));
    assert_eq!(second.reset_at, Some(T0 + 61_000));
    let third = api.list_all().await.unwrap().rate_limit.unwrap();
    assert_eq!(third.remaining, Some(0), "never below zero");

    api.set_rate_limit(Some(RateLimitSpec::new(
        5,
        5,
        1_000,
        RateLimitSource::Vendor,
    )));
    let vendor = api.list_all().await.unwrap().rate_limit.unwrap();
    assert_eq!(vendor.remaining, Some(4));
    assert_eq!(vendor.policy, None);
    assert_eq!(vendor.source, RateLimitSource::Vendor);
    api.set_rate_limit(None);
    assert_eq!(api.list_all().await.unwrap().rate_limit, None);
}

#[tokio::test]
async fn etags_answer_304_to_a_matching_if_none_match() {
    let (api, clock) = setup();
    api.seed(fake_items(3)).unwrap();
    let plain = api.list_all().await.unwrap();
    assert_eq!(plain.etag, None, "ETags are off by default");

    api.set_etags(true);
    let first = api.list_all().await.unwrap();
    let etag = first.etag.clone().unwrap();
    assert!(etag.starts_with("W/\""), "{etag}");
    assert_eq!(
        api.list_all().await.unwrap().etag,
        Some(etag.clone()),
        "stable"
    );

    let conditional = RequestOptions {
        if_none_match: Some(etag.clone()),
        cancel: None,
    };
    let cached = api.request(&Query::All, &conditional).await.unwrap();
    assert!(cached.not_modified());
    assert_eq!(cached.status, 304);
    assert!(cached.items.is_empty());
    assert_eq!(cached.etag, Some(etag.clone()));
    assert_eq!(api.log().last().unwrap().status, Some(304));

    let strong = RequestOptions {
        if_none_match: Some(format!("\"other\", {}", etag.trim_start_matches("W/"))),
        cancel: None,
    };
    assert!(
        api.request(&Query::All, &strong)
            .await
            .unwrap()
            .not_modified()
    );
    let star = RequestOptions {
        if_none_match: Some("*".into()),
        cancel: None,
    };
    assert!(
        api.request(&Query::All, &star)
            .await
            .unwrap()
            .not_modified()
    );

    clock.advance(Duration::from_secs(1));
    api.update("item-002", json!({ "value": 20 })).unwrap();
    let changed = api.request(&Query::All, &conditional).await.unwrap();
    assert_eq!(changed.status, 200);
    assert_eq!(changed.items.len(), 3);
    assert_ne!(changed.etag, Some(etag.clone()));

    api.set_etags(false);
    let off = api
        .request(
            &Query::All,
            &RequestOptions {
                if_none_match: changed.etag,
                cancel: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(off.status, 200, "no 304 when ETags are off");
    assert_eq!(off.etag, None);
}

// ----- latency -----

#[tokio::test]
async fn latency_waits_on_the_manual_clock() {
    let (api, clock) = setup();
    api.seed(fake_items(2)).unwrap();
    api.set_latency(Duration::from_millis(500));
    let request = tokio::spawn({
        let api = api.clone();
        async move { api.list_all().await.map(|listing| listing.items.len()) }
    });
    for _ in 0..5 {
        tokio::task::yield_now().await;
    }
    assert!(!request.is_finished());
    assert_eq!(api.calls(), 0, "the request has not arrived yet");
    clock.advance(Duration::from_millis(499));
    for _ in 0..5 {
        tokio::task::yield_now().await;
    }
    assert!(!request.is_finished());
    clock.advance(Duration::from_millis(1));
    assert_eq!(request.await.unwrap().unwrap(), 2);
    assert_eq!(api.log()[0].at, T0 + 500, "logged when handled");

    api.set_latency(Duration::ZERO);
    assert!(api.list_all().await.is_ok(), "zero latency answers at once");
}

#[tokio::test]
async fn cancellation_aborts_a_request_during_latency() {
    let (api, _clock) = setup();
    api.set_latency(Duration::from_secs(10));
    api.fail_next(Fault::http(503), 1);
    let cancel = CancellationToken::new();
    let request = tokio::spawn({
        let api = api.clone();
        let options = RequestOptions {
            if_none_match: None,
            cancel: Some(cancel.clone()),
        };
        async move { api.request(&Query::All, &options).await }
    });
    for _ in 0..5 {
        tokio::task::yield_now().await;
    }
    assert!(!request.is_finished());
    cancel.cancel();
    let err = request.await.unwrap().unwrap_err();
    assert!(matches!(
        err.downcast_ref::<FakeApiError>(),
        Some(FakeApiError::Cancelled)
    ));
    assert_eq!(api.calls(), 0, "a cancelled request never arrives");
    assert_eq!(api.pending_faults(), 1, "and consumes no fault");

    // Already cancelled: fails at once, even without latency.
    api.set_latency(Duration::ZERO);
    let options = RequestOptions {
        if_none_match: None,
        cancel: Some(cancel),
    };
    let err = api.request(&Query::All, &options).await.unwrap_err();
    assert!(err.downcast_ref::<FakeApiError>().is_some());
}

// ----- adapters -----

#[tokio::test]
async fn fetch_since_walks_the_timestamp_cursor() {
    let (api, clock) = setup_with(2);
    for id in ["c", "a", "b"] {
        api.add(json!({ "id": id })).unwrap();
    }
    clock.advance(Duration::from_secs(1));
    api.add(json!({ "id": "d" })).unwrap();

    let start = Cursor::Timestamp {
        value: None,
        tie_break: None,
    };
    let page = api.fetch_since(&ctx(start, 1)).await.unwrap();
    assert_eq!(ids(&page.items), ["a", "b"]);
    assert_eq!(page.has_more, Some(true), "a full page may have more");
    assert_eq!(page.cursor, None);
    assert!(!page.not_modified);

    let cursor = Cursor::Timestamp {
        value: Some(format_rfc3339_ms(T0)),
        tie_break: Some("b".into()),
    };
    let page = api.fetch_since(&ctx(cursor, 2)).await.unwrap();
    assert_eq!(ids(&page.items), ["c", "d"]);
    assert_eq!(page.has_more, Some(true));
    let cursor = Cursor::Timestamp {
        value: Some(format_rfc3339_ms(T0 + 1_000)),
        tie_break: Some("d".into()),
    };
    let page = api.fetch_since(&ctx(cursor, 3)).await.unwrap();
    assert_eq!(page, Page::new(vec![]).has_more(false));
    assert_eq!(api.log()[1].params["afterId"], "b");
}

#[tokio::test]
async fn fetch_token_returns_the_next_token() {
    let (api, _clock) = setup_with(4);
    api.seed(fake_items(10)).unwrap();
    let mut seen = Vec::new();
    let mut cursor = Cursor::Token { value: None };
    loop {
        let page = api.fetch_token(&ctx(cursor, 1)).await.unwrap();
        seen.extend(ids(&page.items));
        assert_eq!(page.has_more, Some(page.cursor.is_some()));
        match page.cursor {
            Some(next) => cursor = Cursor::Token { value: Some(next) },
            None => break,
        }
    }
    assert_eq!(seen, ids(&api.all()));
    assert_eq!(api.calls(), 3);
}

#[tokio::test]
async fn fetch_page_and_fetch_all_page_through() {
    let (api, _clock) = setup_with(4);
    api.seed(fake_items(6)).unwrap();
    let first = api
        .fetch_page(&ctx(Cursor::Page { page: 1 }, 1))
        .await
        .unwrap();
    assert_eq!(ids(&first.items), ids(&api.all()[..4]));
    assert_eq!(first.has_more, Some(true));
    let second = api
        .fetch_page(&ctx(Cursor::Page { page: 2 }, 2))
        .await
        .unwrap();
    assert_eq!(ids(&second.items), ids(&api.all()[4..]));
    assert_eq!(second.has_more, Some(false));

    let mut seen = Vec::new();
    for page in 1.. {
        let listing = api.fetch_all(&ctx(Cursor::Snapshot, page)).await.unwrap();
        seen.extend(ids(&listing.items));
        if listing.has_more != Some(true) {
            break;
        }
    }
    assert_eq!(seen, ids(&api.all()));

    let err = api
        .fetch_page(&ctx(Cursor::Page { page: 0 }, 1))
        .await
        .unwrap_err();
    assert_eq!(http_status(&err), Some(400));
}

#[tokio::test]
async fn adapters_reject_the_wrong_cursor_kind() {
    let (api, _clock) = setup();
    let timestamp = Cursor::Timestamp {
        value: None,
        tie_break: None,
    };
    let err = api
        .fetch_since(&ctx(Cursor::Snapshot, 1))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "fake api: fetch_since expects a timestamp cursor, got a snapshot cursor"
    );
    let err = api
        .fetch_token(&ctx(timestamp.clone(), 1))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("expects a token cursor"), "{err}");
    let err = api
        .fetch_page(&ctx(timestamp.clone(), 1))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("expects a page cursor"), "{err}");
    let err = api
        .fetch_all(&ctx(Cursor::Page { page: 1 }, 1))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("expects a snapshot cursor"),
        "{err}"
    );
    assert_eq!(api.calls(), 0, "a wrong cursor sends no request");
}

/// A fetch context whose validators live in `store` under `partition`.
fn ctx_with_validators(
    cursor: Cursor,
    store: &Arc<MemoryStore>,
    clock: &ManualClock,
    partition: &str,
) -> FetchContext {
    let key = PKey::new("fake", partition);
    let mut ctx = FetchContext::new(cursor, Partition::new(partition));
    ctx.validators = Some(ValidatorAccess::new(
        Arc::clone(store) as Arc<dyn Store>,
        key,
        Arc::new(clock.clone()),
    ));
    ctx
}

/// Commits what a context's fetch staged, as the engine does with the page.
async fn commit_staged(store: &MemoryStore, ctx: &FetchContext, now: i64) {
    let access = ctx.validators.as_ref().unwrap();
    let key = access.key().clone();
    let lease = store
        .acquire_lease(&key, "test", 60_000, now)
        .await
        .unwrap()
        .unwrap();
    let batch = CommitBatch::default().validators(access.staged());
    store.commit_poll(&key, &lease, &batch).await.unwrap();
    store.release_lease(&key, &lease).await.unwrap();
}

#[tokio::test]
async fn adapters_send_committed_etags_per_key_and_url_and_stage_new_ones() {
    let (api, clock) = setup();
    api.seed(fake_items(3)).unwrap();
    api.set_etags(true);
    api.set_rate_limit(Some(RateLimitSpec::new(
        100,
        100,
        1_000,
        RateLimitSource::Legacy,
    )));
    let store = Arc::new(MemoryStore::new());

    // Without validators in the context, every request is unconditional.
    assert!(
        !api.fetch_all(&ctx(Cursor::Snapshot, 1))
            .await
            .unwrap()
            .not_modified
    );
    assert!(
        !api.fetch_all(&ctx(Cursor::Snapshot, 1))
            .await
            .unwrap()
            .not_modified
    );

    // A 200 stages its ETag; until it is committed, the same request is unconditional again.
    let first = ctx_with_validators(Cursor::Snapshot, &store, &clock, "");
    assert_eq!(api.fetch_all(&first).await.unwrap().items.len(), 3);
    let again = ctx_with_validators(Cursor::Snapshot, &store, &clock, "");
    assert!(
        !api.fetch_all(&again).await.unwrap().not_modified,
        "nothing committed yet"
    );
    commit_staged(&store, &first, T0).await;
    let repeat = api.fetch_all(&again).await.unwrap();
    assert!(repeat.not_modified, "an identical listing is not modified");
    assert!(repeat.items.is_empty());
    assert_eq!(repeat.has_more, None);
    assert_eq!(repeat.rate_limit.unwrap().remaining, Some(95));

    // Another partition has its own validators.
    let other = ctx_with_validators(Cursor::Snapshot, &store, &clock, "tenant-b");
    assert!(!api.fetch_all(&other).await.unwrap().not_modified);

    // A change makes the listing modified again.
    clock.advance(Duration::from_secs(1));
    api.add(json!({ "id": "item-004" })).unwrap();
    let changed = api.fetch_all(&again).await.unwrap();
    assert!(!changed.not_modified);
    assert_eq!(changed.items.len(), 4);

    for cursor in [
        Cursor::Timestamp {
            value: None,
            tie_break: None,
        },
        Cursor::Token { value: None },
    ] {
        let fetch = |c: &FetchContext| {
            let (api, c) = (api.clone(), c.clone());
            async move {
                match &c.cursor {
                    Cursor::Token { .. } => api.fetch_token(&c).await,
                    _ => api.fetch_since(&c).await,
                }
            }
        };
        let ctx = ctx_with_validators(cursor.clone(), &store, &clock, "");
        assert!(!fetch(&ctx).await.unwrap().not_modified, "{cursor:?}");
        commit_staged(&store, &ctx, T0).await;
        assert!(fetch(&ctx).await.unwrap().not_modified, "{cursor:?}");
    }
}

#[tokio::test]
async fn adapters_honour_the_fetch_cancellation() {
    let (api, clock) = setup();
    api.seed(fake_items(1)).unwrap();
    api.set_latency(Duration::from_millis(200));
    let context = ctx(Cursor::Token { value: None }, 1);
    let cancel = context.cancel.clone();
    let fetch = tokio::spawn({
        let api = api.clone();
        async move { api.fetch_token(&context).await }
    });
    for _ in 0..5 {
        tokio::task::yield_now().await;
    }
    assert!(!fetch.is_finished());
    cancel.cancel();
    let err = fetch.await.unwrap().unwrap_err();
    assert!(err.to_string().contains("cancelled"), "{err}");
    assert_eq!(api.calls(), 0);

    // Without cancellation the fetch completes once the clock passed the latency.
    let context = ctx(Cursor::Page { page: 1 }, 1);
    let fetch = tokio::spawn({
        let api = api.clone();
        async move { api.fetch_page(&context).await }
    });
    for _ in 0..5 {
        tokio::task::yield_now().await;
    }
    assert!(!fetch.is_finished());
    clock.advance(Duration::from_millis(200));
    assert_eq!(fetch.await.unwrap().unwrap().items.len(), 1);
}

#[tokio::test]
async fn adapter_faults_surface_as_fetch_errors() {
    let (api, _clock) = setup();
    api.seed(fake_items(2)).unwrap();
    api.fail_next(Fault::http_retry_after(429, 2_000), 1);
    api.fail_next(Fault::Malformed, 1);
    let since = Cursor::Timestamp {
        value: None,
        tie_break: None,
    };
    let err = api.fetch_since(&ctx(since.clone(), 1)).await.unwrap_err();
    let core = err.downcast_ref::<Error>().unwrap();
    assert!(core.is_transient());
    assert!(matches!(
        core,
        Error::Http {
            retry_after_ms: Some(2_000),
            ..
        }
    ));
    let garbage = api.fetch_since(&ctx(since.clone(), 1)).await.unwrap();
    assert_eq!(garbage.items.len(), 3);
    assert!(garbage.items.iter().all(|item| item.get("id").is_none()));
    let ok = api.fetch_since(&ctx(since, 1)).await.unwrap();
    assert_eq!(ids(&ok.items), ["item-001", "item-002"]);
    assert_eq!(ok.has_more, Some(false));
}
