//! SIGTERM stops a long-running example cleanly, as Ctrl-C does: the quickstart daemon, sent
//! SIGTERM once it has delivered events, stops its engine (draining what runs) and prints its
//! clean-stop line, exiting 0.

#![cfg(unix)]

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_quickstart_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_quickstart"))
        .current_dir(dir.path())
        .env_remove("WATUKUY_QUICKSTART_FOR")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the quickstart binary runs");
    let pid = child.id().expect("a running child").to_string();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    // Wait (at most a minute) until it runs as a daemon and has delivered an event.
    let started = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            let delivered = line.trim_start().starts_with("created ");
            seen.push(line);
            if delivered {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(
        started,
        Ok(true),
        "no event delivered:\n{}",
        seen.join("\n")
    );

    let kill = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill runs");
    assert!(kill.success());

    let status = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            seen.push(line);
        }
        child.wait().await.unwrap()
    })
    .await
    .expect("the quickstart stops within a minute of SIGTERM");
    let mut stderr = String::new();
    if let Some(mut err) = child.stderr.take() {
        let _ = err.read_to_string(&mut stderr).await;
    }
    let stdout = seen.join("\n");
    assert!(status.success(), "{status:?}\n{stdout}\n{stderr}");
    assert!(stdout.contains("SIGTERM: stopping"), "{stdout}");
    assert!(stdout.contains("stopped cleanly: "), "{stdout}");
}
