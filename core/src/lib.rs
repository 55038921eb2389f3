#![doc = include_str!("../README.md")]

pub mod backoff;
pub mod budget;
pub mod clock;
pub mod cursor;
pub mod decide;
pub mod delivery;
pub mod diff;
pub mod engine;
pub mod error;
pub mod event;
pub mod fetch;
mod full_scan;
pub mod hooks;
pub mod json;
pub mod model;
pub mod ops;
pub mod poller;
pub mod rng;
pub mod runner;
pub mod schedule;
pub mod store;
pub mod telemetry;

pub use backoff::Backoff;
pub use budget::{BudgetManager, BudgetPolicy, BudgetStore, Fairness, MemoryBudgetStore};
pub use clock::{Clock, ManualClock, SystemClock, TokioClock};
pub use delivery::{
    AckMode, DeliveryOptions, Dispatcher, DrainContext, DrainReport, Handler, HandlerContext,
    HandlerError, HandlerErrorKind, HandlerResult, Partition, PoisonAction, Subscription,
};
pub use engine::{
    Engine, EngineBuilder, InspectReport, PollerInspect, Status, StopOptions, TickOptions,
    TickResult,
};
pub use error::{BoxError, Error, ErrorCode, Result, StoreErrorKind};
pub use event::{CloudEvent, Event, EventType};
pub use fetch::{BudgetCharge, FetchContext, Page, RejectedItem, ValidatorAccess};
pub use json::Json;
pub use model::{
    Capabilities, Circuit, CommitBatch, EventCounts, ItemRow, KeyCounts, Lane, LaneCursor, Lanes,
    Lease, LogQuery, LoggedEvent, OutboxRow, OutboxStatus, PKey, ParkedAction, ParkedError,
    ParkedKind, ParkedQuery, ParkedRow, PollSummary, PollerState, RateLimitInfo, RateLimitSource,
    ScheduleState, SerializedError, StatePatch, UrlValidator, ValidationIssue, Validator,
};
pub use poller::{
    DeleteConfirmation, MAX_ITEM_DEPTH, OnInvalid, PlannedPage, Poller, PollerBuilder, Retain,
};
pub use rng::{Rng, SeededRng, SystemRng};
pub use runner::PollResult;
pub use store::Store;
