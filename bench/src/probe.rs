//! The limit probe's cycle, ported from a standalone probe tool so that it runs in the same
//! process and run as the measurements it is the reference for.
//!
//! The cheapest possible outbox on each backend, through the drivers the stores use: insert `n`
//! rows in transactions of `batch`, then drain: select `batch` pending rows in sequence order,
//! parse each payload, and delete them in one statement (batched ack) or one at a time
//! (per-event ack). Differences from the original: tables and keys carry a `watukuy_bench`
//! name (the server is shared), Redis goes through the workspace's `redis` 1.x, and Postgres
//! reads `event::text` and parses it (the workspace builds sqlx without its `json` feature).

use std::path::Path;

use redis::AsyncCommands;
use watukuy_core::BoxError;

use crate::measure::{Stopwatch, rate};
use crate::stores::{REDIS_PREFIX, remove_sqlite};

/// Both figures of one backend.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Limit {
    /// Events/s with one delete per slice.
    pub(crate) batched: f64,
    /// Events/s with one delete per event.
    pub(crate) per_event: f64,
}

fn payload(i: i64) -> String {
    serde_json::json!({"id": format!("e{i}"), "type": "updated", "subject": format!("item-{}", i % 1000), "data": {"n": i, "status": "paid", "total": 12.5}}).to_string()
}

fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// The Postgres cycle.
pub(crate) async fn postgres(
    url: &str,
    n: i64,
    batch: i64,
    per_event: bool,
) -> Result<f64, BoxError> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(url)
        .await?;
    sqlx::query("drop table if exists watukuy_bench_probe_outbox")
        .execute(&pool)
        .await?;
    sqlx::query("create table watukuy_bench_probe_outbox (seq bigint primary key, event_id text not null unique, key text not null, event jsonb not null, status text not null default 'pending')")
        .execute(&pool)
        .await?;
    let t = Stopwatch::start();
    for start in (0..n).step_by(usize::try_from(batch)?) {
        let seqs: Vec<i64> = (start..(start + batch).min(n)).collect();
        let ids: Vec<String> = seqs.iter().map(|i| format!("e{i}")).collect();
        let keys: Vec<String> = seqs.iter().map(|i| format!("item-{}", i % 1000)).collect();
        let evs: Vec<String> = seqs.iter().map(|i| payload(*i)).collect();
        let mut tx = pool.begin().await?;
        sqlx::query("insert into watukuy_bench_probe_outbox (seq, event_id, key, event) select * from unnest($1::bigint[], $2::text[], $3::text[], $4::text[]::jsonb[])")
            .bind(&seqs)
            .bind(&ids)
            .bind(&keys)
            .bind(&evs)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
    }
    loop {
        let rows: Vec<(i64, String, String)> = sqlx::query_as("select seq, event_id, event::text from watukuy_bench_probe_outbox where status='pending' order by seq limit $1")
            .bind(batch)
            .fetch_all(&pool)
            .await?;
        if rows.is_empty() {
            break;
        }
        for r in &rows {
            let _v: serde_json::Value = serde_json::from_str(&r.2)?;
        }
        if per_event {
            for r in &rows {
                sqlx::query("delete from watukuy_bench_probe_outbox where event_id = $1")
                    .bind(&r.1)
                    .execute(&pool)
                    .await?;
            }
        } else {
            let ids: Vec<String> = rows.iter().map(|r| r.1.clone()).collect();
            sqlx::query("delete from watukuy_bench_probe_outbox where event_id = any($1)")
                .bind(&ids)
                .execute(&pool)
                .await?;
        }
    }
    let elapsed = t.elapsed();
    sqlx::query("drop table if exists watukuy_bench_probe_outbox")
        .execute(&pool)
        .await?;
    pool.close().await;
    Ok(rate(count(n), elapsed))
}

/// The MySQL / MariaDB cycle: multi-row inserts in transactions of `batch`, the payload as
/// bytes in a LONGBLOB (the store keeps JSON the same way), `IN (…)` for the batched delete.
pub(crate) async fn mysql(url: &str, n: i64, batch: i64, per_event: bool) -> Result<f64, BoxError> {
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(4)
        .connect(url)
        .await?;
    sqlx::query("drop table if exists watukuy_bench_probe_outbox")
        .execute(&pool)
        .await?;
    sqlx::query("create table watukuy_bench_probe_outbox (seq bigint primary key, event_id varbinary(64) not null unique, item_key varbinary(64) not null, event longblob not null, status tinyint not null default 0, key pending (status, seq)) engine=InnoDB")
        .execute(&pool)
        .await?;
    let marks = |k: usize, row: &str| vec![row; k].join(",");
    let t = Stopwatch::start();
    for start in (0..n).step_by(usize::try_from(batch)?) {
        let seqs: Vec<i64> = (start..(start + batch).min(n)).collect();
        let sql = format!(
            "insert into watukuy_bench_probe_outbox (seq, event_id, item_key, event) values {}",
            marks(seqs.len(), "(?,?,?,?)")
        );
        let mut q = sqlx::query(&sql);
        for i in &seqs {
            q = q
                .bind(*i)
                .bind(format!("e{i}"))
                .bind(format!("item-{}", i % 1000))
                .bind(payload(*i).into_bytes());
        }
        let mut tx = pool.begin().await?;
        q.execute(&mut *tx).await?;
        tx.commit().await?;
    }
    loop {
        let rows: Vec<(i64, Vec<u8>, Vec<u8>)> = sqlx::query_as("select seq, event_id, event from watukuy_bench_probe_outbox where status = 0 order by seq limit ?")
            .bind(batch)
            .fetch_all(&pool)
            .await?;
        if rows.is_empty() {
            break;
        }
        for r in &rows {
            let _v: serde_json::Value = serde_json::from_slice(&r.2)?;
        }
        if per_event {
            for r in &rows {
                sqlx::query("delete from watukuy_bench_probe_outbox where event_id = ?")
                    .bind(&r.1)
                    .execute(&pool)
                    .await?;
            }
        } else {
            let sql = format!(
                "delete from watukuy_bench_probe_outbox where event_id in ({})",
                marks(rows.len(), "?")
            );
            let mut q = sqlx::query(&sql);
            for r in &rows {
                q = q.bind(&r.1);
            }
            q.execute(&pool).await?;
        }
    }
    let elapsed = t.elapsed();
    sqlx::query("drop table if exists watukuy_bench_probe_outbox")
        .execute(&pool)
        .await?;
    pool.close().await;
    Ok(rate(count(n), elapsed))
}

/// The SQLite cycle (WAL, `synchronous=normal`), on a file in `dir`.
pub(crate) fn sqlite(dir: &Path, n: i64, batch: i64, per_event: bool) -> Result<f64, BoxError> {
    let path = dir.join("watukuy-bench-probe.db");
    remove_sqlite(&path);
    let mut c = rusqlite::Connection::open(&path)?;
    c.execute_batch("pragma journal_mode=wal; pragma synchronous=normal; create table probe_outbox (seq integer primary key, event_id text not null unique, key text not null, event text not null, status text not null default 'pending'); create index po on probe_outbox(status, seq);")?;
    let t = Stopwatch::start();
    for start in (0..n).step_by(usize::try_from(batch)?) {
        let tx = c.transaction()?;
        {
            let mut st = tx.prepare_cached(
                "insert into probe_outbox (seq, event_id, key, event) values (?1, ?2, ?3, ?4)",
            )?;
            for i in start..(start + batch).min(n) {
                st.execute(rusqlite::params![
                    i,
                    format!("e{i}"),
                    format!("item-{}", i % 1000),
                    payload(i)
                ])?;
            }
        }
        tx.commit()?;
    }
    loop {
        let rows: Vec<(i64, String, String)> = {
            let mut st = c.prepare_cached(
                "select seq, event_id, event from probe_outbox where status='pending' order by seq limit ?1",
            )?;
            st.query_map([batch], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect::<Result<_, _>>()?
        };
        if rows.is_empty() {
            break;
        }
        for r in &rows {
            let _v: serde_json::Value = serde_json::from_str(&r.2)?;
        }
        if per_event {
            for r in &rows {
                c.execute("delete from probe_outbox where event_id = ?1", [&r.1])?;
            }
        } else {
            let tx = c.transaction()?;
            {
                let mut st = tx.prepare_cached("delete from probe_outbox where event_id = ?1")?;
                for r in &rows {
                    st.execute([&r.1])?;
                }
            }
            tx.commit()?;
        }
    }
    let elapsed = t.elapsed();
    drop(c);
    remove_sqlite(&path);
    Ok(rate(count(n), elapsed))
}

/// The Redis cycle (a sorted set of ids and a hash of payloads, MULTI/EXEC pipelines).
pub(crate) async fn redis_probe(
    url: &str,
    n: i64,
    batch: i64,
    per_event: bool,
) -> Result<f64, BoxError> {
    let client = redis::Client::open(url)?;
    let mut c = client.get_multiplexed_async_connection().await?;
    let z = format!("{REDIS_PREFIX}probe:z");
    let h = format!("{REDIS_PREFIX}probe:h");
    let _: () = c.del(&[&z, &h]).await?;
    let t = Stopwatch::start();
    for start in (0..n).step_by(usize::try_from(batch)?) {
        let mut p = redis::pipe();
        p.atomic();
        for i in start..(start + batch).min(n) {
            p.zadd(&z, format!("e{i}"), i).ignore();
            p.hset(&h, format!("e{i}"), payload(i)).ignore();
        }
        let _: () = p.query_async(&mut c).await?;
    }
    loop {
        let ids: Vec<String> = redis::cmd("ZRANGE")
            .arg(&z)
            .arg(0)
            .arg(batch - 1)
            .query_async(&mut c)
            .await?;
        if ids.is_empty() {
            break;
        }
        let vals: Vec<String> = redis::cmd("HMGET")
            .arg(&h)
            .arg(&ids)
            .query_async(&mut c)
            .await?;
        for v in &vals {
            let _v: serde_json::Value = serde_json::from_str(v)?;
        }
        if per_event {
            for id in &ids {
                let mut p = redis::pipe();
                p.atomic().zrem(&z, id).ignore().hdel(&h, id).ignore();
                let _: () = p.query_async(&mut c).await?;
            }
        } else {
            let mut p = redis::pipe();
            p.atomic().zrem(&z, &ids).ignore().hdel(&h, &ids).ignore();
            let _: () = p.query_async(&mut c).await?;
        }
    }
    Ok(rate(count(n), t.elapsed()))
}
