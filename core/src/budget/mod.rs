//! Rate budgets (guarantee G6): token buckets that keep every poller sharing an API
//! within its rate limit.
//!
//! - [`BudgetPolicy`] says what a budget allows (`requests` per `per`, `burst`, [`Fairness`],
//!   `max_wait`); [`BucketPolicy`] is the part a store needs.
//! - [`BudgetStore`] is where buckets live: [`MemoryBudgetStore`] in this process, a Redis store
//!   across processes. Every store counts with the same exact integer arithmetic,
//!   spelled out (and implemented) by [`BucketState`].
//! - The engine queues its pollers' requests per budget, by lane, then fairness, then arrival,
//!   with one timer per budget; a fetch takes its tokens through
//!   [`FetchContext::charge_budget`](crate::FetchContext::charge_budget).
//!
//! A [`BudgetTimeout`](crate::Error::BudgetTimeout) is a deferral, not a failure: it counts
//! towards neither the backoff nor the circuit, and the engine reschedules the key for when the
//! budget has tokens again.

mod manager;
mod policy;
mod store;

#[cfg(test)]
use manager::Grant;
pub(crate) use manager::{BudgetManager, Request};
pub use policy::{BucketPolicy, BudgetPolicy, Fairness, MAX_CAPACITY_TOKEN_MS};
pub use store::{BucketState, BudgetStore, MemoryBudgetStore, Take};

#[cfg(test)]
mod tests;
