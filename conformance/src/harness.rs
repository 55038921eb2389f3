//! What a store author implements to run the suite: a [`Harness`] that hands out fresh stores.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use futures::future::BoxFuture;
use watukuy_core::store::{PKey, Store};

/// Why a case did not pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CaseError {
    /// The case does not apply (a missing capability or backend); the reason says which.
    Skipped(String),
    /// The store broke the contract; the message says where and how.
    Failed(String),
}

impl CaseError {
    /// A failure with a message.
    pub fn failed(message: impl Into<String>) -> Self {
        CaseError::Failed(message.into())
    }

    /// A skip with a reason.
    pub fn skipped(reason: impl Into<String>) -> Self {
        CaseError::Skipped(reason.into())
    }
}

impl fmt::Display for CaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CaseError::Skipped(reason) => write!(f, "skipped: {reason}"),
            CaseError::Failed(message) => write!(f, "failed: {message}"),
        }
    }
}

impl From<watukuy_core::Error> for CaseError {
    fn from(error: watukuy_core::Error) -> Self {
        CaseError::Failed(format!("unexpected error ({}): {error}", error.code()))
    }
}

impl From<watukuy_testkit::FakeApiError> for CaseError {
    fn from(error: watukuy_testkit::FakeApiError) -> Self {
        CaseError::Failed(format!("the fake API refused a test step: {error}"))
    }
}

/// The result of one case.
pub type CaseResult = Result<(), CaseError>;

/// Any error (a driver's, JSON, a task's join error, a number conversion) as a failed case:
/// `.or_fail()?` with the error's message, `.or_fail_with("what")?` with `what: ` before it.
pub trait OrFail<T> {
    /// The error's message as the failure.
    fn or_fail(self) -> Result<T, CaseError>;
    /// `what: <the error's message>` as the failure.
    fn or_fail_with(self, what: impl fmt::Display) -> Result<T, CaseError>;
}

impl<T, E: fmt::Display> OrFail<T> for Result<T, E> {
    fn or_fail(self) -> Result<T, CaseError> {
        self.map_err(|e| CaseError::failed(e.to_string()))
    }

    fn or_fail_with(self, what: impl fmt::Display) -> Result<T, CaseError> {
        self.map_err(|e| CaseError::failed(format!("{what}: {e}")))
    }
}

/// Which case is asking for a store (harnesses may use it to name a namespace).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CaseContext {
    /// The case's module (`leases`, `fencing`, ...).
    pub module: &'static str,
    /// The case's name.
    pub name: &'static str,
}

/// A fresh store for one case, with an optional cleanup run only when the case passed (so a
/// failing case leaves its data behind for inspection).
pub struct Fresh {
    /// The store, migrated and empty.
    pub store: Arc<dyn Store>,
    cleanup: Option<BoxFuture<'static, ()>>,
    hooks: Hooks,
}

/// Opens another instance of a store (see [`Fresh::with_instances`]).
type Opener = Arc<dyn Fn() -> BoxFuture<'static, Result<Arc<dyn Store>, CaseError>> + Send + Sync>;

/// Writes data beneath a store (see [`Fresh::with_raw_writes`]).
type RawWriter = Arc<dyn Fn(RawWrite) -> BoxFuture<'static, CaseResult> + Send + Sync>;

/// What a harness lets cases do beyond using the store: shared by [`Fresh`] and [`Env`].
#[derive(Clone, Default)]
struct Hooks {
    instances: Option<Opener>,
    unmigrated: Option<Opener>,
    raw: Option<RawWriter>,
}

/// Data a case asks the harness to write beneath the store, as another program, a newer release
/// or a damaged disk would leave it (see [`Fresh::with_raw_writes`]). A harness answers
/// `Err(CaseError::Skipped(..))` for a write its backend cannot hold (a column type that refuses
/// the bytes, a store without a schema version), and the case goes on without it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RawWrite {
    /// The key's stored state (cursor, sequence, schedule) no longer decodes.
    State(PKey),
    /// Every stored item of the key (its version, hash or payload) no longer decodes.
    Items(PKey),
    /// Every pending outbox event of the key no longer decodes.
    Pending(PKey),
    /// The store's recorded schema version becomes this one, newer than any release knows.
    SchemaVersion(u32),
}

impl fmt::Debug for Fresh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fresh")
            .field("cleanup", &self.cleanup.is_some())
            .field("instances", &self.hooks.instances.is_some())
            .field("unmigrated", &self.hooks.unmigrated.is_some())
            .field("raw_writes", &self.hooks.raw.is_some())
            .finish_non_exhaustive()
    }
}

impl Fresh {
    /// A fresh store without cleanup.
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self {
            store,
            cleanup: None,
            hooks: Hooks::default(),
        }
    }

    /// Lets cases open more instances on this store's data with `open`: another store value
    /// with its own connections (a pool, a client, a file handle), as a second process of the
    /// same service would open. The cases that need one ([`Env::another_instance`]) are skipped
    /// for a harness without it.
    #[must_use]
    pub fn with_instances<F, Fut>(mut self, open: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<Arc<dyn Store>, CaseError>> + Send + 'static,
    {
        self.hooks.instances = Some(Arc::new(move || Box::pin(open())));
        self
    }

    /// Lets cases open instances on a namespace of the case's own that nobody has migrated yet
    /// (a schema, a database, a file or a key prefix that does not exist), the same namespace on
    /// every call, each instance with its own connections; the harness's cleanup removes it. The
    /// cases that migrate new instances at once ([`Env::unmigrated_instance`]) are skipped for a
    /// harness without it.
    #[must_use]
    pub fn with_unmigrated<F, Fut>(mut self, open: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<Arc<dyn Store>, CaseError>> + Send + 'static,
    {
        self.hooks.unmigrated = Some(Arc::new(move || Box::pin(open())));
        self
    }

    /// Lets cases write data beneath the store with `write` (see [`RawWrite`]), with the
    /// backend's own client, to prove the store reads what it did not write as an error naming
    /// it, never a panic. The cases that need it ([`Env::raw_write`]) are skipped for a harness
    /// without it.
    #[must_use]
    pub fn with_raw_writes<F, Fut>(mut self, write: F) -> Self
    where
        F: Fn(RawWrite) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = CaseResult> + Send + 'static,
    {
        self.hooks.raw = Some(Arc::new(move |raw| Box::pin(write(raw))));
        self
    }

    /// Adds a cleanup (drop a schema, delete keys, remove a file) run after a passing case.
    #[must_use]
    pub fn with_cleanup(
        mut self,
        cleanup: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Self {
        self.cleanup = Some(Box::pin(cleanup));
        self
    }

    /// Runs the cleanup (done by the runner for the case's own store; a case that took
    /// [`Env::another_store`] calls it when it passed).
    pub async fn cleanup(self) {
        if let Some(cleanup) = self.cleanup {
            cleanup.await;
        }
    }
}

/// Hands out a fresh, migrated, isolated store per case (a Postgres schema, a Redis key prefix,
/// a SQLite temp file...).
#[async_trait]
pub trait Harness: Send + Sync + 'static {
    /// A name for reports (`memory`, `sqlite-file`, ...).
    fn name(&self) -> String;

    /// A fresh store in its own namespace, already migrated. Return
    /// `Err(CaseError::Failed(..))` when the backend is not available (see [`backend_url`]), or
    /// `Err(CaseError::Skipped(..))` when the case does not apply to this store.
    async fn fresh(&self, ctx: CaseContext) -> Result<Fresh, CaseError>;
}

/// The environment variable naming backends that must be available (comma separated, e.g.
/// `postgres,redis`). [`backend_url`] names it in its failure; the watukuy workspace's own tests
/// read it when they are compiled, and never leave out a test that needs a backend it names
/// (docs/testing.md).
pub const REQUIRE_BACKENDS_ENV: &str = "WATUKUY_REQUIRE_BACKENDS";

/// Reads a backend's URL from `env_var`. When it is unset, the case fails, saying so: a test that
/// needs a backend never passes without it. Leave such tests out while the variable is unset by
/// marking them ignored (`store_tests!(Harness, #[cfg_attr(..., ignore = "...")])`), so libtest
/// counts them as ignored, not passed.
pub fn backend_url(backend: &str, env_var: &str) -> Result<String, CaseError> {
    match std::env::var(env_var) {
        Ok(url) if !url.trim().is_empty() => Ok(url),
        _ => {
            let required = std::env::var(REQUIRE_BACKENDS_ENV).unwrap_or_default();
            let why = if required
                .split(',')
                .any(|b| b.trim().eq_ignore_ascii_case(backend))
            {
                format!("{REQUIRE_BACKENDS_ENV} requires it")
            } else {
                "a test that needs it should be ignored while it is unset".to_owned()
            };
            Err(CaseError::failed(format!(
                "{env_var} is not set, so the {backend} backend cannot be tested ({why})"
            )))
        }
    }
}

/// What a case receives: its fresh store, and the harness for cases that need more stores.
#[derive(Clone)]
pub struct Env {
    /// The case's fresh store.
    pub store: Arc<dyn Store>,
    /// The harness, for another fresh store.
    pub harness: Arc<dyn Harness>,
    /// Which case this is.
    pub ctx: CaseContext,
    hooks: Hooks,
}

impl fmt::Debug for Env {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Env")
            .field("harness", &self.harness.name())
            .field("ctx", &self.ctx)
            .finish()
    }
}

impl Env {
    /// The case's store.
    pub fn store(&self) -> &dyn Store {
        &*self.store
    }

    /// The case's store and what opens more instances of it (see [`Fresh::with_instances`]).
    pub(crate) fn new(fresh: &Fresh, harness: Arc<dyn Harness>, ctx: CaseContext) -> Self {
        Self {
            store: Arc::clone(&fresh.store),
            harness,
            ctx,
            hooks: fresh.hooks.clone(),
        }
    }

    /// Another instance on the case's store's data, with connections of its own, as a second
    /// process would open it. Skips the case when the harness opens none
    /// ([`Fresh::with_instances`]).
    pub async fn another_instance(&self) -> Result<Arc<dyn Store>, CaseError> {
        match &self.hooks.instances {
            Some(open) => open().await,
            None => Err(CaseError::skipped(
                "the harness opens no second instance of a store (Fresh::with_instances)",
            )),
        }
    }

    /// An instance on the case's own namespace that nobody has migrated yet, with connections
    /// of its own: every call opens another on the same namespace. Skips the case when the
    /// harness opens none ([`Fresh::with_unmigrated`]).
    pub async fn unmigrated_instance(&self) -> Result<Arc<dyn Store>, CaseError> {
        match &self.hooks.unmigrated {
            Some(open) => open().await,
            None => Err(CaseError::skipped(
                "the harness opens no unmigrated instance (Fresh::with_unmigrated)",
            )),
        }
    }

    /// Writes `raw` beneath the case's store with the backend's own client. Skipped when the
    /// harness writes nothing raw ([`Fresh::with_raw_writes`]) or not this (its answer).
    pub async fn raw_write(&self, raw: RawWrite) -> CaseResult {
        match &self.hooks.raw {
            Some(write) => write(raw).await,
            None => Err(CaseError::skipped(
                "the harness writes nothing beneath the store (Fresh::with_raw_writes)",
            )),
        }
    }

    /// Another fresh, isolated store from the same harness (for cases that compare two
    /// independent worlds). Call [`Fresh::cleanup`] on it when the case passed.
    pub async fn another_store(&self) -> Result<Fresh, CaseError> {
        self.harness.fresh(self.ctx).await
    }
}
