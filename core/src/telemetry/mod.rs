//! Telemetry: the W3C trace context stamped on events ([`TraceContext`]) and, with the
//! `metrics` feature (on by default), metrics through the [`metrics`](https://docs.rs/metrics)
//! facade: attach [`MetricsHooks`] with `EngineBuilder::hooks` and install any `metrics`
//! exporter (Prometheus, StatsD, OTLP...). Without the feature, `watukuy-core` does not depend
//! on `metrics` at all.
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
//! | `watukuy.pages.quarantined` | counter | | every page whose items were all quarantined |
//! | `watukuy.errors` | counter | `watukuy.phase` | every reported error |
//! | `watukuy.lease.lost` | counter | | every lost lease |
//! | `watukuy.circuit.opened` | counter | | every time a circuit opens |
//! | `watukuy.budget.waits` | counter | `watukuy.budget` | every budget grant that had to wait |
//! | `watukuy.budget.wait` | histogram | `watukuy.budget` | the length of that wait |
//! | `watukuy.circuit.state` | gauge, no `lane` | | 0 closed, 1 half-open, 2 open |
//! | `watukuy.schedule.interval` | gauge, no `lane` | | the live interval after every cycle |
//!
//! Gauges that describe stored state (outbox pending, parked, snapshot size, lag) are not
//! events: call `record_gauges` with an `inspect()` report, e.g. every scrape or every 30 s.

#[cfg(feature = "metrics")]
mod hooks;

#[cfg(feature = "metrics")]
pub use hooks::{MetricsHooks, record_gauges};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Lane;

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
}
