//! The daemon: runs due keys, earliest first and a bounded number at once, sleeps until the
//! next one is due, wakes early for the keys an operation changed.
//!
//! Its work per key is O(log N) in the number of keys: due times live in a min-heap and change
//! only for the key that ran, was woken or was re-read. Nothing walks every key after a run.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, PoisonError};

use tokio_util::sync::CancellationToken;

use crate::clock::duration_ms;
use crate::delivery::Partition;
use crate::engine::{Inner, MAX_SLEEP};
use crate::model::{PKey, PollerState};
use crate::runner::{KeyOutcome, RunOptions, Runtime};
use crate::{runner, schedule};

impl Inner {
    /// When a key should next run, from its stored state.
    pub(super) async fn next_due(&self, rt: &Runtime, key: &PKey) -> i64 {
        match self.shared.store.load_state(key).await {
            Ok(state) => self.due_from(rt, state.as_ref(), None),
            Err(error) => {
                tracing::warn!(%key, %error, "loading state failed; retrying after schedule.min");
                self.now().saturating_add(duration_ms(rt.def.schedule.min))
            }
        }
    }

    /// When a key should next run, from its state (`None`: never saved, due now) and the retry
    /// time of its earliest waiting event.
    fn due_from(&self, rt: &Runtime, state: Option<&PollerState>, retry_at: Option<i64>) -> i64 {
        let now = self.now();
        let Some(state) = state else { return now };
        if state.paused {
            return now.saturating_add(duration_ms(MAX_SLEEP));
        }
        let due = schedule::key_due_at(rt.def.reconcile_every(), state, now);
        let retry = if rt.dispatcher.has_consumer() {
            retry_at
        } else {
            None
        };
        schedule::earliest(Some(due), retry).unwrap_or(due)
    }

    /// Asks the daemon to look at `key` again (its state changed).
    pub(super) fn wake_key(&self, key: &PKey) {
        self.wakes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys
            .insert(key.clone());
        self.wake.notify_one();
    }

    /// Asks the daemon to run every key of poller `name` (a consumer attached: events waiting
    /// in the outbox are delivered even where no poll is due).
    pub(super) fn wake_poller(&self, name: &str) {
        self.wakes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pollers
            .insert(name.to_owned());
        self.wake.notify_one();
    }

    /// The generation of poller `name`'s partition list (0: a poller without a list).
    fn partitions_generation(&self, name: &str) -> u64 {
        self.partitions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .map_or(0, |cache| cache.generation)
    }
}

/// `(poller, partition)`.
type KeyId = (String, String);

/// The time a woken key is scheduled at: before every key that is merely due, so a trigger is
/// served next even when the daemon is behind its schedule.
const WOKEN: i64 = i64::MIN;

/// What the daemon does with a key when its time comes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    /// Run it (poll if due, drain its outbox).
    Run,
    /// Read its state again to learn when it is due: other processes change keys too (a CLI
    /// trigger, another instance's run), so no due time is trusted longer than `MAX_SLEEP`.
    Reread,
}

/// A key the daemon knows.
struct Slot {
    partition: Partition,
    /// When to look at it next, and what to do then (meaningless while it runs).
    at: i64,
    next: Next,
    running: bool,
    /// An operation changed the key while it ran: run it again right after.
    woken: bool,
    /// Still in its poller's partition list; a key that left it while running is forgotten
    /// when its run ends.
    listed: bool,
}

/// The daemon's keys: each one's slot, and a min-heap of `(at, key)` where an entry whose time
/// no longer matches its slot (the key was rescheduled, removed or is running) is skipped.
#[derive(Default)]
struct Keys {
    slots: HashMap<KeyId, Slot>,
    heap: BinaryHeap<Reverse<(i64, KeyId)>>,
    /// The partition-list generation each poller's keys were built from.
    generations: HashMap<String, u64>,
    running: usize,
}

impl Keys {
    /// Schedules `id` (when known and not running) for `next` at `at`.
    fn schedule(&mut self, id: &KeyId, at: i64, next: Next) {
        if let Some(slot) = self.slots.get_mut(id)
            && !slot.running
        {
            slot.at = at;
            slot.next = next;
            self.heap.push(Reverse((at, id.clone())));
        }
    }

    /// Whether poller `name`'s keys were built from another list than `generation`.
    fn stale(&self, name: &str, generation: u64) -> bool {
        self.generations.get(name) != Some(&generation)
    }

    /// Makes the key list of `name` match `list` (of `generation`): new keys are read first
    /// (`now`), keys that left the list are forgotten (once their run ends), the others get the
    /// list's partition data.
    fn sync(&mut self, name: &str, list: Vec<Partition>, generation: u64, now: i64) {
        self.generations.insert(name.to_owned(), generation);
        let listed: HashSet<String> = list.iter().map(|p| p.key.clone()).collect();
        self.slots.retain(|(poller, partition), slot| {
            slot.listed = poller != name || listed.contains(partition);
            slot.listed || slot.running
        });
        for partition in list {
            let id = (name.to_owned(), partition.key.clone());
            match self.slots.get_mut(&id) {
                Some(slot) => {
                    slot.partition = partition;
                    slot.listed = true;
                }
                None => {
                    self.slots.insert(
                        id.clone(),
                        Slot {
                            partition,
                            at: now,
                            next: Next::Reread,
                            running: false,
                            woken: false,
                            listed: true,
                        },
                    );
                    self.heap.push(Reverse((now, id)));
                }
            }
        }
    }

    /// The earliest key due at `now` that is not running, taken off the heap.
    fn pop_due(&mut self, now: i64) -> Option<(KeyId, Next, Partition)> {
        while self.heap.peek().is_some_and(|Reverse((at, _))| *at <= now) {
            let Reverse((at, id)) = self.heap.pop()?;
            if let Some(slot) = self.slots.get_mut(&id)
                && !slot.running
                && slot.at == at
            {
                slot.running = true;
                self.running += 1;
                return Some((id, slot.next, slot.partition.clone()));
            }
        }
        None
    }

    /// The earliest time a key waiting on the heap is due.
    fn next_at(&mut self) -> Option<i64> {
        while let Some(Reverse((at, id))) = self.heap.peek() {
            let current = self
                .slots
                .get(id)
                .is_some_and(|slot| !slot.running && slot.at == *at);
            if current {
                return Some(*at);
            }
            self.heap.pop();
        }
        None
    }

    /// A key's task ended: when to look at it next (`due`, capped at `cap` for a re-read).
    fn finished(&mut self, id: &KeyId, due: i64, cap: i64) {
        self.running = self.running.saturating_sub(1);
        let Some(slot) = self.slots.get_mut(id) else {
            return;
        };
        if !slot.listed {
            self.slots.remove(id);
            return;
        }
        slot.running = false;
        let (at, next) = if std::mem::take(&mut slot.woken) {
            (WOKEN, Next::Run)
        } else if due > cap {
            (cap, Next::Reread)
        } else {
            (due, Next::Run)
        };
        self.schedule(id, at, next);
    }
}

/// The daemon: runs due keys (at most `max_concurrent_keys` at once, earliest due first),
/// sleeps until the next is due (at most 30 s), wakes early for the keys `trigger`, `pause`,
/// `resume`, `reset_cursor`, `replay` and parked retries change, and for every key of a poller
/// a consumer attaches to.
pub(super) async fn daemon_loop(
    inner: Arc<Inner>,
    stop: CancellationToken,
    runs: CancellationToken,
) {
    let mut keys = Keys::default();
    let mut in_flight: tokio::task::JoinSet<(KeyId, i64)> = tokio::task::JoinSet::new();
    loop {
        if stop.is_cancelled() {
            break;
        }
        let now = inner.now();
        for (name, rt) in &inner.pollers {
            // Cheap until the refresh period passed: the list is cached.
            if let Err(error) = inner.refresh_partitions(rt, false).await {
                tracing::warn!(poller = %name, %error, "partition refresh failed; keeping the previous list");
            }
            let generation = inner.partitions_generation(name);
            if keys.stale(name, generation) {
                keys.sync(name, inner.partition_list(name), generation, now);
            }
        }
        take_wakes(&inner, &mut keys);
        while keys.running < inner.max_concurrent_keys {
            let Some((id, next, partition)) = keys.pop_due(now) else {
                break;
            };
            let (inner, cancel) = (Arc::clone(&inner), runs.clone());
            in_flight.spawn(async move {
                let due = match next {
                    Next::Run => run_one(&inner, &id.0, partition, cancel).await,
                    Next::Reread => reread(&inner, &id).await,
                };
                (id, due)
            });
        }
        let now = inner.now();
        let wake_at = keys
            .next_at()
            .filter(|_| keys.running < inner.max_concurrent_keys)
            .unwrap_or(i64::MAX)
            .min(now.saturating_add(duration_ms(MAX_SLEEP)));
        let clock = Arc::clone(&inner.shared.clock);
        tokio::select! {
            () = stop.cancelled() => break,
            () = clock.sleep_until(wake_at) => {}
            () = inner.wake.notified() => {}
            Some(done) = in_flight.join_next(), if !in_flight.is_empty() => {
                if let Ok((id, due)) = done {
                    let now = inner.now();
                    keys.finished(&id, due, now.saturating_add(duration_ms(MAX_SLEEP)));
                }
            }
        }
    }
    // Stopping: let running cycles finish (they are cancelled by `stop` when not draining or
    // after the timeout), so no task outlives the daemon.
    while in_flight.join_next().await.is_some() {}
}

/// Applies the wake-ups operations asked for: a woken key runs next, before the keys merely due
/// (or right after its run in progress), and so does every key of a woken poller.
fn take_wakes(inner: &Inner, keys: &mut Keys) {
    let wakes = std::mem::take(&mut *inner.wakes.lock().unwrap_or_else(PoisonError::into_inner));
    let mut woken: Vec<KeyId> = wakes
        .keys
        .into_iter()
        .map(|key| (key.poller, key.partition))
        .collect();
    for name in wakes.pollers {
        woken.extend(keys.slots.keys().filter(|(p, _)| *p == name).cloned());
    }
    for id in woken {
        match keys.slots.get_mut(&id) {
            Some(slot) if slot.running => slot.woken = true,
            Some(_) => keys.schedule(&id, WOKEN, Next::Run),
            None => {}
        }
    }
}

/// Reads a key's state to learn when it is next due.
async fn reread(inner: &Inner, id: &KeyId) -> i64 {
    let Some(rt) = inner.pollers.get(&id.0) else {
        return i64::MAX;
    };
    inner
        .next_due(rt, &PKey::new(id.0.as_str(), id.1.as_str()))
        .await
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
        // The schedule says the key is due: the run starts with its claim.
        precheck: false,
        deadline_ms: None,
        cancel,
    };
    let outcome = runner::run_key(&inner.shared, rt, partition, options).await;
    let now = inner.now();
    match outcome {
        Ok(KeyOutcome::Leased) => now.saturating_add((inner.shared.lease_ttl_ms / 2).max(1_000)),
        Ok(KeyOutcome::Paused) => now.saturating_add(duration_ms(MAX_SLEEP)),
        // The run's own state says when: no read.
        Ok(KeyOutcome::Ran(report)) if report.state.is_some() => {
            inner.due_from(rt, report.state.as_ref(), report.next_retry_at)
        }
        Ok(
            KeyOutcome::Ran(_) | KeyOutcome::NotDue | KeyOutcome::LeaseLost | KeyOutcome::Aborted,
        ) => inner.next_due(rt, &key).await,
        Err(error) => {
            tracing::warn!(%key, %error, "run failed; retrying after schedule.min");
            now.saturating_add(duration_ms(rt.def.schedule.min))
        }
    }
}
