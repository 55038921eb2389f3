//! Chaos on the store under test: engines crash at every kill point (K1–K7, see [`KillPoint`])
//! while the API changes, fresh instances take over the same store, and the invariant checker
//! proves G1–G5, G7, G9 and liveness once everything is quiet.
//!
//! Each strategy case runs a few seeds (3 by default; `WATUKUY_CHAOS_SEEDS=N` runs seeds 1 to
//! N), each on its own fresh store of the harness. A failing seed prints the exact command that
//! replays it.

use std::sync::Arc;
use std::time::Duration;

use watukuy_core::{
    TickOptions,
    poller::Retain,
    store::{PKey, Store},
};

use crate::harness::{CaseError, CaseResult, Env, Fresh};
use crate::{check, check_eq};
use watukuy_testkit::chaos::{ChaosOptions, ChaosReport, ChaosStrategy, run_chaos, seeds_from_env};
use watukuy_testkit::world::{POLLER, Recorder, StrategyKind, World};
use watukuy_testkit::{FaultyStore, KillPoint, KillSwitch};

/// Seeds per strategy case unless `WATUKUY_CHAOS_SEEDS` says otherwise.
pub const DEFAULT_SEEDS: u32 = 3;
/// Random steps of each seed in the strategy cases.
pub const CASE_STEPS: usize = 120;

/// Runs one chaos simulation on `store`, labelled with the harness for the replay command.
async fn chaos(
    env: &Env,
    store: Arc<dyn Store>,
    options: impl FnOnce(ChaosOptions) -> ChaosOptions,
    seed: u32,
) -> Result<ChaosReport, CaseError> {
    let options = options(ChaosOptions::new(seed, store).store_label(env.harness.name()));
    run_chaos(options)
        .await
        .map_err(|e| CaseError::failed(e.to_string()))
}

/// Fails with the report's violations, replay command and trace tail.
fn holds(report: &ChaosReport) -> CaseResult {
    match report.failure() {
        Some(failure) => Err(CaseError::failed(failure)),
        None => Ok(()),
    }
}

/// The store for the `n`-th run of a case: the case's own for the first, a fresh one from the
/// harness for the others (cleaned up by the caller once they passed).
async fn store_for(env: &Env, n: u32) -> Result<(Arc<dyn Store>, Option<Fresh>), CaseError> {
    if n == 0 {
        Ok((Arc::clone(&env.store), None))
    } else {
        let fresh = env.another_store().await?;
        Ok((Arc::clone(&fresh.store), Some(fresh)))
    }
}

/// Seeds 1..=N of one strategy with every kill point: no violations, something delivered,
/// nothing parked, restarts happened, at least 6 of the 8 kill points fired, and
/// `duplicates == delivered − unique`.
async fn strategy_seeds(env: Env, strategy: ChaosStrategy) -> CaseResult {
    seeds_with(&env, strategy, 0, |o| o).await.map(drop)
}

/// [`strategy_seeds`] with more options; the runs take the stores from `first_run` on (only
/// run 0 uses the case's own store). Returns the reports.
async fn seeds_with(
    env: &Env,
    strategy: ChaosStrategy,
    first_run: u32,
    options: impl Fn(ChaosOptions) -> ChaosOptions + Sync,
) -> Result<Vec<ChaosReport>, CaseError> {
    let mut reports = Vec::new();
    for (n, seed) in (first_run..).zip(1..=seeds_from_env(DEFAULT_SEEDS)) {
        let (store, fresh) = store_for(env, n).await?;
        let report = chaos(
            env,
            store,
            |o| options(o.strategy(strategy).steps(CASE_STEPS)),
            seed,
        )
        .await?;
        holds(&report)?;
        let label = report.describe();
        check!(report.delivered > 0, "{label}: nothing delivered");
        check_eq!(report.parked, 0, "{label}");
        check!(report.restarts > 0, "{label}: no instance ever crashed");
        check!(
            report.lease_probes > 0,
            "{label}: the lease audit never probed a stale lease"
        );
        check!(
            report.kill_points_fired() >= 6,
            "{label}: only {} of 8 kill points fired",
            report.kill_points_fired()
        );
        check_eq!(
            report.duplicates,
            report.delivered - report.unique_events,
            "{label}"
        );
        // No ack call carries more ids than events may be delivered and not acknowledged.
        check!(
            report.largest_ack <= report.unacked_bound,
            "{label}: an ack call carried {} ids, over the bound of {}",
            report.largest_ack,
            report.unacked_bound
        );
        if let Some(fresh) = fresh {
            fresh.cleanup().await;
        }
        reports.push(report);
    }
    Ok(reports)
}

/// G1–G5, G7, G9 under every kill point, `timestamp` strategy, seeds 1..=N.
pub async fn timestamp_seeds(env: Env) -> CaseResult {
    strategy_seeds(env, ChaosStrategy::Timestamp).await
}

/// G1–G5, G7, G9 under every kill point, `snapshot_diff` strategy (deletes), seeds 1..=N.
pub async fn snapshot_diff_seeds(env: Env) -> CaseResult {
    strategy_seeds(env, ChaosStrategy::SnapshotDiff).await
}

/// G1–G5, G7, G9 under every kill point, `token` strategy, seeds 1..=N.
pub async fn token_seeds(env: Env) -> CaseResult {
    strategy_seeds(env, ChaosStrategy::Token).await
}

/// G1–G5, G7, G9 under every kill point, `page` strategy (append-only API), seeds 1..=N.
pub async fn page_seeds(env: Env) -> CaseResult {
    strategy_seeds(env, ChaosStrategy::Page).await
}

/// G1 with `retain: payload` on `timestamp` (seed 11): every update's `previous` is the payload
/// delivered before it.
pub async fn retain_payload_timestamp(env: Env) -> CaseResult {
    let report = retaining_payload(&env, ChaosStrategy::Timestamp, 11).await?;
    holds(&report)?;
    check!(report.delivered > 0, "{}", report.describe());
    Ok(())
}

/// G1 with `retain: payload` on `snapshot_diff` (seed 12): updates carry `previous`, deletes
/// carry the last delivered payload as `data`.
pub async fn retain_payload_snapshot_diff(env: Env) -> CaseResult {
    let report = retaining_payload(&env, ChaosStrategy::SnapshotDiff, 12).await?;
    holds(&report)?;
    check!(
        report.mutations.removed > 0,
        "{}: no removal exercised the deleted payload",
        report.describe()
    );
    Ok(())
}

/// A chaos run of `strategy` with `retain: payload`, on the case's store.
async fn retaining_payload(
    env: &Env,
    strategy: ChaosStrategy,
    seed: u32,
) -> Result<ChaosReport, CaseError> {
    chaos(
        env,
        Arc::clone(&env.store),
        |o| {
            o.strategy(strategy)
                .steps(CASE_STEPS)
                .retain(Retain::Payload)
        },
        seed,
    )
    .await
}

/// Each kill point alone (seed 7, 60 steps, probability 0.5) fires and every guarantee holds.
pub async fn each_kill_point_alone(env: Env) -> CaseResult {
    for (n, point) in KillPoint::ALL.into_iter().enumerate() {
        let (store, fresh) = store_for(&env, u32::try_from(n).unwrap_or(u32::MAX)).await?;
        let report = chaos(
            &env,
            store,
            |o| {
                o.strategy(ChaosStrategy::Timestamp)
                    .steps(60)
                    .kill_points([point])
                    .kill_probability(0.5)
            },
            7,
        )
        .await?;
        holds(&report)?;
        check!(
            report.kills.get(&point).copied().unwrap_or(0) > 0,
            "{point} never fired: {}",
            report.describe()
        );
        check_eq!(
            report.kill_points_fired(),
            1,
            "only {point} may fire: {}",
            report.describe()
        );
        if let Some(fresh) = fresh {
            fresh.cleanup().await;
        }
    }
    Ok(())
}

/// G1 with HTTP validators in play (`etags`): the API answers with `ETag`s and every request is
/// conditional on the validators committed with the pages; `timestamp` and `page` (the
/// strategies that send conditional requests), every kill point, seeds 1..=N. The `after-fetch` kill lands between a `200` (whose
/// validators were only staged) and its page's commit: after recovery the request is sent
/// unconditionally again and every change is delivered. `304`s must have happened, and the
/// `after-fetch` kill must have fired.
pub async fn validators_seeds(env: Env) -> CaseResult {
    let strategies = [ChaosStrategy::Timestamp, ChaosStrategy::Page];
    let (mut not_modified, mut after_fetch) = (0, 0);
    for (i, strategy) in strategies.into_iter().enumerate() {
        // Only the very first run uses the case's own store; every other one a fresh store.
        let first_run = u32::from(i > 0);
        for report in seeds_with(&env, strategy, first_run, |o| o.etags(true)).await? {
            not_modified += report.not_modified;
            after_fetch += report
                .kills
                .get(&KillPoint::AfterFetch)
                .copied()
                .unwrap_or(0);
        }
    }
    check!(
        not_modified > 0,
        "no request was ever answered 304: validators were not in play"
    );
    check!(after_fetch > 0, "the after-fetch kill never fired");
    Ok(())
}

/// G1–G5, G7, G9 with `overlap_delivery` (a page's drain runs while the next page is fetched
/// and committed): `timestamp`, `snapshot_diff` and `page`, every kill point, seeds 1..=N.
pub async fn overlapped_delivery_seeds(env: Env) -> CaseResult {
    let strategies = [
        ChaosStrategy::Timestamp,
        ChaosStrategy::SnapshotDiff,
        ChaosStrategy::Page,
    ];
    for (i, strategy) in strategies.into_iter().enumerate() {
        // Only the very first run uses the case's own store; every other one a fresh store.
        let first_run = u32::from(i > 0);
        // 60 items in pages of 25: the first cycle already overlaps three pages.
        seeds_with(&env, strategy, first_run, |o| {
            o.initial_items(60).overlap_delivery(true)
        })
        .await?;
    }
    Ok(())
}

/// G1–G5, G7, G9 with an ack window of 8 events (concurrency 3): every strategy, every kill
/// point, seeds 1..=N. Acks are flushed in batches larger than the concurrency, so a crash may
/// redeliver up to 8 events, and the G9 check allows exactly that many duplicates per crash;
/// per-key order still only ever repeats a key's newest event.
pub async fn ack_window_seeds(env: Env) -> CaseResult {
    let strategies = [
        ChaosStrategy::Timestamp,
        ChaosStrategy::SnapshotDiff,
        ChaosStrategy::Token,
        ChaosStrategy::Page,
    ];
    let mut largest = 0;
    for (i, strategy) in strategies.into_iter().enumerate() {
        let first_run = u32::from(i > 0);
        let reports = seeds_with(&env, strategy, first_run, |o| o.ack_window(Some(8))).await?;
        for report in &reports {
            check_eq!(report.unacked_bound, 8, "{}", report.describe());
            largest = largest.max(report.largest_ack);
        }
    }
    check!(
        largest > 3,
        "no ack call ever carried more than the concurrency (largest {largest}): the window was not used"
    );
    Ok(())
}

/// The first-cycle-crash regression: a crash right after the very first commit of a new key must
/// not leave the key stalled. (The TypeScript reference once committed a key's first page without
/// its schedule, and a key with no due time was never due: tick mode stalled, the daemon
/// busy-looped. Every commit now carries the schedule, and no due time means due.) A fresh instance drains the
/// crashed page, polls again at once, and keeps polling on schedule; the 40-step timestamp run
/// of seed 2 converges.
pub async fn first_cycle_crash_is_recovered(env: Env) -> CaseResult {
    let w = World::new(6, 4).map_err(|e| CaseError::failed(e.to_string()))?;
    let key = PKey::new(POLLER, "");
    let kills = Arc::new(KillSwitch::new());
    kills.arm(KillPoint::AfterCommit);
    let crashed_store =
        Arc::new(FaultyStore::new(Arc::clone(&env.store)).with_kills(Arc::clone(&kills)));
    let crashed = w.engine(
        crashed_store.clone(),
        "node-a",
        w.poller(StrategyKind::Timestamp).build()?,
        2,
    )?;
    let lost = Recorder::default();
    crashed.on(POLLER, lost.handler())?;
    let _ = crashed.tick(TickOptions::default()).await?;
    check_eq!(
        kills.fired(KillPoint::AfterCommit),
        1,
        "the first commit killed node-a"
    );
    check!(crashed_store.is_dead());
    check!(lost.ids().is_empty(), "node-a delivered nothing");
    drop(crashed);
    check_eq!(
        env.store.counts(&key).await.map(|c| c.pending)?,
        4,
        "the first page is in the outbox"
    );
    let state = env
        .store
        .load_state(&key)
        .await?
        .ok_or_else(|| CaseError::failed("the first commit wrote no state"))?;
    check!(
        state.schedule.interval_ms.is_some() || state.schedule.next_due_at.is_some(),
        "the first commit carries the schedule: {:?}",
        state.schedule
    );

    // Past the world engine's lease TTL (30 s): node-a's lease expired.
    w.advance(Duration::from_secs(31));
    let fresh = w.engine(
        Arc::clone(&env.store),
        "node-b",
        w.poller(StrategyKind::Timestamp).build()?,
        3,
    )?;
    let recorder = Recorder::default();
    fresh.on(POLLER, recorder.handler())?;
    let calls = w.api.calls();
    let result = fresh.tick(TickOptions::default()).await?;
    check!(
        result.polled.iter().all(|p| p.error.is_none()),
        "{result:?}"
    );
    check!(
        w.api.calls() > calls,
        "node-b polls again at once: {result:?}"
    );
    check_eq!(recorder.ids().len(), 6, "the crashed page, then the rest");
    for round in 0..3 {
        w.advance(Duration::from_secs(31));
        let calls = w.api.calls();
        let result = fresh.tick(TickOptions::default()).await?;
        check!(
            w.api.calls() > calls,
            "round {round}: the key is stalled, not polled after 31 s: {result:?}"
        );
    }
    check_eq!(env.store.counts(&key).await.map(|c| c.pending)?, 0);

    let (store, other) = store_for(&env, 1).await?;
    let report = chaos(
        &env,
        store,
        |o| o.strategy(ChaosStrategy::Timestamp).steps(40),
        2,
    )
    .await?;
    holds(&report)?;
    if let Some(other) = other {
        other.cleanup().await;
    }
    Ok(())
}
