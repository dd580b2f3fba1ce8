//! [`KvMemory`]: the engine's memory for every sequence it runs: one [`PagePool`] under the
//! budget, the [`PrefixCache`] over it, and the steps that need both (a new state or more
//! pages evict unused cached pages first; snapshots of recurrent state are kept at page
//! boundaries so hybrid models reuse prefixes too).

use crate::backend::Device;
use crate::state::{
    KvDtype, MemoryLayout, PagePool, PrefixCache, PrefixHit, PrefixStats, RecurrentSnapshot,
    SeqState, DEFAULT_PAGE_ROWS,
};
use crate::{Error, Result};

/// Recurrent models keep a state snapshot every this many prompt tokens (at least).
const SNAPSHOT_EVERY: usize = 128;

/// How the engine's memory is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryConfig {
    /// Bytes for keys, values and recurrent state of all sequences (`None`: no limit).
    pub budget: Option<usize>,
    /// Tokens per page.
    pub page_rows: usize,
    /// Whether finished pages are kept for reuse by later sequences.
    pub prefix_cache: bool,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            budget: None,
            page_rows: DEFAULT_PAGE_ROWS,
            prefix_cache: true,
        }
    }
}

/// Bytes of memory the system can still give (`MemAvailable` of `/proc/meminfo`), if known.
pub fn available_memory() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The default KV memory budget for `max_running` sequences of a model with `layout` whose
/// pages live on `device`: enough for each of them to reach the full context, but at most half
/// the host memory available now (4 GiB when that is unknown) or 80% of the GPU's free memory
/// (the weights are loaded by then), and at least 64 pages.
pub fn default_budget(
    layout: &MemoryLayout,
    dtype: KvDtype,
    max_running: usize,
    device: &Device,
) -> usize {
    let per_seq = layout.sequence_bytes(layout.max_positions, DEFAULT_PAGE_ROWS, dtype);
    let want = per_seq.saturating_mul(max_running.max(1));
    let room = match device {
        Device::Cpu => available_memory().map_or(4 << 30, |a| a / 2),
        #[cfg(feature = "cuda")]
        Device::Cuda(d) => d.memory().map_or(4 << 30, |(free, _)| free / 10 * 8),
    };
    want.min(room)
        .max(layout.sequence_bytes(64 * DEFAULT_PAGE_ROWS, DEFAULT_PAGE_ROWS, dtype))
}

/// A reading of the memory's use (for `/metrics` and benchmarks).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// The budget in bytes (`usize::MAX` without one).
    pub budget_bytes: usize,
    /// Bytes in use (pages, recurrent state, snapshots).
    pub used_bytes: usize,
    /// The most bytes in use at once so far.
    pub peak_bytes: usize,
    /// Bytes of one page.
    pub page_bytes: usize,
    /// Pages allocated.
    pub pages_used: usize,
    /// Pages that still fit in the budget.
    pub pages_free: usize,
    /// Pages kept by the prefix cache (some may also be in use).
    pub cached_pages: usize,
    /// Recurrent snapshots kept by the prefix cache.
    pub cached_snapshots: usize,
    /// Prefix-cache counters.
    pub prefix: PrefixStats,
    /// Sequences preempted (their state dropped, to be recomputed) for lack of memory.
    pub preemptions: u64,
}

/// The memory of every sequence of one engine.
#[derive(Debug)]
pub struct KvMemory {
    layout: MemoryLayout,
    pool: PagePool,
    cache: Option<PrefixCache>,
    pub(crate) preemptions: u64,
}

impl KvMemory {
    /// Memory for sequences of a model whose states look like `layout`, keys and values
    /// stored as `dtype`.
    /// `device` holds the pages.
    pub fn new(
        layout: MemoryLayout,
        dtype: KvDtype,
        config: &MemoryConfig,
        device: &Device,
    ) -> Self {
        let shape = layout.page_shape(config.page_rows.max(1), dtype);
        let pool = PagePool::on_device(device, shape, config.budget.unwrap_or(usize::MAX));
        Self {
            layout,
            pool,
            cache: config
                .prefix_cache
                .then(|| PrefixCache::new(config.page_rows.max(1))),
            preemptions: 0,
        }
    }

    /// The layout of the sequences' states.
    pub fn layout(&self) -> &MemoryLayout {
        &self.layout
    }

    /// Bytes a sequence of up to `tokens` tokens may take in this memory.
    pub fn sequence_bytes(&self, tokens: usize) -> usize {
        let shape = self.pool.shape();
        self.layout
            .sequence_bytes(tokens, shape.page_rows, shape.dtype)
    }

    /// Tokens per page.
    pub fn page_rows(&self) -> usize {
        self.pool.shape().page_rows
    }

    /// Recurrent models: prompt positions where chunks end and snapshots are kept (a multiple of
    /// the page size and of the delta rule's 64-token sub-chunk, at least 128).
    pub fn snapshot_every(&self) -> usize {
        fn gcd(a: usize, b: usize) -> usize {
            if b == 0 {
                a
            } else {
                gcd(b, a % b)
            }
        }
        let lcm = |a: usize, b: usize| a / gcd(a, b) * b;
        lcm(
            lcm(SNAPSHOT_EVERY, self.page_rows()),
            crate::attention::gdn::CHUNK,
        )
    }

    /// Whether prefix caching is on.
    pub fn caches_prefixes(&self) -> bool {
        self.cache.is_some()
    }

    /// Drops one unused cached entry; `false` when none is left.
    fn evict_one(&mut self) -> bool {
        self.cache.as_mut().is_some_and(PrefixCache::evict_one)
    }

    /// Runs `f` until it does not fail for lack of memory, evicting unused cached entries
    /// in between; fails when nothing is left to evict.
    fn with_room<T>(&mut self, mut f: impl FnMut(&PagePool) -> Result<T>) -> Result<T> {
        loop {
            match f(&self.pool) {
                Err(Error::OutOfMemory(m)) => {
                    if !self.evict_one() {
                        return Err(Error::OutOfMemory(m));
                    }
                }
                other => return other,
            }
        }
    }

    /// An empty state of at most `max_len` tokens in the pool.
    pub fn new_state(&mut self, max_len: usize) -> Result<SeqState> {
        let layout = self.layout.clone();
        self.with_room(|pool| SeqState::in_pool(pool, &layout, max_len))
    }

    /// Room for `n` more tokens in `state` ([`SeqState::reserve`]), evicting as needed.
    pub fn reserve(&mut self, state: &mut SeqState, n: usize) -> Result<()> {
        self.with_room(|_| state.reserve(n))
    }

    /// A snapshot of `state`'s recurrent layers, if it fits (evicting as needed).
    pub fn snapshot(&mut self, state: &SeqState) -> Option<RecurrentSnapshot> {
        self.with_room(|_| state.snapshot_recurrent())
            .ok()
            .flatten()
    }

    /// The longest cached prefix of `tokens` (at most `max_tokens`) computed under `salt` (0:
    /// the base model; see `prefix::root`), for a new state.
    pub fn lookup(&mut self, tokens: &[u32], max_tokens: usize, salt: u64) -> PrefixHit {
        let recurrent = self.layout.is_recurrent();
        match &mut self.cache {
            Some(c) => c.lookup(tokens, max_tokens, recurrent, salt),
            None => PrefixHit::default(),
        }
    }

    /// Keeps the full pages of `state` (which holds `tokens`, computed under `salt`) from page
    /// `*published` on.
    pub fn publish(
        &mut self,
        tokens: &[u32],
        state: &SeqState,
        hashes: &mut Vec<u64>,
        published: &mut usize,
        salt: u64,
    ) {
        if let Some(c) = &mut self.cache {
            *published = c.insert(tokens, state.pages(), hashes, *published, salt);
        }
    }

    /// Keeps `snapshot`, taken after the first `pages` pages of the chain `hashes`.
    pub fn publish_snapshot(&mut self, hashes: &[u64], pages: usize, snapshot: RecurrentSnapshot) {
        if let Some(c) = &mut self.cache {
            c.insert_snapshot(hashes, pages, snapshot);
        }
    }

    /// Whether a snapshot is kept after page `pages` of the chain `hashes`.
    pub fn has_snapshot(&self, hashes: &[u64], pages: usize) -> bool {
        self.cache
            .as_ref()
            .is_some_and(|c| c.has_snapshot(hashes, pages))
    }

    /// Drops every cached entry no sequence holds.
    pub fn clear_cache(&mut self) {
        if let Some(c) = &mut self.cache {
            c.clear();
        }
    }

    /// The current reading.
    pub fn stats(&self) -> MemoryStats {
        MemoryStats {
            budget_bytes: self.pool.budget(),
            used_bytes: self.pool.used_bytes(),
            peak_bytes: self.pool.peak_bytes(),
            page_bytes: self.pool.shape().page_bytes(),
            pages_used: self.pool.pages_used(),
            pages_free: self.pool.pages_free(),
            cached_pages: self.cache.as_ref().map_or(0, PrefixCache::len),
            cached_snapshots: self.cache.as_ref().map_or(0, PrefixCache::snapshots),
            prefix: self
                .cache
                .as_ref()
                .map(PrefixCache::stats)
                .unwrap_or_default(),
            preemptions: self.preemptions,
        }
    }
}
