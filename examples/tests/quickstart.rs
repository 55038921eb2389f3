//! The quickstart's promise: with no services, it prints delivered events within seconds.
//!
//! Runs the `quickstart` binary with `--for 10` (it stops by itself) and checks its output.

use std::process::Command;

#[test]
fn quickstart_prints_delivered_events_retries_and_a_parked_event() {
    let output = Command::new(env!("CARGO_BIN_EXE_quickstart"))
        .args(["--for", "10"])
        .output()
        .expect("the quickstart binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "quickstart failed: {:?}\n{stdout}\n{stderr}",
        output.status
    );
    for expected in [
        "created ord-1001 #1 -> open total 120",
        "retry   ord-1002",
        "created ord-1002 #2 -> open total 75 (attempt 2)",
        "PARKED  ord-1003 after 3 attempts: the warehouse rejects ord-1003",
        "[status] polls ",
        "time is up: stopping",
        "stopped cleanly: ",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in the output:\n{stdout}\n{stderr}"
        );
    }
}
