//! Conformance cases: `claims`: a run's first call, the lease with the key's state and whether
//! its outbox holds a pending row.

use watukuy_core::store::{Claim, Lease, StatePatch, Store};

use super::fixtures::{
    NODE_A, NODE_B, T0, TTL, acquire, commit_events, expect_lease_lost, key, key_b, pending,
    progress,
};
use crate::harness::{CaseError, CaseResult, Env};
use crate::{check, check_eq};

/// Claims `key` for `owner` at `now` or fails the case.
async fn claim(
    store: &dyn Store,
    key: &watukuy_core::store::PKey,
    owner: &str,
    now: i64,
) -> Result<Claim, CaseError> {
    store
        .claim(key, owner, TTL, now)
        .await?
        .ok_or_else(|| CaseError::failed(format!("claim({key}, {owner}) at {now} returned None")))
}

/// `Store::claim` contract 1: on a fresh key the claim is epoch 1 with no state and nothing
/// pending; after node-a commits two events and a state, node-b's claim (epoch 2, sharing
/// `acquire_lease`'s counter) returns that state and `pending`; once the events are acknowledged
/// the next claim says nothing is pending. Another partition is untouched throughout.
pub async fn claim_takes_the_lease_and_reads_state_and_outbox(env: Env) -> CaseResult {
    let store = env.store();
    let k = key();
    let first = claim(store, &k, NODE_A, T0).await?;
    let expected = Lease {
        owner: NODE_A.to_owned(),
        epoch: 1,
        expires_at: T0 + TTL,
    };
    check_eq!(
        first,
        Claim::new(expected.clone(), None, false),
        "the claim of a fresh key"
    );
    check_eq!(
        store.get_lease(&k).await?,
        Some(expected),
        "get_lease after the claim"
    );
    let events = vec![pending(&k, "evt-1", 1, "o1"), pending(&k, "evt-2", 2, "o2")];
    commit_events(store, &k, &first.lease, events, false).await?;
    store.release_lease(&k, &first.lease).await?;

    let second = claim(store, &k, NODE_B, T0 + 1_000).await?;
    check_eq!(second.lease.epoch, 2, "the claim after a release");
    check_eq!(second.lease.owner, NODE_B, "the second claim's owner");
    check_eq!(
        second.lease.expires_at,
        T0 + 1_000 + TTL,
        "the second claim's expiry"
    );
    check_eq!(
        second.state,
        store.load_state(&k).await?,
        "the claim's state is load_state's"
    );
    check_eq!(
        second.state.as_ref().map(|s| s.sequence),
        Some(2),
        "the committed sequence"
    );
    check!(second.pending, "two rows are pending, the claim says none");
    store
        .ack_events(&k, &second.lease, &["evt-1".into(), "evt-2".into()])
        .await?;

    // Re-claiming while holding it is an acquisition too: the next epoch.
    let third = claim(store, &k, NODE_B, T0 + 2_000).await?;
    check_eq!(third.lease.epoch, 3, "the same owner re-claiming");
    check!(
        !third.pending,
        "every row was acknowledged, the claim says some are pending"
    );
    check_eq!(third.state, second.state, "acknowledging changes no state");
    let acquired = acquire(store, &k, NODE_B, T0 + 3_000).await?;
    check_eq!(acquired.epoch, 4, "acquire_lease after claims: one counter");

    let other = claim(store, &key_b(), NODE_A, T0).await?;
    check_eq!(
        (other.lease.epoch, other.state, other.pending),
        (1, None, false),
        "another partition"
    );
    Ok(())
}

/// `Store::claim` contract 2: while node-a's lease is unexpired, node-b's claim returns `None`,
/// the holder, the state and the outbox are unchanged, and the refused claims consume no epoch
/// (node-b's claim at expiry gets epoch 2).
pub async fn claim_is_refused_while_another_owner_holds_the_lease(env: Env) -> CaseResult {
    let store = env.store();
    let k = key();
    let held = acquire(store, &k, NODE_A, T0).await?;
    commit_events(store, &k, &held, vec![pending(&k, "evt-1", 1, "o1")], false).await?;
    let state = store.load_state(&k).await?;
    for now in [T0 + 1_000, T0 + TTL - 1] {
        let got = store.claim(&k, NODE_B, TTL, now).await?;
        check_eq!(
            got,
            None,
            "node-b claimed node-a's unexpired lease at T0+{}ms",
            now - T0
        );
        check_eq!(
            store.get_lease(&k).await?.as_ref(),
            Some(&held),
            "the holder after a refused claim"
        );
    }
    check_eq!(
        store.load_state(&k).await?,
        state,
        "the state after refused claims"
    );
    check_eq!(
        store.load_pending(&k, 10).await?.len(),
        1,
        "the outbox after refused claims"
    );
    let stolen = claim(store, &k, NODE_B, T0 + TTL).await?;
    check_eq!(
        stolen.lease.epoch,
        2,
        "refused claims must not consume epochs"
    );
    Ok(())
}

/// `Store::claim` contract 3: node-a commits and then its lease expires without a release (a
/// frozen process); node-b's claim returns node-a's last write, and node-a's next fenced write is
/// rejected and changes nothing node-b read.
pub async fn claim_sees_the_superseded_holders_last_write(env: Env) -> CaseResult {
    let store = env.store();
    let k = key();
    let frozen = claim(store, &k, NODE_A, T0).await?.lease;
    commit_events(
        store,
        &k,
        &frozen,
        vec![pending(&k, "evt-1", 1, "o1")],
        false,
    )
    .await?;
    store
        .save_state(&k, &frozen, &progress(7, T0 + 500))
        .await?;
    let taken = claim(store, &k, NODE_B, T0 + TTL).await?;
    check_eq!(taken.lease.epoch, 2, "the claim that supersedes node-a");
    check_eq!(
        taken.state.as_ref().map(|s| (s.sequence, s.updated_at)),
        Some((7, T0 + 500)),
        "node-a's last write, seen by the claim"
    );
    check!(
        taken.pending,
        "node-a's committed event, not seen by the claim"
    );
    let late = StatePatch {
        paused: Some(true),
        ..progress(9, T0 + TTL + 1)
    };
    expect_lease_lost(
        store.save_state(&k, &frozen, &late).await,
        &k,
        frozen.epoch,
        "node-a's write after node-b's claim",
    )?;
    check_eq!(
        store.load_state(&k).await?,
        taken.state,
        "the rejected write changed the state"
    );
    Ok(())
}
