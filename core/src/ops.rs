//! Operations on one key's stored state, in one place for everything that works on a store:
//! the [`Engine`](crate::Engine), the `watukuy` command line and the admin page call these, so
//! a pause, a replay or an inspection means the same thing wherever it is asked for.
//!
//! Operator writes (pause, resume, make due, reset the cursor) are unfenced: they never touch
//! the lease, so they work while an instance is running the key, which sees them on its next
//! read of the state. A replay takes the key's lease (retrying while another instance holds it)
//! and renews it between pages.
//!
//! Parked rows are listed, retried and discarded here too, with one set of rules (a
//! quarantined item cannot be retried; an id that names no row is an error naming it), and a
//! tool without the pollers' code finds the keys a request names, and inspects them, from the
//! store alone ([`stored_key`], [`inspect_store`]).
//!
//! Each function takes the `initial` state to assume for a key whose state was never saved:
//! the engine passes the poller's initial schedule, a tool without the poller's code
//! [`PollerState::zero`].

use std::time::Duration;

use serde::Serialize;

use crate::clock::Clock;
use crate::error::{Error, Result, StoreErrorKind};
use crate::event::Event;
use crate::model::{
    Circuit, CommitBatch, Lane, LaneCursor, Lease, LogQuery, OutboxRow, PKey, PollSummary,
    PollerState, ScheduleState, StatePatch,
};
use crate::schedule;

pub use crate::engine::{InspectReport, PollerInspect};
use crate::store::Store;

mod keys;
mod parked;

pub use keys::{inspect_store, stored_key, stored_keys};
pub use parked::{ParkedSelection, discard_parked, list_parked, retry_parked};

/// Log entries copied per commit by [`replay`].
pub const REPLAY_PAGE: usize = 500;

/// The cursor of each lane, as an inspection shows them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct LaneCursors {
    /// The live lane.
    pub live: Option<serde_json::Value>,
    /// The reconcile lane (the page it is on, while a listing is in progress).
    pub reconcile: Option<serde_json::Value>,
    /// The backfill lane.
    pub backfill: Option<serde_json::Value>,
    /// The replay lane.
    pub replay: Option<serde_json::Value>,
}

/// A backfill's progress, as an inspection shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct BackfillProgress {
    /// The cursor the backfill reached (parsed JSON, or the raw text if it does not parse;
    /// `None`: the strategy's beginning).
    pub cursor: Option<serde_json::Value>,
    /// Where it stops (`None`: at the end of the listing).
    pub target: Option<serde_json::Value>,
    /// Whether it finished.
    pub done: bool,
    /// Whether known, unchanged items are re-emitted as `updated`.
    pub force: bool,
    /// Consecutive failures of the backfill lane.
    pub failures: u32,
    /// After a failure, when the lane tries again (epoch ms).
    pub retry_at: Option<i64>,
}

/// One key as its store holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct KeyInspect {
    /// The poller.
    pub poller: String,
    /// The partition (`""` for an unpartitioned poller).
    pub partition: String,
    /// Paused by an operator.
    pub paused: bool,
    /// The current lease holder, expired or not, if any.
    pub lease: Option<Lease>,
    /// The lane cursors (parsed JSON, or the raw text if it does not parse).
    pub cursors: LaneCursors,
    /// The schedule (the `initial` one for a key whose state was never saved).
    pub schedule: ScheduleState,
    /// What the last cycle did.
    pub last_poll: Option<PollSummary>,
    /// Events waiting in the outbox.
    pub outbox_pending: u64,
    /// Parked rows (poison and invalid).
    pub parked: u64,
    /// Items in the snapshot.
    pub items: u64,
    /// How far behind now the live cursor is (the timestamp strategy only).
    pub lag_ms: Option<i64>,
    /// Items a full scan (`snapshot_diff`, the reconcile lane) missed and has not yet reported
    /// deleted: they wait for the next complete listing, or for a lookup that failed to be
    /// tried again (see [`DeleteConfirmation`](crate::poller::DeleteConfirmation)). Summed over the
    /// lanes.
    pub suspects: u64,
    /// The last backfill started on the key, finished or not (`None`: never one).
    pub backfill: Option<BackfillProgress>,
}

/// The key's state, or `initial` when it was never saved.
pub async fn state_or(store: &dyn Store, key: &PKey, initial: PollerState) -> Result<PollerState> {
    Ok(store.load_state(key).await?.unwrap_or(initial))
}

/// Reads one key: state, lease, counts and cursors. `lag` turns the live cursor's persisted
/// text into how far behind `now` it is (the engine asks the poller's strategy; a tool without
/// the poller's code uses [`cursor::persisted_lag_ms`](crate::cursor::persisted_lag_ms)).
pub async fn inspect_key(
    store: &dyn Store,
    key: &PKey,
    now: i64,
    initial: PollerState,
    lag: impl Fn(&str, i64) -> Option<i64>,
) -> Result<KeyInspect> {
    // Three independent reads, in flight together.
    let (state, counts, lease) = futures::try_join!(
        state_or(store, key, initial),
        store.counts(key),
        store.get_lease(key)
    )?;
    let text = |lane: Option<&LaneCursor>| lane.and_then(|l| l.cursor.clone());
    let live = text(state.lanes.live.as_ref());
    let lag_ms = live.as_deref().and_then(|text| lag(text, now));
    Ok(KeyInspect {
        poller: key.poller.clone(),
        partition: key.partition.clone(),
        paused: state.paused,
        lease,
        cursors: LaneCursors {
            live: parsed(live),
            reconcile: parsed(text(state.lanes.reconcile.as_ref())),
            backfill: parsed(text(state.lanes.backfill.as_ref())),
            replay: parsed(text(state.lanes.replay.as_ref())),
        },
        last_poll: state.schedule.last_poll.clone(),
        schedule: state.schedule,
        outbox_pending: counts.pending,
        parked: counts.parked,
        items: counts.items,
        lag_ms,
        suspects: Lane::ALL
            .iter()
            .filter_map(|lane| state.lanes.get(*lane)?.suspects.as_ref())
            .map(|suspects| suspects.len() as u64)
            .sum(),
        backfill: state.lanes.backfill.as_ref().map(|lane| BackfillProgress {
            cursor: parsed(lane.cursor.clone()),
            target: parsed(lane.target.clone()),
            done: lane.done == Some(true),
            force: lane.force == Some(true),
            failures: lane.failures.unwrap_or(0),
            retry_at: lane.retry_at,
        }),
    })
}

/// A persisted cursor as JSON, or as its raw text when it does not parse.
fn parsed(text: Option<String>) -> Option<serde_json::Value> {
    text.map(|text| serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)))
}

/// Pauses a key: it is not polled and its outbox is not drained.
pub async fn pause(store: &dyn Store, key: &PKey, now: i64) -> Result<()> {
    let patch = StatePatch {
        paused: Some(true),
        updated_at: Some(now),
        ..StatePatch::default()
    };
    store.save_state_unfenced(key, &patch).await
}

/// Resumes a paused key and makes it due now.
pub async fn resume(store: &dyn Store, key: &PKey, now: i64, initial: PollerState) -> Result<()> {
    let state = state_or(store, key, initial).await?;
    let patch = StatePatch {
        paused: Some(false),
        schedule: Some(schedule::make_due(&state.schedule, now)),
        updated_at: Some(now),
        ..StatePatch::default()
    };
    store.save_state_unfenced(key, &patch).await
}

/// Makes a key due now (a throttle is cleared; an open circuit stays open, so the run is a
/// half-open probe).
pub async fn make_due(store: &dyn Store, key: &PKey, now: i64, initial: PollerState) -> Result<()> {
    let state = state_or(store, key, initial).await?;
    let patch = StatePatch {
        schedule: Some(schedule::make_due(&state.schedule, now)),
        updated_at: Some(now),
        ..StatePatch::default()
    };
    store.save_state_unfenced(key, &patch).await
}

/// Sets the live cursor to `cursor` (the strategy's persisted JSON text; `None`: the strategy's
/// initial cursor) and makes the key due. With `clear_snapshot` the item snapshot is dropped
/// first, so every item is emitted again as `created`, with the ids it had before.
pub async fn reset_cursor(
    store: &dyn Store,
    key: &PKey,
    cursor: Option<String>,
    clear_snapshot: bool,
    now: i64,
    initial: PollerState,
) -> Result<()> {
    let state = state_or(store, key, initial).await?;
    if clear_snapshot {
        store.clear_items(key).await?;
    }
    let mut lanes = state.lanes.clone();
    lanes.live.get_or_insert_with(LaneCursor::default).cursor = cursor;
    let patch = StatePatch {
        lanes: Some(lanes),
        schedule: Some(schedule::make_due(&state.schedule, now)),
        updated_at: Some(now),
        ..StatePatch::default()
    };
    store.save_state_unfenced(key, &patch).await
}

/// How an operation waits for a key's lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseRetry {
    /// Acquisition attempts before giving up (at least one is made).
    pub tries: u32,
    /// The wait between two attempts, on the caller's clock.
    pub every: Duration,
    /// The lease's time to live; a replay renews it after every page.
    pub ttl_ms: i64,
}

impl Default for LeaseRetry {
    /// 20 tries, 250 ms apart, a 30 s lease.
    fn default() -> Self {
        Self {
            tries: 20,
            every: Duration::from_millis(250),
            ttl_ms: 30_000,
        }
    }
}

/// Takes `key`'s lease for `owner`, waiting `retry.every` between attempts while another
/// instance holds it. After `retry.tries` attempts it fails with a transient `Busy` store
/// error naming the holder.
pub async fn acquire_with_retry(
    store: &dyn Store,
    clock: &dyn Clock,
    key: &PKey,
    owner: &str,
    retry: LeaseRetry,
) -> Result<Lease> {
    let tries = retry.tries.max(1);
    for attempt in 0..tries {
        if attempt > 0 {
            clock.sleep(retry.every).await;
        }
        if let Some(lease) = store
            .acquire_lease(key, owner, retry.ttl_ms, clock.now_ms())
            .await?
        {
            return Ok(lease);
        }
    }
    let holder = match store.get_lease(key).await? {
        Some(lease) => format!(
            "{} (epoch {}, expires at {})",
            lease.owner, lease.epoch, lease.expires_at
        ),
        None => "another instance".to_owned(),
    };
    Err(Error::store(
        StoreErrorKind::Busy,
        true,
        format!(
            "{key} stayed leased by {holder} for {tries} tries; try again when its run is over"
        ),
    ))
}

/// Copies the events logged on `key` between `from_ms` and `to_ms` (epoch ms, inclusive;
/// `None`: up to now) into the outbox under the key's lease, which it takes (see
/// [`acquire_with_retry`]), renews after every page of [`REPLAY_PAGE`] and releases at the end:
/// copies keep their original ids, go on lane `replay` with fresh sequences continuing the
/// key's, attempt 0, and are not logged again. An event still pending in the outbox is
/// replaced by its copy (same id), not duplicated. The key's next drain delivers them.
/// Returns how many were queued.
pub async fn replay(
    store: &dyn Store,
    clock: &dyn Clock,
    key: &PKey,
    owner: &str,
    retry: LeaseRetry,
    (from_ms, to_ms): (i64, Option<i64>),
    initial: PollerState,
) -> Result<u64> {
    let lease = acquire_with_retry(store, clock, key, owner, retry).await?;
    let outcome = copy_log(
        store,
        clock,
        key,
        &lease,
        retry.ttl_ms,
        (from_ms, to_ms),
        initial,
    )
    .await;
    // Released whatever happened; a failed release only means the lease expires by itself.
    if let Err(error) = store.release_lease(key, &lease).await {
        tracing::warn!(%key, %error, "lease release after a replay failed; it expires by itself");
    }
    outcome
}

async fn copy_log(
    store: &dyn Store,
    clock: &dyn Clock,
    key: &PKey,
    lease: &Lease,
    ttl_ms: i64,
    (from_ms, to_ms): (i64, Option<i64>),
    initial: PollerState,
) -> Result<u64> {
    let to_ms = to_ms.unwrap_or_else(|| clock.now_ms());
    let mut sequence = state_or(store, key, initial).await?.sequence;
    let mut after = None;
    let mut replayed = 0_u64;
    loop {
        let query = LogQuery {
            after_sequence: after,
            from_time: Some(from_ms),
            to_time: Some(to_ms),
        };
        let page = store.read_log(key, query, REPLAY_PAGE).await?;
        let Some(last) = page.last() else { break };
        after = Some(last.sequence);
        let now = clock.now_ms();
        let events: Vec<OutboxRow> = page
            .iter()
            .map(|logged| {
                sequence += 1;
                let event = Event {
                    lane: Lane::Replay,
                    sequence,
                    attempt: 0,
                    ..logged.event.clone()
                };
                OutboxRow::pending(event, now)
            })
            .collect();
        replayed += events.len() as u64;
        let batch = CommitBatch {
            state_patch: StatePatch {
                sequence: Some(sequence),
                updated_at: Some(now),
                ..StatePatch::default()
            },
            events,
            log: false,
            ..CommitBatch::default()
        };
        store.commit_poll(key, lease, &batch).await?;
        if page.len() < REPLAY_PAGE {
            break;
        }
        if !store
            .renew_lease(key, lease, ttl_ms, clock.now_ms())
            .await?
        {
            return Err(Error::lease_lost(key, lease.epoch));
        }
    }
    Ok(replayed)
}

/// What [`health`] checks: `HealthOptions::default()` (the engine in any status, no circuit
/// open, no lag limit), then the setters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HealthOptions {
    /// The engine must be running its daemon (`start`ed, not stopped): for a service whose
    /// engine runs as a daemon. Off for `tick`-driven (cron) services.
    pub require_running: bool,
    /// An open circuit is reported on its row but does not make the check fail.
    pub allow_open_circuit: bool,
    /// The most a timestamp cursor may lag behind now (`lag_ms` of a key); `None`: no limit.
    pub max_lag: Option<Duration>,
}

impl HealthOptions {
    /// Sets [`require_running`](Self::require_running).
    #[must_use]
    pub fn require_running(mut self, require: bool) -> Self {
        self.require_running = require;
        self
    }

    /// Sets [`allow_open_circuit`](Self::allow_open_circuit).
    #[must_use]
    pub fn allow_open_circuit(mut self, allow: bool) -> Self {
        self.allow_open_circuit = allow;
        self
    }

    /// Sets [`max_lag`](Self::max_lag).
    #[must_use]
    pub fn max_lag(mut self, max: Duration) -> Self {
        self.max_lag = Some(max);
        self
    }
}

/// The answer of a health check: up or down, why, and one row per `(poller, partition)`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct HealthReport {
    /// No reason below: every check passed.
    pub healthy: bool,
    /// The engine's status when checked.
    pub status: crate::Status,
    /// Why the check failed, one sentence each, written for people (empty when healthy).
    pub reasons: Vec<String>,
    /// Every active `(poller, partition)`.
    pub pollers: Vec<HealthRow>,
}

/// One `(poller, partition)` of a [`HealthReport`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct HealthRow {
    /// The poller.
    pub poller: String,
    /// The partition (`""` when unpartitioned).
    pub partition: String,
    /// Paused by an operator.
    pub paused: bool,
    /// The key's circuit.
    pub circuit: Circuit,
    /// How far its timestamp cursor is behind now, in ms (other cursors: `None`).
    pub lag_ms: Option<i64>,
    /// Events waiting in its outbox.
    pub outbox_pending: u64,
    /// Parked rows (poison events and quarantined items).
    pub parked: u64,
    /// The instance holding its lease, if any (expired or not).
    pub lease_owner: Option<String>,
}

/// The health of an engine from its [`InspectReport`] (what [`Engine::health`](crate::Engine::health)
/// reads): down when `require_running` and the engine is not running, when a circuit is open
/// (unless `allow_open_circuit`), or when a key's lag exceeds `max_lag`. A paused key, pending
/// events and parked rows are reported on its row and do not fail the check.
///
/// ```
/// use std::time::Duration;
/// use watukuy_core::ops::{HealthOptions, InspectReport, health};
///
/// # fn check(report: &InspectReport) {
/// let options = HealthOptions::default().require_running(true).max_lag(Duration::from_secs(600));
/// let answer = health(report, &options);
/// if !answer.healthy {
///     eprintln!("unhealthy: {}", answer.reasons.join("; "));
/// }
/// # }
/// ```
pub fn health(report: &InspectReport, options: &HealthOptions) -> HealthReport {
    let mut reasons = Vec::new();
    if options.require_running && report.status != crate::Status::Running {
        let status = serde_json::to_value(report.status)
            .ok()
            .and_then(|value| value.as_str().map(str::to_owned))
            .unwrap_or_default();
        reasons.push(format!("the engine is not running (it is {status})"));
    }
    let max_lag_ms = options.max_lag.map(crate::clock::duration_ms);
    let mut pollers = Vec::with_capacity(report.pollers.len());
    for entry in &report.pollers {
        let key = &entry.key;
        let name = if key.partition.is_empty() {
            key.poller.clone()
        } else {
            format!("{}/{}", key.poller, key.partition)
        };
        let circuit = key.schedule.circuit;
        if circuit == Circuit::Open && !options.allow_open_circuit {
            let failures = key.schedule.consecutive_failures;
            let polls = if failures == 1 {
                "1 failed poll".to_owned()
            } else {
                format!("{failures} failed polls in a row")
            };
            let last = key
                .schedule
                .last_error
                .as_ref()
                .map(|error| format!("; the last error: {}", error.message))
                .unwrap_or_default();
            reasons.push(format!("{name}: the circuit is open after {polls}{last}"));
        }
        if let (Some(lag), Some(max)) = (key.lag_ms, max_lag_ms)
            && lag > max
        {
            reasons.push(format!(
                "{name}: the cursor lags {} behind, more than the {} allowed",
                seconds(lag),
                seconds(max)
            ));
        }
        pollers.push(HealthRow {
            poller: key.poller.clone(),
            partition: key.partition.clone(),
            paused: key.paused,
            circuit,
            lag_ms: key.lag_ms,
            outbox_pending: key.outbox_pending,
            parked: key.parked,
            lease_owner: key.lease.as_ref().map(|lease| lease.owner.clone()),
        });
    }
    HealthReport {
        healthy: reasons.is_empty(),
        status: report.status,
        reasons,
        pollers,
    }
}

/// `ms` as whole seconds for a sentence (`90 s`).
fn seconds(ms: i64) -> String {
    format!("{} s", ms / 1000)
}
