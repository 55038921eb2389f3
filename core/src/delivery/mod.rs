//! Delivery: the dispatcher, consumers and the pure policy behind them.

mod acks;
mod classify;
pub(crate) mod consumer;
mod dispatcher;
mod idempotent;
pub(crate) mod options;
pub(crate) mod policy;
mod reliable;

pub use classify::{
    TransientStatuses, classify_error, classify_http_response, classify_http_status,
    classify_network_error,
};
pub use consumer::{AckHandle, DeliveryOutcome, Handler, HandlerErrorKind, Subscription, Timeout};
// Handlers meet `Partition` and `DeliveryOptions` at the crate root, their one public path.
pub(crate) use consumer::Partition;
pub use dispatcher::{
    DEFAULT_DISPATCH_BATCH_SIZE, DeliveryCounters, Dispatcher, DrainContext, DrainReport,
    Unsubscribe,
};
pub use idempotent::{ApplyError, ApplyOutcome, ConsumerStore, Fence, apply_once};
pub(crate) use options::DeliveryOptions;
pub use options::{
    AckMode, AckWindow, CorrelationIdFn, DEFAULT_HANDLER_TIMEOUT, OrderingKeyFn, PoisonAction,
    Redaction,
};
pub use reliable::{
    LastApplied, LiveOnly, SideEffectGate, idempotency_key, reapplies, scoped_idempotency_key,
    side_effect_gate,
};
