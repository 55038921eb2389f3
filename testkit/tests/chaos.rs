//! The chaos harness on `MemoryStore`: determinism, the checker catching a lossy
//! and a corrupting store with the right guarantee, option validation, and the
//! first-cycle-crash regression in daemon mode. The per-strategy, per-kill-point and
//! retain-payload runs are conformance cases (`conformance::chaos::*`), run by every store.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use watukuy_core::{
    Error, EventType, Result, StopOptions, TickOptions,
    json::Json,
    store::{CommitBatch, Lease, PKey, Store},
};
use watukuy_store_memory::MemoryStore;
use watukuy_testkit::world::{POLLER, Recorder, StrategyKind, World};
use watukuy_testkit::{
    Defect, FaultyStore, KillPoint, KillSwitch, Op,
    chaos::{ChaosError, ChaosOptions, ChaosReport, ChaosStrategy, assert_chaos_report, run_chaos},
};

fn memory() -> Arc<dyn Store> {
    Arc::new(MemoryStore::new())
}

async fn chaos(options: ChaosOptions) -> ChaosReport {
    run_chaos(options).await.expect("valid options")
}

#[tokio::test]
async fn same_options_give_the_same_report_and_trace() {
    for strategy in ChaosStrategy::ALL {
        let options = |store| ChaosOptions::new(5, store).strategy(strategy).steps(80);
        let first = chaos(options(memory())).await;
        let second = chaos(options(memory())).await;
        assert_chaos_report(&first);
        assert_eq!(
            first, second,
            "{strategy}: the same options, another report"
        );
        assert!(
            first.trace.len() > 80,
            "{strategy}: {} lines",
            first.trace.len()
        );
    }
}

#[tokio::test]
async fn different_seeds_give_different_traces() {
    let a = chaos(ChaosOptions::new(5, memory()).steps(40)).await;
    let b = chaos(ChaosOptions::new(6, memory()).steps(40)).await;
    assert_ne!(a.trace, b.trace);
}

#[tokio::test]
async fn a_run_without_kills_has_no_restart_and_no_duplicate() {
    for strategy in ChaosStrategy::ALL {
        let report = chaos(
            ChaosOptions::new(3, memory())
                .strategy(strategy)
                .steps(60)
                .kill_points([]),
        )
        .await;
        assert_chaos_report(&report);
        assert_eq!(report.restarts, 0, "{report}");
        assert_eq!(report.duplicates, 0, "{report}");
        assert_eq!(report.kills.values().sum::<u64>(), 0, "{report}");
    }
}

#[tokio::test]
async fn concurrency_one_and_high_mutation_rates_hold() {
    for (strategy, concurrency, mutations) in [
        (ChaosStrategy::Timestamp, 1, 8),
        (ChaosStrategy::SnapshotDiff, 8, 6),
        (ChaosStrategy::Token, 1, 6),
        (ChaosStrategy::Page, 8, 8),
    ] {
        let report = chaos(
            ChaosOptions::new(21, memory())
                .strategy(strategy)
                .steps(80)
                .concurrency(concurrency)
                .max_mutations_per_step(mutations)
                .kill_probability(0.5),
        )
        .await;
        assert_chaos_report(&report);
    }
}

#[tokio::test]
async fn invalid_options_are_rejected_naming_the_option() {
    let cases: Vec<(&str, ChaosOptions)> = vec![
        ("steps", ChaosOptions::new(1, memory()).steps(0)),
        (
            "kill_probability",
            ChaosOptions::new(1, memory()).kill_probability(f64::NAN),
        ),
        (
            "kill_probability",
            ChaosOptions::new(1, memory()).kill_probability(1.5),
        ),
        (
            "kill_points",
            ChaosOptions::new(1, memory()).kill_points([KillPoint::Handler, KillPoint::Handler]),
        ),
        ("concurrency", ChaosOptions::new(1, memory()).concurrency(0)),
        (
            "initial_items",
            ChaosOptions::new(1, memory()).initial_items(1_000_000),
        ),
        (
            "store_label",
            ChaosOptions::new(1, memory()).store_label(" "),
        ),
    ];
    for (name, options) in cases {
        match run_chaos(options).await {
            Err(ChaosError::InvalidOption { option, .. }) => assert_eq!(option, name),
            other => panic!("{name}: expected an invalid option, got {other:?}"),
        }
    }
    assert_eq!("snapshot_diff".parse(), Ok(ChaosStrategy::SnapshotDiff));
    assert!("custom".parse::<ChaosStrategy>().is_err());
    assert_eq!("after-commit".parse(), Ok(KillPoint::AfterCommit));
    assert!("K3".parse::<KillPoint>().is_err());
}

#[tokio::test]
async fn a_failing_report_prints_the_replay_command() {
    let (store, _) = tamper_store(Tamper::Lossy);
    let options = ChaosOptions::new(3, store)
        .strategy(ChaosStrategy::SnapshotDiff)
        .steps(40)
        .concurrency(2);
    let report = chaos(options).await;
    let failure = report.failure().expect("the lossy store is caught");
    assert!(
        failure.contains(
            "cargo run -p watukuy-examples --bin chaos -- --store memory --seed 3 --strategy snapshotDiff --steps 40 --concurrency 2 --trace"
        ),
        "{failure}"
    );
    assert!(failure.contains("last trace lines"), "{failure}");
    let caught = std::panic::catch_unwind(|| assert_chaos_report(&report));
    assert!(caught.is_err());
}

// ----- negative tests: the checker catches broken stores -----

#[tokio::test]
async fn a_lossy_store_is_caught_as_a_g1_violation() {
    for seed in 1..=3 {
        let (store, tampering) = tamper_store(Tamper::Lossy);
        let report = chaos(
            ChaosOptions::new(seed, store.clone())
                .strategy(ChaosStrategy::SnapshotDiff)
                .steps(60),
        )
        .await;
        assert!(tampering.tampered(), "seed {seed}: nothing was dropped");
        assert!(
            !report.is_ok(),
            "seed {seed}: the lost event went unnoticed"
        );
        println!("lossy, seed {seed}: {}", report.violations.join(" | "));
        assert!(
            report.violations.iter().all(|v| v.starts_with("G1")),
            "seed {seed}: {:#?}",
            report.violations
        );
    }
}

#[tokio::test]
async fn a_corrupting_store_is_caught_as_never_served() {
    for strategy in ChaosStrategy::ALL {
        let (store, tampering) = tamper_store(Tamper::Corrupting);
        let report = chaos(
            ChaosOptions::new(4, store.clone())
                .strategy(strategy)
                .steps(60),
        )
        .await;
        assert!(tampering.tampered(), "{strategy}: nothing was corrupted");
        println!("corrupting, {strategy}: {}", report.violations.join(" | "));
        assert!(
            report
                .violations
                .iter()
                .any(|v| v.starts_with("G1") && v.contains("never served")),
            "{strategy}: {:#?}",
            report.violations
        );
    }
}

#[tokio::test]
async fn a_store_that_ignores_fencing_is_caught_by_the_lease_audit() {
    let (store, tampering) = tamper_store(Tamper::Unfenced);
    let report = chaos(ChaosOptions::new(2, store.clone()).steps(40)).await;
    assert!(tampering.tampered(), "no stale write was ever tried");
    assert!(!report.is_ok(), "the accepted stale write went unnoticed");
    println!("unfenced: {}", report.violations.join(" | "));
    assert!(
        report.violations.iter().all(|v| v.starts_with("G5")),
        "{:#?}",
        report.violations
    );
}

/// How a tampering store breaks the contract (once, for `Lossy` and `Corrupting`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tamper {
    /// Drops the first `created` event of a commit from the outbox (the item row is written).
    Lossy,
    /// Rewrites the data of the first event of a later commit to a value the API never had.
    Corrupting,
    /// Accepts acknowledgements carrying a superseded or released lease.
    Unfenced,
}

/// A `MemoryStore` behind a [`FaultyStore`] that breaks the contract as its [`Tampering`] says.
fn tamper_store(tamper: Tamper) -> (Arc<dyn Store>, Arc<Tampering>) {
    let tampering = Arc::new(Tampering {
        tamper,
        done: AtomicBool::new(false),
        commits: AtomicU64::new(0),
    });
    let store = FaultyStore::new(memory()).with_defect(tampering.clone());
    (Arc::new(store), tampering)
}

/// The defect of a tampering store: once, at commit (or on every stale acknowledgement).
struct Tampering {
    tamper: Tamper,
    done: AtomicBool,
    commits: AtomicU64,
}

impl Tampering {
    fn tampered(&self) -> bool {
        self.done.load(Ordering::SeqCst)
    }

    fn tamper(&self, batch: &CommitBatch) -> Option<CommitBatch> {
        let commits = self.commits.fetch_add(1, Ordering::SeqCst);
        if self.tampered() {
            return None;
        }
        let mut batch = batch.clone();
        match self.tamper {
            Tamper::Lossy => {
                let index = batch
                    .events
                    .iter()
                    .position(|row| row.event.event_type == EventType::Created)?;
                batch.events.remove(index);
            }
            Tamper::Unfenced => return None,
            Tamper::Corrupting => {
                if commits < 3 {
                    return None;
                }
                let row = batch.events.first_mut()?;
                let mut data = row.event.data.as_ref()?.to_value();
                data["value"] = json!(-424_242);
                row.event.data = Some(Json::from_value(&data));
            }
        }
        self.done.store(true, Ordering::SeqCst);
        Some(batch)
    }
}

#[async_trait]
impl Defect for Tampering {
    async fn commit_poll(
        &self,
        inner: &dyn Store,
        key: &PKey,
        lease: &Lease,
        batch: &CommitBatch,
    ) -> Result<()> {
        match self.tamper(batch) {
            Some(tampered) => inner.commit_poll(key, lease, &tampered).await,
            None => inner.commit_poll(key, lease, batch).await,
        }
    }

    async fn ack_events(
        &self,
        inner: &dyn Store,
        key: &PKey,
        lease: &Lease,
        ids: &[String],
    ) -> Result<()> {
        match inner.ack_events(key, lease, ids).await {
            Err(Error::LeaseLost { .. }) if self.tamper == Tamper::Unfenced => {
                self.done.store(true, Ordering::SeqCst);
                Ok(())
            }
            other => other,
        }
    }
}

// ----- the first-cycle-crash regression, daemon side -----

/// After a crash right after the first commit of a new key, a restarted daemon runs the key
/// once and then sleeps until it is due: at most 4 `load_state` calls in 200 scheduler rounds
/// (the historical bug left `next_due_at` unset and the daemon busy-looped).
#[tokio::test]
async fn a_daemon_restarted_after_a_first_cycle_crash_does_not_busy_loop() {
    let store = memory();
    let w = World::new(6, 4).unwrap();
    let kills = Arc::new(KillSwitch::new());
    kills.arm(KillPoint::AfterCommit);
    let crashed_store = Arc::new(FaultyStore::new(Arc::clone(&store)).with_kills(kills.clone()));
    let crashed = timestamp_engine(&w, crashed_store.clone(), "node-a", 2);
    crashed.on(POLLER, Recorder::default().handler()).unwrap();
    crashed.tick(TickOptions::default()).await.unwrap();
    assert!(crashed_store.is_dead());
    drop(crashed);

    // Past the world engine's lease TTL (30 s): node-a's lease expired.
    w.advance(Duration::from_secs(31));
    let counting = Arc::new(FaultyStore::new(Arc::clone(&store)));
    let daemon = timestamp_engine(&w, counting.clone(), "node-b", 3);
    let recorder = Recorder::default();
    daemon.on(POLLER, recorder.handler()).unwrap();
    daemon.start().await.unwrap();
    for _ in 0..200 {
        tokio::task::yield_now().await;
    }
    let loads = counting.calls(Op::LoadState);
    daemon
        .stop(StopOptions::default().drain(false).timeout(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(recorder.ids().len(), 6, "the crashed page, then the rest");
    assert!(loads <= 4, "{loads} load_state calls in 200 rounds");
}

/// An engine of `instance` on `store` (rng seed `seed`) polling the world's API with the
/// `timestamp` strategy.
fn timestamp_engine(
    w: &World,
    store: Arc<FaultyStore>,
    instance: &str,
    seed: u32,
) -> watukuy_core::Engine {
    let poller = w.poller(StrategyKind::Timestamp).build().unwrap();
    w.engine(store, instance, poller, seed).unwrap()
}
