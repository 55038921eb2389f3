//! One lane cycle: page by page, fetch, plan, one `commit_poll` per page, deliver.

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::BoxStream;

use crate::cursor::{Cursor, SharedStrategy};
use crate::delivery::DrainReport;
use crate::error::{BoxError, Error, Result};
use crate::fetch::Page;
use crate::full_scan::FullScan;
use crate::hooks::{HookContext, Phase};
use crate::model::{EventCounts, Lane, PollSummary, PollerState, RateLimitInfo, ScheduleState};
use crate::poller::FetchSource;
use crate::runner::plan::Progress;
use crate::runner::{CycleError, PollResult, Run, RunReport};
use crate::store::DEFAULT_IDENTITY_BATCH;

impl Run<'_> {
    /// The poller's share of its rate budget for this cycle's lane, if it has one.
    pub(super) fn budget_charge(&self, cycle: &Cycle) -> Option<crate::fetch::BudgetCharge> {
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

    /// When the poller's budget can serve its next request, for a deferral.
    pub(super) async fn budget_ready_in(&self) -> i64 {
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

    /// One lane cycle: page by page, one commit per page, then deletes (full scans) and the
    /// lane's bookkeeping: the live lane drives the schedule, reconcile and backfill record their
    /// progress and back off on failure. Returns the state after the cycle (lanes and sequence),
    /// which the next lane of the run continues from.
    pub(super) async fn lane_cycle(
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
        report.next_retry_at = crate::schedule::earliest(report.next_retry_at, cycle.next_retry_at);
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
            quarantined: cycle.quarantined,
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
                // A budget timeout is a deferral, not a failure: no backoff, no
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

    pub(super) async fn pages(
        &self,
        cycle: &mut Cycle,
        mut scan: Option<&mut FullScan<'_>>,
    ) -> Result<(), CycleError> {
        let strategy = Arc::clone(&cycle.spec.strategy);
        let lane = cycle.spec.lane;
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
            let step = self.page(cycle, scan.as_deref_mut(), &mut cursor, &mut stream);
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
                    self.deliver(cycle).await?;
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
}

/// A fetch error as a cycle failure; 429, and 503 with Retry-After, are throttles.
pub(super) fn fetch_failure(error: BoxError) -> CycleError {
    let error = match error.downcast::<Error>() {
        Ok(error) => *error,
        Err(other) => {
            // A String, &str or a client library's error: the fetch's own failure, never an
            // HTTP error (it may not have made a request at all).
            return CycleError::Failed {
                error: Error::fetch(other),
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

/// How one page step of a cycle ended.
pub(super) enum PageStep {
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
pub(super) struct Cycle {
    pub(super) spec: LaneSpec,
    pub(super) hook: HookContext,
    /// The W3C traceparent stamped on this cycle's events.
    pub(super) traceparent: Option<String>,
    pub(super) state: PollerState,
    /// `state.lanes` moved past what the store holds (a page that changed nothing skipped its
    /// commit): the next state write carries them.
    pub(super) unsaved_lanes: bool,
    pub(super) schedule: ScheduleState,
    pub(super) sequence: i64,
    pub(super) cursor: Option<Cursor>,
    pub(super) pages: u64,
    pub(super) items: u64,
    /// Items quarantined by the pages committed so far.
    pub(super) quarantined: u64,
    pub(super) counts: EventCounts,
    pub(super) delivered: u64,
    pub(super) next_retry_at: Option<i64>,
    pub(super) unknown_invalid: bool,
    pub(super) truncated: bool,
    pub(super) saw_not_modified: bool,
    pub(super) done: bool,
    pub(super) halted: bool,
    pub(super) rate_limit: Option<RateLimitInfo>,
    /// The fetch's view of the key's validators (`None` for a full scan and for strategies
    /// without conditional requests); what a fetch stages is taken into its page's commit.
    pub(super) validators: Option<crate::fetch::ValidatorAccess>,
}

impl Cycle {
    /// Moves the cycle to where a committed page leaves it (see `PagePlan`).
    pub(super) fn apply(&mut self, progress: Progress) {
        if let Some(sequence) = progress.sequence {
            self.sequence = sequence;
        }
        if let Some(cursor) = progress.cursor {
            self.cursor = Some(cursor);
        }
        self.done |= progress.done;
        self.unknown_invalid |= progress.unknown_invalid;
    }

    fn new(state: PollerState, schedule: ScheduleState, spec: LaneSpec, hook: HookContext) -> Self {
        Self {
            spec,
            hook,
            traceparent: None,
            sequence: state.sequence,
            state,
            unsaved_lanes: false,
            schedule,
            cursor: None,
            pages: 0,
            items: 0,
            quarantined: 0,
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
