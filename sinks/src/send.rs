//! What every sink's handler does around its one send.

use std::future::Future;

use watukuy_core::{HandlerContext, HandlerError, HandlerResult};

/// Runs one delivery's `send` and acknowledges the event once it succeeded. A delivery
/// cancelled first (a lost lease, a stop without drain) is a transient failure: `what` names it
/// (`"kafka produce"` gives "kafka produce cancelled").
pub(crate) async fn ack_when_sent<T, E: Into<HandlerError>>(
    ctx: &HandlerContext,
    what: &str,
    send: impl Future<Output = Result<T, E>>,
) -> HandlerResult {
    tokio::select! {
        biased;
        () = ctx.cancel.cancelled() => Err(HandlerError::transient(format!("{what} cancelled"))),
        result = send => {
            result.map_err(Into::into)?;
            ctx.ack();
            Ok(())
        }
    }
}
