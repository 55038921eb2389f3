//! TLS (`rediss://`, rustls on ring) against private `redis-server`s started with TLS on spare
//! loopback ports, with a throwaway certificate authority made in the test (rcgen): a verified
//! connection works (options or URL parameters, the store and the budget store), mutual TLS
//! works with a client certificate, and what cannot work is a clear error — a certificate signed
//! by an authority the client does not trust is a permanent `Config` error; plain text to a
//! TLS-only port says to use `rediss://`, and TLS to a plain-text port that it may be one.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::servers::{RedisProcess, base_args, free_port};
use rcgen::{
    BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use watukuy_core::budget::{BucketPolicy, BudgetStore, Take};
use watukuy_core::{
    Error,
    store::{CommitBatch, PKey, Store},
};
use watukuy_store_redis::{RedisBudgetStore, RedisOptions, RedisStore};

const T0: i64 = 1_767_225_600_000;

/// PEM files of one throwaway authority, a server certificate it signed (for `localhost` and
/// `127.0.0.1`), a client certificate it signed, and an unrelated authority.
struct Pki {
    dir: tempfile::TempDir,
    ca: String,
    other_ca: String,
    client_cert: String,
    client_key: String,
}

impl Pki {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let (ca, issuer) = authority("watukuy test CA");
        let (other_ca, _) = authority("someone else's CA");
        let server_key = KeyPair::generate().expect("a server key");
        let mut server =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .expect("server names");
        server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server_cert = server
            .signed_by(&server_key, &issuer)
            .expect("sign the server certificate");
        let client_key = KeyPair::generate().expect("a client key");
        let mut client = CertificateParams::new(vec!["watukuy-client".to_owned()]).expect("client");
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client_cert = client
            .signed_by(&client_key, &issuer)
            .expect("sign the client certificate");
        let pki = Self {
            dir,
            ca,
            other_ca,
            client_cert: client_cert.pem(),
            client_key: client_key.serialize_pem(),
        };
        pki.write("ca.pem", &pki.ca);
        pki.write("server.pem", &server_cert.pem());
        pki.write("server.key", &server_key.serialize_pem());
        pki.write("client.pem", &pki.client_cert);
        pki.write("client.key", &pki.client_key);
        pki
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn write(&self, name: &str, text: &str) {
        std::fs::write(self.path(name), text).expect("write a PEM file");
    }

    /// A `redis-server` with a TLS port and a plain-text port; `client_auth`: clients must show
    /// a certificate the authority signed.
    fn server(&self, client_auth: bool) -> Tls {
        let tls_port = free_port();
        let plain_port = free_port();
        let mut args = base_args(self.dir.path(), tls_port);
        let path = |name: &str| self.path(name).to_string_lossy().into_owned();
        args.extend([
            "--port".to_owned(),
            plain_port.to_string(),
            "--tls-port".to_owned(),
            tls_port.to_string(),
            "--tls-cert-file".to_owned(),
            path("server.pem"),
            "--tls-key-file".to_owned(),
            path("server.key"),
            "--tls-ca-cert-file".to_owned(),
            path("ca.pem"),
            "--tls-auth-clients".to_owned(),
            if client_auth { "yes" } else { "no" }.to_owned(),
        ]);
        let process = RedisProcess::start(tls_port, &args).unwrap_or_else(|e| panic!("{e}"));
        Tls {
            _process: process,
            tls_port,
            plain_port,
        }
    }
}

/// A self-signed authority: its PEM certificate and what signs with it.
fn authority(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let key = KeyPair::generate().expect("a CA key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let cert = params.self_signed(&key).expect("self-sign the CA");
    (cert.pem(), Issuer::new(params, key))
}

/// A running TLS server.
struct Tls {
    _process: RedisProcess,
    tls_port: u16,
    plain_port: u16,
}

fn options(prefix: &str) -> RedisOptions {
    RedisOptions::default()
        .prefix(prefix)
        .connect_timeout(Duration::from_secs(5))
        .response_timeout(Duration::from_secs(5))
        .reconnect_attempts(0)
}

/// Leases, a fenced commit, the outbox and a budget over the connection.
async fn exercise(store: &RedisStore) {
    store.migrate().await.expect("migrate over TLS");
    let key = PKey::new("orders", "tls");
    let lease = store
        .acquire_lease(&key, "node-a", 30_000, T0)
        .await
        .expect("acquire over TLS")
        .expect("a free lease");
    let batch = CommitBatch::default().upserts(vec![watukuy_core::store::ItemRow {
        identity: "o1".to_owned(),
        version: Some("v1".to_owned()),
        hash: "h".to_owned(),
        schema_version: 1,
        payload: None,
        seen_at: T0,
    }]);
    store
        .commit_poll(&key, &lease, &batch)
        .await
        .expect("commit over TLS");
    assert_eq!(store.counts(&key).await.expect("counts").items, 1);
    let budgets: RedisBudgetStore = store.budget_store();
    let policy = BucketPolicy {
        requests: 5,
        per_ms: 1000,
        burst: 5,
    };
    assert!(matches!(
        budgets
            .take("api", 1, &policy, T0)
            .await
            .expect("a budget over TLS"),
        Take::Granted { remaining: 4 }
    ));
    assert!(store.purge().await.expect("purge") >= 3);
}

fn config_option(err: &Error) -> Option<&str> {
    match err {
        Error::Config { option, .. } => Some(option),
        _ => None,
    }
}

/// A server certificate signed by the authority given (as options, by IP or by name, or as a
/// file named in the URL, as the command line passes it) verifies, and the store works.
#[watukuy_testenv::requires(redis_server)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verified_tls_connection_works() {
    let pki = Pki::new();
    let server = pki.server(false);
    for host in ["127.0.0.1", "localhost"] {
        let url = format!("rediss://{host}:{}", server.tls_port);
        let store = RedisStore::connect(&url, options("tls:opt:").tls_ca_pem(pki.ca.clone()))
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        exercise(&store).await;
    }
    let ca = pki.path("ca.pem").to_string_lossy().into_owned();
    let url = format!(
        "rediss://127.0.0.1:{}/0?tls_ca_file={}",
        server.tls_port,
        ca.replace('%', "%25").replace(' ', "%20")
    );
    let store = RedisStore::connect(&url, options("tls:url:"))
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    exercise(&store).await;
    let budgets = RedisBudgetStore::connect(&url, options("tls:budget:"))
        .await
        .expect("a budget store over TLS");
    let policy = BucketPolicy {
        requests: 1,
        per_ms: 1000,
        burst: 1,
    };
    assert!(matches!(
        budgets.take("api", 1, &policy, T0).await.expect("take"),
        Take::Granted { .. }
    ));
}

/// A certificate signed by an authority the client does not trust — another one, or the
/// system's roots only — is a permanent configuration error naming `redis.tls_ca`, right away.
#[watukuy_testenv::requires(redis_server)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_authority_is_a_permanent_config_error() {
    let pki = Pki::new();
    let server = pki.server(false);
    let url = format!("rediss://127.0.0.1:{}", server.tls_port);
    for (what, options) in [
        (
            "another CA",
            options("tls:").tls_ca_pem(pki.other_ca.clone()),
        ),
        ("the system roots", options("tls:")),
    ] {
        let err = RedisStore::connect(&url, options)
            .await
            .expect_err("an untrusted certificate was accepted");
        assert_eq!(config_option(&err), Some("redis.tls_ca"), "{what}: {err}");
        assert!(!err.is_transient(), "{what}: {err}");
        let text = err.to_string();
        assert!(
            text.contains("certificate")
                && text.contains(&format!("127.0.0.1:{}", server.tls_port)),
            "{what}: {text}"
        );
    }
    // Text that holds no certificate is refused before any connection.
    let err = RedisStore::connect(&url, options("tls:").tls_ca_pem("not a certificate"))
        .await
        .expect_err("a bad CA was accepted");
    assert_eq!(config_option(&err), Some("redis.tls_ca"), "{err}");
    let err = RedisStore::connect(
        &format!("{url}/?tls_ca_file={}", pki.path("missing.pem").display()),
        options("tls:"),
    )
    .await
    .expect_err("a missing CA file was accepted");
    assert_eq!(config_option(&err), Some("redis.url"), "{err}");
    assert!(err.to_string().contains("tls_ca_file"), "{err}");
}

/// Plain text to a TLS-only port fails clearly (the message says to use `rediss://`), and TLS to
/// a plain-text port is a permanent configuration error.
#[watukuy_testenv::requires(redis_server)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_text_and_tls_ports_are_not_mixed_up() {
    let pki = Pki::new();
    let server = pki.server(false);
    let err = RedisStore::connect(
        &format!("redis://127.0.0.1:{}", server.tls_port),
        options("tls:"),
    )
    .await
    .expect_err("plain text to a TLS port succeeded");
    let text = err.to_string();
    assert!(text.contains("rediss://"), "{text}");
    assert!(text.contains(&server.tls_port.to_string()), "{text}");
    eprintln!("plain text to the TLS port: {text}");

    // A plain-text server reads the TLS hello as the start of an inline command and waits for
    // the rest: the connection times out, and says why it may have.
    let err = RedisStore::connect(
        &format!("rediss://127.0.0.1:{}", server.plain_port),
        options("tls:")
            .tls_ca_pem(pki.ca.clone())
            .connect_timeout(Duration::from_secs(1)),
    )
    .await
    .expect_err("TLS to a plain-text port succeeded");
    assert!(err.to_string().contains("plain-text port"), "{err}");
    eprintln!("TLS to the plain-text port: {err}");
}

/// A server that requires client certificates lets in the client that shows one its authority
/// signed, and turns away one without (a permanent error, not a retry loop).
#[watukuy_testenv::requires(redis_server)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_needs_the_client_certificate() {
    let pki = Pki::new();
    let server = pki.server(true);
    let url = format!("rediss://localhost:{}", server.tls_port);
    let store = RedisStore::connect(
        &url,
        options("mtls:")
            .tls_ca_pem(pki.ca.clone())
            .tls_client_auth(pki.client_cert.clone(), pki.client_key.clone()),
    )
    .await
    .expect("mutual TLS with the client certificate");
    exercise(&store).await;
    let by_url = format!(
        "{url}/?tls_ca_file={}&tls_cert_file={}&tls_key_file={}",
        file(&pki.path("ca.pem")),
        file(&pki.path("client.pem")),
        file(&pki.path("client.key"))
    );
    let store = RedisStore::connect(&by_url, options("mtls:url:"))
        .await
        .expect("mutual TLS with files named in the URL");
    exercise(&store).await;

    let err = RedisStore::connect(&url, options("mtls:").tls_ca_pem(pki.ca.clone()))
        .await
        .expect_err("a client without a certificate got in");
    assert!(!err.is_transient(), "{err}");
    eprintln!("no client certificate: {err}");
}

fn file(path: &Path) -> String {
    path.to_string_lossy()
        .replace('%', "%25")
        .replace(' ', "%20")
}
