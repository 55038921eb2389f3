//! The workload every measurement shares: items of a given payload size whose subjects spread
//! over a given number of ordering keys.

use std::time::Duration;

use serde_json::{Value, json};
use watukuy_core::diff::{EventIdParts, event_id};
use watukuy_core::schedule::ScheduleOptions;
use watukuy_core::{Event, EventType, json::Json};

/// The parameters of one measurement.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Params {
    /// Events (items) per run.
    pub(crate) events: u64,
    /// Distinct ordering keys the events spread over (round robin).
    pub(crate) keys: u64,
    /// Ordering keys in flight at once (the dispatcher's concurrency).
    pub(crate) concurrency: usize,
    /// Bytes of padding in each item (on top of ~70 bytes of fields).
    pub(crate) payload: usize,
    /// End-to-end runs poll with `overlap_delivery` (a page drains while the next commits).
    pub(crate) overlap: bool,
    /// Delivery with `ack_window(n, ack_delay)`; `None`: no window (the default).
    pub(crate) ack_window: Option<usize>,
    /// The ack window's `max_delay`.
    pub(crate) ack_delay: std::time::Duration,
    /// Partitions (tenants) of the end-to-end poller, each serving every `partitions`-th item;
    /// the engine runs up to 4 of them at once, so their store calls meet.
    pub(crate) partitions: u64,
}

/// The schedule of every bench poller: one tick runs one cycle, and the key is not due again
/// within a run (a minute at least, no jitter).
pub(crate) fn one_cycle() -> ScheduleOptions {
    ScheduleOptions::default()
        .min(Duration::from_secs(60))
        .max(Duration::from_secs(600))
        .jitter(0.0)
}

/// The identity of item `i`.
pub(crate) fn identity(i: u64) -> String {
    format!("item-{i:08}")
}

/// Item `i`: an object of ~70 bytes plus `payload` bytes of padding.
pub(crate) fn item(i: u64, payload: usize) -> Value {
    json!({
        "id": identity(i),
        "status": "paid",
        "total": 12.5,
        "n": i,
        "pad": "x".repeat(payload),
    })
}

/// The ordering key of a subject: `k<i mod keys>` for `item-<i>`.
pub(crate) fn ordering_key(subject: &str, keys: u64) -> String {
    let n: u64 = subject
        .rsplit('-')
        .next()
        .and_then(|d| d.parse().ok())
        .unwrap_or(0);
    format!("k{}", n % keys.max(1))
}

/// A `created` event for item `i` at `sequence`, as the engine would commit it.
pub(crate) fn event(poller: &str, i: u64, sequence: i64, payload: usize, time: &str) -> Event {
    let subject = identity(i);
    let source = format!("urn:watukuy:{poller}");
    let hash = format!("{i:064x}");
    let id = event_id(&EventIdParts {
        source: &source,
        partition: "",
        identity: &subject,
        version_or_hash: &hash,
        schema_version: 1,
        event_type: EventType::Created,
    });
    let mut event = Event::new(id, EventType::Created, poller, subject);
    event.time = time.into();
    event.sequence = sequence;
    event.data = Some(Json::from_value(&item(i, payload)));
    event
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_spread_round_robin() {
        assert_eq!(ordering_key(&identity(0), 1000), "k0");
        assert_eq!(ordering_key(&identity(1001), 1000), "k1");
        assert_eq!(ordering_key(&identity(7), 1), "k0");
    }

    #[test]
    fn items_have_the_padding() {
        let small = item(1, 0).to_string().len();
        let big = item(1, 100).to_string().len();
        assert_eq!(big - small, 100);
        assert_eq!(event("p", 3, 1, 0, "t").subject, "item-00000003");
    }
}
