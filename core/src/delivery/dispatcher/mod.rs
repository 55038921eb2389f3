//! The dispatcher: drains a key's outbox to the poller's consumer with per-key ordering,
//! concurrency across keys, retries, parking and hold-key.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use smol_str::SmolStr;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::consumer::{Consumer, Handler, Partition, Subscription};
use super::options::DeliveryOptions;
use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::hooks::{HookContext, Hooks, NoHooks};
use crate::model::{PKey, ParkedQuery, ParkedRow};
use crate::rng::Rng;
use crate::store::Store;

mod counters;
mod drain;
mod group;

pub use counters::DeliveryCounters;
use counters::{AttemptLog, Counters};

/// The default number of outbox rows loaded per slice.
pub const DEFAULT_DISPATCH_BATCH_SIZE: usize = 100;

/// What one drain did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DrainReport {
    /// Events delivered and acknowledged.
    pub delivered: u64,
    /// Events parked (poison).
    pub parked: u64,
    /// Failed attempts recorded for a later retry.
    pub failed: u64,
    /// The earliest time a waiting retry becomes due (epoch ms), so a daemon can wake for it.
    pub next_retry_at: Option<i64>,
    /// A poison event was parked with `halt`: the drain stopped and the circuit should open.
    pub halted: bool,
    /// The drain was cancelled or the subscriber went away; unfinished events stay pending.
    pub aborted: bool,
    /// No consumer is attached: nothing was delivered and events wait in the outbox.
    pub no_consumer: bool,
    /// Pending rows left after the drain.
    pub remaining: u64,
}

/// The caller's side of a drain: the partition handed to handlers and a cancellation token that
/// fires on stop-without-drain or lease loss.
#[derive(Clone, Debug, Default)]
pub struct DrainContext {
    /// The partition, with its transient data.
    pub partition: Partition,
    /// Cancels in-flight deliveries; they are not acknowledged and will be delivered again.
    pub cancel: CancellationToken,
}

/// Detaches a handler registered with [`Dispatcher::on`].
#[derive(Debug)]
pub struct Unsubscribe {
    slot: Arc<Slot>,
    id: u64,
}

impl Unsubscribe {
    /// Detaches the handler; events then wait in the outbox until a consumer attaches.
    pub fn unsubscribe(self) {
        self.slot.detach(self.id);
    }
}

#[derive(Default)]
struct Slot {
    consumer: Mutex<Option<(u64, Consumer)>>,
    next_id: AtomicU64,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot").finish_non_exhaustive()
    }
}

impl Slot {
    fn attach(&self, poller: &str, consumer: Consumer) -> Result<u64> {
        let mut slot = self.consumer.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_some() {
            return Err(Error::config(
                "on/subscribe",
                format!(
                    "poller '{poller}' already has a consumer: `on` and `subscribe` are exclusive, one per poller"
                ),
            ));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        *slot = Some((id, consumer));
        Ok(id)
    }

    fn detach(&self, id: u64) {
        let mut slot = self.consumer.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.as_ref().is_some_and(|(current, _)| *current == id) {
            *slot = None;
        }
    }

    fn current(&self) -> Option<Consumer> {
        self.consumer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|(_, c)| c.clone())
    }
}

/// The most events whose failed attempts are remembered at once, and the most attempts kept per
/// event: the in-memory attempt log stays bounded whatever happens to the events.
const ATTEMPT_LOG_EVENTS: usize = 10_000;
const ATTEMPT_LOG_PER_EVENT: usize = 50;

/// Delivers a poller's outbox to its consumer (one per poller).
///
/// Within an ordering key events are delivered strictly one after another in sequence order;
/// up to `concurrency` keys are in flight at once. A failed attempt is retried after a
/// full-jitter backoff, during which its key waits and other keys go on. An event that fails
/// every attempt is parked (with its history) and, with `hold_key`, holds its key until the
/// parked row is retried or discarded.
pub struct Dispatcher {
    poller: SmolStr,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    rng: Arc<dyn Rng>,
    options: DeliveryOptions,
    batch_size: usize,
    slot: Arc<Slot>,
    hooks: Arc<dyn Hooks>,
    instance_id: SmolStr,
    counters: Mutex<HashMap<String, Arc<Counters>>>,
    attempt_log: AttemptLog,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("poller", &self.poller)
            .field("options", &self.options)
            .field("batch_size", &self.batch_size)
            .finish_non_exhaustive()
    }
}

impl Dispatcher {
    /// A dispatcher for `poller`. Fails with a `Config` error naming the option when the options
    /// are invalid (concurrency 0, attempts 0, backoff max below base, batch size 0).
    pub fn new(
        poller: impl Into<String>,
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        rng: Arc<dyn Rng>,
        options: DeliveryOptions,
        batch_size: usize,
    ) -> Result<Self> {
        options.validate()?;
        if batch_size == 0 {
            return Err(Error::config(
                "dispatch_batch_size",
                "must be at least 1, got 0",
            ));
        }
        Ok(Self {
            poller: SmolStr::new(poller.into()),
            store,
            clock,
            rng,
            options,
            batch_size,
            slot: Arc::default(),
            hooks: Arc::new(NoHooks),
            instance_id: SmolStr::default(),
            counters: Mutex::default(),
            attempt_log: AttemptLog::default(),
        })
    }

    /// Reports deliveries, retries and parked events to `hooks`, as instance `instance_id`.
    #[must_use]
    pub fn with_hooks(mut self, hooks: Arc<dyn Hooks>, instance_id: impl Into<String>) -> Self {
        self.hooks = hooks;
        self.instance_id = SmolStr::new(instance_id.into());
        self
    }

    fn hook_context(&self, event: &crate::event::Event) -> HookContext {
        HookContext {
            poller: self.poller.clone(),
            partition: event.partition.clone(),
            lane: event.lane,
            instance_id: self.instance_id.clone(),
        }
    }

    async fn report_delivered(&self, event: &crate::event::Event, took: i64) {
        self.hooks
            .on_delivered(&self.hook_context(event), event, took)
            .await;
    }

    /// The poller this dispatcher serves.
    pub fn poller(&self) -> &str {
        &self.poller
    }

    /// The delivery options.
    pub fn options(&self) -> &DeliveryOptions {
        &self.options
    }

    /// The delivery counters of `partition` (`""` for an unpartitioned poller) since this
    /// dispatcher was built; zero for a partition it never delivered.
    pub fn counters(&self, partition: &str) -> DeliveryCounters {
        self.counters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(partition)
            .map(|c| c.snapshot())
            .unwrap_or_default()
    }

    fn counters_of(&self, partition: &str) -> Arc<Counters> {
        let mut all = self.counters.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(counters) = all.get(partition) {
            return Arc::clone(counters);
        }
        Arc::clone(all.entry(partition.to_owned()).or_default())
    }

    /// Attaches a handler. Fails with a `Config` error if a consumer is already attached.
    pub fn on(&self, handler: impl Handler) -> Result<Unsubscribe> {
        let id = self
            .slot
            .attach(&self.poller, Consumer::Handler(Arc::new(handler)))?;
        Ok(Unsubscribe {
            slot: Arc::clone(&self.slot),
            id,
        })
    }

    /// Attaches a pull-based subscription. Fails with a `Config` error if a consumer is already
    /// attached. Dropping the subscription detaches it.
    pub fn subscribe(&self) -> Result<Subscription> {
        let (tx, rx) = mpsc::channel(1);
        let id = self.slot.attach(&self.poller, Consumer::Subscriber(tx))?;
        let slot = Arc::clone(&self.slot);
        Ok(Subscription::new(rx, Box::new(move || slot.detach(id))))
    }

    /// Ends an attached subscription (its stream returns `None`; an event in hand is not
    /// acknowledged). A handler attached with [`on`](Self::on) stays attached.
    pub fn close_subscription(&self) {
        let mut slot = self
            .slot
            .consumer
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if matches!(slot.as_ref(), Some((_, Consumer::Subscriber(_)))) {
            *slot = None;
        }
    }

    /// True while a handler or a subscription is attached.
    pub fn has_consumer(&self) -> bool {
        self.slot.current().is_some()
    }

    /// Parked rows of `key` (poison and quarantined), oldest first.
    pub async fn list_parked(&self, key: &PKey, query: ParkedQuery) -> Result<Vec<ParkedRow>> {
        self.store.list_parked(key, query).await
    }

    /// Moves parked poison events back to the outbox as pending (releasing their hold); the next
    /// drain delivers them, then their key's successors in order. Returns how many moved. The
    /// rules of [`ops::retry_parked`](crate::ops::retry_parked): each id must name a poison row
    /// of the key, else nothing moves.
    pub async fn retry_parked(&self, key: &PKey, ids: &[String]) -> Result<u64> {
        let selection = crate::ops::ParkedSelection::ids(ids.iter().cloned());
        let retried = crate::ops::retry_parked(&*self.store, key, &selection).await?;
        Ok(retried.len() as u64)
    }

    /// Deletes parked rows (releasing their hold). Returns how many were removed. Each id must
    /// name a parked row of the key, else nothing is removed
    /// ([`ops::discard_parked`](crate::ops::discard_parked)).
    pub async fn discard_parked(&self, key: &PKey, ids: &[String]) -> Result<u64> {
        let selection = crate::ops::ParkedSelection::ids(ids.iter().cloned());
        let discarded = crate::ops::discard_parked(&*self.store, key, &selection).await?;
        Ok(discarded.len() as u64)
    }
}
