//! A crash between an HTTP `200` and the commit of its page, with ETags in play, on the durable
//! stores (SQLite and PostgreSQL): the page's validators were only staged, so the instance that
//! takes over asks again without `If-None-Match` and delivers every change. (Were the `ETag`
//! stored on arrival, the next request would get a `304` and the page would be lost until the
//! resource changed again.)

mod common;

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use watukuy_conformance::backend_url;
use watukuy_core::cursor::{self, Cursor};
use watukuy_core::{
    Engine, Event, EventType, FetchContext, Poller, TickOptions, clock::ManualClock,
    rng::SeededRng, store::Store,
};
use watukuy_store_postgres::{PostgresOptions, PostgresStore};
use watukuy_store_sqlite::{SqliteOptions, SqliteStore};
use watukuy_testkit::{FaultyStore, KillPoint, KillSwitch};

use common::{Item, Reply, Server, T0, client, collect_events};

const POLLER: &str = "orders";

/// Page 1 of `/orders`: two items, `ETag: "v1"`, and a `304` to a matching `If-None-Match`;
/// page 2 is empty.
fn api() -> impl Fn(&common::Seen) -> Reply + Send + Sync + 'static {
    |seen| {
        if seen.query("page").as_deref() != Some("1") {
            return Reply::json(200, &json!([]));
        }
        if seen.header("if-none-match") == Some("\"v1\"") {
            return Reply::status(304).header("etag", "\"v1\"");
        }
        Reply::json(200, &json!([{ "id": "a", "v": 1 }, { "id": "b", "v": 1 }]))
            .header("etag", "\"v1\"")
    }
}

/// An engine named `instance` on `store` polling `url` page by page (conditional requests on).
fn engine(
    store: Arc<dyn Store>,
    clock: &ManualClock,
    url: &str,
    instance: &str,
) -> (Engine, Arc<std::sync::Mutex<Vec<Event>>>) {
    let http = client();
    let url = url.to_owned();
    let poller = Poller::builder::<Item>(POLLER)
        .identity(|item: &Item| item.id.clone())
        .cursor(cursor::page(1))
        .fetch(move |ctx: FetchContext| {
            let (http, url) = (http.clone(), url.clone());
            async move {
                let Cursor::Page { page } = ctx.cursor else {
                    return Err("not a page cursor".into());
                };
                let page = http.get(&ctx, url).query("page", page).send().await?;
                let page = page.items_page()?;
                let full = page.items.len() == 2;
                Ok(page.has_more(full))
            }
        })
        .build()
        .unwrap();
    let engine = Engine::builder(store)
        .poller(poller)
        .clock(Arc::new(clock.clone()))
        .rng(Arc::new(SeededRng::new(3)))
        .instance_id(instance)
        .lease(Duration::from_secs(30), None)
        .build()
        .unwrap();
    let events = collect_events(&engine, POLLER);
    (engine, events)
}

/// node-a fetches page 1 (a `200` with an `ETag`) and dies before its commit; node-b takes
/// over after the lease TTL on the same store.
async fn crash_between_fetch_and_commit(store: Arc<dyn Store>, label: &str) {
    store.migrate().await.unwrap();
    let server = Server::start(api()).await;
    let url = server.url("/orders");
    let clock = ManualClock::new(T0);

    let kills = Arc::new(KillSwitch::new());
    kills.arm(KillPoint::AfterFetch);
    let faulty = Arc::new(FaultyStore::new(Arc::clone(&store)).with_kills(Arc::clone(&kills)));
    let (node_a, lost) = engine(faulty.clone(), &clock, &url, "node-a");
    let result = node_a.tick(TickOptions::default()).await.unwrap();
    assert_eq!(kills.fired(KillPoint::AfterFetch), 1, "{label}: {result:?}");
    assert!(faulty.is_dead(), "{label}");
    assert!(lost.lock().unwrap().is_empty(), "{label}");
    let seen = server.seen();
    assert_eq!(seen.len(), 1, "{label}");
    assert_eq!(seen[0].header("if-none-match"), None, "{label}");
    drop(node_a);

    // The 200 was received, its page never committed: no validator may be stored.
    let key = watukuy_core::store::PKey::new(POLLER, "");
    let page_1 = format!("{url}?page=1");
    assert_eq!(
        store
            .get_validator(&key, &watukuy_core::diff::hash_url(&page_1))
            .await
            .unwrap(),
        None,
        "{label}: a validator outlived the page it validated"
    );

    clock.advance(Duration::from_secs(31));
    let (node_b, events) = engine(Arc::clone(&store), &clock, &url, "node-b");
    let result = node_b.tick(TickOptions::default()).await.unwrap();
    assert!(
        result.polled.iter().all(|p| p.error.is_none()),
        "{label}: {result:?}"
    );
    let seen = server.seen();
    assert_eq!(
        seen[1].header("if-none-match"),
        None,
        "{label}: node-b must ask again unconditionally"
    );
    let delivered: Vec<(EventType, String)> = events
        .lock()
        .unwrap()
        .iter()
        .map(|e| (e.event_type, e.subject.to_string()))
        .collect();
    assert_eq!(
        delivered,
        [
            (EventType::Created, "a".to_owned()),
            (EventType::Created, "b".to_owned())
        ],
        "{label}: every change is delivered after the crash"
    );

    // Now the validator is committed with its page: the next request is conditional, a 304.
    clock.advance(Duration::from_secs(60));
    node_b.tick(TickOptions::default()).await.unwrap();
    let seen = server.seen();
    let requests: Vec<(String, Option<String>)> = seen
        .iter()
        .map(|s| (s.uri.clone(), s.header("if-none-match").map(str::to_owned)))
        .collect();
    assert_eq!(
        requests[3..],
        [
            ("/orders?page=1".to_owned(), Some("\"v1\"".to_owned())),
            ("/orders?page=2".to_owned(), None)
        ],
        "{label}: page 1 is conditional (a 304), page 2 ends the listing"
    );
    assert_eq!(events.lock().unwrap().len(), 2, "{label}");
}

#[tokio::test]
async fn sqlite_a_crash_between_fetch_and_commit_loses_no_change() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(SqliteOptions::file(dir.path().join("crash.sqlite"))).unwrap();
    crash_between_fetch_and_commit(Arc::new(store), "sqlite").await;
}

#[watukuy_testenv::requires(postgres)]
#[tokio::test]
async fn postgres_a_crash_between_fetch_and_commit_loses_no_change() {
    let url = backend_url("postgres", "WATUKUY_TEST_POSTGRES_URL")
        .unwrap_or_else(|error| panic!("{error}"));
    let schema = format!("wk_{}_http_crash", std::process::id());
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let drop_schema = format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE");
    sqlx::query(&drop_schema).execute(&pool).await.unwrap();
    let store =
        PostgresStore::from_pool(pool.clone(), PostgresOptions::default().schema(schema)).unwrap();
    crash_between_fetch_and_commit(Arc::new(store), "postgres").await;
    sqlx::query(&drop_schema).execute(&pool).await.unwrap();
}
