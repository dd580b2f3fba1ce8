//! The state of one sequence: a contiguous key/value cache per attention layer, a fixed-size
//! convolution window and recurrent matrix per recurrent layer.

use half::f16;

use super::view::{KvRows, KvView};
use crate::{Error, Result};

/// How an attention layer stores its cached keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvDtype {
    /// f32, exactly as computed (the default; what the parity tests compare).
    #[default]
    F32,
    /// IEEE half precision, rounded to nearest on append: half the memory and the bytes read
    /// per decoded token; attention widens the rows back to f32 exactly.
    F16,
}

impl KvDtype {
    /// Bytes per stored value.
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 => 2,
        }
    }
}

/// The key or value rows of one attention layer.
#[derive(Debug, Clone)]
enum KvBuf {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

impl KvBuf {
    fn new(dtype: KvDtype) -> Self {
        match dtype {
            KvDtype::F32 => KvBuf::F32(Vec::new()),
            KvDtype::F16 => KvBuf::F16(Vec::new()),
        }
    }

    fn len(&self) -> usize {
        match self {
            KvBuf::F32(b) => b.len(),
            KvBuf::F16(b) => b.len(),
        }
    }

    fn capacity_bytes(&self) -> usize {
        match self {
            KvBuf::F32(b) => b.capacity() * 4,
            KvBuf::F16(b) => b.capacity() * 2,
        }
    }

    fn truncate(&mut self, n: usize) {
        match self {
            KvBuf::F32(b) => b.truncate(n),
            KvBuf::F16(b) => b.truncate(n),
        }
    }

    fn rows(&self) -> KvRows<'_> {
        match self {
            KvBuf::F32(b) => KvRows::F32(b),
            KvBuf::F16(b) => KvRows::F16(b),
        }
    }

    /// Keeps the first `keep` values, then appends `new` (converted), growing the storage by
    /// doubling up to `limit` values.
    fn replace_tail(&mut self, keep: usize, new: &[f32], limit: usize) {
        fn grow<T>(buf: &mut Vec<T>, need: usize, limit: usize) {
            if buf.capacity() < need {
                let want = need.max(2 * buf.capacity()).min(limit).max(need);
                buf.reserve_exact(want - buf.len());
            }
        }
        let need = keep + new.len();
        match self {
            KvBuf::F32(b) => {
                b.truncate(keep);
                grow(b, need, limit);
                b.extend_from_slice(new);
            }
            KvBuf::F16(b) => {
                b.truncate(keep);
                grow(b, need, limit);
                b.extend(new.iter().map(|&x| f16::from_f32(x)));
            }
        }
    }
}

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
/// `max_len` tokens, in f32 unless [`SeqState::with_kv_dtype`] chose f16.
#[derive(Debug, Clone)]
pub struct SeqState {
    keys: Vec<KvBuf>,
    values: Vec<KvBuf>,
    kv_dtype: KvDtype,
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
            keys: vec![KvBuf::new(KvDtype::F32); layers.len()],
            values: vec![KvBuf::new(KvDtype::F32); layers.len()],
            kv_dtype: KvDtype::F32,
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

    /// The same state storing keys and values as `dtype` (builder style:
    /// `model.new_cache(n).with_kv_dtype(KvDtype::F16)`). Forgets any cached token (recurrent
    /// layers are reset too), so call it on a fresh state.
    pub fn with_kv_dtype(mut self, dtype: KvDtype) -> Self {
        self.clear();
        self.kv_dtype = dtype;
        for buf in self.keys.iter_mut().chain(self.values.iter_mut()) {
            *buf = KvBuf::new(dtype);
        }
        self
    }

    /// How keys and values are stored.
    pub fn kv_dtype(&self) -> KvDtype {
        self.kv_dtype
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
            buf.truncate(0);
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

    /// Appends the rows of `n` new tokens to `layer` (f32 [n, kv_dim] each, rounded to f16 in
    /// an f16 state), after the committed ones, replacing anything appended to this layer since
    /// the last commit.
    pub fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) {
        let keep = self.len * self.kv_dim;
        let limit = self.max_len * self.kv_dim;
        self.keys[layer].replace_tail(keep, k, limit);
        self.values[layer].replace_tail(keep, v, limit);
    }

    /// Keys of `layer` including rows appended since the last commit: [rows, kv_dim] in the
    /// state's [`KvDtype`].
    pub fn keys(&self, layer: usize) -> KvView<'_> {
        KvView::contiguous(self.keys[layer].rows(), self.kv_dim)
    }

    /// Values of `layer`, like [`SeqState::keys`].
    pub fn values(&self, layer: usize) -> KvView<'_> {
        KvView::contiguous(self.values[layer].rows(), self.kv_dim)
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
            .map(KvBuf::capacity_bytes)
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
        assert_eq!(
            c.keys(0).gather_f32(0..3),
            &[1., 1., 1., 1., 1., 1., 3., 3., 3.]
        );
        c.truncate(1);
        assert_eq!(c.values(1).gather_f32(0..1), &[2.0; 3]);
        assert!(c.check_room(9).is_ok());
        assert!(c.check_room(10).is_err());
    }

    #[test]
    fn f16_state_rounds_on_append() {
        let mut c = SeqState::new(1, 2, 4).with_kv_dtype(KvDtype::F16);
        assert_eq!(c.kv_dtype(), KvDtype::F16);
        c.append(0, &[1.0, 0.1], &[-2.5, 65504.0]);
        c.commit(1);
        let KvRows::F16(k) = c.keys(0).pages()[0] else {
            panic!("an f16 state stores f16 rows")
        };
        assert_eq!(k, &[f16::from_f32(1.0), f16::from_f32(0.1)]);
        // 0.1 is not a half: the stored value is the nearest one.
        assert_eq!(c.keys(0).gather_f32(0..1), &[1.0, 0.099_975_586]);
        assert_eq!(c.values(0).gather_f32(0..1), &[-2.5, 65504.0]);
        assert_eq!(c.memory_bytes() % 2, 0);
        c.truncate(0);
        assert!(c.keys(0).is_empty());
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
