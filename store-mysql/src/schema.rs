//! Versioned migrations, applied under a server-wide named lock (`GET_LOCK`) so that instances
//! starting together never run the same step twice.
//!
//! MySQL and MariaDB commit every DDL statement on its own (no transactional DDL), so each step
//! is written to be re-runnable (`CREATE TABLE IF NOT EXISTS`) and the version row is written
//! after the step: a process killed in the middle of a step leaves a schema the next `migrate`
//! finishes.

use sqlx::MySqlConnection;
use watukuy_core::{Error, Result, store::StoreErrorKind};

use crate::error::OrStore;
use crate::sql::Tables;

/// The newest schema version this crate writes and reads.
pub const SCHEMA_VERSION: i32 = 1;

/// The statements of migration `version` (1-based) for the tables named by `t`.
fn steps(version: i32, t: &Tables) -> Vec<String> {
    match version {
        1 => vec![
            table(
                &t.keys,
                "holder VARBINARY(255) NULL,
                 epoch BIGINT NOT NULL,
                 expires_at BIGINT NOT NULL,
                 listed TINYINT NOT NULL,
                 state_json LONGBLOB NULL,
                 PRIMARY KEY (poller, part)",
            ),
            table(
                &t.items,
                "identity VARBINARY(1024) NOT NULL,
                 item_version LONGBLOB NULL,
                 item_hash LONGBLOB NOT NULL,
                 schema_version INT UNSIGNED NOT NULL,
                 payload LONGBLOB NULL,
                 seen_at BIGINT NOT NULL,
                 PRIMARY KEY (poller, part, identity)",
            ),
            table(
                &t.outbox,
                "event_id VARBINARY(255) NOT NULL,
                 seq BIGINT NOT NULL,
                 event_json LONGBLOB NOT NULL,
                 delivered TINYINT NOT NULL,
                 attempts INT UNSIGNED NOT NULL,
                 next_attempt_at BIGINT NULL,
                 last_error LONGBLOB NULL,
                 created_at BIGINT NOT NULL,
                 PRIMARY KEY (poller, part, event_id),
                 KEY pending (poller, part, delivered, seq)",
            ),
            table(
                &t.parked,
                "id VARBINARY(255) NOT NULL,
                 kind VARBINARY(16) NOT NULL,
                 event_json LONGBLOB NULL,
                 item LONGBLOB NULL,
                 error_json LONGBLOB NOT NULL,
                 attempts INT UNSIGNED NOT NULL,
                 parked_at BIGINT NOT NULL,
                 hold_key LONGBLOB NULL,
                 PRIMARY KEY (poller, part, id),
                 KEY by_time (poller, part, parked_at, id)",
            ),
            table(
                &t.validators,
                "url_hash VARBINARY(255) NOT NULL,
                 etag LONGBLOB NULL,
                 last_modified LONGBLOB NULL,
                 stored_at BIGINT NOT NULL,
                 PRIMARY KEY (poller, part, url_hash)",
            ),
            table(
                &t.log,
                "seq BIGINT NOT NULL,
                 event_json LONGBLOB NOT NULL,
                 created_at BIGINT NOT NULL,
                 PRIMARY KEY (poller, part, seq),
                 KEY by_time (poller, part, created_at)",
            ),
        ],
        _ => Vec::new(),
    }
}

/// `CREATE TABLE IF NOT EXISTS` of `name`: every table belongs to one key `(poller, part)`, whose
/// columns come first, then `columns` (the rest, with the primary key and indexes).
///
/// Byte-wise comparison everywhere: ids, identities and keys are VARBINARY (no collation, no
/// trailing-space padding); JSON is LONGBLOB (the text exactly as given: MySQL's JSON type
/// reorders keys and MariaDB's is LONGTEXT with a check). Engine and row format are explicit so
/// the 3072-byte index limit holds on old defaults too.
fn table(name: &str, columns: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {name} (
                    poller VARBINARY(255) NOT NULL,
                    part VARBINARY(255) NOT NULL,
                    {columns}
                ) ENGINE=InnoDB ROW_FORMAT=DYNAMIC"
    )
}

/// The whole schema as one script, each statement ending in `;`: the version table, every
/// version's statements in order, and the version row, all idempotent (the version row never
/// goes down), so that `migrate` then finds the schema current and changes nothing.
pub(crate) fn ddl(t: &Tables) -> String {
    let mut out = format!("{};\n", version_table(t));
    for statement in (1..=SCHEMA_VERSION).flat_map(|v| steps(v, t)) {
        out.push_str(&statement);
        out.push_str(";\n");
    }
    out.push_str(&format!(
        "INSERT INTO {} (id, version) VALUES (1, {SCHEMA_VERSION}) \
         ON DUPLICATE KEY UPDATE version = GREATEST(version, {SCHEMA_VERSION});\n",
        t.schema_version
    ));
    out
}

/// The one-row table that holds the schema version.
fn version_table(t: &Tables) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (id TINYINT NOT NULL PRIMARY KEY, version INT NOT NULL) \
         ENGINE=InnoDB",
        t.schema_version
    )
}

/// Brings the schema to [`SCHEMA_VERSION`] on `conn`, holding the named lock throughout.
pub(crate) async fn migrate(
    conn: &mut MySqlConnection,
    t: &Tables,
    lock_timeout_secs: u32,
) -> Result<()> {
    let lock = take_named_lock(
        conn,
        "watukuy-migrate",
        &t.prefix,
        lock_timeout_secs,
        "migrate",
    )
    .await?;
    let outcome = apply(conn, t).await;
    let released = release_named_lock(conn, &lock, "migrate").await;
    outcome?;
    released
}

/// A server-wide named lock (`GET_LOCK`), as [`take_named_lock`] took it.
/// Its name is `<family>:<SHA1(database/name)>`: lock names are server-wide and at most 64
/// characters.
pub(crate) struct NamedLock {
    family: String,
    /// `database/name`.
    shown: String,
}

/// Takes the named lock of `name` in `conn`'s database under `family` (waiting up to
/// `timeout_secs`); `doing` starts every error message. A `Config` error when the pool's URL
/// names no database, a transient `Busy` store error when another process held the lock too
/// long.
pub(crate) async fn take_named_lock(
    conn: &mut MySqlConnection,
    family: &str,
    name: &str,
    timeout_secs: u32,
    doing: &str,
) -> Result<NamedLock> {
    let database: Option<String> = sqlx::query_scalar("SELECT DATABASE()")
        .fetch_one(&mut *conn)
        .await
        .store(&format!("{doing}: read the current database"))?;
    let Some(database) = database else {
        return Err(Error::config(
            "url",
            "the MySQL URL names no database (mysql://user@host/<database>)",
        ));
    };
    let shown = format!("{database}/{name}");
    let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(CONCAT(?, ':', SHA1(?)), ?)")
        .bind(family)
        .bind(&shown)
        .bind(timeout_secs)
        .fetch_one(&mut *conn)
        .await
        .store(&format!("{doing}: take the migration lock"))?;
    match got {
        Some(1) => Ok(NamedLock {
            family: family.to_owned(),
            shown,
        }),
        Some(_) => Err(Error::store(
            StoreErrorKind::Busy,
            true,
            format!(
                "{doing}: another process held the migration lock of {shown} for more than \
                 {timeout_secs} s"
            ),
        )),
        None => Err(Error::store(
            StoreErrorKind::Other,
            false,
            format!("{doing}: GET_LOCK failed for the migration lock of {shown}"),
        )),
    }
}

/// Releases a lock [`take_named_lock`] took on `conn`.
pub(crate) async fn release_named_lock(
    conn: &mut MySqlConnection,
    lock: &NamedLock,
    doing: &str,
) -> Result<()> {
    sqlx::query("SELECT RELEASE_LOCK(CONCAT(?, ':', SHA1(?)))")
        .bind(&lock.family)
        .bind(&lock.shown)
        .execute(&mut *conn)
        .await
        .store(&format!(
            "{doing}: release the migration lock of {}",
            lock.shown
        ))
        .map(|_| ())
}

async fn apply(conn: &mut MySqlConnection, t: &Tables) -> Result<()> {
    sqlx::query(&version_table(t))
        .execute(&mut *conn)
        .await
        .store("migrate: create the schema version table")?;
    let current: Option<i32> = sqlx::query_scalar(&format!(
        "SELECT version FROM {} WHERE id = 1",
        t.schema_version
    ))
    .fetch_optional(&mut *conn)
    .await
    .store("migrate: read the schema version")?;
    let current = current.unwrap_or(0);
    if current > SCHEMA_VERSION {
        return Err(Error::store(
            StoreErrorKind::Schema,
            false,
            format!(
                "migrate: the tables `{}*` are at schema version {current}, newer than the {} \
                 this watukuy-store-mysql knows: upgrade it",
                t.prefix, SCHEMA_VERSION
            ),
        ));
    }
    for version in current + 1..=SCHEMA_VERSION {
        for statement in steps(version, t) {
            sqlx::query(&statement)
                .execute(&mut *conn)
                .await
                .store(&format!("migrate: step {version}"))?;
        }
        sqlx::query(&format!(
            "INSERT INTO {} (id, version) VALUES (1, ?) ON DUPLICATE KEY UPDATE version = ?",
            t.schema_version
        ))
        .bind(version)
        .bind(version)
        .execute(&mut *conn)
        .await
        .store(&format!("migrate: record schema version {version}"))?;
    }
    Ok(())
}
