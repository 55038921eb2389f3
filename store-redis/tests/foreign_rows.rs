//! Data another client wrote under the store's prefix, anything in any field of any key: every
//! read of the store answers with what it can decode or a permanent `Corrupt` error, never a
//! panic and never another kind of error (the Redis side of `store-sqlite/tests/foreign_rows.rs`).
//!
//! The targets are what one of everything leaves under the prefix (`KEYS <prefix>*`): every
//! field of every hash, every member of every sorted set and set, and every key as a whole, so a
//! key or field a later release adds is covered. A case changes one of them with a client of its
//! own: a hash field gets any bytes (not UTF-8 included), JSON at the edges or the stored JSON
//! with one value changed (`fixtures::json_mutant`), or goes; a sorted-set member gets a score at
//! the edges, or goes; any of them gets a foreign sibling; a key is replaced by a key of another
//! type. A write the server refuses (a score that is not a float) is no foreign data: the case
//! is discarded. One prefix serves the run; every case purges it and writes one of everything
//! again.

mod common;

use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use redis::aio::MultiplexedConnection;
use watukuy_conformance::cases::fixtures::{
    EDGE_INTEGERS, edge_json, json_mutant, key, populate_one_of_everything, read_everything,
};
use watukuy_conformance::{CaseError, OrFail};
use watukuy_core::Error;
use watukuy_core::store::{Store, StoreErrorKind};
use watukuy_store_redis::{RedisOptions, RedisStore};

use common::{store_at, unique_prefix, with_server};

/// One thing under the prefix a case changes.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Target {
    /// A field of a hash.
    Field { key: String, field: String },
    /// A member of a sorted set.
    Scored { key: String, member: String },
    /// A member of a set.
    Member { key: String, member: String },
    /// A key as a whole.
    Key(String),
}

/// What a case does to its target.
#[derive(Clone, Debug)]
enum Change {
    /// The field's value, or the member's score, becomes these bytes.
    Set(Vec<u8>),
    /// The field's JSON with one value replaced or removed (see `fixtures::json_mutant`).
    NearJson {
        at: usize,
        replacement: Option<String>,
    },
    /// The field or member goes.
    Remove,
    /// Another field (with this value) or member (with this score) beside it.
    Sibling(Vec<u8>, Vec<u8>),
    /// The key is replaced by one of this type.
    Retype(&'static str),
}

/// Every target under `prefix`, in order.
async fn targets(conn: &mut MultiplexedConnection, prefix: &str) -> Result<Vec<Target>, CaseError> {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(conn)
        .await
        .or_fail_with("KEYS")?;
    let mut out = Vec::new();
    for key in keys {
        let kind: String = redis::cmd("TYPE")
            .arg(&key)
            .query_async(conn)
            .await
            .or_fail_with("TYPE")?;
        let listing = match kind.as_str() {
            "hash" => "HKEYS",
            "zset" => "ZRANGE",
            _ => "SMEMBERS",
        };
        let mut list = redis::cmd(listing);
        list.arg(&key);
        if kind == "zset" {
            list.arg(0).arg(-1);
        }
        let names: Vec<String> = list.query_async(conn).await.or_fail_with(listing)?;
        for name in names {
            let key = key.clone();
            out.push(match kind.as_str() {
                "hash" => Target::Field { key, field: name },
                "zset" => Target::Scored { key, member: name },
                _ => Target::Member { key, member: name },
            });
        }
        out.push(Target::Key(key));
    }
    out.sort();
    if out.len() < 20 {
        return Err(CaseError::failed(format!(
            "one of everything left only {out:?}"
        )));
    }
    Ok(out)
}

/// A target and what a case does to it.
fn target_change(targets: Vec<Target>) -> impl Strategy<Value = (Target, Change)> {
    select(targets).prop_flat_map(|target| {
        let name = prop_oneof![
            "\\PC{0,8}".prop_map(String::into_bytes),
            proptest::collection::vec(any::<u8>(), 0..8),
        ];
        let value = prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..24),
            select(edge_json()).prop_map(String::into_bytes),
            select(EDGE_INTEGERS).prop_map(|n| n.to_string().into_bytes()),
            "\\PC{0,16}".prop_map(String::into_bytes),
        ];
        let score = prop_oneof![
            select(&["-inf", "+inf", "-1", "0", "0.5", "1e300", "-1e300", "nan"][..])
                .prop_map(|s| s.as_bytes().to_vec()),
            select(EDGE_INTEGERS).prop_map(|n| n.to_string().into_bytes()),
        ];
        let near = (any::<usize>(), proptest::option::of(select(edge_json())))
            .prop_map(|(at, replacement)| Change::NearJson { at, replacement });
        let change = match target {
            Target::Field { .. } => prop_oneof![
                3 => value.clone().prop_map(Change::Set),
                3 => near,
                1 => Just(Change::Remove),
                1 => (name, value).prop_map(|(name, value)| Change::Sibling(name, value)),
            ]
            .boxed(),
            Target::Scored { .. } => prop_oneof![
                3 => score.clone().prop_map(Change::Set),
                1 => Just(Change::Remove),
                1 => (name, score).prop_map(|(name, score)| Change::Sibling(name, score)),
            ]
            .boxed(),
            Target::Member { .. } => prop_oneof![
                Just(Change::Remove),
                name.prop_map(|name| Change::Sibling(name, Vec::new())),
            ]
            .boxed(),
            Target::Key(_) => select(&["string", "list", "set", "zset", "hash", "stream"][..])
                .prop_map(Change::Retype)
                .boxed(),
        };
        (Just(target), change)
    })
}

/// The commands that make `change` to `target`; `None` when there is no JSON to change.
async fn commands(
    conn: &mut MultiplexedConnection,
    target: &Target,
    change: &Change,
) -> Result<Option<redis::Pipeline>, CaseError> {
    let mut pipe = redis::pipe();
    match (target, change) {
        (Target::Field { key, field }, Change::NearJson { at, replacement }) => {
            let stored: Option<String> = redis::cmd("HGET")
                .arg(key)
                .arg(field)
                .query_async(conn)
                .await
                .or_fail_with("HGET")?;
            let Some(near) = stored.and_then(|s| json_mutant(&s, *at, replacement.as_deref()))
            else {
                return Ok(None);
            };
            pipe.hset(key, field, near);
        }
        (Target::Field { key, field }, Change::Set(value)) => {
            pipe.hset(key, field, value);
        }
        (Target::Field { key, field }, Change::Remove) => {
            pipe.hdel(key, field);
        }
        (Target::Field { key, .. }, Change::Sibling(name, value)) => {
            pipe.hset(key, name, value);
        }
        (Target::Scored { key, member }, Change::Set(score)) => {
            pipe.cmd("ZADD").arg(key).arg(score).arg(member);
        }
        (Target::Scored { key, member }, Change::Remove) => {
            pipe.zrem(key, member);
        }
        (Target::Scored { key, .. }, Change::Sibling(name, score)) => {
            pipe.cmd("ZADD").arg(key).arg(score).arg(name);
        }
        (Target::Member { key, member }, Change::Remove) => {
            pipe.srem(key, member);
        }
        (Target::Member { key, .. }, Change::Sibling(name, _)) => {
            pipe.sadd(key, name);
        }
        (Target::Key(key), Change::Retype(kind)) => {
            pipe.del(key);
            match *kind {
                "string" => pipe.set(key, "foreign"),
                "list" => pipe.rpush(key, "foreign"),
                "set" => pipe.sadd(key, "foreign"),
                "zset" => pipe.zadd(key, "foreign", 0),
                "hash" => pipe.hset(key, "foreign", "foreign"),
                _ => pipe.cmd("XADD").arg(key).arg("*").arg("foreign").arg("1"),
            };
        }
        (target, change) => {
            return Err(CaseError::failed(format!(
                "no command does {change:?} to {target:?}"
            )));
        }
    }
    Ok(Some(pipe))
}

/// One case: the prefix purged, one of everything written again, the foreign change made, every
/// read checked.
async fn case(
    store: &RedisStore,
    conn: &MultiplexedConnection,
    (target, change): (Target, Change),
) -> Result<(), TestCaseError> {
    let mut conn = conn.clone();
    let made = async {
        store.purge().await?;
        populate_one_of_everything(store).await?;
        let Some(pipe) = commands(&mut conn, &target, &change).await? else {
            return Ok(false);
        };
        match pipe.query_async::<()>(&mut conn).await {
            Ok(()) => Ok(true),
            Err(e) if e.is_io_error() || e.is_connection_dropped() => {
                Err(CaseError::failed(format!("{target:?}: {e}")))
            }
            // The server refused it (a score that is not a float): nothing was written.
            Err(_) => Ok(false),
        }
    }
    .await
    .map_err(|e: CaseError| TestCaseError::fail(e.to_string()))?;
    prop_assume!(made, "the server refused the change");
    read_everything(store).await.map_err(TestCaseError::fail)
}

/// A store under a prefix of its own (named after `test`) on the server at `url`, holding one of
/// everything, and a connection of the test's own to write beneath it.
async fn populated(
    url: &str,
    test: &str,
) -> Result<(String, RedisStore, MultiplexedConnection), CaseError> {
    let prefix = unique_prefix(test);
    let store = store_at(url, RedisOptions::default().prefix(&prefix)).await?;
    populate_one_of_everything(&store).await?;
    let conn = redis::Client::open(url)
        .or_fail()?
        .get_multiplexed_async_connection()
        .await
        .or_fail()?;
    Ok((prefix, store, conn))
}

#[watukuy_testenv::requires(redis, or_cfg(feature = "testcontainers"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anything_in_any_field_of_any_key_is_read_or_corrupt() {
    with_server("foreign_rows", |server| async move {
        let (prefix, store, mut conn) = populated(&server.url, "foreign_rows").await?;
        let strategy = target_change(targets(&mut conn, &prefix).await?);
        let handle = tokio::runtime::Handle::current();
        let mut runner = TestRunner::new(Config {
            source_file: Some(file!()),
            ..Config::with_cases(64)
        });
        // A synchronous runner: each case blocks this thread on the runtime.
        tokio::task::block_in_place(|| {
            let outcome = runner.run(&strategy, |input| {
                handle.block_on(case(&store, &conn, input))
            });
            outcome.or_fail()
        })?;
        store.purge().await?;
        Ok(())
    })
    .await;
}

/// Found by the property: a key of another type read through a pipeline (a poller's partitions
/// for `list_keys`, a key's items for `load_versions`) was an `Other` error, not `Corrupt`: the
/// driver reports a pipeline's `WRONGTYPE` without its code.
#[watukuy_testenv::requires(redis, or_cfg(feature = "testcontainers"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_another_type_read_through_a_pipeline_is_corrupt() {
    with_server("foreign_rows_pipeline", |server| async move {
        let (prefix, store, mut conn) = populated(&server.url, "foreign_rows_pipeline").await?;
        for part in ["{keys}:partitions:orders", "p:{orders:}:items"] {
            let target = Target::Key(format!("{prefix}{part}"));
            if let Some(pipe) = commands(&mut conn, &target, &Change::Retype("string")).await? {
                pipe.query_async::<()>(&mut conn).await.or_fail()?;
            }
        }
        let corrupt = |what: &str, error: Option<Error>| match error {
            Some(Error::Store {
                kind: StoreErrorKind::Corrupt,
                transient: false,
                ..
            }) => Ok(()),
            other => Err(CaseError::failed(format!(
                "{what} answered {other:?}, not a permanent Corrupt error"
            ))),
        };
        corrupt("list_keys", store.list_keys(None).await.err())?;
        let identities = ["i1".to_owned()];
        corrupt(
            "load_versions",
            store.load_versions(&key(), &identities).await.err(),
        )?;
        store.purge().await?;
        Ok(())
    })
    .await;
}
