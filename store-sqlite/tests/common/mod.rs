//! Helpers shared by the SQLite store's test files.

/// A temporary directory for a test's database files, removed when it is dropped.
pub(crate) fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("watukuy-sqlite-test-")
        .tempdir()
        .expect("a temporary directory")
}

/// The path of a database file `name` in a new temporary directory, and the directory (which
/// takes the file with it when dropped).
pub(crate) fn temp_db(name: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = temp_dir();
    let path = dir.path().join(name);
    (dir, path)
}
