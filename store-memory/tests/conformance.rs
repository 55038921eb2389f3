//! The whole conformance suite on [`MemoryStore`].

use std::sync::Arc;

use watukuy_conformance::{CaseContext, CaseError, Fresh, Harness};
use watukuy_store_memory::MemoryStore;

/// A new, empty `MemoryStore` per case.
struct MemoryHarness;

#[async_trait::async_trait]
impl Harness for MemoryHarness {
    fn name(&self) -> String {
        "memory".to_owned()
    }

    async fn fresh(&self, _ctx: CaseContext) -> Result<Fresh, CaseError> {
        Ok(Fresh::new(Arc::new(MemoryStore::new())))
    }
}

watukuy_conformance::store_tests!(MemoryHarness);
