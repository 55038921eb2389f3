//! A full scan's deletes: from one complete listing, confirmed by the next when the listing
//! had several pages (see `DeleteConfirmation`).

use super::*;

impl Run<'_> {
    /// After a complete full listing: everything stored but not listed is deleted (the merge
    /// of `scan` says what that is).
    pub(super) async fn full_scan_deletes(
        &self,
        cycle: &mut Cycle,
        scan: Option<FullScan<'_>>,
    ) -> Result<(), CycleError> {
        let def = &self.rt.def;
        let Some(scan) = scan else {
            return Ok(());
        };
        if !(cycle.done && cycle.spec.full_scan)
            || cycle.truncated
            || cycle.saw_not_modified
            || cycle.halted
        {
            return Ok(());
        }
        if cycle.unknown_invalid {
            tracing::warn!(key = %self.key, "an invalid item had no readable identity: no deletes this cycle (set `identity_field` or `raw_identity`)");
            return Ok(());
        }
        // `None`: the store's stream broke its order, nothing can be deleted safely (the merge
        // logged why).
        let Some(missing) = scan.finish().await? else {
            return Ok(());
        };
        let lane = cycle.spec.lane;
        let previous = cycle
            .state
            .lanes
            .get(lane)
            .and_then(|l| l.suspects.clone())
            .unwrap_or_default();
        let trusted = cycle.pages <= 1 || def.delete_confirmation == DeleteConfirmation::Immediate;
        let (confirmed, suspects) = if trusted {
            (missing, Vec::new())
        } else {
            confirm_missing(missing, &previous)
        };
        if !suspects.is_empty() {
            tracing::info!(key = %self.key, lane = lane.as_str(), suspects = suspects.len(), confirmed = confirmed.len(), "items missing from a listing of several pages are reported deleted only if the next listing misses them too");
        }
        let mut suspects = Some(suspects).filter(|s| *s != previous);
        let now = self.now();
        let cursor_json = cycle
            .cursor
            .as_ref()
            .and_then(|c| Json::parse(&cycle.spec.strategy.serialize(c)).ok());
        let mut chunks = confirmed.chunks(DEFAULT_IDENTITY_BATCH).peekable();
        if chunks.peek().is_none() {
            if let Some(suspects) = suspects.take() {
                let processed = Processed {
                    suspects: Some(suspects),
                    ..Processed::default()
                };
                self.commit(cycle, processed).await?;
            }
            return Ok(());
        }
        while let Some(chunk) = chunks.next() {
            self.check_running()?;
            let rows = self.shared.store.load_versions(&self.key, chunk).await?;
            let mut sequence = cycle.sequence;
            let events = plan_deletes(
                def,
                &self.event_source(cycle),
                chunk,
                &rows,
                &mut sequence,
                cursor_json.as_ref(),
                now,
            );
            cycle.sequence = sequence;
            // The new suspects land with the last chunk: a crash before it keeps the old ones,
            // so the confirmed deletes not yet committed are confirmed again next time.
            let processed = Processed {
                deletes: chunk.to_vec(),
                events,
                suspects: if chunks.peek().is_none() {
                    suspects.take()
                } else {
                    None
                },
                ..Processed::default()
            };
            if self.commit(cycle, processed).await? > 0 {
                let drained = self.drain().await;
                self.delivered(cycle, drained).await?;
            }
            if cycle.halted {
                break;
            }
        }
        Ok(())
    }
}

/// Splits a listing's missing identities into those confirmed by the previous listing (missing
/// there too: deleted now) and the new suspects (missing for the first time). Both ascending.
pub(super) fn confirm_missing(
    missing: Vec<String>,
    previous: &[String],
) -> (Vec<String>, Vec<String>) {
    let previous: std::collections::HashSet<&str> = previous.iter().map(String::as_str).collect();
    missing
        .into_iter()
        .partition(|identity| previous.contains(identity.as_str()))
}
