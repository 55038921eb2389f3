//! What a consumer store's author implements to run the consumer suite: a
//! [`ConsumerHarness`] that hands out a fresh database per case, as a [`ConsumerDb`].

use std::sync::Arc;

use async_trait::async_trait;
use futures::future::BoxFuture;
use watukuy_core::delivery::ConsumerStore;
use watukuy_core::{BoxError, Event, clock::ManualClock, store::Store};

use crate::CaseError;

/// A consumer store's transaction, as the suite names it.
pub type TxOf<'a, D> = <<D as ConsumerDb>::Consumer as ConsumerStore>::Tx<'a>;

/// A consumer store's connection, as the suite names it.
pub type ConnOf<D> = <<D as ConsumerDb>::Consumer as ConsumerStore>::Conn;

/// One row of the suite's read model: the subject, its last value (the event's data as JSON
/// text, `None` for a null) and how many times a projection touched it, so a double application
/// shows.
pub type ModelRow = (String, Option<String>, i64);

/// One case's database: a processed-events table (migrated, stamped by [`clock`](Self::clock)),
/// the suite's read model beside it, and an engine store in the same database whose leases
/// the consumer checks (`ConsumerStore::check_fence`).
#[async_trait]
pub trait ConsumerDb: Send + Sync + 'static {
    /// The consumer store under test.
    type Consumer: ConsumerStore + 'static;

    /// The processed-events table, fenced by [`engine_store`](Self::engine_store).
    fn consumer(&self) -> &Self::Consumer;

    /// The connection of instance `instance` (0 or 1). Two instances must be two real
    /// connections (or a pool), so their transactions overlap for real.
    fn conn(&self, instance: usize) -> &ConnOf<Self>;

    /// The clock stamping `applied_at`.
    fn clock(&self) -> &ManualClock;

    /// The engine store in the same database (migrated), whose leases fence the consumer.
    fn engine_store(&self) -> Arc<dyn Store>;

    /// The suite's projection into the read model, in `tx`: for a `deleted` event the subject's
    /// row is deleted; otherwise it is upserted with `value` = the event's data as JSON text and
    /// `applications` incremented (1 for a new row).
    fn project<'t>(
        &'t self,
        tx: &'t mut TxOf<'_, Self>,
        event: &'t Event,
    ) -> BoxFuture<'t, Result<(), BoxError>>;

    /// A statement that fails in `tx` (as a projection's failing second statement would).
    fn fail<'t>(&'t self, tx: &'t mut TxOf<'_, Self>) -> BoxFuture<'t, Result<(), BoxError>>;

    /// The read model, ordered by subject.
    async fn rows(&self) -> Result<Vec<ModelRow>, CaseError>;

    /// How many markers the processed-events table holds.
    async fn markers(&self) -> Result<u64, CaseError>;

    /// Migrates the processed-events table again (the suite checks it is idempotent and safe
    /// when concurrent).
    async fn migrate(&self) -> Result<(), CaseError>;

    /// Whether some transaction on this database is waiting for another's lock right now (a
    /// claim blocked on a concurrent claim). The overlap cases wait for it before letting the
    /// first delivery commit, so the overlap is proven, not hoped for.
    async fn waiting(&self) -> Result<bool, CaseError>;

    /// Whether another connection can take the engine store's lease while a transaction of
    /// this database holds written rows: true on servers with row locks (the default); false
    /// where one writer excludes every other (SQLite), which skips the case of an instance
    /// frozen inside its transaction.
    fn leases_beside_an_open_write(&self) -> bool {
        true
    }

    /// A new, empty read model with its own processed-events table in the same database (to
    /// rebuild a model by replay), as a database of its own sharing the engine store.
    async fn rebuilt(&self) -> Result<Self, CaseError>
    where
        Self: Sized;
}

/// Hands out a fresh [`ConsumerDb`] per case (a PostgreSQL schema, a SQLite file, a MySQL
/// database).
#[async_trait]
pub trait ConsumerHarness: Send + Sync + 'static {
    /// The database a case gets.
    type Db: ConsumerDb;

    /// A fresh database for case `name`, with `clock` stamping the markers. Return
    /// `Err(CaseError::Failed(..))` when the backend is not available.
    async fn fresh(&self, name: &'static str, clock: ManualClock) -> Result<Self::Db, CaseError>;

    /// Removes a database after its case passed (a failing case leaves it for inspection).
    async fn cleanup(&self, db: Arc<Self::Db>) {
        drop(db);
    }
}
