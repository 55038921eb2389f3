//! The consumer suite (`watukuy_conformance::consumer_tests!`) on MySQL / MariaDB: each case in
//! a database of its own holding the processed-events table, the suite's read model and the
//! engine store whose leases fence the consumer. Ignored while `WATUKUY_TEST_MYSQL_URL` is unset
//! (docs/testing.md).

mod common;

use std::sync::Arc;

use common::{Database, OrFail};
use futures::future::BoxFuture;
use sqlx::{Executor, MySql, MySqlPool, Transaction};
use watukuy_conformance::CaseError;
use watukuy_conformance::consumer::{ConsumerDb, ConsumerHarness, ModelRow};
use watukuy_core::{BoxError, Event, EventType, clock::ManualClock, store::Store};
use watukuy_store_mysql::{MySqlOptions, MySqlStore, ProcessedEvents};

/// A database with a processed-events table `processed<suffix>`, a read model `rm<suffix>` and
/// the engine store (default options) fencing them.
struct MySqlConsumerDb {
    database: Database,
    suffix: String,
    processed: ProcessedEvents,
    store: Arc<MySqlStore>,
    clock: ManualClock,
}

impl MySqlConsumerDb {
    async fn new(
        database: Database,
        suffix: &str,
        clock: ManualClock,
        store: Arc<MySqlStore>,
    ) -> Result<Self, CaseError> {
        let processed = ProcessedEvents::new(format!("processed{suffix}"))?
            .with_clock(Arc::new(clock.clone()))
            .fenced_by(&MySqlOptions::default())?;
        processed.migrate(&database.pool).await?;
        let create = format!(
            "CREATE TABLE `rm{suffix}` (subject VARBINARY(1024) PRIMARY KEY, value LONGTEXT NULL, \
             applications BIGINT NOT NULL)"
        );
        database
            .pool
            .execute(create.as_str())
            .await
            .or_fail_with("create the read model")?;
        Ok(Self {
            database,
            suffix: suffix.to_owned(),
            processed,
            store,
            clock,
        })
    }

    fn table(&self) -> String {
        format!("`rm{}`", self.suffix)
    }
}

#[async_trait::async_trait]
impl ConsumerDb for MySqlConsumerDb {
    type Consumer = ProcessedEvents;

    fn consumer(&self) -> &ProcessedEvents {
        &self.processed
    }

    /// One pool serves both instances: each transaction holds a connection of its own.
    fn conn(&self, _instance: usize) -> &MySqlPool {
        &self.database.pool
    }

    fn clock(&self) -> &ManualClock {
        &self.clock
    }

    fn engine_store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    fn project<'t>(
        &'t self,
        tx: &'t mut Transaction<'_, MySql>,
        event: &'t Event,
    ) -> BoxFuture<'t, Result<(), BoxError>> {
        Box::pin(async move {
            let table = self.table();
            if event.event_type == EventType::Deleted {
                sqlx::query(&format!("DELETE FROM {table} WHERE subject = ?"))
                    .bind(event.subject.as_bytes())
                    .execute(&mut **tx)
                    .await?;
            } else {
                let value = event.data.as_ref().map(|d| d.as_str().to_owned());
                sqlx::query(&format!(
                    "INSERT INTO {table} (subject, value, applications) VALUES (?, ?, 1) \
                     ON DUPLICATE KEY UPDATE value = ?, applications = applications + 1"
                ))
                .bind(event.subject.as_bytes())
                .bind(value.clone())
                .bind(value)
                .execute(&mut **tx)
                .await?;
            }
            Ok(())
        })
    }

    /// A statement on a table that does not exist (MySQL's `1/0` is NULL, not an error).
    fn fail<'t>(
        &'t self,
        tx: &'t mut Transaction<'_, MySql>,
    ) -> BoxFuture<'t, Result<(), BoxError>> {
        Box::pin(async move {
            sqlx::query("SELECT * FROM no_such_table")
                .execute(&mut **tx)
                .await?;
            Ok(())
        })
    }

    async fn rows(&self) -> Result<Vec<ModelRow>, CaseError> {
        let rows: Vec<(Vec<u8>, Option<String>, i64)> = sqlx::query_as(&format!(
            "SELECT subject, value, applications FROM {} ORDER BY subject",
            self.table()
        ))
        .fetch_all(&self.database.pool)
        .await
        .or_fail_with("read the model")?;
        rows.into_iter()
            .map(|(subject, value, n)| Ok((String::from_utf8(subject).or_fail()?, value, n)))
            .collect()
    }

    async fn markers(&self) -> Result<u64, CaseError> {
        let n: i64 =
            sqlx::query_scalar(&format!("SELECT COUNT(*) FROM `processed{}`", self.suffix))
                .fetch_one(&self.database.pool)
                .await
                .or_fail_with("count markers")?;
        u64::try_from(n).or_fail()
    }

    async fn migrate(&self) -> Result<(), CaseError> {
        Ok(self.processed.migrate(&self.database.pool).await?)
    }

    /// A connection of this database waiting for a row lock (a claim queued on another's
    /// bucket lock), as `SHOW ENGINE INNODB STATUS` shows it.
    async fn waiting(&self) -> Result<bool, CaseError> {
        Ok(common::lock_waits(&self.database.pool, &self.database.name).await? > 0)
    }

    async fn rebuilt(&self) -> Result<Self, CaseError> {
        Self::new(
            self.database.clone(),
            &format!("{}_rebuilt", self.suffix),
            self.clock.clone(),
            self.store.clone(),
        )
        .await
    }
}

struct MySqlConsumers;

#[async_trait::async_trait]
impl ConsumerHarness for MySqlConsumers {
    type Db = MySqlConsumerDb;

    async fn fresh(
        &self,
        name: &'static str,
        clock: ManualClock,
    ) -> Result<MySqlConsumerDb, CaseError> {
        let database = Database::new(&format!("consumer_{name}"), 8).await?;
        let store = database.store(MySqlOptions::default()).await?;
        MySqlConsumerDb::new(database, "", clock, Arc::new(store)).await
    }

    async fn cleanup(&self, db: Arc<MySqlConsumerDb>) {
        if let Err(e) = db.database.remove().await {
            eprintln!("[mysql] after a passing consumer case: {e}");
        }
    }
}

watukuy_conformance::consumer_tests!(MySqlConsumers, #[watukuy_testenv::requires(mysql)]);
