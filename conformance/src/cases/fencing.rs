//! Conformance cases: `fencing`.
#![allow(missing_docs)]
use crate::harness::{CaseError, CaseResult, Env};

pub async fn save_state_rejects_stale_lease(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn commit_poll_rejects_stale_lease(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn ack_events_rejects_stale_lease(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn record_attempt_rejects_stale_lease(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn park_event_rejects_stale_lease(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn set_validator_rejects_stale_lease(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn fenced_writes_without_lease_are_rejected(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn released_lease_fails_fence(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn lease_lost_carries_key_and_epoch(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}
