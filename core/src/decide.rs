//! The diff decisions: what one fetched item means against its stored row.
//! Pure functions; the runner does the I/O around them.

use std::collections::HashMap;

use crate::event::EventType;
use crate::model::ItemRow;

/// What to do when the poller's schema version differs from a stored row's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnSchemaChange {
    /// Re-baseline: store the item under the new schema version without an event.
    #[default]
    Rebaseline,
    /// Emit `updated` when the fingerprint changed; a drift alone only re-stores the row.
    Emit,
}

/// What a fetched item leads to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Decision {
    /// The event to emit, if any.
    pub(crate) event: Option<EventType>,
    /// Whether to write the item row.
    pub(crate) upsert: bool,
}

/// The version fast path: a stored row with the same version string and schema version is
/// unchanged, without hashing.
pub(crate) fn unchanged_by_version(
    stored: Option<&ItemRow>,
    version: Option<&str>,
    schema_version: u32,
) -> bool {
    match (stored, version) {
        (Some(row), Some(version)) => {
            row.version.as_deref() == Some(version) && row.schema_version == schema_version
        }
        _ => false,
    }
}

/// Decides what an item with fingerprint `hash` (and `version`) means against its stored row.
///
/// `touch_unchanged` re-writes unchanged rows (refreshing their `seen_at`). The engine never asks
/// for it: unchanged rows are not rewritten, full scans included.
pub(crate) fn decide(
    stored: Option<&ItemRow>,
    hash: &str,
    version: Option<&str>,
    schema_version: u32,
    on_schema_change: OnSchemaChange,
    touch_unchanged: bool,
) -> Decision {
    let Some(row) = stored else {
        return Decision {
            event: Some(EventType::Created),
            upsert: true,
        };
    };
    let drifted = row.schema_version != schema_version;
    if drifted && on_schema_change == OnSchemaChange::Rebaseline {
        return Decision {
            event: None,
            upsert: true,
        };
    }
    if row.hash != hash {
        return Decision {
            event: Some(EventType::Updated),
            upsert: true,
        };
    }
    let version_changed = row.version.as_deref() != version;
    Decision {
        event: None,
        upsert: drifted || touch_unchanged || version_changed,
    }
}

/// Removes repeated identities from a page: the last occurrence wins, at the position of the
/// first.
pub(crate) fn dedupe_last_wins<T>(items: Vec<(String, T)>) -> Vec<(String, T)> {
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut out: Vec<(String, T)> = Vec::with_capacity(items.len());
    for (identity, item) in items {
        match index.get(&identity) {
            // Every index was `out.len()` just before a push: it is in range.
            Some(&i) => out[i].1 = item,
            None => {
                index.insert(identity.clone(), out.len());
                out.push((identity, item));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(hash: &str, version: Option<&str>, schema_version: u32) -> ItemRow {
        ItemRow {
            identity: "o1".into(),
            version: version.map(str::to_owned),
            hash: hash.into(),
            schema_version,
            payload: None,
            seen_at: 0,
        }
    }

    const CREATE: Decision = Decision {
        event: Some(EventType::Created),
        upsert: true,
    };
    const UPDATE: Decision = Decision {
        event: Some(EventType::Updated),
        upsert: true,
    };
    const SILENT_UPSERT: Decision = Decision {
        event: None,
        upsert: true,
    };
    const NOTHING: Decision = Decision {
        event: None,
        upsert: false,
    };

    #[test]
    fn decision_table() {
        use OnSchemaChange::{Emit, Rebaseline};
        let same = row("h1", None, 1);
        assert_eq!(decide(None, "h1", None, 1, Rebaseline, false), CREATE);
        assert_eq!(
            decide(Some(&same), "h2", None, 1, Rebaseline, false),
            UPDATE
        );
        assert_eq!(
            decide(Some(&same), "h1", None, 1, Rebaseline, false),
            NOTHING
        );
        assert_eq!(
            decide(Some(&same), "h1", None, 1, Rebaseline, true),
            SILENT_UPSERT,
            "full scans touch"
        );
        let versioned = row("h1", Some("v1"), 1);
        assert_eq!(
            decide(Some(&versioned), "h1", Some("v2"), 1, Rebaseline, false),
            SILENT_UPSERT
        );
        let old_schema = row("h1", None, 1);
        assert_eq!(
            decide(Some(&old_schema), "h2", None, 2, Rebaseline, false),
            SILENT_UPSERT,
            "rebaseline: no event"
        );
        assert_eq!(
            decide(Some(&old_schema), "h2", None, 2, Emit, false),
            UPDATE,
            "emit: a changed hash is an update"
        );
        assert_eq!(
            decide(Some(&old_schema), "h1", None, 2, Emit, false),
            SILENT_UPSERT,
            "emit: drift alone re-stores"
        );
    }

    #[test]
    fn version_fast_path_needs_same_version_and_schema() {
        let versioned = row("h1", Some("v1"), 1);
        assert!(unchanged_by_version(Some(&versioned), Some("v1"), 1));
        assert!(!unchanged_by_version(Some(&versioned), Some("v2"), 1));
        assert!(!unchanged_by_version(Some(&versioned), Some("v1"), 2));
        assert!(!unchanged_by_version(Some(&versioned), None, 1));
        assert!(!unchanged_by_version(None, Some("v1"), 1));
    }

    #[test]
    fn dedupe_keeps_the_last_occurrence_at_the_first_position() {
        let page = vec![
            ("a".to_owned(), 1),
            ("b".to_owned(), 2),
            ("a".to_owned(), 3),
            ("c".to_owned(), 4),
        ];
        assert_eq!(
            dedupe_last_wins(page),
            vec![
                ("a".to_owned(), 3),
                ("b".to_owned(), 2),
                ("c".to_owned(), 4)
            ]
        );
    }
}
