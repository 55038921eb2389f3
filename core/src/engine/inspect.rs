//! What `inspect()` reports.

use futures::TryStreamExt;

use futures::StreamExt;
use serde::Serialize;

use crate::engine::{Engine, Status};
use crate::error::Result;
use crate::model::{PKey, PollerState};
use crate::runner;

/// What `inspect()` reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct InspectReport {
    /// This engine's instance id.
    pub instance_id: String,
    /// The engine's status.
    pub status: Status,
    /// When the report was made (epoch ms).
    pub generated_at: i64,
    /// One entry per active `(poller, partition)`.
    pub pollers: Vec<PollerInspect>,
}

/// The state of one `(poller, partition)`: what its store holds (read through
/// [`ops::inspect_key`](crate::ops::inspect_key), the same for the engine, the CLI and the admin
/// page; its fields read directly through `Deref`), and this engine's delivery counters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct PollerInspect {
    /// The key as its store holds it (the schedule is the poller's initial one for a key that
    /// never ran; `lag_ms` comes from the poller's strategy).
    #[serde(flatten)]
    pub key: crate::ops::KeyInspect,
    /// This engine's delivery counters for the key (received, applied, deduplicated, skipped,
    /// failed), in memory since the engine was built.
    pub delivery: crate::delivery::DeliveryCounters,
}

impl std::ops::Deref for PollerInspect {
    type Target = crate::ops::KeyInspect;

    fn deref(&self) -> &Self::Target {
        &self.key
    }
}

impl Engine {
    /// A plain, serializable report of every active `(poller, partition)`.
    ///
    /// Reads each key's state, lease and counts at once, and up to
    /// [`max_concurrent_keys`](crate::EngineBuilder::max_concurrent_keys) keys at a time: one
    /// store latency per that many keys, not three per key.
    pub async fn inspect(&self) -> Result<InspectReport> {
        let inner = &self.inner;
        let now = inner.now();
        let mut keys = Vec::new();
        for (name, rt) in &inner.pollers {
            if let Err(error) = inner.refresh_partitions(rt, false).await {
                tracing::warn!(poller = %name, %error, "partition refresh failed; keeping the previous list");
            }
            let initial = self.initial_state(rt);
            keys.extend(
                inner
                    .partition_list(name)
                    .into_iter()
                    .map(|partition| (rt, initial.clone(), partition)),
            );
        }
        // The futures are built first: a stream `map` closure over borrowed keys makes the
        // engine's futures fail `Send` for every lifetime (a known limit of the compiler).
        let reads: Vec<_> = keys
            .into_iter()
            .map(|(rt, initial, partition)| self.inspect_one(rt, initial, partition, now))
            .collect();
        let pollers = futures::stream::iter(reads)
            .buffered(inner.max_concurrent_keys)
            .try_collect::<Vec<_>>()
            .await?;
        Ok(InspectReport {
            instance_id: inner.shared.instance_id.clone(),
            status: self.status(),
            generated_at: now,
            pollers,
        })
    }

    /// The health check of this engine ([`ops::health`](crate::ops::health) over
    /// [`inspect`](Self::inspect)): up or down, each reason in a sentence, and one row per
    /// `(poller, partition)`. For liveness and readiness probes (`watukuy-admin` serves it as a
    /// route answering 200 or 503).
    pub async fn health(
        &self,
        options: &crate::ops::HealthOptions,
    ) -> Result<crate::ops::HealthReport> {
        Ok(crate::ops::health(&self.inspect().await?, options))
    }

    /// One key's entry of [`inspect`](Self::inspect).
    async fn inspect_one(
        &self,
        rt: &runner::Runtime,
        initial: PollerState,
        partition: crate::Partition,
        now: i64,
    ) -> Result<PollerInspect> {
        let key = PKey::new(rt.def.name.clone(), partition.key.clone());
        let strategy = &rt.def.strategy;
        let lag = |text: &str, now: i64| {
            let cursor = strategy.deserialize(text).ok()?;
            strategy.lag_ms(&cursor, now)
        };
        let store = &*self.inner.shared.store;
        Ok(PollerInspect {
            key: crate::ops::inspect_key(store, &key, now, initial, lag).await?,
            delivery: rt.dispatcher.counters(&partition.key),
        })
    }

    /// Whether everything seen so far is delivered, for health checks and tests: every
    /// `(poller, partition)` has completed a poll whose listing ended (its last cycle was not
    /// cut short by `max_pages_per_cycle`, a deadline or the full-scan page cap), no event of
    /// any key is pending in the outbox or parked, and no key has suspects: items a full scan
    /// missed and has not yet reported deleted, which wait for the next complete listing
    /// ([`DeleteConfirmation::NextListing`](crate::poller::DeleteConfirmation::NextListing)) or for a
    /// failed lookup to be tried again ([`DeleteConfirmation::Lookup`](crate::poller::DeleteConfirmation::Lookup))
    /// (`suspects` in [`inspect`](Self::inspect)). Changes the API made since the last poll are
    /// not seen yet, so they do not count. Reads the store (as [`inspect`](Self::inspect)).
    pub async fn caught_up(&self) -> Result<bool> {
        Ok(self.inspect().await?.pollers.iter().all(|key| {
            key.last_poll.as_ref().is_some_and(|poll| !poll.truncated)
                && key.outbox_pending == 0
                && key.parked == 0
                && key.suspects == 0
        }))
    }
}
