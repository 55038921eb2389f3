//! The store: [`MySqlStore`], its connection and migration, and its [`Store`] implementation.

use std::collections::{BTreeSet, HashMap};
use std::str::FromStr;

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use sqlx::mysql::{MySql, MySqlConnectOptions, MySqlPoolOptions};
use sqlx::{Executor, MySqlConnection, MySqlPool, Transaction};
use watukuy_core::{
    Error, Event, Result,
    store::{
        Capabilities, Claim, CommitBatch, ItemRow, KeyCounts, Lease, LogQuery, LoggedEvent,
        OutboxRow, OutboxStatus, PKey, ParkedAction, ParkedKind, ParkedQuery, ParkedRow,
        PollerState, SerializedError, StatePatch, Store, StoreErrorKind, UrlValidator, Validator,
    },
};

use crate::codec::{count, decode, encode, kind_from, opt_decode, opt_text, raw_json, text};
use crate::error::OrStore;
use crate::options::MySqlOptions;
use crate::schema;
use crate::sql::{
    MAX_ROWS, MyQuery, Tables, check_len, limit, marks, padded, padded_rows, write_rows,
};

/// A watukuy store on MySQL 5.7+/8.x or MariaDB 10.3+. Cheap to clone (a pool handle).
#[derive(Clone, Debug)]
pub struct MySqlStore {
    pool: MySqlPool,
    tables: std::sync::Arc<Tables>,
    migrate_lock_timeout_secs: u32,
}

/// The driver's options for `url`, before any connection: a URL the driver does not take is a
/// `Config` error that never repeats the URL (it may hold a password).
fn connect_options(url: &str) -> Result<MySqlConnectOptions> {
    MySqlConnectOptions::from_str(url)
        .map_err(|e| Error::config("url", format!("not a MySQL URL: {e}")))
}

impl MySqlStore {
    /// Opens a pool on `url` (`mysql://user:password@host:port/database`, with the driver's
    /// parameters such as `ssl-mode=REQUIRED`, `ssl-ca=/path/ca.pem` or `socket=/run/mysqld.sock`)
    /// and checks that one connection works. Call [`migrate`](watukuy_core::store::Store::migrate)
    /// before use.
    ///
    /// A URL that does not parse or options that are out of range are `Config` errors; a server
    /// that cannot be reached is a transient `Store` error.
    pub async fn connect(url: &str, options: MySqlOptions) -> Result<Self> {
        options.validate()?;
        let connect = connect_options(url)?;
        let pool = MySqlPoolOptions::new()
            .max_connections(options.max_connections)
            .connect_with(connect)
            .await
            .store("connect to MySQL")?;
        Self::from_pool(pool, options)
    }

    /// A store on a pool you built (its size, timeouts and TLS are yours; `max_connections` of
    /// `options` is not used). The store needs nothing of the pool's sessions: isolation is set
    /// per transaction.
    pub fn from_pool(pool: MySqlPool, options: MySqlOptions) -> Result<Self> {
        options.validate()?;
        Ok(Self {
            pool,
            tables: std::sync::Arc::new(Tables::new(&options.table_prefix)),
            migrate_lock_timeout_secs: options.migrate_lock_timeout_secs,
        })
    }

    /// Creates or upgrades the tables (the `Store` method, callable without importing the
    /// trait): safe when many instances run it at once.
    pub async fn migrate(&self) -> Result<()> {
        watukuy_core::store::Store::migrate(self).await
    }

    /// Closes the pool (the `Store` method, callable without importing the trait); later calls
    /// fail with a permanent store error.
    pub async fn close(&self) -> Result<()> {
        watukuy_core::store::Store::close(self).await
    }

    /// The complete, idempotent DDL `migrate` applies for `options`' table prefix, for teams
    /// that manage schemas themselves: the version table, every version's tables in order and
    /// the version row, one script of `;`-terminated statements (for the `mysql` client or a
    /// migration tool), so that `migrate` then finds the schema current and changes nothing.
    /// Running it twice is harmless.
    ///
    /// Fails with a `Config` error when the prefix is not an identifier.
    ///
    /// ```
    /// use watukuy_store_mysql::{MySqlOptions, MySqlStore};
    ///
    /// let ddl = MySqlStore::ddl(&MySqlOptions::default().table_prefix("orders_"))?;
    /// assert!(ddl.contains("CREATE TABLE IF NOT EXISTS `orders_outbox`"));
    /// # Ok::<(), watukuy_core::Error>(())
    /// ```
    pub fn ddl(options: &MySqlOptions) -> Result<String> {
        options.validate()?;
        Ok(schema::ddl(&Tables::new(&options.table_prefix)))
    }

    /// The pool, for queries of your own next to the store's.
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// The store's table names, quoted, each `<prefix><name>` (for tests and operators).
    pub fn table_names(&self) -> Vec<String> {
        let t = &self.tables;
        [
            &t.keys,
            &t.items,
            &t.outbox,
            &t.parked,
            &t.validators,
            &t.log,
            &t.schema_version,
        ]
        .into_iter()
        .cloned()
        .collect()
    }
}

/// Every transaction: `READ COMMITTED` (no gap locks, so keys never block each other), set for
/// this transaction only, in the same round trip as `START TRANSACTION`.
const BEGIN: &str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION";

/// A transaction on a pooled connection.
pub(crate) type Tx = Transaction<'static, MySql>;

/// Opens a `READ COMMITTED` transaction on a connection of `pool`, cancel-safe.
///
/// The engine drops store futures at any `.await` (a cancelled delivery drops its
/// `record_attempt`, say). A `Transaction` dropped after it began queues a `ROLLBACK`, but the
/// driver's begin is not cancel-safe: dropped after `START TRANSACTION` was sent and before its
/// answer came back, it returns the connection to the pool *inside* a transaction, and the next
/// user's autocommit writes hold their locks forever. So the begin runs in a task of its own
/// that always finishes: a caller that went away leaves a `Transaction` the task drops, which
/// rolls back.
pub(crate) async fn begin(pool: &MySqlPool, doing: &str) -> Result<Tx> {
    let pool = pool.clone();
    let begun = tokio::spawn(async move { pool.begin_with(BEGIN).await });
    match begun.await {
        Ok(tx) => tx.store(doing),
        Err(join) => Err(Error::store(
            StoreErrorKind::Other,
            true,
            format!("{doing}: the task opening the transaction failed: {join}"),
        )),
    }
}

/// A lease taken, with what `claim` reads under it (the stored state, whether an event is
/// pending) when asked for.
type TakenLease = (Lease, Option<(Option<Vec<u8>>, bool)>);

/// A key's row as the fence reads it.
struct KeyRow {
    holder: Option<Vec<u8>>,
    epoch: i64,
    expires_at: i64,
    state: Option<Vec<u8>>,
}

/// A row of the outbox, encoded for a multi-row `REPLACE`.
struct OutboxOut<'a> {
    row: &'a OutboxRow,
    event_json: String,
    last_error: Option<String>,
}

/// A row of the replay log, encoded.
struct LogOut<'a> {
    sequence: i64,
    event_json: &'a str,
    created_at: i64,
}

/// A parked row, encoded.
struct ParkedOut<'a> {
    row: &'a ParkedRow,
    event_json: Option<String>,
    error_json: String,
}

/// `usize` limits as the `BIGINT UNSIGNED` a `LIMIT ?` takes.
fn limit_arg(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

fn key_bytes(key: &PKey) -> (&[u8], &[u8]) {
    (key.poller.as_bytes(), key.partition.as_bytes())
}

/// Ids without repeats, in a stable order.
fn distinct(ids: &[String]) -> Vec<&str> {
    ids.iter()
        .map(String::as_str)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

impl MySqlStore {
    /// Opens a transaction on a pooled connection (see [`begin`]).
    async fn begin(&self, doing: &str) -> Result<Tx> {
        begin(&self.pool, doing).await
    }

    /// Takes the lease of `key` for `owner` in one transaction; with `read`, also reads the
    /// key's stored state and whether its outbox holds a pending row, under the row lock (so
    /// after any fenced write in flight committed: `READ COMMITTED` reads see it).
    async fn take_lease(
        &self,
        key: &PKey,
        owner: &str,
        ttl_ms: i64,
        now_ms: i64,
        read: bool,
    ) -> Result<Option<TakenLease>> {
        let doing = format!("{} on {key}", if read { "claim" } else { "acquire_lease" });
        check_len("lease owner", owner, limit::NAME)?;
        let mut tx = self.begin(&doing).await?;
        self.ensure_key(&mut tx, key, &doing).await?;
        let Some(row) = self.lock_key(&mut tx, key, read, &doing).await? else {
            return Err(Error::store(
                StoreErrorKind::Other,
                true,
                format!("{doing}: the key's row vanished under its lock"),
            ));
        };
        let held_by_other = row
            .holder
            .as_deref()
            .is_some_and(|holder| holder != owner.as_bytes());
        if held_by_other && row.expires_at > now_ms {
            tx.rollback().await.store(&doing)?;
            return Ok(None);
        }
        let epoch = row.epoch;
        let epoch = epoch.checked_add(1).ok_or_else(|| {
            Error::store(
                StoreErrorKind::Corrupt,
                false,
                format!("{doing}: the epoch counter is at its maximum"),
            )
        })?;
        let extra = if read {
            let pending: bool = sqlx::query_scalar(&format!(
                "SELECT EXISTS (SELECT 1 FROM {} WHERE poller = ? AND part = ? AND delivered = 0)",
                self.tables.outbox
            ))
            .bind(key.poller.as_bytes())
            .bind(key.partition.as_bytes())
            .fetch_one(&mut *tx)
            .await
            .store(&doing)?;
            Some((row.state, pending))
        } else {
            None
        };
        let expires_at = now_ms.saturating_add(ttl_ms);
        sqlx::query(&format!(
            "UPDATE {} SET holder = ?, epoch = ?, expires_at = ?, listed = 1 \
             WHERE poller = ? AND part = ?",
            self.tables.keys
        ))
        .bind(owner.as_bytes())
        .bind(epoch)
        .bind(expires_at)
        .bind(key.poller.as_bytes())
        .bind(key.partition.as_bytes())
        .execute(&mut *tx)
        .await
        .store(&doing)?;
        tx.commit().await.store(&doing)?;
        let lease = Lease {
            owner: owner.to_owned(),
            epoch,
            expires_at,
        };
        Ok(Some((lease, extra)))
    }

    /// Locks the key's row and reads its lease (and its state when `with_state`); `None` when
    /// the key has no row.
    async fn lock_key(
        &self,
        conn: &mut MySqlConnection,
        key: &PKey,
        with_state: bool,
        doing: &str,
    ) -> Result<Option<KeyRow>> {
        let (poller, part) = key_bytes(key);
        let sql = format!(
            "SELECT holder, epoch, expires_at, {} FROM {} WHERE poller = ? AND part = ? FOR UPDATE",
            if with_state { "state_json" } else { "NULL" },
            self.tables.keys
        );
        let row = sqlx::query_as::<_, (Option<Vec<u8>>, i64, i64, Option<Vec<u8>>)>(&sql)
            .bind(poller)
            .bind(part)
            .fetch_optional(&mut *conn)
            .await
            .store(doing)?;
        Ok(row.map(|(holder, epoch, expires_at, state)| KeyRow {
            holder,
            epoch,
            expires_at,
            state,
        }))
    }

    /// The fence: locks the key's row and checks that `lease` is its current lease. On a
    /// mismatch the transaction is rolled back and the error is `LeaseLost`. Returns the stored
    /// state (when `with_state`).
    async fn fence(
        &self,
        tx: &mut Tx,
        key: &PKey,
        lease: &Lease,
        with_state: bool,
        doing: &str,
    ) -> Result<std::result::Result<Option<Vec<u8>>, Error>> {
        let row = self.lock_key(tx, key, with_state, doing).await?;
        Ok(match row {
            Some(row)
                if row.holder.as_deref() == Some(lease.owner.as_bytes())
                    && row.epoch == lease.epoch =>
            {
                Ok(row.state)
            }
            _ => Err(Error::lease_lost(key, lease.epoch)),
        })
    }

    /// Opens a transaction and passes the fence, or rolls back and fails with `LeaseLost`.
    async fn fenced(
        &self,
        key: &PKey,
        lease: &Lease,
        with_state: bool,
        doing: &str,
    ) -> Result<(Tx, Option<Vec<u8>>)> {
        let mut tx = self.begin(doing).await?;
        match self.fence(&mut tx, key, lease, with_state, doing).await? {
            Ok(state) => Ok((tx, state)),
            Err(lost) => {
                tx.rollback().await.store(doing)?;
                Err(lost)
            }
        }
    }

    /// Runs `head` + `(…) IN (ids)` for every chunk of `ids`, padded like multi-row writes;
    /// returns the rows affected.
    async fn delete_in(
        &self,
        conn: &mut MySqlConnection,
        head: &str,
        key: &PKey,
        ids: &[&str],
        doing: &str,
    ) -> Result<u64> {
        let (poller, part) = key_bytes(key);
        let mut affected = 0;
        for chunk in ids.chunks(MAX_ROWS) {
            let n = padded(chunk.len());
            let sql = format!("{head} IN ({})", marks(n));
            let mut query = sqlx::query(&sql).bind(poller).bind(part);
            for id in padded_rows(chunk, n) {
                query = query.bind(id.as_bytes());
            }
            affected += conn.execute(query).await.store(doing)?.rows_affected();
        }
        Ok(affected)
    }

    async fn write_items(
        &self,
        conn: &mut MySqlConnection,
        key: &PKey,
        rows: &[ItemRow],
        doing: &str,
    ) -> Result<()> {
        let head = format!(
            "REPLACE INTO {} (poller, part, identity, item_version, item_hash, schema_version, \
             payload, seen_at)",
            self.tables.items
        );
        write_rows(
            conn,
            (&head, 8),
            key,
            rows,
            |r| {
                r.identity.len()
                    + r.version.as_ref().map_or(0, String::len)
                    + r.hash.len()
                    + r.payload.as_ref().map_or(0, |p| p.as_str().len())
                    + 32
            },
            |q: MyQuery<'_>, r| {
                q.bind(r.identity.as_bytes())
                    .bind(r.version.as_deref().map(str::as_bytes))
                    .bind(r.hash.as_bytes())
                    .bind(r.schema_version)
                    .bind(r.payload.as_ref().map(|p| p.as_str().as_bytes()))
                    .bind(r.seen_at)
            },
            doing,
        )
        .await
    }

    async fn write_outbox(
        &self,
        conn: &mut MySqlConnection,
        key: &PKey,
        rows: &[OutboxOut<'_>],
        doing: &str,
    ) -> Result<()> {
        let head = format!(
            "REPLACE INTO {} (poller, part, event_id, seq, event_json, delivered, attempts, \
             next_attempt_at, last_error, created_at)",
            self.tables.outbox
        );
        write_rows(
            conn,
            (&head, 10),
            key,
            rows,
            |r| {
                r.row.event_id.len()
                    + r.event_json.len()
                    + r.last_error.as_ref().map_or(0, String::len)
                    + 48
            },
            |q: MyQuery<'_>, r| {
                q.bind(r.row.event_id.as_bytes())
                    .bind(r.row.sequence)
                    .bind(r.event_json.as_bytes())
                    .bind(i8::from(r.row.status == OutboxStatus::Delivered))
                    .bind(r.row.attempts)
                    .bind(r.row.next_attempt_at)
                    .bind(r.last_error.as_deref().map(str::as_bytes))
                    .bind(r.row.created_at)
            },
            doing,
        )
        .await
    }

    async fn write_parked(
        &self,
        conn: &mut MySqlConnection,
        key: &PKey,
        rows: &[ParkedOut<'_>],
        doing: &str,
    ) -> Result<()> {
        let head = format!(
            "REPLACE INTO {} (poller, part, id, kind, event_json, item, error_json, attempts, \
             parked_at, hold_key)",
            self.tables.parked
        );
        write_rows(
            conn,
            (&head, 10),
            key,
            rows,
            |r| {
                r.row.id.len()
                    + r.event_json.as_ref().map_or(0, String::len)
                    + r.row.item.as_ref().map_or(0, |i| i.as_str().len())
                    + r.error_json.len()
                    + r.row.hold_key.as_ref().map_or(0, String::len)
                    + 32
            },
            |q: MyQuery<'_>, r| {
                q.bind(r.row.id.as_bytes())
                    .bind(r.row.kind.as_str().as_bytes())
                    .bind(r.event_json.as_deref().map(str::as_bytes))
                    .bind(r.row.item.as_ref().map(|i| i.as_str().as_bytes()))
                    .bind(r.error_json.as_bytes())
                    .bind(r.row.attempts)
                    .bind(r.row.parked_at)
                    .bind(r.row.hold_key.as_deref().map(str::as_bytes))
            },
            doing,
        )
        .await
    }

    /// The stored state of a key, decoded.
    fn state_of(key: &PKey, bytes: Option<Vec<u8>>) -> Result<Option<PollerState>> {
        opt_decode(&format!("the state of {key}"), bytes)
    }

    async fn write_state(
        &self,
        conn: &mut MySqlConnection,
        key: &PKey,
        state: &PollerState,
        doing: &str,
    ) -> Result<()> {
        let json = encode(&format!("the state of {key}"), state)?;
        let (poller, part) = key_bytes(key);
        sqlx::query(&format!(
            "UPDATE {} SET state_json = ?, listed = 1 WHERE poller = ? AND part = ?",
            self.tables.keys
        ))
        .bind(json.as_bytes())
        .bind(poller)
        .bind(part)
        .execute(&mut *conn)
        .await
        .store(doing)?;
        Ok(())
    }

    /// Creates the key's row when it has none (no lease, epoch 0, listed) and locks it.
    async fn ensure_key(&self, conn: &mut MySqlConnection, key: &PKey, doing: &str) -> Result<()> {
        check_len("poller name", &key.poller, limit::NAME)?;
        check_len("partition", &key.partition, limit::NAME)?;
        let (poller, part) = key_bytes(key);
        // ON DUPLICATE KEY UPDATE takes the row's exclusive lock whether it inserts or not.
        sqlx::query(&format!(
            "INSERT INTO {} (poller, part, holder, epoch, expires_at, listed, state_json) \
             VALUES (?, ?, NULL, 0, 0, 1, NULL) ON DUPLICATE KEY UPDATE listed = listed",
            self.tables.keys
        ))
        .bind(poller)
        .bind(part)
        .execute(&mut *conn)
        .await
        .store(doing)?;
        Ok(())
    }

    async fn identity_batch(
        &self,
        key: &PKey,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>> {
        let doing = format!("stream_identities on {key}");
        let (poller, part) = key_bytes(key);
        let t = &self.tables.items;
        let rows: Vec<Vec<u8>> = match after {
            None => sqlx::query_scalar(&format!(
                "SELECT identity FROM {t} WHERE poller = ? AND part = ? ORDER BY identity LIMIT ?"
            ))
            .bind(poller)
            .bind(part)
            .bind(limit_arg(limit))
            .fetch_all(&self.pool)
            .await
            .store(&doing)?,
            Some(after) => sqlx::query_scalar(&format!(
                "SELECT identity FROM {t} WHERE poller = ? AND part = ? AND identity > ? \
                 ORDER BY identity LIMIT ?"
            ))
            .bind(poller)
            .bind(part)
            .bind(after.as_bytes())
            .bind(limit_arg(limit))
            .fetch_all(&self.pool)
            .await
            .store(&doing)?,
        };
        rows.into_iter()
            .map(|b| text(&format!("an identity of {key}"), b))
            .collect()
    }
}

/// An outbox row as selected.
type OutboxTuple = (
    Vec<u8>,
    i64,
    Vec<u8>,
    i8,
    u32,
    Option<i64>,
    Option<Vec<u8>>,
    i64,
);

fn outbox_row(key: &PKey, row: OutboxTuple) -> Result<OutboxRow> {
    let (
        event_id,
        sequence,
        event_json,
        delivered,
        attempts,
        next_attempt_at,
        last_error,
        created_at,
    ) = row;
    let event_id = text(&format!("an outbox event id of {key}"), event_id)?;
    let what = format!("outbox row {event_id} of {key}");
    Ok(OutboxRow {
        event: decode(&format!("the event of {what}"), &event_json)?,
        last_error: opt_decode(&format!("the last error of {what}"), last_error)?,
        event_id: event_id.into(),
        sequence,
        status: if delivered == 0 {
            OutboxStatus::Pending
        } else {
            OutboxStatus::Delivered
        },
        attempts,
        next_attempt_at,
        created_at,
    })
}

type ParkedTuple = (
    Vec<u8>,
    Vec<u8>,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Vec<u8>,
    u32,
    i64,
    Option<Vec<u8>>,
);

fn parked_row(key: &PKey, row: ParkedTuple) -> Result<ParkedRow> {
    let (id, kind, event_json, item, error_json, attempts, parked_at, hold_key) = row;
    let id = text(&format!("a parked id of {key}"), id)?;
    let what = format!("parked row {id} of {key}");
    Ok(ParkedRow {
        kind: kind_from(&kind)?,
        event: opt_decode(&format!("the event of {what}"), event_json)?,
        item: raw_json(&format!("the item of {what}"), item)?,
        error: decode(&format!("the error of {what}"), &error_json)?,
        attempts,
        parked_at,
        hold_key: opt_text(&format!("the hold key of {what}"), hold_key)?,
        id,
    })
}

#[async_trait]
impl Store for MySqlStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities::default().with_log(true)
    }

    async fn migrate(&self) -> Result<()> {
        let mut conn = self.pool.acquire().await.store("migrate: connect")?;
        crate::schema::migrate(&mut conn, &self.tables, self.migrate_lock_timeout_secs).await
    }

    async fn close(&self) -> Result<()> {
        self.pool.close().await;
        Ok(())
    }

    async fn acquire_lease(
        &self,
        key: &PKey,
        owner: &str,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<Option<Lease>> {
        let taken = self.take_lease(key, owner, ttl_ms, now_ms, false).await?;
        Ok(taken.map(|(lease, _)| lease))
    }

    async fn claim(
        &self,
        key: &PKey,
        owner: &str,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<Option<Claim>> {
        let taken = self.take_lease(key, owner, ttl_ms, now_ms, true).await?;
        taken
            .map(|(lease, read)| {
                let (state, pending) = read.unwrap_or_default();
                Ok(Claim::new(lease, Self::state_of(key, state)?, pending))
            })
            .transpose()
    }

    async fn renew_lease(
        &self,
        key: &PKey,
        lease: &Lease,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<bool> {
        // The driver asks for CLIENT_FOUND_ROWS: the count is of matched rows, so renewing to
        // the same expiry still says true.
        let done = sqlx::query(&format!(
            "UPDATE {} SET expires_at = ? WHERE poller = ? AND part = ? AND holder = ? AND epoch = ?",
            self.tables.keys
        ))
        .bind(now_ms.saturating_add(ttl_ms))
        .bind(key.poller.as_bytes())
        .bind(key.partition.as_bytes())
        .bind(lease.owner.as_bytes())
        .bind(lease.epoch)
        .execute(&self.pool)
        .await
        .store(&format!("renew_lease on {key}"))?;
        Ok(done.rows_affected() > 0)
    }

    async fn release_lease(&self, key: &PKey, lease: &Lease) -> Result<()> {
        sqlx::query(&format!(
            "UPDATE {} SET holder = NULL, expires_at = 0 \
             WHERE poller = ? AND part = ? AND holder = ? AND epoch = ?",
            self.tables.keys
        ))
        .bind(key.poller.as_bytes())
        .bind(key.partition.as_bytes())
        .bind(lease.owner.as_bytes())
        .bind(lease.epoch)
        .execute(&self.pool)
        .await
        .store(&format!("release_lease on {key}"))?;
        Ok(())
    }

    async fn get_lease(&self, key: &PKey) -> Result<Option<Lease>> {
        let doing = format!("get_lease on {key}");
        let row: Option<(Vec<u8>, i64, i64)> = sqlx::query_as(&format!(
            "SELECT holder, epoch, expires_at FROM {} \
             WHERE poller = ? AND part = ? AND holder IS NOT NULL",
            self.tables.keys
        ))
        .bind(key.poller.as_bytes())
        .bind(key.partition.as_bytes())
        .fetch_optional(&self.pool)
        .await
        .store(&doing)?;
        row.map(|(owner, epoch, expires_at)| {
            Ok(Lease {
                owner: text(&format!("the lease owner of {key}"), owner)?,
                epoch,
                expires_at,
            })
        })
        .transpose()
    }

    async fn load_state(&self, key: &PKey) -> Result<Option<PollerState>> {
        let state: Option<Option<Vec<u8>>> = sqlx::query_scalar(&format!(
            "SELECT state_json FROM {} WHERE poller = ? AND part = ?",
            self.tables.keys
        ))
        .bind(key.poller.as_bytes())
        .bind(key.partition.as_bytes())
        .fetch_optional(&self.pool)
        .await
        .store(&format!("load_state on {key}"))?;
        Self::state_of(key, state.flatten())
    }

    async fn save_state_unfenced(&self, key: &PKey, patch: &StatePatch) -> Result<()> {
        let doing = format!("save_state_unfenced on {key}");
        let mut tx = self.begin(&doing).await?;
        self.ensure_key(&mut tx, key, &doing).await?;
        let state = self
            .lock_key(&mut tx, key, true, &doing)
            .await?
            .and_then(|row| row.state);
        let next = PollerState::patched(Self::state_of(key, state)?, patch);
        self.write_state(&mut tx, key, &next, &doing).await?;
        tx.commit().await.store(&doing)
    }

    async fn list_keys(&self, poller: Option<&str>) -> Result<Vec<PKey>> {
        let doing = "list_keys";
        let t = &self.tables.keys;
        let rows: Vec<(Vec<u8>, Vec<u8>)> = match poller {
            None => sqlx::query_as(&format!(
                "SELECT poller, part FROM {t} WHERE listed = 1 ORDER BY poller, part"
            ))
            .fetch_all(&self.pool)
            .await
            .store(doing)?,
            Some(poller) => sqlx::query_as(&format!(
                "SELECT poller, part FROM {t} WHERE listed = 1 AND poller = ? ORDER BY part"
            ))
            .bind(poller.as_bytes())
            .fetch_all(&self.pool)
            .await
            .store(doing)?,
        };
        rows.into_iter()
            .map(|(poller, part)| {
                Ok(PKey::new(
                    text("a poller name", poller)?,
                    text("a partition", part)?,
                ))
            })
            .collect()
    }

    async fn delete_key(&self, key: &PKey) -> Result<()> {
        let doing = format!("delete_key on {key}");
        let t = &self.tables;
        let (poller, part) = key_bytes(key);
        let mut tx = self.begin(&doing).await?;
        if self.lock_key(&mut tx, key, false, &doing).await?.is_none() {
            // Nothing was ever written under this key (every write creates its row first).
            return tx.commit().await.store(&doing);
        }
        for table in [&t.items, &t.outbox, &t.parked, &t.validators, &t.log] {
            sqlx::query(&format!(
                "DELETE FROM {table} WHERE poller = ? AND part = ?"
            ))
            .bind(poller)
            .bind(part)
            .execute(&mut *tx)
            .await
            .store(&doing)?;
        }
        // The row stays for its epoch counter: a lease from before the delete never passes again.
        sqlx::query(&format!(
            "UPDATE {} SET holder = NULL, expires_at = 0, state_json = NULL, listed = 0 \
             WHERE poller = ? AND part = ?",
            t.keys
        ))
        .bind(poller)
        .bind(part)
        .execute(&mut *tx)
        .await
        .store(&doing)?;
        tx.commit().await.store(&doing)
    }

    async fn clear_items(&self, key: &PKey) -> Result<()> {
        let doing = format!("clear_items on {key}");
        let mut tx = self.begin(&doing).await?;
        // The key's row first, as every writer takes it: no deadlock with a page's commit.
        self.lock_key(&mut tx, key, false, &doing).await?;
        sqlx::query(&format!(
            "DELETE FROM {} WHERE poller = ? AND part = ?",
            self.tables.items
        ))
        .bind(key.poller.as_bytes())
        .bind(key.partition.as_bytes())
        .execute(&mut *tx)
        .await
        .store(&doing)?;
        tx.commit().await.store(&doing)
    }

    async fn load_versions(
        &self,
        key: &PKey,
        identities: &[String],
    ) -> Result<HashMap<String, ItemRow>> {
        let doing = format!("load_versions on {key}");
        let (poller, part) = key_bytes(key);
        let mut out = HashMap::with_capacity(identities.len());
        // An identity longer than the column can never be stored: leave it out of the query.
        let wanted: Vec<&str> = identities
            .iter()
            .map(String::as_str)
            .filter(|i| i.len() <= limit::IDENTITY)
            .collect();
        for chunk in wanted.chunks(MAX_ROWS) {
            let n = padded(chunk.len());
            let sql = format!(
                "SELECT identity, item_version, item_hash, schema_version, payload, seen_at \
                 FROM {} WHERE poller = ? AND part = ? AND identity IN ({})",
                self.tables.items,
                marks(n)
            );
            let mut query = sqlx::query_as::<
                _,
                (Vec<u8>, Option<Vec<u8>>, Vec<u8>, u32, Option<Vec<u8>>, i64),
            >(&sql)
            .bind(poller)
            .bind(part);
            for id in padded_rows(chunk, n) {
                query = query.bind(id.as_bytes());
            }
            for (identity, version, hash, schema_version, payload, seen_at) in
                query.fetch_all(&self.pool).await.store(&doing)?
            {
                let identity = text(&format!("an identity of {key}"), identity)?;
                let what = format!("item {identity} of {key}");
                let row = ItemRow {
                    version: opt_text(&format!("the version of {what}"), version)?,
                    hash: text(&format!("the hash of {what}"), hash)?,
                    schema_version,
                    payload: raw_json(&format!("the payload of {what}"), payload)?,
                    seen_at,
                    identity: identity.clone(),
                };
                out.insert(identity, row);
            }
        }
        Ok(out)
    }

    fn stream_identities<'a>(
        &'a self,
        key: &'a PKey,
        batch_size: usize,
    ) -> BoxStream<'a, Result<Vec<String>>> {
        // A batch size of 0 would never move on: read one at a time instead.
        let limit = batch_size.max(1);
        // The state: `None` when done, else the last identity yielded (`None` before the first).
        futures::stream::unfold(Some(None::<String>), move |state| async move {
            let after = state?;
            match self.identity_batch(key, after.as_deref(), limit).await {
                Err(error) => Some((Err(error), None)),
                Ok(batch) if batch.is_empty() => None,
                Ok(batch) => {
                    let next = (batch.len() == limit).then(|| batch.last().cloned());
                    Some((Ok(batch), next))
                }
            }
        })
        .boxed()
    }

    async fn counts(&self, key: &PKey) -> Result<KeyCounts> {
        let doing = format!("counts on {key}");
        let t = &self.tables;
        let (poller, part) = key_bytes(key);
        // One statement, one read view: the three counts are of the same moment.
        let (items, pending, parked): (i64, i64, i64) = sqlx::query_as(&format!(
            "SELECT \
               (SELECT COUNT(*) FROM {} WHERE poller = ? AND part = ?), \
               (SELECT COUNT(*) FROM {} WHERE poller = ? AND part = ? AND delivered = 0), \
               (SELECT COUNT(*) FROM {} WHERE poller = ? AND part = ?)",
            t.items, t.outbox, t.parked
        ))
        .bind(poller)
        .bind(part)
        .bind(poller)
        .bind(part)
        .bind(poller)
        .bind(part)
        .fetch_one(&self.pool)
        .await
        .store(&doing)?;
        Ok(KeyCounts {
            items: count("the item count", items)?,
            pending: count("the pending count", pending)?,
            parked: count("the parked count", parked)?,
        })
    }

    async fn commit_poll(&self, key: &PKey, lease: &Lease, batch: &CommitBatch) -> Result<()> {
        let doing = format!("commit_poll on {key}");
        // Everything that can be refused is refused before the transaction opens.
        for row in &batch.upserts {
            check_len("item identity", &row.identity, limit::IDENTITY)?;
        }
        for identity in &batch.deletes {
            check_len("item identity", identity, limit::IDENTITY)?;
        }
        for row in &batch.parked {
            check_len("parked id", &row.id, limit::NAME)?;
        }
        for v in &batch.validators {
            check_len("URL hash", &v.url_hash, limit::NAME)?;
        }
        let events = batch
            .events
            .iter()
            .map(|row| {
                check_len("event id", &row.event_id, limit::NAME)?;
                Ok(OutboxOut {
                    event_json: encode("an outbox event", &row.event)?,
                    last_error: row
                        .last_error
                        .as_ref()
                        .map(|e| encode("an outbox error", e))
                        .transpose()?,
                    row,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let log: Vec<LogOut<'_>> = if batch.log {
            events
                .iter()
                .map(|e| LogOut {
                    sequence: e.row.sequence,
                    event_json: &e.event_json,
                    created_at: e.row.created_at,
                })
                .collect()
        } else {
            Vec::new()
        };
        let parked = batch
            .parked
            .iter()
            .map(|row| {
                Ok(ParkedOut {
                    event_json: row
                        .event
                        .as_ref()
                        .map(|e| encode("a parked event", e))
                        .transpose()?,
                    error_json: encode("a parked error", &row.error)?,
                    row,
                })
            })
            .collect::<Result<Vec<_>>>()?;

        let (mut tx, state) = self.fenced(key, lease, true, &doing).await?;
        let next = PollerState::patched(Self::state_of(key, state)?, &batch.state_patch);
        let t = &self.tables;
        self.write_items(&mut tx, key, &batch.upserts, &doing)
            .await?;
        if !batch.deletes.is_empty() {
            let deletes: Vec<&str> = batch.deletes.iter().map(String::as_str).collect();
            let head = format!(
                "DELETE FROM {} WHERE poller = ? AND part = ? AND identity",
                t.items
            );
            self.delete_in(&mut tx, &head, key, &deletes, &doing)
                .await?;
        }
        self.write_outbox(&mut tx, key, &events, &doing).await?;
        write_rows(
            &mut tx,
            (
                &format!(
                    "REPLACE INTO {} (poller, part, seq, event_json, created_at)",
                    t.log
                ),
                5,
            ),
            key,
            &log,
            |r| r.event_json.len() + 16,
            |q: MyQuery<'_>, r| {
                q.bind(r.sequence)
                    .bind(r.event_json.as_bytes())
                    .bind(r.created_at)
            },
            &doing,
        )
        .await?;
        self.write_parked(&mut tx, key, &parked, &doing).await?;
        write_rows(
            &mut tx,
            (
                &format!(
                    "REPLACE INTO {} (poller, part, url_hash, etag, last_modified, stored_at)",
                    t.validators
                ),
                6,
            ),
            key,
            &batch.validators,
            |v: &UrlValidator| {
                v.url_hash.len()
                    + v.validator.etag.as_ref().map_or(0, String::len)
                    + v.validator.last_modified.as_ref().map_or(0, String::len)
                    + 8
            },
            |q: MyQuery<'_>, v| {
                q.bind(v.url_hash.as_bytes())
                    .bind(v.validator.etag.as_deref().map(str::as_bytes))
                    .bind(v.validator.last_modified.as_deref().map(str::as_bytes))
                    .bind(v.validator.stored_at)
            },
            &doing,
        )
        .await?;
        self.write_state(&mut tx, key, &next, &doing).await?;
        tx.commit().await.store(&doing)
    }

    async fn load_pending(&self, key: &PKey, limit: usize) -> Result<Vec<OutboxRow>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let rows: Vec<OutboxTuple> = sqlx::query_as(&format!(
            "SELECT event_id, seq, event_json, delivered, attempts, next_attempt_at, \
                 last_error, created_at FROM {} \
                 WHERE poller = ? AND part = ? AND delivered = 0 \
                 ORDER BY seq, event_id LIMIT ?",
            self.tables.outbox
        ))
        .bind(key.poller.as_bytes())
        .bind(key.partition.as_bytes())
        .bind(limit_arg(limit))
        .fetch_all(&self.pool)
        .await
        .store(&format!("load_pending on {key}"))?;
        rows.into_iter().map(|row| outbox_row(key, row)).collect()
    }

    async fn ack_events(&self, key: &PKey, lease: &Lease, ids: &[String]) -> Result<()> {
        let doing = format!("ack_events on {key}");
        let (mut tx, _) = self.fenced(key, lease, false, &doing).await?;
        let ids: Vec<&str> = ids
            .iter()
            .map(String::as_str)
            .filter(|id| id.len() <= limit::NAME)
            .collect();
        if !ids.is_empty() {
            let head = format!(
                "DELETE FROM {} WHERE poller = ? AND part = ? AND event_id",
                self.tables.outbox
            );
            self.delete_in(&mut tx, &head, key, &ids, &doing).await?;
        }
        tx.commit().await.store(&doing)
    }

    async fn record_attempt(
        &self,
        key: &PKey,
        lease: &Lease,
        id: &str,
        error: &SerializedError,
        next_attempt_at: Option<i64>,
    ) -> Result<()> {
        let doing = format!("record_attempt on {key}");
        let error = encode("a delivery error", error)?;
        let (mut tx, _) = self.fenced(key, lease, false, &doing).await?;
        sqlx::query(&format!(
            "UPDATE {} SET attempts = attempts + 1, last_error = ?, next_attempt_at = ? \
             WHERE poller = ? AND part = ? AND event_id = ?",
            self.tables.outbox
        ))
        .bind(error.as_bytes())
        .bind(next_attempt_at)
        .bind(key.poller.as_bytes())
        .bind(key.partition.as_bytes())
        .bind(id.as_bytes())
        .execute(&mut *tx)
        .await
        .store(&doing)?;
        tx.commit().await.store(&doing)
    }

    async fn park_event(&self, key: &PKey, lease: &Lease, row: &ParkedRow) -> Result<()> {
        let doing = format!("park_event on {key}");
        check_len("parked id", &row.id, limit::NAME)?;
        let parked = [ParkedOut {
            event_json: row
                .event
                .as_ref()
                .map(|e| encode("a parked event", e))
                .transpose()?,
            error_json: encode("a parked error", &row.error)?,
            row,
        }];
        let (mut tx, _) = self.fenced(key, lease, false, &doing).await?;
        self.write_parked(&mut tx, key, &parked, &doing).await?;
        if let Some(event) = &row.event {
            sqlx::query(&format!(
                "DELETE FROM {} WHERE poller = ? AND part = ? AND event_id = ?",
                self.tables.outbox
            ))
            .bind(key.poller.as_bytes())
            .bind(key.partition.as_bytes())
            .bind(event.id.as_bytes())
            .execute(&mut *tx)
            .await
            .store(&doing)?;
        }
        tx.commit().await.store(&doing)
    }

    async fn list_parked(&self, key: &PKey, query: ParkedQuery) -> Result<Vec<ParkedRow>> {
        let doing = format!("list_parked on {key}");
        if query.limit == Some(0) {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT id, kind, event_json, item, error_json, attempts, parked_at, hold_key FROM {} \
             WHERE poller = ? AND part = ?{} ORDER BY parked_at, id LIMIT ?",
            self.tables.parked,
            if query.kind.is_some() {
                " AND kind = ?"
            } else {
                ""
            }
        );
        let mut q = sqlx::query_as::<_, ParkedTuple>(&sql)
            .bind(key.poller.as_bytes())
            .bind(key.partition.as_bytes());
        if let Some(kind) = query.kind {
            q = q.bind(kind.as_str().as_bytes());
        }
        let rows = q
            .bind(query.limit.map_or(u64::MAX, limit_arg))
            .fetch_all(&self.pool)
            .await
            .store(&doing)?;
        rows.into_iter().map(|row| parked_row(key, row)).collect()
    }

    async fn resolve_parked(
        &self,
        key: &PKey,
        ids: &[String],
        action: ParkedAction,
    ) -> Result<u64> {
        let doing = format!("resolve_parked on {key}");
        let ids: Vec<&str> = distinct(ids)
            .into_iter()
            .filter(|id| id.len() <= limit::NAME)
            .collect();
        if ids.is_empty() {
            return Ok(0);
        }
        let t = &self.tables;
        let (poller, part) = key_bytes(key);
        let mut tx = self.begin(&doing).await?;
        self.lock_key(&mut tx, key, false, &doing).await?;
        // The rows asked for, locked, with what a retry needs.
        let mut found: Vec<(String, ParkedKind, Option<Event>, i64)> = Vec::new();
        for chunk in ids.chunks(MAX_ROWS) {
            let n = padded(chunk.len());
            let sql = format!(
                "SELECT id, kind, event_json, parked_at FROM {} \
                 WHERE poller = ? AND part = ? AND id IN ({}) FOR UPDATE",
                t.parked,
                marks(n)
            );
            let mut query = sqlx::query_as::<_, (Vec<u8>, Vec<u8>, Option<Vec<u8>>, i64)>(&sql)
                .bind(poller)
                .bind(part);
            for id in padded_rows(chunk, n) {
                query = query.bind(id.as_bytes());
            }
            for (id, kind, event_json, parked_at) in
                query.fetch_all(&mut *tx).await.store(&doing)?
            {
                let id = text(&format!("a parked id of {key}"), id)?;
                let event = opt_decode(
                    &format!("the event of parked row {id} of {key}"),
                    event_json,
                )?;
                found.push((id, kind_from(&kind)?, event, parked_at));
            }
        }
        let resolved: Vec<&str> = match action {
            ParkedAction::Discard => found.iter().map(|(id, ..)| id.as_str()).collect(),
            ParkedAction::Retry => {
                let rows: Vec<OutboxRow> = found
                    .iter()
                    .filter(|(_, kind, ..)| *kind == ParkedKind::Poison)
                    .filter_map(|(_, _, event, parked_at)| {
                        event
                            .as_ref()
                            .map(|event| OutboxRow::pending(event.clone(), *parked_at))
                    })
                    .collect();
                let encoded = rows
                    .iter()
                    .map(|row| {
                        Ok(OutboxOut {
                            event_json: encode("a retried event", &row.event)?,
                            last_error: None,
                            row,
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                self.write_outbox(&mut tx, key, &encoded, &doing).await?;
                found
                    .iter()
                    .filter(|(_, kind, event, _)| *kind == ParkedKind::Poison && event.is_some())
                    .map(|(id, ..)| id.as_str())
                    .collect()
            }
        };
        if !resolved.is_empty() {
            let head = format!(
                "DELETE FROM {} WHERE poller = ? AND part = ? AND id",
                t.parked
            );
            self.delete_in(&mut tx, &head, key, &resolved, &doing)
                .await?;
        }
        tx.commit().await.store(&doing)?;
        Ok(u64::try_from(resolved.len()).unwrap_or(u64::MAX))
    }

    async fn held_keys(&self, key: &PKey) -> Result<Vec<String>> {
        let doing = format!("held_keys on {key}");
        // Hold keys are LONGBLOB (no length limit), and MySQL sorts and groups blobs by their
        // first max_sort_length bytes only: distinct them here.
        let rows: Vec<Vec<u8>> = sqlx::query_scalar(&format!(
            "SELECT hold_key FROM {} WHERE poller = ? AND part = ? AND hold_key IS NOT NULL",
            self.tables.parked
        ))
        .bind(key.poller.as_bytes())
        .bind(key.partition.as_bytes())
        .fetch_all(&self.pool)
        .await
        .store(&doing)?;
        let held = rows
            .into_iter()
            .map(|b| text(&format!("a hold key of {key}"), b))
            .collect::<Result<BTreeSet<String>>>()?;
        Ok(held.into_iter().collect())
    }

    async fn get_validator(&self, key: &PKey, url_hash: &str) -> Result<Option<Validator>> {
        let doing = format!("get_validator on {key}");
        let row: Option<(Option<Vec<u8>>, Option<Vec<u8>>, i64)> = sqlx::query_as(&format!(
            "SELECT etag, last_modified, stored_at FROM {} \
             WHERE poller = ? AND part = ? AND url_hash = ?",
            self.tables.validators
        ))
        .bind(key.poller.as_bytes())
        .bind(key.partition.as_bytes())
        .bind(url_hash.as_bytes())
        .fetch_optional(&self.pool)
        .await
        .store(&doing)?;
        row.map(|(etag, last_modified, stored_at)| {
            Ok(Validator {
                etag: opt_text(&format!("an ETag of {key}"), etag)?,
                last_modified: opt_text(&format!("a Last-Modified of {key}"), last_modified)?,
                stored_at,
            })
        })
        .transpose()
    }

    async fn read_log(
        &self,
        key: &PKey,
        query: LogQuery,
        limit: usize,
    ) -> Result<Vec<LoggedEvent>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let rows: Vec<(i64, Vec<u8>, i64)> = sqlx::query_as(&format!(
            "SELECT seq, event_json, created_at FROM {} \
             WHERE poller = ? AND part = ? AND seq > ? AND created_at >= ? AND created_at <= ? \
             ORDER BY seq LIMIT ?",
            self.tables.log
        ))
        .bind(key.poller.as_bytes())
        .bind(key.partition.as_bytes())
        .bind(query.after_sequence.unwrap_or(i64::MIN))
        .bind(query.from_time.unwrap_or(i64::MIN))
        .bind(query.to_time.unwrap_or(i64::MAX))
        .bind(limit_arg(limit))
        .fetch_all(&self.pool)
        .await
        .store(&format!("read_log on {key}"))?;
        rows.into_iter()
            .map(|(sequence, event_json, created_at)| {
                Ok(LoggedEvent {
                    sequence,
                    event: decode(&format!("log entry {sequence} of {key}"), &event_json)?,
                    created_at,
                })
            })
            .collect()
    }

    async fn prune_log(&self, key: &PKey, older_than: i64) -> Result<u64> {
        let done = sqlx::query(&format!(
            "DELETE FROM {} WHERE poller = ? AND part = ? AND created_at < ?",
            self.tables.log
        ))
        .bind(key.poller.as_bytes())
        .bind(key.partition.as_bytes())
        .bind(older_than)
        .execute(&self.pool)
        .await
        .store(&format!("prune_log on {key}"))?;
        Ok(done.rows_affected())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Whatever a URL holds, its password is in no error it gives before connecting.
        #[test]
        fn a_password_never_shows_in_an_error(
            scheme in "mysql|MYSQL|mariadb|postgres|http",
            user in "[a-z]{0,4}",
            password in "[A-Z][A-Za-z0-9/?#@:%+ =&]{5,12}",
            host in "[a-z0-9.,:\\[\\]]{0,16}",
            tail in "(/[a-z]{0,4})?(\\?(ssl-mode|ssl-ca|charset|socket|statement-cache-capacity)=[a-z%0-9./-]{0,10})?",
        ) {
            let url = format!("{scheme}://{user}:{password}@{host}{tail}");
            if let Err(error) = connect_options(&url) {
                let printed = format!("{error} {error:?}");
                prop_assert!(!printed.contains(&password), "{url:?}: {printed}");
            }
        }
    }
}
