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

/// The freeze the consumer suite cannot play on every database: an instance frozen INSIDE its
/// projection's transaction past its lease. The new holder takes the lease and delivers the
/// same event; its claim waits on the frozen instance's claim lock. When the frozen instance
/// wakes, its fence check fails and it rolls back, so the new holder's claim goes on and applies
/// the event: once, by the instance that holds the lease.
#[watukuy_testenv::requires(mysql)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_frozen_inside_its_transaction_past_its_lease_cannot_commit() {
    use watukuy_conformance::cases::fixtures::{NODE_A, NODE_B, T0, TTL, acquire, event, key};
    use watukuy_conformance::consumer::cases::{
        applications, apply_with, spawn_held, until_blocked,
    };
    use watukuy_core::delivery::{ApplyError, ApplyOutcome, Fence};

    let run = async {
        let db = Arc::new(
            MySqlConsumers
                .fresh("frozen_inside", ManualClock::new(T0))
                .await?,
        );
        let store = db.engine_store();
        let k = key();
        let old = acquire(&*store, &k, NODE_A, T0).await?;
        let e = event(&k, "evt-1", 1, "o1");
        // The old holder claims and writes, then freezes with its transaction open.
        let (frozen, wrote, wake) = spawn_held(
            &db,
            0,
            &e,
            Some(Fence::new(k.clone(), old.owner.as_str(), old.epoch)),
        );
        wrote
            .await
            .or_fail_with("the frozen projection never ran")?;
        // Its lease expires; another instance takes it and delivers the same event.
        let new = acquire(&*store, &k, NODE_B, T0 + TTL + 1).await?;
        let holder = {
            let (db, e) = (Arc::clone(&db), e.clone());
            let fence = Fence::new(k.clone(), new.owner.as_str(), new.epoch);
            tokio::spawn(
                async move { apply_with(&db, 1, &e, Some(&fence), async { Ok(()) }).await },
            )
        };
        until_blocked(&*db, "the new holder").await?;
        let _ = wake.send(Ok(()));
        let frozen = frozen.await.or_fail()?;
        let holder = holder.await.or_fail()?;
        if !matches!(&frozen, Err(ApplyError::Store(watukuy_core::Error::LeaseLost { epoch, .. })) if *epoch == old.epoch)
        {
            return Err(CaseError::failed(format!(
                "the frozen instance: {frozen:?}"
            )));
        }
        if !matches!(holder, Ok(ApplyOutcome::Applied(()))) {
            return Err(CaseError::failed(format!("the new holder: {holder:?}")));
        }
        let n = applications(&*db, "o1").await?;
        if n != 1 {
            return Err(CaseError::failed(format!("applied {n} times")));
        }
        MySqlConsumers.cleanup(db).await;
        Ok::<(), CaseError>(())
    };
    if let Err(e) = run.await {
        panic!("[mysql] {e}");
    }
}
