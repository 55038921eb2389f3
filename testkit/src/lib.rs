#![doc = include_str!("../README.md")]

pub mod chaos;
mod fake_api;
mod faulty;
pub mod world;

pub use fake_api::{
    DEFAULT_BASE_URL, FakeApi, FakeApiError, FakeApiOptions, Fault, Listing, LogEntry, Query,
    RateLimitSpec, RequestOptions, fake_items,
};
pub use faulty::{
    Defect, FaultyStore, KillPoint, KillSwitch, LeaseAudit, Op, PROBE_EVENT_ID, Timing,
    simulated_crash,
};

/// 2026-01-01T00:00:00Z in epoch milliseconds: the kit's start of time. [`fake_items`]
/// timestamps start there and a [`world::World`]'s manual clock starts one second later.
pub const T0: i64 = 1_767_225_600_000;
