//! Conformance cases: `outbox`.
#![allow(missing_docs)]
use crate::harness::{CaseError, CaseResult, Env};

pub async fn load_pending_orders_by_sequence(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn count_pending_counts_pending_only(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn ack_removes_rows_ignores_unknown(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn record_attempt_updates_row(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}
