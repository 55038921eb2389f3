//! A PostgreSQL store written by the last release (v1, commit 47ad676) is carried forward by
//! today's code: `migrate` succeeds (twice), everything v1 wrote reads back as v1 read it, and
//! today's engine delivers the events v1 left pending.
//!
//! `fixtures/v1.sql` is the `pg_dump` of the schema the v1 writer filled, with the schema's name
//! replaced by [`SCHEMA_PLACEHOLDER`]; `fixtures/v1.expected.json` is what the v1 code read back
//! from it. Both were produced as `store-sqlite/tests/fixtures/README.md` describes. Each run
//! loads the dump into a fresh schema.

mod common;
#[path = "../../store-sqlite/tests/v1_checks/mod.rs"]
mod v1_checks;

use std::sync::Arc;

use sqlx::Connection;
use watukuy_conformance::CaseError;
use watukuy_store_postgres::PostgresOptions;

/// The v1 schema, dumped as SQL.
const FIXTURE: &str = include_str!("fixtures/v1.sql");
/// What the v1 code read back from it.
const EXPECTED: &str = include_str!("fixtures/v1.expected.json");
/// The schema name in [`FIXTURE`], replaced by the test's own.
const SCHEMA_PLACEHOLDER: &str = "__WATUKUY_V1_SCHEMA__";

/// Loads the v1 dump into the new schema `schema` on a connection of its own (the dump sets the
/// session's `search_path`, which must not leak into a pooled connection).
async fn load_v1(url: &str, schema: &str) -> Result<(), CaseError> {
    let sql = FIXTURE.replace(SCHEMA_PLACEHOLDER, schema);
    let mut conn = sqlx::PgConnection::connect(url)
        .await
        .map_err(|e| CaseError::failed(format!("connect to load the v1 dump: {e}")))?;
    sqlx::raw_sql(&sql)
        .execute(&mut conn)
        .await
        .map_err(|e| CaseError::failed(format!("load the v1 dump into {schema}: {e}")))?;
    conn.close()
        .await
        .map_err(|e| CaseError::failed(format!("close the loading connection: {e}")))
}

/// The v1 schema migrates, reads back whole and its pending events are delivered.
#[watukuy_testenv::requires(postgres, or_cfg(feature = "testcontainers"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v1_postgres_store_is_migrated_read_and_delivered() {
    common::with_schema("v1_store", 4, |schema| async move {
        load_v1(&schema.url, &schema.name).await?;
        let store = schema.unmigrated(PostgresOptions::default())?;
        v1_checks::upgrade_and_check(Arc::new(store), "postgres", EXPECTED).await;
        Ok(())
    })
    .await;
}
