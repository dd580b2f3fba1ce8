//! A contiguous key/value cache for one sequence.

use crate::{Error, Result};

/// Keys and values of every layer for the tokens a sequence has seen so far, each layer's rows
/// back to back: f32 [len, kv_dim] (`kv_dim = n_kv_heads * head_dim`, heads contiguous).
///
/// A forward pass first [`KvCache::append`]s the new rows to every layer (they are visible to
/// that layer's attention at once), then [`KvCache::commit`]s them, which advances
/// [`KvCache::len`]. Storage grows by doubling up to `max_len` tokens.
#[derive(Debug, Clone)]
pub struct KvCache {
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    kv_dim: usize,
    len: usize,
    max_len: usize,
}

impl KvCache {
    /// An empty cache for `n_layers` layers of width `kv_dim`, holding at most `max_len` tokens.
    pub fn new(n_layers: usize, kv_dim: usize, max_len: usize) -> Self {
        Self {
            keys: vec![Vec::new(); n_layers],
            values: vec![Vec::new(); n_layers],
            kv_dim,
            len: 0,
            max_len,
        }
    }

    /// Tokens committed so far (the position of the next token).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no token has been committed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The most tokens this cache may hold.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Width of one layer's key (or value) row.
    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    /// Checks that `n` more tokens fit.
    pub fn check_room(&self, n: usize) -> Result<()> {
        if self.len + n > self.max_len {
            return Err(Error::InvalidInput(format!(
                "the sequence would have {} tokens; the context holds at most {}",
                self.len + n,
                self.max_len
            )));
        }
        Ok(())
    }

    /// Appends the rows of `n` new tokens to `layer` (f32 [n, kv_dim] each), after the committed
    /// ones, replacing anything appended to this layer since the last commit.
    pub fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) {
        let keep = self.len * self.kv_dim;
        for (buf, new) in [(&mut self.keys[layer], k), (&mut self.values[layer], v)] {
            buf.truncate(keep);
            if buf.capacity() < keep + new.len() {
                let want = (keep + new.len())
                    .max(2 * buf.capacity())
                    .min(self.max_len * self.kv_dim)
                    .max(keep + new.len());
                buf.reserve_exact(want - buf.len());
            }
            buf.extend_from_slice(new);
        }
    }

    /// Keys of `layer` including rows appended since the last commit: f32 [rows, kv_dim].
    pub fn keys(&self, layer: usize) -> &[f32] {
        &self.keys[layer]
    }

    /// Values of `layer`, like [`KvCache::keys`].
    pub fn values(&self, layer: usize) -> &[f32] {
        &self.values[layer]
    }

    /// Makes the `n` tokens appended to every layer part of the sequence.
    pub fn commit(&mut self, n: usize) {
        self.len += n;
        debug_assert!(self.keys.iter().all(|k| k.len() == self.len * self.kv_dim));
    }

    /// Forgets every token from position `len` on (e.g. to reuse a shared prompt prefix).
    pub fn truncate(&mut self, len: usize) {
        if len < self.len {
            self.len = len;
            for buf in self.keys.iter_mut().chain(self.values.iter_mut()) {
                buf.truncate(len * self.kv_dim);
            }
        }
    }

    /// Bytes held by the cache's buffers.
    pub fn memory_bytes(&self) -> usize {
        self.keys
            .iter()
            .chain(&self.values)
            .map(|b| b.capacity() * 4)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_commit_truncate() {
        let mut c = KvCache::new(2, 3, 10);
        for layer in 0..2 {
            c.append(layer, &[1.0; 6], &[2.0; 6]);
        }
        c.commit(2);
        assert_eq!(c.len(), 2);
        // A failed pass that appended to one layer only is replaced by the next append.
        c.append(0, &[9.0; 3], &[9.0; 3]);
        for layer in 0..2 {
            c.append(layer, &[3.0; 3], &[4.0; 3]);
        }
        c.commit(1);
        assert_eq!(c.keys(0), &[1., 1., 1., 1., 1., 1., 3., 3., 3.]);
        c.truncate(1);
        assert_eq!(c.values(1), &[2.0; 3]);
        assert!(c.check_room(9).is_ok());
        assert!(c.check_room(10).is_err());
    }
}
