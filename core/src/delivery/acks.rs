//! Group commit of acknowledgements: the acks of events of *different* ordering keys that finish
//! at about the same time go to the store in one call.
//!
//! Each key still waits for its own ack to be durable before its next event is delivered, so a
//! crash can only redeliver each key's newest in-flight event (G3 and the chaos checker's rule
//! hold), and at most `concurrency` events are delivered but not yet acknowledged (G9). The
//! batching comes from concurrency alone: while one flush is in the store, the keys finishing
//! meanwhile queue up and go together in the next flush. Nothing waits on a timer.

use std::sync::{Mutex, PoisonError};

use tokio::sync::oneshot::{self, error::TryRecvError};

use crate::error::{Error, Result, StoreErrorKind};
use crate::model::{Lease, PKey};
use crate::store::Store;

/// Acks waiting for a flush, each with the channel its result travels back on.
type Queue = Vec<(String, oneshot::Sender<Result<()>>)>;

/// Coalesces `ack_events` calls of one drain (one key, one lease).
pub(crate) struct AckBatcher<'a> {
    store: &'a dyn Store,
    key: &'a PKey,
    lease: &'a Lease,
    queue: Mutex<Queue>,
    /// Held by the one flush in progress.
    flushing: tokio::sync::Mutex<()>,
}

impl<'a> AckBatcher<'a> {
    pub(crate) fn new(store: &'a dyn Store, key: &'a PKey, lease: &'a Lease) -> Self {
        Self {
            store,
            key,
            lease,
            queue: Mutex::new(Vec::new()),
            flushing: tokio::sync::Mutex::new(()),
        }
    }

    /// Acknowledges `id`, returning once the ack is durable (possibly together with others).
    pub(crate) async fn ack(&self, id: &str) -> Result<()> {
        let (tx, mut rx) = oneshot::channel();
        self.queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((id.to_owned(), tx));
        let _flush = self.flushing.lock().await;
        // A flush that ran while we waited for the lock may already have carried our ack.
        match rx.try_recv() {
            Ok(result) => return result,
            Err(TryRecvError::Closed) => {
                return Err(Error::store(
                    StoreErrorKind::Other,
                    true,
                    "the flush carrying this ack was cancelled",
                ));
            }
            Err(TryRecvError::Empty) => {}
        }
        // Let the other keys of this drain that are ready to ack join this flush (one yield, no
        // timer): with a store that answers without awaiting, nothing else could.
        tokio::task::yield_now().await;
        let result = self.flush_queue().await;
        rx.try_recv().unwrap_or(result)
    }

    async fn flush_queue(&self) -> Result<()> {
        let batch: Queue =
            std::mem::take(&mut *self.queue.lock().unwrap_or_else(PoisonError::into_inner));
        if batch.is_empty() {
            return Ok(());
        }
        let ids: Vec<String> = batch.iter().map(|(id, _)| id.clone()).collect();
        let result = self.store.ack_events(self.key, self.lease, &ids).await;
        for (_, waiter) in batch {
            let _ = waiter.send(match &result {
                Ok(()) => Ok(()),
                Err(error) => Err(same_error(error)),
            });
        }
        result
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
