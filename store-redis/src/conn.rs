//! The connection the store talks through: one self-reconnecting multiplexed connection to a
//! standalone Redis, or a cluster connection (a multiplexed connection per node, following
//! `MOVED`/`ASK` and refreshing its slot map after a failover).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, Pipeline, RedisFuture, Value};
use watukuy_core::{Error, Result, store::StoreErrorKind};

use crate::error::classify_in;

/// A standalone connection or a cluster connection; both are cheap to clone.
#[derive(Clone)]
pub(crate) enum Conn {
    /// A standalone Redis (or a proxy in front of a cluster).
    Single(ConnectionManager),
    /// Redis Cluster.
    Cluster(Arc<Cluster>),
}

/// A cluster connection, replaced by a fresh one (a new slot map from the seed nodes) when the
/// cluster answers in a way the driver does not follow by itself: a primary that died and was
/// replaced (refused connections, `READONLY` from a node that became a replica), `MOVED` it
/// gave up on, `CLUSTERDOWN`.
pub(crate) struct Cluster {
    /// Builds the fresh connections; `None` for a connection handed to the store (the driver's
    /// own recovery only).
    client: Option<ClusterClient>,
    current: RwLock<ClusterConnection>,
    refreshing: AtomicBool,
}

impl Cluster {
    pub(crate) fn new(client: Option<ClusterClient>, conn: ClusterConnection) -> Self {
        Self {
            client,
            current: RwLock::new(conn),
            refreshing: AtomicBool::new(false),
        }
    }

    fn get(&self) -> ClusterConnection {
        match self.current.read() {
            Ok(conn) => conn.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Starts building a fresh connection in the background (one at a time); calls keep using
    /// the current one until it is ready.
    fn refresh(self: &Arc<Self>) {
        if self.client.is_none() || self.refreshing.swap(true, Ordering::SeqCst) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.refreshing.store(false, Ordering::SeqCst);
            return;
        };
        let this = Arc::clone(self);
        runtime.spawn(async move {
            if let Some(client) = &this.client
                && let Ok(conn) = client.get_async_connection().await
            {
                match this.current.write() {
                    Ok(mut current) => *current = conn,
                    Err(poisoned) => *poisoned.into_inner() = conn,
                }
            }
            this.refreshing.store(false, Ordering::SeqCst);
        });
    }
}

/// Whether `error`, from a cluster, says the driver's slot map is stale.
fn stale_topology(error: &redis::RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind};
    matches!(
        error.kind(),
        ErrorKind::Server(
            ServerErrorKind::ReadOnly
                | ServerErrorKind::Moved
                | ServerErrorKind::Ask
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::TryAgain
        ) | ErrorKind::ClusterConnectionNotFound
    ) || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_timeout()
}

impl Conn {
    /// Whether commands of different slots must go in separate round trips.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Conn::Cluster(_))
    }

    /// Maps a driver error ([`classify_in`]) knowing whether this connection follows the cluster.
    /// On a cluster, an error that says the slot map is stale also starts building a fresh
    /// connection, which the next calls use.
    pub(crate) fn classify(&self, error: redis::RedisError) -> Error {
        if let Conn::Cluster(cluster) = self
            && stale_topology(&error)
        {
            cluster.refresh();
        }
        classify_in(error, self.is_cluster())
    }

    /// `SCAN` of `pattern` over every primary (the one server, or each primary of a cluster),
    /// calling `batch` with each batch of key names found.
    pub(crate) async fn scan_each<F, Fut>(&self, pattern: &str, mut batch: F) -> Result<()>
    where
        F: FnMut(Vec<String>) -> Fut,
        Fut: std::future::Future<Output = Result<()>>,
    {
        match self {
            Conn::Single(conn) => {
                let mut conn = conn.clone();
                let mut cursor: u64 = 0;
                loop {
                    let (next, keys): (u64, Vec<String>) = scan_cmd(cursor, pattern)
                        .query_async(&mut conn)
                        .await
                        .map_err(|e| self.classify(e))?;
                    batch(keys).await?;
                    if next == 0 {
                        return Ok(());
                    }
                    cursor = next;
                }
            }
            Conn::Cluster(cluster) => {
                let mut conn = cluster.get();
                for (host, port) in primaries(&mut conn).await? {
                    let mut cursor: u64 = 0;
                    loop {
                        let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                            host: host.clone(),
                            port,
                        });
                        let value = conn
                            .route_command(scan_cmd(cursor, pattern), routing)
                            .await
                            .map_err(|e| self.classify(e))?;
                        let (next, keys): (u64, Vec<String>) = redis::from_redis_value(value)
                            .map_err(|e| self.classify(redis::RedisError::from(e)))?;
                        batch(keys).await?;
                        if next == 0 {
                            break;
                        }
                        cursor = next;
                    }
                }
                Ok(())
            }
        }
    }
}

fn scan_cmd(cursor: u64, pattern: &str) -> Cmd {
    let mut cmd = redis::cmd("SCAN");
    cmd.arg(cursor)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(1000);
    cmd
}

/// `host:port` of every primary that serves slots, from `CLUSTER SLOTS`.
async fn primaries(conn: &mut ClusterConnection) -> Result<Vec<(String, u16)>> {
    let value: Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(conn)
        .await
        .map_err(|e| classify_in(e, true))?;
    let bad = || {
        Error::store(
            StoreErrorKind::Corrupt,
            false,
            "cannot read the reply of CLUSTER SLOTS",
        )
    };
    let Value::Array(ranges) = value else {
        return Err(bad());
    };
    let mut out: Vec<(String, u16)> = Vec::new();
    for range in ranges {
        // [start, end, [host, port, id, ..], replicas..]
        let Value::Array(parts) = range else {
            return Err(bad());
        };
        let Some(Value::Array(primary)) = parts.get(2) else {
            return Err(bad());
        };
        let (Some(host), Some(port)) = (primary.first(), primary.get(1)) else {
            return Err(bad());
        };
        let host: String = redis::from_redis_value(host.clone()).map_err(|_| bad())?;
        let port: u16 = redis::from_redis_value(port.clone()).map_err(|_| bad())?;
        if !out.iter().any(|(h, p)| *h == host && *p == port) {
            out.push((host, port));
        }
    }
    Ok(out)
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(conn) => conn.req_packed_command(cmd),
            Conn::Cluster(cluster) => {
                let mut conn = cluster.get();
                Box::pin(async move { conn.req_packed_command(cmd).await })
            }
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(conn) => conn.req_packed_commands(cmd, offset, count),
            Conn::Cluster(cluster) => {
                let mut conn = cluster.get();
                Box::pin(async move { conn.req_packed_commands(cmd, offset, count).await })
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(conn) => conn.get_db(),
            Conn::Cluster(cluster) => cluster.get().get_db(),
        }
    }
}
