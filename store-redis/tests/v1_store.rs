//! A Redis store written by the last release (v1, commit 47ad676) is carried forward by today's
//! code: `migrate` succeeds (twice), everything v1 wrote reads back as v1 read it, and today's
//! engine delivers the events v1 left pending.
//!
//! `fixtures/v1.json` lists every key the v1 writer left under its prefix (name without the
//! prefix, type, contents); `fixtures/v1.expected.json` is what the v1 code read back from them.
//! Both were produced as `store-sqlite/tests/fixtures/README.md` describes. Each run writes the
//! keys under a fresh prefix.

mod common;
#[path = "../../store-sqlite/tests/v1_checks/mod.rs"]
mod v1_checks;

use std::sync::Arc;

use serde::Deserialize;
use watukuy_conformance::CaseError;
use watukuy_store_redis::{RedisOptions, RedisStore};

/// The v1 keys.
const FIXTURE: &str = include_str!("fixtures/v1.json");
/// What the v1 code read back from them.
const EXPECTED: &str = include_str!("fixtures/v1.expected.json");

/// One key of the dump, its name without the prefix.
#[derive(Debug, Deserialize)]
struct DumpedKey {
    /// The name after the prefix.
    key: String,
    /// Its contents, by type.
    #[serde(flatten)]
    value: DumpedValue,
}

/// A key's contents as the v1 writer dumped them.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", content = "value", rename_all = "lowercase")]
enum DumpedValue {
    /// `GET`.
    String(String),
    /// `HGETALL`.
    Hash(std::collections::BTreeMap<String, String>),
    /// `ZRANGE 0 -1 WITHSCORES`: `[member, score]` pairs, the score as Redis printed it.
    Zset(Vec<(String, String)>),
    /// `SMEMBERS`.
    Set(Vec<String>),
    /// `LRANGE 0 -1`.
    List(Vec<String>),
}

/// The whole dump.
#[derive(Debug, Deserialize)]
struct Dump {
    /// Every key, sorted by name.
    keys: Vec<DumpedKey>,
}

/// Writes every key of the v1 dump under `prefix` (which holds nothing yet).
async fn load_v1(url: &str, prefix: &str) -> Result<(), CaseError> {
    let dump: Dump = serde_json::from_str(FIXTURE).expect("fixtures/v1.json decodes");
    let failed = |e: redis::RedisError| CaseError::failed(format!("load the v1 keys: {e}"));
    let client = redis::Client::open(url).map_err(failed)?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(failed)?;
    let mut pipe = redis::pipe();
    pipe.atomic();
    for DumpedKey { key, value } in &dump.keys {
        let name = format!("{prefix}{key}");
        let cmd = match value {
            DumpedValue::String(text) => pipe.cmd("SET").arg(&name).arg(text),
            DumpedValue::Hash(fields) => {
                let cmd = pipe.cmd("HSET").arg(&name);
                for (field, text) in fields {
                    cmd.arg(field).arg(text);
                }
                cmd
            }
            DumpedValue::Zset(entries) => {
                let cmd = pipe.cmd("ZADD").arg(&name);
                for (member, score) in entries {
                    cmd.arg(score).arg(member);
                }
                cmd
            }
            DumpedValue::Set(members) => pipe.cmd("SADD").arg(&name).arg(members),
            DumpedValue::List(items) => pipe.cmd("RPUSH").arg(&name).arg(items),
        };
        cmd.ignore();
    }
    pipe.query_async::<()>(&mut conn).await.map_err(failed)
}

/// The v1 keys migrate, read back whole and their pending events are delivered.
#[watukuy_testenv::requires(redis, or_cfg(feature = "testcontainers"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v1_redis_store_is_migrated_read_and_delivered() {
    common::with_server("v1_store", |server| async move {
        let prefix = common::unique_prefix("v1_store");
        let store =
            RedisStore::connect(&server.url, RedisOptions::default().prefix(&prefix)).await?;
        store.purge().await?;
        load_v1(&server.url, &prefix).await?;
        v1_checks::upgrade_and_check(Arc::new(store.clone()), "redis", EXPECTED).await;
        store.purge().await?;
        Ok(())
    })
    .await;
}
