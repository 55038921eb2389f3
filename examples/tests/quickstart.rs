//! The quickstart's promise: with no services, it prints delivered events within seconds, into
//! `./quickstart.sqlite`, and the command it prints shows them.
//!
//! Runs the `quickstart` binary in a temporary working folder with `--for 10` (it stops by
//! itself) and checks its output; runs the inspect command it printed (the command line as a
//! library, on the file that command names, from that folder); runs it again, which carries on
//! from the file, and once more with `--fresh`, which starts over.

mod common;

use std::path::Path;
use std::process::Command;

/// The command the quickstart prints, and README.md shows.
const CLI_COMMAND: &str = "cargo run -p watukuy-cli -- inspect -s sqlite:./quickstart.sqlite";

/// Runs the quickstart in `dir` with `args`; its output, once it succeeded printing `expected`.
fn quickstart(dir: &Path, args: &[&str], expected: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_quickstart"))
        .args(args)
        .current_dir(dir)
        .env_remove("WATUKUY_QUICKSTART_FOR")
        .output()
        .expect("the quickstart binary runs");
    common::printed(&format!("quickstart {args:?}"), &output, expected)
}

/// The numbers of `stopped cleanly: D events delivered, P parked, I items in …`.
fn stopped(stdout: &str) -> (u64, u64, u64) {
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("stopped cleanly: "))
        .unwrap_or_else(|| panic!("no 'stopped cleanly' line in:\n{stdout}"));
    let numbers: Vec<u64> = line
        .split_whitespace()
        .filter_map(|w| w.trim_end_matches(',').parse().ok())
        .collect();
    assert_eq!(numbers.len(), 3, "{line}");
    (numbers[0], numbers[1], numbers[2])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_keeps_its_file_and_prints_the_command_that_inspects_it() {
    let dir = tempfile::tempdir().unwrap();
    let stdout = quickstart(
        dir.path(),
        &["--for", "10"],
        &[
            "a new database: ./quickstart.sqlite",
            "created ord-1001 #1 -> open total 120",
            "retry   ord-1002",
            "created ord-1002 #2 -> open total 75 (attempt 2)",
            "PARKED  ord-1003 after 3 attempts: the warehouse rejects ord-1003",
            "[status] polls ",
            "time is up: stopping",
            "stopped cleanly: ",
            "items in ./quickstart.sqlite",
        ],
    );
    let (_, parked, items) = stopped(&stdout);

    // The printed command, exactly, on a line of its own; README.md shows the same.
    let printed: Vec<&str> = stdout
        .lines()
        .map(str::trim)
        .filter(|l| l.contains("watukuy-cli"))
        .collect();
    assert!(!printed.is_empty(), "no inspect command in:\n{stdout}");
    for line in printed {
        assert_eq!(line, CLI_COMMAND);
    }
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .expect("README.md");
    assert!(
        readme.contains(CLI_COMMAND),
        "README.md does not show {CLI_COMMAND}"
    );

    // The command line reads the file the command names, from the folder the quickstart ran in.
    let args: Vec<&str> = CLI_COMMAND
        .split_once(" -- ")
        .map(|(_, args)| args.split_whitespace().collect())
        .unwrap_or_default();
    let url = args.last().copied().unwrap_or("");
    let relative = url.strip_prefix("sqlite:").expect("a sqlite: URL");
    let file = dir.path().join(relative);
    assert!(file.is_file(), "{} is not there", file.display());
    let mut argv = vec!["watukuy".to_owned()];
    argv.extend(args[..args.len() - 1].iter().map(|a| (*a).to_owned()));
    argv.extend([format!("sqlite:{}", file.display()), "--json".to_owned()]);
    let out = watukuy_cli::run(argv).await.expect("inspect runs");
    let pollers = out.json["pollers"].as_array().expect("pollers");
    assert_eq!(pollers.len(), 1, "{}", out.json);
    assert_eq!(pollers[0]["poller"], "orders");
    assert_eq!(pollers[0]["items"], items, "{}", out.json);
    assert_eq!(pollers[0]["parked"], parked, "{}", out.json);
    assert!(items >= 3 && parked == 1, "{items} items, {parked} parked");

    // The next run carries on from the file...
    let reusing =
        format!("reusing ./quickstart.sqlite from an earlier run: {items} items, {parked} parked");
    quickstart(dir.path(), &["--for", "0"], &[&reusing]);
    // ...and `--fresh` starts over.
    quickstart(
        dir.path(),
        &["--fresh", "--for", "0"],
        &["a new database: ./quickstart.sqlite"],
    );
}
