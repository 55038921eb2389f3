//! The command line of a service's own binary: its pollers run by `tick`, `run` and `backfill`,
//! and every command of `watukuy` beside them.

use std::ffi::OsString;
use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use clap::{CommandFactory, FromArgMatches};
use serde_json::json;
use watukuy_core::clock::{Clock, SystemClock};
use watukuy_core::hooks::{CommitInfo, HookContext, Hooks};
use watukuy_core::ops::{BackfillProgress, HealthOptions, KeyInspect};
use watukuy_core::store::{PKey, Store};
use watukuy_core::{
    BackfillOptions, BoxError, Engine, EngineBuilder, Lane, StopOptions, TickOptions, TickResult,
};

use crate::args::{Backfill, Command, Run, ServiceCli, ServiceCommand, Tick};
use crate::ops::{Report, Session};
use crate::serve::{self, Signals};
use crate::{CliError, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, Output, StoreUrl};

/// What [`Service::new`]'s function returns: the engine, with its handlers attached.
pub type BuildFuture = Pin<Box<dyn Future<Output = Result<Engine, BoxError>> + Send>>;

type Build = dyn Fn(EngineBuilder) -> BuildFuture + Send + Sync;

/// The command line of a service's binary: `main` hands over how to build the engine, and the
/// binary gets `tick`, `run`, `backfill` and every command of `watukuy`, all knowing the
/// service's pollers.
///
/// ```no_run
/// use std::process::ExitCode;
/// use watukuy_cli::Service;
/// # fn orders_poller() -> watukuy_core::Poller { unimplemented!() }
///
/// fn main() -> ExitCode {
///     Service::new("orders-sync", |builder| async move {
///         let engine = builder.poller(orders_poller()).build()?;
///         engine.on("orders", |event: watukuy_core::Event, _ctx| async move {
///             println!("{} {}", event.event_type, event.subject);
///             Ok(())
///         })?;
///         Ok(engine)
///     })
///     .default_store("sqlite:orders.db")
///     .main()
/// }
/// ```
///
/// The function receives [`Engine::builder`] on the store the command line names (`--store` or
/// `WATUKUY_STORE`), with the instance id of `--instance-id` (or `WATUKUY_INSTANCE_ID`) when one
/// is given; it adds the pollers, builds, attaches the handlers and returns the engine. It runs
/// for the commands that need the engine (all but `migrate` and `keys`), once per process.
#[derive(Clone)]
pub struct Service {
    name: String,
    version: Option<String>,
    default_store: Option<String>,
    build: Arc<Build>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("name", &self.name)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

impl Service {
    /// The command line of the program `name`, whose engine `build` makes.
    pub fn new<F, Fut>(name: impl Into<String>, build: F) -> Self
    where
        F: Fn(EngineBuilder) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Engine, BoxError>> + Send + 'static,
    {
        Self {
            name: name.into(),
            version: None,
            default_store: None,
            build: Arc::new(move |builder| Box::pin(build(builder))),
        }
    }

    /// The version `--version` prints (default: none; pass `env!("CARGO_PKG_VERSION")`).
    #[must_use]
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = Some(version.into());
        self
    }

    /// The store URL used when neither `--store` nor `WATUKUY_STORE` gives one.
    #[must_use]
    pub fn default_store(mut self, url: impl Into<String>) -> Self {
        self.default_store = Some(url.into());
        self
    }

    /// The whole program: parses the process's arguments, runs the command on a new
    /// multi-threaded runtime and returns the exit code (0 ok, 1 error, 2 usage, 130 stopped by
    /// a second signal). Use [`run`](Self::run) from inside a runtime.
    pub fn main(self) -> ExitCode {
        let runtime = match tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(error) => {
                eprintln!("error (INTERNAL): cannot start the runtime: {error}");
                return ExitCode::from(EXIT_ERROR);
            }
        };
        ExitCode::from(runtime.block_on(self.run(std::env::args_os())))
    }

    /// Parses `argv` (its first item is the program name), runs the command, prints its output
    /// on stdout (progress and errors on stderr) and returns the exit code.
    pub async fn run<I, T>(&self, argv: I) -> u8
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let mut command = ServiceCli::command()
            .name(self.name.clone())
            .bin_name(self.name.clone());
        if let Some(version) = &self.version {
            command = command.version(version.clone());
        }
        let argv: Vec<OsString> = argv.into_iter().map(Into::into).collect();
        let parse = |argv: &[OsString]| {
            command
                .clone()
                .try_get_matches_from(argv)
                .and_then(|matches| ServiceCli::from_arg_matches(&matches))
        };
        let cli = match parse(&argv) {
            Ok(cli) => cli,
            Err(error) => {
                let error = crate::clap_error(error, &argv, |hidden| parse(hidden).err());
                if error.exit_code == EXIT_OK {
                    print!("{}", error.message);
                } else {
                    eprintln!("error: {}", error.message);
                }
                return error.exit_code;
            }
        };
        match self.execute(&cli).await {
            Ok((output, code)) => {
                print!("{}", output.render(cli.common.json));
                code
            }
            Err(error) => {
                eprintln!("{error}");
                error.exit_code
            }
        }
    }

    async fn execute(&self, cli: &ServiceCli) -> Result<(Output, u8), CliError> {
        // The daemon delivers several keys at once.
        let (url, options) =
            crate::url::store_from(&cli.common, self.default_store.as_deref(), Some(10))?;
        // The commands that poll create the schema (and a new SQLite file) as they start.
        let polls = matches!(
            cli.command,
            ServiceCommand::Tick(_) | ServiceCommand::Run(_) | ServiceCommand::Backfill(_)
        );
        let create = polls || matches!(cli.command, ServiceCommand::Store(Command::Migrate));
        let store = url.open(&options, create).await?;
        let outcome = self.dispatch(cli, &url, Arc::clone(&store), polls).await;
        let _ = store.close().await;
        outcome
    }

    async fn dispatch(
        &self,
        cli: &ServiceCli,
        url: &StoreUrl,
        store: Arc<dyn Store>,
        polls: bool,
    ) -> Result<(Output, u8), CliError> {
        let session = Session::new(Arc::clone(&store), url.to_string());
        // These two need no poller code.
        if let ServiceCommand::Store(command @ (Command::Migrate | Command::Keys(_))) = &cli.command
        {
            return Ok((crate::command(&session, command).await?, EXIT_OK));
        }
        let progress = Arc::new(Progress::default());
        let mut builder =
            Engine::builder(Arc::clone(&store)).hooks(Arc::clone(&progress) as Arc<dyn Hooks>);
        if let Some(id) = &cli.instance_id {
            builder = builder.instance_id(id.clone());
        }
        let engine = (self.build)(builder)
            .await
            .map_err(|error| CliError::config(format!("building the engine failed: {error}")))?;
        if polls {
            engine.migrate().await?;
        }
        match &cli.command {
            ServiceCommand::Tick(tick) => self::tick(&engine, tick).await,
            ServiceCommand::Run(run) => self::run(&engine, store, run).await,
            ServiceCommand::Backfill(backfill) => {
                self::backfill(&engine, backfill, &progress).await
            }
            ServiceCommand::Store(Command::Admin(admin)) => {
                let state = watukuy_admin::AdminState::new(engine.clone(), store);
                let app = serve::admin_app(state);
                Ok((serve::until_signal(&admin.listen, app).await?, EXIT_OK))
            }
            ServiceCommand::Store(Command::Inspect(select)) => {
                let report = inspect(&engine, &session, select.poller.as_deref()).await?;
                let report = match select.partition.as_deref() {
                    Some(partition) => {
                        key_of(&report, &engine, select.poller.as_deref(), partition)?;
                        Report {
                            pollers: report
                                .pollers
                                .into_iter()
                                .filter(|k| k.partition == partition)
                                .collect(),
                            ..report
                        }
                    }
                    None => report,
                };
                Ok((crate::report_output(&report)?, EXIT_OK))
            }
            // The engine knows keys that never ran, and wakes its daemon.
            ServiceCommand::Store(
                command @ (Command::Pause(t) | Command::Resume(t) | Command::Trigger(t)),
            ) => {
                known(&engine, &t.poller)?;
                let partition = t.partition.as_deref();
                match command {
                    Command::Pause(_) => engine.pause(&t.poller, partition).await?,
                    Command::Resume(_) => engine.resume(&t.poller, partition).await?,
                    _ => engine.trigger(&t.poller, partition).await?,
                }
                let key = PKey::new(t.poller.clone(), partition.unwrap_or_default());
                Ok((crate::key_action_output(command, &key), EXIT_OK))
            }
            ServiceCommand::Store(command) => {
                if let Some(poller) = crate::poller_of(command) {
                    known(&engine, poller)?;
                }
                Ok((crate::command(&session, command).await?, EXIT_OK))
            }
        }
    }
}

/// An unknown poller name is an error listing the service's pollers.
fn known(engine: &Engine, poller: &str) -> Result<(), CliError> {
    let names = engine.poller_names();
    if names.iter().any(|name| name == poller) {
        return Ok(());
    }
    Err(watukuy_core::Error::UnknownPoller {
        name: poller.to_owned(),
        known: names,
    }
    .into())
}

/// The engine's report (every active key, never-run ones included), as `watukuy inspect`
/// prints it.
async fn inspect(
    engine: &Engine,
    session: &Session,
    poller: Option<&str>,
) -> Result<Report, CliError> {
    if let Some(poller) = poller {
        known(engine, poller)?;
    }
    let report = engine.inspect().await?;
    Ok(Report {
        store: session.label().to_owned(),
        generated_at: report.generated_at,
        pollers: report
            .pollers
            .into_iter()
            .map(|p| p.key)
            .filter(|k| poller.is_none_or(|name| k.poller == name))
            .collect(),
    })
}

/// The key of `report` for `poller` and `partition`, or an error naming the partitions.
fn key_of<'a>(
    report: &'a Report,
    engine: &Engine,
    poller: Option<&str>,
    partition: &str,
) -> Result<&'a KeyInspect, CliError> {
    let poller = poller.unwrap_or_default();
    known(engine, poller)?;
    let keys: Vec<&KeyInspect> = report
        .pollers
        .iter()
        .filter(|k| k.poller == poller)
        .collect();
    if let Some(key) = keys.iter().find(|k| k.partition == partition) {
        return Ok(key);
    }
    let names: Vec<String> = keys.iter().map(|k| format!("'{}'", k.partition)).collect();
    if partition.is_empty() {
        return Err(CliError::config(format!(
            "poller '{poller}' is partitioned; pass --partition (partitions: {})",
            names.join(", ")
        )));
    }
    Err(CliError::new(
        "UNKNOWN_PARTITION",
        if names == ["''"] {
            format!("poller '{poller}' is not partitioned; drop --partition")
        } else {
            format!(
                "poller '{poller}' has no partition '{partition}' (partitions: {})",
                names.join(", ")
            )
        },
    ))
}

async fn tick(engine: &Engine, args: &Tick) -> Result<(Output, u8), CliError> {
    let mut options = TickOptions::default();
    if let Some(max) = args.max_duration {
        options = options.max_duration(max);
    }
    if let Some(poller) = &args.poller {
        let partition = args.partition.as_deref().unwrap_or_default();
        let report = engine.inspect().await?;
        let session_report = Report {
            store: String::new(),
            generated_at: report.generated_at,
            pollers: report.pollers.into_iter().map(|p| p.key).collect(),
        };
        key_of(&session_report, engine, Some(poller), partition)?;
        options = options.only([poller.clone()]);
        if args.partition.is_some() {
            options = options.partition(partition);
        }
    }
    let result = engine.tick(options).await?;
    let output = Output::new(tick_text(&result), crate::to_json(&result)?);
    let failed: Vec<String> = result
        .polled
        .iter()
        .filter_map(|poll| {
            let error = poll.error.as_ref()?;
            let code = error.code.as_deref().unwrap_or(&error.name);
            Some(format!(
                "error ({code}): {} {} failed: {}",
                key_label(&poll.poller, &poll.partition),
                poll.lane.as_str(),
                error.message
            ))
        })
        .collect();
    for line in &failed {
        eprintln!("{line}");
    }
    Ok((
        output,
        if failed.is_empty() {
            EXIT_OK
        } else {
            EXIT_ERROR
        },
    ))
}

fn tick_text(result: &TickResult) -> String {
    let mut text = String::new();
    for poll in &result.polled {
        let outcome = match &poll.error {
            Some(error) => format!("failed: {}", error.message),
            None => format!(
                "{} items, {} events, {} delivered",
                poll.items, poll.events, poll.delivered
            ),
        };
        text.push_str(&format!(
            "{} {}: {outcome} ({} ms)\n",
            key_label(&poll.poller, &poll.partition),
            poll.lane.as_str(),
            poll.duration_ms
        ));
    }
    text.push_str(&format!(
        "tick: {} cycles, {} delivered, {} not due, {} held by another instance{}, {} ms\n",
        result.polled.len(),
        result.delivered,
        result.skipped_not_due,
        result.skipped_leased,
        if result.timed_out {
            ", stopped at --max-duration"
        } else {
            ""
        },
        result.duration_ms
    ));
    text
}

async fn run(engine: &Engine, store: Arc<dyn Store>, args: &Run) -> Result<(Output, u8), CliError> {
    // Signals are caught from here on: a signal before the daemon starts stops it at once.
    let mut signals = Signals::new()?;
    let server = match &args.listen {
        Some(address) => {
            let mut health = HealthOptions::default()
                .require_running(true)
                .allow_open_circuit(args.allow_open_circuit);
            if let Some(max) = args.max_lag {
                health = health.max_lag(max);
            }
            let state = watukuy_admin::AdminState::new(engine.clone(), store);
            let app = watukuy_admin::health_router(engine.clone(), health)
                .nest("/admin", serve::admin_app(state));
            Some(serve::Server::bind(address, app).await?)
        }
        None => None,
    };
    engine.start().await?;
    eprintln!(
        "running {} (instance {}); SIGINT or SIGTERM stops",
        engine.poller_names().join(", "),
        engine.instance_id()
    );
    let signal = signals.next().await;
    eprintln!(
        "{signal}: stopping; running cycles may finish within {} s (a second signal stops at once)",
        args.drain_timeout.as_secs()
    );
    // Stop accepting requests first: probes see the service go away.
    let server = server.map(serve::Server::shutdown);
    let stop = engine.stop(StopOptions::default().timeout(args.drain_timeout));
    tokio::select! {
        stopped = stop => stopped?,
        signal = signals.next() => {
            eprintln!("{signal} again: stopped at once; unacknowledged events are delivered again later");
            return Ok((Output::new("interrupted", json!({ "stopped": false })), EXIT_INTERRUPTED));
        }
    }
    if let Some(server) = server {
        server.await;
    }
    let pending = engine
        .inspect()
        .await
        .map(|report| report.pollers.iter().map(|p| p.outbox_pending).sum::<u64>())
        .ok();
    eprintln!("stopped");
    Ok((
        Output::new(
            "stopped",
            json!({ "stopped": true, "outboxPending": pending }),
        ),
        EXIT_OK,
    ))
}

/// Counts the pages each lane commits, for `backfill`'s progress.
#[derive(Debug, Default)]
struct Progress {
    backfill_pages: AtomicU64,
}

#[async_trait]
impl Hooks for Progress {
    async fn on_commit(&self, ctx: &HookContext, _info: &CommitInfo) {
        if ctx.lane == Lane::Backfill {
            self.backfill_pages.fetch_add(1, Ordering::Relaxed);
        }
    }
}

async fn backfill(
    engine: &Engine,
    args: &Backfill,
    progress: &Progress,
) -> Result<(Output, u8), CliError> {
    let (poller, partition) = (
        &args.target.poller,
        args.target.partition.as_deref().unwrap_or_default(),
    );
    let state = |report: &watukuy_core::ops::InspectReport| {
        let report = Report {
            store: String::new(),
            generated_at: report.generated_at,
            pollers: report.pollers.iter().map(|p| p.key.clone()).collect(),
        };
        key_of(&report, engine, Some(poller), partition).map(|k| k.backfill.clone())
    };
    let before = state(&engine.inspect().await?)?;
    let label = key_label(poller, partition);
    let optional = args.target.partition.as_deref();
    if args.resume {
        if before.as_ref().is_none_or(|b| b.done) {
            return Err(CliError::new(
                "NOT_FOUND",
                format!(
                    "{label} has no unfinished backfill to resume; start one with --from <cursor|null>"
                ),
            ));
        }
        eprintln!("resuming the backfill of {label}");
    } else {
        let mut options = BackfillOptions::default().force(args.force);
        match args.from.as_deref().map(str::trim) {
            None | Some("null") => {}
            Some(from) => options = options.from_cursor(from),
        }
        if let Some(to) = &args.to {
            options = options.to_cursor(to.clone());
        }
        engine.backfill(poller, optional, options).await?;
        eprintln!("backfill of {label} started");
    }
    let mut events = 0_u64;
    let mut ticks_without_progress = 0_u32;
    let done = loop {
        let mut options = TickOptions::default().only([poller.clone()]);
        options = options.partition(partition);
        let result = engine.tick(options).await?;
        let mut ran = false;
        for poll in &result.polled {
            if let Some(error) = &poll.error {
                let reached = state(&engine.inspect().await?)?;
                return Err(CliError::new(
                    error.code.clone().unwrap_or_else(|| "FETCH".to_owned()),
                    format!(
                        "the {} lane of {label} failed: {}; the backfill stopped at {} \
                         (`backfill --resume` continues from there)",
                        poll.lane.as_str(),
                        error.message,
                        cursor_text(reached.as_ref())
                    ),
                ));
            }
            if poll.lane == Lane::Backfill {
                ran = true;
                events += poll.events;
            }
        }
        let report = engine.inspect().await?;
        let now = state(&report)?;
        let pages = progress.backfill_pages.load(Ordering::Relaxed);
        eprintln!(
            "backfill {label}: {pages} pages, {events} events, cursor {}",
            cursor_text(now.as_ref())
        );
        let retry_in = now
            .as_ref()
            .and_then(|p| p.retry_at)
            .map(|at| at.saturating_sub(report.generated_at))
            .filter(|ms| *ms > 0);
        match now {
            Some(progress) if progress.done => break progress,
            Some(_) if ran => ticks_without_progress = 0,
            _ if result.skipped_leased > 0 => {
                // Another instance holds the key (a running daemon backfills it too), or a
                // killed process's lease has not expired yet: look again shortly.
                eprintln!("{label} is held by another instance; waiting");
                SystemClock.sleep(Duration::from_secs(1)).await;
            }
            _ if retry_in.is_some() => {
                // The lane backs off after a failure of an earlier run.
                let ms = retry_in.unwrap_or_default().clamp(0, 60_000);
                eprintln!("the backfill lane of {label} retries in {ms} ms; waiting");
                SystemClock
                    .sleep(Duration::from_millis(ms.unsigned_abs()))
                    .await;
            }
            _ => {
                ticks_without_progress += 1;
                if ticks_without_progress >= 3 {
                    return Err(CliError::new(
                        "NOT_RUNNING",
                        format!(
                            "the backfill of {label} does not run (is the key paused? see \
                             `inspect`); it stopped at {}",
                            cursor_text(now.as_ref())
                        ),
                    ));
                }
            }
        }
    };
    let pages = progress.backfill_pages.load(Ordering::Relaxed);
    let text = format!(
        "backfill of {label} done: {pages} pages, {events} events, cursor {}",
        cursor_text(Some(&done))
    );
    let json = json!({
        "poller": poller,
        "partition": partition,
        "done": true,
        "pages": pages,
        "events": events,
        "cursor": done.cursor,
    });
    Ok((Output::new(text, json), EXIT_OK))
}

fn cursor_text(progress: Option<&BackfillProgress>) -> String {
    match progress.and_then(|p| p.cursor.as_ref()) {
        Some(cursor) => cursor.to_string(),
        None => "the beginning".to_owned(),
    }
}

fn key_label(poller: &str, partition: &str) -> String {
    if partition.is_empty() {
        format!("'{poller}'")
    } else {
        format!("'{poller}' partition '{partition}'")
    }
}
