#![doc = include_str!("../README.md")]

mod budget;
mod codec;
mod conn;
mod error;
mod keys;
mod options;
mod scripts;
mod store;
mod url;

pub use crate::budget::RedisBudgetStore;
pub use crate::options::RedisOptions;
pub use crate::store::RedisStore;

/// The redis connection type [`RedisStore::from_manager`] takes, re-exported so callers can name
/// it without matching this crate's redis version by hand.
pub use redis::aio::ConnectionManager;

/// The Redis Cluster connection type [`RedisStore::from_cluster`] takes (the redis crate's
/// `cluster_async::ClusterConnection`), re-exported like [`ConnectionManager`].
pub use redis::cluster_async::ClusterConnection;
