//! The store through PgBouncer in transaction pooling mode (`pool_mode = transaction`, as Debian
//! ships it, 1.18): the whole conformance suite, concurrent `migrate()`, and many stores writing
//! at once through a pool of fewer server connections than they have clients.
//!
//! The test starts its own PostgreSQL and PgBouncer on spare ports (tests/servers), once for the
//! whole file; the stores connect with `PostgresOptions::transaction_pooling(true)`. Ignored,
//! with the reason, when the programs are missing (docs/testing.md).

mod common;
mod servers;

use std::sync::{Arc, LazyLock};

use common::{Database, OrFail, Schema, ensure, fail};
use servers::Bouncer;
use watukuy_conformance::cases::fixtures::{TTL, pending};
use watukuy_conformance::{CaseContext, CaseError, Fresh, Harness};
use watukuy_core::store::{CommitBatch, PKey, Store};
use watukuy_store_postgres::{PostgresOptions, PostgresStore};
use watukuy_testkit::T0;

/// The pooler (and the server behind it) of this test process.
static BOUNCER: LazyLock<Bouncer> = LazyLock::new(Bouncer::start);

/// The pooler, started on first use (off the async threads: it blocks until it is up).
async fn bouncer() -> &'static Bouncer {
    tokio::task::spawn_blocking(|| &*BOUNCER)
        .await
        .unwrap_or_else(|e| panic!("starting PgBouncer failed: {e}"))
}

/// A fresh schema on the server (a direct pool, for setting up and dropping it).
async fn schema(what: &str) -> Result<Schema, CaseError> {
    let bouncer = bouncer().await;
    Schema::new(&Database::at(bouncer.server.url("")), what, 2).await
}

/// A store on `schema` connected through the pooler.
async fn pooled_store(schema: &Schema, max_connections: u32) -> Result<PostgresStore, CaseError> {
    let options = schema
        .options()
        .transaction_pooling(true)
        .max_connections(max_connections)
        .close_pool(true);
    Ok(PostgresStore::connect(&bouncer().await.url(), options).await?)
}

/// Every conformance case on a store that reaches its schema only through PgBouncer.
struct BouncerHarness;

#[async_trait::async_trait]
impl Harness for BouncerHarness {
    fn name(&self) -> String {
        "postgres-pgbouncer".to_owned()
    }

    async fn fresh(&self, ctx: CaseContext) -> Result<Fresh, CaseError> {
        let schema = schema(&format!("{}_{}", ctx.module, ctx.name)).await?;
        let store = Arc::new(pooled_store(&schema, 4).await?);
        store.migrate().await?;
        let cleanup = Arc::clone(&store);
        let instances = schema.clone();
        Ok(Fresh::new(store)
            .with_cleanup(async move {
                let _ = cleanup.close().await;
                if let Err(e) = schema.remove().await {
                    eprintln!("[pgbouncer] after a passing case: {e}");
                }
                schema.pool.close().await;
            })
            // Another store through the pooler, as a second process would connect.
            .with_instances(move || {
                let schema = instances.clone();
                async move {
                    let store = pooled_store(&schema, 2).await?;
                    Ok(Arc::new(store) as Arc<dyn watukuy_core::store::Store>)
                }
            }))
    }
}

watukuy_conformance::store_tests!(
    BouncerHarness,
    #[watukuy_testenv::requires(postgres_server, pgbouncer)]
);

/// Runs a test body in a fresh schema; panics with its failure.
async fn with_schema<F, Fut>(what: &str, body: F)
where
    F: FnOnce(Schema) -> Fut,
    Fut: std::future::Future<Output = Result<(), CaseError>>,
{
    let schema = schema(what)
        .await
        .unwrap_or_else(|e| panic!("[pgbouncer] {what}: {e}"));
    if let Err(e) = body(schema.clone()).await {
        panic!("[pgbouncer] {what}: {e}");
    }
    schema
        .remove()
        .await
        .unwrap_or_else(|e| panic!("[pgbouncer] {what}: {e}"));
}

/// Concurrent `migrate()` calls from many instances, each through the pooler, all succeed and
/// leave one schema version: the migration's advisory locks are transaction-level, so they hold
/// across a pooler that reassigns server connections between transactions.
#[watukuy_testenv::requires(postgres_server, pgbouncer)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_migrations_through_the_pooler_all_succeed() {
    with_schema("concurrent_migrate", |schema| async move {
        let mut stores = Vec::new();
        for _ in 0..8 {
            stores.push(Arc::new(pooled_store(&schema, 2).await?));
        }
        let tasks: Vec<_> = stores
            .iter()
            .map(|store| {
                let store = Arc::clone(store);
                tokio::spawn(async move { store.migrate().await })
            })
            .collect();
        for task in tasks {
            task.await.or_fail()??;
        }
        let versions: Vec<i32> = sqlx::query_scalar(&format!(
            "SELECT version FROM \"{schema}\".watukuy_schema_version ORDER BY version"
        ))
        .fetch_all(&schema.pool)
        .await
        .or_fail()?;
        ensure!(
            versions == (1..=watukuy_store_postgres::SCHEMA_VERSION).collect::<Vec<_>>(),
            "versions {versions:?}"
        );
        for store in stores {
            store.close().await?;
        }
        Ok(())
    })
    .await;
}

/// More clients than server connections, all writing at once: 12 stores of 3 connections each
/// share PgBouncer's pool of 10 server connections, so consecutive statements of one client run
/// on different server connections. Every fenced write lands, nothing is lost or doubled.
#[watukuy_testenv::requires(postgres_server, pgbouncer)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_clients_share_fewer_server_connections() {
    const STORES: usize = 12;
    const PAGES: i64 = 15;
    with_schema("many_clients", |schema| async move {
        let first = pooled_store(&schema, 3).await?;
        first.migrate().await?;
        first.close().await?;
        let mut tasks = Vec::new();
        for s in 0..STORES {
            let store = pooled_store(&schema, 3).await?;
            tasks.push(tokio::spawn(async move {
                let key = PKey::new("orders", format!("p{s}"));
                let owner = format!("node-{s}");
                let lease = store
                    .acquire_lease(&key, &owner, TTL, T0)
                    .await?
                    .ok_or_else(|| fail("the lease is taken"))?;
                for page in 1..=PAGES {
                    let mut batch = CommitBatch::default();
                    batch.events = vec![pending(&key, &format!("e{s}-{page}"), page, "o1")];
                    store.commit_poll(&key, &lease, &batch).await?;
                    let pending = store.load_pending(&key, 100).await?;
                    let ids: Vec<String> =
                        pending.iter().map(|row| row.event.id.to_string()).collect();
                    ensure!(ids.len() == 1, "store {s} page {page}: pending {ids:?}");
                    store.ack_events(&key, &lease, &ids).await?;
                }
                let counts = store.counts(&key).await?;
                ensure!(counts.pending == 0, "store {s}: {counts:?}");
                store.close().await?;
                Ok::<_, CaseError>(())
            }));
        }
        for task in tasks {
            task.await.or_fail()??;
        }
        Ok(())
    })
    .await;
}

/// Without `transaction_pooling`, PgBouncer refuses the driver's `extra_float_digits` startup
/// parameter: a permanent error that says which option to set.
#[watukuy_testenv::requires(postgres_server, pgbouncer)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_transaction_pooling_the_error_names_the_option() {
    let result = PostgresStore::connect(&bouncer().await.url(), PostgresOptions::default()).await;
    match result {
        Err(error @ watukuy_core::Error::Store { .. }) => {
            assert!(!error.is_transient(), "{error}");
            let message = error.to_string();
            for part in [
                "unsupported startup parameter",
                "extra_float_digits",
                "transaction_pooling(true)",
            ] {
                assert!(message.contains(part), "{part:?} missing from: {message}");
            }
        }
        Err(other) => panic!("expected a permanent store error, got {other:?}"),
        Ok(_) => panic!("PgBouncer accepted extra_float_digits (ignore_startup_parameters?)"),
    }
}
