//! What the conformance suite cannot see on MySQL / MariaDB: a connection killed in the middle of
//! a page's commit, concurrent migrations, byte order and byte-exact JSON as stored, limits and
//! foreign rows. Every test works in a database of its own (`common::Database`) against
//! `WATUKUY_TEST_MYSQL_URL`; ignored while it is unset (docs/testing.md).

mod common;

use std::str::FromStr;
use std::sync::Arc;

use common::{Database, OrFail, ensure, fail, with_database};
use sqlx::mysql::MySqlConnectOptions;
use sqlx::{ConnectOptions, Executor, MySqlConnection};
use watukuy_conformance::CaseError;
use watukuy_conformance::cases::fixtures::{NODE_A, TTL, item, json, key, pending};
use watukuy_core::{
    ErrorCode,
    store::{
        CommitBatch, ItemRow, Lease, PKey, StatePatch, Store, StoreErrorKind, UrlValidator,
        Validator,
    },
};
use watukuy_store_mysql::{MySqlOptions, MySqlStore, SCHEMA_VERSION};
use watukuy_testkit::T0;

/// A test `$name` running `$body` on a database of its own named after it, with a pool of
/// `$connections` ([`with_database`]).
macro_rules! db_test {
    ($name:ident, $connections:literal, $body:expr) => {
        #[watukuy_testenv::requires(mysql)]
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            with_database(stringify!($name), $connections, $body).await;
        }
    };
}

/// The default store on `database`, with the lease of `key()` taken for `NODE_A` at `T0`.
async fn leased_store(database: &Database) -> Result<(MySqlStore, PKey, Lease), CaseError> {
    let store = database.store(MySqlOptions::default()).await?;
    let k = key();
    let lease = store
        .acquire_lease(&k, NODE_A, TTL, T0)
        .await?
        .ok_or_else(|| fail("no lease"))?;
    Ok((store, k, lease))
}

/// A connection of the test's own on the database (not from the store's pool).
async fn connection(database: &Database) -> Result<MySqlConnection, CaseError> {
    MySqlConnectOptions::from_str(&database.url)
        .or_fail()?
        .connect()
        .await
        .or_fail_with("connect")
}

/// A page big enough to take a while: `n` items with payloads, as many outbox rows, a
/// validator on `url_hash` and a state patch.
fn big_page(n: usize, url_hash: &str) -> CommitBatch {
    let k = key();
    let upserts: Vec<ItemRow> = (0..n)
        .map(|i| {
            let mut row = item(&format!("item-{i:06}"), &format!("{i:064}"));
            row.payload = Some(json(&format!(
                r#"{{"id":{i},"pad":"{}"}}"#,
                "x".repeat(512)
            )));
            row
        })
        .collect();
    let events = (0..n)
        .map(|i| {
            let seq = i64::try_from(i).unwrap_or(0) + 1;
            pending(&k, &format!("{seq:064x}"), seq, &format!("item-{i:06}"))
        })
        .collect();
    CommitBatch::default()
        .upserts(upserts)
        .events(events)
        .log(true)
        .validators(vec![UrlValidator {
            url_hash: url_hash.to_owned(),
            validator: Validator {
                etag: Some("\"v1\"".to_owned()),
                last_modified: None,
                stored_at: T0,
            },
        }])
        .state_patch(StatePatch {
            sequence: Some(i64::try_from(n).unwrap_or(0)),
            updated_at: Some(T0),
            ..StatePatch::default()
        })
}

// `KILL` of the store's connection in the middle of `commit_poll`, after the items and the
// outbox rows were written and before `COMMIT`: nothing of the page is visible afterwards, the
// error is transient, and the same page commits whole on the next try.
//
// No timing: a second transaction holds the lock of the page's validator row, so the commit
// stops at that statement (its last but one, before the state and the `COMMIT`); the test
// finds it in the process list, kills it, and only then lets the blocker go.
db_test!(
    a_connection_killed_mid_commit_leaves_nothing_and_the_store_recovers,
    4,
    |database| async move {
        let store = Arc::new(database.store(MySqlOptions::default()).await?);
        let k = key();
        let lease = store
            .acquire_lease(&k, NODE_A, TTL, T0)
            .await?
            .ok_or_else(|| fail("no lease on a fresh key"))?;
        let batch = big_page(2_000, "blocked-url");

        // The blocker: an uncommitted row with the page's validator key.
        let mut blocker = connection(&database).await?;
        blocker.execute("START TRANSACTION").await.or_fail()?;
        sqlx::query(
            "INSERT INTO `watukuy_validators` (poller, part, url_hash, etag, last_modified, \
         stored_at) VALUES (?, ?, 'blocked-url', NULL, NULL, 0)",
        )
        .bind(k.poller.as_bytes())
        .bind(k.partition.as_bytes())
        .execute(&mut blocker)
        .await
        .or_fail_with("blocker")?;

        let commit = tokio::spawn({
            let (store, k, lease, batch) =
                (Arc::clone(&store), k.clone(), lease.clone(), batch.clone());
            async move { store.commit_poll(&k, &lease, &batch).await }
        });

        // Find the committing connection waiting on the validator row.
        let mut killer = connection(&database).await?;
        let mut victim = None;
        for _ in 0..100_000 {
            victim = sqlx::query_scalar::<_, i64>(
                "SELECT CAST(ID AS SIGNED) FROM information_schema.PROCESSLIST \
             WHERE DB = ? AND INFO LIKE 'REPLACE INTO `watukuy_validators`%'",
            )
            .bind(&database.name)
            .fetch_optional(&mut killer)
            .await
            .or_fail_with("read the process list")?;
            if victim.is_some() || commit.is_finished() {
                break;
            }
            tokio::task::yield_now().await;
        }
        let victim = victim.ok_or_else(|| {
            fail("the commit never reached the validator statement (or finished without it)")
        })?;
        killer
            .execute(format!("KILL CONNECTION {victim}").as_str())
            .await
            .or_fail_with("KILL")?;
        let outcome = commit.await.or_fail_with("the commit task")?;
        blocker.execute("ROLLBACK").await.or_fail()?;

        let error = match outcome {
            Ok(()) => return Err(fail("commit_poll succeeded on a killed connection")),
            Err(error) => error,
        };
        eprintln!("[mysql] the killed commit failed with: {error}");
        ensure!(
            error.code() == ErrorCode::Store && error.is_transient(),
            "a killed connection is a transient store error, got {error}"
        );

        // Nothing of the page is visible.
        let counts = store.counts(&k).await?;
        ensure!(
            counts.items == 0 && counts.pending == 0,
            "a killed commit left rows behind: {counts:?}"
        );
        ensure!(
            store.load_state(&k).await?.is_none(),
            "a killed commit left a state behind"
        );
        ensure!(
            store.get_validator(&k, "blocked-url").await?.is_none(),
            "a killed commit left a validator behind"
        );
        let log = store.read_log(&k, Default::default(), 10).await?;
        ensure!(
            log.is_empty(),
            "a killed commit left log entries: {}",
            log.len()
        );
        let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM `watukuy_items`")
            .fetch_one(&mut killer)
            .await
            .or_fail()?;
        ensure!(
            rows == 0,
            "{rows} item rows are visible to another connection"
        );

        // The store recovers: the same page commits whole (the pool replaces the dead connection).
        store.commit_poll(&k, &lease, &batch).await?;
        let counts = store.counts(&k).await?;
        ensure!(
            counts.items == 2_000 && counts.pending == 2_000,
            "the retried page is not whole: {counts:?}"
        );
        ensure!(
            store.load_state(&k).await?.map(|s| s.sequence) == Some(2_000),
            "the retried page's state is missing"
        );
        ensure!(
            store.get_validator(&k, "blocked-url").await?.is_some(),
            "the retried page's validator is missing"
        );
        Ok(())
    }
);

// The exported DDL lets a team create the schema itself (twice: it is idempotent); the store
// then finds it current and works on it as is.
db_test!(
    externally_managed_schema_is_used_as_is,
    2,
    |database| async move {
        let options = MySqlOptions::default().table_prefix("managed_");
        let ddl = MySqlStore::ddl(&options)?;
        for _ in 0..2 {
            sqlx::raw_sql(&ddl)
                .execute(&database.pool)
                .await
                .or_fail_with("apply the DDL by hand")?;
        }
        // The script itself records the version, so `migrate` has no step left to run.
        let version: i32 =
            sqlx::query_scalar("SELECT version FROM `managed_schema_version` WHERE id = 1")
                .fetch_one(&database.pool)
                .await
                .or_fail()?;
        ensure!(version == SCHEMA_VERSION, "schema version {version}");
        let store = database.unmigrated(options)?;
        store.migrate().await?;
        let lease = store.acquire_lease(&key(), NODE_A, TTL, T0).await?;
        ensure!(lease.map(|l| l.epoch) == Some(1), "no first lease");
        Ok(())
    }
);

// Payloads are stored as the exact bytes given (key order, big numbers, escapes, spaces), and
// identities compare as bytes: no collation folds `a` and `A`, or `a` and `a ` (trailing
// spaces), or `e` and `é`.
db_test!(
    json_is_byte_exact_and_identities_are_bytes,
    2,
    |database| async move {
        let (store, k, lease) = leased_store(&database).await?;
        let text = "{ \"z\": 1, \"a\": 123456789012345678901234567890, \"s\": \"\\u00e9\\n\", \"n\": null }";
        let ids = ["a", "A", "a ", "e", "é", "\u{1F600}"];
        let upserts: Vec<ItemRow> = ids
            .iter()
            .map(|id| {
                let mut row = item(id, "h");
                row.payload = Some(json(text));
                row
            })
            .collect();
        store
            .commit_poll(&k, &lease, &CommitBatch::default().upserts(upserts))
            .await?;
        let owned: Vec<String> = ids.iter().map(|s| (*s).to_owned()).collect();
        let rows = store.load_versions(&k, &owned).await?;
        ensure!(
            rows.len() == ids.len(),
            "{} rows of {}",
            rows.len(),
            ids.len()
        );
        for id in ids {
            let payload = rows.get(id).and_then(|r| r.payload.as_ref());
            ensure!(
                payload.map(|p| p.as_str()) == Some(text),
                "{id:?}: payload {payload:?}"
            );
        }
        let stored: Vec<u8> = sqlx::query_scalar("SELECT payload FROM `watukuy_items` LIMIT 1")
            .fetch_one(&database.pool)
            .await
            .or_fail()?;
        ensure!(stored == text.as_bytes(), "the stored bytes differ");
        let mut streamed = Vec::new();
        let mut stream = store.stream_identities(&k, 2);
        while let Some(batch) = futures::StreamExt::next(&mut stream).await {
            streamed.extend(batch?);
        }
        let mut expected = owned.clone();
        expected.sort();
        ensure!(streamed == expected, "{streamed:?} is not in byte order");
        Ok(())
    }
);

// Strings longer than their indexed columns are refused before anything is written, with an
// error naming them (never truncated by a non-strict server).
db_test!(
    long_identities_are_refused_by_name,
    2,
    |database| async move {
        let (store, k, lease) = leased_store(&database).await?;
        let long = "x".repeat(1025);
        let batch = CommitBatch::default()
            .upserts(vec![item("ok", "h"), item(&long, "h")])
            .state_patch(StatePatch {
                sequence: Some(9),
                ..StatePatch::default()
            });
        match store.commit_poll(&k, &lease, &batch).await {
            Err(watukuy_core::Error::Store {
                kind: StoreErrorKind::Rejected,
                transient: false,
                message,
                ..
            }) if message.contains("identity") && message.contains("1025 bytes") => {}
            other => return Err(fail(format!("expected a Rejected error, got {other:?}"))),
        }
        ensure!(
            store.counts(&k).await?.items == 0,
            "part of the page landed"
        );
        let err = store
            .acquire_lease(
                &watukuy_core::store::PKey::new("p".repeat(300), ""),
                NODE_A,
                TTL,
                T0,
            )
            .await
            .err()
            .ok_or_else(|| fail("a 300-byte poller name was accepted"))?;
        ensure!(err.to_string().contains("poller name"), "{err}");
        Ok(())
    }
);

// An identity the store did not write (not UTF-8) is a Corrupt error naming it when streamed,
// never a panic (the suite's `setup::undecodable_rows_are_corrupt_errors` covers the state,
// payloads and pending events).
db_test!(
    foreign_identities_are_corrupt_errors,
    2,
    |database| async move {
        let store = database.store(MySqlOptions::default()).await?;
        let k = key();
        sqlx::query(
            "INSERT INTO `watukuy_items` (poller, part, identity, item_version, item_hash, \
         schema_version, payload, seen_at) VALUES (?, ?, X'FF', NULL, 'h', 1, NULL, 0)",
        )
        .bind(k.poller.as_bytes())
        .bind(k.partition.as_bytes())
        .execute(&database.pool)
        .await
        .or_fail()?;
        let mut stream = store.stream_identities(&k, 10);
        let first = futures::StreamExt::next(&mut stream).await;
        ensure!(
            matches!(&first, Some(Err(e)) if e.to_string().contains("identity")),
            "{first:?}"
        );
        Ok(())
    }
);

/// The harness puts each test's database into the server's URL, parameters kept.
#[test]
fn the_harness_puts_the_database_into_the_url() {
    assert_eq!(
        common::url_with_database("mysql://root@127.0.0.1:3306/test", "x"),
        "mysql://root@127.0.0.1:3306/x"
    );
    assert_eq!(
        common::url_with_database("mysql://root@h?ssl-mode=REQUIRED", "x"),
        "mysql://root@h/x?ssl-mode=REQUIRED"
    );
}
