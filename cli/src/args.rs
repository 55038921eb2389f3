//! The command line, as clap parses it.

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Inspect and operate watukuy pollers from their store, without the pollers' code.
#[derive(Clone, Debug, Parser)]
#[command(name = "watukuy", version, about, long_about = None)]
#[command(after_help = "\
Store URLs: sqlite:<path>, postgres://user[:password]@host[:port]/database, mysql://user[:password]@host[:port]/database, redis://host:port[/db]
(rediss://…?tls_ca_file=<path> over TLS; redis+cluster://host:port,host:port for Redis Cluster).
Exit codes: 0 ok, 1 error (printed as `error (<CODE>): message`), 2 usage.")]
pub struct Cli {
    /// Which store, and how to print.
    #[command(flatten)]
    pub common: CommonArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The options `watukuy` and a service's binary share: the store and its options, and the
/// output format. Its `Debug` hides the store URL's password.
#[derive(Clone, Args)]
pub struct CommonArgs {
    /// The store URL (or set WATUKUY_STORE).
    #[arg(
        long,
        short = 's',
        env = "WATUKUY_STORE",
        global = true,
        hide_env_values = true
    )]
    pub store: Option<String>,
    /// PostgreSQL: the schema holding watukuy's tables (default `public`).
    #[arg(long, global = true)]
    pub schema: Option<String>,
    /// The table prefix (SQLite, PostgreSQL, MySQL; default `watukuy_`) or key prefix (Redis; default
    /// `watukuy:`) the application's store uses.
    #[arg(long, global = true)]
    pub prefix: Option<String>,
    /// PostgreSQL: the URL is a pooler in transaction mode (PgBouncer `pool_mode =
    /// transaction`); every statement then runs in a transaction of its own.
    #[arg(long, global = true)]
    pub transaction_pooling: bool,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,
}

impl std::fmt::Debug for CommonArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommonArgs")
            .field("store", &self.store.as_deref().map(crate::url::redact))
            .field("schema", &self.schema)
            .field("prefix", &self.prefix)
            .field("transaction_pooling", &self.transaction_pooling)
            .field("json", &self.json)
            .finish()
    }
}

/// The commands.
#[derive(Clone, Debug, Subcommand)]
pub enum Command {
    /// Create or upgrade the store's schema (idempotent).
    Migrate,
    /// Show every (poller, partition): state, circuit, lag, outbox, parked, items, last error.
    Inspect(Select),
    /// List the (poller, partition) keys the store holds.
    Keys(PollerFilter),
    /// Parked events (poison) and quarantined items (invalid).
    Parked {
        /// What to do with them.
        #[command(subcommand)]
        action: ParkedAction,
    },
    /// Pause a key: it is not polled and its outbox is not delivered until resumed.
    Pause(Target),
    /// Resume a paused key and make it due now.
    Resume(Target),
    /// Make a key due now (an open circuit stays open: the run is a probe).
    Trigger(Target),
    /// Move the live cursor and make the key due.
    ResetCursor(ResetCursor),
    /// Copy logged events into the outbox; the next run of the key delivers them again.
    Replay(Replay),
    /// Serve the admin page (read-only unless WATUKUY_ADMIN_TOKEN is set) until SIGINT/SIGTERM.
    Admin(Admin),
}

/// `admin --listen`.
#[derive(Clone, Debug, Args)]
pub struct Admin {
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: String,
}

/// `--poller` and an optional `--partition`, to narrow `inspect`.
#[derive(Clone, Debug, Default, Args)]
pub struct Select {
    /// Only this poller.
    #[arg(long)]
    pub poller: Option<String>,
    /// Only this partition (with `--poller`).
    #[arg(long, requires = "poller")]
    pub partition: Option<String>,
}

/// An optional `--poller`.
#[derive(Clone, Debug, Default, Args)]
pub struct PollerFilter {
    /// Only this poller.
    #[arg(long)]
    pub poller: Option<String>,
}

/// The key a command works on.
#[derive(Clone, Debug, Args)]
pub struct Target {
    /// The poller.
    #[arg(long)]
    pub poller: String,
    /// The partition (required for a partitioned poller).
    #[arg(long)]
    pub partition: Option<String>,
}

/// A parked row's kind, as the command line writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum KindArg {
    /// Events whose handler failed every attempt.
    Poison,
    /// Items that failed validation.
    Invalid,
}

impl From<KindArg> for watukuy_core::store::ParkedKind {
    fn from(kind: KindArg) -> Self {
        match kind {
            KindArg::Poison => watukuy_core::store::ParkedKind::Poison,
            KindArg::Invalid => watukuy_core::store::ParkedKind::Invalid,
        }
    }
}

/// `parked ls|retry|discard`.
#[derive(Clone, Debug, Subcommand)]
pub enum ParkedAction {
    /// List parked rows, oldest first.
    Ls(ParkedArgs),
    /// Move poison events back to the outbox; the key's next run delivers them (quarantined
    /// items cannot be retried: fix the data or the check, then discard them).
    Retry(ParkedArgs),
    /// Delete parked rows for good (their ordering key is released).
    Discard(ParkedArgs),
}

/// The rows a `parked` command works on.
#[derive(Clone, Debug, Args)]
pub struct ParkedArgs {
    /// The key.
    #[command(flatten)]
    pub target: Target,
    /// Only these row ids (comma separated); default every row (of `--kind`).
    #[arg(long, value_delimiter = ',')]
    pub ids: Option<Vec<String>>,
    /// Only rows of this kind.
    #[arg(long, value_enum)]
    pub kind: Option<KindArg>,
    /// `ls`: at most this many rows.
    #[arg(long)]
    pub limit: Option<usize>,
}

/// `reset-cursor`.
#[derive(Clone, Debug, Args)]
pub struct ResetCursor {
    /// The key.
    #[command(flatten)]
    pub target: Target,
    /// The new live cursor: the strategy's cursor as JSON text, as `inspect --json` shows it
    /// (e.g. '{"value":"2026-01-01T00:00:00Z","tieBreak":null}'), or `null` for the strategy's
    /// initial cursor.
    #[arg(long, allow_hyphen_values = true)]
    pub to: String,
    /// Also drop the item snapshot: every item is emitted again as `created`, with the same ids.
    #[arg(long)]
    pub clear_snapshot: bool,
}

/// `replay`.
#[derive(Clone, Debug, Args)]
pub struct Replay {
    /// The key.
    #[command(flatten)]
    pub target: Target,
    /// Replay events logged at or after this time (RFC 3339, or epoch milliseconds).
    #[arg(long)]
    pub from: String,
    /// ...and at or before this time (default: now).
    #[arg(long)]
    pub to: Option<String>,
}

/// The command line of a service's own binary (see [`crate::Service`]): the store options of
/// `watukuy`, the commands that run the service's pollers, and every command of `watukuy`.
#[derive(Clone, Debug, Parser)]
#[command(
    about = "The service's pollers (tick, run, backfill) and every command of watukuy on its store",
    long_about = None
)]
#[command(after_help = "\
Store URLs: sqlite:<path>, postgres://user[:password]@host[:port]/database, mysql://user[:password]@host[:port]/database, redis://host:port[/db].
Durations: 500ms, 50s, 10m, 2h.
Exit codes: 0 ok, 1 error (printed as `error (<CODE>): message`), 2 usage, 130 stopped by a second signal.")]
pub struct ServiceCli {
    /// Which store, and how to print.
    #[command(flatten)]
    pub common: CommonArgs,
    /// This process's lease owner id (or set WATUKUY_INSTANCE_ID). Give each process slot a
    /// stable one (a pod name) and a restarted process takes its keys back at once instead of
    /// waiting for its old leases to expire; never give two live processes the same one.
    #[arg(long, env = "WATUKUY_INSTANCE_ID", global = true)]
    pub instance_id: Option<String>,
    /// What to do.
    #[command(subcommand)]
    pub command: ServiceCommand,
}

/// The commands of a service's binary.
#[derive(Clone, Debug, Subcommand)]
pub enum ServiceCommand {
    /// Run every due key once and deliver what it commits (for cron and serverless); exit 1
    /// when a poll failed.
    Tick(Tick),
    /// Run the daemon until SIGINT or SIGTERM, then stop, letting running cycles finish.
    Run(Run),
    /// Re-read a poller's history on the backfill lane, to its end, with progress.
    Backfill(Backfill),
    /// Every command of `watukuy`.
    #[command(flatten)]
    Store(Command),
}

/// `tick`.
#[derive(Clone, Debug, Args)]
pub struct Tick {
    /// Stop starting keys and pages after this long (a running page finishes).
    #[arg(long, value_parser = parse_duration)]
    pub max_duration: Option<std::time::Duration>,
    /// Only this poller.
    #[arg(long)]
    pub poller: Option<String>,
    /// Only this partition (with `--poller`).
    #[arg(long, requires = "poller")]
    pub partition: Option<String>,
}

/// `run`.
#[derive(Clone, Debug, Args)]
pub struct Run {
    /// After a signal, how long running cycles may take to finish before they are aborted
    /// (their events are delivered again later).
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    pub drain_timeout: std::time::Duration,
    /// Also serve `GET /health` (200 or 503) and the admin page under `/admin/` on this
    /// address, until the stop.
    #[arg(long)]
    pub listen: Option<String>,
    /// Health: the most a timestamp cursor may lag before `/health` answers 503.
    #[arg(long, value_parser = parse_duration, requires = "listen")]
    pub max_lag: Option<std::time::Duration>,
    /// Health: an open circuit does not make `/health` answer 503.
    #[arg(long, requires = "listen")]
    pub allow_open_circuit: bool,
}

/// `backfill`.
#[derive(Clone, Debug, Args)]
pub struct Backfill {
    /// The key.
    #[command(flatten)]
    pub target: Target,
    /// Where to start, as the API writes its cursor (a time, a token), or `null` for the
    /// beginning.
    #[arg(long, allow_hyphen_values = true, required_unless_present = "resume")]
    pub from: Option<String>,
    /// Where to stop, as the API writes its cursor (default: the live cursor now).
    #[arg(long, allow_hyphen_values = true, conflicts_with = "resume")]
    pub to: Option<String>,
    /// Re-emit known, unchanged items as `updated`.
    #[arg(long, conflicts_with = "resume")]
    pub force: bool,
    /// Continue the key's unfinished backfill from the cursor it reached (after an
    /// interruption).
    #[arg(long, conflicts_with = "from")]
    pub resume: bool,
}

/// A duration: a whole number and a unit, `ms`, `s`, `m` or `h` (`500ms`, `50s`, `10m`).
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let bad = || format!("'{text}' is not a duration (a whole number and ms, s, m or h: 50s)");
    let number: u64 = number.parse().map_err(|_| bad())?;
    let ms = match unit.trim() {
        "ms" => Some(number),
        "s" => number.checked_mul(1_000),
        "m" => number.checked_mul(60_000),
        "h" => number.checked_mul(3_600_000),
        _ => return Err(bad()),
    };
    ms.map(std::time::Duration::from_millis).ok_or_else(bad)
}
