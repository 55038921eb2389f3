//! Rows another program wrote into a SQLite store's file: whatever lands in its columns, every read
//! of the store answers decoded data or a permanent `Corrupt` error, never a panic and never
//! another kind of error.
//!
//! The input is lines `table.column=kind:value`, each a write into the first row of a table of a
//! store holding one of everything (`populate_one_of_everything`): `kind` is `null`, `int`,
//! `real`, `text` or `hex` (bytes). A write the file refuses (a constraint) is left out; a line of
//! another form is ignored.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use rusqlite::types::Value;
use watukuy_conformance::cases::fixtures::{populate_one_of_everything, read_everything};
use watukuy_fuzz::block_on;
use watukuy_store_sqlite::{SqliteOptions, SqliteStore};

/// A folder for this process, with `template.db`: a migrated store holding one of everything,
/// its journal folded into the file.
static TEMPLATE: LazyLock<(tempfile::TempDir, PathBuf)> = LazyLock::new(|| {
    let dir = tempfile::tempdir().expect("a scratch folder");
    let path = dir.path().join("template.db");
    block_on(async {
        let store = SqliteStore::open(SqliteOptions::file(&path)).expect("valid options");
        store.migrate().await.expect("migrate");
        populate_one_of_everything(&store).await.expect("populate");
        store.close().await.expect("close");
    });
    rusqlite::Connection::open(&path)
        .and_then(|c| {
            c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE); PRAGMA journal_mode=DELETE;")
        })
        .expect("a template without a journal");
    (dir, path)
});

/// One write: `table.column=kind:value`.
fn write(line: &str) -> Option<(&str, &str, Value)> {
    let (target, value) = line.split_once('=')?;
    let (table, column) = target.split_once('.')?;
    let (kind, text) = value.split_once(':')?;
    let value = match kind {
        "null" => Value::Null,
        "int" => Value::Integer(text.trim().parse().ok()?),
        "real" => Value::Real(text.trim().parse().ok()?),
        "text" => Value::Text(text.to_owned()),
        "hex" => Value::Blob(hex(text)?),
        _ => return None,
    };
    Some((table, column, value))
}

fn hex(text: &str) -> Option<Vec<u8>> {
    let digits = text.trim().as_bytes();
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
        .collect()
}

/// Names as SQLite quotes them: letters, digits and `_` only, so no write reaches past its table.
fn plain(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn damage(path: &Path, text: &str) {
    let conn = rusqlite::Connection::open(path).expect("the copy opens");
    for (table, column, value) in text.lines().filter_map(write) {
        if !plain(table) || !plain(column) {
            continue;
        }
        let sql = format!(
            "UPDATE watukuy_{table} SET \"{column}\" = ?1 \
             WHERE rowid = (SELECT min(rowid) FROM watukuy_{table})"
        );
        // No such table or column, or a constraint refused it: nothing foreign was written.
        let _ = conn.execute(&sql, [&value]);
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (dir, template) = &*TEMPLATE;
    let path = dir.path().join("case.db");
    // The last case's journal must not be read into this one.
    for journal in ["case.db-wal", "case.db-shm"] {
        let _ = std::fs::remove_file(dir.path().join(journal));
    }
    std::fs::copy(template, &path).expect("a copy of the template");
    damage(&path, text);
    block_on(async {
        let store = SqliteStore::open(SqliteOptions::file(&path)).expect("valid options");
        if let Err(error) = read_everything(&store).await {
            panic!("{error}\nafter {text:?}");
        }
        let _ = store.close().await;
    });
});
