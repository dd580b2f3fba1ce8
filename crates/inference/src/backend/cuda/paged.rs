//! Causal attention of a batch whose tensors and KV pages are on a GPU: writes the new rows'
//! keys and values into each sequence's pages, builds the launch's page table and query
//! tiles from the states, and runs the paged flash-style kernel (backend::cuda).

use std::sync::Arc;

use super::graph::HostPart;
use super::launch::ATTN_ROWS;
use super::{AttnTiles, Buf, CudaDevice, Input};
use crate::attention::CausalShape;
use crate::state::{KvDtype, SeqState};
use crate::{Error, Result};

/// Where a pass's new rows go and what its attention launch reads, built from the states.
struct Plan {
    rows: usize,
    /// Page-row address of each new row (attention slot 0).
    dst: Vec<u64>,
    tiles: AttnTiles,
    page_rows: usize,
    k_off: usize,
    val_off: usize,
    f16: bool,
    decode: bool,
}

/// What attention builds from the states for a pass, alike for every layer (a page holds every
/// layer's rows of its tokens; only the layer's offsets within a page differ): the pass's first
/// attention layer builds it, its later layers take it as it is (a decode step of 64 sequences
/// of 640 tokens has 2,560 page addresses to gather, for each of 28 layers otherwise).
struct Layout {
    /// The forward pass ([`crate::backend::pass_id`]) and device it was built in.
    pass: u64,
    dev: usize,
    /// The states as the layout left them: see [`state_key`].
    key: Vec<StateKey>,
    rows: usize,
    /// Page-row address of each new row (attention slot 0).
    dst: Vec<u64>,
    row_pos: Vec<i32>,
    tile_seq: Vec<i32>,
    tile_row0: Vec<i32>,
    tile_n: Vec<i32>,
    pages: Vec<u64>,
    page0: Vec<i32>,
    page_rows: usize,
    dtype: KvDtype,
}

/// A state's address, committed rows, appended rows, pages and first page address: while
/// these stay, so do its page table and new rows' destinations.
type StateKey = [usize; 5];

fn state_key(state: &SeqState) -> StateKey {
    [
        state as *const SeqState as usize,
        state.len(),
        state.visible_rows(),
        state.pages().len(),
        state
            .pages()
            .first()
            .and_then(|p| p.device_addr())
            .unwrap_or(0) as usize,
    ]
}

thread_local! {
    /// The layout of the pass running on this thread.
    static LAYOUT: std::cell::RefCell<Option<Layout>> = const { std::cell::RefCell::new(None) };
}

impl Layout {
    /// Reserves the new rows of `layer` in every state and gathers the pages.
    fn build(
        dev: &Arc<CudaDevice>,
        seq_lens: &[usize],
        states: &mut [&mut SeqState],
        layer: usize,
    ) -> Result<Self> {
        let rows: usize = seq_lens.iter().sum();
        let dtype = states.first().map_or(KvDtype::F32, |s| s.kv_dtype());
        let page_rows = states.first().map_or(1, |s| s.page_rows());
        let elt = dtype.bytes() as u64;
        let mut dst = Vec::with_capacity(rows);
        let mut row_pos = Vec::with_capacity(rows);
        let (mut tile_seq, mut tile_row0, mut tile_n) = (Vec::new(), Vec::new(), Vec::new());
        let (mut pages, mut page0) = (Vec::new(), Vec::with_capacity(states.len()));
        let mut row0 = 0usize;
        let no_page = || Error::Device("a KV page is not in device memory".into());
        for (s, (&n, state)) in seq_lens.iter().zip(states.iter_mut()).enumerate() {
            if state.kv_dtype() != dtype || state.page_rows() != page_rows {
                return Err(Error::InvalidInput(
                    "the sequences of one batch must share a KV pool".into(),
                ));
            }
            let start = state.len();
            let (_, slots) = state.append_slots(layer, n)?;
            for (pi, r) in slots {
                let page = &state.pages()[pi];
                let base = page.device_addr().ok_or_else(no_page)?;
                dst.push(base + page.offset(0, false, r) as u64 * elt);
            }
            page0.push(pages.len() as i32);
            let visible = state.visible_rows().div_ceil(page_rows);
            for p in &state.pages()[..visible] {
                pages.push(p.device_addr().ok_or_else(no_page)?);
            }
            row_pos.extend((start..start + n).map(|p| p as i32));
            for c in (0..n).step_by(ATTN_ROWS) {
                tile_seq.push(s as i32);
                tile_row0.push((row0 + c) as i32);
                tile_n.push((n - c).min(ATTN_ROWS) as i32);
            }
            row0 += n;
        }
        Ok(Self {
            pass: crate::backend::pass_id(),
            dev: Arc::as_ptr(dev) as usize,
            key: states.iter().map(|s| state_key(s)).collect(),
            rows,
            dst,
            row_pos,
            tile_seq,
            tile_row0,
            tile_n,
            pages,
            page0,
            page_rows,
            dtype,
        })
    }

    /// Whether this layout is the one of the pass running, on `dev`, over `states` as they are.
    fn fits(&self, dev: &Arc<CudaDevice>, seq_lens: &[usize], states: &[&mut SeqState]) -> bool {
        self.pass != 0
            && self.pass == crate::backend::pass_id()
            && self.dev == Arc::as_ptr(dev) as usize
            && self.key.len() == states.len()
            && seq_lens.len() == states.len()
            && self
                .key
                .iter()
                .zip(states)
                .zip(seq_lens)
                .all(|((k, s), &n)| k[2] - k[1] == n && *k == state_key(s))
    }
}

/// Reserves the new rows of `layer` in every state (the pass's first attention layer; the
/// others take its [`Layout`]) and uploads the attention inputs.
fn plan(
    dev: &Arc<CudaDevice>,
    seq_lens: &[usize],
    states: &mut [&mut SeqState],
    layer: usize,
    shape: &CausalShape,
) -> Result<Plan> {
    dev.timed(HostPart::AttentionPlan, || {
        LAYOUT.with(|cell| {
            let mut cell = cell.borrow_mut();
            let reuse = cell.as_ref().is_some_and(|l| l.fits(dev, seq_lens, states));
            if !reuse {
                *cell = None;
                *cell = Some(Layout::build(dev, seq_lens, states, layer)?);
            }
            let l = cell.as_ref().expect("built above");
            // This layer's keys and values within a page (every state's pages share a pool).
            let (mut k_off, mut val_off) = (0, 0);
            if let Some(s) = states.iter().find(|s| !s.pages().is_empty()) {
                let slot = s.attention_slot(layer).ok_or_else(|| {
                    Error::InvalidInput(format!("layer {layer} keeps no keys and values"))
                })?;
                let p = &s.pages()[0];
                k_off = p.offset(slot, false, 0);
                val_off = p.offset(slot, true, 0) - k_off;
            }
            let tiles = AttnTiles {
                n_tiles: l.tile_seq.len(),
                tile_seq: dev.input(Input::TileSeq, &l.tile_seq)?,
                tile_row0: dev.input(Input::TileRow0, &l.tile_row0)?,
                tile_n: dev.input(Input::TileRows, &l.tile_n)?,
                row_pos: dev.input(Input::RowPositions, &l.row_pos)?,
                pages: dev.input(Input::Pages, &l.pages)?,
                page0: dev.input(Input::FirstPages, &l.page0)?,
            };
            Ok(Plan {
                rows: l.rows,
                dst: l.dst.clone(),
                tiles,
                page_rows: l.page_rows,
                k_off,
                val_off,
                f16: l.dtype == KvDtype::F16,
                decode: seq_lens.iter().all(|&n| n == 1) && shape.head_dim.is_multiple_of(4),
            })
        })
    })
}

/// The attention launch of a plan whose keys and values are written.
fn run(
    dev: &Arc<CudaDevice>,
    plan: &Plan,
    q: &Buf,
    shape: &CausalShape,
    scale: f32,
) -> Result<Buf> {
    let (h, kvh, hd, win) = (
        shape.n_heads,
        shape.n_kv_heads,
        shape.head_dim,
        shape.sliding_window,
    );
    let (pr, ko, vo, rows, t) = (
        plan.page_rows,
        plan.k_off,
        plan.val_off,
        plan.rows,
        &plan.tiles,
    );
    // SAFETY: the plan's pages hold, per sequence, every row its positions reach (committed,
    // and written for this pass), all of one pool and so one layout (k_off, val_off, page_rows).
    unsafe {
        if plan.decode {
            dev.attention_decode(q, rows, t, pr, ko, vo, h, kvh, hd, scale, win, plan.f16)
        } else {
            dev.attention(q, rows, t, pr, ko, vo, h, kvh, hd, scale, win, plan.f16)
        }
    }
}

/// [`crate::attention::attend`] on device buffers: `q` [rows, n_heads * hd], `k` and `v`
/// [rows, n_kv_heads * hd]; returns the context [rows, n_heads * hd].
#[allow(clippy::too_many_arguments)]
pub fn attend_paged(
    dev: &Arc<CudaDevice>,
    q: &Buf,
    k: &Buf,
    v: &Buf,
    seq_lens: &[usize],
    states: &mut [&mut SeqState],
    layer: usize,
    shape: &CausalShape,
    scale: f32,
) -> Result<Buf> {
    let kv_dim = shape.n_kv_heads * shape.head_dim;
    let plan = plan(dev, seq_lens, states, layer, shape)?;
    // SAFETY: every destination is a row of a live page that `append_slots` made exclusive to
    // its sequence; `k_off` and `val_off` are this layer's keys and values within a page.
    unsafe { dev.kv_write(k, v, &plan.dst, kv_dim, plan.k_off, plan.val_off, plan.f16)? };
    run(dev, &plan, q, shape, scale)
}

/// The per-head norms and rotary embedding [`attend_qkv_paged`] applies on the way.
pub struct QkvPrep<'a> {
    /// Rotary inverse frequencies on the device [rotary_dim / 2].
    pub inv_freq: &'a Buf,
    /// cos/sin scale.
    pub attn: f32,
    /// Per-head query and key RMSNorm weights [hd] and epsilon (Qwen3).
    pub norms: Option<(&'a Buf, &'a Buf, f32)>,
    /// Row positions (RoPE), one per row.
    pub positions: &'a [i32],
}

/// Attention from a layer's fused Q/K/V product `qkv` [rows, (n_heads + 2 n_kv_heads) * hd]:
/// one kernel normalizes and rotates the heads and writes keys and values into the pages, then
/// the attention launch; returns the context [rows, n_heads * hd].
#[allow(clippy::too_many_arguments)]
pub fn attend_qkv_paged(
    dev: &Arc<CudaDevice>,
    qkv: &Buf,
    prep: &QkvPrep<'_>,
    seq_lens: &[usize],
    states: &mut [&mut SeqState],
    layer: usize,
    shape: &CausalShape,
    scale: f32,
) -> Result<Buf> {
    let plan = plan(dev, seq_lens, states, layer, shape)?;
    let (h, kvh, hd) = (shape.n_heads, shape.n_kv_heads, shape.head_dim);
    // SAFETY: as in `attend_paged`.
    let q = unsafe {
        dev.qkv_prep(
            qkv,
            &plan.dst,
            prep,
            h,
            kvh,
            hd,
            plan.k_off,
            plan.val_off,
            plan.f16,
        )?
    };
    run(dev, &plan, &q, shape, scale)
}

/// Bidirectional attention of an encoder over packed sequences (`cu_seqlens`): qkv [n_tokens,
/// 3 * n_heads * head_dim] holds Q, K and V side by side per token; returns the context
/// [n_tokens, n_heads * head_dim]. The paged attention kernel with each sequence's keys and
/// values as one page of its own and every row placed at the sequence's last position, so that
/// each row sees all keys of its sequence. Its inputs are uploaded afresh (not the per-step
/// [`Input`] buffers, which the decoder's recorded steps own).
pub fn attend_packed(
    dev: &Arc<CudaDevice>,
    qkv: &Buf,
    cu_seqlens: &[usize],
    n_heads: usize,
    head_dim: usize,
) -> Result<Buf> {
    let hidden = n_heads * head_dim;
    let n = cu_seqlens.last().copied().unwrap_or(0);
    if n == 0 {
        return dev.alloc_buf(0);
    }
    let q = dev.copy_cols(qkv, 3 * hidden, 0, n, hidden)?;
    // Keys [n, hidden] then values [n, hidden] in one buffer: values are `val_off` further.
    let mut kv = dev.alloc_buf(2 * n * hidden)?;
    dev.copy_cols_into(qkv, 3 * hidden, hidden, n, hidden, &mut kv, 0)?;
    dev.copy_cols_into(qkv, 3 * hidden, 2 * hidden, n, hidden, &mut kv, n * hidden)?;
    let base = dev.ptr(&kv);
    let (mut tile_seq, mut tile_row0, mut tile_n) = (Vec::new(), Vec::new(), Vec::new());
    let (mut row_pos, mut pages, mut page0) = (Vec::with_capacity(n), Vec::new(), Vec::new());
    let mut longest = 1usize;
    for (s, w) in cu_seqlens.windows(2).enumerate() {
        let len = w[1] - w[0];
        longest = longest.max(len);
        page0.push(s as i32);
        pages.push(base + (w[0] * hidden * 4) as u64);
        row_pos.extend(std::iter::repeat_n(len.saturating_sub(1) as i32, len));
        for c in (0..len).step_by(ATTN_ROWS) {
            tile_seq.push(s as i32);
            tile_row0.push((w[0] + c) as i32);
            tile_n.push((len - c).min(ATTN_ROWS) as i32);
        }
    }
    let up = |v: &[i32]| dev.upload(v);
    let (ts, tr, tn, rp, p0) = (
        up(&tile_seq)?,
        up(&tile_row0)?,
        up(&tile_n)?,
        up(&row_pos)?,
        up(&page0)?,
    );
    let pg = dev.upload(&pages)?;
    let tiles = AttnTiles {
        n_tiles: tile_seq.len(),
        tile_seq: dev.ptr(&ts),
        tile_row0: dev.ptr(&tr),
        tile_n: dev.ptr(&tn),
        row_pos: dev.ptr(&rp),
        pages: dev.ptr(&pg),
        page0: dev.ptr(&p0),
    };
    let scale = 1.0 / (head_dim as f32).sqrt();
    // SAFETY: every page address is a sequence's first key row inside `kv`, whose rows reach
    // `longest` (= page_rows) keys past it at most; values sit n * hidden values further.
    let out = unsafe {
        dev.attention(
            &q,
            n,
            &tiles,
            longest,
            0,
            n * hidden,
            n_heads,
            n_heads,
            head_dim,
            scale,
            None,
            false,
        )
    }?;
    // The uploads and `kv` stay alive until the kernel has read them (freed in stream order).
    drop((ts, tr, tn, rp, p0, pg, kv));
    Ok(out)
}
