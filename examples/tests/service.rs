//! The `service` example's built binary, run as a new user runs it: a service's `main` that
//! embeds watukuy's command line, against a local HTTP orders API served by this test.
//!
//! - `tick` delivers and exits 0; against a failing API it exits 1 and says why;
//! - `run` serves `/health`, and under SIGTERM finishes the cycle in flight, delivers what it
//!   committed and exits 0;
//! - `backfill` killed with SIGKILL mid-way resumes with `--resume` from the page it reached.
//!
//! Nothing sleeps: each step waits for what the binary prints or for the API request it makes.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStderr, Command};
use tokio::sync::{Notify, mpsc};

/// How long a step may take before the test fails (a bound, never waited out when green).
const STEP: Duration = Duration::from_secs(60);

/// The orders API: `GET /orders?since&after&limit`, oldest first by `(updatedAt, id)`.
#[derive(Default)]
struct Api {
    orders: Vec<Value>,
    /// Answer 503 with a problem document.
    failing: bool,
    /// Hold the first request whose `after` is this id until [`Gate::open`].
    hold_after: Option<String>,
}

#[derive(Clone)]
struct Server {
    api: Arc<Mutex<Api>>,
    /// Told when a request is held.
    held: mpsc::UnboundedSender<String>,
    release: Arc<Notify>,
}

#[derive(serde::Deserialize)]
struct Listing {
    since: Option<String>,
    after: Option<String>,
    limit: Option<usize>,
}

async fn list(State(server): State<Server>, Query(query): Query<Listing>) -> Response {
    let hold = {
        let mut api = server.api.lock().unwrap_or_else(PoisonError::into_inner);
        if api.failing {
            let problem = json!({
                "type": "about:blank",
                "title": "Service Unavailable",
                "detail": "orders database is in maintenance",
            });
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                [("content-type", "application/problem+json")],
                problem.to_string(),
            )
                .into_response();
        }
        let hold = api.hold_after.is_some() && api.hold_after == query.after;
        if hold {
            api.hold_after = None;
        }
        hold
    };
    if hold {
        let released = server.release.notified();
        let _ = server.held.send(query.after.clone().unwrap_or_default());
        released.await;
    }
    let api = server.api.lock().unwrap_or_else(PoisonError::into_inner);
    let key = |order: &Value| {
        (
            order["updatedAt"].as_str().unwrap_or_default().to_owned(),
            order["id"].as_str().unwrap_or_default().to_owned(),
        )
    };
    let mut page: Vec<&Value> = api
        .orders
        .iter()
        .filter(|order| {
            let (at, id) = key(order);
            match (&query.since, &query.after) {
                (None, _) => true,
                (Some(since), None) => at >= *since,
                (Some(since), Some(after)) => (at.as_str(), id.as_str()) > (since, after),
            }
        })
        .collect();
    page.sort_by_key(|order| key(order));
    page.truncate(query.limit.unwrap_or(100));
    axum::Json(page).into_response()
}

fn order(n: u32) -> Value {
    json!({
        "id": format!("o-{n:03}"),
        "status": "open",
        "updatedAt": format!("2026-11-0{}T10:00:00Z", n.min(9)),
    })
}

/// The API, a temporary folder for the store and the ledger, and the binary's environment.
struct World {
    server: Server,
    held: mpsc::UnboundedReceiver<String>,
    url: String,
    dir: tempfile::TempDir,
}

impl World {
    async fn new(orders: u32) -> Self {
        let (held_tx, held) = mpsc::unbounded_channel();
        let server = Server {
            api: Arc::new(Mutex::new(Api {
                orders: (1..=orders).map(order).collect(),
                ..Api::default()
            })),
            held: held_tx,
            release: Arc::new(Notify::new()),
        };
        let app = axum::Router::new()
            .route("/orders", axum::routing::get(list))
            .with_state(server.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            server,
            held,
            url,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn api(&self) -> std::sync::MutexGuard<'_, Api> {
        self.server
            .api
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn ledger_path(&self) -> PathBuf {
        self.dir.path().join("ledger.txt")
    }

    /// The ledger's lines: `<type> <subject> <lane> <id>`.
    fn ledger(&self) -> Vec<String> {
        match std::fs::read_to_string(self.ledger_path()) {
            Ok(text) => text.lines().map(str::to_owned).collect(),
            Err(_) => Vec::new(),
        }
    }

    /// The subjects of the ledger's lines of `kind` on `lane`.
    fn subjects(&self, kind: &str, lane: &str) -> BTreeSet<String> {
        self.ledger()
            .iter()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split(' ').collect();
                (fields.first() == Some(&kind) && fields.get(2) == Some(&lane))
                    .then(|| fields[1].to_owned())
            })
            .collect()
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_service"));
        command
            .args(args)
            .env("ORDERS_API_URL", &self.url)
            .env("ORDERS_LEDGER", self.ledger_path())
            .env("WATUKUY_STORE", store_url(self.dir.path()))
            .env("WATUKUY_INSTANCE_ID", "orders-1")
            .env_remove("WATUKUY_ADMIN_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    }

    /// Runs the binary to its end: exit code, stdout, stderr.
    async fn run(&self, args: &[&str]) -> (i32, String, String) {
        let output = tokio::time::timeout(STEP, self.command(args).output())
            .await
            .expect("the command ends")
            .unwrap();
        (
            output.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }

    /// `inspect --json`'s only key.
    async fn inspect(&self) -> Value {
        let (code, stdout, stderr) = self.run(&["inspect", "--json"]).await;
        assert_eq!(code, 0, "{stderr}");
        let report: Value = serde_json::from_str(&stdout).unwrap();
        report["pollers"][0].clone()
    }

    /// Waits until the API holds a request, and returns its `after`.
    async fn held(&mut self) -> String {
        tokio::time::timeout(STEP, self.held.recv())
            .await
            .expect("the request arrives")
            .expect("the API runs")
    }
}

fn store_url(dir: &Path) -> String {
    format!("sqlite:{}", dir.join("orders.db").display())
}

/// Reads stderr lines until one contains `needle`; returns it.
async fn wait_for(lines: &mut Lines<BufReader<ChildStderr>>, needle: &str) -> String {
    tokio::time::timeout(STEP, async {
        loop {
            match lines.next_line().await.unwrap() {
                Some(line) if line.contains(needle) => return line,
                Some(_) => {}
                None => panic!("stderr ended before a line with {needle:?}"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no line with {needle:?}"))
}

fn signal(child: &Child, name: &str) {
    let pid = child.id().expect("running").to_string();
    let status = std::process::Command::new("kill")
        .args([&format!("-{name}"), &pid])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{name} {pid}");
}

async fn exit_code(child: &mut Child) -> Option<i32> {
    tokio::time::timeout(STEP, child.wait())
        .await
        .expect("the process exits")
        .unwrap()
        .code()
}

fn all(orders: u32) -> BTreeSet<String> {
    (1..=orders).map(|n| format!("o-{n:03}")).collect()
}

#[tokio::test]
async fn tick_delivers_and_exits_0_and_names_the_known_pollers() {
    let world = World::new(3).await;
    let (code, stdout, stderr) = world.run(&["tick"]).await;
    assert_eq!(code, 0, "stdout: {stdout}\nstderr: {stderr}");
    assert_eq!(world.subjects("created", "live"), all(3));
    assert!(
        stdout.contains("'orders' live: 3 items, 3 events, 3 delivered"),
        "{stdout}"
    );

    // Nothing is due a moment later; --json prints the tick's result.
    let (code, stdout, _) = world.run(&["tick", "--json"]).await;
    assert_eq!(code, 0);
    let result: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(result["delivered"], 0, "{result}");
    assert_eq!(world.ledger().len(), 3, "nothing delivered twice");

    // The commands know the service's pollers.
    let (code, _, stderr) = world.run(&["pause", "--poller", "order"]).await;
    assert_eq!(code, 1);
    assert_eq!(
        stderr.trim(),
        "error (UNKNOWN_POLLER): unknown poller 'order' (known pollers: 'orders')"
    );
    let (code, _, stderr) = world.run(&["tick", "--poller", "nope"]).await;
    assert_eq!(
        (code, stderr.contains("known pollers: 'orders'")),
        (1, true)
    );
    let (code, _, stderr) = world
        .run(&["tick", "--poller", "orders", "--partition", "eu"])
        .await;
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("not partitioned"), "{stderr}");
}

#[tokio::test]
async fn tick_against_a_failing_api_exits_1_and_says_why() {
    let world = World::new(3).await;
    world.api().failing = true;
    let (code, stdout, stderr) = world.run(&["tick"]).await;
    assert_eq!(code, 1, "stdout: {stdout}\nstderr: {stderr}");
    assert!(stderr.contains("'orders' live failed"), "{stderr}");
    assert!(stderr.contains("503"), "{stderr}");
    assert!(
        stderr.contains("orders database is in maintenance"),
        "{stderr}"
    );
    assert!(world.ledger().is_empty());

    // The API is back: the next tick (`trigger` makes the key due at once) delivers.
    world.api().failing = false;
    assert_eq!(world.run(&["trigger", "--poller", "orders"]).await.0, 0);
    let (code, _, stderr) = world.run(&["tick"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(world.subjects("created", "live"), all(3));
}

#[tokio::test]
async fn run_serves_health_and_drains_the_cycle_in_flight_on_sigterm() {
    let mut world = World::new(4).await;
    // The second page (after o-002) is held until the process has begun to stop.
    world.api().hold_after = Some("o-002".to_owned());
    let mut child = world
        .command(&["run", "--listen", "127.0.0.1:0", "--drain-timeout", "60s"])
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let listening = wait_for(&mut lines, "listening on ").await;
    let base = listening.rsplit(' ').next().unwrap().to_owned();
    wait_for(&mut lines, "running orders").await;
    assert_eq!(world.held().await, "o-002");

    let health = http_get(&format!("{base}/health")).await;
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(health.contains("\"healthy\":true"), "{health}");
    let admin = http_get(&format!("{base}/admin/api/info")).await;
    assert!(admin.contains("\"mode\":\"read-only\""), "{admin}");

    signal(&child, "TERM");
    wait_for(&mut lines, "SIGTERM: stopping").await;
    // The cycle in flight goes on: its page arrives, is committed and delivered.
    world.server.release.notify_one();
    assert_eq!(exit_code(&mut child).await, Some(0));
    assert_eq!(world.subjects("created", "live"), all(4));
    assert_eq!(world.inspect().await["outboxPending"], 0);
}

#[tokio::test]
async fn backfill_reports_progress_and_resumes_after_sigkill() {
    let mut world = World::new(6).await;
    assert_eq!(world.run(&["tick"]).await.0, 0);
    assert_eq!(world.subjects("created", "live"), all(6));

    // The backfill's second page (after o-002) is held, and the process killed there.
    world.api().hold_after = Some("o-002".to_owned());
    let mut child = world
        .command(&[
            "backfill", "--poller", "orders", "--from", "null", "--force",
        ])
        .spawn()
        .unwrap();
    assert_eq!(world.held().await, "o-002");
    signal(&child, "KILL");
    assert_eq!(exit_code(&mut child).await, None, "killed by a signal");
    world.server.release.notify_one();

    let backfill = world.inspect().await["backfill"].clone();
    assert_eq!(backfill["done"], false, "{backfill}");
    assert_eq!(backfill["cursor"]["tieBreak"], "o-002", "{backfill}");

    let (code, stdout, stderr) = world
        .run(&["backfill", "--poller", "orders", "--resume"])
        .await;
    assert_eq!(code, 0, "stdout: {stdout}\nstderr: {stderr}");
    assert!(
        stderr.contains("resuming the backfill of 'orders'"),
        "{stderr}"
    );
    assert!(stderr.contains("pages, "), "progress lines: {stderr}");
    assert!(
        stdout.starts_with("backfill of 'orders' done: "),
        "{stdout}"
    );
    assert_eq!(world.subjects("updated", "backfill"), all(6));
    let backfill = world.inspect().await["backfill"].clone();
    assert_eq!(backfill["done"], true, "{backfill}");
    assert_eq!(backfill["cursor"]["tieBreak"], "o-006", "{backfill}");

    // Nothing left to resume.
    let (code, _, stderr) = world
        .run(&["backfill", "--poller", "orders", "--resume"])
        .await;
    assert_eq!(code, 1);
    assert!(stderr.contains("no unfinished backfill"), "{stderr}");
}

/// A plain HTTP/1.1 GET over a TCP connection: the status line, headers and body.
async fn http_get(url: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_at(rest.find('/').unwrap());
    let mut stream = tokio::net::TcpStream::connect(host).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response
}
