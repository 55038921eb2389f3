//! Crash safety: a process killed with SIGKILL in the middle of a `commit_poll` loop leaves a
//! database where every committed page is whole and no page is half-written.
//!
//! The parent test re-runs this test binary as a child process (selecting only
//! [`commit_loop`] and naming the database in [`CHILD_ENV`]). The child commits page after page
//! and prints a line after each commit; the parent reads those lines (a blocking read on the
//! pipe: no sleeps, no polling), kills the child once enough pages are committed, while it is in
//! the middle of the next `commit_poll`, and checks the file. Several rounds resume on the same
//! file, so later kills also land on a database that recovered from an earlier one.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};

use futures::TryStreamExt;
use watukuy_conformance::cases::fixtures::{item, pending};
use watukuy_core::{
    json::Json,
    store::{CommitBatch, LogQuery, PKey, StatePatch, Store},
};
use watukuy_store_sqlite::{SqliteOptions, SqliteStore};
use watukuy_testkit::T0;

/// Names the database file of a child process; unset in the parent.
const CHILD_ENV: &str = "WATUKUY_SQLITE_CRASH_CHILD_DB";
/// What the child prints after each committed page, followed by the page number.
const COMMITTED: &str = "WATUKUY-COMMITTED ";
/// What the child prints right before it calls `commit_poll` for a page.
const STARTING: &str = "WATUKUY-STARTING ";
/// Items (and events) per page.
const PAGE: i64 = 100;
/// A child that is never killed stops by itself after this many pages.
const CHILD_MAX_PAGES: i64 = 20_000;
/// How many pages the parent lets a child commit before killing it, per round.
const PAGES_PER_ROUND: usize = 12;
/// How many times the parent kills a child.
const ROUNDS: usize = 4;

fn key() -> PKey {
    PKey::new("crash", "")
}

fn identity(page: i64, n: i64) -> String {
    format!("p{page:06}-{n:03}")
}

/// Page `page`: `PAGE` items, `PAGE` events (sequences following on from the previous page, all
/// logged) and a state patch carrying the page's last sequence.
fn page_batch(key: &PKey, page: i64) -> CommitBatch {
    let first = (page - 1) * PAGE + 1;
    let mut upserts = Vec::new();
    let mut events = Vec::new();
    for n in 0..PAGE {
        let id = identity(page, n);
        let mut row = item(&id, &format!("hash-{page}-{n}"));
        row.payload = Some(
            Json::parse(&format!(
                r#"{{"id":"{id}","page":{page},"text":"{}"}}"#,
                "x".repeat(200)
            ))
            .expect("valid JSON"),
        );
        upserts.push(row);
        events.push(pending(key, &format!("evt-{}", first + n), first + n, &id));
    }
    CommitBatch::default()
        .state_patch(StatePatch {
            sequence: Some(page * PAGE),
            updated_at: Some(T0 + page),
            ..StatePatch::default()
        })
        .upserts(upserts)
        .events(events)
        .log(true)
}

/// Commits pages on the file at `path`, resuming after the last committed one, until
/// `max_pages` pages exist; calls `progress(page, done)` before (`false`) and after (`true`)
/// each page's `commit_poll`.
async fn commit_pages(path: &Path, max_pages: i64, mut progress: impl FnMut(i64, bool)) {
    let store = SqliteStore::open(SqliteOptions::file(path)).expect("valid options");
    let key = key();
    // The same owner re-acquires its key after each crash (with the next epoch).
    let lease = store
        .acquire_lease(&key, "crash-child", 3_600_000, T0)
        .await
        .expect("acquire")
        .expect("the child's own key is free");
    let done = store
        .load_state(&key)
        .await
        .expect("load_state")
        .map_or(0, |state| state.sequence / PAGE);
    for page in done + 1..=max_pages {
        let batch = page_batch(&key, page);
        progress(page, false);
        store
            .commit_poll(&key, &lease, &batch)
            .await
            .expect("commit_poll");
        progress(page, true);
    }
}

/// Checks that the file holds exactly whole pages and returns how many.
async fn whole_pages(path: &Path) -> i64 {
    let integrity: String = rusqlite::Connection::open(path)
        .expect("open for the integrity check")
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .expect("integrity_check");
    assert_eq!(integrity, "ok");

    let store = SqliteStore::open(SqliteOptions::file(path)).expect("valid options");
    let key = key();
    let sequence = store
        .load_state(&key)
        .await
        .expect("load_state")
        .map_or(0, |state| state.sequence);
    assert_eq!(
        sequence % PAGE,
        0,
        "the state's sequence {sequence} ends mid-page"
    );
    let pages = sequence / PAGE;
    let rows = u64::try_from(sequence).expect("non-negative");

    let counts = store.counts(&key).await.expect("counts");
    assert_eq!((counts.items, counts.pending), (rows, rows));
    let log = store
        .read_log(&key, LogQuery::default(), usize::MAX)
        .await
        .expect("read_log");
    assert_eq!(
        log.len(),
        usize::try_from(rows).expect("fits"),
        "log entries"
    );

    let identities: BTreeSet<String> = store
        .stream_identities(&key, 1000)
        .try_collect::<Vec<_>>()
        .await
        .expect("stream_identities")
        .into_iter()
        .flatten()
        .collect();
    let expected: BTreeSet<String> = (1..=pages)
        .flat_map(|page| (0..PAGE).map(move |n| identity(page, n)))
        .collect();
    assert!(
        identities == expected,
        "the snapshot is not exactly {pages} whole pages"
    );

    let sequences: Vec<i64> = store
        .load_pending(&key, usize::MAX)
        .await
        .expect("load_pending")
        .iter()
        .map(|row| row.sequence)
        .collect();
    assert_eq!(
        sequences,
        (1..=sequence).collect::<Vec<_>>(),
        "outbox sequences"
    );
    store.close().await.expect("close");
    pages
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// The commit loop. Spawned by the parent (with [`CHILD_ENV`] set) it commits until it is
/// killed; run as a plain test it commits a few pages on its own file and checks them, so the
/// loop the crash test relies on is itself tested.
#[test]
fn commit_loop() {
    let runtime = runtime();
    if let Some(path) = std::env::var_os(CHILD_ENV) {
        runtime.block_on(commit_pages(
            Path::new(&path),
            CHILD_MAX_PAGES,
            |page, done| {
                if done {
                    println!("{COMMITTED}{page}");
                } else {
                    println!("{STARTING}{page}");
                }
            },
        ));
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("loop.db");
    let mut seen = Vec::new();
    runtime.block_on(commit_pages(&path, 3, |page, done| seen.push((page, done))));
    runtime.block_on(commit_pages(&path, 5, |page, done| seen.push((page, done))));
    let expected: Vec<(i64, bool)> = (1..=5).flat_map(|p| [(p, false), (p, true)]).collect();
    assert_eq!(seen, expected, "the loop resumes after the last page");
    assert_eq!(runtime.block_on(whole_pages(&path)), 5);
}

#[test]
fn sigkill_mid_commit_poll_leaves_only_whole_pages() {
    let runtime = runtime();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("crash.db");
    let exe = std::env::current_exe().expect("the test binary");
    let mut pages = 0;
    // Rounds whose kill landed before the in-flight commit finished (its page is absent).
    let mut cut = 0;
    for round in 1..=ROUNDS {
        let mut child = Command::new(&exe)
            .args(["commit_loop", "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, &path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the child");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut committed = 0;
        let mut last_page = 0;
        let mut lines = BufReader::new(stdout).lines();
        for line in lines.by_ref() {
            let line = line.expect("read the child's output");
            if let Some(page) = line.strip_prefix(COMMITTED) {
                last_page = page.trim().parse().expect("a page number");
                committed += 1;
            } else if line.starts_with(STARTING) && committed == PAGES_PER_ROUND {
                break;
            }
        }
        // The child has just called commit_poll for the next page: the kill lands inside it,
        // or, on a loaded machine, a few pages later.
        child.kill().expect("SIGKILL the child");
        let status = child.wait().expect("reap the child");
        // Whatever the child reported before it died is still in the pipe: every commit it saw
        // return counts. Only the commit in flight at the kill may be either whole or absent.
        for line in lines {
            let Ok(line) = line else { break };
            if let Some(page) = line.strip_prefix(COMMITTED) {
                last_page = page.trim().parse().expect("a page number");
                committed += 1;
            }
        }
        if committed < PAGES_PER_ROUND {
            let mut stderr = String::new();
            if let Some(mut err) = child.stderr.take() {
                err.read_to_string(&mut stderr).ok();
            }
            panic!(
                "round {round}: the child stopped after {committed} pages ({status}):\n{stderr}"
            );
        }
        assert!(!status.success(), "round {round}: the child was not killed");

        let found = runtime.block_on(whole_pages(&path));
        assert!(
            found >= last_page,
            "round {round}: page {last_page} was reported committed but only {found} pages are there"
        );
        assert!(
            found <= last_page + 1,
            "round {round}: {found} pages, but the child reported only up to page {last_page}"
        );
        assert!(found > pages, "round {round}: no progress");
        if found == last_page {
            cut += 1;
        }
        pages = found;
    }
    eprintln!(
        "{ROUNDS} kills, {cut} of them before the in-flight commit finished; {pages} whole pages"
    );
}
