//! The idempotent consumer on real MySQL / MariaDB: every failure window of `apply_once`.
//!
//! - crash before commit: nothing applied, the redelivery applies once;
//! - projection failure: the marker is rolled back with it;
//! - overlapping deliveries of one id, the second blocked on the first (seen in
//!   `SHOW ENGINE INNODB STATUS`): applied once, for a subject with an earlier applied event
//!   and without, and applied by the second when the first rolls back; also from a
//!   `REPEATABLE READ` transaction of the caller's own whose snapshot predates the first's commit;
//! - late redeliveries and repeated ids of new changes;
//! - markers pruned by age, migrations concurrent, idempotent, from the exported DDL, a newer
//!   table refused;
//! - the fence: the current lease commits, a lease another owner took fails with `LeaseLost`,
//!   and a takeover waits for a fenced commit in flight.
//!
//! Each test runs in a database of its own (`WATUKUY_TEST_MYSQL_URL`; ignored while it is unset,
//! see docs/testing.md). "Crashes" drop the transaction's future at the right point or inject a
//! failure; time is a manual clock; nothing sleeps.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Database, OrFail, ensure, fail, with_database};
use sqlx::{Executor, MySql, MySqlPool, Transaction};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use watukuy_conformance::CaseError;
use watukuy_conformance::cases::fixtures::{NODE_A, NODE_B, T0, TTL, event, key};
use watukuy_core::delivery::{ApplyError, ApplyOutcome, ConsumerStore, Fence};
use watukuy_core::{
    BoxError, Clock, Error, Event, EventType, Lane, ManualClock, Store, StoreErrorKind,
};
use watukuy_store_mysql::{MySqlOptions, PROCESSED_EVENTS_VERSION, ProcessedEvents, apply_once};

/// What one delivery gave.
type Applied = Result<ApplyOutcome<()>, ApplyError<BoxError>>;

/// A read model row: subject, value, applications.
type Row = (String, Option<String>, i32);

/// The test's database with the processed-events table `processed` (fenced by the default
/// store options, stamped by `clock`) and the read model `rm`.
#[derive(Clone)]
struct Db {
    pool: MySqlPool,
    name: String,
    processed: ProcessedEvents,
    clock: ManualClock,
}

impl Db {
    async fn new(database: &Database) -> Result<Self, CaseError> {
        let clock = ManualClock::new(T0);
        let processed = ProcessedEvents::new("processed")?
            .with_clock(Arc::new(clock.clone()))
            .fenced_by(&MySqlOptions::default())?;
        processed.migrate(&database.pool).await?;
        let db = Self {
            pool: database.pool.clone(),
            name: database.name.clone(),
            processed,
            clock,
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

    /// `apply_once` of `e` (fenced by `fence` when given) with the projection into `rm`, which
    /// awaits `after_write` once it wrote, inside the still open transaction.
    async fn apply_with(
        &self,
        e: &Event,
        fence: Option<&Fence>,
        after_write: impl Future<Output = Result<(), BoxError>> + Send + 'static,
    ) -> Applied {
        match fence {
            Some(fence) => {
                self.processed
                    .apply_once_fenced(&self.pool, e, fence, |tx| {
                        Box::pin(async move {
                            project(tx, e).await?;
                            after_write.await
                        })
                    })
                    .await
            }
            None => {
                self.processed
                    .apply_once(&self.pool, e, |tx| {
                        Box::pin(async move {
                            project(tx, e).await?;
                            after_write.await
                        })
                    })
                    .await
            }
        }
    }

    /// `apply_once` of `e`, unfenced; `what` names a failure.
    async fn apply(&self, e: &Event, what: &str) -> Result<ApplyOutcome<()>, CaseError> {
        self.apply_with(e, None, async { Ok(()) })
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
            db.apply_with(&e, None, async move {
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
        tokio::spawn(async move { db.apply_with(&e, None, async { Ok(()) }).await })
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

/// The projection: a `deleted` event deletes its subject's row; any other upserts it with the
/// event's data, counting applications.
async fn project(tx: &mut Transaction<'_, MySql>, event: &Event) -> Result<(), sqlx::Error> {
    if event.event_type == EventType::Deleted {
        sqlx::query("DELETE FROM rm WHERE subject = ?")
            .bind(event.subject.as_str())
            .execute(&mut **tx)
            .await?;
    } else {
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
    }
    Ok(())
}

/// A `created` event of `subject` with `id` and `sequence` on `key()`.
fn order(id: &str, sequence: i64, subject: &str) -> Event {
    event(&key(), id, sequence, subject)
}

/// `e` as a `deleted` event.
fn deleted(mut e: Event) -> Event {
    e.event_type = EventType::Deleted;
    e.data = None;
    e
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

db_test!(
    crash_before_commit_applies_nothing_and_the_redelivery_applies_once,
    |db, _database| {
        let e = order("evt-1", 1, "o1");
        // The projection writes, then the process "dies" before the commit: the task running
        // apply_once is aborted while the transaction is open.
        let (task, wrote, _go) = db.spawn_held(&e);
        wrote.await.map_err(|_| fail("the projection never ran"))?;
        task.abort();
        ensure!(
            task.await.is_err_and(|e| e.is_cancelled()),
            "the task was not cancelled"
        );
        ensure!(
            db.rows().await?.is_empty(),
            "an uncommitted projection is visible"
        );
        ensure!(
            !db.processed.is_processed(&db.pool, "evt-1").await?,
            "an uncommitted marker is visible"
        );
        // The redelivery applies it (once the dropped transaction has rolled back) ...
        let outcome = db.apply(&e, "the redelivery").await?;
        ensure!(
            outcome.is_applied(),
            "the redelivery was not applied: {outcome:?}"
        );
        // ... and a further one is a duplicate.
        let again = db.apply(&e, "the second redelivery").await?;
        ensure!(
            again.is_deduplicated(),
            "the second redelivery applied again"
        );
        ensure!(
            db.applications("o1").await? == 1,
            "rows: {:?}",
            db.rows().await?
        );
        ensure!(db.markers().await? == 1, "expected one marker");
        Ok(())
    }
);

db_test!(
    a_projection_failure_rolls_back_the_marker,
    |db, _database| {
        let e = order("evt-1", 1, "o1");
        let result = db
            .processed
            .apply_once(&db.pool, &e, |tx| {
                let e = &e;
                Box::pin(async move {
                    project(tx, e).await?;
                    // A failing statement after a successful write.
                    sqlx::query("SELECT * FROM no_such_table")
                        .execute(&mut **tx)
                        .await?;
                    Ok::<_, sqlx::Error>(())
                })
            })
            .await;
        ensure!(
            matches!(result, Err(ApplyError::Projection(_))),
            "expected a projection error, got {result:?}"
        );
        ensure!(
            db.rows().await?.is_empty(),
            "the projection's first write survived"
        );
        ensure!(db.markers().await? == 0, "the marker survived the rollback");
        let subjects: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM processed_subjects")
            .fetch_one(&db.pool)
            .await
            .or_fail()?;
        ensure!(subjects == 0, "the subject's record survived the rollback");
        // A projection error keeps its classification on the way to the dispatcher.
        let permanent = db
            .processed
            .apply_once(&db.pool, &e, |_tx| {
                Box::pin(async {
                    Err::<(), _>(watukuy_core::HandlerError::permanent("unknown product"))
                })
            })
            .await;
        let handler_error = match permanent {
            Err(err) => watukuy_core::HandlerError::from(err),
            Ok(outcome) => return Err(fail(format!("expected an error, got {outcome:?}"))),
        };
        ensure!(
            handler_error.kind() == &watukuy_core::HandlerErrorKind::Permanent,
            "classification lost: {handler_error:?}"
        );
        // The next delivery applies normally.
        ensure!(
            db.apply(&e, "the next delivery").await?.is_applied(),
            "not applied after the failures"
        );
        ensure!(db.markers().await? == 1, "markers");
        Ok(())
    }
);

// Two overlapping deliveries of one id: the second is blocked on the first (a lock wait of this
// database in SHOW ENGINE INNODB STATUS) before the first commits, then finds it applied.
// The important case is a subject that already had an applied event: a claim that re-read the
// subject in its own snapshot would see that earlier event, take the id for a new change and
// apply it twice.
db_test!(
    overlapping_deliveries_of_one_id_apply_once,
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
            let (first, wrote, go) = db.spawn_held(&e);
            wrote
                .await
                .map_err(|_| fail("the first projection never ran"))?;
            let second = db.spawn_apply(&e);
            db.until_blocked(what).await?;
            let _ = go.send(Ok(()));
            let (first, second) = (joined(first).await?, joined(second).await?);
            ensure!(
                matches!(first, Ok(ApplyOutcome::Applied(()))),
                "{what}: first: {first:?}"
            );
            ensure!(
                matches!(second, Ok(ApplyOutcome::Deduplicated)),
                "{what}: the second delivery applied again: {second:?}"
            );
            ensure!(
                db.applications(&e.subject).await? == expected,
                "{what}: rows {:?}",
                db.rows().await?
            );
        }
        // Free-for-all: 10 ids, 4 concurrent deliveries each.
        let mut tasks = Vec::new();
        for n in 0..10 {
            let e = order(&format!("evt-many-{n}"), 1, &format!("m{n}"));
            for _ in 0..4 {
                tasks.push(db.spawn_apply(&e));
            }
        }
        let mut applied = 0;
        for task in tasks {
            match joined(task).await? {
                Ok(outcome) => applied += usize::from(outcome.is_applied()),
                Err(err) => return Err(fail(format!("a delivery failed: {err}"))),
            }
        }
        ensure!(
            applied == 10,
            "{applied} deliveries applied, expected one per id"
        );
        let rows = db.rows().await?;
        ensure!(
            rows.iter().all(|r| r.0 == "o1" || r.2 == 1),
            "a row was applied twice: {rows:?}"
        );
        ensure!(db.markers().await? == 13, "markers");
        Ok(())
    }
);

db_test!(
    an_overlapping_delivery_applies_after_the_first_rolled_back,
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

// A copy of an applied event delivered after later events of its subject is a duplicate; an id
// that comes back with a higher sequence after its subject moved on (a re-create after a
// delete with the same content) is a new change, applied again.
db_test!(
    late_redeliveries_are_duplicates_and_repeated_ids_of_new_changes_apply,
    |db, _database| {
        let history = [
            order("evt-0", 1, "o1"),
            order("evt-1", 2, "o1"),
            order("evt-2", 3, "o1"),
        ];
        for e in &history {
            ensure!(db.apply(e, "history").await?.is_applied(), "{}", e.id);
        }
        for late in &history[..2] {
            ensure!(
                db.apply(late, "a late copy").await?.is_deduplicated(),
                "the late copy of {} applied again",
                late.id
            );
        }
        ensure!(
            db.applications("o1").await? == 3,
            "rows {:?}",
            db.rows().await?
        );

        let created = |seq| order("evt-created", seq, "o2");
        let removed = |seq| deleted(order("evt-deleted", seq, "o2"));
        let present = |rows: Vec<Row>| rows.iter().any(|r| r.0 == "o2");
        let mut seq = 10;
        for round in 1..=2 {
            seq += 1;
            ensure!(
                db.apply(&created(seq), "a create").await?.is_applied(),
                "round {round}: the create was not applied"
            );
            ensure!(
                present(db.rows().await?),
                "round {round}: absent after create"
            );
            ensure!(
                db.apply(&created(seq), "a copy").await?.is_deduplicated(),
                "round {round}: a copy of the create applied again"
            );
            seq += 1;
            ensure!(
                db.apply(&removed(seq), "a delete").await?.is_applied(),
                "round {round}: the delete was not applied"
            );
            ensure!(
                !present(db.rows().await?),
                "round {round}: present after delete"
            );
        }
        // A third re-create, delivered twice at once: applied once.
        let e = created(seq + 1);
        let (first, wrote, go) = db.spawn_held(&e);
        wrote
            .await
            .map_err(|_| fail("the first projection never ran"))?;
        let second = db.spawn_apply(&e);
        db.until_blocked("a repeated re-create").await?;
        let _ = go.send(Ok(()));
        let (first, second) = (joined(first).await?, joined(second).await?);
        ensure!(
            matches!(first, Ok(ApplyOutcome::Applied(())))
                && matches!(second, Ok(ApplyOutcome::Deduplicated)),
            "first {first:?}, second {second:?}"
        );
        ensure!(
            db.applications("o2").await? == 1,
            "rows {:?}",
            db.rows().await?
        );
        // On the replay lane a repeated `updated` id is a duplicate.
        let mut replayed = order("evt-0", 1, "o1");
        replayed.lane = Lane::Replay;
        replayed.sequence = 99;
        ensure!(
            db.apply(&replayed, "a replay").await?.is_deduplicated(),
            "a replayed update applied again"
        );
        ensure!(db.markers().await? == 5, "markers");
        Ok(())
    }
);

db_test!(markers_are_pruned_by_age, |db, _database| {
    for n in 0..3 {
        let e = order(&format!("old-{n}"), 1, &format!("o{n}"));
        ensure!(db.apply(&e, "an old event").await?.is_applied(), "old-{n}");
    }
    db.clock.advance(Duration::from_secs(3_600));
    ensure!(
        db.apply(&order("new", 1, "o9"), "a new event")
            .await?
            .is_applied(),
        "new"
    );
    // A later event of o0 keeps its subject's record.
    ensure!(
        db.apply(&order("old-0-later", 2, "o0"), "a later event")
            .await?
            .is_applied(),
        "old-0-later"
    );
    let pruned = db
        .processed
        .prune_older_than(&db.pool, Duration::from_secs(1_800))
        .await?;
    ensure!(pruned == 3, "pruned {pruned}");
    ensure!(
        db.processed.is_processed(&db.pool, "new").await?,
        "the new marker was pruned"
    );
    ensure!(
        !db.processed.is_processed(&db.pool, "old-0").await?,
        "an old marker survived"
    );
    let subjects: Vec<Vec<u8>> =
        sqlx::query_scalar("SELECT subject FROM processed_subjects ORDER BY subject")
            .fetch_all(&db.pool)
            .await
            .or_fail()?;
    ensure!(
        subjects == [b"o0".to_vec(), b"o9".to_vec()],
        "subjects kept: {subjects:?}"
    );
    // Through the trait, with an explicit cut: nothing older is left.
    let cut = db.clock.now_ms() - 1_800_000;
    ensure!(
        ConsumerStore::prune(&db.processed, &db.pool, cut).await? == 0,
        "pruned again"
    );
    Ok(())
});

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
    let outcome = db.apply_with(&e, None, async { Ok(()) }).await;
    ensure!(
        matches!(&outcome, Err(ApplyError::Store(Error::Store { kind: StoreErrorKind::Rejected, message, .. })) if message.contains("event id")),
        "{outcome:?}"
    );
    e.id = "evt-1".into();
    e.subject = "s".repeat(1025).into();
    let outcome = db.apply_with(&e, None, async { Ok(()) }).await;
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

// The fence: the engine store (same database) leases the key to node A; A's fenced delivery
// commits. Node B takes the expired lease; A's next fenced delivery commits nothing and fails
// with LeaseLost; B's applies. A table built without `fenced_by` cannot check leases.
db_test!(
    the_fence_holds_for_the_current_lease_only,
    |db, database| {
        let store = database.store(MySqlOptions::default()).await?;
        let k = key();
        let old = store
            .acquire_lease(&k, NODE_A, TTL, T0)
            .await?
            .ok_or_else(|| fail("no lease for node A"))?;
        let old_fence = Fence::new(k.clone(), old.owner.as_str(), old.epoch);
        let first = db
            .apply_with(&order("evt-1", 1, "o1"), Some(&old_fence), async { Ok(()) })
            .await;
        ensure!(
            matches!(first, Ok(ApplyOutcome::Applied(()))),
            "the holder's delivery: {first:?}"
        );

        let new = store
            .acquire_lease(&k, NODE_B, TTL, T0 + TTL + 1)
            .await?
            .ok_or_else(|| fail("node B could not take the expired lease"))?;
        let new_fence = Fence::new(k.clone(), new.owner.as_str(), new.epoch);
        let e = order("evt-2", 2, "o2");
        let late = db.apply_with(&e, Some(&old_fence), async { Ok(()) }).await;
        ensure!(
            matches!(&late, Err(ApplyError::Store(Error::LeaseLost { epoch, .. })) if *epoch == old.epoch),
            "the stale instance's delivery: {late:?}"
        );
        ensure!(
            db.applications("o2").await? == 0,
            "the stale projection committed"
        );
        ensure!(db.markers().await? == 1, "the stale marker committed");
        let outcome = db.apply_with(&e, Some(&new_fence), async { Ok(()) }).await;
        ensure!(
            matches!(outcome, Ok(ApplyOutcome::Applied(()))),
            "the new holder's delivery: {outcome:?}"
        );

        let unfenced = ProcessedEvents::new("processed")?;
        let outcome = unfenced
            .apply_once_fenced(&db.pool, &order("evt-3", 3, "o3"), &new_fence, |_tx| {
                Box::pin(async { Ok::<_, sqlx::Error>(()) })
            })
            .await;
        ensure!(
            matches!(&outcome, Err(ApplyError::Store(Error::Unsupported { .. }))),
            "an unfenced table: {outcome:?}"
        );
        ensure!(
            !db.processed.is_processed(&db.pool, "evt-3").await?,
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
