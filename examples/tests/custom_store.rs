//! The whole conformance suite on the example [`CountingStore`] (over a `MemoryStore`): the
//! template for testing a store of your own.
//!
//! Run it with `cargo test -p watukuy-examples --test custom_store`.

use std::sync::Arc;

use watukuy_conformance::{CaseContext, CaseError, Fresh, Harness};
use watukuy_examples::custom_store::CountingStore;
use watukuy_store_memory::MemoryStore;

/// A new, empty, migrated store per case.
struct CountingHarness;

#[async_trait::async_trait]
impl Harness for CountingHarness {
    fn name(&self) -> String {
        "counting-memory".to_owned()
    }

    async fn fresh(&self, _ctx: CaseContext) -> Result<Fresh, CaseError> {
        let store = CountingStore::new(Arc::new(MemoryStore::new()));
        watukuy_core::store::Store::migrate(&store)
            .await
            .map_err(|e| CaseError::failed(format!("migrate: {e}")))?;
        Ok(Fresh::new(Arc::new(store)))
    }
}

watukuy_conformance::store_tests!(CountingHarness);
