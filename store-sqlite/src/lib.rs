#![doc = include_str!("../README.md")]

mod codec;
mod db;
mod error;
mod options;
mod sql;
mod store;

pub use options::{
    DEFAULT_BUSY_TIMEOUT, DEFAULT_MAX_READERS, DEFAULT_TABLE_PREFIX, Location, SqliteOptions,
};
pub use sql::{SCHEMA_VERSION, ddl};
pub use store::SqliteStore;
