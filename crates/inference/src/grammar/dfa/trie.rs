//! The DFA engine's view of a vocabulary: every usable token's bytes, byte tries of them in
//! depth-first order, the "pure" tokens (safe JSON string characters only) as bit sets by
//! character count, and the mask computation: a depth-first walk of a trie that follows an
//! automaton's transitions and skips a subtree as soon as it dies, with the pure tokens taken
//! from their bit sets where a string state's room for characters is known
//! ([`Tokens::allowed`]).

use std::collections::HashMap;
use std::sync::Arc;

use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// Tokens longer than this many bytes are not in the trie (its nodes hold their depth in a
/// byte) and are checked one by one.
const MAX_TRIE_DEPTH: usize = 255;

/// The UTF-8 encodings of the characters a JSON string holds unescaped (U+0020-U+10FFFF but
/// `"` and `\`): the byte ranges of each position, per encoding pattern.
const SAFE_UTF8: &[&[(u8, u8)]] = &[
    &[(0x20, 0x21)],
    &[(0x23, 0x5b)],
    &[(0x5d, 0x7f)],
    &[(0xc2, 0xdf), (0x80, 0xbf)],
    &[(0xe0, 0xe0), (0xa0, 0xbf), (0x80, 0xbf)],
    &[(0xe1, 0xec), (0x80, 0xbf), (0x80, 0xbf)],
    &[(0xed, 0xed), (0x80, 0x9f), (0x80, 0xbf)],
    &[(0xee, 0xef), (0x80, 0xbf), (0x80, 0xbf)],
    &[(0xf0, 0xf0), (0x90, 0xbf), (0x80, 0xbf), (0x80, 0xbf)],
    &[(0xf1, 0xf3), (0x80, 0xbf), (0x80, 0xbf), (0x80, 0xbf)],
    &[(0xf4, 0xf4), (0x80, 0x8f), (0x80, 0xbf), (0x80, 0xbf)],
];

/// The characters a token starts, if its bytes are safe JSON string characters only (the last
/// one may be incomplete): such a "pure" token is live in a string state exactly when the
/// string has room for that many more characters.
fn pure_len(bytes: &[u8]) -> Option<usize> {
    let (mut i, mut n) = (0, 0);
    while i < bytes.len() {
        let pattern = SAFE_UTF8
            .iter()
            .find(|p| (p[0].0..=p[0].1).contains(&bytes[i]))?;
        for (k, &(lo, hi)) in pattern.iter().enumerate().skip(1) {
            match bytes.get(i + k) {
                Some(b) if (lo..=hi).contains(b) => {}
                None => return Some(n + 1),
                Some(_) => return None,
            }
        }
        i += pattern.len();
        n += 1;
    }
    Some(n)
}

/// Pure tokens of more characters than this are walked with the impure ones, so that the
/// check of a string state looks at most this many characters ahead.
const MAX_PURE_CHARS: usize = 32;

/// A byte trie of some tokens in depth-first order.
#[derive(Default)]
struct Trie {
    /// Per node: `(token + 1) << 8 | byte` (0 for no token), and `end << 8 | depth` (`end`:
    /// the index one past its subtree; depth from 1).
    nodes: Vec<[u32; 2]>,
    /// Tokens with the same bytes as an earlier one: `(first, other)`.
    dups: Vec<(u32, u32)>,
    /// Tokens longer than [`MAX_TRIE_DEPTH`].
    long: Vec<u32>,
}

/// Every token's bytes, and byte tries of the usable ones.
pub(super) struct Tokens {
    /// The number of logits masks cover.
    pub(super) n_vocab: usize,
    /// The end of the output, allowed where the automaton accepts.
    pub(super) eos: u32,
    /// Every usable token.
    all: Trie,
    /// The usable tokens that are not pure (see [`pure_len`]).
    impure: Trie,
    /// `pure[k]`: the pure tokens of at most `k` characters, as a bit set.
    pure: Vec<Box<[u32]>>,
    offsets: Vec<u32>,
    bytes: Vec<u8>,
    /// Whether a token can be part of a constrained output (not special, not EOS, not empty,
    /// valid as part of UTF-8 text).
    usable: Vec<bool>,
}

impl Tokens {
    /// The tokens of `tokenizer` for a model with `n_vocab` logits: ids past the tokenizer's,
    /// special tokens, `eos`, empty tokens and tokens with bytes that UTF-8 never holds are not
    /// usable (never allowed but `eos`, where the constraint is complete).
    pub(super) fn new(tokenizer: &Tokenizer, n_vocab: usize, eos: u32) -> Result<Self> {
        if n_vocab >= 1 << 24 {
            return Err(Error::InvalidInput(format!(
                "DFA engine: {n_vocab} tokens is more than 2^24"
            )));
        }
        let (mut offsets, mut bytes, mut usable) = (vec![0u32], Vec::new(), Vec::new());
        for id in 0..n_vocab as u32 {
            let t = tokenizer.token_bytes(id);
            let ok = id != eos
                && matches!(&t, Some((b, false))
                    if !b.is_empty() && !b.iter().any(|&c| matches!(c, 0xc0 | 0xc1 | 0xf5..)));
            if let Some((b, _)) = t.filter(|_| ok) {
                bytes.extend_from_slice(&b);
            }
            usable.push(ok);
            offsets.push(bytes.len() as u32);
        }
        let mut tokens = Tokens {
            n_vocab,
            eos,
            all: Trie::default(),
            impure: Trie::default(),
            pure: Vec::new(),
            offsets,
            bytes,
            usable,
        };
        let ids: Vec<u32> = (0..n_vocab as u32)
            .filter(|&id| tokens.usable[id as usize])
            .collect();
        // Longer pure tokens are walked (a shorter chain of states to check per state).
        let lens: Vec<Option<usize>> = ids
            .iter()
            .map(|&id| {
                pure_len(tokens.token(id).unwrap_or_default()).filter(|&l| l <= MAX_PURE_CHARS)
            })
            .collect();
        let most = lens.iter().flatten().max().copied().unwrap_or(0);
        let mut pure = vec![vec![0u32; tokens.words()]; most + 1];
        for (&id, len) in ids.iter().zip(&lens) {
            if let Some(len) = *len {
                for p in &mut pure[len..] {
                    p[id as usize / 32] |= 1 << (id % 32);
                }
            }
        }
        tokens.pure = pure.into_iter().map(Vec::into_boxed_slice).collect();
        let impure: Vec<u32> = ids
            .iter()
            .zip(&lens)
            .filter(|(_, l)| l.is_none())
            .map(|(&id, _)| id)
            .collect();
        tokens.impure = tokens.trie(impure);
        tokens.all = tokens.trie(ids);
        Ok(tokens)
    }

    /// The number of nodes of the trie of every usable token.
    pub(super) fn trie_nodes(&self) -> usize {
        self.all.nodes.len()
    }

    /// The number of nodes of the trie of the usable tokens that are not pure.
    pub(super) fn impure_trie_nodes(&self) -> usize {
        self.impure.nodes.len()
    }

    /// The bytes of a usable token (`None` for the others).
    pub(super) fn token(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        (i < self.n_vocab && self.usable[i])
            .then(|| &self.bytes[self.offsets[i] as usize..self.offsets[i + 1] as usize])
    }

    fn words(&self) -> usize {
        self.n_vocab.div_ceil(32)
    }

    fn trie(&self, mut ids: Vec<u32>) -> Trie {
        ids.sort_by(|&a, &b| self.token(a).cmp(&self.token(b)));
        // Preorder construction from sorted keys: `path` holds the open nodes.
        let mut t = Trie::default();
        let (mut path, mut path_token): (Vec<usize>, Vec<u32>) = (Vec::new(), Vec::new());
        let mut prev: &[u8] = &[];
        for id in ids {
            let w = self.token(id).unwrap_or_default();
            if w.len() > MAX_TRIE_DEPTH {
                t.long.push(id);
                continue;
            }
            let common = w.iter().zip(prev).take_while(|(a, b)| a == b).count();
            if common == w.len() && w.len() == prev.len() {
                t.dups.push((path_token[path.len() - 1], id));
                continue;
            }
            while path.len() > common {
                let n = path.pop().unwrap_or_default();
                t.nodes[n][1] |= (t.nodes.len() as u32) << 8;
                path_token.pop();
            }
            for (k, &b) in w.iter().enumerate().skip(common) {
                let tok = if k + 1 == w.len() { (id + 1) << 8 } else { 0 };
                path.push(t.nodes.len());
                path_token.push(id);
                t.nodes.push([tok | b as u32, k as u32 + 1]);
            }
            prev = w;
        }
        for n in path {
            t.nodes[n][1] |= (t.nodes.len() as u32) << 8;
        }
        t
    }

    /// How many more string characters state `s` has room for, if every safe character
    /// (`chars`: one byte string per combination of the automaton's byte classes) takes it
    /// to one same live state, and so on for that state, until all of them die at their
    /// first byte (the string must end); `pure.len() - 1` means at least that many. `None`
    /// when the characters do not all behave alike. `memo` keeps the answers found on the
    /// way (each position of a bounded string is a state of its own).
    fn capacity<S: Copy + Eq + std::hash::Hash>(
        &self,
        s: S,
        chars: &[Vec<u8>],
        next: &mut impl FnMut(S, u8) -> Option<S>,
        memo: &mut HashMap<S, Option<usize>>,
    ) -> Option<usize> {
        let most = self.pure.len() - 1;
        // The room of `chain[k]` is `room(k)`, once the chain ends.
        let mut chain = vec![s];
        let room: Box<dyn Fn(usize) -> Option<usize>> = loop {
            let (cur, j) = (chain[chain.len() - 1], chain.len() - 1);
            if let Some(&known) = memo.get(&cur) {
                break Box::new(move |k| known.map(|v| (j + v - k).min(most)));
            }
            if j == most {
                // At least `most` for `s`; unknown for the others.
                chain.truncate(1);
                break Box::new(move |_| Some(most));
            }
            let (mut succ, mut died, mut alike) = (None, false, true);
            'chars: for c in chars {
                let Some(mut st) = next(cur, c[0]) else {
                    died = true;
                    continue;
                };
                for &b in &c[1..] {
                    match next(st, b) {
                        Some(n) => st = n,
                        None => {
                            alike = false;
                            break 'chars;
                        }
                    }
                }
                match succ {
                    None => succ = Some(st),
                    Some(x) if x == st => {}
                    Some(_) => {
                        alike = false;
                        break 'chars;
                    }
                }
            }
            match succ {
                _ if !alike => break Box::new(|_| None),
                None => break Box::new(move |k| Some(j - k)),
                Some(_) if died => break Box::new(|_| None),
                Some(x) if x == cur => break Box::new(move |_| Some(most)),
                Some(x) => chain.push(x),
            }
        };
        for (k, st) in chain.iter().enumerate() {
            memo.insert(*st, room(k));
        }
        room(0)
    }

    /// The tokens whose bytes keep the automaton live from `start` (`next` gives the state
    /// after a byte, `None` when dead); EOS if `accepting`. Where [`Self::capacity`] applies,
    /// the pure tokens come from their precomputed bit set and only the impure ones are
    /// walked.
    pub(super) fn allowed<S: Copy + Eq + std::hash::Hash>(
        &self,
        start: S,
        accepting: bool,
        chars: &[Vec<u8>],
        memo: &mut HashMap<S, Option<usize>>,
        mut next: impl FnMut(S, u8) -> Option<S>,
    ) -> Arc<[u32]> {
        let room = self.capacity(start, chars, &mut next, memo);
        let trie = if room.is_some() {
            &self.impure
        } else {
            &self.all
        };
        let mut bits = walk(trie, self.words(), start, &mut next);
        for &id in &trie.long {
            let mut s = Some(start);
            for &b in self.token(id).unwrap_or_default() {
                s = s.and_then(|s| next(s, b));
            }
            if s.is_some() {
                bits[id as usize / 32] |= 1 << (id % 32);
            }
        }
        if let Some(room) = room {
            for (b, p) in bits.iter_mut().zip(self.pure[room].iter()) {
                *b |= p;
            }
        }
        for &(first, other) in &trie.dups {
            if bits[first as usize / 32] >> (first % 32) & 1 == 1 {
                bits[other as usize / 32] |= 1 << (other % 32);
            }
        }
        if accepting && (self.eos as usize) < self.n_vocab {
            bits[self.eos as usize / 32] |= 1 << (self.eos % 32);
        }
        bits.into()
    }
}

/// The tokens of `trie` whose bytes keep the automaton live from `start`: a depth-first walk
/// that skips the subtree of a node as soon as the automaton dies.
fn walk<S: Copy>(
    trie: &Trie,
    words: usize,
    start: S,
    next: &mut impl FnMut(S, u8) -> Option<S>,
) -> Vec<u32> {
    // Bit `id + 1` for token `id` (bit 0 takes the nodes without a token, branch-free),
    // shifted down at the end.
    let mut shifted = vec![0u32; words + 1];
    let mut stack = [start; MAX_TRIE_DEPTH + 1];
    let nodes = &trie.nodes;
    let mut i = 0;
    while i < nodes.len() {
        let [w, e] = nodes[i];
        let depth = (e & 0xff) as usize;
        match next(stack[depth - 1], w as u8) {
            None => i = (e >> 8) as usize,
            Some(s) => {
                stack[depth] = s;
                let t = w >> 8;
                shifted[t as usize / 32] |= 1 << (t % 32);
                i += 1;
            }
        }
    }
    (0..words)
        .map(|k| shifted[k] >> 1 | shifted[k + 1] << 31)
        .collect()
}

/// One byte string per safe JSON character class combination of an automaton's byte classes
/// (`class`): enough to follow every safe character from a state.
pub(super) fn char_paths(class: impl Fn(u8) -> u8) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for pattern in SAFE_UTF8 {
        let mut paths: Vec<Vec<u8>> = vec![Vec::new()];
        for &(lo, hi) in pattern.iter() {
            let mut reps: Vec<u8> = Vec::new();
            let mut seen = [false; 256];
            for b in lo..=hi {
                let c = class(b) as usize;
                if !seen[c] {
                    seen[c] = true;
                    reps.push(b);
                }
            }
            paths = paths
                .into_iter()
                .flat_map(|p| {
                    reps.iter().map(move |&b| {
                        let mut q = p.clone();
                        q.push(b);
                        q
                    })
                })
                .collect();
        }
        out.extend(paths);
    }
    out
}
