#![doc = include_str!("../README.md")]

pub mod backoff;
pub mod budget;
pub mod clock;
pub mod cursor;
mod decide;
pub mod delivery;
pub mod diff;
mod engine;
mod error;
mod event;
mod fetch;
mod full_scan;
pub mod hooks;
pub mod json;
mod model;
pub mod ops;
pub mod poller;
pub mod rng;
mod runner;
pub mod schedule;
pub mod store;
pub mod telemetry;

pub use delivery::consumer::{HandlerContext, HandlerError, HandlerResult, Partition};
pub use delivery::options::DeliveryOptions;
pub use engine::{
    BackfillOptions, Engine, EngineBuilder, Status, StopOptions, TickOptions, TickResult,
};
pub use error::{BoxError, Error, ErrorCode, Result};
pub use event::{CloudEvent, CloudEventError, Event, EventType};
pub use fetch::{FetchContext, Page};
pub use model::Lane;
pub use poller::{builder::PollerBuilder, handle::Poller};
pub use runner::PollResult;
/// The string type of [`Event`]'s fields: a `str` that clones without copying (up to 23 bytes
/// inline, longer ones shared), compared with `==` against `&str` and `String`.
pub use smol_str::SmolStr;

// What users share across tasks must stay shareable: a change that breaks one of these is a
// breaking change and fails the build here, not in a user's code.
const _: () = {
    const fn send_sync<T: Send + Sync + ?Sized>() {}
    send_sync::<Engine>();
    send_sync::<Event>();
    send_sync::<std::sync::Arc<dyn store::Store>>();
    send_sync::<Poller>();
    send_sync::<delivery::Dispatcher>();
};
