//! Conformance cases: `setup`: capabilities, migrations and closing.

use std::sync::Arc;

use watukuy_core::store::{CommitBatch, PollerState, StatePatch, Store, StoreErrorKind};

use super::fixtures::{
    NODE_A, Observation, T0, acquire, item, json, leased, observe, pending, progress, unleased,
};
use crate::harness::{CaseError, CaseResult, Env, RawWrite};
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

/// How many new instances [`concurrent_migrations_of_new_instances_succeed`] migrates at once.
const CONCURRENT_MIGRATIONS: usize = 8;

/// `Store::migrate` contract 2: instances that each open their own connections on a namespace
/// nobody has migrated yet (a service's replicas starting together on a new database) may all
/// call `migrate()` at once: every call succeeds, and the result is one working store that every
/// instance sees, which a later `migrate()` leaves as it is.
pub async fn concurrent_migrations_of_new_instances_succeed(env: Env) -> CaseResult {
    let mut stores: Vec<Arc<dyn Store>> = Vec::with_capacity(CONCURRENT_MIGRATIONS);
    for _ in 0..CONCURRENT_MIGRATIONS {
        stores.push(env.unmigrated_instance().await?);
    }
    let results = futures::future::join_all(stores.iter().map(|store| store.migrate())).await;
    for (n, result) in results.into_iter().enumerate() {
        result.map_err(|e| {
            CaseError::failed(format!(
                "instance {n} of {CONCURRENT_MIGRATIONS} migrating at once failed: {e}"
            ))
        })?;
    }
    let key = super::fixtures::key();
    let first = stores.first().map(Arc::as_ref);
    let last = stores.last().map(Arc::as_ref);
    let (Some(first), Some(last)) = (first, last) else {
        return Err(CaseError::failed("no instance was opened"));
    };
    let lease = acquire(first, &key, NODE_A, T0).await?;
    check_eq!(lease.epoch, 1, "the first lease after the migrations");
    let batch = CommitBatch::default()
        .upserts(vec![item("item-1", "h1")])
        .state_patch(progress(1, T0));
    first.commit_poll(&key, &lease, &batch).await?;
    last.migrate().await?;
    check_eq!(
        last.counts(&key).await.map(|c| c.items)?,
        1,
        "another instance's count of the committed page, after one more migrate()"
    );
    check_eq!(
        last.load_state(&key).await?.map(|s| s.sequence),
        Some(1),
        "another instance's reading of the committed state"
    );
    Ok(())
}

/// `Store::migrate` contract 3: a store whose recorded schema is newer than this build knows
/// (a newer release migrated it) is refused by `migrate()` with `Error::Store` of kind
/// `Schema`, permanent, naming the version it found: never read as if it were its own.
pub async fn a_newer_schema_is_refused(env: Env) -> CaseResult {
    const FUTURE: u32 = 9_999;
    env.raw_write(RawWrite::SchemaVersion(FUTURE)).await?;
    // A store opened after the upgrade, as a process of the older release starting up would.
    let store = match env.another_instance().await {
        Ok(store) => store,
        Err(CaseError::Skipped(_)) => Arc::clone(&env.store),
        Err(failed) => return Err(failed),
    };
    match store.migrate().await {
        Err(watukuy_core::Error::Store {
            kind: StoreErrorKind::Schema,
            transient: false,
            message,
            ..
        }) if message.contains(&FUTURE.to_string()) => Ok(()),
        other => Err(CaseError::failed(format!(
            "migrate() over schema version {FUTURE} answered {other:?}, not a permanent \
             Schema error naming {FUTURE}"
        ))),
    }
}

/// `Store::load_state` contract 2: stored data the store cannot decode (another program wrote
/// it, a disk damaged it) is `Error::Store` of kind `Corrupt`, permanent, from every read that
/// meets it (`load_state`, `load_versions`, `load_pending`): never a panic, never a default.
/// Each damage the harness cannot write is left out; the case is skipped when it writes none.
pub async fn undecodable_rows_are_corrupt_errors(env: Env) -> CaseResult {
    let (store, key, lease) = leased(&env).await?;
    let mut row = item("item-1", "h1");
    row.payload = Some(json(r#"{"id":"item-1"}"#));
    let batch = CommitBatch::default()
        .upserts(vec![row])
        .events(vec![pending(&key, "evt-1", 1, "item-1")])
        .state_patch(progress(1, T0));
    store.commit_poll(&key, &lease, &batch).await?;

    let ids = vec!["item-1".to_owned()];
    let mut written = 0;
    for raw in [
        RawWrite::State(key.clone()),
        RawWrite::Items(key.clone()),
        RawWrite::Pending(key.clone()),
    ] {
        match env.raw_write(raw.clone()).await {
            Ok(()) => {}
            Err(CaseError::Skipped(_)) => continue,
            Err(failed) => return Err(failed),
        }
        let (what, result) = match &raw {
            RawWrite::State(_) => ("load_state", store.load_state(&key).await.map(drop)),
            RawWrite::Items(_) => (
                "load_versions",
                store.load_versions(&key, &ids).await.map(drop),
            ),
            _ => ("load_pending", store.load_pending(&key, 10).await.map(drop)),
        };
        match result {
            Err(watukuy_core::Error::Store {
                kind: StoreErrorKind::Corrupt,
                transient: false,
                ..
            }) => written += 1,
            other => {
                return Err(CaseError::failed(format!(
                    "{what} after {raw:?} answered {other:?}, not a permanent Corrupt error"
                )));
            }
        }
    }
    if written == 0 {
        return Err(CaseError::skipped(
            "the harness wrote no undecodable row (RawWrite)",
        ));
    }
    Ok(())
}
