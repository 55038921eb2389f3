//! The idempotent consumer on real PostgreSQL: every failure window of `apply_once`.
//!
//! - crash before commit: nothing applied, the redelivery applies once;
//! - crash after commit, before the acknowledgement: redelivered, detected as a duplicate, the
//!   projection unchanged (through the real dispatcher);
//! - concurrent duplicate deliveries of one id: applied once;
//! - projection failure: the marker is rolled back with it;
//! - replay into an empty read model (an engine with a log, `Engine::replay`): rebuilt exactly.
//!
//! Each test runs in its own schema (`WATUKUY_TEST_POSTGRES_URL`; ignored while it is unset, see
//! docs/testing.md). "Crashes" drop the transaction's
//! future at the right point or inject a failure; nothing sleeps.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{OrFail, Schema, ensure, fail, with_schema};
use sqlx::{PgPool, Postgres, Row, Transaction};
use tokio::task::JoinHandle;
use watukuy_conformance::CaseError;
use watukuy_conformance::cases::fixtures::{
    CrashBeforeAck, NODE_A, PendingDelivery, T0, event, key,
};
use watukuy_conformance::world::{POLLER, StrategyKind, World, lock};
use watukuy_core::delivery::{ApplyError, ApplyOutcome};
use watukuy_core::{Engine, Event, EventType, HandlerContext, HandlerError, ManualClock};
use watukuy_store_postgres::{PostgresOptions, PostgresStore, ProcessedEvents};

/// The test's schema with the processed-events table `processed` and read models.
struct Db {
    pool: PgPool,
    schema: String,
    processed: ProcessedEvents,
}

impl Db {
    async fn new(schema: &Schema) -> Result<Self, CaseError> {
        let (pool, schema) = (schema.pool.clone(), schema.name.clone());
        let processed = ProcessedEvents::new(schema.as_str(), "processed")?
            .with_clock(Arc::new(ManualClock::new(T0)));
        processed.migrate(&pool).await?;
        let db = Self {
            pool,
            schema,
            processed,
        };
        db.create_read_model("rm").await?;
        Ok(db)
    }

    /// A read model table: one row per subject with its payload and how many times a
    /// projection touched it (so a double application shows).
    async fn create_read_model(&self, table: &str) -> Result<(), CaseError> {
        sqlx::query(&format!(
            r#"CREATE TABLE "{}"."{table}" (subject text PRIMARY KEY, value text, applications integer NOT NULL)"#,
            self.schema
        ))
        .execute(&self.pool)
        .await
        .or_fail_with("sql")?;
        Ok(())
    }

    async fn rows(&self, table: &str) -> Result<Vec<(String, Option<String>, i32)>, CaseError> {
        let rows = sqlx::query(&format!(
            r#"SELECT subject, value, applications FROM "{}"."{table}" ORDER BY subject"#,
            self.schema
        ))
        .fetch_all(&self.pool)
        .await
        .or_fail_with("sql")?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
            .collect::<Result<_, sqlx::Error>>()
            .or_fail_with("sql")
    }

    /// `apply_once` of `e` with the projection into `rm`; `what` names a failure.
    async fn apply(&self, e: &Event, what: &str) -> Result<ApplyOutcome<()>, CaseError> {
        self.processed
            .apply_once(&self.pool, e, |tx| {
                Box::pin(project(tx, &self.schema, "rm", e))
            })
            .await
            .map_err(|err| fail(format!("{what}: {err}")))
    }

    /// Spawns `apply_once` of `e` with the projection into `rm`, which runs `after_write` once
    /// it wrote, inside the still open transaction.
    fn spawn_apply(
        &self,
        e: &Event,
        after_write: impl Future<Output = ()> + Send + 'static,
    ) -> JoinHandle<Result<ApplyOutcome<()>, ApplyError<sqlx::Error>>> {
        let (pool, processed, schema, e) = (
            self.pool.clone(),
            self.processed.clone(),
            self.schema.clone(),
            e.clone(),
        );
        tokio::spawn(async move {
            processed
                .apply_once(&pool, &e, |tx| {
                    let (schema, e) = (&schema, &e);
                    Box::pin(async move {
                        project(tx, schema, "rm", e).await?;
                        after_write.await;
                        Ok::<_, sqlx::Error>(())
                    })
                })
                .await
        })
    }

    async fn markers(&self) -> Result<i64, CaseError> {
        sqlx::query_scalar(&format!(
            r#"SELECT count(*) FROM "{}"."processed""#,
            self.schema
        ))
        .fetch_one(&self.pool)
        .await
        .or_fail_with("sql")
    }
}

/// The projection: upsert (counting applications) or delete.
async fn project(
    tx: &mut Transaction<'_, Postgres>,
    schema: &str,
    table: &str,
    event: &Event,
) -> Result<(), sqlx::Error> {
    if event.event_type == EventType::Deleted {
        sqlx::query(&format!(
            r#"DELETE FROM "{schema}"."{table}" WHERE subject = $1"#
        ))
        .bind(event.subject.as_str())
        .execute(&mut **tx)
        .await?;
    } else {
        sqlx::query(&format!(
            r#"INSERT INTO "{schema}"."{table}" AS t (subject, value, applications) VALUES ($1, $2, 1)
               ON CONFLICT (subject) DO UPDATE SET value = excluded.value, applications = t.applications + 1"#
        ))
        .bind(event.subject.as_str())
        .bind(event.data.as_ref().map(|d| d.as_str().to_owned()))
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// A test `$name` running `$body` with `$db`, the [`Db`] of a schema of its own named after it.
macro_rules! db_test {
    ($name:ident, |$db:ident| $body:block) => {
        #[watukuy_testenv::requires(postgres, or_cfg(feature = "testcontainers"))]
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            with_schema(stringify!($name), 8, |schema| async move {
                let $db = Db::new(&schema).await?;
                $body
            })
            .await;
        }
    };
}

fn order(id: &str, subject: &str) -> Event {
    event(&key(), id, 1, subject)
}

db_test!(
    crash_before_commit_applies_nothing_and_the_redelivery_applies_once,
    |db| {
        let e = order("evt-1", "o1");

        // The projection writes, then the process "dies" before the commit: the task running
        // apply_once is aborted while the transaction is open.
        let (wrote_tx, wrote_rx) = tokio::sync::oneshot::channel::<()>();
        let task = db.spawn_apply(&e, async move {
            let _ = wrote_tx.send(());
            std::future::pending::<()>().await;
        });
        wrote_rx
            .await
            .map_err(|_| fail("the projection never ran"))?;
        task.abort();
        ensure!(
            task.await.is_err_and(|e| e.is_cancelled()),
            "the task was not cancelled"
        );
        ensure!(
            db.rows("rm").await?.is_empty(),
            "an uncommitted projection is visible"
        );
        ensure!(
            !db.processed.is_processed(&db.pool, "evt-1").await?,
            "an uncommitted marker is visible"
        );

        // The redelivery applies it (once the dropped transaction has rolled back) ...
        let outcome = db.apply(&e, "redelivery failed").await?;
        ensure!(
            outcome.is_applied(),
            "the redelivery was not applied: {outcome:?}"
        );
        // ... and a further one is a duplicate.
        let again = db.apply(&e, "second redelivery failed").await?;
        ensure!(
            again.is_deduplicated(),
            "the second redelivery applied again"
        );
        let rows = db.rows("rm").await?;
        ensure!(
            rows.len() == 1 && rows[0].2 == 1,
            "applied more than once: {rows:?}"
        );
        ensure!(db.markers().await? == 1, "expected one marker");
        Ok(())
    }
);

db_test!(
    crash_after_commit_before_ack_is_redelivered_and_detected_as_duplicate,
    |db| {
        // The real dispatcher over a PostgresStore in the same schema.
        let store = Arc::new(PostgresStore::from_pool(
            db.pool.clone(),
            PostgresOptions::default().schema(db.schema.as_str()),
        )?);
        let bench = PendingDelivery::new(store, order("evt-1", "o1")).await?;
        // The first attempt commits its projection, then "crashes" before the acknowledgement
        // (the handler fails after apply_once returned).
        let crash = CrashBeforeAck::default();
        bench.dispatcher.on({
            let (pool, processed, schema) =
                (db.pool.clone(), db.processed.clone(), db.schema.clone());
            let crash = crash.clone();
            move |event: Event, ctx: HandlerContext| {
                let (pool, processed, schema) = (pool.clone(), processed.clone(), schema.clone());
                let crash = crash.clone();
                async move {
                    let outcome = processed
                        .apply_once(&pool, &event, |tx| {
                            Box::pin(project(tx, &schema, "rm", &event))
                        })
                        .await?
                        .report(&ctx);
                    crash.after(outcome.is_applied())
                }
            }
        })?;
        let report = bench.drain().await?;
        ensure!(
            report.failed == 1 && report.delivered == 0,
            "first drain: {report:?}"
        );
        let after_first = db.rows("rm").await?;
        ensure!(
            after_first.len() == 1,
            "the first attempt's commit is missing"
        );

        // The retry is due after the backoff: the event is redelivered and found applied.
        bench.clock.advance(Duration::from_secs(60));
        let report = bench.drain().await?;
        ensure!(
            report.delivered == 1 && report.remaining == 0,
            "redelivery: {report:?}"
        );
        let seen = crash.applied();
        ensure!(
            seen == vec![true, false],
            "applied/deduplicated per attempt: {seen:?}"
        );
        ensure!(
            db.rows("rm").await? == after_first,
            "the duplicate changed the projection"
        );
        let counters = bench.dispatcher.counters("");
        ensure!(
            serde_json::to_value(counters).ok()
                == Some(
                    serde_json::json!({"received": 2, "applied": 0, "deduplicated": 1, "skipped": 0, "failed": 1})
                ),
            "counters: {counters:?}"
        );
        Ok(())
    }
);

db_test!(concurrent_duplicate_deliveries_apply_once, |db| {
    // Forced overlap: the first delivery holds its transaction open after claiming the id;
    // the second blocks on the claim until the first commits, then finds the marker.
    let e = order("evt-race", "o1");
    let (claimed_tx, claimed_rx) = tokio::sync::oneshot::channel::<()>();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let first = db.spawn_apply(&e, async move {
        let _ = claimed_tx.send(());
        let _ = go_rx.await;
    });
    claimed_rx
        .await
        .map_err(|_| fail("the first projection never ran"))?;
    let second = db.spawn_apply(&e, async {});
    // Wait until the second delivery is blocked on the first one's marker (a lock wait in
    // this schema), then let the first commit.
    let waiting_sql = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%\"{}\".\"processed\"%'",
        db.schema
    );
    let mut blocked = false;
    for _ in 0..100_000 {
        let waiting: i64 = sqlx::query_scalar(&waiting_sql)
            .fetch_one(&db.pool)
            .await
            .or_fail_with("sql")?;
        if waiting > 0 {
            blocked = true;
            break;
        }
        tokio::task::yield_now().await;
    }
    ensure!(blocked, "the second delivery never waited for the first");
    let _ = go_tx.send(());
    let first = first.await.or_fail()?;
    let second = second.await.or_fail()?;
    ensure!(
        matches!(first, Ok(ApplyOutcome::Applied(()))),
        "first: {first:?}"
    );
    ensure!(
        matches!(second, Ok(ApplyOutcome::Deduplicated)),
        "second: {second:?}"
    );

    // Free-for-all: 20 ids, 4 concurrent deliveries each.
    let mut tasks = Vec::new();
    for n in 0..20 {
        let e = order(&format!("evt-{n}"), &format!("s{n}"));
        for _ in 0..4 {
            tasks.push(db.spawn_apply(&e, async {}));
        }
    }
    let mut applied = 0;
    for task in tasks {
        match task.await.or_fail()? {
            Ok(outcome) => applied += usize::from(outcome.is_applied()),
            Err(err) => return Err(fail(format!("a delivery failed: {err}"))),
        }
    }
    ensure!(
        applied == 20,
        "{applied} deliveries applied, expected one per id"
    );
    let rows = db.rows("rm").await?;
    ensure!(rows.len() == 21, "rows: {}", rows.len());
    ensure!(
        rows.iter().all(|r| r.2 == 1),
        "a row was applied twice: {rows:?}"
    );
    ensure!(db.markers().await? == 21, "markers");
    Ok(())
});

db_test!(a_projection_failure_rolls_back_the_marker, |db| {
    let e = order("evt-1", "o1");
    let result = db
        .processed
        .apply_once(&db.pool, &e, |tx| {
            let (schema, e) = (&db.schema, &e);
            Box::pin(async move {
                project(tx, schema, "rm", e).await?;
                // A failing statement after a successful write.
                sqlx::query("SELECT 1/0").execute(&mut **tx).await?;
                Ok::<_, sqlx::Error>(())
            })
        })
        .await;
    ensure!(
        matches!(result, Err(ApplyError::Projection(_))),
        "expected a projection error, got {result:?}"
    );
    ensure!(
        db.rows("rm").await?.is_empty(),
        "the projection's first write survived"
    );
    ensure!(db.markers().await? == 0, "the marker survived the rollback");
    // A projection error keeps its classification on the way to the dispatcher.
    let permanent = db
        .processed
        .apply_once(&db.pool, &e, |_tx| {
            Box::pin(async { Err::<(), _>(HandlerError::permanent("unknown product")) })
        })
        .await;
    let handler_error = match permanent {
        Err(err) => HandlerError::from(err),
        Ok(outcome) => return Err(fail(format!("expected an error, got {outcome:?}"))),
    };
    ensure!(
        handler_error.kind() == &watukuy_core::HandlerErrorKind::Permanent,
        "classification lost: {handler_error:?}"
    );
    // The next delivery applies normally.
    let outcome = db.apply(&e, "the next delivery").await?;
    ensure!(outcome.is_applied(), "not applied after the failures");
    ensure!(db.markers().await? == 1, "markers");
    Ok(())
});

db_test!(
    markers_are_pruned_by_age_and_migrations_are_idempotent,
    |db| {
        let clock = ManualClock::new(T0);
        let processed = ProcessedEvents::new(db.schema.as_str(), "processed")?
            .with_clock(Arc::new(clock.clone()));
        // Concurrent migrations of an existing table are harmless.
        let (a, b) = tokio::join!(processed.migrate(&db.pool), processed.migrate(&db.pool));
        a?;
        b?;
        for n in 0..3 {
            let e = order(&format!("old-{n}"), &format!("o{n}"));
            let o = processed
                .apply_once(&db.pool, &e, |_tx| {
                    Box::pin(async { Ok::<_, sqlx::Error>(()) })
                })
                .await
                .map_err(|err| fail(err.to_string()))?;
            ensure!(o.is_applied(), "old-{n}");
        }
        clock.advance(Duration::from_secs(3_600));
        let e = order("new", "o9");
        let _ = processed
            .apply_once(&db.pool, &e, |_tx| {
                Box::pin(async { Ok::<_, sqlx::Error>(()) })
            })
            .await
            .map_err(|err| fail(err.to_string()))?;
        let pruned = processed
            .prune_older_than(&db.pool, Duration::from_secs(1_800))
            .await?;
        ensure!(pruned == 3, "pruned {pruned}");
        ensure!(
            processed.is_processed(&db.pool, "new").await?,
            "the new marker was pruned"
        );
        ensure!(
            !processed.is_processed(&db.pool, "old-0").await?,
            "an old marker survived"
        );
        Ok(())
    }
);

/// Where the replay test's handler projects: the read model table and its marker table.
#[derive(Clone)]
struct Target {
    table: String,
    processed: ProcessedEvents,
}

/// An engine (snapshot_diff poller with a log, on the database's store schema) over `items`
/// items, whose handler records every event it sees and projects it with `apply_once` into the
/// read model `rm` with the database's markers.
struct Projected {
    world: World,
    engine: Engine,
    target: Arc<Mutex<Target>>,
    seen: Arc<Mutex<Vec<Event>>>,
}

impl Projected {
    async fn new(db: &Db, items: usize) -> Result<Self, CaseError> {
        let store = Arc::new(PostgresStore::from_pool(
            db.pool.clone(),
            PostgresOptions::default().schema(db.schema.as_str()),
        )?);
        store.migrate().await?;
        let world = World::new(items, 10).or_fail()?;
        let poller = world
            .poller(StrategyKind::SnapshotDiff)
            .log(Duration::from_secs(86_400))
            .build()?;
        let engine: Engine = world.engine(store, NODE_A, poller, 7)?;
        let target = Arc::new(Mutex::new(Target {
            table: "rm".to_owned(),
            processed: db.processed.clone(),
        }));
        let seen = Arc::new(Mutex::new(Vec::new()));
        engine.on(POLLER, {
            let (pool, schema, target, seen) = (
                db.pool.clone(),
                db.schema.clone(),
                target.clone(),
                seen.clone(),
            );
            move |event: Event, ctx: HandlerContext| {
                let (pool, schema) = (pool.clone(), schema.clone());
                let Target { table, processed } = lock(&target).clone();
                lock(&seen).push(event.clone());
                async move {
                    processed
                        .apply_once(&pool, &event, |tx| {
                            Box::pin(project(tx, &schema, &table, &event))
                        })
                        .await?
                        .report(&ctx);
                    Ok::<(), HandlerError>(())
                }
            }
        })?;
        Ok(Self {
            world,
            engine,
            target,
            seen,
        })
    }

    /// Projects into a new, empty read model `rm_rebuilt` with its own marker table from now on.
    async fn rebuild_into_a_new_model(&self, db: &Db) -> Result<(), CaseError> {
        db.create_read_model("rm_rebuilt").await?;
        let markers = ProcessedEvents::new(db.schema.as_str(), "processed_rebuilt")?;
        markers.migrate(&db.pool).await?;
        *lock(&self.target) = Target {
            table: "rm_rebuilt".to_owned(),
            processed: markers,
        };
        Ok(())
    }
}

db_test!(replay_into_an_empty_read_model_rebuilds_it_exactly, |db| {
    let fixture = Projected::new(&db, 5).await?;
    let (world, engine) = (&fixture.world, &fixture.engine);

    // History: creates, updates and a delete, one poll each.
    world.tick(engine).await?;
    world.advance(Duration::from_secs(30));
    world
        .api
        .update("item-002", serde_json::json!({ "value": 20 }))
        .or_fail()?;
    world
        .api
        .update("item-004", serde_json::json!({ "name": "four" }))
        .or_fail()?;
    world.tick(engine).await?;
    world.advance(Duration::from_secs(30));
    ensure!(world.api.remove("item-003"), "item-003 missing");
    world
        .api
        .update("item-002", serde_json::json!({ "value": 21 }))
        .or_fail()?;
    world.tick(engine).await?;
    let live = db.rows("rm").await?;
    ensure!(live.len() == 4, "live read model: {live:?}");
    ensure!(
        live.iter().any(|r| r.0 == "item-002" && r.2 == 3),
        "item-002 should carry three applications: {live:?}"
    );

    // A new, empty read model with its own marker table; replay the whole log into it.
    fixture.rebuild_into_a_new_model(&db).await?;
    let replayed = engine.replay(POLLER, None, 0, None).await?;
    ensure!(
        replayed == 9,
        "replayed {replayed} events, expected 5 + 2 + 2"
    );
    let result = world.tick(engine).await?;
    ensure!(result.delivered == 9, "delivered {}", result.delivered);
    ensure!(
        db.rows("rm_rebuilt").await? == live,
        "the rebuilt read model differs"
    );

    // Replaying again into the rebuilt model leaves it as it is. Every event is a duplicate
    // but item-003's create and delete: a replayed `created` after its subject's `deleted`
    // is applied again (it could be a re-create with the same id), then its delete.
    let before = engine.inspect().await?.pollers[0].delivery;
    engine.replay(POLLER, None, 0, None).await?;
    world.tick(engine).await?;
    ensure!(
        db.rows("rm_rebuilt").await? == live,
        "a second replay changed the model"
    );
    let after = engine.inspect().await?.pollers[0].delivery;
    ensure!(
        after.deduplicated == before.deduplicated + 7 && after.applied == before.applied + 2,
        "counters before {before:?} after {after:?}"
    );
    ensure!(
        after.applied == 20 && after.failed == 0,
        "counters: {after:?}"
    );
    Ok(())
});

// A delete and a re-create with identical content: the engine gives the re-create the
// original `created` id, and a second delete the first one's `deleted` id. `apply_once`
// applies each of them anyway, because another event of the subject was applied since the id
// was: the item ends present after every re-create and absent after every delete, live and in
// a read model rebuilt from the log.
db_test!(
    a_delete_then_a_re_create_with_identical_content_ends_with_the_item_present,
    |db| {
        let fixture = Projected::new(&db, 3).await?;
        let Projected {
            world,
            engine,
            seen,
            ..
        } = &fixture;
        let present =
            |rows: Vec<(String, Option<String>, i32)>| rows.iter().any(|r| r.0 == "item-002");

        world.tick(engine).await?;
        let Some(original) = world.api.get("item-002") else {
            return Err(fail("item-002 is not in the API"));
        };
        ensure!(present(db.rows("rm").await?), "item-002 was not created");
        for round in 1..=2 {
            ensure!(world.api.remove("item-002"), "item-002 missing");
            // A missing item is reported deleted by the second listing that misses it.
            for _ in 0..2 {
                world.advance(Duration::from_secs(60));
                world.tick(engine).await?;
            }
            ensure!(
                !present(db.rows("rm").await?),
                "round {round}: the delete was not applied"
            );
            world.api.seed([original.clone()]).or_fail()?;
            world.advance(Duration::from_secs(60));
            world.tick(engine).await?;
            ensure!(
                present(db.rows("rm").await?),
                "round {round}: the re-create was dropped"
            );
        }
        let seen = lock(seen).clone();
        let of_item = |kind| {
            seen.iter()
                .filter(move |e| e.subject == "item-002" && e.event_type == kind)
        };
        let ids = |kind| of_item(kind).map(|e| e.id.clone()).collect::<Vec<_>>();
        let (created, deleted) = (ids(EventType::Created), ids(EventType::Deleted));
        ensure!(
            created.len() == 3
                && deleted.len() == 2
                && created.iter().all(|id| *id == created[0])
                && deleted[0] == deleted[1],
            "the scenario needs repeated ids: created {created:?}, deleted {deleted:?}"
        );

        // The same history replayed into an empty read model: the item ends present there too.
        let live = db.rows("rm").await?;
        fixture.rebuild_into_a_new_model(&db).await?;
        let replayed = engine.replay(POLLER, None, 0, None).await?;
        ensure!(replayed == 3 + 4, "replayed {replayed}");
        world.tick(engine).await?;
        ensure!(
            db.rows("rm_rebuilt").await? == live,
            "the rebuilt read model differs"
        );
        Ok(())
    }
);
