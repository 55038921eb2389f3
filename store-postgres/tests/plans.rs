//! Query plans of the hot statements on a fresh schema that was never ANALYZEd: the state of a
//! first backfill, whose rows arrive faster than autovacuum analyzes them. There the planner
//! guesses that a key has almost no rows, and statements written as
//! `poller = $1 AND "partition" = $2 AND event_id = ANY($5)` were planned as a read of the
//! key's whole index range with `event_id` as a filter (every pending row of the key, per ack).
//!
//! The statements are the store's own files (`sql/queries/*.sql`), prepared on one connection
//! and explained with `EXPLAIN (FORMAT JSON) EXECUTE` twice: with a custom plan (the parameter
//! values known, as for a statement's first executions on a connection) and with the generic
//! plan (what a prepared statement settles on later). The checks are on plan nodes and index
//! names only, never on timings; they run again after `ANALYZE`.

mod common;

use common::{OrFail, fail, with_schema};
use serde_json::Value;
use sqlx::{Connection, PgConnection, Row};
use watukuy_conformance::CaseError;
use watukuy_core::{
    Event, EventType,
    json::Json,
    store::{CommitBatch, ItemRow, Lease, OutboxRow, PKey, StatePatch, Store},
};
use watukuy_store_postgres::PostgresOptions;

const T0: i64 = 1_767_225_600_000;
/// Pending events (and items) committed for the key before the plans are checked.
const ROWS: usize = 5_000;
/// Ids in one ack: the acks of different ordering keys finishing together share a call, so an
/// ack carries up to the dispatcher's concurrency (16 by default) ids.
const ACK_IDS: usize = 16;
/// Identities in one `load_versions`: a page.
const PAGE: usize = 100;

fn key() -> PKey {
    PKey::new("orders", "")
}

fn event_id(i: usize) -> String {
    format!("evt-{i:06}")
}

fn identity(i: usize) -> String {
    format!("o{i:06}")
}

fn event(i: usize) -> Result<Event, CaseError> {
    let sequence = i64::try_from(i + 1).or_fail()?;
    let data = format!(r#"{{"id":"{}","total":12.5,"status":"paid"}}"#, identity(i));
    let mut event = Event::new(event_id(i), EventType::Created, "orders", identity(i));
    event.time = "2026-01-01T00:00:00.000Z".into();
    event.sequence = sequence;
    event.data = Some(Json::parse(&data).or_fail()?);
    Ok(event)
}

/// Commits `ROWS` new items and their pending events in pages of 500, as the engine does.
async fn backfill(store: &dyn Store, lease: &Lease) -> Result<(), CaseError> {
    for start in (0..ROWS).step_by(500) {
        let range = start..(start + 500).min(ROWS);
        let mut events = Vec::new();
        for i in range.clone() {
            events.push(OutboxRow::pending(event(i)?, T0));
        }
        let batch = CommitBatch::default()
            .state_patch(StatePatch {
                sequence: events.last().map(|row| row.sequence),
                updated_at: Some(T0),
                ..StatePatch::default()
            })
            .upserts(
                range
                    .map(|i| ItemRow {
                        identity: identity(i),
                        version: None,
                        hash: format!("hash-{i}"),
                        schema_version: 1,
                        payload: None,
                        seen_at: T0,
                    })
                    .collect(),
            )
            .events(events);
        store.commit_poll(&key(), lease, &batch).await?;
    }
    Ok(())
}

/// A statement of `sql/queries/` with the table names filled in as the store fills them.
fn statement(template: &str, schema: &str) -> String {
    let mut sql = template
        .replace(
            "{state_assignments}",
            include_str!("../sql/queries/state_assignments.sql").trim_end(),
        )
        .replace(
            "{load_pending}",
            include_str!("../sql/queries/load_pending.sql").trim_end(),
        );
    for table in ["pollers", "items", "outbox", "parked", "validators", "log"] {
        sql = sql.replace(
            &format!("{{{table}}}"),
            &format!("\"{schema}\".\"watukuy_{table}\""),
        );
    }
    sql
}

/// SQL literals for `EXECUTE`'s arguments (the values are the test's own).
fn text(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

fn texts(values: &[String]) -> String {
    if values.is_empty() {
        return "'{}'::text[]".to_owned();
    }
    let items: Vec<String> = values.iter().map(|v| text(v)).collect();
    format!("ARRAY[{}]::text[]", items.join(", "))
}

fn nulls(n: usize, ty: &str) -> String {
    if n == 0 {
        return format!("'{{}}'::{ty}[]");
    }
    format!("ARRAY[{}]::{ty}[]", vec!["NULL"; n].join(", "))
}

fn bigints(values: impl IntoIterator<Item = usize>) -> String {
    let items: Vec<String> = values.into_iter().map(|v| v.to_string()).collect();
    if items.is_empty() {
        return "'{}'::bigint[]".to_owned();
    }
    format!("ARRAY[{}]::bigint[]", items.join(", "))
}

/// Every node of an `EXPLAIN (FORMAT JSON)` plan, CTEs and subplans included.
fn nodes(plan: &Value) -> Vec<&Value> {
    let mut out = vec![plan];
    if let Some(children) = plan.get("Plans").and_then(Value::as_array) {
        for child in children {
            out.extend(nodes(child));
        }
    }
    out
}

fn field<'a>(node: &'a Value, name: &str) -> &'a str {
    node.get(name).and_then(Value::as_str).unwrap_or("")
}

/// What a statement's plan must do with one table.
enum Expect {
    /// Every read of the table is an index scan of `index` whose index condition includes
    /// `column` (a probe per id), never a scan of the key's range filtering `column`.
    Probe {
        table: &'static str,
        index: &'static str,
        column: &'static str,
    },
    /// The table is read through `index` in index order (no sort, no other access).
    Ordered {
        table: &'static str,
        index: &'static str,
    },
}

/// One statement to explain: its name, its SQL and its `EXECUTE` arguments.
struct Check {
    name: &'static str,
    sql: String,
    args: Vec<String>,
    expect: Vec<Expect>,
}

/// Explains `check` with a custom and a generic plan on `conn` and checks both.
async fn check_plans(conn: &mut PgConnection, check: &Check, when: &str) -> Result<(), CaseError> {
    let prepared = format!("wk_plan_{}", check.name);
    sqlx::raw_sql(&format!("PREPARE {prepared} AS {}", check.sql))
        .execute(&mut *conn)
        .await
        .map_err(|e| fail(format!("{}: cannot prepare: {e}", check.name)))?;
    for mode in ["force_custom_plan", "force_generic_plan"] {
        sqlx::raw_sql(&format!("SET plan_cache_mode = {mode}"))
            .execute(&mut *conn)
            .await
            .or_fail()?;
        let explain = format!(
            "EXPLAIN (FORMAT JSON) EXECUTE {prepared}({})",
            check.args.join(", ")
        );
        let row = sqlx::raw_sql(&explain)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| fail(format!("{}: cannot explain: {e}", check.name)))?;
        // The column is `json`, which this build of sqlx does not decode as such; its text is
        // the plan.
        let text: String = row
            .try_get_unchecked(0)
            .map_err(|e| fail(format!("{}: plan: {e}", check.name)))?;
        let plan: Value = serde_json::from_str(&text).or_fail()?;
        let root = plan
            .get(0)
            .and_then(|p| p.get("Plan"))
            .ok_or_else(|| fail(format!("{}: no plan in {text}", check.name)))?;
        let context = format!("{} ({when}, {mode})", check.name);
        verify(root, &check.expect, &context)?;
    }
    sqlx::raw_sql(&format!("DEALLOCATE {prepared}"))
        .execute(&mut *conn)
        .await
        .or_fail()?;
    Ok(())
}

fn verify(root: &Value, expect: &[Expect], context: &str) -> Result<(), CaseError> {
    let all = nodes(root);
    let shown = || serde_json::to_string_pretty(root).unwrap_or_default();
    for expectation in expect {
        let (table, index) = match expectation {
            Expect::Probe { table, index, .. } | Expect::Ordered { table, index } => {
                (*table, *index)
            }
        };
        let reads: Vec<&Value> = all
            .iter()
            .copied()
            .filter(|n| {
                field(n, "Relation Name") == table && field(n, "Node Type") != "ModifyTable"
            })
            .collect();
        if reads.is_empty() {
            return Err(fail(format!(
                "{context}: {table} is never read:\n{}",
                shown()
            )));
        }
        for read in reads {
            let kind = field(read, "Node Type");
            if !matches!(kind, "Index Scan" | "Index Only Scan")
                || field(read, "Index Name") != index
            {
                return Err(fail(format!(
                    "{context}: {table} is read by a {kind} of {:?}, expected an index scan of \
                     {index}:\n{}",
                    field(read, "Index Name"),
                    shown()
                )));
            }
            if let Expect::Probe { column, .. } = expectation {
                if !field(read, "Index Cond").contains(column) {
                    return Err(fail(format!(
                        "{context}: the index condition on {table} does not include {column} \
                         (a read of the key's range):\n{}",
                        shown()
                    )));
                }
                if field(read, "Filter").contains(column) {
                    return Err(fail(format!(
                        "{context}: {table} filters {column} instead of probing it:\n{}",
                        shown()
                    )));
                }
            }
        }
        if matches!(expectation, Expect::Ordered { .. })
            && all.iter().any(|n| field(n, "Node Type").contains("Sort"))
        {
            return Err(fail(format!(
                "{context}: {table} is sorted instead of read in index order:\n{}",
                shown()
            )));
        }
    }
    Ok(())
}

/// The hot statements with realistic arguments for the key that holds the backfill.
fn checks(schema: &str, lease: &Lease) -> Vec<Check> {
    let (poller, partition) = (text("orders"), text(""));
    let owner = text(&lease.owner);
    let epoch = lease.epoch.to_string();
    let acked: Vec<String> = (0..ACK_IDS).map(|i| event_id(i * 7)).collect();
    let page: Vec<String> = (0..PAGE).map(|i| identity(ROWS - PAGE + i)).collect();
    // A page as commit_poll gets it: 100 upserts of known items, 100 new events, two deleted
    // identities, no delivered ids, no log, nothing parked, no validators.
    let new_events: Vec<String> = (ROWS..ROWS + PAGE).map(event_id).collect();
    let bodies: Vec<String> = (ROWS..ROWS + PAGE)
        .map(|i| format!(r#"{{"id":"{}"}}"#, identity(i)))
        .collect();
    let mut commit_args = vec![poller.clone(), partition.clone()];
    commit_args.extend(std::iter::repeat_n("NULL".to_owned(), 13));
    commit_args.extend([
        owner.clone(),
        epoch.clone(),
        texts(&page),
        nulls(PAGE, "text"),
        texts(&page),
        bigints(std::iter::repeat_n(1, PAGE)),
        nulls(PAGE, "text"),
        bigints(std::iter::repeat_n(0, PAGE)),
        texts(&[identity(1), identity(2)]),
        texts(&new_events),
        bigints(ROWS + 1..=ROWS + PAGE),
        texts(&bodies),
        bigints(std::iter::repeat_n(0, PAGE)),
        nulls(PAGE, "bigint"),
        nulls(PAGE, "text"),
        bigints(std::iter::repeat_n(0, PAGE)),
        texts(&[]),
        bigints([]),
        texts(&[]),
        bigints([]),
    ]);
    for ty in [
        "text", "text", "text", "bigint", "text", "text", "bigint", "bigint", "text",
    ] {
        commit_args.push(nulls(0, ty));
    }
    for ty in ["text", "text", "text", "bigint"] {
        commit_args.push(nulls(0, ty));
    }
    let outbox_probe = || Expect::Probe {
        table: "watukuy_outbox",
        index: "watukuy_outbox_pkey",
        column: "event_id",
    };
    let items_probe = || Expect::Probe {
        table: "watukuy_items",
        index: "watukuy_items_pkey",
        column: "identity",
    };
    vec![
        Check {
            name: "ack_events",
            sql: statement(include_str!("../sql/queries/ack_events.sql"), schema),
            args: vec![
                poller.clone(),
                partition.clone(),
                owner.clone(),
                epoch.clone(),
                texts(&acked),
            ],
            expect: vec![outbox_probe()],
        },
        Check {
            name: "record_attempt",
            sql: statement(include_str!("../sql/queries/record_attempt.sql"), schema),
            args: vec![
                poller.clone(),
                partition.clone(),
                owner.clone(),
                epoch.clone(),
                text(&event_id(3)),
                text(r#"{"message":"boom"}"#),
                "NULL".to_owned(),
            ],
            expect: vec![outbox_probe()],
        },
        Check {
            name: "load_pending",
            sql: statement(include_str!("../sql/queries/load_pending.sql"), schema),
            args: vec![poller.clone(), partition.clone(), "100".to_owned()],
            expect: vec![Expect::Ordered {
                table: "watukuy_outbox",
                index: "watukuy_outbox_queue_idx",
            }],
        },
        Check {
            name: "load_pending_with_holds",
            sql: statement(
                include_str!("../sql/queries/load_pending_with_holds.sql"),
                schema,
            ),
            args: vec![poller.clone(), partition.clone(), "101".to_owned()],
            expect: vec![
                Expect::Ordered {
                    table: "watukuy_outbox",
                    index: "watukuy_outbox_queue_idx",
                },
                Expect::Ordered {
                    table: "watukuy_parked",
                    index: "watukuy_parked_hold_idx",
                },
            ],
        },
        Check {
            name: "load_versions",
            sql: statement(include_str!("../sql/queries/load_versions.sql"), schema),
            args: vec![poller.clone(), partition.clone(), texts(&page)],
            expect: vec![items_probe()],
        },
        Check {
            name: "commit_poll",
            sql: statement(include_str!("../sql/queries/commit_poll.sql"), schema),
            args: commit_args,
            expect: vec![items_probe(), outbox_probe()],
        },
    ]
}

/// 5,000 pending events and items committed through the store on a fresh schema, never
/// analyzed: the ack, `record_attempt`, `commit_poll` and `load_versions` probe the primary key
/// per id, `load_pending` reads the partial queue index in order (and so does
/// `load_pending_with_holds`, beside the partial hold index), with custom and generic
/// plans, before and after `ANALYZE`.
#[watukuy_testenv::requires(postgres, or_cfg(feature = "testcontainers"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn id_lookups_probe_the_primary_key_on_an_unanalyzed_schema() {
    with_schema("plans", 2, |schema| async move {
        let pool = &schema.pool;
        let store = schema.store(PostgresOptions::default()).await?;
        // Autovacuum must not analyze the tables in the middle of the test (it may be on).
        for table in ["watukuy_outbox", "watukuy_items"] {
            sqlx::query(&format!(
                "ALTER TABLE \"{schema}\".\"{table}\" SET (autovacuum_enabled = false)"
            ))
            .execute(pool)
            .await
            .or_fail()?;
        }
        let lease = store
            .acquire_lease(&key(), "node-a", 60_000, T0)
            .await?
            .ok_or_else(|| fail("no lease"))?;
        backfill(&store, &lease).await?;
        if store.counts(&key()).await.map(|c| c.pending)? != u64::try_from(ROWS).unwrap_or(0) {
            return Err(fail("the backfill is not pending"));
        }
        // Never analyzed (nor vacuumed): PostgreSQL marks that with reltuples = -1.
        let unanalyzed: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_class \
             WHERE relnamespace = $1::regnamespace AND relname IN ('watukuy_outbox', 'watukuy_items') \
               AND reltuples < 0",
        )
        .bind(&schema.name)
        .fetch_one(pool)
        .await
        .or_fail()?;
        if unanalyzed != 2 {
            return Err(fail("the tables were analyzed before the plans were checked"));
        }

        let mut conn = PgConnection::connect(&schema.url)
            .await
            .or_fail()?;
        for check in checks(&schema.name, &lease) {
            check_plans(&mut conn, &check, "never analyzed").await?;
        }
        for table in ["watukuy_outbox", "watukuy_items"] {
            sqlx::raw_sql(&format!("ANALYZE \"{schema}\".\"{table}\""))
                .execute(&mut conn)
                .await
                .or_fail()?;
        }
        for check in checks(&schema.name, &lease) {
            check_plans(&mut conn, &check, "analyzed").await?;
        }
        conn.close().await.or_fail()?;
        Ok(())
    })
    .await;
}
