#![doc = include_str!("../README.md")]

pub mod backoff;
pub mod clock;
pub mod delivery;
pub mod error;
pub mod event;
pub mod json;
pub mod model;
pub mod rng;
pub mod store;

pub use backoff::Backoff;
pub use clock::{Clock, ManualClock, SystemClock, TokioClock};
pub use delivery::{
    AckMode, DeliveryOptions, Dispatcher, DrainContext, DrainReport, Handler, HandlerContext,
    HandlerError, HandlerErrorKind, HandlerResult, Partition, PoisonAction, Subscription,
};
pub use error::{BoxError, Error, ErrorCode, Result, StoreErrorKind};
pub use event::{CloudEvent, Event, EventType};
pub use json::Json;
pub use model::{
    Capabilities, Circuit, CommitBatch, EventCounts, ItemRow, Lane, LaneCursor, Lanes, Lease,
    LogQuery, LoggedEvent, OutboxRow, OutboxStatus, PKey, ParkedError, ParkedKind, ParkedQuery,
    ParkedRow, PollSummary, PollerState, RateLimitInfo, RateLimitSource, ScheduleState,
    SerializedError, StatePatch, ValidationIssue, Validator,
};
pub use rng::{Rng, SeededRng, SystemRng};
pub use store::Store;
