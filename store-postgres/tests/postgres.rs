//! PostgreSQL-specific behaviour beyond the conformance suite: several instances on one
//! database, concurrent migrations, a backend killed in the middle of `commit_poll`, chunked
//! commits, bad input, `close()`, and JSON that only a verbatim column keeps.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Database, OrFail, Schema, ensure, fail, pool, with_database, with_schema};
use sqlx::{Connection, PgConnection};
use watukuy_conformance::CaseError;
use watukuy_conformance::cases::fixtures::{self, TTL, item, key};
use watukuy_core::{
    Error, ErrorCode, Event,
    json::Json,
    store::{
        CommitBatch, ItemRow, Lease, LogQuery, OutboxRow, PKey, ParkedError, ParkedKind,
        ParkedQuery, ParkedRow, PollerState, SerializedError, StatePatch, Store, StoreErrorKind,
    },
};
use watukuy_store_postgres::{PostgresOptions, PostgresStore};
use watukuy_testkit::T0;

/// A created event of `o<sequence>` on [`key`] carrying `data`, without a cursor.
fn event(id: &str, sequence: i64, data: &str) -> Result<Event, CaseError> {
    let mut event = fixtures::event(&key(), id, sequence, &format!("o{sequence}"));
    event.cursor = None;
    event.data = Some(Json::parse(data).or_fail()?);
    Ok(event)
}

/// A test `$name` running `$body` on a schema of its own named after it, with a pool of
/// `$connections` ([`with_schema`]).
macro_rules! schema_test {
    ($name:ident, $connections:literal, $body:expr) => {
        #[watukuy_testenv::requires(postgres, or_cfg(feature = "testcontainers"))]
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            with_schema(stringify!($name), $connections, $body).await;
        }
    };
}

/// One page: items, their events (logged) and a patch moving the sequence.
fn page(identities: &[&str], first_sequence: i64) -> Result<CommitBatch, CaseError> {
    let mut events = Vec::new();
    for (i, identity) in identities.iter().enumerate() {
        let sequence = first_sequence + i64::try_from(i).or_fail()?;
        let data = format!(r#"{{"id":"{identity}","seq":{sequence}}}"#);
        events.push(OutboxRow::pending(
            event(&format!("evt-{identity}-{sequence}"), sequence, &data)?,
            T0,
        ));
    }
    let patch = StatePatch {
        sequence: events.last().map(|row| row.sequence),
        updated_at: Some(T0),
        ..StatePatch::default()
    };
    let items = identities.iter();
    Ok(CommitBatch::default()
        .state_patch(patch)
        .upserts(
            items
                .map(|id| item(id, &format!("hash-{id}-{first_sequence}")))
                .collect(),
        )
        .events(events)
        .log(true))
}

fn expect_lease_lost<T: std::fmt::Debug>(
    result: Result<T, Error>,
    epoch: i64,
    what: &str,
) -> Result<(), CaseError> {
    match result {
        Err(Error::LeaseLost { epoch: e, .. }) if e == epoch => Ok(()),
        other => Err(fail(format!(
            "{what}: expected LeaseLost(epoch {epoch}), got {other:?}"
        ))),
    }
}

/// The lease state, item count and pending count of `k`: what a rejected write must not change.
async fn footprint(
    store: &dyn Store,
    k: &PKey,
) -> Result<(Option<PollerState>, u64, u64), CaseError> {
    let counts = store.counts(k).await?;
    Ok((store.load_state(k).await?, counts.items, counts.pending))
}

/// A session of its own holding the row lock of item `o1` in `schema`, in an open transaction,
/// and its backend's pid.
async fn lock_o1(schema: &Schema) -> Result<(PgConnection, i32), CaseError> {
    let mut blocker = PgConnection::connect(&schema.url).await.or_fail()?;
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut blocker)
        .await
        .or_fail()?;
    sqlx::query("BEGIN").execute(&mut blocker).await.or_fail()?;
    sqlx::query(&format!(
        "SELECT 1 FROM \"{schema}\".\"watukuy_items\" WHERE identity = 'o1' FOR UPDATE"
    ))
    .execute(&mut blocker)
    .await
    .or_fail()?;
    Ok((blocker, pid))
}

/// Runs `count_sql` (its `$1` bound to `pid`) until it counts a row or `gave_up()`, polling
/// without sleeping (bounded); whether it counted one.
async fn counts_a_row(
    admin: &mut PgConnection,
    count_sql: &str,
    pid: i32,
    gave_up: impl Fn() -> bool,
) -> Result<bool, CaseError> {
    for _ in 0..200_000 {
        let count: i64 = sqlx::query_scalar(count_sql)
            .bind(pid)
            .fetch_one(&mut *admin)
            .await
            .or_fail()?;
        if count > 0 {
            return Ok(true);
        }
        if gave_up() {
            return Ok(false);
        }
        tokio::task::yield_now().await;
    }
    Ok(false)
}

async fn acquire(store: &dyn Store, owner: &str, now: i64) -> Result<Lease, CaseError> {
    store
        .acquire_lease(&key(), owner, TTL, now)
        .await?
        .ok_or_else(|| fail(format!("{owner} could not acquire at {now}")))
}

// The backend running a `commit_poll` is terminated while the statement waits on a row lock
// (after it already applied the state patch): the store reports a transient error, nothing of
// the page is visible, and committing the same page again succeeds.
schema_test!(
    terminated_backend_mid_commit_is_transient_and_atomic,
    1,
    |schema| async move {
        // One connection: the store's commit runs on the only backend of its pool.
        let store = Arc::new(schema.store(PostgresOptions::default()).await?);
        let k = key();
        let lease = acquire(&*store, "node-a", T0).await?;
        store.commit_poll(&k, &lease, &page(&["o1"], 1)?).await?;
        let before_state = store.load_state(&k).await?;

        // A second session locks o1's row, so the next page (which upserts o1) blocks inside
        // its single statement, after the fence already updated the state.
        let (mut blocker, blocker_pid) = lock_o1(&schema).await?;

        let second = page(&["o2", "o1", "o3"], 2)?;
        let task = {
            let store = Arc::clone(&store);
            let (k, lease, batch) = (k.clone(), lease.clone(), second.clone());
            tokio::spawn(async move { store.commit_poll(&k, &lease, &batch).await })
        };

        // Find the backend the blocker holds up (bounded polling, no sleeping).
        let mut admin = PgConnection::connect(&schema.url).await.or_fail()?;
        let mut victim = None;
        for _ in 0..200_000 {
            victim = sqlx::query_scalar::<_, i32>(
                "SELECT pid FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
            )
            .bind(blocker_pid)
            .fetch_optional(&mut admin)
            .await
            .or_fail()?;
            if victim.is_some() || task.is_finished() {
                break;
            }
            tokio::task::yield_now().await;
        }
        let victim = victim.ok_or_else(|| fail("commit_poll never blocked on the locked row"))?;
        let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
            .bind(victim)
            .fetch_one(&mut admin)
            .await
            .or_fail()?;
        ensure!(terminated, "pg_terminate_backend({victim}) returned false");
        let result = task.await.or_fail_with("commit task panicked")?;
        sqlx::query("ROLLBACK")
            .execute(&mut blocker)
            .await
            .or_fail()?;

        let error = match result {
            Err(error) => error,
            Ok(()) => return Err(fail("commit_poll succeeded on a terminated backend")),
        };
        eprintln!("commit_poll on the terminated backend failed with: {error}");
        ensure!(
            error.code() == ErrorCode::Store && error.is_transient(),
            "expected a transient store error, got {error:?}"
        );
        ensure!(
            matches!(error.store_kind(), Some((StoreErrorKind::Connection, true))),
            "expected a Connection error, got {error:?}"
        );

        // Nothing of the page is visible (the pool replaces the dead connection).
        ensure!(
            store.load_state(&k).await? == before_state,
            "the state patch leaked"
        );
        let rows = store
            .load_versions(&k, &["o1".to_owned(), "o2".to_owned(), "o3".to_owned()])
            .await?;
        ensure!(
            rows.len() == 1 && rows.get("o1").is_some_and(|r| r.hash == "hash-o1-1"),
            "items of the page leaked: {rows:?}"
        );
        ensure!(
            store.counts(&k).await.map(|c| c.pending)? == 1,
            "events of the page leaked"
        );
        ensure!(
            store.read_log(&k, LogQuery::default(), 10).await?.len() == 1,
            "log entries of the page leaked"
        );

        // The next cycle re-commits the same page.
        store.commit_poll(&k, &lease, &second).await?;
        ensure!(
            store.counts(&k).await.map(|c| c.items)? == 3,
            "re-commit did not land"
        );
        ensure!(
            store.counts(&k).await.map(|c| c.pending)? == 4,
            "re-committed events missing"
        );
        let state = store
            .load_state(&k)
            .await?
            .ok_or_else(|| fail("no state"))?;
        ensure!(state.sequence == 4, "re-committed patch missing: {state:?}");

        Ok(())
    }
);

// With a tiny `max_rows_per_statement` a commit becomes several statements in one
// transaction: everything lands (duplicates resolved like the reference store), and a stale
// lease still writes nothing.
schema_test!(
    chunked_commits_land_whole_or_not_at_all,
    2,
    |schema| async move {
        let options = PostgresOptions::default().max_rows_per_statement(7);
        let store = schema.store(options).await?;
        let k = key();
        let lease = acquire(&store, "node-a", T0).await?;

        let ids: Vec<String> = (0..30).map(|i| format!("o{i:02}")).collect();
        let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        let mut batch = page(&id_refs, 1)?;
        // Repeats within one batch: the last row of an identity, event id and parked id wins;
        // an identity both upserted and deleted ends deleted.
        batch.upserts.push(ItemRow {
            hash: "last".to_owned(),
            ..item("o00", "x")
        });
        batch.deletes = vec!["o29".to_owned(), "o28".to_owned()];
        let mut repeated = batch.events[0].clone();
        repeated.created_at = T0 + 9;
        batch.events.push(repeated);
        for i in 0..9 {
            batch.parked.push(ParkedRow {
                id: format!("invalid:{}", i % 8),
                kind: ParkedKind::Invalid,
                event: None,
                item: Some(Json::parse(&format!(r#"{{"n":{i}}}"#)).or_fail()?),
                error: ParkedError {
                    error: SerializedError::new("ValidationError", "bad"),
                    history: None,
                    issues: None,
                    details: Default::default(),
                },
                attempts: 0,
                parked_at: T0 + i,
                hold_key: None,
            });
        }
        store.commit_poll(&k, &lease, &batch).await?;
        ensure!(
            store.counts(&k).await.map(|c| c.items)? == 28,
            "items: {}",
            store.counts(&k).await.map(|c| c.items)?
        );
        let o00 = store.load_versions(&k, &["o00".to_owned()]).await?;
        ensure!(
            o00.get("o00").is_some_and(|r| r.hash == "last"),
            "last upsert did not win: {o00:?}"
        );
        ensure!(
            store.counts(&k).await.map(|c| c.pending)? == 30,
            "pending: {}",
            store.counts(&k).await.map(|c| c.pending)?
        );
        let first = store.load_pending(&k, 1).await?;
        ensure!(
            first.first().is_some_and(|r| r.created_at == T0 + 9),
            "last event row did not win: {first:?}"
        );
        ensure!(
            store.read_log(&k, LogQuery::default(), 100).await?.len() == 30,
            "log entries"
        );
        let parked = store.list_parked(&k, ParkedQuery::default()).await?;
        ensure!(parked.len() == 8, "parked rows: {}", parked.len());
        ensure!(
            parked
                .iter()
                .any(|r| r.id == "invalid:0" && r.parked_at == T0 + 8),
            "last parked row did not win"
        );

        // Acks in chunks too.
        let acked: Vec<String> = store
            .load_pending(&k, 20)
            .await?
            .into_iter()
            .map(|r| r.event_id.to_string())
            .collect();
        store.ack_events(&k, &lease, &acked).await?;
        ensure!(
            store.counts(&k).await.map(|c| c.pending)? == 10,
            "chunked ack"
        );

        // A stale lease: none of the chunks lands.
        let stale = Lease {
            epoch: lease.epoch + 1,
            ..lease.clone()
        };
        let before = footprint(&store, &k).await?;
        let more: Vec<String> = (0..20).map(|i| format!("n{i:02}")).collect();
        let more_refs: Vec<&str> = more.iter().map(String::as_str).collect();
        expect_lease_lost(
            store.commit_poll(&k, &stale, &page(&more_refs, 100)?).await,
            stale.epoch,
            "chunked commit",
        )?;
        expect_lease_lost(
            store.ack_events(&k, &stale, &more).await,
            stale.epoch,
            "chunked ack",
        )?;
        let after = footprint(&store, &k).await?;
        ensure!(
            before == after,
            "a rejected chunked commit changed something"
        );

        Ok(())
    }
);

// PostgreSQL text cannot hold a raw NUL: such an identity is a permanent `Rejected` error and
// nothing of its batch lands. (JSON and NUL characters in messages come back verbatim:
// `commit_poll::json_and_text_come_back_verbatim`, run by every store.)
schema_test!(
    a_nul_identity_is_rejected_and_nothing_of_its_batch_lands,
    2,
    |schema| async move {
        let store = schema.store(PostgresOptions::default()).await?;
        let k = key();
        let lease = acquire(&store, "node-a", T0).await?;
        store.commit_poll(&k, &lease, &page(&["o1"], 1)?).await?;
        let before = (
            store.load_state(&k).await?,
            store.counts(&k).await.map(|c| c.items)?,
        );
        let mut bad = page(&["fine"], 50)?;
        bad.upserts.push(item("nul\0identity", "h"));
        let err = store
            .commit_poll(&k, &lease, &bad)
            .await
            .err()
            .ok_or_else(|| fail("a NUL identity was accepted"))?;
        ensure!(
            err.store_kind() == Some((StoreErrorKind::Rejected, false)),
            "NUL identity: {err:?}"
        );
        let after = (
            store.load_state(&k).await?,
            store.counts(&k).await.map(|c| c.items)?,
        );
        ensure!(before == after, "a rejected batch left something behind");

        Ok(())
    }
);

/// A closed local port is a clear, transient `Connection` store error naming where the store
/// tried to connect; an unusable URL and invalid identifiers are `Config` errors before any
/// connection is tried. (Needs no server.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_and_identifiers_are_clear_errors() {
    // A port that was just free: bind, read it, release it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(1);
    let options = PostgresOptions::default().acquire_timeout(Duration::from_secs(5));
    let refused = PostgresStore::connect(
        &format!("postgres://root@127.0.0.1:{port}/test"),
        options.clone(),
    )
    .await
    .map(|_| ());
    let err = refused.expect_err("a closed port must not connect");
    assert_eq!(
        err.store_kind(),
        Some((StoreErrorKind::Connection, true)),
        "{err:?}"
    );
    assert!(err.is_transient());
    let message = err.to_string();
    assert!(message.contains(&format!("127.0.0.1:{port}")), "{message}");
    assert!(
        message.contains("cannot connect to PostgreSQL"),
        "{message}"
    );

    let err = PostgresStore::connect("not a url", options.clone())
        .await
        .map(|_| ())
        .expect_err("garbage URL");
    assert!(
        matches!(&err, Error::Config { option, .. } if option == "postgres.url"),
        "{err:?}"
    );

    // Invalid identifiers are rejected before anything touches the network, even with a URL
    // that would be refused.
    for (options, option) in [
        (
            PostgresOptions::default().schema("x; drop table y"),
            "postgres.schema",
        ),
        (
            PostgresOptions::default().schema("Robert'); DROP TABLE students;--"),
            "postgres.schema",
        ),
        (
            PostgresOptions::default().table_prefix("p\"; drop"),
            "postgres.table_prefix",
        ),
    ] {
        let err = PostgresStore::connect(
            &format!("postgres://root@127.0.0.1:{port}/test"),
            options.clone(),
        )
        .await
        .map(|_| ())
        .expect_err("bad identifier");
        assert!(
            matches!(&err, Error::Config { option: o, .. } if o == option),
            "{err:?}"
        );
        let lazy =
            sqlx::postgres::PgPoolOptions::new().connect_lazy("postgres://root@127.0.0.1/test");
        let pool = lazy.expect("a lazy pool never connects");
        let err = PostgresStore::from_pool(pool, options)
            .map(|_| ())
            .expect_err("bad identifier");
        assert!(
            matches!(&err, Error::Config { option: o, .. } if o == option),
            "{err:?}"
        );
    }
}

/// A database that does not exist on a reachable server is a clear, transient `Connection`
/// store error naming the database.
#[watukuy_testenv::requires(postgres, or_cfg(feature = "testcontainers"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_database_is_a_clear_error() {
    with_database("missing_database", |db: Database| async move {
        // The test URL with its database (if it names one) replaced.
        let mut url = db.url.clone();
        if let Some(query) = url.find('?') {
            url.truncate(query);
        }
        if let Some(slash) = url.rfind('/').filter(|i| *i > "postgres://".len()) {
            url.truncate(slash);
        }
        url.push_str("/watukuy_no_such_database");
        let err = PostgresStore::connect(&url, PostgresOptions::default())
            .await
            .map(|_| ())
            .err()
            .ok_or_else(|| fail("connected to a database that does not exist"))?;
        ensure!(
            err.store_kind() == Some((StoreErrorKind::Connection, true)),
            "missing database: {err:?}"
        );
        ensure!(
            err.to_string().contains("watukuy_no_such_database"),
            "{err}"
        );
        Ok(())
    })
    .await;
}

// Before `migrate()` every call fails with a `Schema` error that says to run it; `close()`
// leaves the pool open unless `close_pool(true)`, after which calls fail permanently.
schema_test!(unmigrated_store_and_close_pool, 2, |schema| async move {
    let store = schema.unmigrated(PostgresOptions::default())?;
    let err = store
        .load_state(&key())
        .await
        .err()
        .ok_or_else(|| fail("read without tables"))?;
    ensure!(
        err.store_kind() == Some((StoreErrorKind::Schema, false))
            && err.to_string().contains("migrate()"),
        "missing tables: {err:?}"
    );

    store.migrate().await?;
    store.migrate().await?;
    store.close().await?;
    ensure!(
        !schema.pool.is_closed(),
        "close() closed a pool it was not asked to close"
    );
    ensure!(
        store.load_state(&key()).await?.is_none(),
        "store unusable after close()"
    );

    // On a pool of its own: the schema's pool stays open to remove the schema.
    let closing_pool = pool(&schema.url, 1).await?;
    let closing =
        PostgresStore::from_pool(closing_pool.clone(), schema.options().close_pool(true))?;
    closing.close().await?;
    ensure!(
        closing_pool.is_closed(),
        "close_pool(true) did not close the pool"
    );
    let err = closing
        .counts(&key())
        .await
        .map(|c| c.items)
        .err()
        .ok_or_else(|| fail("closed pool still answered"))?;
    ensure!(
        err.store_kind() == Some((StoreErrorKind::Connection, false)),
        "closed pool: {err:?}"
    );
    Ok(())
});

/// The tables, columns and indexes of `schema` (table and index names without the schema),
/// for comparing two schemas.
async fn catalog(pool: &sqlx::PgPool, schema: &str) -> Result<Vec<String>, CaseError> {
    let columns: Vec<String> = sqlx::query_scalar(
        "SELECT table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable \
         FROM information_schema.columns WHERE table_schema = $1 \
         ORDER BY table_name, ordinal_position",
    )
    .bind(schema)
    .fetch_all(pool)
    .await
    .or_fail()?;
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT indexdef FROM pg_indexes WHERE schemaname = $1 ORDER BY indexname",
    )
    .bind(schema)
    .fetch_all(pool)
    .await
    .or_fail()?;
    let quoted = format!("{schema}.");
    Ok(columns
        .into_iter()
        .chain(indexes.into_iter().map(|def| def.replace(&quoted, "")))
        .collect())
}

// The exported DDL is what `migrate()` applies: run by hand, it leaves a schema that
// `migrate()` accepts as current and the store uses, with the same tables, columns and
// indexes as a migrated one.
schema_test!(exported_ddl_matches_migrate, 1, |schema| async move {
    let pool = &schema.pool;
    let options = schema.options().table_prefix("");
    let ddl = PostgresStore::ddl(&options)?;
    sqlx::raw_sql(&ddl).execute(pool).await.or_fail()?;
    // Idempotent text: a second run changes nothing.
    sqlx::raw_sql(&ddl).execute(pool).await.or_fail()?;
    let migrated = schema.another("exported_ddl_migrated").await?;
    migrated
        .store(PostgresOptions::default().table_prefix(""))
        .await?;
    let by_hand = catalog(pool, &schema.name).await?;
    let by_migrate = catalog(pool, &migrated.name).await?;
    ensure!(
        by_hand == by_migrate,
        "the exported DDL made {by_hand:#?}\nmigrate() made {by_migrate:#?}"
    );
    ensure!(
        by_hand.iter().any(|def| def.contains("outbox_queue_idx"))
            && !by_hand.iter().any(|def| def.contains("outbox_pending_idx")),
        "the queue index replaces the old pending index: {by_hand:#?}"
    );
    migrated.remove().await?;
    let store = schema.store(options).await?;
    let lease = acquire(&store, "node-a", T0).await?;
    store
        .commit_poll(&key(), &lease, &page(&["o1", "o2"], 1)?)
        .await?;
    ensure!(
        store.counts(&key()).await.map(|c| c.items)? == 2,
        "store on hand-made DDL"
    );
    Ok(())
});

// A takeover racing an in-flight commit: while instance A's `commit_poll` is inside its
// statement (holding the key's row lock, blocked on an item row), instance B's acquisition of
// the expired lease waits for it. A's page lands whole, B then gets the next epoch, and A's
// next write is rejected.
schema_test!(
    takeover_waits_for_the_commit_in_flight,
    1,
    |schema| async move {
        let pool_b = pool(&schema.url, 1).await?;
        let a = Arc::new(schema.store(PostgresOptions::default()).await?);
        let b = Arc::new(PostgresStore::from_pool(pool_b.clone(), schema.options())?);
        let k = key();
        let lease_a = acquire(&*a, "node-a", T0).await?;
        a.commit_poll(&k, &lease_a, &page(&["o1"], 1)?).await?;

        let (mut blocker, blocker_pid) = lock_o1(&schema).await?;

        let commit = {
            let (a, k, lease) = (Arc::clone(&a), k.clone(), lease_a.clone());
            let batch = page(&["o1", "o2"], 2)?;
            tokio::spawn(async move { a.commit_poll(&k, &lease, &batch).await })
        };
        let mut admin = PgConnection::connect(&schema.url).await.or_fail()?;
        let blocked = counts_a_row(
            &mut admin,
            "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
            blocker_pid,
            || commit.is_finished(),
        )
        .await?;
        ensure!(blocked, "A's commit never reached the locked row");

        // B tries to take the expired lease while A's statement holds the key's row lock.
        let takeover = {
            let (b, k) = (Arc::clone(&b), k.clone());
            tokio::spawn(async move { b.acquire_lease(&k, "node-b", TTL, T0 + TTL).await })
        };
        // B waits on A's backend, which itself waits on the blocker.
        let waiting = counts_a_row(
            &mut admin,
            "SELECT count(*) FROM pg_stat_activity a, pg_stat_activity b \
             WHERE b.pid = ANY(pg_blocking_pids(a.pid)) AND $1 = ANY(pg_blocking_pids(b.pid))",
            blocker_pid,
            || takeover.is_finished(),
        )
        .await?;
        ensure!(
            waiting,
            "B's acquisition did not wait for A's commit in flight"
        );
        sqlx::query("ROLLBACK")
            .execute(&mut blocker)
            .await
            .or_fail()?;

        commit.await.or_fail_with("commit task panicked")??;
        let lease_b = takeover
            .await
            .or_fail_with("acquire task panicked")??
            .ok_or_else(|| fail("B did not get the expired lease"))?;
        ensure!(lease_b.epoch == lease_a.epoch + 1, "B's epoch: {lease_b:?}");
        ensure!(
            b.counts(&k).await.map(|c| c.items)? == 2,
            "A's in-flight page did not land whole"
        );
        let state = b.load_state(&k).await?.ok_or_else(|| fail("no state"))?;
        ensure!(state.sequence == 3, "A's patch missing: {state:?}");
        expect_lease_lost(
            a.commit_poll(&k, &lease_a, &page(&["o3"], 4)?).await,
            lease_a.epoch,
            "A after the takeover",
        )?;
        ensure!(
            b.counts(&k).await.map(|c| c.items)? == 2,
            "A's stale page landed"
        );

        pool_b.close().await;
        Ok(())
    }
);

// A schema at version 1 (the tables and indexes of `sql/0001_init.sql`, with rows in them)
// is brought to the current version by `migrate()`: the outbox's pending index is replaced by
// the partial queue index, the parked table gets its hold-key index, and the rows survive.
schema_test!(
    migrate_upgrades_a_version_1_schema,
    1,
    |schema| async move {
        let pool = &schema.pool;
        let render = |template: &str| {
            template
                .replace("{schema}", &schema.name)
                .replace("{prefix}", "watukuy_")
        };
        let version_1 = format!(
            "{};\n{};\n{}\nINSERT INTO \"{schema}\".\"watukuy_schema_version\" VALUES (1, 'init');",
            render(include_str!("../sql/schema.sql")).trim_end(),
            render(include_str!("../sql/schema_version.sql")).trim_end(),
            render(include_str!("../sql/0001_init.sql")),
        );
        sqlx::raw_sql(&version_1).execute(pool).await.or_fail()?;
        let store = schema.unmigrated(PostgresOptions::default())?;
        // Rows written by a version 1 store (the statements do not depend on the indexes).
        let lease = acquire(&store, "node-a", T0).await?;
        store
            .commit_poll(&key(), &lease, &page(&["o1", "o2", "o3"], 1)?)
            .await?;

        store.migrate().await?;
        let versions: Vec<i32> = sqlx::query_scalar(&format!(
            "SELECT version FROM \"{schema}\".\"watukuy_schema_version\" ORDER BY version"
        ))
        .fetch_all(pool)
        .await
        .or_fail()?;
        ensure!(
            versions == vec![1, watukuy_store_postgres::SCHEMA_VERSION],
            "versions after the upgrade: {versions:?}"
        );
        let indexes: Vec<String> = sqlx::query_scalar(
            "SELECT indexname::text FROM pg_indexes WHERE schemaname = $1 ORDER BY indexname",
        )
        .bind(&schema.name)
        .fetch_all(pool)
        .await
        .or_fail()?;
        ensure!(
            indexes.contains(&"watukuy_outbox_queue_idx".to_owned())
                && indexes.contains(&"watukuy_parked_hold_idx".to_owned())
                && !indexes.contains(&"watukuy_outbox_pending_idx".to_owned()),
            "indexes after the upgrade: {indexes:?}"
        );
        ensure!(
            store.counts(&key()).await.map(|c| c.pending)? == 3
                && store.counts(&key()).await.map(|c| c.items)? == 3,
            "rows lost in the upgrade"
        );
        let pending = store.load_pending(&key(), 10).await?;
        let ids: Vec<String> = pending.iter().map(|row| row.event_id.to_string()).collect();
        store.ack_events(&key(), &lease, &ids).await?;
        ensure!(
            store.counts(&key()).await.map(|c| c.pending)? == 0,
            "acks after the upgrade"
        );
        // Running it again changes nothing.
        store.migrate().await?;
        Ok(())
    }
);

/// The testcontainers fallback (feature `testcontainers`, for machines with Docker) hands the
/// suite a URL built from the container's host and mapped port: the driver reads back the same
/// host, port, user and database for a name, an IPv4 and an IPv6 host.
#[test]
fn the_container_url_reaches_the_mapped_port() {
    use std::str::FromStr;

    use sqlx::postgres::PgConnectOptions;

    for host in ["localhost", "127.0.0.1", "[::1]"] {
        let url = common::container_url(host, 49_153);
        let options = PgConnectOptions::from_str(&url).unwrap_or_else(|e| panic!("{url}: {e}"));
        let unbracketed = |host: &str| host.trim_matches(['[', ']']).to_owned();
        assert_eq!(unbracketed(options.get_host()), unbracketed(host), "{url}");
        assert_eq!(options.get_port(), 49_153, "{url}");
        assert_eq!(options.get_username(), "postgres", "{url}");
        assert_eq!(options.get_database(), Some("postgres"), "{url}");
    }
}
