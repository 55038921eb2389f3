//! The whole conformance suite on a `SqliteStore` over a database file: a new file per case,
//! once with the default durability (`Synchronous::Full`, `conformance::*`) and once with
//! `Synchronous::Normal` (`normal::conformance::*`). The level changes only what a power loss
//! may undo, so every case must pass with both.

use std::path::PathBuf;
use std::sync::Arc;

use watukuy_conformance::{CaseContext, CaseError, CaseResult, Fresh, Harness, RawWrite};
use watukuy_store_sqlite::{SqliteOptions, SqliteStore, Synchronous};

/// A fresh, migrated store on a new file in its own temporary directory per case. The directory
/// is removed only when the case passed, so a failing case leaves its database behind (the path
/// is printed with the case's output).
struct FileHarness {
    /// The durability level of every store this harness opens.
    synchronous: Synchronous,
}

#[async_trait::async_trait]
impl Harness for FileHarness {
    fn name(&self) -> String {
        match self.synchronous {
            Synchronous::Full => "sqlite-file".to_owned(),
            level => format!("sqlite-file-{level}"),
        }
    }

    async fn fresh(&self, ctx: CaseContext) -> Result<Fresh, CaseError> {
        let dir: PathBuf = tempfile::Builder::new()
            .prefix(&format!("watukuy-sqlite-{}-{}-", ctx.module, ctx.name))
            .tempdir()
            .map_err(|e| CaseError::failed(format!("cannot create a temporary directory: {e}")))?
            .keep();
        let path = dir.join("watukuy.db");
        eprintln!(
            "[{}] {}::{} uses {}",
            self.name(),
            ctx.module,
            ctx.name,
            path.display()
        );
        let options = SqliteOptions::file(&path).synchronous(self.synchronous);
        let store = SqliteStore::open(options.clone())?;
        store.migrate().await?;
        // The level asked for is the level SQLite applies, or every case below proves nothing
        // about it.
        let applied = store.synchronous_in_effect().await?;
        if applied != self.synchronous {
            return Err(CaseError::failed(format!(
                "asked for synchronous = {}, SQLite applies {applied}",
                self.synchronous
            )));
        }
        let store = Arc::new(store);
        let cleanup = Arc::clone(&store);
        let (raw_path, new_path) = (path.clone(), dir.join("unmigrated.db"));
        let synchronous = self.synchronous;
        Ok(Fresh::new(store)
            .with_cleanup(async move {
                // Best effort: a leftover temporary directory is harmless.
                let _ = cleanup.close().await;
                let _ = std::fs::remove_dir_all(&dir);
            })
            // Another store opening the same file, as a second process would.
            .with_instances(move || {
                let options = options.clone();
                async move {
                    Ok(Arc::new(SqliteStore::open(options)?)
                        as Arc<dyn watukuy_core::store::Store>)
                }
            })
            // Stores on a file nobody has created yet, in the case's directory.
            .with_unmigrated(move || {
                let options = SqliteOptions::file(&new_path).synchronous(synchronous);
                async move {
                    Ok(Arc::new(SqliteStore::open(options)?)
                        as Arc<dyn watukuy_core::store::Store>)
                }
            })
            .with_raw_writes(move |raw| {
                let path = raw_path.clone();
                async move { raw_write(&path, &raw) }
            }))
    }
}

/// Writes `raw` into the file with SQLite itself, over every row of the case's own database.
fn raw_write(path: &std::path::Path, raw: &RawWrite) -> CaseResult {
    let sql = match raw {
        RawWrite::State(_) => "UPDATE watukuy_pollers SET state = '{\"lanes\": oops'".to_owned(),
        RawWrite::Items(_) => "UPDATE watukuy_items SET payload = '{\"half\":'".to_owned(),
        RawWrite::Pending(_) => "UPDATE watukuy_outbox SET event = '[1, 2'".to_owned(),
        RawWrite::SchemaVersion(version) => {
            format!("INSERT INTO watukuy_schema_version (version) VALUES ({version})")
        }
        other => return Err(CaseError::skipped(format!("{other:?} is not written here"))),
    };
    let conn = rusqlite::Connection::open(path)
        .map_err(|e| CaseError::failed(format!("open {}: {e}", path.display())))?;
    conn.execute_batch(&sql)
        .map_err(|e| CaseError::failed(format!("{sql}: {e}")))
}

watukuy_conformance::store_tests!(FileHarness {
    synchronous: Synchronous::Full,
});

/// The same suite with `Synchronous::Normal`.
mod normal {
    use super::*;

    watukuy_conformance::store_tests!(FileHarness {
        synchronous: Synchronous::Normal,
    });
}
