//! The engine's handle on a poller definition (at the crate root, where users name it).

use std::fmt;
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{PollerBuilder, PollerDef};

/// A validated, type-erased poller definition.
#[derive(Clone)]
pub struct Poller {
    pub(crate) inner: Arc<PollerDef>,
}

impl fmt::Debug for Poller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Poller")
            .field("name", &self.inner.name)
            .field("cursor", &self.inner.strategy.name())
            .field("schema_version", &self.inner.schema_version)
            .finish_non_exhaustive()
    }
}

impl Poller {
    /// Starts a definition over the item type `T`. `name` must match
    /// `^[a-zA-Z0-9][a-zA-Z0-9._-]{0,127}$`: it keys the store, so renaming starts over.
    pub fn builder<T>(name: impl Into<String>) -> PollerBuilder<T>
    where
        T: Serialize + DeserializeOwned + Send + Sync + 'static,
    {
        PollerBuilder::new(name.into())
    }

    /// The poller's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// True when the poller lists partitions.
    pub fn is_partitioned(&self) -> bool {
        self.inner.partitions.is_some()
    }
}
