//! The [`Store`] contract: everything the engine persists goes through it.
//!
//! Every method's documentation carries a numbered **Contract**. Each bullet is proven by exactly
//! one conformance case of `watukuy-conformance`, named in the bullet as module::case, so a
//! store that passes `store_tests!` keeps every promise below.
//!
//! Rules every implementation follows:
//! - **Fencing.** A *fenced* method takes the caller's [`Lease`] and, in the same atomic unit as its
//!   write, checks that the key's current lease has the same owner and epoch. On mismatch (a stale,
//!   released, foreign or made-up lease) it writes nothing and fails with
//!   [`Error::LeaseLost`](crate::Error::LeaseLost) carrying the key and the *rejected* epoch.
//!   Expiry alone does not fail the fence: only another acquisition does.
//! - **Time is a parameter.** Stores never read a clock; `now_ms` arrives from the engine.
//! - **No driver types cross this boundary.** Driver errors are mapped once, per backend, into
//!   [`Error::Store`](crate::Error::Store) with a transient/permanent flag.
//! - **Unfenced admin writes never touch the lease.**
//! - **In-process stores hand out copies**, never references into their own state.
//!
//! # Stability for store authors
//!
//! This module is the extension contract: a store written outside this repository depends on
//! it, so it moves by its own rules. Versions are 0.x, where the minor is the breaking number.
//!
//! A custom store may rely on, within one minor version (0.2.z):
//! - The required methods of [`Store`], their signatures, and every numbered **Contract** bullet
//!   staying as written. A patch release may add a conformance case that pins an existing bullet
//!   more closely: a store that fails it was already wrong.
//! - New methods arriving only as *provided* ones whose default is correct for every store that
//!   keeps the existing contract (as [`Store::claim`] was added, built on `acquire_lease`,
//!   `load_state` and `load_pending`); override one for speed, never for correctness.
//! - The JSON shapes of [`PollerState`], [`Event`](crate::Event), [`SerializedError`] and the
//!   other row payloads: what a store persisted as text reads back in every later version, so
//!   stored data needs no migration on an upgrade of this crate.
//! - [`StoreErrorKind`], [`ParkedKind`] and the other `#[non_exhaustive]` types may gain variants
//!   and fields in a patch release; build them with their constructors and match them with a `_`
//!   arm.
//!
//! Breaking for store authors, so only in a new minor version with a CHANGELOG entry: a new
//! required method, a changed signature, a contract bullet that asks more of a store, a new
//! field in a row type built with a struct literal (the exhaustive ones: [`OutboxRow`],
//! [`ItemRow`], [`ParkedRow`], …), and a change to a persisted JSON shape that old text does not
//! read as. `.ci/semver-check` holds every published crate to this on each change.

use std::collections::HashMap;

use async_trait::async_trait;
use futures::stream::BoxStream;

use crate::error::Result;
pub use crate::error::StoreErrorKind;
pub use crate::model::{
    AttemptRecord, Capabilities, Circuit, Claim, CommitBatch, EventCounts, FailureClass,
    FailureDetails, ItemRow, KeyCounts, LaneCursor, Lanes, Lease, LogQuery, LoggedEvent, OutboxRow,
    OutboxStatus, PKey, ParkReason, ParkedAction, ParkedError, ParkedKind, ParkedQuery, ParkedRow,
    PollSummary, PollerState, RateLimitInfo, RateLimitSource, ScheduleState, SerializedError,
    StatePatch, UrlValidator, ValidationIssue, Validator,
};

/// The default batch size of [`Store::stream_identities`].
pub const DEFAULT_IDENTITY_BATCH: usize = 1000;

/// Persistence for pollers: leases, state, the item snapshot, the outbox, parked rows,
/// HTTP validators and the replay log.
///
/// Object safe: the engine holds an `Arc<dyn Store>`, so wrappers and runtime choice of backend
/// are plain values.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// What this store supports. Provided: no replay log; a store that keeps one says so and
    /// implements [`read_log`](Self::read_log) and [`prune_log`](Self::prune_log).
    ///
    /// **Contract**
    /// 1. Returns the same value on every call, before and after `migrate`
    ///    (`setup::exposes_capabilities`).
    fn capabilities(&self) -> Capabilities {
        Capabilities { log: false }
    }

    /// Creates or upgrades the store's schema. Provided: nothing to do.
    ///
    /// **Contract**
    /// 1. Idempotent: calling it again changes nothing and the store reads as empty
    ///    (`setup::migrate_is_idempotent`).
    /// 2. Instances with connections of their own may migrate a new namespace at once: every
    ///    call succeeds and they share one working store
    ///    (`setup::concurrent_migrations_of_new_instances_succeed`).
    /// 3. A schema newer than the build knows is refused with [`Error::Store`](crate::Error::Store)
    ///    of kind [`StoreErrorKind::Schema`], permanent, naming the version found
    ///    (`setup::a_newer_schema_is_refused`).
    async fn migrate(&self) -> Result<()> {
        Ok(())
    }

    /// Releases the store's resources (connections, file handles). The engine never calls it;
    /// the application does, once, when it shuts down. Provided: nothing to release.
    ///
    /// **Contract**
    /// 1. Idempotent; what was committed before it stays committed; a call after it either
    ///    works (the store reopened lazily) or fails with [`Error::Store`](crate::Error::Store),
    ///    never panics or hangs (`setup::close_is_idempotent_and_keeps_data`).
    async fn close(&self) -> Result<()> {
        Ok(())
    }

    /// Takes the lease on `key` for `owner` until `now_ms + ttl_ms`.
    ///
    /// **Contract**
    /// 1. On a key never leased, returns `Lease { owner, epoch: 1, expires_at: now + ttl }`
    ///    (`leases::acquire_on_empty_key_returns_epoch_1`).
    /// 2. Returns `None`, changing nothing, while another owner's lease is unexpired
    ///    (`expires_at > now`) (`leases::other_owner_cannot_acquire_valid_lease`).
    /// 3. The same owner re-acquiring gets the next epoch and a new expiry; its old lease stops
    ///    passing the fence (`leases::same_owner_reacquire_bumps_epoch`).
    /// 4. At or after `expires_at` another owner takes it with the next epoch
    ///    (`leases::expired_lease_is_stolen_with_next_epoch`).
    /// 5. Epochs are strictly increasing per key across every acquisition, releases included
    ///    (`leases::release_then_acquire_keeps_epoch_monotonic`).
    /// 6. Keys are independent: a new partition starts at epoch 1 with nothing stored, and a lease
    ///    or a write on one partition never touches another (`isolation::partitions_are_isolated`).
    async fn acquire_lease(
        &self,
        key: &PKey,
        owner: &str,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<Option<Lease>>;

    /// Takes the lease like [`acquire_lease`](Self::acquire_lease) and then reads what a run
    /// needs to begin: the key's state and whether its outbox holds a pending row. Every run of
    /// the engine starts here. Provided: `acquire_lease`, then `load_state` and
    /// `load_pending(key, 1)`, three calls; a store overrides it to do the same in one round
    /// trip where it can.
    ///
    /// **Contract**
    /// 1. Takes the lease exactly as `acquire_lease` would (the same epoch counter), and returns
    ///    the state and pending flag `load_state` and `load_pending` give right after it
    ///    (`claims::claim_takes_the_lease_and_reads_state_and_outbox`).
    /// 2. Returns `None`, changing nothing, while another owner's lease is unexpired
    ///    (`claims::claim_is_refused_while_another_owner_holds_the_lease`).
    /// 3. The reads happen after the acquisition: they see every write committed before the
    ///    lease was taken, in particular the last fenced write of the holder it superseded
    ///    (`claims::claim_sees_the_superseded_holders_last_write`).
    async fn claim(
        &self,
        key: &PKey,
        owner: &str,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<Option<Claim>> {
        let Some(lease) = self.acquire_lease(key, owner, ttl_ms, now_ms).await? else {
            return Ok(None);
        };
        let state = self.load_state(key).await?;
        let pending = !self.load_pending(key, 1).await?.is_empty();
        Ok(Some(Claim::new(lease, state, pending)))
    }

    /// Extends the caller's lease to `now_ms + ttl_ms` if it is still the current one.
    ///
    /// **Contract**
    /// 1. Returns `true` and moves the expiry when owner and epoch match; `false`, changing nothing,
    ///    for a stale epoch, another owner or another key (`leases::renew_succeeds_for_current_epoch_only`).
    async fn renew_lease(
        &self,
        key: &PKey,
        lease: &Lease,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<bool>;

    /// Gives the lease up if it is still the current one; otherwise does nothing.
    ///
    /// **Contract**
    /// 1. After a release, `get_lease` is `None` and the epoch counter is kept
    ///    (`leases::release_then_acquire_keeps_epoch_monotonic`).
    /// 2. A stale epoch, another owner or another key is a silent no-op
    ///    (`leases::release_with_stale_lease_is_noop`).
    /// 3. A released lease no longer passes the fence (`fencing::released_lease_fails_fence`).
    /// 4. Leases and fences hold across instances of one store (two pools or clients on the same
    ///    data): a takeover by one fences the other, and of two instances racing for an expired
    ///    lease exactly one wins (`fencing::a_second_instance_shares_data_and_is_fenced`).
    async fn release_lease(&self, key: &PKey, lease: &Lease) -> Result<()>;

    /// The current holder of `key`, expired or not, or `None` if unowned.
    ///
    /// **Contract**
    /// 1. `None` before any acquisition, the holder afterwards (`leases::get_lease_is_none_then_holder`).
    async fn get_lease(&self, key: &PKey) -> Result<Option<Lease>>;

    /// The key's state, or `None` if it was never saved.
    ///
    /// **Contract**
    /// 1. `None` for an unknown key, even after a lease was acquired on it
    ///    (`state::load_state_is_none_for_unknown_key`).
    /// 2. Stored data that does not decode (another program wrote it, a disk damaged it) is
    ///    [`Error::Store`](crate::Error::Store) of kind [`StoreErrorKind::Corrupt`], permanent,
    ///    here and in every read that meets it (`load_versions`, `load_pending`), never a panic
    ///    (`setup::undecodable_rows_are_corrupt_errors`).
    async fn load_state(&self, key: &PKey) -> Result<Option<PollerState>>;

    /// Fenced: applies `patch` (top-level replace, see [`PollerState::apply`]). Provided: a
    /// [`commit_poll`](Self::commit_poll) of an empty batch carrying the patch; override it only
    /// for a cheaper write with the same fence.
    ///
    /// **Contract**
    /// 1. Round-trips every field, nested JSON included; a first save creates the zero state with
    ///    `created_at = patch.updated_at` (`state::save_state_round_trips_every_field`).
    /// 2. Fenced: a stale lease, another owner or a made-up epoch fails with `LeaseLost` and
    ///    changes nothing (`fencing::save_state_rejects_stale_lease`).
    /// 3. A lease that was never acquired fails the fence and creates neither state nor lease
    ///    (`fencing::fenced_writes_without_lease_are_rejected`).
    /// 4. The `LeaseLost` error carries the key and the rejected epoch
    ///    (`fencing::lease_lost_carries_key_and_epoch`).
    async fn save_state(&self, key: &PKey, lease: &Lease, patch: &StatePatch) -> Result<()> {
        let batch = CommitBatch::default().state_patch(patch.clone());
        self.commit_poll(key, lease, &batch).await
    }

    /// Unfenced: applies `patch` without a lease (pause, resume, trigger, reset, partition removal).
    ///
    /// **Contract**
    /// 1. Creates the zero state with `created_at = patch.updated_at` and creates no lease
    ///    (`state::unfenced_save_creates_zero_state`).
    /// 2. Without `updated_at`, a new state has `created_at = 0`
    ///    (`state::unfenced_save_without_updated_at_uses_zero`).
    /// 3. Patches replace top-level fields wholesale and keep `created_at`
    ///    (`state::patches_replace_top_level_fields`).
    async fn save_state_unfenced(&self, key: &PKey, patch: &StatePatch) -> Result<()>;

    /// Every key ever written (by a lease acquisition, a save or a commit) and not deleted since,
    /// optionally only those of one poller, matched exactly (any order).
    ///
    /// **Contract**
    /// 1. Lists keys created by lease acquisition or by an unfenced save; the filter keeps one
    ///    poller; an unknown poller gives an empty list (`state::list_keys_filters_by_poller`).
    async fn list_keys(&self, poller: Option<&str>) -> Result<Vec<PKey>>;

    /// Unfenced: removes everything of `key`: state, lease, items, outbox, parked, validators, log.
    /// Only the epoch counter survives, so a lease taken before the delete can never pass the
    /// fence of the key when it comes back.
    ///
    /// **Contract**
    /// 1. Leaves other keys intact, is idempotent, and the key leaves `list_keys`
    ///    (`state::delete_key_removes_everything`).
    /// 2. Pollers are independent: deleting one poller's key leaves another poller's key with the
    ///    same partition intact (`isolation::pollers_are_isolated`).
    /// 3. Epochs keep increasing across a delete: the next acquisition gets a higher epoch than any
    ///    before, and a lease from before the delete fails the fence (`leases::epochs_survive_delete_key`).
    async fn delete_key(&self, key: &PKey) -> Result<()>;

    /// Unfenced: drops the item snapshot of `key` and nothing else.
    ///
    /// **Contract**
    /// 1. Outbox, parked rows, state and lease are untouched; clearing an unknown key is fine
    ///    (`state::clear_items_drops_snapshot_only`).
    async fn clear_items(&self, key: &PKey) -> Result<()>;

    /// The stored rows of the given identities; absent identities are left out.
    ///
    /// **Contract**
    /// 1. Returns present rows only, payload only when stored (absent and JSON `null` differ),
    ///    `version: None` round-trips, empty input gives an empty map
    ///    (`items::load_versions_returns_present_rows`).
    async fn load_versions(
        &self,
        key: &PKey,
        identities: &[String],
    ) -> Result<HashMap<String, ItemRow>>;

    /// Every identity of the snapshot exactly once, in ascending byte order, in batches of at
    /// most `batch_size`.
    ///
    /// A full scan merges its listing against this stream while it pages through the API, so
    /// it holds one stored batch instead of a set of everything it listed. It keeps the stream
    /// open across the cycle's pages and commits pages between two batches; each batch should
    /// be a short read of its own (keyset pagination: the identities after the last one
    /// yielded), not a transaction or a cursor held open for the whole stream.
    ///
    /// **Contract**
    /// 1. Batches are full except the last; together they cover the snapshot exactly once; an
    ///    empty snapshot yields no batch (`items::stream_identities_batches`).
    /// 2. Identities come in strictly ascending byte order — the order of their UTF-8 bytes,
    ///    which is Unicode code point order and `str`'s `Ord` — across the whole stream, not
    ///    only within a batch: `"B" < "a"`, `"10" < "9"`, `"a b" < "ab"`, `"z" < "é"`,
    ///    `"\u{FFFD}" < "😀"` (not a locale collation, not UTF-16 order). This holds while the
    ///    snapshot changes under an open stream: an identity committed after the stream yielded
    ///    a higher one is not yielded, and every identity stored throughout is yielded once
    ///    (`items::stream_identities_in_byte_order`). A store that breaks this makes full scans
    ///    emit no deletes (the engine logs a warning naming this point).
    fn stream_identities<'a>(
        &'a self,
        key: &'a PKey,
        batch_size: usize,
    ) -> BoxStream<'a, Result<Vec<String>>>;

    /// How many snapshot items, pending outbox rows and parked rows the key has, read together.
    ///
    /// **Contract**
    /// 1. `items` counts the snapshot after upserts and deletes (`items::count_items_counts_snapshot`).
    /// 2. `pending` counts pending rows only; acks decrement it
    ///    (`outbox::count_pending_counts_pending_only`).
    /// 3. `parked` counts every kind; re-parking an id replaces the row
    ///    (`parked::count_parked_counts_every_kind`).
    async fn counts(&self, key: &PKey) -> Result<KeyCounts>;

    /// Fenced, atomic: applies one page's work in ONE transaction.
    ///
    /// Upserts and deletes of items, outbox rows (insert or replace by event id; a row with
    /// status `Delivered` is not pending), parked rows (insert or replace by id), HTTP validators
    /// (insert or replace by URL hash), a log append of the events when `batch.log` (one
    /// [`LoggedEvent`] per outbox row, keyed by its sequence, with the row's `created_at`), and
    /// the state patch. All or nothing.
    ///
    /// **Contract**
    /// 1. Applies every part together; the state equals the zero state plus the patch
    ///    (`commit_poll::applies_everything_together`).
    /// 2. Appends to the log only when `batch.log` (`commit_poll::appends_log_only_when_asked`).
    /// 3. Re-committing an event id overwrites the row, attempts included
    ///    (`commit_poll::recommitting_event_overwrites_row`).
    /// 4. An empty batch still applies the patch (`commit_poll::empty_batch_applies_patch`).
    /// 5. Fenced: with a bad lease nothing of the batch lands (`fencing::commit_poll_rejects_stale_lease`).
    /// 6. Upserts replace existing rows and deletes remove them; deleting an identity that never
    ///    existed is fine (`items::upserts_replace_and_deletes_remove`).
    /// 7. Writes `batch.validators` with the rest, replacing a URL hash's stored validators whole
    ///    and leaving other URL hashes alone; with a bad lease none of them lands
    ///    (`commit_poll::writes_validators_with_the_page`).
    /// 8. JSON comes back byte for byte (key order, spacing, escapes, number spellings, repeated
    ///    keys, `\u0000`) in payloads, events, parked rows and logs, and text with a raw NUL
    ///    character in error messages (`commit_poll::json_and_text_come_back_verbatim`).
    async fn commit_poll(&self, key: &PKey, lease: &Lease, batch: &CommitBatch) -> Result<()>;

    /// Up to `limit` pending rows in sequence order. Not filtered by `next_attempt_at`: the
    /// dispatcher decides what a future retry time means.
    ///
    /// **Contract**
    /// 1. Sequence order, honours `limit` (0 gives none), ignores `next_attempt_at`, sees only its
    ///    key (`outbox::load_pending_orders_by_sequence`).
    async fn load_pending(&self, key: &PKey, limit: usize) -> Result<Vec<OutboxRow>>;

    /// Fenced: removes delivered rows (or marks them delivered). Unknown ids are ignored.
    ///
    /// **Contract**
    /// 1. Removes the rows; unknown ids and an empty list are no-ops
    ///    (`outbox::ack_removes_rows_ignores_unknown`).
    /// 2. Fenced (`fencing::ack_events_rejects_stale_lease`).
    async fn ack_events(&self, key: &PKey, lease: &Lease, ids: &[String]) -> Result<()>;

    /// Fenced: records a failed attempt: `attempts + 1`, the error and the next attempt time.
    ///
    /// **Contract**
    /// 1. Increments attempts, stores the error and `next_attempt_at` (which may be `None`);
    ///    an unknown id is a no-op (`outbox::record_attempt_updates_row`).
    /// 2. Fenced (`fencing::record_attempt_rejects_stale_lease`).
    async fn record_attempt(
        &self,
        key: &PKey,
        lease: &Lease,
        id: &str,
        error: &SerializedError,
        next_attempt_at: Option<i64>,
    ) -> Result<()>;

    /// Fenced: inserts or replaces a parked row and removes the outbox row of its event, if any.
    ///
    /// **Contract**
    /// 1. The outbox row of `row.event` is removed; `held_keys` reflects `hold_key`; a row without
    ///    an event leaves the outbox alone (`parked::park_event_removes_outbox_row_and_holds`).
    /// 2. Fenced (`fencing::park_event_rejects_stale_lease`).
    async fn park_event(&self, key: &PKey, lease: &Lease, row: &ParkedRow) -> Result<()>;

    /// Parked rows ordered by `parked_at`, then id.
    ///
    /// **Contract**
    /// 1. Filters by kind, orders by `parked_at` then id, honours the limit
    ///    (`parked::list_parked_filters_orders_limits`).
    async fn list_parked(&self, key: &PKey, query: ParkedQuery) -> Result<Vec<ParkedRow>>;

    /// Unfenced: resolves parked rows by id; returns how many rows it resolved (an id counts
    /// once however often it is listed).
    ///
    /// [`ParkedAction::Retry`] moves poison rows back to the outbox as pending and releases their
    /// hold: the new outbox row is `{ event_id, sequence: event.sequence, attempts: 0,
    /// next_attempt_at: None, last_error: None, created_at: parked_at }`; invalid rows and
    /// unknown ids are ignored. [`ParkedAction::Discard`] deletes the rows, of any kind.
    ///
    /// **Contract**
    /// 1. Retry: exactly that row appears, the parked row and its hold are gone, invalid rows and
    ///    unknown ids are ignored, the count is returned (`parked::retry_parked_moves_poison_back`).
    /// 2. Discard: removes rows, counts each once, updates held keys
    ///    (`parked::discard_parked_returns_count`).
    async fn resolve_parked(&self, key: &PKey, ids: &[String], action: ParkedAction)
    -> Result<u64>;

    /// The distinct non-null hold keys of parked rows. Provided: read from
    /// [`list_parked`](Self::list_parked) (every row); a store with many parked rows overrides it
    /// with a query of the distinct keys (the dispatcher reads it once per drain).
    ///
    /// **Contract**
    /// 1. Reflects parking, retrying and discarding (`parked::park_event_removes_outbox_row_and_holds`).
    async fn held_keys(&self, key: &PKey) -> Result<Vec<String>> {
        let rows = self.list_parked(key, ParkedQuery::default()).await?;
        let held: std::collections::BTreeSet<String> =
            rows.into_iter().filter_map(|row| row.hold_key).collect();
        Ok(held.into_iter().collect())
    }

    /// The pending rows of [`load_pending`](Self::load_pending) and the hold keys of
    /// [`held_keys`](Self::held_keys), read in one round trip where the backend allows. A drain
    /// needs both before its first slice. Provided: the two calls one after the other; a store
    /// overrides it with one statement, script or connection hop.
    ///
    /// **Contract**
    /// 1. Returns exactly what `load_pending(key, limit)` and `held_keys(key)` return (the hold
    ///    keys in any order, also when no row is pending) (`outbox::load_pending_with_holds_reads_both`).
    async fn load_pending_with_holds(
        &self,
        key: &PKey,
        limit: usize,
    ) -> Result<(Vec<OutboxRow>, Vec<String>)> {
        let rows = self.load_pending(key, limit).await?;
        Ok((rows, self.held_keys(key).await?))
    }

    /// The validators stored for a URL hash.
    ///
    /// **Contract**
    /// 1. `None` until set; round-trips (all-`None` fields allowed); overwrites; URLs are
    ///    independent (`validators::validators_round_trip`).
    async fn get_validator(&self, key: &PKey, url_hash: &str) -> Result<Option<Validator>>;

    /// Log entries matching `query`, in sequence order, at most `limit`. Provided: none (a store
    /// without a log).
    ///
    /// **Contract**
    /// 1. `sequence > after_sequence`, in sequence order (`log::read_log_after_sequence`).
    /// 2. `created_at` within `[from_time, to_time]` inclusive, honours `limit` (0 gives none)
    ///    (`log::read_log_time_range_and_limit`).
    async fn read_log(
        &self,
        key: &PKey,
        query: LogQuery,
        limit: usize,
    ) -> Result<Vec<LoggedEvent>> {
        let _ = (key, query, limit);
        Ok(Vec::new())
    }

    /// Deletes log entries created strictly before `older_than`; returns how many. Provided:
    /// none (a store without a log).
    ///
    /// **Contract**
    /// 1. Strictly older only, idempotent, per key (`log::prune_log_strictly_older`).
    async fn prune_log(&self, key: &PKey, older_than: i64) -> Result<u64> {
        let _ = (key, older_than);
        Ok(0)
    }
}
