//! A SQLite store written by the last release (v1, commit 47ad676) is carried forward by
//! today's code: `migrate` succeeds (twice), everything v1 wrote reads back as v1 read it, and
//! today's engine delivers the events v1 left pending.
//!
//! The fixture `fixtures/v1.sqlite` and what v1 read back from it, `fixtures/v1.expected.json`,
//! were produced as `fixtures/README.md` describes. Each run works on a temporary copy.

mod v1_checks;

use std::path::Path;
use std::sync::Arc;

use watukuy_store_sqlite::{SqliteOptions, SqliteStore};

/// The v1 database file, as the v1 writer left it (vacuumed, rollback journal).
const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/v1.sqlite");
/// What the v1 code read back from it.
const EXPECTED: &str = include_str!("fixtures/v1.expected.json");

/// Copies the v1 fixture to `dir` and opens the copy with today's store.
fn v1_copy_in(dir: &Path) -> SqliteStore {
    let path = dir.join("v1.sqlite");
    std::fs::copy(FIXTURE, &path).expect("copy the v1 fixture");
    SqliteStore::open(SqliteOptions::file(&path)).expect("valid options")
}

/// The v1 file migrates, reads back whole and its pending events are delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v1_sqlite_store_is_migrated_read_and_delivered() {
    let dir = tempfile::Builder::new()
        .prefix("watukuy-sqlite-v1-")
        .tempdir()
        .expect("a temporary directory");
    let store = Arc::new(v1_copy_in(dir.path()));
    v1_checks::upgrade_and_check(store.clone(), "sqlite", EXPECTED).await;
    watukuy_core::store::Store::close(&*store)
        .await
        .expect("close the store");
}
