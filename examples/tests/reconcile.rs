//! The `reconcile` example's promise, on its own HTTP server: with a live `timestamp` lane and a
//! reconcile lane over an offset-paged listing that changes while it runs (items added, updated
//! and deleted, some while a full listing is being read, which shifts the listing across a live
//! item), a consumer that only applies the events ends with exactly the API's listing; every
//! deleted item is reported deleted exactly once, by the reconcile lane, and no item the API
//! still lists is ever reported deleted: the item the listing missed is looked up and found.
//!
//! The scenario runs on a manual clock driven by `tick()`: no real sleeps. The second test runs
//! the binary with `--scenario`, as CI does.

mod common;

use std::collections::BTreeMap;
use std::process::Command;

use watukuy_core::{EventType, Lane};
use watukuy_examples::reconcile::{RECONCILE_EVERY, scenario};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_delete_is_reported_once_and_the_consumer_ends_with_the_listing() {
    let report = scenario().await.unwrap();

    // The scenario deleted items, some of them while a full listing was read.
    let deleted_on_server = report.deleted.clone();
    assert_eq!(
        deleted_on_server
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        [
            "item-01", "item-02", "item-03", "item-05", "item-07", "item-08"
        ]
    );

    // Every deleted item is reported deleted exactly once, by the reconcile lane.
    let mut deletes: BTreeMap<&str, usize> = BTreeMap::new();
    for seen in &report.seen {
        if seen.event_type == EventType::Deleted {
            *deletes.entry(seen.subject.as_str()).or_default() += 1;
            assert_eq!(seen.lane, Lane::Reconcile, "{seen:?}");
            assert_eq!(seen.item, None, "{seen:?}");
        }
    }
    assert_eq!(
        deletes.keys().copied().collect::<Vec<_>>(),
        deleted_on_server
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        "deleted events: {deletes:?}"
    );
    assert!(deletes.values().all(|&n| n == 1), "{deletes:?}");

    // No item the API still lists was ever reported deleted, and each was created once.
    for id in report.listing.keys() {
        assert!(!deletes.contains_key(id.as_str()), "{id} reported deleted");
        let created = report
            .seen
            .iter()
            .filter(|s| s.event_type == EventType::Created && &s.subject == id)
            .count();
        assert_eq!(created, 1, "{id} created {created} times");
    }

    // The consumer's read model (from the events alone) and the engine's snapshot equal the
    // API's listing, item for item.
    assert_eq!(report.model, report.listing);
    assert_eq!(
        report.snapshot.iter().collect::<Vec<_>>(),
        report.listing.keys().collect::<Vec<_>>()
    );
    assert_eq!(
        report
            .listing
            .keys()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        ["item-04", "item-06", "item-09", "item-10"]
    );
    assert!(report.converged());
    // item-02 was deleted after the listing had named it: the next listing reports it, within
    // one reconcile period (ticks are one second apart).
    let period = u32::try_from(RECONCILE_EVERY.as_secs()).unwrap();
    assert!(report.settle_ticks <= period + 1, "{}", report.settle_ticks);
    // The shifted listing missed item-09, which still exists: the lookup after that listing
    // found it, so it was kept; the same lookup did not find item-08, deleted in that listing.
    let shifted = report
        .lookups
        .iter()
        .find(|l| l.asked.iter().any(|id| id == "item-09"))
        .unwrap_or_else(|| panic!("item-09 was never looked up: {:?}", report.lookups));
    assert_eq!(shifted.found, ["item-09"], "{shifted:?}");
    assert!(
        shifted.asked.iter().any(|id| id == "item-08"),
        "{shifted:?}"
    );
    assert!(report.listing.contains_key("item-09"));
    // item-09 is the only item a lookup ever found: every other item a listing missed was gone.
    for lookup in &report.lookups {
        for id in &lookup.found {
            assert_eq!(id, "item-09", "{:?}", report.lookups);
        }
    }
    // item-10, added after the first page of a listing, was found by that listing.
    assert!(
        report
            .seen
            .iter()
            .any(|s| s.subject == "item-10" && s.event_type == EventType::Created),
        "item-10 never created"
    );
}

#[test]
fn the_binary_runs_its_scenario_and_stops_by_itself() {
    let output = Command::new(env!("CARGO_BIN_EXE_reconcile"))
        .arg("--scenario")
        .output()
        .expect("the reconcile binary runs");
    common::printed(
        "reconcile --scenario",
        &output,
        &[
            "api: item-08 deleted (while the full listing is read, after its page 1)",
            "deleted item-08 (reconcile lane)",
            "item-09 found",
            "created item-10 (reconcile lane)",
            "scenario done: 20 events (6 deletes); the read model equals the API's 4 items",
        ],
    );
}
