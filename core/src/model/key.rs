//! Keys, leases and lanes: who owns a `(poller, partition)` and where each lane stands.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::store::PollerState;

/// Identifies one `(poller, partition)`: the unit of leasing, state, snapshot, outbox and parking.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PKey {
    /// The poller's name.
    pub poller: String,
    /// The partition key; `""` for an unpartitioned poller.
    pub partition: String,
}

impl PKey {
    /// Builds a key from a poller name and a partition key.
    pub fn new(poller: impl Into<String>, partition: impl Into<String>) -> Self {
        Self {
            poller: poller.into(),
            partition: partition.into(),
        }
    }
}

impl fmt::Display for PKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.poller, self.partition)
    }
}

/// A lease on a key: who holds it, its fencing epoch and when it expires (epoch ms).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    /// The holder's instance id.
    pub owner: String,
    /// The fencing token: strictly increasing per key across every acquisition.
    pub epoch: i64,
    /// Expiry in epoch milliseconds; the lease may be taken by another owner at or after it.
    pub expires_at: i64,
}

/// What [`Store::claim`](crate::store::Store::claim) returns: the lease taken, and what a run needs to
/// begin, read after the lease was taken.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Claim {
    /// The lease taken.
    pub lease: Lease,
    /// The key's state, `None` if it was never saved.
    pub state: Option<PollerState>,
    /// Whether the key's outbox holds at least one pending row.
    pub pending: bool,
}

impl Claim {
    /// A claim of `lease` that read `state` and `pending`.
    pub fn new(lease: Lease, state: Option<PollerState>, pending: bool) -> Self {
        Self {
            lease,
            state,
            pending,
        }
    }
}

/// The lane an event was produced on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Lane {
    /// Incremental polling driven by the schedule.
    Live,
    /// A periodic full listing that finds deletes.
    Reconcile,
    /// A bounded re-read of history from a given cursor.
    Backfill,
    /// Copies of logged events re-delivered on request.
    Replay,
}

impl Lane {
    /// Every lane, in priority order (live first).
    pub const ALL: [Lane; 4] = [Lane::Live, Lane::Reconcile, Lane::Backfill, Lane::Replay];

    /// The lane's name as it appears in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Lane::Live => "live",
            Lane::Reconcile => "reconcile",
            Lane::Backfill => "backfill",
            Lane::Replay => "replay",
        }
    }

    /// Budget priority: lower is served first (live 0, reconcile 1, backfill 2, replay 3).
    pub fn rank(self) -> u8 {
        match self {
            Lane::Live => 0,
            Lane::Reconcile => 1,
            Lane::Backfill => 2,
            Lane::Replay => 3,
        }
    }
}

impl fmt::Display for Lane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The persisted position of one lane.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LaneCursor {
    /// The strategy's serialized cursor (JSON text), or `None` for the strategy's initial cursor.
    pub cursor: Option<String>,
    /// Backfill only: the serialized cursor at which the backfill stops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Reconcile and backfill: whether the lane finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done: Option<bool>,
    /// Reconcile: when the last complete listing (or one cut short by the page cap) finished
    /// (epoch ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run_at: Option<i64>,
    /// Backfill: re-emit known unchanged items as `updated`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub force: Option<bool>,
    /// Reconcile and backfill: consecutive failures of this lane (lane-level backoff).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failures: Option<u32>,
    /// Reconcile and backfill: after a failure, the lane waits until this time (epoch ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<i64>,
    /// Full scans: identities the last complete listing of several pages did not name, in
    /// ascending order, not yet reported deleted. The next complete listing that misses one of
    /// them again deletes it, or, with a lookup, looks it up again (those a failed lookup left
    /// undecided); see [`DeleteConfirmation`](crate::poller::DeleteConfirmation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspects: Option<Vec<String>>,
}

/// The cursors of every lane of a key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lanes {
    /// The live lane.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<LaneCursor>,
    /// The reconcile lane.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconcile: Option<LaneCursor>,
    /// The backfill lane.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backfill: Option<LaneCursor>,
    /// The replay lane.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<LaneCursor>,
}

impl Lanes {
    /// The cursor of `lane`, if it ever ran.
    pub fn get(&self, lane: Lane) -> Option<&LaneCursor> {
        match lane {
            Lane::Live => self.live.as_ref(),
            Lane::Reconcile => self.reconcile.as_ref(),
            Lane::Backfill => self.backfill.as_ref(),
            Lane::Replay => self.replay.as_ref(),
        }
    }

    /// The slot of `lane`.
    pub fn slot(&mut self, lane: Lane) -> &mut Option<LaneCursor> {
        match lane {
            Lane::Live => &mut self.live,
            Lane::Reconcile => &mut self.reconcile,
            Lane::Backfill => &mut self.backfill,
            Lane::Replay => &mut self.replay,
        }
    }
}
