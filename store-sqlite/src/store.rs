//! [`SqliteStore`]: the [`Store`] on SQLite.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use futures::stream::{self, BoxStream, StreamExt};
use rusqlite::types::ToSql;
use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::Mutex as AsyncMutex;
use watukuy_core::{
    Error, Event, Result,
    store::{
        Capabilities, Claim, CommitBatch, ItemRow, KeyCounts, Lease, LogQuery, LoggedEvent,
        OutboxRow, PKey, ParkedAction, ParkedQuery, ParkedRow, PollerState, SerializedError,
        StatePatch, Store, StoreErrorKind, UrlValidator, Validator,
    },
};

use crate::codec::{
    self, ItemValues, OutboxValues, ParkedValues, decode, encode, to_count, to_limit,
};
use crate::db::{Ctx, Db, blocking};
use crate::error::DbResult;
use crate::options::{Location, SqliteOptions, Synchronous};
use crate::sql::{IN_CHUNK, in_list};

/// The [`Store`] on SQLite (rusqlite, bundled SQLite): a database file in WAL mode that several
/// processes may share, or a private in-memory database.
///
/// - **Lazy.** [`SqliteStore::open`] only checks the options; the file is created, switched to
///   WAL and migrated by [`Store::migrate`] or by the first call that needs the database.
/// - **Off the runtime.** Writes go through one writer connection owned by a thread of the
///   store's own, which runs them one after another; writes queued together (concurrent keys,
///   acks beside a page's commit) share ONE transaction and its commit (group commit: one
///   `fsync` for all of them under [`Synchronous::Full`]), each in a savepoint of its own, so a
///   write that fails or loses its fence is rolled back alone; reads run on tokio's blocking pool through
///   up to `max_readers` read connections (see [`SqliteOptions::max_readers`]). Use the store
///   inside a tokio runtime.
/// - **Durability** is [`SqliteOptions::synchronous`]: [`Synchronous::Full`] (the default) or
///   [`Synchronous::Normal`], which trades the last commits before a power loss for writes
///   without an `fsync` each.
/// - **Fenced.** Every fenced write runs in ONE `BEGIN IMMEDIATE` transaction (its savepoint when
///   grouped) that first reads the key's lease owner and epoch and, on a mismatch, rolls back and fails with
///   [`Error::LeaseLost`]. Lease acquisition is one upsert; epochs never go back, not even across
///   [`Store::delete_key`].
/// - **Byte for byte.** Payloads, cursors and raw items are stored as the JSON text they came as;
///   an absent payload is SQL `NULL`, a JSON `null` payload is the text `null`.
/// - **Closing** releases the connections of a file database; the next call reopens it. A private
///   in-memory database lives as long as the store value, so `close` keeps it: closing never
///   changes what a store reads.
pub struct SqliteStore {
    ctx: Arc<Ctx>,
    db: Mutex<Option<Arc<Db>>>,
    /// Serializes opening and closing, so concurrent first calls open the database once.
    opening: AsyncMutex<()>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("location", &self.ctx.location)
            .field("open", &self.current().is_some())
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Checks `options` and returns a store that touches no file until it is first used (or
    /// [`Store::migrate`] is called). An invalid option is a `Config` error naming it.
    pub fn open(options: SqliteOptions) -> Result<Self> {
        options.validate()?;
        Ok(Self {
            ctx: Arc::new(Ctx::new(options)),
            db: Mutex::new(None),
            opening: AsyncMutex::new(()),
        })
    }

    /// [`Store::migrate`], callable without importing the trait: opens the database when it is
    /// not open yet (creating the file and switching it to WAL) and applies every pending
    /// migration. Idempotent; safe from several processes sharing the file.
    ///
    /// Fails with a [`Error::Store`] when the file cannot be opened or migrated (a directory
    /// that does not exist, a file that is not a database, a schema newer than this version).
    ///
    /// ```
    /// use watukuy_store_sqlite::{SqliteOptions, SqliteStore}; // no `use watukuy_core::store::Store`
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let store = SqliteStore::open(SqliteOptions::in_memory())?;
    /// store.migrate().await?;
    /// store.migrate().await?; // idempotent
    /// store.close().await?;
    /// # Ok::<(), watukuy_core::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn migrate(&self) -> Result<()> {
        <Self as Store>::migrate(self).await
    }

    /// The complete, idempotent DDL `migrate` applies for `options`' table prefix, for teams
    /// that manage schemas themselves: the tables, their indexes and the schema-version rows, so
    /// that `migrate` (or the store's first use) then finds the schema current and changes
    /// nothing. Running it twice is harmless.
    ///
    /// Fails with a `Config` error (`sqlite.table_prefix`) when the prefix is not an identifier.
    ///
    /// ```
    /// use watukuy_store_sqlite::{SqliteOptions, SqliteStore};
    ///
    /// let ddl = SqliteStore::ddl(&SqliteOptions::in_memory().table_prefix("orders_"))?;
    /// assert!(ddl.contains("CREATE TABLE IF NOT EXISTS orders_outbox"));
    /// # Ok::<(), watukuy_core::Error>(())
    /// ```
    pub fn ddl(options: &SqliteOptions) -> Result<String> {
        options.validate()?;
        crate::sql::ddl(options.prefix())
    }

    /// [`Store::close`], callable without importing the trait: closes the connections of a file
    /// database once the calls in flight finish (the next call reopens it); a private in-memory
    /// database is kept, so closing never changes what the store reads. Idempotent.
    pub async fn close(&self) -> Result<()> {
        <Self as Store>::close(self).await
    }

    /// Where this store keeps its data.
    pub fn location(&self) -> &Location {
        &self.ctx.location
    }

    /// Reads `PRAGMA synchronous` back from the writer connection, opening (and migrating) the
    /// database first if needed: the durability level SQLite really applies to this store's
    /// commits, which is [`SqliteOptions::synchronous`]. A diagnostic for operators and tests;
    /// the engine never needs it.
    pub async fn synchronous_in_effect(&self) -> Result<Synchronous> {
        self.write(|conn, ctx| {
            let level: i64 = conn.pragma_query_value(None, "synchronous", |r| r.get(0))?;
            Synchronous::from_pragma(level).ok_or_else(|| {
                Error::store(
                    StoreErrorKind::Other,
                    false,
                    format!(
                        "{} reports PRAGMA synchronous = {level}, a level this store never sets",
                        ctx.location
                    ),
                )
                .into()
            })
        })
        .await
    }

    fn current(&self) -> Option<Arc<Db>> {
        self.db
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The open database, opening (and migrating) it first if needed; `true` when this call
    /// opened it.
    async fn database(&self) -> Result<(Arc<Db>, bool)> {
        if let Some(db) = self.current() {
            return Ok((db, false));
        }
        let _opening = self.opening.lock().await;
        if let Some(db) = self.current() {
            return Ok((db, false));
        }
        let ctx = Arc::clone(&self.ctx);
        let db =
            blocking(move || Db::open(Arc::clone(&ctx)).map_err(|e| e.into_error(&ctx.location)))
                .await??;
        let db = Arc::new(db);
        *self.db.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::clone(&db));
        Ok((db, true))
    }

    async fn write<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection, &Ctx) -> DbResult<T> + Send + 'static,
    {
        self.database().await?.0.write(f).await
    }

    async fn read<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, &Ctx) -> DbResult<T> + Send + 'static,
    {
        self.database().await?.0.read(f).await
    }

    /// A write in a transaction of the writer's (see `Db::write_in_transaction`).
    async fn write_in_transaction<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, &Ctx) -> DbResult<T> + Send + 'static,
    {
        self.database().await?.0.write_in_transaction(f).await
    }

    /// A fenced write: checks the lease, then runs `f`, in ONE immediate transaction (maybe
    /// shared with other writes, each in a savepoint of its own: `Db::write_in_transaction`).
    async fn fenced<T, F>(&self, key: &PKey, lease: &Lease, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, &Ctx, &PKey) -> DbResult<T> + Send + 'static,
    {
        let key = key.clone();
        let lease = lease.clone();
        self.write_in_transaction(move |tx, ctx| {
            let holder = tx
                .prepare_cached(&ctx.sql.lease_holder)?
                .query_row(params![key.poller, key.partition], |r| {
                    Ok((r.get::<_, Option<String>>(0)?, r.get::<_, i64>(1)?))
                })
                .optional()?;
            let holds = matches!(
                &holder,
                Some((Some(owner), epoch)) if *owner == lease.owner && *epoch == lease.epoch
            );
            if !holds {
                // Its savepoint is rolled back; nothing was written.
                return Err(Error::lease_lost(&key, lease.epoch).into());
            }
            f(tx, ctx, &key)
        })
        .await
    }

    /// An unfenced write: runs `f` in ONE immediate transaction (maybe shared, as `fenced`).
    async fn unfenced<T, F>(&self, key: &PKey, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, &Ctx, &PKey) -> DbResult<T> + Send + 'static,
    {
        let key = key.clone();
        self.write_in_transaction(move |tx, ctx| f(tx, ctx, &key))
            .await
    }
}

/// Takes the lease of `key` for `owner` (the `lease_acquire` upsert); `None` while another
/// owner holds an unexpired one.
fn take_lease(
    conn: &Connection,
    ctx: &Ctx,
    key: &PKey,
    owner: &str,
    expires_at: i64,
    now_ms: i64,
) -> DbResult<Option<Lease>> {
    Ok(conn
        .prepare_cached(&ctx.sql.lease_acquire)?
        .query_row(
            params![key.poller, key.partition, owner, expires_at, now_ms],
            |r| {
                Ok(Lease {
                    owner: r.get(0)?,
                    epoch: r.get(1)?,
                    expires_at: r.get(2)?,
                })
            },
        )
        .optional()?)
}

/// Up to `limit` (at least 1) pending rows of `key` in sequence order. Blocking.
fn pending_rows(
    conn: &Connection,
    ctx: &Ctx,
    key: &PKey,
    limit: usize,
) -> DbResult<Vec<OutboxRow>> {
    let mut statement = conn.prepare_cached(&ctx.sql.outbox_pending)?;
    let mut rows = statement.query(params![key.poller, key.partition, to_limit(limit)])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(codec::outbox_row(row)?);
    }
    Ok(out)
}

/// The distinct hold keys of `key`'s parked rows. Blocking.
fn held_keys(conn: &Connection, ctx: &Ctx, key: &PKey) -> DbResult<Vec<String>> {
    let mut statement = conn.prepare_cached(&ctx.sql.parked_held)?;
    let held = statement
        .query_map(params![key.poller, key.partition], |r| r.get(0))?
        .collect::<rusqlite::Result<Vec<String>>>()?;
    Ok(held)
}

/// Reads, patches and writes the key's state inside the caller's transaction. `fenced` writes
/// update the existing row (the fence proved it exists); unfenced writes create it if needed.
fn patch_state(
    tx: &Connection,
    ctx: &Ctx,
    key: &PKey,
    patch: &StatePatch,
    fenced: bool,
) -> DbResult<()> {
    let stored: Option<String> = tx
        .prepare_cached(&ctx.sql.state_get)?
        .query_row(params![key.poller, key.partition], |r| r.get(0))
        .optional()?
        .flatten();
    if patch.is_empty() && stored.is_some() {
        return Ok(());
    }
    let current: Option<PollerState> = stored
        .map(|text| decode(format_args!("the state of {key}"), &text))
        .transpose()?;
    let state = PollerState::patched(current, patch);
    let text = encode("the poller state", &state)?;
    let sql = if fenced {
        &ctx.sql.state_set
    } else {
        &ctx.sql.state_upsert
    };
    tx.prepare_cached(sql)?
        .execute(params![key.poller, key.partition, text])?;
    Ok(())
}

/// The key's poller and partition followed by `ids`, as positional parameters.
fn key_and_ids<'a>(key: &'a PKey, ids: &'a [String]) -> impl Iterator<Item = &'a dyn ToSql> {
    [&key.poller as &dyn ToSql, &key.partition as &dyn ToSql]
        .into_iter()
        .chain(ids.iter().map(|id| id as &dyn ToSql))
}

/// Runs a chunked `... IN ({ids})` write for every id; returns the rows changed.
fn execute_in(conn: &Connection, template: &str, key: &PKey, ids: &[String]) -> DbResult<usize> {
    let mut changed = 0;
    for chunk in ids.chunks(IN_CHUNK) {
        let sql = in_list(template, 3, chunk.len());
        changed += conn
            .prepare_cached(&sql)?
            .execute(rusqlite::params_from_iter(key_and_ids(key, chunk)))?;
    }
    Ok(changed)
}

/// Runs a chunked `... IN ({ids})` query for every id, decoding each row with `decode_row`.
fn query_in<T>(
    conn: &Connection,
    template: &str,
    key: &PKey,
    ids: &[String],
    mut decode_row: impl FnMut(&rusqlite::Row<'_>) -> DbResult<T>,
) -> DbResult<Vec<T>> {
    let mut out = Vec::new();
    for chunk in ids.chunks(IN_CHUNK) {
        let sql = in_list(template, 3, chunk.len());
        let mut statement = conn.prepare_cached(&sql)?;
        let mut rows = statement.query(rusqlite::params_from_iter(key_and_ids(key, chunk)))?;
        while let Some(row) = rows.next()? {
            out.push(decode_row(row)?);
        }
    }
    Ok(out)
}

/// The distinct ids, in first-appearance order.
fn unique(ids: &[String]) -> Vec<String> {
    let mut seen = HashSet::new();
    ids.iter()
        .filter(|id| seen.insert(id.as_str()))
        .cloned()
        .collect()
}

/// Writes one parked row.
fn put_parked(tx: &Connection, ctx: &Ctx, key: &PKey, row: &ParkedValues) -> DbResult<()> {
    tx.prepare_cached(&ctx.sql.parked_upsert)?.execute(params![
        key.poller,
        key.partition,
        row.id,
        row.kind,
        row.event,
        row.item,
        row.error,
        row.attempts,
        row.parked_at,
        row.hold_key,
    ])?;
    Ok(())
}

/// The rows of one page, encoded before the transaction starts.
struct EncodedBatch {
    patch: StatePatch,
    upserts: Vec<ItemValues>,
    deletes: Vec<String>,
    events: Vec<OutboxValues>,
    log: bool,
    parked: Vec<ParkedValues>,
    validators: Vec<UrlValidator>,
}

impl EncodedBatch {
    fn new(batch: &CommitBatch) -> Result<Self> {
        Ok(Self {
            patch: batch.state_patch.clone(),
            upserts: batch.upserts.iter().map(ItemValues::new).collect(),
            deletes: batch.deletes.clone(),
            events: batch
                .events
                .iter()
                .map(OutboxValues::new)
                .collect::<Result<_>>()?,
            log: batch.log,
            parked: batch
                .parked
                .iter()
                .map(ParkedValues::new)
                .collect::<Result<_>>()?,
            validators: batch.validators.clone(),
        })
    }

    /// Applies the page inside the caller's (fenced) transaction, in the reference order:
    /// upserts, deletes, events (and their log entries), parked rows, validators, the state
    /// patch.
    fn apply(&self, tx: &Connection, ctx: &Ctx, key: &PKey) -> DbResult<()> {
        let sql = &ctx.sql;
        if !self.upserts.is_empty() {
            let mut upsert = tx.prepare_cached(&sql.items_upsert)?;
            for row in &self.upserts {
                upsert.execute(params![
                    key.poller,
                    key.partition,
                    row.identity,
                    row.version,
                    row.hash,
                    row.schema_version,
                    row.payload,
                    row.seen_at,
                ])?;
            }
        }
        execute_in(tx, &sql.items_delete_in, key, &self.deletes)?;
        if !self.events.is_empty() {
            let mut upsert = tx.prepare_cached(&sql.outbox_upsert)?;
            let mut delete = tx.prepare_cached(&sql.outbox_delete)?;
            let mut log = tx.prepare_cached(&sql.log_upsert)?;
            for row in &self.events {
                if row.pending {
                    upsert.execute(params![
                        key.poller,
                        key.partition,
                        row.event_id,
                        row.sequence,
                        row.event,
                        row.attempts,
                        row.next_attempt_at,
                        row.last_error,
                        row.created_at,
                    ])?;
                } else {
                    // The outbox keeps pending rows only: a delivered row is not pending.
                    delete.execute(params![key.poller, key.partition, row.event_id])?;
                }
                if self.log {
                    log.execute(params![
                        key.poller,
                        key.partition,
                        row.sequence,
                        row.event,
                        row.created_at,
                    ])?;
                }
            }
        }
        for row in &self.parked {
            put_parked(tx, ctx, key, row)?;
        }
        if !self.validators.is_empty() {
            let mut set = tx.prepare_cached(&sql.validator_set)?;
            for v in &self.validators {
                set.execute(params![
                    key.poller,
                    key.partition,
                    v.url_hash,
                    v.validator.etag,
                    v.validator.last_modified,
                    v.validator.stored_at
                ])?;
            }
        }
        patch_state(tx, ctx, key, &self.patch, true)
    }
}

#[async_trait]
impl Store for SqliteStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities::default().with_log(true)
    }

    async fn migrate(&self) -> Result<()> {
        let (db, opened) = self.database().await?;
        if opened {
            // Opening migrated already.
            return Ok(());
        }
        db.migrate().await
    }

    async fn close(&self) -> Result<()> {
        if *self.location() == Location::Memory {
            // The connection IS the data of a private in-memory database: keep it, so that
            // closing never changes what the store reads.
            return Ok(());
        }
        let _opening = self.opening.lock().await;
        // Calls in flight keep their connections until they finish; the next call reopens.
        let db = self
            .db
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(db) = db.and_then(Arc::into_inner) {
            // Nothing uses it any more: close the file before returning.
            db.shutdown().await?;
        }
        Ok(())
    }

    async fn acquire_lease(
        &self,
        key: &PKey,
        owner: &str,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<Option<Lease>> {
        let key = key.clone();
        let owner = owner.to_owned();
        let expires_at = now_ms.saturating_add(ttl_ms);
        self.write_in_transaction(move |conn, ctx| {
            take_lease(conn, ctx, &key, &owner, expires_at, now_ms)
        })
        .await
    }

    async fn claim(
        &self,
        key: &PKey,
        owner: &str,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<Option<Claim>> {
        // One closure on the writer: the reads run in the acquiring transaction, after the
        // lease row was written, so they see every write committed before it.
        let key = key.clone();
        let owner = owner.to_owned();
        let expires_at = now_ms.saturating_add(ttl_ms);
        self.write_in_transaction(move |conn, ctx| {
            let Some(lease) = take_lease(conn, ctx, &key, &owner, expires_at, now_ms)? else {
                return Ok(None);
            };
            let state = conn
                .prepare_cached(&ctx.sql.state_get)?
                .query_row(params![key.poller, key.partition], |r| {
                    r.get::<_, Option<String>>(0)
                })
                .optional()?
                .flatten()
                .map(|text| decode(format_args!("the state of {key}"), &text))
                .transpose()?;
            let pending = !pending_rows(conn, ctx, &key, 1)?.is_empty();
            Ok(Some(Claim::new(lease, state, pending)))
        })
        .await
    }

    async fn renew_lease(
        &self,
        key: &PKey,
        lease: &Lease,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<bool> {
        let key = key.clone();
        let lease = lease.clone();
        let expires_at = now_ms.saturating_add(ttl_ms);
        self.write_in_transaction(move |conn, ctx| {
            let changed = conn.prepare_cached(&ctx.sql.lease_renew)?.execute(params![
                key.poller,
                key.partition,
                lease.owner,
                lease.epoch,
                expires_at
            ])?;
            Ok(changed == 1)
        })
        .await
    }

    async fn release_lease(&self, key: &PKey, lease: &Lease) -> Result<()> {
        let key = key.clone();
        let lease = lease.clone();
        self.write_in_transaction(move |conn, ctx| {
            // A stale lease matches no row: a silent no-op, as the contract wants.
            conn.prepare_cached(&ctx.sql.lease_release)?
                .execute(params![key.poller, key.partition, lease.owner, lease.epoch])?;
            Ok(())
        })
        .await
    }

    async fn get_lease(&self, key: &PKey) -> Result<Option<Lease>> {
        let key = key.clone();
        self.read(move |conn, ctx| {
            let lease = conn
                .prepare_cached(&ctx.sql.lease_get)?
                .query_row(params![key.poller, key.partition], |r| {
                    Ok(Lease {
                        owner: r.get(0)?,
                        epoch: r.get(1)?,
                        expires_at: r.get(2)?,
                    })
                })
                .optional()?;
            Ok(lease)
        })
        .await
    }

    async fn load_state(&self, key: &PKey) -> Result<Option<PollerState>> {
        let key = key.clone();
        self.read(move |conn, ctx| {
            let stored: Option<String> = conn
                .prepare_cached(&ctx.sql.state_get)?
                .query_row(params![key.poller, key.partition], |r| r.get(0))
                .optional()?
                .flatten();
            stored
                .map(|text| decode(format_args!("the state of {key}"), &text))
                .transpose()
        })
        .await
    }

    async fn save_state(&self, key: &PKey, lease: &Lease, patch: &StatePatch) -> Result<()> {
        let patch = patch.clone();
        self.fenced(key, lease, move |tx, ctx, key| {
            patch_state(tx, ctx, key, &patch, true)
        })
        .await
    }

    async fn save_state_unfenced(&self, key: &PKey, patch: &StatePatch) -> Result<()> {
        let patch = patch.clone();
        self.unfenced(key, move |tx, ctx, key| {
            patch_state(tx, ctx, key, &patch, false)
        })
        .await
    }

    async fn list_keys(&self, poller: Option<&str>) -> Result<Vec<PKey>> {
        let poller = poller.map(str::to_owned);
        self.read(move |conn, ctx| {
            let mut statement = conn.prepare_cached(&ctx.sql.keys_list)?;
            let keys = statement
                .query_map(params![poller], |r| {
                    Ok(PKey::new(r.get::<_, String>(0)?, r.get::<_, String>(1)?))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(keys)
        })
        .await
    }

    async fn delete_key(&self, key: &PKey) -> Result<()> {
        self.unfenced(key, |tx, ctx, key| {
            let sql = &ctx.sql;
            for statement in [
                &sql.items_clear,
                &sql.outbox_clear,
                &sql.parked_clear,
                &sql.validators_clear,
                &sql.log_clear,
                &sql.key_forget,
            ] {
                tx.prepare_cached(statement)?
                    .execute(params![key.poller, key.partition])?;
            }
            Ok(())
        })
        .await
    }

    async fn clear_items(&self, key: &PKey) -> Result<()> {
        self.unfenced(key, |tx, ctx, key| {
            tx.prepare_cached(&ctx.sql.items_clear)?
                .execute(params![key.poller, key.partition])?;
            Ok(())
        })
        .await
    }

    async fn load_versions(
        &self,
        key: &PKey,
        identities: &[String],
    ) -> Result<HashMap<String, ItemRow>> {
        if identities.is_empty() {
            return Ok(HashMap::new());
        }
        let key = key.clone();
        let identities = unique(identities);
        self.read(move |conn, ctx| {
            let rows = query_in(
                conn,
                &ctx.sql.items_load_in,
                &key,
                &identities,
                codec::item_row,
            )?;
            Ok(rows
                .into_iter()
                .map(|row| (row.identity.clone(), row))
                .collect())
        })
        .await
    }

    fn stream_identities<'a>(
        &'a self,
        key: &'a PKey,
        batch_size: usize,
    ) -> BoxStream<'a, Result<Vec<String>>> {
        // Keyset pagination on the primary key: one short read per batch, never the whole
        // snapshot at once, and no identity twice even while the snapshot changes.
        let batch_size = batch_size.max(1);
        let limit = to_limit(batch_size);
        stream::unfold(Some(None::<String>), move |after| async move {
            let after = after?;
            let key = key.clone();
            let page = self
                .read(move |conn, ctx| {
                    let mut ids = Vec::new();
                    match &after {
                        None => {
                            let mut statement = conn.prepare_cached(&ctx.sql.items_first_page)?;
                            let mut rows =
                                statement.query(params![key.poller, key.partition, limit])?;
                            while let Some(row) = rows.next()? {
                                ids.push(row.get(0)?);
                            }
                        }
                        Some(last) => {
                            let mut statement = conn.prepare_cached(&ctx.sql.items_next_page)?;
                            let mut rows =
                                statement.query(params![key.poller, key.partition, last, limit])?;
                            while let Some(row) = rows.next()? {
                                ids.push(row.get(0)?);
                            }
                        }
                    }
                    Ok(ids)
                })
                .await;
            match page {
                // An error ends the stream after it is reported.
                Err(error) => Some((Err(error), None)),
                Ok(ids) if ids.is_empty() => None,
                Ok(ids) => {
                    let next = (ids.len() == batch_size).then(|| ids.last().cloned());
                    Some((Ok(ids), next))
                }
            }
        })
        .boxed()
    }

    async fn counts(&self, key: &PKey) -> Result<KeyCounts> {
        let key = key.clone();
        self.read(move |conn, ctx| {
            let counts = conn.prepare_cached(&ctx.sql.key_counts)?.query_row(
                params![key.poller, key.partition],
                |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, i64>(2)?,
                    ))
                },
            )?;
            Ok(KeyCounts {
                items: to_count(counts.0),
                pending: to_count(counts.1),
                parked: to_count(counts.2),
            })
        })
        .await
    }

    async fn resolve_parked(
        &self,
        key: &PKey,
        ids: &[String],
        action: ParkedAction,
    ) -> Result<u64> {
        match action {
            ParkedAction::Retry => self.retry_parked(key, ids).await,
            ParkedAction::Discard => self.discard_parked(key, ids).await,
        }
    }

    async fn commit_poll(&self, key: &PKey, lease: &Lease, batch: &CommitBatch) -> Result<()> {
        // Encoding happens here, before the transaction: a value that cannot be encoded fails
        // the call before anything is written.
        let batch = EncodedBatch::new(batch)?;
        self.fenced(key, lease, move |tx, ctx, key| batch.apply(tx, ctx, key))
            .await
    }

    async fn load_pending(&self, key: &PKey, limit: usize) -> Result<Vec<OutboxRow>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let key = key.clone();
        self.read(move |conn, ctx| pending_rows(conn, ctx, &key, limit))
            .await
    }

    async fn load_pending_with_holds(
        &self,
        key: &PKey,
        limit: usize,
    ) -> Result<(Vec<OutboxRow>, Vec<String>)> {
        let key = key.clone();
        self.read(move |conn, ctx| {
            let rows = match limit {
                0 => Vec::new(),
                _ => pending_rows(conn, ctx, &key, limit)?,
            };
            Ok((rows, held_keys(conn, ctx, &key)?))
        })
        .await
    }

    async fn ack_events(&self, key: &PKey, lease: &Lease, ids: &[String]) -> Result<()> {
        let ids = ids.to_vec();
        self.fenced(key, lease, move |tx, ctx, key| {
            // One cached statement executed per id rather than an `IN (...)` list: acks come in
            // groups of every size, and a list per size would be one more statement to build and
            // prepare per size, crowding the statement cache. Each execution is one primary-key
            // lookup either way.
            let mut delete = tx.prepare_cached(&ctx.sql.outbox_delete)?;
            for id in &ids {
                delete.execute(params![key.poller, key.partition, id])?;
            }
            Ok(())
        })
        .await
    }

    async fn record_attempt(
        &self,
        key: &PKey,
        lease: &Lease,
        id: &str,
        error: &SerializedError,
        next_attempt_at: Option<i64>,
    ) -> Result<()> {
        let id = id.to_owned();
        let error = encode("an error", error)?;
        self.fenced(key, lease, move |tx, ctx, key| {
            tx.prepare_cached(&ctx.sql.outbox_attempt)?
                .execute(params![
                    key.poller,
                    key.partition,
                    id,
                    error,
                    next_attempt_at
                ])?;
            Ok(())
        })
        .await
    }

    async fn park_event(&self, key: &PKey, lease: &Lease, row: &ParkedRow) -> Result<()> {
        let row = ParkedValues::new(row)?;
        self.fenced(key, lease, move |tx, ctx, key| {
            if let Some(event_id) = &row.event_id {
                tx.prepare_cached(&ctx.sql.outbox_delete)?.execute(params![
                    key.poller,
                    key.partition,
                    event_id
                ])?;
            }
            put_parked(tx, ctx, key, &row)
        })
        .await
    }

    async fn list_parked(&self, key: &PKey, query: ParkedQuery) -> Result<Vec<ParkedRow>> {
        let key = key.clone();
        let kind = query.kind.map(|k| k.as_str());
        let limit = query.limit.map_or(-1, to_limit);
        self.read(move |conn, ctx| {
            let mut statement = conn.prepare_cached(&ctx.sql.parked_list)?;
            let mut rows = statement.query(params![key.poller, key.partition, kind, limit])?;
            let mut out = Vec::new();
            while let Some(row) = rows.next()? {
                out.push(codec::parked_row(row)?);
            }
            Ok(out)
        })
        .await
    }

    async fn held_keys(&self, key: &PKey) -> Result<Vec<String>> {
        let key = key.clone();
        self.read(move |conn, ctx| held_keys(conn, ctx, &key)).await
    }

    async fn get_validator(&self, key: &PKey, url_hash: &str) -> Result<Option<Validator>> {
        let key = key.clone();
        let url_hash = url_hash.to_owned();
        self.read(move |conn, ctx| {
            let validator = conn
                .prepare_cached(&ctx.sql.validator_get)?
                .query_row(params![key.poller, key.partition, url_hash], |r| {
                    Ok(Validator {
                        etag: r.get(0)?,
                        last_modified: r.get(1)?,
                        stored_at: r.get(2)?,
                    })
                })
                .optional()?;
            Ok(validator)
        })
        .await
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
        let key = key.clone();
        self.read(move |conn, ctx| {
            let mut statement = conn.prepare_cached(&ctx.sql.log_read)?;
            let mut rows = statement.query(params![
                key.poller,
                key.partition,
                query.after_sequence,
                query.from_time,
                query.to_time,
                to_limit(limit)
            ])?;
            let mut out = Vec::new();
            while let Some(row) = rows.next()? {
                let sequence: i64 = row.get(0)?;
                let event: Event = decode(
                    format_args!("the log entry {sequence} of {key}"),
                    &row.get::<_, String>(1)?,
                )?;
                out.push(LoggedEvent {
                    sequence,
                    event,
                    created_at: row.get(2)?,
                });
            }
            Ok(out)
        })
        .await
    }

    async fn prune_log(&self, key: &PKey, older_than: i64) -> Result<u64> {
        self.unfenced(key, move |tx, ctx, key| {
            let removed = tx.prepare_cached(&ctx.sql.log_prune)?.execute(params![
                key.poller,
                key.partition,
                older_than
            ])?;
            Ok(u64::try_from(removed).unwrap_or(u64::MAX))
        })
        .await
    }
}

/// The two halves of [`Store::resolve_parked`].
impl SqliteStore {
    /// Moves poison rows back to the outbox as pending (see `Store::resolve_parked`).
    async fn retry_parked(&self, key: &PKey, ids: &[String]) -> Result<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        let ids = unique(ids);
        self.unfenced(key, move |tx, ctx, key| {
            let rows = query_in(tx, &ctx.sql.parked_retryable_in, key, &ids, |row| {
                let id: String = row.get(0)?;
                let text: String = row.get(1)?;
                let parked_at: i64 = row.get(2)?;
                let event: Event = decode(format_args!("the event of parked row {id:?}"), &text)?;
                Ok((id, event.sequence, text, parked_at))
            })?;
            let mut insert = tx.prepare_cached(&ctx.sql.outbox_upsert)?;
            let mut delete = tx.prepare_cached(&ctx.sql.parked_delete)?;
            for (id, sequence, event, parked_at) in &rows {
                // The event text moves as stored: no re-serialization.
                insert.execute(params![
                    key.poller,
                    key.partition,
                    id,
                    sequence,
                    event,
                    0,
                    None::<i64>,
                    None::<String>,
                    parked_at,
                ])?;
                delete.execute(params![key.poller, key.partition, id])?;
            }
            Ok(u64::try_from(rows.len()).unwrap_or(u64::MAX))
        })
        .await
    }

    /// Deletes parked rows (see `Store::resolve_parked`).
    async fn discard_parked(&self, key: &PKey, ids: &[String]) -> Result<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        let ids = unique(ids);
        self.unfenced(key, move |tx, ctx, key| {
            let removed = execute_in(tx, &ctx.sql.parked_delete_in, key, &ids)?;
            Ok(u64::try_from(removed).unwrap_or(u64::MAX))
        })
        .await
    }
}
