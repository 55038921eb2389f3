//! Model-based test of delivery (guarantees G1, G3, G5, G7, G9) with `proptest-state-machine`:
//! random sequences of commits, drains, handler failures, crashes, lease steals and
//! park/retry/discard run against the real [`Dispatcher`] over `MemoryStore` and against a pure
//! reference model of delivery; after every step the delivered events, the outbox and the
//! parked rows must match the model exactly. Failing sequences shrink to a minimal one; the
//! regressions proptest finds are kept in `model.proptest-regressions` and replayed first, and
//! the interesting sequences are also pinned as explicit tests below.
//!
//! The model is exact for one delivery at a time (concurrency 1), crash and steal included.
//! With concurrency 3 (no crash, no steal) deliveries of different keys interleave, so only each
//! key's own deliveries are compared.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::Config;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest, prop_state_machine};
use watukuy_conformance::cases::fixtures::event;
use watukuy_core::{
    DeliveryOptions, Event, HandlerContext, HandlerError, HandlerResult,
    backoff::Backoff,
    clock::{Clock, ManualClock},
    delivery::{Dispatcher, DrainContext},
    rng::SeededRng,
    store::{CommitBatch, Lease, OutboxRow, PKey, ParkedQuery, StatePatch, Store},
};
use watukuy_store_memory::MemoryStore;
use watukuy_testkit::FaultyStore;

/// Ordering keys (subjects) the model uses.
const KEYS: usize = 3;
/// Delivery attempts before an event is parked.
const ATTEMPTS: u32 = 3;
/// Outbox rows per dispatcher slice (small, so slices and window widening are exercised).
const BATCH: usize = 3;
/// The window never grows past this many rows; the model keeps the outbox within it so every
/// deliverable row is always within reach.
const MAX_PENDING: usize = BATCH * 16;
/// Lease TTL.
const TTL_MS: i64 = 10_000;
/// Each drain runs this long after the previous step: longer than the largest backoff (4 s), so
/// every scheduled retry is due.
const DRAIN_ADVANCE: Duration = Duration::from_secs(5);

fn subject(key: u8) -> String {
    format!("k{key}")
}

fn key_index(subject: &str) -> u8 {
    subject
        .strip_prefix('k')
        .and_then(|n| n.parse().ok())
        .unwrap_or(u8::MAX)
}

// ----- the reference model -----

/// What the model believes about the current instance's lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LeaseState {
    /// The instance holds the key.
    Held,
    /// Another owner took the key; the instance does not know yet.
    Stolen,
    /// The instance learnt it lost the lease (a fenced write was rejected): it re-acquires.
    Lost,
    /// The instance died: a new one takes over after the TTL.
    Dead,
}

/// An outbox or parked event in the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Ev {
    seq: i64,
    key: u8,
    attempts: u32,
}

/// The pure reference model of delivery.
#[derive(Clone, Debug)]
struct Model {
    concurrency: usize,
    next_seq: i64,
    lease: LeaseState,
    pending: Vec<Ev>,
    parked: Vec<Ev>,
    fail: [u32; KEYS],
    crash_on: Option<u8>,
    /// Every delivery the consumer must have seen, in order: (key, sequence).
    delivered: Vec<(u8, i64)>,
    discarded: BTreeSet<i64>,
}

/// One step of a test sequence.
#[derive(Clone, Debug)]
enum Step {
    /// Commit events for these keys (one `commit_poll`).
    Commit(Vec<u8>),
    /// The key's next `n` handler attempts fail.
    FailNext { key: u8, times: u32 },
    /// The instance dies right after the handler returns for this key's next event (before the
    /// ack).
    CrashAfterHandler(u8),
    /// The instance dies between operations; its lease lingers until the TTL.
    Crash,
    /// Another owner takes the key once the instance's lease expired.
    StealLease,
    /// One drain, after the clock moved past every retry.
    Drain,
    /// `retry_parked` for the key's parked events.
    RetryParked(u8),
    /// `discard_parked` for the key's parked events.
    DiscardParked(u8),
}

impl Model {
    /// The start: `concurrency` handlers at a time, the lease held, nothing committed.
    fn new(concurrency: usize) -> Self {
        Self {
            concurrency,
            next_seq: 0,
            lease: LeaseState::Held,
            pending: Vec::new(),
            parked: Vec::new(),
            fail: [0; KEYS],
            crash_on: None,
            delivered: Vec::new(),
            discarded: BTreeSet::new(),
        }
    }

    fn keys_held(&self) -> BTreeSet<u8> {
        self.parked.iter().map(|e| e.key).collect()
    }

    /// The instance holds a valid lease again (a new instance after a crash).
    fn ensure_lease(&mut self) {
        if matches!(self.lease, LeaseState::Dead | LeaseState::Lost) {
            self.lease = LeaseState::Held;
        }
    }

    fn commit(&mut self, keys: &[u8]) {
        self.ensure_lease();
        if self.lease == LeaseState::Stolen {
            // The fenced commit is rejected: nothing persisted, and now the instance knows.
            self.lease = LeaseState::Lost;
            return;
        }
        for key in keys {
            self.next_seq += 1;
            self.pending.push(Ev {
                seq: self.next_seq,
                key: *key,
                attempts: 0,
            });
        }
    }

    /// The dispatcher's drain, one group at a time: slices of `BATCH` rows (plus one) in sequence order,
    /// groups by key in order of first appearance, held and blocked keys skipped, the window
    /// doubling (up to 16 slices) when a full slice had nothing eligible, until a pass makes no
    /// progress.
    fn drain(&mut self) {
        self.ensure_lease();
        let stolen = self.lease == LeaseState::Stolen;
        let mut window = BATCH;
        let mut blocked: BTreeSet<u8> = BTreeSet::new();
        loop {
            // One row more than the window: a full read says more rows follow.
            let rows: Vec<Ev> = self.pending.iter().take(window + 1).copied().collect();
            if rows.is_empty() {
                return;
            }
            let slice_full = rows.len() > window;
            let held = self.keys_held();
            let mut groups: Vec<(u8, Vec<Ev>)> = Vec::new();
            for row in rows {
                if held.contains(&row.key) || blocked.contains(&row.key) {
                    continue;
                }
                match groups.iter_mut().find(|(k, _)| *k == row.key) {
                    Some((_, rows)) => rows.push(row),
                    None => groups.push((row.key, vec![row])),
                }
            }
            if groups.is_empty() {
                if slice_full && window < MAX_PENDING {
                    window = (window * 2).min(MAX_PENDING);
                    continue;
                }
                return;
            }
            let mut progress = false;
            for (key, rows) in groups {
                for row in rows {
                    let k = usize::from(key);
                    if self.crash_on == Some(key) {
                        // Delivered, then the process died before the ack.
                        self.crash_on = None;
                        self.delivered.push((key, row.seq));
                        self.lease = LeaseState::Dead;
                        return;
                    }
                    if self.fail[k] > 0 {
                        self.fail[k] -= 1;
                        if stolen {
                            // record_attempt / park_event is fenced out: nothing written.
                            self.lease = LeaseState::Lost;
                            return;
                        }
                        let attempt = row.attempts + 1;
                        let index = self.index_of(row.seq);
                        if attempt >= ATTEMPTS {
                            let mut parked = self.pending.remove(index);
                            parked.attempts = attempt;
                            self.parked.push(parked);
                        } else {
                            self.pending[index].attempts = attempt;
                        }
                        blocked.insert(key);
                        progress = true;
                        break;
                    }
                    self.delivered.push((key, row.seq));
                    if stolen {
                        // Delivered, but the ack is fenced out: it stays pending.
                        self.lease = LeaseState::Lost;
                        return;
                    }
                    let index = self.index_of(row.seq);
                    self.pending.remove(index);
                    progress = true;
                }
            }
            if !progress {
                return;
            }
        }
    }

    fn index_of(&self, seq: i64) -> usize {
        self.pending
            .iter()
            .position(|e| e.seq == seq)
            .unwrap_or(usize::MAX)
    }

    fn retry_parked(&mut self, key: u8) {
        let (moved, kept): (Vec<Ev>, Vec<Ev>) = self.parked.iter().partition(|e| e.key == key);
        self.parked = kept;
        for mut ev in moved {
            ev.attempts = 0;
            self.pending.push(ev);
        }
        self.pending.sort_by_key(|e| e.seq);
    }

    fn discard_parked(&mut self, key: u8) {
        let (gone, kept): (Vec<Ev>, Vec<Ev>) = self.parked.iter().partition(|e| e.key == key);
        self.parked = kept;
        self.discarded.extend(gone.iter().map(|e| e.seq));
    }
}

struct DeliveryModel;

impl ReferenceStateMachine for DeliveryModel {
    type State = Model;
    type Transition = Step;

    fn init_state() -> BoxedStrategy<Model> {
        prop_oneof![3 => Just(1_usize), 1 => Just(3_usize)]
            .prop_map(Model::new)
            .boxed()
    }

    fn transitions(state: &Model) -> BoxedStrategy<Step> {
        let key = 0..u8::try_from(KEYS).unwrap_or(1);
        let exact = state.concurrency == 1;
        let mut choices = vec![
            (
                4,
                proptest::collection::vec(key.clone(), 1..=3)
                    .prop_map(Step::Commit)
                    .boxed(),
            ),
            (
                2,
                (key.clone(), 1..=3_u32)
                    .prop_map(|(key, times)| Step::FailNext { key, times })
                    .boxed(),
            ),
            (5, Just(Step::Drain).boxed()),
            (1, key.clone().prop_map(Step::RetryParked).boxed()),
            (1, key.clone().prop_map(Step::DiscardParked).boxed()),
        ];
        if exact {
            choices.push((1, key.prop_map(Step::CrashAfterHandler).boxed()));
            choices.push((1, Just(Step::Crash).boxed()));
            choices.push((1, Just(Step::StealLease).boxed()));
        }
        proptest::strategy::Union::new_weighted(choices).boxed()
    }

    fn preconditions(state: &Model, step: &Step) -> bool {
        match step {
            Step::Commit(keys) => state.pending.len() + keys.len() <= MAX_PENDING - BATCH,
            Step::CrashAfterHandler(_) => state.crash_on.is_none() && state.concurrency == 1,
            Step::Crash | Step::StealLease => {
                state.lease == LeaseState::Held && state.concurrency == 1
            }
            Step::FailNext { key, .. } => state.fail[usize::from(*key)] < 6,
            Step::RetryParked(key) | Step::DiscardParked(key) => {
                state.parked.iter().any(|e| e.key == *key)
            }
            Step::Drain => true,
        }
    }

    fn apply(mut state: Model, step: &Step) -> Model {
        match step {
            Step::Commit(keys) => state.commit(keys),
            Step::FailNext { key, times } => state.fail[usize::from(*key)] += times,
            Step::CrashAfterHandler(key) => state.crash_on = Some(*key),
            Step::Crash => state.lease = LeaseState::Dead,
            Step::StealLease => state.lease = LeaseState::Stolen,
            Step::Drain => state.drain(),
            Step::RetryParked(key) => state.retry_parked(*key),
            Step::DiscardParked(key) => state.discard_parked(*key),
        }
        state
    }
}

// ----- the system under test -----

/// What the handlers of every instance share: the failure script and the delivery log.
#[derive(Default)]
struct Script {
    fail: [u32; KEYS],
    crash_on: Option<u8>,
    delivered: Vec<(u8, i64, String)>,
}

/// The real dispatcher over `MemoryStore`, one instance at a time.
struct Sut {
    runtime: tokio::runtime::Runtime,
    store: Arc<MemoryStore>,
    clock: ManualClock,
    rng_seed: u32,
    script: Arc<Mutex<Script>>,
    key: PKey,
    concurrency: usize,
    instance: u32,
    faulty: Arc<FaultyStore>,
    dispatcher: Dispatcher,
    lease: Lease,
    /// The instance learnt it lost its lease.
    lost: bool,
}

fn handler(
    script: Arc<Mutex<Script>>,
    faulty: Arc<FaultyStore>,
) -> impl Fn(Event, HandlerContext) -> futures::future::Ready<HandlerResult> + Send + Sync + 'static
{
    move |event: Event, _ctx: HandlerContext| {
        let key = key_index(&event.subject);
        let mut script = script.lock().unwrap_or_else(PoisonError::into_inner);
        if faulty.is_dead() {
            return futures::future::ready(Err(HandlerError::transient("dead instance")));
        }
        if script.crash_on == Some(key) {
            script.crash_on = None;
            script
                .delivered
                .push((key, event.sequence, event.id.to_string()));
            faulty.kill("crash after the handler");
            return futures::future::ready(Ok(()));
        }
        if let Some(fail) = script.fail.get_mut(usize::from(key)).filter(|n| **n > 0) {
            *fail -= 1;
            return futures::future::ready(Err(HandlerError::transient("scripted failure")));
        }
        script
            .delivered
            .push((key, event.sequence, event.id.to_string()));
        futures::future::ready(Ok(()))
    }
}

impl Sut {
    fn new(concurrency: usize) -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let store = Arc::new(MemoryStore::new());
        let clock = ManualClock::new(1_767_225_600_000);
        let script = Arc::new(Mutex::new(Script::default()));
        let key = PKey::new("model", "");
        let (faulty, dispatcher) = Self::instance(&store, &clock, &script, concurrency, 1);
        let lease = runtime
            .block_on(faulty.acquire_lease(&key, "inst-1", TTL_MS, clock.now_ms()))
            .expect("acquire")
            .expect("a free key");
        Self {
            runtime,
            store,
            clock,
            rng_seed: 1,
            script,
            key,
            concurrency,
            instance: 1,
            faulty,
            dispatcher,
            lease,
            lost: false,
        }
    }

    fn instance(
        store: &Arc<MemoryStore>,
        clock: &ManualClock,
        script: &Arc<Mutex<Script>>,
        concurrency: usize,
        n: u32,
    ) -> (Arc<FaultyStore>, Dispatcher) {
        let faulty = Arc::new(FaultyStore::new(Arc::clone(store) as Arc<dyn Store>));
        let options = DeliveryOptions::default()
            .attempts(ATTEMPTS)
            .backoff(Backoff::new(
                Duration::from_secs(1),
                2.0,
                Duration::from_secs(4),
            ))
            .concurrency(concurrency)
            .hold_key(true);
        let dispatcher = Dispatcher::new(
            "model",
            Arc::clone(&faulty) as Arc<dyn Store>,
            Arc::new(clock.clone()),
            Arc::new(SeededRng::new(n)),
            options,
            BATCH,
        )
        .expect("valid options");
        dispatcher
            .on(handler(Arc::clone(script), Arc::clone(&faulty)))
            .expect("one consumer");
        (faulty, dispatcher)
    }

    /// Before a fenced operation: a dead instance is replaced and a lost lease re-acquired,
    /// both after the TTL.
    fn ensure_lease(&mut self) {
        if self.faulty.is_dead() {
            self.instance += 1;
            self.rng_seed += 1;
            let (faulty, dispatcher) = Self::instance(
                &self.store,
                &self.clock,
                &self.script,
                self.concurrency,
                self.rng_seed,
            );
            self.faulty = faulty;
            self.dispatcher = dispatcher;
            self.lost = true;
        }
        if self.lost {
            self.clock.advance(Duration::from_millis(
                u64::try_from(TTL_MS + 1_000).unwrap_or(0),
            ));
            let owner = format!("inst-{}", self.instance);
            self.lease = self
                .runtime
                .block_on(
                    self.faulty
                        .acquire_lease(&self.key, &owner, TTL_MS, self.clock.now_ms()),
                )
                .expect("acquire")
                .expect("the key is free after the TTL");
            self.lost = false;
        }
    }

    fn commit(&mut self, keys: &[u8]) {
        self.ensure_lease();
        let state = self
            .runtime
            .block_on(self.store.load_state(&self.key))
            .expect("load_state");
        let mut seq = state.map_or(0, |s| s.sequence);
        let now = self.clock.now_ms();
        let events: Vec<OutboxRow> = keys
            .iter()
            .map(|key| {
                seq += 1;
                OutboxRow::pending(
                    event(&self.key, &format!("e{seq}"), seq, &subject(*key)),
                    now,
                )
            })
            .collect();
        let batch = CommitBatch::default()
            .state_patch(StatePatch {
                sequence: Some(seq),
                updated_at: Some(now),
                ..StatePatch::default()
            })
            .events(events);
        match self
            .runtime
            .block_on(self.faulty.commit_poll(&self.key, &self.lease, &batch))
        {
            Ok(()) => {}
            Err(watukuy_core::Error::LeaseLost { .. }) => self.lost = true,
            Err(other) => panic!("commit failed: {other}"),
        }
    }

    fn drain(&mut self) {
        self.clock.advance(DRAIN_ADVANCE);
        self.ensure_lease();
        let ctx = DrainContext::default();
        match self
            .runtime
            .block_on(self.dispatcher.drain(&self.key, &self.lease, &ctx))
        {
            Ok(_) => {}
            Err(watukuy_core::Error::LeaseLost { .. }) => self.lost = true,
            Err(_) if self.faulty.is_dead() => {}
            Err(other) => panic!("drain failed: {other}"),
        }
    }

    fn steal(&mut self) {
        self.clock
            .advance(Duration::from_millis(u64::try_from(TTL_MS).unwrap_or(0)));
        let stolen = self
            .runtime
            .block_on(
                self.store
                    .acquire_lease(&self.key, "thief", TTL_MS, self.clock.now_ms()),
            )
            .expect("acquire");
        assert!(stolen.is_some(), "the expired lease can be taken");
    }

    fn parked_ids(&self, key: u8) -> Vec<String> {
        self.runtime
            .block_on(self.store.list_parked(&self.key, ParkedQuery::default()))
            .expect("list_parked")
            .into_iter()
            .filter(|row| {
                row.event
                    .as_ref()
                    .is_some_and(|e| key_index(&e.subject) == key)
            })
            .map(|row| row.id)
            .collect()
    }

    /// Retries or discards every event parked for `key`, and checks that each one was.
    fn resolve_parked(&self, key: u8, action: watukuy_core::store::ParkedAction) {
        let ids = self.parked_ids(key);
        let resolved = self
            .runtime
            .block_on(self.store.resolve_parked(&self.key, &ids, action))
            .unwrap_or_else(|e| panic!("resolve_parked {action:?}: {e}"));
        assert_eq!(resolved, ids.len() as u64);
    }

    fn delivered(&self) -> Vec<(u8, i64, String)> {
        self.script
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .delivered
            .clone()
    }
}

struct DeliveryTest;

impl StateMachineTest for DeliveryTest {
    type SystemUnderTest = Sut;
    type Reference = DeliveryModel;

    fn init_test(model: &Model) -> Sut {
        Sut::new(model.concurrency)
    }

    fn apply(mut sut: Sut, _model: &Model, step: Step) -> Sut {
        match step {
            Step::Commit(keys) => sut.commit(&keys),
            Step::FailNext { key, times } => {
                sut.script
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .fail[usize::from(key)] += times;
            }
            Step::CrashAfterHandler(key) => {
                sut.script
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .crash_on = Some(key);
            }
            Step::Crash => sut.faulty.kill("crash"),
            Step::StealLease => sut.steal(),
            Step::Drain => sut.drain(),
            Step::RetryParked(key) => {
                sut.resolve_parked(key, watukuy_core::store::ParkedAction::Retry)
            }
            Step::DiscardParked(key) => {
                sut.resolve_parked(key, watukuy_core::store::ParkedAction::Discard);
            }
        }
        sut
    }

    fn check_invariants(sut: &Sut, model: &Model) {
        let delivered = sut.delivered();
        // G2: an event id always names the same sequence.
        for (_, seq, id) in &delivered {
            assert_eq!(id, &format!("e{seq}"), "event ids are stable");
        }
        let actual: Vec<(u8, i64)> = delivered.iter().map(|(k, s, _)| (*k, *s)).collect();
        if model.concurrency == 1 {
            assert_eq!(actual, model.delivered, "deliveries differ from the model");
        } else {
            let per_key = |log: &[(u8, i64)]| {
                let mut map: BTreeMap<u8, Vec<i64>> = BTreeMap::new();
                for (k, s) in log {
                    map.entry(*k).or_default().push(*s);
                }
                map
            };
            assert_eq!(
                per_key(&actual),
                per_key(&model.delivered),
                "per-key deliveries differ from the model"
            );
        }
        // G3, independently of the model: per key, sequences never go back; a redelivery only
        // repeats the newest.
        let mut newest: HashMap<u8, i64> = HashMap::new();
        for (key, seq) in &actual {
            if let Some(last) = newest.get(key) {
                assert!(seq >= last, "k{key}: sequence {seq} delivered after {last}");
            }
            newest.insert(*key, *seq);
        }
        // The outbox and the parked rows are what the model says.
        let pending = sut
            .runtime
            .block_on(sut.store.load_pending(&sut.key, 10_000))
            .expect("load_pending");
        let pending: Vec<(i64, u32)> = pending.iter().map(|r| (r.sequence, r.attempts)).collect();
        let expected: Vec<(i64, u32)> = model.pending.iter().map(|e| (e.seq, e.attempts)).collect();
        assert_eq!(pending, expected, "the outbox differs from the model");
        let mut parked: Vec<i64> = sut
            .runtime
            .block_on(sut.store.list_parked(&sut.key, ParkedQuery::default()))
            .expect("list_parked")
            .iter()
            .filter_map(|row| row.event.as_ref().map(|e| e.sequence))
            .collect();
        parked.sort_unstable();
        let mut expected: Vec<i64> = model.parked.iter().map(|e| e.seq).collect();
        expected.sort_unstable();
        assert_eq!(parked, expected, "the parked rows differ from the model");
        let held: BTreeSet<String> = sut
            .runtime
            .block_on(sut.store.held_keys(&sut.key))
            .expect("held_keys")
            .into_iter()
            .collect();
        let expected: BTreeSet<String> = model.keys_held().into_iter().map(subject).collect();
        assert_eq!(held, expected, "held keys differ from the model");
    }

    /// G1 and liveness: with every failure cleared, parked events retried and a valid lease,
    /// a drain (two if the lease turns out stolen) delivers every committed, undiscarded event
    /// at least once and empties the outbox.
    fn teardown(mut sut: Sut, model: Model) {
        {
            let mut script = sut.script.lock().unwrap_or_else(PoisonError::into_inner);
            script.fail = [0; KEYS];
            script.crash_on = None;
        }
        for key in 0..u8::try_from(KEYS).unwrap_or(0) {
            let ids = sut.parked_ids(key);
            sut.runtime
                .block_on(sut.store.resolve_parked(
                    &sut.key,
                    &ids,
                    watukuy_core::store::ParkedAction::Retry,
                ))
                .expect("retry_parked");
        }
        sut.drain();
        if sut.lost || sut.faulty.is_dead() {
            sut.drain();
        }
        let left = sut
            .runtime
            .block_on(sut.store.counts(&sut.key))
            .expect("counts")
            .pending;
        assert_eq!(left, 0, "the outbox is empty after a clean drain");
        let delivered: BTreeSet<i64> = sut.delivered().iter().map(|(_, s, _)| *s).collect();
        for seq in 1..=model.next_seq {
            if !model.discarded.contains(&seq) {
                assert!(delivered.contains(&seq), "event e{seq} was never delivered");
            }
        }
    }
}

prop_state_machine! {
    #![proptest_config(Config {
        cases: 256,
        max_shrink_iters: 4096,
        .. Config::default()
    })]

    #[test]
    fn delivery_matches_the_reference_model(sequential 1..48 => DeliveryTest);
}

// ----- pinned sequences -----

fn run(concurrency: usize, steps: Vec<Step>) {
    let mut model = Model::new(concurrency);
    let mut sut = DeliveryTest::init_test(&model);
    for step in steps {
        model = DeliveryModel::apply(model, &step);
        sut = DeliveryTest::apply(sut, &model, step);
        DeliveryTest::check_invariants(&sut, &model);
    }
    DeliveryTest::teardown(sut, model);
}

#[test]
fn a_crash_after_the_handler_redelivers_the_same_event_first() {
    run(
        1,
        vec![
            Step::Commit(vec![0, 0, 1]),
            Step::CrashAfterHandler(0),
            Step::Drain,
            Step::Drain,
        ],
    );
}

#[test]
fn a_stolen_lease_delivers_at_most_one_event_and_writes_nothing() {
    run(
        1,
        vec![
            Step::Commit(vec![0, 1]),
            Step::StealLease,
            Step::FailNext { key: 0, times: 1 },
            Step::Drain,
            Step::Commit(vec![2]),
            Step::StealLease,
            Step::Drain,
            Step::Drain,
        ],
    );
}

#[test]
fn a_parked_key_holds_its_successors_until_retried_or_discarded() {
    run(
        1,
        vec![
            Step::Commit(vec![0, 1, 0]),
            Step::FailNext { key: 0, times: 3 },
            Step::Drain,
            Step::Drain,
            Step::Drain,
            Step::Commit(vec![0]),
            Step::Drain,
            Step::RetryParked(0),
            Step::FailNext { key: 0, times: 3 },
            Step::Drain,
            Step::Drain,
            Step::Drain,
            Step::DiscardParked(0),
            Step::Drain,
        ],
    );
}

#[test]
fn a_parked_key_behind_a_full_window_does_not_hide_other_keys() {
    let mut steps = vec![
        Step::Commit(vec![0, 0, 0]),
        Step::Commit(vec![0, 0, 0]),
        Step::Commit(vec![0, 0, 0]),
        Step::Commit(vec![1, 2]),
        Step::FailNext { key: 0, times: 3 },
    ];
    steps.extend([Step::Drain, Step::Drain, Step::Drain, Step::Drain]);
    run(1, steps.clone());
    run(3, steps);
}
