//! Conformance cases: `validators`.
#![allow(missing_docs)]
use crate::harness::{CaseError, CaseResult, Env};

pub async fn validators_round_trip(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}
