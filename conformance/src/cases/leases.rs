//! Conformance cases: `leases`.
#![allow(missing_docs)]
use crate::harness::{CaseError, CaseResult, Env};

pub async fn acquire_on_empty_key_returns_epoch_1(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn other_owner_cannot_acquire_valid_lease(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn same_owner_reacquire_bumps_epoch(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn expired_lease_is_stolen_with_next_epoch(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn renew_succeeds_for_current_epoch_only(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn release_then_acquire_keeps_epoch_monotonic(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn release_with_stale_lease_is_noop(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn get_lease_is_none_then_holder(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}
