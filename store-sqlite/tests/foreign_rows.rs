//! Rows another program wrote into the store's file, any value in any column: every read of
//! the store answers with what it can decode or a permanent `Corrupt` error, never a panic and
//! never another kind of error. (`setup::undecodable_rows_are_corrupt_errors` in the suite holds
//! every store to the chosen damages; this tries every column with any value.)

mod common;

use proptest::prelude::*;
use rusqlite::types::Value;
use watukuy_conformance::cases::fixtures::{populate_one_of_everything, read_everything};
use watukuy_store_sqlite::{SqliteOptions, SqliteStore};

/// Every column of every table the store reads, as `table.column`.
const COLUMNS: &[(&str, &str)] = &[
    ("pollers", "poller"),
    ("pollers", "\"partition\""),
    ("pollers", "present"),
    ("pollers", "state"),
    ("pollers", "lease_owner"),
    ("pollers", "lease_epoch"),
    ("pollers", "lease_expires_at"),
    ("pollers", "epoch_counter"),
    ("items", "identity"),
    ("items", "version"),
    ("items", "hash"),
    ("items", "schema_version"),
    ("items", "payload"),
    ("items", "seen_at"),
    ("outbox", "event_id"),
    ("outbox", "seq"),
    ("outbox", "event"),
    ("outbox", "attempts"),
    ("outbox", "next_attempt_at"),
    ("outbox", "last_error"),
    ("outbox", "created_at"),
    ("parked", "id"),
    ("parked", "kind"),
    ("parked", "event"),
    ("parked", "item"),
    ("parked", "error"),
    ("parked", "attempts"),
    ("parked", "parked_at"),
    ("parked", "hold_key"),
    ("validators", "url_hash"),
    ("validators", "etag"),
    ("validators", "last_modified"),
    ("validators", "stored_at"),
    ("log", "seq"),
    ("log", "event"),
    ("log", "created_at"),
];

/// A value as SQLite holds it: NULL, integers at the edges, reals, text that is almost JSON,
/// or bytes that are not UTF-8.
fn value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        prop_oneof![
            Just(i64::MIN),
            Just(-1_i64),
            Just(0),
            Just(i64::MAX),
            any::<i64>()
        ]
        .prop_map(Value::Integer),
        any::<f64>().prop_map(Value::Real),
        prop_oneof![
            "\\PC{0,16}",
            "[\\[\\]{}\":,0-9a-z ]{0,24}",
            Just("{\"lanes\":{}}".to_owned()),
            Just("poison".to_owned()),
            Just("invalid".to_owned()),
        ]
        .prop_map(Value::Text),
        proptest::collection::vec(any::<u8>(), 0..16).prop_map(Value::Blob),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn any_value_in_any_column_is_read_or_corrupt(
        column in 0..COLUMNS.len(),
        value in value(),
    ) {
        let (table, column) = COLUMNS[column];
        let (_dir, path) = common::temp_db("foreign.db");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let store = SqliteStore::open(SqliteOptions::file(&path)).expect("valid options");
        runtime.block_on(async {
            store.migrate().await.expect("migrate");
            populate_one_of_everything(&store)
                .await
                .unwrap_or_else(|e| panic!("populate: {e}"));
        });
        // One row (tables holding two, parked and log, would refuse one key for both).
        let sql = format!(
            "UPDATE watukuy_{table} SET {column} = ?1 \
             WHERE rowid = (SELECT min(rowid) FROM watukuy_{table})"
        );
        let written = rusqlite::Connection::open(&path)
            .expect("raw connection")
            .execute(&sql, [&value]);
        // A NOT NULL or key constraint refuses the value: nothing foreign was written.
        prop_assume!(written.is_ok());
        runtime
            .block_on(read_everything(&store))
            .map_err(TestCaseError::fail)?;
    }
}
