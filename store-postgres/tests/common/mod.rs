//! The PostgreSQL test harness shared by the test files: where the database is, and a fresh,
//! migrated store in its own schema per case.
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
use watukuy_conformance::{CaseContext, CaseError, Fresh, Harness, backend_url};
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
            url: format!("postgres://postgres:postgres@{host}:{port}/postgres"),
            _container: Some(Box::new(container)),
        })
    }
}

/// A schema name unique to this process and call, readable in `psql` (`wk_<pid>_<n>_<what>`),
/// at most 63 bytes. No randomness: the process id and a counter.
pub fn unique_schema(what: &str) -> String {
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

/// Drops `schema` and everything in it.
pub async fn drop_schema(pool: &PgPool, schema: &str) -> Result<(), sqlx::Error> {
    sqlx::query(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
        .execute(pool)
        .await
        .map(|_| ())
}

/// A migrated store in the fresh schema `schema` (dropped first, in case a process with the
/// same id left it behind).
pub async fn store_in(
    pool: &PgPool,
    schema: &str,
    options: PostgresOptions,
) -> Result<PostgresStore, CaseError> {
    drop_schema(pool, schema)
        .await
        .map_err(|e| CaseError::failed(format!("cannot drop stale schema {schema}: {e}")))?;
    let store = PostgresStore::from_pool(pool.clone(), options.schema(schema))?;
    watukuy_core::Store::migrate(&store).await?;
    Ok(store)
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
        let schema = unique_schema(&format!("{}_{}", ctx.module, ctx.name));
        let pool = pool(&database.url, 4).await?;
        let store = store_in(&pool, &schema, PostgresOptions::default()).await?;
        Ok(Fresh::new(Arc::new(store)).with_cleanup(async move {
            if let Err(e) = drop_schema(&pool, &schema).await {
                eprintln!("[postgres] could not drop schema {schema} after a passing case: {e}");
            }
            pool.close().await;
            drop(database);
        }))
    }
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
