//! The daemon: runs due keys, sleeps until the next one is due, wakes early on demand.

use super::*;

impl Inner {
    /// When a key should next run, from its state and a run's outcome.
    pub(super) async fn next_due(&self, rt: &Runtime, key: &PKey, retry_at: Option<i64>) -> i64 {
        let now = self.now();
        let state = match self.shared.store.load_state(key).await {
            Ok(state) => state,
            Err(error) => {
                tracing::warn!(%key, %error, "loading state failed; retrying after schedule.min");
                return now.saturating_add(duration_ms(rt.def.schedule.min));
            }
        };
        let Some(state) = state else { return now };
        if state.paused {
            return now.saturating_add(duration_ms(MAX_SLEEP));
        }
        let due = schedule::key_due_at(&rt.def, &state, now);
        let retry = if rt.dispatcher.has_consumer() {
            retry_at
        } else {
            None
        };
        runner::min_opt(Some(due), retry).unwrap_or(due)
    }
}

/// The daemon: runs due keys, sleeps until the next is due (at most 30 s), wakes early on
/// `on`, `subscribe`, `trigger`, `resume` and parked retries.
pub(super) async fn daemon_loop(
    inner: Arc<Inner>,
    stop: CancellationToken,
    runs: CancellationToken,
) {
    let mut due: HashMap<(String, String), i64> = HashMap::new();
    let mut in_flight: tokio::task::JoinSet<((String, String), i64)> = tokio::task::JoinSet::new();
    let mut running: HashSet<(String, String)> = HashSet::new();
    let mut reread_at = inner.now();
    loop {
        if stop.is_cancelled() {
            break;
        }
        let now = inner.now();
        if now >= reread_at {
            // Other processes change keys too (a CLI trigger, another engine's resume): re-read
            // every key's state at least every MAX_SLEEP instead of trusting cached due times.
            due.clear();
            reread_at = now.saturating_add(duration_ms(MAX_SLEEP));
        }
        let mut active = HashSet::new();
        for (name, rt) in &inner.pollers {
            if let Err(error) = inner.refresh_partitions(rt, false).await {
                tracing::warn!(poller = %name, %error, "partition refresh failed; keeping the previous list");
            }
            for partition in inner.partition_list(name) {
                let id = (name.clone(), partition.key.clone());
                active.insert(id.clone());
                if running.contains(&id) {
                    continue;
                }
                let at = match due.get(&id) {
                    Some(at) => *at,
                    None => {
                        let at = inner
                            .next_due(rt, &PKey::new(name.clone(), partition.key.clone()), None)
                            .await;
                        due.insert(id.clone(), at);
                        at
                    }
                };
                if at <= now {
                    running.insert(id.clone());
                    let (inner, cancel) = (Arc::clone(&inner), runs.clone());
                    in_flight.spawn(async move {
                        let next = run_one(&inner, &id.0, partition, cancel).await;
                        (id, next)
                    });
                }
            }
        }
        due.retain(|id, _| active.contains(id));
        let now = inner.now();
        let next = due
            .iter()
            .filter(|(id, _)| !running.contains(*id))
            .map(|(_, at)| *at)
            .min()
            .unwrap_or(i64::MAX)
            .min(now.saturating_add(duration_ms(MAX_SLEEP)));
        let clock = Arc::clone(&inner.shared.clock);
        tokio::select! {
            () = stop.cancelled() => break,
            () = clock.sleep_until(next) => {}
            () = inner.wake.notified() => {
                // Something changed (a consumer attached, a trigger): re-read every key.
                due.clear();
            }
            Some(done) = in_flight.join_next(), if !in_flight.is_empty() => {
                if let Ok((id, at)) = done {
                    running.remove(&id);
                    due.insert(id, at);
                }
            }
        }
    }
    // Stopping: let running cycles finish (they are cancelled by `stop` when not draining or
    // after the timeout), so no task outlives the daemon.
    while in_flight.join_next().await.is_some() {}
}

/// Runs one key in the daemon and returns when it is next due.
async fn run_one(
    inner: &Inner,
    name: &str,
    partition: Partition,
    cancel: CancellationToken,
) -> i64 {
    let Some(rt) = inner.pollers.get(name) else {
        return i64::MAX;
    };
    let key = PKey::new(name, partition.key.clone());
    let options = RunOptions {
        force: false,
        deadline_ms: None,
        cancel,
    };
    let outcome = runner::run_key(&inner.shared, rt, partition, options).await;
    let now = inner.now();
    match outcome {
        Ok(KeyOutcome::Leased) => now.saturating_add((inner.shared.lease_ttl_ms / 2).max(1_000)),
        Ok(KeyOutcome::Paused) => now.saturating_add(duration_ms(MAX_SLEEP)),
        Ok(KeyOutcome::Ran(report)) => inner.next_due(rt, &key, report.next_retry_at).await,
        Ok(KeyOutcome::NotDue | KeyOutcome::LeaseLost | KeyOutcome::Aborted) => {
            inner.next_due(rt, &key, None).await
        }
        Err(error) => {
            tracing::warn!(%key, %error, "run failed; retrying after schedule.min");
            now.saturating_add(duration_ms(rt.def.schedule.min))
        }
    }
}
