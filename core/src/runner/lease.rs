//! The lease keeper: renews a run's lease in the background and on demand.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::model::{Lease, PKey};
use crate::runner::Shared;
use crate::store::Store;

/// The epoch of this engine's last lease on each key it ran, to tell a lease taken anew from
/// the next run of a key it already held.
///
/// A run releases its lease when it ends, and every acquisition takes the key's next epoch
/// (Store contract `acquire_lease` 1, 3 and 4, `release_lease` 1: the counter is kept and moves
/// by one per acquisition, whoever takes it). So a lease whose epoch follows this engine's last
/// one on the key means nobody took the key in between: the engine still holds it, run after
/// run. Any other epoch (the key's first run since the engine started, another instance or an
/// operation such as a replay took the key in between) is a new acquisition, and so is the
/// first one after a lost lease (forgotten by [`lost`](Self::lost)).
#[derive(Debug, Default)]
pub(crate) struct HeldLeases(Mutex<HashMap<PKey, i64>>);

impl HeldLeases {
    /// Records `lease` as this engine's lease on `key`; true when it is newly acquired (see the
    /// type's documentation), false when it continues the engine's last lease on the key.
    pub(super) fn acquired(&self, key: &PKey, lease: &Lease) -> bool {
        let mut held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let previous = held.insert(key.clone(), lease.epoch);
        previous.is_none_or(|epoch| epoch.checked_add(1) != Some(lease.epoch))
    }

    /// Forgets `key`: its lease was lost, so the next one is a new acquisition.
    pub(super) fn lost(&self, key: &PKey) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
    }
}

/// Renews a lease every `renew_every` in the background and on demand.
pub(super) struct LeaseKeeper {
    /// Fires when the lease is lost. Losing the lease cancels the run (in-flight handlers
    /// included), but not the other way round: a run cancelled by `stop` still holds its lease
    /// and releases it.
    pub(super) lost: CancellationToken,
    pub(super) run_cancel: CancellationToken,
    pub(super) stop: CancellationToken,
    pub(super) task: tokio::task::JoinHandle<()>,
    pub(super) expires_at: Arc<Mutex<i64>>,
}

impl LeaseKeeper {
    pub(super) fn start(
        shared: &Shared,
        key: &PKey,
        lease: &Lease,
        run_cancel: &CancellationToken,
    ) -> Self {
        let lost = CancellationToken::new();
        let stop = CancellationToken::new();
        let expires_at = Arc::new(Mutex::new(lease.expires_at));
        let (store, clock) = (Arc::clone(&shared.store), Arc::clone(&shared.clock));
        let (key, lease, ttl, every) = (
            key.clone(),
            lease.clone(),
            shared.lease_ttl_ms,
            shared.renew_every_ms,
        );
        let (task_lost, task_run, task_stop, task_expiry) = (
            lost.clone(),
            run_cancel.clone(),
            stop.clone(),
            Arc::clone(&expires_at),
        );
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = task_stop.cancelled() => return,
                    () = task_lost.cancelled() => return,
                    () = clock.sleep(crate::clock::ms_duration(every)) => {}
                }
                if !renew(&*store, &*clock, &key, &lease, ttl, &task_expiry).await {
                    task_lost.cancel();
                    task_run.cancel();
                    return;
                }
            }
        });
        Self {
            lost,
            run_cancel: run_cancel.clone(),
            stop,
            task,
            expires_at,
        }
    }

    /// Renews now, unless the lease was renewed (or taken) less than `renew_every` ago; false
    /// when the lease is gone. Skipping costs nothing in safety, since every write is fenced:
    /// a lease lost meanwhile fails the next write.
    pub(super) async fn renew_now(&self, shared: &Shared, key: &PKey, lease: &Lease) -> bool {
        if self.lost.is_cancelled() {
            return false;
        }
        let expires_at = *self
            .expires_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let fresh_until = expires_at
            .saturating_sub(shared.lease_ttl_ms)
            .saturating_add(shared.renew_every_ms);
        if shared.clock.now_ms() < fresh_until {
            return true;
        }
        let ok = renew(
            &*shared.store,
            &*shared.clock,
            key,
            lease,
            shared.lease_ttl_ms,
            &self.expires_at,
        )
        .await;
        if !ok {
            self.lost.cancel();
            self.run_cancel.cancel();
        }
        ok
    }

    pub(super) async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// One renewal: `false` when the store says the lease is not ours, or when it failed and the
/// lease has expired meanwhile (a transient failure before expiry is retried next time).
pub(super) async fn renew(
    store: &dyn Store,
    clock: &dyn Clock,
    key: &PKey,
    lease: &Lease,
    ttl: i64,
    expires_at: &Mutex<i64>,
) -> bool {
    let now = clock.now_ms();
    match store.renew_lease(key, lease, ttl, now).await {
        Ok(true) => {
            *expires_at.lock().unwrap_or_else(PoisonError::into_inner) = now.saturating_add(ttl);
            true
        }
        Ok(false) => false,
        Err(error) => {
            let expiry = *expires_at.lock().unwrap_or_else(PoisonError::into_inner);
            tracing::warn!(%key, %error, "lease renewal failed");
            now < expiry
        }
    }
}
