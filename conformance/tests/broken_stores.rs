//! The suite catches broken stores: each deliberately wrong store below fails the case named for
//! its defect, while the honest `MemoryStore` passes every case.

use std::collections::HashMap;
use std::sync::Arc;

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use watukuy_conformance::{CaseContext, CaseError, Fresh, Harness, Outcome, Report, run_all};
use watukuy_core::{
    Capabilities, CommitBatch, ItemRow, KeyCounts, Lease, LogQuery, LoggedEvent, OutboxRow, PKey,
    ParkedAction, ParkedQuery, ParkedRow, PollerState, Result, SerializedError, StatePatch, Store,
    Validator,
};
use watukuy_store_memory::MemoryStore;

/// The one thing a broken store gets wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Defect {
    /// None: the store is honest.
    None,
    /// `ack_events` checks the owner but not the epoch.
    AckIgnoresEpoch,
    /// `load_pending` hides rows whose retry is not due yet by the store's own idea of "now".
    PendingFilteredByNextAttempt,
    /// `commit_poll` writes the snapshot before checking the lease for the rest of the batch.
    CommitNotAtomic,
    /// `stream_identities` yields the largest identity first (a store paging `ORDER BY
    /// identity DESC`).
    IdentitiesDescending,
    /// `stream_identities` orders by UTF-16 code units, as a store on a UTF-16 string type
    /// would: the same as byte order for most text, not above U+FFFF.
    IdentitiesInUtf16Order,
    /// An honest store without a replay log (`capabilities().log` is false).
    NoLog,
}

/// The store's own clock, which the contract forbids it to have.
const STORE_NOW: i64 = 1_767_225_600_000 + 60_000;

struct Broken {
    inner: MemoryStore,
    defect: Defect,
}

impl Broken {
    /// The current lease if `lease` has its owner: "checks the owner only".
    async fn forge(&self, key: &PKey, lease: &Lease) -> Result<Lease> {
        Ok(match self.inner.get_lease(key).await? {
            Some(current) if current.owner == lease.owner => current,
            _ => lease.clone(),
        })
    }
}

#[async_trait::async_trait]
#[deny(clippy::missing_trait_methods)]
impl Store for Broken {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            log: self.defect != Defect::NoLog,
        }
    }
    async fn migrate(&self) -> Result<()> {
        self.inner.migrate().await
    }
    async fn close(&self) -> Result<()> {
        self.inner.close().await
    }
    async fn acquire_lease(
        &self,
        key: &PKey,
        owner: &str,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<Option<Lease>> {
        self.inner.acquire_lease(key, owner, ttl_ms, now_ms).await
    }
    async fn renew_lease(
        &self,
        key: &PKey,
        lease: &Lease,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<bool> {
        self.inner.renew_lease(key, lease, ttl_ms, now_ms).await
    }
    async fn release_lease(&self, key: &PKey, lease: &Lease) -> Result<()> {
        self.inner.release_lease(key, lease).await
    }
    async fn get_lease(&self, key: &PKey) -> Result<Option<Lease>> {
        self.inner.get_lease(key).await
    }
    async fn load_state(&self, key: &PKey) -> Result<Option<PollerState>> {
        self.inner.load_state(key).await
    }
    async fn save_state(&self, key: &PKey, lease: &Lease, patch: &StatePatch) -> Result<()> {
        self.inner.save_state(key, lease, patch).await
    }
    async fn save_state_unfenced(&self, key: &PKey, patch: &StatePatch) -> Result<()> {
        self.inner.save_state_unfenced(key, patch).await
    }
    async fn list_keys(&self, poller: Option<&str>) -> Result<Vec<PKey>> {
        self.inner.list_keys(poller).await
    }
    async fn delete_key(&self, key: &PKey) -> Result<()> {
        self.inner.delete_key(key).await
    }
    async fn clear_items(&self, key: &PKey) -> Result<()> {
        self.inner.clear_items(key).await
    }
    async fn load_versions(
        &self,
        key: &PKey,
        identities: &[String],
    ) -> Result<HashMap<String, ItemRow>> {
        self.inner.load_versions(key, identities).await
    }
    fn stream_identities<'a>(
        &'a self,
        key: &'a PKey,
        batch_size: usize,
    ) -> BoxStream<'a, Result<Vec<String>>> {
        let defect = self.defect;
        if !matches!(
            defect,
            Defect::IdentitiesDescending | Defect::IdentitiesInUtf16Order
        ) {
            return self.inner.stream_identities(key, batch_size);
        }
        // Reads the whole snapshot, reorders it and hands it out in batches.
        let all = async move {
            let batches: Vec<Vec<String>> = self
                .inner
                .stream_identities(key, 1000)
                .try_collect()
                .await?;
            let mut all: Vec<String> = batches.into_iter().flatten().collect();
            match defect {
                Defect::IdentitiesDescending => all.sort_by(|a, b| b.cmp(a)),
                _ => all.sort_by(|a, b| a.encode_utf16().cmp(b.encode_utf16())),
            }
            Ok::<_, watukuy_core::Error>(all)
        };
        futures::stream::once(all)
            .flat_map(move |all| {
                let batches: Vec<Result<Vec<String>>> = match all {
                    Ok(all) => all
                        .chunks(batch_size.max(1))
                        .map(|c| Ok(c.to_vec()))
                        .collect(),
                    Err(error) => vec![Err(error)],
                };
                futures::stream::iter(batches)
            })
            .boxed()
    }
    async fn counts(&self, key: &PKey) -> Result<KeyCounts> {
        self.inner.counts(key).await
    }
    async fn commit_poll(&self, key: &PKey, lease: &Lease, batch: &CommitBatch) -> Result<()> {
        if let Defect::CommitNotAtomic = self.defect {
            if let Some(current) = self.inner.get_lease(key).await? {
                let snapshot = CommitBatch::default()
                    .upserts(batch.upserts.clone())
                    .deletes(batch.deletes.clone());
                self.inner.commit_poll(key, &current, &snapshot).await?;
            }
        }
        self.inner.commit_poll(key, lease, batch).await
    }
    async fn load_pending(&self, key: &PKey, limit: usize) -> Result<Vec<OutboxRow>> {
        let rows = self.inner.load_pending(key, limit).await?;
        Ok(match self.defect {
            Defect::PendingFilteredByNextAttempt => rows
                .into_iter()
                .filter(|r| r.next_attempt_at.is_none_or(|t| t <= STORE_NOW))
                .collect(),
            _ => rows,
        })
    }
    async fn ack_events(&self, key: &PKey, lease: &Lease, ids: &[String]) -> Result<()> {
        let lease = match self.defect {
            Defect::AckIgnoresEpoch => self.forge(key, lease).await?,
            _ => lease.clone(),
        };
        self.inner.ack_events(key, &lease, ids).await
    }
    async fn record_attempt(
        &self,
        key: &PKey,
        lease: &Lease,
        id: &str,
        error: &SerializedError,
        next_attempt_at: Option<i64>,
    ) -> Result<()> {
        self.inner
            .record_attempt(key, lease, id, error, next_attempt_at)
            .await
    }
    async fn park_event(&self, key: &PKey, lease: &Lease, row: &ParkedRow) -> Result<()> {
        self.inner.park_event(key, lease, row).await
    }
    async fn list_parked(&self, key: &PKey, query: ParkedQuery) -> Result<Vec<ParkedRow>> {
        self.inner.list_parked(key, query).await
    }
    async fn resolve_parked(
        &self,
        key: &PKey,
        ids: &[String],
        action: ParkedAction,
    ) -> Result<u64> {
        self.inner.resolve_parked(key, ids, action).await
    }
    async fn held_keys(&self, key: &PKey) -> Result<Vec<String>> {
        self.inner.held_keys(key).await
    }
    async fn get_validator(&self, key: &PKey, url_hash: &str) -> Result<Option<Validator>> {
        self.inner.get_validator(key, url_hash).await
    }
    async fn read_log(
        &self,
        key: &PKey,
        query: LogQuery,
        limit: usize,
    ) -> Result<Vec<LoggedEvent>> {
        self.inner.read_log(key, query, limit).await
    }
    async fn prune_log(&self, key: &PKey, older_than: i64) -> Result<u64> {
        self.inner.prune_log(key, older_than).await
    }
}

struct BrokenHarness(Defect);

#[async_trait::async_trait]
impl Harness for BrokenHarness {
    fn name(&self) -> String {
        format!("{:?}", self.0)
    }

    async fn fresh(&self, _ctx: CaseContext) -> std::result::Result<Fresh, CaseError> {
        Ok(Fresh::new(Arc::new(Broken {
            inner: MemoryStore::new(),
            defect: self.0,
        })))
    }
}

async fn report(defect: Defect) -> Report {
    let report = run_all(BrokenHarness(defect)).await;
    println!("{report}");
    report
}

fn assert_fails(report: &Report, case: &str) {
    match report.outcome(case) {
        Some(Outcome::Failed(message)) => println!("{case} caught it: {message}"),
        other => panic!(
            "{case} should fail for {}, got {other:?}\n{report}",
            report.harness
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_honest_store_passes_every_case() {
    let report = report(Defect::None).await;
    assert!(report.is_ok(), "{report}");
    assert_eq!(report.passed(), report.outcomes.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_ignores_the_epoch_on_ack_is_caught() {
    assert_fails(
        &report(Defect::AckIgnoresEpoch).await,
        "fencing::ack_events_rejects_stale_lease",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_filters_pending_rows_by_next_attempt_is_caught() {
    assert_fails(
        &report(Defect::PendingFilteredByNextAttempt).await,
        "outbox::load_pending_orders_by_sequence",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_whose_commit_is_not_atomic_is_caught() {
    assert_fails(
        &report(Defect::CommitNotAtomic).await,
        "fencing::commit_poll_rejects_stale_lease",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_streaming_identities_out_of_byte_order_is_caught() {
    for defect in [Defect::IdentitiesDescending, Defect::IdentitiesInUtf16Order] {
        assert_fails(
            &report(defect).await,
            "items::stream_identities_in_byte_order",
        );
    }
}

/// The warnings of `watukuy_core::full_scan`, recorded by a process-wide subscriber with the
/// thread that logged them. A global subscriber rather than `set_default`: a callsite first
/// hit on another test's thread while a scoped subscriber is being installed can be cached as
/// uninteresting, and its events lost.
type Recorded = Arc<std::sync::Mutex<Vec<(std::thread::ThreadId, String)>>>;

static WARNINGS: std::sync::OnceLock<Recorded> = std::sync::OnceLock::new();

fn warnings() -> &'static Recorded {
    use tracing_subscriber::layer::SubscriberExt;
    WARNINGS.get_or_init(|| {
        let recorded = Recorded::default();
        let layer = Warnings(Arc::clone(&recorded));
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
            .expect("no other global subscriber in this test binary");
        recorded
    })
}

struct Warnings(Recorded);

struct Text<'a>(&'a mut String);

impl tracing::field::Visit for Text<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!("{}={value:?} ", field.name()));
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Warnings {
    fn register_callsite(
        &self,
        metadata: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        if metadata.target() == "watukuy_core::full_scan"
            && *metadata.level() == tracing::Level::WARN
        {
            tracing::subscriber::Interest::always()
        } else {
            tracing::subscriber::Interest::never()
        }
    }

    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut text = String::new();
        event.record(&mut Text(&mut text));
        self.0
            .lock()
            .unwrap()
            .push((std::thread::current().id(), text));
    }
}

/// A full scan over a store whose `stream_identities` goes backwards cannot tell what is
/// missing: it deletes nothing, keeps the snapshot and says which contract point was broken;
/// the honest store deletes the two removed items.
#[tokio::test]
async fn a_full_scan_over_a_store_streaming_backwards_deletes_nothing_and_warns() {
    use std::time::Duration;

    use watukuy_conformance::world::{POLLER, Recorder, StrategyKind, World};
    use watukuy_core::EventType;

    warnings();
    for (defect, deletes) in [(Defect::None, 2), (Defect::IdentitiesDescending, 0)] {
        let world = World::new(30, 10).unwrap();
        let store: Arc<dyn Store> = Arc::new(Broken {
            inner: MemoryStore::new(),
            defect,
        });
        let poller = world
            .poller(StrategyKind::SnapshotDiff)
            .delete_confirmation(watukuy_core::DeleteConfirmation::Immediate)
            .build()
            .unwrap();
        let engine = world
            .engine(Arc::clone(&store), "node-a", poller, 1)
            .unwrap();
        let recorder = Recorder::default();
        engine.on(POLLER, recorder.handler()).unwrap();
        world.tick(&engine).await.unwrap();
        assert_eq!(recorder.events().len(), 30, "{defect:?}");

        world.api.remove("item-003");
        world.api.remove("item-027");
        world.advance(Duration::from_secs(60));
        let result = world.tick(&engine).await.unwrap();
        assert!(
            result.polled.iter().all(|p| p.error.is_none()),
            "{result:?}"
        );
        let deleted: Vec<String> = recorder
            .events()
            .iter()
            .filter(|e| e.event_type == EventType::Deleted)
            .map(|e| e.subject.clone())
            .collect();
        assert_eq!(deleted.len(), deletes, "{defect:?}: {deleted:?}");
        let key = watukuy_core::PKey::new(POLLER, "");
        assert_eq!(
            store.counts(&key).await.map(|c| c.items).unwrap(),
            30 - deletes as u64,
            "{defect:?}"
        );
    }
    // This test's engines run on its own thread (a current-thread runtime); other tests of this
    // binary run the suite on the same broken store on theirs.
    let me = std::thread::current().id();
    let warnings: Vec<String> = warnings()
        .lock()
        .unwrap()
        .iter()
        .filter(|(thread, _)| *thread == me)
        .map(|(_, text)| text.clone())
        .collect();
    let broke: Vec<&String> = warnings
        .iter()
        .filter(|w| w.contains("stream_identities broke its contract (point 2"))
        .collect();
    assert_eq!(
        broke.len(),
        1,
        "one warning, for the broken store: {warnings:?}"
    );
    assert!(
        broke[0].contains("items/"),
        "it names the key: {}",
        broke[0]
    );
}

/// An engine refuses, when it is built, a poller that keeps a replay log on a store that has
/// none (the error names the option and the poller); the same poller without `log_retention`
/// builds.
#[test]
fn a_poller_with_a_log_is_refused_on_a_store_without_one() {
    use std::time::Duration;

    use watukuy_conformance::world::{StrategyKind, World};

    let world = World::new(1, 10).unwrap();
    let store: Arc<dyn Store> = Arc::new(Broken {
        inner: MemoryStore::new(),
        defect: Defect::NoLog,
    });
    let logged = world
        .poller(StrategyKind::Timestamp)
        .log(Duration::from_secs(3600))
        .build()
        .unwrap();
    let error = world
        .engine(Arc::clone(&store), "node-a", logged, 1)
        .unwrap_err();
    assert_eq!(error.code(), watukuy_core::ErrorCode::Config, "{error}");
    let message = error.to_string();
    assert!(
        message.contains("log_retention") && message.contains("items"),
        "{message}"
    );
    let plain = world.poller(StrategyKind::Timestamp).build().unwrap();
    assert!(world.engine(store, "node-a", plain, 1).is_ok());
}
