//! Rate budgets (guarantee G6): token buckets that keep every poller sharing an API
//! within its rate limit.
//!
//! - [`BudgetPolicy`] says what a budget allows (`requests` per `per`, `burst`, [`Fairness`],
//!   `max_wait`); [`BucketPolicy`] is the part a store needs.
//! - [`BudgetStore`] is where buckets live: [`MemoryBudgetStore`] in this process, a Redis store
//!   across processes. Every store counts with the same exact integer arithmetic,
//!   spelled out (and implemented) by [`BucketState`].
//! - [`BudgetManager`] queues the requests of an engine's pollers per budget, by lane, then
//!   fairness, then arrival, with one timer per budget.
//!
//! A [`BudgetTimeout`](crate::Error::BudgetTimeout) is a deferral, not a failure: it counts
//! towards neither the backoff nor the circuit, and the caller reschedules the key, e.g. after
//! [`BudgetManager::ready_in_ms`].

mod manager;
mod policy;
mod store;

pub use manager::{BudgetManager, Grant, Request};
pub use policy::{BucketPolicy, BudgetPolicy, Fairness, MAX_CAPACITY_TOKEN_MS};
pub use store::{BucketState, BudgetStore, MemoryBudgetStore, Take};

#[cfg(test)]
mod tests;
