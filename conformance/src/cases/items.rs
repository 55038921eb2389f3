//! Conformance cases: `items`.
#![allow(missing_docs)]
use crate::harness::{CaseError, CaseResult, Env};

pub async fn load_versions_returns_present_rows(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn upserts_replace_and_deletes_remove(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn stream_identities_batches(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}

pub async fn count_items_counts_snapshot(_env: Env) -> CaseResult {
    Err(CaseError::failed("not written yet"))
}
