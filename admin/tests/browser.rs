//! The admin page in a real browser: headless Chromium, driven over WebDriver by chromedriver,
//! loads the page of a running example, sees the poller and its parked event, clicks Retry, and
//! the engine's next run delivers the event (checked through the store). Screenshots are kept in
//! `target/admin-screenshot.png` (and `target/admin-screenshot-after-retry.png`).
//!
//! Needs `chromium` and `chromedriver` (Debian packages `chromium` and `chromium-driver`, which
//! `.ci/run` installs) on `PATH`, or at `WATUKUY_TEST_CHROMIUM` / `WATUKUY_TEST_CHROMEDRIVER`;
//! without them the test is ignored with the reason (docs/testing.md).

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use common::{example, failing};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use watukuy_admin::{AdminState, Mode, router};
use watukuy_core::store::Store;
use watukuy_store_sqlite::{SqliteOptions, SqliteStore};
use watukuy_testkit::world::{Consumer, key};

/// Chromium and chromedriver as found when this test was compiled (`Err`: why not).
const CHROMIUM: Result<&str, &str> = watukuy_testenv::program!("chromium");
const CHROMEDRIVER: Result<&str, &str> = watukuy_testenv::program!("chromedriver");

/// A program the test needs; a missing one fails it.
fn program(found: Result<&'static str, &'static str>) -> &'static str {
    found.unwrap_or_else(|why| panic!("{why}"))
}

/// Turns a hang (a browser that never answers) into a failure; never decides a passing run.
const HANG_GUARD: Duration = Duration::from_secs(120);

/// How long the browser waits for the page to reach a state (a WebDriver script timeout).
const PAGE_WAIT_MS: u64 = 20_000;

/// A minimal WebDriver client: JSON over HTTP/1.1 to chromedriver on loopback.
struct WebDriver {
    port: u16,
    session: String,
}

fn webdriver_value(response: &Value) -> Result<Value, String> {
    let value = response.get("value").cloned().unwrap_or(Value::Null);
    if let Some(error) = value.get("error").and_then(Value::as_str) {
        let message = value.get("message").and_then(Value::as_str).unwrap_or("");
        return Err(format!("{error}: {message}"));
    }
    Ok(value)
}

/// One HTTP request to `127.0.0.1:port`; the body of the answer as JSON. A request that gets
/// no answer within [`HANG_GUARD`] fails.
async fn http(port: u16, method: &str, path: &str, body: Option<&Value>) -> Result<Value, String> {
    eprintln!("webdriver: {method} {path}");
    tokio::time::timeout(HANG_GUARD, http_once(port, method, path, body))
        .await
        .map_err(|_| format!("chromedriver did not answer {method} {path}"))?
}

async fn http_once(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<Value, String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| format!("connect to chromedriver: {e}"))?;
    let body = body.map(Value::to_string).unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    // Read the head, then exactly Content-Length bytes (chromedriver may keep the connection
    // open), or chunks, or up to the end.
    let mut raw = Vec::new();
    let mut buf = [0_u8; 8192];
    let split = loop {
        if let Some(at) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        let n = stream.read(&mut buf).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("chromedriver closed the connection before answering".into());
        }
        raw.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let mut payload = raw[split + 4..].to_vec();
    let length = head.lines().find_map(|line| {
        line.strip_prefix("content-length:")
            .and_then(|v| v.trim().parse::<usize>().ok())
    });
    let chunked = head.contains("transfer-encoding: chunked");
    loop {
        let complete = match length {
            Some(length) => payload.len() >= length,
            None if chunked => payload.windows(5).any(|w| w == b"0\r\n\r\n"),
            None => false,
        };
        if complete {
            break;
        }
        let n = stream.read(&mut buf).await.map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        payload.extend_from_slice(&buf[..n]);
    }
    if let Some(length) = length {
        payload.truncate(length);
    } else if chunked {
        payload = dechunk(&payload)?;
    }
    serde_json::from_slice(&payload).map_err(|e| format!("chromedriver answered non-JSON: {e}"))
}

fn dechunk(mut data: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let line_end = data
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("bad chunk")?;
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&data[..line_end])
                .split(';')
                .next()
                .unwrap_or("")
                .trim(),
            16,
        )
        .map_err(|e| e.to_string())?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        out.extend_from_slice(data.get(..size).ok_or("short chunk")?);
        data = data.get(size + 2..).ok_or("short chunk")?;
    }
}

fn base64_decode(text: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let (mut acc, mut bits) = (0_u32, 0_u32);
    for c in text.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' | b'\n' | b'\r' => continue,
            _ => return Err(format!("not base64: {c}")),
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push(u8::try_from((acc >> bits) & 0xff).unwrap_or(0));
        }
    }
    Ok(out)
}

impl WebDriver {
    async fn start(port: u16, profile: &Path) -> Result<Self, String> {
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--window-size=1400,900",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .chain([format!("--user-data-dir={}", profile.display())])
        .collect::<Vec<_>>();
        let capabilities = json!({
            "capabilities": { "alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": { "binary": program(CHROMIUM), "args": args },
            }}
        });
        let created = webdriver_value(&http(port, "POST", "/session", Some(&capabilities)).await?)?;
        let session = created["sessionId"]
            .as_str()
            .ok_or("no session id")?
            .to_owned();
        let driver = Self { port, session };
        driver
            .cmd(
                "POST",
                "timeouts",
                json!({ "script": PAGE_WAIT_MS, "implicit": 0, "pageLoad": PAGE_WAIT_MS }),
            )
            .await?;
        Ok(driver)
    }

    async fn cmd(&self, method: &str, path: &str, body: Value) -> Result<Value, String> {
        let path = format!("/session/{}/{path}", self.session);
        let body = (method == "POST").then_some(body);
        webdriver_value(&http(self.port, method, &path, body.as_ref()).await?)
    }

    async fn goto(&self, url: &str) -> Result<(), String> {
        self.cmd("POST", "url", json!({ "url": url }))
            .await
            .map(drop)
    }

    /// Waits, in the browser, until `selector` matches an element whose text contains `text`:
    /// a MutationObserver resolves as soon as the DOM gets there, bounded by the session's
    /// script timeout. Returns the element's text.
    async fn wait_for(&self, selector: &str, text: &str) -> Result<String, String> {
        let script = r#"
            const [selector, text, done] = arguments;
            const match = () => {
                const e = document.querySelector(selector);
                return e && e.textContent.includes(text) ? e.textContent : null;
            };
            const now = match();
            if (now !== null) { done(now); return; }
            const observer = new MutationObserver(() => {
                const found = match();
                if (found !== null) { observer.disconnect(); done(found); }
            });
            observer.observe(document, { subtree: true, childList: true, characterData: true, attributes: true });
        "#;
        self.cmd(
            "POST",
            "execute/async",
            json!({ "script": script, "args": [selector, text] }),
        )
        .await
        .map(|v| v.as_str().unwrap_or_default().to_owned())
        .map_err(|e| format!("waiting for {selector:?} containing {text:?}: {e}"))
    }

    /// Finds `selector` and clicks it; the page re-renders its tables every few seconds, so a
    /// click on an element replaced meanwhile is tried again (a bounded number of times).
    async fn click(&self, selector: &str) -> Result<(), String> {
        let mut last = String::new();
        for _ in 0..5 {
            let found = self
                .cmd(
                    "POST",
                    "element",
                    json!({ "using": "css selector", "value": selector }),
                )
                .await;
            let element = match found {
                Ok(e) => e,
                Err(e) => {
                    last = e;
                    continue;
                }
            };
            let id = element
                .as_object()
                .and_then(|o| o.values().next())
                .and_then(Value::as_str)
                .ok_or("no element id")?
                .to_owned();
            match self
                .cmd("POST", &format!("element/{id}/click"), json!({}))
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) if e.starts_with("stale element") => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(format!("clicking {selector:?}: {last}"))
    }

    async fn screenshot(&self, path: &Path) -> Result<(), String> {
        let png = self.cmd("GET", "screenshot", Value::Null).await?;
        let bytes = base64_decode(png.as_str().ok_or("no screenshot")?)?;
        if !bytes.starts_with(b"\x89PNG") {
            return Err("the screenshot is not a PNG".into());
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        }
        std::fs::write(path, bytes).map_err(|e| format!("write {}: {e}", path.display()))
    }

    async fn quit(&self) {
        let path = format!("/session/{}", self.session);
        let _ = http(self.port, "DELETE", &path, None).await;
    }
}

/// Starts chromedriver on a port it picks, and returns the child and the port it reports.
async fn chromedriver() -> Result<(tokio::process::Child, u16), String> {
    let chromedriver = program(CHROMEDRIVER);
    let mut child = tokio::process::Command::new(chromedriver)
        .arg("--port=0")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start {chromedriver}: {e}"))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    while let Some(line) = lines.next_line().await.map_err(|e| e.to_string())? {
        if let Some(rest) = line.split("started successfully on port ").nth(1) {
            let port = rest
                .trim_end_matches('.')
                .trim()
                .parse::<u16>()
                .map_err(|e| format!("chromedriver port in {line:?}: {e}"))?;
            // Keep reading its output so it never blocks on a full pipe.
            tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
            return Ok((child, port));
        }
    }
    Err("chromedriver exited before it was ready".into())
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"),
        PathBuf::from,
    )
}

#[watukuy_testenv::requires(browser)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_from_the_page_delivers_the_parked_event() {
    for found in [CHROMIUM, CHROMEDRIVER] {
        program(found);
    }
    run().await.unwrap_or_else(|e| panic!("{e}"));
}

async fn run() -> Result<(), String> {
    // A running example on a SQLite file: item-002's handler fails until the flag flips.
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let store: Arc<dyn Store> = Arc::new(
        SqliteStore::open(SqliteOptions::file(dir.path().join("watukuy.db")))
            .map_err(|e| e.to_string())?,
    );
    store.migrate().await.map_err(|e| e.to_string())?;
    let consumer = failing(&["item-002"]);
    let (world, engine) = example(4, &store, &consumer);
    world.tick(&engine).await.map_err(|e| e.to_string())?;
    let key = key();
    let parked = store
        .list_parked(&key, watukuy_core::store::ParkedQuery::default())
        .await
        .map_err(|e| e.to_string())?;
    assert_eq!(parked.len(), 1, "item-002 is parked");
    let parked_id = parked[0].id.clone();
    assert!(!consumer.delivered_ids().contains(&parked_id));

    // The admin page, read-write, on a free loopback port.
    let app = router(AdminState::new(engine.clone(), Arc::clone(&store)).mode(Mode::ReadWrite));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let address = listener.local_addr().map_err(|e| e.to_string())?;
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let (mut driver_process, driver_port) = tokio::time::timeout(HANG_GUARD, chromedriver())
        .await
        .map_err(|_| "chromedriver never said it was ready".to_owned())??;
    let profile = tempfile::tempdir().map_err(|e| e.to_string())?;
    let browser = WebDriver::start(driver_port, profile.path()).await?;
    let outcome = drive(
        &browser,
        &format!("http://{address}/"),
        &parked_id,
        &consumer,
    )
    .await;
    browser.quit().await;
    // Ends chromedriver and any browser it still runs, then makes sure it is gone.
    let _ = http(driver_port, "GET", "/shutdown", None).await;
    let _ = driver_process.kill().await;
    server.abort();
    outcome?;

    // The engine's next run delivers the event: checked through the store.
    world.tick(&engine).await.map_err(|e| e.to_string())?;
    assert_eq!(
        store
            .counts(&key)
            .await
            .map(|c| c.parked)
            .map_err(|e| e.to_string())?,
        0
    );
    assert_eq!(
        store
            .counts(&key)
            .await
            .map(|c| c.pending)
            .map_err(|e| e.to_string())?,
        0
    );
    assert!(consumer.delivered_ids().contains(&parked_id), "delivered");
    Ok(())
}

async fn drive(
    browser: &WebDriver,
    url: &str,
    parked_id: &str,
    consumer: &Consumer,
) -> Result<(), String> {
    browser.goto(url).await?;
    // The poller with one parked event.
    let row = browser
        .wait_for("tr.poller[data-poller=\"items\"]", "items")
        .await?;
    assert!(row.contains("closed"), "{row}");
    browser
        .wait_for("tr.poller[data-poller=\"items\"] td.parked-count", "1")
        .await?;
    browser.wait_for("#mode", "read-write").await?;
    // Its parked rows: the event of item-002 with the handler's error.
    browser
        .click("tr.poller[data-poller=\"items\"] button.show-parked")
        .await?;
    let parked_row = format!("tr.parked-row[data-id=\"{parked_id}\"]");
    let text = browser.wait_for(&parked_row, "item-002").await?;
    assert!(text.contains("downstream rejected item-002"), "{text}");
    browser
        .screenshot(&target_dir().join("admin-screenshot.png"))
        .await?;

    // Flip the flag, click Retry: back in the outbox, nothing parked any more.
    consumer.heal();
    browser.click(&format!("{parked_row} button.retry")).await?;
    browser.wait_for("#status", "Retried 1").await?;
    browser
        .wait_for("tr.poller[data-poller=\"items\"] td.parked-count", "0")
        .await?;
    browser
        .wait_for("#parked td.empty", "Nothing parked")
        .await?;
    browser
        .screenshot(&target_dir().join("admin-screenshot-after-retry.png"))
        .await?;
    Ok(())
}

#[test]
fn helpers_decode_what_chromedriver_sends() {
    assert_eq!(base64_decode("iVBORw==").unwrap(), b"\x89PNG");
    assert_eq!(base64_decode("aGVsbG8gd29ybGQ=").unwrap(), b"hello world");
    assert_eq!(
        dechunk(b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n").unwrap(),
        b"hello world"
    );
    assert!(
        webdriver_value(&json!({ "value": { "error": "no such element", "message": "x" } }))
            .is_err()
    );
}
