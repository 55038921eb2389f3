//! The consumer suite (`watukuy_conformance::consumer_tests!`) on PostgreSQL: each case in a
//! schema of its own holding the processed-events table, the suite's read model and the engine
//! store whose leases fence the consumer. Ignored while `WATUKUY_TEST_POSTGRES_URL` is unset
//! (docs/testing.md).

mod common;

use std::sync::Arc;

use common::{OrFail, Schema, database};
use futures::future::BoxFuture;
use sqlx::{PgPool, Postgres, Row, Transaction};
use watukuy_conformance::CaseError;
use watukuy_conformance::consumer::{ConsumerDb, ConsumerHarness, ModelRow};
use watukuy_core::{BoxError, Event, EventType, clock::ManualClock, store::Store};
use watukuy_store_postgres::{PostgresStore, ProcessedEvents};

/// A schema with a processed-events table `processed<suffix>` and a read model `rm<suffix>`.
struct PgConsumerDb {
    schema: Schema,
    suffix: String,
    processed: ProcessedEvents,
    store: Arc<PostgresStore>,
    clock: ManualClock,
}

impl PgConsumerDb {
    async fn new(
        schema: Schema,
        suffix: &str,
        clock: ManualClock,
        store: Arc<PostgresStore>,
    ) -> Result<Self, CaseError> {
        let processed = ProcessedEvents::new(schema.name.as_str(), format!("processed{suffix}"))?
            .with_clock(Arc::new(clock.clone()))
            .fenced_by(&schema.options())?;
        processed.migrate(&schema.pool).await?;
        sqlx::query(&format!(
            r#"CREATE TABLE "{}"."rm{suffix}" (subject text PRIMARY KEY, value text, applications bigint NOT NULL)"#,
            schema.name
        ))
        .execute(&schema.pool)
        .await
        .or_fail_with("create the read model")?;
        Ok(Self {
            schema,
            suffix: suffix.to_owned(),
            processed,
            store,
            clock,
        })
    }

    fn table(&self) -> String {
        format!(r#""{}"."rm{}""#, self.schema.name, self.suffix)
    }
}

#[async_trait::async_trait]
impl ConsumerDb for PgConsumerDb {
    type Consumer = ProcessedEvents;

    fn consumer(&self) -> &ProcessedEvents {
        &self.processed
    }

    /// One pool serves both instances: each transaction holds a connection of its own.
    fn conn(&self, _instance: usize) -> &PgPool {
        &self.schema.pool
    }

    fn clock(&self) -> &ManualClock {
        &self.clock
    }

    fn engine_store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    fn project<'t>(
        &'t self,
        tx: &'t mut Transaction<'_, Postgres>,
        event: &'t Event,
    ) -> BoxFuture<'t, Result<(), BoxError>> {
        Box::pin(async move {
            let table = self.table();
            if event.event_type == EventType::Deleted {
                sqlx::query(&format!("DELETE FROM {table} WHERE subject = $1"))
                    .bind(event.subject.as_str())
                    .execute(&mut **tx)
                    .await?;
            } else {
                sqlx::query(&format!(
                    "INSERT INTO {table} AS t (subject, value, applications) VALUES ($1, $2, 1)
                     ON CONFLICT (subject) DO UPDATE
                     SET value = excluded.value, applications = t.applications + 1"
                ))
                .bind(event.subject.as_str())
                .bind(event.data.as_ref().map(|d| d.as_str().to_owned()))
                .execute(&mut **tx)
                .await?;
            }
            Ok(())
        })
    }

    fn fail<'t>(
        &'t self,
        tx: &'t mut Transaction<'_, Postgres>,
    ) -> BoxFuture<'t, Result<(), BoxError>> {
        Box::pin(async move {
            sqlx::query("SELECT 1/0").execute(&mut **tx).await?;
            Ok(())
        })
    }

    async fn rows(&self) -> Result<Vec<ModelRow>, CaseError> {
        let rows = sqlx::query(&format!(
            "SELECT subject, value, applications FROM {} ORDER BY subject",
            self.table()
        ))
        .fetch_all(&self.schema.pool)
        .await
        .or_fail_with("read the model")?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
            .collect::<Result<_, sqlx::Error>>()
            .or_fail_with("read the model")
    }

    async fn markers(&self) -> Result<u64, CaseError> {
        let n: i64 = sqlx::query_scalar(&format!(
            r#"SELECT count(*) FROM "{}"."processed{}""#,
            self.schema.name, self.suffix
        ))
        .fetch_one(&self.schema.pool)
        .await
        .or_fail_with("count markers")?;
        u64::try_from(n).or_fail()
    }

    async fn migrate(&self) -> Result<(), CaseError> {
        Ok(self.processed.migrate(&self.schema.pool).await?)
    }

    /// A backend of this schema's pool waiting on a lock (a claim blocked on another's marker or
    /// subject row).
    async fn waiting(&self) -> Result<bool, CaseError> {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1",
        )
        .bind(format!("%\"{}\"%", self.schema.name))
        .fetch_one(&self.schema.pool)
        .await
        .or_fail_with("pg_stat_activity")?;
        Ok(n > 0)
    }

    async fn rebuilt(&self) -> Result<Self, CaseError> {
        Self::new(
            self.schema.clone(),
            &format!("{}_rebuilt", self.suffix),
            self.clock.clone(),
            self.store.clone(),
        )
        .await
    }
}

struct PgConsumers;

#[async_trait::async_trait]
impl ConsumerHarness for PgConsumers {
    type Db = PgConsumerDb;

    async fn fresh(
        &self,
        name: &'static str,
        clock: ManualClock,
    ) -> Result<PgConsumerDb, CaseError> {
        let database = database().await?;
        let schema = Schema::new(&database, &format!("consumer_{name}"), 8).await?;
        let store = PostgresStore::from_pool(schema.pool.clone(), schema.options())?;
        watukuy_core::store::Store::migrate(&store).await?;
        PgConsumerDb::new(schema, "", clock, Arc::new(store)).await
    }

    async fn cleanup(&self, db: Arc<PgConsumerDb>) {
        if let Err(e) = db.schema.remove().await {
            eprintln!("[postgres] after a passing consumer case: {e}");
        }
    }
}

watukuy_conformance::consumer_tests!(
    PgConsumers,
    #[watukuy_testenv::requires(postgres, or_cfg(feature = "testcontainers"))]
);
