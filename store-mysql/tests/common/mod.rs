//! The MySQL test harness shared by the test files: where the server is, a fresh database of
//! its own per test or case (dropped when it passes), and failures as `CaseError`s.
//!
//! The server is `WATUKUY_TEST_MYSQL_URL` (CI: the local MariaDB). While it is unset the tests
//! are ignored (`#[watukuy_testenv::requires(mysql)]`, see docs/testing.md), and one run anyway
//! fails.

#![allow(dead_code, unreachable_pub)]

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sqlx::MySqlPool;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use watukuy_conformance::{
    CaseContext, CaseError, CaseResult, Fresh, Harness, RawWrite, backend_url,
};
use watukuy_store_mysql::{MySqlOptions, MySqlStore};

/// The variable naming the test server.
pub const URL_ENV: &str = "WATUKUY_TEST_MYSQL_URL";

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

/// A database name unique to this process and call (`wk_<pid>_<n>_<what>`), at most 64 bytes.
/// No randomness: the process id and a counter.
fn unique_name(what: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut name = format!("wk_{}_{n}_{what}", std::process::id());
    name.retain(|c| c.is_ascii_alphanumeric() || c == '_');
    name.truncate(64);
    name
}

/// A fresh, empty database of a test's own on the test server, with a pool on it. A passing
/// test drops it ([`with_database`] does); a failing one leaves it to be inspected.
#[derive(Clone, Debug)]
pub struct Database {
    /// Its name.
    pub name: String,
    /// A pool on it.
    pub pool: MySqlPool,
    /// The server's URL with this database in its path.
    pub url: String,
    /// A pool on the server's URL as given (for `CREATE` / `DROP DATABASE`).
    admin: MySqlPool,
}

impl Database {
    /// A fresh database named after `what`, with a pool of `max_connections`.
    pub async fn new(what: &str, max_connections: u32) -> Result<Self, CaseError> {
        let server = backend_url("mysql", URL_ENV)?;
        let options = MySqlConnectOptions::from_str(&server).or_fail_with(URL_ENV)?;
        let admin = MySqlPoolOptions::new()
            .max_connections(1)
            .connect_with(options.clone())
            .await
            .or_fail_with(format!("cannot connect to {URL_ENV}"))?;
        let name = unique_name(what);
        for sql in [
            format!("DROP DATABASE IF EXISTS `{name}`"),
            format!("CREATE DATABASE `{name}`"),
        ] {
            sqlx::query(&sql).execute(&admin).await.or_fail_with(&sql)?;
        }
        let pool = MySqlPoolOptions::new()
            .max_connections(max_connections)
            .connect_with(options.database(&name))
            .await
            .or_fail_with(format!("cannot connect to database {name}"))?;
        let url = url_with_database(&server, &name);
        Ok(Self {
            name,
            pool,
            url,
            admin,
        })
    }

    /// A store on this database, not migrated.
    pub fn unmigrated(&self, options: MySqlOptions) -> Result<MySqlStore, CaseError> {
        Ok(MySqlStore::from_pool(self.pool.clone(), options)?)
    }

    /// A migrated store on this database.
    pub async fn store(&self, options: MySqlOptions) -> Result<MySqlStore, CaseError> {
        let store = self.unmigrated(options)?;
        watukuy_core::store::Store::migrate(&store).await?;
        Ok(store)
    }

    /// Drops the database and closes the pools.
    pub async fn remove(&self) -> Result<(), CaseError> {
        self.pool.close().await;
        let sql = format!("DROP DATABASE IF EXISTS `{}`", self.name);
        sqlx::query(&sql)
            .execute(&self.admin)
            .await
            .or_fail_with(&sql)?;
        self.admin.close().await;
        Ok(())
    }
}

/// `url` with its path (the database) replaced by `database`.
pub fn url_with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority_end = base
        .find("://")
        .map(|i| i + 3)
        .and_then(|start| base[start..].find('/').map(|j| start + j))
        .unwrap_or(base.len());
    let mut out = format!("{}/{database}", &base[..authority_end]);
    if let Some(query) = query {
        out.push('?');
        out.push_str(query);
    }
    out
}

/// Hands every conformance case a migrated store in its own database, dropped when it passes.
pub struct MySqlHarness;

#[async_trait::async_trait]
impl Harness for MySqlHarness {
    fn name(&self) -> String {
        "mysql".to_owned()
    }

    async fn fresh(&self, ctx: CaseContext) -> Result<Fresh, CaseError> {
        let database = Database::new(&format!("{}_{}", ctx.module, ctx.name), 4).await?;
        let store = database.store(MySqlOptions::default()).await?;
        let (url, new_url, raw) = (
            database.url.clone(),
            database.url.clone(),
            database.pool.clone(),
        );
        Ok(Fresh::new(Arc::new(store))
            .with_cleanup(async move {
                if let Err(e) = database.remove().await {
                    eprintln!("[mysql] after a passing case: {e}");
                }
            })
            // A store on a pool of its own, as a second process would open.
            .with_instances(move || {
                let url = url.clone();
                async move {
                    let store = MySqlStore::connect(&url, MySqlOptions::default()).await?;
                    Ok(Arc::new(store) as Arc<dyn watukuy_core::store::Store>)
                }
            })
            // Stores on tables nobody has created yet: another prefix in the case's database.
            .with_unmigrated(move || {
                let url = new_url.clone();
                async move {
                    let options = MySqlOptions::default().table_prefix("new_");
                    let store = MySqlStore::connect(&url, options).await?;
                    Ok(Arc::new(store) as Arc<dyn watukuy_core::store::Store>)
                }
            })
            .with_raw_writes(move |write| {
                let pool = raw.clone();
                async move { raw_write(&pool, &write).await }
            }))
    }
}

/// Writes `raw` with SQL of the test's own, over every row of the case's database.
async fn raw_write(pool: &MySqlPool, raw: &RawWrite) -> CaseResult {
    let sql = match raw {
        RawWrite::State(_) => "UPDATE `watukuy_keys` SET state_json = '{not json'".to_owned(),
        // Not UTF-8: a payload is JSON text.
        RawWrite::Items(_) => "UPDATE `watukuy_items` SET payload = X'FF'".to_owned(),
        RawWrite::Pending(_) => "UPDATE `watukuy_outbox` SET event_json = '[1, 2'".to_owned(),
        RawWrite::SchemaVersion(version) => {
            format!("UPDATE `watukuy_schema_version` SET version = {version}")
        }
        other => return Err(CaseError::skipped(format!("{other:?} is not written here"))),
    };
    sqlx::query(&sql).execute(pool).await.or_fail_with(&sql)?;
    Ok(())
}

/// Runs a test body in a fresh [`Database`] named after `what`; a failing or skipping body, or
/// a missing server, fails the test. A passing body's database is dropped.
pub async fn with_database<F, Fut>(what: &str, max_connections: u32, body: F)
where
    F: FnOnce(Database) -> Fut,
    Fut: std::future::Future<Output = Result<(), CaseError>>,
{
    let outcome = async {
        let database = Database::new(what, max_connections).await?;
        body(database.clone()).await?;
        database.remove().await
    }
    .await;
    if let Err(error) = outcome {
        panic!("[mysql] {what} {error}");
    }
}

/// How many transactions on `database` wait for a row lock right now.
///
/// Read from `SHOW ENGINE INNODB STATUS` (its `LOCK WAIT` transactions and their thread ids,
/// matched against `information_schema.processlist`), which the server builds on every call.
/// Not from `information_schema.innodb_trx`: InnoDB refreshes that table's cache only when
/// nobody read it for 100 ms, so tests polling it at once keep it stale for good.
pub async fn lock_waits(pool: &MySqlPool, database: &str) -> Result<u64, CaseError> {
    let (_, _, status): (String, String, String) = sqlx::query_as("SHOW ENGINE INNODB STATUS")
        .fetch_one(pool)
        .await
        .or_fail_with("SHOW ENGINE INNODB STATUS")?;
    let waiters: Vec<i64> = status
        .split("---TRANSACTION")
        .filter(|block| block.lines().any(|line| line.starts_with("LOCK WAIT")))
        .filter_map(|block| {
            let (_, after) = block.split_once(" thread id ")?;
            let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .collect();
    if waiters.is_empty() {
        return Ok(0);
    }
    let sql = format!(
        "SELECT COUNT(*) FROM information_schema.processlist WHERE db = ? AND id IN ({})",
        vec!["?"; waiters.len()].join(",")
    );
    let mut query = sqlx::query_scalar::<_, i64>(&sql).bind(database);
    for id in waiters {
        query = query.bind(id);
    }
    let count = query
        .fetch_one(pool)
        .await
        .or_fail_with("read information_schema.processlist")?;
    Ok(u64::try_from(count).unwrap_or(0))
}
