#![doc = include_str!("../README.md")]

mod codec;
mod consumer;
mod db;
mod error;
mod options;
mod sql;
mod store;
mod tx;

pub use consumer::{
    DEFAULT_PROCESSED_EVENTS_TABLE, PROCESSED_EVENTS_VERSION, ProcessedEvents, apply_once,
};
pub use options::{
    DEFAULT_BUSY_TIMEOUT, DEFAULT_MAX_READERS, DEFAULT_TABLE_PREFIX, Location, SqliteOptions,
    Synchronous,
};
pub use sql::SCHEMA_VERSION;
pub use store::SqliteStore;
pub use tx::SqliteTx;
