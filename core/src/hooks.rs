//! Hooks: the engine reports what it does, one method per step of a run. Every method has a no-op default.

use std::sync::Arc;

use async_trait::async_trait;
use smol_str::SmolStr;

use crate::event::Event;
use crate::json::Json;
use crate::model::{Lane, Lease, ParkedRow, PollSummary, SerializedError, ValidationIssue};
use crate::schedule::ScheduleReason;

/// Where a hook fired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HookContext {
    /// The poller.
    pub poller: SmolStr,
    /// The partition (`""` for none).
    pub partition: SmolStr,
    /// The lane running.
    pub lane: Lane,
    /// This engine's instance id.
    pub instance_id: SmolStr,
}

/// The phase a failure happened in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Fetching or processing a page.
    Fetch,
    /// Committing a page.
    Commit,
    /// Delivering events.
    Dispatch,
    /// Acquiring, renewing or releasing the lease.
    Lease,
    /// Saving the schedule.
    Schedule,
}

impl Phase {
    /// The phase's name (`fetch`, `commit`, `dispatch`, `lease`, `schedule`).
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Fetch => "fetch",
            Phase::Commit => "commit",
            Phase::Dispatch => "dispatch",
            Phase::Lease => "lease",
            Phase::Schedule => "schedule",
        }
    }
}

/// What one fetched page looked like.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FetchInfo {
    /// The 1-based page index in the cycle.
    pub page: u32,
    /// How long the fetch took.
    pub duration_ms: i64,
    /// Items returned.
    pub items: usize,
    /// The API answered 304.
    pub not_modified: bool,
}

/// What one commit wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommitInfo {
    /// Events committed.
    pub events: usize,
    /// Item rows written.
    pub upserts: usize,
    /// Item rows deleted.
    pub deletes: usize,
    /// How long the commit took.
    pub duration_ms: i64,
}

/// Observes the engine. Implement the methods you need; the rest do nothing. Hooks run inline
/// and in order, so keep them fast.
#[async_trait]
#[allow(unused_variables)]
pub trait Hooks: Send + Sync + 'static {
    /// This engine took the key's lease anew: the key's first run since the engine started,
    /// the first after another instance (or an operation such as a replay) held the key, or the
    /// first after a lost lease. Not on every run: a run takes the lease and releases it when it
    /// ends, and a run of a key this engine held last (nobody took it in between; its epoch is
    /// the next one) keeps its lease without this hook. `lease.epoch` is the new epoch.
    async fn on_lease_acquired(&self, ctx: &HookContext, lease: &Lease) {}
    /// A lane cycle started.
    async fn on_poll_start(&self, ctx: &HookContext, started_at: i64) {}
    /// A page was fetched.
    async fn on_fetch(&self, ctx: &HookContext, info: &FetchInfo) {}
    /// A page was committed.
    async fn on_commit(&self, ctx: &HookContext, info: &CommitInfo) {}
    /// An event was committed to the outbox.
    async fn on_event(&self, ctx: &HookContext, event: &Event) {}
    /// An event was delivered and acknowledged.
    async fn on_delivered(&self, ctx: &HookContext, event: &Event, duration_ms: i64) {}
    /// A delivery failed and will be retried after `delay_ms`.
    async fn on_retry(
        &self,
        ctx: &HookContext,
        event: &Event,
        error: &SerializedError,
        delay_ms: i64,
    ) {
    }
    /// An event was parked (poison).
    async fn on_parked(&self, ctx: &HookContext, row: &ParkedRow) {}
    /// An item failed validation and was quarantined.
    async fn on_invalid(&self, ctx: &HookContext, item: &Json, issues: &[ValidationIssue]) {}
    /// Every item of page `page` (`items` of them) failed validation and was quarantined, while
    /// the cursor moved past the page: usually a wrong item type (numeric ids into a `String`
    /// field) rather than bad data. Also logged at `warn`, counted in the cycle's summary
    /// (`PollSummary::quarantined`) and by `MetricsHooks` (`watukuy.pages.quarantined`).
    async fn on_page_quarantined(&self, ctx: &HookContext, page: u32, items: usize) {}
    /// A cycle failed in `phase`.
    async fn on_error(&self, ctx: &HookContext, error: &SerializedError, phase: Phase) {}
    /// The key's lease was lost (`epoch` is the rejected one).
    async fn on_lease_lost(&self, ctx: &HookContext, epoch: i64) {}
    /// The circuit opened; the next probe runs at `probe_at`.
    async fn on_circuit_open(&self, ctx: &HookContext, failures: u32, probe_at: i64) {}
    /// The circuit closed.
    async fn on_circuit_close(&self, ctx: &HookContext) {}
    /// A budget request waited `wait_ms` before it was granted.
    async fn on_budget_wait(&self, ctx: &HookContext, budget: &str, wait_ms: i64) {}
    /// The schedule changed after a live cycle.
    async fn on_schedule_change(
        &self,
        ctx: &HookContext,
        interval_ms: i64,
        next_due_at: i64,
        reason: ScheduleReason,
    ) {
    }
    /// A lane cycle ended (success or failure).
    async fn on_poll_end(&self, ctx: &HookContext, summary: &PollSummary) {}
}

/// Hooks that do nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoHooks;

impl Hooks for NoHooks {}

/// Several hook sets called in order.
#[derive(Clone, Default)]
pub struct ComposedHooks(pub Vec<Arc<dyn Hooks>>);

impl std::fmt::Debug for ComposedHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ComposedHooks({} sets)", self.0.len())
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl Hooks for ComposedHooks {
    async fn on_lease_acquired(&self, ctx: &HookContext, lease: &Lease) {
        for h in &self.0 {
            h.on_lease_acquired(ctx, lease).await;
        }
    }
    async fn on_poll_start(&self, ctx: &HookContext, started_at: i64) {
        for h in &self.0 {
            h.on_poll_start(ctx, started_at).await;
        }
    }
    async fn on_fetch(&self, ctx: &HookContext, info: &FetchInfo) {
        for h in &self.0 {
            h.on_fetch(ctx, info).await;
        }
    }
    async fn on_commit(&self, ctx: &HookContext, info: &CommitInfo) {
        for h in &self.0 {
            h.on_commit(ctx, info).await;
        }
    }
    async fn on_event(&self, ctx: &HookContext, event: &Event) {
        for h in &self.0 {
            h.on_event(ctx, event).await;
        }
    }
    async fn on_delivered(&self, ctx: &HookContext, event: &Event, duration_ms: i64) {
        for h in &self.0 {
            h.on_delivered(ctx, event, duration_ms).await;
        }
    }
    async fn on_retry(
        &self,
        ctx: &HookContext,
        event: &Event,
        error: &SerializedError,
        delay_ms: i64,
    ) {
        for h in &self.0 {
            h.on_retry(ctx, event, error, delay_ms).await;
        }
    }
    async fn on_parked(&self, ctx: &HookContext, row: &ParkedRow) {
        for h in &self.0 {
            h.on_parked(ctx, row).await;
        }
    }
    async fn on_invalid(&self, ctx: &HookContext, item: &Json, issues: &[ValidationIssue]) {
        for h in &self.0 {
            h.on_invalid(ctx, item, issues).await;
        }
    }
    async fn on_page_quarantined(&self, ctx: &HookContext, page: u32, items: usize) {
        for h in &self.0 {
            h.on_page_quarantined(ctx, page, items).await;
        }
    }
    async fn on_error(&self, ctx: &HookContext, error: &SerializedError, phase: Phase) {
        for h in &self.0 {
            h.on_error(ctx, error, phase).await;
        }
    }
    async fn on_lease_lost(&self, ctx: &HookContext, epoch: i64) {
        for h in &self.0 {
            h.on_lease_lost(ctx, epoch).await;
        }
    }
    async fn on_circuit_open(&self, ctx: &HookContext, failures: u32, probe_at: i64) {
        for h in &self.0 {
            h.on_circuit_open(ctx, failures, probe_at).await;
        }
    }
    async fn on_circuit_close(&self, ctx: &HookContext) {
        for h in &self.0 {
            h.on_circuit_close(ctx).await;
        }
    }
    async fn on_budget_wait(&self, ctx: &HookContext, budget: &str, wait_ms: i64) {
        for h in &self.0 {
            h.on_budget_wait(ctx, budget, wait_ms).await;
        }
    }
    async fn on_schedule_change(
        &self,
        ctx: &HookContext,
        interval_ms: i64,
        next_due_at: i64,
        reason: ScheduleReason,
    ) {
        for h in &self.0 {
            h.on_schedule_change(ctx, interval_ms, next_due_at, reason)
                .await;
        }
    }
    async fn on_poll_end(&self, ctx: &HookContext, summary: &PollSummary) {
        for h in &self.0 {
            h.on_poll_end(ctx, summary).await;
        }
    }
}
