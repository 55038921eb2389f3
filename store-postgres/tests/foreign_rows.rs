//! Rows another program wrote into the store's tables, any value in any column: every read of
//! the store answers with what it can decode or a permanent `Corrupt` error, never a panic and
//! never another kind of error (the PostgreSQL side of `store-sqlite/tests/foreign_rows.rs`).
//!
//! The columns are the catalog's: every column of every table of the store's schema but the
//! schema version's, so a column a later migration adds is covered. A case writes one value, as
//! text the column's type parses, into one row: a SQL value at the edges of the type, text, or
//! the stored JSON with one value changed (`fixtures::json_mutant`). A value the type or a
//! constraint refuses is no foreign data: the case is discarded. One schema serves the run;
//! every case empties it and writes one of everything again.

mod common;

use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use watukuy_conformance::cases::fixtures::{
    EDGE_INTEGERS, edge_json, json_mutant, populate_one_of_everything, read_everything,
};
use watukuy_conformance::{CaseError, OrFail};
use watukuy_store_postgres::{PostgresOptions, PostgresStore};

use common::{Schema, with_schema};

/// A column of one of the store's tables.
#[derive(Clone, Debug)]
struct Column {
    table: String,
    name: String,
    /// Its type as the catalog spells it (`bigint`, `boolean`, `json`, `text`).
    data_type: String,
}

/// What a case writes into its column.
#[derive(Clone, Debug)]
enum Write {
    /// This text, parsed by the column's type (`None`: NULL).
    Value(Option<String>),
    /// The stored JSON with one value replaced or removed (see `fixtures::json_mutant`).
    Mutant {
        at: usize,
        replacement: Option<String>,
    },
}

/// Every column of the store's tables in `schema` but the schema version's.
async fn columns(schema: &Schema) -> Result<Vec<Column>, CaseError> {
    let rows: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT table_name::text, column_name::text, data_type::text \
         FROM information_schema.columns \
         WHERE table_schema = $1 AND table_name NOT LIKE '%schema_version' \
         ORDER BY table_name, ordinal_position",
    )
    .bind(&schema.name)
    .fetch_all(&schema.pool)
    .await
    .or_fail_with("read the catalog")?;
    if rows.len() < 6 {
        return Err(CaseError::failed(format!(
            "the catalog lists only {rows:?} in {schema}"
        )));
    }
    Ok(rows
        .into_iter()
        .map(|(table, name, data_type)| Column {
            table,
            name,
            data_type,
        })
        .collect())
}

/// A column and what to write into it: values of its type, at the edges, and for JSON columns
/// near misses of what the store wrote.
fn column_write(columns: Vec<Column>) -> impl Strategy<Value = (Column, Write)> {
    select(columns).prop_flat_map(|column| {
        let text = prop_oneof![
            select(edge_json()),
            "\\PC{0,16}",
            "[\\[\\]{}\":,0-9a-z ]{0,24}",
            Just("invalid".to_owned()),
        ];
        let value = match column.data_type.as_str() {
            "bigint" | "integer" => prop_oneof![select(EDGE_INTEGERS), any::<i64>()]
                .prop_map(|n| n.to_string())
                .boxed(),
            "boolean" => any::<bool>().prop_map(|b| b.to_string()).boxed(),
            _ => text.boxed(),
        };
        let write = prop_oneof![
            1 => Just(Write::Value(None)),
            4 => value.prop_map(|v| Write::Value(Some(v))),
        ];
        let write = if column.data_type == "json" {
            let mutant = (any::<usize>(), proptest::option::of(select(edge_json())))
                .prop_map(|(at, replacement)| Write::Mutant { at, replacement });
            prop_oneof![1 => write, 2 => mutant].boxed()
        } else {
            write.boxed()
        };
        (Just(column), write)
    })
}

/// Writes `write` into `column` of one row with SQL of the test's own. `false`: the column's
/// type or a constraint refused it, or there was no JSON to change.
async fn write_foreign(schema: &Schema, column: &Column, write: &Write) -> Result<bool, CaseError> {
    let table = format!("\"{schema}\".\"{}\"", column.table);
    let name = &column.name;
    let (row, stored): (String, Option<String>) = sqlx::query_as(&format!(
        "SELECT ctid::text, \"{name}\"::text FROM {table} LIMIT 1"
    ))
    .fetch_one(&schema.pool)
    .await
    .or_fail_with(format!("read {table}.{name}"))?;
    let value = match write {
        Write::Value(value) => value.clone(),
        Write::Mutant { at, replacement } => {
            match stored.and_then(|json| json_mutant(&json, *at, replacement.as_deref())) {
                Some(mutant) => Some(mutant),
                None => return Ok(false),
            }
        }
    };
    let sql = format!(
        "UPDATE {table} SET \"{name}\" = $1::text::{} WHERE ctid = $2::tid",
        column.data_type
    );
    match sqlx::query(&sql)
        .bind(value)
        .bind(row)
        .execute(&schema.pool)
        .await
    {
        Ok(_) => Ok(true),
        Err(sqlx::Error::Database(_)) => Ok(false),
        Err(other) => Err(CaseError::failed(format!("{sql}: {other}"))),
    }
}

/// One case: the schema emptied and populated again, the foreign write, every read.
async fn case(
    schema: &Schema,
    store: &PostgresStore,
    tables: &str,
    (column, write): (Column, Write),
) -> Result<(), TestCaseError> {
    let prepared = async {
        sqlx::query(&format!("TRUNCATE {tables}"))
            .execute(&schema.pool)
            .await
            .or_fail_with("empty the tables")?;
        populate_one_of_everything(store).await?;
        write_foreign(schema, &column, &write).await
    };
    let written = prepared
        .await
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assume!(written, "the column refused the value");
    read_everything(store).await.map_err(TestCaseError::fail)
}

#[watukuy_testenv::requires(postgres, or_cfg(feature = "testcontainers"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_value_in_any_column_is_read_or_corrupt() {
    with_schema("foreign_rows", 2, |schema| async move {
        let store = schema.store(PostgresOptions::default()).await?;
        let columns = columns(&schema).await?;
        let mut tables: Vec<String> = columns
            .iter()
            .map(|c| format!("\"{schema}\".\"{}\"", c.table))
            .collect();
        tables.dedup();
        let tables = tables.join(", ");
        let runtime = tokio::runtime::Handle::current();
        let mut runner = TestRunner::new(Config {
            source_file: Some(file!()),
            ..Config::with_cases(64)
        });
        // The runner is synchronous: each case blocks this worker on the runtime's handle.
        tokio::task::block_in_place(|| {
            let strategy = column_write(columns);
            let outcome = runner.run(&strategy, |input| {
                runtime.block_on(case(&schema, &store, &tables, input))
            });
            outcome.or_fail()
        })
    })
    .await;
}
