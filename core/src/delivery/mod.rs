//! Delivery (SPEC §2.7): the dispatcher, consumers and the pure policy behind them.

mod consumer;
mod dispatcher;
mod options;
pub mod policy;

pub use consumer::{
    AckHandle, Handler, HandlerContext, HandlerError, HandlerErrorKind, HandlerResult, Partition,
    Subscription,
};
pub use dispatcher::{
    DEFAULT_DISPATCH_BATCH_SIZE, Dispatcher, DrainContext, DrainReport, Unsubscribe,
};
pub use options::{AckMode, DeliveryOptions, OrderingKeyFn, PoisonAction};
