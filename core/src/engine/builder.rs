//! Building an engine: its pollers, clock, randomness, hooks, lease, budgets, validated once.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::clock::{Clock, duration_ms};
use crate::delivery::Dispatcher;
use crate::engine::{Engine, Inner, Status};
use crate::error::{Error, Result};
use crate::hooks::{ComposedHooks, Hooks};
use crate::poller::Poller;
use crate::rng::Rng;
use crate::runner;
use crate::runner::{Runtime, Shared};
use crate::store::Store;

/// Builds an [`Engine`].
pub struct EngineBuilder {
    pub(super) store: Arc<dyn Store>,
    pub(super) pollers: Vec<Poller>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) rng: Arc<dyn Rng>,
    pub(super) hooks: Vec<Arc<dyn Hooks>>,
    pub(super) instance_id: Option<String>,
    pub(super) lease_ttl: Duration,
    pub(super) renew_every: Option<Duration>,
    pub(super) source_prefix: String,
    pub(super) dispatch_batch_size: usize,
    pub(super) max_concurrent_keys: usize,
    pub(super) budgets: Vec<(String, crate::budget::BudgetPolicy)>,
    pub(super) budget_store: Arc<dyn crate::budget::BudgetStore>,
    pub(super) trace: Arc<dyn crate::telemetry::TraceContext>,
}

impl std::fmt::Debug for EngineBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineBuilder")
            .field("pollers", &self.pollers)
            .finish_non_exhaustive()
    }
}

impl EngineBuilder {
    /// Adds a poller.
    #[must_use]
    pub fn poller(mut self, poller: Poller) -> Self {
        self.pollers.push(poller);
        self
    }

    /// The clock (default: the system clock).
    #[must_use]
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The randomness source (default: seeded from the OS).
    #[must_use]
    pub fn rng(mut self, rng: Arc<dyn Rng>) -> Self {
        self.rng = rng;
        self
    }

    /// Adds a set of hooks (several sets run in the order added).
    #[must_use]
    pub fn hooks(mut self, hooks: Arc<dyn Hooks>) -> Self {
        self.hooks.push(hooks);
        self
    }

    /// The lease owner id (default `watukuy-` + 10 random `[a-z0-9]`).
    #[must_use]
    pub fn instance_id(mut self, id: impl Into<String>) -> Self {
        self.instance_id = Some(id.into());
        self
    }

    /// Lease time-to-live (default 30 s) and renewal period (default a third of it).
    #[must_use]
    pub fn lease(mut self, ttl: Duration, renew_every: Option<Duration>) -> Self {
        self.lease_ttl = ttl;
        self.renew_every = renew_every;
        self
    }

    /// The prefix of default event sources (default `urn:watukuy:`).
    #[must_use]
    pub fn source_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.source_prefix = prefix.into();
        self
    }

    /// Outbox rows per dispatch slice (default 100).
    #[must_use]
    pub fn dispatch_batch_size(mut self, size: usize) -> Self {
        self.dispatch_batch_size = size;
        self
    }

    /// How many keys the daemon ([`Engine::start`]) runs at once, all pollers and partitions
    /// together (default 64).
    /// Due keys wait their turn earliest-due first, so every partition gets its turn; each key
    /// in flight holds a page in memory. `0` is a `Config` error naming `max_concurrent_keys`.
    #[must_use]
    pub fn max_concurrent_keys(mut self, keys: usize) -> Self {
        self.max_concurrent_keys = keys;
        self
    }

    /// Declares a named rate budget that pollers draw on (`PollerBuilder::budget`).
    #[must_use]
    pub fn budget(mut self, name: impl Into<String>, policy: crate::budget::BudgetPolicy) -> Self {
        self.budgets.push((name.into(), policy));
        self
    }

    /// Where budget buckets live (default: in memory, per process). A shared store (Redis)
    /// makes budgets hold across processes.
    #[must_use]
    pub fn budget_store(mut self, store: Arc<dyn crate::budget::BudgetStore>) -> Self {
        self.budget_store = store;
        self
    }

    /// How events get their W3C `traceparent` (default: a generated, deterministic trace per
    /// poll cycle; with OpenTelemetry, return the current context's).
    #[must_use]
    pub fn trace_context(mut self, trace: Arc<dyn crate::telemetry::TraceContext>) -> Self {
        self.trace = trace;
        self
    }

    /// Validates everything and builds the engine.
    pub fn build(self) -> Result<Engine> {
        let ttl_ms = duration_ms(self.lease_ttl);
        if ttl_ms <= 0 {
            return Err(Error::config("lease.ttl", "must be greater than zero"));
        }
        if self.max_concurrent_keys == 0 {
            return Err(Error::config(
                "max_concurrent_keys",
                "must be at least 1, got 0",
            ));
        }
        let renew_ms = self.renew_every.map_or(ttl_ms / 3, duration_ms);
        if renew_ms >= ttl_ms || renew_ms <= 0 {
            return Err(Error::config(
                "lease.renew_every",
                format!(
                    "must be greater than zero and less than the ttl ({ttl_ms} ms), got {renew_ms} ms"
                ),
            ));
        }
        let instance_id = match self.instance_id {
            Some(id) if id.trim().is_empty() => {
                return Err(Error::config("instance_id", "must not be empty"));
            }
            Some(id) => id,
            None => random_instance_id(&*self.rng),
        };
        let hooks: Arc<dyn Hooks> = match self.hooks.len() {
            0 => Arc::new(crate::hooks::NoHooks),
            1 => Arc::clone(&self.hooks[0]),
            _ => Arc::new(ComposedHooks(self.hooks)),
        };
        let mut budgets = crate::budget::BudgetManager::new(
            Arc::clone(&self.budget_store),
            Arc::clone(&self.clock),
        );
        for (name, policy) in self.budgets {
            budgets = budgets.with_budget(name, policy)?;
        }
        let mut pollers = BTreeMap::new();
        for poller in self.pollers {
            let def = Arc::clone(&poller.inner);
            if let Some(budget) = &def.budget
                && !budgets.contains(budget)
            {
                return Err(Error::config(
                    "budget",
                    format!(
                        "poller '{}' uses budget '{budget}', which the engine does not declare",
                        def.name
                    ),
                ));
            }
            if def.log_retention.is_some() && !self.store.capabilities().log {
                return Err(Error::config(
                    "log_retention",
                    format!(
                        "poller '{}' keeps a replay log, but the store has none (Capabilities::log is false)",
                        def.name
                    ),
                ));
            }
            if pollers.contains_key(&def.name) {
                return Err(Error::config(
                    "pollers",
                    format!("duplicate poller name '{}'", def.name),
                ));
            }
            let dispatcher = Dispatcher::new(
                def.name.clone(),
                Arc::clone(&self.store),
                Arc::clone(&self.clock),
                Arc::clone(&self.rng),
                def.delivery.clone(),
                self.dispatch_batch_size,
            )?
            .with_hooks(Arc::clone(&hooks), instance_id.clone());
            let source = def.source_for(&self.source_prefix);
            pollers.insert(
                def.name.clone(),
                Runtime {
                    def,
                    dispatcher,
                    source,
                },
            );
        }
        let shared = Shared {
            store: self.store,
            clock: self.clock,
            rng: self.rng,
            hooks,
            instance_id,
            lease_ttl_ms: ttl_ms,
            renew_every_ms: renew_ms,
            budgets: Arc::new(budgets),
            trace: self.trace,
            held: runner::HeldLeases::default(),
        };
        Ok(Engine {
            inner: Arc::new(Inner {
                shared,
                pollers,
                partitions: Mutex::default(),
                status: Mutex::new(Status::Idle),
                wake: Notify::new(),
                wakes: Mutex::default(),
                max_concurrent_keys: self.max_concurrent_keys,
                daemon: tokio::sync::Mutex::new(None),
            }),
        })
    }
}

fn random_instance_id(rng: &dyn Rng) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let suffix: String = (0..10)
        .map(|_| {
            let index = crate::backoff::f64_to_ms(rng.next_f64() * 36.0).clamp(0, 35);
            char::from(ALPHABET[usize::try_from(index).unwrap_or(0)])
        })
        .collect();
    format!("watukuy-{suffix}")
}
