//! The state of one sequence: a contiguous key/value cache per attention layer, a fixed-size
//! convolution window and recurrent matrix per recurrent layer.

use crate::{Error, Result};

/// What a layer keeps between forward passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// Keys and values of every token (attention).
    Attention,
    /// A fixed-size state: `conv` values of the causal-convolution window and `recurrent`
    /// values of the recurrent matrices (Gated DeltaNet).
    Recurrent {
        /// Values in the convolution window.
        conv: usize,
        /// Values in the recurrent state.
        recurrent: usize,
    },
}

/// Fixed-size state of a recurrent layer, with the update of the pass in flight.
#[derive(Debug, Clone, Default)]
struct Recurrent {
    conv: Vec<f32>,
    state: Vec<f32>,
    pending: Option<(Vec<f32>, Vec<f32>)>,
}

/// Everything a decoder remembers of one sequence.
///
/// Attention layers keep the keys and values of every token, rows back to back: f32
/// [len, kv_dim] (`kv_dim = n_kv_heads * head_dim`, heads contiguous). Recurrent layers keep a
/// convolution window and recurrent matrices of fixed size, whatever the length.
///
/// A forward pass first [`SeqState::append`]s the new rows to every attention layer (visible to
/// that layer's attention at once) and [`SeqState::set_recurrent`]s the new state of every
/// recurrent layer, then [`SeqState::commit`]s, which advances [`SeqState::len`]; a pass that
/// fails before the commit leaves the state as it was. Key/value storage grows by doubling up to
/// `max_len` tokens.
#[derive(Debug, Clone)]
pub struct SeqState {
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    recurrent: Vec<Option<Recurrent>>,
    kv_dim: usize,
    len: usize,
    max_len: usize,
}

impl SeqState {
    /// An empty state for `n_layers` attention layers of width `kv_dim`, holding at most
    /// `max_len` tokens.
    pub fn new(n_layers: usize, kv_dim: usize, max_len: usize) -> Self {
        Self::with_layers(&vec![LayerKind::Attention; n_layers], kv_dim, max_len)
    }

    /// An empty state for layers of the given kinds (attention layers of width `kv_dim`).
    pub fn with_layers(layers: &[LayerKind], kv_dim: usize, max_len: usize) -> Self {
        Self {
            keys: vec![Vec::new(); layers.len()],
            values: vec![Vec::new(); layers.len()],
            recurrent: layers
                .iter()
                .map(|k| match *k {
                    LayerKind::Attention => None,
                    LayerKind::Recurrent { conv, recurrent } => Some(Recurrent {
                        conv: vec![0.0; conv],
                        state: vec![0.0; recurrent],
                        pending: None,
                    }),
                })
                .collect(),
            kv_dim,
            len: 0,
            max_len,
        }
    }

    /// The committed convolution window and recurrent state of recurrent layer `layer`.
    ///
    /// Panics if `layer` is an attention layer (a model bug).
    pub fn recurrent(&self, layer: usize) -> (&[f32], &[f32]) {
        let r = self.recurrent[layer]
            .as_ref()
            .expect("recurrent() on an attention layer");
        (&r.conv, &r.state)
    }

    /// Records the state of recurrent layer `layer` after the pass in flight (applied by
    /// [`SeqState::commit`]).
    pub fn set_recurrent(&mut self, layer: usize, conv: Vec<f32>, state: Vec<f32>) {
        let r = self.recurrent[layer]
            .as_mut()
            .expect("set_recurrent() on an attention layer");
        debug_assert!(conv.len() == r.conv.len() && state.len() == r.state.len());
        r.pending = Some((conv, state));
    }

    /// Whether the state can be cut back to its first `len` tokens ([`SeqState::truncate`]):
    /// always for attention-only states, only to the current length when a recurrent layer
    /// exists (its state cannot be rewound; restore a snapshot instead).
    pub fn can_truncate_to(&self, len: usize) -> bool {
        len >= self.len || self.recurrent.iter().all(Option::is_none)
    }

    /// Back to an empty sequence (keeps the allocated buffers).
    pub fn clear(&mut self) {
        self.len = 0;
        for buf in self.keys.iter_mut().chain(self.values.iter_mut()) {
            buf.clear();
        }
        for r in self.recurrent.iter_mut().flatten() {
            r.conv.fill(0.0);
            r.state.fill(0.0);
            r.pending = None;
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

    /// Values of `layer`, like [`SeqState::keys`].
    pub fn values(&self, layer: usize) -> &[f32] {
        &self.values[layer]
    }

    /// Makes the `n` tokens appended to every layer part of the sequence.
    pub fn commit(&mut self, n: usize) {
        self.len += n;
        for r in self.recurrent.iter_mut().flatten() {
            if let Some((conv, state)) = r.pending.take() {
                r.conv = conv;
                r.state = state;
            }
        }
        debug_assert!(self
            .keys
            .iter()
            .zip(&self.recurrent)
            .all(|(k, r)| r.is_some() || k.len() == self.len * self.kv_dim));
    }

    /// Forgets every token from position `len` on (e.g. to reuse a shared prompt prefix).
    ///
    /// Panics unless [`SeqState::can_truncate_to`] allows it (a caller bug).
    pub fn truncate(&mut self, len: usize) {
        assert!(self.can_truncate_to(len), "cannot rewind a recurrent state");
        if len < self.len {
            self.len = len;
            for buf in self.keys.iter_mut().chain(self.values.iter_mut()) {
                buf.truncate(len * self.kv_dim);
            }
        }
    }

    /// Bytes held by the state's buffers.
    pub fn memory_bytes(&self) -> usize {
        let kv: usize = self
            .keys
            .iter()
            .chain(&self.values)
            .map(|b| b.capacity() * 4)
            .sum();
        let rec: usize = self
            .recurrent
            .iter()
            .flatten()
            .map(|r| (r.conv.capacity() + r.state.capacity()) * 4)
            .sum();
        kv + rec
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_commit_truncate() {
        let mut c = SeqState::new(2, 3, 10);
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

    #[test]
    fn recurrent_layers_update_on_commit_only() {
        let kinds = [
            LayerKind::Recurrent {
                conv: 2,
                recurrent: 3,
            },
            LayerKind::Attention,
        ];
        let mut s = SeqState::with_layers(&kinds, 2, 8);
        assert_eq!(s.recurrent(0), (&[0.0; 2][..], &[0.0; 3][..]));
        s.set_recurrent(0, vec![1.0; 2], vec![2.0; 3]);
        s.append(1, &[5.0; 2], &[6.0; 2]);
        assert_eq!(s.recurrent(0).1, &[0.0; 3]);
        s.commit(1);
        assert_eq!(s.recurrent(0).1, &[2.0; 3]);
        assert!(!s.can_truncate_to(0));
        assert!(s.can_truncate_to(1));
        let snapshot = s.clone();
        s.clear();
        assert_eq!(s.len(), 0);
        assert_eq!(s.recurrent(0).0, &[0.0; 2]);
        assert_eq!(snapshot.recurrent(0).0, &[1.0; 2]);
    }
}
