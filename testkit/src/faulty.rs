//! [`FaultyStore`]: a wrapper that injects failures and counts calls, for guarantee and chaos
//! tests.
//!
//! Two kinds of failure:
//! - **Injected faults** ([`FaultyStore::fail`]): the next `n` calls of an [`Op`] fail with a
//!   transient store error, before or after reaching the inner store. The instance goes on.
//! - **Kill points** ([`KillPoint`], K1–K7): armed on a shared [`KillSwitch`], a kill fires
//!   once, at the exact call it names, and the instance is then **dead**: every later call
//!   through this wrapper fails with `SimulatedCrash(dead-instance)` without reaching the store
//!   (no schedule save, no release, no acks), as if the process had died at that call.
//!
//! A [`Defect`] ([`FaultyStore::with_defect`]) makes the wrapper a *broken* store on purpose, for
//! the negative tests that prove the suite and the chaos checker catch a store that breaks the
//! contract: it sees the calls that can break an outbox (capabilities, commits, pending rows,
//! acknowledgements, identity streams) before the inner store does.
//!
//! A [`LeaseAudit`] shared by every instance over one store checks G5 as calls pass through:
//! never two unexpired leases of different owners, epochs strictly increasing per key, and a
//! superseded or released lease's write rejected by the inner store (each acquisition and
//! release probes the inner store with the lease that just stopped being valid).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use futures::stream::BoxStream;
use watukuy_core::{
    Error, Result,
    store::{
        Capabilities, Claim, CommitBatch, ItemRow, KeyCounts, Lease, LogQuery, LoggedEvent,
        OutboxRow, PKey, ParkedAction, ParkedQuery, ParkedRow, PollerState, SerializedError,
        StatePatch, Store, StoreErrorKind, Validator,
    },
};

/// A store operation that can fail on purpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// `acquire_lease`.
    AcquireLease,
    /// `renew_lease`.
    RenewLease,
    /// `release_lease`.
    ReleaseLease,
    /// `save_state`.
    SaveState,
    /// `commit_poll`.
    CommitPoll,
    /// `load_pending` (and `load_pending_with_holds`, which reads the same rows).
    LoadPending,
    /// `ack_events`.
    AckEvents,
    /// `record_attempt`.
    RecordAttempt,
    /// `park_event`.
    ParkEvent,
    /// `load_state`.
    LoadState,
    /// `held_keys`.
    HeldKeys,
    /// `counts`.
    Counts,
    /// `load_versions`.
    LoadVersions,
    /// `claim`.
    Claim,
    /// `stream_identities`: counted once per batch it yields (each one is a read of the
    /// store); never failed on purpose.
    StreamIdentities,
}

/// Whether an injected failure happens before the call reaches the store (nothing written) or
/// after it succeeded (written, but the caller sees an error: a crash after the write).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Timing {
    /// Fail without calling the inner store.
    Before,
    /// Call the inner store, then fail.
    After,
}

/// The kill points K1–K7: where a process dies (`docs/guarantees.md` lists them under G9).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KillPoint {
    /// K1 `before-acquire`: a run's `claim` fails before touching the store (nothing happened).
    BeforeAcquire,
    /// K2 `after-fetch`: a page was fetched and its first store read (`load_versions` of its
    /// items) fails, before its commit (the page is fetched again; no cursor move, no events).
    AfterFetch,
    /// K3 `after-commit`: `commit_poll` succeeds, then fails (the next run drains the outbox
    /// first, with the same ids).
    AfterCommit,
    /// K4 `mid-dispatch`: the next `ack_events` succeeds, then fails (the unacknowledged rest is
    /// delivered again).
    MidDispatch,
    /// K4 `before-ack`: `ack_events` fails before delegating, after the handler ran (delivered
    /// again).
    BeforeAck,
    /// K5/K6 `after-ack-before-schedule`: `save_state` fails (the schedule keeps its previous,
    /// sooner, value).
    AfterAckBeforeSchedule,
    /// K7 `during-release`: `release_lease` fails (the lease lingers until its TTL).
    DuringRelease,
    /// `handler`: the consumer fails once (attempt 1 of one event): a retry, not a crash.
    Handler,
}

impl KillPoint {
    /// Every kill point, K1 to K7, then `handler`.
    pub const ALL: [KillPoint; 8] = [
        KillPoint::BeforeAcquire,
        KillPoint::AfterFetch,
        KillPoint::AfterCommit,
        KillPoint::MidDispatch,
        KillPoint::BeforeAck,
        KillPoint::AfterAckBeforeSchedule,
        KillPoint::DuringRelease,
        KillPoint::Handler,
    ];

    /// The harness name (`before-acquire`, `after-fetch`, ...).
    pub fn name(self) -> &'static str {
        match self {
            KillPoint::BeforeAcquire => "before-acquire",
            KillPoint::AfterFetch => "after-fetch",
            KillPoint::AfterCommit => "after-commit",
            KillPoint::MidDispatch => "mid-dispatch",
            KillPoint::BeforeAck => "before-ack",
            KillPoint::AfterAckBeforeSchedule => "after-ack-before-schedule",
            KillPoint::DuringRelease => "during-release",
            KillPoint::Handler => "handler",
        }
    }

    /// The label (`K1` ... `K7`; `handler` has none).
    pub fn label(self) -> &'static str {
        match self {
            KillPoint::BeforeAcquire => "K1",
            KillPoint::AfterFetch => "K2",
            KillPoint::AfterCommit => "K3",
            KillPoint::MidDispatch | KillPoint::BeforeAck => "K4",
            KillPoint::AfterAckBeforeSchedule => "K5/K6",
            KillPoint::DuringRelease => "K7",
            KillPoint::Handler => "-",
        }
    }

    /// Whether the kill is a process death (every kill point but `handler`).
    pub fn is_crash(self) -> bool {
        self != KillPoint::Handler
    }

    /// The store call and timing where the kill fires (`None` for `handler`).
    pub fn site(self) -> Option<(Op, Timing)> {
        match self {
            KillPoint::BeforeAcquire => Some((Op::Claim, Timing::Before)),
            KillPoint::AfterFetch => Some((Op::LoadVersions, Timing::Before)),
            KillPoint::AfterCommit => Some((Op::CommitPoll, Timing::After)),
            KillPoint::MidDispatch => Some((Op::AckEvents, Timing::After)),
            KillPoint::BeforeAck => Some((Op::AckEvents, Timing::Before)),
            KillPoint::AfterAckBeforeSchedule => Some((Op::SaveState, Timing::Before)),
            KillPoint::DuringRelease => Some((Op::ReleaseLease, Timing::Before)),
            KillPoint::Handler => None,
        }
    }
}

impl fmt::Display for KillPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KillPoint {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        KillPoint::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = KillPoint::ALL.iter().map(|k| k.name()).collect();
                format!(
                    "unknown kill point {s:?}; expected one of {}",
                    names.join(", ")
                )
            })
    }
}

/// The error a killed or dead instance's store call fails with.
pub fn simulated_crash(reason: &str) -> Error {
    Error::store(
        StoreErrorKind::Other,
        false,
        format!("SimulatedCrash({reason})"),
    )
}

/// The armed kill points, shared by every instance of a chaos run (and its handler): each armed
/// kill fires once, at the first matching call of any live instance, then disarms; an armed
/// kill that did not fire stays armed.
#[derive(Debug, Default)]
pub struct KillSwitch {
    state: Mutex<KillState>,
}

#[derive(Debug, Default)]
struct KillState {
    armed: BTreeSet<KillPoint>,
    fired: BTreeMap<KillPoint, u64>,
}

impl KillSwitch {
    /// Nothing armed.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, KillState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Arms `point`; false when it was armed already.
    pub fn arm(&self, point: KillPoint) -> bool {
        self.lock().armed.insert(point)
    }

    /// Disarms everything.
    pub fn disarm_all(&self) {
        self.lock().armed.clear();
    }

    /// The armed kill points.
    pub fn armed(&self) -> Vec<KillPoint> {
        self.lock().armed.iter().copied().collect()
    }

    /// Fires `point` if it is armed: disarms it, counts it and returns true.
    pub fn try_fire(&self, point: KillPoint) -> bool {
        let mut state = self.lock();
        if state.armed.remove(&point) {
            *state.fired.entry(point).or_default() += 1;
            true
        } else {
            false
        }
    }

    /// How many times `point` fired.
    pub fn fired(&self, point: KillPoint) -> u64 {
        self.lock().fired.get(&point).copied().unwrap_or(0)
    }

    /// How many times each kill point fired (every point listed, zeros included).
    pub fn fired_counts(&self) -> BTreeMap<KillPoint, u64> {
        let state = self.lock();
        KillPoint::ALL
            .into_iter()
            .map(|k| (k, state.fired.get(&k).copied().unwrap_or(0)))
            .collect()
    }
}

/// The identity of the event every lease probe acknowledges: it never exists, so a store that
/// wrongly accepts the probe changes nothing.
pub const PROBE_EVENT_ID: &str = "watukuy-chaos-lease-probe";

/// Audits G5 over every instance sharing one store: never two unexpired leases held by
/// different owners, epochs strictly increasing per key, and writes with a superseded or
/// released lease rejected by the inner store. Also records the largest accepted ack batch.
///
/// Seen from outside the store, a lease counts as released once its release is sent (another
/// instance may take the key as soon as the store executes it, before the call returns), and
/// as held again if the release fails.
#[derive(Debug, Default)]
pub struct LeaseAudit {
    state: Mutex<AuditState>,
}

#[derive(Debug, Default)]
struct AuditState {
    keys: HashMap<PKey, KeyAudit>,
    violations: Vec<String>,
    acquisitions: u64,
    probes: u64,
    largest_ack: usize,
}

#[derive(Debug, Default)]
struct KeyAudit {
    /// The latest lease granted, and whether it was released since.
    current: Option<(Lease, bool)>,
    max_epoch: i64,
}

impl LeaseAudit {
    /// An audit that saw nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, AuditState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every G5 violation seen, in order.
    pub fn violations(&self) -> Vec<String> {
        self.lock().violations.clone()
    }

    fn accepted_ack(&self, ids: usize) {
        let mut state = self.lock();
        state.largest_ack = state.largest_ack.max(ids);
    }

    /// The most event ids one accepted `ack_events` call carried.
    pub fn largest_ack(&self) -> usize {
        self.lock().largest_ack
    }

    /// How many leases were granted.
    pub fn acquisitions(&self) -> u64 {
        self.lock().acquisitions
    }

    /// How many stale-lease probes reached the inner store.
    pub fn probes(&self) -> u64 {
        self.lock().probes
    }

    /// Records a granted lease; returns the lease it superseded (unreleased), to probe.
    fn acquired(&self, key: &PKey, lease: &Lease, now_ms: i64) -> Option<Lease> {
        let mut state = self.lock();
        state.acquisitions += 1;
        let audit = state.keys.entry(key.clone()).or_default();
        let mut found = Vec::new();
        if lease.epoch <= audit.max_epoch {
            found.push(format!(
                "G5: {key}: {} acquired epoch {} after epoch {} was granted (epochs must strictly increase)",
                lease.owner, lease.epoch, audit.max_epoch
            ));
        }
        let superseded = match audit.current.take() {
            Some((previous, released)) => {
                if !released && previous.owner != lease.owner && previous.expires_at > now_ms {
                    found.push(format!(
                        "G5: {key}: {} acquired epoch {} at {now_ms} while {} held epoch {} until {} (two unexpired owners)",
                        lease.owner,
                        lease.epoch,
                        previous.owner,
                        previous.epoch,
                        previous.expires_at
                    ));
                }
                (!released).then_some(previous)
            }
            None => None,
        };
        audit.max_epoch = audit.max_epoch.max(lease.epoch);
        audit.current = Some((lease.clone(), false));
        state.violations.extend(found);
        superseded
    }

    fn renewed(&self, key: &PKey, lease: &Lease, expires_at: i64) {
        let mut state = self.lock();
        let audit = state.keys.entry(key.clone()).or_default();
        match &mut audit.current {
            Some((current, false)) if current.epoch == lease.epoch => {
                current.expires_at = expires_at;
            }
            _ => {
                let message = format!(
                    "G5: {key}: {} renewed epoch {}, which is not the key's current lease",
                    lease.owner, lease.epoch
                );
                state.violations.push(message);
            }
        }
    }

    /// Marks `lease` released, as its release is sent; `false` when it is not the current,
    /// unreleased lease (nothing to probe then).
    fn released(&self, key: &PKey, lease: &Lease) -> bool {
        let mut state = self.lock();
        let audit = state.keys.entry(key.clone()).or_default();
        match &mut audit.current {
            Some((current, released)) if current.epoch == lease.epoch && !*released => {
                *released = true;
                true
            }
            _ => false,
        }
    }

    /// Undoes [`released`](Self::released) for a release that failed: the lease may still
    /// be held.
    fn unreleased(&self, key: &PKey, lease: &Lease) {
        let mut state = self.lock();
        if let Some(audit) = state.keys.get_mut(key)
            && let Some((current, released)) = &mut audit.current
            && current.epoch == lease.epoch
        {
            *released = false;
        }
    }

    /// A fenced write the inner store accepted: it must carry the current, unreleased lease.
    fn accepted_write(&self, key: &PKey, lease: &Lease, op: &str) {
        let mut state = self.lock();
        let audit = state.keys.entry(key.clone()).or_default();
        let ok = matches!(&audit.current, Some((current, false)) if current.epoch == lease.epoch && current.owner == lease.owner);
        if !ok {
            let current = audit.current.as_ref().map(|(l, released)| {
                format!("{} epoch {} (released: {released})", l.owner, l.epoch)
            });
            let message = format!(
                "G5: {key}: the store accepted {op} from {} with epoch {}, but the current lease is {}",
                lease.owner,
                lease.epoch,
                current.unwrap_or_else(|| "none".to_owned())
            );
            state.violations.push(message);
        }
    }

    fn probed(&self, key: &PKey, stale: &Lease, why: &str, result: &Result<()>) {
        let mut state = self.lock();
        state.probes += 1;
        match result {
            Err(Error::LeaseLost { .. }) => {}
            Ok(()) => state.violations.push(format!(
                "G5: {key}: a write with {why} epoch {} of {} was accepted by the store",
                stale.epoch, stale.owner
            )),
            Err(other) => state.violations.push(format!(
                "G5: {key}: a write with {why} epoch {} of {} failed with {other} instead of LeaseLost",
                stale.epoch, stale.owner
            )),
        }
    }
}

/// A deliberate contract violation a [`FaultyStore`] applies to the calls passing through it.
///
/// Every method defaults to the honest call on `inner`, so a defect overrides only what it
/// breaks: `commit_poll` dropping an event, `ack_events` ignoring the epoch, `stream_identities`
/// out of order, a store claiming no replay log.
#[async_trait]
pub trait Defect<S: Store + ?Sized = dyn Store>: Send + Sync {
    /// What the store claims to support.
    fn capabilities(&self, inner: &S) -> Capabilities {
        inner.capabilities()
    }

    /// Commits a page.
    async fn commit_poll(
        &self,
        inner: &S,
        key: &PKey,
        lease: &Lease,
        batch: &CommitBatch,
    ) -> Result<()> {
        inner.commit_poll(key, lease, batch).await
    }

    /// Loads the pending outbox rows.
    async fn load_pending(&self, inner: &S, key: &PKey, limit: usize) -> Result<Vec<OutboxRow>> {
        inner.load_pending(key, limit).await
    }

    /// Loads the pending outbox rows and the held keys together. A defect that changes
    /// [`load_pending`](Self::load_pending) changes this too if the dispatcher must see it: the
    /// dispatcher reads a drain's first slice through this call.
    async fn load_pending_with_holds(
        &self,
        inner: &S,
        key: &PKey,
        limit: usize,
    ) -> Result<(Vec<OutboxRow>, Vec<String>)> {
        inner.load_pending_with_holds(key, limit).await
    }

    /// Acknowledges delivered events.
    async fn ack_events(&self, inner: &S, key: &PKey, lease: &Lease, ids: &[String]) -> Result<()> {
        inner.ack_events(key, lease, ids).await
    }

    /// Streams the snapshot's identities.
    fn stream_identities<'a>(
        &'a self,
        inner: &'a S,
        key: &'a PKey,
        batch_size: usize,
    ) -> BoxStream<'a, Result<Vec<String>>> {
        inner.stream_identities(key, batch_size)
    }
}

/// No defect: every call goes to the inner store unchanged.
struct Honest;

impl<S: Store + ?Sized> Defect<S> for Honest {}

/// Wraps a store, failing chosen operations on demand, firing kill points and counting what
/// passes through. One wrapper stands for one process (engine instance).
pub struct FaultyStore<S: Store + ?Sized = dyn Store> {
    inner: Arc<S>,
    defect: Arc<dyn Defect<S>>,
    armed: Mutex<HashMap<(Op, Timing), u32>>,
    calls: Mutex<HashMap<Op, u64>>,
    /// Every call of a store method (see `total_calls`).
    total_calls: AtomicU64,
    max_pending_limit: AtomicUsize,
    max_pending_rows: AtomicUsize,
    kills: Option<Arc<KillSwitch>>,
    audit: Option<Arc<LeaseAudit>>,
    dead: AtomicBool,
    killed_by: Mutex<Option<String>>,
}

impl<S: Store + ?Sized> fmt::Debug for FaultyStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyStore")
            .field("dead", &self.is_dead())
            .finish_non_exhaustive()
    }
}

impl<S: Store + ?Sized> FaultyStore<S> {
    /// Wraps `inner` with no fault armed.
    pub fn new(inner: Arc<S>) -> Self {
        Self {
            inner,
            defect: Arc::new(Honest),
            armed: Mutex::default(),
            calls: Mutex::default(),
            total_calls: AtomicU64::new(0),
            max_pending_limit: AtomicUsize::new(0),
            max_pending_rows: AtomicUsize::new(0),
            kills: None,
            audit: None,
            dead: AtomicBool::new(false),
            killed_by: Mutex::new(None),
        }
    }

    /// Fires the store-level kill points armed on `kills` (shared by every instance of a run).
    #[must_use]
    pub fn with_kills(mut self, kills: Arc<KillSwitch>) -> Self {
        self.kills = Some(kills);
        self
    }

    /// Breaks the contract on purpose, as `defect` says (see [`Defect`]).
    #[must_use]
    pub fn with_defect(mut self, defect: Arc<dyn Defect<S>>) -> Self {
        self.defect = defect;
        self
    }

    /// Reports lease activity to `audit` (shared by every instance over the same store).
    #[must_use]
    pub fn with_audit(mut self, audit: Arc<LeaseAudit>) -> Self {
        self.audit = Some(audit);
        self
    }

    /// The wrapped store.
    pub fn inner(&self) -> &Arc<S> {
        &self.inner
    }

    /// Makes the next `times` calls of `op` fail at `timing` with a transient store error.
    pub fn fail(&self, op: Op, timing: Timing, times: u32) {
        *self
            .armed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry((op, timing))
            .or_default() += times;
    }

    /// How many store methods were called in all, counted or not by [`calls`](Self::calls)
    /// (failed calls included; `stream_identities` once per call, however many batches it
    /// yields).
    pub fn total_calls(&self) -> u64 {
        self.total_calls.load(Ordering::Relaxed)
    }

    /// How many times `op` was called (failed calls included).
    pub fn calls(&self, op: Op) -> u64 {
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&op)
            .copied()
            .unwrap_or(0)
    }

    /// The largest `limit` ever passed to `load_pending`.
    pub fn max_load_pending_limit(&self) -> usize {
        self.max_pending_limit.load(Ordering::Relaxed)
    }

    /// The most rows one `load_pending` call ever returned.
    pub fn max_load_pending_rows(&self) -> usize {
        self.max_pending_rows.load(Ordering::Relaxed)
    }

    /// Kills the instance now, as if its process died (`reason` shows in its errors).
    pub fn kill(&self, reason: &str) {
        let mut killed_by = self
            .killed_by
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if killed_by.is_none() {
            *killed_by = Some(reason.to_owned());
        }
        self.dead.store(true, Ordering::SeqCst);
    }

    /// True once a kill fired (or [`kill`](Self::kill) was called): every call fails.
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }

    /// What killed the instance, if it is dead.
    pub fn killed_by(&self) -> Option<String> {
        self.killed_by
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Tells the audit (if any) that `lease` was granted, and probes the lease it superseded.
    async fn audit_acquired(&self, key: &PKey, lease: &Lease, now_ms: i64) {
        if let Some(audit) = &self.audit
            && let Some(superseded) = audit.acquired(key, lease, now_ms)
        {
            self.probe(audit, key, &superseded, "a superseded").await;
        }
    }

    /// Fails every call of a dead instance without reaching the store.
    fn alive(&self) -> Result<()> {
        self.total_calls.fetch_add(1, Ordering::Relaxed);
        self.check_alive()
    }

    /// [`alive`](Self::alive) without counting a call.
    fn check_alive(&self) -> Result<()> {
        if self.is_dead() {
            Err(simulated_crash("dead-instance"))
        } else {
            Ok(())
        }
    }

    fn take(&self, op: Op, timing: Timing) -> Result<()> {
        let mut armed = self.armed.lock().unwrap_or_else(PoisonError::into_inner);
        match armed.get_mut(&(op, timing)) {
            Some(n) if *n > 0 => {
                *n -= 1;
                Err(Error::store(
                    StoreErrorKind::Other,
                    true,
                    format!("injected fault: {op:?} ({timing:?})"),
                ))
            }
            _ => Ok(()),
        }
    }

    /// Fires the kill point armed at `(op, timing)`, if any: the instance dies.
    fn fire(&self, op: Op, timing: Timing) -> Result<()> {
        let Some(kills) = &self.kills else {
            return Ok(());
        };
        for point in KillPoint::ALL {
            if point.site() == Some((op, timing)) && kills.try_fire(point) {
                self.kill(point.name());
                return Err(simulated_crash(point.name()));
            }
        }
        Ok(())
    }

    /// Counts the call, fails it if the instance is dead, and applies a `Before` fault or kill.
    fn before(&self, op: Op) -> Result<()> {
        self.count(op);
        self.alive()?;
        self.take(op, Timing::Before)?;
        self.fire(op, Timing::Before)
    }

    /// Counts one call of `op`.
    fn count(&self, op: Op) {
        *self
            .calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(op)
            .or_default() += 1;
    }

    /// Applies an `After` fault or kill to a successful result.
    fn after<T>(&self, op: Op, result: Result<T>) -> Result<T> {
        let value = result?;
        self.take(op, Timing::After)?;
        self.fire(op, Timing::After)?;
        Ok(value)
    }

    /// Reports a fenced write the inner store accepted to the audit.
    fn audit_write<T>(&self, key: &PKey, lease: &Lease, op: &str, result: &Result<T>) {
        if let (Some(audit), Ok(_)) = (&self.audit, result) {
            audit.accepted_write(key, lease, op);
        }
    }

    /// Probes the inner store with a lease that is no longer valid: the write must be rejected.
    async fn probe(&self, audit: &LeaseAudit, key: &PKey, stale: &Lease, why: &str) {
        let result = self
            .inner
            .ack_events(key, stale, &[PROBE_EVENT_ID.to_owned()])
            .await;
        audit.probed(key, stale, why, &result);
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<S: Store + ?Sized> Store for FaultyStore<S> {
    fn capabilities(&self) -> Capabilities {
        self.defect.capabilities(&*self.inner)
    }

    async fn migrate(&self) -> Result<()> {
        self.alive()?;
        self.inner.migrate().await
    }

    async fn close(&self) -> Result<()> {
        self.alive()?;
        self.inner.close().await
    }

    async fn acquire_lease(
        &self,
        key: &PKey,
        owner: &str,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<Option<Lease>> {
        self.before(Op::AcquireLease)?;
        let result = self.inner.acquire_lease(key, owner, ttl_ms, now_ms).await;
        if let Ok(Some(lease)) = &result {
            self.audit_acquired(key, lease, now_ms).await;
        }
        self.after(Op::AcquireLease, result)
    }

    async fn claim(
        &self,
        key: &PKey,
        owner: &str,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<Option<Claim>> {
        self.before(Op::Claim)?;
        let result = self.inner.claim(key, owner, ttl_ms, now_ms).await;
        if let Ok(Some(claim)) = &result {
            self.audit_acquired(key, &claim.lease, now_ms).await;
        }
        self.after(Op::Claim, result)
    }

    async fn renew_lease(
        &self,
        key: &PKey,
        lease: &Lease,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<bool> {
        self.before(Op::RenewLease)?;
        let result = self.inner.renew_lease(key, lease, ttl_ms, now_ms).await;
        if let (Some(audit), Ok(true)) = (&self.audit, &result) {
            audit.renewed(key, lease, now_ms.saturating_add(ttl_ms));
        }
        self.after(Op::RenewLease, result)
    }

    async fn release_lease(&self, key: &PKey, lease: &Lease) -> Result<()> {
        self.before(Op::ReleaseLease)?;
        // Released for the audit as the release is sent: another instance may take the key
        // as soon as the store executes it, before this call returns. A failed release is
        // held again.
        let sent = self
            .audit
            .as_ref()
            .is_some_and(|audit| audit.released(key, lease));
        let result = self.inner.release_lease(key, lease).await;
        if let Some(audit) = self.audit.as_ref().filter(|_| sent) {
            match &result {
                Ok(()) => self.probe(audit, key, lease, "a released").await,
                Err(_) => audit.unreleased(key, lease),
            }
        }
        self.after(Op::ReleaseLease, result)
    }

    async fn get_lease(&self, key: &PKey) -> Result<Option<Lease>> {
        self.alive()?;
        self.inner.get_lease(key).await
    }

    async fn load_state(&self, key: &PKey) -> Result<Option<PollerState>> {
        self.before(Op::LoadState)?;
        let result = self.inner.load_state(key).await;
        self.after(Op::LoadState, result)
    }

    async fn save_state(&self, key: &PKey, lease: &Lease, patch: &StatePatch) -> Result<()> {
        self.before(Op::SaveState)?;
        let result = self.inner.save_state(key, lease, patch).await;
        self.audit_write(key, lease, "save_state", &result);
        self.after(Op::SaveState, result)
    }

    async fn save_state_unfenced(&self, key: &PKey, patch: &StatePatch) -> Result<()> {
        self.alive()?;
        self.inner.save_state_unfenced(key, patch).await
    }

    async fn list_keys(&self, poller: Option<&str>) -> Result<Vec<PKey>> {
        self.alive()?;
        self.inner.list_keys(poller).await
    }

    async fn delete_key(&self, key: &PKey) -> Result<()> {
        self.alive()?;
        self.inner.delete_key(key).await
    }

    async fn clear_items(&self, key: &PKey) -> Result<()> {
        self.alive()?;
        self.inner.clear_items(key).await
    }

    async fn load_versions(
        &self,
        key: &PKey,
        identities: &[String],
    ) -> Result<HashMap<String, ItemRow>> {
        self.before(Op::LoadVersions)?;
        let result = self.inner.load_versions(key, identities).await;
        self.after(Op::LoadVersions, result)
    }

    fn stream_identities<'a>(
        &'a self,
        key: &'a PKey,
        batch_size: usize,
    ) -> BoxStream<'a, Result<Vec<String>>> {
        // A full scan holds the stream open across its pages: an instance killed meanwhile
        // must not reach the store for the next batch either, so the check is per batch.
        self.total_calls.fetch_add(1, Ordering::Relaxed);
        let inner = self.defect.stream_identities(&*self.inner, key, batch_size);
        Box::pin(futures::stream::unfold(
            Some(inner),
            move |inner| async move {
                let mut inner = inner?;
                if let Err(error) = self.check_alive() {
                    return Some((Err(error), None));
                }
                let batch = futures::StreamExt::next(&mut inner).await?;
                self.count(Op::StreamIdentities);
                Some((batch, Some(inner)))
            },
        ))
    }

    async fn counts(&self, key: &PKey) -> Result<KeyCounts> {
        self.before(Op::Counts)?;
        let result = self.inner.counts(key).await;
        self.after(Op::Counts, result)
    }

    async fn commit_poll(&self, key: &PKey, lease: &Lease, batch: &CommitBatch) -> Result<()> {
        self.before(Op::CommitPoll)?;
        let result = self
            .defect
            .commit_poll(&*self.inner, key, lease, batch)
            .await;
        self.audit_write(key, lease, "commit_poll", &result);
        self.after(Op::CommitPoll, result)
    }

    async fn load_pending(&self, key: &PKey, limit: usize) -> Result<Vec<OutboxRow>> {
        self.before(Op::LoadPending)?;
        self.max_pending_limit.fetch_max(limit, Ordering::Relaxed);
        let result = self.defect.load_pending(&*self.inner, key, limit).await;
        if let Ok(rows) = &result {
            self.max_pending_rows
                .fetch_max(rows.len(), Ordering::Relaxed);
        }
        self.after(Op::LoadPending, result)
    }

    /// Counted, failed and killed as one `load_pending` ([`Op::LoadPending`]).
    async fn load_pending_with_holds(
        &self,
        key: &PKey,
        limit: usize,
    ) -> Result<(Vec<OutboxRow>, Vec<String>)> {
        self.before(Op::LoadPending)?;
        self.max_pending_limit.fetch_max(limit, Ordering::Relaxed);
        let result = self
            .defect
            .load_pending_with_holds(&*self.inner, key, limit)
            .await;
        if let Ok((rows, _)) = &result {
            self.max_pending_rows
                .fetch_max(rows.len(), Ordering::Relaxed);
        }
        self.after(Op::LoadPending, result)
    }

    async fn ack_events(&self, key: &PKey, lease: &Lease, ids: &[String]) -> Result<()> {
        self.before(Op::AckEvents)?;
        let result = self.defect.ack_events(&*self.inner, key, lease, ids).await;
        self.audit_write(key, lease, "ack_events", &result);
        if let (Some(audit), Ok(())) = (&self.audit, &result) {
            audit.accepted_ack(ids.len());
        }
        self.after(Op::AckEvents, result)
    }

    async fn record_attempt(
        &self,
        key: &PKey,
        lease: &Lease,
        id: &str,
        error: &SerializedError,
        next_attempt_at: Option<i64>,
    ) -> Result<()> {
        self.before(Op::RecordAttempt)?;
        let result = self
            .inner
            .record_attempt(key, lease, id, error, next_attempt_at)
            .await;
        self.audit_write(key, lease, "record_attempt", &result);
        self.after(Op::RecordAttempt, result)
    }

    async fn park_event(&self, key: &PKey, lease: &Lease, row: &ParkedRow) -> Result<()> {
        self.before(Op::ParkEvent)?;
        let result = self.inner.park_event(key, lease, row).await;
        self.audit_write(key, lease, "park_event", &result);
        self.after(Op::ParkEvent, result)
    }

    async fn list_parked(&self, key: &PKey, query: ParkedQuery) -> Result<Vec<ParkedRow>> {
        self.alive()?;
        self.inner.list_parked(key, query).await
    }

    async fn resolve_parked(
        &self,
        key: &PKey,
        ids: &[String],
        action: ParkedAction,
    ) -> Result<u64> {
        self.alive()?;
        self.inner.resolve_parked(key, ids, action).await
    }

    async fn held_keys(&self, key: &PKey) -> Result<Vec<String>> {
        self.before(Op::HeldKeys)?;
        let result = self.inner.held_keys(key).await;
        self.after(Op::HeldKeys, result)
    }

    async fn get_validator(&self, key: &PKey, url_hash: &str) -> Result<Option<Validator>> {
        self.alive()?;
        self.inner.get_validator(key, url_hash).await
    }

    async fn read_log(
        &self,
        key: &PKey,
        query: LogQuery,
        limit: usize,
    ) -> Result<Vec<LoggedEvent>> {
        self.alive()?;
        self.inner.read_log(key, query, limit).await
    }

    async fn prune_log(&self, key: &PKey, older_than: i64) -> Result<u64> {
        self.alive()?;
        self.inner.prune_log(key, older_than).await
    }
}
