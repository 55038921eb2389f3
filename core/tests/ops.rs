//! `ops` against the memory store: the rules of parked rows (list, retry, discard) and how a
//! request names a key, which the engine, the command line and the admin page all go through.

use std::sync::Arc;

use watukuy_core::store::{PKey, ParkedKind, Store};
use watukuy_core::{Error, ErrorCode, ops};
use watukuy_store_memory::MemoryStore;
use watukuy_testkit::world::{POLLER, Parked, World, key};

/// A memory store holding the rows `World::park` parks: item-001 and item-003 poison, item-004
/// quarantined.
async fn parked() -> Parked {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    World::new(4, 10).unwrap().park(store).await.unwrap()
}

async fn parked_count(store: &dyn Store) -> u64 {
    store.counts(&key()).await.unwrap().parked
}

async fn listed(store: &dyn Store, selection: ops::ParkedSelection) -> Vec<String> {
    ops::list_parked(store, &key(), &selection)
        .await
        .unwrap()
        .into_iter()
        .map(|row| row.id)
        .collect()
}

#[tokio::test]
async fn listing_selects_by_kind_id_and_limit() {
    let p = parked().await;
    let store = &*p.store;
    let poison = ops::ParkedSelection::all().kind(ParkedKind::Poison);
    assert_eq!(listed(store, poison).await, p.poison);
    let invalid = ops::ParkedSelection::all().kind(ParkedKind::Invalid);
    assert_eq!(
        listed(store, invalid).await,
        std::slice::from_ref(&p.invalid)
    );
    assert_eq!(
        listed(store, ops::ParkedSelection::all().limit(1))
            .await
            .len(),
        1
    );
    let by_id = ops::ParkedSelection::ids([p.poison[1].as_str(), "nope"]);
    assert_eq!(listed(store, by_id).await, [p.poison[1].clone()]);
}

#[tokio::test]
async fn a_quarantined_item_cannot_be_retried_and_nothing_moves() {
    let p = parked().await;
    let store = &*p.store;
    let by_kind = ops::ParkedSelection::all().kind(ParkedKind::Invalid);
    let error = ops::retry_parked(store, &key(), &by_kind)
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::Config);
    assert!(
        error
            .to_string()
            .contains("quarantined items cannot be retried"),
        "{error}"
    );
    let by_id = ops::ParkedSelection::ids([p.invalid.clone()]);
    let error = ops::retry_parked(store, &key(), &by_id).await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::Config);
    assert!(
        error
            .to_string()
            .contains(&format!("{} quarantined (invalid)", p.invalid)),
        "{error}"
    );
    // A poison id and the quarantined one together: still nothing moves.
    let mixed = ops::ParkedSelection::ids([p.poison[0].clone(), p.invalid.clone()]);
    let error = ops::retry_parked(store, &key(), &mixed).await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::Config, "{error}");
    assert_eq!(parked_count(store).await, 3);
}

#[tokio::test]
async fn an_id_that_names_no_row_is_not_found_and_nothing_moves() {
    let p = parked().await;
    let store = &*p.store;
    let selection = ops::ParkedSelection::ids([p.poison[0].clone(), "evt-nope".to_owned()]);
    let error = ops::retry_parked(store, &key(), &selection)
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::NotFound);
    assert_eq!(
        error.to_string(),
        format!(
            "nothing was retried: this id does not apply on {}: evt-nope (no such parked row)",
            key()
        )
    );
    let error = ops::discard_parked(store, &key(), &selection)
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::NotFound);
    assert!(
        error.to_string().starts_with("nothing was discarded: "),
        "{error}"
    );
    assert_eq!(parked_count(store).await, 3);
}

#[tokio::test]
async fn retry_moves_poison_rows_and_discard_removes_any_kind() {
    let p = parked().await;
    let store = &*p.store;
    let retried = ops::retry_parked(store, &key(), &ops::ParkedSelection::all())
        .await
        .unwrap();
    assert_eq!(
        retried, p.poison,
        "every poison row, none of the quarantined"
    );
    assert_eq!(store.counts(&key()).await.unwrap().pending, 2);
    let discarded = ops::discard_parked(
        store,
        &key(),
        &ops::ParkedSelection::ids([p.invalid.clone()]),
    )
    .await
    .unwrap();
    assert_eq!(discarded, std::slice::from_ref(&p.invalid));
    assert_eq!(parked_count(store).await, 0);
    // Nothing left: a selection of everything does nothing, and its answer is empty.
    let none = ops::discard_parked(store, &key(), &ops::ParkedSelection::all())
        .await
        .unwrap();
    assert!(none.is_empty());
}

#[tokio::test]
async fn a_request_names_a_key_the_store_holds() {
    let p = parked().await;
    let store = &*p.store;
    assert_eq!(ops::stored_key(store, POLLER, None).await.unwrap(), key());
    assert_eq!(ops::stored_keys(store, None).await.unwrap(), [key()]);

    let error = ops::stored_key(store, "nope", None).await.unwrap_err();
    assert!(
        matches!(&error, Error::UnknownPoller { known, .. } if known == &[POLLER.to_owned()]),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        format!("unknown poller 'nope' (known pollers: '{POLLER}')")
    );
    let error = ops::stored_key(store, POLLER, Some("eu"))
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::UnknownPartition);
    assert_eq!(
        error.to_string(),
        format!("poller '{POLLER}' is not partitioned; got partition 'eu'")
    );

    // A partitioned poller's keys: one must be named, and it must exist.
    for key in [PKey::new("regions", "eu"), PKey::new("regions", "us")] {
        ops::pause(store, &key, 0).await.unwrap();
    }
    let error = ops::stored_key(store, "regions", None).await.unwrap_err();
    assert_eq!(
        error.to_string(),
        "poller 'regions' is partitioned: name a partition (partitions: 'eu', 'us')"
    );
    let error = ops::stored_key(store, "regions", Some("apac"))
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "poller 'regions' has no partition 'apac' (partitions: 'eu', 'us')"
    );

    let all = ops::inspect_store(store, None, None, 0).await.unwrap();
    let names: Vec<(&str, &str)> = all
        .iter()
        .map(|k| (k.poller.as_str(), k.partition.as_str()))
        .collect();
    assert_eq!(names, [(POLLER, ""), ("regions", "eu"), ("regions", "us")]);
    assert_eq!(all[0].parked, 3);
    assert!(all[1].paused);
    let one = ops::inspect_store(store, Some("regions"), Some("us"), 0)
        .await
        .unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].partition, "us");
}
