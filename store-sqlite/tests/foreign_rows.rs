//! Rows another program wrote into the store's file, any value in any column: every read of
//! the store answers with what it can decode or a permanent `Corrupt` error, never a panic and
//! never another kind of error. (`setup::undecodable_rows_are_corrupt_errors` in the suite holds
//! every store to the chosen damages; this tries every column with any value.)

mod common;

use std::path::Path;

use futures::TryStreamExt;
use proptest::prelude::*;
use rusqlite::types::Value;
use watukuy_conformance::cases::fixtures::{NODE_A, TTL, invalid, item, key, pending};
use watukuy_core::Error;
use watukuy_core::store::{
    CommitBatch, LogQuery, ParkedQuery, StatePatch, Store, StoreErrorKind, UrlValidator, Validator,
};
use watukuy_store_sqlite::{SqliteOptions, SqliteStore};
use watukuy_testkit::T0;

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

/// A file store holding one of everything: state, items, a pending event, a parked row of each
/// kind, a validator and the log.
async fn populated(path: &Path) -> SqliteStore {
    let store = SqliteStore::open(SqliteOptions::file(path)).expect("valid options");
    store.migrate().await.expect("migrate");
    let key = key();
    let lease = store
        .acquire_lease(&key, NODE_A, TTL, T0)
        .await
        .expect("acquire")
        .expect("free");
    let mut row = item("i1", "h1");
    row.payload = Some(watukuy_core::json::Json::parse(r#"{"id":"i1"}"#).expect("json"));
    let event = pending(&key, "evt-1", 1, "i1");
    let batch = CommitBatch::default()
        .state_patch(StatePatch {
            sequence: Some(1),
            updated_at: Some(T0),
            ..StatePatch::default()
        })
        .upserts(vec![row])
        .events(vec![event])
        .parked(vec![invalid("invalid:x", r#"{"id":"x"}"#, T0)])
        .validators(vec![UrlValidator {
            url_hash: "u1".to_owned(),
            validator: Validator {
                etag: Some("\"v1\"".to_owned()),
                last_modified: None,
                stored_at: T0,
            },
        }])
        .log(true);
    store
        .commit_poll(&key, &lease, &batch)
        .await
        .expect("commit");
    store
}

/// `Ok`, or a permanent `Corrupt` error: what every read may answer over foreign data.
fn decoded_or_corrupt<T>(what: &str, result: Result<T, Error>) -> Result<(), TestCaseError> {
    match result {
        Ok(_) => Ok(()),
        Err(Error::Store {
            kind: StoreErrorKind::Corrupt,
            transient: false,
            ..
        }) => Ok(()),
        Err(other) => Err(TestCaseError::fail(format!(
            "{what} answered {other:?}, not a permanent Corrupt error"
        ))),
    }
}

async fn read_everything(store: &SqliteStore) -> Result<(), TestCaseError> {
    let key = key();
    decoded_or_corrupt("list_keys", store.list_keys(None).await)?;
    decoded_or_corrupt("get_lease", store.get_lease(&key).await)?;
    decoded_or_corrupt("load_state", store.load_state(&key).await)?;
    decoded_or_corrupt("counts", store.counts(&key).await)?;
    decoded_or_corrupt(
        "load_versions",
        store.load_versions(&key, &["i1".to_owned()]).await,
    )?;
    decoded_or_corrupt(
        "stream_identities",
        store
            .stream_identities(&key, 10)
            .try_collect::<Vec<_>>()
            .await,
    )?;
    decoded_or_corrupt("load_pending", store.load_pending(&key, 10).await)?;
    decoded_or_corrupt(
        "list_parked",
        store.list_parked(&key, ParkedQuery::default()).await,
    )?;
    decoded_or_corrupt("get_validator", store.get_validator(&key, "u1").await)?;
    decoded_or_corrupt(
        "read_log",
        store.read_log(&key, LogQuery::default(), 10).await,
    )?;
    Ok(())
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
        let store = runtime.block_on(populated(&path));
        let sql = format!("UPDATE watukuy_{table} SET {column} = ?1");
        let written = rusqlite::Connection::open(&path)
            .expect("raw connection")
            .execute(&sql, [&value]);
        // A NOT NULL or key constraint refuses the value: nothing foreign was written.
        prop_assume!(written.is_ok());
        runtime.block_on(read_everything(&store))?;
    }
}
