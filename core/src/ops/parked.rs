//! Parked rows: list, retry and discard, with the same rules for every caller.

use crate::error::{Error, Result};
use crate::model::{PKey, ParkedAction, ParkedKind, ParkedQuery, ParkedRow};
use crate::store::Store;

/// Which parked rows of a key an operation is about: the rows named by `ids` (every row when
/// `None`), of one kind (both kinds when `None`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ParkedSelection {
    /// The rows' ids (`None`: every row of the key).
    pub ids: Option<Vec<String>>,
    /// Only rows of this kind.
    pub kind: Option<ParkedKind>,
    /// At most this many rows, oldest first (listing only).
    pub limit: Option<usize>,
}

impl ParkedSelection {
    /// Every parked row of the key.
    pub fn all() -> Self {
        Self::default()
    }

    /// The rows with these ids; each must exist and fit the operation, or nothing is done.
    pub fn ids<I: Into<String>>(ids: impl IntoIterator<Item = I>) -> Self {
        Self {
            ids: Some(ids.into_iter().map(Into::into).collect()),
            ..Self::default()
        }
    }

    /// Only rows of this kind.
    #[must_use]
    pub fn kind(mut self, kind: ParkedKind) -> Self {
        self.kind = Some(kind);
        self
    }

    /// At most this many rows (listing only).
    #[must_use]
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = Some(limit);
        self
    }
}

/// The selected parked rows of `key`, oldest first.
pub async fn list_parked(
    store: &dyn Store,
    key: &PKey,
    selection: &ParkedSelection,
) -> Result<Vec<ParkedRow>> {
    let query = ParkedQuery {
        kind: selection.kind,
        // Filtered by id below, then limited.
        limit: if selection.ids.is_some() {
            None
        } else {
            selection.limit
        },
    };
    let mut rows = store.list_parked(key, query).await?;
    if let Some(ids) = &selection.ids {
        rows.retain(|row| ids.contains(&row.id));
        if let Some(limit) = selection.limit {
            rows.truncate(limit);
        }
    }
    Ok(rows)
}

/// Moves the selected poison rows back to the outbox (their hold on the key released): the
/// key's next drain delivers them, then its later events in order. Returns the ids that moved.
///
/// Quarantined (invalid) items cannot be retried (they never became events): selecting
/// [`ParkedKind::Invalid`] is a [`Error::Config`] error, and so is naming one by id. An id that
/// names no parked row of the key is [`Error::NotFound`]. Either way nothing moves.
pub async fn retry_parked(
    store: &dyn Store,
    key: &PKey,
    selection: &ParkedSelection,
) -> Result<Vec<String>> {
    if selection.kind == Some(ParkedKind::Invalid) {
        return Err(quarantined_cannot_be_retried(None));
    }
    let mut poison = selection.clone();
    poison.kind = Some(ParkedKind::Poison);
    poison.limit = None;
    let rows = list_parked(store, key, &poison).await?;
    check_ids(store, key, &poison, &rows, ParkedAction::Retry).await?;
    resolve(store, key, rows, ParkedAction::Retry).await
}

/// Deletes the selected parked rows (releasing their hold on the key). Returns the ids removed.
/// An id that names no parked row of the key (of the selected kind) is [`Error::NotFound`], and
/// nothing is removed.
pub async fn discard_parked(
    store: &dyn Store,
    key: &PKey,
    selection: &ParkedSelection,
) -> Result<Vec<String>> {
    let mut all = selection.clone();
    all.limit = None;
    let rows = list_parked(store, key, &all).await?;
    check_ids(store, key, &all, &rows, ParkedAction::Discard).await?;
    resolve(store, key, rows, ParkedAction::Discard).await
}

async fn resolve(
    store: &dyn Store,
    key: &PKey,
    rows: Vec<ParkedRow>,
    action: ParkedAction,
) -> Result<Vec<String>> {
    let ids: Vec<String> = rows.into_iter().map(|row| row.id).collect();
    if !ids.is_empty() {
        store.resolve_parked(key, &ids, action).await?;
    }
    Ok(ids)
}

fn quarantined_cannot_be_retried(ids: Option<&[&String]>) -> Error {
    let which = match ids {
        Some(ids) => format!(
            "{} quarantined (invalid): ",
            ids.iter()
                .map(|id| id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        None => String::new(),
    };
    Error::config(
        "kind",
        format!(
            "{which}quarantined items cannot be retried: they never became events; fix the data \
             or the poller's check (the next poll sees the item again), then discard the rows"
        ),
    )
}

/// Every asked id must name a row the operation applies to; the error names each one that does
/// not, and why.
async fn check_ids(
    store: &dyn Store,
    key: &PKey,
    selection: &ParkedSelection,
    rows: &[ParkedRow],
    action: ParkedAction,
) -> Result<()> {
    let retry = matches!(action, ParkedAction::Retry);
    let what = if retry { "retried" } else { "discarded" };
    let Some(ids) = &selection.ids else {
        return Ok(());
    };
    let missing: Vec<&String> = ids
        .iter()
        .filter(|id| !rows.iter().any(|row| &row.id == *id))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let every = store.list_parked(key, ParkedQuery::default()).await?;
    let kind_of = |id: &String| every.iter().find(|row| &row.id == id).map(|row| row.kind);
    if retry {
        let quarantined: Vec<&String> = missing
            .iter()
            .copied()
            .filter(|id| kind_of(id) == Some(ParkedKind::Invalid))
            .collect();
        if quarantined.len() == missing.len() {
            return Err(quarantined_cannot_be_retried(Some(&quarantined)));
        }
    }
    let explain = |id: &String| match kind_of(id) {
        Some(kind) => format!("{id} (kind {})", kind.as_str()),
        None => format!("{id} (no such parked row)"),
    };
    Err(Error::NotFound {
        message: format!(
            "nothing was {what}: {} on {key}: {}",
            if missing.len() == 1 {
                "this id does not apply"
            } else {
                "these ids do not apply"
            },
            missing
                .into_iter()
                .map(explain)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    })
}
