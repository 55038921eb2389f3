//! A primary of a Redis Cluster dies in the middle of a run (SIGKILL) and its replica takes over:
//! the store reports transient errors while the slot has no primary (and, with
//! `RedisOptions::wait_replicas`, while the new primary has no replica yet), recovers by itself
//! once the cluster has, and loses no event it reported committed before the failover.
//!
//! The cluster (3 primaries, 3 replicas, a node timeout of 1 s) is this test's own, on spare
//! loopback ports. A writer task commits pages of 5 events to one key, page after page, retrying
//! a page until it is committed as the engine would; the test kills the primary of that key's
//! slot once 20 pages are in, waits until a replica is promoted, starts the killed node again
//! (it rejoins as a replica, so `WAIT 1` can be satisfied again), lets 20 more pages commit, and
//! then reads the outbox: every event of every page the store acknowledged is there, and is
//! delivered (acknowledged) from the new primary.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::servers::{Cluster, poll};
use tokio::sync::Mutex;
use watukuy_conformance::cases::fixtures;
use watukuy_core::{
    Event,
    json::Json,
    store::{CommitBatch, OutboxRow, PKey, StatePatch, Store},
};
use watukuy_store_redis::{RedisOptions, RedisStore};

const T0: i64 = 1_767_225_600_000;
const EVENTS_PER_PAGE: usize = 5;
const PAGES_BEFORE: usize = 20;
const PAGES_AFTER: usize = 20;

/// A created event `id` (its own subject) on `key`, carrying its sequence, without a cursor.
fn event(key: &PKey, id: &str, sequence: i64) -> Result<Event, String> {
    let data = Json::parse(&format!(r#"{{"sequence":{sequence}}}"#)).map_err(|e| e.to_string())?;
    let mut event = fixtures::event(key, id, sequence, id);
    event.cursor = None;
    event.data = Some(data);
    Ok(event)
}

/// Page `page` (from 0): events `evt-<page>-<i>` at sequences `page * 5 + i + 1`.
fn page(key: &PKey, page: usize) -> Result<(CommitBatch, Vec<String>), String> {
    let mut rows = Vec::new();
    let mut ids = Vec::new();
    for i in 0..EVENTS_PER_PAGE {
        let id = format!("evt-{page:04}-{i}");
        let sequence = i64::try_from(page * EVENTS_PER_PAGE + i + 1).map_err(|e| e.to_string())?;
        rows.push(OutboxRow::pending(event(key, &id, sequence)?, T0));
        ids.push(id);
    }
    let last = i64::try_from((page + 1) * EVENTS_PER_PAGE).map_err(|e| e.to_string())?;
    let batch = CommitBatch::default().events(rows).state_patch(StatePatch {
        sequence: Some(last),
        updated_at: Some(T0),
        ..StatePatch::default()
    });
    Ok((batch, ids))
}

/// What the writer saw.
#[derive(Default)]
struct Seen {
    /// Ids of the events of every page the store reported committed, in order.
    committed: Vec<String>,
    /// Pages committed before the primary was killed.
    pages_before: usize,
    /// Every failed attempt: (transient?, message).
    errors: Vec<(bool, String)>,
}

#[watukuy_testenv::requires(redis_server)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_failover_loses_no_committed_event() {
    let cluster = tokio::task::spawn_blocking(|| Cluster::start(3, 1, 1_000))
        .await
        .expect("the cluster task")
        .unwrap_or_else(|e| panic!("the test cluster: {e}"));
    let cluster = Arc::new(Mutex::new(cluster));
    let url = cluster.lock().await.url();
    let options = RedisOptions::default()
        .prefix("failover:")
        .connect_timeout(Duration::from_secs(1))
        .response_timeout(Duration::from_secs(2))
        .reconnect_attempts(1)
        .wait_replicas(1, Duration::from_millis(500));
    let store = RedisStore::connect(&url, options)
        .await
        .expect("connect to the cluster");
    store.migrate().await.expect("migrate");
    let key = PKey::new("orders", "failover");
    let tagged = format!("{{{}:{}}}", key.poller, key.partition);
    let primary = cluster
        .lock()
        .await
        .primary_of(&tagged)
        .expect("the key's primary");
    let lease = store
        .acquire_lease(&key, "node-a", 3_600_000, T0)
        .await
        .expect("acquire")
        .expect("a free lease");

    // The writer: page after page, each retried until the store reports it committed.
    let seen = Arc::new(std::sync::Mutex::new(Seen::default()));
    let pages = Arc::new(AtomicUsize::new(0));
    let killed = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (store, key, lease) = (store.clone(), key.clone(), lease.clone());
        let (seen, pages, killed, stop) = (
            Arc::clone(&seen),
            Arc::clone(&pages),
            Arc::clone(&killed),
            Arc::clone(&stop),
        );
        tokio::spawn(async move {
            let mut n = 0;
            // Bounded, so that a store that never recovers fails the test instead of hanging it.
            for _ in 0..5_000 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let (batch, ids) = page(&key, n)?;
                match store.commit_poll(&key, &lease, &batch).await {
                    Ok(()) => {
                        let mut seen = seen.lock().map_err(|e| e.to_string())?;
                        seen.committed.extend(ids);
                        if !killed.load(Ordering::SeqCst) {
                            seen.pages_before = n + 1;
                        }
                        n += 1;
                        pages.store(n, Ordering::SeqCst);
                    }
                    Err(error) => {
                        let mut seen = seen.lock().map_err(|e| e.to_string())?;
                        seen.errors.push((error.is_transient(), error.to_string()));
                        if !error.is_transient() {
                            return Err(format!("a permanent error during the failover: {error}"));
                        }
                    }
                }
            }
            Ok::<usize, String>(n)
        })
    };

    let wait_for_pages = |target: usize| {
        let pages = Arc::clone(&pages);
        async move {
            for _ in 0..1_200 {
                if pages.load(Ordering::SeqCst) >= target {
                    return true;
                }
                // Real time passes while the cluster fails over; poll the writer's progress.
                let _ = tokio::task::spawn_blocking(common::servers::pause).await;
            }
            false
        }
    };
    assert!(
        wait_for_pages(PAGES_BEFORE).await,
        "the writer did not commit {PAGES_BEFORE} pages"
    );

    // The primary of the key's slot dies; a replica is promoted.
    killed.store(true, Ordering::SeqCst);
    let promoted = {
        let cluster = Arc::clone(&cluster);
        let tagged = tagged.clone();
        tokio::task::spawn_blocking(move || {
            let mut cluster = cluster.blocking_lock();
            cluster.kill(primary)?;
            poll("a replica takes over the slot", || {
                cluster
                    .primary_of(&tagged)
                    .ok()
                    .filter(|port| *port != primary)
            })
        })
        .await
        .expect("the failover task")
        .unwrap_or_else(|e| panic!("{e}"))
    };
    let committed_at_kill = pages.load(Ordering::SeqCst);
    // The killed node comes back and rejoins as the new primary's replica.
    {
        let cluster = Arc::clone(&cluster);
        tokio::task::spawn_blocking(move || {
            let mut cluster = cluster.blocking_lock();
            cluster.restart(primary)?;
            cluster.wait_healthy(3, 1)
        })
        .await
        .expect("the restart task")
        .unwrap_or_else(|e| panic!("{e}"));
    }
    if !wait_for_pages(committed_at_kill + PAGES_AFTER).await {
        let seen = seen.lock().expect("the writer's report");
        let mut errors: Vec<String> = seen
            .errors
            .iter()
            .map(|(_, e)| e.chars().take(200).collect())
            .collect();
        errors.dedup();
        panic!(
            "the store did not recover: no {PAGES_AFTER} pages committed after the failover \
             ({} pages in all); errors: {errors:#?}",
            pages.load(Ordering::SeqCst)
        );
    }
    stop.store(true, Ordering::SeqCst);
    let written = writer
        .await
        .expect("the writer task")
        .unwrap_or_else(|e| panic!("{e}"));

    // Every event the store reported committed is in the outbox, on the new primary, and is
    // delivered from there.
    let (committed, pages_before, errors) = {
        let seen = seen.lock().expect("the writer's report");
        (
            seen.committed.clone(),
            seen.pages_before,
            seen.errors.clone(),
        )
    };
    let before = pages_before * EVENTS_PER_PAGE;
    let pending = store
        .load_pending(&key, committed.len() + 100)
        .await
        .expect("read the outbox after the failover");
    let found: BTreeSet<&str> = pending.iter().map(|row| row.event_id.as_str()).collect();
    let lost: Vec<&String> = committed
        .iter()
        .filter(|id| !found.contains(id.as_str()))
        .collect();
    assert!(lost.is_empty(), "events committed and then lost: {lost:?}");
    let ids: Vec<String> = pending.iter().map(|row| row.event_id.to_string()).collect();
    store
        .ack_events(&key, &lease, &ids)
        .await
        .expect("deliver (acknowledge) after the failover");
    let delivered_before = committed[..before]
        .iter()
        .filter(|id| found.contains(id.as_str()))
        .count();
    assert_eq!(
        store.counts(&key).await.expect("counts").pending,
        0,
        "the outbox is not empty after delivery"
    );
    let transient = errors.iter().filter(|(t, _)| *t).count();
    assert!(
        transient > 0,
        "the failover surfaced no transient error: was the primary of the slot really killed?"
    );
    let mut kinds: Vec<String> = errors
        .iter()
        .map(|(_, e)| e.chars().take(90).collect::<String>())
        .collect();
    kinds.sort();
    kinds.dedup();
    eprintln!(
        "[redis-cluster] failover of primary :{primary} ({tagged}) to :{promoted}: \
         {before} events in {pages_before} pages committed before the failover, {} after it \
         ({written} pages in all); {transient} transient errors while it failed over; \
         {delivered_before} of the {before} delivered after it, {} events delivered in all, \
         0 lost. Errors seen: {kinds:#?}",
        committed.len() - before,
        ids.len(),
    );
    store.purge().await.expect("purge");
}
