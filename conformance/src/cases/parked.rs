//! Conformance cases: `parked`.
#![allow(missing_docs)]
use crate::harness::{CaseError, CaseResult, Env};

pub async fn park_event_removes_outbox_row_and_holds(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn list_parked_filters_orders_limits(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn count_parked_counts_every_kind(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn retry_parked_moves_poison_back(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn discard_parked_returns_count(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}
