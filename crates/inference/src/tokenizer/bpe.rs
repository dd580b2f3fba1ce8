//! The BPE model: a vocabulary, ranked merges, and the merge loop that turns one pre-tokenized
//! word into token ids, as HF `tokenizers` does it (lowest merge rank first, leftmost on ties).
//!
//! Two input flavours: byte-level (GPT-2, Llama 3, Qwen: every byte of the word is one initial
//! symbol, spelled through the byte-to-unicode table) and character-level (SentencePiece-style
//! BPE: every character is one initial symbol; characters outside the vocabulary become
//! `<0xNN>` byte tokens with `byte_fallback`, else the unknown token, fused when `fuse_unk`).
//! This module neither splits text into words nor decodes ids.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::RwLock;

use super::vocab::{FastHasher, IdTable, VocabMap};

/// The byte → character table of byte-level BPE (GPT-2's `bytes_to_unicode`): printable bytes
/// map to themselves, the others to U+0100 onwards in byte order.
pub(crate) const BYTE_CHARS: [char; 256] = {
    let mut t = ['\0'; 256];
    let mut n = 0u32;
    let mut b = 0usize;
    while b < 256 {
        let printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
        t[b] = if printable {
            // Every byte value is a valid scalar.
            match char::from_u32(b as u32) {
                Some(c) => c,
                None => '\0',
            }
        } else {
            let c = match char::from_u32(256 + n) {
                Some(c) => c,
                None => '\0',
            };
            n += 1;
            c
        };
        b += 1;
    }
    t
};

/// The inverse of [`BYTE_CHARS`]: the byte a byte-level character stands for.
pub(crate) fn char_byte(c: char) -> Option<u8> {
    let cp = c as u32;
    if cp >= 0x144 {
        return None;
    }
    BYTE_CHARS.iter().position(|&x| x == c).map(|b| b as u8)
}

/// Hasher for the merge table's packed `(left id, right id)` keys: one folded 64×64→128-bit
/// multiply, which spreads both halves over all bits.
#[derive(Default, Clone, Copy)]
struct PairHasher(u64);

impl Hasher for PairHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    #[inline]
    fn write_u64(&mut self, v: u64) {
        let m = u128::from(v ^ self.0) * 0x9e37_79b9_7f4a_7c15_u128;
        self.0 = (m as u64) ^ ((m >> 64) as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

/// `pair_key(left, right)` → (rank, merged id).
type PairMap = HashMap<u64, (u32, u32), BuildHasherDefault<PairHasher>>;

/// The merge table key of a pair of ids.
#[inline]
fn pair_key(left: u32, right: u32) -> u64 {
    (u64::from(left) << 32) | u64::from(right)
}

/// No id: the marker in [`Bpe::ascii_ids`].
const NO_ID: u32 = u32::MAX;

/// Errors building a BPE model, turned into messages by the loader.
#[derive(Debug)]
pub(crate) enum BpeError {
    /// A merge names a token that is not in the vocabulary.
    MergeToken(usize, String),
    /// A merge's result is not in the vocabulary.
    MergeResult(usize, String),
    /// The unknown token is not in the vocabulary.
    Unk(String),
}

impl std::fmt::Display for BpeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BpeError::MergeToken(i, t) => write!(f, "merge {i}: token `{t}` is not in the vocab"),
            BpeError::MergeResult(i, t) => {
                write!(f, "merge {i}: merged token `{t}` is not in the vocab")
            }
            BpeError::Unk(t) => write!(f, "unk_token `{t}` is not in the vocab"),
        }
    }
}

/// Settings of a BPE model besides its vocabulary and merges.
#[derive(Debug, Clone, Default)]
pub(crate) struct BpeOptions {
    /// Unknown token, if any.
    pub unk_token: Option<String>,
    /// Fuse consecutive unknown tokens into one.
    pub fuse_unk: bool,
    /// Spell unknown characters as `<0xNN>` byte tokens.
    pub byte_fallback: bool,
    /// Look whole words up before merging (Llama 3).
    pub ignore_merges: bool,
    /// Prefix of every symbol but the first of a word.
    pub continuing_subword_prefix: Option<String>,
    /// Suffix of the last symbol of a word.
    pub end_of_word_suffix: Option<String>,
    /// Words are byte-level encoded (set from the pre-tokenizer / decoder).
    pub byte_level: bool,
}

/// Words of this many bytes or more are not cached (HF's `MAX_LENGTH`: a SentencePiece-style
/// file without a pre-tokenizer hands whole sentences to the model, and those are worth caching
/// too).
const MAX_CACHED_WORD_BYTES: usize = 256;
/// Number of words the cache holds by default (HF's default); once full, new words are no longer
/// added.
const DEFAULT_CACHE_CAPACITY: usize = 10_000;

type CacheMap = HashMap<Box<str>, Box<[BpePiece]>, BuildHasherDefault<FastHasher>>;

/// Tokenized words, shared by all threads using the model, up to `capacity` words. A clone
/// starts empty.
#[derive(Debug)]
struct WordCache {
    map: RwLock<CacheMap>,
    capacity: usize,
}

impl Default for WordCache {
    fn default() -> Self {
        Self::new(DEFAULT_CACHE_CAPACITY)
    }
}

impl Clone for WordCache {
    fn clone(&self) -> Self {
        Self::new(self.capacity)
    }
}

impl WordCache {
    fn new(capacity: usize) -> Self {
        Self {
            map: RwLock::new(CacheMap::default()),
            capacity,
        }
    }

    /// Appends the cached pieces of `word` to `out`; false when absent (or the lock is poisoned).
    fn get(&self, word: &str, out: &mut Vec<BpePiece>) -> bool {
        if self.capacity == 0 {
            return false;
        }
        let Ok(map) = self.map.read() else {
            return false;
        };
        match map.get(word) {
            Some(pieces) => {
                out.extend_from_slice(pieces);
                true
            }
            None => false,
        }
    }

    fn put(&self, word: &str, pieces: &[BpePiece]) {
        if self.capacity == 0 {
            return;
        }
        if let Ok(mut map) = self.map.write() {
            if map.len() < self.capacity {
                map.insert(word.into(), pieces.into());
            }
        }
    }
}

/// A loaded BPE model.
#[derive(Clone)]
pub(crate) struct Bpe {
    vocab: VocabMap,
    id_to_token: IdTable,
    /// (left id, right id) → (rank, merged id).
    merges: PairMap,
    opts: BpeOptions,
    unk_id: Option<u32>,
    /// Byte-level: id of each byte's one-character token.
    byte_ids: [Option<u32>; 256],
    /// Byte fallback: id of `<0xNN>` for each byte.
    fallback_ids: [Option<u32>; 256],
    /// Character-level without subword prefix / suffix: id of each ASCII character's token, or
    /// [`NO_ID`] (then the vocabulary is asked).
    ascii_ids: [u32; 128],
    cache: WordCache,
}

impl std::fmt::Debug for Bpe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bpe")
            .field("n_tokens", &self.vocab.len())
            .field("n_merges", &self.merges.len())
            .field("opts", &self.opts)
            .field("unk_id", &self.unk_id)
            .finish_non_exhaustive()
    }
}

/// One token of a word: its id and the byte range of the word it covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BpePiece {
    /// Token id.
    pub id: u32,
    /// Start byte in the word.
    pub start: usize,
    /// End byte in the word.
    pub end: usize,
}

#[derive(Debug, Clone, Copy)]
struct Symbol {
    id: u32,
    start: usize,
    end: usize,
    prev: usize,
    next: usize,
}

const NONE: usize = usize::MAX;

impl Bpe {
    /// Builds the model; `merges` are token pairs in rank order.
    pub fn new(
        entries: Vec<(String, u32)>,
        merges: Vec<(String, String)>,
        opts: BpeOptions,
    ) -> Result<Self, BpeError> {
        let mut vocab = VocabMap::default();
        for (token, id) in &entries {
            vocab.insert(token.as_str().into(), *id);
        }
        let id_to_token = IdTable::reverse(entries, &vocab);
        let mut pairs = PairMap::default();
        let prefix_len = opts
            .continuing_subword_prefix
            .as_deref()
            .map_or(0, str::len);
        for (rank, (a, b)) in merges.into_iter().enumerate() {
            let id_a = *vocab
                .get(a.as_str())
                .ok_or_else(|| BpeError::MergeToken(rank, a.clone()))?;
            let id_b = *vocab
                .get(b.as_str())
                .ok_or_else(|| BpeError::MergeToken(rank, b.clone()))?;
            let merged = format!("{a}{}", b.get(prefix_len..).unwrap_or(&b));
            let id = *vocab
                .get(merged.as_str())
                .ok_or(BpeError::MergeResult(rank, merged))?;
            // A repeated pair keeps its last rank, as HF's map build (later entries overwrite).
            pairs.insert(pair_key(id_a, id_b), (rank as u32, id));
        }
        let unk_id = match &opts.unk_token {
            None => None,
            Some(t) => Some(
                *vocab
                    .get(t.as_str())
                    .ok_or_else(|| BpeError::Unk(t.clone()))?,
            ),
        };
        let mut byte_ids = [None; 256];
        let mut fallback_ids = [None; 256];
        let mut ascii_ids = [NO_ID; 128];
        let affixes = opts
            .continuing_subword_prefix
            .as_deref()
            .unwrap_or("")
            .is_empty()
            && opts.end_of_word_suffix.as_deref().unwrap_or("").is_empty();
        for b in 0..256 {
            let mut buf = [0u8; 4];
            byte_ids[b] = vocab.get(&*BYTE_CHARS[b].encode_utf8(&mut buf)).copied();
            fallback_ids[b] = vocab.get(format!("<0x{b:02X}>").as_str()).copied();
            if b < 128 && affixes {
                let c = [b as u8];
                let key = std::str::from_utf8(&c).unwrap_or_default();
                ascii_ids[b] = vocab.get(key).copied().unwrap_or(NO_ID);
            }
        }
        Ok(Self {
            vocab,
            id_to_token,
            merges: pairs,
            opts,
            unk_id,
            byte_ids,
            fallback_ids,
            ascii_ids,
            cache: WordCache::default(),
        })
    }

    /// Marks words as byte-level encoded.
    pub fn set_byte_level(&mut self, on: bool) {
        self.opts.byte_level = on;
        self.cache = self.cache.clone();
    }

    /// Sets how many words the word cache holds (0 turns it off); empties it.
    pub fn set_cache_capacity(&mut self, words: usize) {
        self.cache = WordCache::new(words);
    }

    /// Id of a token string.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.vocab.get(token).copied()
    }

    /// Token string of an id.
    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        self.id_to_token.get(id)
    }

    /// Vocabulary size.
    pub fn len(&self) -> usize {
        self.vocab.len()
    }

    /// Looks up the initial symbol for `word[start..end]`, with prefix/suffix as HF adds them.
    fn lookup(&self, word: &str, start: usize, end: usize, buf: &mut String) -> Option<u32> {
        let prefix = self.opts.continuing_subword_prefix.as_deref().unwrap_or("");
        let suffix = self.opts.end_of_word_suffix.as_deref().unwrap_or("");
        if (start == 0 || prefix.is_empty()) && (end < word.len() || suffix.is_empty()) {
            return self.vocab.get(&word[start..end]).copied();
        }
        buf.clear();
        if start > 0 {
            buf.push_str(prefix);
        }
        buf.push_str(&word[start..end]);
        if end == word.len() {
            buf.push_str(suffix);
        }
        self.vocab.get(buf.as_str()).copied()
    }

    /// Initial symbols of a character-level word (byte fallback / unknown handling included).
    fn char_symbols(&self, word: &str, syms: &mut Vec<Symbol>) {
        let mut buf = String::new();
        let mut last_unk = false;
        for (i, c) in word.char_indices() {
            let end = i + c.len_utf8();
            if let Some(&id) = self.ascii_ids.get(c as usize) {
                if id != NO_ID {
                    push_symbol(syms, id, i, end);
                    last_unk = false;
                    continue;
                }
            }
            if let Some(id) = self.lookup(word, i, end, &mut buf) {
                push_symbol(syms, id, i, end);
                last_unk = false;
                continue;
            }
            if self.opts.byte_fallback {
                let ids: Option<Vec<u32>> = word.as_bytes()[i..end]
                    .iter()
                    .map(|&b| self.fallback_ids[b as usize])
                    .collect();
                if let Some(ids) = ids {
                    for (k, id) in ids.into_iter().enumerate() {
                        push_symbol(syms, id, i + k, i + k + 1);
                    }
                    last_unk = false;
                    continue;
                }
            }
            let Some(unk) = self.unk_id else {
                // No unknown token: HF drops the character.
                continue;
            };
            if self.opts.fuse_unk && last_unk {
                if let Some(s) = syms.last_mut() {
                    s.end = end;
                }
            } else {
                push_symbol(syms, unk, i, end);
            }
            last_unk = true;
        }
    }

    /// Tokenizes one word (raw bytes of the pre-token; byte-level spelling is applied here).
    /// Short words go through a bounded cache.
    pub fn tokenize_word(&self, word: &str, out: &mut Vec<BpePiece>) {
        if word.is_empty() {
            return;
        }
        if word.len() >= MAX_CACHED_WORD_BYTES {
            return self.tokenize_uncached(word, out);
        }
        if self.cache.get(word, out) {
            return;
        }
        let first = out.len();
        self.tokenize_uncached(word, out);
        self.cache.put(word, &out[first..]);
    }

    fn tokenize_uncached(&self, word: &str, out: &mut Vec<BpePiece>) {
        if self.opts.ignore_merges {
            let id = if self.opts.byte_level {
                let spelled: String = word.bytes().map(|b| BYTE_CHARS[b as usize]).collect();
                self.vocab.get(spelled.as_str()).copied()
            } else {
                self.vocab.get(word).copied()
            };
            if let Some(id) = id {
                out.push(BpePiece {
                    id,
                    start: 0,
                    end: word.len(),
                });
                return;
            }
        }
        let mut syms = Vec::with_capacity(word.len());
        if self.opts.byte_level {
            for (i, &b) in word.as_bytes().iter().enumerate() {
                match self.byte_ids[b as usize] {
                    Some(id) => push_symbol(&mut syms, id, i, i + 1),
                    None => {
                        if let Some(unk) = self.unk_id {
                            push_symbol(&mut syms, unk, i, i + 1);
                        }
                    }
                }
            }
        } else {
            self.char_symbols(word, &mut syms);
        }
        self.merge(&mut syms);
        let mut i = if syms.is_empty() { NONE } else { 0 };
        while i != NONE {
            let s = syms[i];
            out.push(BpePiece {
                id: s.id,
                start: s.start,
                end: s.end,
            });
            i = s.next;
        }
    }

    /// The merge loop: a heap of candidate pairs, lowest rank then leftmost first; stale entries
    /// (a side already merged away or changed) are skipped when popped.
    fn merge(&self, syms: &mut [Symbol]) {
        let mut heap = BinaryHeap::with_capacity(syms.len());
        for i in 1..syms.len() {
            if let Some(&(rank, id)) = self.merges.get(&pair_key(syms[i - 1].id, syms[i].id)) {
                heap.push(Reverse((rank, i - 1, id)));
            }
        }
        while let Some(Reverse((rank, pos, new_id))) = heap.pop() {
            let left = syms[pos];
            if left.end == left.start || left.next == NONE {
                continue;
            }
            let right = syms[left.next];
            match self.merges.get(&pair_key(left.id, right.id)) {
                Some(&(r, id)) if r == rank && id == new_id => {}
                _ => continue,
            }
            // Merge right into left.
            syms[pos].id = new_id;
            syms[pos].end = right.end;
            syms[pos].next = right.next;
            let right_pos = left.next;
            syms[right_pos].start = syms[right_pos].end; // mark dead
            syms[right_pos].next = NONE;
            if right.next != NONE {
                syms[right.next].prev = pos;
                if let Some(&(r, id)) = self.merges.get(&pair_key(new_id, syms[right.next].id)) {
                    heap.push(Reverse((r, pos, id)));
                }
            }
            if left.prev != NONE {
                if let Some(&(r, id)) = self.merges.get(&pair_key(syms[left.prev].id, new_id)) {
                    heap.push(Reverse((r, left.prev, id)));
                }
            }
        }
    }
}

fn push_symbol(syms: &mut Vec<Symbol>, id: u32, start: usize, end: usize) {
    let n = syms.len();
    if let Some(last) = syms.last_mut() {
        last.next = n;
    }
    syms.push(Symbol {
        id,
        start,
        end,
        prev: if n == 0 { NONE } else { n - 1 },
        next: NONE,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(byte_level: bool) -> Bpe {
        let vocab = [
            "a", "b", "c", "ab", "bc", "abc", "<unk>", "<0xC3>", "<0xA9>", "Ġ", "Ġa",
        ];
        let entries = vocab
            .iter()
            .enumerate()
            .map(|(i, t)| (t.to_string(), i as u32))
            .collect();
        let merges = [("a", "b"), ("b", "c"), ("ab", "c"), ("Ġ", "a")]
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        let opts = BpeOptions {
            unk_token: Some("<unk>".into()),
            fuse_unk: true,
            byte_fallback: true,
            byte_level,
            ..BpeOptions::default()
        };
        Bpe::new(entries, merges, opts).expect("valid model")
    }

    fn ids(m: &Bpe, w: &str) -> Vec<u32> {
        let mut out = Vec::new();
        m.tokenize_word(w, &mut out);
        out.iter().map(|p| p.id).collect()
    }

    #[test]
    fn merges_by_rank() {
        let m = model(false);
        assert_eq!(ids(&m, "abc"), [5]);
        assert_eq!(ids(&m, "bca"), [4, 0]);
        assert_eq!(ids(&m, "é"), [7, 8]);
        assert_eq!(ids(&m, "xyza"), [6, 0]);
        assert_eq!(ids(&model(true), " ab"), [9, 3]);
        assert_eq!(ids(&model(true), " a"), [10]);
    }

    #[test]
    fn byte_table_is_gpt2() {
        assert_eq!(BYTE_CHARS[b' ' as usize], 'Ġ');
        assert_eq!(BYTE_CHARS[b'\n' as usize], 'Ċ');
        assert_eq!(BYTE_CHARS[b'a' as usize], 'a');
        assert_eq!(char_byte('Ġ'), Some(b' '));
        assert_eq!(char_byte('中'), None);
    }
}
