#![doc = include_str!("../README.md")]

pub mod args;
mod ops;
mod render;
mod serve;
mod service;
mod url;

use std::ffi::OsString;
use std::io::Write;
use std::sync::Arc;

use clap::Parser;
use serde_json::json;
use watukuy_core::{
    ErrorCode,
    clock::{Clock, SystemClock},
    store::{PKey, StoreErrorKind},
};

use args::{Cli, Command};
pub use ops::{CLI_LEASE_TTL_MS, CLI_OWNER, KeyInspect, REPLAY_PAGE, Report, Session};
pub use service::{BuildFuture, Service};
pub use url::{StoreOptions, StoreUrl};

/// Exit code of a successful command.
pub const EXIT_OK: u8 = 0;
/// Exit code of a failed command (the error is printed as `error (<CODE>): message`).
pub const EXIT_ERROR: u8 = 1;
/// Exit code of a command line that does not parse, or of options that do not fit together.
pub const EXIT_USAGE: u8 = 2;
/// Exit code of `run` (or `admin`) stopped by a second SIGINT or SIGTERM before the first stop
/// finished (128 + SIGINT, as shells report an interrupted program).
pub const EXIT_INTERRUPTED: u8 = 130;

/// Why a command failed: a stable code, a message for people, and the process exit code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CliError {
    /// `USAGE`, `CONFIG`, `STORE`, `UNKNOWN_POLLER`, `UNKNOWN_PARTITION`, `NOT_FOUND`,
    /// `REPLAY_UNAVAILABLE`, or any other [`ErrorCode`] of watukuy.
    pub code: String,
    /// What went wrong, and when it helps, what to do.
    pub message: String,
    /// [`EXIT_ERROR`] or [`EXIT_USAGE`].
    pub exit_code: u8,
}

impl CliError {
    /// An error (exit code 1) with a code and a message.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
            exit_code: EXIT_ERROR,
        }
    }

    /// A `CONFIG` error (exit code 1): a value the command cannot use.
    pub fn config(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Config.as_str(), message)
    }

    /// A `USAGE` error (exit code 2): options that do not fit together.
    pub fn usage(message: impl Into<String>) -> Self {
        Self {
            code: "USAGE".to_owned(),
            message: message.into(),
            exit_code: EXIT_USAGE,
        }
    }
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "error ({}): {}", self.code, self.message)
    }
}

impl std::error::Error for CliError {}

impl From<watukuy_core::Error> for CliError {
    fn from(error: watukuy_core::Error) -> Self {
        // The stores' messages already carry what the driver said, and where.
        let mut message = error.to_string();
        if let watukuy_core::Error::Store {
            kind: StoreErrorKind::Schema,
            ..
        } = &error
        {
            message.push_str(
                " (is this the right store, schema and prefix? `watukuy migrate` creates the schema)",
            );
        }
        Self::new(error.code().as_str(), message)
    }
}

/// What a command produced: the text for people and the value `--json` prints.
#[derive(Clone, Debug, PartialEq)]
pub struct Output {
    /// The readable output (ends with a newline).
    pub text: String,
    /// The machine-readable output.
    pub json: serde_json::Value,
}

impl Output {
    pub(crate) fn new(text: impl Into<String>, json: serde_json::Value) -> Self {
        let mut text = text.into();
        if !text.ends_with('\n') {
            text.push('\n');
        }
        Self { text, json }
    }

    /// What the process prints on stdout: the JSON (pretty) or the text.
    pub fn render(&self, as_json: bool) -> String {
        if as_json {
            let mut text = serde_json::to_string_pretty(&self.json).unwrap_or_default();
            text.push('\n');
            text
        } else {
            self.text.clone()
        }
    }
}

/// How [`run_with`] runs: the clock, and how patiently `replay` waits for a key's lease.
#[derive(Clone)]
pub struct RunOptions {
    /// The clock (default: the system clock).
    pub clock: Arc<dyn Clock>,
    /// Tries to take a key's lease for `replay` (default 20, 250 ms apart).
    pub lease_tries: u32,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            clock: Arc::new(SystemClock),
            lease_tries: 20,
        }
    }
}

impl std::fmt::Debug for RunOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunOptions")
            .field("lease_tries", &self.lease_tries)
            .finish_non_exhaustive()
    }
}

/// Parses `argv` (its first item is the program name) and runs the command. `--help` and
/// `--version` come back as an [`Output`] (their text); a command line that does not parse is
/// a `USAGE` [`CliError`] with exit code 2 and clap's message.
pub async fn run<I, T>(argv: I) -> Result<Output, CliError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    run_with(argv, RunOptions::default()).await
}

/// [`run`] with another clock or lease patience (tests).
pub async fn run_with<I, T>(argv: I, options: RunOptions) -> Result<Output, CliError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match parse_args(argv) {
        Ok(cli) => cli,
        Err(help) if help.exit_code == EXIT_OK => {
            return Ok(Output::new(help.message, serde_json::Value::Null));
        }
        Err(error) => return Err(error),
    };
    execute(&cli, options).await
}

/// Parses `argv` (its first item is the program name) as `watukuy` does. A command line that
/// does not parse is a `USAGE` [`CliError`] with exit code 2 and clap's message, with the
/// password of any store URL in it hidden; `--help` and `--version` are a `HELP` one with exit
/// code 0 and their text.
pub fn parse_args<I, T>(argv: I) -> Result<Cli, CliError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let argv: Vec<OsString> = argv.into_iter().map(Into::into).collect();
    Cli::try_parse_from(&argv)
        .map_err(|error| clap_error(error, &argv, |hidden| Cli::try_parse_from(hidden).err()))
}

/// clap's refusal of `argv` as the command line reports it: a `USAGE` error (exit code 2), or
/// for `--help` and `--version` a `HELP` one (exit code 0) carrying their text.
///
/// clap quotes the arguments it did not expect, a store URL typed in the wrong place too: when
/// an argument holds a password, the message is `reparse`'s, clap's refusal of the same command
/// line with every password hidden.
pub(crate) fn clap_error(
    error: clap::Error,
    argv: &[OsString],
    reparse: impl FnOnce(&[OsString]) -> Option<clap::Error>,
) -> CliError {
    let hidden: Vec<OsString> = argv
        .iter()
        .map(|arg| {
            let text = arg.to_string_lossy();
            let redacted = url::redact(&text);
            if redacted == text {
                arg.clone()
            } else {
                redacted.into()
            }
        })
        .collect();
    let error = if hidden == argv {
        error
    } else {
        match reparse(&hidden) {
            Some(error) => error,
            None => {
                return CliError::usage(
                    "the command line does not parse (not shown: it holds a password)",
                );
            }
        }
    };
    let text = error.render().to_string();
    if error.use_stderr() {
        CliError::usage(text.trim_end().trim_start_matches("error: "))
    } else {
        // --help, --version: not an error; carried out of the parser as the output.
        CliError {
            code: "HELP".to_owned(),
            message: text,
            exit_code: EXIT_OK,
        }
    }
}

/// Opens the store named by `cli` and runs its command.
pub async fn execute(cli: &Cli, options: RunOptions) -> Result<Output, CliError> {
    let (url, store_options) = url::store_from(&cli.common, None, None)?;
    let create = matches!(cli.command, Command::Migrate);
    let store = url.open(&store_options, create).await?;
    if let Command::Admin(admin) = &cli.command {
        let state = watukuy_admin::AdminState::from_store(Arc::clone(&store));
        let outcome = serve::until_signal(&admin.listen, serve::admin_app(state)).await;
        let _ = store.close().await;
        return outcome;
    }
    let session = Session::new(Arc::clone(&store), url.to_string())
        .with_clock(options.clock)
        .with_lease_retry(options.lease_tries, std::time::Duration::from_millis(250));
    let outcome = command(&session, &cli.command).await;
    // Close the pool or connection; what matters is the command's outcome.
    let _ = store.close().await;
    outcome
}

/// Runs one command on an open session.
pub async fn command(session: &Session, command: &Command) -> Result<Output, CliError> {
    use args::ParkedAction;
    match command {
        Command::Migrate => {
            session.migrate().await?;
            Ok(Output::new("migrated", json!({ "migrated": true })))
        }
        Command::Inspect(select) => {
            let report = session
                .inspect(select.poller.as_deref(), select.partition.as_deref())
                .await?;
            report_output(&report)
        }
        Command::Keys(filter) => {
            let keys = session.keys(filter.poller.as_deref()).await?;
            let rows: Vec<Vec<String>> = keys
                .iter()
                .map(|k| vec![k.poller.clone(), partition_label(k)])
                .collect();
            let text = if rows.is_empty() {
                "no keys in this store yet\n".to_owned()
            } else {
                render::table(&["POLLER", "PARTITION"], &rows)
            };
            Ok(Output::new(text, to_json(&keys)?))
        }
        Command::Parked { action } => {
            let (args, verb) = match action {
                ParkedAction::Ls(a) => (a, "ls"),
                ParkedAction::Retry(a) => (a, "retry"),
                ParkedAction::Discard(a) => (a, "discard"),
            };
            let key = session
                .key(&args.target.poller, args.target.partition.as_deref())
                .await?;
            let ids = args.ids.as_deref();
            let kind = args.kind.map(Into::into);
            match verb {
                "ls" => {
                    let rows = session.parked(&key, ids, kind, args.limit).await?;
                    Ok(Output::new(
                        render::parked(&rows, session.now()),
                        to_json(&rows)?,
                    ))
                }
                "retry" => {
                    let moved = session.retry_parked(&key, ids, kind).await?;
                    let text = format!(
                        "{} parked event(s) of {} moved back to the outbox; the key's next run \
                         delivers them (`watukuy trigger` makes it due now)",
                        moved.len(),
                        key_label(&key)
                    );
                    Ok(Output::new(
                        text,
                        json!({ "retried": moved.len(), "ids": moved }),
                    ))
                }
                _ => {
                    let removed = session.discard_parked(&key, ids, kind).await?;
                    let text = format!(
                        "{} parked row(s) of {} discarded",
                        removed.len(),
                        key_label(&key)
                    );
                    Ok(Output::new(
                        text,
                        json!({ "discarded": removed.len(), "ids": removed }),
                    ))
                }
            }
        }
        Command::Pause(t) | Command::Resume(t) | Command::Trigger(t) => {
            let key = session.key(&t.poller, t.partition.as_deref()).await?;
            match command {
                Command::Pause(_) => session.pause(&key).await?,
                Command::Resume(_) => session.resume(&key).await?,
                _ => session.trigger(&key).await?,
            }
            Ok(key_action_output(command, &key))
        }
        Command::ResetCursor(r) => {
            let key = session
                .key(&r.target.poller, r.target.partition.as_deref())
                .await?;
            let to = match r.to.trim() {
                "null" => None,
                text => Some(text),
            };
            session.reset_cursor(&key, to, r.clear_snapshot).await?;
            let text = format!(
                "{}: live cursor set to {}{}; due now",
                key_label(&key),
                to.unwrap_or("the strategy's initial cursor"),
                if r.clear_snapshot {
                    ", snapshot cleared"
                } else {
                    ""
                }
            );
            Ok(Output::new(
                text,
                json!({
                    "action": "reset-cursor",
                    "poller": key.poller,
                    "partition": key.partition,
                    "cursor": to,
                    "clearedSnapshot": r.clear_snapshot,
                }),
            ))
        }
        Command::Replay(r) => {
            let key = session
                .key(&r.target.poller, r.target.partition.as_deref())
                .await?;
            let from = parse_time("--from", &r.from)?;
            let to = r.to.as_deref().map(|t| parse_time("--to", t)).transpose()?;
            if let Some(to) = to
                && to < from
            {
                return Err(CliError::config(format!(
                    "--to ({}) is before --from ({})",
                    render::time(to),
                    render::time(from)
                )));
            }
            let replayed = session.replay(&key, from, to).await?;
            let text = if replayed == 0 {
                format!(
                    "nothing logged on {} in that range (does the poller keep a log? see \
                     PollerBuilder::log)",
                    key_label(&key)
                )
            } else {
                format!(
                    "{replayed} logged event(s) of {} copied to the outbox (lane replay); the \
                     key's next run delivers them",
                    key_label(&key)
                )
            };
            Ok(Output::new(text, json!({ "replayed": replayed })))
        }
        Command::Admin(_) => Err(CliError::usage(
            "`admin` serves until a signal: run it through `execute` or the binary",
        )),
    }
}

/// What `pause`, `resume` and `trigger` print once done on `key`.
pub(crate) fn key_action_output(command: &Command, key: &PKey) -> Output {
    let (action, text) = match command {
        Command::Pause(_) => (
            "paused",
            "paused: it is not polled and its outbox is not delivered until resumed",
        ),
        Command::Resume(_) => ("resumed", "resumed and due now"),
        _ => (
            "triggered",
            "due now (an open circuit stays open: the next run is a probe)",
        ),
    };
    Output::new(
        format!("{}: {text}", key_label(key)),
        json!({ "action": action, "poller": key.poller, "partition": key.partition }),
    )
}

/// What `inspect` prints for `report`.
pub(crate) fn report_output(report: &Report) -> Result<Output, CliError> {
    Ok(Output::new(render::report(report), to_json(report)?))
}

/// The poller a command names, if it names one.
pub(crate) fn poller_of(command: &Command) -> Option<&str> {
    use args::ParkedAction;
    match command {
        Command::Migrate | Command::Admin(_) => None,
        Command::Inspect(select) => select.poller.as_deref(),
        Command::Keys(filter) => filter.poller.as_deref(),
        Command::Parked {
            action: ParkedAction::Ls(a) | ParkedAction::Retry(a) | ParkedAction::Discard(a),
        } => Some(&a.target.poller),
        Command::Pause(t) | Command::Resume(t) | Command::Trigger(t) => Some(&t.poller),
        Command::ResetCursor(r) => Some(&r.target.poller),
        Command::Replay(r) => Some(&r.target.poller),
    }
}

pub(crate) fn to_json<T: serde::Serialize>(value: &T) -> Result<serde_json::Value, CliError> {
    serde_json::to_value(value).map_err(|e| CliError::new("INTERNAL", e.to_string()))
}

fn partition_label(key: &PKey) -> String {
    if key.partition.is_empty() {
        "-".to_owned()
    } else {
        key.partition.clone()
    }
}

fn key_label(key: &PKey) -> String {
    if key.partition.is_empty() {
        format!("'{}'", key.poller)
    } else {
        format!("'{}' partition '{}'", key.poller, key.partition)
    }
}

/// Epoch milliseconds (digits, optionally negative) or an RFC 3339 / ISO 8601 time.
pub fn parse_time(option: &str, text: &str) -> Result<i64, CliError> {
    let text = text.trim();
    let digits = text.strip_prefix('-').unwrap_or(text);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse::<i64>()
            .map_err(|e| CliError::config(format!("{option} '{text}': {e}")));
    }
    if (text.bytes().filter(|b| *b == b'-').count() >= 2 || text.contains(':'))
        && let Some(ms) = watukuy_core::cursor::parse_timestamp(text)
    {
        return Ok(ms);
    }
    Err(CliError::config(format!(
        "{option} '{text}' is neither epoch milliseconds nor an RFC 3339 time (2026-01-01T00:00:00Z)"
    )))
}

/// The whole program: parses `argv`, runs the command on a fresh single-threaded runtime,
/// prints to `stdout` / `stderr` and returns the exit code.
pub fn main_with<I, T>(argv: I, stdout: &mut dyn Write, stderr: &mut dyn Write) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match parse_args(argv) {
        Ok(cli) => cli,
        Err(error) if error.exit_code == EXIT_OK => {
            let _ = write!(stdout, "{}", error.message);
            return EXIT_OK;
        }
        Err(error) => {
            let _ = writeln!(stderr, "error: {}", error.message);
            return error.exit_code;
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            let _ = writeln!(
                stderr,
                "error (INTERNAL): cannot start the runtime: {error}"
            );
            return EXIT_ERROR;
        }
    };
    match runtime.block_on(execute(&cli, RunOptions::default())) {
        Ok(output) => {
            let _ = write!(stdout, "{}", output.render(cli.common.json));
            EXIT_OK
        }
        Err(error) => {
            let _ = writeln!(stderr, "{error}");
            error.exit_code
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_as_ms_or_rfc3339() {
        assert_eq!(parse_time("--from", "0").unwrap(), 0);
        assert_eq!(
            parse_time("--from", "1767225600000").unwrap(),
            1_767_225_600_000
        );
        assert_eq!(
            parse_time("--from", "2026-01-01T00:00:01Z").unwrap(),
            1_767_225_601_000
        );
        assert_eq!(
            parse_time("--from", "2026-01-01").unwrap(),
            1_767_225_600_000
        );
        for bad in ["", "yesterday", "NaN", "12abc"] {
            let error = parse_time("--from", bad).unwrap_err();
            assert_eq!(error.code, "CONFIG", "{bad}");
        }
    }

    #[test]
    fn usage_errors_exit_2_and_help_exits_0() {
        let mut out = Vec::new();
        let mut err = Vec::new();
        assert_eq!(main_with(["watukuy", "frobnicate"], &mut out, &mut err), 2);
        assert!(String::from_utf8_lossy(&err).contains("frobnicate"));
        let mut out = Vec::new();
        assert_eq!(main_with(["watukuy", "--help"], &mut out, &mut err), 0);
        assert!(String::from_utf8_lossy(&out).contains("reset-cursor"));
        let mut err = Vec::new();
        assert_eq!(
            main_with(["watukuy", "pause"], &mut Vec::new(), &mut err),
            2
        );
        assert!(String::from_utf8_lossy(&err).contains("--poller"));
    }

    #[test]
    fn store_errors_keep_their_code() {
        let error: CliError = watukuy_core::Error::UnknownPoller {
            name: "x".into(),
            known: vec!["orders".into()],
        }
        .into();
        assert_eq!(
            (error.code.as_str(), error.exit_code),
            ("UNKNOWN_POLLER", 1)
        );
        assert_eq!(
            error.to_string(),
            "error (UNKNOWN_POLLER): unknown poller 'x' (known pollers: 'orders')"
        );
    }
}
