//! Where the tests' stores are: a SQLite temp file, a fresh PostgreSQL schema, a fresh MySQL
//! table prefix, a fresh Redis key prefix; and an engine that writes into them.

#![allow(dead_code, unreachable_pub)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use watukuy_cli::{CliError, Output, RunOptions, StoreOptions, StoreUrl};
use watukuy_conformance::world::{POLLER, StrategyKind, World};
use watukuy_conformance::{CaseError, backend_url};
use watukuy_core::{
    Engine, Event, HandlerContext, HandlerError, HandlerResult, PKey, SeededRng, Store,
};

/// Which backend a test runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Sqlite,
    Postgres,
    MySql,
    Redis,
}

/// A fresh, migrated store in its own namespace, and the command-line options naming it.
pub struct Backend {
    pub kind: Kind,
    pub store: Arc<dyn Store>,
    /// `--store URL [--schema S | --prefix P]`.
    pub args: Vec<String>,
    url: String,
    schema: Option<String>,
    _dir: Option<tempfile::TempDir>,
}

/// A name unique to this process and call (no randomness: the process id and a counter).
fn unique(what: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("wkcli_{}_{n}_{what}", std::process::id())
}

impl Backend {
    /// A fresh store; a failure when the backend's URL is unset.
    pub async fn fresh(kind: Kind, what: &str) -> Result<Self, CaseError> {
        let (url, options, args, dir) = match kind {
            Kind::Sqlite => {
                let dir = tempfile::tempdir().map_err(|e| CaseError::failed(e.to_string()))?;
                let url = format!("sqlite:{}", dir.path().join("watukuy.db").display());
                (
                    url.clone(),
                    StoreOptions::default(),
                    vec!["--store".to_owned(), url],
                    Some(dir),
                )
            }
            Kind::Postgres => {
                let url = backend_url("postgres", "WATUKUY_TEST_POSTGRES_URL")?;
                let schema = unique(what);
                let options = StoreOptions {
                    schema: Some(schema.clone()),
                    ..StoreOptions::default()
                };
                let args = vec![
                    "--store".to_owned(),
                    url.clone(),
                    "--schema".to_owned(),
                    schema,
                ];
                (url, options, args, None)
            }
            Kind::MySql => {
                let url = backend_url("mysql", "WATUKUY_TEST_MYSQL_URL")?;
                let mut prefix = format!("{}_", unique(what));
                prefix.truncate(48);
                let options = StoreOptions {
                    prefix: Some(prefix.clone()),
                    ..StoreOptions::default()
                };
                let args = vec![
                    "--store".to_owned(),
                    url.clone(),
                    "--prefix".to_owned(),
                    prefix,
                ];
                (url, options, args, None)
            }
            Kind::Redis => {
                let url = backend_url("redis", "WATUKUY_TEST_REDIS_URL")?;
                let prefix = format!("{}:", unique(what));
                let options = StoreOptions {
                    prefix: Some(prefix.clone()),
                    ..StoreOptions::default()
                };
                let args = vec![
                    "--store".to_owned(),
                    url.clone(),
                    "--prefix".to_owned(),
                    prefix,
                ];
                (url, options, args, None)
            }
        };
        let store = StoreUrl::parse(&url)
            .map_err(|e| CaseError::failed(e.to_string()))?
            .open(&options, true)
            .await
            .map_err(|e| CaseError::failed(e.to_string()))?;
        store.migrate().await?;
        Ok(Self {
            kind,
            store,
            args,
            url,
            schema: options.schema,
            _dir: dir,
        })
    }

    /// Drops what the test wrote on a shared server (the SQLite temp dir goes by itself).
    pub async fn cleanup(self) {
        match self.kind {
            Kind::Sqlite => {}
            Kind::Postgres => {
                let _ = self.store.close().await;
                if let (Ok(pool), Some(schema)) = (
                    sqlx::PgPool::connect(&self.url).await,
                    self.schema.as_deref(),
                ) {
                    let _ = sqlx::query(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                        .execute(&pool)
                        .await;
                    pool.close().await;
                }
            }
            Kind::MySql => {
                let _ = self.store.close().await;
                let prefix = self.args.last().cloned().unwrap_or_default();
                if let Ok(store) = watukuy_store_mysql::MySqlStore::connect(
                    &self.url,
                    watukuy_store_mysql::MySqlOptions::default()
                        .table_prefix(prefix)
                        .max_connections(1),
                )
                .await
                {
                    for table in store.table_names() {
                        let _ = sqlx::query(&format!("DROP TABLE IF EXISTS {table}"))
                            .execute(store.pool())
                            .await;
                    }
                    let _ = store.close().await;
                }
            }
            Kind::Redis => {
                // Every key under the prefix: the store's own purge.
                let prefix = self.args.last().cloned().unwrap_or_default();
                if let Ok(store) = watukuy_store_redis::RedisStore::connect(
                    &self.url,
                    watukuy_store_redis::RedisOptions::default().prefix(prefix),
                )
                .await
                {
                    let _ = store.purge().await;
                }
            }
        }
    }

    /// `watukuy <backend args> <args…>`, in-process, on `clock`.
    pub async fn cli(&self, world: &World, args: &[&str]) -> Result<Output, CliError> {
        let mut argv = vec!["watukuy".to_owned()];
        argv.extend(self.args.iter().cloned());
        argv.extend(args.iter().map(|a| (*a).to_owned()));
        watukuy_cli::run_with(
            argv,
            RunOptions {
                clock: Arc::new(world.clock.clone()),
                lease_tries: 1,
            },
        )
        .await
    }

    /// The backend options followed by `args`, for the binary.
    pub fn argv(&self, args: &[&str]) -> Vec<String> {
        let mut argv = self.args.clone();
        argv.extend(args.iter().map(|a| (*a).to_owned()));
        argv
    }
}

/// Runs `body` on a backend; cleans up after a passing test. A test on PostgreSQL or Redis is
/// marked `#[watukuy_testenv::requires(..)]`, so it is ignored while the backend is not
/// configured; run anyway, the missing backend fails it.
pub async fn on<F, Fut>(kind: Kind, what: &str, body: F)
where
    F: FnOnce(Arc<Backend>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let backend = Backend::fresh(kind, what)
        .await
        .map(Arc::new)
        .unwrap_or_else(|error| panic!("{kind:?} backend: {error}"));
    body(Arc::clone(&backend)).await;
    if let Ok(backend) = Arc::try_unwrap(backend) {
        backend.cleanup().await;
    }
}

/// A handler that records what it delivered and fails permanently (so the event is parked at
/// once) for the subjects in `failing`.
#[derive(Clone, Default)]
pub struct Consumer {
    pub delivered: Arc<Mutex<Vec<Event>>>,
    pub failing: Arc<Mutex<Vec<String>>>,
    pub down: Arc<AtomicBool>,
}

impl Consumer {
    pub fn failing(subjects: &[&str]) -> Self {
        let consumer = Self::default();
        consumer
            .failing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(subjects.iter().map(|s| (*s).to_owned()));
        consumer
    }

    pub fn heal(&self) {
        self.failing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    pub fn delivered(&self) -> Vec<Event> {
        self.delivered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn attach(&self, engine: &Engine) {
        let (delivered, failing) = (Arc::clone(&self.delivered), Arc::clone(&self.failing));
        engine
            .on(POLLER, move |event: Event, _ctx: HandlerContext| {
                let fail = failing
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .contains(&event.subject);
                let result: HandlerResult = if fail {
                    Err(HandlerError::permanent(format!(
                        "cannot handle {}",
                        event.subject
                    )))
                } else {
                    delivered
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(event);
                    Ok(())
                };
                futures::future::ready(result)
            })
            .expect("attach the consumer");
    }
}

/// A world of `items` items and an engine polling them into `store` with the timestamp
/// strategy and a one-day log, `consumer` attached.
pub fn engine(world: &World, store: &Arc<dyn Store>, consumer: &Consumer) -> Engine {
    let poller = world
        .poller(StrategyKind::Timestamp)
        .log(Duration::from_secs(86_400))
        .build()
        .expect("poller");
    let engine = Engine::builder(Arc::clone(store))
        .poller(poller)
        .clock(Arc::new(world.clock.clone()))
        .rng(Arc::new(SeededRng::new(7)))
        .instance_id("node-a")
        .build()
        .expect("engine");
    consumer.attach(&engine);
    engine
}

/// The key of the world's poller.
pub fn key() -> PKey {
    PKey::new(POLLER, "")
}
