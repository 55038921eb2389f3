//! Stopping a program cleanly on a signal: Ctrl-C (SIGINT) everywhere, and on Unix SIGTERM too,
//! which is what `kill`, systemd, Docker and Kubernetes send to stop a process.
//!
//! Every long-running example waits on [`signal`] next to its own work, then calls
//! `engine.stop(StopOptions::default())`, which lets running cycles and deliveries finish (drain,
//! up to 30 s) before it returns:
//!
//! ```no_run
//! # async fn run(engine: watukuy_core::Engine) -> Result<(), Box<dyn std::error::Error>> {
//! use watukuy_core::StopOptions;
//!
//! engine.start().await?;
//! let signal = watukuy_examples::shutdown::signal().await?;
//! println!("{signal}: stopping");
//! engine.stop(StopOptions::default()).await?; // drains what is running
//! # Ok(())
//! # }
//! ```

use std::fmt;

/// The signal that asked the program to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shutdown {
    /// Ctrl-C in a terminal (SIGINT).
    CtrlC,
    /// SIGTERM (Unix only): `kill <pid>`, `systemctl stop`, `docker stop`, a Kubernetes pod
    /// being terminated.
    Terminate,
}

impl fmt::Display for Shutdown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Shutdown::CtrlC => "Ctrl-C",
            Shutdown::Terminate => "SIGTERM",
        })
    }
}

/// Waits for Ctrl-C or, on Unix, SIGTERM, and says which arrived. The handlers are installed
/// when the future is first polled, so poll it (in a `tokio::select!`) from the start of the
/// work it should interrupt; from then on the signal no longer ends the process by itself.
///
/// Fails only when a handler cannot be installed (no signal driver in the runtime).
pub async fn signal() -> std::io::Result<Shutdown> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut terminate = signal(SignalKind::terminate())?;
        tokio::select! {
            ctrl_c = tokio::signal::ctrl_c() => ctrl_c.map(|()| Shutdown::CtrlC),
            _ = terminate.recv() => Ok(Shutdown::Terminate),
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await.map(|()| Shutdown::CtrlC)
    }
}
