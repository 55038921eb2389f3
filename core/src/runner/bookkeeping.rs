//! A lane cycle's book-keeping: the live lane drives the schedule (AIMD, backoff, throttle,
//! circuit, a poison halt), reconcile and backfill record their progress and back off.

use crate::error::{Error, Result};
use crate::hooks::Phase;
use crate::model::{Lane, LaneCursor, PollSummary, ScheduleState, SerializedError, StatePatch};
use crate::runner::cycle::Cycle;
use crate::runner::{CycleError, Run};
use crate::schedule;
use crate::schedule::{FailureOutcome, SuccessOutcome};

impl Run<'_> {
    /// A poison `halt` opens the circuit (persisted at once, fenced).
    pub(super) async fn halt(&self, schedule: &ScheduleState) -> Result<ScheduleState> {
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

    /// The live lane drives the schedule: AIMD after a success, backoff, throttle or the
    /// circuit after a failure.
    pub(super) async fn live_bookkeeping(
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
            change = schedule::keep_halt(change, &cycle.schedule);
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
    /// jitter on the poller's backoff) so a failing lane never runs hot.
    pub(super) async fn lane_bookkeeping(
        &self,
        cycle: &mut Cycle,
        failed: bool,
        now: i64,
    ) -> Result<(), CycleError> {
        let lane = cycle.spec.lane;
        let mut lanes = cycle.state.lanes.clone();
        let slot = lanes.slot(lane).get_or_insert_with(LaneCursor::default);
        if failed {
            let u = self.shared.rng.next_f64();
            schedule::lane_failed(slot, &self.rt.def.schedule, u, now);
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
    pub(super) async fn defer(
        &self,
        cycle: &mut Cycle,
        ready_in: i64,
        now: i64,
    ) -> Result<(), CycleError> {
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

    /// Saves a cycle's bookkeeping (fenced), with the lanes a skipped commit left unsaved; a
    /// failure other than a lost lease is reported and the previous value stays.
    pub(super) async fn save_bookkeeping(
        &self,
        cycle: &mut Cycle,
        patch: &StatePatch,
    ) -> Result<(), CycleError> {
        let carried;
        let patch = if cycle.unsaved_lanes && patch.lanes.is_none() {
            carried = StatePatch {
                lanes: Some(cycle.state.lanes.clone()),
                ..patch.clone()
            };
            &carried
        } else {
            patch
        };
        match self
            .shared
            .store
            .save_state(&self.key, &self.lease, patch)
            .await
        {
            Ok(()) => {
                cycle.unsaved_lanes = false;
                Ok(())
            }
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
}
