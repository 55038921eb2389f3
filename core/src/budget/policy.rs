//! Budget configuration: what a budget allows, and the three numbers a store needs.

use std::time::Duration;

use crate::error::{Error, Result};

/// The largest `burst × per` (in token·ms) a budget may hold: 2^53, so that every store can count
/// exactly, including one whose script language only has doubles (Lua in Redis).
pub const MAX_CAPACITY_TOKEN_MS: u64 = 1 << 53;

/// How waiters of the same lane share a budget.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Fairness {
    /// The least recently served requester goes first (a requester never served goes first of all).
    #[default]
    RoundRobin,
    /// The requester with the lowest `served / weight` goes first (ties: least recently served),
    /// where `served` counts the tokens granted to it.
    Weighted,
}

/// A rate budget: at most `requests` per `per`, with bursts of up to `burst`.
///
/// The bucket starts full (`burst` tokens) and refills at `requests / per`; a request costing more
/// than `burst` still goes through once the bucket holds its cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BudgetPolicy {
    /// Tokens refilled every `per` (at least 1).
    pub requests: u64,
    /// The refill period (at least 1 ms).
    pub per: Duration,
    /// The bucket's capacity in tokens; `None` means `requests`.
    pub burst: Option<u64>,
    /// How waiters of the same lane are ordered.
    pub fairness: Fairness,
    /// How long a request may wait for tokens; `None` waits until served or cancelled. A request's
    /// own `max_wait` takes precedence.
    pub max_wait: Option<Duration>,
}

impl BudgetPolicy {
    /// `requests` per `per`, burst `requests`, round-robin, no wait limit.
    pub fn new(requests: u64, per: Duration) -> Self {
        Self {
            requests,
            per,
            burst: None,
            fairness: Fairness::RoundRobin,
            max_wait: None,
        }
    }

    /// Sets the bucket's capacity.
    #[must_use]
    pub fn with_burst(mut self, burst: u64) -> Self {
        self.burst = Some(burst);
        self
    }

    /// Sets the fairness between requesters.
    #[must_use]
    pub fn with_fairness(mut self, fairness: Fairness) -> Self {
        self.fairness = fairness;
        self
    }

    /// Sets how long a request may wait by default.
    #[must_use]
    pub fn with_max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = Some(max_wait);
        self
    }

    /// The bucket's capacity: `burst`, or `requests` when unset.
    pub fn burst(&self) -> u64 {
        self.burst.unwrap_or(self.requests)
    }

    /// The refill period in whole milliseconds (saturating).
    pub fn per_ms(&self) -> u64 {
        u64::try_from(self.per.as_millis()).unwrap_or(u64::MAX)
    }

    /// The numbers a [`BudgetStore`](super::BudgetStore) works with.
    pub fn bucket(&self) -> BucketPolicy {
        BucketPolicy {
            requests: self.requests,
            per_ms: self.per_ms(),
            burst: self.burst(),
        }
    }

    /// Checks the policy of budget `name`; errors name the option, e.g. `budgets.github.requests`.
    pub fn validate(&self, name: &str) -> Result<()> {
        let option = |o: &str| format!("budgets.{name}.{o}");
        if self.requests == 0 {
            return Err(Error::config(
                option("requests"),
                "must be at least 1, got 0",
            ));
        }
        if self.per_ms() == 0 {
            return Err(Error::config(
                option("per"),
                format!("must be at least 1 ms, got {:?}", self.per),
            ));
        }
        if self.burst() == 0 {
            return Err(Error::config(option("burst"), "must be at least 1, got 0"));
        }
        let capacity = u128::from(self.burst()) * u128::from(self.per_ms());
        if capacity > u128::from(MAX_CAPACITY_TOKEN_MS) {
            return Err(Error::config(
                option("burst"),
                format!(
                    "burst × per must be at most 2^53 token·ms, got {} × {} ms",
                    self.burst(),
                    self.per_ms()
                ),
            ));
        }
        Ok(())
    }
}

/// What a [`BudgetStore`](super::BudgetStore) needs to run a budget's token bucket: `requests`
/// tokens refill every `per_ms` milliseconds, up to `burst` tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BucketPolicy {
    /// Tokens refilled every `per_ms` (at least 1).
    pub requests: u64,
    /// The refill period in milliseconds (at least 1).
    pub per_ms: u64,
    /// The bucket's capacity in tokens (at least 1).
    pub burst: u64,
}

impl BucketPolicy {
    /// Checks the numbers for budget `name` (a store calls this before counting, so a bad policy
    /// is a `Config` error rather than a division by zero).
    pub fn validate(&self, name: &str) -> Result<()> {
        for (option, value) in [
            ("requests", self.requests),
            ("per", self.per_ms),
            ("burst", self.burst),
        ] {
            if value == 0 {
                return Err(Error::config(
                    format!("budgets.{name}.{option}"),
                    "must be at least 1, got 0",
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_burst_to_requests() {
        let policy = BudgetPolicy::new(10, Duration::from_secs(1));
        assert_eq!(policy.burst(), 10);
        assert_eq!(policy.fairness, Fairness::RoundRobin);
        assert_eq!(
            policy.with_burst(3).bucket(),
            BucketPolicy {
                requests: 10,
                per_ms: 1000,
                burst: 3
            }
        );
        policy.validate("api").unwrap();
    }

    #[test]
    fn validation_names_the_option() {
        let ok = BudgetPolicy::new(2, Duration::from_secs(10));
        let cases = [
            (BudgetPolicy { requests: 0, ..ok }, "budgets.gh.requests"),
            (
                BudgetPolicy {
                    per: Duration::ZERO,
                    ..ok
                },
                "budgets.gh.per",
            ),
            (
                BudgetPolicy {
                    per: Duration::from_micros(500),
                    ..ok
                },
                "budgets.gh.per",
            ),
            (ok.with_burst(0), "budgets.gh.burst"),
            (ok.with_burst(1 << 53), "budgets.gh.burst"),
        ];
        for (policy, expected) in cases {
            let err = policy.validate("gh").unwrap_err();
            assert_eq!(err.config_option(), Some(expected), "{policy:?}");
        }
        let bucket = BucketPolicy {
            requests: 1,
            per_ms: 0,
            burst: 1,
        };
        assert_eq!(
            bucket.validate("gh").unwrap_err().config_option(),
            Some("budgets.gh.per")
        );
    }
}
