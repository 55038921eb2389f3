//! [`MetricsHooks`] and [`record_gauges`]: the metrics of the table in [`super`].

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};

use async_trait::async_trait;
use metrics::{counter, gauge, histogram};

use crate::engine::InspectReport;
use crate::event::Event;
use crate::hooks::{CommitInfo, FetchInfo, HookContext, Hooks, Phase};
use crate::json::Json;
use crate::model::{Circuit, Lease, ParkedRow, PollSummary, SerializedError, ValidationIssue};
use crate::schedule::ScheduleReason;

/// Hooks that record metrics. One instance per engine.
#[derive(Debug, Default)]
pub struct MetricsHooks {
    /// Cycles (poller, partition, lane) that reported an error, so `on_poll_end` can label
    /// the duration with its outcome.
    failed: Mutex<HashSet<(String, String, &'static str)>>,
}

impl MetricsHooks {
    /// Hooks recording through the globally installed `metrics` recorder.
    pub fn new() -> Self {
        Self::default()
    }

    fn cycle(ctx: &HookContext) -> (String, String, &'static str) {
        (
            ctx.poller.to_string(),
            ctx.partition.to_string(),
            ctx.lane.as_str(),
        )
    }
}

/// A millisecond count as a histogram value.
fn ms(value: i64) -> f64 {
    crate::backoff::ms_f64(value.max(0))
}

/// A count as a gauge value.
fn count(value: u64) -> f64 {
    crate::backoff::ms_f64(i64::try_from(value).unwrap_or(i64::MAX))
}

macro_rules! labels {
    ($ctx:expr) => {
        [
            ("poller", $ctx.poller.to_string()),
            ("partition", $ctx.partition.to_string()),
            ("lane", $ctx.lane.as_str().to_owned()),
        ]
    };
}

#[async_trait]
impl Hooks for MetricsHooks {
    async fn on_lease_acquired(&self, _ctx: &HookContext, _lease: &Lease) {}

    async fn on_poll_start(&self, ctx: &HookContext, _started_at: i64) {
        self.failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&Self::cycle(ctx));
    }

    async fn on_fetch(&self, ctx: &HookContext, info: &FetchInfo) {
        counter!("watukuy.items.fetched", &labels!(ctx))
            .increment(u64::try_from(info.items).unwrap_or(u64::MAX));
    }

    async fn on_commit(&self, _ctx: &HookContext, _info: &CommitInfo) {}

    async fn on_event(&self, ctx: &HookContext, event: &Event) {
        let mut labels = labels!(ctx).to_vec();
        labels.push(("watukuy.event.type", event.event_type.as_str().to_owned()));
        counter!("watukuy.events.emitted", &labels).increment(1);
    }

    async fn on_delivered(&self, ctx: &HookContext, _event: &Event, duration_ms: i64) {
        counter!("watukuy.events.delivered", &labels!(ctx)).increment(1);
        histogram!("watukuy.deliver.duration", &labels!(ctx)).record(ms(duration_ms));
    }

    async fn on_retry(
        &self,
        ctx: &HookContext,
        _event: &Event,
        _error: &SerializedError,
        _delay_ms: i64,
    ) {
        counter!("watukuy.events.retried", &labels!(ctx)).increment(1);
    }

    async fn on_parked(&self, ctx: &HookContext, row: &ParkedRow) {
        let mut labels = labels!(ctx).to_vec();
        labels.push(("watukuy.kind", row.kind.as_str().to_owned()));
        counter!("watukuy.events.parked", &labels).increment(1);
    }

    async fn on_invalid(&self, ctx: &HookContext, _item: &Json, _issues: &[ValidationIssue]) {
        counter!("watukuy.items.invalid", &labels!(ctx)).increment(1);
    }

    async fn on_page_quarantined(&self, ctx: &HookContext, _page: u32, _items: usize) {
        counter!("watukuy.pages.quarantined", &labels!(ctx)).increment(1);
    }

    async fn on_error(&self, ctx: &HookContext, _error: &SerializedError, phase: Phase) {
        let mut labels = labels!(ctx).to_vec();
        labels.push(("watukuy.phase", phase.as_str().to_owned()));
        counter!("watukuy.errors", &labels).increment(1);
        if phase != Phase::Dispatch {
            self.failed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(Self::cycle(ctx));
        }
    }

    async fn on_lease_lost(&self, ctx: &HookContext, _epoch: i64) {
        counter!("watukuy.lease.lost", &labels!(ctx)).increment(1);
    }

    async fn on_circuit_open(&self, ctx: &HookContext, _failures: u32, _probe_at: i64) {
        counter!("watukuy.circuit.opened", &labels!(ctx)).increment(1);
        gauge!("watukuy.circuit.state", "poller" => ctx.poller.to_string(), "partition" => ctx.partition.to_string()).set(2.0);
    }

    async fn on_circuit_close(&self, ctx: &HookContext) {
        gauge!("watukuy.circuit.state", "poller" => ctx.poller.to_string(), "partition" => ctx.partition.to_string()).set(0.0);
    }

    async fn on_budget_wait(&self, ctx: &HookContext, budget: &str, wait_ms: i64) {
        let mut labels = labels!(ctx).to_vec();
        labels.push(("watukuy.budget", budget.to_owned()));
        counter!("watukuy.budget.waits", &labels).increment(1);
        histogram!("watukuy.budget.wait", &labels).record(ms(wait_ms));
    }

    async fn on_schedule_change(
        &self,
        ctx: &HookContext,
        interval_ms: i64,
        _next_due_at: i64,
        _reason: ScheduleReason,
    ) {
        gauge!("watukuy.schedule.interval", "poller" => ctx.poller.to_string(), "partition" => ctx.partition.to_string())
            .set(ms(interval_ms));
    }

    async fn on_poll_end(&self, ctx: &HookContext, summary: &PollSummary) {
        let failed = self
            .failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&Self::cycle(ctx));
        let mut labels = labels!(ctx).to_vec();
        labels.push((
            "watukuy.outcome",
            if failed { "error" } else { "ok" }.to_owned(),
        ));
        histogram!("watukuy.poll.duration", &labels).record(ms(summary.duration_ms));
    }
}

/// Records the state gauges of an `inspect()` report: per (poller, partition)
/// `watukuy.outbox.pending`, `watukuy.parked`, `watukuy.items`, `watukuy.lag` (ms, timestamp
/// strategy only), `watukuy.circuit.state` (0 closed, 1 half-open, 2 open) and
/// `watukuy.schedule.interval` (ms).
pub fn record_gauges(report: &InspectReport) {
    for key in &report.pollers {
        let labels = [
            ("poller", key.poller.clone()),
            ("partition", key.partition.clone()),
        ];
        gauge!("watukuy.outbox.pending", &labels).set(count(key.outbox_pending));
        gauge!("watukuy.parked", &labels).set(count(key.parked));
        gauge!("watukuy.items", &labels).set(count(key.items));
        if let Some(lag) = key.lag_ms {
            gauge!("watukuy.lag", &labels).set(ms(lag));
        }
        let circuit = match key.schedule.circuit {
            Circuit::Closed => 0.0,
            Circuit::HalfOpen => 1.0,
            Circuit::Open => 2.0,
        };
        gauge!("watukuy.circuit.state", &labels).set(circuit);
        if let Some(interval) = key.schedule.interval_ms {
            gauge!("watukuy.schedule.interval", &labels).set(ms(interval));
        }
    }
}

#[cfg(test)]
mod tests {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    use super::*;
    use crate::model::Lane;

    fn ctx() -> HookContext {
        HookContext {
            poller: "orders".into(),
            partition: "".into(),
            lane: Lane::Live,
            instance_id: "node-a".into(),
        }
    }

    fn summary() -> PollSummary {
        PollSummary {
            lane: Lane::Live,
            started_at: 0,
            duration_ms: 42,
            pages: 1,
            items: 3,
            events: crate::model::EventCounts::default(),
            not_modified: false,
            truncated: false,
            quarantined: 0,
        }
    }

    #[test]
    fn hooks_record_counters_histograms_and_outcomes() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            runtime.block_on(async {
                let hooks = MetricsHooks::new();
                let ctx = ctx();
                hooks.on_poll_start(&ctx, 0).await;
                hooks
                    .on_fetch(
                        &ctx,
                        &FetchInfo {
                            page: 1,
                            duration_ms: 5,
                            items: 3,
                            not_modified: false,
                        },
                    )
                    .await;
                hooks
                    .on_error(
                        &ctx,
                        &SerializedError::new("HttpError", "503"),
                        Phase::Fetch,
                    )
                    .await;
                hooks.on_poll_end(&ctx, &summary()).await;
                hooks.on_poll_start(&ctx, 0).await;
                hooks.on_poll_end(&ctx, &summary()).await;
            });
        });
        type Recorded = (String, Vec<(String, String)>, DebugValue);
        let metrics: Vec<Recorded> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(key, _, _, value)| {
                let labels = key
                    .key()
                    .labels()
                    .map(|l| (l.key().to_owned(), l.value().to_owned()))
                    .collect();
                (key.key().name().to_owned(), labels, value)
            })
            .collect();
        let find = |name: &str, outcome: Option<&str>| {
            metrics.iter().find(|(n, labels, _)| {
                n == name
                    && outcome.is_none_or(|o| {
                        labels.iter().any(|(k, v)| k == "watukuy.outcome" && v == o)
                    })
            })
        };
        assert!(matches!(
            find("watukuy.items.fetched", None),
            Some((_, _, DebugValue::Counter(3)))
        ));
        assert!(matches!(
            find("watukuy.errors", None),
            Some((_, _, DebugValue::Counter(1)))
        ));
        let labels = &find("watukuy.items.fetched", None).unwrap().1;
        assert!(
            labels.iter().all(|(k, _)| k != "instance_id"),
            "no high-cardinality labels: {labels:?}"
        );
        match find("watukuy.poll.duration", Some("error")) {
            Some((_, _, DebugValue::Histogram(values))) => assert_eq!(values.len(), 1),
            other => panic!("the failed cycle is labelled error: {other:?}"),
        }
        match find("watukuy.poll.duration", Some("ok")) {
            Some((_, _, DebugValue::Histogram(values))) => assert_eq!(values.len(), 1),
            other => panic!("the next cycle is labelled ok: {other:?}"),
        }
    }
}
