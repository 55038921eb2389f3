//! A full scan's deletes: from one complete listing, at once, confirmed by the next listing, or
//! confirmed by looking the missing items up, as `DeleteConfirmation` says.

use std::collections::HashSet;
use std::sync::Arc;

use tracing::Instrument;

use crate::decide::dedupe_last_wins;
use crate::error::{Error, Result};
use crate::fetch::{FetchContext, Page};
use crate::full_scan::FullScan;
use crate::hooks::Phase;
use crate::json::Json;
use crate::model::{PKey, ParkedRow};
use crate::poller::{Candidate, DeleteConfirmation, LookupDef, PollerDef, Prepared};
use crate::runner::cycle::{Cycle, fetch_failure};
use crate::runner::plan::{At, PagePlan, Progress, invalid, plan, plan_deletes};
use crate::runner::{CycleError, Run};
use crate::store::DEFAULT_IDENTITY_BATCH;

impl Run<'_> {
    /// After a complete full listing: everything stored but not listed is deleted (the merge
    /// of `scan` says what that is), as the poller's `DeleteConfirmation` confirms it.
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
        let sorted = sort_missing(def.delete_confirmation, cycle.pages, missing, &previous);
        if let Some(lookup) = def.lookup.as_ref().filter(|_| !sorted.look_up.is_empty()) {
            return self
                .confirm_by_lookup(cycle, lookup, sorted.look_up, &previous)
                .await;
        }
        let MissingPlan {
            deleted: confirmed,
            mut suspects,
            look_up,
        } = sorted;
        // Only without a lookup (which `build` rules out for `Lookup`): nothing is deleted
        // unconfirmed, they wait as suspects.
        suspects.extend(look_up);
        if !suspects.is_empty() {
            tracing::info!(key = %self.key, lane = lane.as_str(), suspects = suspects.len(), confirmed = confirmed.len(), "items missing from a listing of several pages are reported deleted only if the next listing misses them too");
        }
        let mut suspects = Some(suspects).filter(|s| *s != previous);
        let now = self.now();
        let mut chunks = confirmed.chunks(DEFAULT_IDENTITY_BATCH).peekable();
        if chunks.peek().is_none() {
            if let Some(suspects) = suspects.take() {
                let plan = PagePlan {
                    suspects: Some(suspects),
                    ..PagePlan::default()
                };
                self.commit(cycle, plan).await?;
            }
            return Ok(());
        }
        while let Some(chunk) = chunks.next() {
            self.check_running()?;
            let rows = self.shared.store.load_versions(&self.key, chunk).await?;
            let mut from = self.event_source(cycle, self.at(cycle, now));
            let events = plan_deletes(def, &mut from, chunk, &rows);
            // The new suspects land with the last chunk: a crash before it keeps the old ones,
            // so the confirmed deletes not yet committed are confirmed again next time.
            let plan = PagePlan {
                deletes: chunk.to_vec(),
                events,
                suspects: if chunks.peek().is_none() {
                    suspects.take()
                } else {
                    None
                },
                progress: Progress {
                    sequence: Some(from.sequence()),
                    ..Progress::default()
                },
                ..PagePlan::default()
            };
            self.commit_and_deliver(cycle, plan).await?;
            if cycle.halted {
                break;
            }
        }
        Ok(())
    }

    /// The deletes' events are made `now`, after the cycle's sequence, with the cursor the
    /// cycle ended on.
    fn at(&self, cycle: &Cycle, now: i64) -> At {
        At {
            now,
            sequence: cycle.sequence,
            cursor: cycle
                .cursor
                .as_ref()
                .and_then(|c| Json::parse(&cycle.spec.strategy.serialize(c)).ok()),
        }
    }

    /// `DeleteConfirmation::Lookup`: looks `missing` up batch by batch; each batch commits the
    /// items found (diffed like listed ones) and the deletes of those not found, and the last
    /// one the suspects left undecided. A failed lookup commits what is still undecided as the
    /// lane's suspects and fails the cycle like a failed fetch; a deadline or a poison `halt`
    /// stops the lookups, keeping the rest as suspects.
    async fn confirm_by_lookup(
        &self,
        cycle: &mut Cycle,
        lookup: &LookupDef,
        missing: Vec<String>,
        previous: &[String],
    ) -> Result<(), CycleError> {
        let def = &self.rt.def;
        let lane = cycle.spec.lane;
        tracing::info!(key = %self.key, lane = lane.as_str(), missing = missing.len(), batch_size = lookup.batch_size, "looking up the items missing from a listing of several pages");
        let batches: Vec<&[String]> = missing.chunks(lookup.batch_size).collect();
        // Suspects no lookup could decide, in ascending order (`missing` is).
        let mut undecided: Vec<String> = Vec::new();
        for (index, batch) in batches.iter().enumerate() {
            let rest = || batches[index..].iter().flat_map(|b| b.iter().cloned());
            let stop = self.deadline_ms.is_some_and(|d| self.now() >= d) || cycle.halted;
            let answer = if stop {
                None
            } else {
                self.check_running()?;
                Some(self.look_up(cycle, lookup, index, batch).await)
            };
            let answer = match answer {
                Some(Ok(page)) => page,
                failed_or_stopped => {
                    // Nothing of this batch or the later ones is decided: they stay suspects.
                    undecided.extend(rest());
                    if undecided != previous {
                        let plan = PagePlan {
                            suspects: Some(undecided),
                            ..PagePlan::default()
                        };
                        self.commit(cycle, plan).await?;
                    }
                    return match failed_or_stopped {
                        Some(Err(error)) => Err(error),
                        _ => Ok(()),
                    };
                }
            };
            cycle.items += answer.items.len() as u64;
            if answer.rate_limit.is_some() {
                cycle.rate_limit.clone_from(&answer.rate_limit);
            }
            let now = self.now();
            let resolved =
                resolve_lookup(def, &self.key, batch, &answer, now).map_err(|error| {
                    CycleError::Failed {
                        error,
                        phase: Phase::Fetch,
                        throttle: None,
                    }
                })?;
            if !resolved.unasked.is_empty() {
                tracing::warn!(key = %self.key, lane = lane.as_str(), unasked = ?resolved.unasked, "the lookup returned items it was not asked for: ignored (does the lookup return identities exactly as the listing does?)");
            }
            if !resolved.undecided.is_empty() {
                tracing::warn!(key = %self.key, lane = lane.as_str(), undecided = resolved.undecided.len(), "the lookup's answer held an invalid item without a readable identity: the items it did not return stay suspects");
            }
            undecided.extend(resolved.undecided);
            let mut identities: Vec<String> =
                resolved.found.iter().map(|(id, _)| id.clone()).collect();
            identities.extend(resolved.gone.iter().cloned());
            let rows = self
                .shared
                .store
                .load_versions(&self.key, &identities)
                .await?;
            let mut from = self.event_source(cycle, self.at(cycle, now));
            let diff = plan(def, &mut from, resolved.found, &rows, false).map_err(|error| {
                CycleError::Failed {
                    error,
                    phase: Phase::Fetch,
                    throttle: None,
                }
            })?;
            let mut events = diff.events;
            events.extend(plan_deletes(def, &mut from, &resolved.gone, &rows));
            let mut quarantined = resolved.quarantined;
            quarantined.extend(diff.quarantined);
            let last = index + 1 == batches.len();
            let plan = PagePlan {
                upserts: diff.upserts,
                deletes: resolved.gone,
                events,
                quarantined,
                suspects: (last && undecided != previous).then(|| undecided.clone()),
                progress: Progress {
                    sequence: Some(from.sequence()),
                    ..Progress::default()
                },
                ..PagePlan::default()
            };
            self.commit_and_deliver(cycle, plan).await?;
        }
        Ok(())
    }

    /// Calls the poller's lookup for one batch (the `index`-th, from 0), as a fetch of the
    /// cycle's lane: with its budget, cancelled with the run.
    async fn look_up(
        &self,
        cycle: &Cycle,
        lookup: &LookupDef,
        index: usize,
        batch: &[String],
    ) -> Result<Page, CycleError> {
        let number = u32::try_from(index + 1).unwrap_or(u32::MAX);
        let ctx = FetchContext {
            cursor: cycle.spec.strategy.initial(),
            page: number,
            partition: self.partition.clone(),
            lane: cycle.spec.lane,
            cancel: self.cancel.clone(),
            budget: self.budget_charge(cycle),
            validators: None,
            clock: Some(Arc::clone(&self.shared.clock)),
        };
        let span = tracing::info_span!("watukuy.lookup", batch = number, size = batch.len());
        let asking = lookup.lookup.lookup(ctx, batch.to_vec()).instrument(span);
        // A lookup that ignores its cancellation token is dropped when the run is cancelled.
        tokio::select! {
            biased;
            () = self.cancel.cancelled() => Err(self.check_running().err().unwrap_or(CycleError::Aborted)),
            answer = asking => answer.map_err(fetch_failure),
        }
    }
}

/// What a complete listing's missing identities become, by the rule (all ascending).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct MissingPlan {
    /// Reported deleted now.
    pub(super) deleted: Vec<String>,
    /// Kept as the lane's suspects until the next listing.
    pub(super) suspects: Vec<String>,
    /// To look up now (`DeleteConfirmation::Lookup`).
    pub(super) look_up: Vec<String>,
}

/// Sorts a complete listing's `missing` identities by the rule (pure): a listing of one page is
/// trusted whatever the rule; otherwise `Immediate` deletes them all, `NextListing` deletes
/// those `previous` (the lane's suspects) already held and keeps the others as suspects, and
/// `Lookup` looks them all up.
pub(super) fn sort_missing(
    rule: DeleteConfirmation,
    pages: u64,
    missing: Vec<String>,
    previous: &[String],
) -> MissingPlan {
    if pages <= 1 {
        return MissingPlan {
            deleted: missing,
            ..MissingPlan::default()
        };
    }
    match rule {
        DeleteConfirmation::Immediate => MissingPlan {
            deleted: missing,
            ..MissingPlan::default()
        },
        DeleteConfirmation::NextListing => {
            let (deleted, suspects) = confirm_missing(missing, previous);
            MissingPlan {
                deleted,
                suspects,
                look_up: Vec::new(),
            }
        }
        DeleteConfirmation::Lookup => MissingPlan {
            look_up: missing,
            ..MissingPlan::default()
        },
    }
}

/// Splits a listing's missing identities into those confirmed by the previous listing (missing
/// there too: deleted now) and the new suspects (missing for the first time). Both ascending.
pub(super) fn confirm_missing(
    missing: Vec<String>,
    previous: &[String],
) -> (Vec<String>, Vec<String>) {
    let previous: HashSet<&str> = previous.iter().map(String::as_str).collect();
    missing
        .into_iter()
        .partition(|identity| previous.contains(identity.as_str()))
}

/// What a lookup's answer says about the batch it was asked for.
#[derive(Default)]
pub(super) struct LookupAnswer {
    /// The valid items asked for, by identity (the last of a repeated identity kept): alive,
    /// to diff against their rows.
    pub(super) found: Vec<(String, Candidate)>,
    /// Invalid items to park (`on_invalid: quarantine`).
    pub(super) quarantined: Vec<ParkedRow>,
    /// Asked for and not in the answer: deleted. Ascending.
    pub(super) gone: Vec<String>,
    /// Asked for and not in an answer that held an invalid item without a readable identity
    /// (it might be one of them): still suspects. Ascending.
    pub(super) undecided: Vec<String>,
    /// Identities of valid items the answer held that were not asked for (ignored).
    pub(super) unasked: Vec<String>,
}

/// Reads a lookup's `answer` to the batch `asked` (ascending) (pure: no store, no clock). An
/// item asked for, valid or invalid with a readable identity, is alive (an invalid one is
/// quarantined by `on_invalid`); an item not asked for is ignored; an identity the answer does
/// not name is gone, unless the answer held an item whose identity cannot be read. `Err` for
/// an answer that cannot say what is gone (`has_more`, `not_modified`) and, with
/// `on_invalid: fail`, for an invalid item.
pub(super) fn resolve_lookup(
    def: &PollerDef,
    key: &PKey,
    asked: &[String],
    answer: &Page,
    now: i64,
) -> Result<LookupAnswer> {
    if answer.not_modified {
        return Err(Error::fetch(
            "the lookup answered 304 Not Modified, which says nothing about the items asked for",
        ));
    }
    if answer.has_more == Some(true) {
        return Err(Error::fetch(format!(
            "the lookup's answer to {} identities says more items follow (`has_more`): a lookup \
             must return every item of its batch that exists (lower `lookup`'s batch size)",
            asked.len()
        )));
    }
    let wanted: HashSet<&str> = asked.iter().map(String::as_str).collect();
    let mut out = LookupAnswer::default();
    let mut seen: HashSet<String> = HashSet::new();
    let mut unknown = false;
    let mut found = Vec::new();
    for raw in &answer.items {
        match (def.prepare)(raw) {
            Prepared::Valid(candidate) if wanted.contains(candidate.identity.as_str()) => {
                seen.insert(candidate.identity.clone());
                found.push((candidate.identity.clone(), candidate));
            }
            Prepared::Valid(candidate) => out.unasked.push(candidate.identity),
            Prepared::Invalid {
                identity: Some(identity),
                ..
            } if !wanted.contains(identity.as_str()) => {}
            Prepared::Invalid { issues, identity } => {
                let row = invalid(def, key, || Json::from_value(raw), issues, now)?;
                out.quarantined.extend(row);
                match identity {
                    Some(identity) => {
                        seen.insert(identity);
                    }
                    None => unknown = true,
                }
            }
        }
    }
    for rejected in &answer.rejected {
        let issues = vec![crate::model::ValidationIssue {
            message: rejected.reason.clone(),
            path: None,
        }];
        let text = || Json::from_value(&serde_json::Value::String(rejected.text.clone()));
        out.quarantined
            .extend(invalid(def, key, text, issues, now)?);
        unknown = true;
    }
    out.found = dedupe_last_wins(found);
    let absent = asked
        .iter()
        .filter(|id| !seen.contains(id.as_str()))
        .cloned();
    if unknown {
        out.undecided = absent.collect();
    } else {
        out.gone = absent.collect();
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::error::BoxError;
    use crate::model::ParkedKind;
    use crate::poller::OnInvalid;
    use crate::poller::Poller;

    const NOW: i64 = 1_767_225_600_000;

    fn ids(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Order {
        id: String,
        total: i64,
    }

    fn def(on_invalid: OnInvalid) -> Arc<PollerDef> {
        let poller = Poller::builder::<Order>("orders")
            .identity_field("id")
            .cursor(crate::cursor::snapshot_diff())
            .on_invalid(on_invalid)
            .fetch(|_ctx: FetchContext| async { Ok::<Page, BoxError>(Page::default()) })
            .lookup(10, |_ctx: FetchContext, _ids: Vec<String>| async {
                Ok::<Page, BoxError>(Page::default())
            })
            .build()
            .expect("a valid poller");
        Arc::clone(&poller.inner)
    }

    fn key() -> PKey {
        PKey::new("orders", "")
    }

    fn answer(items: serde_json::Value) -> Page {
        let serde_json::Value::Array(items) = items else {
            panic!("an array");
        };
        Page::new(items)
    }

    #[test]
    fn one_page_is_trusted_whatever_the_rule() {
        for rule in [
            DeleteConfirmation::NextListing,
            DeleteConfirmation::Immediate,
            DeleteConfirmation::Lookup,
        ] {
            for pages in [0, 1] {
                assert_eq!(
                    sort_missing(rule, pages, ids(&["a", "b"]), &ids(&["z"])),
                    MissingPlan {
                        deleted: ids(&["a", "b"]),
                        ..MissingPlan::default()
                    },
                    "{rule:?}, {pages} pages"
                );
            }
        }
    }

    #[test]
    fn several_pages_are_sorted_by_the_rule() {
        let missing = ids(&["a", "b", "c"]);
        let previous = ids(&["b", "x"]);
        assert_eq!(
            sort_missing(DeleteConfirmation::Immediate, 2, missing.clone(), &previous),
            MissingPlan {
                deleted: missing.clone(),
                ..MissingPlan::default()
            }
        );
        assert_eq!(
            sort_missing(
                DeleteConfirmation::NextListing,
                2,
                missing.clone(),
                &previous
            ),
            MissingPlan {
                deleted: ids(&["b"]),
                suspects: ids(&["a", "c"]),
                look_up: Vec::new(),
            },
            "b was a suspect already; x was listed again"
        );
        assert_eq!(
            sort_missing(DeleteConfirmation::Lookup, 2, missing.clone(), &previous),
            MissingPlan {
                look_up: missing,
                ..MissingPlan::default()
            },
            "a lookup does not wait for the next listing, suspect or not"
        );
    }

    #[test]
    fn a_lookup_answer_keeps_the_found_and_deletes_the_rest() {
        let def = def(OnInvalid::Quarantine);
        let asked = ids(&["a", "b", "c", "d"]);
        let page = answer(json!([
            { "id": "c", "total": 3 },
            { "id": "a", "total": 1 },
            { "id": "a", "total": 2 },
            { "id": "zz", "total": 9 },
        ]));
        let out = resolve_lookup(&def, &key(), &asked, &page, NOW).expect("an answer");
        let found: Vec<(&str, &serde_json::Value)> = out
            .found
            .iter()
            .map(|(id, c)| (id.as_str(), &c.value["total"]))
            .collect();
        assert_eq!(
            found,
            [("c", &json!(3)), ("a", &json!(2))],
            "the last a wins"
        );
        assert_eq!(out.gone, ids(&["b", "d"]));
        assert!(out.undecided.is_empty());
        assert_eq!(out.unasked, ids(&["zz"]), "not asked for: ignored");
        assert!(out.quarantined.is_empty());
    }

    #[test]
    fn an_empty_answer_deletes_the_whole_batch() {
        let def = def(OnInvalid::Quarantine);
        let asked = ids(&["a", "b"]);
        let out = resolve_lookup(&def, &key(), &asked, &Page::default(), NOW).expect("an answer");
        assert!(out.found.is_empty());
        assert_eq!(out.gone, asked);
    }

    #[test]
    fn an_invalid_item_asked_for_is_alive_and_quarantined() {
        let def = def(OnInvalid::Quarantine);
        let asked = ids(&["a", "b"]);
        let page = answer(json!([
            { "id": "a", "total": "not a number" },
            { "id": "other", "total": "not a number" },
        ]));
        let out = resolve_lookup(&def, &key(), &asked, &page, NOW).expect("an answer");
        assert!(out.found.is_empty());
        assert_eq!(out.gone, ids(&["b"]), "a is alive, only invalid");
        assert_eq!(
            out.quarantined.len(),
            1,
            "the invalid item not asked for is ignored"
        );
        assert_eq!(out.quarantined[0].kind, ParkedKind::Invalid);
    }

    #[test]
    fn an_item_without_identity_leaves_the_batch_undecided() {
        let def = def(OnInvalid::Quarantine);
        let asked = ids(&["a", "b", "c"]);
        let page = answer(json!([{ "id": "a", "total": 1 }, { "total": 2 }]));
        let out = resolve_lookup(&def, &key(), &asked, &page, NOW).expect("an answer");
        assert_eq!(out.found.len(), 1, "a is still diffed");
        assert!(out.gone.is_empty(), "nothing deleted: {:?}", out.gone);
        assert_eq!(out.undecided, ids(&["b", "c"]));
        assert_eq!(out.quarantined.len(), 1);

        let rejected = Page::default().reject("[\"\\ud800\"]", "a lone surrogate");
        let out = resolve_lookup(&def, &key(), &asked, &rejected, NOW).expect("an answer");
        assert!(out.gone.is_empty());
        assert_eq!(
            out.undecided, asked,
            "an undecodable item hides its identity"
        );
    }

    #[test]
    fn an_answer_that_cannot_say_what_is_gone_is_an_error() {
        let def = def(OnInvalid::Quarantine);
        let asked = ids(&["a"]);
        for (label, page) in [
            ("has_more", Page::default().has_more(true)),
            ("not_modified", Page::not_modified()),
        ] {
            let error = resolve_lookup(&def, &key(), &asked, &page, NOW)
                .err()
                .unwrap_or_else(|| panic!("{label}: accepted"));
            assert_eq!(error.code(), crate::ErrorCode::Fetch, "{label}: {error}");
        }
        let done = Page::default().has_more(false);
        assert!(resolve_lookup(&def, &key(), &asked, &done, NOW).is_ok());
    }

    #[test]
    fn an_invalid_item_fails_the_lookup_when_asked_to() {
        let def = def(OnInvalid::Fail);
        let page = answer(json!([{ "id": "a", "total": "x" }]));
        let error = resolve_lookup(&def, &key(), &ids(&["a"]), &page, NOW)
            .err()
            .expect("on_invalid: fail");
        assert_eq!(error.code(), crate::ErrorCode::Validation, "{error}");
    }
}
