//! The whole conformance suite on a `SqliteStore` over a private in-memory database.

use std::sync::Arc;

use watukuy_conformance::{CaseContext, CaseError, Fresh, Harness};
use watukuy_store_sqlite::{SqliteOptions, SqliteStore};

/// A fresh, migrated in-memory store per case (the database goes with the store).
struct MemoryHarness;

#[async_trait::async_trait]
impl Harness for MemoryHarness {
    fn name(&self) -> String {
        "sqlite-memory".to_owned()
    }

    async fn fresh(&self, _ctx: CaseContext) -> Result<Fresh, CaseError> {
        let store = SqliteStore::open(SqliteOptions::in_memory())?;
        store.migrate().await?;
        Ok(Fresh::new(Arc::new(store)))
    }
}

watukuy_conformance::store_tests!(MemoryHarness);
