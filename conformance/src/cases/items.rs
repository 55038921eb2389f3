//! Conformance cases: `items` — the item snapshot (`load_versions`, `stream_identities`,
//! `count_items`) as written by `commit_poll` upserts and deletes.

use std::collections::{HashMap, HashSet};

use watukuy_core::store::DEFAULT_IDENTITY_BATCH;
use watukuy_core::{
    json::Json,
    store::{CommitBatch, ItemRow, Lease, PKey, StatePatch, Store},
};

use super::fixtures::{
    NODE_A, T0, acquire, identity_batches, item, json, key, key_b, key_other, leased,
    leased_after_zero_count, others_count_zero,
};
use crate::harness::{CaseError, CaseResult, Env};
use crate::{check, check_eq};

/// A payload that only survives a store that keeps JSON text as it was written: a big integer
/// no `f64` holds, raw non-ASCII text, an escaped character, empty containers, keys out of order.
const EXACT_PAYLOAD: &str = r#"{"zeta":12345678901234567890123,"name":"Ñandú 🐦 señal","escaped":"caf\u00e9","tags":[],"meta":{},"alpha":-0.5e-7}"#;

/// Commits `upserts` and `deletes` (nothing else) with a plain state patch.
async fn commit_items(
    store: &dyn Store,
    key: &PKey,
    lease: &Lease,
    upserts: Vec<ItemRow>,
    deletes: &[&str],
) -> CaseResult {
    let batch = CommitBatch::default()
        .state_patch(StatePatch {
            updated_at: Some(T0),
            ..StatePatch::default()
        })
        .upserts(upserts)
        .deletes(deletes.iter().map(|id| (*id).to_owned()).collect());
    store.commit_poll(key, lease, &batch).await?;
    Ok(())
}

/// `load_versions` of `identities` given as string slices.
async fn versions(
    store: &dyn Store,
    key: &PKey,
    identities: &[&str],
) -> Result<HashMap<String, ItemRow>, CaseError> {
    let identities: Vec<String> = identities.iter().map(|id| (*id).to_owned()).collect();
    Ok(store.load_versions(key, &identities).await?)
}

/// `Store::load_versions` contract 1: only present rows come back, each exactly as written; the
/// payload is there only when it was stored (absent and JSON `null` differ, and a stored payload
/// comes back byte for byte), `version: None` round-trips, empty input gives an empty map and
/// another key sees nothing.
pub async fn load_versions_returns_present_rows(env: Env) -> CaseResult {
    let (store, k, lease) = leased(&env).await?;

    let no_payload = item("no-payload", "hash-1");
    let null_payload = ItemRow {
        identity: "null-payload".to_owned(),
        version: Some("v2".to_owned()),
        hash: "hash-2".to_owned(),
        schema_version: 3,
        payload: Some(Json::null()),
        seen_at: T0 + 1_000,
    };
    let exact_payload = ItemRow {
        identity: "exact-payload".to_owned(),
        version: Some("2026-01-01T00:00:00.000Z".to_owned()),
        hash: "hash-3".to_owned(),
        schema_version: 1,
        payload: Some(json(EXACT_PAYLOAD)),
        seen_at: T0 + 2_000,
    };
    commit_items(
        store,
        &k,
        &lease,
        vec![
            no_payload.clone(),
            null_payload.clone(),
            exact_payload.clone(),
        ],
        &[],
    )
    .await?;

    let rows = versions(
        store,
        &k,
        &[
            "no-payload",
            "null-payload",
            "exact-payload",
            "never-written",
        ],
    )
    .await?;
    let mut returned: Vec<&str> = rows.keys().map(String::as_str).collect();
    returned.sort_unstable();
    check_eq!(
        returned,
        vec!["exact-payload", "no-payload", "null-payload"],
        "load_versions returns exactly the present identities"
    );

    let row = rows.get("no-payload");
    check_eq!(row, Some(&no_payload), "row without payload round-trips");
    check!(
        row.is_some_and(|r| r.payload.is_none() && r.version.is_none()),
        "an absent payload stays absent (not JSON null) and version None stays None: {row:?}"
    );

    let row = rows.get("null-payload");
    check_eq!(
        row,
        Some(&null_payload),
        "row with a JSON null payload round-trips"
    );
    check!(
        row.and_then(|r| r.payload.as_ref())
            .is_some_and(Json::is_null),
        "a JSON null payload comes back as Some(null), not absent: {row:?}"
    );

    let row = rows.get("exact-payload");
    check_eq!(row, Some(&exact_payload), "row with a payload round-trips");
    check_eq!(
        row.and_then(|r| r.payload.as_ref()).map(Json::as_str),
        Some(EXACT_PAYLOAD),
        "the payload comes back byte for byte (big integer, unicode, escapes, empty containers, key order)"
    );

    // The map is keyed by the identity it carries.
    for (identity, row) in &rows {
        check_eq!(identity, &row.identity, "map key equals the row's identity");
    }

    let subset = versions(store, &k, &["null-payload"]).await?;
    check_eq!(subset.len(), 1, "only the asked-for identity comes back");
    check_eq!(subset.get("null-payload"), Some(&null_payload));

    check!(
        store.load_versions(&k, &[]).await?.is_empty(),
        "empty input gives an empty map"
    );
    check!(
        versions(store, &k, &["never-written", "also-missing"])
            .await?
            .is_empty(),
        "only absent identities give an empty map"
    );
    for other in [key_b(), key_other()] {
        let rows = versions(
            store,
            &other,
            &["no-payload", "null-payload", "exact-payload"],
        )
        .await?;
        check!(rows.is_empty(), "{other} sees none of {k}'s rows: {rows:?}");
    }
    Ok(())
}

/// `Store::commit_poll` contract 6: upserts replace whole rows (a replacing row keeps nothing of
/// the old one, payload and version included) and deletes remove them; deleting an identity that
/// never existed is fine, and a deleted identity can be upserted again.
pub async fn upserts_replace_and_deletes_remove(env: Env) -> CaseResult {
    let (store, k, lease) = leased(&env).await?;

    let first = ItemRow {
        identity: "a".to_owned(),
        version: Some("1".to_owned()),
        hash: "hash-a1".to_owned(),
        schema_version: 1,
        payload: Some(json(r#"{"id":"a","v":1}"#)),
        seen_at: T0,
    };
    let b = item("b", "hash-b1");
    let c = item("c", "hash-c1");
    commit_items(store, &k, &lease, vec![first, b, c.clone()], &[]).await?;

    // Replace `a` with a row without version or payload; delete `b` and an identity that was
    // never written.
    let replacement = ItemRow {
        identity: "a".to_owned(),
        version: None,
        hash: "hash-a2".to_owned(),
        schema_version: 2,
        payload: None,
        seen_at: T0 + 5_000,
    };
    commit_items(
        store,
        &k,
        &lease,
        vec![replacement.clone()],
        &["b", "never-existed"],
    )
    .await?;

    let rows = versions(store, &k, &["a", "b", "c", "never-existed"]).await?;
    check_eq!(rows.len(), 2, "a and c remain: {rows:?}");
    check_eq!(
        rows.get("a"),
        Some(&replacement),
        "the upsert replaced the whole row (no version or payload left over)"
    );
    check!(!rows.contains_key("b"), "b was deleted");
    check_eq!(rows.get("c"), Some(&c), "c is untouched");
    check_eq!(store.counts(&k).await.map(|c| c.items)?, 2);

    // A batch that only deletes identities that do not exist succeeds and changes nothing.
    commit_items(store, &k, &lease, Vec::new(), &["b", "ghost"]).await?;
    let again = versions(store, &k, &["a", "b", "c"]).await?;
    check_eq!(again, rows, "deleting absent identities changes nothing");

    // Deleted identities can come back.
    let b_again = item("b", "hash-b2");
    commit_items(store, &k, &lease, vec![b_again.clone()], &["c"]).await?;
    let rows = versions(store, &k, &["a", "b", "c"]).await?;
    check_eq!(rows.get("a"), Some(&replacement));
    check_eq!(
        rows.get("b"),
        Some(&b_again),
        "a deleted identity can be upserted again"
    );
    check!(!rows.contains_key("c"), "c was deleted");
    check_eq!(store.counts(&k).await.map(|c| c.items)?, 2);
    Ok(())
}

/// `Store::stream_identities` contract 1: 2,500 identities come in batches of 1000/1000/500,
/// every batch is full except the last, no empty batch is yielded (not even after an exact
/// multiple), the default batch size covers all 2,500 exactly once, and an empty key yields
/// nothing.
pub async fn stream_identities_batches(env: Env) -> CaseResult {
    let store = env.store();
    let k = key();

    check!(
        identity_batches(store, &k, 1000).await?.is_empty(),
        "a key never written yields no batch"
    );

    let lease = acquire(store, &k, NODE_A, T0).await?;
    check!(
        identity_batches(store, &k, DEFAULT_IDENTITY_BATCH)
            .await?
            .is_empty(),
        "a leased key without items yields no batch"
    );

    let expected: HashSet<String> = (0..2_500).map(|i| format!("item-{i:04}")).collect();
    let upserts = expected.iter().map(|id| item(id, "hash")).collect();
    commit_items(store, &k, &lease, upserts, &[]).await?;
    check_eq!(store.counts(&k).await.map(|c| c.items)?, 2_500);

    let batches = identity_batches(store, &k, 1000).await?;
    let sizes: Vec<usize> = batches.iter().map(Vec::len).collect();
    check_eq!(
        sizes,
        vec![1000, 1000, 500],
        "batch sizes with batch_size 1000"
    );
    check_covers_once(&batches, &expected)?;

    let batches = identity_batches(store, &k, 500).await?;
    let sizes: Vec<usize> = batches.iter().map(Vec::len).collect();
    check_eq!(
        sizes,
        vec![500; 5],
        "an exact multiple gives full batches and no trailing empty batch"
    );
    check_covers_once(&batches, &expected)?;

    let batches = identity_batches(store, &k, DEFAULT_IDENTITY_BATCH).await?;
    let Some((last, full)) = batches.split_last() else {
        return Err(CaseError::failed(
            "the default batch size yielded no batch for 2,500 identities",
        ));
    };
    check!(
        full.iter().all(|b| b.len() == DEFAULT_IDENTITY_BATCH),
        "every batch but the last is full with the default size {DEFAULT_IDENTITY_BATCH}"
    );
    check!(
        !last.is_empty() && last.len() <= DEFAULT_IDENTITY_BATCH,
        "the last batch holds 1..={DEFAULT_IDENTITY_BATCH} identities, got {}",
        last.len()
    );
    check_covers_once(&batches, &expected)?;

    for other in [key_b(), key_other()] {
        check!(
            identity_batches(store, &other, 1000).await?.is_empty(),
            "{other} has an empty snapshot and yields no batch"
        );
    }
    Ok(())
}

/// Identities whose byte order differs from numeric, case-insensitive, locale and UTF-16
/// orders, of 0 to 300 bytes and 1- to 4-byte UTF-8 sequences (no NUL: PostgreSQL's `text`
/// cannot hold it).
const ORDER_IDENTITIES: &[&str] = &[
    "z",
    "B",
    "a",
    "10",
    "9",
    "a b",
    "ab",
    "a-b",
    "A",
    "é",
    "ä",
    "e",
    "f",
    "Z",
    "😀",
    "\u{FFFD}",
    "\u{E000}",
    "\u{7F}",
    "\u{80}",
    "\u{7FF}",
    "\u{800}",
    "\u{FFFF}",
    "\u{10000}",
    "\u{10FFFF}",
    "item-2",
    "item-10",
    "aa",
    "",
    " ",
    "~",
    "ñandú",
    "Ω",
    "中文",
    "-",
    "+",
    "(",
    "[",
    "_",
];

/// Pairs that a store ordering by something other than bytes gets wrong: `(lower, higher)`.
const ORDER_PAIRS: &[(&str, &str)] = &[
    ("B", "a"),                // case: uppercase first
    ("Z", "a"),                // case-insensitive collations put "a" first
    ("10", "9"),               // numeric order puts "9" first
    ("item-10", "item-2"),     // natural sort puts "item-2" first
    ("a b", "ab"),             // locale collations ignore the space
    ("a-b", "ab"),             // ... and the hyphen
    ("z", "é"),                // locale collations put "é" next to "e"
    ("ä", "é"),                // code points U+E4 < U+E9
    ("\u{FFFD}", "😀"),        // UTF-16 order puts the surrogate pair of U+1F600 first
    ("\u{E000}", "\u{10000}"), // the same, at the edges
    ("", " "),                 // the empty identity first
];

/// `Store::stream_identities` contract 2: identities come in strictly ascending byte order
/// across batches of 1, 3, 7 and the default size (the pairs of `ORDER_PAIRS` in that order);
/// with the stream open after its first batch, identities committed below the last one yielded
/// are not yielded later, and every identity stored throughout comes exactly once, in order.
pub async fn stream_identities_in_byte_order(env: Env) -> CaseResult {
    use futures::StreamExt;

    let (store, k, lease) = leased(&env).await?;
    let long_a = "x".repeat(300);
    let long_b = format!("{}y", "x".repeat(299));
    let mut written: Vec<String> = ORDER_IDENTITIES.iter().map(|id| (*id).to_owned()).collect();
    written.push(long_a.clone());
    written.push(long_b.clone());
    // Written in several commits and in an order that is not the expected one.
    written.reverse();
    for chunk in written.chunks(7) {
        let upserts = chunk.iter().map(|id| item(id, "hash")).collect();
        commit_items(store, &k, &lease, upserts, &[]).await?;
    }
    let mut expected = written.clone();
    expected.sort();

    for batch_size in [1, 3, 7, DEFAULT_IDENTITY_BATCH] {
        let streamed: Vec<String> = identity_batches(store, &k, batch_size)
            .await?
            .into_iter()
            .flatten()
            .collect();
        for (lower, higher) in ORDER_PAIRS
            .iter()
            .chain([&(long_a.as_str(), long_b.as_str())])
        {
            let at = |id: &str| streamed.iter().position(|s| s == id);
            check!(
                at(lower).is_some() && at(lower) < at(higher),
                "batch size {batch_size}: {lower:?} (bytes {:x?}) must come before {higher:?} (bytes {:x?}); streamed {streamed:?}",
                lower.as_bytes(),
                higher.as_bytes()
            );
        }
        check_eq!(
            streamed,
            expected,
            "batch size {batch_size}: every identity once, in strictly ascending byte order"
        );
    }

    // The snapshot changes while the stream is open.
    let mut stream = store.stream_identities(&k, 4);
    let first = match stream.next().await {
        Some(batch) => batch?,
        None => return Err(CaseError::failed("the stream yielded no batch")),
    };
    let Some(last) = first.last().cloned() else {
        return Err(CaseError::failed("the first batch is empty"));
    };
    // Below the last identity yielded ("" " " "(" "+" make the first batch of 4): "!" and
    // "'" sort after " " and before "(".
    let behind = ["!", "'"];
    check!(
        behind.iter().all(|id| *id < last.as_str()),
        "the first batch of 4 ends at {last:?}, expected \"+\""
    );
    let deleted = "ñandú";
    let ahead = "zz";
    let upserts = behind
        .iter()
        .chain([&ahead])
        .map(|id| item(id, "hash"))
        .collect();
    commit_items(store, &k, &lease, upserts, &[deleted]).await?;
    let mut streamed = first;
    while let Some(batch) = stream.next().await {
        streamed.extend(batch?);
    }
    drop(stream);
    check!(
        streamed.windows(2).all(|w| w[0] < w[1]),
        "with commits while the stream was open, identities still come strictly ascending, without the ones committed below {last:?}: {streamed:?}"
    );
    let kept: Vec<&String> = expected.iter().filter(|id| *id != deleted).collect();
    let yielded: Vec<&String> = streamed
        .iter()
        .filter(|id| *id != deleted && *id != ahead)
        .collect();
    check_eq!(
        yielded,
        kept,
        "every identity stored throughout the stream is yielded exactly once"
    );
    Ok(())
}

/// Fails unless the batches hold every expected identity exactly once and nothing else.
fn check_covers_once(batches: &[Vec<String>], expected: &HashSet<String>) -> CaseResult {
    let total: usize = batches.iter().map(Vec::len).sum();
    let seen: HashSet<&String> = batches.iter().flatten().collect();
    check_eq!(total, expected.len(), "identities yielded in total");
    check_eq!(seen.len(), total, "no identity is yielded twice");
    check!(
        seen.iter().all(|id| expected.contains(*id)),
        "only snapshot identities are yielded"
    );
    Ok(())
}

/// `Store::count_items` contract 1: the count follows upserts (new identities add, replacements
/// do not) and deletes (unknown identities do not subtract), per key.
pub async fn count_items_counts_snapshot(env: Env) -> CaseResult {
    let (store, k, lease) = leased_after_zero_count(&env, |c| c.items).await?;
    check_eq!(
        store.counts(&k).await.map(|c| c.items)?,
        0,
        "a leased key without items counts 0"
    );

    commit_items(
        store,
        &k,
        &lease,
        vec![item("a", "h1"), item("b", "h1"), item("c", "h1")],
        &[],
    )
    .await?;
    check_eq!(store.counts(&k).await.map(|c| c.items)?, 3);

    commit_items(
        store,
        &k,
        &lease,
        vec![item("a", "h2"), item("d", "h1")],
        &[],
    )
    .await?;
    check_eq!(
        store.counts(&k).await.map(|c| c.items)?,
        4,
        "a replacement does not add"
    );

    commit_items(store, &k, &lease, Vec::new(), &["b", "unknown"]).await?;
    check_eq!(
        store.counts(&k).await.map(|c| c.items)?,
        3,
        "only the existing identity is subtracted"
    );

    commit_items(store, &k, &lease, Vec::new(), &["a", "c", "d"]).await?;
    check_eq!(
        store.counts(&k).await.map(|c| c.items)?,
        0,
        "every row deleted"
    );

    commit_items(store, &k, &lease, vec![item("e", "h1")], &[]).await?;
    check_eq!(store.counts(&k).await.map(|c| c.items)?, 1);
    others_count_zero(store, |c| c.items).await
}
