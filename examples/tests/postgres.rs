//! The PostgreSQL examples (`read_model`, `multi_instance`), run against
//! `WATUKUY_TEST_POSTGRES_URL` (CI sets it). While it is unset the tests are ignored with the
//! reason (docs/testing.md); run anyway, they fail.

use std::process::Command;

use watukuy_conformance::backend_url;

const URL_ENV: &str = "WATUKUY_TEST_POSTGRES_URL";

/// The database URL; a missing one fails the test.
fn postgres_url() -> String {
    backend_url("postgres", URL_ENV).unwrap_or_else(|error| panic!("{error}"))
}

fn run(binary: &str, url: &str) -> String {
    let output = Command::new(binary)
        .args(["--url", url])
        .output()
        .expect("the example binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{binary} failed: {:?}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[watukuy_testenv::requires(postgres)]
#[test]
fn read_model_applies_every_event_exactly_once() {
    let url = postgres_url();
    let stdout = run(env!("CARGO_BIN_EXE_read_model"), &url);
    for expected in [
        "created order-2 #2 (attempt 2): deduplicated",
        "order-2: open, total 75, applied 1 time(s)",
        "read model consistent: every event applied exactly once",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
}

#[watukuy_testenv::requires(postgres)]
#[test]
fn multi_instance_fails_over_when_an_instance_is_killed() {
    let url = postgres_url();
    let stdout = run(env!("CARGO_BIN_EXE_multi_instance"), &url);
    for expected in [
        "--- parent: killed instance b",
        "[a] stopped cleanly",
        "[c] stopped cleanly",
        "fail-over ok: after b was killed, a and c polled all 6 keys",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
}
