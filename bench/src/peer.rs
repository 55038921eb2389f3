//! The peer side by side: apalis 0.7 (`apalis-sql` on Postgres and SQLite, `apalis-redis`) on
//! the same servers, with the same workload: `events` jobs carrying the same item payload are
//! pushed (one `push` per job: apalis 0.7's `Storage` has no bulk push) while one worker with
//! concurrency `concurrency` runs a no-op handler; timed from the first push to the last job
//! handled. Both libraries get a fetch of 100 jobs per poll; apalis polls every 10 ms (its
//! default 100 ms would cap it at 1,000 jobs/s).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use apalis::prelude::*;
use apalis_redis::RedisStorage;
use apalis_sql::postgres::PostgresStorage;
use apalis_sql::sqlite::SqliteStorage;
use serde::{Deserialize, Serialize};
use watukuy_core::BoxError;

use crate::measure::{Stopwatch, rate};
use crate::stores::{Backend as Store, Targets, remove_sqlite};
use crate::workload::{self, Params};

/// The job: the same subject and item as one of our events.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct BenchJob {
    subject: String,
    data: serde_json::Value,
}

/// Counts handled jobs and wakes the waiter at the target.
#[derive(Clone, Debug)]
struct Done {
    handled: Arc<AtomicU64>,
    target: u64,
    notify: Arc<tokio::sync::Notify>,
}

async fn handle(_job: BenchJob, done: Data<Done>) -> Result<(), Error> {
    let n = done.handled.fetch_add(1, Ordering::Relaxed) + 1;
    if n >= done.target {
        done.notify.notify_one();
    }
    Ok(())
}

const POLL: Duration = Duration::from_millis(10);
const BUFFER: usize = 100;

/// The SQL storages' settings: one queue, [`BUFFER`] jobs a fetch, polled every [`POLL`].
fn apalis_config() -> apalis_sql::Config {
    apalis_sql::Config::new("watukuy-bench")
        .set_buffer_size(BUFFER)
        .set_poll_interval(POLL)
}
/// Gives up on a run that stopped making progress.
const GUARD: Duration = Duration::from_secs(900);

/// Pushes the jobs while one worker handles them; events/s from the first push to the last
/// job handled. A macro rather than a generic function: apalis' worker bounds are spelled
/// per concrete storage.
macro_rules! drive {
    ($storage:expr, $p:expr, $done:expr) => {{
        async {
            let mut storage = $storage;
            let p: &Params = $p;
            let done: Done = $done;
            let notify = Arc::clone(&done.notify);
            let handled = Arc::clone(&done.handled);
            let worker = WorkerBuilder::new("watukuy-bench")
                .concurrency(p.concurrency)
                .data(done)
                .backend(storage.clone())
                .build_fn(handle);
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let t = Stopwatch::start();
            let monitor =
                tokio::spawn(Monitor::new().register(worker).run_with_signal(async move {
                    let _ = stopped.await;
                    Ok(())
                }));
            for i in 0..p.events {
                storage
                    .push(BenchJob {
                        subject: workload::identity(i),
                        data: workload::item(i, p.payload),
                    })
                    .await?;
            }
            let waited = tokio::time::timeout(GUARD, async {
                while handled.load(Ordering::Relaxed) < p.events {
                    notify.notified().await;
                }
            })
            .await;
            let elapsed = t.elapsed();
            let _ = stop.send(());
            let _ = tokio::time::timeout(Duration::from_secs(10), monitor).await;
            if waited.is_err() {
                return Err::<f64, BoxError>(
                    format!(
                        "apalis handled {} of {} jobs before the guard",
                        handled.load(Ordering::Relaxed),
                        p.events
                    )
                    .into(),
                );
            }
            Ok(rate(p.events, elapsed))
        }
        .await
    }};
}

/// Runs the workload on `backend`; `None` for the memory store (no apalis counterpart run).
pub(crate) async fn run(backend: Store, t: &Targets, p: &Params) -> Result<Option<f64>, BoxError> {
    let done = Done {
        handled: Arc::new(AtomicU64::new(0)),
        target: p.events,
        notify: Arc::new(tokio::sync::Notify::new()),
    };
    let r = match backend {
        Store::Memory | Store::MySql => return Ok(None),
        Store::Postgres => {
            // apalis' migrations create the `apalis` schema; sqlx's bookkeeping table goes to a
            // schema of ours through the search path, never to the shared `public`.
            {
                let admin = apalis_sql::sqlx::PgPool::connect(&t.postgres).await?;
                for statement in [
                    "DROP SCHEMA IF EXISTS apalis CASCADE",
                    "DROP SCHEMA IF EXISTS watukuy_bench_apalis CASCADE",
                    "CREATE SCHEMA watukuy_bench_apalis",
                ] {
                    apalis_sql::sqlx::query(statement).execute(&admin).await?;
                }
                admin.close().await;
            }
            let options: apalis_sql::sqlx::postgres::PgConnectOptions = t.postgres.parse()?;
            let options = options.options([("search_path", "watukuy_bench_apalis")]);
            let pool = apalis_sql::sqlx::postgres::PgPoolOptions::new()
                .max_connections(10)
                .connect_with(options)
                .await?;
            PostgresStorage::setup(&pool).await?;
            let storage: PostgresStorage<BenchJob> =
                PostgresStorage::new_with_config(pool.clone(), apalis_config());
            let r = drive!(storage, p, done);
            for statement in [
                "DROP SCHEMA IF EXISTS apalis CASCADE",
                "DROP SCHEMA IF EXISTS watukuy_bench_apalis CASCADE",
            ] {
                apalis_sql::sqlx::query(statement).execute(&pool).await?;
            }
            pool.close().await;
            r?
        }
        Store::Sqlite => {
            let path = t.dir.join("watukuy-bench-apalis.db");
            remove_sqlite(&path);
            let url = format!("sqlite://{}?mode=rwc", path.display());
            let pool = apalis_sql::sqlx::SqlitePool::connect(&url).await?;
            SqliteStorage::setup(&pool).await?;
            let storage: SqliteStorage<BenchJob> =
                SqliteStorage::new_with_config(pool.clone(), apalis_config());
            let r = drive!(storage, p, done);
            pool.close().await;
            remove_sqlite(&path);
            r?
        }
        Store::Redis => {
            let namespace = "watukuy-bench-apalis";
            purge_redis(&t.redis, namespace).await?;
            let conn = apalis_redis::connect(t.redis.as_str()).await?;
            let config = apalis_redis::Config::default()
                .set_namespace(namespace)
                .set_buffer_size(BUFFER)
                .set_poll_interval(POLL);
            let storage: RedisStorage<BenchJob> = RedisStorage::new_with_config(conn, config);
            let r = drive!(storage, p, done);
            purge_redis(&t.redis, namespace).await?;
            r?
        }
    };
    Ok(Some(r))
}

/// Deletes apalis' keys of `namespace` (with the workspace's redis client).
async fn purge_redis(url: &str, namespace: &str) -> Result<(), BoxError> {
    let client = redis::Client::open(url)?;
    let mut c = client.get_multiplexed_async_connection().await?;
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{namespace}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut c)
            .await?;
        if !keys.is_empty() {
            let _: i64 = redis::cmd("DEL").arg(&keys).query_async(&mut c).await?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}
