//! The PostgreSQL examples (`read_model`, `multi_instance`), run against
//! `WATUKUY_TEST_POSTGRES_URL` (CI sets it). While it is unset the tests are ignored with the
//! reason (docs/testing.md); run anyway, they fail.

mod common;

use std::process::Command;

use watukuy_conformance::backend_url;

const URL_ENV: &str = "WATUKUY_TEST_POSTGRES_URL";

/// The database URL; a missing one fails the test.
fn postgres_url() -> String {
    backend_url("postgres", URL_ENV).unwrap_or_else(|error| panic!("{error}"))
}

/// Runs the example `binary` on the test database and checks that it succeeds and prints every
/// line of `expected`.
fn assert_prints(binary: &str, expected: &[&str]) {
    let output = Command::new(binary)
        .args(["--url", &postgres_url()])
        .output()
        .expect("the example binary runs");
    common::printed(binary, &output, expected);
}

#[watukuy_testenv::requires(postgres)]
#[test]
fn read_model_applies_every_event_exactly_once() {
    assert_prints(
        env!("CARGO_BIN_EXE_read_model"),
        &[
            "created order-2 #2 (attempt 2): deduplicated",
            "order-2: open, total 75, applied 1 time(s)",
            "read model consistent: every event applied exactly once",
        ],
    );
}

#[watukuy_testenv::requires(postgres)]
#[test]
fn multi_instance_fails_over_when_an_instance_is_killed() {
    assert_prints(
        env!("CARGO_BIN_EXE_multi_instance"),
        &[
            "--- parent: killed instance b",
            "[a] stopped cleanly",
            "[c] stopped cleanly",
            "fail-over ok: after b was killed, a and c polled all 6 keys",
        ],
    );
}
