//! The state of one sequence: a page table over a [`PagePool`] for the attention layers (keys
//! and values of every token), a fixed-size convolution window and recurrent matrix per
//! recurrent layer.

use std::sync::Arc;

use super::pool::{Charge, PagePool, PageRef, PageShape, DEFAULT_PAGE_ROWS};
use super::view::KvView;
use crate::backend::Device;
use crate::tensor::Tensor;
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

/// The per-sequence memory a model needs: the kind of every layer and the width of the
/// attention layers' key (or value) rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryLayout {
    /// One entry per layer.
    pub kinds: Vec<LayerKind>,
    /// Width of one attention layer's key (or value) row.
    pub kv_dim: usize,
    /// The longest sequence the model supports.
    pub max_positions: usize,
}

impl MemoryLayout {
    /// Attention layers.
    pub fn attn_layers(&self) -> usize {
        self.kinds
            .iter()
            .filter(|k| **k == LayerKind::Attention)
            .count()
    }

    /// Whether some layer keeps a recurrent state (which cannot be rewound).
    pub fn is_recurrent(&self) -> bool {
        self.kinds.iter().any(|k| *k != LayerKind::Attention)
    }

    /// Bytes of one sequence's recurrent state (f32).
    pub fn recurrent_bytes(&self) -> usize {
        self.kinds
            .iter()
            .map(|k| match k {
                LayerKind::Attention => 0,
                LayerKind::Recurrent { conv, recurrent } => 4 * (conv + recurrent),
            })
            .sum()
    }

    /// Bytes a sequence of up to `tokens` tokens may take: its pages (of `page_rows` tokens,
    /// keys and values as `dtype`) and its recurrent state.
    pub fn sequence_bytes(&self, tokens: usize, page_rows: usize, dtype: KvDtype) -> usize {
        let page = self.page_shape(page_rows, dtype).page_bytes();
        tokens.div_ceil(page_rows.max(1)).saturating_mul(page) + self.recurrent_bytes()
    }

    /// The page shape of this layout.
    pub fn page_shape(&self, page_rows: usize, dtype: KvDtype) -> PageShape {
        PageShape {
            page_rows,
            attn_layers: self.attn_layers(),
            kv_dim: self.kv_dim,
            dtype,
        }
    }
}

/// Fixed-size state of a recurrent layer, with the update of the pass in flight.
#[derive(Debug, Clone, Default)]
struct Recurrent {
    conv: Vec<f32>,
    state: Vec<f32>,
    pending: Option<(Vec<f32>, Vec<f32>)>,
}

/// A copy of every recurrent layer's state at one position (for the prefix cache, or a
/// session's checkpoint), charged against the pool it was taken from.
#[derive(Debug)]
pub struct RecurrentSnapshot {
    layers: Vec<Option<(Vec<f32>, Vec<f32>)>>,
    /// A copy of a device state's block.
    block: Option<Tensor>,
    charge: Charge,
}

impl RecurrentSnapshot {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.charge.bytes()
    }
}

/// The recurrent state before the last commit (see [`SeqState::keep_previous`]).
#[derive(Debug)]
struct Previous {
    len: usize,
    layers: Vec<Option<(Vec<f32>, Vec<f32>)>>,
    _charge: Charge,
}

/// Everything a decoder remembers of one sequence.
///
/// Attention layers keep the keys and values of every token in pages of a [`PagePool`]: row
/// `t` of layer `l` is row `t % page_rows` of page `t / page_rows` in the sequence's page table.
/// Pages may be shared with other sequences and the prefix cache (read-only); the page a
/// sequence writes into is made its own first (copy on write). Recurrent layers keep a
/// convolution window and recurrent matrices of fixed size, whatever the length.
///
/// A forward pass first [`SeqState::reserve`]s room for its new tokens (the only step that can
/// fail for lack of memory), then [`SeqState::append`]s the new rows to every attention layer
/// (visible to that layer's attention at once) and [`SeqState::set_recurrent`]s the new state
/// of every recurrent layer, then [`SeqState::commit`]s, which advances [`SeqState::len`]; a
/// pass that fails before the commit leaves the state as it was.
#[derive(Debug)]
pub struct SeqState {
    pool: PagePool,
    pages: Vec<PageRef>,
    /// Attention slot of every layer (`None` for recurrent layers).
    slots: Arc<[Option<usize>]>,
    kinds: Arc<[LayerKind]>,
    /// Host states of the recurrent layers (states on the CPU).
    recurrent: Vec<Option<Recurrent>>,
    /// Every recurrent layer's window and matrices in one device tensor (states on a GPU),
    /// which the device's kernels update in place: see [`SeqState::recurrent_block`].
    block: Option<Tensor>,
    recurrent_charge: Option<Charge>,
    kv_dim: usize,
    len: usize,
    /// Rows appended by the pass in flight.
    appended: usize,
    max_len: usize,
    /// Armed by [`SeqState::keep_previous`]: the next commit keeps the recurrent state it
    /// replaces (charged here), in `previous`.
    keep: Option<Charge>,
    previous: Option<Previous>,
}

impl Clone for SeqState {
    /// Shares the pages (copy on write) and copies the recurrent state, charged to the pool
    /// even beyond its budget.
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            pages: self.pages.clone(),
            slots: Arc::clone(&self.slots),
            kinds: Arc::clone(&self.kinds),
            recurrent: self.recurrent.clone(),
            block: self.block.as_ref().map(|b| {
                b.try_clone()
                    .expect("device memory for a copy of a recurrent state")
            }),
            recurrent_charge: self
                .recurrent_charge
                .as_ref()
                .map(|c| self.pool.force_charge(c.bytes())),
            kv_dim: self.kv_dim,
            len: self.len,
            appended: self.appended,
            max_len: self.max_len,
            keep: None,
            previous: None,
        }
    }
}

impl SeqState {
    /// An empty state for `n_layers` attention layers of width `kv_dim`, holding at most
    /// `max_len` tokens, in a pool of its own.
    pub fn new(n_layers: usize, kv_dim: usize, max_len: usize) -> Self {
        Self::with_layers(&vec![LayerKind::Attention; n_layers], kv_dim, max_len)
    }

    /// An empty state for layers of the given kinds (attention layers of width `kv_dim`), in a
    /// pool of its own with no budget.
    pub fn with_layers(layers: &[LayerKind], kv_dim: usize, max_len: usize) -> Self {
        Self::with_layers_on(&Device::Cpu, layers, kv_dim, max_len)
    }

    /// [`SeqState::with_layers`] with the pages on `device`.
    pub fn with_layers_on(
        device: &Device,
        layers: &[LayerKind],
        kv_dim: usize,
        max_len: usize,
    ) -> Self {
        let layout = MemoryLayout {
            kinds: layers.to_vec(),
            kv_dim,
            max_positions: max_len,
        };
        let shape = layout.page_shape(DEFAULT_PAGE_ROWS, KvDtype::F32);
        let pool = PagePool::on_device(device, shape, usize::MAX);
        Self::in_pool(&pool, &layout, max_len).expect("an unbounded pool has room")
    }

    /// An empty state in `pool` (whose page shape must be `layout`'s) holding at most
    /// `max_len` tokens; its recurrent state is charged to the pool now.
    pub fn in_pool(pool: &PagePool, layout: &MemoryLayout, max_len: usize) -> Result<Self> {
        let shape = pool.shape();
        if shape.attn_layers != layout.attn_layers() || shape.kv_dim != layout.kv_dim {
            return Err(Error::InvalidInput(format!(
                "a page pool of {} attention layers x {} values cannot hold a model of {} x {}",
                shape.attn_layers,
                shape.kv_dim,
                layout.attn_layers(),
                layout.kv_dim
            )));
        }
        let rec_bytes = layout.recurrent_bytes();
        let recurrent_charge = if rec_bytes > 0 {
            Some(pool.charge(rec_bytes)?)
        } else {
            None
        };
        let on_device = !pool.device().is_cpu() && layout.is_recurrent();
        let block = if on_device {
            let values = layout.recurrent_bytes() / 4;
            Some(Tensor::zeros(pool.device(), 1, values)?)
        } else {
            None
        };
        let mut next = 0;
        let slots: Arc<[Option<usize>]> = layout
            .kinds
            .iter()
            .map(|k| {
                (*k == LayerKind::Attention).then(|| {
                    next += 1;
                    next - 1
                })
            })
            .collect();
        Ok(Self {
            pool: pool.clone(),
            pages: Vec::new(),
            slots,
            kinds: layout.kinds.iter().copied().collect(),
            block,
            recurrent: layout
                .kinds
                .iter()
                .map(|k| match *k {
                    LayerKind::Attention => None,
                    _ if on_device => None,
                    LayerKind::Recurrent { conv, recurrent } => Some(Recurrent {
                        conv: vec![0.0; conv],
                        state: vec![0.0; recurrent],
                        pending: None,
                    }),
                })
                .collect(),
            recurrent_charge,
            kv_dim: layout.kv_dim,
            len: 0,
            appended: 0,
            max_len: max_len.min(layout.max_positions),
            keep: None,
            previous: None,
        })
    }

    /// The layer kinds and widths this state was made for.
    pub fn layout(&self) -> MemoryLayout {
        MemoryLayout {
            kinds: self.kinds.to_vec(),
            kv_dim: self.kv_dim,
            max_positions: self.max_len,
        }
    }

    /// The same layers storing keys and values as `dtype`, in a new pool of its own (builder
    /// style: `model.new_cache(n).with_kv_dtype(KvDtype::F16)`). Forgets any cached token.
    pub fn with_kv_dtype(self, dtype: KvDtype) -> Self {
        let shape = self.pool.shape();
        let pool =
            PagePool::on_device(self.pool.device(), PageShape { dtype, ..shape }, usize::MAX);
        Self::in_pool(&pool, &self.layout(), self.max_len).expect("an unbounded pool has room")
    }

    /// How keys and values are stored.
    pub fn kv_dtype(&self) -> crate::state::KvDtype {
        self.pool.shape().dtype
    }

    /// The pool holding the pages.
    pub fn pool(&self) -> &PagePool {
        &self.pool
    }

    /// Tokens per page.
    pub fn page_rows(&self) -> usize {
        self.pool.shape().page_rows
    }

    /// The page table (pages of committed tokens first).
    pub fn pages(&self) -> &[PageRef] {
        &self.pages
    }

    /// Whether some layer keeps a recurrent state.
    pub fn is_recurrent(&self) -> bool {
        self.kinds.iter().any(|k| *k != LayerKind::Attention)
    }

    /// The committed convolution window and recurrent state of recurrent layer `layer` (a
    /// state on the CPU).
    ///
    /// Panics if `layer` is an attention layer or the state lives on a GPU (a model bug).
    pub fn recurrent(&self, layer: usize) -> (&[f32], &[f32]) {
        let r = self.recurrent[layer]
            .as_ref()
            .expect("recurrent() on an attention layer or a GPU state");
        (&r.conv, &r.state)
    }

    /// Records the state of recurrent layer `layer` after the pass in flight (applied by
    /// [`SeqState::commit`]; a state on the CPU).
    pub fn set_recurrent(&mut self, layer: usize, conv: Vec<f32>, state: Vec<f32>) {
        let r = self.recurrent[layer]
            .as_mut()
            .expect("set_recurrent() on an attention layer or a GPU state");
        debug_assert!(conv.len() == r.conv.len() && state.len() == r.state.len());
        r.pending = Some((conv, state));
    }

    /// The device block of a state on a GPU, and where recurrent layer `layer`'s convolution
    /// window ([kernel - 1, conv channels]) and matrices start in it (values from its start).
    /// The device's kernels read and update the block in place, so a pass that fails midway
    /// on a GPU leaves the layers it ran advanced (the request fails with it). `None` for
    /// states on the CPU (see [`SeqState::recurrent`]) and for attention layers.
    pub fn recurrent_block(&mut self, layer: usize) -> Option<(&mut Tensor, usize, usize)> {
        let mut off = 0;
        let mut at = None;
        for (l, k) in self.kinds.iter().enumerate() {
            if let LayerKind::Recurrent { conv, recurrent } = *k {
                if l == layer {
                    at = Some((off, off + conv));
                }
                off += conv + recurrent;
            }
        }
        let (conv, rec) = at?;
        Some((self.block.as_mut()?, conv, rec))
    }

    /// A copy of the committed recurrent state (`None` for attention-only states), charged
    /// to the pool; [`Error::OutOfMemory`] when it does not fit.
    pub fn snapshot_recurrent(&self) -> Result<Option<RecurrentSnapshot>> {
        let Some(c) = &self.recurrent_charge else {
            return Ok(None);
        };
        let charge = self.pool.charge(c.bytes())?;
        let block = self.block.as_ref().map(Tensor::try_clone).transpose()?;
        let layers = self
            .recurrent
            .iter()
            .map(|r| r.as_ref().map(|r| (r.conv.clone(), r.state.clone())))
            .collect();
        Ok(Some(RecurrentSnapshot {
            layers,
            block,
            charge,
        }))
    }

    /// Starts this empty state from `len` tokens of cached `pages` (shared, read-only) and, for
    /// recurrent layers, the snapshot taken at that position.
    ///
    /// Panics unless the state is empty and the pages and snapshot fit it (a caller bug);
    /// fails only when a device copy does.
    pub fn adopt_prefix(
        &mut self,
        pages: Vec<PageRef>,
        len: usize,
        snapshot: Option<&RecurrentSnapshot>,
    ) -> Result<()> {
        assert!(
            self.len == 0 && self.pages.is_empty(),
            "adopt_prefix on a used state"
        );
        assert!(len <= pages.len() * self.page_rows() && len <= self.max_len);
        assert_eq!(
            snapshot.is_some(),
            self.is_recurrent(),
            "snapshot of another kind"
        );
        if let Some(s) = snapshot {
            for (r, l) in self.recurrent.iter_mut().zip(&s.layers) {
                if let (Some(r), Some((conv, state))) = (r, l) {
                    r.conv.copy_from_slice(conv);
                    r.state.copy_from_slice(state);
                }
            }
            if let (Some(b), Some(from)) = (self.block.as_mut(), s.block.as_ref()) {
                b.copy_from(from)?;
            }
        }
        self.pages = pages;
        self.len = len;
        Ok(())
    }

    /// A new sequence holding this one's first `len` committed tokens (llama.cpp's `seq_cp`):
    /// the pages are shared (copy on write), the recurrent state copied and charged to the
    /// pool. Recurrent states fork only at their current length; [`Error::OutOfMemory`] when
    /// the copy does not fit.
    pub fn fork(&self, len: usize) -> Result<SeqState> {
        if len > self.len || !self.can_truncate_to(len) {
            return Err(Error::InvalidInput(format!(
                "cannot fork {len} tokens of a sequence of {} (recurrent states fork at their end)",
                self.len
            )));
        }
        let recurrent_charge = match &self.recurrent_charge {
            Some(c) => Some(self.pool.charge(c.bytes())?),
            None => None,
        };
        let mut forked = Self {
            pool: self.pool.clone(),
            pages: self.pages[..len.div_ceil(self.page_rows()).min(self.pages.len())].to_vec(),
            slots: Arc::clone(&self.slots),
            kinds: Arc::clone(&self.kinds),
            recurrent: self.recurrent.clone(),
            block: self.block.as_ref().map(Tensor::try_clone).transpose()?,
            recurrent_charge,
            kv_dim: self.kv_dim,
            len: self.len,
            appended: 0,
            max_len: self.max_len,
            keep: None,
            previous: None,
        };
        forked.truncate(len);
        for r in forked.recurrent.iter_mut().flatten() {
            r.pending = None;
        }
        Ok(forked)
    }

    /// Whether the state can be cut back to its first `len` tokens ([`SeqState::truncate`]):
    /// always for attention-only states; when a recurrent layer exists, only to the current
    /// length or to the length before the last commit when [`SeqState::keep_previous`] kept
    /// that state (a recurrent state cannot be rewound otherwise; restore a snapshot instead).
    pub fn can_truncate_to(&self, len: usize) -> bool {
        len >= self.len
            || !self.is_recurrent()
            || self.previous.as_ref().is_some_and(|p| p.len == len)
    }

    /// Makes the next [`SeqState::commit`] keep the recurrent state it replaces, so the pass
    /// can be undone by [`SeqState::truncate`] to the length before it (speculative decoding:
    /// the pass that verifies a draft). Costs no copy (the replaced state is kept, not
    /// freed) but holds a second recurrent state, charged to the pool until the commit after
    /// next; [`Error::OutOfMemory`] when it does not fit. Nothing to do for attention-only
    /// states (they truncate anywhere).
    pub fn keep_previous(&mut self) -> Result<()> {
        if self.block.is_some() {
            return Err(Error::Device(
                "a recurrent state on a GPU is updated in place and cannot undo a pass \
                 (speculative decoding of hybrid models runs on the CPU)"
                    .into(),
            ));
        }
        if let (None, Some(c)) = (&self.keep, &self.recurrent_charge) {
            self.keep = Some(self.pool.charge(c.bytes())?);
        }
        Ok(())
    }

    /// Back to an empty sequence (its pages go back to the pool unless shared); fails only
    /// when zeroing a device state does.
    pub fn clear(&mut self) -> Result<()> {
        self.len = 0;
        self.appended = 0;
        self.pages.clear();
        self.previous = None;
        for r in self.recurrent.iter_mut().flatten() {
            r.conv.fill(0.0);
            r.state.fill(0.0);
            r.pending = None;
        }
        match self.block.as_mut() {
            Some(b) => b.fill_zero(),
            None => Ok(()),
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

    /// The most tokens this state may hold.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Width of one layer's key (or value) row.
    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    /// Checks that `n` more tokens fit the state's length limit.
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

    fn has_attention(&self) -> bool {
        self.slots.iter().any(Option::is_some)
    }

    /// Makes room for `n` more tokens: checks the length limit, takes new pages from the pool
    /// and copies a shared page the new rows would go into. [`Error::OutOfMemory`] when the
    /// pool's budget is spent (the state stays valid; pages taken so far are kept).
    pub fn reserve(&mut self, n: usize) -> Result<()> {
        self.check_room(n)?;
        if n == 0 || !self.has_attention() {
            return Ok(());
        }
        let p = self.page_rows();
        let first = self.len / p;
        let need = (self.len + n).div_ceil(p);
        for i in first..need.min(self.pages.len()) {
            if Arc::strong_count(&self.pages[i]) > 1 {
                self.pages[i] = Arc::new(self.pages[i].duplicate()?);
            }
        }
        while self.pages.len() < need {
            self.pages.push(Arc::new(self.pool.alloc()?));
        }
        Ok(())
    }

    /// Appends the rows of `n` new tokens to `layer` (f32 [n, kv_dim] each, rounded to f16 in
    /// an f16 state), after the committed ones, replacing anything appended to this layer since
    /// the last commit. Reserves the room first if [`SeqState::reserve`] was not called.
    ///
    /// Panics if the pool has no room (reserve first to get an error instead).
    pub fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) {
        let slot = self.slots[layer].expect("append() on a recurrent layer");
        let n = k.len() / self.kv_dim;
        assert_eq!(k.len(), v.len(), "keys and values of different sizes");
        if self.pages.len() * self.page_rows() < self.len + n
            || (n > 0 && Arc::strong_count(&self.pages[self.len / self.page_rows()]) > 1)
        {
            self.reserve(n).expect("KV pages for the pass");
        }
        let (p, d) = (self.page_rows(), self.kv_dim);
        let mut t = 0;
        while t < n {
            let pos = self.len + t;
            let (page, row) = (pos / p, pos % p);
            let take = (p - row).min(n - t);
            let page = Arc::get_mut(&mut self.pages[page]).expect("reserved pages are exclusive");
            page.write(slot, false, row, &k[t * d..(t + take) * d]);
            page.write(slot, true, row, &v[t * d..(t + take) * d]);
            t += take;
        }
        self.appended = n;
    }

    /// [`SeqState::append`] for a state whose pages the caller writes itself (device memory):
    /// makes room for `n` new rows of `layer`, marks them appended and returns the layer's
    /// attention slot and, for each new row, (index in the page table, row in that page).
    pub fn append_slots(&mut self, layer: usize, n: usize) -> Result<(usize, Vec<(usize, usize)>)> {
        let slot = self.slots[layer].ok_or_else(|| {
            Error::InvalidInput(format!("layer {layer} keeps no keys and values"))
        })?;
        if self.pages.len() * self.page_rows() < self.len + n
            || (n > 0 && Arc::strong_count(&self.pages[self.len / self.page_rows()]) > 1)
        {
            self.reserve(n)?;
        }
        let p = self.page_rows();
        let rows = (self.len..self.len + n)
            .map(|pos| (pos / p, pos % p))
            .collect();
        self.appended = n;
        Ok((slot, rows))
    }

    /// The attention slot (index among attention layers) of `layer`, `None` for a recurrent
    /// layer.
    pub fn attention_slot(&self, layer: usize) -> Option<usize> {
        self.slots.get(layer).copied().flatten()
    }

    /// Rows of `layer` attention reads now: committed plus appended by the pass in flight.
    pub fn visible_rows(&self) -> usize {
        self.len + self.appended
    }

    fn view(&self, layer: usize, values: bool) -> KvView<'_> {
        let slot = self.slots[layer].expect("keys() on a recurrent layer");
        let rows = self.len + self.appended;
        let p = self.page_rows();
        let pages = self.pages[..rows.div_ceil(p)]
            .iter()
            .map(|pg| pg.rows(slot, values))
            .collect();
        KvView::new(pages, p, rows, self.kv_dim)
    }

    /// Keys of `layer` including rows appended since the last commit.
    pub fn keys(&self, layer: usize) -> KvView<'_> {
        self.view(layer, false)
    }

    /// Values of `layer`, like [`SeqState::keys`].
    pub fn values(&self, layer: usize) -> KvView<'_> {
        self.view(layer, true)
    }

    /// Makes the `n` tokens appended to every layer part of the sequence.
    pub fn commit(&mut self, n: usize) {
        debug_assert!(!self.has_attention() || self.appended == n);
        let keep = self.keep.take();
        let before = self.len;
        self.len += n;
        self.appended = 0;
        let layers = self
            .recurrent
            .iter_mut()
            .map(|r| {
                let r = r.as_mut()?;
                let (conv, state) = match r.pending.take() {
                    Some(new) => (
                        std::mem::replace(&mut r.conv, new.0),
                        std::mem::replace(&mut r.state, new.1),
                    ),
                    None if keep.is_some() => (r.conv.clone(), r.state.clone()),
                    None => return None,
                };
                keep.is_some().then_some((conv, state))
            })
            .collect();
        self.previous = keep.map(|charge| Previous {
            len: before,
            layers,
            _charge: charge,
        });
    }

    /// Forgets every token from position `len` on (e.g. to reuse a shared prompt prefix).
    ///
    /// Panics unless [`SeqState::can_truncate_to`] allows it (a caller bug).
    pub fn truncate(&mut self, len: usize) {
        assert!(self.can_truncate_to(len), "cannot rewind a recurrent state");
        if len < self.len {
            if self.is_recurrent() {
                let previous = self.previous.take().expect("checked by can_truncate_to");
                for (r, kept) in self.recurrent.iter_mut().zip(previous.layers) {
                    if let (Some(r), Some((conv, state))) = (r, kept) {
                        r.conv = conv;
                        r.state = state;
                        r.pending = None;
                    }
                }
            }
            self.len = len;
            self.appended = 0;
            self.pages.truncate(len.div_ceil(self.page_rows()));
        }
    }

    /// Bytes held by the state: its pages (shared ones too) and its recurrent state.
    pub fn memory_bytes(&self) -> usize {
        self.pages.len() * self.pool.shape().page_bytes()
            + self.recurrent_charge.as_ref().map_or(0, Charge::bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::KvRows;
    use half::f16;

    #[test]
    fn append_commit_truncate() {
        let mut c = SeqState::new(2, 3, 100);
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
        assert!(c.check_room(99).is_ok());
        assert!(c.check_room(100).is_err());
    }

    #[test]
    fn rows_cross_pages_and_shared_pages_are_copied_on_write() {
        let mut a = SeqState::new(1, 2, 1000);
        let rows: Vec<f32> = (0..2 * 40).map(|x| x as f32).collect();
        a.append(0, &rows, &rows);
        a.commit(40);
        assert_eq!(a.pages().len(), 2);
        assert_eq!(a.keys(0).gather_f32(0..40), rows);
        // A fork shares both pages; writing into the partly filled one copies it.
        let mut b = a.clone();
        b.append(0, &[-1.0, -1.0], &[-2.0, -2.0]);
        b.commit(1);
        assert!(Arc::ptr_eq(&a.pages()[0], &b.pages()[0]));
        assert!(!Arc::ptr_eq(&a.pages()[1], &b.pages()[1]));
        assert_eq!(a.keys(0).gather_f32(0..40), rows);
        assert_eq!(b.keys(0).gather_f32(40..41), vec![-1.0, -1.0]);
        assert_eq!(a.pool().pages_used(), 3);
        // A fork of a prefix shares the pages it covers.
        let c = a.fork(33).unwrap();
        assert_eq!(c.len(), 33);
        assert_eq!(c.keys(0).gather_f32(0..33), rows[..66]);
        assert!(Arc::ptr_eq(&a.pages()[1], &c.pages()[1]));
        assert!(a.fork(41).is_err());
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
        assert_eq!(&k[..2], &[f16::from_f32(1.0), f16::from_f32(0.1)]);
        // 0.1 is not a half: the stored value is the nearest one.
        assert_eq!(c.keys(0).gather_f32(0..1), &[1.0, 0.099_975_586]);
        assert_eq!(c.values(0).gather_f32(0..1), &[-2.5, 65504.0]);
        assert_eq!(c.memory_bytes() % 2, 0);
        c.truncate(0);
        assert!(c.keys(0).is_empty());
    }

    #[test]
    fn budget_refuses_pages_with_an_error() {
        let layout = MemoryLayout {
            kinds: vec![LayerKind::Attention],
            kv_dim: 2,
            max_positions: 1000,
        };
        let shape = layout.page_shape(4, KvDtype::F32);
        let pool = PagePool::new(shape, 2 * shape.page_bytes());
        let mut s = SeqState::in_pool(&pool, &layout, 1000).unwrap();
        s.reserve(8).unwrap();
        assert!(matches!(s.reserve(9), Err(Error::OutOfMemory(_))));
        assert_eq!(s.len(), 0);
        drop(s);
        assert_eq!(pool.used_bytes(), 0);
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
        let saved = s.snapshot_recurrent().unwrap().unwrap();
        let pages = s.pages().to_vec();
        s.clear().unwrap();
        assert_eq!(s.len(), 0);
        assert_eq!(s.recurrent(0).0, &[0.0; 2]);
        assert_eq!(snapshot.recurrent(0).0, &[1.0; 2]);
        s.adopt_prefix(pages, 1, Some(&saved)).unwrap();
        assert_eq!(s.recurrent(0).0, &[1.0; 2]);
        assert_eq!(s.keys(1).gather_f32(0..1), vec![5.0; 2]);
    }
}
