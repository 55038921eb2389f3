//! What the example tests share.

use std::process::Output;

/// The standard output of an example's run, after checking that it exited 0 and printed each of
/// `expected` (a part of a line); a failure shows what it printed on both outputs.
pub(crate) fn printed(what: &str, output: &Output, expected: &[&str]) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{what} failed: {:?}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    for expected in expected {
        assert!(
            stdout.contains(expected),
            "{what}: no {expected:?} in:\n{stdout}"
        );
    }
    stdout
}
