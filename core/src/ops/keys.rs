//! The keys a store holds: which `(poller, partition)` a request names, and every key's
//! inspection, for tools that have the store but not the pollers' code.

use crate::error::{Error, Result};
use crate::model::{PKey, PollerState};
use crate::store::Store;

use super::{KeyInspect, inspect_key};

/// The keys of the store (of one poller), sorted. A poller the store holds no key for is
/// [`Error::UnknownPoller`], naming the pollers it does hold.
pub async fn stored_keys(store: &dyn Store, poller: Option<&str>) -> Result<Vec<PKey>> {
    let mut keys = store.list_keys(poller).await?;
    keys.sort();
    if let Some(name) = poller
        && keys.is_empty()
    {
        let mut known: Vec<String> = store
            .list_keys(None)
            .await?
            .into_iter()
            .map(|key| key.poller)
            .collect();
        known.sort();
        known.dedup();
        return Err(Error::UnknownPoller {
            name: name.to_owned(),
            known,
        });
    }
    Ok(keys)
}

/// The key `poller` / `partition` names (`None`: the unpartitioned key), which the store must
/// hold: else [`Error::UnknownPoller`] or [`Error::UnknownPartition`], naming what exists.
pub async fn stored_key(store: &dyn Store, poller: &str, partition: Option<&str>) -> Result<PKey> {
    let keys = stored_keys(store, Some(poller)).await?;
    let partition = partition.unwrap_or_default();
    if keys.iter().any(|key| key.partition == partition) {
        return Ok(PKey::new(poller, partition));
    }
    Err(Error::UnknownPartition {
        poller: poller.to_owned(),
        partition: partition.to_owned(),
        known: keys.into_iter().map(|key| key.partition).collect(),
    })
}

/// Every key the store holds (of one poller; of one partition when both are given), read as
/// [`inspect_key`] reads one, sorted. Without the pollers' code, a key whose state was never
/// saved shows [`PollerState::zero`] (due now), and the lag is read from cursors of the
/// timestamp strategy's shape ([`persisted_lag_ms`](crate::cursor::persisted_lag_ms)).
pub async fn inspect_store(
    store: &dyn Store,
    poller: Option<&str>,
    partition: Option<&str>,
    now: i64,
) -> Result<Vec<KeyInspect>> {
    let keys = match (poller, partition) {
        (Some(name), Some(_)) => vec![stored_key(store, name, partition).await?],
        _ => stored_keys(store, poller).await?,
    };
    let mut inspected = Vec::with_capacity(keys.len());
    for key in keys {
        let lag = crate::cursor::persisted_lag_ms;
        inspected.push(inspect_key(store, &key, now, PollerState::zero(now), lag).await?);
    }
    Ok(inspected)
}
