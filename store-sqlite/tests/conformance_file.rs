//! The whole conformance suite on a `SqliteStore` over a database file: a new file per case.

use std::path::PathBuf;
use std::sync::Arc;

use watukuy_conformance::{CaseContext, CaseError, Fresh, Harness};
use watukuy_core::Store;
use watukuy_store_sqlite::{SqliteOptions, SqliteStore};

/// A fresh, migrated store on a new file in its own temporary directory per case. The directory
/// is removed only when the case passed, so a failing case leaves its database behind (the path
/// is printed with the case's output).
struct FileHarness;

#[async_trait::async_trait]
impl Harness for FileHarness {
    fn name(&self) -> String {
        "sqlite-file".to_owned()
    }

    async fn fresh(&self, ctx: CaseContext) -> Result<Fresh, CaseError> {
        let dir: PathBuf = tempfile::Builder::new()
            .prefix(&format!("watukuy-sqlite-{}-{}-", ctx.module, ctx.name))
            .tempdir()
            .map_err(|e| CaseError::failed(format!("cannot create a temporary directory: {e}")))?
            .keep();
        let path = dir.join("watukuy.db");
        eprintln!(
            "[sqlite-file] {}::{} uses {}",
            ctx.module,
            ctx.name,
            path.display()
        );
        let store = SqliteStore::open(SqliteOptions::file(&path))?;
        store.migrate().await?;
        let store = Arc::new(store);
        let cleanup = Arc::clone(&store);
        Ok(Fresh::new(store).with_cleanup(async move {
            // Best effort: a leftover temporary directory is harmless.
            let _ = cleanup.close().await;
            let _ = std::fs::remove_dir_all(&dir);
        }))
    }
}

watukuy_conformance::store_tests!(FileHarness);
