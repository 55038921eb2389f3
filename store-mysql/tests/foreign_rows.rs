//! Rows another program wrote into the store's tables, any value in any column: every read of
//! the store answers with what it can decode or a permanent `Corrupt` error, never a panic and
//! never another kind of error (the MySQL / MariaDB side of `store-sqlite/tests/foreign_rows.rs`).
//!
//! The columns are the catalog's: every column of every table in the test's database but the
//! schema version's, so a column a later migration adds is covered. A case sends one row of one
//! column bytes the server converts to the column's type: integers at the edges for the integer
//! columns; for the VARBINARY and LONGBLOB ones any bytes (not UTF-8 included), JSON at the edges,
//! and the stored JSON with one value changed (`fixtures::json_mutant`). A value the server
//! refuses (strict mode: out of range, not a number, NULL in a NOT NULL column, too long) is no
//! foreign data: the case is discarded. One database serves the run; every case empties it and
//! writes one of everything again.

mod common;

use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use watukuy_conformance::cases::fixtures::{
    EDGE_INTEGERS, edge_json, json_mutant, populate_one_of_everything, read_everything,
};
use watukuy_conformance::{CaseError, OrFail};
use watukuy_store_mysql::{MySqlOptions, MySqlStore};

use common::{Database, with_database};

/// `table`.`column`, and the column's type as the catalog spells it (`bigint`, `int`,
/// `tinyint`, `varbinary`, `longblob`).
#[derive(Clone, Debug)]
struct Cell {
    table: String,
    column: String,
    data_type: String,
}

/// The bytes a case sends.
#[derive(Clone, Debug)]
enum Bytes {
    /// These (`None`: NULL).
    Raw(Option<Vec<u8>>),
    /// The stored JSON with one value replaced or removed (see `fixtures::json_mutant`).
    NearJson {
        at: usize,
        replacement: Option<String>,
    },
}

/// The store's columns in `database`: every table's but the schema version's.
async fn cells(database: &Database) -> Result<Vec<Cell>, CaseError> {
    let rows: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT TABLE_NAME, COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS \
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME NOT LIKE '%schema_version' \
         ORDER BY TABLE_NAME, ORDINAL_POSITION",
    )
    .fetch_all(&database.pool)
    .await
    .or_fail_with("read information_schema")?;
    match rows.len() {
        0..6 => Err(CaseError::failed(format!(
            "information_schema lists only {rows:?} in {}",
            database.name
        ))),
        _ => Ok(rows
            .into_iter()
            .map(|(table, column, data_type)| Cell {
                table,
                column,
                data_type,
            })
            .collect()),
    }
}

/// A cell and the bytes a case sends into it.
fn foreign_bytes(cells: Vec<Cell>) -> impl Strategy<Value = (Cell, Bytes)> {
    select(cells).prop_flat_map(|cell| {
        let raw = if cell.data_type.ends_with("int") {
            prop_oneof![select(EDGE_INTEGERS), -129_i64..=256]
                .prop_map(|n| n.to_string().into_bytes())
                .boxed()
        } else {
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..24),
                select(edge_json()).prop_map(String::into_bytes),
                "\\PC{0,16}".prop_map(String::into_bytes),
                Just(b"invalid".to_vec()),
            ]
            .boxed()
        };
        let raw = prop_oneof![
            1 => Just(Bytes::Raw(None)),
            4 => raw.prop_map(|bytes| Bytes::Raw(Some(bytes))),
        ];
        let bytes = if cell.data_type == "longblob" {
            let near = (any::<usize>(), proptest::option::of(select(edge_json())))
                .prop_map(|(at, replacement)| Bytes::NearJson { at, replacement });
            prop_oneof![raw, near].boxed()
        } else {
            raw.boxed()
        };
        (Just(cell), bytes)
    })
}

/// Sends `bytes` into `cell` of one row with SQL of the test's own. `false`: the server refused
/// them, or the stored value was no JSON to change.
async fn send(database: &Database, cell: &Cell, bytes: &Bytes) -> Result<bool, CaseError> {
    let Cell { table, column, .. } = cell;
    let value = match bytes {
        Bytes::Raw(value) => value.clone(),
        Bytes::NearJson { at, replacement } => {
            let stored: Option<Vec<u8>> =
                sqlx::query_scalar(&format!("SELECT `{column}` FROM `{table}` LIMIT 1"))
                    .fetch_one(&database.pool)
                    .await
                    .or_fail_with(format!("read {table}.{column}"))?;
            let near = stored
                .and_then(|stored| String::from_utf8(stored).ok())
                .and_then(|json| json_mutant(&json, *at, replacement.as_deref()));
            let Some(near) = near else {
                return Ok(false);
            };
            Some(near.into_bytes())
        }
    };
    let sql = format!("UPDATE `{table}` SET `{column}` = ? LIMIT 1");
    let sent = sqlx::query(&sql).bind(value).execute(&database.pool).await;
    match sent {
        Ok(_) => Ok(true),
        Err(sqlx::Error::Database(_)) => Ok(false),
        Err(other) => Err(CaseError::failed(format!("{sql}: {other}"))),
    }
}

/// One case: every table emptied, one of everything written again, the foreign bytes sent,
/// every read checked.
async fn check(
    database: &Database,
    store: &MySqlStore,
    tables: &[String],
    input: (Cell, Bytes),
) -> Result<(), TestCaseError> {
    let (cell, bytes) = input;
    let sent = async {
        for table in tables {
            let sql = format!("DELETE FROM `{table}`");
            sqlx::query(&sql)
                .execute(&database.pool)
                .await
                .or_fail_with(&sql)?;
        }
        populate_one_of_everything(store).await?;
        send(database, &cell, &bytes).await
    }
    .await
    .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assume!(sent, "the server refused the bytes");
    read_everything(store).await.map_err(TestCaseError::fail)
}

#[watukuy_testenv::requires(mysql)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_bytes_in_any_column_are_read_or_corrupt() {
    with_database("foreign_rows", 2, |database| async move {
        let store = database.store(MySqlOptions::default()).await?;
        let cells = cells(&database).await?;
        let mut tables: Vec<String> = cells.iter().map(|cell| cell.table.clone()).collect();
        tables.dedup();
        let strategy = foreign_bytes(cells);
        let handle = tokio::runtime::Handle::current();
        let mut runner = TestRunner::new(Config {
            source_file: Some(file!()),
            ..Config::with_cases(64)
        });
        // The runner calls back synchronously: each case blocks this thread on the runtime.
        tokio::task::block_in_place(|| {
            runner
                .run(&strategy, |input| {
                    handle.block_on(check(&database, &store, &tables, input))
                })
                .or_fail()
        })
    })
    .await;
}
