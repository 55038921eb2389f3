//! The idempotent-consumer contract: a processed-events table beside a read model, claimed in
//! the projection's own transaction, so a projection's effect happens once per change however
//! often the change is delivered.
//!
//! [`ConsumerStore`] is implemented by the SQL stores (`ProcessedEvents` in
//! `watukuy-store-postgres`, `watukuy-store-sqlite` and `watukuy-store-mysql`), and can be by your
//! own; [`apply_once`] runs one delivery through any of them. The shared suite
//! (`watukuy_conformance::consumer_tests!`) proves the rules below on each.

use std::fmt;

use async_trait::async_trait;
use futures::future::BoxFuture;
use smol_str::SmolStr;

use crate::error::{Error, Result};
use crate::event::Event;
use crate::model::PKey;

/// The lease a delivery runs under: the key, the holder and its fencing epoch, as
/// [`HandlerContext::fence`](crate::HandlerContext::fence) hands it to a handler.
///
/// The epoch grows with every acquisition of the key's lease, so a process that was frozen past
/// its lease (a long GC or VM pause) and wakes holds an epoch the store no longer has.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Fence {
    /// The poller of the key whose lease the delivery runs under.
    pub poller: SmolStr,
    /// The partition of that key.
    pub partition: SmolStr,
    /// The instance holding the lease.
    pub owner: SmolStr,
    /// The lease's fencing epoch.
    pub epoch: i64,
}

impl Fence {
    /// The fence of `owner`'s lease on `key` with `epoch`.
    pub fn new(key: PKey, owner: impl Into<SmolStr>, epoch: i64) -> Self {
        Self {
            poller: key.poller.into(),
            partition: key.partition.into(),
            owner: owner.into(),
            epoch,
        }
    }

    /// The key whose lease this is.
    pub fn key(&self) -> PKey {
        PKey::new(self.poller.as_str(), self.partition.as_str())
    }
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{} (owner {}, epoch {})",
            self.poller, self.partition, self.owner, self.epoch
        )
    }
}

/// A processed-events table in the consumer's own database: the contract an idempotent
/// consumer keeps.
///
/// A delivery is claimed inside the transaction that also writes the projection
/// ([`begin`](Self::begin), [`claim`](Self::claim), the projection's writes,
/// optionally [`check_fence`](Self::check_fence), [`commit`](Self::commit); [`apply_once`]
/// runs exactly that). The rules, which `watukuy_conformance::consumer_tests!` checks:
///
/// 1. **One unit.** The claim's records exist exactly when the transaction that made them
///    committed: a rollback, a failed projection, a dropped transaction (a crash, a killed
///    task) leave nothing, and a later delivery applies afresh.
/// 2. **A redelivery is a duplicate.** Once a delivery of an event committed, every other
///    delivery of the same event (same id, same `sequence`) claims `false`, whatever happened
///    since: a later event of its subject applied meanwhile does not make it new.
/// 3. **Overlap decides on what committed.** A claim that meets a concurrent, uncommitted claim
///    of the same id waits for it to end, then decides on the committed outcome: `false` after
///    its commit, a fresh claim after its rollback. Two overlapping deliveries apply once, for a
///    subject with or without earlier events.
/// 4. **An id can come back as a new change.** Event ids are stable per identity, version and
///    type, so a delete followed by a re-create with the same content, or an item changed back
///    to an earlier content, repeats an id with a *higher* sequence. Such a delivery is claimed
///    again when another event of its subject was applied since, as
///    [`reapplies`](super::reapplies) decides (which also gives the replay lane's rules).
///    Overlapping deliveries of such a change apply once too.
/// 5. **Fencing.** `check_fence` succeeds only while the key's lease is still held by the
///    fence's owner with its epoch, read in the same transaction; otherwise it fails with
///    [`Error::LeaseLost`] and the caller rolls back. A store that cannot see the engine's
///    leases (the read model lives in another database) returns `Unsupported`.
/// 6. **Markers are bounded.** `prune(older_than)` deletes records applied before that time
///    (epoch ms, from the consumer's clock); a pruned event is no longer recognised.
/// 7. **Migrations** are versioned, idempotent, safe to run from several instances at once, and
///    refuse a table newer than the code with a `Schema` store error.
///
/// `Conn` is what the methods run on (a pool, or a connection behind a mutex); `Tx<'a>` is the
/// store's transaction, handed to projections. An implementation whose transaction does not
/// borrow (`type Tx<'a> = MyTx;`) names it `Self::Tx<'_>` in its method signatures.
///
/// **Stability.** This trait is an extension contract like [`Store`](crate::store::Store) and
/// moves by the same rules (the `store` module's "Stability for store authors"): within a minor
/// version its required methods, their signatures and the seven rules above stay as written; new
/// methods come only as provided ones that are correct for every implementation; anything else
/// waits for a new minor version with a CHANGELOG entry.
#[async_trait]
pub trait ConsumerStore: Send + Sync {
    /// The database handle the table lives in.
    type Conn: Send + Sync + ?Sized;
    /// An open transaction on it, in which the projection writes.
    type Tx<'a>: Send;

    /// Opens a transaction on `conn`.
    async fn begin<'a>(&'a self, conn: &'a Self::Conn) -> Result<Self::Tx<'a>>;

    /// Claims `event` in `tx`: records it and returns `true` when it is a change to apply, or
    /// returns `false` when it was applied already (rules 2–4). May wait for a concurrent claim
    /// of the same id to end.
    async fn claim(&self, tx: &mut Self::Tx<'_>, event: &Event) -> Result<bool>;

    /// Checks in `tx` that `fence`'s lease is still held (rule 5): [`Error::LeaseLost`] (see
    /// [`Error::lease_lost`]) when it is not.
    async fn check_fence(&self, tx: &mut Self::Tx<'_>, fence: &Fence) -> Result<()>;

    /// Commits `tx`.
    async fn commit(&self, tx: Self::Tx<'_>) -> Result<()>;

    /// Rolls `tx` back (dropping it rolls back too; this frees the connection sooner).
    async fn rollback(&self, tx: Self::Tx<'_>) -> Result<()>;

    /// Whether `event_id` has a record.
    async fn is_processed(&self, conn: &Self::Conn, event_id: &str) -> Result<bool>;

    /// Deletes records applied before `older_than` (epoch ms); returns how many markers.
    async fn prune(&self, conn: &Self::Conn, older_than: i64) -> Result<u64>;
}

/// Applies `event` at most once through `consumer`: in ONE transaction, claims it and, when it
/// is a change to apply, runs `projection` on the transaction, checks `fence` (when given) and
/// commits.
///
/// - A repeated delivery is a no-op: [`ApplyOutcome::Deduplicated`] (the projection does not
///   run).
/// - The projection's error rolls everything back, claim included: [`ApplyError::Projection`];
///   a later delivery applies it afresh.
/// - With a fence, a lease lost while the projection ran (an instance frozen past its lease)
///   rolls everything back: [`ApplyError::Store`] with [`Error::LeaseLost`]; the new holder
///   delivers the event again.
/// - Dropping the returned future before it completes (a crash) rolls back as well.
/// - A failure to begin, claim or commit is [`ApplyError::Store`]. When a commit fails in flight
///   its outcome is unknown; the redelivery then finds the claim or not.
///
/// The projection is a closure taking the transaction and returning a boxed future
/// (`|tx| Box::pin(async move { ... })`).
pub async fn apply_once<'a, C, T, E, F>(
    consumer: &'a C,
    conn: &'a C::Conn,
    event: &Event,
    fence: Option<&Fence>,
    projection: F,
) -> std::result::Result<ApplyOutcome<T>, ApplyError<E>>
where
    C: ConsumerStore + ?Sized,
    F: for<'t> FnOnce(&'t mut C::Tx<'a>) -> BoxFuture<'t, std::result::Result<T, E>>,
{
    let mut tx = consumer.begin(conn).await.map_err(ApplyError::Store)?;
    let claimed = match consumer.claim(&mut tx, event).await {
        Ok(claimed) => claimed,
        Err(error) => {
            let _ = consumer.rollback(tx).await;
            return Err(ApplyError::Store(error));
        }
    };
    if !claimed {
        // Nothing was written; ending the transaction is only tidiness.
        let _ = consumer.rollback(tx).await;
        return Ok(ApplyOutcome::Deduplicated);
    }
    let value = match projection(&mut tx).await {
        Ok(value) => value,
        Err(error) => {
            let _ = consumer.rollback(tx).await;
            return Err(ApplyError::Projection(error));
        }
    };
    if let Some(fence) = fence
        && let Err(error) = consumer.check_fence(&mut tx, fence).await
    {
        let _ = consumer.rollback(tx).await;
        return Err(ApplyError::Store(error));
    }
    consumer.commit(tx).await.map_err(ApplyError::Store)?;
    Ok(ApplyOutcome::Applied(value))
}

/// What an idempotent apply (`apply_once` in the SQL stores) did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApplyOutcome<T> {
    /// The marker was inserted and the projection ran and committed with it; its value.
    Applied(T),
    /// The event's marker already existed: the projection did not run, nothing changed.
    Deduplicated,
}

impl<T> ApplyOutcome<T> {
    /// True for [`ApplyOutcome::Applied`].
    pub fn is_applied(&self) -> bool {
        matches!(self, ApplyOutcome::Applied(_))
    }

    /// True for [`ApplyOutcome::Deduplicated`].
    pub fn is_deduplicated(&self) -> bool {
        matches!(self, ApplyOutcome::Deduplicated)
    }

    /// The projection's value, when it ran.
    pub fn applied(self) -> Option<T> {
        match self {
            ApplyOutcome::Applied(value) => Some(value),
            ApplyOutcome::Deduplicated => None,
        }
    }
}

/// Why an idempotent apply failed. In both cases nothing was committed: neither the marker nor
/// the projection's writes.
#[derive(Debug)]
pub enum ApplyError<E> {
    /// The marker table or the transaction failed (connection, missing table, commit).
    Store(Error),
    /// The projection returned this error; its transaction, marker included, was rolled back.
    Projection(E),
}

impl<E> ApplyError<E> {
    /// The projection's error, if that is what failed.
    pub fn projection(self) -> Option<E> {
        match self {
            ApplyError::Projection(e) => Some(e),
            ApplyError::Store(_) => None,
        }
    }
}

impl<E: fmt::Display> fmt::Display for ApplyError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ApplyError::Store(e) => write!(f, "apply_once: {e}"),
            ApplyError::Projection(e) => write!(f, "projection failed (rolled back): {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::error::Error;
    use crate::event::EventType;

    /// A consumer store that records what `apply_once` asked of it.
    #[derive(Default)]
    struct Recording {
        calls: Mutex<Vec<&'static str>>,
        duplicate: bool,
        lease_held: bool,
    }

    impl Recording {
        fn note(&self, call: &'static str) {
            self.calls.lock().unwrap().push(call);
        }

        fn calls(&self) -> Vec<&'static str> {
            self.calls.lock().unwrap().clone()
        }
    }

    #[async_trait]
    impl ConsumerStore for Recording {
        type Conn = ();
        type Tx<'a> = Vec<&'static str>;

        async fn begin<'a>(&'a self, _conn: &'a ()) -> Result<Vec<&'static str>> {
            self.note("begin");
            Ok(Vec::new())
        }

        async fn claim(&self, tx: &mut Self::Tx<'_>, _event: &Event) -> Result<bool> {
            self.note("claim");
            tx.push("marker");
            Ok(!self.duplicate)
        }

        async fn check_fence(&self, _tx: &mut Self::Tx<'_>, fence: &Fence) -> Result<()> {
            self.note("check_fence");
            if self.lease_held {
                Ok(())
            } else {
                Err(Error::lease_lost(&fence.key(), fence.epoch))
            }
        }

        async fn commit(&self, _tx: Self::Tx<'_>) -> Result<()> {
            self.note("commit");
            Ok(())
        }

        async fn rollback(&self, _tx: Self::Tx<'_>) -> Result<()> {
            self.note("rollback");
            Ok(())
        }

        async fn is_processed(&self, _conn: &(), _event_id: &str) -> Result<bool> {
            Ok(false)
        }

        async fn prune(&self, _conn: &(), _older_than: i64) -> Result<u64> {
            Ok(0)
        }
    }

    fn event() -> Event {
        Event {
            time: "2026-01-01T00:00:00.000Z".into(),
            sequence: 1,
            attempt: 1,
            ..Event::new("e", EventType::Created, "orders", "o1")
        }
    }

    async fn run(store: &Recording, fence: Option<&Fence>, fails: bool) -> String {
        let outcome = apply_once(store, &(), &event(), fence, |tx| {
            Box::pin(async move {
                tx.push("projection");
                if fails { Err("no") } else { Ok(7) }
            })
        })
        .await;
        format!("{outcome:?}")
    }

    #[tokio::test]
    async fn apply_once_commits_only_a_claimed_projection_whose_fence_holds() {
        let fence = Fence::new(PKey::new("orders", ""), "node-a", 3);
        let held = Recording {
            lease_held: true,
            ..Recording::default()
        };
        assert_eq!(run(&held, Some(&fence), false).await, "Ok(Applied(7))");
        assert_eq!(
            held.calls(),
            ["begin", "claim", "check_fence", "commit"],
            "the fence is checked after the projection, before the commit"
        );

        let lost = Recording::default();
        let outcome = run(&lost, Some(&fence), false).await;
        assert!(outcome.contains("LeaseLost"), "{outcome}");
        assert_eq!(lost.calls(), ["begin", "claim", "check_fence", "rollback"]);

        let unfenced = Recording::default();
        assert_eq!(run(&unfenced, None, false).await, "Ok(Applied(7))");
        assert_eq!(unfenced.calls(), ["begin", "claim", "commit"]);

        let failing = Recording::default();
        assert_eq!(
            run(&failing, Some(&fence), true).await,
            "Err(Projection(\"no\"))"
        );
        assert_eq!(failing.calls(), ["begin", "claim", "rollback"]);

        let duplicate = Recording {
            duplicate: true,
            ..Recording::default()
        };
        assert_eq!(
            run(&duplicate, Some(&fence), false).await,
            "Ok(Deduplicated)"
        );
        assert_eq!(duplicate.calls(), ["begin", "claim", "rollback"]);
    }
}
