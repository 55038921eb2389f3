//! The cases, one module per group. Each case is a plain `pub async fn(Env) -> CaseResult` whose
//! doc names the `Store` contract bullet (or the guarantee) it proves.

pub mod fixtures;

pub mod chaos;
pub mod claims;
pub mod commit_poll;
pub mod engine;
pub mod fencing;
pub mod full_scans;
pub mod guarantees;
pub mod isolation;
pub mod items;
pub mod lanes;
pub mod leases;
pub mod log;
pub mod outbox;
pub mod parked;
pub mod setup;
pub mod state;
pub mod validators;
