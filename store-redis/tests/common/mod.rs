//! The Redis test harness shared by the test files: where the server is, and a fresh store under
//! its own key prefix per case.
//!
//! The server is `WATUKUY_TEST_REDIS_URL` (CI: the local server). When it is unset and the
//! crate's `testcontainers` feature is on, a throwaway Redis 7 starts in Docker; otherwise the
//! tests are ignored (`#[watukuy_testenv::requires(redis, ..)]`, see docs/testing.md), and one
//! run anyway fails.

#![allow(dead_code, unreachable_pub)]

pub mod servers;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use watukuy_conformance::{
    CaseContext, CaseError, CaseResult, Fresh, Harness, RawWrite, backend_url,
};
use watukuy_store_redis::{RedisOptions, RedisStore};

/// The variable naming the test server.
pub const URL_ENV: &str = "WATUKUY_TEST_REDIS_URL";

/// A reachable test server, and the container serving it when one was started for it.
pub struct Server {
    /// Its connection URL.
    pub url: String,
    /// Keeps a testcontainers Redis alive (and removes it when dropped).
    _container: Option<Box<dyn std::any::Any + Send + Sync>>,
}

/// The test server: the URL from the environment, else (with the `testcontainers` feature) a
/// fresh container, else a failure saying the variable is unset.
pub async fn server() -> Result<Server, CaseError> {
    if let Ok(url) = std::env::var(URL_ENV)
        && !url.trim().is_empty()
    {
        return Ok(Server {
            url,
            _container: None,
        });
    }
    #[cfg(feature = "testcontainers")]
    match container::start().await {
        Ok(server) => return Ok(server),
        Err(reason) => eprintln!("testcontainers could not start Redis: {reason}"),
    }
    // Unset and no container: a failure (the test should have been ignored).
    let url = backend_url("redis", URL_ENV)?;
    Ok(Server {
        url,
        _container: None,
    })
}

#[cfg(feature = "testcontainers")]
mod container {
    use testcontainers_modules::redis::{REDIS_PORT, Redis};
    use testcontainers_modules::testcontainers::ImageExt;
    use testcontainers_modules::testcontainers::runners::AsyncRunner;

    use super::Server;

    /// Starts Redis 7 in Docker (needs a running Docker daemon).
    pub(super) async fn start() -> Result<Server, String> {
        let container = Redis::default()
            .with_tag("7-alpine")
            .start()
            .await
            .map_err(|e| e.to_string())?;
        let host = container.get_host().await.map_err(|e| e.to_string())?;
        let port = container
            .get_host_port_ipv4(REDIS_PORT)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Server {
            url: super::container_url(&host.to_string(), port),
            _container: Some(Box::new(container)),
        })
    }
}

/// The URL of the testcontainers Redis at `host` (a name, an IPv4 address or a bracketed IPv6
/// address, as testcontainers reports it) and the mapped `port`.
pub fn container_url(host: &str, port: u16) -> String {
    format!("redis://{host}:{port}")
}

/// A key prefix unique to this process and call, readable in `redis-cli`
/// (`wk:<pid>:<n>:<what>:`). No randomness: the process id and a counter; the counter is
/// followed by `:`, so no prefix is the start of another.
pub fn unique_prefix(what: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut what = what.to_owned();
    what.retain(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
    format!("wk:{}:{n}:{what}:", std::process::id())
}

/// A store under a fresh prefix (purged first, in case a process with the same id left keys
/// behind), scripts loaded.
pub async fn store_at(url: &str, options: RedisOptions) -> Result<RedisStore, CaseError> {
    let store = RedisStore::connect(url, options).await?;
    store.purge().await?;
    watukuy_core::store::Store::migrate(&store).await?;
    Ok(store)
}

/// Another store on `url` under the same options (a client of its own, as a second process
/// would connect), for the cases that need a second instance.
async fn another_client(
    (url, options): (String, RedisOptions),
) -> Result<Arc<dyn watukuy_core::store::Store>, CaseError> {
    Ok(Arc::new(RedisStore::connect(&url, options).await?))
}

/// Hands every conformance case a store under its own prefix, purged when the case passes.
pub struct RedisHarness;

#[async_trait::async_trait]
impl Harness for RedisHarness {
    fn name(&self) -> String {
        "redis".to_owned()
    }

    async fn fresh(&self, ctx: CaseContext) -> Result<Fresh, CaseError> {
        let server = server().await?;
        let prefix = unique_prefix(&format!("{}.{}", ctx.module, ctx.name));
        let store = store_at(&server.url, RedisOptions::default().prefix(&prefix)).await?;
        let cleanup = store.clone();
        let instances = (server.url.clone(), RedisOptions::default().prefix(&prefix));
        // A prefix nobody has written under yet, for new instances loading their scripts at once
        // (purged with the case's: it starts with the case's prefix).
        let unmigrated = (
            server.url.clone(),
            RedisOptions::default().prefix(format!("{prefix}new:")),
        );
        let raw = (server.url.clone(), prefix.clone());
        Ok(Fresh::new(Arc::new(store))
            .with_cleanup(async move {
                if let Err(e) = cleanup.purge().await {
                    eprintln!(
                        "[redis] could not delete the keys of {prefix} after a passing case: {e}"
                    );
                }
                drop(server);
            })
            .with_instances(move || another_client(instances.clone()))
            .with_unmigrated(move || another_client(unmigrated.clone()))
            .with_raw_writes(move |write| {
                let (url, prefix) = raw.clone();
                async move { raw_write(&url, &prefix, write).await }
            }))
    }
}

/// Writes `raw` with a client of the test's own: a value of another type for the state, text
/// that is not JSON for every item and pending event. Redis keeps no schema version.
async fn raw_write(url: &str, prefix: &str, raw: RawWrite) -> CaseResult {
    let fail = |e: redis::RedisError| CaseError::failed(format!("raw write to {url}: {e}"));
    let base =
        |key: &watukuy_core::store::PKey| format!("{prefix}p:{{{}:{}}}", key.poller, key.partition);
    let mut conn = redis::Client::open(url)
        .map_err(fail)?
        .get_multiplexed_async_connection()
        .await
        .map_err(fail)?;
    let (hash, garbage) = match &raw {
        RawWrite::State(key) => {
            let state = format!("{}:state", base(key));
            let _: () = redis::pipe()
                .del(&state)
                .set(&state, "not a hash")
                .query_async(&mut conn)
                .await
                .map_err(fail)?;
            return Ok(());
        }
        RawWrite::Items(key) => (format!("{}:items", base(key)), "{not json"),
        RawWrite::Pending(key) => (format!("{}:outbox:rows", base(key)), "[1, 2"),
        other => return Err(CaseError::skipped(format!("{other:?} is not written here"))),
    };
    let fields: Vec<String> = redis::cmd("HKEYS")
        .arg(&hash)
        .query_async(&mut conn)
        .await
        .map_err(fail)?;
    if fields.is_empty() {
        return Err(CaseError::failed(format!("{hash} holds nothing to damage")));
    }
    // One HSET for every field.
    let mut hset = redis::cmd("HSET");
    hset.arg(&hash);
    for field in fields {
        hset.arg(field).arg(garbage);
    }
    let _: () = hset.query_async(&mut conn).await.map_err(fail)?;
    Ok(())
}

/// Runs a test body that needs the server. Its test is marked
/// `#[watukuy_testenv::requires(redis, ..)]`, so it is ignored while the server is not
/// configured; when it runs anyway, a missing server fails it, as does a body that fails or
/// skips (a test that did not do its work never passes).
pub async fn with_server<F, Fut>(name: &str, body: F)
where
    F: FnOnce(Server) -> Fut,
    Fut: std::future::Future<Output = Result<(), CaseError>>,
{
    let server = server()
        .await
        .unwrap_or_else(|error| panic!("[redis] {name} {error}"));
    if let Err(error) = body(server).await {
        panic!("[redis] {name} {error}");
    }
}

/// The Redis Cluster this test binary shares (3 primaries, 3 replicas), started on first use
/// and gone when the binary exits. Fails when `redis-server` is missing (the tests are ignored
/// then, unless run anyway or required) or the cluster does not form.
pub async fn shared_cluster() -> Result<&'static servers::Cluster, CaseError> {
    static CLUSTER: OnceLock<Result<servers::Cluster, String>> = OnceLock::new();
    let cluster = tokio::task::spawn_blocking(|| {
        CLUSTER.get_or_init(|| servers::Cluster::start(3, 1, 2_000))
    })
    .await
    .map_err(|e| CaseError::failed(format!("starting the cluster panicked: {e}")))?;
    cluster
        .as_ref()
        .map_err(|e| CaseError::failed(format!("the test cluster: {e}")))
}

/// Hands every conformance case a store on the shared Redis Cluster ([`shared_cluster`]) under
/// its own prefix, purged (on every primary) when the case passes.
pub struct ClusterHarness;

#[async_trait::async_trait]
impl Harness for ClusterHarness {
    fn name(&self) -> String {
        "redis-cluster".to_owned()
    }

    async fn fresh(&self, ctx: CaseContext) -> Result<Fresh, CaseError> {
        let cluster = shared_cluster().await?;
        let prefix = unique_prefix(&format!("{}.{}", ctx.module, ctx.name));
        let store = store_at(&cluster.url(), RedisOptions::default().prefix(&prefix)).await?;
        if !store.is_cluster() {
            return Err(CaseError::failed(
                "the store did not connect as a cluster client",
            ));
        }
        let cleanup = store.clone();
        let instances = (cluster.url(), RedisOptions::default().prefix(&prefix));
        Ok(Fresh::new(Arc::new(store))
            .with_cleanup(async move {
                if let Err(e) = cleanup.purge().await {
                    eprintln!(
                        "[redis-cluster] could not delete the keys of {prefix} after a passing case: {e}"
                    );
                }
            })
            .with_instances(move || another_client(instances.clone())))
    }
}
