//! One page turned into the work to commit: the cursor advances, items are validated
//! (invalid ones quarantined), deduplicated and diffed against the stored rows, and events get
//! their deterministic ids.

use std::collections::HashMap;

use smol_str::SmolStr;

use crate::clock::format_rfc3339_ms;
use crate::cursor::{AdvanceInput, Cursor, SharedStrategy};
use crate::decide::{decide, dedupe_last_wins, unchanged_by_version};
use crate::diff::{EventIdParts, sha256_hex};
use crate::error::{Error, Result};
use crate::event::{Event, EventType};
use crate::fetch::Page;
use crate::full_scan::FullScan;
use crate::hooks::Phase;
use crate::json::Json;
use crate::model::{ItemRow, Lane, PKey, ParkedError, ParkedKind, ParkedRow, SerializedError};
use crate::poller::{OnInvalid, PollerDef, Prepared, Retain};
use crate::runner::cycle::{Cycle, LaneSpec};
use crate::runner::{CycleError, Run};

/// Where and when a page's events are made: what their ids and envelopes are made of, the
/// cursor they carry, and the sequence they continue. The strings every event of the page shares
/// are made once, and each event takes a cheap clone of them.
pub(crate) struct EventSource<'a> {
    /// The poller's event source (`urn:watukuy:…`).
    source: SmolStr,
    /// The poller and partition.
    pub(crate) key: &'a PKey,
    poller: SmolStr,
    partition: SmolStr,
    /// The lane the page was read on.
    lane: Lane,
    /// The W3C traceparent of the cycle.
    traceparent: Option<SmolStr>,
    /// The planning's time: the events' `time`, the rows' `seen_at`.
    pub(crate) now: i64,
    time: SmolStr,
    /// The cursor the events carry.
    cursor: Option<Json>,
    /// The sequence of the last event made (the next one takes the one after).
    sequence: i64,
}

/// When a page is planned: its time, the sequence its events continue and the cursor they carry.
pub(crate) struct At {
    /// The planning's time (epoch milliseconds).
    pub(crate) now: i64,
    /// The sequence of the last event before the page's.
    pub(crate) sequence: i64,
    /// The cursor the page's events carry.
    pub(crate) cursor: Option<Json>,
}

/// One observation of an item, which an event reports.
pub(crate) struct Observed<'i> {
    pub(crate) identity: &'i str,
    /// The item's version, or its content hash: part of the event id.
    pub(crate) version_or_hash: &'i str,
    pub(crate) event_type: EventType,
    pub(crate) data: Option<Json>,
    pub(crate) previous: Option<Json>,
}

impl<'a> EventSource<'a> {
    /// The events of `key`'s pages read on `lane`, made `at` a time, a sequence and a cursor.
    pub(crate) fn new(
        source: &str,
        key: &'a PKey,
        lane: Lane,
        traceparent: Option<&str>,
        at: At,
    ) -> Self {
        Self {
            source: SmolStr::new(source),
            key,
            poller: SmolStr::new(&key.poller),
            partition: SmolStr::new(&key.partition),
            lane,
            traceparent: traceparent.map(SmolStr::new),
            now: at.now,
            time: SmolStr::from(format_rfc3339_ms(at.now)),
            cursor: at.cursor,
            sequence: at.sequence,
        }
    }

    /// The sequence of the last event made.
    pub(crate) fn sequence(&self) -> i64 {
        self.sequence
    }

    /// The event of one observation, with the next sequence.
    pub(crate) fn event(&mut self, schema_version: u32, observed: Observed<'_>) -> Event {
        self.sequence += 1;
        let id = crate::diff::event_id_text(&EventIdParts {
            source: &self.source,
            partition: &self.key.partition,
            identity: observed.identity,
            version_or_hash: observed.version_or_hash,
            schema_version,
            event_type: observed.event_type,
        });
        Event {
            id,
            event_type: observed.event_type,
            source: self.source.clone(),
            subject: SmolStr::new(observed.identity),
            time: self.time.clone(),
            poller: self.poller.clone(),
            partition: self.partition.clone(),
            lane: self.lane,
            sequence: self.sequence,
            cursor: self.cursor.clone(),
            data: observed.data,
            previous: observed.previous,
            attempt: 0,
            traceparent: self.traceparent.clone(),
        }
    }
}

/// A page after validation: the cursor's move and the items to diff.
pub(crate) struct PreparedPage {
    /// The strategy's move over the page (as the API returned it, invalid items included).
    pub(crate) advance: crate::cursor::Advance,
    /// Valid items by identity, the last of a repeated identity kept, in page order.
    pub(crate) valid: Vec<(String, crate::poller::Candidate)>,
    /// Invalid items to park (`on_invalid: quarantine`).
    pub(crate) quarantined: Vec<ParkedRow>,
    /// What the page lists for a full scan: the valid identities and those of invalid items
    /// whose identity can be read (they count as seen, so an item that starts failing
    /// validation is not reported deleted).
    pub(crate) listed: Vec<String>,
    /// An invalid item had no readable identity: a full scan cannot delete this cycle.
    pub(crate) unknown_invalid: bool,
}

/// How a planning step treats an invalid item, by `on_invalid`: `Err` fails the cycle; `Ok`
/// with a row quarantines it; `Ok(None)` skips it.
pub(super) fn invalid(
    def: &PollerDef,
    key: &PKey,
    item: impl FnOnce() -> Json,
    issues: Vec<crate::model::ValidationIssue>,
    now: i64,
) -> Result<Option<ParkedRow>> {
    match def.on_invalid {
        OnInvalid::Fail => Err(Error::Validation { issues }),
        OnInvalid::Skip => {
            tracing::warn!(%key, ?issues, "invalid item skipped");
            Ok(None)
        }
        OnInvalid::Quarantine => Ok(Some(quarantine_row(item(), issues, now))),
    }
}

/// Moves the cursor over a page and validates its items (pure: no store, no clock).
///
/// The cursor moves over the page as the API returned it, before validation: an invalid item
/// must not hold a timestamp watermark back, or a page of invalid items would be fetched again
/// and again and block everything behind it.
pub(crate) fn prepare(
    def: &PollerDef,
    strategy: &SharedStrategy,
    key: &PKey,
    cursor: &Cursor,
    page: &Page,
    now: i64,
) -> Result<PreparedPage> {
    let input = AdvanceInput {
        items: &page.items,
        page_cursor: page.cursor.as_deref(),
        has_more: page.has_more,
        now_ms: now,
    };
    let advance = strategy.advance(cursor, input)?;
    let mut prepared = PreparedPage {
        advance,
        valid: Vec::new(),
        quarantined: Vec::new(),
        listed: Vec::new(),
        unknown_invalid: false,
    };
    let mut valid = Vec::new();
    let keep = prepared
        .advance
        .keep
        .iter()
        .copied()
        .chain(std::iter::repeat(true));
    for (raw, _) in page.items.iter().zip(keep).filter(|(_, keep)| *keep) {
        match (def.prepare)(raw) {
            Prepared::Valid(candidate) => valid.push(candidate),
            Prepared::Invalid { issues, identity } => {
                let row = invalid(def, key, || Json::from_value(raw), issues, now)?;
                prepared.quarantined.extend(row);
                match identity {
                    Some(identity) => prepared.listed.push(identity),
                    None => prepared.unknown_invalid = true,
                }
            }
        }
    }
    // Items the fetch could not even decode (see `Page::reject`): invalid, identity unknown.
    for rejected in &page.rejected {
        let issues = vec![crate::model::ValidationIssue {
            message: rejected.reason.clone(),
            path: None,
        }];
        let text = || Json::from_value(&serde_json::Value::String(rejected.text.clone()));
        prepared
            .quarantined
            .extend(invalid(def, key, text, issues, now)?);
        prepared.unknown_invalid = true;
    }
    let kept = valid.into_iter().map(|c| (c.identity.clone(), c)).collect();
    prepared.valid = dedupe_last_wins(kept);
    prepared
        .listed
        .extend(prepared.valid.iter().map(|(id, _)| id.clone()));
    Ok(prepared)
}

/// A page's snapshot delta and events.
#[derive(Default)]
pub(crate) struct Diff {
    /// Snapshot rows to write.
    pub(crate) upserts: Vec<ItemRow>,
    /// The page's events, with their sequences.
    pub(crate) events: Vec<Event>,
    /// Items that could not be fingerprinted, to park.
    pub(crate) quarantined: Vec<ParkedRow>,
}

/// Diffs a page's valid items against their stored rows (pure: no store, no clock): the
/// decision table decides each item's event and whether its row is written; unchanged rows are
/// not rewritten; a forced backfill re-emits known, unchanged items as `updated`; every event
/// takes the next sequence of `events`.
pub(crate) fn plan(
    def: &PollerDef,
    events: &mut EventSource<'_>,
    valid: Vec<(String, crate::poller::Candidate)>,
    stored: &HashMap<String, ItemRow>,
    force: bool,
) -> Result<Diff> {
    let mut out = Diff::default();
    let now = events.now;
    for (identity, mut candidate) in valid {
        let row = stored.get(&identity);
        let version = candidate.version.clone();
        // Unchanged rows are not rewritten, full scans included: a scan of a million items
        // must not rewrite a million rows (deletes come from the merge, not `seen_at`).
        if unchanged_by_version(row, version.as_deref(), def.schema_version) && !force {
            continue;
        }
        let hash = candidate.fingerprint();
        let value = candidate.value;
        let hash = match hash {
            Ok(hash) => hash,
            Err(error) => {
                // An item that cannot be fingerprinted is invalid like any other: it never
                // fails the page it came with.
                let issues = vec![crate::model::ValidationIssue {
                    message: format!("item {identity:?} cannot be fingerprinted: {error}"),
                    path: None,
                }];
                let key = events.key;
                let row = invalid(def, key, || Json::from_value(&value), issues, now)?;
                out.quarantined.extend(row);
                continue;
            }
        };
        let mut decision = decide(
            row,
            &hash,
            version.as_deref(),
            def.schema_version,
            def.on_schema_change,
            false,
        );
        if force && decision.event.is_none() && row.is_some() {
            decision.event = Some(EventType::Updated);
        }
        let data = Json::from_value(&value);
        if decision.upsert {
            out.upserts.push(ItemRow {
                identity: identity.clone(),
                version: version.clone(),
                hash: hash.clone(),
                schema_version: def.schema_version,
                payload: (def.retain == Retain::Payload).then(|| data.clone()),
                seen_at: now,
            });
        }
        if let Some(event_type) = decision.event {
            let previous = match (event_type, def.retain) {
                (EventType::Updated, Retain::Payload) => row.and_then(|r| r.payload.clone()),
                _ => None,
            };
            let version_or_hash = version.unwrap_or(hash);
            out.events.push(events.event(
                def.schema_version,
                Observed {
                    identity: &identity,
                    version_or_hash: &version_or_hash,
                    event_type,
                    data: Some(data),
                    previous,
                },
            ));
        }
    }
    Ok(out)
}

/// The `deleted` events of identities a full scan found gone (pure): each carries the row's
/// version (or hash) in its id, and, with `Retain::Payload`, the last payload as `data` and
/// `previous`. Identities without a stored row are skipped.
pub(crate) fn plan_deletes(
    def: &PollerDef,
    events: &mut EventSource<'_>,
    identities: &[String],
    stored: &HashMap<String, ItemRow>,
) -> Vec<Event> {
    identities
        .iter()
        .filter_map(|identity| {
            let row = stored.get(identity)?;
            let payload = (def.retain == Retain::Payload)
                .then(|| row.payload.clone())
                .flatten();
            Some(events.event(
                def.schema_version,
                Observed {
                    identity,
                    version_or_hash: row.version.as_deref().unwrap_or(&row.hash),
                    event_type: EventType::Deleted,
                    data: payload.clone(),
                    previous: payload,
                },
            ))
        })
        .collect()
}

/// A page's work as a value: what its one `commit_poll` writes, and what the cycle's running
/// state becomes once that commit succeeded ([`Progress`]). Nothing of it touches the cycle
/// before then: a failed commit leaves the cycle as it was.
#[derive(Default)]
pub(super) struct PagePlan {
    pub(super) upserts: Vec<ItemRow>,
    pub(super) deletes: Vec<String>,
    pub(super) events: Vec<Event>,
    /// Invalid items, parked with the page (`on_invalid: quarantine`).
    pub(super) quarantined: Vec<ParkedRow>,
    /// The validators of the responses the page was built from.
    pub(super) validators: Vec<crate::model::UrlValidator>,
    /// A full scan's new suspects, replacing the lane's (see `DeleteConfirmation`).
    pub(super) suspects: Option<Vec<String>>,
    /// The cycle after the commit.
    pub(super) progress: Progress,
}

/// What a committed page moves the cycle to.
#[derive(Default)]
pub(super) struct Progress {
    /// The sequence of the page's last event (`None`: it stays).
    pub(super) sequence: Option<i64>,
    /// Where the lane's cursor moves (`None`: it stays).
    pub(super) cursor: Option<Cursor>,
    /// The listing is complete (or a backfill reached its target).
    pub(super) done: bool,
    /// A full scan's page held an invalid item without a readable identity: no deletes this
    /// cycle.
    pub(super) unknown_invalid: bool,
}

impl PagePlan {
    /// Nothing for the store: no row, event, parked item, validator or suspect change.
    pub(super) fn writes_nothing(&self) -> bool {
        self.upserts.is_empty()
            && self.deletes.is_empty()
            && self.events.is_empty()
            && self.quarantined.is_empty()
            && self.validators.is_empty()
            && self.suspects.is_none()
    }
}

/// Plans a listed page (pure): [`plan`] over the prepared items and their stored rows, the
/// cursor's move (to the strategy's end-of-cycle cursor when the listing is complete), and
/// whether the cycle is done (a backfill also stops once it reached its target).
pub(super) fn page_plan(
    def: &PollerDef,
    spec: &LaneSpec,
    prepared: PreparedPage,
    stored: &HashMap<String, ItemRow>,
    mut events: EventSource<'_>,
) -> Result<PagePlan> {
    let diff = plan(def, &mut events, prepared.valid, stored, spec.force)?;
    let advance = prepared.advance;
    let strategy = &spec.strategy;
    let reached = spec
        .target
        .as_ref()
        .is_some_and(|t| strategy.reached(&advance.cursor, t));
    let cursor = if advance.done {
        strategy.on_cycle_complete(&advance.cursor)
    } else {
        advance.cursor
    };
    let mut quarantined = prepared.quarantined;
    quarantined.extend(diff.quarantined);
    Ok(PagePlan {
        upserts: diff.upserts,
        events: diff.events,
        quarantined,
        progress: Progress {
            sequence: Some(events.sequence()),
            cursor: Some(cursor),
            done: advance.done || reached,
            unknown_invalid: spec.full_scan && prepared.unknown_invalid,
        },
        ..PagePlan::default()
    })
}

impl Run<'_> {
    /// Where this cycle's events come from, made `at` a time, a sequence and a cursor.
    pub(super) fn event_source<'c>(&'c self, cycle: &'c Cycle, at: At) -> EventSource<'c> {
        EventSource::new(
            &self.rt.source,
            &self.key,
            cycle.spec.lane,
            cycle.traceparent.as_deref(),
            at,
        )
    }

    /// Plans one page: [`prepare`], the full scan's merge of the listed identities (before the
    /// page is committed), the stored rows of the page's items, [`page_plan`]. Reads only: the
    /// cycle moves when the plan is committed.
    pub(super) async fn process(
        &self,
        cycle: &Cycle,
        scan: Option<&mut FullScan<'_>>,
        cursor: &Cursor,
        page: Page,
    ) -> Result<PagePlan, CycleError> {
        let def = &self.rt.def;
        let now = self.now();
        let strategy = &cycle.spec.strategy;
        let fetch_phase = |error| CycleError::Failed {
            error,
            phase: Phase::Fetch,
            throttle: None,
        };
        let mut prepared =
            prepare(def, strategy, &self.key, cursor, &page, now).map_err(fetch_phase)?;
        if let Some(scan) = scan {
            scan.list(std::mem::take(&mut prepared.listed)).await?;
        }
        let identities: Vec<String> = prepared.valid.iter().map(|(id, _)| id.clone()).collect();
        let stored = if identities.is_empty() {
            Default::default()
        } else {
            self.shared
                .store
                .load_versions(&self.key, &identities)
                .await?
        };
        let at = At {
            now,
            sequence: cycle.sequence,
            cursor: Json::parse(&strategy.serialize(&prepared.advance.cursor)).ok(),
        };
        page_plan(
            def,
            &cycle.spec,
            prepared,
            &stored,
            self.event_source(cycle, at),
        )
        .map_err(fetch_phase)
    }
}

/// The parked row of a quarantined item: its id is derived from the item's text, so the same
/// invalid item parks once however often it is listed.
pub(super) fn quarantine_row(
    item: Json,
    issues: Vec<crate::model::ValidationIssue>,
    now: i64,
) -> ParkedRow {
    let message = issues
        .iter()
        .map(|i| i.message.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    ParkedRow {
        id: format!("invalid:{}", &sha256_hex(item.as_str().as_bytes())[..32]),
        kind: ParkedKind::Invalid,
        event: None,
        item: Some(item),
        error: ParkedError {
            error: SerializedError::new("ValidationError", message).with_code("VALIDATION"),
            history: None,
            issues: Some(issues),
            details: Default::default(),
        },
        attempts: 0,
        parked_at: now,
        hold_key: None,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::poller::Poller;

    const NOW: i64 = 1_767_225_600_000;

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Order {
        id: String,
        total: i64,
    }

    fn def(on_invalid: OnInvalid, retain: Retain) -> Arc<PollerDef> {
        let poller = Poller::builder::<Order>("orders")
            .identity(|o: &Order| o.id.clone())
            .raw_identity(|raw| raw.get("id")?.as_str().map(str::to_owned))
            .cursor(crate::cursor::page(1))
            .on_invalid(on_invalid)
            .retain(retain)
            .fetch(|_ctx: crate::FetchContext| async { Ok(Page::default()) })
            .build()
            .expect("a valid poller");
        Arc::clone(&poller.inner)
    }

    fn key() -> PKey {
        PKey::new("orders", "eu")
    }

    fn source(key: &PKey, sequence: i64) -> EventSource<'_> {
        let at = At {
            now: NOW,
            sequence,
            cursor: None,
        };
        EventSource::new("urn:watukuy:orders", key, Lane::Live, None, at)
    }

    fn page(items: serde_json::Value) -> Page {
        let serde_json::Value::Array(items) = items else {
            panic!("an array");
        };
        Page::new(items).has_more(false)
    }

    fn prepared(def: &PollerDef, page: &Page) -> Result<PreparedPage> {
        let strategy = Arc::clone(&def.strategy);
        prepare(def, &strategy, &key(), &strategy.initial(), page, NOW)
    }

    fn stored(identity: &str, def: &PollerDef, total: i64) -> ItemRow {
        let page = page(json!([{ "id": identity, "total": total }]));
        let mut valid = prepared(def, &page).expect("valid").valid;
        let (_, mut candidate) = valid.pop().expect("one item");
        let payload = Json::from_value(&candidate.value);
        ItemRow {
            identity: identity.to_owned(),
            version: None,
            hash: candidate.fingerprint().expect("a fingerprint"),
            schema_version: def.schema_version,
            payload: Some(payload),
            seen_at: NOW - 1_000,
        }
    }

    #[test]
    fn prepare_validates_dedupes_and_lists_what_a_full_scan_saw() {
        let def = def(OnInvalid::Quarantine, Retain::Hash);
        let page = page(json!([
            { "id": "a", "total": 1 },
            { "id": "b", "total": 2 },
            { "id": "a", "total": 3 },
            { "id": "bad", "total": "x" },
        ]))
        .reject("[\"\\ud800\"]", "a lone surrogate");
        let prepared = prepared(&def, &page).expect("a page with invalid items still plans");
        let valid: Vec<(&str, &serde_json::Value)> = prepared
            .valid
            .iter()
            .map(|(id, c)| (id.as_str(), &c.value["total"]))
            .collect();
        assert_eq!(
            valid,
            [("a", &json!(3)), ("b", &json!(2))],
            "the last a wins"
        );
        assert_eq!(
            prepared.quarantined.len(),
            2,
            "the invalid and the undecodable item"
        );
        assert!(
            prepared
                .quarantined
                .iter()
                .all(|row| row.kind == ParkedKind::Invalid && row.parked_at == NOW)
        );
        assert_eq!(
            prepared.listed,
            ["bad", "a", "b"],
            "invalid with identity counts as seen"
        );
        assert!(
            prepared.unknown_invalid,
            "the undecodable item has no identity"
        );
        assert!(prepared.advance.done);
    }

    #[test]
    fn prepare_fails_the_page_when_asked_and_skips_when_asked() {
        let bad = page(json!([{ "id": "a", "total": 1 }, { "id": "bad", "total": "x" }]));
        let error = prepared(&def(OnInvalid::Fail, Retain::Hash), &bad)
            .err()
            .expect("on_invalid: fail");
        assert_eq!(error.code(), crate::ErrorCode::Validation, "{error}");
        let skipped = prepared(&def(OnInvalid::Skip, Retain::Hash), &bad).expect("skip");
        assert!(skipped.quarantined.is_empty());
        assert_eq!(skipped.valid.len(), 1);
    }

    #[test]
    fn plan_emits_created_updated_and_nothing_for_unchanged_with_pinned_ids() {
        let def = def(OnInvalid::Quarantine, Retain::Payload);
        let key = key();
        let rows: HashMap<String, ItemRow> = [stored("same", &def, 1), stored("changed", &def, 1)]
            .into_iter()
            .map(|row| (row.identity.clone(), row))
            .collect();
        let page = page(json!([
            { "id": "same", "total": 1 },
            { "id": "changed", "total": 2 },
            { "id": "new", "total": 3 },
        ]));
        let valid = prepared(&def, &page).expect("valid").valid;
        let mut from = source(&key, 41);
        let planned = plan(&def, &mut from, valid, &rows, false).expect("a plan");
        let events: Vec<(EventType, &str, i64)> = planned
            .events
            .iter()
            .map(|e| (e.event_type, e.subject.as_str(), e.sequence))
            .collect();
        assert_eq!(
            events,
            [
                (EventType::Updated, "changed", 42),
                (EventType::Created, "new", 43)
            ]
        );
        assert_eq!(from.sequence(), 43);
        let upserted: Vec<&str> = planned
            .upserts
            .iter()
            .map(|r| r.identity.as_str())
            .collect();
        assert_eq!(
            upserted,
            ["changed", "new"],
            "an unchanged row is not rewritten"
        );
        let updated = &planned.events[0];
        assert_eq!(
            updated.previous.as_ref().map(Json::as_str),
            Some(r#"{"id":"changed","total":1}"#),
            "retain payload: the previous payload"
        );
        let expected_id = crate::diff::event_id(&EventIdParts {
            source: "urn:watukuy:orders",
            partition: "eu",
            identity: "changed",
            version_or_hash: &planned.upserts[0].hash,
            schema_version: def.schema_version,
            event_type: EventType::Updated,
        });
        assert_eq!(updated.id, expected_id);
        assert_eq!(updated.time, "2026-01-01T00:00:00.000Z");
    }

    #[test]
    fn a_forced_plan_re_emits_unchanged_items_as_updated() {
        let def = def(OnInvalid::Quarantine, Retain::Hash);
        let key = key();
        let rows: HashMap<String, ItemRow> = [stored("same", &def, 1)]
            .into_iter()
            .map(|row| (row.identity.clone(), row))
            .collect();
        let valid = prepared(&def, &page(json!([{ "id": "same", "total": 1 }])))
            .expect("valid")
            .valid;
        let planned = plan(&def, &mut source(&key, 0), valid, &rows, true).expect("a plan");
        assert_eq!(planned.events.len(), 1);
        assert_eq!(planned.events[0].event_type, EventType::Updated);
    }

    #[test]
    fn plan_deletes_carries_the_last_payload_and_skips_unknown_identities() {
        let def = def(OnInvalid::Quarantine, Retain::Payload);
        let key = key();
        let row = stored("gone", &def, 7);
        let rows: HashMap<String, ItemRow> = [(row.identity.clone(), row.clone())].into();
        let identities = ["gone".to_owned(), "never-stored".to_owned()];
        let events = plan_deletes(&def, &mut source(&key, 9), &identities, &rows);
        assert_eq!(events.len(), 1);
        let deleted = &events[0];
        assert_eq!(
            (
                deleted.event_type,
                deleted.subject.as_str(),
                deleted.sequence
            ),
            (EventType::Deleted, "gone", 10)
        );
        assert_eq!(deleted.data, row.payload);
        assert_eq!(deleted.previous, row.payload);
    }
}
