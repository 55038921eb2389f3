//! One page of a cycle: fetched (the stream form or one call), planned, committed with its
//! validators in one `commit_poll`, and reported to the hooks.

use std::sync::Arc;

use futures::StreamExt;
use futures::stream::BoxStream;
use tracing::Instrument;

use crate::cursor::Cursor;
use crate::error::{BoxError, Error};
use crate::event::EventType;
use crate::fetch::{FetchContext, Page};
use crate::full_scan::FullScan;
use crate::hooks::{CommitInfo, FetchInfo, Phase};
use crate::model::{CommitBatch, LaneCursor, OutboxRow, StatePatch};
use crate::poller::FetchSource;
use crate::runner::cycle::{Cycle, PageStep, fetch_failure};
use crate::runner::plan::PagePlan;
use crate::runner::{CycleError, Run};

impl Run<'_> {
    /// Fetches, processes and commits the next page (its events are delivered by the caller).
    pub(super) async fn page(
        &self,
        cycle: &mut Cycle,
        scan: Option<&mut FullScan<'_>>,
        cursor: &mut Cursor,
        stream: &mut Option<BoxStream<'static, Result<Page, BoxError>>>,
    ) -> Result<PageStep, CycleError> {
        self.check_running()?;
        if self.deadline_ms.is_some_and(|d| self.now() >= d)
            || u64::from(cycle.spec.cap) <= cycle.pages
        {
            cycle.truncated = true;
            return Ok(PageStep::End);
        }
        let page_index = u32::try_from(cycle.pages + 1).unwrap_or(u32::MAX);
        let ctx = FetchContext {
            cursor: cycle.spec.strategy.for_fetch(cursor, cycle.pages == 0),
            page: page_index,
            partition: self.partition.clone(),
            lane: cycle.spec.lane,
            cancel: self.cancel.clone(),
            budget: self.budget_charge(cycle),
            validators: cycle.validators.clone(),
            clock: Some(Arc::clone(&self.shared.clock)),
        };
        let fetch_started = self.now();
        let span = tracing::info_span!("watukuy.fetch", page = page_index);
        let fetching = async {
            match &cycle.spec.fetch {
                FetchSource::Pages(fetch) => Some(fetch.fetch(ctx).await),
                FetchSource::Stream(source) => {
                    stream.get_or_insert_with(|| source.pages(ctx)).next().await
                }
            }
        };
        // A fetch that ignores its cancellation token is dropped when the run is cancelled.
        let next = tokio::select! {
            biased;
            () = self.cancel.cancelled() => return Err(self.check_running().err().unwrap_or(CycleError::Aborted)),
            next = fetching.instrument(span) => next,
        };
        let Some(fetched) = next else {
            // The stream ended: the listing is complete.
            return self
                .stream_ended(cycle, cursor)
                .await
                .map(|()| PageStep::End);
        };
        // What the fetch staged belongs to this page: it lands with its commit or not at all.
        let staged = cycle
            .validators
            .as_ref()
            .map(crate::fetch::ValidatorAccess::take_staged)
            .unwrap_or_default();
        let page = fetched.map_err(fetch_failure)?;
        cycle.pages += 1;
        cycle.items += page.items.len() as u64;
        if page.rate_limit.is_some() {
            cycle.rate_limit.clone_from(&page.rate_limit);
        }
        cycle.saw_not_modified |= page.not_modified;
        let info = FetchInfo {
            page: page_index,
            duration_ms: self.now().saturating_sub(fetch_started),
            items: page.items.len(),
            not_modified: page.not_modified,
        };
        self.shared.hooks.on_fetch(&cycle.hook, &info).await;
        if page.not_modified {
            // No body: nothing to advance over, validate or commit (validators staged by other
            // requests of this fetch are dropped with the body they came from).
            return Ok(match cycle.spec.strategy.after_not_modified(cursor) {
                Some(next) => {
                    *cursor = next;
                    PageStep::Page {
                        events: 0,
                        last: false,
                    }
                }
                None => {
                    cycle.done = true;
                    PageStep::End
                }
            });
        }
        let fetched = page.items.len() + page.rejected.len();
        let mut plan = self.process(cycle, scan, cursor, page).await?;
        plan.validators = staged;
        let quarantined = plan.quarantined.len();
        let events = self.commit(cycle, plan).await?;
        if quarantined > 0 && quarantined == fetched {
            // Silent otherwise: the cursor moved past items that all went to quarantine, which
            // is usually a wrong item type rather than bad data.
            tracing::warn!(
                key = %self.key,
                lane = cycle.spec.lane.as_str(),
                page = page_index,
                items = quarantined,
                "every item of the page failed validation and was quarantined while the cursor \
                 moved on: check the item type (e.g. numeric ids into a String field); the \
                 parked rows of kind `invalid` hold them"
            );
            self.shared
                .hooks
                .on_page_quarantined(&cycle.hook, page_index, quarantined)
                .await;
        }
        if let Some(next) = cycle.cursor.clone() {
            *cursor = next;
        }
        Ok(PageStep::Page {
            events,
            last: cycle.done && stream.is_none(),
        })
    }

    /// A stream of pages ended: the cycle is complete, and the strategy's end-of-cycle cursor
    /// is persisted if it differs from the last committed one.
    pub(super) async fn stream_ended(
        &self,
        cycle: &mut Cycle,
        cursor: &Cursor,
    ) -> Result<(), CycleError> {
        if cycle.done {
            return Ok(());
        }
        cycle.done = true;
        let strategy = Arc::clone(&cycle.spec.strategy);
        let complete = strategy.on_cycle_complete(cursor);
        if &complete == cursor {
            return Ok(());
        }
        let mut lanes = cycle.state.lanes.clone();
        lanes
            .slot(cycle.spec.lane)
            .get_or_insert_with(LaneCursor::default)
            .cursor = Some(strategy.serialize(&complete));
        let patch = StatePatch {
            lanes: Some(lanes.clone()),
            updated_at: Some(self.now()),
            ..StatePatch::default()
        };
        self.shared
            .store
            .save_state(&self.key, &self.lease, &patch)
            .await?;
        cycle.state.lanes = lanes;
        cycle.unsaved_lanes = false;
        cycle.cursor = Some(complete);
        Ok(())
    }

    /// Commits one page's plan in one `commit_poll`, then moves the cycle to it and reports it
    /// to the hooks; returns how many events it committed (the caller delivers them). A failed
    /// commit leaves the cycle as it was: the next cycle fetches the page again.
    pub(super) async fn commit(
        &self,
        cycle: &mut Cycle,
        plan: PagePlan,
    ) -> Result<usize, CycleError> {
        let now = self.now();
        let quiet =
            plan.writes_nothing() && cycle.state.schema_version == Some(self.rt.def.schema_version);
        let PagePlan {
            upserts,
            deletes,
            events,
            quarantined,
            validators,
            suspects,
            progress,
        } = plan;
        let mut lanes = cycle.state.lanes.clone();
        let slot = lanes
            .slot(cycle.spec.lane)
            .get_or_insert_with(LaneCursor::default);
        if let Some(cursor) = progress.cursor.as_ref().or(cycle.cursor.as_ref()) {
            slot.cursor = Some(cycle.spec.strategy.serialize(cursor));
        }
        if let Some(suspects) = suspects {
            slot.suspects = Some(suspects).filter(|s| !s.is_empty());
        }
        if quiet {
            // A page that changed nothing (the idle poll) costs no commit: its cursor rides
            // with the cycle's next write, at the latest its bookkeeping. A crash before that
            // fetches the page again, which changes nothing again.
            cycle.state.lanes = lanes;
            cycle.unsaved_lanes = true;
            cycle.apply(progress);
            return Ok(0);
        }
        let batch = CommitBatch {
            state_patch: StatePatch {
                lanes: Some(lanes.clone()),
                schedule: Some(cycle.schedule.clone()),
                paused: None,
                schema_version: Some(self.rt.def.schema_version),
                sequence: Some(progress.sequence.unwrap_or(cycle.sequence)),
                updated_at: Some(now),
            },
            upserts,
            deletes,
            events: events
                .into_iter()
                .map(|e| OutboxRow::pending(e, now))
                .collect(),
            log: self.rt.def.log_retention.is_some(),
            parked: quarantined,
            validators,
        };
        let events = batch.events.len();
        let started = self.now();
        match self
            .shared
            .store
            .commit_poll(&self.key, &self.lease, &batch)
            .instrument(tracing::info_span!(
                "watukuy.commit",
                events,
                upserts = batch.upserts.len(),
                deletes = batch.deletes.len()
            ))
            .await
        {
            Ok(()) => {}
            Err(Error::LeaseLost { epoch, .. }) => return Err(CycleError::LeaseLost(epoch)),
            Err(error) => {
                return Err(CycleError::Failed {
                    error,
                    phase: Phase::Commit,
                    throttle: None,
                });
            }
        }
        cycle.state.lanes = lanes;
        cycle.unsaved_lanes = false;
        cycle.apply(progress);
        cycle.quarantined += batch.parked.len() as u64;
        for row in &batch.events {
            match row.event.event_type {
                EventType::Created => cycle.counts.created += 1,
                EventType::Updated => cycle.counts.updated += 1,
                EventType::Deleted => cycle.counts.deleted += 1,
            }
        }
        let info = CommitInfo {
            events,
            upserts: batch.upserts.len(),
            deletes: batch.deletes.len(),
            duration_ms: self.now().saturating_sub(started),
        };
        self.shared.hooks.on_commit(&cycle.hook, &info).await;
        for row in &batch.events {
            self.shared.hooks.on_event(&cycle.hook, &row.event).await;
        }
        for row in &batch.parked {
            let (Some(item), Some(issues)) = (&row.item, &row.error.issues) else {
                continue;
            };
            self.shared
                .hooks
                .on_invalid(&cycle.hook, item, issues)
                .await;
        }
        Ok(events)
    }

    /// Commits a plan and delivers what it committed before the cycle goes on.
    pub(super) async fn commit_and_deliver(
        &self,
        cycle: &mut Cycle,
        plan: PagePlan,
    ) -> Result<(), CycleError> {
        if self.commit(cycle, plan).await? > 0 {
            self.deliver(cycle).await?;
        }
        Ok(())
    }

    /// Drains the key's outbox and counts what it delivered into the cycle.
    pub(super) async fn deliver(&self, cycle: &mut Cycle) -> Result<(), CycleError> {
        let drained = self.drain().await;
        self.delivered(cycle, drained).await
    }
}
