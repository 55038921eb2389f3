//! The engine-level queue in front of the budget store: who gets the next tokens, and when.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, oneshot};
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;

use super::policy::{BucketPolicy, BudgetPolicy, Fairness, MAX_CAPACITY_TOKEN_MS};
use super::store::{BudgetStore, Take};
use crate::backoff::f64_to_ms;
use crate::clock::{Clock, duration_ms};
use crate::error::{Error, Result};
use crate::model::Lane;

/// Requesters remembered per budget before idle ones are forgotten (a forgotten requester that
/// returns starts at the current minimum, like any new one).
const MAX_TRACKED_REQUESTERS: usize = 4096;

/// A request for tokens from a budget.
#[derive(Clone, Debug)]
pub(crate) struct Request {
    /// Who asks, as `"poller/partition"`: fairness is per requester.
    pub requester: String,
    /// The requester's share under [`Fairness::Weighted`] (finite, > 0; default 1).
    pub weight: f64,
    /// The lane asking: live is served before reconcile, backfill and replay.
    pub lane: Lane,
    /// Tokens wanted (default 1); 0 is granted at once without touching the budget.
    pub cost: u64,
    /// Cancelling this token withdraws the request.
    pub cancel: Option<CancellationToken>,
    /// How long to wait at most; `None` uses the policy's `max_wait` (and waits without limit when
    /// that is unset too). `Some(Duration::ZERO)` fails at once unless served right away.
    pub max_wait: Option<Duration>,
}

impl Request {
    /// One token for `requester` on the live lane, weight 1, no cancellation, the policy's wait.
    pub(crate) fn new(requester: impl Into<String>) -> Self {
        Self {
            requester: requester.into(),
            weight: 1.0,
            lane: Lane::Live,
            cost: 1,
            cancel: None,
            max_wait: None,
        }
    }

    /// Sets the weight.
    #[must_use]
    pub(crate) fn with_weight(mut self, weight: f64) -> Self {
        self.weight = weight;
        self
    }

    /// Sets the lane.
    #[must_use]
    pub(crate) fn with_lane(mut self, lane: Lane) -> Self {
        self.lane = lane;
        self
    }

    /// Sets the cost in tokens.
    #[must_use]
    pub(crate) fn with_cost(mut self, cost: u64) -> Self {
        self.cost = cost;
        self
    }

    /// Withdraws the request when `cancel` is cancelled.
    #[must_use]
    pub(crate) fn with_cancel(mut self, cancel: CancellationToken) -> Self {
        self.cancel = Some(cancel);
        self
    }

    /// Sets the longest wait.
    #[must_use]
    pub(crate) fn with_max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = Some(max_wait);
        self
    }

    fn validate(&self, bucket: &BucketPolicy) -> Result<()> {
        if !self.weight.is_finite() || self.weight <= 0.0 {
            return Err(Error::config(
                "budget_weight",
                format!("must be a finite number > 0, got {}", self.weight),
            ));
        }
        let units = u128::from(self.cost) * u128::from(bucket.per_ms);
        if units > u128::from(MAX_CAPACITY_TOKEN_MS) {
            return Err(Error::config(
                "budget_cost",
                format!(
                    "cost × per must be at most 2^53 token·ms, got {} × {} ms",
                    self.cost, bucket.per_ms
                ),
            ));
        }
        Ok(())
    }
}

/// A granted request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Grant {
    /// How long the request waited, in ms (0 when served at once); the engine reports a positive
    /// wait with `on_budget_wait`.
    pub waited_ms: i64,
}

/// Named rate budgets shared by every poller of an engine (guarantee G6: never exceeded).
///
/// A request is served at once when nobody is waiting and the store has the tokens. Otherwise it
/// joins the budget's queue, which is served in this order:
///
/// 1. lane: live, then reconcile, then backfill, then replay;
/// 2. fairness: under [`Fairness::Weighted`] the lowest `served / weight` (tokens granted so far
///    over weight), then the least recently served requester (this alone is
///    [`Fairness::RoundRobin`]; a requester never served goes first);
/// 3. arrival order.
///
/// The head of the queue is never skipped: a smaller request behind it waits even if the bucket
/// could serve it. A requester new to a weighted budget starts at the current minimum
/// `served / weight`, so it cannot monopolize the budget by arriving late.
///
/// While requests wait, one driver task per budget (spawned on the current tokio runtime, ended
/// as soon as the queue is empty) asks the store for the head's tokens and sleeps on the
/// [`Clock`] until the store's `retry_in_ms` has passed, or until the earliest waiter's deadline:
/// exactly one timer per budget, no polling. Deadlines (`max_wait`) are only looked at once the
/// queue is stuck; an expired request fails with [`Error::BudgetTimeout`] and leaves the queue.
/// A cancelled (or dropped) request leaves the queue at once and the driver moves on.
///
/// Tokens the store granted to a request that was withdrawn in the same instant are not returned:
/// the budget errs on the side of the API's limit.
pub(crate) struct BudgetManager {
    budgets: BTreeMap<String, Arc<Budget>>,
    store: Arc<dyn BudgetStore>,
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for BudgetManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BudgetManager")
            .field("budgets", &self.budgets.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl BudgetManager {
    /// A manager without budgets, counting in `store` and timing with `clock`.
    pub(crate) fn new(store: Arc<dyn BudgetStore>, clock: Arc<dyn Clock>) -> Self {
        Self {
            budgets: BTreeMap::new(),
            store,
            clock,
        }
    }

    /// Adds budget `name` after validating `policy`; a name used twice is a `Config` error.
    pub(crate) fn with_budget(
        mut self,
        name: impl Into<String>,
        policy: BudgetPolicy,
    ) -> Result<Self> {
        let name = name.into();
        policy.validate(&name)?;
        if self.budgets.contains_key(&name) {
            return Err(Error::config(format!("budgets.{name}"), "is defined twice"));
        }
        let budget = Budget {
            name: name.clone(),
            policy,
            bucket: policy.bucket(),
            queue: Mutex::new(Queue::default()),
            wake: Notify::new(),
        };
        self.budgets.insert(name, Arc::new(budget));
        Ok(self)
    }

    /// Whether budget `name` exists (a poller naming an unknown budget is a `Config` error).
    pub(crate) fn contains(&self, name: &str) -> bool {
        self.budgets.contains_key(name)
    }

    /// The policy of budget `name`.
    pub(crate) fn policy(&self, name: &str) -> Option<&BudgetPolicy> {
        self.budgets.get(name).map(|b| &b.policy)
    }

    /// The budgets' names, sorted.
    #[cfg(test)]
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.budgets.keys().map(String::as_str)
    }

    /// Waits for `request.cost` tokens of budget `name`.
    ///
    /// Fails with [`Error::BudgetTimeout`] when the wait limit passes (a deferral for the caller,
    /// not a failure: the engine makes the key due again when the budget can serve it, without
    /// backoff and without counting towards the circuit), [`Error::NotRunning`] when the request is cancelled, `Config` for an
    /// unknown budget, a weight that is not a finite number > 0 or an absurd cost, `Unsupported`
    /// when it must wait outside a tokio runtime, and with the store's error when the store fails.
    pub(crate) async fn acquire(&self, name: &str, request: Request) -> Result<Grant> {
        let budget = self.budget(name)?;
        request.validate(&budget.bucket)?;
        if request.cost == 0 {
            return Ok(Grant { waited_ms: 0 });
        }
        if request
            .cancel
            .as_ref()
            .is_some_and(CancellationToken::is_cancelled)
        {
            return Err(cancelled(name));
        }
        let start = self.clock.now_ms();
        let max_wait = request.max_wait.or(budget.policy.max_wait).map(duration_ms);

        // Nobody waits: ask the store directly, without queueing or a driver.
        if budget.lock().is_idle() {
            match self
                .store
                .take(name, request.cost, &budget.bucket, start)
                .await?
            {
                Take::Granted { .. } => {
                    let mut queue = budget.lock();
                    queue.track(&request.requester, request.weight, budget.policy.fairness);
                    queue.record_served(&request.requester, request.cost);
                    return Ok(Grant { waited_ms: 0 });
                }
                Take::Wait { .. } if max_wait == Some(0) => {
                    return Err(timeout(name, self.clock.now_ms().saturating_sub(start)));
                }
                Take::Wait { .. } => {}
            }
        }

        let (reply, mut answer) = oneshot::channel();
        let id = {
            let mut queue = budget.lock();
            queue.track(&request.requester, request.weight, budget.policy.fairness);
            let id = queue.push(Waiter {
                id: 0,
                requester: request.requester.clone(),
                rank: request.lane.rank(),
                cost: request.cost,
                enqueued_at: start,
                deadline: max_wait.map(|wait| start.saturating_add(wait)),
                reply,
            });
            if queue.driver.is_none() {
                let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                    queue.remove(id);
                    return Err(Error::Unsupported {
                        message: format!(
                            "budget '{name}': waiting for tokens needs a tokio runtime"
                        ),
                    });
                };
                let driver = runtime.spawn(drive(
                    Arc::clone(&budget),
                    Arc::clone(&self.store),
                    Arc::clone(&self.clock),
                ));
                queue.driver = Some(driver.abort_handle());
            }
            id
        };
        budget.wake.notify_one();

        // Leaves the queue if this future is dropped before it is answered.
        let queued = Queued {
            budget: &budget,
            id,
        };
        let answer = match &request.cancel {
            None => (&mut answer).await,
            Some(cancel) => {
                tokio::select! {
                    biased;
                    answer = &mut answer => answer,
                    () = cancel.cancelled() => {
                        if queued.leave() {
                            return Err(cancelled(name));
                        }
                        // Answered in the same instant (the driver answers and removes under one
                        // lock): the answer is already there.
                        (&mut answer).await
                    }
                }
            }
        };
        drop(queued);
        answer.unwrap_or_else(|_| {
            Err(Error::NotRunning {
                message: format!("budget '{name}': its queue stopped"),
            })
        })
    }

    /// When the driver of budget `name` next expects tokens for the head of its queue (epoch ms),
    /// or `None` when nothing waits. A daemon can sleep until then.
    pub(crate) fn next_refill_at(&self, name: &str) -> Option<i64> {
        let queue = self.budgets.get(name)?.lock();
        if queue.waiters.is_empty() {
            None
        } else {
            queue.wake_at
        }
    }

    /// An estimate of how long until budget `name` could serve `cost` tokens, in ms: the bucket's
    /// refill time, or the queue's next refill when requests already wait, whichever is later.
    /// Useful to defer a key after a [`Error::BudgetTimeout`]; the estimate may be early (others
    /// may be served first), never a promise.
    pub(crate) async fn ready_in_ms(&self, name: &str, cost: u64) -> Result<i64> {
        let budget = self.budget(name)?;
        let now = self.clock.now_ms();
        let tokens = self.store.peek(name, &budget.bucket, now).await?;
        let deficit = u64_f64(cost) - tokens;
        let refill = if deficit > 0.0 {
            let bucket = &budget.bucket;
            let ms = (deficit * u64_f64(bucket.per_ms) / u64_f64(bucket.requests)).ceil();
            f64_to_ms(ms).max(1)
        } else {
            0
        };
        let queued = self
            .next_refill_at(name)
            .map_or(0, |at| at.saturating_sub(now).max(0));
        Ok(refill.max(queued))
    }

    /// How many requests wait on budget `name`.
    #[cfg(test)]
    pub(crate) fn waiting(&self, name: &str) -> usize {
        self.budgets
            .get(name)
            .map_or(0, |budget| budget.lock().waiters.len())
    }

    /// How many budgets have a driver task (and so at most one timer) right now; 0 once every
    /// request is answered.
    #[cfg(test)]
    pub(crate) fn active_drivers(&self) -> usize {
        self.budgets
            .values()
            .filter(|budget| budget.lock().driver.is_some())
            .count()
    }

    fn budget(&self, name: &str) -> Result<Arc<Budget>> {
        self.budgets
            .get(name)
            .cloned()
            .ok_or_else(|| Error::config("budget", format!("unknown budget '{name}'")))
    }
}

impl Drop for BudgetManager {
    fn drop(&mut self) {
        // No request can still be waiting (they borrow the manager), so drivers are ending
        // anyway; aborting makes sure none outlives the manager.
        for budget in self.budgets.values() {
            let driver = budget.lock().driver.take();
            if let Some(driver) = driver {
                driver.abort();
            }
        }
    }
}

/// A `u64` as `f64` (exact below 2^53: costs and periods are validated below it).
#[allow(clippy::cast_precision_loss)]
fn u64_f64(n: u64) -> f64 {
    n as f64
}

fn cancelled(name: &str) -> Error {
    Error::NotRunning {
        message: format!("budget '{name}': the request was cancelled"),
    }
}

fn timeout(name: &str, waited_ms: i64) -> Error {
    Error::BudgetTimeout {
        budget: name.to_owned(),
        waited_ms: waited_ms.max(0),
    }
}

/// One budget: its policy and its queue.
struct Budget {
    name: String,
    policy: BudgetPolicy,
    bucket: BucketPolicy,
    queue: Mutex<Queue>,
    /// Wakes the driver when the queue changes (a permit is kept if it is not listening).
    wake: Notify,
}

impl Budget {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A waiting request.
struct Waiter {
    id: u64,
    requester: String,
    rank: u8,
    cost: u64,
    enqueued_at: i64,
    deadline: Option<i64>,
    reply: oneshot::Sender<Result<Grant>>,
}

/// What fairness remembers of a requester.
#[derive(Clone, Copy, Debug)]
struct Served {
    /// Tokens granted (a new weighted requester starts at the current minimum ratio).
    tokens: f64,
    /// The latest weight asked with.
    weight: f64,
    /// The serial of its latest grant (0: never served).
    last: u64,
}

#[derive(Default)]
struct Queue {
    waiters: Vec<Waiter>,
    requesters: BTreeMap<String, Served>,
    next_id: u64,
    grants: u64,
    /// The driver task, while one runs.
    driver: Option<AbortHandle>,
    /// When the driver expects the head's tokens.
    wake_at: Option<i64>,
}

impl Queue {
    fn is_idle(&self) -> bool {
        self.waiters.is_empty() && self.driver.is_none()
    }

    /// Remembers `requester` (a new one starts at the current minimum `served / weight`).
    fn track(&mut self, requester: &str, weight: f64, fairness: Fairness) {
        if let Some(served) = self.requesters.get_mut(requester) {
            served.weight = weight;
            return;
        }
        if self.requesters.len() >= MAX_TRACKED_REQUESTERS {
            let waiting: Vec<&str> = self.waiters.iter().map(|w| w.requester.as_str()).collect();
            self.requesters
                .retain(|name, _| waiting.contains(&name.as_str()));
        }
        let tokens = match fairness {
            Fairness::Weighted => {
                self.requesters
                    .values()
                    .map(|s| s.tokens / s.weight)
                    .min_by(f64::total_cmp)
                    .unwrap_or(0.0)
                    * weight
            }
            Fairness::RoundRobin => 0.0,
        };
        self.requesters.insert(
            requester.to_owned(),
            Served {
                tokens,
                weight,
                last: 0,
            },
        );
    }

    fn record_served(&mut self, requester: &str, cost: u64) {
        self.grants += 1;
        if let Some(served) = self.requesters.get_mut(requester) {
            served.tokens += u64_f64(cost);
            served.last = self.grants;
        }
    }

    fn push(&mut self, mut waiter: Waiter) -> u64 {
        self.next_id += 1;
        waiter.id = self.next_id;
        self.waiters.push(waiter);
        self.next_id
    }

    fn remove(&mut self, id: u64) -> Option<Waiter> {
        let at = self.waiters.iter().position(|w| w.id == id)?;
        Some(self.waiters.remove(at))
    }

    fn contains(&self, id: u64) -> bool {
        self.waiters.iter().any(|w| w.id == id)
    }

    /// The head: `(id, cost)` of the waiter to serve next.
    fn head(&self, fairness: Fairness) -> Option<(u64, u64)> {
        let unknown = Served {
            tokens: 0.0,
            weight: 1.0,
            last: 0,
        };
        let served = |w: &Waiter| *self.requesters.get(&w.requester).unwrap_or(&unknown);
        self.waiters
            .iter()
            .min_by(|a, b| {
                let (sa, sb) = (served(a), served(b));
                let ratio = match fairness {
                    Fairness::Weighted => {
                        (sa.tokens / sa.weight).total_cmp(&(sb.tokens / sb.weight))
                    }
                    Fairness::RoundRobin => std::cmp::Ordering::Equal,
                };
                a.rank
                    .cmp(&b.rank)
                    .then(ratio)
                    .then(sa.last.cmp(&sb.last))
                    .then(a.id.cmp(&b.id))
            })
            .map(|w| (w.id, w.cost))
    }

    /// Answers waiter `id` with a grant at `now`.
    fn grant(&mut self, id: u64, now: i64) {
        if let Some(waiter) = self.remove(id) {
            self.record_served(&waiter.requester, waiter.cost);
            let waited_ms = now.saturating_sub(waiter.enqueued_at).max(0);
            let _ = waiter.reply.send(Ok(Grant { waited_ms }));
        }
    }

    /// Answers waiter `id` with `error`.
    fn fail(&mut self, id: u64, error: Error) {
        if let Some(waiter) = self.remove(id) {
            let _ = waiter.reply.send(Err(error));
        }
    }

    /// Fails every waiter whose deadline has passed at `now`.
    fn expire(&mut self, name: &str, now: i64) {
        let (expired, kept): (Vec<Waiter>, Vec<Waiter>) = std::mem::take(&mut self.waiters)
            .into_iter()
            .partition(|w| w.deadline.is_some_and(|deadline| deadline <= now));
        self.waiters = kept;
        for waiter in expired {
            let waited = now.saturating_sub(waiter.enqueued_at);
            let _ = waiter.reply.send(Err(timeout(name, waited)));
        }
    }

    fn earliest_deadline(&self) -> Option<i64> {
        self.waiters.iter().filter_map(|w| w.deadline).min()
    }
}

/// A queued request; dropping it withdraws the request if it is still waiting.
struct Queued<'a> {
    budget: &'a Budget,
    id: u64,
}

impl Queued<'_> {
    /// Withdraws the request; false when it was already answered.
    fn leave(&self) -> bool {
        let left = self.budget.lock().remove(self.id).is_some();
        if left {
            self.budget.wake.notify_one();
        }
        left
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.leave();
    }
}

/// Ends a driver that stopped without emptying its queue (a panicking store, an abort): the
/// waiters are dropped, so they fail instead of waiting forever, and a later request starts a
/// new driver.
struct DriverGuard {
    budget: Arc<Budget>,
    finished: bool,
}

impl Drop for DriverGuard {
    fn drop(&mut self) {
        if !self.finished {
            let mut queue = self.budget.lock();
            queue.driver = None;
            queue.wake_at = None;
            queue.waiters.clear();
        }
    }
}

/// Serves budget `budget`'s queue until it is empty (see [`BudgetManager`]).
async fn drive(budget: Arc<Budget>, store: Arc<dyn BudgetStore>, clock: Arc<dyn Clock>) {
    let mut guard = DriverGuard {
        budget: Arc::clone(&budget),
        finished: false,
    };
    let fairness = budget.policy.fairness;
    // The head the store was last asked for, and when its tokens are due.
    let mut plan: Option<(u64, i64)> = None;
    loop {
        let now = clock.now_ms();
        let head = {
            let mut queue = budget.lock();
            let Some(head) = queue.head(fairness) else {
                queue.driver = None;
                queue.wake_at = None;
                guard.finished = true;
                return;
            };
            head
        };
        let due = match plan {
            // Same head, its tokens not due yet: no need to ask the store again.
            Some((id, due)) if id == head.0 && now < due => due,
            _ => {
                let taken = store.take(&budget.name, head.1, &budget.bucket, now).await;
                let answered_at = clock.now_ms();
                let mut queue = budget.lock();
                match taken {
                    Ok(Take::Granted { .. }) => {
                        queue.grant(head.0, answered_at);
                        queue.wake_at = None;
                        plan = None;
                        continue;
                    }
                    Ok(Take::Wait { retry_in_ms }) => {
                        let due = now.saturating_add(retry_in_ms.max(1));
                        plan = Some((head.0, due));
                        queue.wake_at = Some(due);
                        due
                    }
                    Err(error) => {
                        queue.fail(head.0, error);
                        queue.wake_at = None;
                        plan = None;
                        continue;
                    }
                }
            }
        };

        // Stuck: only now do deadlines matter.
        let until = {
            let mut queue = budget.lock();
            queue.expire(&budget.name, clock.now_ms());
            if !queue.contains(head.0) {
                // The head left (expired or withdrawn): the next one may be servable now.
                plan = None;
                continue;
            }
            queue
                .earliest_deadline()
                .map_or(due, |deadline| deadline.min(due))
        };
        tokio::select! {
            () = clock.sleep_until(until) => {}
            () = budget.wake.notified() => {}
        }
    }
}
