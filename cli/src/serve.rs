//! Serving HTTP until a signal, and the signals themselves.

use std::future::Future;
use std::pin::Pin;

use axum::Router;
use tokio::sync::oneshot;

use crate::{CliError, Output};

/// SIGINT and SIGTERM (Ctrl-C elsewhere than Unix), caught from creation on.
pub(crate) struct Signals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    pub(crate) fn new() -> Result<Self, CliError> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let catch = |kind: SignalKind| {
                signal(kind)
                    .map_err(|e| CliError::new("INTERNAL", format!("cannot catch signals: {e}")))
            };
            Ok(Self {
                interrupt: catch(SignalKind::interrupt())?,
                terminate: catch(SignalKind::terminate())?,
            })
        }
        #[cfg(not(unix))]
        {
            Ok(Self {})
        }
    }

    /// Waits for the next signal and names it.
    pub(crate) async fn next(&mut self) -> &'static str {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.interrupt.recv() => "SIGINT",
                _ = self.terminate.recv() => "SIGTERM",
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            "Ctrl-C"
        }
    }
}

/// An HTTP server running in the background until [`shutdown`](Self::shutdown).
pub(crate) struct Server {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    /// Binds `address` and serves `app` on it; prints where.
    pub(crate) async fn bind(address: &str, app: Router) -> Result<Self, CliError> {
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .map_err(|e| CliError::config(format!("cannot listen on {address}: {e}")))?;
        let local = listener
            .local_addr()
            .map_err(|e| CliError::config(format!("cannot listen on {address}: {e}")))?;
        eprintln!("listening on http://{local}");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            if let Err(error) = axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
            {
                eprintln!("error (INTERNAL): the HTTP server stopped: {error}");
            }
        });
        Ok(Self { stop, task })
    }

    /// Stops accepting connections; the future ends once the requests in flight are answered.
    pub(crate) fn shutdown(self) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let _ = self.stop.send(());
        let task = self.task;
        Box::pin(async move {
            let _ = task.await;
        })
    }
}

/// The admin page with its mode and token from the environment: read-write behind
/// `WATUKUY_ADMIN_TOKEN` when it is set, read-only without it.
pub(crate) fn admin_app(state: watukuy_admin::AdminState) -> Router {
    let state = match std::env::var("WATUKUY_ADMIN_TOKEN") {
        Ok(token) if !token.is_empty() => state
            .bearer_token(token)
            .mode(watukuy_admin::Mode::ReadWrite),
        _ => state,
    };
    watukuy_admin::router(state)
}

/// Serves `app` on `address` until SIGINT or SIGTERM.
pub(crate) async fn until_signal(address: &str, app: Router) -> Result<Output, CliError> {
    let mut signals = Signals::new()?;
    let server = Server::bind(address, app).await?;
    let signal = signals.next().await;
    eprintln!("{signal}: stopping");
    server.shutdown().await;
    Ok(Output::new(
        "stopped",
        serde_json::json!({ "stopped": true }),
    ))
}
