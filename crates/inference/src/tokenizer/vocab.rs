//! The vocabulary tables the WordPiece and BPE models share: token → id ([`VocabMap`], keyed
//! with a hasher for short strings) and id → token ([`IdTable`]).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A small multiply-rotate hasher for short keys (vocabulary strings); much cheaper than SipHash
/// and safe here because the keys come from the model file, not from request text.
#[derive(Default, Clone, Copy)]
pub(crate) struct FastHasher(u64);

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FastHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FastHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word) ^ ((rest.len() as u64) << 59));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

/// `HashMap` keyed by vocabulary strings with [`FastHasher`].
pub(crate) type VocabMap = HashMap<Box<str>, u32, BuildHasherDefault<FastHasher>>;

/// id → token, the reverse of a [`VocabMap`] (HF's reversed vocabulary: where two ids share a
/// token string, only the id the map kept is here). A table indexed by id when the ids are about
/// as many as the tokens (every real vocabulary); a map when a file's ids are sparse, so that an
/// id near 2^32 costs one entry rather than a table of that many slots.
#[derive(Debug, Clone)]
pub(crate) enum IdTable {
    /// Slot `id` holds the token of `id`.
    Dense(Vec<Option<Box<str>>>),
    /// The tokens of sparse ids.
    Sparse(HashMap<u32, Box<str>>),
}

impl IdTable {
    /// The reverse of `vocab`, made from its `entries` in file order: an entry the map did not
    /// keep (its string has a later id) is left out; where two strings share an id, the later
    /// one is kept.
    pub fn reverse(entries: Vec<(String, u32)>, vocab: &VocabMap) -> Self {
        let kept = entries
            .into_iter()
            .filter(|(t, id)| vocab.get(t.as_str()) == Some(id));
        let slots = vocab.values().max().map_or(0, |&id| id as usize + 1);
        if slots > 2 * vocab.len() + 1024 {
            return IdTable::Sparse(kept.map(|(t, id)| (id, t.into_boxed_str())).collect());
        }
        let mut table = vec![None; slots];
        for (token, id) in kept {
            table[id as usize] = Some(token.into_boxed_str());
        }
        IdTable::Dense(table)
    }

    /// The token of `id`, if any.
    pub fn get(&self, id: u32) -> Option<&str> {
        match self {
            IdTable::Dense(t) => t.get(id as usize)?.as_deref(),
            IdTable::Sparse(m) => m.get(&id).map(|t| &**t),
        }
    }
}
