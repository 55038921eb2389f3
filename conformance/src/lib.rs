#![doc = include_str!("../README.md")]

pub mod cases;
pub mod consumer;
mod harness;
mod runner;

pub use harness::{
    CaseContext, CaseError, CaseResult, Env, Fresh, Harness, OrFail, REQUIRE_BACKENDS_ENV,
    RawWrite, backend_url,
};
pub use runner::{Case, Outcome, Report, run_all, run_case, run_test};

/// Calls `$crate::$callback!` with `$extra` tokens in parentheses, then the ONE list of cases,
/// grouped by module.
///
/// Both [`store_tests!`] (one `#[test]` per case) and [`all_cases`] (what [`run_all`] runs) are
/// generated from this list, so they can never disagree.
#[macro_export]
macro_rules! for_each_case {
    ($callback:ident $(, $($extra:tt)*)?) => {
        $crate::$callback! {
            ($($($extra)*)?)
            setup {
                exposes_capabilities,
                migrate_is_idempotent,
                close_is_idempotent_and_keeps_data,
                concurrent_migrations_of_new_instances_succeed,
                a_newer_schema_is_refused,
                undecodable_rows_are_corrupt_errors,
            }
            leases {
                acquire_on_empty_key_returns_epoch_1,
                other_owner_cannot_acquire_valid_lease,
                same_owner_reacquire_bumps_epoch,
                expired_lease_is_stolen_with_next_epoch,
                renew_succeeds_for_current_epoch_only,
                release_then_acquire_keeps_epoch_monotonic,
                release_with_stale_lease_is_noop,
                get_lease_is_none_then_holder,
                epochs_survive_delete_key,
            }
            claims {
                claim_takes_the_lease_and_reads_state_and_outbox,
                claim_is_refused_while_another_owner_holds_the_lease,
                claim_sees_the_superseded_holders_last_write,
            }
            fencing {
                save_state_rejects_stale_lease,
                commit_poll_rejects_stale_lease,
                ack_events_rejects_stale_lease,
                record_attempt_rejects_stale_lease,
                park_event_rejects_stale_lease,
                fenced_writes_without_lease_are_rejected,
                released_lease_fails_fence,
                lease_lost_carries_key_and_epoch,
                a_second_instance_shares_data_and_is_fenced,
            }
            state {
                load_state_is_none_for_unknown_key,
                save_state_round_trips_every_field,
                unfenced_save_creates_zero_state,
                unfenced_save_without_updated_at_uses_zero,
                patches_replace_top_level_fields,
                list_keys_filters_by_poller,
                delete_key_removes_everything,
                clear_items_drops_snapshot_only,
            }
            items {
                load_versions_returns_present_rows,
                upserts_replace_and_deletes_remove,
                stream_identities_batches,
                stream_identities_in_byte_order,
                count_items_counts_snapshot,
            }
            commit_poll {
                applies_everything_together,
                appends_log_only_when_asked,
                recommitting_event_overwrites_row,
                empty_batch_applies_patch,
                writes_validators_with_the_page,
                json_and_text_come_back_verbatim,
            }
            outbox {
                load_pending_orders_by_sequence,
                load_pending_with_holds_reads_both,
                count_pending_counts_pending_only,
                ack_removes_rows_ignores_unknown,
                record_attempt_updates_row,
            }
            parked {
                park_event_removes_outbox_row_and_holds,
                list_parked_filters_orders_limits,
                count_parked_counts_every_kind,
                retry_parked_moves_poison_back,
                discard_parked_returns_count,
            }
            validators {
                validators_round_trip,
            }
            log {
                read_log_after_sequence,
                read_log_time_range_and_limit,
                prune_log_strictly_older,
            }
            isolation {
                partitions_are_isolated,
                pollers_are_isolated,
            }
            guarantees {
                g1_interrupted_delivery_is_redelivered_with_same_id,
                g1_failing_handler_is_retried,
                g2_redelivery_carries_the_same_id_and_payload,
                g3_per_key_order_under_concurrency_and_failures,
                g7_poison_key_does_not_block_others,
                g7_retry_delivers_poison_then_successors_in_order,
                g7_discard_releases_the_key,
                g10_subscribe_never_pulls_more_than_asked,
                g10_dispatcher_holds_at_most_one_slice,
            }
            engine {
                g2_independent_engines_produce_identical_ids,
                g2_reset_with_cleared_snapshot_recreates_same_ids,
                g4_crash_after_commit_is_recovered_with_same_ids,
                g4_failed_commit_persists_nothing,
                g5_second_instance_is_skipped_while_leased,
                g5_stale_holder_is_fenced_out,
                g8_same_seed_same_trace,
                g8_nothing_runs_after_stop,
                hooks_fire_in_lifecycle_order,
                g6_shared_budget_is_never_exceeded,
                an_idle_relisting_commits_nothing_and_keeps_its_cursor,
            }
            lanes {
                aimd_sequence,
                throttle_waits_exactly_retry_after,
                circuit_opens_probes_and_closes,
                reconcile_finds_deletes,
                backfill_force_reemits_and_finishes,
                failing_backfill_backs_off,
                replay_redelivers_with_same_ids,
                log_retention_prunes,
            }
            full_scans {
                a_shifting_listing_never_deletes_a_live_item,
                an_interrupted_listing_never_deletes_a_live_item,
                caught_up_waits_for_the_suspects,
                lookups_never_delete_a_live_item_of_a_listing_that_always_shifts,
                a_failing_lookup_deletes_nothing,
            }
            chaos {
                timestamp_seeds,
                snapshot_diff_seeds,
                token_seeds,
                page_seeds,
                retain_payload_timestamp,
                retain_payload_snapshot_diff,
                each_kill_point_alone,
                overlapped_delivery_seeds,
                ack_window_seeds,
                validators_seeds,
                first_cycle_crash_is_recovered,
            }
        }
    };
}

/// Generates one `#[test]` per conformance case for a harness, grouped in modules named after
/// the case groups, so `cargo test conformance::leases::` filters work:
///
/// ```text
/// watukuy_conformance::store_tests!(MyHarness::from_env());
/// ```
///
/// (The crate documentation has a complete, compiled example.)
///
/// The harness expression is evaluated once per test, inside the generated module (which
/// imports `super::*`).
///
/// Attributes after the harness go on every generated test. A store whose tests need a server
/// uses this to have them counted as *ignored*, with a reason, when the server is not
/// configured, instead of reported as passed: a build script sets a `cfg` when the variable is
/// unset (`cargo::rustc-check-cfg=cfg(no_my_store)`, `cargo::rerun-if-env-changed=MY_STORE_URL`,
/// `cargo::rustc-cfg=no_my_store`), and
///
/// ```text
/// watukuy_conformance::store_tests!(
///     MyHarness,
///     #[cfg_attr(no_my_store, ignore = "set MY_STORE_URL to test against a server")]
/// );
/// ```
///
/// gives `test conformance::leases::… ... ignored, set MY_STORE_URL to test against a server`.
#[macro_export]
macro_rules! store_tests {
    ($harness:expr $(, #[$attr:meta])* $(,)?) => {
        /// The watukuy conformance suite, one test per case.
        mod conformance {
            #[allow(unused_imports)]
            use super::*;
            $crate::for_each_case!(__store_test_modules, ($harness) [$(#[$attr])*]);
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __store_test_modules {
    ((($harness:expr) $attrs:tt) $($module:ident { $($case:ident),* $(,)? })*) => {
        $(
            mod $module {
                #[allow(unused_imports)]
                use super::*;
                $(
                    $crate::__store_test! { $attrs $module $case $harness }
                )*
            }
        )*
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __store_test {
    ([$(#[$attr:meta])*] $module:ident $case:ident $harness:expr) => {
        $(#[$attr])*
        #[test]
        fn $case() {
            $crate::run_test($harness, $crate::Case {
                module: ::core::stringify!($module),
                name: ::core::stringify!($case),
                run: |env| ::std::boxed::Box::pin($crate::cases::$module::$case(env)),
            });
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __case_table {
    (() $($module:ident { $($case:ident),* $(,)? })*) => {
        vec![$($(
            $crate::Case {
                module: ::core::stringify!($module),
                name: ::core::stringify!($case),
                run: |env| ::std::boxed::Box::pin($crate::cases::$module::$case(env)),
            },
        )*)*]
    };
}

/// Every case of the suite, in order.
pub fn all_cases() -> Vec<Case> {
    for_each_case!(__case_table)
}

/// Fails the case with the file, line and a message unless the condition holds.
#[macro_export]
macro_rules! check {
    ($cond:expr $(,)?) => {
        if !$cond {
            return ::core::result::Result::Err($crate::CaseError::failed(::std::format!(
                "{}:{}: check failed: {}",
                ::core::file!(),
                ::core::line!(),
                ::core::stringify!($cond)
            )));
        }
    };
    ($cond:expr, $($arg:tt)+) => {
        if !$cond {
            return ::core::result::Result::Err($crate::CaseError::failed(::std::format!(
                "{}:{}: {}",
                ::core::file!(),
                ::core::line!(),
                ::std::format_args!($($arg)+)
            )));
        }
    };
}

/// Fails the case unless both sides are equal, showing both (`Debug`) and an optional message.
#[macro_export]
macro_rules! check_eq {
    ($left:expr, $right:expr $(,)?) => {
        $crate::check_eq!($left, $right, "{} == {}", ::core::stringify!($left), ::core::stringify!($right))
    };
    ($left:expr, $right:expr, $($arg:tt)+) => {
        match (&$left, &$right) {
            (left, right) => {
                if !(*left == *right) {
                    return ::core::result::Result::Err($crate::CaseError::failed(::std::format!(
                        "{}:{}: {}\n  left:  {:?}\n  right: {:?}",
                        ::core::file!(),
                        ::core::line!(),
                        ::std::format_args!($($arg)+),
                        left,
                        right
                    )));
                }
            }
        }
    };
}
