//! Conformance cases: `log`.
#![allow(missing_docs)]
use crate::harness::{CaseError, CaseResult, Env};

pub async fn read_log_after_sequence(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn read_log_time_range_and_limit(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn prune_log_strictly_older(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}
