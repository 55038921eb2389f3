//! The PostgreSQL store: the `Store` implementation and its connection handling.

use std::collections::{BTreeSet, HashMap};
use std::str::FromStr;

use async_trait::async_trait;
use futures::stream::{self, BoxStream, StreamExt};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgQueryResult, PgRow};
use sqlx::{Connection, Executor, PgConnection, PgPool, Row};
use watukuy_core::{
    Error, Result,
    store::{
        Capabilities, Claim, CommitBatch, ItemRow, KeyCounts, Lease, LogQuery, LoggedEvent,
        OutboxRow, OutboxStatus, PKey, ParkedAction, ParkedQuery, ParkedRow, PollerState,
        SerializedError, StatePatch, Store, Validator,
    },
};

use crate::SCHEMA_VERSION;
use crate::codec::PgQuery;
use crate::codec::{
    self, ItemParams, LogParams, OutboxParams, ParkedParams, StateParams, ValidatorParams, count,
    last_wins, limit,
};
use crate::error::classify;
use crate::options::PostgresOptions;
use crate::sql::{self, Statements};
use crate::tls;

/// The PostgreSQL [`Store`]: many instances share one database, fenced by leases.
///
/// Build it with [`connect`](Self::connect) (a URL) or [`from_pool`](Self::from_pool) (your
/// pool), call [`migrate`](Store::migrate) once per schema and prefix (concurrent calls are
/// safe), and hand it to the engine. See the crate documentation for the design.
pub struct PostgresStore {
    pool: PgPool,
    options: PostgresOptions,
    sql: Statements,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("schema", &self.options.schema)
            .field("table_prefix", &self.options.table_prefix)
            .field("close_pool", &self.options.close_pool)
            .finish_non_exhaustive()
    }
}

/// The driver's options for `url` and `options`, before any connection: a URL the driver does
/// not take, or TLS settings that cannot work, are `Config` errors that never repeat the URL (it
/// may hold a password).
fn connect_options(url: &str, options: &PostgresOptions) -> Result<PgConnectOptions> {
    let connect_options = PgConnectOptions::from_str(url).map_err(|e| {
        Error::config(
            "postgres.url",
            format!("not a usable PostgreSQL connection string: {e}"),
        )
    })?;
    let connect_options = tls::configure(connect_options, url, options)?;
    Ok(if options.transaction_pooling {
        // No statement may outlive its transaction, and PgBouncer refuses startup parameters it
        // does not track.
        connect_options
            .statement_cache_capacity(0)
            .extra_float_digits(None)
    } else {
        connect_options
    })
}

impl PostgresStore {
    /// Connects to `url` (`postgres://user:password@host:port/database?...`) with a pool of
    /// [`max_connections`](PostgresOptions::max_connections).
    ///
    /// TLS (the `tls` feature, on by default: rustls, no OpenSSL) follows the URL's `sslmode`:
    /// `verify-full` checks the server's certificate and that it names the host, `verify-ca` the
    /// certificate only, `require` encrypts without checking (unless a root certificate is
    /// given: then it checks like `verify-ca`), `prefer` (the default) uses TLS when the server
    /// offers it, `disable` never. Certificates are checked against the system's roots plus
    /// `sslrootcert=<file>` or [`PostgresOptions::ssl_root_cert`]. Client certificates
    /// (`sslcert`, `sslkey`) are passed to the driver as they are.
    ///
    /// Fails with [`Error::Config`] for invalid options, an unusable URL, or TLS that cannot
    /// work: a root certificate that cannot be read, a server certificate that is not trusted,
    /// not for this host or expired, a server without TLS when the URL requires it (each message
    /// names the cause and the setting to change; retrying does not help). Fails with a
    /// transient [`Error::Store`] of kind `Connection` when the server cannot be reached
    /// (refused, unknown host, timed out) or the database does not exist yet, and with a
    /// permanent one when it refuses the login (a server that accepts only TLS for this user
    /// says so).
    pub async fn connect(url: &str, options: PostgresOptions) -> Result<Self> {
        options.validate()?;
        let connect_options = connect_options(url, &options)?;
        // One direct connection first: its error says what went wrong (refused, unknown host,
        // authentication, missing database), where the pool would retry a refused connection
        // until its acquire timeout and then report only that it timed out.
        let target = describe_target(&connect_options);
        let attempt = tokio::time::timeout(
            options.acquire_timeout,
            PgConnection::connect_with(&connect_options),
        )
        .await;
        match attempt {
            Ok(Ok(connection)) => {
                // The probe connection is not needed any more; failing to say goodbye is harmless.
                let _ = connection.close().await;
            }
            Ok(Err(e)) => return Err(connect_error(&target, classify(e))),
            Err(_) => {
                return Err(Error::store(
                    watukuy_core::store::StoreErrorKind::Connection,
                    true,
                    format!(
                        "cannot connect to PostgreSQL at {target}: no answer within {:?}",
                        options.acquire_timeout
                    ),
                ));
            }
        }
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.acquire_timeout)
            .connect_lazy_with(connect_options);
        Self::from_pool(pool, options)
    }

    /// Uses a pool you built (with your TLS, sizing and timeouts). `close()` closes it only with
    /// [`close_pool(true)`](PostgresOptions::close_pool).
    ///
    /// Fails with [`Error::Config`] naming the first invalid option. Nothing is sent to the
    /// database until the first call.
    pub fn from_pool(pool: PgPool, options: PostgresOptions) -> Result<Self> {
        options.validate()?;
        let sql = Statements::new(&options);
        Ok(Self { pool, options, sql })
    }

    /// [`Store::migrate`], callable without importing the trait: creates the schema when
    /// missing and applies every pending migration in one transaction under advisory locks, so
    /// every instance may call it at start-up at once (they run one after the other and all
    /// succeed). Until it has run, the store's calls fail with a `Schema` store error that says
    /// to run it.
    ///
    /// Fails with an [`Error::Store`] when the database cannot be reached (transient) or refuses
    /// the DDL (permissions, a schema newer than this version).
    pub async fn migrate(&self) -> Result<()> {
        <Self as Store>::migrate(self).await
    }

    /// [`Store::close`], callable without importing the trait: closes the pool when the store
    /// was built with [`close_pool(true)`](PostgresOptions::close_pool) (a closed pool is not
    /// reopened), and otherwise does nothing. Idempotent.
    pub async fn close(&self) -> Result<()> {
        <Self as Store>::close(self).await
    }

    /// The options this store was built with.
    pub fn options(&self) -> &PostgresOptions {
        &self.options
    }

    /// The complete DDL `migrate()` applies for `options` (schema, migrations table, every
    /// migration and its version row), for review or for your own migration tool. Every
    /// statement is idempotent.
    ///
    /// ```
    /// use watukuy_store_postgres::{PostgresOptions, PostgresStore};
    ///
    /// let ddl = PostgresStore::ddl(&PostgresOptions::default().schema("events")).unwrap();
    /// assert!(ddl.contains(r#"CREATE TABLE IF NOT EXISTS "events"."watukuy_outbox""#));
    /// ```
    pub fn ddl(options: &PostgresOptions) -> Result<String> {
        options.validate()?;
        Ok(sql::ddl(options))
    }

    /// Runs `queries` (each returning the `fenced` flag) as one fenced write: a single query runs
    /// on its own (one round trip, its own implicit transaction); several run in one
    /// transaction, the first of which takes the key's row lock. Any `false` rolls everything
    /// back and fails with `LeaseLost`.
    async fn run_fenced(&self, key: &PKey, lease: &Lease, queries: Vec<PgQuery<'_>>) -> Result<()> {
        let lost = || Error::lease_lost(key, lease.epoch);
        let mut queries = queries.into_iter();
        let Some(first) = queries.next() else {
            return Ok(());
        };
        if queries.len() == 0 {
            // The common case: one statement, one round trip, its own implicit transaction.
            let row = first.one_on(self).await?;
            return if fenced_flag(&row)? {
                Ok(())
            } else {
                Err(lost())
            };
        }
        let mut tx = self.pool.begin().await.map_err(classify)?;
        for query in std::iter::once(first).chain(queries) {
            let row = query.fetch_one(&mut *tx).await.map_err(classify)?;
            if !fenced_flag(&row)? {
                // Dropping the transaction rolls it back too; an explicit rollback just frees
                // the connection sooner, and its failure changes nothing for the caller.
                let _ = tx.rollback().await;
                return Err(lost());
            }
        }
        tx.commit().await.map_err(classify)
    }

    /// A statement: cached as a named prepared statement, or (with
    /// [`transaction_pooling`](PostgresOptions::transaction_pooling)) prepared unnamed.
    fn query<'q>(&self, sql: &'q str) -> PgQuery<'q> {
        sqlx::query(sql).persistent(!self.options.transaction_pooling)
    }

    fn key_query<'q>(&'q self, sql: &'q str, key: &'q PKey) -> PgQuery<'q> {
        self.query(sql).bind(&key.poller).bind(&key.partition)
    }

    /// The lease upsert (sql/queries/acquire_lease.sql): the row it wrote, `None` while another
    /// owner's lease is valid.
    async fn take_lease(
        &self,
        key: &PKey,
        owner: &str,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<Option<PgRow>> {
        self.key_query(&self.sql.acquire_lease, key)
            .bind(owner)
            .bind(now_ms)
            .bind(now_ms.saturating_add(ttl_ms))
            .optional_on(self)
            .await
    }

    fn fence_query<'q>(&'q self, sql: &'q str, key: &'q PKey, lease: &'q Lease) -> PgQuery<'q> {
        self.key_query(sql, key)
            .bind(&lease.owner)
            .bind(lease.epoch)
    }
}

/// Runs one statement on the store's pool, as it is or, with
/// [`transaction_pooling`](PostgresOptions::transaction_pooling), inside a transaction of its
/// own: the driver prepares and executes a statement in two exchanges, and a transaction pooler
/// may hand the second to another server connection unless a transaction holds it.
trait RunOn {
    /// Every row.
    async fn all_on(self, store: &PostgresStore) -> Result<Vec<PgRow>>;
    /// The first row, if any.
    async fn optional_on(self, store: &PostgresStore) -> Result<Option<PgRow>>;
    /// Exactly one row.
    async fn one_on(self, store: &PostgresStore) -> Result<PgRow>;
    /// No rows; how many were affected.
    async fn execute_on(self, store: &PostgresStore) -> Result<PgQueryResult>;
}

macro_rules! run_on {
    ($name:ident, $driver:ident, $out:ty) => {
        async fn $name(self, store: &PostgresStore) -> Result<$out> {
            if store.options.transaction_pooling {
                let mut tx = store.pool.begin().await.map_err(classify)?;
                let out = self.$driver(&mut *tx).await.map_err(classify)?;
                tx.commit().await.map_err(classify)?;
                Ok(out)
            } else {
                self.$driver(&store.pool).await.map_err(classify)
            }
        }
    };
}

impl RunOn for PgQuery<'_> {
    run_on!(all_on, fetch_all, Vec<PgRow>);
    run_on!(optional_on, fetch_optional, Option<PgRow>);
    run_on!(one_on, fetch_one, PgRow);
    run_on!(execute_on, execute, PgQueryResult);
}

/// `host:port/database` of a connection, without credentials.
fn describe_target(options: &PgConnectOptions) -> String {
    format!(
        "{}:{}/{}",
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or(options.get_username())
    )
}

/// Prefixes a connection failure with where the store tried to connect.
fn connect_error(target: &str, error: Error) -> Error {
    match error {
        Error::Config { option, message } => Error::Config {
            option,
            message: format!("cannot connect to PostgreSQL at {target}: {message}"),
        },
        Error::Store {
            kind,
            transient,
            message,
            source,
        } => Error::Store {
            kind,
            transient,
            message: format!("cannot connect to PostgreSQL at {target}: {message}"),
            source,
        },
        other => other,
    }
}

/// The `fenced` column of a fenced statement's row.
fn fenced_flag(row: &PgRow) -> Result<bool> {
    row.try_get::<bool, _>(0).map_err(classify)
}

/// The body of `migrate()`, on the migration transaction's connection.
async fn migrate_in(conn: &mut PgConnection, options: &PostgresOptions) -> Result<()> {
    // Under a transaction pooler, no named prepared statement may outlive the transaction.
    let persistent = !options.transaction_pooling;
    // The schema-wide lock also covers CREATE SCHEMA, which is not safe to race even with
    // IF NOT EXISTS (stores with other prefixes may be creating the same schema).
    let locks = [
        format!("watukuy:migrate:{}", options.schema),
        format!(
            "watukuy:migrate:{}.{}",
            options.schema, options.table_prefix
        ),
    ];
    for lock in locks {
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
            .persistent(persistent)
            .bind(lock)
            .execute(&mut *conn)
            .await
            .map_err(classify)?;
    }
    let schema_exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
            .persistent(persistent)
            .bind(options.schema.clone())
            .fetch_one(&mut *conn)
            .await
            .map_err(classify)?;
    if !schema_exists {
        let create = sql::render(sql::SCHEMA_TEMPLATE, options);
        (&mut *conn)
            .execute(create.as_str())
            .await
            .map_err(classify)?;
    }
    let versions = sql::render(sql::SCHEMA_VERSION_TEMPLATE, options);
    (&mut *conn)
        .execute(versions.as_str())
        .await
        .map_err(classify)?;
    let versions_table = format!(
        "\"{}\".\"{}schema_version\"",
        options.schema, options.table_prefix
    );
    let current_sql = format!("SELECT max(version) FROM {versions_table}");
    let current: Option<i32> = sqlx::query_scalar(&current_sql)
        .persistent(persistent)
        .fetch_one(&mut *conn)
        .await
        .map_err(classify)?;
    let current = current.unwrap_or(0);
    if current > SCHEMA_VERSION {
        return Err(Error::store(
            watukuy_core::store::StoreErrorKind::Schema,
            false,
            format!(
                "the tables in schema {:?} with prefix {:?} are at version {current}, newer \
                 than this watukuy-store-postgres knows ({SCHEMA_VERSION}): upgrade the crate",
                options.schema, options.table_prefix
            ),
        ));
    }
    let record = format!("INSERT INTO {versions_table} (version, name) VALUES ($1, $2)");
    for migration in sql::MIGRATIONS {
        if migration.version <= current {
            continue;
        }
        let ddl = sql::render(migration.template, options);
        (&mut *conn).execute(ddl.as_str()).await.map_err(classify)?;
        sqlx::query(&record)
            .persistent(persistent)
            .bind(migration.version)
            .bind(migration.name)
            .execute(&mut *conn)
            .await
            .map_err(classify)?;
    }
    Ok(())
}

/// The lease in a row of the lease upsert.
fn lease_of(row: &PgRow, owner: &str) -> Result<Lease> {
    Ok(Lease {
        owner: owner.to_owned(),
        epoch: row.try_get("lease_epoch").map_err(classify)?,
        expires_at: codec::required(row, "lease_expires_at")?,
    })
}

#[async_trait]
impl Store for PostgresStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities::default().with_log(true)
    }

    /// Creates the schema when missing and applies every pending migration, in one transaction
    /// holding `pg_advisory_xact_lock(hashtext('watukuy:migrate:<schema>'))` and
    /// `pg_advisory_xact_lock(hashtext('watukuy:migrate:<schema>.<prefix>'))`, so concurrent
    /// calls from any number of instances run one after the other and all succeed.
    async fn migrate(&self) -> Result<()> {
        let mut tx = self.pool.begin().await.map_err(classify)?;
        migrate_in(&mut tx, &self.options).await?;
        tx.commit().await.map_err(classify)
    }

    async fn close(&self) -> Result<()> {
        if self.options.close_pool {
            self.pool.close().await;
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
        let taken = self.take_lease(key, owner, ttl_ms, now_ms).await?;
        taken.map(|row| lease_of(&row, owner)).transpose()
    }

    async fn claim(
        &self,
        key: &PKey,
        owner: &str,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<Option<Claim>> {
        // Two statements, not one: see sql/queries/acquire_lease.sql.
        let Some(row) = self.take_lease(key, owner, ttl_ms, now_ms).await? else {
            return Ok(None);
        };
        let has_state: bool = codec::required(&row, "has_state")?;
        let state = has_state.then(|| codec::decode_state(&row)).transpose()?;
        let pending: bool = codec::required(
            &self
                .key_query(&self.sql.has_pending, key)
                .one_on(self)
                .await?,
            "pending",
        )?;
        Ok(Some(Claim::new(lease_of(&row, owner)?, state, pending)))
    }

    async fn renew_lease(
        &self,
        key: &PKey,
        lease: &Lease,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<bool> {
        let done = self
            .fence_query(&self.sql.renew_lease, key, lease)
            .bind(now_ms.saturating_add(ttl_ms))
            .execute_on(self)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn release_lease(&self, key: &PKey, lease: &Lease) -> Result<()> {
        // Zero rows affected is the contract's silent no-op for a stale lease.
        self.fence_query(&self.sql.release_lease, key, lease)
            .execute_on(self)
            .await?;
        Ok(())
    }

    async fn get_lease(&self, key: &PKey) -> Result<Option<Lease>> {
        let row = self
            .key_query(&self.sql.get_lease, key)
            .optional_on(self)
            .await?;
        row.map(|row| {
            Ok(Lease {
                owner: codec::required(&row, "lease_owner")?,
                epoch: row.try_get("lease_epoch").map_err(classify)?,
                expires_at: codec::required(&row, "lease_expires_at")?,
            })
        })
        .transpose()
    }

    async fn load_state(&self, key: &PKey) -> Result<Option<PollerState>> {
        let row = self
            .key_query(&self.sql.load_state, key)
            .optional_on(self)
            .await?;
        row.as_ref().map(codec::decode_state).transpose()
    }

    async fn save_state(&self, key: &PKey, lease: &Lease, patch: &StatePatch) -> Result<()> {
        let state = StateParams::new(patch)?;
        // ONE statement: the UPDATE's WHERE is the fence (see sql/queries/save_state.sql).
        let done = state
            .bind(self.key_query(&self.sql.save_state, key))
            .bind(&lease.owner)
            .bind(lease.epoch)
            .execute_on(self)
            .await?;
        if done.rows_affected() == 1 {
            Ok(())
        } else {
            Err(Error::lease_lost(key, lease.epoch))
        }
    }

    async fn save_state_unfenced(&self, key: &PKey, patch: &StatePatch) -> Result<()> {
        let state = StateParams::new(patch)?;
        state
            .bind(self.key_query(&self.sql.save_state_unfenced, key))
            .execute_on(self)
            .await?;
        Ok(())
    }

    async fn list_keys(&self, poller: Option<&str>) -> Result<Vec<PKey>> {
        let rows = self
            .query(&self.sql.list_keys)
            .bind(poller)
            .all_on(self)
            .await?;
        rows.iter()
            .map(|row| {
                Ok(PKey {
                    poller: row.try_get("poller").map_err(classify)?,
                    partition: row.try_get("partition").map_err(classify)?,
                })
            })
            .collect()
    }

    async fn delete_key(&self, key: &PKey) -> Result<()> {
        // Two statements in one transaction: the first waits for any fenced write in flight and
        // locks the key's row, so the second's snapshot sees everything that write committed.
        let mut tx = self.pool.begin().await.map_err(classify)?;
        self.key_query(&self.sql.lock_key, key)
            .fetch_optional(&mut *tx)
            .await
            .map_err(classify)?;
        self.key_query(&self.sql.delete_key, key)
            .execute(&mut *tx)
            .await
            .map_err(classify)?;
        tx.commit().await.map_err(classify)
    }

    async fn clear_items(&self, key: &PKey) -> Result<()> {
        self.key_query(&self.sql.clear_items, key)
            .execute_on(self)
            .await?;
        Ok(())
    }

    async fn load_versions(
        &self,
        key: &PKey,
        identities: &[String],
    ) -> Result<HashMap<String, ItemRow>> {
        let mut out = HashMap::with_capacity(identities.len());
        for chunk in identities.chunks(self.options.max_rows_per_statement) {
            let rows = self
                .key_query(&self.sql.load_versions, key)
                .bind(chunk)
                .all_on(self)
                .await?;
            for row in &rows {
                let item = codec::decode_item(row)?;
                out.insert(item.identity.clone(), item);
            }
        }
        Ok(out)
    }

    fn stream_identities<'a>(
        &'a self,
        key: &'a PKey,
        batch_size: usize,
    ) -> BoxStream<'a, Result<Vec<String>>> {
        // Keyset pagination in byte order: one short query per batch, never the whole snapshot
        // at once. After a short batch (or an error) the stream ends.
        let batch_size = batch_size.max(1);
        stream::unfold(Some(None::<String>), move |after| async move {
            let after = after?;
            let result = self
                .key_query(&self.sql.stream_identities, key)
                .bind(after)
                .bind(limit(batch_size))
                .all_on(self)
                .await
                .and_then(|rows| {
                    rows.iter()
                        .map(|row| row.try_get::<String, _>(0).map_err(classify))
                        .collect::<Result<Vec<String>>>()
                });
            match result {
                Ok(batch) if batch.is_empty() => None,
                Ok(batch) => {
                    let next = (batch.len() == batch_size).then(|| batch.last().cloned());
                    Some((Ok(batch), next))
                }
                Err(e) => Some((Err(e), None)),
            }
        })
        .boxed()
    }

    async fn counts(&self, key: &PKey) -> Result<KeyCounts> {
        let row = self.key_query(&self.sql.counts, key).one_on(self).await?;
        let column = |i: usize| -> Result<u64> {
            let value: i64 = row.try_get(i).map_err(classify)?;
            u64::try_from(value).map_err(|e| Error::corrupt("a row count", e))
        };
        Ok(KeyCounts {
            items: column(0)?,
            pending: column(1)?,
            parked: column(2)?,
        })
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
        let state = StateParams::new(&batch.state_patch)?;
        // One statement may not change a row twice, so every list is reduced to distinct keys
        // first, with the reference store's outcome: upserts then deletes (a deleted identity
        // stays deleted), the last row of an event id, sequence, parked id or URL hash wins.
        let deleted: BTreeSet<&str> = batch.deletes.iter().map(String::as_str).collect();
        let upserts: Vec<ItemParams> = last_wins(
            batch
                .upserts
                .iter()
                .filter(|row| !deleted.contains(row.identity.as_str())),
            |row| row.identity.as_str(),
        )
        .into_iter()
        .map(ItemParams::new)
        .collect();
        let deletes: Vec<String> = deleted.iter().map(|id| (*id).to_owned()).collect();
        let events = last_wins(batch.events.iter(), |row| row.event_id.as_str());
        let mut pending = Vec::new();
        let mut delivered = Vec::new();
        for row in events {
            match row.status {
                OutboxStatus::Pending => pending.push(OutboxParams::new(row)?),
                OutboxStatus::Delivered => delivered.push(row.event_id.to_string()),
            }
        }
        let log: Vec<LogParams> = if batch.log {
            last_wins(batch.events.iter(), |row| row.sequence)
                .into_iter()
                .map(LogParams::new)
                .collect::<Result<_>>()?
        } else {
            Vec::new()
        };
        let parked: Vec<ParkedParams> = last_wins(batch.parked.iter(), |row| row.id.as_str())
            .into_iter()
            .map(ParkedParams::new)
            .collect::<Result<_>>()?;
        let validators: Vec<ValidatorParams> =
            last_wins(batch.validators.iter(), |row| row.url_hash.as_str())
                .into_iter()
                .map(ValidatorParams::new)
                .collect();

        let per = self.options.max_rows_per_statement;
        let longest = [
            upserts.len(),
            deletes.len(),
            pending.len(),
            delivered.len(),
            log.len(),
            parked.len(),
            validators.len(),
        ]
        .into_iter()
        .max()
        .unwrap_or(0);
        let statements = longest.div_ceil(per).max(1);
        let mut queries = Vec::with_capacity(statements);
        for chunk in 0..statements {
            let range = |len: usize| (chunk * per).min(len)..((chunk + 1) * per).min(len);
            // The first statement carries the patch; later ones (same transaction, lock held)
            // carry an empty one and only re-check the fence.
            let state = if chunk == 0 {
                state.clone()
            } else {
                state.without_patch()
            };
            let query = state
                .bind(self.key_query(&self.sql.commit_poll, key))
                .bind(&lease.owner)
                .bind(lease.epoch);
            let query = ItemParams::bind(query, &upserts[range(upserts.len())])
                .bind(deletes[range(deletes.len())].to_vec());
            let query = OutboxParams::bind(query, &pending[range(pending.len())])
                .bind(delivered[range(delivered.len())].to_vec());
            let query = LogParams::bind(query, &log[range(log.len())]);
            let query = ParkedParams::bind(query, &parked[range(parked.len())]);
            queries.push(ValidatorParams::bind(
                query,
                &validators[range(validators.len())],
            ));
        }
        self.run_fenced(key, lease, queries).await
    }

    async fn load_pending(&self, key: &PKey, limit_rows: usize) -> Result<Vec<OutboxRow>> {
        let rows = self
            .key_query(&self.sql.load_pending, key)
            .bind(limit(limit_rows))
            .all_on(self)
            .await?;
        rows.iter().map(codec::decode_outbox).collect()
    }

    async fn load_pending_with_holds(
        &self,
        key: &PKey,
        limit_rows: usize,
    ) -> Result<(Vec<OutboxRow>, Vec<String>)> {
        let rows = self
            .key_query(&self.sql.load_pending_with_holds, key)
            .bind(limit(limit_rows))
            .all_on(self)
            .await?;
        let held = match rows.first() {
            Some(row) => row
                .try_get::<Vec<String>, _>("held_keys")
                .map_err(classify)?,
            None => Vec::new(),
        };
        let mut pending = Vec::with_capacity(rows.len());
        for row in &rows {
            // The one row of an empty outbox carries the hold keys only.
            if row
                .try_get::<Option<String>, _>("event_id")
                .map_err(classify)?
                .is_some()
            {
                pending.push(codec::decode_outbox(row)?);
            }
        }
        pending.sort_by(|a, b| (a.sequence, &a.event_id).cmp(&(b.sequence, &b.event_id)));
        Ok((pending, held))
    }

    async fn ack_events(&self, key: &PKey, lease: &Lease, ids: &[String]) -> Result<()> {
        // Even an empty list runs the fence, so a stale lease is reported either way.
        let chunks: Vec<&[String]> = if ids.is_empty() {
            vec![ids]
        } else {
            ids.chunks(self.options.max_rows_per_statement).collect()
        };
        let queries = chunks
            .into_iter()
            .map(|chunk| {
                self.fence_query(&self.sql.ack_events, key, lease)
                    .bind(chunk)
            })
            .collect();
        self.run_fenced(key, lease, queries).await
    }

    async fn record_attempt(
        &self,
        key: &PKey,
        lease: &Lease,
        id: &str,
        error: &SerializedError,
        next_attempt_at: Option<i64>,
    ) -> Result<()> {
        let query = self
            .fence_query(&self.sql.record_attempt, key, lease)
            .bind(id)
            .bind(codec::encode("an outbox row's last error", error)?)
            .bind(next_attempt_at);
        self.run_fenced(key, lease, vec![query]).await
    }

    async fn park_event(&self, key: &PKey, lease: &Lease, row: &ParkedRow) -> Result<()> {
        let params = ParkedParams::new(row)?;
        let query = self
            .fence_query(&self.sql.park_event, key, lease)
            .bind(row.event.as_ref().map(|event| event.id.as_str()));
        let query = params.bind_one(query);
        self.run_fenced(key, lease, vec![query]).await
    }

    async fn list_parked(&self, key: &PKey, query: ParkedQuery) -> Result<Vec<ParkedRow>> {
        let rows = self
            .key_query(&self.sql.list_parked, key)
            .bind(query.kind.map(|kind| kind.as_str()))
            .bind(query.limit.map(limit))
            .all_on(self)
            .await?;
        rows.iter().map(codec::decode_parked).collect()
    }

    async fn held_keys(&self, key: &PKey) -> Result<Vec<String>> {
        let rows = self
            .key_query(&self.sql.held_keys, key)
            .all_on(self)
            .await?;
        rows.iter()
            .map(|row| row.try_get::<String, _>(0).map_err(classify))
            .collect()
    }

    async fn get_validator(&self, key: &PKey, url_hash: &str) -> Result<Option<Validator>> {
        let row = self
            .key_query(&self.sql.get_validator, key)
            .bind(url_hash)
            .optional_on(self)
            .await?;
        row.map(|row| {
            Ok(Validator {
                etag: row.try_get("etag").map_err(classify)?,
                last_modified: row.try_get("last_modified").map_err(classify)?,
                stored_at: row.try_get("stored_at").map_err(classify)?,
            })
        })
        .transpose()
    }

    async fn read_log(
        &self,
        key: &PKey,
        query: LogQuery,
        limit_rows: usize,
    ) -> Result<Vec<LoggedEvent>> {
        let rows = self
            .key_query(&self.sql.read_log, key)
            .bind(query.after_sequence)
            .bind(query.from_time)
            .bind(query.to_time)
            .bind(limit(limit_rows))
            .all_on(self)
            .await?;
        rows.iter().map(codec::decode_logged).collect()
    }

    async fn prune_log(&self, key: &PKey, older_than: i64) -> Result<u64> {
        let done = self
            .key_query(&self.sql.prune_log, key)
            .bind(older_than)
            .execute_on(self)
            .await?;
        Ok(done.rows_affected())
    }
}

/// The two halves of [`Store::resolve_parked`].
impl PostgresStore {
    /// Moves poison rows back to the outbox as pending (see `Store::resolve_parked`).
    async fn retry_parked(&self, key: &PKey, ids: &[String]) -> Result<u64> {
        let mut moved = 0;
        for chunk in ids.chunks(self.options.max_rows_per_statement) {
            let row = self
                .key_query(&self.sql.retry_parked, key)
                .bind(chunk)
                .one_on(self)
                .await?;
            moved += count(&row)?;
        }
        Ok(moved)
    }

    /// Deletes parked rows (see `Store::resolve_parked`).
    async fn discard_parked(&self, key: &PKey, ids: &[String]) -> Result<u64> {
        let mut removed = 0;
        for chunk in ids.chunks(self.options.max_rows_per_statement) {
            let done = self
                .key_query(&self.sql.discard_parked, key)
                .bind(chunk)
                .execute_on(self)
                .await?;
            removed += done.rows_affected();
        }
        Ok(removed)
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
            scheme in "postgres|postgresql|POSTGRES|mysql|http",
            user in "[a-z]{0,4}",
            password in "[A-Z][A-Za-z0-9/?#@:%+ =&]{5,12}",
            host in "[a-z0-9.,:\\[\\]]{0,16}",
            tail in "(/[a-z]{0,4})?(\\?(sslmode|sslrootcert|port|options|application_name)=[a-z%0-9./-]{0,10})?",
        ) {
            let url = format!("{scheme}://{user}:{password}@{host}{tail}");
            if let Err(error) = connect_options(&url, &PostgresOptions::default()) {
                let printed = format!("{error} {error:?}");
                prop_assert!(!printed.contains(&password), "{url:?}: {printed}");
            }
        }
    }
}
