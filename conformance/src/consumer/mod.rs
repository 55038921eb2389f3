//! The consumer suite: the rules of [`ConsumerStore`](watukuy_core::delivery::ConsumerStore)
//! checked against a real database, for every consumer store (`consumer_tests!`).

mod harness;

pub use harness::{ConnOf, ConsumerDb, ConsumerHarness, ModelRow, TxOf};
