//! Draft-free speculation in the style of SuffixDecoding (Oliaro et al. 2024): [`suffix_draft`]
//! proposes the tokens that followed earlier occurrences of the sequence's current suffix, in
//! its own history ([`SuffixIndex`]) and in a bounded cache of finished requests' outputs
//! ([`SuffixCache`]), choosing the continuation by frequency among the longest matches.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;

/// Shortest suffix match that counts as an occurrence (the bigram the index is keyed by).
const MIN_MATCH: usize = 2;
/// Longest match length measured; longer matches are all equally good.
const MAX_MATCH: usize = 24;
/// Most occurrences examined per corpus per bigram, the most recent first.
const MAX_CANDIDATES: usize = 256;
/// The draft is at most this many times the best match length.
const SPEC_FACTOR: usize = 2;
/// The draft stops before its estimated probability of being accepted falls below this.
const MIN_PROB: f64 = 0.1;
/// Most tokens a [`SuffixCache`] keeps, so that arena positions always fit in `u32`.
const MAX_CACHE_TOKENS: usize = 1 << 30;

/// How recent an occurrence is: history ones beat cache ones, then later positions win.
type Recency = (bool, usize);

fn bigram(a: u32, b: u32) -> u64 {
    (u64::from(a) << 32) | u64::from(b)
}

/// How many tokens at the end of `before` equal the end of `history`, capped at `MAX_MATCH`.
fn match_len(before: &[u32], history: &[u32]) -> usize {
    let pairs = before.iter().rev().zip(history.iter().rev());
    pairs.take(MAX_MATCH).take_while(|(a, b)| a == b).count()
}

/// Positions `p` of a corpus, keyed by the bigram of the two tokens before `p`, ascending.
#[derive(Debug, Default, Clone)]
struct BigramIndex(HashMap<u64, Vec<u32>>);

impl BigramIndex {
    /// Indexes position `p >= MIN_MATCH` of `corpus` (positions past `u32::MAX` are not indexed).
    fn push(&mut self, corpus: &[u32], p: usize) {
        if let Ok(pos) = u32::try_from(p) {
            self.0
                .entry(bigram(corpus[p - 2], corpus[p - 1]))
                .or_default()
                .push(pos);
        }
    }

    /// The positions after `key`, latest first.
    fn recent(&self, key: u64) -> impl Iterator<Item = usize> + '_ {
        self.0
            .get(&key)
            .into_iter()
            .flat_map(|v| v.iter().rev())
            .map(|&p| p as usize)
    }
}

/// A place where the history's suffix occurred before, and what followed it.
struct Occurrence<'a> {
    cont: &'a [u32],
    len: usize,
    recency: Recency,
}

/// An index over one growing token sequence (a request's prompt and output so far).
#[derive(Debug, Default, Clone)]
pub struct SuffixIndex {
    tokens: Vec<u32>,
    index: BigramIndex,
}

impl SuffixIndex {
    /// An empty sequence.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `tokens` to the sequence and indexes them.
    pub fn extend(&mut self, tokens: &[u32]) {
        let start = self.tokens.len();
        self.tokens.extend_from_slice(tokens);
        for p in start.max(MIN_MATCH)..self.tokens.len() {
            self.index.push(&self.tokens, p);
        }
    }

    /// Tokens in the sequence.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the sequence has no tokens.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The sequence.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Adds the occurrences of `history`'s last bigram `key`; the continuation always starts
    /// before the end, so the suffix never matches itself.
    fn collect<'a>(&'a self, key: u64, history: &[u32], out: &mut Vec<Occurrence<'a>>) {
        for p in self.index.recent(key).take(MAX_CANDIDATES) {
            let len = match_len(&self.tokens[..p], history);
            out.push(Occurrence {
                cont: &self.tokens[p..],
                len,
                recency: (true, p),
            });
        }
    }
}

/// A bounded cache of finished requests' outputs, shared by the requests of one engine.
#[derive(Debug, Clone)]
pub struct SuffixCache {
    max_tokens: usize,
    /// Outputs back to back in insertion order; those before the first live segment are evicted.
    arena: Vec<u32>,
    /// The live outputs' ranges in `arena`, oldest first.
    segments: VecDeque<Range<usize>>,
    /// Tokens in the live outputs.
    held: usize,
    index: BigramIndex,
}

impl SuffixCache {
    /// A cache of at most `max_tokens` tokens (clamped to 2^30); oldest outputs are evicted first.
    pub fn new(max_tokens: usize) -> Self {
        Self {
            max_tokens: max_tokens.min(MAX_CACHE_TOKENS),
            arena: Vec::new(),
            segments: VecDeque::new(),
            held: 0,
            index: BigramIndex::default(),
        }
    }

    /// Adds a finished output: one shorter than 2 tokens is ignored, one longer than the cache
    /// keeps its last `max_tokens` tokens, and the oldest outputs go until the rest fit.
    pub fn insert(&mut self, output: &[u32]) {
        let output = &output[output.len().saturating_sub(self.max_tokens)..];
        if output.len() < MIN_MATCH {
            return;
        }
        let start = self.arena.len();
        self.arena.extend_from_slice(output);
        for p in start + MIN_MATCH..self.arena.len() {
            self.index.push(&self.arena, p);
        }
        self.segments.push_back(start..self.arena.len());
        self.held += output.len();
        while self.held > self.max_tokens {
            let old = self
                .segments
                .pop_front()
                .expect("held tokens lie in live segments");
            self.held -= old.len();
        }
        let dead = self.live_start();
        if dead > 0 && 2 * dead >= self.held {
            self.rebuild();
        }
    }

    /// Tokens held now.
    pub fn tokens(&self) -> usize {
        self.held
    }

    /// The first arena position of a live output (every position before it is evicted).
    fn live_start(&self) -> usize {
        self.segments.front().map_or(self.arena.len(), |s| s.start)
    }

    /// Drops the evicted prefix of the arena and indexes the live outputs afresh.
    fn rebuild(&mut self) {
        let offset = self.live_start();
        self.arena.drain(..offset);
        self.index = BigramIndex::default();
        for seg in &mut self.segments {
            *seg = seg.start - offset..seg.end - offset;
            for p in seg.start + MIN_MATCH..seg.end {
                self.index.push(&self.arena, p);
            }
        }
    }

    /// Adds the occurrences of `history`'s last bigram `key` in the live outputs; matches stay
    /// within their output.
    fn collect<'a>(&'a self, key: u64, history: &[u32], out: &mut Vec<Occurrence<'a>>) {
        let live = self.live_start();
        for p in self
            .index
            .recent(key)
            .take_while(|&p| p >= live)
            .take(MAX_CANDIDATES)
        {
            let seg = &self.segments[self.segments.partition_point(|s| s.start <= p) - 1];
            let len = match_len(&self.arena[seg.start..p], history);
            out.push(Occurrence {
                cont: &self.arena[p..seg.end],
                len,
                recency: (false, p),
            });
        }
    }
}

/// The draft after `history`: up to `max` tokens.
///
/// The longest matches of the history's suffix (at least `MIN_MATCH`, measured up to
/// `MAX_MATCH` tokens) in the history and the cache vote token by token; the draft takes the
/// most frequent continuation (ties go to the most recent occurrence) while its estimated
/// probability stays at least `MIN_PROB`, for at most `SPEC_FACTOR` times the match length.
pub fn suffix_draft(history: &SuffixIndex, cache: Option<&SuffixCache>, max: usize) -> Vec<u32> {
    let tokens = history.tokens();
    let n = tokens.len();
    if max == 0 || n < MIN_MATCH {
        return Vec::new();
    }
    let key = bigram(tokens[n - 2], tokens[n - 1]);
    let mut occurrences = Vec::new();
    history.collect(key, tokens, &mut occurrences);
    if let Some(cache) = cache {
        cache.collect(key, tokens, &mut occurrences);
    }
    let Some(best) = occurrences.iter().map(|o| o.len).max() else {
        return Vec::new();
    };
    occurrences.retain(|o| o.len == best);
    let limit = max.min(SPEC_FACTOR * best);

    let mut draft = Vec::with_capacity(limit);
    let mut prob = 1.0;
    let mut tally: HashMap<u32, (u32, Recency)> = HashMap::new();
    while draft.len() < limit {
        let depth = draft.len();
        occurrences.retain(|o| o.cont.len() > depth);
        tally.clear();
        for o in &occurrences {
            let entry = tally.entry(o.cont[depth]).or_insert((0, o.recency));
            entry.0 += 1;
            entry.1 = entry.1.max(o.recency);
        }
        let total: u32 = tally.values().map(|&(count, _)| count).sum();
        let Some((&token, &(count, _))) = tally.iter().max_by_key(|&(_, &vote)| vote) else {
            break;
        };
        prob *= f64::from(count) / f64::from(total);
        if prob < MIN_PROB {
            break;
        }
        draft.push(token);
        occurrences.retain(|o| o.cont[depth] == token);
    }
    draft
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draft(history: &[u32], cache: Option<&SuffixCache>, max: usize) -> Vec<u32> {
        let mut index = SuffixIndex::new();
        index.extend(history);
        suffix_draft(&index, cache, max)
    }

    #[test]
    fn longest_match_wins_and_limits_the_draft() {
        // "8 1 2" matches at 4 (length 3); the later "0 1 2" at 9 only matches "1 2".
        let h = [7, 8, 1, 2, 3, 30, 0, 1, 2, 4, 31, 8, 1, 2];
        assert_eq!(draft(&h, None, 100), [3, 30, 0, 1, 2, 4]); // SPEC_FACTOR * 3 tokens
        assert_eq!(draft(&h, None, 2), [3, 30]);
        assert!(draft(&h, None, 0).is_empty());
        assert!(draft(&[], None, 4).is_empty());
    }

    #[test]
    fn match_length_is_capped() {
        let h: Vec<u32> = (0..60).map(|i| 1 + i % 2).collect();
        // Every even position from 24 on matches MAX_MATCH tokens; the one at 24 runs longest.
        assert_eq!(draft(&h, None, 100), &h[24..]);
    }

    #[test]
    fn most_frequent_continuation_wins() {
        // "1 2" is followed by 3 twice and by 4 once (most recently).
        let h = [20, 1, 2, 3, 21, 1, 2, 3, 22, 1, 2, 4, 23, 1, 2];
        // 3 (2/3), then 21 or 22 (1/2 each: the later, 22), estimate 1/3 >= MIN_PROB.
        assert_eq!(draft(&h, None, 10), [3, 22, 1, 2]);
        let h = [10, 1, 2, 3, 11, 1, 2, 4, 12, 1, 2, 5, 13, 1, 2];
        // 3, 4, 5 each 1/3: the most recent, 5, and its continuation up to the end.
        assert_eq!(draft(&h, None, 10), [5, 13, 1, 2]);
    }

    #[test]
    fn low_probability_stops_the_draft() {
        // `per_group` cached outputs [1, 2, g, 100 + k] for each group token g.
        let vote = |groups: &[u32], per_group: u32| {
            let mut cache = SuffixCache::new(1000);
            for &g in groups {
                for k in 0..per_group {
                    cache.insert(&[1, 2, g, 100 + k]);
                }
            }
            draft(&[9, 1, 2], Some(&cache), 10)
        };
        assert_eq!(vote(&[5, 6, 7], 4), [7]); // 1/3, then 1/4: 1/12 < MIN_PROB stops
        assert_eq!(vote(&[5, 6, 7], 3), [7, 102]); // 1/3, then 1/3: 1/9 goes on
        assert_eq!(vote(&[5], 11), [5]); // 1/11 stops
        assert_eq!(vote(&[5], 10), [5, 109]); // exactly MIN_PROB goes on
    }

    #[test]
    fn no_trivial_self_match() {
        assert!(draft(&[1, 2, 3], None, 4).is_empty());
        assert_eq!(draft(&[5, 5, 5], None, 3), [5]);
        let mut grown = SuffixIndex::new();
        assert!(grown.is_empty());
        grown.extend(&[5, 5]);
        assert_eq!((grown.len(), suffix_draft(&grown, None, 3)), (2, vec![]));
    }

    #[test]
    fn cache_matches_across_requests() {
        let mut cache = SuffixCache::new(100);
        cache.insert(&[1, 2, 3, 4, 5]);
        assert_eq!(draft(&[9, 3, 4], Some(&cache), 8), [5]);
        assert_eq!(draft(&[2, 3], Some(&cache), 8), [4, 5]);
        assert!(draft(&[2, 3], None, 8).is_empty());
        cache.insert(&[1, 2, 7]);
        // Equal matches in history and cache: the history counts as more recent.
        assert_eq!(draft(&[1, 2, 8, 1, 2], Some(&cache), 8), [8, 1, 2]);
    }

    #[test]
    fn cache_matches_stay_within_outputs() {
        let mut cache = SuffixCache::new(100);
        cache.insert(&[3, 4]);
        cache.insert(&[9, 8]);
        assert!(draft(&[4, 9], Some(&cache), 4).is_empty());
        // Crossing into [8, 7] would make [1, 2, 5] a match of 3 and draft 5.
        let mut cache = SuffixCache::new(100);
        for output in [&[8, 7][..], &[1, 2, 5], &[9, 1, 2, 6]] {
            cache.insert(output);
        }
        assert_eq!(draft(&[7, 1, 2], Some(&cache), 4), [6]);
    }

    #[test]
    fn eviction_forgets_old_outputs() {
        let mut cache = SuffixCache::new(10);
        cache.insert(&[1, 2, 3]);
        cache.insert(&[7]);
        assert_eq!(cache.tokens(), 3);
        assert_eq!(draft(&[1, 2], Some(&cache), 4), [3]);
        cache.insert(&[20, 21, 22, 23, 24]);
        cache.insert(&[30, 31, 32, 33, 34]);
        assert_eq!(cache.tokens(), 10);
        assert!(draft(&[1, 2], Some(&cache), 4).is_empty());
        cache.insert(&(40..55).collect::<Vec<u32>>());
        assert_eq!(cache.tokens(), 10);
        assert!(draft(&[40, 41], Some(&cache), 4).is_empty());
        assert!(draft(&[20, 21], Some(&cache), 4).is_empty());
        assert_eq!(draft(&[45, 46], Some(&cache), 8), [47, 48, 49, 50]);
        for i in 0..100 {
            cache.insert(&[100 + i, 200 + i, 300 + i]);
            assert!(cache.tokens() <= 10);
        }
        assert!(draft(&[100, 200], Some(&cache), 4).is_empty());
        assert_eq!(draft(&[199, 299], Some(&cache), 4), [399]);
        let mut empty = SuffixCache::new(0);
        empty.insert(&[1, 2, 3]);
        assert_eq!(empty.tokens(), 0);
        assert!(draft(&[1, 2], Some(&empty), 4).is_empty());
    }

    /// Scans every position of the history and of each cached output (oldest first).
    fn reference(history: &[u32], outputs: &VecDeque<Vec<u32>>, max: usize) -> Vec<u32> {
        let corpora = std::iter::once((history, 1)).chain(outputs.iter().map(|o| (&o[..], 0)));
        let mut occs = Vec::new(); // (continuation, match length, recency)
        for (order, (corpus, in_history)) in corpora.enumerate() {
            for p in 2..corpus.len() {
                let before = corpus[..p].iter().rev();
                let len = before
                    .zip(history.iter().rev())
                    .take_while(|(a, b)| a == b)
                    .count();
                if len >= 2 {
                    occs.push((&corpus[p..], len.min(MAX_MATCH), (in_history, order, p)));
                }
            }
        }
        let best = occs.iter().map(|o| o.1).max().unwrap_or(0); // no occurrence: no draft
        occs.retain(|o| o.1 == best);
        let mut out = Vec::new();
        let mut prob = 1.0;
        while out.len() < max.min(2 * best) {
            let j = out.len();
            occs.retain(|o| o.0.len() > j);
            let score = |t: u32| {
                let with_t = occs.iter().filter(|o| o.0[j] == t);
                (with_t.clone().count(), with_t.map(|o| o.2).max())
            };
            let Some(t) = occs.iter().map(|o| o.0[j]).max_by_key(|&t| score(t)) else {
                break;
            };
            prob *= score(t).0 as f64 / occs.len() as f64;
            if prob < 0.1 {
                break;
            }
            out.push(t);
            occs.retain(|o| o.0[j] == t);
        }
        out
    }

    /// A xorshift64 generator.
    struct XorShift(u64);

    impl XorShift {
        fn below(&mut self, bound: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            usize::try_from(self.0 % u64::try_from(bound).unwrap()).unwrap()
        }
    }

    /// Random tokens of 4 kinds, with chunks copied from `source` or from earlier in the
    /// sequence to make long matches.
    fn sequence(len: usize, source: &[u32], rng: &mut XorShift) -> Vec<u32> {
        let mut out = Vec::new();
        while out.len() < len {
            let from_source = rng.below(3) == 0;
            let from_len = if from_source { source.len() } else { out.len() };
            if from_len > 4 && rng.below(2) == 0 {
                let start = rng.below(from_len - 4);
                let end = (start + 1 + rng.below(30)).min(from_len);
                if from_source {
                    out.extend_from_slice(&source[start..end]);
                } else {
                    out.extend_from_within(start..end);
                }
            } else {
                out.push(u32::try_from(rng.below(4)).unwrap());
            }
        }
        out.truncate(len);
        out
    }

    #[test]
    fn matches_brute_force_reference() {
        let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
        let max_tokens = 150;
        let mut cache = SuffixCache::new(max_tokens);
        let mut model: VecDeque<Vec<u32>> = VecDeque::new();
        let mut last = Vec::new();
        for _ in 0..300 {
            for _ in 0..rng.below(4) {
                let output = sequence(rng.below(60), &last, &mut rng);
                cache.insert(&output);
                let kept = &output[output.len().saturating_sub(max_tokens)..];
                if kept.len() >= 2 {
                    model.push_back(kept.to_vec());
                }
                let mut held: usize = model.iter().map(Vec::len).sum();
                while held > max_tokens {
                    held -= model.pop_front().map_or(0, |o| o.len());
                }
                assert_eq!(cache.tokens(), held);
            }
            let source = model.back().map_or(&[][..], |o| &o[..]);
            let history = sequence(1 + rng.below(200), source, &mut rng);
            let mut index = SuffixIndex::new();
            let mut at = 0;
            while at < history.len() {
                let next = (at + 1 + rng.below(40)).min(history.len());
                index.extend(&history[at..next]);
                at = next;
                let max = rng.below(12);
                let got = suffix_draft(&index, Some(&cache), max);
                assert_eq!(
                    got,
                    reference(&history[..at], &model, max),
                    "{:?}",
                    &history[..at]
                );
                let alone = suffix_draft(&index, None, max);
                assert_eq!(alone, reference(&history[..at], &VecDeque::new(), max));
            }
            last = history;
        }
    }
}
