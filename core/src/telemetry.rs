//! Metrics through the [`metrics`] facade: attach [`MetricsHooks`] with
//! `EngineBuilder::hooks` and install any `metrics` exporter (Prometheus, StatsD, OTLP...).
//!
//! The names are those of the TypeScript reference's OpenTelemetry hooks, so dashboards carry
//! over. Labels are `poller`, `partition` and `lane` (never the instance id or an event id, which
//! would explode cardinality), plus the extra label a row names. Durations are milliseconds;
//! exporters that take bucket boundaries should use [`HISTOGRAM_BUCKETS_MS`].
//!
//! | metric | kind | extra label | recorded |
//! |---|---|---|---|
//! | `watukuy.poll.duration` | histogram | `watukuy.outcome` (`ok`, `error`) | at the end of every lane cycle |
//! | `watukuy.items.fetched` | counter | | items of every fetched page |
//! | `watukuy.events.emitted` | counter | `watukuy.event.type` | every committed event |
//! | `watukuy.events.delivered` | counter | | every successful delivery |
//! | `watukuy.deliver.duration` | histogram | | every successful delivery |
//! | `watukuy.events.retried` | counter | | every failed attempt that will be retried |
//! | `watukuy.events.parked` | counter | `watukuy.kind` (`poison`, `invalid`) | every parked row |
//! | `watukuy.items.invalid` | counter | | every quarantined item |
//! | `watukuy.errors` | counter | `watukuy.phase` | every reported error |
//! | `watukuy.lease.lost` | counter | | every lost lease |
//! | `watukuy.circuit.opened` | counter | | every time a circuit opens |
//! | `watukuy.budget.waits` | counter | `watukuy.budget` | every budget grant that had to wait |
//! | `watukuy.budget.wait` | histogram | `watukuy.budget` | the length of that wait |
//! | `watukuy.circuit.state` | gauge, no `lane` | | 0 closed, 1 half-open, 2 open |
//! | `watukuy.schedule.interval` | gauge, no `lane` | | the live interval after every cycle |
//!
//! Gauges that describe stored state (outbox pending, parked, snapshot size, lag) are not
//! events: call [`record_gauges`] with an `inspect()` report, e.g. every scrape or every 30 s.

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

/// What a [`TraceContext`] knows about the poll cycle whose events it stamps.
#[derive(Clone, Copy, Debug)]
pub struct PollTrace<'a> {
    /// The poller.
    pub poller: &'a str,
    /// The partition.
    pub partition: &'a str,
    /// The lane.
    pub lane: crate::model::Lane,
    /// The engine's instance id.
    pub instance_id: &'a str,
    /// When the cycle started (epoch ms).
    pub started_at: i64,
    /// The key's outbox sequence when the cycle started.
    pub sequence: i64,
}

/// Chooses the W3C `traceparent` stamped on the events a poll cycle commits, so consumers can
/// link their work to the poll that observed the change.
///
/// With OpenTelemetry, implement it to return the current context's traceparent; the default,
/// [`GeneratedTraceContext`], makes one per cycle.
pub trait TraceContext: Send + Sync + 'static {
    /// The traceparent for the cycle, or `None` to stamp nothing.
    fn traceparent(&self, poll: &PollTrace<'_>) -> Option<String>;
}

/// A fresh, deterministic trace per poll cycle: trace and span ids derived (SHA-256) from the
/// instance, key, lane, start time and sequence, so the same run gives the same ids (G8).
#[derive(Clone, Copy, Debug, Default)]
pub struct GeneratedTraceContext;

impl TraceContext for GeneratedTraceContext {
    fn traceparent(&self, poll: &PollTrace<'_>) -> Option<String> {
        let material = format!(
            "{}|{}|{}|{}|{}|{}",
            poll.instance_id,
            poll.poller,
            poll.partition,
            poll.lane.as_str(),
            poll.started_at,
            poll.sequence
        );
        let digest = crate::diff::sha256_hex(material.as_bytes());
        Some(format!("00-{}-{}-01", &digest[..32], &digest[32..48]))
    }
}

/// True for a well-formed W3C `traceparent` of version `00`.
pub fn is_traceparent(value: &str) -> bool {
    let parts: Vec<&str> = value.split('-').collect();
    let hex = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    parts.len() == 4
        && parts[0] == "00"
        && hex(parts[1], 32)
        && hex(parts[2], 16)
        && hex(parts[3], 2)
        && parts[1] != "0".repeat(32)
        && parts[2] != "0".repeat(16)
}

/// Histogram bucket boundaries in milliseconds, from 5 ms to one minute.
pub const HISTOGRAM_BUCKETS_MS: [f64; 13] = [
    5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1_000.0, 2_500.0, 5_000.0, 10_000.0, 30_000.0,
    60_000.0,
];

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
        (ctx.poller.clone(), ctx.partition.clone(), ctx.lane.as_str())
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
            ("poller", $ctx.poller.clone()),
            ("partition", $ctx.partition.clone()),
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
        gauge!("watukuy.circuit.state", "poller" => ctx.poller.clone(), "partition" => ctx.partition.clone()).set(2.0);
    }

    async fn on_circuit_close(&self, ctx: &HookContext) {
        gauge!("watukuy.circuit.state", "poller" => ctx.poller.clone(), "partition" => ctx.partition.clone()).set(0.0);
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
        gauge!("watukuy.schedule.interval", "poller" => ctx.poller.clone(), "partition" => ctx.partition.clone())
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
        }
    }

    #[test]
    fn generated_traceparents_are_valid_distinct_and_deterministic() {
        let poll = PollTrace {
            poller: "orders",
            partition: "",
            lane: Lane::Live,
            instance_id: "node-a",
            started_at: 1,
            sequence: 0,
        };
        let a = GeneratedTraceContext.traceparent(&poll).unwrap();
        assert!(is_traceparent(&a), "{a}");
        assert_eq!(Some(a.clone()), GeneratedTraceContext.traceparent(&poll));
        let b = GeneratedTraceContext
            .traceparent(&PollTrace {
                started_at: 2,
                ..poll
            })
            .unwrap();
        assert_ne!(a, b);
        assert!(!is_traceparent("00-abc-def-01"));
        assert!(!is_traceparent(&format!(
            "00-{}-{}-01",
            "0".repeat(32),
            "1".repeat(16)
        )));
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
