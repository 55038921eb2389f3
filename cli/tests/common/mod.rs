//! Where the tests' stores are: a SQLite temp file, a fresh PostgreSQL schema, a fresh MySQL
//! table prefix, a fresh Redis key prefix; and an engine that writes into them.

#![allow(dead_code, unreachable_pub)]

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use watukuy_cli::{CliError, Output, RunOptions, StoreOptions, StoreUrl};
use watukuy_conformance::{CaseError, backend_url};
use watukuy_core::{Engine, store::Store};
use watukuy_testkit::world::Consumer;
use watukuy_testkit::world::World;

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

/// `--store URL FLAG NAME`: the options naming a server store's namespace.
fn server_args(url: &str, flag: &str, name: &str) -> Vec<String> {
    ["--store", url, flag, name].map(str::to_owned).to_vec()
}

/// A server store in the namespace `prefix`: its URL, its options and its arguments.
fn prefixed(
    url: String,
    prefix: String,
) -> (String, StoreOptions, Vec<String>, Option<tempfile::TempDir>) {
    let args = server_args(&url, "--prefix", &prefix);
    let options = StoreOptions {
        prefix: Some(prefix),
        ..StoreOptions::default()
    };
    (url, options, args, None)
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
                let args = server_args(&url, "--schema", &schema);
                let options = StoreOptions {
                    schema: Some(schema),
                    ..StoreOptions::default()
                };
                (url, options, args, None)
            }
            Kind::MySql => {
                let mut prefix = format!("{}_", unique(what));
                prefix.truncate(48);
                prefixed(backend_url("mysql", "WATUKUY_TEST_MYSQL_URL")?, prefix)
            }
            Kind::Redis => prefixed(
                backend_url("redis", "WATUKUY_TEST_REDIS_URL")?,
                format!("{}:", unique(what)),
            ),
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

/// The command-line tests' consumer: it fails the given subjects with "cannot handle".
pub fn failing(subjects: &[&str]) -> Consumer {
    Consumer::failing("cannot handle", subjects)
}

/// A world of `items` items and an engine polling them into `store` with the timestamp
/// strategy and a one-day log, `consumer` attached.
pub fn engine(world: &World, store: &Arc<dyn Store>, consumer: &Consumer) -> Engine {
    world
        .consumer_engine(Arc::clone(store), consumer, 7)
        .expect("engine")
}

/// Runs the built `watukuy` binary with `args`, without a `WATUKUY_STORE` from the
/// environment.
pub fn watukuy<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_watukuy"))
        .args(args)
        .env_remove("WATUKUY_STORE")
        .output()
        .expect("run the watukuy binary")
}

/// Output bytes as text.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
