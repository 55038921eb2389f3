//! The PostgreSQL test harness shared by the test files: where the database is, a fresh schema
//! of its own per test or case (dropped when it passes), and failures as `CaseError`s.
//!
//! The database is `WATUKUY_TEST_POSTGRES_URL` (CI: the local server). When it is unset and the
//! crate's `testcontainers` feature is on, each case starts a throwaway PostgreSQL 15 in Docker;
//! otherwise the tests are ignored (`#[watukuy_testenv::requires(postgres, ..)]`, see
//! docs/testing.md), and one run anyway fails.

#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use watukuy_conformance::{
    CaseContext, CaseError, CaseResult, Fresh, Harness, RawWrite, backend_url,
};
use watukuy_store_postgres::{PostgresOptions, PostgresStore};

/// The variable naming the test database.
pub const URL_ENV: &str = "WATUKUY_TEST_POSTGRES_URL";

/// A reachable test database, and the container serving it when one was started for it.
pub struct Database {
    /// Its connection URL.
    pub url: String,
    /// Keeps a testcontainers PostgreSQL alive (and removes it when dropped).
    _container: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl Database {
    /// A database at `url` that the test started itself (tests/servers).
    pub fn at(url: String) -> Self {
        Self {
            url,
            _container: None,
        }
    }
}

/// The test database: the URL from the environment, else (with the `testcontainers` feature) a
/// fresh container, else a failure saying the variable is unset.
pub async fn database() -> Result<Database, CaseError> {
    if let Ok(url) = std::env::var(URL_ENV)
        && !url.trim().is_empty()
    {
        return Ok(Database {
            url,
            _container: None,
        });
    }
    #[cfg(feature = "testcontainers")]
    match container::start().await {
        Ok(database) => return Ok(database),
        Err(reason) => eprintln!("testcontainers could not start PostgreSQL: {reason}"),
    }
    // Unset and no container: a failure (the test should have been ignored).
    let url = backend_url("postgres", URL_ENV)?;
    Ok(Database {
        url,
        _container: None,
    })
}

#[cfg(feature = "testcontainers")]
mod container {
    use testcontainers_modules::postgres::Postgres;
    use testcontainers_modules::testcontainers::ImageExt;
    use testcontainers_modules::testcontainers::runners::AsyncRunner;

    use super::Database;

    /// Starts PostgreSQL 15 in Docker (needs a running Docker daemon).
    pub(super) async fn start() -> Result<Database, String> {
        let container = Postgres::default()
            .with_tag("15-alpine")
            .start()
            .await
            .map_err(|e| e.to_string())?;
        let host = container.get_host().await.map_err(|e| e.to_string())?;
        let port = container
            .get_host_port_ipv4(5432)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Database {
            url: super::container_url(&host.to_string(), port),
            _container: Some(Box::new(container)),
        })
    }
}

/// The URL of the testcontainers PostgreSQL (the image's default user, password and database)
/// at `host` (a name, an IPv4 address or a bracketed IPv6 address, as testcontainers reports
/// it) and the mapped `port`.
pub fn container_url(host: &str, port: u16) -> String {
    format!("postgres://postgres:postgres@{host}:{port}/postgres")
}

/// A schema name unique to this process and call, readable in `psql` (`wk_<pid>_<n>_<what>`),
/// at most 63 bytes. No randomness: the process id and a counter.
fn unique_schema(what: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut name = format!("wk_{}_{n}_{what}", std::process::id());
    name.retain(|c| c.is_ascii_alphanumeric() || c == '_');
    name.truncate(63);
    name
}

/// A small pool on `url` (each test runs its own tokio runtime, and a pool belongs to the
/// runtime that made it, so every case gets its own).
pub async fn pool(url: &str, max_connections: u32) -> Result<PgPool, CaseError> {
    PgPoolOptions::new()
        .max_connections(max_connections)
        .connect(url)
        .await
        .map_err(|e| CaseError::failed(format!("cannot connect to {URL_ENV}: {e}")))
}

/// A failed test with `message`.
pub fn fail(message: impl Into<String>) -> CaseError {
    CaseError::failed(message)
}

/// Fails the test with a formatted message unless the condition holds.
#[allow(unused_macros)]
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err($crate::common::fail(format!($($msg)+)));
        }
    };
}
#[allow(unused_imports)]
pub(crate) use ensure;

/// Any error as a failed test (`.or_fail()?`, `.or_fail_with("what")?`).
#[allow(unused_imports)]
pub use watukuy_conformance::OrFail;

/// A fresh, empty schema of a test's own on the test database (a stale one of the same name is
/// dropped first), with a pool and the database's URL for connections of the test's own. A
/// passing test removes it ([`with_schema`] does); a failing one leaves it to be inspected.
#[derive(Clone, Debug)]
pub struct Schema {
    /// The schema's name (`wk_<pid>_<n>_<what>`).
    pub name: String,
    /// A pool on the database.
    pub pool: PgPool,
    /// The database's URL.
    pub url: String,
}

/// The schema's name, for SQL text (`"\"{schema}\".table"`).
impl std::fmt::Display for Schema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

impl Schema {
    /// A fresh schema named after `what`, with a pool of `max_connections`.
    pub async fn new(
        database: &Database,
        what: &str,
        max_connections: u32,
    ) -> Result<Self, CaseError> {
        let pool = pool(&database.url, max_connections).await?;
        Self::on(pool, database.url.clone(), what).await
    }

    async fn on(pool: PgPool, url: String, what: &str) -> Result<Self, CaseError> {
        let schema = Self {
            name: unique_schema(what),
            pool,
            url,
        };
        schema.remove().await?;
        Ok(schema)
    }

    /// Another fresh schema on the same database and pool; the test removes it.
    pub async fn another(&self, what: &str) -> Result<Self, CaseError> {
        Self::on(self.pool.clone(), self.url.clone(), what).await
    }

    /// `PostgresOptions` on this schema.
    pub fn options(&self) -> PostgresOptions {
        PostgresOptions::default().schema(self.name.as_str())
    }

    /// A store on this schema with `options` (whose schema is replaced), not migrated.
    pub fn unmigrated(&self, options: PostgresOptions) -> Result<PostgresStore, CaseError> {
        Ok(PostgresStore::from_pool(
            self.pool.clone(),
            options.schema(self.name.as_str()),
        )?)
    }

    /// A migrated store on this schema with `options` (whose schema is replaced).
    pub async fn store(&self, options: PostgresOptions) -> Result<PostgresStore, CaseError> {
        let store = self.unmigrated(options)?;
        watukuy_core::store::Store::migrate(&store).await?;
        Ok(store)
    }

    /// Drops the schema and everything in it (nothing if it does not exist).
    pub async fn remove(&self) -> Result<(), CaseError> {
        sqlx::query(&format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.name))
            .execute(&self.pool)
            .await
            .map_err(|e| fail(format!("cannot drop schema {}: {e}", self.name)))?;
        Ok(())
    }
}

/// Hands every conformance case a migrated store in its own schema, dropped when it passes.
pub struct PgHarness;

#[async_trait::async_trait]
impl Harness for PgHarness {
    fn name(&self) -> String {
        "postgres".to_owned()
    }

    async fn fresh(&self, ctx: CaseContext) -> Result<Fresh, CaseError> {
        let database = database().await?;
        let schema = Schema::new(&database, &format!("{}_{}", ctx.module, ctx.name), 4).await?;
        let store = schema.store(PostgresOptions::default()).await?;
        // A schema nobody has created yet, for new instances migrating at once.
        let new_schema = schema.another(&format!("{}_new", ctx.name)).await?;
        let (url, options) = (schema.url.clone(), schema.options());
        let (new_url, new_options) = (schema.url.clone(), new_schema.options());
        let raw = schema.clone();
        Ok(Fresh::new(Arc::new(store))
            .with_cleanup(async move {
                for schema in [&new_schema, &schema] {
                    if let Err(e) = schema.remove().await {
                        eprintln!("[postgres] after a passing case: {e}");
                    }
                }
                schema.pool.close().await;
                drop(database);
            })
            // A store on a pool of its own, as a second process would open.
            .with_instances(move || {
                let (url, options) = (url.clone(), options.clone());
                async move {
                    let store = PostgresStore::from_pool(pool(&url, 2).await?, options)?;
                    Ok(Arc::new(store) as Arc<dyn watukuy_core::store::Store>)
                }
            })
            .with_unmigrated(move || {
                let (url, options) = (new_url.clone(), new_options.clone());
                async move {
                    let store = PostgresStore::from_pool(pool(&url, 1).await?, options)?;
                    Ok(Arc::new(store) as Arc<dyn watukuy_core::store::Store>)
                }
            })
            .with_raw_writes(move |write| {
                let schema = raw.clone();
                async move { raw_write(&schema, &write).await }
            }))
    }
}

/// Writes `raw` with SQL of the test's own, over every row of the case's schema. The columns are
/// `json`, which refuses text that is not JSON: the damage is JSON of the wrong shape. Items are
/// not written: any JSON is a valid payload.
async fn raw_write(schema: &Schema, raw: &RawWrite) -> CaseResult {
    let sql = match raw {
        RawWrite::State(_) => {
            format!("UPDATE \"{schema}\".watukuy_pollers SET lanes = '[\"not\", \"lanes\"]'")
        }
        RawWrite::Pending(_) => format!("UPDATE \"{schema}\".watukuy_outbox SET event = '[1, 2]'"),
        RawWrite::SchemaVersion(version) => format!(
            "INSERT INTO \"{schema}\".watukuy_schema_version (version, name) \
             VALUES ({version}, 'from the future')"
        ),
        other => return Err(CaseError::skipped(format!("{other:?} is not written here"))),
    };
    sqlx::query(&sql)
        .execute(&schema.pool)
        .await
        .or_fail_with(&sql)?;
    Ok(())
}

/// Runs a test body that needs the database. Its test is marked
/// `#[watukuy_testenv::requires(postgres, ..)]`, so it is ignored while the database is not
/// configured; when it runs anyway, a missing database fails it, as does a body that fails or
/// skips (a test that did not do its work never passes).
pub async fn with_database<F, Fut>(name: &str, body: F)
where
    F: FnOnce(Database) -> Fut,
    Fut: std::future::Future<Output = Result<(), CaseError>>,
{
    let database = database()
        .await
        .unwrap_or_else(|error| panic!("[postgres] {name} {error}"));
    if let Err(error) = body(database).await {
        panic!("[postgres] {name} {error}");
    }
}

/// Runs a test body in a fresh [`Schema`] named after `what` (with a pool of
/// `max_connections`), as [`with_database`] does; when the body passes, drops the schema and
/// closes the pool.
pub async fn with_schema<F, Fut>(what: &str, max_connections: u32, body: F)
where
    F: FnOnce(Schema) -> Fut,
    Fut: std::future::Future<Output = Result<(), CaseError>>,
{
    with_database(what, |database| async move {
        let schema = Schema::new(&database, what, max_connections).await?;
        body(schema.clone()).await?;
        schema.remove().await?;
        schema.pool.close().await;
        drop(database);
        Ok(())
    })
    .await;
}
