//! Conformance cases: `leases`: acquisition, renewal, release and the
//! per-key epoch counter.

use watukuy_core::store::{Lease, StatePatch, Store};

use super::fixtures::{
    NODE_A, NODE_B, T0, TTL, acquire, expect_lease_lost, key_b, key_other, leased, unleased,
};
use crate::harness::{CaseResult, Env};
use crate::{check, check_eq};

/// A lease equal to `lease` except for its owner.
fn with_owner(lease: &Lease, owner: &str) -> Lease {
    Lease {
        owner: owner.to_owned(),
        ..lease.clone()
    }
}

/// A lease equal to `lease` except for its epoch.
fn with_epoch(lease: &Lease, epoch: i64) -> Lease {
    Lease {
        epoch,
        ..lease.clone()
    }
}

/// Fails unless `get_lease(key)` is exactly `expected`.
async fn expect_holder(
    store: &dyn Store,
    key: &watukuy_core::store::PKey,
    expected: Option<&Lease>,
    when: &str,
) -> CaseResult {
    check_eq!(
        store.get_lease(key).await?.as_ref(),
        expected,
        "get_lease({key}) {when}"
    );
    Ok(())
}

/// `Store::acquire_lease` contract 1: on a key never leased, acquisition returns
/// `{ owner, epoch: 1, expires_at: now + ttl }`, and `get_lease` reports that lease.
pub async fn acquire_on_empty_key_returns_epoch_1(env: Env) -> CaseResult {
    let (store, key) = unleased(&env);
    let lease = store.acquire_lease(&key, NODE_A, TTL, T0).await?;
    let expected = Lease {
        owner: NODE_A.to_owned(),
        epoch: 1,
        expires_at: T0 + TTL,
    };
    check_eq!(
        lease.as_ref(),
        Some(&expected),
        "acquire_lease on an empty key"
    );
    expect_holder(store, &key, Some(&expected), "after the first acquisition").await
}

/// `Store::acquire_lease` contract 2: while node-a's lease is unexpired (at T0+1s and at
/// T0+TTL−1) node-b gets `None`, the holder is unchanged, and the refused attempts do not consume
/// epochs (the eventual steal at T0+TTL still gets epoch 2).
pub async fn other_owner_cannot_acquire_valid_lease(env: Env) -> CaseResult {
    let (store, key, held) = leased(&env).await?;
    for now in [T0 + 1_000, T0 + TTL - 1] {
        let got = store.acquire_lease(&key, NODE_B, TTL, now).await?;
        check_eq!(
            got,
            None,
            "node-b acquired node-a's unexpired lease at T0+{}ms",
            now - T0
        );
        expect_holder(
            store,
            &key,
            Some(&held),
            &format!("after node-b's refused acquisition at T0+{}ms", now - T0),
        )
        .await?;
    }
    let stolen = acquire(store, &key, NODE_B, T0 + TTL).await?;
    check_eq!(
        stolen.epoch,
        2,
        "refused acquisitions must not consume epochs (changing nothing)"
    );
    Ok(())
}

/// `Store::acquire_lease` contract 3: node-a re-acquiring its own unexpired lease gets epoch 2
/// and a new expiry; renewing with the old lease returns `false`, a fenced write with it fails
/// with `LeaseLost`, and `get_lease` is the second lease.
pub async fn same_owner_reacquire_bumps_epoch(env: Env) -> CaseResult {
    let (store, key, first) = leased(&env).await?;
    let now = T0 + 1_000;
    let second = acquire(store, &key, NODE_A, now).await?;
    check_eq!(
        second,
        Lease {
            owner: NODE_A.to_owned(),
            epoch: first.epoch + 1,
            expires_at: now + TTL,
        },
        "the same owner re-acquiring"
    );
    check_eq!(second.epoch, 2, "the second acquisition's epoch");
    check!(
        !store.renew_lease(&key, &first, TTL, now + 1).await?,
        "renew_lease with the superseded lease returned true"
    );
    let patch = StatePatch {
        paused: Some(true),
        updated_at: Some(now),
        ..StatePatch::default()
    };
    expect_lease_lost(
        store.save_state(&key, &first, &patch).await,
        &key,
        first.epoch,
        "save_state with the superseded lease",
    )?;
    check_eq!(
        store.load_state(&key).await?,
        None,
        "the rejected save_state wrote state"
    );
    expect_holder(store, &key, Some(&second), "after the re-acquisition").await
}

/// `Store::acquire_lease` contract 4: at exactly `expires_at` (T0+TTL) another owner takes the
/// lease with the next epoch (2) and a fresh expiry; the old holder's renew then fails.
pub async fn expired_lease_is_stolen_with_next_epoch(env: Env) -> CaseResult {
    let (store, key, old) = leased(&env).await?;
    let now = old.expires_at;
    check_eq!(now, T0 + TTL, "node-a's expiry");
    let stolen = store.acquire_lease(&key, NODE_B, TTL, now).await?;
    let expected = Lease {
        owner: NODE_B.to_owned(),
        epoch: 2,
        expires_at: now + TTL,
    };
    check_eq!(
        stolen.as_ref(),
        Some(&expected),
        "node-b acquiring at exactly the expiry"
    );
    check!(
        !store.renew_lease(&key, &old, TTL, now).await?,
        "renew_lease with the stolen lease returned true"
    );
    expect_holder(store, &key, Some(&expected), "after the steal").await
}

/// `Store::renew_lease` contract 1: renewing the current lease returns `true` and moves the
/// expiry to `now + ttl` (also after the expiry passed, as long as nobody acquired); a wrong
/// epoch (older or newer), another owner or another key (unleased, or leased by someone else)
/// returns `false` and changes no lease.
pub async fn renew_succeeds_for_current_epoch_only(env: Env) -> CaseResult {
    let (store, key, lease) = leased(&env).await?;
    let other = acquire(store, &key_other(), NODE_B, T0).await?;

    let now = T0 + 10_000;
    check!(
        store.renew_lease(&key, &lease, TTL, now).await?,
        "renew_lease with the current lease returned false"
    );
    let renewed = Lease {
        expires_at: now + TTL,
        ..lease.clone()
    };
    expect_holder(store, &key, Some(&renewed), "after renewing").await?;

    // Expiry alone does not fail the fence: only another acquisition does.
    let late = renewed.expires_at + 5_000;
    check!(
        store.renew_lease(&key, &lease, TTL, late).await?,
        "renew_lease of the current but expired (not re-acquired) lease returned false"
    );
    let renewed = Lease {
        expires_at: late + TTL,
        ..lease.clone()
    };
    expect_holder(
        store,
        &key,
        Some(&renewed),
        "after renewing past the expiry",
    )
    .await?;

    let when = late + 1_000;
    let wrong = [
        (
            key.clone(),
            with_epoch(&lease, lease.epoch + 1),
            "epoch + 1",
        ),
        (
            key.clone(),
            with_epoch(&lease, lease.epoch - 1),
            "epoch - 1",
        ),
        (key.clone(), with_owner(&lease, NODE_B), "another owner"),
        (key_b(), lease.clone(), "an unleased key"),
        (key_other(), lease.clone(), "a key leased by node-b"),
    ];
    for (target, bad, what) in wrong {
        check!(
            !store.renew_lease(&target, &bad, TTL, when).await?,
            "renew_lease with {what} returned true"
        );
        expect_holder(
            store,
            &key,
            Some(&renewed),
            &format!("after renewing with {what}"),
        )
        .await?;
        expect_holder(
            store,
            &key_b(),
            None,
            &format!("after renewing with {what}"),
        )
        .await?;
        expect_holder(
            store,
            &key_other(),
            Some(&other),
            &format!("after renewing with {what}"),
        )
        .await?;
    }
    Ok(())
}

/// `Store::release_lease` contract 1 and `Store::acquire_lease` contract 5: after a release
/// `get_lease` is `None` and another owner acquires at once (before the old expiry) with epoch 2;
/// the counter keeps increasing across further releases (epoch 3 next).
pub async fn release_then_acquire_keeps_epoch_monotonic(env: Env) -> CaseResult {
    let (store, key, first) = leased(&env).await?;
    check_eq!(first.epoch, 1, "the first acquisition's epoch");
    store.release_lease(&key, &first).await?;
    expect_holder(store, &key, None, "after node-a released").await?;

    let now = T0 + 1_000;
    let second = Lease {
        owner: NODE_B.to_owned(),
        epoch: 2,
        expires_at: now + TTL,
    };
    check_eq!(
        store.acquire_lease(&key, NODE_B, TTL, now).await?.as_ref(),
        Some(&second),
        "node-b acquiring a released (unexpired) lease"
    );
    store.release_lease(&key, &second).await?;
    expect_holder(store, &key, None, "after node-b released").await?;

    let third = acquire(store, &key, NODE_A, now + 1_000).await?;
    check_eq!(
        third.epoch,
        3,
        "the epoch counter after two releases (never reset)"
    );
    expect_holder(store, &key, Some(&third), "after the third acquisition").await
}

/// `Store::release_lease` contract 2: releasing with a superseded epoch, a made-up epoch, another
/// owner or on another key (unleased, or leased by someone else) is a silent no-op: `Ok(())`
/// and every lease intact.
pub async fn release_with_stale_lease_is_noop(env: Env) -> CaseResult {
    let (store, key, superseded) = leased(&env).await?;
    let current = acquire(store, &key, NODE_A, T0 + 1_000).await?;
    check_eq!(
        current.epoch,
        superseded.epoch + 1,
        "re-acquisition's epoch"
    );
    let other = acquire(store, &key_other(), NODE_B, T0).await?;

    let wrong = [
        (key.clone(), superseded.clone(), "the superseded epoch"),
        (
            key.clone(),
            with_epoch(&current, current.epoch + 1),
            "epoch + 1",
        ),
        (key.clone(), with_owner(&current, NODE_B), "another owner"),
        (key_b(), current.clone(), "an unleased key"),
        (key_other(), current.clone(), "a key leased by node-b"),
    ];
    for (target, bad, what) in wrong {
        store.release_lease(&target, &bad).await?;
        expect_holder(
            store,
            &key,
            Some(&current),
            &format!("after releasing with {what}"),
        )
        .await?;
        expect_holder(
            store,
            &key_b(),
            None,
            &format!("after releasing with {what}"),
        )
        .await?;
        expect_holder(
            store,
            &key_other(),
            Some(&other),
            &format!("after releasing with {what}"),
        )
        .await?;
    }
    check!(
        store.renew_lease(&key, &current, TTL, T0 + 2_000).await?,
        "the current lease no longer renews after stale releases"
    );
    Ok(())
}

/// `Store::get_lease` contract 1: `None` before any acquisition, then exactly the holder; other
/// keys stay `None`.
pub async fn get_lease_is_none_then_holder(env: Env) -> CaseResult {
    let (store, key) = unleased(&env);
    expect_holder(store, &key, None, "before any acquisition").await?;
    let lease = acquire(store, &key, NODE_A, T0).await?;
    expect_holder(store, &key, Some(&lease), "after node-a acquired").await?;
    expect_holder(store, &key_b(), None, "of another partition").await?;
    expect_holder(store, &key_other(), None, "of another poller").await?;
    let stolen = acquire(store, &key, NODE_B, T0 + TTL).await?;
    expect_holder(store, &key, Some(&stolen), "after node-b stole the lease").await
}

/// `Store::delete_key` contract 3: the epoch counter survives `delete_key`. After a delete, the
/// next acquisition gets a higher epoch than any before, and a lease taken before the delete
/// (same owner, old epoch) fails the fence of the re-created key.
pub async fn epochs_survive_delete_key(env: Env) -> CaseResult {
    let (store, k, first) = leased(&env).await?;
    let second = acquire(store, &k, NODE_A, T0 + 1).await?;
    check_eq!(second.epoch, first.epoch + 1);
    store.delete_key(&k).await?;
    check!(
        store.get_lease(&k).await?.is_none(),
        "delete_key removes the lease"
    );
    let again = acquire(store, &k, NODE_A, T0 + 2).await?;
    check!(
        again.epoch > second.epoch,
        "epoch {} after delete must exceed {}",
        again.epoch,
        second.epoch
    );
    for stale in [&first, &second] {
        let patch = StatePatch {
            paused: Some(true),
            ..StatePatch::default()
        };
        expect_lease_lost(
            store.save_state(&k, stale, &patch).await,
            &k,
            stale.epoch,
            "save_state with a pre-delete lease",
        )?;
    }
    check!(
        store.load_state(&k).await?.is_none(),
        "a rejected write leaves nothing behind"
    );
    Ok(())
}
