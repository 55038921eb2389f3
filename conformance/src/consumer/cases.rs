//! The consumer cases: each is a plain `pub async fn` over a fresh [`ConsumerDb`], named in
//! [`for_each_consumer_case!`](crate::for_each_consumer_case).
//!
//! Overlaps are real: two deliveries run as two tasks on two connections, and a case lets the
//! first commit only after [`ConsumerDb::waiting`] saw the second blocked on it. Crashes drop a
//! transaction's future at a chosen point; nothing sleeps.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use watukuy_core::delivery::{self, ApplyError, ApplyOutcome, ConsumerStore, Fence};
use watukuy_core::{
    BoxError, Engine, Error, Event, EventType, HandlerContext, HandlerError, Lane, clock::Clock,
    delivery::HandlerErrorKind,
};

use super::harness::{ConsumerDb, ModelRow};
use crate::cases::fixtures::{
    CrashBeforeAck, NODE_A, NODE_B, PendingDelivery, T0, TTL, acquire, event, key,
};
use crate::harness::{CaseError, CaseResult, OrFail};
use crate::{check, check_eq};
use watukuy_testkit::world::{POLLER, StrategyKind, World, lock};

/// What one delivery through `apply_once` gave.
type Applied = Result<ApplyOutcome<()>, ApplyError<BoxError>>;

/// A `created` event of `subject` with `id` and `sequence` on the suite's key.
fn order(id: &str, sequence: i64, subject: &str) -> Event {
    event(&key(), id, sequence, subject)
}

/// `e` as a `deleted` event.
fn deleted(mut e: Event) -> Event {
    e.event_type = EventType::Deleted;
    e.data = None;
    e
}

/// Delivers `e` on instance `instance` with the suite's projection; `after_write` runs inside
/// the still open transaction once the projection wrote.
async fn apply_with<D, W>(
    db: &Arc<D>,
    instance: usize,
    e: &Event,
    fence: Option<&Fence>,
    after_write: W,
) -> Applied
where
    D: ConsumerDb,
    W: Future<Output = Result<(), BoxError>> + Send + 'static,
{
    let (projector, event) = (Arc::clone(db), e.clone());
    delivery::apply_once(db.consumer(), db.conn(instance), e, fence, move |tx| {
        Box::pin(async move {
            projector.project(tx, &event).await?;
            after_write.await
        })
    })
    .await
}

/// Delivers `e` on instance 0, unfenced.
async fn apply<D: ConsumerDb>(db: &Arc<D>, e: &Event) -> Applied {
    apply_with(db, 0, e, None, async { Ok(()) }).await
}

/// [`apply`], failing the case on an error; `what` names the delivery.
async fn applied<D: ConsumerDb>(
    db: &Arc<D>,
    e: &Event,
    what: &str,
) -> Result<ApplyOutcome<()>, CaseError> {
    apply(db, e)
        .await
        .map_err(|err| CaseError::failed(format!("{what}: {err}")))
}

/// Spawns a delivery of `e` on `instance` whose projection, once it wrote, says so and waits
/// for the returned sender: `Ok(())` commits, `Err(())` fails the projection (a rollback).
#[allow(clippy::type_complexity)]
fn spawn_held<D: ConsumerDb>(
    db: &Arc<D>,
    instance: usize,
    e: &Event,
    fence: Option<Fence>,
) -> (
    JoinHandle<Applied>,
    oneshot::Receiver<()>,
    oneshot::Sender<Result<(), ()>>,
) {
    let (wrote_tx, wrote_rx) = oneshot::channel::<()>();
    let (go_tx, go_rx) = oneshot::channel::<Result<(), ()>>();
    let (db, e) = (Arc::clone(db), e.clone());
    let task = tokio::spawn(async move {
        apply_with(&db, instance, &e, fence.as_ref(), async move {
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

/// Spawns a plain delivery of `e` on `instance`.
fn spawn_apply<D: ConsumerDb>(db: &Arc<D>, instance: usize, e: &Event) -> JoinHandle<Applied> {
    let (db, e) = (Arc::clone(db), e.clone());
    tokio::spawn(async move { apply_with(&db, instance, &e, None, async { Ok(()) }).await })
}

/// Waits until some transaction of `db` is blocked on another's lock.
async fn until_blocked<D: ConsumerDb>(db: &D, what: &str) -> CaseResult {
    for _ in 0..200_000 {
        if db.waiting().await? {
            return Ok(());
        }
        tokio::task::yield_now().await;
    }
    Err(CaseError::failed(format!(
        "{what}: the second delivery never waited for the first"
    )))
}

/// Two overlapping deliveries of `e`: the first (instance 0) claims and writes, the second
/// (instance 1) starts and is seen blocked on it, then the first commits (`first_commits`) or
/// rolls back. Returns both outcomes.
async fn overlap<D: ConsumerDb>(
    db: &Arc<D>,
    what: &str,
    e: &Event,
    first_commits: bool,
) -> Result<(Applied, Applied), CaseError> {
    let (first, wrote, go) = spawn_held(db, 0, e, None);
    wrote
        .await
        .map_err(|_| CaseError::failed(format!("{what}: the first projection never ran")))?;
    let second = spawn_apply(db, 1, e);
    until_blocked(&**db, what).await?;
    let _ = go.send(if first_commits { Ok(()) } else { Err(()) });
    Ok((joined(first).await?, joined(second).await?))
}

/// Applies an earlier event of subject `o1`, then returns the two overlap scenarios: an event
/// of `o1` (after the earlier one) and one of a fresh subject `o9`, each with the applications
/// its subject has once it applied.
async fn with_and_without_an_earlier_event<D: ConsumerDb>(
    db: &Arc<D>,
) -> Result<[(&'static str, Event, i64); 2], CaseError> {
    check!(
        applied(db, &order("evt-0", 1, "o1"), "the earlier event")
            .await?
            .is_applied()
    );
    Ok([
        ("after an earlier event", order("evt-1", 2, "o1"), 2),
        ("of a fresh subject", order("evt-9", 1, "o9"), 1),
    ])
}

/// The task's outcome, failing the case on a panic or a cancellation.
async fn joined(task: JoinHandle<Applied>) -> Result<Applied, CaseError> {
    task.await.or_fail_with("a delivery task")
}

/// The read model's row of `subject`.
async fn row_of<D: ConsumerDb>(db: &D, subject: &str) -> Result<Option<ModelRow>, CaseError> {
    Ok(db.rows().await?.into_iter().find(|r| r.0 == subject))
}

/// How many times the projection touched `subject` (0 when it has no row).
async fn applications<D: ConsumerDb>(db: &D, subject: &str) -> Result<i64, CaseError> {
    Ok(row_of(db, subject).await?.map_or(0, |r| r.2))
}

/// Rule 1: a crash between the projection's write and the commit leaves nothing; the
/// redelivery applies once and a further one is a duplicate.
pub async fn a_crash_before_the_commit_applies_nothing<D: ConsumerDb>(db: Arc<D>) -> CaseResult {
    let e = order("evt-1", 1, "o1");
    let (task, wrote, _go) = spawn_held(&db, 0, &e, None);
    wrote
        .await
        .map_err(|_| CaseError::failed("the projection never ran"))?;
    task.abort();
    check!(
        task.await.is_err_and(|e| e.is_cancelled()),
        "the task was not cancelled"
    );
    check!(
        db.rows().await?.is_empty(),
        "an uncommitted projection is visible"
    );
    check!(
        !db.consumer().is_processed(db.conn(1), "evt-1").await?,
        "an uncommitted marker is visible"
    );
    let outcome = applied(&db, &e, "the redelivery").await?;
    check!(outcome.is_applied(), "the redelivery was not applied");
    let again = applied(&db, &e, "the second redelivery").await?;
    check!(
        again.is_deduplicated(),
        "the second redelivery applied again"
    );
    check_eq!(applications(&*db, "o1").await?, 1);
    check_eq!(db.markers().await?, 1);
    Ok(())
}

/// Rules 1 and 2 through the real dispatcher: the first attempt commits its projection, then
/// fails before the acknowledgement; the redelivery finds it applied and changes nothing. The
/// handler applies fenced by its delivery's lease (rule 5, the lease held).
pub async fn a_redelivery_after_the_commit_is_a_duplicate<D: ConsumerDb>(db: Arc<D>) -> CaseResult {
    let bench = PendingDelivery::new(db.engine_store(), order("evt-1", 1, "o1")).await?;
    let crash = CrashBeforeAck::default();
    bench.dispatcher.on({
        let (db, crash) = (Arc::clone(&db), crash.clone());
        move |event: Event, ctx: HandlerContext| {
            let (db, crash) = (Arc::clone(&db), crash.clone());
            async move {
                let fence = ctx.fence().cloned();
                let outcome = apply_with(&db, 0, &event, fence.as_ref(), async { Ok(()) })
                    .await
                    .map_err(|e| HandlerError::transient(e.to_string()))?
                    .report(&ctx);
                crash.after(outcome.is_applied())
            }
        }
    })?;
    let report = bench.drain().await?;
    check!(
        report.failed == 1 && report.delivered == 0,
        "first drain: {report:?}"
    );
    let after_first = db.rows().await?;
    check_eq!(
        after_first.len(),
        1,
        "the first attempt's commit is missing"
    );
    bench.clock.advance(Duration::from_secs(60));
    let report = bench.drain().await?;
    check!(
        report.delivered == 1 && report.remaining == 0,
        "redelivery: {report:?}"
    );
    check_eq!(crash.applied(), vec![true, false], "applied per attempt");
    check_eq!(
        db.rows().await?,
        after_first,
        "the duplicate changed the projection"
    );
    let counters = bench.dispatcher.counters("");
    check!(
        counters.deduplicated == 1 && counters.failed == 1,
        "counters: {counters:?}"
    );
    Ok(())
}

/// Rule 3: two overlapping deliveries of one event, the second blocked on the first's claim
/// until it commits, apply once: for a fresh subject, and for a subject that already had an
/// applied event (which a claim deciding on its own stale snapshot applies twice).
pub async fn overlapping_deliveries_apply_once<D: ConsumerDb>(db: Arc<D>) -> CaseResult {
    for (what, e, expected) in with_and_without_an_earlier_event(&db).await? {
        let (first, second) = overlap(&db, what, &e, true).await?;
        check!(
            matches!(first, Ok(ApplyOutcome::Applied(()))),
            "{what}: first: {first:?}"
        );
        check!(
            matches!(second, Ok(ApplyOutcome::Deduplicated)),
            "{what}: the second delivery applied again: {second:?}"
        );
        check_eq!(
            applications(&*db, &e.subject).await?,
            expected,
            "{what}: applications"
        );
    }
    // Free-for-all: 10 ids, 4 concurrent deliveries each, over both connections.
    let mut tasks = Vec::new();
    for n in 0..10 {
        let e = order(&format!("evt-many-{n}"), 1, &format!("m{n}"));
        for copy in 0..4 {
            tasks.push(spawn_apply(&db, copy % 2, &e));
        }
    }
    let mut count = 0;
    for task in tasks {
        match joined(task).await? {
            Ok(outcome) => count += usize::from(outcome.is_applied()),
            Err(err) => return Err(CaseError::failed(format!("a delivery failed: {err}"))),
        }
    }
    check_eq!(count, 10, "deliveries applied, expected one per id");
    check!(
        db.rows().await?.iter().all(|r| r.0 == "o1" || r.2 == 1),
        "a row was applied twice: {:?}",
        db.rows().await?
    );
    check_eq!(db.markers().await?, 13);
    Ok(())
}

/// Rule 3: when the first of two overlapping deliveries rolls back, the second, which waited
/// on it, applies (once), for a subject with and without an earlier event.
pub async fn an_overlapping_delivery_applies_after_the_first_rolled_back<D: ConsumerDb>(
    db: Arc<D>,
) -> CaseResult {
    for (what, e, expected) in with_and_without_an_earlier_event(&db).await? {
        let (first, second) = overlap(&db, what, &e, false).await?;
        check!(
            matches!(first, Err(ApplyError::Projection(_))),
            "{what}: first: {first:?}"
        );
        check!(
            matches!(second, Ok(ApplyOutcome::Applied(()))),
            "{what}: the second delivery did not apply: {second:?}"
        );
        check_eq!(
            applications(&*db, &e.subject).await?,
            expected,
            "{what}: applications"
        );
    }
    check_eq!(db.markers().await?, 3);
    Ok(())
}

/// Rule 1: a failing projection rolls its marker back; its classification reaches the
/// dispatcher; the next delivery applies normally.
pub async fn a_failing_projection_rolls_back_its_marker<D: ConsumerDb>(db: Arc<D>) -> CaseResult {
    let e = order("evt-1", 1, "o1");
    let projector = Arc::clone(&db);
    let event = e.clone();
    let result = delivery::apply_once(db.consumer(), db.conn(0), &e, None, move |tx| {
        Box::pin(async move {
            projector.project(tx, &event).await?;
            projector.fail(tx).await
        })
    })
    .await;
    check!(
        matches!(result, Err(ApplyError::Projection(_))),
        "expected a projection error, got {result:?}"
    );
    check!(
        db.rows().await?.is_empty(),
        "the projection's first write survived"
    );
    check_eq!(db.markers().await?, 0, "the marker survived the rollback");
    let permanent = delivery::apply_once(db.consumer(), db.conn(0), &e, None, |_tx| {
        Box::pin(async { Err::<(), _>(HandlerError::permanent("unknown product")) })
    })
    .await;
    let handler_error = match permanent {
        Err(err) => HandlerError::from(err),
        Ok(outcome) => {
            return Err(CaseError::failed(format!(
                "expected an error, got {outcome:?}"
            )));
        }
    };
    check_eq!(handler_error.kind(), &HandlerErrorKind::Permanent);
    check!(applied(&db, &e, "the next delivery").await?.is_applied());
    check_eq!(db.markers().await?, 1);
    Ok(())
}

/// Rule 2: a copy of an applied event delivered after later events of its subject were applied
/// (an instance frozen past its lease, waking up) is a duplicate, not a new change.
pub async fn a_late_redelivery_after_newer_events_is_a_duplicate<D: ConsumerDb>(
    db: Arc<D>,
) -> CaseResult {
    let history = [
        order("evt-0", 1, "o1"),
        order("evt-1", 2, "o1"),
        order("evt-2", 3, "o1"),
    ];
    for e in &history {
        check!(applied(&db, e, "history").await?.is_applied(), "{}", e.id);
    }
    for late in &history[..2] {
        let outcome = applied(&db, late, "the late copy").await?;
        check!(
            outcome.is_deduplicated(),
            "the late copy of {} applied again",
            late.id
        );
    }
    check_eq!(applications(&*db, "o1").await?, 3);
    let value = row_of(&*db, "o1").await?.and_then(|r| r.1);
    check!(
        value.as_deref().is_some_and(|v| v.contains("\"seq\":3")),
        "the read model went back to an older value: {value:?}"
    );
    Ok(())
}

/// Rule 4: delete, re-create, delete, re-create with repeated ids (higher sequences) applies
/// each change; overlapping copies of a re-create apply once.
pub async fn repeated_ids_of_new_changes_apply_again<D: ConsumerDb>(db: Arc<D>) -> CaseResult {
    let created = |seq| order("evt-created", seq, "o1");
    let removed = |seq| deleted(order("evt-deleted", seq, "o1"));
    let present = |rows: Vec<ModelRow>| rows.iter().any(|r| r.0 == "o1");
    let mut seq = 0;
    for round in 1..=2 {
        seq += 1;
        check!(
            applied(&db, &created(seq), "a create").await?.is_applied(),
            "round {round}: the create was not applied"
        );
        check!(
            present(db.rows().await?),
            "round {round}: absent after create"
        );
        seq += 1;
        check!(
            applied(&db, &removed(seq), "a delete").await?.is_applied(),
            "round {round}: the delete was not applied"
        );
        check!(
            !present(db.rows().await?),
            "round {round}: present after delete"
        );
    }
    // A third re-create, delivered twice at once: applied once.
    seq += 1;
    let (first, second) = overlap(&db, "a repeated re-create", &created(seq), true).await?;
    check!(
        matches!(first, Ok(ApplyOutcome::Applied(())))
            && matches!(second, Ok(ApplyOutcome::Deduplicated)),
        "first {first:?}, second {second:?}"
    );
    check_eq!(applications(&*db, "o1").await?, 1, "the re-created row");
    check_eq!(db.markers().await?, 2, "one marker per id");
    Ok(())
}

/// Rule 5: a delivery whose lease moved on (another instance took it, as after a freeze past
/// the lease) commits nothing and fails with `LeaseLost`; the new holder's fenced delivery
/// applies.
pub async fn a_lost_lease_commits_nothing<D: ConsumerDb>(db: Arc<D>) -> CaseResult {
    let store = db.engine_store();
    store.migrate().await?;
    let k = key();
    let old = acquire(&*store, &k, NODE_A, T0).await?;
    let old_fence = Fence::new(k.clone(), old.owner.as_str(), old.epoch);
    let new = acquire(&*store, &k, NODE_B, T0 + TTL + 1).await?;
    let new_fence = Fence::new(k.clone(), new.owner.as_str(), new.epoch);
    let e = order("evt-1", 1, "o1");
    let late = apply_with(&db, 0, &e, Some(&old_fence), async { Ok(()) }).await;
    check!(
        matches!(&late, Err(ApplyError::Store(Error::LeaseLost { epoch, .. })) if *epoch == old.epoch),
        "the stale instance's delivery: {late:?}"
    );
    check!(
        db.rows().await?.is_empty(),
        "the stale projection committed"
    );
    check_eq!(db.markers().await?, 0, "the stale marker committed");
    let outcome = apply_with(&db, 1, &e, Some(&new_fence), async { Ok(()) }).await;
    check!(
        matches!(outcome, Ok(ApplyOutcome::Applied(()))),
        "the holder's delivery: {outcome:?}"
    );
    check_eq!(applications(&*db, "o1").await?, 1);
    Ok(())
}

/// Rule 5, frozen inside: an instance frozen INSIDE its projection's transaction past its
/// lease. The new holder takes the lease and delivers the same event; its claim waits on the
/// frozen instance's marker. When the frozen instance wakes, its fence check fails and it rolls
/// back, so the new holder's claim goes on and applies the event: once, by the instance that
/// holds the lease. Skipped where a writer excludes every other
/// ([`ConsumerDb::leases_beside_an_open_write`]).
pub async fn an_instance_frozen_inside_its_transaction_past_its_lease_cannot_commit<
    D: ConsumerDb,
>(
    db: Arc<D>,
) -> CaseResult {
    if !db.leases_beside_an_open_write() {
        return Err(CaseError::skipped(
            "a write transaction excludes the lease's takeover on this database",
        ));
    }
    let store = db.engine_store();
    store.migrate().await?;
    let k = key();
    let old = acquire(&*store, &k, NODE_A, T0).await?;
    let e = order("evt-1", 1, "o1");
    // The old holder claims and writes, then freezes with its transaction open.
    let old_fence = Fence::new(k.clone(), old.owner.as_str(), old.epoch);
    let (frozen, wrote, wake) = spawn_held(&db, 0, &e, Some(old_fence));
    wrote
        .await
        .or_fail_with("the frozen projection never ran")?;
    // Its lease expires; another instance takes it and delivers the same event.
    let new = acquire(&*store, &k, NODE_B, T0 + TTL + 1).await?;
    let holder = {
        let (db, e) = (Arc::clone(&db), e.clone());
        let fence = Fence::new(k.clone(), new.owner.as_str(), new.epoch);
        tokio::spawn(async move { apply_with(&db, 1, &e, Some(&fence), async { Ok(()) }).await })
    };
    until_blocked(&*db, "the new holder").await?;
    let _ = wake.send(Ok(()));
    let frozen = joined(frozen).await?;
    let holder = joined(holder).await?;
    check!(
        matches!(&frozen, Err(ApplyError::Store(Error::LeaseLost { epoch, .. })) if *epoch == old.epoch),
        "the frozen instance: {frozen:?}"
    );
    check!(
        matches!(holder, Ok(ApplyOutcome::Applied(()))),
        "the new holder: {holder:?}"
    );
    check_eq!(applications(&*db, "o1").await?, 1, "applied once");
    Ok(())
}

/// Rules 6 and 7: concurrent migrations are harmless; markers older than a cut are pruned and
/// no longer recognised, newer ones are kept.
pub async fn markers_are_pruned_by_age_and_migrations_are_idempotent<D: ConsumerDb>(
    db: Arc<D>,
) -> CaseResult {
    let (a, b) = tokio::join!(db.migrate(), db.migrate());
    a?;
    b?;
    for n in 0..3 {
        let e = order(&format!("old-{n}"), 1, &format!("o{n}"));
        check!(applied(&db, &e, "an old event").await?.is_applied());
    }
    db.clock().advance(Duration::from_secs(3_600));
    check!(
        applied(&db, &order("new", 1, "o9"), "a new event")
            .await?
            .is_applied()
    );
    let cut = db.clock().now_ms() - 1_800_000;
    let pruned = db.consumer().prune(db.conn(0), cut).await?;
    check_eq!(pruned, 3);
    check!(db.consumer().is_processed(db.conn(0), "new").await?);
    check!(!db.consumer().is_processed(db.conn(0), "old-0").await?);
    Ok(())
}

/// Where the engine cases' handler projects (swapped to rebuild a model by replay).
type Target<D> = Arc<Mutex<Arc<D>>>;

/// An engine (snapshot_diff poller with a log, on the database's engine store) over `items`
/// items, whose handler records every event and applies it, fenced by its lease, into the
/// current target.
async fn projected<D: ConsumerDb>(
    db: &Arc<D>,
    items: usize,
) -> Result<(World, Engine, Target<D>, Arc<Mutex<Vec<Event>>>), CaseError> {
    let store = db.engine_store();
    store.migrate().await?;
    let world = World::new(items, 10).or_fail()?;
    let poller = world
        .poller(StrategyKind::SnapshotDiff)
        .log(Duration::from_secs(86_400))
        .build()?;
    let engine = world.engine(store, NODE_A, poller, 7)?;
    let target: Target<D> = Arc::new(Mutex::new(Arc::clone(db)));
    let seen = Arc::new(Mutex::new(Vec::new()));
    engine.on(POLLER, {
        let (target, seen) = (Arc::clone(&target), Arc::clone(&seen));
        move |event: Event, ctx: HandlerContext| {
            let db = Arc::clone(&lock(&target));
            lock(&seen).push(event.clone());
            async move {
                let fence = ctx.fence().cloned();
                apply_with(&db, 0, &event, fence.as_ref(), async { Ok(()) })
                    .await
                    .map_err(|e| HandlerError::transient(e.to_string()))?
                    .report(&ctx);
                Ok::<(), HandlerError>(())
            }
        }
    })?;
    Ok((world, engine, target, seen))
}

/// Rule 4 on the replay lane, through a real engine: replaying the log into a new, empty model
/// rebuilds it row for row; replaying again into that up-to-date model changes nothing.
pub async fn replay_rebuilds_a_model_and_changes_nothing_in_an_up_to_date_one<D: ConsumerDb>(
    db: Arc<D>,
) -> CaseResult {
    let (world, engine, target, seen) = projected(&db, 5).await?;
    world.tick(&engine).await?;
    world.advance(Duration::from_secs(30));
    world
        .api
        .update("item-002", serde_json::json!({ "value": 20 }))
        .or_fail()?;
    world
        .api
        .update("item-004", serde_json::json!({ "name": "four" }))
        .or_fail()?;
    world.tick(&engine).await?;
    world.advance(Duration::from_secs(30));
    check!(world.api.remove("item-003"), "item-003 missing");
    world
        .api
        .update("item-002", serde_json::json!({ "value": 21 }))
        .or_fail()?;
    world.tick(&engine).await?;
    let live = db.rows().await?;
    check_eq!(live.len(), 4, "live read model: {live:?}");
    check!(
        live.iter().any(|r| r.0 == "item-002" && r.2 == 3),
        "item-002 should carry three applications: {live:?}"
    );

    let rebuilt = Arc::new(db.rebuilt().await?);
    *lock(&target) = Arc::clone(&rebuilt);
    let replayed = engine.replay(POLLER, None, 0, None).await?;
    check_eq!(replayed, 9, "replayed 5 + 2 + 2");
    let result = world.tick(&engine).await?;
    check_eq!(result.delivered, 9);
    check_eq!(
        rebuilt.rows().await?,
        live,
        "the rebuilt read model differs"
    );

    // Every event is a duplicate but item-003's create and delete: a replayed `created` after
    // its subject's `deleted` is applied again (it could be a re-create), then its delete.
    let before = engine.inspect().await?.pollers[0].delivery;
    engine.replay(POLLER, None, 0, None).await?;
    world.tick(&engine).await?;
    check_eq!(
        rebuilt.rows().await?,
        live,
        "a second replay changed the model"
    );
    let after = engine.inspect().await?.pollers[0].delivery;
    check!(
        after.deduplicated == before.deduplicated + 7 && after.applied == before.applied + 2,
        "counters before {before:?} after {after:?}"
    );
    check!(
        after.applied == 20 && after.failed == 0,
        "counters: {after:?}"
    );
    check!(
        lock(&seen).iter().any(|e| e.lane == Lane::Replay),
        "nothing was replayed"
    );
    Ok(())
}

/// Rule 4 through a real engine: an item deleted and re-created with identical content twice
/// (the engine repeats the `created` and `deleted` ids) ends present after every re-create and
/// absent after every delete, live and in a model rebuilt from the log.
pub async fn a_delete_and_a_re_create_with_identical_content_end_present<D: ConsumerDb>(
    db: Arc<D>,
) -> CaseResult {
    let (world, engine, target, seen) = projected(&db, 3).await?;
    let present = |rows: Vec<ModelRow>| rows.iter().any(|r| r.0 == "item-002");
    world.tick(&engine).await?;
    let Some(original) = world.api.get("item-002") else {
        return Err(CaseError::failed("item-002 is not in the API"));
    };
    check!(present(db.rows().await?), "item-002 was not created");
    for round in 1..=2 {
        check!(world.api.remove("item-002"), "item-002 missing");
        // A missing item is reported deleted by the second listing that misses it.
        for _ in 0..2 {
            world.advance(Duration::from_secs(60));
            world.tick(&engine).await?;
        }
        check!(
            !present(db.rows().await?),
            "round {round}: the delete was not applied"
        );
        world.api.seed([original.clone()]).or_fail()?;
        world.advance(Duration::from_secs(60));
        world.tick(&engine).await?;
        check!(
            present(db.rows().await?),
            "round {round}: the re-create was dropped"
        );
    }
    let seen = lock(&seen).clone();
    let ids = |kind| {
        seen.iter()
            .filter(|e| e.subject == "item-002" && e.event_type == kind)
            .map(|e| e.id.clone())
            .collect::<Vec<_>>()
    };
    let (created, deleted) = (ids(EventType::Created), ids(EventType::Deleted));
    check!(
        created.len() == 3
            && deleted.len() == 2
            && created.iter().all(|id| *id == created[0])
            && deleted[0] == deleted[1],
        "the case needs repeated ids: created {created:?}, deleted {deleted:?}"
    );
    let live = db.rows().await?;
    let rebuilt = Arc::new(db.rebuilt().await?);
    *lock(&target) = Arc::clone(&rebuilt);
    let replayed = engine.replay(POLLER, None, 0, None).await?;
    check_eq!(replayed, 3 + 4);
    world.tick(&engine).await?;
    check_eq!(
        rebuilt.rows().await?,
        live,
        "the rebuilt read model differs"
    );
    Ok(())
}

/// Runs consumer case `case` against a fresh database of `harness`, panicking with the failure
/// (the body of each test `consumer_tests!` generates).
pub async fn run_consumer_case<H, C, F>(harness: H, name: &'static str, case: C)
where
    H: super::ConsumerHarness,
    C: FnOnce(Arc<H::Db>) -> F,
    F: Future<Output = CaseResult>,
{
    let clock = watukuy_core::clock::ManualClock::new(T0);
    let db = match harness.fresh(name, clock).await {
        Ok(db) => Arc::new(db),
        Err(err) => panic!("consumer case {name}: no database: {err}"),
    };
    match case(Arc::clone(&db)).await {
        Ok(()) => {}
        // Printed and passed, as libtest cannot skip at run time (see `run_test`).
        Err(CaseError::Skipped(reason)) => eprintln!("consumer case {name} SKIPPED: {reason}"),
        Err(err) => panic!("consumer case {name}: {err}"),
    }
    harness.cleanup(db).await;
}
