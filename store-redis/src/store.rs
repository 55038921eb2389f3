//! The Redis store: the `Store` implementation, its connections and its scripts' callers.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::{self, BoxStream, StreamExt};
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Client, Value};
use watukuy_core::{
    Error, Result,
    store::{
        Capabilities, Claim, CommitBatch, ItemRow, KeyCounts, Lease, LogQuery, LoggedEvent,
        OutboxRow, OutboxStatus, PKey, ParkedAction, ParkedKind, ParkedQuery, ParkedRow,
        PollerState, SerializedError, StatePatch, Store, StoreErrorKind, Validator,
    },
};

use crate::budget::RedisBudgetStore;
use crate::codec::{self, Attempt, count, decode, encode, int, outbox_row, state_args};
use crate::conn::{self, Conn};
use crate::error::classify;
use crate::keys::{KeyKeys, KeySpace};
use crate::options::{RedisOptions, TlsOptions};
use crate::scripts::{self, Call, Lua, SCRIPTS, reply, run, run_many, run_many_waited, run_waited};
use crate::url;

/// How many identities one `HMGET` asks for.
const HMGET_CHUNK: usize = 1000;

/// The Redis [`Store`]: many engine instances share one Redis (standalone or Redis Cluster),
/// fenced by leases; every fenced write is one Lua script.
///
/// Build it with [`connect`](Self::connect) (a URL: `redis://`, `rediss://` for TLS,
/// `redis+cluster://` for a cluster), [`connect_cluster`](Self::connect_cluster) (a cluster's
/// seed nodes), [`from_manager`](Self::from_manager) or [`from_cluster`](Self::from_cluster)
/// (your connection) and hand it to the engine. [`migrate`](Store::migrate) only loads the
/// scripts (there is no schema); [`close`](Store::close) does nothing (the connection closes when
/// the last clone of the store is dropped). See the crate documentation for the key layout, the
/// scripts and what a failover can lose.
#[derive(Clone)]
pub struct RedisStore {
    conn: Conn,
    options: RedisOptions,
    keys: KeySpace,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.options.prefix)
            .field("cluster", &self.conn.is_cluster())
            .finish_non_exhaustive()
    }
}

/// `host:port` (or the socket path) of a client, without credentials.
fn describe_target(client: &Client) -> String {
    client.get_connection_info().addr().to_string()
}

/// A failure to connect, prefixed with where the store tried to connect. A plain-text connection
/// the server closed at once, and a TLS connection that got no answer, get a hint about TLS.
fn connect_error(target: &str, tls: bool, error: redis::RedisError) -> Error {
    let hint = if !tls && error.is_connection_dropped() && !error.is_connection_refusal() {
        " (the server accepted the connection and closed it: if it only accepts TLS, use a \
         rediss:// URL)"
    } else if tls && error.is_timeout() {
        " (no TLS answer: if this is a plain-text port, use a redis:// URL or the server's TLS \
         port)"
    } else {
        ""
    };
    match classify(error) {
        Error::Store {
            kind,
            transient,
            message,
            source,
        } => Error::Store {
            kind,
            transient,
            message: format!("cannot connect to Redis at {target}: {message}{hint}"),
            source,
        },
        Error::Config { option, message } => Error::Config {
            option,
            message: format!("cannot connect to Redis at {target}: {message}"),
        },
        other => other,
    }
}

/// Connects once to `client`, to learn early and clearly whether the server is there.
async fn probe(
    client: &Client,
    options: &RedisOptions,
) -> redis::RedisResult<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(options.connect_timeout))
        .set_response_timeout(Some(options.response_timeout));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

/// The TLS material of `options`, completed by the files a URL names.
fn tls_material(options: &RedisOptions, target: &url::Target) -> Result<TlsOptions> {
    let read = |param: &str, path: &str| {
        std::fs::read(path).map_err(|e| {
            Error::config(
                "redis.url",
                format!("the URL parameter {param}: cannot read {path}: {e}"),
            )
        })
    };
    let mut tls = options.tls.clone();
    if let Some(path) = &target.ca_file {
        tls.ca_pem = Some(read("tls_ca_file", path)?);
    }
    if let (Some(cert), Some(key)) = (&target.cert_file, &target.key_file) {
        tls.client_pem = Some((read("tls_cert_file", cert)?, read("tls_key_file", key)?));
    }
    let checked = RedisOptions {
        tls: tls.clone(),
        ..options.clone()
    };
    checked.validate()?;
    Ok(tls)
}

#[cfg(feature = "tls")]
fn certificates(tls: &TlsOptions) -> Option<redis::TlsCertificates> {
    if tls.ca_pem.is_none() && tls.client_pem.is_none() {
        return None;
    }
    Some(redis::TlsCertificates {
        client_tls: tls
            .client_pem
            .as_ref()
            .map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
        root_cert: tls.ca_pem.clone(),
    })
}

/// A client for one node of `target`, with TLS material when the URL is a TLS one.
fn client(url: &str, target: &url::Target, tls: &TlsOptions) -> Result<Client> {
    let unusable =
        |e: redis::RedisError| Error::config("redis.url", format!("not a usable Redis URL: {e}"));
    if target.tls {
        #[cfg(feature = "tls")]
        {
            // redis builds its rustls configuration with the process-wide crypto provider: make
            // it ring when the process has chosen none (a program that compiles in two providers
            // would otherwise panic there).
            if rustls::crypto::CryptoProvider::get_default().is_none() {
                let _ = rustls::crypto::ring::default_provider().install_default();
            }
            return match certificates(tls) {
                Some(certs) => Client::build_with_tls(url, certs).map_err(unusable),
                None => Client::open(url).map_err(unusable),
            };
        }
        #[cfg(not(feature = "tls"))]
        {
            let _ = tls;
            return Err(Error::config(
                "redis.url",
                "a TLS URL (rediss://) needs the `tls` feature of watukuy-store-redis, which \
                 this build leaves out",
            ));
        }
    }
    let _ = tls;
    Client::open(url).map_err(unusable)
}

impl RedisStore {
    /// Connects to `url` through connections that reconnect by themselves (see
    /// [`RedisOptions::reconnect_attempts`]):
    ///
    /// - `redis://[user:password@]host:port[/db]`, `unix:///path/to/socket`: a standalone Redis,
    ///   one multiplexed connection;
    /// - `rediss://…`: the same over TLS (the `tls` feature, on by default), verifying the
    ///   server's certificate against the system's roots, or the authorities of
    ///   [`RedisOptions::tls_ca_pem`] or of the URL parameter `tls_ca_file=<path>`; a client
    ///   certificate for mutual TLS comes from [`RedisOptions::tls_client_auth`] or
    ///   `tls_cert_file=<path>&tls_key_file=<path>`;
    /// - `redis+cluster://[user:password@]host:port[,host:port…]` (`rediss+cluster://` with TLS):
    ///   Redis Cluster, from the seed nodes listed, like [`connect_cluster`](Self::connect_cluster).
    ///
    /// Fails with [`Error::Config`] for invalid options, an unusable URL and a TLS failure that
    /// retrying cannot fix (a certificate that does not verify, a server that does not speak TLS),
    /// and with a transient [`Error::Store`] of kind `Connection` when the server cannot be
    /// reached (refused, unknown host, timed out, closed the connection).
    pub async fn connect(url: &str, options: RedisOptions) -> Result<Self> {
        options.validate()?;
        let target = url::parse(url)?;
        let tls = tls_material(&options, &target)?;
        if target.cluster {
            return Self::cluster(&target, &tls, options).await;
        }
        let node = target.nodes.first().map(String::as_str).unwrap_or_default();
        let client = client(node, &target, &tls)?;
        let described = describe_target(&client);
        // One direct connection first: its error says what went wrong, where the manager would
        // retry a refused connection with backoff before reporting it.
        drop(
            probe(&client, &options)
                .await
                .map_err(|e| connect_error(&described, target.tls, e))?,
        );
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.response_timeout))
            .set_number_of_retries(options.reconnect_attempts);
        let conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| connect_error(&described, target.tls, e))?;
        Self::from_manager(conn, options)
    }

    /// Connects to Redis Cluster through `nodes` (`redis://host:port` or `rediss://host:port`
    /// URLs of some of its nodes, all with the same credentials and scheme): one multiplexed
    /// connection per node, commands routed by slot, `MOVED`/`ASK` followed and the slot map
    /// refreshed after a failover. TLS material comes from `options` as for
    /// [`connect`](Self::connect). Every script of the store touches the keys of one slot only.
    ///
    /// Fails like [`connect`](Self::connect); the first node is probed first so that its error
    /// says what is wrong.
    pub async fn connect_cluster(nodes: &[&str], options: RedisOptions) -> Result<Self> {
        options.validate()?;
        if nodes.is_empty() {
            return Err(Error::config(
                "redis.url",
                "a cluster needs at least one seed node",
            ));
        }
        let tls = nodes
            .first()
            .is_some_and(|n| n.trim().to_ascii_lowercase().starts_with("rediss://"));
        let target = url::Target {
            nodes: nodes.iter().map(|n| n.trim().to_owned()).collect(),
            cluster: true,
            tls,
            ca_file: None,
            cert_file: None,
            key_file: None,
        };
        let material = options.tls.clone();
        Self::cluster(&target, &material, options).await
    }

    async fn cluster(
        target: &url::Target,
        tls: &TlsOptions,
        options: RedisOptions,
    ) -> Result<Self> {
        let first = target.nodes.first().map(String::as_str).unwrap_or_default();
        let seed = client(first, target, tls)?;
        let described = describe_target(&seed);
        drop(
            probe(&seed, &options)
                .await
                .map_err(|e| connect_error(&described, target.tls, e))?,
        );
        let builder = ClusterClientBuilder::new(target.nodes.iter().map(String::as_str))
            .connection_timeout(options.connect_timeout)
            .response_timeout(options.response_timeout)
            .retries(u32::try_from(options.reconnect_attempts).unwrap_or(u32::MAX));
        #[cfg(feature = "tls")]
        let builder = match certificates(tls) {
            Some(certs) if target.tls => builder.certs(certs),
            _ => builder,
        };
        let client = builder
            .build()
            .map_err(|e| Error::config("redis.url", format!("not a usable Redis Cluster: {e}")))?;
        let conn = client
            .get_async_connection()
            .await
            .map_err(|e| connect_error(&described, target.tls, e))?;
        Self::build(
            Conn::Cluster(Arc::new(conn::Cluster::new(Some(client), conn))),
            options,
        )
    }

    /// Uses a connection manager you built (with your TLS, timeouts and reconnection policy).
    /// The store only clones it; nothing is sent until the first call.
    ///
    /// Fails with [`Error::Config`] naming the first invalid option. Connection settings of
    /// `options` are ignored: the manager keeps its own.
    pub fn from_manager(conn: ConnectionManager, options: RedisOptions) -> Result<Self> {
        Self::build(Conn::Single(conn), options)
    }

    /// Uses a Redis Cluster connection you built (`redis::cluster::ClusterClient`'s
    /// `get_async_connection`). Like [`from_manager`](Self::from_manager): nothing is sent until
    /// the first call, and the connection keeps its own settings.
    ///
    /// The driver follows `MOVED` and `ASK` by itself; unlike the connections
    /// [`connect`](Self::connect) builds, this one cannot be replaced by a fresh one when a
    /// failover leaves its slot map stale, so prefer `connect` with a `redis+cluster://` URL.
    pub fn from_cluster(conn: ClusterConnection, options: RedisOptions) -> Result<Self> {
        Self::build(
            Conn::Cluster(Arc::new(conn::Cluster::new(None, conn))),
            options,
        )
    }

    fn build(conn: Conn, options: RedisOptions) -> Result<Self> {
        options.validate()?;
        let keys = KeySpace::new(&options.prefix);
        Ok(Self {
            conn,
            options,
            keys,
        })
    }

    /// Whether the store talks to Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.conn.is_cluster()
    }

    /// [`Store::migrate`], callable without importing the trait. Redis has no schema: this loads
    /// every Lua script, which checks that the server runs them and warms its script cache.
    /// Idempotent.
    ///
    /// Fails with an [`Error::Store`] when the server cannot be reached (transient) or refuses
    /// the scripts.
    pub async fn migrate(&self) -> Result<()> {
        <Self as Store>::migrate(self).await
    }

    /// [`Store::close`], callable without importing the trait. It does nothing: the connection
    /// closes with the last clone of the store.
    pub async fn close(&self) -> Result<()> {
        <Self as Store>::close(self).await
    }

    /// The options this store was built with.
    pub fn options(&self) -> &RedisOptions {
        &self.options
    }

    /// A [`RedisBudgetStore`] on this store's connection and prefix: rate budgets shared by
    /// every process that uses the same Redis and prefix.
    pub fn budget_store(&self) -> RedisBudgetStore {
        RedisBudgetStore::new(self.conn.clone(), self.keys.clone())
    }

    /// Deletes every key under the prefix (`SCAN MATCH <prefix>*` and `UNLINK`, in batches, not
    /// atomically): data, leases, epoch counters and budgets. Meant for tests and teardown; a
    /// running engine on the same prefix loses everything. Returns how many keys were deleted.
    pub async fn purge(&self) -> Result<u64> {
        // The prefix holds no glob characters (validated), so it matches itself.
        let pattern = format!("{}*", self.keys.prefix());
        let deleted = std::sync::atomic::AtomicU64::new(0);
        self.conn
            .scan_each(&pattern, |batch| {
                let mut conn = self.conn.clone();
                let deleted = &deleted;
                async move {
                    if batch.is_empty() {
                        return Ok(());
                    }
                    // On a cluster the driver splits a multi-key UNLINK by slot.
                    let n: i64 = redis::cmd("UNLINK")
                        .arg(&batch)
                        .query_async(&mut conn)
                        .await
                        .map_err(|e| self.conn.classify(e))?;
                    deleted.fetch_add(count(n), std::sync::atomic::Ordering::Relaxed);
                    Ok(())
                }
            })
            .await?;
        Ok(deleted.into_inner())
    }

    fn of(&self, key: &PKey) -> KeyKeys {
        self.keys.of(key)
    }

    /// Runs a lease-taking `script` (`acquire_lease.lua`, `claim.lua`) on `keys` for `owner`:
    /// the key is listed first, then leased, both in one round trip (two on a cluster: the list
    /// has a slot of its own). `None` when another owner's lease is still valid.
    async fn take_lease<T: redis::FromRedisValue>(
        &self,
        key: &PKey,
        script: &'static Lua,
        keys: &[&String],
        owner: &str,
        now_ms: i64,
        expires_at: i64,
    ) -> Result<Option<T>> {
        let take = script
            .call(keys)
            .arg(owner)
            .arg(now_ms.to_string())
            .arg(expires_at.to_string());
        let (mut replies, waited) = run_many_waited(
            &self.conn,
            vec![self.register(key), take],
            self.options.wait,
        )
        .await?;
        let taken: Option<T> = match replies.pop() {
            Some(value) => reply(script, value)?,
            None => None,
        };
        if taken.is_some() {
            // A new epoch a failover could lose would be handed out again.
            waited?;
        }
        Ok(taken)
    }

    /// `register_key.lua` for `key`.
    fn register(&self, key: &PKey) -> Call {
        SCRIPTS
            .register_key
            .call(&[self.keys.pollers(), self.keys.partitions(&key.poller)])
            .arg(&key.poller)
            .arg(&key.partition)
    }

    /// Runs a fenced script, which answers `OK` or `LEASE_LOST`, then `WAIT`s for replicas
    /// when [`RedisOptions::wait_replicas`] asks for it (in the same round trip).
    async fn fenced(&self, key: &PKey, lease: &Lease, call: Call) -> Result<()> {
        let (answer, waited): (String, Result<()>) =
            run_waited(&self.conn, call, self.options.wait).await?;
        fenced_answer(key, lease, &answer)?;
        waited
    }

    async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T> {
        let mut conn = self.conn.clone();
        cmd.query_async(&mut conn)
            .await
            .map_err(|e| self.conn.classify(e))
    }

    /// `HMGET` of many fields, chunked, in one round trip.
    async fn hmget(&self, hash: &str, fields: &[&String]) -> Result<Vec<Option<String>>> {
        if fields.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for chunk in fields.chunks(HMGET_CHUNK) {
            pipe.cmd("HMGET").arg(hash).arg(chunk);
        }
        let mut conn = self.conn.clone();
        let chunks: Vec<Vec<Option<String>>> = pipe
            .query_async(&mut conn)
            .await
            .map_err(|e| self.conn.classify(e))?;
        Ok(chunks.into_iter().flatten().collect())
    }
}

fn fenced_answer(key: &PKey, lease: &Lease, answer: &str) -> Result<()> {
    match answer {
        "OK" => Ok(()),
        "LEASE_LOST" => Err(Error::lease_lost(key, lease.epoch)),
        other => Err(Error::store(
            StoreErrorKind::Corrupt,
            false,
            format!("unexpected answer from a fenced script: {other:?}"),
        )),
    }
}

/// The distinct ids, in first-appearance order.
fn unique(ids: &[String]) -> Vec<&String> {
    let mut seen = HashSet::new();
    ids.iter().filter(|id| seen.insert(id.as_str())).collect()
}

#[async_trait]
impl Store for RedisStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities::default().with_log(true)
    }

    async fn migrate(&self) -> Result<()> {
        // No schema: loading every script checks that the server runs Lua and warms its cache.
        for script in SCRIPTS.all() {
            scripts::load(&self.conn, script).await?;
        }
        Ok(())
    }

    async fn close(&self) -> Result<()> {
        Ok(())
    }

    async fn acquire_lease(
        &self,
        key: &PKey,
        owner: &str,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<Option<Lease>> {
        let keys = self.of(key);
        let expires_at = now_ms.saturating_add(ttl_ms);
        let epoch: Option<String> = self
            .take_lease(
                key,
                &SCRIPTS.acquire_lease,
                &[&keys.meta],
                owner,
                now_ms,
                expires_at,
            )
            .await?;
        epoch
            .map(|epoch| {
                Ok(Lease {
                    owner: owner.to_owned(),
                    epoch: int("a lease epoch", &epoch)?,
                    expires_at,
                })
            })
            .transpose()
    }

    async fn claim(
        &self,
        key: &PKey,
        owner: &str,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<Option<Claim>> {
        let k = self.of(key);
        let expires_at = now_ms.saturating_add(ttl_ms);
        let claimed: Option<Vec<String>> = self
            .take_lease(
                key,
                &SCRIPTS.claim,
                &[&k.meta, &k.state, &k.outbox, &k.rows],
                owner,
                now_ms,
                expires_at,
            )
            .await?;
        let Some(claimed) = claimed else {
            return Ok(None);
        };
        let mut values = claimed.into_iter();
        let (Some(epoch), Some(pending)) = (values.next(), values.next()) else {
            return Err(Error::store(
                StoreErrorKind::Corrupt,
                false,
                format!("script claim on {key} answered without an epoch"),
            ));
        };
        let mut fields = Vec::new();
        while let (Some(name), Some(value)) = (values.next(), values.next()) {
            fields.push((name, value));
        }
        let lease = Lease {
            owner: owner.to_owned(),
            epoch: int("a lease epoch", &epoch)?,
            expires_at,
        };
        let state = codec::state_from_fields(fields)?;
        Ok(Some(Claim::new(lease, state, pending == "1")))
    }

    async fn renew_lease(
        &self,
        key: &PKey,
        lease: &Lease,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<bool> {
        let keys = self.of(key);
        let call = SCRIPTS
            .renew_lease
            .call(&[&keys.meta])
            .arg(&lease.owner)
            .arg(lease.epoch.to_string())
            .arg(now_ms.saturating_add(ttl_ms).to_string());
        let renewed: i64 = run(&self.conn, call).await?;
        Ok(renewed == 1)
    }

    async fn release_lease(&self, key: &PKey, lease: &Lease) -> Result<()> {
        let keys = self.of(key);
        let call = SCRIPTS
            .release_lease
            .call(&[&keys.meta])
            .arg(&lease.owner)
            .arg(lease.epoch.to_string());
        let _: String = run(&self.conn, call).await?;
        Ok(())
    }

    async fn get_lease(&self, key: &PKey) -> Result<Option<Lease>> {
        let keys = self.of(key);
        let (owner, epoch, expires_at): (Option<String>, Option<String>, Option<String>) = self
            .query(
                redis::cmd("HMGET")
                    .arg(&keys.meta)
                    .arg("owner")
                    .arg("epoch")
                    .arg("expires_at"),
            )
            .await?;
        let Some(owner) = owner else {
            return Ok(None);
        };
        let missing = || {
            Error::store(
                StoreErrorKind::Corrupt,
                false,
                format!("the lease of {key} has an owner but no epoch or expiry"),
            )
        };
        Ok(Some(Lease {
            owner,
            epoch: int("a lease epoch", &epoch.ok_or_else(missing)?)?,
            expires_at: int("a lease expiry", &expires_at.ok_or_else(missing)?)?,
        }))
    }

    async fn load_state(&self, key: &PKey) -> Result<Option<PollerState>> {
        let keys = self.of(key);
        let fields: Vec<(String, String)> =
            self.query(redis::cmd("HGETALL").arg(&keys.state)).await?;
        codec::state_from_fields(fields)
    }

    async fn save_state(&self, key: &PKey, lease: &Lease, patch: &StatePatch) -> Result<()> {
        let keys = self.of(key);
        let call = SCRIPTS
            .save_state
            .call(&[&keys.meta, &keys.state])
            .arg(&lease.owner)
            .arg(lease.epoch.to_string())
            .arg(state_args(patch)?);
        self.fenced(key, lease, call).await
    }

    async fn save_state_unfenced(&self, key: &PKey, patch: &StatePatch) -> Result<()> {
        let keys = self.of(key);
        let save = SCRIPTS
            .save_state_unfenced
            .call(&[&keys.state])
            .arg(state_args(patch)?);
        run_many(&self.conn, vec![self.register(key), save]).await?;
        Ok(())
    }

    async fn list_keys(&self, poller: Option<&str>) -> Result<Vec<PKey>> {
        let pollers: Vec<String> = match poller {
            Some(poller) => vec![poller.to_owned()],
            None => {
                self.query(redis::cmd("SMEMBERS").arg(self.keys.pollers()))
                    .await?
            }
        };
        if pollers.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for poller in &pollers {
            pipe.cmd("SMEMBERS").arg(self.keys.partitions(poller));
        }
        let mut conn = self.conn.clone();
        let partitions: Vec<Vec<String>> = pipe
            .query_async(&mut conn)
            .await
            .map_err(|e| self.conn.classify(e))?;
        let mut keys: Vec<PKey> = pollers
            .iter()
            .zip(partitions)
            .flat_map(|(poller, partitions)| {
                partitions
                    .into_iter()
                    .map(move |partition| PKey::new(poller.clone(), partition))
            })
            .collect();
        keys.sort();
        Ok(keys)
    }

    async fn delete_key(&self, key: &PKey) -> Result<()> {
        let keys = self.of(key);
        let unregister = SCRIPTS
            .unregister_key
            .call(&[self.keys.pollers(), self.keys.partitions(&key.poller)])
            .arg(&key.poller)
            .arg(&key.partition);
        let mut names = vec![keys.meta.as_str()];
        names.extend(keys.data());
        let delete = SCRIPTS.delete_key.call(&names);
        // Unlisted first: a delete racing an acquisition can leave a listed empty key, never an
        // unlisted one with data.
        run_many(&self.conn, vec![unregister, delete]).await?;
        Ok(())
    }

    async fn clear_items(&self, key: &PKey) -> Result<()> {
        let keys = self.of(key);
        let _: i64 = self
            .query(redis::cmd("DEL").arg(&keys.items).arg(&keys.ids))
            .await?;
        Ok(())
    }

    async fn load_versions(
        &self,
        key: &PKey,
        identities: &[String],
    ) -> Result<HashMap<String, ItemRow>> {
        let keys = self.of(key);
        let wanted = unique(identities);
        let rows = self.hmget(&keys.items, &wanted).await?;
        let mut out = HashMap::with_capacity(rows.len());
        for (identity, row) in wanted.into_iter().zip(rows) {
            if let Some(row) = row {
                out.insert(identity.clone(), decode("a snapshot row", &row)?);
            }
        }
        Ok(out)
    }

    fn stream_identities<'a>(
        &'a self,
        key: &'a PKey,
        batch_size: usize,
    ) -> BoxStream<'a, Result<Vec<String>>> {
        // Keyset paging over a sorted set of the identities, all with score 0, so
        // `ZRANGEBYLEX` orders them by memcmp: byte order, as the contract wants. Every batch
        // is exact, and identities that stay in the snapshot are seen exactly once.
        let batch_size = batch_size.max(1);
        let ids = self.of(key).ids;
        stream::unfold(Some("-".to_owned()), move |min| {
            let ids = ids.clone();
            async move {
                let min = min?;
                let batch: Result<Vec<String>> = self
                    .query(
                        redis::cmd("ZRANGEBYLEX")
                            .arg(&ids)
                            .arg(&min)
                            .arg("+")
                            .arg("LIMIT")
                            .arg(0)
                            .arg(batch_size),
                    )
                    .await;
                match batch {
                    Err(e) => Some((Err(e), None)),
                    Ok(batch) if batch.is_empty() => None,
                    Ok(batch) => {
                        let next = (batch.len() == batch_size)
                            .then(|| batch.last().map(|last| format!("({last}")))
                            .flatten();
                        Some((Ok(batch), next))
                    }
                }
            }
        })
        .boxed()
    }

    async fn counts(&self, key: &PKey) -> Result<KeyCounts> {
        Ok(KeyCounts {
            items: self.count_items(key).await?,
            pending: self.count_pending(key).await?,
            parked: self.count_parked(key).await?,
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
        let k = self.of(key);
        let mut call = SCRIPTS.commit_poll.call(&[
            &k.meta,
            &k.state,
            &k.items,
            &k.ids,
            &k.outbox,
            &k.rows,
            &k.attempts,
            &k.errors,
            &k.parked,
            &k.hold,
            &k.log,
            &k.log_rows,
            &k.log_at,
            &k.validators,
        ]);
        call.push(&lease.owner)
            .push(lease.epoch.to_string())
            .push(if batch.log { "1" } else { "0" });
        call.push(batch.upserts.len());
        for row in &batch.upserts {
            call.push(&row.identity)
                .push(encode("a snapshot row", row)?);
        }
        call.push(batch.deletes.len());
        for identity in &batch.deletes {
            call.push(identity);
        }
        call.push(batch.events.len());
        for row in &batch.events {
            let logged = if batch.log {
                encode(
                    "a log entry",
                    &LoggedEvent {
                        sequence: row.sequence,
                        event: row.event.clone(),
                        created_at: row.created_at,
                    },
                )?
            } else {
                String::new()
            };
            let pending = row.status == OutboxStatus::Pending;
            call.push(row.event_id.as_str())
                .push(row.sequence.to_string())
                .push(if pending { "1" } else { "0" })
                .push(if pending {
                    encode("an outbox row", row)?
                } else {
                    String::new()
                })
                .push(row.created_at.to_string())
                .push(logged);
        }
        call.push(batch.parked.len());
        for row in &batch.parked {
            call.push(&row.id)
                .push(encode("a parked row", row)?)
                .push(if row.hold_key.is_some() { "1" } else { "0" })
                .push(row.hold_key.as_deref().unwrap_or(""));
        }
        call.push(batch.validators.len());
        for row in &batch.validators {
            call.push(&row.url_hash)
                .push(encode("a validator", &row.validator)?);
        }
        call.push(state_args(&batch.state_patch)?);
        self.fenced(key, lease, call).await
    }

    async fn load_pending(&self, key: &PKey, limit: usize) -> Result<Vec<OutboxRow>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let k = self.of(key);
        let call = SCRIPTS
            .load_pending
            .call(&[&k.outbox, &k.rows, &k.attempts, &k.errors])
            .arg(last_rank(limit));
        let flat: Vec<Option<String>> = run(&self.conn, call).await?;
        outbox_rows(&flat)
    }

    async fn load_pending_with_holds(
        &self,
        key: &PKey,
        limit: usize,
    ) -> Result<(Vec<OutboxRow>, Vec<String>)> {
        let k = self.of(key);
        let call = SCRIPTS
            .load_pending
            .call(&[&k.outbox, &k.rows, &k.attempts, &k.errors, &k.hold])
            .arg(last_rank(limit));
        let flat: Vec<Option<String>> = run(&self.conn, call).await?;
        let malformed = || {
            Error::store(
                StoreErrorKind::Corrupt,
                false,
                "unexpected reply from script load_pending (hold keys)",
            )
        };
        let count: usize = flat
            .first()
            .and_then(|count| count.as_deref()?.parse().ok())
            .ok_or_else(malformed)?;
        let held = flat.get(1..=count).ok_or_else(malformed)?;
        let held: BTreeSet<String> = held.iter().flatten().cloned().collect();
        let rows = outbox_rows(&flat[count + 1..])?;
        Ok((rows, held.into_iter().collect()))
    }

    async fn ack_events(&self, key: &PKey, lease: &Lease, ids: &[String]) -> Result<()> {
        let k = self.of(key);
        let call = SCRIPTS
            .ack_events
            .call(&[&k.meta, &k.outbox, &k.rows, &k.attempts, &k.errors])
            .arg(&lease.owner)
            .arg(lease.epoch.to_string())
            .arg(ids);
        self.fenced(key, lease, call).await
    }

    async fn record_attempt(
        &self,
        key: &PKey,
        lease: &Lease,
        id: &str,
        error: &SerializedError,
        next_attempt_at: Option<i64>,
    ) -> Result<()> {
        let k = self.of(key);
        let attempt = encode(
            "a delivery error",
            &Attempt {
                last_error: error.clone(),
                next_attempt_at,
            },
        )?;
        let call = SCRIPTS
            .record_attempt
            .call(&[&k.meta, &k.rows, &k.attempts, &k.errors])
            .arg(&lease.owner)
            .arg(lease.epoch.to_string())
            .arg(id)
            .arg(attempt);
        self.fenced(key, lease, call).await
    }

    async fn park_event(&self, key: &PKey, lease: &Lease, row: &ParkedRow) -> Result<()> {
        let k = self.of(key);
        let call = SCRIPTS
            .park_event
            .call(&[
                &k.meta,
                &k.outbox,
                &k.rows,
                &k.attempts,
                &k.errors,
                &k.parked,
                &k.hold,
            ])
            .arg(&lease.owner)
            .arg(lease.epoch.to_string())
            .arg(&row.id)
            .arg(encode("a parked row", row)?)
            .arg(if row.hold_key.is_some() { "1" } else { "0" })
            .arg(row.hold_key.as_deref().unwrap_or(""))
            .arg(if row.event.is_some() { "1" } else { "0" })
            .arg(row.event.as_ref().map_or("", |event| event.id.as_str()));
        self.fenced(key, lease, call).await
    }

    async fn list_parked(&self, key: &PKey, query: ParkedQuery) -> Result<Vec<ParkedRow>> {
        let keys = self.of(key);
        let texts: Vec<String> = self.query(redis::cmd("HVALS").arg(&keys.parked)).await?;
        let mut rows = Vec::with_capacity(texts.len());
        for text in &texts {
            let row: ParkedRow = decode("a parked row", text)?;
            if query.kind.is_none_or(|kind| row.kind == kind) {
                rows.push(row);
            }
        }
        rows.sort_by(|a, b| (a.parked_at, &a.id).cmp(&(b.parked_at, &b.id)));
        rows.truncate(query.limit.unwrap_or(usize::MAX));
        Ok(rows)
    }

    async fn held_keys(&self, key: &PKey) -> Result<Vec<String>> {
        let keys = self.of(key);
        let held: Vec<String> = self.query(redis::cmd("HVALS").arg(&keys.hold)).await?;
        Ok(held
            .into_iter()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect())
    }

    async fn get_validator(&self, key: &PKey, url_hash: &str) -> Result<Option<Validator>> {
        let keys = self.of(key);
        let text: Option<String> = self
            .query(redis::cmd("HGET").arg(&keys.validators).arg(url_hash))
            .await?;
        text.map(|text| decode("a validator", &text)).transpose()
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
        let k = self.of(key);
        let call = SCRIPTS
            .read_log
            .call(&[&k.log, &k.log_rows, &k.log_at])
            .arg(
                query
                    .after_sequence
                    .map_or_else(|| "-inf".to_owned(), |s| format!("({s}")),
            )
            .arg(query.from_time.map(|t| t.to_string()).unwrap_or_default())
            .arg(query.to_time.map(|t| t.to_string()).unwrap_or_default())
            .arg(limit.to_string());
        let texts: Vec<String> = run(&self.conn, call).await?;
        texts
            .iter()
            .map(|text| decode("a log entry", text))
            .collect()
    }

    async fn prune_log(&self, key: &PKey, older_than: i64) -> Result<u64> {
        let k = self.of(key);
        let call = SCRIPTS
            .prune_log
            .call(&[&k.log, &k.log_rows, &k.log_at])
            .arg(format!("({older_than}"));
        let n: i64 = run(&self.conn, call).await?;
        Ok(count(n))
    }
}

/// The parts of [`Store::counts`] and [`Store::resolve_parked`].
impl RedisStore {
    /// The snapshot's size.
    async fn count_items(&self, key: &PKey) -> Result<u64> {
        let keys = self.of(key);
        let n: i64 = self.query(redis::cmd("HLEN").arg(&keys.items)).await?;
        Ok(count(n))
    }

    /// The number of pending outbox rows.
    async fn count_pending(&self, key: &PKey) -> Result<u64> {
        let keys = self.of(key);
        let n: i64 = self.query(redis::cmd("ZCARD").arg(&keys.outbox)).await?;
        Ok(count(n))
    }

    /// The number of parked rows of every kind.
    async fn count_parked(&self, key: &PKey) -> Result<u64> {
        let keys = self.of(key);
        let n: i64 = self.query(redis::cmd("HLEN").arg(&keys.parked)).await?;
        Ok(count(n))
    }

    /// Moves poison rows back to the outbox as pending (see `Store::resolve_parked`).
    async fn retry_parked(&self, key: &PKey, ids: &[String]) -> Result<u64> {
        let k = self.of(key);
        let mut pending: Vec<&String> = unique(ids);
        let mut moved = 0;
        // A row that changed between the read and the script (re-parked meanwhile) is read again;
        // three rounds are plenty for an admin operation racing the engine.
        for _ in 0..3 {
            if pending.is_empty() {
                break;
            }
            let texts = self.hmget(&k.parked, &pending).await?;
            let mut call = SCRIPTS.retry_parked.call(&[
                &k.parked,
                &k.hold,
                &k.outbox,
                &k.rows,
                &k.attempts,
                &k.errors,
            ]);
            let mut any = false;
            for (id, text) in pending.iter().zip(texts) {
                let Some(text) = text else { continue };
                let row: ParkedRow = decode("a parked row", &text)?;
                let ParkedRow {
                    kind: ParkedKind::Poison,
                    event: Some(event),
                    parked_at,
                    ..
                } = row
                else {
                    continue;
                };
                let mut outbox = OutboxRow::pending(event, parked_at);
                outbox.event_id = id.as_str().into();
                call.push(*id)
                    .push(&text)
                    .push(outbox.sequence.to_string())
                    .push(encode("an outbox row", &outbox)?);
                any = true;
            }
            if !any {
                break;
            }
            let answer: Vec<Value> = run(&self.conn, call).await?;
            let mut answer = answer.into_iter();
            let n: i64 = answer
                .next()
                .map(|v| reply(&SCRIPTS.retry_parked, v))
                .transpose()?
                .unwrap_or(0);
            moved += count(n);
            let changed: Vec<String> = answer
                .map(|v| reply(&SCRIPTS.retry_parked, v))
                .collect::<Result<_>>()?;
            pending.retain(|id| changed.contains(id));
        }
        Ok(moved)
    }

    /// Deletes parked rows (see `Store::resolve_parked`).
    async fn discard_parked(&self, key: &PKey, ids: &[String]) -> Result<u64> {
        let wanted = unique(ids);
        if wanted.is_empty() {
            return Ok(0);
        }
        let k = self.of(key);
        let call = SCRIPTS
            .discard_parked
            .call(&[&k.parked, &k.hold])
            .arg(wanted);
        let n: i64 = run(&self.conn, call).await?;
        Ok(count(n))
    }
}

/// The last rank `load_pending.lua` reads for `limit` rows, as decimal text (`-1` for none).
fn last_rank(limit: usize) -> String {
    match limit {
        0 => "-1".to_owned(),
        n => i64::try_from(n - 1).unwrap_or(i64::MAX).to_string(),
    }
}

/// The outbox rows of `load_pending.lua`'s reply: id, row, attempts, error for each.
fn outbox_rows(flat: &[Option<String>]) -> Result<Vec<OutboxRow>> {
    let mut rows = Vec::with_capacity(flat.len() / 4);
    for quad in flat.chunks(4) {
        let [_, Some(row), attempts, attempt] = quad else {
            return Err(Error::store(
                StoreErrorKind::Corrupt,
                false,
                "unexpected reply from script load_pending",
            ));
        };
        rows.push(outbox_row(row, attempts.as_deref(), attempt.as_deref())?);
    }
    Ok(rows)
}
