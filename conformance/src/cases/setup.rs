//! Conformance cases: `setup`: capabilities, migrations and closing.

use watukuy_core::store::{PollerState, StatePatch};

use super::fixtures::{NODE_A, Observation, T0, acquire, leased, observe, progress, unleased};
use crate::harness::{CaseResult, Env};
use crate::{check, check_eq};

/// `Store::capabilities` contract 1: the store reports the same capabilities on every call,
/// before and after `migrate()`.
pub async fn exposes_capabilities(env: Env) -> CaseResult {
    let store = env.store();
    let first = store.capabilities();
    check_eq!(
        store.capabilities(),
        first,
        "capabilities() changed between two calls"
    );
    store.migrate().await?;
    check_eq!(
        store.capabilities(),
        first,
        "capabilities() changed after migrate()"
    );
    Ok(())
}

/// `Store::migrate` contract 1: migrating a migrated store again succeeds and changes nothing:
/// an untouched store still reads as empty (`load_state` is `None`, `count_items` is 0, no keys),
/// and data written before another `migrate()` is still there after it.
pub async fn migrate_is_idempotent(env: Env) -> CaseResult {
    let (store, key) = unleased(&env);
    store.migrate().await?;
    store.migrate().await?;
    check_eq!(
        store.load_state(&key).await?,
        None,
        "load_state after repeated migrate()"
    );
    check_eq!(
        store.counts(&key).await.map(|c| c.items)?,
        0,
        "count_items after repeated migrate()"
    );
    check_eq!(
        observe(store, &key, &["url-1"]).await?,
        Observation::empty(store.capabilities().log, &["url-1"]),
        "an untouched key after repeated migrate() is not empty"
    );
    check!(
        store.list_keys(None).await?.is_empty(),
        "list_keys(None) is not empty after repeated migrate()"
    );

    // Written data survives another migrate().
    let lease = acquire(store, &key, NODE_A, T0).await?;
    let patch = StatePatch {
        paused: Some(true),
        sequence: Some(7),
        updated_at: Some(T0),
        ..StatePatch::default()
    };
    store.save_state(&key, &lease, &patch).await?;
    store.migrate().await?;
    check_eq!(
        store.load_state(&key).await?,
        Some(PollerState {
            paused: true,
            sequence: 7,
            ..PollerState::zero(T0)
        }),
        "state changed by migrate()"
    );
    check_eq!(
        store.get_lease(&key).await?,
        Some(lease),
        "lease changed by migrate()"
    );
    Ok(())
}

/// `Store::close` contract 1: closing twice succeeds; afterwards a read either returns what was
/// committed before the close (the store reopened) or fails with `Error::Store`, and never
/// panics.
pub async fn close_is_idempotent_and_keeps_data(env: Env) -> CaseResult {
    let (store, key, lease) = leased(&env).await?;
    let patch = progress(3, T0);
    store.save_state(&key, &lease, &patch).await?;
    store.close().await?;
    store.close().await?;
    match store.load_state(&key).await {
        Ok(state) => check_eq!(
            state,
            Some(PollerState {
                sequence: 3,
                ..PollerState::zero(T0)
            }),
            "the state read after close()"
        ),
        Err(watukuy_core::Error::Store { .. }) => {}
        Err(other) => {
            return Err(crate::harness::CaseError::failed(format!(
                "a read after close() failed with {other:?}, not Error::Store"
            )));
        }
    }
    Ok(())
}
