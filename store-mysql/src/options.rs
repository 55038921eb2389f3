//! [`MySqlOptions`]: the table prefix, the pool size and the migration lock's wait.

use watukuy_core::{Error, Result};

use crate::sql;

/// How a [`MySqlStore`](crate::MySqlStore) is set up: `MySqlOptions::default()`, then the setters.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MySqlOptions {
    /// Prefix of every table name (letters, digits and `_`, at most 48 bytes); several stores
    /// can share one database with different prefixes. Default `watukuy_`.
    pub table_prefix: String,
    /// Connections of the pool [`MySqlStore::connect`](crate::MySqlStore::connect) opens. Default 10.
    pub max_connections: u32,
    /// How long `migrate` waits for another process's migration to finish, in seconds.
    /// Default 60.
    pub migrate_lock_timeout_secs: u32,
}

impl Default for MySqlOptions {
    fn default() -> Self {
        Self {
            table_prefix: "watukuy_".to_owned(),
            max_connections: 10,
            migrate_lock_timeout_secs: 60,
        }
    }
}

impl MySqlOptions {
    /// Sets the table prefix.
    #[must_use]
    pub fn table_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.table_prefix = prefix.into();
        self
    }

    /// Sets the pool size of [`MySqlStore::connect`](crate::MySqlStore::connect).
    #[must_use]
    pub fn max_connections(mut self, max: u32) -> Self {
        self.max_connections = max;
        self
    }

    /// Sets how long `migrate` waits for the migration lock, in seconds.
    #[must_use]
    pub fn migrate_lock_timeout_secs(mut self, secs: u32) -> Self {
        self.migrate_lock_timeout_secs = secs;
        self
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let prefix = &self.table_prefix;
        if prefix.len() > sql::MAX_PREFIX {
            return Err(Error::config(
                "table_prefix",
                format!(
                    "{prefix:?} is {} bytes long; at most {} (MySQL names are at most 64 characters)",
                    prefix.len(),
                    sql::MAX_PREFIX
                ),
            ));
        }
        if let Some(bad) = prefix
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '_'))
        {
            return Err(Error::config(
                "table_prefix",
                format!("{prefix:?} contains {bad:?}; use ASCII letters, digits and `_`"),
            ));
        }
        if self.max_connections == 0 {
            return Err(Error::config(
                "max_connections",
                "must be at least 1, got 0",
            ));
        }
        Ok(())
    }
}
