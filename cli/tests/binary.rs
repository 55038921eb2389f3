//! The built `watukuy` binary: exit codes, stdout and stderr, on every store.

mod common;

use std::sync::Arc;

use common::{Backend, Kind, engine, failing, on, text, watukuy};
use watukuy_testkit::world::{POLLER, World};

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|a| (*a).to_owned()).collect()
}

/// Seeds a store through an engine, then runs the binary on it: inspect (exit 0, JSON and
/// table), parked retry (the store changes), an unknown poller (exit 1).
async fn binary_on(b: Arc<Backend>) {
    let world = World::new(3, 10).unwrap();
    let consumer = failing(&["item-002"]);
    let engine = engine(&world, &b.store, &consumer);
    world.tick(&engine).await.unwrap();
    let key = watukuy_testkit::world::key();

    let out = watukuy(&b.argv(&["inspect", "--json"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["pollers"][0]["poller"], POLLER);
    assert_eq!(report["pollers"][0]["parked"], 1);
    assert_eq!(report["pollers"][0]["items"], 3);

    let out = watukuy(&b.argv(&["inspect"]));
    assert_eq!(out.status.code(), Some(0));
    let table = text(&out.stdout);
    assert!(
        table.contains("POLLER") && table.contains("LAST ERROR"),
        "{table}"
    );

    let out = watukuy(&b.argv(&["parked", "retry", "--poller", POLLER]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("1 parked event(s)"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(b.store.counts(&key).await.map(|c| c.parked).unwrap(), 0);
    assert_eq!(b.store.counts(&key).await.map(|c| c.pending).unwrap(), 1);

    let out = watukuy(&b.argv(&["parked", "discard", "--poller", "nope"]));
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with("error (UNKNOWN_POLLER): unknown poller 'nope'"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
}

#[tokio::test]
async fn sqlite() {
    on(Kind::Sqlite, "binary", binary_on).await;
}

/// A cycle whose every item failed validation shows in `inspect`'s "needs attention" notes.
#[tokio::test]
async fn inspect_points_at_a_cycle_that_quarantined_its_items() {
    on(Kind::Sqlite, "quarantined", |b: Arc<Backend>| async move {
        let world = World::new(3, 10).unwrap();
        let poller = world
            .poller(watukuy_testkit::world::StrategyKind::Timestamp)
            .check(|_: &serde_json::Value| {
                Err(vec![watukuy_core::store::ValidationIssue {
                    message: "a number where a string was expected".into(),
                    path: None,
                }])
            })
            .build()
            .unwrap();
        let engine = world
            .engine(Arc::clone(&b.store), "node-a", poller, 7)
            .unwrap();
        world.tick(&engine).await.unwrap();

        let out = watukuy(&b.argv(&["inspect"]));
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let report = text(&out.stdout);
        assert!(
            report.contains("the last live cycle quarantined 3 of 3 items as invalid"),
            "{report}"
        );
    })
    .await;
}

#[watukuy_testenv::requires(postgres)]
#[tokio::test]
async fn postgres() {
    on(Kind::Postgres, "binary", binary_on).await;
}

#[watukuy_testenv::requires(redis)]
#[tokio::test]
async fn redis() {
    on(Kind::Redis, "binary", binary_on).await;
}

#[test]
fn bad_store_urls_exit_1_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let missing = format!("sqlite:{}", dir.path().join("missing.db").display());
    let not_a_db = dir.path().join("notes.txt");
    std::fs::write(&not_a_db, "these are not the tables you are looking for").unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            args(&["--store", "mongodb://root:hunter2@db/app", "inspect"]),
            "error (CONFIG): unsupported store URL 'mongodb://root:***@db/app'",
        ),
        (
            args(&["--store", "watukuy.db", "inspect"]),
            "error (CONFIG): unsupported store URL",
        ),
        (
            args(&["--store", &missing, "inspect"]),
            "error (STORE): no SQLite database at",
        ),
        (
            args(&["--store", &format!("sqlite:{}", not_a_db.display()), "keys"]),
            "is not a SQLite database",
        ),
        (
            args(&[
                "--store",
                "postgres://nobody:secret@127.0.0.1:1/none",
                "inspect",
            ]),
            "cannot connect to PostgreSQL at 127.0.0.1:1",
        ),
        (
            args(&["--store", "redis://127.0.0.1:1", "inspect"]),
            "cannot connect to Redis at 127.0.0.1:1",
        ),
    ];
    for (argv, expected) in cases {
        let out = watukuy(&argv);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{argv:?}: {stderr}");
        assert!(stderr.contains(expected), "{argv:?}: {stderr}");
        assert!(
            !stderr.contains("hunter2") && !stderr.contains("secret"),
            "{stderr}"
        );
    }
}

#[test]
fn usage_errors_exit_2() {
    for argv in [
        args(&[]),
        args(&["frobnicate"]),
        args(&["--store", "sqlite:x.db", "pause"]),
        args(&[
            "--store",
            "sqlite:x.db",
            "parked",
            "ls",
            "--poller",
            "a",
            "--kind",
            "weird",
        ]),
        args(&["inspect"]),
        args(&["--store", "redis://127.0.0.1:1", "--schema", "s", "keys"]),
    ] {
        let out = watukuy(&argv);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{argv:?}: {}",
            text(&out.stderr)
        );
        assert!(text(&out.stderr).starts_with("error"), "{argv:?}");
    }
    let out = watukuy(&args(&["--help"]));
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout).contains("Exit codes: 0 ok, 1 error"));
    let out = watukuy(&args(&["--version"]));
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout).starts_with("watukuy "));
}

/// `watukuy admin --listen`: the page of a store, read-only without `WATUKUY_ADMIN_TOKEN`,
/// behind the token and writable with it; SIGTERM stops it with exit code 0.
#[tokio::test]
async fn admin_listens_until_sigterm_and_takes_its_token_from_the_environment() {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

    async fn get(base: &str, path: &str, token: Option<&str>) -> String {
        let host = base.trim_start_matches("http://");
        let mut stream = tokio::net::TcpStream::connect(host).await.unwrap();
        let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Connection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    let b = Arc::new(Backend::fresh(Kind::Sqlite, "admin").await.unwrap());
    let world = World::new(2, 10).unwrap();
    let consumer = failing(&[]);
    world
        .tick(&engine(&world, &b.store, &consumer))
        .await
        .unwrap();
    for token in [None, Some("s3cret-token")] {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_watukuy"));
        command
            .args(b.argv(&["admin", "--listen", "127.0.0.1:0"]))
            .env_remove("WATUKUY_STORE")
            .env_remove("WATUKUY_ADMIN_TOKEN")
            .stderr(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true);
        if let Some(token) = token {
            command.env("WATUKUY_ADMIN_TOKEN", token);
        }
        let mut child = command.spawn().unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let line = lines.next_line().await.unwrap().unwrap();
        let base = line
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("{line}"))
            .to_owned();
        match token {
            None => {
                let info = get(&base, "/api/info", None).await;
                assert!(info.contains("\"mode\":\"read-only\""), "{info}");
                let pollers = get(&base, "/api/pollers", None).await;
                assert!(
                    pollers.contains(&format!("\"poller\":\"{POLLER}\"")),
                    "{pollers}"
                );
            }
            Some(token) => {
                let denied = get(&base, "/api/info", None).await;
                assert!(denied.starts_with("HTTP/1.1 401"), "{denied}");
                assert!(!denied.contains(token), "the token is never echoed");
                let info = get(&base, "/api/info", Some(token)).await;
                assert!(info.contains("\"mode\":\"read-write\""), "{info}");
            }
        }
        let pid = child.id().unwrap().to_string();
        let killed = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        assert!(killed.success());
        let status = child.wait().await.unwrap();
        assert_eq!(status.code(), Some(0));
        assert_eq!(
            lines.next_line().await.unwrap().as_deref(),
            Some("SIGTERM: stopping")
        );
    }
}
