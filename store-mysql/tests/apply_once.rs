//! What only MySQL / MariaDB shows of the idempotent consumer:
//!
//! - three overlapping deliveries of one id whose first rolls back: one of the two waiting
//!   applies, the other finds it applied, and they do not deadlock (waiting on a vanished row's
//!   insert did, through InnoDB's gap locks; claims now queue on a bucket row of `<table>_locks`);
//! - a claim inside a `REPEATABLE READ` transaction of the caller's own whose snapshot predates
//!   a concurrent delivery's commit decides on what committed (locking reads);
//! - a new table migrated by four callers at once (under `GET_LOCK`), the exported DDL applied
//!   by hand, the default table; a newer table refused; ids and subjects too long for their
//!   columns rejected by name;
//! - a table built without `fenced_by` cannot check leases; a takeover waits for a fenced
//!   commit in flight (the fence check's shared lock on the lease row).
//!
//! The scenarios every consumer store shares (crashes before the commit and before the
//! acknowledgement, overlapping and late deliveries, projection failures, repeated ids, pruning,
//! concurrent migrations, the fence, replays) are the consumer suite's, in `tests/consumer.rs`.
//!
//! Each test runs in a database of its own (`WATUKUY_TEST_MYSQL_URL`; ignored while it is unset,
//! see docs/testing.md). Overlaps are seen in `SHOW ENGINE INNODB STATUS`; nothing sleeps.

mod common;

use std::sync::Arc;

use common::{Database, OrFail, ensure, fail, with_database};
use sqlx::{Executor, MySql, MySqlPool, Transaction};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use watukuy_conformance::CaseError;
use watukuy_conformance::cases::fixtures::{NODE_A, NODE_B, TTL, event, key};
use watukuy_core::delivery::{ApplyError, ApplyOutcome, ConsumerStore, Fence};
use watukuy_core::{
    BoxError, Error, Event,
    clock::ManualClock,
    store::{Store, StoreErrorKind},
};
use watukuy_store_mysql::{MySqlOptions, PROCESSED_EVENTS_VERSION, ProcessedEvents, apply_once};
use watukuy_testkit::T0;

/// What one delivery gave.
type Applied = Result<ApplyOutcome<()>, ApplyError<BoxError>>;

/// A read model row: subject, value, applications.
type Row = (String, Option<String>, i32);

/// The test's database with the processed-events table `processed` (fenced by the default
/// store options, stamped by a manual clock) and the read model `rm`.
#[derive(Clone)]
struct Db {
    pool: MySqlPool,
    name: String,
    processed: ProcessedEvents,
}

impl Db {
    async fn new(database: &Database) -> Result<Self, CaseError> {
        let processed = ProcessedEvents::new("processed")?
            .with_clock(Arc::new(ManualClock::new(T0)))
            .fenced_by(&MySqlOptions::default())?;
        processed.migrate(&database.pool).await?;
        let db = Self {
            pool: database.pool.clone(),
            name: database.name.clone(),
            processed,
        };
        db.create_read_model("rm").await?;
        Ok(db)
    }

    /// A read model table: one row per subject with its value and how many times a projection
    /// touched it (so a double application shows).
    async fn create_read_model(&self, table: &str) -> Result<(), CaseError> {
        let sql = format!(
            "CREATE TABLE `{table}` (subject VARBINARY(1024) PRIMARY KEY, value LONGTEXT NULL, \
             applications INT NOT NULL)"
        );
        self.pool.execute(sql.as_str()).await.or_fail_with(&sql)?;
        Ok(())
    }

    async fn rows(&self) -> Result<Vec<Row>, CaseError> {
        let rows: Vec<(Vec<u8>, Option<String>, i32)> =
            sqlx::query_as("SELECT subject, value, applications FROM rm ORDER BY subject")
                .fetch_all(&self.pool)
                .await
                .or_fail_with("read the read model")?;
        Ok(rows
            .into_iter()
            .map(|(subject, value, n)| (String::from_utf8_lossy(&subject).into_owned(), value, n))
            .collect())
    }

    /// How many times the projection touched `subject` (0 without a row).
    async fn applications(&self, subject: &str) -> Result<i32, CaseError> {
        Ok(self
            .rows()
            .await?
            .into_iter()
            .find(|r| r.0 == subject)
            .map_or(0, |r| r.2))
    }

    async fn markers(&self) -> Result<i64, CaseError> {
        sqlx::query_scalar("SELECT COUNT(*) FROM processed")
            .fetch_one(&self.pool)
            .await
            .or_fail_with("count the markers")
    }

    /// `apply_once` of `e` with the projection into `rm`, which awaits `after_write` once it
    /// wrote, inside the still open transaction.
    async fn apply_with(
        &self,
        e: &Event,
        after_write: impl Future<Output = Result<(), BoxError>> + Send + 'static,
    ) -> Applied {
        self.processed
            .apply_once(&self.pool, e, |tx| {
                Box::pin(async move {
                    project(tx, e).await?;
                    after_write.await
                })
            })
            .await
    }

    /// `apply_once` of `e`, unfenced; `what` names a failure.
    async fn apply(&self, e: &Event, what: &str) -> Result<ApplyOutcome<()>, CaseError> {
        self.apply_with(e, async { Ok(()) })
            .await
            .map_err(|err| fail(format!("{what}: {err}")))
    }

    /// Spawns a delivery of `e` whose projection, once it wrote, says so and waits for the
    /// returned sender: `Ok(())` commits, `Err(())` fails the projection (a rollback), dropping
    /// it leaves the delivery waiting.
    #[allow(clippy::type_complexity)]
    fn spawn_held(
        &self,
        e: &Event,
    ) -> (
        JoinHandle<Applied>,
        oneshot::Receiver<()>,
        oneshot::Sender<Result<(), ()>>,
    ) {
        let (wrote_tx, wrote_rx) = oneshot::channel::<()>();
        let (go_tx, go_rx) = oneshot::channel::<Result<(), ()>>();
        let (db, e) = (self.clone(), e.clone());
        let task = tokio::spawn(async move {
            db.apply_with(&e, async move {
                let _ = wrote_tx.send(());
                match go_rx.await {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(())) => Err("the first delivery fails after writing".into()),
                    Err(_) => std::future::pending().await,
                }
            })
            .await
        });
        (task, wrote_rx, go_tx)
    }

    /// Spawns a plain delivery of `e`.
    fn spawn_apply(&self, e: &Event) -> JoinHandle<Applied> {
        let (db, e) = (self.clone(), e.clone());
        tokio::spawn(async move { db.apply_with(&e, async { Ok(()) }).await })
    }

    /// Waits until a transaction of this database is blocked on another's lock.
    async fn until_blocked(&self, what: &str) -> Result<(), CaseError> {
        self.until_waiting(1, what).await
    }

    /// Waits until `n` transactions of this database are blocked on others' locks.
    async fn until_waiting(&self, n: u64, what: &str) -> Result<(), CaseError> {
        for _ in 0..200_000 {
            if common::lock_waits(&self.pool, &self.name).await? >= n {
                return Ok(());
            }
            tokio::task::yield_now().await;
        }
        Err(fail(format!(
            "{what}: {n} transaction(s) never waited for the first one's locks"
        )))
    }
}

/// The projection: upserts the subject's row with the event's data, counting applications.
async fn project(tx: &mut Transaction<'_, MySql>, event: &Event) -> Result<(), sqlx::Error> {
    let value = event.data.as_ref().map(|d| d.as_str().to_owned());
    sqlx::query(
        "INSERT INTO rm (subject, value, applications) VALUES (?, ?, 1) \
         ON DUPLICATE KEY UPDATE value = ?, applications = applications + 1",
    )
    .bind(event.subject.as_str())
    .bind(value.clone())
    .bind(value)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// A `created` event of `subject` with `id` and `sequence` on `key()`.
fn order(id: &str, sequence: i64, subject: &str) -> Event {
    event(&key(), id, sequence, subject)
}

/// The task's outcome, failing the test on a panic or a cancellation.
async fn joined(task: JoinHandle<Applied>) -> Result<Applied, CaseError> {
    task.await.or_fail_with("a delivery task")
}

/// A test `$name` running `$body` with `$db`, the [`Db`] of a database of its own named after
/// it, and `$database` that database.
macro_rules! db_test {
    ($name:ident, |$db:ident, $database:ident| $body:block) => {
        #[watukuy_testenv::requires(mysql)]
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            with_database(stringify!($name), 8, |$database| async move {
                let $db = Db::new(&$database).await?;
                $body
            })
            .await;
        }
    };
}

// Three overlapping deliveries of one id, the second and third blocked on the first, which rolls
// back: one of the two applies, the other finds it applied. The InnoDB gap-lock deadlock
// regression: when both waited on the first's insert of the marker, its rollback turned their
// locks on the vanished row into gap locks that blocked each other's inserts.
db_test!(
    three_overlapping_deliveries_whose_first_rolls_back_do_not_deadlock,
    |db, _database| {
        ensure!(
            db.apply(&order("evt-0", 1, "o1"), "the earlier event")
                .await?
                .is_applied(),
            "the earlier event"
        );
        for (what, e, expected) in [
            ("after an earlier event", order("evt-1", 2, "o1"), 2),
            ("of a fresh subject", order("evt-9", 1, "o9"), 1),
        ] {
            // Two more deliveries wait on the first; when it rolls back, one of them applies
            // and the other finds it applied (no deadlock between the two).
            let (first, wrote, go) = db.spawn_held(&e);
            wrote
                .await
                .map_err(|_| fail("the first projection never ran"))?;
            let (second, third) = (db.spawn_apply(&e), db.spawn_apply(&e));
            db.until_waiting(2, what).await?;
            let _ = go.send(Err(()));
            let first = joined(first).await?;
            ensure!(
                matches!(first, Err(ApplyError::Projection(_))),
                "{what}: first: {first:?}"
            );
            let (second, third) = (joined(second).await?, joined(third).await?);
            let applied = [&second, &third]
                .iter()
                .filter(|o| matches!(o, Ok(ApplyOutcome::Applied(()))))
                .count();
            let deduplicated = [&second, &third]
                .iter()
                .filter(|o| matches!(o, Ok(ApplyOutcome::Deduplicated)))
                .count();
            ensure!(
                applied == 1 && deduplicated == 1,
                "{what}: after the rollback: {second:?}, {third:?}"
            );
            ensure!(
                db.applications(&e.subject).await? == expected,
                "{what}: rows {:?}",
                db.rows().await?
            );
        }
        ensure!(db.markers().await? == 3, "markers");
        Ok(())
    }
);

// `claim` in a transaction of the caller's own at InnoDB's default REPEATABLE READ, whose
// snapshot was taken before a concurrent delivery of the same id committed: the claim decides
// on what committed (locking reads), not on its snapshot, both when it waited for that delivery
// and when it came after.
db_test!(
    a_claim_in_a_repeatable_read_transaction_decides_on_what_committed,
    |db, _database| {
        ensure!(
            db.apply(&order("evt-0", 1, "o1"), "the earlier event")
                .await?
                .is_applied(),
            "the earlier event"
        );
        let snapshot = "SELECT COUNT(*) FROM processed_subjects";

        // Overlapping: the caller's transaction took its snapshot, then waits on the first.
        let e = order("evt-1", 2, "o1");
        let (first, wrote, go) = db.spawn_held(&e);
        wrote
            .await
            .map_err(|_| fail("the first projection never ran"))?;
        let mut mine = db.pool.begin().await.or_fail()?;
        let level: String = sqlx::query_scalar("SELECT @@tx_isolation")
            .fetch_one(&mut *mine)
            .await
            .or_fail()?;
        ensure!(
            level == "REPEATABLE-READ",
            "the server's default level is {level}"
        );
        let _: i64 = sqlx::query_scalar(snapshot)
            .fetch_one(&mut *mine)
            .await
            .or_fail()?;
        let (processed, claimed_e) = (db.processed.clone(), e.clone());
        let claim = tokio::spawn(async move {
            let claimed = processed.claim(&mut mine, &claimed_e).await;
            (claimed, mine)
        });
        db.until_blocked("a claim of the caller's own").await?;
        let _ = go.send(Ok(()));
        let first = joined(first).await?;
        ensure!(
            matches!(first, Ok(ApplyOutcome::Applied(()))),
            "first: {first:?}"
        );
        let (claimed, mine) = claim.await.or_fail()?;
        ensure!(
            matches!(claimed, Ok(false)),
            "the waiting claim took the id again: {claimed:?}"
        );
        mine.commit().await.or_fail()?;

        // After: the snapshot predates a commit the claim did not wait for.
        let e = order("evt-2", 3, "o1");
        let mut mine = db.pool.begin().await.or_fail()?;
        let _: i64 = sqlx::query_scalar(snapshot)
            .fetch_one(&mut *mine)
            .await
            .or_fail()?;
        ensure!(
            db.apply(&e, "the other delivery").await?.is_applied(),
            "the other delivery"
        );
        let claimed = db.processed.claim(&mut mine, &e).await?;
        ensure!(!claimed, "a claim after the commit took the id again");
        mine.commit().await.or_fail()?;
        ensure!(
            db.applications("o1").await? == 3,
            "rows {:?}",
            db.rows().await?
        );
        Ok(())
    }
);

// The suite re-migrates an existing table; here a new one is migrated by four callers at once
// (MySQL commits each DDL statement on its own, so they queue on a named lock), then again.
db_test!(migrations_are_concurrent_and_idempotent, |db, database| {
    // A new table, migrated by four callers at once, then again.
    let fresh = ProcessedEvents::new("fresh")?;
    let results = futures::future::join_all((0..4).map(|_| fresh.migrate(&database.pool))).await;
    for result in results {
        result?;
    }
    fresh.migrate(&database.pool).await?;
    let versions: Vec<(i32, String)> =
        sqlx::query_as("SELECT version, name FROM fresh_version ORDER BY version")
            .fetch_all(&database.pool)
            .await
            .or_fail()?;
    ensure!(
        versions
            == [
                (1, "processed_events".to_owned()),
                (2, "subjects".to_owned()),
                (3, "claim_locks".to_owned())
            ],
        "versions {versions:?}"
    );
    ensure!(
        i32::try_from(versions.len()).ok() == Some(PROCESSED_EVENTS_VERSION),
        "not at the newest version"
    );

    // The exported DDL, applied by hand (twice), gives a table migrate leaves alone.
    let by_hand = ProcessedEvents::new("by_hand")?;
    for _ in 0..2 {
        database
            .pool
            .execute(by_hand.ddl().as_str())
            .await
            .or_fail_with("the exported DDL")?;
    }
    by_hand.migrate(&database.pool).await?;
    let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM by_hand_version")
        .fetch_one(&database.pool)
        .await
        .or_fail()?;
    ensure!(count == 3, "{count} version rows");
    let locks: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM by_hand_locks")
        .fetch_one(&database.pool)
        .await
        .or_fail()?;
    ensure!(locks == 4096, "{locks} claim locks");
    let e = order("evt-1", 1, "o1");
    let outcome = by_hand
        .apply_once(&database.pool, &e, |_tx| {
            Box::pin(async { Ok::<_, sqlx::Error>(()) })
        })
        .await
        .map_err(|err| fail(err.to_string()))?;
    ensure!(outcome.is_applied(), "by hand: {outcome:?}");

    // The default table, through the free function.
    ProcessedEvents::default().migrate(&database.pool).await?;
    for expected in [true, false] {
        let outcome = apply_once(&database.pool, &e, |tx| {
            let e = &e;
            Box::pin(project(tx, e))
        })
        .await
        .map_err(|err| fail(err.to_string()))?;
        ensure!(
            outcome.is_applied() == expected,
            "default table: {outcome:?}"
        );
    }
    ensure!(
        db.applications("o1").await? == 1,
        "rows {:?}",
        db.rows().await?
    );
    Ok(())
});

db_test!(a_newer_table_is_refused, |db, _database| {
    sqlx::query("INSERT INTO processed_version (version, name) VALUES (?, 'from the future')")
        .bind(PROCESSED_EVENTS_VERSION + 1)
        .execute(&db.pool)
        .await
        .or_fail()?;
    match db.processed.migrate(&db.pool).await {
        Err(Error::Store {
            kind: StoreErrorKind::Schema,
            transient: false,
            message,
            ..
        }) if message.contains(&format!("version {}", PROCESSED_EVENTS_VERSION + 1)) => Ok(()),
        other => Err(fail(format!("expected a Schema error, got {other:?}"))),
    }
});

db_test!(long_values_are_rejected_by_name, |db, _database| {
    let mut e = order(&"x".repeat(256), 1, "o1");
    let outcome = db.apply_with(&e, async { Ok(()) }).await;
    ensure!(
        matches!(&outcome, Err(ApplyError::Store(Error::Store { kind: StoreErrorKind::Rejected, message, .. })) if message.contains("event id")),
        "{outcome:?}"
    );
    e.id = "evt-1".into();
    e.subject = "s".repeat(1025).into();
    let outcome = db.apply_with(&e, async { Ok(()) }).await;
    ensure!(
        matches!(&outcome, Err(ApplyError::Store(Error::Store { kind: StoreErrorKind::Rejected, message, .. })) if message.contains("subject")),
        "{outcome:?}"
    );
    e.subject = "s".repeat(1024).into();
    ensure!(
        db.apply(&e, "a subject of 1024 bytes").await?.is_applied(),
        "1024 bytes"
    );
    Ok(())
});

// A table built without `fenced_by` cannot check leases: a fenced delivery fails with
// `Unsupported` and its claim does not commit.
db_test!(
    a_table_without_fenced_by_cannot_check_leases,
    |db, _database| {
        let fence = Fence::new(key(), NODE_A, 1);
        let unfenced = ProcessedEvents::new("processed")?;
        let outcome = unfenced
            .apply_once_fenced(&db.pool, &order("evt-1", 1, "o1"), &fence, |_tx| {
                Box::pin(async { Ok::<_, sqlx::Error>(()) })
            })
            .await;
        ensure!(
            matches!(&outcome, Err(ApplyError::Store(Error::Unsupported { .. }))),
            "an unfenced table: {outcome:?}"
        );
        ensure!(
            !db.processed.is_processed(&db.pool, "evt-1").await?,
            "the unfenced claim committed"
        );
        Ok(())
    }
);

// The fence check is a shared lock on the key's row until the commit: a takeover that comes
// after the check waits for the transaction to end, so it is ordered after the commit.
db_test!(
    a_takeover_waits_for_a_fenced_commit_in_flight,
    |db, database| {
        let store = database.store(MySqlOptions::default()).await?;
        let k = key();
        let lease = store
            .acquire_lease(&k, NODE_A, TTL, T0)
            .await?
            .ok_or_else(|| fail("no lease for node A"))?;
        let fence = Fence::new(k.clone(), lease.owner.as_str(), lease.epoch);
        let e = order("evt-1", 1, "o1");
        let mut tx = ConsumerStore::begin(&db.processed, &db.pool).await?;
        ensure!(db.processed.claim(&mut tx, &e).await?, "not claimed");
        project(&mut tx, &e).await.or_fail()?;
        db.processed.check_fence(&mut tx, &fence).await?;
        let takeover = tokio::spawn({
            let (store, k) = (store.clone(), k.clone());
            async move { store.acquire_lease(&k, NODE_B, TTL, T0 + TTL + 1).await }
        });
        db.until_blocked("the takeover").await?;
        ConsumerStore::commit(&db.processed, tx).await?;
        let taken = takeover.await.or_fail()??;
        ensure!(
            taken.is_some_and(|l| l.owner == NODE_B && l.epoch == lease.epoch + 1),
            "the takeover failed"
        );
        ensure!(
            db.applications("o1").await? == 1,
            "rows {:?}",
            db.rows().await?
        );
        Ok(())
    }
);
