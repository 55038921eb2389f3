//! Library code shared by the watukuy examples (the programs are in `src/bin/`).
//!
//! - [`custom_store`]: the template for writing your own store — a wrapper that delegates every
//!   [`Store`](watukuy_core::store::Store) method, tested with `watukuy_conformance::store_tests!` in
//!   `tests/custom_store.rs`.
//! - [`erp`]: the quickstart's order book (an HTTP "ERP" changing by itself) and its poller,
//!   shared by the `quickstart` and `kafka` examples.
//! - [`reconcile`]: the `reconcile` example's catalog API, poller and scripted scenario (a live
//!   lane plus a reconcile lane finding deletes), tested by `tests/reconcile.rs`.
//! - [`shutdown`]: stopping cleanly on Ctrl-C or SIGTERM, shared by every long-running example.

pub mod custom_store;
pub mod erp;
pub mod reconcile;
pub mod shutdown;
