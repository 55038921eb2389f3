//! Draining a key's outbox: slices in sequence order, grouped by ordering key, up to
//! `concurrency` handlers at once, acks group-committed (see `acks`).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::{FutureExt, StreamExt};

use crate::delivery::acks::Acks;
use crate::delivery::dispatcher::{Dispatcher, DrainContext, DrainReport};
use crate::delivery::policy;
use crate::error::Result;
use crate::model::{Lease, PKey};

impl Dispatcher {
    /// Delivers the pending events of `key` under `lease`.
    ///
    /// Loads the outbox a slice at a time (in sequence order; a slice is `dispatch_batch_size`
    /// rows plus one, which tells whether more follow), skips keys that are held by a
    /// parked event or already waiting in this drain, and delivers the rest with up to
    /// `concurrency` handlers running at once (and, with an ack window, up to its `max_events`
    /// keys waiting for their acks to be flushed). A row whose next attempt lies in the future
    /// blocks its key
    /// for this drain and is reported in `next_retry_at`. Stops when a pass makes no progress,
    /// on a `halt`, on cancellation, or on the first store error (`LeaseLost` included; in-flight
    /// handlers are then cancelled).
    pub async fn drain(
        &self,
        key: &PKey,
        lease: &Lease,
        ctx: &DrainContext,
    ) -> Result<DrainReport> {
        let mut report = DrainReport::default();
        let Some(consumer) = self.slot.current() else {
            report.no_consumer = true;
            report.remaining = self.store.counts(key).await?.pending;
            return Ok(report);
        };
        let cancel = ctx.cancel.child_token();
        let halted = AtomicBool::new(false);
        let mut blocked: HashSet<String> = HashSet::new();
        // Read once per drain, with its first slice: keys parked with `hold_key` during the drain
        // are `blocked` by their group, and a hold released meanwhile is seen by the next drain.
        let mut held: Option<HashSet<String>> = None;
        let mut window = self.batch_size;
        // Known without asking the store when the last slice held every pending row.
        let mut remaining: Option<u64> = None;
        while !cancel.is_cancelled() {
            // One row more than the window: a slice that holds them all says more rows follow,
            // and one that does not ends the drain without another read.
            let limit = window.saturating_add(1);
            let rows = match held {
                Some(_) => self.store.load_pending(key, limit).await?,
                None => {
                    let (rows, keys) = self.store.load_pending_with_holds(key, limit).await?;
                    held = Some(keys.into_iter().collect());
                    rows
                }
            };
            if rows.is_empty() {
                remaining = Some(0);
                break;
            }
            let slice_len = rows.len() as u64;
            let slice_full = rows.len() > window;
            let held = held.get_or_insert_default();
            let groups =
                policy::eligible_groups(rows, |r| self.options.key_of(&r.event), held, &blocked);
            if groups.is_empty() {
                match policy::widened_window(window, self.batch_size, slice_full) {
                    Some(wider) => {
                        window = wider;
                        continue;
                    }
                    None => {
                        remaining = (!slice_full).then_some(slice_len);
                        break;
                    }
                }
            }
            let mut progress = false;
            let mut removed = 0;
            let acks = Acks::new(&*self.store, &*self.clock, key, lease, &self.options);
            // A group holds its place until its last ack is durable, and has at most one event
            // delivered and not acknowledged: the bound on what a crash redelivers (G9).
            let mut runs = futures::stream::iter(groups)
                .map(|group| {
                    let group_key = group.key.clone();
                    self.run_group(
                        key,
                        lease,
                        &acks,
                        group,
                        &consumer,
                        &ctx.partition,
                        &cancel,
                        &halted,
                    )
                    .map(move |outcome| (group_key, outcome))
                })
                .buffer_unordered(self.options.unacked_bound());
            let flusher = acks.flush_loop();
            tokio::pin!(flusher);
            loop {
                // Groups first, so the acks of every group ready in this turn share the flush.
                let next = tokio::select! {
                    biased;
                    next = runs.next() => next,
                    never = &mut flusher => match never {},
                };
                let Some((group_key, outcome)) = next else {
                    break;
                };
                let outcome = match outcome {
                    Ok(outcome) => outcome,
                    Err(error) => {
                        cancel.cancel();
                        return Err(error);
                    }
                };
                progress |=
                    outcome.delivered + outcome.parked + outcome.failed > 0 || outcome.blocked;
                removed += outcome.delivered + outcome.parked;
                report.delivered += outcome.delivered;
                report.parked += outcome.parked;
                report.failed += outcome.failed;
                report.aborted |= outcome.aborted;
                report.next_retry_at =
                    crate::schedule::earliest(report.next_retry_at, outcome.next_retry_at);
                if outcome.blocked {
                    blocked.insert(group_key);
                }
            }
            report.halted = halted.load(Ordering::Acquire);
            if !slice_full {
                remaining = Some(slice_len - removed);
                break;
            }
            if report.halted || report.aborted || !progress {
                break;
            }
        }
        report.aborted |= cancel.is_cancelled() && !report.halted;
        report.remaining = match remaining {
            Some(remaining) => remaining,
            None => self.store.counts(key).await?.pending,
        };
        Ok(report)
    }
}
