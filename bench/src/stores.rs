//! The backends under test, each opened fresh (empty) for every measurement.

use std::path::PathBuf;
use std::sync::Arc;

use watukuy_core::{BoxError, store::Store};
use watukuy_store_memory::MemoryStore;
use watukuy_store_mysql::{MySqlOptions, MySqlStore};
use watukuy_store_postgres::{PostgresOptions, PostgresStore};
use watukuy_store_redis::{RedisOptions, RedisStore};
use watukuy_store_sqlite::{SqliteOptions, SqliteStore, Synchronous};

/// The Postgres schema every benchmark table lives in (dropped before each run).
pub(crate) const PG_SCHEMA: &str = "watukuy_bench";
/// The MySQL table prefix of every benchmark table (dropped before each run).
pub(crate) const MYSQL_PREFIX: &str = "watukuy_bench_";
/// The Redis key prefix of every benchmark key (purged before each run).
pub(crate) const REDIS_PREFIX: &str = "watukuy-bench:";

/// A store backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, clap::ValueEnum)]
pub(crate) enum Backend {
    /// `watukuy-store-memory`.
    Memory,
    /// `watukuy-store-sqlite` on a file (WAL).
    Sqlite,
    /// `watukuy-store-postgres`.
    Postgres,
    /// `watukuy-store-redis`.
    Redis,
    /// `watukuy-store-mysql` (MySQL or MariaDB).
    #[value(name = "mysql")]
    MySql,
}

impl Backend {
    /// The name used in tables and plots.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
            Backend::Redis => "redis",
            Backend::MySql => "mysql",
        }
    }
}

/// Where the servers and files are.
#[derive(Clone, Debug)]
pub(crate) struct Targets {
    /// Postgres URL.
    pub(crate) postgres: String,
    /// Redis URL.
    pub(crate) redis: String,
    /// MySQL / MariaDB URL.
    pub(crate) mysql: String,
    /// The directory SQLite files go to.
    pub(crate) dir: PathBuf,
    /// The dispatcher's concurrency, to size the Postgres pool.
    pub(crate) concurrency: usize,
    /// The SQLite store's durability level.
    pub(crate) sqlite_synchronous: Synchronous,
}

impl Targets {
    /// The SQLite file of the benchmark store.
    pub(crate) fn sqlite_path(&self) -> PathBuf {
        self.dir.join("watukuy-bench.db")
    }
}

/// Removes a SQLite database and its WAL and shared-memory files.
pub(crate) fn remove_sqlite(path: &std::path::Path) {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        let _ = std::fs::remove_file(PathBuf::from(p));
    }
}

/// A store on the benchmark's Postgres schema as it is (migrated if new), as one more process
/// would open it.
pub(crate) async fn postgres(t: &Targets) -> Result<Arc<dyn Store>, BoxError> {
    // One connection per in-flight key plus the dispatcher's own reads, as a user would size
    // it; bounded so the shared server keeps connections for others.
    let pool = u32::try_from(t.concurrency.saturating_add(2).clamp(10, 40)).unwrap_or(10);
    let options = PostgresOptions::default()
        .schema(PG_SCHEMA)
        .max_connections(pool);
    Ok(Arc::new(
        PostgresStore::connect(&t.postgres, options).await?,
    ))
}

/// An empty, migrated store of `backend`.
pub(crate) async fn fresh(backend: Backend, t: &Targets) -> Result<Arc<dyn Store>, BoxError> {
    let store: Arc<dyn Store> = match backend {
        Backend::Memory => Arc::new(MemoryStore::new()),
        Backend::Sqlite => {
            let path = t.sqlite_path();
            remove_sqlite(&path);
            Arc::new(SqliteStore::open(
                SqliteOptions::file(path).synchronous(t.sqlite_synchronous),
            )?)
        }
        Backend::Postgres => {
            {
                let pool = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(1)
                    .connect(&t.postgres)
                    .await?;
                sqlx::query(&format!("DROP SCHEMA IF EXISTS \"{PG_SCHEMA}\" CASCADE"))
                    .execute(&pool)
                    .await?;
                pool.close().await;
            }
            postgres(t).await?
        }
        Backend::MySql => {
            // As many connections as Postgres gets, for the same reason.
            let pool = u32::try_from(t.concurrency.saturating_add(2).clamp(10, 40)).unwrap_or(10);
            let options = MySqlOptions::default()
                .table_prefix(MYSQL_PREFIX)
                .max_connections(pool);
            let store = MySqlStore::connect(&t.mysql, options).await?;
            for table in store.table_names() {
                sqlx::query(&format!("DROP TABLE IF EXISTS {table}"))
                    .execute(store.pool())
                    .await?;
            }
            Arc::new(store)
        }
        Backend::Redis => {
            let store =
                RedisStore::connect(&t.redis, RedisOptions::default().prefix(REDIS_PREFIX)).await?;
            store.purge().await?;
            Arc::new(store)
        }
    };
    store.migrate().await?;
    Ok(store)
}
