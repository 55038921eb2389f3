//! The `watukuy` binary on PostgreSQL as deployed: over TLS to a server that accepts only TLS
//! (a certificate authority made in the test), and through PgBouncer in transaction mode. The
//! servers are private ones the test starts (store-postgres' tests/servers, docs/testing.md).

#![cfg(feature = "tls")]

mod common;
#[path = "../../store-postgres/tests/servers/mod.rs"]
mod servers;

use std::sync::LazyLock;

use common::{text, watukuy};
use servers::{Access, Bouncer, PgServer, TestCa};

static TLS_SERVER: LazyLock<PgServer> = LazyLock::new(|| {
    PgServer::start(Access::TlsOnly(TestCa::new(
        "the server's CA",
        &["localhost"],
    )))
});

static BOUNCER: LazyLock<Bouncer> = LazyLock::new(Bouncer::start);

#[watukuy_testenv::requires(postgres_server)]
#[test]
fn verified_tls_by_url_and_a_wrong_ca_is_a_config_error() {
    let server = &*TLS_SERVER;
    let ca = server.write_file(
        "cli-ca.pem",
        &server.ca.as_ref().expect("a TLS server").ca_pem,
    );
    let url = format!(
        "postgres://postgres@localhost:{}/postgres?sslmode=verify-full&sslrootcert={}",
        server.port,
        ca.display()
    );
    for command in [["migrate"], ["keys"]] {
        let out = watukuy(&[command[0], "--store", &url, "--schema", "cli_tls"]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    }

    let wrong = server.write_file(
        "cli-wrong-ca.pem",
        &TestCa::new("another CA", &["localhost"]).ca_pem,
    );
    let url = format!(
        "postgres://postgres@localhost:{}/postgres?sslmode=verify-full&sslrootcert={}",
        server.port,
        wrong.display()
    );
    let out = watukuy(&["keys", "--store", &url]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with("error (CONFIG):")
            && stderr.contains("not signed by a trusted certificate authority"),
        "{stderr}"
    );
}

#[watukuy_testenv::requires(postgres_server, pgbouncer)]
#[test]
fn through_pgbouncer_in_transaction_mode() {
    let url = BOUNCER.url();
    for command in [["migrate"], ["keys"]] {
        let out = watukuy(&[
            command[0],
            "--store",
            &url,
            "--schema",
            "cli_pooled",
            "--transaction-pooling",
        ]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    }
    let out = watukuy(&["keys", "--store", &url, "--schema", "cli_pooled"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("unsupported startup parameter") && stderr.contains("transaction_pooling"),
        "{stderr}"
    );
}
