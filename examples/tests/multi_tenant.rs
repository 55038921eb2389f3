//! Runs the `multi_tenant` example (no services needed) and checks that each tenant was polled
//! with its own credentials: initech fails with its stale token, then catches up after rotation.

mod common;

use std::process::Command;

#[test]
fn multi_tenant_polls_each_tenant_with_its_own_token() {
    let output = Command::new(env!("CARGO_BIN_EXE_multi_tenant"))
        .output()
        .expect("the multi_tenant binary runs");
    common::printed(
        "multi_tenant",
        &output,
        &[
            "[acme] created inv-1 -> open 100",
            "[globex] created inv-2 -> paid 40",
            "api[initech]: 401 (wrong token)",
            "[initech] cycle failed: GET ",
            "[acme] updated inv-1 -> paid 100",
            "[initech] created inv-7 -> open 999",
            "inspect: invoices/initech: 1 items, 1 delivered, last error: -",
        ],
    );
}
