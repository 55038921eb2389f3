//! One page turned into the work to commit: the cursor advances, items are validated
//! (invalid ones quarantined), deduplicated and diffed against the stored rows, and events get
//! their deterministic ids.

use super::*;

impl Run<'_> {
    /// Advances the cursor, validates and diffs one page; a full scan merges the page's
    /// identities before it is committed.
    pub(super) async fn process(
        &self,
        cycle: &mut Cycle,
        scan: Option<&mut FullScan<'_>>,
        cursor: &Cursor,
        page: crate::fetch::Page,
    ) -> Result<Processed, CycleError> {
        let def = &self.rt.def;
        let now = self.now();
        // The cursor moves over the page as the API returned it, before validation (SPEC §2.6):
        // an invalid item must not hold a timestamp watermark back, or a page of invalid items
        // would be fetched again and again and block everything behind it.
        let input = AdvanceInput {
            items: &page.items,
            page_cursor: page.cursor.as_deref(),
            has_more: page.has_more,
            now_ms: now,
        };
        let strategy = Arc::clone(&cycle.spec.strategy);
        let advance = strategy
            .advance(cursor, input)
            .map_err(|error| CycleError::Failed {
                error,
                phase: Phase::Fetch,
                throttle: None,
            })?;
        let mut valid = Vec::new();
        let mut quarantined = Vec::new();
        // What the page lists for a full scan: valid items, and invalid ones whose identity
        // can be read (they count as seen, so an item that starts failing validation is not
        // reported deleted).
        let mut listed = Vec::new();
        let keep = advance.keep.iter().copied().chain(std::iter::repeat(true));
        for (raw, _) in page.items.iter().zip(keep).filter(|(_, keep)| *keep) {
            match (def.prepare)(raw) {
                Prepared::Valid(candidate) => valid.push(candidate),
                Prepared::Invalid { issues, identity } => match def.on_invalid {
                    OnInvalid::Fail => {
                        return Err(CycleError::Failed {
                            error: Error::Validation { issues },
                            phase: Phase::Fetch,
                            throttle: None,
                        });
                    }
                    OnInvalid::Skip => {
                        tracing::warn!(key = %self.key, ?issues, "invalid item skipped");
                        self.note_seen_invalid(cycle, &mut listed, identity);
                    }
                    OnInvalid::Quarantine => {
                        self.note_seen_invalid(cycle, &mut listed, identity);
                        let row = quarantine_row(Json::from_value(raw), issues, now);
                        quarantined.push(row);
                    }
                },
            }
        }
        // Items the fetch could not even decode (see `Page::reject`): invalid, identity unknown.
        for rejected in &page.rejected {
            let issues = vec![crate::model::ValidationIssue {
                message: rejected.reason.clone(),
                path: None,
            }];
            match def.on_invalid {
                OnInvalid::Fail => {
                    return Err(CycleError::Failed {
                        error: Error::Validation { issues },
                        phase: Phase::Fetch,
                        throttle: None,
                    });
                }
                OnInvalid::Skip => {
                    tracing::warn!(key = %self.key, ?issues, "undecodable item skipped");
                    self.note_seen_invalid(cycle, &mut listed, None);
                }
                OnInvalid::Quarantine => {
                    self.note_seen_invalid(cycle, &mut listed, None);
                    let item = Json::from_value(&serde_json::Value::String(rejected.text.clone()));
                    quarantined.push(quarantine_row(item, issues, now));
                }
            }
        }
        let kept: Vec<(String, crate::poller::Candidate)> =
            valid.into_iter().map(|c| (c.identity.clone(), c)).collect();
        let kept = dedupe_last_wins(kept);
        let identities: Vec<String> = kept.iter().map(|(id, _)| id.clone()).collect();
        if let Some(scan) = scan {
            listed.extend(identities.iter().cloned());
            scan.list(listed).await?;
        }
        let stored = self
            .shared
            .store
            .load_versions(&self.key, &identities)
            .await?;
        let cursor_json = Json::parse(&cycle.spec.strategy.serialize(&advance.cursor)).ok();
        let mut upserts = Vec::new();
        let mut events = Vec::new();
        let time = format_rfc3339_ms(now);
        for (identity, candidate) in kept {
            let row = stored.get(&identity);
            let version = candidate.version.clone();
            // Unchanged rows are not rewritten, full scans included: a scan of a million items
            // must not rewrite a million rows (deletes come from the merge, not `seen_at`).
            if unchanged_by_version(row, version.as_deref(), def.schema_version)
                && !cycle.spec.force
            {
                continue;
            }
            let value = candidate.value.clone();
            let hash = match (candidate.fingerprint)() {
                Ok(hash) => hash,
                Err(error) => {
                    // An item that cannot be fingerprinted is invalid like any other: it never
                    // fails the page it came with.
                    let issues = vec![crate::model::ValidationIssue {
                        message: format!("item {identity:?} cannot be fingerprinted: {error}"),
                        path: None,
                    }];
                    match def.on_invalid {
                        OnInvalid::Fail => {
                            return Err(CycleError::Failed {
                                error: Error::Validation { issues },
                                phase: Phase::Fetch,
                                throttle: None,
                            });
                        }
                        OnInvalid::Skip => {
                            tracing::warn!(key = %self.key, ?issues, "invalid item skipped");
                        }
                        OnInvalid::Quarantine => {
                            quarantined.push(quarantine_row(Json::from_value(&value), issues, now));
                        }
                    }
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
            // A forced backfill re-emits known, unchanged items as `updated`.
            if cycle.spec.force && decision.event.is_none() && row.is_some() {
                decision.event = Some(EventType::Updated);
            }
            let data = Json::from_value(&value);
            if decision.upsert {
                upserts.push(ItemRow {
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
                let version_or_hash = version.clone().unwrap_or_else(|| hash.clone());
                events.push(self.event(
                    cycle,
                    &identity,
                    &version_or_hash,
                    event_type,
                    Some(data),
                    previous,
                    cursor_json.clone(),
                    &time,
                ));
            }
        }
        // A backfill also stops once it reached its target.
        let reached = cycle
            .spec
            .target
            .as_ref()
            .is_some_and(|t| strategy.reached(&advance.cursor, t));
        cycle.done = advance.done || reached;
        let lane_cursor = if advance.done {
            cycle.spec.strategy.on_cycle_complete(&advance.cursor)
        } else {
            advance.cursor.clone()
        };
        cycle.cursor = Some(lane_cursor);
        Ok(Processed {
            upserts,
            events,
            quarantined,
            ..Processed::default()
        })
    }

    pub(super) fn note_seen_invalid(
        &self,
        cycle: &mut Cycle,
        listed: &mut Vec<String>,
        identity: Option<String>,
    ) {
        if cycle.spec.full_scan {
            match identity {
                Some(identity) => listed.push(identity),
                None => cycle.unknown_invalid = true,
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn event(
        &self,
        cycle: &mut Cycle,
        identity: &str,
        version_or_hash: &str,
        event_type: EventType,
        data: Option<Json>,
        previous: Option<Json>,
        cursor: Option<Json>,
        time: &str,
    ) -> Event {
        cycle.sequence += 1;
        let id = event_id(&EventIdParts {
            source: &self.rt.source,
            partition: &self.key.partition,
            identity,
            version_or_hash,
            schema_version: self.rt.def.schema_version,
            event_type,
        });
        Event {
            id,
            event_type,
            source: self.rt.source.clone(),
            subject: identity.to_owned(),
            time: time.to_owned(),
            poller: self.key.poller.clone(),
            partition: self.key.partition.clone(),
            lane: cycle.spec.lane,
            sequence: cycle.sequence,
            cursor,
            data,
            previous,
            attempt: 0,
            traceparent: cycle.traceparent.clone(),
        }
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
