//! One run of one `(poller, partition)` (SPEC §2.6): lease, drain the outbox first, the live
//! cycle page by page (one `commit_poll` per page), full-scan deletes, the schedule, release.

use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::clock::{Clock, format_rfc3339_ms};
use crate::cursor::{AdvanceInput, Cursor, SharedStrategy};
use crate::decide::{decide, dedupe_last_wins, unchanged_by_version};
use crate::delivery::{Dispatcher, DrainContext, DrainReport, Partition};
use crate::diff::{EventIdParts, event_id, sha256_hex};
use crate::error::{BoxError, Error, Result};
use crate::event::{Event, EventType};
use crate::fetch::{FetchContext, Page};
use crate::full_scan::FullScan;
use crate::hooks::{CommitInfo, FetchInfo, HookContext, Hooks, Phase};
use crate::json::Json;
use crate::model::{
    CommitBatch, EventCounts, ItemRow, Lane, LaneCursor, Lease, OutboxRow, PKey, ParkedError,
    ParkedKind, ParkedRow, PollSummary, PollerState, RateLimitInfo, ScheduleState, SerializedError,
    StatePatch,
};
use crate::poller::{DeleteConfirmation, FetchSource, OnInvalid, PollerDef, Prepared, Retain};
use crate::rng::Rng;
use crate::schedule::{self, FailureOutcome, ScheduleReason, SuccessOutcome};
use crate::store::{DEFAULT_IDENTITY_BATCH, Store};

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
    Ran(RunReport),
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
}

/// Options of one run.
pub(crate) struct RunOptions {
    /// Run the live lane even if not due (`trigger`).
    pub(crate) force: bool,
    /// Stop fetching new pages at this time (tick deadline); a running page finishes.
    pub(crate) deadline_ms: Option<i64>,
    /// Fires on stop without drain.
    pub(crate) cancel: CancellationToken,
}

/// Renews a lease every `renew_every` in the background and on demand.
struct LeaseKeeper {
    /// Fires when the lease is lost. Losing the lease cancels the run (in-flight handlers
    /// included), but not the other way round: a run cancelled by `stop` still holds its lease
    /// and releases it.
    lost: CancellationToken,
    run_cancel: CancellationToken,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    expires_at: Arc<Mutex<i64>>,
}

impl LeaseKeeper {
    fn start(shared: &Shared, key: &PKey, lease: &Lease, run_cancel: &CancellationToken) -> Self {
        let lost = CancellationToken::new();
        let stop = CancellationToken::new();
        let expires_at = Arc::new(Mutex::new(lease.expires_at));
        let (store, clock) = (Arc::clone(&shared.store), Arc::clone(&shared.clock));
        let (key, lease, ttl, every) = (
            key.clone(),
            lease.clone(),
            shared.lease_ttl_ms,
            shared.renew_every_ms,
        );
        let (task_lost, task_run, task_stop, task_expiry) = (
            lost.clone(),
            run_cancel.clone(),
            stop.clone(),
            Arc::clone(&expires_at),
        );
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = task_stop.cancelled() => return,
                    () = task_lost.cancelled() => return,
                    () = clock.sleep(crate::clock::ms_duration(every)) => {}
                }
                if !renew(&*store, &*clock, &key, &lease, ttl, &task_expiry).await {
                    task_lost.cancel();
                    task_run.cancel();
                    return;
                }
            }
        });
        Self {
            lost,
            run_cancel: run_cancel.clone(),
            stop,
            task,
            expires_at,
        }
    }

    /// Renews now; false when the lease is gone.
    async fn renew_now(&self, shared: &Shared, key: &PKey, lease: &Lease) -> bool {
        if self.lost.is_cancelled() {
            return false;
        }
        let ok = renew(
            &*shared.store,
            &*shared.clock,
            key,
            lease,
            shared.lease_ttl_ms,
            &self.expires_at,
        )
        .await;
        if !ok {
            self.lost.cancel();
            self.run_cancel.cancel();
        }
        ok
    }

    async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// One renewal: `false` when the store says the lease is not ours, or when it failed and the
/// lease has expired meanwhile (a transient failure before expiry is retried next time).
async fn renew(
    store: &dyn Store,
    clock: &dyn Clock,
    key: &PKey,
    lease: &Lease,
    ttl: i64,
    expires_at: &Mutex<i64>,
) -> bool {
    let now = clock.now_ms();
    match store.renew_lease(key, lease, ttl, now).await {
        Ok(true) => {
            *expires_at.lock().unwrap_or_else(PoisonError::into_inner) = now.saturating_add(ttl);
            true
        }
        Ok(false) => false,
        Err(error) => {
            let expiry = *expires_at.lock().unwrap_or_else(PoisonError::into_inner);
            tracing::warn!(%key, %error, "lease renewal failed");
            now < expiry
        }
    }
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
    let state = shared.store.load_state(&key).await?;
    if state.as_ref().is_some_and(|s| s.paused) {
        return Ok(KeyOutcome::Paused);
    }
    let live_due = options.force
        || state.as_ref().is_none_or(|s| {
            schedule::is_due(&s.schedule, now)
                || reconcile_due(&rt.def, s, now)
                || backfill_due(s, now)
        });
    let has_consumer = rt.dispatcher.has_consumer();
    let drain_due = has_consumer && !shared.store.load_pending(&key, 1).await?.is_empty();
    if !live_due && !drain_due {
        return Ok(KeyOutcome::NotDue);
    }
    let Some(lease) = shared
        .store
        .acquire_lease(&key, &shared.instance_id, shared.lease_ttl_ms, now)
        .await?
    else {
        return Ok(KeyOutcome::Leased);
    };
    let hook = HookContext {
        poller: key.poller.clone(),
        partition: key.partition.clone(),
        lane: Lane::Live,
        instance_id: shared.instance_id.clone(),
    };
    shared.hooks.on_lease_acquired(&hook, &lease).await;
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
    let outcome = run.execute(options.force).await;
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

    async fn execute(&self, force: bool) -> Result<KeyOutcome> {
        // Re-read under the lease: this read is authoritative.
        let state = match self.shared.store.load_state(&self.key).await? {
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
            Err(Error::LeaseLost { epoch, .. }) => return Ok(self.on_lease_lost(epoch).await),
            Err(error) => return Err(error),
        }
        let mut state = PollerState { schedule, ..state };
        let def = &self.rt.def;
        // Lanes run one after another within a key: live, then reconcile, then backfill.
        if force || schedule::is_due(&state.schedule, self.now()) {
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
            .filter(|_| reconcile_due(def, &state, self.now()))
        {
            let spec = LaneSpec {
                lane: Lane::Reconcile,
                strategy: crate::cursor::page(1).into_strategy(),
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
        if backfill_due(&state, self.now()) {
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
        let _ = state;
        // Log retention is enforced once per run, while holding the key (SPEC §8.5).
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
        Ok(KeyOutcome::Ran(report))
    }

    /// The poller's share of its rate budget for this cycle's lane, if it has one.
    fn budget_charge(&self, cycle: &Cycle) -> Option<crate::fetch::BudgetCharge> {
        let def = &self.rt.def;
        let name = def.budget.as_ref()?;
        let max_wait = self
            .shared
            .budgets
            .policy(name)
            .and_then(|p| p.max_wait)
            .unwrap_or(def.schedule.max);
        Some(crate::fetch::BudgetCharge {
            manager: Arc::clone(&self.shared.budgets),
            name: name.clone(),
            requester: format!("{}/{}", self.key.poller, self.key.partition),
            weight: def.budget_weight,
            lane: cycle.spec.lane,
            cost: def.budget_cost,
            max_wait: Some(max_wait),
            hooks: Arc::clone(&self.shared.hooks),
            hook: cycle.hook.clone(),
        })
    }

    /// When the poller's budget can serve its next request, for a deferral (SPEC §8.4).
    async fn budget_ready_in(&self) -> i64 {
        let def = &self.rt.def;
        match &def.budget {
            Some(name) => self
                .shared
                .budgets
                .ready_in_ms(name, def.budget_cost)
                .await
                .unwrap_or(1_000)
                .max(1),
            None => 1_000,
        }
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
        self.shared.hooks.on_lease_lost(&self.hook, epoch).await;
        tracing::warn!(key = %self.key, epoch, "lease lost; the run's work is dropped");
        KeyOutcome::LeaseLost
    }

    async fn drain(&self) -> Result<DrainReport> {
        let ctx = DrainContext {
            partition: self.partition.clone(),
            cancel: self.cancel.clone(),
        };
        self.rt.dispatcher.drain(&self.key, &self.lease, &ctx).await
    }

    /// A poison `halt` opens the circuit (persisted at once, fenced).
    async fn halt(&self, schedule: &ScheduleState) -> Result<ScheduleState> {
        let now = self.now();
        let error = SerializedError::new(
            "PoisonHalt",
            "a poison event was parked with poison action `halt`",
        );
        let change = schedule::poison_halt(
            schedule,
            &self.rt.def.schedule,
            &self.rt.def.circuit,
            error,
            now,
        );
        let patch = StatePatch {
            schedule: Some(change.state.clone()),
            updated_at: Some(now),
            ..StatePatch::default()
        };
        self.shared
            .store
            .save_state(&self.key, &self.lease, &patch)
            .await?;
        if change.circuit_opened {
            let probe_at = change.state.next_due_at.unwrap_or(now);
            self.shared
                .hooks
                .on_circuit_open(&self.hook, change.state.consecutive_failures, probe_at)
                .await;
        }
        Ok(change.state)
    }

    /// One lane cycle: page by page, one commit per page, then deletes (full scans) and the
    /// lane's bookkeeping: the live lane drives the schedule, reconcile and backfill record their
    /// progress and back off on failure. Returns the state after the cycle (lanes and sequence),
    /// which the next lane of the run continues from.
    async fn lane_cycle(
        &self,
        spec: LaneSpec,
        state: PollerState,
        schedule: ScheduleState,
        report: &mut RunReport,
    ) -> Result<PollerState, CycleError> {
        let started = self.now();
        let hook = HookContext {
            lane: spec.lane,
            ..self.hook.clone()
        };
        self.shared.hooks.on_poll_start(&hook, started).await;
        let lane = spec.lane;
        let traceparent = self.shared.trace.traceparent(&crate::telemetry::PollTrace {
            poller: &self.key.poller,
            partition: &self.key.partition,
            lane,
            instance_id: &self.shared.instance_id,
            started_at: started,
            sequence: state.sequence,
        });
        if let Some(traceparent) = &traceparent {
            tracing::Span::current().record("traceparent", traceparent.as_str());
        }
        // A full scan merges its listing against the stored identities as the pages arrive
        // (one stored batch at a time, see `full_scan`); the stream stays open across the
        // cycle's pages and is read only while pages are listed and after the last one.
        let mut scan = spec.full_scan.then(|| {
            FullScan::new(
                &self.key,
                self.shared
                    .store
                    .stream_identities(&self.key, DEFAULT_IDENTITY_BATCH),
            )
        });
        let conditional = !spec.full_scan && spec.strategy.conditional_requests();
        let mut cycle = Cycle::new(state, schedule, spec, hook);
        cycle.traceparent = traceparent;
        cycle.validators = conditional.then(|| {
            crate::fetch::ValidatorAccess::new(
                Arc::clone(&self.shared.store),
                self.key.clone(),
                Arc::clone(&self.shared.clock),
            )
        });
        let outcome = match self.pages(&mut cycle, scan.as_mut()).await {
            Ok(()) => self.full_scan_deletes(&mut cycle, scan).await,
            Err(e) => Err(e),
        };
        report.delivered += cycle.delivered;
        report.next_retry_at = min_opt(report.next_retry_at, cycle.next_retry_at);
        let now = self.now();
        let summary = PollSummary {
            lane,
            started_at: started,
            duration_ms: now.saturating_sub(started),
            pages: cycle.pages,
            items: cycle.items,
            events: cycle.counts,
            not_modified: cycle.saw_not_modified && cycle.items == 0,
            truncated: cycle.truncated,
        };
        let mut result = PollResult {
            poller: self.key.poller.clone(),
            partition: self.key.partition.clone(),
            lane,
            items: cycle.items,
            events: cycle.counts.created + cycle.counts.updated + cycle.counts.deleted,
            delivered: cycle.delivered,
            duration_ms: summary.duration_ms,
            error: None,
        };
        let failure = match outcome {
            Ok(()) => None,
            Err(CycleError::Failed {
                error: Error::BudgetTimeout { budget, waited_ms },
                ..
            }) => {
                // A budget timeout is a deferral, not a failure (SPEC §8.4): no backoff, no
                // circuit; the key is due again when the budget can serve it.
                let ready_in = self.budget_ready_in().await;
                tracing::info!(key = %self.key, budget, waited_ms, ready_in, lane = lane.as_str(), "cycle deferred by its rate budget");
                self.defer(&mut cycle, ready_in, now).await?;
                self.shared.hooks.on_poll_end(&cycle.hook, &summary).await;
                report.polled.push(result);
                let mut state = cycle.state;
                state.sequence = cycle.sequence;
                state.schedule = cycle.schedule;
                return Ok(state);
            }
            Err(CycleError::Failed {
                error,
                phase,
                throttle,
            }) => {
                let serialized = error.to_serialized();
                tracing::warn!(key = %self.key, %error, lane = lane.as_str(), phase = phase.as_str(), "cycle failed");
                self.shared
                    .hooks
                    .on_error(&cycle.hook, &serialized, phase)
                    .await;
                tracing::Span::current().record("error", serialized.message.as_str());
                result.error = Some(serialized.clone());
                Some((serialized, throttle))
            }
            Err(other) => return Err(other),
        };
        if lane == Lane::Live {
            self.live_bookkeeping(&mut cycle, &summary, result.events > 0, failure, now)
                .await?;
        } else {
            self.lane_bookkeeping(&mut cycle, failure.is_some(), now)
                .await?;
        }
        self.shared.hooks.on_poll_end(&cycle.hook, &summary).await;
        report.polled.push(result);
        let mut state = cycle.state;
        state.sequence = cycle.sequence;
        state.schedule = cycle.schedule;
        Ok(state)
    }

    /// The live lane drives the schedule: AIMD after a success, backoff, throttle or the
    /// circuit after a failure.
    async fn live_bookkeeping(
        &self,
        cycle: &mut Cycle,
        summary: &PollSummary,
        had_events: bool,
        failure: Option<(SerializedError, Option<Option<i64>>)>,
        now: i64,
    ) -> Result<(), CycleError> {
        let (def, u) = (&self.rt.def, self.shared.rng.next_f64());
        let failure_free = failure.is_none();
        let mut change = match failure {
            None => {
                let success = SuccessOutcome {
                    had_events,
                    not_modified: summary.not_modified,
                    truncated: cycle.truncated,
                    rate_limit: cycle.rate_limit.clone(),
                    summary: summary.clone(),
                };
                schedule::after_success(
                    &cycle.schedule,
                    &def.schedule,
                    &def.circuit,
                    &success,
                    now,
                    u,
                )
            }
            Some((error, throttle)) => {
                let failure = FailureOutcome {
                    error,
                    retry_after_ms: throttle.flatten(),
                    is_throttle: throttle.is_some(),
                    rate_limit: cycle.rate_limit.clone(),
                };
                schedule::after_failure(
                    &cycle.schedule,
                    &def.schedule,
                    &def.circuit,
                    &failure,
                    now,
                    u,
                )
            }
        };
        if cycle.halted && failure_free {
            // A poison `halt` opened the circuit during this cycle (and announced it): the
            // cycle's success must not close it again. The probe time and error stay the halt's.
            let halted = &cycle.schedule;
            change.state = ScheduleState {
                circuit: halted.circuit,
                circuit_opened_at: halted.circuit_opened_at,
                next_due_at: halted.next_due_at,
                consecutive_failures: halted.consecutive_failures,
                last_error: halted.last_error.clone(),
                ..change.state
            };
            change.reason = ScheduleReason::CircuitOpen;
            change.circuit_closed = false;
        }
        let patch = StatePatch {
            schedule: Some(change.state.clone()),
            updated_at: Some(now),
            ..StatePatch::default()
        };
        self.save_bookkeeping(cycle, &patch).await?;
        cycle.schedule = change.state.clone();
        if change.circuit_opened {
            let probe_at = change.state.next_due_at.unwrap_or(now);
            self.shared
                .hooks
                .on_circuit_open(&cycle.hook, change.state.consecutive_failures, probe_at)
                .await;
        }
        if change.circuit_closed {
            self.shared.hooks.on_circuit_close(&cycle.hook).await;
        }
        let interval = change.state.interval_ms.unwrap_or(0);
        let next_due = change.state.next_due_at.unwrap_or(now);
        self.shared
            .hooks
            .on_schedule_change(&cycle.hook, interval, next_due, change.reason)
            .await;
        Ok(())
    }

    /// Reconcile and backfill record their progress; a failure backs the lane off (full
    /// jitter on the poller's backoff) so a failing lane never runs hot (SPEC §8.6).
    async fn lane_bookkeeping(
        &self,
        cycle: &mut Cycle,
        failed: bool,
        now: i64,
    ) -> Result<(), CycleError> {
        let lane = cycle.spec.lane;
        let mut lanes = cycle.state.lanes.clone();
        let slot = lanes.slot(lane).get_or_insert_with(LaneCursor::default);
        if failed {
            let failures = slot.failures.unwrap_or(0).saturating_add(1);
            let delay = self
                .rt
                .def
                .schedule
                .backoff
                .full_jitter_ms(failures, self.shared.rng.next_f64());
            slot.failures = Some(failures);
            slot.retry_at = Some(now.saturating_add(delay.max(1)));
        } else {
            slot.failures = None;
            slot.retry_at = None;
            let complete = cycle.done && !cycle.truncated;
            slot.done = Some(complete);
            if lane == Lane::Reconcile {
                // A reconcile restarts from page 1 next time. A complete listing counts as a run,
                // and so does one the page cap cut short (it emitted no deletes): run again at
                // once, it would only be cut short again, and the daemon would re-list it in a
                // hot loop (a listing cut short by a tick deadline still runs on the next run).
                slot.cursor = None;
                let capped = cycle.truncated && cycle.pages >= u64::from(cycle.spec.cap);
                if complete || capped {
                    slot.last_run_at = Some(now);
                }
                if capped {
                    tracing::warn!(key = %self.key, cap = cycle.spec.cap, "the reconcile listing reached full_scan_page_cap: no deletes; next listing after `every`");
                }
            }
        }
        let patch = StatePatch {
            lanes: Some(lanes.clone()),
            updated_at: Some(now),
            ..StatePatch::default()
        };
        self.save_bookkeeping(cycle, &patch).await?;
        cycle.state.lanes = lanes;
        Ok(())
    }

    /// Defers the lane by `ready_in` ms without counting a failure.
    async fn defer(&self, cycle: &mut Cycle, ready_in: i64, now: i64) -> Result<(), CycleError> {
        let lane = cycle.spec.lane;
        let patch = if lane == Lane::Live {
            cycle.schedule = schedule::deferred(&cycle.schedule, ready_in, now);
            StatePatch {
                schedule: Some(cycle.schedule.clone()),
                updated_at: Some(now),
                ..StatePatch::default()
            }
        } else {
            let mut lanes = cycle.state.lanes.clone();
            lanes
                .slot(lane)
                .get_or_insert_with(LaneCursor::default)
                .retry_at = Some(now.saturating_add(ready_in));
            cycle.state.lanes = lanes.clone();
            StatePatch {
                lanes: Some(lanes),
                updated_at: Some(now),
                ..StatePatch::default()
            }
        };
        self.save_bookkeeping(cycle, &patch).await
    }

    /// Saves a cycle's bookkeeping (fenced); a failure other than a lost lease is reported and
    /// the previous value stays.
    async fn save_bookkeeping(&self, cycle: &Cycle, patch: &StatePatch) -> Result<(), CycleError> {
        match self
            .shared
            .store
            .save_state(&self.key, &self.lease, patch)
            .await
        {
            Ok(()) => Ok(()),
            Err(Error::LeaseLost { epoch, .. }) => Err(CycleError::LeaseLost(epoch)),
            Err(error) => {
                tracing::warn!(key = %self.key, %error, "saving the cycle's bookkeeping failed; the previous state stays");
                self.shared
                    .hooks
                    .on_error(&cycle.hook, &error.to_serialized(), Phase::Schedule)
                    .await;
                Ok(())
            }
        }
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

    async fn pages(
        &self,
        cycle: &mut Cycle,
        mut scan: Option<&mut FullScan<'_>>,
    ) -> Result<(), CycleError> {
        let strategy = Arc::clone(&cycle.spec.strategy);
        let fetch = cycle.spec.fetch.clone();
        let (lane, cap) = (cycle.spec.lane, cycle.spec.cap);
        // A full scan always lists from its first page: its deletes come from one complete
        // listing, so a scan interrupted at page k (a crash, a failed request, a deadline) starts
        // over instead of resuming with pages 1..k unseen.
        let stored = if cycle.spec.full_scan {
            None
        } else {
            cycle
                .state
                .lanes
                .get(lane)
                .and_then(|l| l.cursor.as_deref())
        };
        let mut cursor = match stored {
            Some(text) => strategy
                .deserialize(text)
                .map_err(|error| CycleError::Failed {
                    error,
                    phase: Phase::Fetch,
                    throttle: None,
                })?,
            None => strategy.initial(),
        };
        // The stream form is opened once per cycle, from the cycle's first cursor.
        let mut stream: Option<BoxStream<'static, Result<Page, BoxError>>> = None;
        // With `overlap_delivery`, the drain of the pages committed so far runs while the next
        // page is fetched, validated and committed (each step joins the drain before it ends).
        let mut draining: Option<BoxFuture<'_, Result<DrainReport>>> = None;
        loop {
            let step = self.page(
                cycle,
                scan.as_deref_mut(),
                (&strategy, &fetch, lane, cap),
                &mut cursor,
                &mut stream,
            );
            let (drained, step) = match draining.take() {
                Some(drain) => {
                    let (drained, step) = tokio::join!(drain, step);
                    (Some(drained), step)
                }
                None => (None, step.await),
            };
            if let Some(drained) = drained {
                self.delivered(cycle, drained).await?;
            }
            let PageStep::Page { events, last } = step? else {
                return Ok(());
            };
            if cycle.halted {
                return Ok(());
            }
            if events > 0 {
                if self.rt.def.overlap_delivery && !last {
                    draining = Some(Box::pin(self.drain()));
                } else {
                    let drained = self.drain().await;
                    self.delivered(cycle, drained).await?;
                    if cycle.halted {
                        return Ok(());
                    }
                }
            }
            if !self
                .keeper
                .renew_now(self.shared, &self.key, &self.lease)
                .await
            {
                return Err(CycleError::LeaseLost(self.lease.epoch));
            }
            if last {
                return Ok(());
            }
        }
    }

    /// Fetches, processes and commits the next page (its events are delivered by the caller).
    async fn page(
        &self,
        cycle: &mut Cycle,
        scan: Option<&mut FullScan<'_>>,
        (strategy, fetch, lane, cap): (&SharedStrategy, &FetchSource, Lane, u32),
        cursor: &mut Cursor,
        stream: &mut Option<BoxStream<'static, Result<Page, BoxError>>>,
    ) -> Result<PageStep, CycleError> {
        self.check_running()?;
        if self.deadline_ms.is_some_and(|d| self.now() >= d) || u64::from(cap) <= cycle.pages {
            cycle.truncated = true;
            return Ok(PageStep::End);
        }
        let page_index = u32::try_from(cycle.pages + 1).unwrap_or(u32::MAX);
        let ctx = FetchContext {
            cursor: strategy.for_fetch(cursor, cycle.pages == 0),
            page: page_index,
            partition: self.partition.clone(),
            lane,
            attempt: 1,
            cancel: self.cancel.clone(),
            budget: self.budget_charge(cycle),
            validators: cycle.validators.clone(),
            clock: Some(Arc::clone(&self.shared.clock)),
        };
        let fetch_started = self.now();
        let span = tracing::info_span!("watukuy.fetch", page = page_index);
        let fetching = async {
            match fetch {
                FetchSource::Pages(fetch) => Some(fetch.fetch(ctx).await),
                FetchSource::Stream(source) => {
                    stream.get_or_insert_with(|| source.pages(ctx)).next().await
                }
            }
        };
        // A fetch that ignores its cancellation token is dropped when the run is cancelled.
        let next = tokio::select! {
            biased;
            () = self.cancel.cancelled() => return Err(self.check_running().err().unwrap_or(CycleError::Aborted)),
            next = fetching.instrument(span) => next,
        };
        let Some(fetched) = next else {
            // The stream ended: the listing is complete.
            return self
                .stream_ended(cycle, cursor)
                .await
                .map(|()| PageStep::End);
        };
        // What the fetch staged belongs to this page: it lands with its commit or not at all.
        let staged = cycle
            .validators
            .as_ref()
            .map(crate::fetch::ValidatorAccess::take_staged)
            .unwrap_or_default();
        let page = fetched.map_err(fetch_failure)?;
        cycle.pages += 1;
        cycle.items += page.items.len() as u64;
        if page.rate_limit.is_some() {
            cycle.rate_limit.clone_from(&page.rate_limit);
        }
        cycle.saw_not_modified |= page.not_modified;
        let info = FetchInfo {
            page: page_index,
            duration_ms: self.now().saturating_sub(fetch_started),
            items: page.items.len(),
            not_modified: page.not_modified,
        };
        self.shared.hooks.on_fetch(&cycle.hook, &info).await;
        if page.not_modified {
            // No body: nothing to advance over, validate or commit (validators staged by other
            // requests of this fetch are dropped with the body they came from).
            return Ok(match cycle.spec.strategy.after_not_modified(cursor) {
                Some(next) => {
                    *cursor = next;
                    PageStep::Page {
                        events: 0,
                        last: false,
                    }
                }
                None => {
                    cycle.done = true;
                    PageStep::End
                }
            });
        }
        let mut processed = self.process(cycle, scan, cursor, page).await?;
        processed.validators = staged;
        let events = self.commit(cycle, processed).await?;
        if let Some(next) = cycle.cursor.clone() {
            *cursor = next;
        }
        Ok(PageStep::Page {
            events,
            last: cycle.done && stream.is_none(),
        })
    }

    /// Folds a drain's report into the cycle; a poison `halt` opens the circuit.
    async fn delivered(
        &self,
        cycle: &mut Cycle,
        drained: Result<DrainReport>,
    ) -> Result<(), CycleError> {
        let drained = drained?;
        cycle.delivered += drained.delivered;
        cycle.next_retry_at = min_opt(cycle.next_retry_at, drained.next_retry_at);
        if drained.halted {
            cycle.schedule = self.halt(&cycle.schedule).await?;
            cycle.halted = true;
        }
        if drained.aborted && self.cancel.is_cancelled() {
            self.check_running()?;
        }
        Ok(())
    }

    /// A stream of pages ended: the cycle is complete, and the strategy's end-of-cycle cursor
    /// is persisted if it differs from the last committed one.
    async fn stream_ended(&self, cycle: &mut Cycle, cursor: &Cursor) -> Result<(), CycleError> {
        if cycle.done {
            return Ok(());
        }
        cycle.done = true;
        let strategy = Arc::clone(&cycle.spec.strategy);
        let complete = strategy.on_cycle_complete(cursor);
        if &complete == cursor {
            return Ok(());
        }
        let mut lanes = cycle.state.lanes.clone();
        lanes
            .slot(cycle.spec.lane)
            .get_or_insert_with(LaneCursor::default)
            .cursor = Some(strategy.serialize(&complete));
        let patch = StatePatch {
            lanes: Some(lanes.clone()),
            updated_at: Some(self.now()),
            ..StatePatch::default()
        };
        self.shared
            .store
            .save_state(&self.key, &self.lease, &patch)
            .await?;
        cycle.state.lanes = lanes;
        cycle.cursor = Some(complete);
        Ok(())
    }

    /// Advances the cursor, validates and diffs one page; a full scan merges the page's
    /// identities before it is committed.
    async fn process(
        &self,
        cycle: &mut Cycle,
        scan: Option<&mut FullScan<'_>>,
        cursor: &Cursor,
        page: crate::fetch::Page,
    ) -> Result<Processed, CycleError> {
        let def = &self.rt.def;
        let now = self.now();
        // The cursor moves over the page as the API returned it, before validation (SPEC §2.6):
        // an invalid item must not hold a timestamp watermark back, or a page of invalid items
        // would be fetched again and again and block everything behind it.
        let input = AdvanceInput {
            items: &page.items,
            page_cursor: page.cursor.as_deref(),
            has_more: page.has_more,
            now_ms: now,
        };
        let strategy = Arc::clone(&cycle.spec.strategy);
        let advance = strategy
            .advance(cursor, input)
            .map_err(|error| CycleError::Failed {
                error,
                phase: Phase::Fetch,
                throttle: None,
            })?;
        let mut valid = Vec::new();
        let mut quarantined = Vec::new();
        // What the page lists for a full scan: valid items, and invalid ones whose identity
        // can be read (they count as seen, so an item that starts failing validation is not
        // reported deleted).
        let mut listed = Vec::new();
        let keep = advance.keep.iter().copied().chain(std::iter::repeat(true));
        for (raw, _) in page.items.iter().zip(keep).filter(|(_, keep)| *keep) {
            match (def.prepare)(raw) {
                Prepared::Valid(candidate) => valid.push(candidate),
                Prepared::Invalid { issues, identity } => match def.on_invalid {
                    OnInvalid::Fail => {
                        return Err(CycleError::Failed {
                            error: Error::Validation { issues },
                            phase: Phase::Fetch,
                            throttle: None,
                        });
                    }
                    OnInvalid::Skip => {
                        tracing::warn!(key = %self.key, ?issues, "invalid item skipped");
                        self.note_seen_invalid(cycle, &mut listed, identity);
                    }
                    OnInvalid::Quarantine => {
                        self.note_seen_invalid(cycle, &mut listed, identity);
                        let row = quarantine_row(Json::from_value(raw), issues, now);
                        quarantined.push(row);
                    }
                },
            }
        }
        // Items the fetch could not even decode (see `Page::reject`): invalid, identity unknown.
        for rejected in &page.rejected {
            let issues = vec![crate::model::ValidationIssue {
                message: rejected.reason.clone(),
                path: None,
            }];
            match def.on_invalid {
                OnInvalid::Fail => {
                    return Err(CycleError::Failed {
                        error: Error::Validation { issues },
                        phase: Phase::Fetch,
                        throttle: None,
                    });
                }
                OnInvalid::Skip => {
                    tracing::warn!(key = %self.key, ?issues, "undecodable item skipped");
                    self.note_seen_invalid(cycle, &mut listed, None);
                }
                OnInvalid::Quarantine => {
                    self.note_seen_invalid(cycle, &mut listed, None);
                    let item = Json::from_value(&serde_json::Value::String(rejected.text.clone()));
                    quarantined.push(quarantine_row(item, issues, now));
                }
            }
        }
        let kept: Vec<(String, crate::poller::Candidate)> =
            valid.into_iter().map(|c| (c.identity.clone(), c)).collect();
        let kept = dedupe_last_wins(kept);
        let identities: Vec<String> = kept.iter().map(|(id, _)| id.clone()).collect();
        if let Some(scan) = scan {
            listed.extend(identities.iter().cloned());
            scan.list(listed).await?;
        }
        let stored = self
            .shared
            .store
            .load_versions(&self.key, &identities)
            .await?;
        let cursor_json = Json::parse(&cycle.spec.strategy.serialize(&advance.cursor)).ok();
        let mut upserts = Vec::new();
        let mut events = Vec::new();
        let time = format_rfc3339_ms(now);
        for (identity, candidate) in kept {
            let row = stored.get(&identity);
            let version = candidate.version.clone();
            // Unchanged rows are not rewritten, full scans included: a scan of a million items
            // must not rewrite a million rows (deletes come from the merge, not `seen_at`).
            if unchanged_by_version(row, version.as_deref(), def.schema_version)
                && !cycle.spec.force
            {
                continue;
            }
            let value = candidate.value.clone();
            let hash = match (candidate.fingerprint)() {
                Ok(hash) => hash,
                Err(error) => {
                    // An item that cannot be fingerprinted is invalid like any other: it never
                    // fails the page it came with.
                    let issues = vec![crate::model::ValidationIssue {
                        message: format!("item {identity:?} cannot be fingerprinted: {error}"),
                        path: None,
                    }];
                    match def.on_invalid {
                        OnInvalid::Fail => {
                            return Err(CycleError::Failed {
                                error: Error::Validation { issues },
                                phase: Phase::Fetch,
                                throttle: None,
                            });
                        }
                        OnInvalid::Skip => {
                            tracing::warn!(key = %self.key, ?issues, "invalid item skipped");
                        }
                        OnInvalid::Quarantine => {
                            quarantined.push(quarantine_row(Json::from_value(&value), issues, now));
                        }
                    }
                    continue;
                }
            };
            let mut decision = decide(
                row,
                &hash,
                version.as_deref(),
                def.schema_version,
                def.on_schema_change,
                false,
            );
            // A forced backfill re-emits known, unchanged items as `updated`.
            if cycle.spec.force && decision.event.is_none() && row.is_some() {
                decision.event = Some(EventType::Updated);
            }
            let data = Json::from_value(&value);
            if decision.upsert {
                upserts.push(ItemRow {
                    identity: identity.clone(),
                    version: version.clone(),
                    hash: hash.clone(),
                    schema_version: def.schema_version,
                    payload: (def.retain == Retain::Payload).then(|| data.clone()),
                    seen_at: now,
                });
            }
            if let Some(event_type) = decision.event {
                let previous = match (event_type, def.retain) {
                    (EventType::Updated, Retain::Payload) => row.and_then(|r| r.payload.clone()),
                    _ => None,
                };
                let version_or_hash = version.clone().unwrap_or_else(|| hash.clone());
                events.push(self.event(
                    cycle,
                    &identity,
                    &version_or_hash,
                    event_type,
                    Some(data),
                    previous,
                    cursor_json.clone(),
                    &time,
                ));
            }
        }
        // A backfill also stops once it reached its target.
        let reached = cycle
            .spec
            .target
            .as_ref()
            .is_some_and(|t| strategy.reached(&advance.cursor, t));
        cycle.done = advance.done || reached;
        let lane_cursor = if advance.done {
            cycle.spec.strategy.on_cycle_complete(&advance.cursor)
        } else {
            advance.cursor.clone()
        };
        cycle.cursor = Some(lane_cursor);
        Ok(Processed {
            upserts,
            events,
            quarantined,
            ..Processed::default()
        })
    }

    fn note_seen_invalid(
        &self,
        cycle: &mut Cycle,
        listed: &mut Vec<String>,
        identity: Option<String>,
    ) {
        if cycle.spec.full_scan {
            match identity {
                Some(identity) => listed.push(identity),
                None => cycle.unknown_invalid = true,
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn event(
        &self,
        cycle: &mut Cycle,
        identity: &str,
        version_or_hash: &str,
        event_type: EventType,
        data: Option<Json>,
        previous: Option<Json>,
        cursor: Option<Json>,
        time: &str,
    ) -> Event {
        cycle.sequence += 1;
        let id = event_id(&EventIdParts {
            source: &self.rt.source,
            partition: &self.key.partition,
            identity,
            version_or_hash,
            schema_version: self.rt.def.schema_version,
            event_type,
        });
        Event {
            id,
            event_type,
            source: self.rt.source.clone(),
            subject: identity.to_owned(),
            time: time.to_owned(),
            poller: self.key.poller.clone(),
            partition: self.key.partition.clone(),
            lane: cycle.spec.lane,
            sequence: cycle.sequence,
            cursor,
            data,
            previous,
            attempt: 0,
            traceparent: cycle.traceparent.clone(),
        }
    }

    /// Commits one page (cursor, snapshot delta, events, quarantined items and the current
    /// schedule) in one transaction, then delivers.
    /// Commits one page's work in one `commit_poll` and reports it to the hooks; returns how
    /// many events it committed (the caller delivers them).
    async fn commit(&self, cycle: &mut Cycle, processed: Processed) -> Result<usize, CycleError> {
        let now = self.now();
        let mut lanes = cycle.state.lanes.clone();
        let slot = lanes
            .slot(cycle.spec.lane)
            .get_or_insert_with(LaneCursor::default);
        if let Some(cursor) = &cycle.cursor {
            slot.cursor = Some(cycle.spec.strategy.serialize(cursor));
        }
        if let Some(suspects) = processed.suspects {
            slot.suspects = Some(suspects).filter(|s| !s.is_empty());
        }
        let events = processed.events.len();
        let batch = CommitBatch {
            state_patch: StatePatch {
                lanes: Some(lanes.clone()),
                schedule: Some(cycle.schedule.clone()),
                paused: None,
                schema_version: Some(self.rt.def.schema_version),
                sequence: Some(cycle.sequence),
                updated_at: Some(now),
            },
            upserts: processed.upserts,
            deletes: processed.deletes,
            events: processed
                .events
                .iter()
                .map(|e| OutboxRow::pending(e.clone(), now))
                .collect(),
            log: self.rt.def.log_retention.is_some(),
            parked: processed.quarantined.clone(),
            validators: processed.validators,
        };
        let started = self.now();
        match self
            .shared
            .store
            .commit_poll(&self.key, &self.lease, &batch)
            .instrument(tracing::info_span!(
                "watukuy.commit",
                events,
                upserts = batch.upserts.len(),
                deletes = batch.deletes.len()
            ))
            .await
        {
            Ok(()) => {}
            Err(Error::LeaseLost { epoch, .. }) => return Err(CycleError::LeaseLost(epoch)),
            Err(error) => {
                // Nothing of the page persisted; the cursor did not move, so the next cycle
                // fetches the page again.
                cycle.sequence -= i64::try_from(events).unwrap_or(0);
                return Err(CycleError::Failed {
                    error,
                    phase: Phase::Commit,
                    throttle: None,
                });
            }
        }
        cycle.state.lanes = lanes;
        // Counted only now: a failed commit leaves the cycle's counts describing nothing of it.
        for event in &processed.events {
            match event.event_type {
                EventType::Created => cycle.counts.created += 1,
                EventType::Updated => cycle.counts.updated += 1,
                EventType::Deleted => cycle.counts.deleted += 1,
            }
        }
        let info = CommitInfo {
            events,
            upserts: batch.upserts.len(),
            deletes: batch.deletes.len(),
            duration_ms: self.now().saturating_sub(started),
        };
        self.shared.hooks.on_commit(&cycle.hook, &info).await;
        for event in &processed.events {
            self.shared.hooks.on_event(&cycle.hook, event).await;
        }
        for row in &processed.quarantined {
            let (Some(item), Some(issues)) = (&row.item, &row.error.issues) else {
                continue;
            };
            self.shared
                .hooks
                .on_invalid(&cycle.hook, item, issues)
                .await;
        }
        Ok(events)
    }

    /// After a complete full listing: everything stored but not listed is deleted (the merge
    /// of `scan` says what that is).
    async fn full_scan_deletes(
        &self,
        cycle: &mut Cycle,
        scan: Option<FullScan<'_>>,
    ) -> Result<(), CycleError> {
        let def = &self.rt.def;
        let Some(scan) = scan else {
            return Ok(());
        };
        if !(cycle.done && cycle.spec.full_scan)
            || cycle.truncated
            || cycle.saw_not_modified
            || cycle.halted
        {
            return Ok(());
        }
        if cycle.unknown_invalid {
            tracing::warn!(key = %self.key, "an invalid item had no readable identity: no deletes this cycle (set `identity_field` or `raw_identity`)");
            return Ok(());
        }
        // `None`: the store's stream broke its order, nothing can be deleted safely (the merge
        // logged why).
        let Some(missing) = scan.finish().await? else {
            return Ok(());
        };
        let lane = cycle.spec.lane;
        let previous = cycle
            .state
            .lanes
            .get(lane)
            .and_then(|l| l.suspects.clone())
            .unwrap_or_default();
        let trusted = cycle.pages <= 1 || def.delete_confirmation == DeleteConfirmation::Immediate;
        let (confirmed, suspects) = if trusted {
            (missing, Vec::new())
        } else {
            confirm_missing(missing, &previous)
        };
        if !suspects.is_empty() {
            tracing::info!(key = %self.key, lane = lane.as_str(), suspects = suspects.len(), confirmed = confirmed.len(), "items missing from a listing of several pages are reported deleted only if the next listing misses them too");
        }
        let mut suspects = Some(suspects).filter(|s| *s != previous);
        let now = self.now();
        let time = format_rfc3339_ms(now);
        let cursor_json = cycle
            .cursor
            .as_ref()
            .and_then(|c| Json::parse(&cycle.spec.strategy.serialize(c)).ok());
        let mut chunks = confirmed.chunks(DEFAULT_IDENTITY_BATCH).peekable();
        if chunks.peek().is_none() {
            if let Some(suspects) = suspects.take() {
                let processed = Processed {
                    suspects: Some(suspects),
                    ..Processed::default()
                };
                self.commit(cycle, processed).await?;
            }
            return Ok(());
        }
        while let Some(chunk) = chunks.next() {
            self.check_running()?;
            let rows = self.shared.store.load_versions(&self.key, chunk).await?;
            let mut events = Vec::new();
            for identity in chunk {
                let Some(row) = rows.get(identity) else {
                    continue;
                };
                let payload = (def.retain == Retain::Payload)
                    .then(|| row.payload.clone())
                    .flatten();
                let version_or_hash = row.version.clone().unwrap_or_else(|| row.hash.clone());
                events.push(self.event(
                    cycle,
                    identity,
                    &version_or_hash,
                    EventType::Deleted,
                    payload.clone(),
                    payload,
                    cursor_json.clone(),
                    &time,
                ));
            }
            // The new suspects land with the last chunk: a crash before it keeps the old ones,
            // so the confirmed deletes not yet committed are confirmed again next time.
            let processed = Processed {
                deletes: chunk.to_vec(),
                events,
                suspects: if chunks.peek().is_none() {
                    suspects.take()
                } else {
                    None
                },
                ..Processed::default()
            };
            if self.commit(cycle, processed).await? > 0 {
                let drained = self.drain().await;
                self.delivered(cycle, drained).await?;
            }
            if cycle.halted {
                break;
            }
        }
        Ok(())
    }
}

/// The parked row of a quarantined item: its id is derived from the item's text, so the same
/// invalid item parks once however often it is listed.
fn quarantine_row(item: Json, issues: Vec<crate::model::ValidationIssue>, now: i64) -> ParkedRow {
    let message = issues
        .iter()
        .map(|i| i.message.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    ParkedRow {
        id: format!("invalid:{}", &sha256_hex(item.as_str().as_bytes())[..32]),
        kind: ParkedKind::Invalid,
        event: None,
        item: Some(item),
        error: ParkedError {
            error: SerializedError::new("ValidationError", message).with_code("VALIDATION"),
            history: None,
            issues: Some(issues),
            details: Default::default(),
        },
        attempts: 0,
        parked_at: now,
        hold_key: None,
    }
}

/// Splits a listing's missing identities into those confirmed by the previous listing (missing
/// there too: deleted now) and the new suspects (missing for the first time). Both ascending.
fn confirm_missing(missing: Vec<String>, previous: &[String]) -> (Vec<String>, Vec<String>) {
    let previous: std::collections::HashSet<&str> = previous.iter().map(String::as_str).collect();
    missing
        .into_iter()
        .partition(|identity| previous.contains(identity.as_str()))
}

/// Whether the reconcile lane is due: never ran, or `every` passed since its last complete (or
/// page-capped) listing, and not backing off.
pub(crate) fn reconcile_due(def: &PollerDef, state: &PollerState, now: i64) -> bool {
    reconcile_due_at(def, state).is_some_and(|at| at <= now)
}

/// When the reconcile lane is next due, if the poller has one.
pub(crate) fn reconcile_due_at(def: &PollerDef, state: &PollerState) -> Option<i64> {
    let every = crate::clock::duration_ms(def.reconcile.as_ref()?.every);
    let lane = state.lanes.reconcile.as_ref();
    let after_last = lane
        .and_then(|l| l.last_run_at)
        .map_or(i64::MIN, |t| t.saturating_add(every));
    let retry = lane.and_then(|l| l.retry_at).unwrap_or(i64::MIN);
    Some(after_last.max(retry))
}

/// Whether an unfinished backfill may run now (not backing off).
pub(crate) fn backfill_due(state: &PollerState, now: i64) -> bool {
    backfill_due_at(state).is_some_and(|at| at <= now)
}

/// When an unfinished backfill may run next.
pub(crate) fn backfill_due_at(state: &PollerState) -> Option<i64> {
    let lane = state
        .lanes
        .backfill
        .as_ref()
        .filter(|l| l.done != Some(true))?;
    Some(lane.retry_at.unwrap_or(i64::MIN))
}

/// A fetch error as a cycle failure; 429, and 503 with Retry-After, are throttles.
fn fetch_failure(error: BoxError) -> CycleError {
    let error = match error.downcast::<Error>() {
        Ok(error) => *error,
        Err(other) => {
            return CycleError::Failed {
                error: Error::Http {
                    method: "FETCH".into(),
                    url: String::new(),
                    status: None,
                    message: Some(other.to_string()),
                    retry_after_ms: None,
                },
                phase: Phase::Fetch,
                throttle: None,
            };
        }
    };
    let throttle = match &error {
        Error::Http {
            status: Some(429),
            retry_after_ms,
            ..
        } => Some(*retry_after_ms),
        Error::Http {
            status: Some(503),
            retry_after_ms: Some(ms),
            ..
        } => Some(Some(*ms)),
        _ => None,
    };
    CycleError::Failed {
        error,
        phase: Phase::Fetch,
        throttle,
    }
}

/// The page work ready to commit.
#[derive(Default)]
struct Processed {
    upserts: Vec<ItemRow>,
    deletes: Vec<String>,
    events: Vec<Event>,
    /// Invalid items, parked with the page (`on_invalid: quarantine`).
    quarantined: Vec<ParkedRow>,
    /// The validators of the responses the page was built from.
    validators: Vec<crate::model::UrlValidator>,
    /// A full scan's new suspects, replacing the lane's (see `DeleteConfirmation`).
    suspects: Option<Vec<String>>,
}

/// How one page step of a cycle ended.
enum PageStep {
    /// No page was fetched: the cycle was truncated, or the stream of pages ended.
    End,
    /// A page was committed with `events` events; `last` when no page follows.
    Page { events: usize, last: bool },
}

/// What one lane cycle reads and how.
pub(crate) struct LaneSpec {
    pub(crate) lane: Lane,
    pub(crate) strategy: SharedStrategy,
    pub(crate) fetch: FetchSource,
    /// Every cycle lists everything: unseen identities are deleted after a complete listing.
    pub(crate) full_scan: bool,
    pub(crate) cap: u32,
    /// Backfill: re-emit known unchanged items as `updated`.
    pub(crate) force: bool,
    /// Backfill: stop once the cursor reached this.
    pub(crate) target: Option<Cursor>,
}

/// The running totals of one cycle.
struct Cycle {
    spec: LaneSpec,
    hook: HookContext,
    /// The W3C traceparent stamped on this cycle's events.
    traceparent: Option<String>,
    state: PollerState,
    schedule: ScheduleState,
    sequence: i64,
    cursor: Option<Cursor>,
    pages: u64,
    items: u64,
    counts: EventCounts,
    delivered: u64,
    next_retry_at: Option<i64>,
    unknown_invalid: bool,
    truncated: bool,
    saw_not_modified: bool,
    done: bool,
    halted: bool,
    rate_limit: Option<RateLimitInfo>,
    /// The fetch's view of the key's validators (`None` for a full scan and for strategies
    /// without conditional requests); what a fetch stages is taken into its page's commit.
    validators: Option<crate::fetch::ValidatorAccess>,
}

impl Cycle {
    fn new(state: PollerState, schedule: ScheduleState, spec: LaneSpec, hook: HookContext) -> Self {
        Self {
            spec,
            hook,
            traceparent: None,
            sequence: state.sequence,
            state,
            schedule,
            cursor: None,
            pages: 0,
            items: 0,
            counts: EventCounts::default(),
            delivered: 0,
            next_retry_at: None,
            unknown_invalid: false,
            truncated: false,
            saw_not_modified: false,
            done: false,
            halted: false,
            rate_limit: None,
            validators: None,
        }
    }
}

pub(crate) fn min_opt(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
