//! The engine's handle on a poller definition (at the crate root, where users name it).

use std::fmt;
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{PollerBuilder, PollerDef};
#[cfg(feature = "unstable")]
use crate::error::Result;

/// A validated, type-erased poller definition.
#[derive(Clone)]
pub struct Poller {
    pub(crate) inner: Arc<PollerDef>,
}

impl fmt::Debug for Poller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Poller")
            .field("name", &self.inner.name)
            .field("cursor", &self.inner.strategy.name())
            .field("schema_version", &self.inner.schema_version)
            .finish_non_exhaustive()
    }
}

impl Poller {
    /// Starts a definition over the item type `T`. `name` must match
    /// `^[a-zA-Z0-9][a-zA-Z0-9._-]{0,127}$`: it keys the store, so renaming starts over.
    pub fn builder<T>(name: impl Into<String>) -> PollerBuilder<T>
    where
        T: Serialize + DeserializeOwned + Send + Sync + 'static,
    {
        PollerBuilder::new(name.into())
    }

    /// The poller's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// True when the poller lists partitions.
    pub fn is_partitioned(&self) -> bool {
        self.inner.partitions.is_some()
    }

    /// Plans one page of raw items on the live lane the way an engine's cycle does, without a
    /// store or a clock: validation (invalid items quarantined by `on_invalid`), deduplication,
    /// the diff against `stored` (the rows of the page's identities), and the events with their
    /// deterministic ids and the next sequences after `*sequence` (which it advances). The
    /// events' source is the engine default's (`urn:watukuy:<name>` unless the poller sets
    /// one). The cursor strategy is not consulted. For custom runners and benchmarks; an
    /// engine does this itself. Unstable (the `unstable` feature): it may change in any release.
    #[cfg(feature = "unstable")]
    pub fn plan_page(
        &self,
        partition: &str,
        items: Vec<serde_json::Value>,
        stored: &std::collections::HashMap<String, crate::model::ItemRow>,
        sequence: &mut i64,
        now_ms: i64,
    ) -> Result<PlannedPage> {
        let def = &self.inner;
        let key = crate::model::PKey::new(def.name.clone(), partition);
        let source = def.source_for(super::DEFAULT_SOURCE_PREFIX);
        let valid = items
            .iter()
            .map(|raw| crate::runner::prepare_item(def, &key, raw, now_ms))
            .collect::<Result<Vec<_>>>()?;
        let mut quarantined = Vec::new();
        let mut candidates = Vec::new();
        for item in valid {
            match item {
                Ok(candidate) => candidates.push((candidate.identity.clone(), candidate)),
                Err(row) => quarantined.extend(row),
            }
        }
        let candidates = crate::decide::dedupe_last_wins(candidates);
        let at = crate::runner::At {
            now: now_ms,
            sequence: *sequence,
            cursor: None,
        };
        let mut from =
            crate::runner::EventSource::new(&source, &key, crate::model::Lane::Live, None, at);
        let planned = crate::runner::plan(def, &mut from, candidates, stored, false)?;
        *sequence = from.sequence();
        quarantined.extend(planned.quarantined);
        Ok(PlannedPage {
            upserts: planned.upserts,
            events: planned.events,
            quarantined,
        })
    }
}

/// What [`Poller::plan_page`] made of a page. Unstable (the `unstable` feature).
#[cfg(feature = "unstable")]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PlannedPage {
    /// Snapshot rows to write (unchanged items are not rewritten).
    pub upserts: Vec<crate::model::ItemRow>,
    /// The page's events, in page order, with their sequences.
    pub events: Vec<crate::event::Event>,
    /// Invalid items to park (with `on_invalid: quarantine`).
    pub quarantined: Vec<crate::model::ParkedRow>,
}
