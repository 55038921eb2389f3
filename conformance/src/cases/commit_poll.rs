//! Conformance cases: `commit_poll`.
#![allow(missing_docs)]
use crate::harness::{CaseError, CaseResult, Env};

pub async fn applies_everything_together(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn appends_log_only_when_asked(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn recommitting_event_overwrites_row(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn empty_batch_applies_patch(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}
