//! The budget store port and the in-process token bucket.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use async_trait::async_trait;

use super::policy::BucketPolicy;
use crate::error::Result;

/// The answer of [`BudgetStore::take`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Take {
    /// The tokens were taken.
    Granted {
        /// Whole tokens left in the bucket.
        remaining: u64,
    },
    /// Not enough tokens: nothing was taken.
    Wait {
        /// Milliseconds until the bucket holds the cost (at least 1), if nobody else takes first.
        retry_in_ms: i64,
    },
}

/// Where the token buckets of rate budgets live.
///
/// [`MemoryBudgetStore`] keeps them in this process; a shared store (Redis) keeps them across
/// processes, which is what extends guarantee G6 to many instances. Every implementation counts
/// exactly as [`BucketState`] describes, with time given by the caller (`now_ms`, epoch
/// milliseconds): a store never reads a clock. Each call is atomic per budget name.
#[async_trait]
pub trait BudgetStore: Send + Sync + 'static {
    /// Takes `cost` tokens from budget `name` if the bucket holds them at `now_ms`; otherwise takes
    /// nothing and says how long until it would. `cost = 0` is always granted.
    ///
    /// Fails with a `Config` error when a number of `policy` is 0, or with a `Store` error when
    /// the backend fails.
    async fn take(&self, name: &str, cost: u64, policy: &BucketPolicy, now_ms: i64)
    -> Result<Take>;

    /// The tokens in budget `name` at `now_ms` (a fraction: refill is continuous), without taking
    /// any. An unknown budget is full.
    async fn peek(&self, name: &str, policy: &BucketPolicy, now_ms: i64) -> Result<f64>;
}

/// One budget's bucket and the arithmetic every store mirrors; public so that other stores can
/// test their implementation against it.
///
/// # The arithmetic
///
/// Every store counts the same way, so a budget shared through Redis behaves like one in memory.
/// Counting is exact integer arithmetic in **token·ms** units: one token is `per_ms` units, and
/// the bucket gains `requests` units every millisecond (that is `requests / per_ms` tokens per ms).
/// The state of a budget is two integers: the level `L` (units) and the time `T` (epoch ms) it was
/// last brought up to date.
///
/// ```text
/// state missing:  L = burst·per_ms, T = now                  (a new bucket starts full)
///
/// take(cost, now):
///   cap  = max(burst, cost)·per_ms                            (an oversized cost still fits)
///   need = cost·per_ms
///   L    = min(cap, L + max(0, now − T)·requests)             (time going backwards adds nothing)
///   T    = max(T, now)                                        (... and never moves T back)
///   cost = 0:    → Granted { remaining: floor(L / per_ms) }   (nothing is written)
///   L >= need:   L = L − need; write (L, T)
///                → Granted { remaining: floor(L / per_ms) }
///   otherwise:   write (L, T)
///                → Wait { retry_in_ms: max(1, ceil((need − L) / requests)) }
///
/// peek(now):     min(burst·per_ms, L + max(0, now − T)·requests) / per_ms   (a fraction; nothing written)
/// ```
///
/// With `10 per 1000 ms, burst 3`: a bucket starts at 3000; three takes leave 0; the fourth needs
/// 1000 more and waits `ceil(1000 / 10) = 100` ms; at `t = 99` the level is 990 and the wait is
/// `ceil(10 / 10) = 1` ms. A cost of 5 against 3 tokens needs 2000 more: 200 ms.
///
/// **Mirroring it in Lua.** Policies are validated so that `burst·per_ms <= 2^53` (and the manager
/// refuses costs with `cost·per_ms > 2^53`), so every level and every `need` is an integer a double
/// holds exactly. A refill product `(now − T)·requests` above 2^53 may round, but it is then larger
/// than `cap` and the `min` clamps it to the exact `cap`. Compute the ceiling without trusting a
/// rounded quotient: `q = math.floor(d / r); if q * r < d then q = q + 1 end; if q > 1 and
/// (q - 1) * r >= d then q = q - 1 end` (all products are below 2^53, hence exact). Store `L` and
/// `T` formatted with `%.17g` (they are integers, so this is exact); take `now` from the caller,
/// never from Redis `TIME`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketState {
    /// The level in token·ms units (`per_ms` units are one token).
    pub level: u128,
    /// The epoch millisecond the level was last brought up to date.
    pub last_ms: i64,
}

impl BucketState {
    /// A full bucket (`burst` tokens) at `now_ms`.
    pub fn full(policy: &BucketPolicy, now_ms: i64) -> Self {
        Self {
            level: u128::from(policy.burst) * u128::from(policy.per_ms),
            last_ms: now_ms,
        }
    }

    /// The level refilled up to `now_ms` and capped at `cap` (units).
    fn refilled(&self, policy: &BucketPolicy, cap: u128, now_ms: i64) -> u128 {
        let elapsed = u128::try_from(now_ms.saturating_sub(self.last_ms)).unwrap_or(0);
        let gained = elapsed.saturating_mul(u128::from(policy.requests));
        self.level.saturating_add(gained).min(cap)
    }

    /// Takes `cost` tokens at `now_ms`, updating the state (see [the arithmetic](BucketState#the-arithmetic)).
    ///
    /// `policy` is assumed valid (see [`BucketPolicy::validate`]); a zero `requests` or `per_ms`
    /// is counted as 1 rather than divided by.
    pub fn take(&mut self, cost: u64, policy: &BucketPolicy, now_ms: i64) -> Take {
        let per_ms = u128::from(policy.per_ms.max(1));
        let requests = u128::from(policy.requests.max(1));
        let cap = u128::from(policy.burst.max(cost)) * per_ms;
        let need = u128::from(cost) * per_ms;
        let level = self.refilled(policy, cap, now_ms);
        let remaining = |level: u128| u64::try_from(level / per_ms).unwrap_or(u64::MAX);
        if cost == 0 {
            return Take::Granted {
                remaining: remaining(level),
            };
        }
        self.last_ms = self.last_ms.max(now_ms);
        if level >= need {
            self.level = level - need;
            Take::Granted {
                remaining: remaining(self.level),
            }
        } else {
            self.level = level;
            let wait = (need - level).div_ceil(requests).max(1);
            Take::Wait {
                retry_in_ms: i64::try_from(wait).unwrap_or(i64::MAX),
            }
        }
    }

    /// The tokens at `now_ms` (capped at `burst`), without changing the state.
    pub fn tokens(&self, policy: &BucketPolicy, now_ms: i64) -> f64 {
        let per_ms = u128::from(policy.per_ms.max(1));
        let level = self.refilled(policy, u128::from(policy.burst) * per_ms, now_ms);
        units_to_tokens(level, per_ms)
    }
}

/// `level / per_ms` as a float: the whole tokens exactly, plus the fraction.
#[allow(clippy::cast_precision_loss)]
fn units_to_tokens(level: u128, per_ms: u128) -> f64 {
    (level / per_ms) as f64 + (level % per_ms) as f64 / per_ms as f64
}

/// Token buckets in this process: enough for one engine (G6 within a process).
///
/// ```
/// use watukuy_core::budget::{BucketPolicy, BudgetStore, MemoryBudgetStore, Take};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> watukuy_core::Result<()> {
/// let store = MemoryBudgetStore::new();
/// let policy = BucketPolicy { requests: 10, per_ms: 1000, burst: 3 };
/// for _ in 0..3 {
///    assert!(matches!(store.take("api", 1, &policy, 0).await?, Take::Granted { .. }));
/// }
/// assert_eq!(store.take("api", 1, &policy, 0).await?, Take::Wait { retry_in_ms: 100 });
/// assert_eq!(store.take("api", 1, &policy, 99).await?, Take::Wait { retry_in_ms: 1 });
/// assert_eq!(store.take("api", 1, &policy, 100).await?, Take::Granted { remaining: 0 });
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Default)]
pub struct MemoryBudgetStore {
    buckets: Mutex<BTreeMap<String, BucketState>>,
}

impl MemoryBudgetStore {
    /// An empty store: every budget starts full.
    pub fn new() -> Self {
        Self::default()
    }

    fn with_bucket<T>(
        &self,
        name: &str,
        policy: &BucketPolicy,
        now_ms: i64,
        f: impl FnOnce(&mut BucketState) -> T,
    ) -> T {
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        let bucket = buckets
            .entry(name.to_owned())
            .or_insert_with(|| BucketState::full(policy, now_ms));
        f(bucket)
    }
}

#[async_trait]
impl BudgetStore for MemoryBudgetStore {
    async fn take(
        &self,
        name: &str,
        cost: u64,
        policy: &BucketPolicy,
        now_ms: i64,
    ) -> Result<Take> {
        policy.validate(name)?;
        Ok(self.with_bucket(name, policy, now_ms, |bucket| {
            bucket.take(cost, policy, now_ms)
        }))
    }

    async fn peek(&self, name: &str, policy: &BucketPolicy, now_ms: i64) -> Result<f64> {
        policy.validate(name)?;
        let buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(buckets.get(name).map_or_else(
            || BucketState::full(policy, now_ms).tokens(policy, now_ms),
            |bucket| bucket.tokens(policy, now_ms),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: BucketPolicy = BucketPolicy {
        requests: 10,
        per_ms: 1000,
        burst: 3,
    };

    fn granted(take: Take) -> bool {
        matches!(take, Take::Granted { .. })
    }

    #[tokio::test]
    async fn three_takes_then_the_fourth_waits_100_ms() {
        let store = MemoryBudgetStore::new();
        for left in [2, 1, 0] {
            assert_eq!(
                store.take("b", 1, &POLICY, 0).await.unwrap(),
                Take::Granted { remaining: left }
            );
        }
        assert_eq!(
            store.take("b", 1, &POLICY, 0).await.unwrap(),
            Take::Wait { retry_in_ms: 100 }
        );
        assert_eq!(
            store.take("b", 1, &POLICY, 99).await.unwrap(),
            Take::Wait { retry_in_ms: 1 }
        );
        assert_eq!(
            store.take("b", 1, &POLICY, 100).await.unwrap(),
            Take::Granted { remaining: 0 }
        );
    }

    #[tokio::test]
    async fn cost_five_with_three_tokens_waits_200_ms() {
        let store = MemoryBudgetStore::new();
        assert_eq!(
            store.take("b", 5, &POLICY, 0).await.unwrap(),
            Take::Wait { retry_in_ms: 200 }
        );
        // A cost above burst is finite: the bucket may fill up to the cost for that call.
        assert_eq!(
            store.take("b", 5, &POLICY, 199).await.unwrap(),
            Take::Wait { retry_in_ms: 1 }
        );
        assert_eq!(
            store.take("b", 5, &POLICY, 200).await.unwrap(),
            Take::Granted { remaining: 0 }
        );
    }

    #[tokio::test]
    async fn cost_zero_is_always_granted_and_takes_nothing() {
        let store = MemoryBudgetStore::new();
        for _ in 0..3 {
            assert!(granted(store.take("b", 1, &POLICY, 0).await.unwrap()));
        }
        assert_eq!(
            store.take("b", 0, &POLICY, 0).await.unwrap(),
            Take::Granted { remaining: 0 }
        );
        assert_eq!(
            store.take("b", 1, &POLICY, 0).await.unwrap(),
            Take::Wait { retry_in_ms: 100 }
        );
    }

    #[tokio::test]
    async fn refill_is_capped_at_burst() {
        let store = MemoryBudgetStore::new();
        assert!(granted(store.take("b", 3, &POLICY, 0).await.unwrap()));
        assert_eq!(store.peek("b", &POLICY, 0).await.unwrap(), 0.0);
        assert_eq!(store.peek("b", &POLICY, 150).await.unwrap(), 1.5);
        assert_eq!(store.peek("b", &POLICY, 3_600_000).await.unwrap(), 3.0);
        for left in [2, 1, 0] {
            assert_eq!(
                store.take("b", 1, &POLICY, 3_600_000).await.unwrap(),
                Take::Granted { remaining: left }
            );
        }
        assert!(!granted(
            store.take("b", 1, &POLICY, 3_600_000).await.unwrap()
        ));
    }

    #[tokio::test]
    async fn time_going_backwards_is_ignored() {
        let store = MemoryBudgetStore::new();
        assert!(granted(store.take("b", 3, &POLICY, 1_000).await.unwrap()));
        // Earlier than the last update: no refill, and the update time stays at 1000.
        assert_eq!(
            store.take("b", 1, &POLICY, 500).await.unwrap(),
            Take::Wait { retry_in_ms: 100 }
        );
        assert_eq!(store.peek("b", &POLICY, 0).await.unwrap(), 0.0);
        assert_eq!(
            store.take("b", 1, &POLICY, 1_099).await.unwrap(),
            Take::Wait { retry_in_ms: 1 }
        );
        assert!(granted(store.take("b", 1, &POLICY, 1_100).await.unwrap()));
    }

    #[tokio::test]
    async fn budgets_are_independent_and_start_full() {
        let store = MemoryBudgetStore::new();
        assert_eq!(store.peek("a", &POLICY, 0).await.unwrap(), 3.0);
        assert!(granted(store.take("a", 3, &POLICY, 0).await.unwrap()));
        assert!(granted(store.take("b", 3, &POLICY, 0).await.unwrap()));
    }

    #[tokio::test]
    async fn a_zero_policy_is_a_config_error() {
        let store = MemoryBudgetStore::new();
        let bad = BucketPolicy {
            requests: 0,
            ..POLICY
        };
        let err = store.take("b", 1, &bad, 0).await.unwrap_err();
        assert!(err.to_string().contains("budgets.b.requests"), "{err}");
        assert!(store.peek("b", &bad, 0).await.is_err());
    }

    #[test]
    fn extreme_numbers_do_not_overflow() {
        let huge = BucketPolicy {
            requests: u64::MAX,
            per_ms: u64::MAX,
            burst: u64::MAX,
        };
        let mut bucket = BucketState::full(&huge, i64::MIN);
        assert!(granted(bucket.take(u64::MAX, &huge, i64::MIN)));
        assert_eq!(
            bucket.take(1, &huge, i64::MIN),
            Take::Wait { retry_in_ms: 1 }
        );
        assert!(granted(bucket.take(1, &huge, i64::MAX)));
        let slow = BucketPolicy {
            requests: 1,
            per_ms: u64::MAX,
            burst: 1,
        };
        let mut bucket = BucketState::full(&slow, 0);
        assert!(granted(bucket.take(1, &slow, 0)));
        assert_eq!(
            bucket.take(1, &slow, 0),
            Take::Wait {
                retry_in_ms: i64::MAX
            }
        );
    }
}
