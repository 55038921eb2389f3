//! The lease keeper: renews a run's lease in the background and on demand.

use super::*;

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

    /// Renews now; false when the lease is gone.
    pub(super) async fn renew_now(&self, shared: &Shared, key: &PKey, lease: &Lease) -> bool {
        if self.lost.is_cancelled() {
            return false;
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
