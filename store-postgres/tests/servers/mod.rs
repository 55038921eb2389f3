//! Private servers the tests start themselves: a PostgreSQL cluster (`initdb` + `postgres`) on
//! a spare port, optionally TLS-only with a throwaway certificate authority, and a PgBouncer in
//! transaction pooling mode in front of one. Used by the tests marked
//! `#[watukuy_testenv::requires(postgres_server)]` / `requires(pgbouncer)` (docs/testing.md).
//!
//! A server is started once per test process ([`std::sync::LazyLock`]) and shared by its tests.
//! PostgreSQL and PgBouncer refuse to run as root: when the tests run as root (CI), the servers
//! run as the `postgres` OS user (Debian's package creates it), in a temporary folder given to
//! it. Statics are never dropped, so each server has a *reaper*: a small shell that waits for
//! the end of a pipe from this process, which the OS closes when the process exits however it
//! exits, then stops the server and removes its folder.

#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::os::unix::fs::{PermissionsExt, chown};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;
use std::sync::mpsc;
use std::time::Duration;

/// How long a server may take to say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A throwaway certificate authority and a server certificate it signed, as PEM.
pub struct TestCa {
    /// The CA's certificate (what a client trusts).
    pub ca_pem: String,
    /// The server's certificate, for `localhost` and `127.0.0.1`.
    pub server_cert_pem: String,
    /// The server certificate's private key.
    pub server_key_pem: String,
}

impl TestCa {
    /// A new CA named `name` and a server certificate for `hosts` (names or IP addresses).
    pub fn new(name: &str, hosts: &[&str]) -> Self {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().expect("a CA key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} (watukuy tests)"));
        let ca_cert = ca_params.self_signed(&ca_key).expect("a self-signed CA");
        let issuer = Issuer::new(ca_params, ca_key);
        let server_key = KeyPair::generate().expect("a server key");
        let hosts: Vec<String> = hosts.iter().map(|h| (*h).to_owned()).collect();
        let mut params = CertificateParams::new(hosts).expect("server params");
        params
            .distinguished_name
            .push(DnType::CommonName, "watukuy test server");
        let server_cert = params
            .signed_by(&server_key, &issuer)
            .expect("a server certificate");
        Self {
            ca_pem: ca_cert.pem(),
            server_cert_pem: server_cert.pem(),
            server_key_pem: server_key.serialize_pem(),
        }
    }
}

/// How a private PostgreSQL accepts connections on 127.0.0.1.
pub enum Access {
    /// Plain TCP, no TLS.
    Plain,
    /// TLS only (`ssl = on` and only `hostssl` lines in `pg_hba.conf`) with this certificate.
    TlsOnly(TestCa),
}

/// A running private PostgreSQL (user `postgres`, trust authentication, database `postgres`).
pub struct PgServer {
    /// Its TCP port on 127.0.0.1.
    pub port: u16,
    /// Its folder (data directory under `data/`, certificates, logs).
    pub dir: PathBuf,
    /// The CA of a TLS-only server.
    pub ca: Option<TestCa>,
    _reaper: Reaper,
}

impl PgServer {
    /// `postgres://postgres@127.0.0.1:<port>/postgres` followed by `query` (e.g.
    /// `?sslmode=disable`).
    pub fn url(&self, query: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres{query}",
            self.port
        )
    }

    /// Writes `pem` to a file in the server's folder (readable by the tests) and returns its
    /// path.
    pub fn write_file(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.dir.join(name);
        std::fs::write(&path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        path
    }

    /// Initialises a cluster in a new temporary folder and starts it on a spare port, waiting
    /// until it accepts connections. Panics, saying why, when the programs are missing or the
    /// server does not come up.
    pub fn start(access: Access) -> Self {
        let initdb = watukuy_testenv::program!("initdb").unwrap_or_else(|why| panic!("{why}"));
        let postgres = watukuy_testenv::program!("postgres").unwrap_or_else(|why| panic!("{why}"));
        let owner = Owner::current_or_postgres();
        let dir = owner.temp_dir("watukuy-pg");
        let data = dir.join("data");
        let port = spare_port();
        let out = owner
            .command(initdb)
            .args(["-D", &data.to_string_lossy()])
            .args(["-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"])
            .args(["--locale=C", "--no-instructions"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {initdb}: {e}"));
        assert!(
            out.status.success(),
            "{initdb} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let mut conf = format!(
            "\n# watukuy tests\nport = {port}\nlisten_addresses = '127.0.0.1'\n\
             unix_socket_directories = '{dir}'\nmax_connections = 120\nshared_buffers = 32MB\n\
             fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n",
            dir = dir.display()
        );
        let (ca, hba) = match access {
            Access::Plain => (
                None,
                "local all all trust\nhost all all 127.0.0.1/32 trust\n".to_owned(),
            ),
            Access::TlsOnly(ca) => {
                let cert = data.join("server.crt");
                let key = data.join("server.key");
                owner.write(&cert, ca.server_cert_pem.as_bytes(), 0o644);
                owner.write(&key, ca.server_key_pem.as_bytes(), 0o600);
                conf.push_str(&format!(
                    "ssl = on\nssl_cert_file = '{}'\nssl_key_file = '{}'\n",
                    cert.display(),
                    key.display()
                ));
                // Only hostssl: a plain-text TCP connection finds no line and is refused.
                (
                    Some(ca),
                    "local all all trust\nhostssl all all 127.0.0.1/32 trust\n".to_owned(),
                )
            }
        };
        append(&data.join("postgresql.conf"), &conf);
        owner.write(&data.join("pg_hba.conf"), hba.as_bytes(), 0o600);

        let reaper = start_server(
            owner
                .command(postgres)
                .args(["-D", &data.to_string_lossy()]),
            &dir,
            "INT",
            "database system is ready to accept connections",
            &format!("postgres on port {port}"),
        );
        Self {
            port,
            dir,
            ca,
            _reaper: reaper,
        }
    }
}

/// A running private PgBouncer in transaction pooling mode in front of a [`PgServer`].
pub struct Bouncer {
    /// Its TCP port on 127.0.0.1.
    pub port: u16,
    /// The server it pools.
    pub server: PgServer,
    _reaper: Reaper,
}

impl Bouncer {
    /// The server-side pool size per database and user.
    pub const POOL_SIZE: u32 = 10;

    /// Starts a plain private PostgreSQL and a PgBouncer (`pool_mode = transaction`) in front
    /// of it, waiting until both accept connections.
    pub fn start() -> Self {
        let pgbouncer =
            watukuy_testenv::program!("pgbouncer").unwrap_or_else(|why| panic!("{why}"));
        let server = PgServer::start(Access::Plain);
        let owner = Owner::current_or_postgres();
        let port = spare_port();
        let dir = owner.temp_dir("watukuy-pgbouncer");
        let users = dir.join("userlist.txt");
        owner.write(&users, b"\"postgres\" \"\"\n", 0o600);
        let ini = dir.join("pgbouncer.ini");
        // No ignore_startup_parameters: the store must not send what PgBouncer does not track.
        let config = format!(
            "[databases]\n* = host=127.0.0.1 port={server_port}\n\n[pgbouncer]\n\
             listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = trust\nauth_file = {users}\npool_mode = transaction\n\
             max_client_conn = 400\ndefault_pool_size = {pool}\nmax_db_connections = {pool}\n\
             pidfile =\nlogfile =\nlog_connections = 0\nlog_disconnections = 0\n",
            server_port = server.port,
            users = users.display(),
            pool = Self::POOL_SIZE,
        );
        owner.write(&ini, config.as_bytes(), 0o600);
        let reaper = start_server(
            owner.command(pgbouncer).arg(&ini),
            &dir,
            "TERM",
            "process up",
            &format!("pgbouncer on port {port}"),
        );
        Self {
            port,
            server,
            _reaper: reaper,
        }
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres` through the pooler.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

/// The OS user the servers run as: this one, or `postgres` when this one is root.
struct Owner {
    /// `(uid, gid)` to switch to, or `None` to stay.
    switch: Option<(u32, u32)>,
}

impl Owner {
    fn current_or_postgres() -> Self {
        let uid = id(&["-u"]);
        if uid != 0 {
            return Self { switch: None };
        }
        Self {
            switch: Some((id(&["-u", "postgres"]), id(&["-g", "postgres"]))),
        }
    }

    /// A command running as this owner.
    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        if let Some((uid, gid)) = self.switch {
            command.uid(uid).gid(gid);
            // The server's own HOME (some programs read it), not root's.
            command.env("HOME", std::env::temp_dir());
        }
        command
    }

    /// A new temporary folder belonging to this owner (kept; the reaper removes it).
    fn temp_dir(&self, prefix: &str) -> PathBuf {
        let dir = tempfile::Builder::new()
            .prefix(&format!("{prefix}-"))
            .tempdir()
            .expect("a temporary folder")
            .keep();
        self.give(&dir);
        dir
    }

    /// Writes a file with `mode`, belonging to this owner.
    fn write(&self, path: &Path, contents: &[u8], mode: u32) {
        std::fs::write(path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
        self.give(path);
    }

    fn give(&self, path: &Path) {
        if let Some((uid, gid)) = self.switch {
            chown(path, Some(uid), Some(gid))
                .unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
        }
    }
}

/// `id <args>` as a number (`id -u postgres`).
fn id(args: &[&str]) -> u32 {
    let out = Command::new("id")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run id: {e}"));
    assert!(
        out.status.success(),
        "id {}: {} (the servers run as the postgres OS user when the tests run as root)",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("a numeric id")
}

fn append(path: &Path, text: &str) {
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    file.write_all(text.as_bytes())
        .unwrap_or_else(|e| panic!("append to {}: {e}", path.display()));
}

/// A port nothing listens on right now.
pub fn spare_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a spare port");
    listener.local_addr().expect("local address").port()
}

/// Starts the server `what` with `command` (it logs to stderr), hands it to a [`Reaper`] that
/// removes `dir` and stops it with `signal`, and waits until its log says `ready`.
fn start_server(
    command: &mut Command,
    dir: &Path,
    signal: &str,
    ready: &'static str,
    what: &str,
) -> Reaper {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    let stderr = child.stderr.take().expect("the server's stderr");
    let reaper = Reaper::new(dir, child, signal);
    wait_for_line(stderr, ready, what);
    reaper
}

/// Reads a server's log until a line contains `ready` (then keeps draining it in a thread, so
/// the server never blocks on a full pipe); panics with the log when it ends first or takes
/// longer than [`READY_TIMEOUT`].
fn wait_for_line(log: impl std::io::Read + Send + 'static, ready: &'static str, what: &str) {
    let (tx, rx) = mpsc::channel::<Result<(), String>>();
    std::thread::spawn(move || {
        let mut seen = String::new();
        let mut lines = BufReader::new(log).lines();
        for line in lines.by_ref() {
            let Ok(line) = line else { break };
            if line.contains(ready) {
                let _ = tx.send(Ok(()));
                for _ in lines.by_ref() {}
                return;
            }
            seen.push_str(&line);
            seen.push('\n');
        }
        let _ = tx.send(Err(seen));
    });
    match rx.recv_timeout(READY_TIMEOUT) {
        Ok(Ok(())) => {}
        Ok(Err(log)) => panic!("{what} exited before it was ready:\n{log}"),
        Err(_) => panic!("{what} was not ready within {READY_TIMEOUT:?}"),
    }
}

/// Stops a server and removes its folder when this process exits (see the module docs).
struct Reaper {
    /// The server (never waited for: the reaper stops it when this process is gone).
    _server: Mutex<Child>,
    /// The reaper shell, and the pipe whose end it waits for.
    _reaper: Mutex<(Child, ChildStdin)>,
}

impl Reaper {
    /// `server` is stopped with `signal` (`INT`: PostgreSQL's fast shutdown, `TERM`: PgBouncer's
    /// immediate one).
    fn new(dir: &Path, server: Child, signal: &str) -> Self {
        let pids = [(server.id(), signal)];
        // Waits for the end of stdin, signals, waits for the processes to go, removes the folder.
        let script = r#"dir=$1; shift
cat >/dev/null
for p in "$@"; do kill -s "${p#*:}" "${p%%:*}" 2>/dev/null; done
for p in "$@"; do while kill -0 "${p%%:*}" 2>/dev/null; do sleep 0.1; done; done
rm -rf "$dir""#;
        let mut command = Command::new("sh");
        command.args(["-c", script, "watukuy-reaper"]).arg(dir);
        for (pid, signal) in pids {
            command.arg(format!("{pid}:{signal}"));
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own process group: a Ctrl-C of the test run does not kill it before it cleans.
            .process_group(0)
            .spawn()
            .expect("start the reaper shell");
        let pipe = child.stdin.take().expect("the reaper's stdin");
        Self {
            _server: Mutex::new(server),
            _reaper: Mutex::new((child, pipe)),
        }
    }
}
