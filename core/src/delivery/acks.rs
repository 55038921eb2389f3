//! The acknowledgements of one drain (one key, one lease), group-committed.
//!
//! A key's next event waits until its previous ack is durable, so a crash only ever redelivers
//! each key's newest delivered event (G3), and at most one event per group of the drain is
//! delivered but not acknowledged. The drain runs at most `max(concurrency, max_events)` groups at
//! once ([`DeliveryOptions::unacked_bound`]): that is the most a crash can redeliver (G9).
//! Handlers run at most `concurrency` at once; a group whose ack is queued gives its handler turn
//! to another group meanwhile.
//!
//! Without an ack window a queued ack is flushed as soon as the flush task runs: the acks of
//! keys finishing while one flush is in the store go together in the next (batching from
//! concurrency alone, no timer). With a window of `max_events` the flush waits until that many
//! acks are queued, the oldest has waited `max_delay`, or every group of the drain is waiting on
//! the window, whichever comes first ([`policy::flush_due`]).

use std::convert::Infallible;
use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::sync::{Notify, Semaphore, SemaphorePermit, oneshot};

use super::options::DeliveryOptions;
use super::policy::{self, FlushDue};
use crate::clock::{Clock, duration_ms};
use crate::error::{Error, Result, StoreErrorKind};
use crate::model::{Lease, PKey};
use crate::store::Store;

/// Coalesces the `ack_events` calls of one drain and bounds what is delivered but unacknowledged.
pub(crate) struct Acks<'a> {
    store: &'a dyn Store,
    clock: &'a dyn Clock,
    key: &'a PKey,
    lease: &'a Lease,
    /// Flush once this many acks are queued (1 without a window: at once).
    max_events: usize,
    /// Flush once the oldest queued ack has waited this long (ms); `None` without a window.
    max_delay_ms: Option<i64>,
    /// Handlers running at once; only needed with a window, since without one the drain runs
    /// at most `concurrency` groups, each with at most one handler running.
    handlers: Option<Semaphore>,
    state: Mutex<State>,
    /// Wakes the flush task when the queue or the waiting count changed.
    wake: Notify,
}

/// What the flush task decides on.
struct State {
    queue: Vec<(String, oneshot::Sender<Result<()>>)>,
    /// When the oldest queued ack was queued (epoch ms).
    oldest_at: i64,
    /// Groups of the drain that started and have not finished.
    live: usize,
    /// Groups waiting for their ack to be durable.
    waiting: usize,
}

impl<'a> Acks<'a> {
    /// The acks of a drain of `key` under `lease`.
    pub(crate) fn new(
        store: &'a dyn Store,
        clock: &'a dyn Clock,
        key: &'a PKey,
        lease: &'a Lease,
        options: &DeliveryOptions,
    ) -> Self {
        let (max_events, max_delay_ms) = match options.ack_window {
            Some(window) => (window.max_events, Some(duration_ms(window.max_delay))),
            None => (1, None),
        };
        Self {
            store,
            clock,
            key,
            lease,
            max_events,
            max_delay_ms,
            handlers: (options.unacked_bound() > options.concurrency)
                .then(|| Semaphore::new(options.concurrency)),
            state: Mutex::new(State {
                queue: Vec::new(),
                oldest_at: 0,
                live: 0,
                waiting: 0,
            }),
            wake: Notify::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A turn to run a handler (at most `concurrency` at once).
    pub(crate) async fn handler_turn(&self) -> Option<SemaphorePermit<'_>> {
        match &self.handlers {
            Some(handlers) => Some(acquired(handlers.acquire().await)),
            None => None,
        }
    }

    /// Queues the ack of `id` and returns once it is durable (or its flush failed).
    pub(crate) async fn ack(&self, id: &str) -> Result<()> {
        let (tx, rx) = oneshot::channel();
        {
            let mut state = self.state();
            if state.queue.is_empty() {
                state.oldest_at = self.clock.now_ms();
            }
            state.queue.push((id.to_owned(), tx));
        }
        let _waiting = self.waiting();
        rx.await.unwrap_or_else(|_| {
            Err(Error::store(
                StoreErrorKind::Other,
                true,
                "the flush carrying this ack was cancelled",
            ))
        })
    }

    /// Counts a group as started until the guard drops (its last row done, or it stopped).
    pub(crate) fn group(&self) -> Live<'_, 'a> {
        self.state().live += 1;
        Live(self)
    }

    /// Counts the caller as waiting on the window until the guard drops.
    fn waiting(&self) -> Waiting<'_, 'a> {
        self.state().waiting += 1;
        self.wake.notify_one();
        Waiting(self)
    }

    /// The flush task: runs for the whole drain, flushing whenever [`policy::flush_due`] says so.
    /// Never returns; the drain drops it once every group finished.
    pub(crate) async fn flush_loop(&self) -> Infallible {
        loop {
            let due = {
                let state = self.state();
                policy::flush_due(
                    state.queue.len(),
                    state.waiting >= state.live,
                    self.max_events,
                    self.max_delay_ms
                        .map(|delay| state.oldest_at.saturating_add(delay)),
                    self.clock.now_ms(),
                )
            };
            match due {
                FlushDue::Now => self.flush().await,
                FlushDue::Idle => self.wake.notified().await,
                FlushDue::At(deadline) => {
                    tokio::select! {
                        () = self.wake.notified() => {}
                        () = self.clock.sleep_until(deadline) => {}
                    }
                }
            }
        }
    }

    async fn flush(&self) {
        let batch = std::mem::take(&mut self.state().queue);
        let ids: Vec<String> = batch.iter().map(|(id, _)| id.clone()).collect();
        let result = self.store.ack_events(self.key, self.lease, &ids).await;
        for (_, waiter) in batch {
            let _ = waiter.send(match &result {
                Ok(()) => Ok(()),
                Err(error) => Err(same_error(error)),
            });
        }
    }
}

/// The semaphore lives as long as the drain and is never closed.
fn acquired<T>(permit: std::result::Result<T, tokio::sync::AcquireError>) -> T {
    permit.unwrap_or_else(|_| unreachable!("a drain's semaphores are never closed"))
}

/// A group of the drain that started and has not finished.
pub(crate) struct Live<'s, 'a>(&'s Acks<'a>);

impl Drop for Live<'_, '_> {
    fn drop(&mut self) {
        self.0.state().live -= 1;
        self.0.wake.notify_one();
    }
}

/// A caller counted as waiting on the window.
struct Waiting<'s, 'a>(&'s Acks<'a>);

impl Drop for Waiting<'_, '_> {
    fn drop(&mut self) {
        self.0.state().waiting -= 1;
    }
}

/// An equivalent error for every waiter of a failed flush (the kind, code and flags that
/// decide what happens next are kept; the driver error is summarised in the message).
fn same_error(error: &Error) -> Error {
    match error {
        Error::LeaseLost {
            poller,
            partition,
            epoch,
        } => Error::LeaseLost {
            poller: poller.clone(),
            partition: partition.clone(),
            epoch: *epoch,
        },
        Error::Store {
            kind,
            transient,
            message,
            ..
        } => Error::store(*kind, *transient, message.clone()),
        other => Error::store(
            StoreErrorKind::Other,
            other.is_transient(),
            other.to_string(),
        ),
    }
}
