//! What every durable store's v1 upgrade test checks, once the store holds the v1 fixture.
//!
//! The fixtures were written by the code of commit 47ad676 (the last release) running one engine
//! scenario on a ManualClock (see `store-sqlite/tests/fixtures/README.md` and the writer
//! `store-sqlite/tests/fixtures/v1_writer.rs`). Beside each fixture, `v1.expected.json` is what
//! the v1 code itself read back from that store: the v1 `load_state`, `get_lease`, snapshot
//! (`stream_identities` + `load_versions`), `load_pending`, `list_parked`, `get_validator` and
//! `read_log` of each key, with every payload embedded as the exact JSON text v1 returned.
//!
//! [`upgrade_and_check`] migrates the store twice with today's code, reads every part back with
//! today's code and compares it with what v1 read (typed equality: payloads byte for byte), checks
//! a few facts spelled out here (so a wrong expectations file cannot hide a loss), and then runs
//! today's engine with handlers attached: it must deliver exactly the pending v1 events, in
//! sequence order, with their ids and payloads, and leave every outbox empty.
//!
//! This file is shared by the SQLite, PostgreSQL and Redis tests (`#[path]`).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use serde::Deserialize;
use watukuy_core::hooks::{HookContext, Hooks};
use watukuy_core::schedule::ScheduleOptions;
use watukuy_core::{
    Engine, Event, EventType, FetchContext, HandlerContext, Page, Partition, Poller, TickOptions,
    clock::ManualClock,
    cursor,
    poller::Retain,
    rng::SeededRng,
    store::{
        ItemRow, Lease, LogQuery, LoggedEvent, OutboxRow, PKey, ParkedKind, ParkedQuery, ParkedRow,
        PollerState, Store, Validator,
    },
};

/// When the v1 scenario started (2023-11-14T22:13:20Z): phase 1 polled and delivered.
pub(crate) const T0: i64 = 1_700_000_000_000;
/// Phase 2 (ten minutes later) committed events with no handler attached: they stayed pending.
pub(crate) const T1: i64 = T0 + 600_000;
/// One second after phase 2 the v1 writer failed `o-4` once and "crashed" holding the lease of
/// orders/eu (it expires at `T2 + 30 s`).
pub(crate) const T2: i64 = T1 + 1_000;
/// When today's engine runs: the crashed lease has expired and the retry time of `o-4` has
/// passed, but no poller is due (their next poll is at `T0 + 15 min`), so the tick only drains.
pub(crate) const T_TEST: i64 = T2 + 60_000;

/// The v1 lease owner.
const V1_OWNER: &str = "v1-writer";

/// What v1 read back from one key (`v1.expected.json`), decoded with today's types.
#[derive(Debug, Deserialize)]
struct V1Key {
    /// The poller.
    poller: String,
    /// The partition.
    partition: String,
    /// `load_state`.
    state: Option<PollerState>,
    /// `get_lease`.
    lease: Option<Lease>,
    /// The snapshot: `load_versions` of every identity `stream_identities` listed.
    items: BTreeMap<String, ItemRow>,
    /// `load_pending`.
    pending: Vec<OutboxRow>,
    /// `list_parked` (no filter).
    parked: Vec<ParkedRow>,
    /// `get_validator`, per URL hash.
    validators: BTreeMap<String, Validator>,
    /// `read_log` (no filter).
    log: Vec<LoggedEvent>,
}

impl V1Key {
    /// The key.
    fn key(&self) -> PKey {
        PKey::new(&self.poller, &self.partition)
    }
}

/// The whole of `v1.expected.json`.
#[derive(Debug, Deserialize)]
struct V1Dump {
    /// One entry per key the v1 scenario wrote.
    keys: Vec<V1Key>,
}

impl V1Dump {
    /// Parses `v1.expected.json`.
    fn parse(text: &str) -> Self {
        serde_json::from_str(text).expect("v1.expected.json decodes with today's types")
    }

    /// The entry of `poller`/`partition`.
    fn key(&self, poller: &str, partition: &str) -> &V1Key {
        self.keys
            .iter()
            .find(|k| k.poller == poller && k.partition == partition)
            .unwrap_or_else(|| panic!("v1.expected.json has no key {poller}/{partition}"))
    }
}

/// Migrates `store` (which holds the v1 fixture) twice, checks that today's code reads
/// everything v1 wrote, then that today's engine delivers the pending v1 events. `store_name`
/// labels the failures; `expected` is the text of the store's `v1.expected.json`.
pub(crate) async fn upgrade_and_check(store: Arc<dyn Store>, store_name: &str, expected: &str) {
    let expected = V1Dump::parse(expected);
    store
        .migrate()
        .await
        .unwrap_or_else(|e| panic!("[{store_name}] the first migrate of a v1 store failed: {e}"));
    store
        .migrate()
        .await
        .unwrap_or_else(|e| panic!("[{store_name}] the second migrate of a v1 store failed: {e}"));
    check_spelled_out_facts(&expected);
    for key in &expected.keys {
        check_reads(&*store, store_name, key).await;
    }
    check_delivery(store, store_name, &expected).await;
}

/// Compares everything today's code reads from one key with what v1 read from it.
async fn check_reads(store: &dyn Store, store_name: &str, v1: &V1Key) {
    let key = v1.key();
    let at = format!("[{store_name}] {key}");
    assert_eq!(
        store.load_state(&key).await.expect("load_state"),
        v1.state,
        "{at}: load_state differs from what v1 wrote"
    );
    assert_eq!(
        store.get_lease(&key).await.expect("get_lease"),
        v1.lease,
        "{at}: get_lease differs from the lease v1 held"
    );
    let identities = identities(store, &key).await;
    let v1_identities: Vec<String> = v1.items.keys().cloned().collect();
    assert_eq!(
        identities, v1_identities,
        "{at}: stream_identities differs from v1's snapshot"
    );
    let items: BTreeMap<String, ItemRow> = store
        .load_versions(&key, &identities)
        .await
        .expect("load_versions")
        .into_iter()
        .collect();
    assert_eq!(
        items, v1.items,
        "{at}: load_versions differs from v1's snapshot"
    );
    assert_eq!(
        store.load_pending(&key, 100).await.expect("load_pending"),
        v1.pending,
        "{at}: load_pending differs from v1's pending events"
    );
    assert_eq!(
        store
            .list_parked(&key, ParkedQuery::default())
            .await
            .expect("list_parked"),
        v1.parked,
        "{at}: list_parked differs from v1's parked rows"
    );
    for (url_hash, validator) in &v1.validators {
        assert_eq!(
            store
                .get_validator(&key, url_hash)
                .await
                .expect("get_validator")
                .as_ref(),
            Some(validator),
            "{at}: get_validator({url_hash}) differs from v1's"
        );
    }
    assert_eq!(
        store
            .read_log(&key, LogQuery::default(), 100)
            .await
            .expect("read_log"),
        v1.log,
        "{at}: read_log differs from v1's log"
    );
}

/// Every identity of `key`'s snapshot, streamed in batches of 2 (so the stream has several).
async fn identities(store: &dyn Store, key: &PKey) -> Vec<String> {
    let mut out = Vec::new();
    let mut stream = store.stream_identities(key, 2);
    while let Some(batch) = stream.next().await {
        out.extend(batch.expect("stream_identities"));
    }
    out
}

/// The subject and type of each row, in order.
fn subjects(rows: &[OutboxRow]) -> Vec<(&str, EventType)> {
    rows.iter()
        .map(|r| (r.event.subject.as_str(), r.event.event_type))
        .collect()
}

/// What the v1 scenario wrote, spelled out, so the comparison above cannot pass on an
/// expectations file that lost something.
fn check_spelled_out_facts(v1: &V1Dump) {
    let eu = v1.key("orders", "eu");
    let state = eu.state.as_ref().expect("orders/eu has a state");
    assert_eq!(state.sequence, 6);
    assert_eq!(
        state
            .lanes
            .live
            .as_ref()
            .and_then(|lane| lane.cursor.as_deref()),
        Some(r#"{"value":"2023-11-14T22:05:03.000Z","tieBreak":"o-5"}"#),
        "orders/eu: the timestamp cursor"
    );
    assert_eq!(state.schedule.next_due_at, Some(T0 + 900_000));
    assert_eq!(state.schedule.interval_ms, Some(300_000));
    assert_eq!(state.schedule.last_poll_at, Some(T1));
    assert_eq!(
        eu.lease,
        Some(Lease {
            owner: V1_OWNER.to_owned(),
            epoch: 3,
            expires_at: T2 + 30_000,
        })
    );
    assert_eq!(
        subjects(&eu.pending),
        [
            ("o-1", EventType::Updated),
            ("o-4", EventType::Created),
            ("o-5", EventType::Created)
        ]
    );
    let sequences: Vec<i64> = eu.pending.iter().map(|r| r.sequence).collect();
    assert_eq!(sequences, [4, 5, 6]);
    let o1 = &eu.pending[0];
    assert_eq!(
        o1.event.data.as_ref().map(|j| j.as_str()),
        Some(
            r#"{"customer":"cust-eu-o-1","id":"o-1","lines":[{"qty":3,"sku":"sku-o-1"}],"note":"Café ☕ \"changed\"\tagain","qty":3,"total":37.5,"updatedAt":"2023-11-14T22:05:01.000Z"}"#
        ),
        "orders/eu: the payload of o-1's update"
    );
    assert_eq!(
        o1.event.previous.as_ref().map(|j| j.as_str()),
        Some(
            r#"{"customer":"cust-eu-o-1","id":"o-1","lines":[{"qty":2,"sku":"sku-o-1"}],"note":"Café ☕ \"first\"\nline 2","qty":2,"total":25.0,"updatedAt":"2023-11-14T22:00:01.000Z"}"#
        ),
        "orders/eu: the previous payload of o-1's update (Retain::Payload)"
    );
    let o4 = &eu.pending[1];
    assert_eq!(
        (o4.attempts, o4.next_attempt_at),
        (1, Some(T2 + 2_000)),
        "orders/eu: o-4 failed once in v1"
    );
    assert_eq!(
        o4.last_error.as_ref().map(|e| e.message.as_str()),
        Some("connection reset by peer")
    );
    assert_eq!(eu.parked.len(), 2, "orders/eu: one poison, one invalid");
    let poison = &eu.parked[0];
    assert_eq!(poison.kind, ParkedKind::Poison);
    assert_eq!(poison.hold_key.as_deref(), Some("o-2"));
    assert_eq!(
        poison.event.as_ref().map(|e| e.subject.as_str()),
        Some("o-2")
    );
    assert_eq!(poison.id, poison.event.as_ref().expect("poison event").id);
    let invalid = &eu.parked[1];
    assert_eq!(invalid.kind, ParkedKind::Invalid);
    assert!(invalid.id.starts_with("invalid:"), "{}", invalid.id);
    assert_eq!(invalid.hold_key, None);
    assert!(
        invalid
            .item
            .as_ref()
            .is_some_and(|item| item.as_str().contains(r#""id":"o-bad""#)),
        "orders/eu: the quarantined item keeps its raw JSON"
    );
    assert_eq!(
        eu.items.keys().map(String::as_str).collect::<Vec<_>>(),
        ["o-1", "o-2", "o-3", "o-4", "o-5"]
    );
    assert!(eu.items.values().all(|row| row.payload.is_some()));
    assert_eq!(
        eu.items["o-1"].payload, o1.event.data,
        "orders/eu: the snapshot keeps o-1's latest payload"
    );
    assert_eq!(eu.validators.len(), 1);
    assert!(
        eu.validators
            .values()
            .all(|v| v.etag.as_deref() == Some(r#"W/"orders-eu-2""#) && v.stored_at == T1)
    );
    let logged: Vec<i64> = eu.log.iter().map(|e| e.sequence).collect();
    assert_eq!(logged, [1, 2, 3, 4, 5, 6], "orders/eu: every event logged");

    let us = v1.key("orders", "us");
    assert_eq!(
        subjects(&us.pending),
        [("u-1", EventType::Updated), ("u-3", EventType::Created)]
    );
    assert_eq!(
        us.items.keys().map(String::as_str).collect::<Vec<_>>(),
        ["u-1", "u-2", "u-3"]
    );
    assert!(us.parked.is_empty());
    assert_eq!(us.lease, None);
    assert_eq!(us.log.len(), 4);

    let catalog = v1.key("catalog", "");
    assert_eq!(
        subjects(&catalog.pending),
        [("c-3", EventType::Updated), ("c-2", EventType::Deleted)]
    );
    assert_eq!(
        catalog.pending[1].event.data.as_ref().map(|j| j.as_str()),
        Some(r#"{"name":"Teapot","price":1999,"sku":"c-2","tags":["v1","fixture"]}"#),
        "catalog: the delete carries the last payload (Retain::Payload)"
    );
    assert_eq!(
        catalog.items.keys().map(String::as_str).collect::<Vec<_>>(),
        ["c-1", "c-3"]
    );
    assert_eq!(catalog.log.len(), 5);
}

/// One delivery a handler saw.
#[derive(Clone, Debug)]
struct Delivered {
    /// The event's key.
    key: PKey,
    /// The event, as delivered.
    event: Event,
}

/// Records every lease the engine acquires, by key.
#[derive(Default)]
struct LeaseLog(Mutex<Vec<(PKey, i64)>>);

#[async_trait::async_trait]
impl Hooks for LeaseLog {
    async fn on_lease_acquired(&self, ctx: &HookContext, lease: &Lease) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).push((
            PKey::new(ctx.poller.as_str(), ctx.partition.as_str()),
            lease.epoch,
        ));
    }
}

/// The scenario's schedule (a fixed 5 minutes), as v1 used it.
fn schedule() -> ScheduleOptions {
    ScheduleOptions::default()
        .min(Duration::from_secs(300))
        .max(Duration::from_secs(600))
        .adaptive(false)
        .jitter(0.0)
}

/// The v1 scenario's two pollers, defined with today's API. Their fetch only counts its calls
/// (and lists nothing): at [`T_TEST`] no poller is due, so it must not be called.
fn pollers(fetches: &Arc<Mutex<u32>>) -> Vec<Poller> {
    let fetch = |fetches: Arc<Mutex<u32>>| {
        move |_ctx: FetchContext| {
            *fetches.lock().unwrap_or_else(PoisonError::into_inner) += 1;
            async move { Ok(Page::new(Vec::new()).has_more(false)) }
        }
    };
    let orders = Poller::builder::<serde_json::Value>("orders")
        .identity_field("id")
        .cursor(cursor::timestamp("updatedAt").tie_break("id"))
        .retain(Retain::Payload)
        .log(Duration::from_secs(7 * 24 * 3600))
        .schedule(schedule())
        .partitions(
            || async { Ok(vec![Partition::new("eu"), Partition::new("us")]) },
            Duration::from_secs(3600),
        )
        .fetch(fetch(Arc::clone(fetches)))
        .build()
        .expect("the orders poller");
    let catalog = Poller::builder::<serde_json::Value>("catalog")
        .identity_field("sku")
        .cursor(cursor::snapshot_diff())
        .retain(Retain::Payload)
        .log(Duration::from_secs(7 * 24 * 3600))
        .schedule(schedule())
        .fetch(fetch(Arc::clone(fetches)))
        .build()
        .expect("the catalog poller");
    vec![orders, catalog]
}

/// Today's engine, handlers attached, ticks once at [`T_TEST`]: it takes over the crashed v1
/// lease with the next epoch and delivers every pending v1 event, and nothing else changes.
async fn check_delivery(store: Arc<dyn Store>, store_name: &str, v1: &V1Dump) {
    let fetches = Arc::new(Mutex::new(0_u32));
    let leases = Arc::new(LeaseLog::default());
    let mut builder = Engine::builder(Arc::clone(&store))
        .clock(Arc::new(ManualClock::new(T_TEST)))
        .rng(Arc::new(SeededRng::new(7)))
        .hooks(leases.clone())
        .instance_id("today-reader");
    for poller in pollers(&fetches) {
        builder = builder.poller(poller);
    }
    let engine = builder.build().expect("today's engine over the v1 store");
    let delivered: Arc<Mutex<Vec<Delivered>>> = Arc::default();
    for poller in ["orders", "catalog"] {
        let delivered = Arc::clone(&delivered);
        engine
            .on(poller, move |event: Event, _ctx: HandlerContext| {
                let delivered = Arc::clone(&delivered);
                async move {
                    delivered
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(Delivered {
                            key: PKey::new(event.poller.as_str(), event.partition.as_str()),
                            event,
                        });
                    Ok(())
                }
            })
            .expect("a handler");
    }
    let tick = engine
        .tick(TickOptions::default())
        .await
        .unwrap_or_else(|e| panic!("[{store_name}] tick over the v1 store failed: {e}"));
    let errors: Vec<_> = tick.polled.iter().filter(|p| p.error.is_some()).collect();
    assert!(
        errors.is_empty(),
        "[{store_name}] the tick failed: {errors:?}"
    );
    assert_eq!(
        *fetches.lock().unwrap_or_else(PoisonError::into_inner),
        0,
        "[{store_name}] no poller was due: the tick only drained the v1 outboxes"
    );

    let delivered = delivered
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let total: usize = v1.keys.iter().map(|k| k.pending.len()).sum();
    assert_eq!(
        delivered.len(),
        total,
        "[{store_name}] every pending v1 event is delivered once: {delivered:?}"
    );
    assert_eq!(
        tick.delivered, total as u64,
        "[{store_name}] tick.delivered"
    );
    let mut epochs: HashMap<PKey, Vec<i64>> = HashMap::new();
    for (key, epoch) in leases
        .0
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
    {
        epochs.entry(key.clone()).or_default().push(*epoch);
    }
    for key in &v1.keys {
        let pkey = key.key();
        let at = format!("[{store_name}] {pkey}");
        let got: Vec<&Delivered> = delivered.iter().filter(|d| d.key == pkey).collect();
        let ids: Vec<&str> = got.iter().map(|d| d.event.id.as_str()).collect();
        let v1_ids: Vec<&str> = key.pending.iter().map(|r| r.event_id.as_str()).collect();
        assert_eq!(
            ids, v1_ids,
            "{at}: the pending v1 events, delivered in sequence order"
        );
        for (delivery, row) in got.iter().zip(&key.pending) {
            let mut expected = row.event.clone();
            expected.attempt = row.attempts + 1;
            assert_eq!(
                delivery.event, expected,
                "{at}: event {} is delivered as v1 stored it (payloads byte for byte), on attempt {}",
                row.event_id, expected.attempt
            );
        }
        assert_eq!(
            store.load_pending(&pkey, 100).await.expect("load_pending"),
            Vec::<OutboxRow>::new(),
            "{at}: the outbox is empty after the delivery"
        );
        // The v1 writer took two leases per key (phase 1, phase 2) and one more on orders/eu
        // (the crash): today's engine gets the next epoch, so no v1 lease passes the fence.
        let v1_epoch = if key.poller == "orders" && key.partition == "eu" {
            3
        } else {
            2
        };
        assert_eq!(
            epochs.get(&pkey).map(Vec::as_slice),
            Some(&[v1_epoch + 1][..]),
            "{at}: today's engine leases the key with the epoch after v1's"
        );
        assert_eq!(
            store.get_lease(&pkey).await.expect("get_lease"),
            None,
            "{at}: the engine released its lease"
        );
        // Delivering changes neither the parked rows (the poison keeps its hold), nor the
        // snapshot, the log, the cursor or the sequence.
        assert_eq!(
            store
                .list_parked(&pkey, ParkedQuery::default())
                .await
                .expect("list_parked"),
            key.parked,
            "{at}: parked rows after the delivery"
        );
        let identities = identities(&*store, &pkey).await;
        let items: BTreeMap<String, ItemRow> = store
            .load_versions(&pkey, &identities)
            .await
            .expect("load_versions")
            .into_iter()
            .collect();
        assert_eq!(items, key.items, "{at}: snapshot after the delivery");
        assert_eq!(
            store
                .read_log(&pkey, LogQuery::default(), 100)
                .await
                .expect("read_log"),
            key.log,
            "{at}: log after the delivery"
        );
        let state = store
            .load_state(&pkey)
            .await
            .expect("load_state")
            .expect("state after the delivery");
        let v1_state = key.state.as_ref().expect("v1 state");
        assert_eq!(
            (&state.lanes, state.sequence, state.created_at),
            (&v1_state.lanes, v1_state.sequence, v1_state.created_at),
            "{at}: cursor and sequence after the delivery"
        );
    }
}
