//! Building a poller: every option checked, the item type erased behind `prepare`.

use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{Error, Result};
use crate::poller::builder::{Identity, PollerBuilder, RawIdentityFn};
use crate::poller::handle::Poller;
use crate::poller::prepare::{field_string, make_prepare};
use crate::poller::{DeleteConfirmation, LookupDef, PollerDef, Reconcile, validate_name};

impl<T> PollerBuilder<T>
where
    T: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// Validates every option and builds the poller.
    pub fn build(self) -> Result<Poller> {
        validate_name(&self.name)?;
        if self.schema_version == 0 {
            return Err(Error::config(
                "schema_version",
                "must be an integer >= 1, got 0",
            ));
        }
        if self.max_pages_per_cycle == 0 {
            return Err(Error::config(
                "max_pages_per_cycle",
                "must be at least 1, got 0",
            ));
        }
        if self.full_scan_page_cap == 0 {
            return Err(Error::config(
                "full_scan_page_cap",
                "must be at least 1, got 0",
            ));
        }
        if self.partitions_refresh.is_zero() {
            return Err(Error::config(
                "partitions_refresh",
                "must be greater than zero",
            ));
        }
        if let Some(source) = &self.source
            && source.trim().is_empty()
        {
            return Err(Error::config("source", "must not be empty"));
        }
        self.schedule.validate()?;
        self.circuit.validate()?;
        self.delivery.validate()?;
        let strategy = self
            .cursor
            .ok_or_else(|| Error::config("cursor", "is required"))?
            .into_strategy()?;
        let reconcile = match (self.reconcile, self.reconcile_cursor) {
            (None, None) => None,
            (None, Some(_)) => {
                return Err(Error::config(
                    "reconcile_cursor",
                    "has no reconcile lane: add one with `reconcile` or `reconcile_stream`",
                ));
            }
            (Some((every, fetch)), cursor) => Some(Reconcile {
                every,
                fetch,
                // The strategy's errors name `cursor.*`: here they are `reconcile_cursor.*`.
                strategy: cursor
                    .unwrap_or_else(|| crate::cursor::page(1).into())
                    .into_strategy()
                    .map_err(|error| match error {
                        Error::Config { option, message } => Error::Config {
                            option: format!("reconcile_{option}"),
                            message,
                        },
                        other => other,
                    })?,
            }),
        };
        if let Some(reconcile) = &reconcile {
            if reconcile.strategy.skips_items() {
                return Err(Error::config(
                    "reconcile_cursor",
                    format!(
                        "the `{}` cursor leaves items out of a page (`lag` or `skip_seen`): in a \
                         full listing they would look deleted",
                        reconcile.strategy.name()
                    ),
                ));
            }
            if strategy.is_full_scan() {
                return Err(Error::config(
                    "reconcile",
                    format!(
                        "is redundant with the `{}` strategy, which lists everything every cycle",
                        strategy.name()
                    ),
                ));
            }
            if reconcile.every.is_zero() {
                return Err(Error::config(
                    "reconcile.every",
                    "must be greater than zero",
                ));
            }
        }
        let full_scan = strategy.is_full_scan() || reconcile.is_some();
        let delete_confirmation = confirmation(self.delete_confirmation, &self.lookup, full_scan)?;
        if !(self.budget_weight.is_finite() && self.budget_weight > 0.0) {
            return Err(Error::config(
                "budget_weight",
                format!("must be a finite number > 0, got {}", self.budget_weight),
            ));
        }
        if self.log_retention.is_some_and(|r| r.is_zero()) {
            return Err(Error::config("log.retention", "must be greater than zero"));
        }
        let fetch = self
            .fetch
            .ok_or_else(|| Error::config("fetch", "is required"))?;
        let identity = match (self.identity, self.identity_field.clone()) {
            (Some(_), Some(_)) => {
                return Err(Error::config(
                    "identity",
                    "set either `identity` or `identity_field`, not both",
                ));
            }
            (None, None) => return Err(Error::config("identity", "is required")),
            (Some(f), None) => Identity::Typed(f),
            (None, Some(path)) => {
                if path.is_empty() || path.split('.').any(str::is_empty) {
                    return Err(Error::config(
                        "identity_field",
                        format!("{path:?} is not a dot path"),
                    ));
                }
                Identity::Field(path)
            }
        };
        let raw_identity: Option<RawIdentityFn> = match (&self.raw_identity, &self.identity_field) {
            (Some(f), _) => Some(Arc::clone(f)),
            (None, Some(path)) => {
                let path = path.clone();
                Some(Arc::new(move |raw: &serde_json::Value| {
                    field_string(raw, &path)
                }))
            }
            (None, None) => None,
        };
        let prepare = make_prepare::<T>(
            identity,
            raw_identity,
            self.version,
            self.fingerprint,
            self.check,
        );
        Ok(Poller {
            inner: Arc::new(PollerDef {
                name: self.name,
                source: self.source,
                schema_version: self.schema_version,
                strategy,
                fetch,
                prepare,
                schedule: self.schedule,
                circuit: self.circuit,
                delivery: self.delivery,
                retain: self.retain,
                on_invalid: self.on_invalid,
                on_schema_change: self.on_schema_change,
                max_pages_per_cycle: self.max_pages_per_cycle,
                full_scan_page_cap: self.full_scan_page_cap,
                delete_confirmation,
                lookup: self.lookup,
                overlap_delivery: self.overlap_delivery,
                log_retention: self.log_retention,
                reconcile,
                budget: self.budget,
                budget_weight: self.budget_weight,
                budget_cost: self.budget_cost,
                partitions: self.partitions,
                partitions_refresh: self.partitions_refresh,
            }),
        })
    }
}

/// The delete confirmation rule from what the builder was given: `Lookup` and a lookup come
/// together, a lookup needs a full scan to confirm, and a batch holds at least one identity.
fn confirmation(
    rule: Option<DeleteConfirmation>,
    lookup: &Option<LookupDef>,
    full_scan: bool,
) -> Result<DeleteConfirmation> {
    let Some(lookup) = lookup else {
        return match rule {
            Some(DeleteConfirmation::Lookup) => Err(Error::config(
                "lookup",
                "is required by `DeleteConfirmation::Lookup`: add one with `lookup(batch_size, f)`",
            )),
            rule => Ok(rule.unwrap_or_default()),
        };
    };
    if let Some(rule) = rule.filter(|r| *r != DeleteConfirmation::Lookup) {
        return Err(Error::config(
            "delete_confirmation",
            format!(
                "is `{rule:?}`, which never calls the `lookup` that is set: use \
                 `DeleteConfirmation::Lookup` (what `lookup` selects) or remove the lookup"
            ),
        ));
    }
    if lookup.batch_size == 0 {
        return Err(Error::config(
            "lookup.batch_size",
            "must be at least 1, got 0",
        ));
    }
    if !full_scan {
        return Err(Error::config(
            "lookup",
            "has nothing to confirm: only a full scan reports deletes (the `snapshot_diff` \
             strategy or a `reconcile` lane)",
        ));
    }
    Ok(DeleteConfirmation::Lookup)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::BoxError;
    use crate::fetch::{FetchContext, Page};

    fn lookup(batch_size: usize) -> Option<LookupDef> {
        let lookup =
            |_ctx: FetchContext, _ids: Vec<String>| async { Ok::<Page, BoxError>(Page::default()) };
        Some(LookupDef {
            batch_size,
            lookup: Arc::new(lookup),
        })
    }

    fn option(result: Result<DeleteConfirmation>) -> String {
        match result {
            Ok(rule) => panic!("accepted as {rule:?}"),
            Err(error) => error
                .config_option()
                .unwrap_or("not a Config error")
                .to_owned(),
        }
    }

    #[test]
    fn the_rule_defaults_to_next_listing_and_a_lookup_selects_lookup() {
        assert_eq!(
            confirmation(None, &None, true).ok(),
            Some(DeleteConfirmation::NextListing)
        );
        for rule in [
            DeleteConfirmation::Immediate,
            DeleteConfirmation::NextListing,
        ] {
            assert_eq!(confirmation(Some(rule), &None, true).ok(), Some(rule));
        }
        for rule in [None, Some(DeleteConfirmation::Lookup)] {
            assert_eq!(
                confirmation(rule, &lookup(1), true).ok(),
                Some(DeleteConfirmation::Lookup)
            );
        }
    }

    #[test]
    fn a_lookup_rule_and_a_lookup_come_together() {
        assert_eq!(
            option(confirmation(Some(DeleteConfirmation::Lookup), &None, true)),
            "lookup"
        );
        for rule in [
            DeleteConfirmation::Immediate,
            DeleteConfirmation::NextListing,
        ] {
            assert_eq!(
                option(confirmation(Some(rule), &lookup(10), true)),
                "delete_confirmation"
            );
        }
    }

    #[test]
    fn a_lookup_needs_a_batch_and_a_full_scan() {
        assert_eq!(
            option(confirmation(None, &lookup(0), true)),
            "lookup.batch_size"
        );
        assert_eq!(option(confirmation(None, &lookup(10), false)), "lookup");
    }
}
