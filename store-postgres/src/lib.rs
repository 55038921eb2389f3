#![doc = include_str!("../README.md")]

mod codec;
mod consumer;
mod error;
mod options;
mod sql;
mod store;
mod tls;

pub use crate::consumer::{
    DEFAULT_PROCESSED_EVENTS_TABLE, PROCESSED_EVENTS_VERSION, ProcessedEvents, apply_once,
};
pub use crate::options::PostgresOptions;
pub use crate::store::PostgresStore;

/// The sqlx pool type [`PostgresStore::from_pool`] takes, re-exported so callers can name it
/// without matching this crate's sqlx version by hand.
pub use sqlx::PgPool;

/// The newest schema version this crate's migrations create.
pub const SCHEMA_VERSION: i32 = 2;
