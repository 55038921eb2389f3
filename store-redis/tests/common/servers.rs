//! Private `redis-server` processes the tests start on spare loopback ports: a plain or TLS
//! server, and a Redis Cluster of primaries and replicas built by hand (`CLUSTER MEET`,
//! `ADDSLOTSRANGE`, `REPLICATE`), without redis-cli and without Docker.
//!
//! Every server runs under a small `sh` that kills it (SIGKILL) when the test process's end of
//! its stdin closes, so a server never outlives its test binary, even one that was killed, and
//! a cluster kept in a `static` for a whole binary goes away with it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// How long a node may take to start, and a cluster to form or fail over.
const PATIENCE: Duration = Duration::from_secs(60);

/// Waits a little between two polls of a server that is starting or failing over: the only
/// real-time wait of these tests, and never part of what they measure.
#[allow(clippy::disallowed_methods)]
pub fn pause() {
    std::thread::sleep(Duration::from_millis(50));
}

/// Polls `check` until it answers `Some`, for at most [`PATIENCE`] (counted in polls).
pub fn poll<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> Result<T, String> {
    let polls = PATIENCE.as_millis() / 50;
    for _ in 0..polls {
        if let Some(value) = check() {
            return Ok(value);
        }
        pause();
    }
    Err(format!("{what}: not within {} s", PATIENCE.as_secs()))
}

/// A port nothing listens on right now.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local address").port()
}

/// One `redis-server` process.
pub struct RedisProcess {
    /// The `sh` around it; its stdin is the server's lifeline.
    wrapper: Child,
    /// The server's own process id.
    pid: u32,
    /// The port it listens on (plain or TLS).
    pub port: u16,
}

impl RedisProcess {
    /// Starts `redis-server <args>` (`--port`/`--tls-port` among them) and waits until it logs
    /// that it accepts connections. Fails when `redis-server` was not found (the test is
    /// ignored then, unless run anyway or required).
    pub fn start(port: u16, args: &[String]) -> Result<Self, String> {
        let program = watukuy_testenv::program!("redis-server")?;
        let mut wrapper = Command::new("sh")
            .arg("-c")
            .arg(r#""$@" & server=$!; echo "pid $server"; read _; kill -9 $server 2>/dev/null; wait"#)
            .arg("sh")
            .arg(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {program}: {e}"))?;
        let stdout = wrapper.stdout.take().ok_or("no stdout")?;
        let (tx, rx) = mpsc::channel();
        // Reads the log to the end, so the server never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut ready = false;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(pid) = line.strip_prefix("pid ") {
                    let _ = tx.send(Ok(pid.trim().parse::<u32>().unwrap_or(0)));
                } else if !ready && line.contains("Ready to accept connections") {
                    ready = true;
                    let _ = tx.send(Err(()));
                }
            }
        });
        let pid = match rx.recv_timeout(PATIENCE) {
            Ok(Ok(pid)) if pid > 0 => pid,
            _ => return Err(format!("redis-server on port {port} did not start")),
        };
        match rx.recv_timeout(PATIENCE) {
            Ok(Err(())) => Ok(Self { wrapper, pid, port }),
            _ => {
                let _ = wrapper.kill();
                Err(format!(
                    "redis-server on port {port} did not become ready (args {args:?})"
                ))
            }
        }
    }

    /// Kills the server (SIGKILL: a crash, nothing flushed, nothing handed to replicas).
    pub fn kill(&mut self) {
        if self.wrapper.stdin.is_none() {
            return;
        }
        let _ = Command::new("kill")
            .arg("-9")
            .arg(self.pid.to_string())
            .stderr(Stdio::null())
            .status();
        // Closing stdin lets the wrapper end.
        drop(self.wrapper.stdin.take());
        let _ = self.wrapper.wait();
    }
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The arguments of a server that listens on loopback only, keeps nothing on disk and stays in
/// the foreground.
pub const EPHEMERAL: [&str; 8] = [
    "--bind",
    "127.0.0.1",
    "--save",
    "",
    "--appendonly",
    "no",
    "--daemonize",
    "no",
];

/// The arguments every private server gets: [`EPHEMERAL`], data in `dir`.
pub fn base_args(dir: &Path, port: u16) -> Vec<String> {
    let data = [
        "--dir",
        &dir.to_string_lossy(),
        "--dbfilename",
        &format!("dump-{port}.rdb"),
    ];
    EPHEMERAL
        .iter()
        .chain(&data)
        .map(|s| (*s).to_owned())
        .collect()
}

/// A plain connection to a node, for setting it up.
pub fn node(port: u16) -> Result<redis::Connection, String> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .map_err(|e| format!("node {port}: {e}"))?;
    client
        .get_connection_with_timeout(Duration::from_secs(5))
        .map_err(|e| format!("node {port}: {e}"))
}

/// Runs `args` on the node at `port`.
pub fn command<T: redis::FromRedisValue>(port: u16, args: &[&str]) -> Result<T, String> {
    let mut conn = node(port)?;
    redis::cmd(args[0])
        .arg(&args[1..])
        .query(&mut conn)
        .map_err(|e| format!("node {port}: {args:?}: {e}"))
}

/// One node of a [`Cluster`].
pub struct Node {
    /// Its client port.
    pub port: u16,
    /// Its cluster bus port.
    pub bus: u16,
    /// Its cluster node id.
    pub id: String,
    /// The process; `None` once killed.
    pub process: Option<RedisProcess>,
    /// The arguments it was started with (to start it again, with its cluster config).
    args: Vec<String>,
}

/// A Redis Cluster on loopback: `primaries` primaries, each with `replicas` replicas, slots
/// spread evenly, in a temporary folder removed with it.
pub struct Cluster {
    /// Primaries first (in slot order), then the replicas of each in turn.
    pub nodes: Vec<Node>,
    dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts the nodes, joins them, assigns the slots and attaches the replicas; returns once
    /// every node reports `cluster_state:ok` and every replica is in sync.
    pub fn start(primaries: usize, replicas: usize, node_timeout_ms: u64) -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("a temporary folder: {e}"))?;
        let total = primaries * (1 + replicas);
        let mut nodes = Vec::with_capacity(total);
        for _ in 0..total {
            let port = free_port();
            let bus = free_port();
            let mut args = base_args(dir.path(), port);
            args.extend([
                "--port".to_owned(),
                port.to_string(),
                "--cluster-enabled".to_owned(),
                "yes".to_owned(),
                "--cluster-port".to_owned(),
                bus.to_string(),
                "--cluster-config-file".to_owned(),
                config_file(dir.path(), port),
                "--cluster-node-timeout".to_owned(),
                node_timeout_ms.to_string(),
                // A replica may always take over, however long it was cut off.
                "--cluster-replica-validity-factor".to_owned(),
                "0".to_owned(),
                "--repl-diskless-sync".to_owned(),
                "yes".to_owned(),
                "--repl-diskless-sync-delay".to_owned(),
                "0".to_owned(),
            ]);
            let process = RedisProcess::start(port, &args)?;
            let id: String = command(port, &["CLUSTER", "MYID"])?;
            nodes.push(Node {
                port,
                bus,
                id,
                process: Some(process),
                args,
            });
        }
        for (i, node) in nodes.iter().enumerate() {
            let epoch = (i + 1).to_string();
            let _: () = command(node.port, &["CLUSTER", "SET-CONFIG-EPOCH", &epoch])?;
        }
        let per = 16384 / primaries;
        for (i, node) in nodes.iter().take(primaries).enumerate() {
            let start = i * per;
            let end = if i + 1 == primaries {
                16383
            } else {
                (i + 1) * per - 1
            };
            let _: () = command(
                node.port,
                &[
                    "CLUSTER",
                    "ADDSLOTSRANGE",
                    &start.to_string(),
                    &end.to_string(),
                ],
            )?;
        }
        let first = nodes[0].port;
        for node in &nodes[1..] {
            let _: () = command(
                first,
                &[
                    "CLUSTER",
                    "MEET",
                    "127.0.0.1",
                    &node.port.to_string(),
                    &node.bus.to_string(),
                ],
            )?;
        }
        // Everyone knows everyone before replicas are attached.
        for node in &nodes {
            poll(&format!("node {} meets the cluster", node.port), || {
                let text: String = command(node.port, &["CLUSTER", "NODES"]).ok()?;
                let known = text
                    .lines()
                    .filter(|l| !l.contains("handshake") && !l.contains("noaddr"))
                    .count();
                (known == total).then_some(())
            })?;
        }
        for r in 0..replicas {
            for p in 0..primaries {
                let replica = primaries + r * primaries + p;
                let id = nodes[p].id.clone();
                let _: () = command(nodes[replica].port, &["CLUSTER", "REPLICATE", &id])?;
            }
        }
        let cluster = Self { nodes, dir };
        cluster.wait_healthy(primaries, replicas)?;
        Ok(cluster)
    }

    /// Waits until every live node reports `cluster_state:ok`, every primary has `replicas`
    /// replicas online and every node sees the same primaries.
    pub fn wait_healthy(&self, primaries: usize, replicas: usize) -> Result<(), String> {
        for node in self.nodes.iter().filter(|n| n.process.is_some()) {
            poll(
                &format!("node {} reports the cluster ok", node.port),
                || {
                    let info: String = command(node.port, &["CLUSTER", "INFO"]).ok()?;
                    info.contains("cluster_state:ok").then_some(())
                },
            )?;
            poll(&format!("node {} is in sync", node.port), || {
                let info: String = command(node.port, &["INFO", "replication"]).ok()?;
                if info.contains("role:master") {
                    let online = info.matches("state=online").count();
                    let serving = self
                        .primary_ports()
                        .ok()
                        .is_some_and(|ports| ports.contains(&node.port));
                    (!serving || online >= replicas).then_some(())
                } else {
                    info.contains("master_link_status:up").then_some(())
                }
            })?;
        }
        poll("every node sees the same primaries", || {
            let views: Vec<Vec<u16>> = self
                .nodes
                .iter()
                .filter(|n| n.process.is_some())
                .map(|n| primaries_seen_by(n.port))
                .collect::<Option<_>>()?;
            (views.windows(2).all(|w| w[0] == w[1])
                && views.first().is_some_and(|v| v.len() == primaries))
            .then_some(())
        })
    }

    /// The client ports of the primaries that serve slots now, sorted.
    pub fn primary_ports(&self) -> Result<Vec<u16>, String> {
        let alive = self
            .nodes
            .iter()
            .find(|n| n.process.is_some())
            .ok_or("no node is alive")?;
        primaries_seen_by(alive.port).ok_or_else(|| "cannot read CLUSTER SLOTS".to_owned())
    }

    /// The client port of the primary serving `key`'s slot now.
    pub fn primary_of(&self, key: &str) -> Result<u16, String> {
        let alive = self
            .nodes
            .iter()
            .find(|n| n.process.is_some())
            .ok_or("no node is alive")?;
        // The server's own hashing, not a copy of it here.
        let slot: u16 = command(alive.port, &["CLUSTER", "KEYSLOT", key])?;
        let slots: redis::Value = command(alive.port, &["CLUSTER", "SLOTS"])?;
        for (start, end, port) in slot_ranges(slots) {
            if (start..=end).contains(&slot) {
                return Ok(port);
            }
        }
        Err(format!("no primary serves slot {slot} (of {key:?})"))
    }

    /// `redis+cluster://127.0.0.1:<port>,…` listing every node as a seed.
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}", seeds.join(","))
    }

    /// The node at `port`.
    fn node_mut(&mut self, port: u16) -> Result<&mut Node, String> {
        self.nodes
            .iter_mut()
            .find(|n| n.port == port)
            .ok_or_else(|| format!("no node on port {port}"))
    }

    /// Kills the node at `port` (SIGKILL).
    pub fn kill(&mut self, port: u16) -> Result<(), String> {
        let node = self.node_mut(port)?;
        if let Some(mut process) = node.process.take() {
            process.kill();
        }
        Ok(())
    }

    /// Starts the node at `port` again, with its cluster config (it rejoins the cluster; a
    /// primary that was failed over comes back as a replica).
    pub fn restart(&mut self, port: u16) -> Result<(), String> {
        let node = self.node_mut(port)?;
        node.process = Some(RedisProcess::start(port, &node.args)?);
        Ok(())
    }

    /// Where the cluster keeps its files.
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}

fn config_file(dir: &Path, port: u16) -> String {
    dir.join(format!("nodes-{port}.conf"))
        .to_string_lossy()
        .into_owned()
}

/// `(start, end, primary port)` of every slot range in a `CLUSTER SLOTS` reply.
fn slot_ranges(value: redis::Value) -> Vec<(u16, u16, u16)> {
    let redis::Value::Array(ranges) = value else {
        return Vec::new();
    };
    ranges
        .into_iter()
        .filter_map(|range| {
            let redis::Value::Array(parts) = range else {
                return None;
            };
            let start: u16 = redis::from_redis_value(parts.first()?.clone()).ok()?;
            let end: u16 = redis::from_redis_value(parts.get(1)?.clone()).ok()?;
            let redis::Value::Array(primary) = parts.get(2)? else {
                return None;
            };
            let port: u16 = redis::from_redis_value(primary.get(1)?.clone()).ok()?;
            Some((start, end, port))
        })
        .collect()
}

/// The sorted ports of the primaries that serve slots, as the node at `port` sees them.
fn primaries_seen_by(port: u16) -> Option<Vec<u16>> {
    let slots: redis::Value = command(port, &["CLUSTER", "SLOTS"]).ok()?;
    let mut ports: Vec<u16> = slot_ranges(slots).into_iter().map(|(_, _, p)| p).collect();
    ports.sort_unstable();
    ports.dedup();
    Some(ports)
}

/// The part of a key Redis Cluster hashes: between the first `{` and the next `}` if non-empty,
/// else the whole key.
pub fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|b| *b == b'{')
        && let Some(len) = key[open + 1..].iter().position(|b| *b == b'}')
        && len > 0
    {
        return &key[open + 1..open + 1 + len];
    }
    key
}
