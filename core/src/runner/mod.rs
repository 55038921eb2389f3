//! One run of one `(poller, partition)`: lease, drain the outbox first, the live
//! cycle page by page (one `commit_poll` per page), full-scan deletes, the schedule, release.

use std::sync::Arc;

use smol_str::SmolStr;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::clock::Clock;
use crate::delivery::{Dispatcher, DrainContext, DrainReport, Partition};
use crate::error::{Error, Result};
use crate::hooks::{HookContext, Hooks, Phase};
use crate::model::{Claim, Lane, Lease, PKey, PollerState, SerializedError};
use crate::poller::PollerDef;
use crate::rng::Rng;
use crate::schedule;
use crate::store::Store;

mod bookkeeping;
mod cycle;
mod deletes;
mod lease;
mod page;
mod plan;

use cycle::{Cycle, LaneSpec};
pub(crate) use lease::HeldLeases;
use lease::LeaseKeeper;

/// What the engine shares with every run.
pub(crate) struct Shared {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) rng: Arc<dyn Rng>,
    pub(crate) hooks: Arc<dyn Hooks>,
    pub(crate) instance_id: String,
    pub(crate) lease_ttl_ms: i64,
    pub(crate) renew_every_ms: i64,
    pub(crate) budgets: Arc<crate::budget::BudgetManager>,
    pub(crate) trace: Arc<dyn crate::telemetry::TraceContext>,
    /// This engine's last lease on each key: `on_lease_acquired` fires for a new one only.
    pub(crate) held: HeldLeases,
}

/// A poller as the engine runs it.
pub(crate) struct Runtime {
    pub(crate) def: Arc<PollerDef>,
    pub(crate) dispatcher: Dispatcher,
    pub(crate) source: String,
}

/// One lane cycle's result, as `tick()` reports it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct PollResult {
    /// The poller.
    pub poller: String,
    /// The partition.
    pub partition: String,
    /// The lane.
    pub lane: Lane,
    /// Items fetched.
    pub items: u64,
    /// Events committed.
    pub events: u64,
    /// Events delivered during the cycle.
    pub delivered: u64,
    /// How long the cycle took.
    pub duration_ms: i64,
    /// The failure, if the cycle failed (fetch failures land here, they are never thrown).
    pub error: Option<SerializedError>,
}

/// How a key run ended.
#[derive(Debug)]
pub(crate) enum KeyOutcome {
    /// The key is paused.
    Paused,
    /// Nothing to do yet.
    NotDue,
    /// Another instance holds the lease.
    Leased,
    /// The run happened.
    Ran(Box<RunReport>),
    /// The lease was lost midway; the run's remaining work was dropped.
    LeaseLost,
    /// Stopped without draining.
    Aborted,
}

/// What a run did.
#[derive(Debug, Default)]
pub(crate) struct RunReport {
    pub(crate) polled: Vec<PollResult>,
    pub(crate) delivered: u64,
    pub(crate) next_retry_at: Option<i64>,
    /// The key's state after the run, as this run left it.
    pub(crate) state: Option<PollerState>,
}

/// Options of one run.
pub(crate) struct RunOptions {
    /// Read the state (and, when no poll is due, whether the outbox holds rows) before taking
    /// the lease, and skip a key with nothing to do; `false` where the caller knows the key is
    /// due (the daemon's schedule), so the run starts with its claim.
    pub(crate) precheck: bool,
    /// Stop fetching new pages at this time (tick deadline); a running page finishes.
    pub(crate) deadline_ms: Option<i64>,
    /// Fires on stop without drain.
    pub(crate) cancel: CancellationToken,
}

/// Why a cycle stopped early.
enum CycleError {
    LeaseLost(i64),
    Aborted,
    Failed {
        error: Error,
        phase: Phase,
        throttle: Option<Option<i64>>,
    },
}

impl From<Error> for CycleError {
    fn from(error: Error) -> Self {
        match error {
            Error::LeaseLost { epoch, .. } => CycleError::LeaseLost(epoch),
            error => CycleError::Failed {
                error,
                phase: Phase::Commit,
                throttle: None,
            },
        }
    }
}

/// Everything one run needs.
struct Run<'a> {
    shared: &'a Shared,
    rt: &'a Runtime,
    key: PKey,
    partition: Partition,
    lease: Lease,
    keeper: LeaseKeeper,
    cancel: CancellationToken,
    hook: HookContext,
    deadline_ms: Option<i64>,
}

/// Runs one key. Never returns a fetch failure as `Err`: those land in the poll result.
pub(crate) async fn run_key(
    shared: &Shared,
    rt: &Runtime,
    partition: Partition,
    options: RunOptions,
) -> Result<KeyOutcome> {
    let key = PKey::new(rt.def.name.clone(), partition.key.clone());
    let now = shared.clock.now_ms();
    if options.precheck {
        // Read-only: a key with nothing to do costs no lease write.
        let state = shared.store.load_state(&key).await?;
        if state.as_ref().is_some_and(|s| s.paused) {
            return Ok(KeyOutcome::Paused);
        }
        let live_due = state
            .as_ref()
            .is_none_or(|s| schedule::key_due(rt.def.reconcile_every(), s, now));
        let drain_due = !live_due
            && rt.dispatcher.has_consumer()
            && !shared.store.load_pending(&key, 1).await?.is_empty();
        if !live_due && !drain_due {
            return Ok(KeyOutcome::NotDue);
        }
    }
    let Some(claim) = shared
        .store
        .claim(&key, &shared.instance_id, shared.lease_ttl_ms, now)
        .await?
    else {
        return Ok(KeyOutcome::Leased);
    };
    let Claim {
        lease,
        state,
        pending,
    } = claim;
    let hook = HookContext {
        poller: SmolStr::new(&key.poller),
        partition: SmolStr::new(&key.partition),
        lane: Lane::Live,
        instance_id: SmolStr::new(&shared.instance_id),
    };
    // Once per lease taken anew, not on every run of a key this engine keeps re-taking.
    if shared.held.acquired(&key, &lease) {
        shared.hooks.on_lease_acquired(&hook, &lease).await;
    }
    let cancel = options.cancel.child_token();
    let keeper = LeaseKeeper::start(shared, &key, &lease, &cancel);
    let run = Run {
        shared,
        rt,
        key,
        partition,
        lease,
        keeper,
        cancel,
        hook,
        deadline_ms: options.deadline_ms,
    };
    let outcome = run.execute(state, pending).await;
    let Run {
        key,
        lease,
        keeper,
        hook,
        ..
    } = run;
    keeper.stop().await;
    match &outcome {
        Ok(KeyOutcome::LeaseLost) => {}
        _ => {
            if let Err(error) = shared.store.release_lease(&key, &lease).await {
                tracing::warn!(%key, %error, "lease release failed; it expires by itself");
                shared
                    .hooks
                    .on_error(&hook, &error.to_serialized(), Phase::Lease)
                    .await;
            }
        }
    }
    outcome
}

impl Run<'_> {
    fn now(&self) -> i64 {
        self.shared.clock.now_ms()
    }

    fn lease_lost(&self) -> bool {
        self.keeper.lost.is_cancelled()
    }

    /// The run proper, from the state and pending flag its claim read under the lease (that
    /// read is authoritative).
    async fn execute(&self, state: Option<PollerState>, pending: bool) -> Result<KeyOutcome> {
        let state = match state {
            Some(state) if state.paused => return Ok(KeyOutcome::Paused),
            Some(state) => state,
            None => {
                let now = self.now();
                let mut state = PollerState::zero(now);
                state.schedule = schedule::initial_schedule(&self.rt.def.schedule, now);
                state
            }
        };
        let mut report = RunReport::default();
        let mut schedule = state.schedule.clone();
        // Drain the outbox first: events committed by a crashed run go out before new ones.
        if pending {
            match self.drain().await {
                Ok(drained) => {
                    report.delivered += drained.delivered;
                    report.next_retry_at = drained.next_retry_at;
                    if drained.halted {
                        schedule = self.halt(&schedule).await?;
                    }
                    if drained.aborted && self.cancel.is_cancelled() {
                        return Ok(if self.lease_lost() {
                            KeyOutcome::LeaseLost
                        } else {
                            KeyOutcome::Aborted
                        });
                    }
                }
                Err(Error::LeaseLost { epoch, .. }) => {
                    return Ok(self.on_lease_lost(epoch).await);
                }
                Err(error) => return Err(error),
            }
        }
        let mut state = PollerState { schedule, ..state };
        let def = &self.rt.def;
        // Lanes run one after another within a key: live, then reconcile, then backfill.
        if schedule::is_due(&state.schedule, self.now()) {
            if state.schedule.circuit == crate::model::Circuit::Open {
                state.schedule = schedule::begin_probe(&state.schedule);
            }
            let spec = LaneSpec {
                lane: Lane::Live,
                strategy: Arc::clone(&def.strategy),
                fetch: def.fetch.clone(),
                full_scan: def.strategy.is_full_scan(),
                cap: if def.strategy.is_full_scan() {
                    def.full_scan_page_cap
                } else {
                    def.max_pages_per_cycle
                },
                force: false,
                target: None,
            };
            state = match self.run_lane(spec, state, &mut report).await {
                Ok(state) => state,
                Err(outcome) => return Ok(outcome),
            };
        }
        if let Some(reconcile) = def
            .reconcile
            .as_ref()
            .filter(|_| schedule::reconcile_due(def.reconcile_every(), &state, self.now()))
        {
            let spec = LaneSpec {
                lane: Lane::Reconcile,
                strategy: Arc::clone(&reconcile.strategy),
                fetch: reconcile.fetch.clone(),
                full_scan: true,
                cap: def.full_scan_page_cap,
                force: false,
                target: None,
            };
            state = match self.run_lane(spec, state, &mut report).await {
                Ok(state) => state,
                Err(outcome) => return Ok(outcome),
            };
        }
        if schedule::backfill_due(&state, self.now()) {
            let lane = state.lanes.backfill.clone().unwrap_or_default();
            let target = match lane
                .target
                .as_deref()
                .map(|t| def.strategy.deserialize(t))
                .transpose()
            {
                Ok(target) => target,
                Err(error) => return Err(error),
            };
            let spec = LaneSpec {
                lane: Lane::Backfill,
                strategy: Arc::clone(&def.strategy),
                fetch: def.fetch.clone(),
                full_scan: false,
                cap: def.max_pages_per_cycle,
                force: lane.force == Some(true),
                target,
            };
            state = match self.run_lane(spec, state, &mut report).await {
                Ok(state) => state,
                Err(outcome) => return Ok(outcome),
            };
        }
        report.state = Some(state);
        // Log retention is enforced once per run, while holding the key.
        if let Some(retention) = def.log_retention {
            let cutoff = self
                .now()
                .saturating_sub(crate::clock::duration_ms(retention));
            match self.shared.store.prune_log(&self.key, cutoff).await {
                Ok(0) => {}
                Ok(pruned) => tracing::debug!(key = %self.key, pruned, "replay log pruned"),
                Err(error) => {
                    tracing::warn!(key = %self.key, %error, "pruning the replay log failed")
                }
            }
        }
        Ok(KeyOutcome::Ran(Box::new(report)))
    }

    /// Runs one lane with its span; a lost lease or a stop ends the whole run.
    async fn run_lane(
        &self,
        spec: LaneSpec,
        state: PollerState,
        report: &mut RunReport,
    ) -> Result<PollerState, KeyOutcome> {
        let schedule = state.schedule.clone();
        let span = tracing::info_span!(
            "watukuy.poll",
            poller = %self.key.poller,
            partition = %self.key.partition,
            lane = spec.lane.as_str(),
            instance_id = %self.shared.instance_id,
            traceparent = tracing::field::Empty,
            error = tracing::field::Empty,
        );
        match self
            .lane_cycle(spec, state, schedule, report)
            .instrument(span)
            .await
        {
            Ok(state) => Ok(state),
            Err(CycleError::LeaseLost(epoch)) => Err(self.on_lease_lost(epoch).await),
            Err(CycleError::Aborted | CycleError::Failed { .. }) => Err(if self.lease_lost() {
                self.on_lease_lost(self.lease.epoch).await
            } else {
                KeyOutcome::Aborted
            }),
        }
    }

    async fn on_lease_lost(&self, epoch: i64) -> KeyOutcome {
        self.keeper.lost.cancel();
        self.shared.held.lost(&self.key);
        self.shared.hooks.on_lease_lost(&self.hook, epoch).await;
        tracing::warn!(key = %self.key, epoch, "lease lost; the run's work is dropped");
        KeyOutcome::LeaseLost
    }

    async fn drain(&self) -> Result<DrainReport> {
        // Without a consumer nothing can be delivered: skip the dispatcher, which would count
        // the key's rows only to report them (a count the run never reads, after every page).
        if !self.rt.dispatcher.has_consumer() {
            return Ok(DrainReport {
                no_consumer: true,
                ..DrainReport::default()
            });
        }
        let ctx = DrainContext {
            partition: self.partition.clone(),
            cancel: self.cancel.clone(),
        };
        self.rt.dispatcher.drain(&self.key, &self.lease, &ctx).await
    }

    fn check_running(&self) -> Result<(), CycleError> {
        if self.lease_lost() {
            Err(CycleError::LeaseLost(self.lease.epoch))
        } else if self.cancel.is_cancelled() {
            Err(CycleError::Aborted)
        } else {
            Ok(())
        }
    }

    /// Folds a drain's report into the cycle; a poison `halt` opens the circuit.
    async fn delivered(
        &self,
        cycle: &mut Cycle,
        drained: Result<DrainReport>,
    ) -> Result<(), CycleError> {
        let drained = drained?;
        cycle.delivered += drained.delivered;
        cycle.next_retry_at = schedule::earliest(cycle.next_retry_at, drained.next_retry_at);
        if drained.halted {
            cycle.schedule = self.halt(&cycle.schedule).await?;
            cycle.halted = true;
        }
        if drained.aborted && self.cancel.is_cancelled() {
            self.check_running()?;
        }
        Ok(())
    }
}
