//! Conformance cases: `isolation`.
#![allow(missing_docs)]
use crate::harness::{CaseError, CaseResult, Env};

pub async fn partitions_are_isolated(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn pollers_are_isolated(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}
