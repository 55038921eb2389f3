//! The deletes of a full scan, found in bounded memory.
//!
//! A full scan (`snapshot_diff`, a reconcile lane) deletes every stored identity its complete
//! listing did not name. Keeping a set of everything listed costs O(items) (about 100 MiB for a
//! million identities), so instead the listing is merged, page by page, against the stored
//! identities, which [`Store::stream_identities`](crate::store::Store::stream_identities) yields in
//! strictly ascending byte order (its contract point 2). The stream is held open across the
//! cycle's pages.
//!
//! **In identity order** (each page's identities, sorted, start at or after the highest
//! identity `hi` listed before): a stored identity below the listed one is passed by the merge
//! without having been listed, and since everything listed later sorts higher, it never will
//! be: it is a *candidate* delete. An equal one was seen; a listed identity not stored yet is
//! new. The merge holds one page, one stored batch and the candidates, nothing else.
//!
//! **Out of order** (a page reaches below `hi`): the merge stops where it is, keeping `hi` and
//! the candidates so far, and the identities listed from then on are kept in a set, `later`,
//! for the rest of the cycle. After the listing, a stored identity at or below `hi` was already
//! classified (listed before the break, or a candidate) and is deleted iff it is a candidate
//! not in `later`; one above `hi` is deleted iff it is not in `later`.
//!
//! **New identities committed during the scan** never show up as stored-but-unlisted: before a
//! page is committed the merge has read the stream up to the page's highest identity, and the
//! stream continues after the last identity it yielded, so what the page inserts lies behind it.
//! (After a break, anything the stream still yields that was listed is in `later`.)
//!
//! **A store that breaks the order** (an identity not above the one before it) makes the merge
//! unable to tell what is missing: the scan deletes nothing that cycle and says why.

use std::collections::{HashSet, VecDeque};

use futures::StreamExt;
use futures::stream::BoxStream;

use crate::error::Result;
use crate::model::PKey;

/// One full-scan cycle's merge of the listing against the stored identities.
pub(crate) struct FullScan<'a> {
    /// The key, for the log lines.
    key: PKey,
    /// The stored identities, in batches, ascending.
    stored: BoxStream<'a, Result<Vec<String>>>,
    /// The current stored batch's identities the merge has not passed yet.
    batch: VecDeque<String>,
    /// The last identity the store yielded: the next one must sort after it.
    last_stored: Option<String>,
    /// The stored stream ended (or broke its order).
    exhausted: bool,
    /// The highest identity listed while the listing was in identity order.
    hi: Option<String>,
    /// Stored identities the merge passed without them being listed, ascending.
    candidates: Vec<String>,
    /// Once the listing left identity order: every identity listed since.
    later: Option<HashSet<String>>,
    /// The store yielded `.1` after `.0`, breaking `stream_identities` contract point 2.
    out_of_order: Option<(String, String)>,
    /// Identities listed so far.
    listed: u64,
    /// The most identities held at once: stored batch + candidates + `later` (+ the deletes
    /// while they are collected). A page's own identities are not counted.
    held_peak: usize,
}

impl<'a> FullScan<'a> {
    /// A merge over `stored`, the key's `stream_identities`. Nothing is read until the first
    /// page is listed.
    pub(crate) fn new(key: &PKey, stored: BoxStream<'a, Result<Vec<String>>>) -> Self {
        Self {
            key: key.clone(),
            stored,
            batch: VecDeque::new(),
            last_stored: None,
            exhausted: false,
            hi: None,
            candidates: Vec::new(),
            later: None,
            out_of_order: None,
            listed: 0,
            held_peak: 0,
        }
    }

    /// Takes one page's listed identities (valid items and invalid ones with a readable
    /// identity, in any order within the page). Call it before the page is committed.
    pub(crate) async fn list(&mut self, mut identities: Vec<String>) -> Result<()> {
        self.listed += identities.len() as u64;
        if self.out_of_order.is_some() {
            return Ok(());
        }
        if let Some(later) = self.later.as_mut() {
            later.extend(identities);
            self.note_held(0);
            return Ok(());
        }
        identities.sort_unstable();
        identities.dedup();
        let Some(first) = identities.first() else {
            return Ok(());
        };
        if self.hi.as_ref().is_some_and(|hi| first < hi) {
            tracing::debug!(
                key = %self.key,
                identity = %first,
                after = ?self.hi,
                "the full scan's listing is not in identity order from here on: the identities listed for the rest of the cycle are kept in memory"
            );
            self.later = Some(identities.into_iter().collect());
            self.note_held(0);
            return Ok(());
        }
        for identity in &identities {
            self.pass(identity).await?;
        }
        self.hi = identities.pop();
        self.note_held(0);
        Ok(())
    }

    /// Moves the merge up to `identity`: stored identities below it become candidates, an
    /// equal one is consumed.
    async fn pass(&mut self, identity: &str) -> Result<()> {
        loop {
            let Some(stored) = self.peek().await? else {
                return Ok(());
            };
            match stored.as_str().cmp(identity) {
                std::cmp::Ordering::Less => {
                    if let Some(candidate) = self.batch.pop_front() {
                        self.candidates.push(candidate);
                    }
                }
                std::cmp::Ordering::Equal => {
                    self.batch.pop_front();
                    return Ok(());
                }
                std::cmp::Ordering::Greater => return Ok(()),
            }
        }
    }

    /// The next stored identity the merge has not passed, reading the next batch when the
    /// current one is used up.
    async fn peek(&mut self) -> Result<Option<&String>> {
        while self.batch.is_empty() && !self.exhausted {
            match self.stored.next().await {
                None => self.exhausted = true,
                Some(batch) => self.accept(batch?),
            }
        }
        Ok(self.batch.front())
    }

    /// Takes a stored batch after checking that it continues the strictly ascending order.
    fn accept(&mut self, batch: Vec<String>) {
        let mut previous = self.last_stored.as_ref();
        for identity in &batch {
            if previous.is_some_and(|p| identity <= p) {
                let previous = previous.cloned().unwrap_or_default();
                self.out_of_order = Some((previous, identity.clone()));
                // Nothing will be deleted: let go of everything held.
                self.exhausted = true;
                self.batch = VecDeque::new();
                self.candidates = Vec::new();
                self.later = None;
                return;
            }
            previous = Some(identity);
        }
        self.last_stored = batch.last().cloned().or(self.last_stored.take());
        self.batch.extend(batch);
        self.note_held(0);
    }

    fn note_held(&mut self, deletes: usize) {
        let held = self.batch.len()
            + self.candidates.len()
            + self.later.as_ref().map_or(0, HashSet::len)
            + deletes;
        self.held_peak = self.held_peak.max(held);
    }

    /// After a complete listing: the stored identities to delete, ascending; `None` when the
    /// store broke the order of `stream_identities` (nothing may be deleted then; logged).
    pub(crate) async fn finish(mut self) -> Result<Option<Vec<String>>> {
        let mut deletes = std::mem::take(&mut self.candidates);
        if let Some(later) = &self.later {
            deletes.retain(|id| !later.contains(id));
        }
        // Everything the stream still yields lies above `hi`.
        loop {
            if self.peek().await?.is_none() {
                break;
            }
            let later = self.later.as_ref();
            deletes.extend(
                self.batch
                    .drain(..)
                    .filter(|id| later.is_none_or(|l| !l.contains(id))),
            );
            self.note_held(deletes.len());
        }
        if let Some((previous, next)) = &self.out_of_order {
            tracing::warn!(
                key = %self.key,
                previous = %previous,
                next = %next,
                "Store::stream_identities broke its contract (point 2: identities in strictly ascending byte order across the whole stream): {next:?} came after {previous:?}; this full scan emits no deletes"
            );
            return Ok(None);
        }
        tracing::debug!(
            key = %self.key,
            listed = self.listed,
            in_order = self.later.is_none(),
            deletes = deletes.len(),
            held_peak = self.held_peak,
            "full scan merged against the stored identities"
        );
        Ok(Some(deletes))
    }

    /// The most identities held at once so far (stored batch, candidates, the set kept after
    /// the listing left identity order, deletes being collected).
    #[cfg(test)]
    pub(crate) fn held_peak(&self) -> usize {
        self.held_peak
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::{Arc, Mutex};

    use futures::stream;

    use super::*;
    use crate::rng::SeededRng;

    fn key() -> PKey {
        PKey::new("p", "")
    }

    fn ids(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    /// A keyset stream over a snapshot the test changes while it is open, like the stores'.
    fn keyset(
        snapshot: Arc<Mutex<BTreeSet<String>>>,
        batch: usize,
    ) -> BoxStream<'static, Result<Vec<String>>> {
        stream::unfold(Some(None::<String>), move |after| {
            let snapshot = Arc::clone(&snapshot);
            async move {
                let after = after?;
                let page: Vec<String> = {
                    let set = snapshot.lock().unwrap();
                    match &after {
                        None => set.iter().take(batch).cloned().collect(),
                        Some(last) => set
                            .range::<String, _>((
                                std::ops::Bound::Excluded(last),
                                std::ops::Bound::Unbounded,
                            ))
                            .take(batch)
                            .cloned()
                            .collect(),
                    }
                };
                if page.is_empty() {
                    return None;
                }
                let next = (page.len() == batch).then(|| page.last().cloned());
                Some((Ok(page), next))
            }
        })
        .boxed()
    }

    /// Lists `pages` against a keyset store holding `stored`, committing each page's
    /// identities after it was listed (as the runner does); returns the deletes and the peak.
    async fn scan(stored: &[String], pages: &[Vec<String>], batch: usize) -> (Vec<String>, usize) {
        let snapshot = Arc::new(Mutex::new(stored.iter().cloned().collect::<BTreeSet<_>>()));
        let mut merge = FullScan::new(&key(), keyset(Arc::clone(&snapshot), batch));
        for page in pages {
            merge.list(page.clone()).await.unwrap();
            snapshot.lock().unwrap().extend(page.iter().cloned());
        }
        let peak_before = merge.held_peak();
        let deletes = merge.finish().await.unwrap().expect("an ordered store");
        (deletes, peak_before)
    }

    /// What the old set-based scan deleted: stored minus listed, ascending.
    fn expected(stored: &[String], pages: &[Vec<String>]) -> Vec<String> {
        let listed: HashSet<&String> = pages.iter().flatten().collect();
        let mut out: Vec<String> = stored
            .iter()
            .filter(|id| !listed.contains(id))
            .cloned()
            .collect();
        out.sort();
        out.dedup();
        out
    }

    #[tokio::test]
    async fn sorted_listing_finds_deletes_at_the_start_middle_end_and_between_pages() {
        let stored = ids(&["a", "b", "c", "d", "e", "f", "g", "h", "i"]);
        // "a" (start), "d" (between pages 1 and 2), "f" (inside page 2), "i" (end) are gone;
        // "cc" and "z" are new.
        let pages = vec![ids(&["b", "c", "cc"]), ids(&["e", "g", "h", "z"])];
        let (deletes, _) = scan(&stored, &pages, 2).await;
        assert_eq!(deletes, ids(&["a", "d", "f", "i"]));
    }

    #[tokio::test]
    async fn a_page_unsorted_within_itself_still_merges() {
        let stored = ids(&["a", "b", "c", "d"]);
        let pages = vec![ids(&["c", "a"]), ids(&["d"])];
        let snapshot = Arc::new(Mutex::new(stored.iter().cloned().collect::<BTreeSet<_>>()));
        let mut merge = FullScan::new(&key(), keyset(snapshot, 1));
        for page in &pages {
            merge.list(page.clone()).await.unwrap();
        }
        assert!(merge.later.is_none(), "pages in range order stay merged");
        assert_eq!(merge.finish().await.unwrap(), Some(ids(&["b"])));
    }

    #[tokio::test]
    async fn unsorted_listing_falls_back_on_both_sides_of_the_high_water_mark() {
        let stored = ids(&["a", "b", "c", "d", "e", "f", "g", "h"]);
        // In order up to "e" (hi), then "b" comes back (listed again after the break), then
        // "a" and "g". Gone: "c" (≤ hi, a candidate never listed again), "d" (≤ hi), "f" and
        // "h" (> hi, not listed after the break).
        let pages = vec![ids(&["a", "b"]), ids(&["e"]), ids(&["b", "g"]), ids(&["a"])];
        let (deletes, _) = scan(&stored, &pages, 3).await;
        assert_eq!(deletes, ids(&["c", "d", "f", "h"]));
        assert_eq!(deletes, expected(&stored, &pages));
    }

    #[tokio::test]
    async fn a_candidate_listed_again_after_the_break_is_kept() {
        let stored = ids(&["a", "b", "c"]);
        // "b" is passed (a candidate) on page 1, then listed after the order broke.
        let pages = vec![ids(&["a", "c"]), ids(&["b"])];
        let (deletes, _) = scan(&stored, &pages, 10).await;
        assert!(deletes.is_empty(), "{deletes:?}");
    }

    #[tokio::test]
    async fn identities_inserted_during_the_scan_are_never_candidates() {
        // 3,000 stored identities, batches of 1,000; the listing adds one new identity after
        // every stored one, so each page commits identities the next stored batch would hold if
        // the merge had not read up to the page's end before it was committed.
        let stored: Vec<String> = (0..3000).map(|i| format!("k{i:05}")).collect();
        let listing: Vec<String> = stored
            .iter()
            .filter(|id| !id.ends_with('7'))
            .flat_map(|id| [id.clone(), format!("{id}+")])
            .collect();
        let pages: Vec<Vec<String>> = listing.chunks(100).map(<[String]>::to_vec).collect();
        let (deletes, _) = scan(&stored, &pages, 1000).await;
        assert_eq!(deletes, expected(&stored, &pages));
        assert_eq!(deletes.len(), 300);
    }

    #[tokio::test]
    async fn a_sorted_scan_holds_one_batch_and_the_deletes() {
        let stored: Vec<String> = (0..20_000).map(|i| format!("item-{i:06}")).collect();
        let listing: Vec<String> = stored
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 1000 != 0)
            .map(|(_, id)| id.clone())
            .collect();
        let pages: Vec<Vec<String>> = listing.chunks(250).map(<[String]>::to_vec).collect();
        let (deletes, peak) = scan(&stored, &pages, 1000).await;
        assert_eq!(deletes.len(), 20);
        assert!(
            peak <= 1000 + 20,
            "a sorted scan over 20,000 identities held {peak} at once"
        );
    }

    #[tokio::test]
    async fn a_store_going_backwards_deletes_nothing() {
        for batches in [
            vec![ids(&["a", "c"]), ids(&["b"])],
            vec![ids(&["a", "c", "b"])],
            vec![ids(&["a", "b"]), ids(&["b", "c"])],
        ] {
            let label = format!("{batches:?}");
            let stream = stream::iter(batches.into_iter().map(Ok)).boxed();
            let mut merge = FullScan::new(&key(), stream);
            merge.list(ids(&["x"])).await.unwrap();
            assert_eq!(merge.finish().await.unwrap(), None, "{label}");
        }
        // Also when the break only shows in the stream's tail, after the listing.
        let stream = stream::iter([Ok(ids(&["a"])), Ok(ids(&["m", "l"]))]).boxed();
        let mut merge = FullScan::new(&key(), stream);
        merge.list(ids(&["a"])).await.unwrap();
        assert_eq!(merge.finish().await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_store_error_is_returned() {
        let error = crate::Error::store(crate::store::StoreErrorKind::Other, true, "boom");
        let stream = stream::iter([Ok(ids(&["a"])), Err(error)]).boxed();
        let mut merge = FullScan::new(&key(), stream);
        assert!(merge.list(ids(&["b"])).await.is_err());
    }

    #[tokio::test]
    async fn an_empty_listing_deletes_everything_and_an_empty_store_nothing() {
        let stored = ids(&["a", "b"]);
        assert_eq!(scan(&stored, &[], 1).await.0, stored);
        assert_eq!(scan(&stored, &[Vec::new()], 1).await.0, stored);
        assert!(scan(&[], &[ids(&["a"])], 1).await.0.is_empty());
    }

    /// Seeded random stores and listings (sorted, nearly sorted, shuffled, with new, repeated
    /// and removed identities, pages of random sizes) give exactly the set-based deletes.
    #[tokio::test]
    async fn random_listings_delete_what_the_set_based_scan_deleted() {
        for seed in 1..=200_u32 {
            let rng = SeededRng::new(seed);
            let pick = |n: usize| rng.next_u32() as usize % n.max(1);
            let stored: Vec<String> = (0..pick(300))
                .map(|_| format!("{:x}", pick(1000)))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            let mut listing: Vec<String> = stored
                .iter()
                .filter(|_| pick(10) != 0)
                .cloned()
                .chain((0..pick(50)).map(|_| format!("{:x}n", pick(1000))))
                .collect();
            listing.sort();
            match pick(4) {
                0 => {}
                1 => {
                    // A few swaps: nearly sorted.
                    for _ in 0..=pick(3) {
                        if listing.len() > 1 {
                            let (i, j) = (pick(listing.len()), pick(listing.len()));
                            listing.swap(i, j);
                        }
                    }
                }
                2 => {
                    // Repeats of earlier identities.
                    for _ in 0..pick(5) {
                        if !listing.is_empty() {
                            let id = listing[pick(listing.len())].clone();
                            let at = pick(listing.len() + 1);
                            listing.insert(at, id);
                        }
                    }
                }
                _ => {
                    for i in (1..listing.len()).rev() {
                        listing.swap(i, pick(i + 1));
                    }
                }
            }
            let mut pages = Vec::new();
            let mut rest = listing.as_slice();
            while !rest.is_empty() {
                let n = (1 + pick(40)).min(rest.len());
                pages.push(rest[..n].to_vec());
                rest = &rest[n..];
            }
            let batch = 1 + pick(64);
            let (deletes, _) = scan(&stored, &pages, batch).await;
            assert_eq!(
                deletes,
                expected(&stored, &pages),
                "seed {seed}, batch {batch}"
            );
        }
    }
}
