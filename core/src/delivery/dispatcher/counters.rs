//! What a dispatcher counts per partition, and the attempt log parked rows carry.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use crate::delivery::dispatcher::{ATTEMPT_LOG_EVENTS, ATTEMPT_LOG_PER_EVENT};
use crate::model::AttemptRecord;

/// Delivery counters of one `(poller, partition)` since this engine started (in memory, per
/// engine instance; they restart at zero with the process).
///
/// `received` counts every delivery handed to the consumer (each attempt). A successful attempt
/// counts as `applied`, `deduplicated` or `skipped` according to what the handler reported with
/// [`HandlerContext::report`](crate::HandlerContext::report) (an unreported success is `applied`; `apply_once`'s outcome reports
/// itself with `ApplyOutcome::report`). `failed` counts failed attempts (errors, panics,
/// timeouts, missing manual acks), whether retried or parked. Attempts cut short by cancellation
/// or a vanished subscriber count only as received.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct DeliveryCounters {
    /// Deliveries handed to the consumer.
    pub received: u64,
    /// Successful deliveries that changed something (or reported nothing).
    pub applied: u64,
    /// Successful deliveries the handler reported as duplicates.
    pub deduplicated: u64,
    /// Successful deliveries the handler reported as skipped.
    pub skipped: u64,
    /// Failed attempts.
    pub failed: u64,
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) received: AtomicU64,
    pub(super) applied: AtomicU64,
    pub(super) deduplicated: AtomicU64,
    pub(super) skipped: AtomicU64,
    pub(super) failed: AtomicU64,
}

impl Counters {
    pub(super) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn snapshot(&self) -> DeliveryCounters {
        DeliveryCounters {
            received: self.received.load(Ordering::Relaxed),
            applied: self.applied.load(Ordering::Relaxed),
            deduplicated: self.deduplicated.load(Ordering::Relaxed),
            skipped: self.skipped.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
        }
    }
}

/// Failed attempts of events still being retried, by `(partition, event id)`, so a parked row
/// can carry its timed attempt history. In memory: attempts made before a restart or by another
/// instance are known only through the outbox row's last error.
#[derive(Default)]
pub(super) struct AttemptLog {
    pub(super) entries: Mutex<HashMap<(String, String), Vec<AttemptRecord>>>,
}

impl AttemptLog {
    pub(super) fn push(&self, partition: &str, event_id: &str, record: AttemptRecord) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (partition.to_owned(), event_id.to_owned());
        if !entries.contains_key(&key) && entries.len() >= ATTEMPT_LOG_EVENTS {
            return;
        }
        let log = entries.entry(key).or_default();
        if log.len() >= ATTEMPT_LOG_PER_EVENT {
            log.remove(0);
        }
        log.push(record);
    }

    pub(super) fn take(&self, partition: &str, event_id: &str) -> Vec<AttemptRecord> {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(partition.to_owned(), event_id.to_owned()))
            .unwrap_or_default()
    }
}
