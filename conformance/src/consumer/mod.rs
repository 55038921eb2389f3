//! The consumer suite: the rules of [`ConsumerStore`](watukuy_core::delivery::ConsumerStore)
//! checked against a real database, for every consumer store.
//!
//! A consumer store proves itself with one line in a test file, given a [`ConsumerHarness`]:
//!
//! ```text
//! watukuy_conformance::consumer_tests!(MyConsumerHarness::from_env());
//! ```
//!
//! which generates one `#[tokio::test]` per case in a module `consumer`, so
//! `cargo test consumer::` runs them. Attributes after the harness go on every test (to have
//! them counted as ignored, with a reason, while a server is not configured).

pub mod cases;
mod harness;

pub use harness::{ConnOf, ConsumerDb, ConsumerHarness, ModelRow, TxOf};

/// Calls `$crate::$callback!` with `$extra` tokens in parentheses, then the ONE list of
/// consumer cases.
#[macro_export]
macro_rules! for_each_consumer_case {
    ($callback:ident $(, $($extra:tt)*)?) => {
        $crate::$callback! {
            ($($($extra)*)?)
            a_crash_before_the_commit_applies_nothing,
            a_redelivery_after_the_commit_is_a_duplicate,
            overlapping_deliveries_apply_once,
            an_overlapping_delivery_applies_after_the_first_rolled_back,
            a_failing_projection_rolls_back_its_marker,
            a_late_redelivery_after_newer_events_is_a_duplicate,
            repeated_ids_of_new_changes_apply_again,
            a_lost_lease_commits_nothing,
            an_instance_frozen_inside_its_transaction_past_its_lease_cannot_commit,
            markers_are_pruned_by_age_and_migrations_are_idempotent,
            replay_rebuilds_a_model_and_changes_nothing_in_an_up_to_date_one,
            a_delete_and_a_re_create_with_identical_content_end_present,
        }
    };
}

/// Generates one `#[tokio::test]` per consumer case for a harness, in a module `consumer`:
///
/// ```text
/// watukuy_conformance::consumer_tests!(
///     MyConsumerHarness::from_env(),
///     #[cfg_attr(no_my_db, ignore = "set MY_DB_URL to test against a server")]
/// );
/// ```
///
/// The harness expression is evaluated once per test, inside the generated module (which
/// imports `super::*`).
#[macro_export]
macro_rules! consumer_tests {
    ($harness:expr $(, #[$attr:meta])* $(,)?) => {
        $crate::for_each_consumer_case!(__consumer_tests, $harness, ($(#[$attr])*));
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __consumer_tests {
    (($harness:expr, $attrs:tt) $($case:ident,)*) => {
        /// The watukuy consumer suite, one test per case.
        mod consumer {
            #[allow(unused_imports)]
            use super::*;
            $( $crate::__consumer_test!($harness, $case, $attrs); )*
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __consumer_test {
    ($harness:expr, $case:ident, ($(#[$attr:meta])*)) => {
        $(#[$attr])*
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $case() {
            $crate::consumer::cases::run_consumer_case(
                $harness,
                stringify!($case),
                $crate::consumer::cases::$case,
            )
            .await;
        }
    };
}
