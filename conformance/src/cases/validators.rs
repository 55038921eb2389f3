//! Conformance cases: `validators` — HTTP validators (`ETag`, `Last-Modified`) per URL hash.

use watukuy_core::store::Validator;

use super::fixtures::{NODE_A, T0, acquire, key, key_b, key_other};
use crate::harness::{CaseResult, Env};
use crate::{check, check_eq};

/// `Store::get_validator` contract 1: `None` until set (on a fresh key and on a leased one);
/// a validator written by a commit round-trips, an all-`None` validator is stored as such (not as "no
/// validator"), a second set overwrites the whole value (a field set to `None` is cleared), and
/// URL hashes and keys are independent.
pub async fn validators_round_trip(env: Env) -> CaseResult {
    let store = env.store();
    let k = key();
    check!(
        store.get_validator(&k, "url-1").await?.is_none(),
        "None on a key never written"
    );
    let lease = acquire(store, &k, NODE_A, T0).await?;
    check!(
        store.get_validator(&k, "url-1").await?.is_none(),
        "None on a leased key before any set"
    );

    let first = Validator {
        etag: Some("\"33a64df551425fcc55e4d42a148795d9f25f89d4\"".to_owned()),
        last_modified: Some("Wed, 21 Oct 2015 07:28:00 GMT".to_owned()),
        stored_at: T0,
    };
    super::fixtures::write_validator(store, &k, &lease, "url-1", &first).await?;
    check_eq!(
        store.get_validator(&k, "url-1").await?,
        Some(first.clone()),
        "round trip"
    );
    check!(
        store.get_validator(&k, "url-2").await?.is_none(),
        "another URL hash is still unset"
    );

    let bare = Validator {
        etag: None,
        last_modified: None,
        stored_at: T0 + 1,
    };
    super::fixtures::write_validator(store, &k, &lease, "url-2", &bare).await?;
    check_eq!(
        store.get_validator(&k, "url-2").await?,
        Some(bare.clone()),
        "an all-None validator round-trips as Some"
    );

    let replaced = Validator {
        etag: Some("W/\"0815\"".to_owned()),
        last_modified: None,
        stored_at: T0 + 2_000,
    };
    super::fixtures::write_validator(store, &k, &lease, "url-1", &replaced).await?;
    check_eq!(
        store.get_validator(&k, "url-1").await?,
        Some(replaced),
        "a second set overwrites the whole validator (last_modified cleared)"
    );
    check_eq!(
        store.get_validator(&k, "url-2").await?,
        Some(bare),
        "overwriting url-1 leaves url-2 alone"
    );

    for other in [key_b(), key_other()] {
        check!(
            store.get_validator(&other, "url-1").await?.is_none(),
            "{other} has no validator for url-1"
        );
    }
    Ok(())
}
