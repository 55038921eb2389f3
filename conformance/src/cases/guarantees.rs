//! Conformance cases: `guarantees`.
#![allow(missing_docs)]
use crate::harness::{CaseError, CaseResult, Env};

pub async fn g1_interrupted_delivery_is_redelivered_with_same_id(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn g1_failing_handler_is_retried(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn g2_redelivery_carries_the_same_id_and_payload(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn g3_per_key_order_under_concurrency_and_failures(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn g7_poison_key_does_not_block_others(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn g7_retry_delivers_poison_then_successors_in_order(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn g7_discard_releases_the_key(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn g10_subscribe_never_pulls_more_than_asked(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn g10_dispatcher_holds_at_most_one_slice(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}
