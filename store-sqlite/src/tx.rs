//! [`SqliteTx`]: an immediate transaction on a rusqlite connection, driven from async code.

use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Mutex, PoisonError, mpsc};

use rusqlite::{Connection, Transaction, TransactionBehavior};
use tokio::sync::oneshot;
use watukuy_core::{Error, Result, store::StoreErrorKind};

use crate::error::classify;
use crate::options::Location;

/// A job for the transaction's thread: runs on the transaction and says whether it returned
/// (`false`: it panicked, and the transaction is rolled back).
type Job = Box<dyn FnOnce(&Transaction<'_>) -> bool + Send>;

/// What the handle asks of the transaction's thread.
enum Message {
    /// Runs a job on the transaction.
    Run(Job),
    /// Commits (`true`) or rolls back (`false`), answers, and ends the thread.
    End {
        commit: bool,
        reply: oneshot::Sender<Result<()>>,
    },
}

/// An open `BEGIN IMMEDIATE` transaction on a connection behind `Arc<Mutex<_>>`, owned by async
/// code: the transaction of [`ProcessedEvents`](crate::ProcessedEvents) as a
/// [`ConsumerStore`](watukuy_core::delivery::ConsumerStore), which
/// [`watukuy_core::delivery::apply_once`] hands to a projection.
///
/// rusqlite is synchronous and its [`Transaction`] borrows the connection, so the transaction
/// lives on a thread of tokio's blocking pool (`spawn_blocking`) that locks the connection's
/// mutex for the transaction's whole life, begins it, then runs the jobs it is sent, one after
/// another: [`run`](Self::run) sends a closure over the transaction and awaits its value. The
/// runtime's threads never wait on SQLite.
///
/// - [`commit`](Self::commit) and [`rollback`](Self::rollback) end it.
/// - **Dropping the handle rolls back**: the thread sees its queue closed, drops the transaction
///   (a rollback) and unlocks the connection. That is what a crash looks like from here: an
///   aborted task, a future dropped mid-way, a projection that returned early.
/// - **A job that panics** does not take the thread or the runtime down: the transaction is
///   rolled back at once, `run` returns a store error, and the handle is spent (a later `run` or
///   `commit` fails; `rollback` succeeds, there is nothing left to undo).
/// - Being immediate, the transaction takes the file's write lock when it begins (waiting for
///   it up to the connection's busy timeout), so transactions on one file serialize, and other
///   writers of the file, the engine store's included, wait while it is open: keep it short.
/// - While it is open, the connection's mutex is locked: do not lock it yourself meanwhile (run
///   statements through [`run`](Self::run)), or the two wait for each other.
///
/// Each open transaction holds a blocking-pool thread until it ends.
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use watukuy_core::delivery;
/// use watukuy_core::{BoxError, Event, HandlerContext, HandlerError};
/// use watukuy_store_sqlite::{ProcessedEvents, SqliteOptions};
///
/// // The read model and the processed-events table live in the engine store's file, so each
/// // commit can be fenced by the delivery's lease.
/// async fn handle(
///     conn: Arc<Mutex<rusqlite::Connection>>,
///     processed: ProcessedEvents,
///     event: Event,
///     ctx: HandlerContext,
/// ) -> Result<(), HandlerError> {
///     let subject = event.subject.clone();
///     delivery::apply_once(&processed, &conn, &event, ctx.fence(), move |tx| {
///         Box::pin(async move {
///             // Any async work may go here; the SQL runs on the transaction's thread.
///             tx.run(move |t| {
///                 t.execute(
///                     "INSERT INTO totals VALUES (?1, 1) \
///                      ON CONFLICT (subject) DO UPDATE SET n = n + 1",
///                     [subject.as_str()],
///                 )
///             })
///             .await??;
///             Ok::<_, BoxError>(())
///         })
///     })
///     .await?
///     .report(&ctx); // counts as applied or deduplicated in `inspect()`
///     Ok(())
/// }
///
/// # fn setup() -> Result<(), watukuy_core::Error> {
/// let store_options = SqliteOptions::file("/var/lib/myapp/watukuy.db");
/// let processed = ProcessedEvents::default().fenced_by(&store_options)?;
/// # let _ = processed;
/// # Ok(())
/// # }
/// ```
pub struct SqliteTx {
    /// The queue of the transaction's thread; `None` once a job panicked or the thread stopped.
    messages: Option<mpsc::Sender<Message>>,
    location: Location,
}

impl std::fmt::Debug for SqliteTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteTx")
            .field("location", &self.location)
            .field("open", &self.messages.is_some())
            .finish()
    }
}

impl SqliteTx {
    /// Begins an immediate transaction on `conn` on a blocking-pool thread: waits for the
    /// connection's mutex, then for the file's write lock (up to the connection's busy timeout;
    /// then a transient `Busy` store error). Needs a tokio runtime.
    pub async fn begin(conn: &Arc<Mutex<Connection>>) -> Result<Self> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| {
            Error::store_with(
                StoreErrorKind::Other,
                false,
                "a SqliteTx runs on tokio's blocking pool: begin it inside a tokio runtime",
                e,
            )
        })?;
        let (messages, inbox) = mpsc::channel();
        let (begun, began) = oneshot::channel();
        let conn = Arc::clone(conn);
        drop(runtime.spawn_blocking(move || serve(&conn, begun, &inbox)));
        let location = began.await.map_err(|_| {
            Error::store(
                StoreErrorKind::Other,
                false,
                "the thread of a SQLite transaction stopped before it began",
            )
        })??;
        Ok(Self {
            messages: Some(messages),
            location,
        })
    }

    /// Runs `f` on the transaction (on its thread) and returns its value.
    ///
    /// A panic in `f` rolls the transaction back and ends it: `run` returns a store error. If
    /// the future of `run` is dropped once `f` was sent, `f` still runs, and its writes stay in
    /// the transaction until it ends.
    pub async fn run<R: Send + 'static>(
        &mut self,
        f: impl FnOnce(&Transaction<'_>) -> R + Send + 'static,
    ) -> Result<R> {
        let (reply, answer) = oneshot::channel();
        let job: Job = Box::new(move |tx| {
            let result = panic::catch_unwind(AssertUnwindSafe(|| f(tx)));
            let returned = result.is_ok();
            // The caller may be gone; then nobody wants the value.
            let _ = reply.send(result.ok());
            returned
        });
        self.send(Message::Run(job))?;
        match answer.await {
            Ok(Some(value)) => Ok(value),
            Ok(None) => {
                self.messages = None;
                Err(Error::store(
                    StoreErrorKind::Other,
                    false,
                    format!(
                        "a job of a transaction on the {} panicked; the transaction was rolled back",
                        self.location
                    ),
                ))
            }
            Err(_) => {
                self.messages = None;
                Err(self.over())
            }
        }
    }

    /// Commits. When the commit fails, the transaction is rolled back.
    pub async fn commit(mut self) -> Result<()> {
        self.end(true).await
    }

    /// Rolls back (also when a job panicked, which rolled it back already).
    pub async fn rollback(mut self) -> Result<()> {
        if self.messages.is_none() {
            return Ok(());
        }
        self.end(false).await
    }

    /// Where the transaction runs.
    pub fn location(&self) -> &Location {
        &self.location
    }

    async fn end(&mut self, commit: bool) -> Result<()> {
        let (reply, answer) = oneshot::channel();
        self.send(Message::End { commit, reply })?;
        self.messages = None;
        answer.await.unwrap_or_else(|_| Err(self.over()))
    }

    fn send(&mut self, message: Message) -> Result<()> {
        let sent = match &self.messages {
            Some(messages) => messages.send(message).is_ok(),
            None => false,
        };
        if sent {
            Ok(())
        } else {
            self.messages = None;
            Err(self.over())
        }
    }

    /// The error of a transaction that is no longer open.
    fn over(&self) -> Error {
        Error::store(
            StoreErrorKind::Other,
            false,
            format!(
                "a transaction on the {} is over: a job panicked (or its thread stopped) and it \
                 was rolled back",
                self.location
            ),
        )
    }
}

/// The transaction's thread: locks `conn`, begins, reports to `begun`, then serves `inbox`
/// until the transaction ends. Returning drops the transaction (a rollback, unless it was
/// committed) and unlocks the connection.
fn serve(
    conn: &Mutex<Connection>,
    begun: oneshot::Sender<Result<Location>>,
    inbox: &mpsc::Receiver<Message>,
) {
    if begun.is_closed() {
        // Whoever began it is gone already.
        return;
    }
    // A poisoned lock means a closure panicked while holding the connection; its transaction
    // was dropped (rolled back) while unwinding, so the connection is consistent.
    let mut conn = conn.lock().unwrap_or_else(PoisonError::into_inner);
    let location = location_of(&conn);
    let tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(e) => {
            let _ = begun.send(Err(classify(e, &location)));
            return;
        }
    };
    if begun.send(Ok(location.clone())).is_err() {
        return;
    }
    while let Ok(message) = inbox.recv() {
        match message {
            Message::Run(job) => {
                if !job(&tx) {
                    return;
                }
            }
            Message::End { commit, reply } => {
                let ended = if commit { tx.commit() } else { tx.rollback() };
                let _ = reply.send(ended.map_err(|e| classify(e, &location)));
                return;
            }
        }
    }
    // The handle was dropped: the transaction is dropped with this frame, rolled back.
}

/// Where `conn` points, for error messages.
pub(crate) fn location_of(conn: &Connection) -> Location {
    match conn.path() {
        Some(path) if !path.is_empty() => Location::File(path.into()),
        _ => Location::Memory,
    }
}
