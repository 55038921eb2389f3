//! The suite catches broken stores: each deliberately wrong store below fails the case named for
//! its defect, while the honest `MemoryStore` passes every case.

use std::sync::Arc;

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use watukuy_conformance::{CaseContext, CaseError, Fresh, Harness, Outcome, Report, run_all};
use watukuy_core::{
    Result,
    store::{Capabilities, CommitBatch, Lease, OutboxRow, PKey, Store},
};
use watukuy_store_memory::MemoryStore;
use watukuy_testkit::{Defect, FaultyStore};

/// The one thing a broken store gets wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flaw {
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

/// A broken store: a `MemoryStore` behind a [`FaultyStore`] with this defect.
struct Broken(Flaw);

impl Broken {
    /// The current lease if `lease` has its owner: "checks the owner only".
    async fn forge(store: &dyn Store, key: &PKey, lease: &Lease) -> Result<Lease> {
        Ok(match store.get_lease(key).await? {
            Some(current) if current.owner == lease.owner => current,
            _ => lease.clone(),
        })
    }
}

#[async_trait::async_trait]
impl Defect for Broken {
    fn capabilities(&self, inner: &dyn Store) -> Capabilities {
        Capabilities::default().with_log(inner.capabilities().log && self.0 != Flaw::NoLog)
    }

    fn stream_identities<'a>(
        &'a self,
        inner: &'a dyn Store,
        key: &'a PKey,
        batch_size: usize,
    ) -> BoxStream<'a, Result<Vec<String>>> {
        let flaw = self.0;
        if !matches!(
            flaw,
            Flaw::IdentitiesDescending | Flaw::IdentitiesInUtf16Order
        ) {
            return inner.stream_identities(key, batch_size);
        }
        // Reads the whole snapshot, reorders it and hands it out in batches.
        let all = async move {
            let batches: Vec<Vec<String>> =
                inner.stream_identities(key, 1000).try_collect().await?;
            let mut all: Vec<String> = batches.into_iter().flatten().collect();
            match flaw {
                Flaw::IdentitiesDescending => all.sort_by(|a, b| b.cmp(a)),
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

    async fn commit_poll(
        &self,
        inner: &dyn Store,
        key: &PKey,
        lease: &Lease,
        batch: &CommitBatch,
    ) -> Result<()> {
        if let Flaw::CommitNotAtomic = self.0
            && let Some(current) = inner.get_lease(key).await?
        {
            let snapshot = CommitBatch::default()
                .upserts(batch.upserts.clone())
                .deletes(batch.deletes.clone());
            inner.commit_poll(key, &current, &snapshot).await?;
        }
        inner.commit_poll(key, lease, batch).await
    }

    async fn load_pending(
        &self,
        inner: &dyn Store,
        key: &PKey,
        limit: usize,
    ) -> Result<Vec<OutboxRow>> {
        let rows = inner.load_pending(key, limit).await?;
        Ok(match self.0 {
            Flaw::PendingFilteredByNextAttempt => rows
                .into_iter()
                .filter(|r| r.next_attempt_at.is_none_or(|t| t <= STORE_NOW))
                .collect(),
            _ => rows,
        })
    }

    async fn ack_events(
        &self,
        inner: &dyn Store,
        key: &PKey,
        lease: &Lease,
        ids: &[String],
    ) -> Result<()> {
        let lease = match self.0 {
            Flaw::AckIgnoresEpoch => Self::forge(inner, key, lease).await?,
            _ => lease.clone(),
        };
        inner.ack_events(key, &lease, ids).await
    }
}

/// A fresh broken store.
fn broken(flaw: Flaw) -> Arc<dyn Store> {
    view(&(Arc::new(MemoryStore::new()) as Arc<dyn Store>), flaw)
}

/// A broken view of `inner`.
fn view(inner: &Arc<dyn Store>, flaw: Flaw) -> Arc<dyn Store> {
    Arc::new(FaultyStore::new(Arc::clone(inner)).with_defect(Arc::new(Broken(flaw))))
}

struct BrokenHarness(Flaw);

#[async_trait::async_trait]
impl Harness for BrokenHarness {
    fn name(&self) -> String {
        format!("{:?}", self.0)
    }

    /// A broken view of a new memory store; another instance is another view of its data.
    async fn fresh(&self, _ctx: CaseContext) -> std::result::Result<Fresh, CaseError> {
        let inner: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let flaw = self.0;
        Ok(Fresh::new(view(&inner, flaw))
            .with_instances(move || std::future::ready(Ok(view(&inner, flaw)))))
    }
}

async fn report(flaw: Flaw) -> Report {
    let report = run_all(BrokenHarness(flaw)).await;
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
    let report = report(Flaw::None).await;
    assert!(report.is_ok(), "{report}");
    // Only the cases that need a backend's own client (rows written beneath the store, a
    // namespace nobody migrated) do not apply to a store in memory.
    let skipped: Vec<String> = report
        .outcomes
        .iter()
        .filter(|(_, outcome)| matches!(outcome, Outcome::Skipped(_)))
        .map(|(case, _)| format!("{}::{}", case.module, case.name))
        .collect();
    assert_eq!(
        skipped,
        [
            "setup::concurrent_migrations_of_new_instances_succeed",
            "setup::a_newer_schema_is_refused",
            "setup::undecodable_rows_are_corrupt_errors",
        ],
        "{report}"
    );
    assert_eq!(report.passed() + skipped.len(), report.outcomes.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_ignores_the_epoch_on_ack_is_caught() {
    assert_fails(
        &report(Flaw::AckIgnoresEpoch).await,
        "fencing::ack_events_rejects_stale_lease",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_filters_pending_rows_by_next_attempt_is_caught() {
    assert_fails(
        &report(Flaw::PendingFilteredByNextAttempt).await,
        "outbox::load_pending_orders_by_sequence",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_whose_commit_is_not_atomic_is_caught() {
    assert_fails(
        &report(Flaw::CommitNotAtomic).await,
        "fencing::commit_poll_rejects_stale_lease",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_streaming_identities_out_of_byte_order_is_caught() {
    for defect in [Flaw::IdentitiesDescending, Flaw::IdentitiesInUtf16Order] {
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

    use watukuy_core::EventType;
    use watukuy_testkit::world::{POLLER, StrategyKind, World};

    warnings();
    for (defect, deletes) in [(Flaw::None, 2), (Flaw::IdentitiesDescending, 0)] {
        let world = World::new(30, 10).unwrap();
        let store = broken(defect);
        let poller = world
            .poller(StrategyKind::SnapshotDiff)
            .delete_confirmation(watukuy_core::poller::DeleteConfirmation::Immediate)
            .build()
            .unwrap();
        let (engine, recorder) = world.recorded_engine(Arc::clone(&store), poller).unwrap();
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
            .map(|e| e.subject.to_string())
            .collect();
        assert_eq!(deleted.len(), deletes, "{defect:?}: {deleted:?}");
        let key = watukuy_core::store::PKey::new(POLLER, "");
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

    use watukuy_testkit::world::{StrategyKind, World};

    let world = World::new(1, 10).unwrap();
    let store = broken(Flaw::NoLog);
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
