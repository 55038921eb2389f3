//! Redis-specific behaviour beyond the conformance suite: bad input (a 5 MB payload, names with
//! `:`, `{`, `}` and unicode, foreign data under the prefix), JSON kept byte for byte, two
//! instances fencing each other, connection failures, and a Redis restart in the middle of a run
//! (on a private `redis-server` this test starts, never the shared one).

mod common;

use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::Duration;

use common::servers::{EPHEMERAL, free_port, hash_tag};
use common::{Server, store_at, unique_prefix, with_server};
use futures::TryStreamExt;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use watukuy_conformance::CaseError;
use watukuy_conformance::cases::fixtures;
use watukuy_core::{
    Error, ErrorCode, Event,
    json::Json,
    store::{
        CommitBatch, ItemRow, LaneCursor, Lanes, Lease, LogQuery, OutboxRow, PKey, ParkedError,
        ParkedKind, ParkedQuery, ParkedRow, SerializedError, StatePatch, Store, StoreErrorKind,
        Validator,
    },
};
use watukuy_store_redis::{RedisOptions, RedisStore};

const T0: i64 = 1_767_225_600_000;
const TTL: i64 = 30_000;

fn fail(message: impl Into<String>) -> CaseError {
    CaseError::failed(message)
}

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(fail(format!($($msg)+)));
        }
    };
}

fn json(text: &str) -> Result<Json, CaseError> {
    Json::parse(text).map_err(|e| fail(format!("bad test JSON: {e}")))
}

/// A created event of `s<sequence>` on `key` carrying `data`, without a cursor.
fn event(key: &PKey, id: &str, sequence: i64, data: Json) -> Event {
    let mut event = fixtures::event(key, id, sequence, &format!("s{sequence}"));
    event.cursor = None;
    event.data = Some(data);
    event
}

fn item(identity: &str, payload: Option<Json>) -> ItemRow {
    ItemRow {
        identity: identity.to_owned(),
        version: Some("v1".to_owned()),
        hash: format!("hash-{identity}"),
        schema_version: 1,
        payload,
        seen_at: T0,
    }
}

fn parked(id: &str, item: Json, hold: Option<&str>) -> ParkedRow {
    ParkedRow {
        id: id.to_owned(),
        kind: ParkedKind::Invalid,
        event: None,
        item: Some(item),
        error: ParkedError {
            error: SerializedError::new("ValidationError", "bad item"),
            history: None,
            issues: None,
            details: Default::default(),
        },
        attempts: 0,
        parked_at: T0,
        hold_key: hold.map(str::to_owned),
    }
}

/// A commit of one item (with `payload`), its event (data `payload`, logged) and a quarantined
/// row holding `payload` as its raw item.
fn page(key: &PKey, identity: &str, sequence: i64, payload: &Json) -> CommitBatch {
    CommitBatch::default()
        .state_patch(StatePatch {
            sequence: Some(sequence),
            updated_at: Some(T0),
            ..StatePatch::default()
        })
        .upserts(vec![item(identity, Some(payload.clone()))])
        .events(vec![OutboxRow::pending(
            event(key, &format!("evt-{identity}"), sequence, payload.clone()),
            T0,
        )])
        .log(true)
        .parked(vec![parked(
            &format!("invalid:{identity}"),
            payload.clone(),
            Some(identity),
        )])
}

async fn acquire(store: &dyn Store, key: &PKey, owner: &str, now: i64) -> Result<Lease, CaseError> {
    store
        .acquire_lease(key, owner, TTL, now)
        .await?
        .ok_or_else(|| fail(format!("{owner} could not acquire {key} at {now}")))
}

/// Commits `page(key, identity, 1, payload)` and checks that every path reads `payload` back
/// byte for byte: the snapshot, the outbox, the log and the parked row.
async fn round_trip(store: &RedisStore, key: &PKey, payload: &Json) -> Result<(), CaseError> {
    let lease = acquire(store, key, "node-a", T0).await?;
    let identity = "o-1";
    store
        .commit_poll(key, &lease, &page(key, identity, 1, payload))
        .await?;
    let rows = store.load_versions(key, &[identity.to_owned()]).await?;
    let stored = rows
        .get(identity)
        .and_then(|row| row.payload.as_ref())
        .ok_or_else(|| fail("the item's payload is missing"))?;
    ensure!(
        stored.as_str() == payload.as_str(),
        "item payload changed ({} -> {} bytes)",
        payload.as_str().len(),
        stored.as_str().len()
    );
    let pending = store.load_pending(key, 10).await?;
    let log = store.read_log(key, LogQuery::default(), 10).await?;
    let parked = store.list_parked(key, ParkedQuery::default()).await?;
    let copies = [
        (
            "the outbox row's event data",
            pending.first().and_then(|row| row.event.data.as_ref()),
        ),
        (
            "the log entry's event data",
            log.first().and_then(|entry| entry.event.data.as_ref()),
        ),
        (
            "the parked row's raw item",
            parked.first().and_then(|row| row.item.as_ref()),
        ),
    ];
    for (what, copy) in copies {
        let copy = copy.ok_or_else(|| fail(format!("{what} is missing")))?;
        ensure!(copy.as_str() == payload.as_str(), "{what} changed");
    }
    ensure!(
        store.held_keys(key).await? == vec![identity.to_owned()],
        "hold key missing"
    );
    Ok(())
}

/// A test `$name` running `$body` against the test server ([`with_server`]).
macro_rules! server_test {
    ($name:ident, $body:expr) => {
        #[watukuy_testenv::requires(redis, or_cfg(feature = "testcontainers"))]
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            with_server(stringify!($name), $body).await;
        }
    };
}

/// A store under a fresh prefix on the test server.
async fn fresh(server: &Server, what: &str) -> Result<RedisStore, CaseError> {
    store_at(
        &server.url,
        RedisOptions::default().prefix(unique_prefix(what)),
    )
    .await
}

// A 5 MB payload goes through every path of the store intact.
server_test!(five_megabyte_payload_round_trips, |server| async move {
    let store = fresh(&server, "big").await?;
    let key = PKey::new("orders", "");
    let mut text = String::with_capacity(5 * 1024 * 1024 + 64);
    text.push_str(r#"{"blob":""#);
    while text.len() < 5 * 1024 * 1024 {
        text.push_str("0123456789abcdef\u{e9}\u{1F600}");
    }
    text.push_str(r#"","n":123456789012345678901234567890}"#);
    let payload = json(&text)?;
    round_trip(&store, &key, &payload).await?;
    store.purge().await?;
    Ok(())
});

// Big integers, escapes, unicode, empty containers, odd numbers and key order come back
// exactly as written, in payloads and in lane cursors.
server_test!(json_round_trips_byte_for_byte, |server| async move {
    let store = fresh(&server, "json").await?;
    let texts = [
        r#"{"z":1,"a":[],"m":{},"big":123456789012345678901234567890,"neg":-0.5e-7}"#,
        r#"{"escaped":"\u00e9\u0000\n\"","raw":"é😀","nested":[[[]],{"":null}]}"#,
        r#"[]"#,
        r#"null"#,
        r#"  {"spaced" : [ 1 , 2 ] }  "#,
        r#"18446744073709551616"#,
    ];
    for (i, text) in texts.iter().enumerate() {
        let key = PKey::new("json", format!("p{i}"));
        round_trip(&store, &key, &json(text)?).await?;
    }
    // Lane cursors are strings holding JSON: they survive too.
    let key = PKey::new("json", "cursor");
    let lease = acquire(&store, &key, "node-a", T0).await?;
    let cursor = r#"{"value":"2026-01-01T00:00:00Z","id":12345678901234567890123}"#.to_owned();
    let lanes = Lanes {
        live: Some(LaneCursor {
            cursor: Some(cursor.clone()),
            ..LaneCursor::default()
        }),
        ..Lanes::default()
    };
    store
        .save_state(
            &key,
            &lease,
            &StatePatch {
                lanes: Some(lanes.clone()),
                updated_at: Some(T0),
                ..StatePatch::default()
            },
        )
        .await?;
    let state = store
        .load_state(&key)
        .await?
        .ok_or_else(|| fail("state missing"))?;
    ensure!(state.lanes == lanes, "lanes changed: {:?}", state.lanes);
    store.purge().await?;
    Ok(())
});

// Names with `:`, `{`, `}`, `%`, unicode and empty strings are stored and listed exactly; all
// keys of one `(poller, partition)` share one cluster slot; `a:b`/`c` and `a`/`b:c` do not
// collide.
server_test!(
    weird_names_keep_one_slot_and_never_collide,
    |server| async move {
        let weird = [
            PKey::new("a:b", "c"),
            PKey::new("a", "b:c"),
            PKey::new("{orders}", "}tenant{"),
            PKey::new("ord}ers", "{"),
            PKey::new("100%", "%3A"),
            PKey::new("заказы", "租户-β 😀"),
            PKey::new("", ""),
            PKey::new(":", ":"),
        ];
        // One store per key, so that every key under a prefix but the lists belongs to it.
        for key in &weird {
            let store = fresh(&server, "slot").await?;
            let lease = acquire(&store, key, "node-a", T0).await?;
            store
                .commit_poll(key, &lease, &page(key, "o{1}:x", 1, &json("{}")?))
                .await?;
            store
                .record_attempt(
                    key,
                    &lease,
                    "evt-o{1}:x",
                    &SerializedError::new("HandlerError", "once"),
                    Some(T0 + 1),
                )
                .await?;
            let validator = watukuy_core::store::UrlValidator {
                url_hash: "url:{hash}".to_owned(),
                validator: Validator {
                    etag: Some("\"e\"".to_owned()),
                    last_modified: None,
                    stored_at: T0,
                },
            };
            let batch = CommitBatch::default().validators(vec![validator]);
            store.commit_poll(key, &lease, &batch).await?;
            let names = scan(&server, store.options().get_prefix()).await?;
            // One hash tag for all of them: one slot, whatever the cluster's hashing.
            let mut tags = BTreeSet::new();
            let mut data_keys = 0;
            for name in &names {
                let tag = hash_tag(name);
                if tag == b"keys" {
                    continue;
                }
                data_keys += 1;
                tags.insert(tag.to_vec());
            }
            ensure!(
                data_keys == 14 && tags.len() == 1,
                "{key:?}: {data_keys} keys under hash tags {tags:?}: {names:?}"
            );
            ensure!(
                store.list_keys(None).await? == vec![key.clone()],
                "{key:?} is not listed exactly"
            );
            ensure!(
                store.list_keys(Some(&key.poller)).await? == vec![key.clone()],
                "{key:?} is not listed under its poller"
            );
            store.purge().await?;
        }

        // All of them in one store: each sees only its own data.
        let store = fresh(&server, "weird").await?;
        for (i, key) in weird.iter().enumerate() {
            let lease = acquire(&store, key, "node-a", T0).await?;
            let payload = json(&format!(r#"{{"owner":{i}}}"#))?;
            store
                .commit_poll(key, &lease, &page(key, &format!("id-{i}"), 1, &payload))
                .await?;
        }
        let mut expected = weird.to_vec();
        expected.sort();
        ensure!(
            store.list_keys(None).await? == expected,
            "list_keys differs: {:?}",
            store.list_keys(None).await?
        );
        for (i, key) in weird.iter().enumerate() {
            let ids: Vec<Vec<String>> = store.stream_identities(key, 10).try_collect().await?;
            ensure!(ids == vec![vec![format!("id-{i}")]], "{key:?} sees {ids:?}");
            ensure!(
                store.counts(key).await.map(|c| c.pending)? == 1,
                "{key:?} outbox"
            );
            ensure!(
                store.held_keys(key).await? == vec![format!("id-{i}")],
                "{key:?} holds"
            );
        }
        // Deleting `a:b`/`c` leaves `a`/`b:c` alone.
        store.delete_key(&weird[0]).await?;
        ensure!(
            store.counts(&weird[0]).await.map(|c| c.items)? == 0,
            "a:b/c not deleted"
        );
        ensure!(
            store.counts(&weird[1]).await.map(|c| c.items)? == 1,
            "a/b:c was hit"
        );
        ensure!(
            store.list_keys(Some("a")).await? == vec![weird[1].clone()],
            "a/b:c unlisted"
        );
        ensure!(
            store.list_keys(Some("a:b")).await?.is_empty(),
            "a:b still listed"
        );
        store.purge().await?;
        Ok(())
    }
);

// Identities that are special in `ZRANGEBYLEX` (`-`, `+`, `(`, `[`, the empty string) and
// unicode page exactly, in byte order.
server_test!(
    stream_identities_pages_special_identities_exactly,
    |server| async move {
        let store = fresh(&server, "identities").await?;
        let key = PKey::new("orders", "");
        let lease = acquire(&store, &key, "node-a", T0).await?;
        let identities = ["", "-", "+", "(", "[", "((", "a", "é", "😀", "z\u{0}"];
        let batch =
            CommitBatch::default().upserts(identities.iter().map(|id| item(id, None)).collect());
        store.commit_poll(&key, &lease, &batch).await?;
        let batches: Vec<Vec<String>> = store.stream_identities(&key, 3).try_collect().await?;
        let sizes: Vec<usize> = batches.iter().map(Vec::len).collect();
        ensure!(sizes == vec![3, 3, 3, 1], "batch sizes {sizes:?}");
        let all: Vec<String> = batches.into_iter().flatten().collect();
        let mut expected: Vec<String> = identities.iter().map(|s| (*s).to_owned()).collect();
        expected.sort();
        ensure!(all == expected, "identities {all:?}");
        store.purge().await?;
        Ok(())
    }
);

// A fenced write over a value of another type under the store's keys fails inside its script:
// permanent, and nothing else of the batch lands (the suite's
// `setup::undecodable_rows_are_corrupt_errors` covers the reads).
server_test!(
    a_write_over_foreign_data_is_a_permanent_error,
    |server| async move {
        let store = fresh(&server, "foreign").await?;
        let prefix = store.options().get_prefix().to_owned();
        let key = PKey::new("orders", "");
        let mut conn = raw(&server).await?;
        let _: () = redis::cmd("SET")
            .arg(format!("{prefix}p:{{orders:}}:state"))
            .arg("not a hash")
            .query_async(&mut conn)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let lease = acquire(&store, &key, "node-a", T0).await?;
        let err = store
            .commit_poll(&key, &lease, &page(&key, "o2", 1, &json("{}")?))
            .await
            .err();
        ensure!(
            err.as_ref().is_some_and(|e| !e.is_transient()),
            "commit over foreign data: {err:?}"
        );
        ensure!(
            store.counts(&key).await.map(|c| c.pending)? == 0
                && store.counts(&key).await.map(|c| c.parked)? == 0,
            "a commit that failed on foreign data left part of its writes"
        );
        store.purge().await?;
        Ok(())
    }
);

/// Bad URLs are `Config` errors naming `redis.url`; a refused connection is a transient
/// `Connection` error that says where; bad options fail before any connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_failures_are_clear() {
    let err = RedisStore::connect("http://example.com", RedisOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Config { ref option, .. } if option == "redis.url"),
        "{err}"
    );
    let port = free_port();
    let err = RedisStore::connect(
        &format!("redis://127.0.0.1:{port}"),
        RedisOptions::default(),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Store {
                kind: StoreErrorKind::Connection,
                transient: true,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
    let err = RedisStore::connect("redis://127.0.0.1:1", RedisOptions::default().prefix("a b"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Config);
    assert!(err.to_string().contains("redis.prefix"), "{err}");
}

/// A Redis restart in the middle of a run: calls fail with transient errors while the server
/// is down, the store recovers by itself when it is back (reloading its scripts), and — the
/// server has no persistence — everything stored before is gone, as the README warns.
#[watukuy_testenv::requires(redis_server)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_mid_run_is_transient_then_recovers() {
    let port = free_port();
    let mut server = RedisChild::start(port).await;
    let url = format!("redis://127.0.0.1:{port}");
    let options = RedisOptions::default()
        .prefix("restart:")
        .reconnect_attempts(0)
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2));
    let store = RedisStore::connect(&url, options)
        .await
        .expect("connect to the private redis-server");
    store.migrate().await.expect("migrate");
    let key = PKey::new("orders", "tenant:{1}");
    let lease = store
        .acquire_lease(&key, "node-a", TTL, T0)
        .await
        .expect("acquire")
        .expect("free lease");
    let payload = Json::parse(r#"{"n":1}"#).expect("json");
    store
        .commit_poll(&key, &lease, &page(&key, "o1", 1, &payload))
        .await
        .expect("first commit");

    // The script cache is emptied (as a failover would): the next fenced write reloads it.
    let mut admin = redis::Client::open(url.as_str())
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("admin connection");
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut admin)
        .await
        .expect("SCRIPT FLUSH");
    store
        .commit_poll(&key, &lease, &page(&key, "o2", 2, &payload))
        .await
        .expect("commit after SCRIPT FLUSH");
    assert_eq!(store.counts(&key).await.map(|c| c.items).expect("count"), 2);

    // The server dies in the middle of the run.
    server.kill().await;
    let errors = [
        store.load_state(&key).await.err(),
        store
            .commit_poll(&key, &lease, &page(&key, "o3", 3, &payload))
            .await
            .err(),
        store.acquire_lease(&key, "node-a", TTL, T0 + 1).await.err(),
        store.counts(&key).await.map(|c| c.pending).err(),
    ];
    for error in errors {
        let error = error.expect("a call succeeded while Redis was down");
        assert!(
            error.is_transient() && error.code() == ErrorCode::Store,
            "not a transient store error: {error}"
        );
    }

    // It comes back (empty: no persistence); the store recovers within a few calls.
    let _server = RedisChild::start(port).await;
    let mut recovered = None;
    for _ in 0..10 {
        match store.counts(&key).await.map(|c| c.items) {
            Ok(n) => {
                recovered = Some(n);
                break;
            }
            Err(error) => assert!(error.is_transient(), "permanent error: {error}"),
        }
    }
    assert_eq!(
        recovered,
        Some(0),
        "the store did not recover, or kept data"
    );
    assert_eq!(store.load_state(&key).await.expect("state"), None);
    assert_eq!(store.get_lease(&key).await.expect("lease"), None);
    assert!(store.list_keys(None).await.expect("keys").is_empty());
    // Epochs start over on an empty server; the stale lease of node-a is fenced by owner.
    let fresh = store
        .acquire_lease(&key, "node-b", TTL, T0 + 2)
        .await
        .expect("acquire after restart")
        .expect("free lease");
    assert_eq!(fresh.epoch, 1);
    assert!(matches!(
        store
            .commit_poll(&key, &lease, &page(&key, "o4", 4, &payload))
            .await,
        Err(Error::LeaseLost { .. })
    ));
    store
        .commit_poll(&key, &fresh, &page(&key, "o4", 4, &payload))
        .await
        .expect("commit after restart (scripts reloaded)");
    let pending = store.counts(&key).await.expect("counts").pending;
    assert_eq!(pending, 1);
}

/// A private `redis-server` (no persistence) on `port`, killed when dropped.
struct RedisChild {
    child: Child,
}

impl RedisChild {
    /// Starts it and waits until it logs that it accepts connections. Fails when `redis-server`
    /// was not found (the test is ignored then, unless run anyway or required).
    async fn start(port: u16) -> Self {
        let program =
            watukuy_testenv::program!("redis-server").unwrap_or_else(|why| panic!("{why}"));
        let mut child = Command::new(program)
            .args(["--port", &port.to_string()])
            .args(EPHEMERAL)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {program}: {e}"));
        let stdout = child.stdout.take().expect("redis-server stdout");
        let mut lines = BufReader::new(stdout).lines();
        let ready = tokio::time::timeout(Duration::from_secs(30), async {
            while let Ok(Some(line)) = lines.next_line().await {
                if line.contains("Ready to accept connections") {
                    return true;
                }
            }
            false
        })
        .await;
        assert!(
            matches!(ready, Ok(true)),
            "redis-server on port {port} did not become ready"
        );
        // Keep reading its log so it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Self { child }
    }

    /// Kills it (SIGKILL: a crash, nothing flushed) and waits for it to exit.
    async fn kill(&mut self) {
        self.child.kill().await.expect("kill redis-server");
    }
}

/// A plain connection for writing foreign data.
async fn raw(server: &Server) -> Result<redis::aio::MultiplexedConnection, CaseError> {
    redis::Client::open(server.url.as_str())
        .map_err(|e| fail(e.to_string()))?
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| fail(e.to_string()))
}

/// Every key under `prefix`.
async fn scan(server: &Server, prefix: &str) -> Result<Vec<Vec<u8>>, CaseError> {
    let mut conn = raw(server).await?;
    let mut cursor: u64 = 0;
    let mut out = Vec::new();
    loop {
        let (next, batch): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .map_err(|e| fail(e.to_string()))?;
        out.extend(batch);
        if next == 0 {
            return Ok(out);
        }
        cursor = next;
    }
}

#[test]
fn hash_tags_follow_the_redis_cluster_spec() {
    assert_eq!(hash_tag(b"user:{1000}:following"), b"1000");
    assert_eq!(hash_tag(b"foo{}{bar}"), b"foo{}{bar}");
}

/// The testcontainers fallback (feature `testcontainers`, for machines with Docker) hands the
/// suite a URL built from the container's host and mapped port: the driver reads back the same
/// address for a name, an IPv4 and an IPv6 host.
#[test]
fn the_container_url_reaches_the_mapped_port() {
    use redis::{ConnectionAddr, IntoConnectionInfo};

    for (host, expected) in [
        ("localhost", "localhost"),
        ("127.0.0.1", "127.0.0.1"),
        ("[::1]", "::1"),
    ] {
        let url = common::container_url(host, 49_153);
        let info = url
            .as_str()
            .into_connection_info()
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        match info.addr() {
            ConnectionAddr::Tcp(parsed, port) => {
                assert_eq!(parsed.trim_matches(['[', ']']), expected, "{url}");
                assert_eq!(*port, 49_153, "{url}");
            }
            other => panic!("{url}: {other:?}"),
        }
    }
}
