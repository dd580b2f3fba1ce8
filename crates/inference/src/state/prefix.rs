//! [`PrefixCache`]: automatic prefix caching. Every full page a sequence computes is kept,
//! keyed by a hash of its tokens and of all the tokens before it (the hash of its parent page
//! chained with its own tokens, as vLLM's automatic prefix caching does), so a new sequence
//! whose tokens start with a cached chain of pages adopts those pages (shared, read-only) and
//! computes only the rest. Each entry also keeps its tokens, so a hash collision can never hand
//! out another prefix's keys and values.
//!
//! Models with recurrent layers cannot rebuild their state from keys and values: for them a
//! page boundary is reusable only when a [`RecurrentSnapshot`] taken at that position is kept
//! with the page ending there.
//!
//! Entries held by nobody else (page reference count 1) are evicted least recently used first,
//! the deepest page of a chain before its parents, when the pool needs room.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use super::pool::PageRef;
use super::seq::RecurrentSnapshot;

/// The hash of the empty prefix.
const ROOT: u64 = 0x6c61_7474_6963_6521;

/// The parent hash of a chain's first page: [`ROOT`] for the base model, one per `salt`
/// otherwise (e.g. the LoRA adapters a request runs with: their keys and values differ).
pub fn root(salt: u64) -> u64 {
    if salt == 0 {
        ROOT
    } else {
        page_hash(ROOT, &[salt as u32, (salt >> 32) as u32])
    }
}

/// The chained hash of a page's tokens after the prefix hashed as `parent`.
pub fn page_hash(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

#[derive(Debug)]
struct Entry {
    page: PageRef,
    parent: u64,
    tokens: Box<[u32]>,
    depth: usize,
    last_use: u64,
    /// The recurrent state after this page's last token, and when it was last used.
    snapshot: Option<(Arc<RecurrentSnapshot>, u64)>,
}

/// Counters of the cache's use (for `/metrics`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixStats {
    /// Lookups made.
    pub lookups: u64,
    /// Prompt tokens looked up.
    pub queried_tokens: u64,
    /// Tokens found in the cache (not recomputed).
    pub hit_tokens: u64,
    /// Pages evicted to make room.
    pub evicted_pages: u64,
    /// Recurrent snapshots evicted.
    pub evicted_snapshots: u64,
}

/// What a lookup found: the cached pages of the longest reusable prefix.
#[derive(Debug, Default)]
pub struct PrefixHit {
    /// Pages covering the first `tokens` tokens.
    pub pages: Vec<PageRef>,
    /// Tokens covered (a multiple of the page size).
    pub tokens: usize,
    /// For recurrent models: the state after those tokens.
    pub snapshot: Option<Arc<RecurrentSnapshot>>,
}

/// Cached pages of earlier sequences, keyed by their token prefix.
#[derive(Debug)]
pub struct PrefixCache {
    page_rows: usize,
    entries: HashMap<u64, Entry>,
    clock: u64,
    stats: PrefixStats,
}

impl PrefixCache {
    /// An empty cache of pages of `page_rows` tokens.
    pub fn new(page_rows: usize) -> Self {
        Self {
            page_rows,
            entries: HashMap::new(),
            clock: 0,
            stats: PrefixStats::default(),
        }
    }

    /// Tokens per page.
    pub fn page_rows(&self) -> usize {
        self.page_rows
    }

    /// Pages held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Recurrent snapshots held.
    pub fn snapshots(&self) -> usize {
        self.entries
            .values()
            .filter(|e| e.snapshot.is_some())
            .count()
    }

    /// The counters so far.
    pub fn stats(&self) -> PrefixStats {
        self.stats
    }

    /// The chained hashes of the full pages of `tokens`, continuing `hashes` (which holds those
    /// of the first pages already).
    pub fn extend_hashes(&self, tokens: &[u32], hashes: &mut Vec<u64>, salt: u64) {
        let p = self.page_rows;
        for i in hashes.len()..tokens.len() / p {
            let parent = if i == 0 { root(salt) } else { hashes[i - 1] };
            hashes.push(page_hash(parent, &tokens[i * p..(i + 1) * p]));
        }
    }

    fn matches(&self, hash: u64, parent: u64, tokens: &[u32]) -> bool {
        self.entries
            .get(&hash)
            .is_some_and(|e| e.parent == parent && *e.tokens == *tokens)
    }

    /// The longest cached prefix of `tokens` of at most `max_tokens` tokens, in whole pages;
    /// with `recurrent`, the longest one that also ends at a kept snapshot. Marks what it
    /// returns as recently used.
    pub fn lookup(
        &mut self,
        tokens: &[u32],
        max_tokens: usize,
        recurrent: bool,
        salt: u64,
    ) -> PrefixHit {
        self.clock += 1;
        self.stats.lookups += 1;
        self.stats.queried_tokens += tokens.len() as u64;
        let p = self.page_rows;
        let mut hashes = Vec::new();
        self.extend_hashes(
            &tokens[..max_tokens.min(tokens.len()) / p * p],
            &mut hashes,
            salt,
        );
        let mut best = 0;
        for (i, &h) in hashes.iter().enumerate() {
            let parent = if i == 0 { root(salt) } else { hashes[i - 1] };
            if !self.matches(h, parent, &tokens[i * p..(i + 1) * p]) {
                break;
            }
            if !recurrent || self.entries[&h].snapshot.is_some() {
                best = i + 1;
            }
        }
        let clock = self.clock;
        let mut hit = PrefixHit::default();
        for &h in &hashes[..best] {
            let e = self.entries.get_mut(&h).expect("matched above");
            e.last_use = clock;
            hit.pages.push(Arc::clone(&e.page));
        }
        if recurrent && best > 0 {
            let e = self
                .entries
                .get_mut(&hashes[best - 1])
                .expect("matched above");
            let (snap, used) = e.snapshot.as_mut().expect("chosen for its snapshot");
            *used = clock;
            hit.snapshot = Some(Arc::clone(snap));
        }
        hit.tokens = best * p;
        self.stats.hit_tokens += hit.tokens as u64;
        hit
    }

    /// Keeps the full pages of a sequence from page `from` on: page `i` of `pages` holds
    /// `tokens[i * page_rows..]`; `hashes` are the sequence's chained page hashes (extended
    /// here). Pages already cached (the same tokens computed by another sequence) keep the
    /// cached copy. Returns the number of full pages now covered.
    pub fn insert(
        &mut self,
        tokens: &[u32],
        pages: &[PageRef],
        hashes: &mut Vec<u64>,
        from: usize,
        salt: u64,
    ) -> usize {
        self.clock += 1;
        let p = self.page_rows;
        let full = (tokens.len() / p).min(pages.len());
        self.extend_hashes(&tokens[..full * p], hashes, salt);
        for (i, page) in pages.iter().enumerate().take(full).skip(from) {
            let parent = if i == 0 { root(salt) } else { hashes[i - 1] };
            let h = hashes[i];
            let clock = self.clock;
            let e = self.entries.entry(h).or_insert_with(|| Entry {
                page: Arc::clone(page),
                parent,
                tokens: tokens[i * p..(i + 1) * p].into(),
                depth: i,
                last_use: clock,
                snapshot: None,
            });
            e.last_use = clock;
        }
        full
    }

    /// Keeps `snapshot`, the recurrent state after the first `pages * page_rows` tokens of the
    /// sequence whose page hashes are `hashes`, with the cached page ending there. Returns
    /// whether it was kept (the page must be cached).
    pub fn insert_snapshot(
        &mut self,
        hashes: &[u64],
        pages: usize,
        snapshot: RecurrentSnapshot,
    ) -> bool {
        self.clock += 1;
        let clock = self.clock;
        match pages
            .checked_sub(1)
            .and_then(|i| hashes.get(i))
            .and_then(|h| self.entries.get_mut(h))
        {
            Some(e) => {
                e.snapshot = Some((Arc::new(snapshot), clock));
                e.last_use = clock;
                true
            }
            None => false,
        }
    }

    /// Whether a snapshot is kept after page `pages` of the chain `hashes`.
    pub fn has_snapshot(&self, hashes: &[u64], pages: usize) -> bool {
        pages
            .checked_sub(1)
            .and_then(|i| hashes.get(i))
            .and_then(|h| self.entries.get(h))
            .is_some_and(|e| e.snapshot.is_some())
    }

    /// Drops the least recently used entry (a snapshot, or a page with its snapshot) that no
    /// sequence holds. Returns `false` when there is none.
    pub fn evict_one(&mut self) -> bool {
        // (last use, deeper first, hash, snapshot only)
        let mut victim: Option<(u64, std::cmp::Reverse<usize>, u64, bool)> = None;
        for (&h, e) in &self.entries {
            let snap_free = e
                .snapshot
                .as_ref()
                .map(|(s, used)| (Arc::strong_count(s) == 1, *used));
            if let Some((true, used)) = snap_free {
                let c = (used, std::cmp::Reverse(e.depth), h, true);
                if victim.is_none_or(|v| (c.0, c.1) < (v.0, v.1)) {
                    victim = Some(c);
                }
            }
            let page_free = Arc::strong_count(&e.page) == 1 && snap_free.is_none_or(|(f, _)| f);
            if page_free {
                let c = (e.last_use, std::cmp::Reverse(e.depth), h, false);
                if victim.is_none_or(|v| (c.0, c.1) < (v.0, v.1)) {
                    victim = Some(c);
                }
            }
        }
        let Some((_, _, h, snapshot_only)) = victim else {
            return false;
        };
        if snapshot_only {
            self.entries.get_mut(&h).expect("found above").snapshot = None;
            self.stats.evicted_snapshots += 1;
        } else {
            let e = self.entries.remove(&h).expect("found above");
            self.stats.evicted_pages += 1;
            if e.snapshot.is_some() {
                self.stats.evicted_snapshots += 1;
            }
        }
        true
    }

    /// Drops every entry no sequence holds.
    pub fn clear(&mut self) {
        while self.evict_one() {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{KvDtype, LayerKind, MemoryLayout, PagePool, SeqState};

    fn layout(recurrent: bool) -> MemoryLayout {
        let mut kinds = vec![LayerKind::Attention];
        if recurrent {
            kinds.push(LayerKind::Recurrent {
                conv: 1,
                recurrent: 1,
            });
        }
        MemoryLayout {
            kinds,
            kv_dim: 1,
            max_positions: 1000,
        }
    }

    fn filled(pool: &PagePool, lay: &MemoryLayout, tokens: &[u32]) -> SeqState {
        let mut s = SeqState::in_pool(pool, lay, 1000).unwrap();
        let rows: Vec<f32> = tokens.iter().map(|&t| t as f32).collect();
        s.append(0, &rows, &rows);
        s.commit(tokens.len());
        s
    }

    #[test]
    fn shares_whole_pages_of_a_common_prefix() {
        let lay = layout(false);
        let pool = PagePool::unbounded(lay.page_shape(4, KvDtype::F32));
        let mut cache = PrefixCache::new(4);
        let a: Vec<u32> = (0..10).collect();
        let s = filled(&pool, &lay, &a);
        let mut hashes = Vec::new();
        cache.insert(&a, s.pages(), &mut hashes, 0, 0);
        assert_eq!(cache.len(), 2); // the third page is partial
        drop(s);
        let mut b = a.clone();
        b[9] = 99;
        b.push(7);
        let hit = cache.lookup(&b, b.len() - 1, false, 0);
        assert_eq!(hit.tokens, 8);
        let mut s = SeqState::in_pool(&pool, &lay, 1000).unwrap();
        s.adopt_prefix(hit.pages, 8, None).unwrap();
        assert_eq!(
            s.keys(0).gather_f32(0..8),
            (0..8).map(|x| x as f32).collect::<Vec<_>>()
        );
        // Diverging inside the first page finds nothing; at most `max_tokens` are reused.
        assert_eq!(cache.lookup(&[0, 1, 5, 3, 4], 4, false, 0).tokens, 0);
        assert_eq!(cache.lookup(&a, 7, false, 0).tokens, 4);
        // Pages in use are never evicted; once free, deepest first.
        drop(s);
        assert!(cache.evict_one());
        assert_eq!(cache.lookup(&a, 10, false, 0).tokens, 4);
        cache.clear();
        assert!(cache.is_empty());
        assert_eq!(pool.used_bytes(), 0);
        let st = cache.stats();
        assert_eq!((st.lookups, st.evicted_pages), (4, 2));
    }

    #[test]
    fn recurrent_prefixes_need_a_snapshot() {
        let lay = layout(true);
        let pool = PagePool::unbounded(lay.page_shape(4, KvDtype::F32));
        let mut cache = PrefixCache::new(4);
        let a: Vec<u32> = (0..12).collect();
        let s = filled(&pool, &lay, &a[..8]);
        let mut hashes = Vec::new();
        cache.insert(&a[..8], s.pages(), &mut hashes, 0, 0);
        assert_eq!(cache.lookup(&a, 11, true, 0).tokens, 0);
        let snap = s.snapshot_recurrent().unwrap().unwrap();
        assert!(cache.insert_snapshot(&hashes, 1, snap));
        assert!(cache.has_snapshot(&hashes, 1));
        let hit = cache.lookup(&a, 11, true, 0);
        assert_eq!(hit.tokens, 4);
        assert!(hit.snapshot.is_some());
        assert_eq!(cache.lookup(&a, 11, false, 0).tokens, 8);
        drop(hit);
        drop(s);
        // The snapshot goes first when it is the least recently used.
        cache.clear();
        assert_eq!(pool.used_bytes(), 0);
    }
}
