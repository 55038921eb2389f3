//! G6 across processes: two engines in two OS processes share one Redis budget of `5 per 1s`
//! (on the test Redis, and again on a Redis Cluster this binary starts),
//! and the API they call sees no more requests than that budget allows.
//!
//! This target has its own `main` (`harness = false`): run plainly it is the *parent*, which
//! starts this same binary twice as *children* (`WATUKUY_G6_CHILD=<poller>`). Each child runs an
//! engine with one poller (a token listing of 20 pages over its own fake API) whose fetch charges
//! the shared budget `api` before every request, through a [`RedisBudgetStore`] on the test
//! Redis.
//!
//! Time is virtual and moves in lockstep: the parent moves both children's manual clocks forward
//! 50 ms at a time over their stdin (`ADVANCE 50`), and a child acknowledges (`AT <now>`) only
//! once its engine has *settled*: it is done, or its last budget take was refused and its retry
//! is still in the future. So no child works while the other's clock is ahead, every token is
//! taken at the time both clocks show, and the budget, not the speed of this machine, paces the
//! requests. No one sleeps. When its tick ends, a child reports the time of every request its
//! API received (`REQ <at>`), then `DONE`.
//!
//! The check: from the first request on, by any time `t` the API has seen at most
//! `5 + ⌊5 · (t − start) / 1 s⌋` requests, and the 40 requests took as long as the budget
//! requires. The same run with a per-process in-memory budget breaks that bound, which shows the
//! check catches what the shared budget prevents.

use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::watch;
use watukuy_conformance::CaseError;
use watukuy_core::budget::{BucketPolicy, BudgetPolicy, BudgetStore, MemoryBudgetStore, Take};
use watukuy_core::{
    Engine, TickOptions,
    clock::{Clock, ManualClock},
    rng::SeededRng,
    store::Store,
};
use watukuy_store_redis::{RedisOptions, RedisStore};
use watukuy_testkit::world::{StrategyKind, World};

mod common;

const NAME: &str = "g6_two_processes_share_one_redis_budget";
const CLUSTER_NAME: &str = "g6_two_processes_share_one_redis_cluster_budget";
const CHILD_ENV: &str = "WATUKUY_G6_CHILD";
const URL_ENV: &str = common::URL_ENV;
const PREFIX_ENV: &str = "WATUKUY_G6_PREFIX";
const BUDGET_ENV: &str = "WATUKUY_G6_BUDGET";
/// Tokens per second, and the burst.
const RATE: i64 = 5;
/// How far the parent moves the clocks per step.
const STEP_MS: i64 = 50;
/// Items per child's API, two per page: 20 requests each.
const ITEMS: usize = 40;
const PAGE_SIZE: usize = 2;

fn policy() -> BudgetPolicy {
    BudgetPolicy::new(5, Duration::from_secs(1))
}

fn main() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("cannot build a tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Ok(poller) = std::env::var(CHILD_ENV) {
        return match runtime.block_on(child(&poller)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                println!("DONE error {e}");
                ExitCode::FAILURE
            }
        };
    }
    // Filters, `--list`, `--ignored` and `--include-ignored`, as libtest would handle them. The
    // tests need Redis, or the redis-server program for the cluster: while it is not there they
    // are ignored, with the reason (docs/testing.md).
    let tests: [(&str, Option<&str>); 2] = [
        (
            NAME,
            watukuy_testenv::ignored!(redis, or_cfg(feature = "testcontainers")),
        ),
        (CLUSTER_NAME, watukuy_testenv::ignored!(redis_server)),
    ];
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| args.iter().any(|a| a == name);
    let (only_ignored, include_ignored) = (flag("--ignored"), flag("--include-ignored"));
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let selected: Vec<(&str, Option<&str>)> = tests
        .iter()
        .copied()
        .filter(|(name, ignored)| {
            (filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str())))
                && (!only_ignored || ignored.is_some())
        })
        .collect();
    if flag("--list") {
        for (name, _) in &selected {
            println!("{name}: test");
        }
        return ExitCode::SUCCESS;
    }
    let filtered = tests.len() - selected.len();
    println!("\nrunning {} tests", selected.len());
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    for (name, ignored) in selected {
        if let Some(reason) = ignored.filter(|_| !(only_ignored || include_ignored)) {
            println!("test {name} ... ignored, {reason}");
            skipped += 1;
            continue;
        }
        // A missing server (unset URL, no program), a failure or a skip all fail: a test that
        // did not do its work never passes.
        let result = if name == CLUSTER_NAME {
            runtime.block_on(cluster_parent())
        } else {
            runtime.block_on(parent())
        };
        match result {
            Ok(()) => {
                println!("test {name} ... ok");
                passed += 1;
            }
            Err(error) => {
                println!("test {name} ... FAILED\n\n[redis] {name} {error}\n");
                failed += 1;
            }
        }
    }
    let verdict = if failed == 0 { "ok" } else { "FAILED" };
    println!(
        "\ntest result: {verdict}. {passed} passed; {failed} failed; {skipped} ignored; 0 measured; {filtered} filtered out\n"
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// One child: an engine polling `poller` under the shared budget, its clock moved by the parent.
async fn child(poller: &str) -> Result<(), String> {
    let url = std::env::var(URL_ENV).map_err(|e| format!("{URL_ENV}: {e}"))?;
    let prefix = std::env::var(PREFIX_ENV).map_err(|e| format!("{PREFIX_ENV}: {e}"))?;
    let shared = std::env::var(BUDGET_ENV).map_err(|e| format!("{BUDGET_ENV}: {e}"))? == "redis";
    let world = World::new(ITEMS, PAGE_SIZE).map_err(|e| e.to_string())?;
    let store = RedisStore::connect(&url, RedisOptions::default().prefix(&prefix))
        .await
        .map_err(|e| e.to_string())?;
    let inner: Arc<dyn BudgetStore> = if shared {
        Arc::new(store.budget_store())
    } else {
        Arc::new(MemoryBudgetStore::new())
    };
    let (gate, settled) = watch::channel(Progress::default());
    let gate = Arc::new(gate);
    let budgets = Arc::new(Gated {
        inner,
        gate: Arc::clone(&gate),
    });
    let definition = world
        .poller_named(poller, StrategyKind::Token)
        .budget("api")
        .build()
        .map_err(|e| e.to_string())?;
    let engine = Engine::builder(Arc::new(store) as Arc<dyn Store>)
        .poller(definition)
        .budget("api", policy())
        .budget_store(budgets)
        .clock(Arc::new(world.clock.clone()))
        .rng(Arc::new(SeededRng::new(6)))
        .instance_id(format!("{poller}-process"))
        .build()
        .map_err(|e| e.to_string())?;

    // The parent's clock: every `ADVANCE <ms>` moves this engine's clock, and is acknowledged
    // once the engine has settled at the new time.
    let clock = world.clock.clone();
    let driver = tokio::spawn(drive_clock(clock, settled));
    let result = engine
        .tick(TickOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    if let Some(error) = result.polled.iter().find_map(|p| p.error.as_ref()) {
        return Err(format!(
            "the poll failed: {}: {}",
            error.name, error.message
        ));
    }
    for entry in world.api.log() {
        println!("REQ {}", entry.at);
    }
    gate.send_modify(|p| p.done = true);
    println!("DONE ok");
    // Keep answering the parent until it closes stdin.
    driver.await.map_err(|e| e.to_string())?;
    Ok(())
}

/// What a child's engine is doing, as its budget takes show it.
#[derive(Clone, Copy, Debug, Default)]
struct Progress {
    /// A take is running.
    taking: bool,
    /// The last take was refused; the budget retries at this time.
    retry_at: Option<i64>,
    /// The tick is over.
    done: bool,
}

impl Progress {
    /// Nothing will happen before the clock moves: the tick is over, or the engine waits for a
    /// budget retry that lies in the future.
    fn settled(&self, now: i64) -> bool {
        self.done || (!self.taking && self.retry_at.is_some_and(|at| at > now))
    }
}

/// The child's budget store, reporting each take's progress to the clock driver.
struct Gated {
    inner: Arc<dyn BudgetStore>,
    gate: Arc<watch::Sender<Progress>>,
}

#[async_trait::async_trait]
impl BudgetStore for Gated {
    async fn take(
        &self,
        name: &str,
        cost: u64,
        policy: &BucketPolicy,
        now_ms: i64,
    ) -> watukuy_core::Result<Take> {
        self.gate.send_modify(|p| p.taking = true);
        let taken = self.inner.take(name, cost, policy, now_ms).await;
        self.gate.send_modify(|p| {
            p.taking = false;
            p.retry_at = match &taken {
                Ok(Take::Wait { retry_in_ms }) => {
                    Some(now_ms.saturating_add((*retry_in_ms).max(1)))
                }
                _ => None,
            };
        });
        taken
    }

    async fn peek(
        &self,
        name: &str,
        policy: &BucketPolicy,
        now_ms: i64,
    ) -> watukuy_core::Result<f64> {
        self.inner.peek(name, policy, now_ms).await
    }
}

/// Moves `clock` on every `ADVANCE <ms>` from stdin and answers `AT <now>` once the engine has
/// settled at the new time; ends when stdin closes.
async fn drive_clock(clock: ManualClock, mut settled: watch::Receiver<Progress>) {
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let Some(Ok(ms)) = line
            .strip_prefix("ADVANCE ")
            .map(|ms| ms.trim().parse::<u64>())
        else {
            continue;
        };
        clock.advance(Duration::from_millis(ms));
        let now = clock.now_ms();
        if settled.wait_for(|p| p.settled(now)).await.is_err() {
            return;
        }
        println!("AT {now}");
    }
}

/// A running child and what it reported.
struct Running {
    name: &'static str,
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    requests: Vec<i64>,
    done: Option<String>,
}

impl Running {
    fn start(name: &'static str, url: &str, prefix: &str, budget: &str) -> Result<Self, CaseError> {
        let exe = std::env::current_exe()
            .map_err(|e| CaseError::failed(format!("cannot find this test binary: {e}")))?;
        let mut child = Command::new(exe)
            .env(CHILD_ENV, name)
            .env(URL_ENV, url)
            .env(PREFIX_ENV, prefix)
            .env(BUDGET_ENV, budget)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| CaseError::failed(format!("cannot start a child process: {e}")))?;
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| CaseError::failed("no stdin"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| CaseError::failed("no stdout"))?;
        Ok(Self {
            name,
            child,
            stdin,
            stdout: BufReader::new(stdout).lines(),
            requests: Vec::new(),
            done: None,
        })
    }

    /// Reads until the acknowledgement of an `ADVANCE`, recording requests and completion.
    async fn read_until_ack(&mut self) -> Result<i64, CaseError> {
        loop {
            let line = self
                .stdout
                .next_line()
                .await
                .map_err(|e| CaseError::failed(format!("{}: {e}", self.name)))?
                .ok_or_else(|| {
                    CaseError::failed(format!("{} exited: {:?}", self.name, self.done))
                })?;
            if let Some(at) = line.strip_prefix("AT ") {
                return at.parse().map_err(|e| {
                    CaseError::failed(format!("{}: bad ack {line:?}: {e}", self.name))
                });
            } else if let Some(at) = line.strip_prefix("REQ ") {
                let at = at.parse().map_err(|e| {
                    CaseError::failed(format!("{}: bad line {line:?}: {e}", self.name))
                })?;
                self.requests.push(at);
            } else if let Some(done) = line.strip_prefix("DONE ") {
                if done != "ok" {
                    return Err(CaseError::failed(format!("{}: {done}", self.name)));
                }
                self.done = Some(done.to_owned());
            }
        }
    }
}

/// Runs both children with one kind of budget (`redis` or `memory`) until both are done, and
/// returns every request time, sorted, with the time of the first step.
async fn run(url: &str, budget: &str) -> Result<(Vec<i64>, [usize; 2]), CaseError> {
    let prefix = format!("wk:{}:g6.{budget}:", std::process::id());
    let admin = RedisStore::connect(url, RedisOptions::default().prefix(&prefix)).await?;
    admin.purge().await?;
    let mut children = [
        Running::start("alpha", url, &prefix, budget)?,
        Running::start("beta", url, &prefix, budget)?,
    ];
    // At most 60 s of virtual time: far more than 40 requests at 5 per second need. The first
    // round moves nothing: both engines settle at the start time before the clocks move.
    for step in 0..1_200 {
        let by = if step == 0 { 0 } else { STEP_MS };
        for child in &mut children {
            child
                .stdin
                .write_all(format!("ADVANCE {by}\n").as_bytes())
                .await
                .map_err(|e| CaseError::failed(format!("{}: {e}", child.name)))?;
            child
                .stdin
                .flush()
                .await
                .map_err(|e| CaseError::failed(format!("{}: {e}", child.name)))?;
        }
        let mut clocks = Vec::new();
        for child in &mut children {
            // A child that never settles (an engine stuck on something other than the budget)
            // fails the test instead of hanging it.
            let ack = tokio::time::timeout(Duration::from_secs(60), child.read_until_ack())
                .await
                .map_err(|_| {
                    CaseError::failed(format!("{} did not settle within 60 s", child.name))
                })??;
            clocks.push(ack);
        }
        if clocks.windows(2).any(|w| w[0] != w[1]) {
            return Err(CaseError::failed(format!("clocks out of step: {clocks:?}")));
        }
        if children.iter().all(|c| c.done.is_some()) {
            break;
        }
    }
    let counts = [children[0].requests.len(), children[1].requests.len()];
    let mut requests: Vec<i64> = children
        .iter()
        .flat_map(|c| c.requests.iter().copied())
        .collect();
    for mut child in children {
        if child.done.is_none() {
            return Err(CaseError::failed(format!(
                "{} did not finish within 60 s of virtual time",
                child.name
            )));
        }
        drop(child.stdin);
        let status = child
            .child
            .wait()
            .await
            .map_err(|e| CaseError::failed(format!("{}: {e}", child.name)))?;
        if !status.success() {
            return Err(CaseError::failed(format!(
                "{} exited with {status}",
                child.name
            )));
        }
    }
    admin.purge().await?;
    requests.sort_unstable();
    Ok((requests, counts))
}

/// The first time `t` at which more requests were seen than `5 + ⌊5 · (t − start) / 1 s⌋`.
fn first_excess(requests: &[i64]) -> Option<(i64, usize)> {
    let start = *requests.first()?;
    requests.iter().enumerate().find_map(|(i, at)| {
        let seen = i64::try_from(i + 1).unwrap_or(i64::MAX);
        let allowed = RATE + RATE * (at - start) / 1_000;
        (seen > allowed).then_some((*at, i + 1))
    })
}

async fn parent() -> Result<(), CaseError> {
    // The test server (or a container, with the `testcontainers` feature), kept for both runs.
    let server = common::server().await?;
    let url = server.url.clone();
    check(&url).await
}

/// The same on a Redis Cluster of 3 primaries and 3 replicas this process starts (the children
/// connect with its `redis+cluster://` URL).
async fn cluster_parent() -> Result<(), CaseError> {
    let cluster = tokio::task::spawn_blocking(|| common::servers::Cluster::start(3, 1, 2_000))
        .await
        .map_err(|e| CaseError::failed(format!("starting the cluster panicked: {e}")))?
        .map_err(|e| CaseError::failed(format!("the test cluster: {e}")))?;
    let result = check(&cluster.url()).await;
    drop(cluster);
    result
}

/// Both runs against the Redis at `url`: the shared budget holds, per-process budgets do not.
async fn check(url: &str) -> Result<(), CaseError> {
    let url = url.to_owned();
    let (shared, counts) = run(&url, "redis").await?;
    let expected = 2 * (ITEMS / PAGE_SIZE);
    if shared.len() < expected || counts.contains(&0) {
        return Err(CaseError::failed(format!(
            "expected at least {expected} requests from both processes, got {counts:?}"
        )));
    }
    if let Some((at, seen)) = first_excess(&shared) {
        return Err(CaseError::failed(format!(
            "the shared budget was exceeded: {seen} requests by {at}: {shared:?}"
        )));
    }
    // Both processes waited for each other: the whole run took as long as the budget needs.
    let span = shared.last().copied().unwrap_or(0) - shared.first().copied().unwrap_or(0);
    let needed = (i64::try_from(shared.len()).unwrap_or(0) - RATE) * 1_000 / RATE;
    if span < needed {
        return Err(CaseError::failed(format!(
            "{} requests in {span} ms: faster than 5 per second",
            shared.len()
        )));
    }
    // The control: per-process budgets in memory let the API see about twice as much.
    let (separate, _) = run(&url, "memory").await?;
    let offsets = |times: &[i64]| -> Vec<i64> {
        let start = times.first().copied().unwrap_or(0);
        times.iter().map(|t| t - start).collect()
    };
    eprintln!(
        "[redis] {NAME}: shared budget: {} requests ({counts:?}) at ms {:?}; per-process \
         budgets: at ms {:?}",
        shared.len(),
        offsets(&shared),
        offsets(&separate),
    );
    if first_excess(&separate).is_none() {
        return Err(CaseError::failed(format!(
            "per-process budgets stayed within the shared bound, so the check proves nothing: {separate:?}"
        )));
    }
    Ok(())
}
