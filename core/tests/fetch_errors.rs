//! How a fetch's own error is reported: a `String`, `&str` or client library error returned by a
//! fetch is a transient `Error::Fetch` carrying the fetch's message (never an HTTP error "without
//! a status"), it fails the cycle and backs the key off; an `Error::Http` from a fetch stays an
//! HTTP error. On `MemoryStore` and a manual clock.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use watukuy_core::hooks::{HookContext, Hooks, Phase};
use watukuy_core::{
    BoxError, Error, FetchContext, Page, TickResult, cursor, ops::KeyInspect,
    store::SerializedError,
};
use watukuy_store_memory::MemoryStore;
use watukuy_testkit::world::{POLLER, StrategyKind, World};

/// Records every `on_error` call.
#[derive(Default)]
struct Errors(Mutex<Vec<(SerializedError, Phase)>>);

impl Errors {
    fn all(&self) -> Vec<(SerializedError, Phase)> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

#[async_trait]
impl Hooks for Errors {
    async fn on_error(&self, _ctx: &HookContext, error: &SerializedError, phase: Phase) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((error.clone(), phase));
    }
}

/// One tick of a poller whose fetch fails with `error()`, and what the hooks saw.
async fn fail_with(
    error: impl Fn() -> BoxError + Send + Sync + 'static,
) -> (TickResult, Vec<(SerializedError, Phase)>, KeyInspect) {
    let world = World::new(3, 10).unwrap();
    let poller = world
        .poller(StrategyKind::Timestamp)
        .cursor(cursor::timestamp("updatedAt").tie_break("id"))
        .fetch(move |_ctx: FetchContext| {
            let error = error();
            async move { Err::<Page, BoxError>(error) }
        })
        .build()
        .unwrap();
    let hooks = Arc::new(Errors::default());
    let engine = world
        .engine_builder(Arc::new(MemoryStore::new()), "node-a", poller, 1)
        .hooks(hooks.clone())
        .build()
        .unwrap();
    let result = world.tick(&engine).await.unwrap();
    let report = engine.inspect().await.unwrap();
    assert_eq!(report.pollers.len(), 1);
    let key = report.pollers.into_iter().next().unwrap().key;
    (result, hooks.all(), key)
}

#[tokio::test]
async fn a_string_returned_by_a_fetch_is_a_transient_fetch_error_with_its_message() {
    let (result, errors, key) = fail_with(|| "the ERP is in maintenance".into()).await;

    assert_eq!(result.polled.len(), 1);
    assert_eq!(result.polled[0].poller, POLLER);
    let reported = result.polled[0].error.clone().expect("the cycle failed");
    assert_eq!(reported.name, "FetchError");
    assert_eq!(reported.code.as_deref(), Some("FETCH"));
    assert_eq!(reported.message, "fetch failed: the ERP is in maintenance");
    assert_eq!(reported.status, None);
    assert!(
        !reported.message.contains("without a status"),
        "{reported:?}"
    );
    assert!(!reported.message.contains("FETCH"), "{reported:?}");

    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].0, reported);
    assert_eq!(errors[0].1, Phase::Fetch);

    // Transient: the cycle failed and the key backs off (it is not paused), with the error kept.
    assert_eq!(key.schedule.consecutive_failures, 1, "{key:?}");
    assert!(!key.paused);
    assert_eq!(key.schedule.last_error.as_ref(), Some(&reported));
}

#[tokio::test]
async fn a_client_error_returned_by_a_fetch_keeps_its_causes_in_the_message() {
    #[derive(Debug)]
    struct ClientError(std::io::Error);
    impl std::fmt::Display for ClientError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("listing orders failed")
        }
    }
    impl std::error::Error for ClientError {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    let (result, _, _) = fail_with(|| {
        ClientError(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "connection reset by peer",
        ))
        .into()
    })
    .await;
    let reported = result.polled[0].error.clone().expect("the cycle failed");
    assert_eq!(reported.name, "FetchError");
    assert_eq!(
        reported.message,
        "fetch failed: listing orders failed: connection reset by peer"
    );
}

#[tokio::test]
async fn an_http_error_returned_by_a_fetch_stays_an_http_error() {
    let (result, errors, _) = fail_with(|| {
        Error::Http {
            method: "GET".into(),
            url: "https://erp.example/orders".into(),
            status: Some(502),
            message: Some("Bad Gateway".into()),
            retry_after_ms: None,
        }
        .into()
    })
    .await;
    let reported = result.polled[0].error.clone().expect("the cycle failed");
    assert_eq!(reported.name, "HttpError");
    assert_eq!(reported.code.as_deref(), Some("HTTP"));
    assert_eq!(reported.status, Some(502));
    assert_eq!(errors[0].1, Phase::Fetch);
}

#[tokio::test]
async fn a_failing_fetch_backs_off_and_retries_after_the_backoff() {
    let world = World::new(3, 10).unwrap();
    let calls = Arc::new(Mutex::new(0_u32));
    let counted = Arc::clone(&calls);
    let poller = world
        .poller(StrategyKind::Timestamp)
        .fetch(move |_ctx: FetchContext| {
            *counted.lock().unwrap_or_else(PoisonError::into_inner) += 1;
            async move { Err::<Page, BoxError>("down".into()) }
        })
        .build()
        .unwrap();
    let engine = world
        .engine(Arc::new(MemoryStore::new()), "node-a", poller, 1)
        .unwrap();
    world.tick(&engine).await.unwrap();
    // Not due again at once: the failure backed the key off.
    world.tick(&engine).await.unwrap();
    assert_eq!(*calls.lock().unwrap_or_else(PoisonError::into_inner), 1);
    world.advance(Duration::from_secs(120));
    let result = world.tick(&engine).await.unwrap();
    assert_eq!(*calls.lock().unwrap_or_else(PoisonError::into_inner), 2);
    assert_eq!(
        result.polled[0].error.as_ref().map(|e| e.name.as_str()),
        Some("FetchError")
    );
}
