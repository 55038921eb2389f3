//! [`RedisBudgetStore`]: rate budgets shared by every process on one Redis (G6 across
//! instances).

use async_trait::async_trait;
use watukuy_core::budget::{BucketPolicy, BudgetStore, MAX_CAPACITY_TOKEN_MS, Take};
use watukuy_core::{Error, Result, store::StoreErrorKind};

use crate::conn::Conn;
use crate::keys::KeySpace;
use crate::options::RedisOptions;
use crate::scripts::{SCRIPTS, run};
use crate::{ClusterConnection, ConnectionManager};

/// The token buckets of rate budgets in Redis, so that every engine on the same Redis and
/// prefix shares one budget per name (guarantee G6 across processes).
///
/// Each budget is one hash, `<prefix>budget:{<name>}` (`level` and `last`, in token·ms and epoch
/// ms), updated by one Lua script per call (`lua/budget_take.lua`, `lua/budget_peek.lua`). The
/// script mirrors [`BucketState`](watukuy_core::budget::BucketState) exactly, with the time
/// always the caller's `now_ms` (never Redis `TIME`), so the same sequence of calls gives the
/// same answers as [`MemoryBudgetStore`](watukuy_core::budget::MemoryBudgetStore).
///
/// Lua counts in doubles, so the store refuses what a double cannot count exactly: a policy with
/// `burst × per_ms > 2^53` (a `Config` error naming `budgets.<name>.burst`, as
/// [`BudgetPolicy::validate`](watukuy_core::budget::BudgetPolicy::validate) does), a cost with
/// `cost × per_ms > 2^53` (a `Config` error naming `budget_cost`, as the budget manager does) and
/// a `now_ms` beyond ±2^53 ms (a `Rejected` store error). Within those bounds every answer is
/// exact.
#[derive(Clone)]
pub struct RedisBudgetStore {
    conn: Conn,
    keys: KeySpace,
}

impl std::fmt::Debug for RedisBudgetStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBudgetStore")
            .field("prefix", &self.keys.prefix())
            .finish_non_exhaustive()
    }
}

impl RedisBudgetStore {
    pub(crate) fn new(conn: Conn, keys: KeySpace) -> Self {
        Self { conn, keys }
    }

    /// Connects to `url` like [`RedisStore::connect`](crate::RedisStore::connect) (standalone,
    /// TLS or cluster URLs).
    pub async fn connect(url: &str, options: RedisOptions) -> Result<Self> {
        Ok(crate::RedisStore::connect(url, options)
            .await?
            .budget_store())
    }

    /// Uses a connection manager you built; fails with [`Error::Config`] for invalid options.
    pub fn from_manager(conn: ConnectionManager, options: RedisOptions) -> Result<Self> {
        options.validate()?;
        Ok(Self::new(
            Conn::Single(conn),
            KeySpace::new(&options.prefix),
        ))
    }

    /// Uses a Redis Cluster connection you built; each budget is one key, so one slot.
    pub fn from_cluster(conn: ClusterConnection, options: RedisOptions) -> Result<Self> {
        options.validate()?;
        Ok(Self::new(
            Conn::Cluster(std::sync::Arc::new(crate::conn::Cluster::new(None, conn))),
            KeySpace::new(&options.prefix),
        ))
    }
}

/// 2^53: every integer up to it is exact in a double.
const EXACT: u64 = MAX_CAPACITY_TOKEN_MS;

fn check(name: &str, policy: &BucketPolicy, cost: u64, now_ms: i64) -> Result<()> {
    policy.validate(name)?;
    let capacity = u128::from(policy.burst) * u128::from(policy.per_ms);
    if capacity > u128::from(EXACT) {
        return Err(Error::config(
            format!("budgets.{name}.burst"),
            format!(
                "burst × per must be at most 2^53 token·ms, got {} × {} ms",
                policy.burst, policy.per_ms
            ),
        ));
    }
    if u128::from(cost) * u128::from(policy.per_ms) > u128::from(EXACT) {
        return Err(Error::config(
            "budget_cost",
            format!(
                "cost × per must be at most 2^53 token·ms, got {cost} × {} ms",
                policy.per_ms
            ),
        ));
    }
    if now_ms.unsigned_abs() > EXACT {
        return Err(Error::store(
            StoreErrorKind::Rejected,
            false,
            format!("now_ms {now_ms} is beyond ±2^53 ms, which Redis' Lua cannot count exactly"),
        ));
    }
    Ok(())
}

fn number(what: &str, text: &str) -> Result<u64> {
    text.parse().map_err(|e| Error::corrupt(what, e))
}

#[async_trait]
impl BudgetStore for RedisBudgetStore {
    async fn take(
        &self,
        name: &str,
        cost: u64,
        policy: &BucketPolicy,
        now_ms: i64,
    ) -> Result<Take> {
        check(name, policy, cost, now_ms)?;
        let call = SCRIPTS
            .budget_take
            .call(&[self.keys.budget(name)])
            .arg(cost.to_string())
            .arg(policy.requests.to_string())
            .arg(policy.per_ms.to_string())
            .arg(policy.burst.to_string())
            .arg(now_ms.to_string());
        let (granted, value): (i64, String) = run(&self.conn, call).await?;
        let value = number("a budget answer", &value)?;
        Ok(if granted == 1 {
            Take::Granted { remaining: value }
        } else {
            Take::Wait {
                retry_in_ms: i64::try_from(value).unwrap_or(i64::MAX),
            }
        })
    }

    async fn peek(&self, name: &str, policy: &BucketPolicy, now_ms: i64) -> Result<f64> {
        check(name, policy, 0, now_ms)?;
        let call = SCRIPTS
            .budget_peek
            .call(&[self.keys.budget(name)])
            .arg(policy.requests.to_string())
            .arg(policy.per_ms.to_string())
            .arg(policy.burst.to_string())
            .arg(now_ms.to_string());
        let (whole, rest): (String, String) = run(&self.conn, call).await?;
        let whole = number("a budget level", &whole)?;
        let rest = number("a budget level", &rest)?;
        Ok(tokens(whole, rest, policy.per_ms))
    }
}

/// `whole + rest / per_ms`, computed as `BucketState::tokens` computes it.
#[allow(clippy::cast_precision_loss)]
fn tokens(whole: u64, rest: u64, per_ms: u64) -> f64 {
    let per_ms = u128::from(per_ms.max(1));
    u128::from(whole) as f64 + u128::from(rest) as f64 / per_ms as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: BucketPolicy = BucketPolicy {
        requests: 10,
        per_ms: 1000,
        burst: 3,
    };

    #[test]
    fn refuses_what_lua_cannot_count_exactly() {
        assert!(check("api", &POLICY, 3, 1_767_225_600_000).is_ok());
        let huge = BucketPolicy {
            burst: 1 << 53,
            ..POLICY
        };
        let err = check("api", &huge, 1, 0).unwrap_err();
        assert!(err.to_string().contains("budgets.api.burst"), "{err}");
        let err = check("api", &POLICY, 1 << 50, 0).unwrap_err();
        assert!(err.to_string().contains("budget_cost"), "{err}");
        assert!(check("api", &POLICY, 1, i64::MAX).is_err());
        let zero = BucketPolicy {
            requests: 0,
            ..POLICY
        };
        assert!(check("api", &zero, 1, 0).is_err());
    }

    #[test]
    fn tokens_match_the_memory_formula() {
        assert_eq!(tokens(1, 500, 1000), 1.5);
        assert_eq!(tokens(3, 0, 1000), 3.0);
    }
}
