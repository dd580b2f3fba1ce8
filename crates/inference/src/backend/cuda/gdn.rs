//! Launchers of gdn.cu: the Gated DeltaNet layer (causal convolution with its window, the
//! delta rule over recurrent states kept in device blocks, the gated RMSNorm) and the small
//! ops of Qwen3.5's gated attention (query/gate split, sigmoid gate). Shapes are checked by the callers (`attention::gdn`, `ops`); each launcher asserts
//! the buffer sizes its kernel touches.

use super::launch::{grid_1d, per_row};
use super::{Buf, CudaDevice, Input};
use crate::attention::gdn::GdnHeads;
use crate::{Error, Result};
use cudarc::driver::LaunchConfig;

/// Key head widths of the delta-rule kernel variants (`gdn_delta_k*`, `gdn_chunked_k*`): a
/// head of `dk` takes the smallest that holds it.
pub const DELTA_KEY_DIMS: [usize; 3] = [32, 64, 128];

/// Tokens per chunk of the chunked kernel (`GDN_CHUNK` in gdn.cu).
const CHUNK: usize = 64;

/// Threads of a chunked-kernel block (`GDN_CHUNK_THREADS` in gdn.cu).
const CHUNK_THREADS: u32 = 256;

/// Shared memory of the chunked kernel for key heads of the `dk` variant: queries and keys
/// (rows padded by one), W, A, intra, U, the state slice and four per-token values.
pub fn chunk_smem_bytes(dk: usize) -> usize {
    4 * (2 * CHUNK * (dk + 1) + CHUNK * dk + 2 * CHUNK * CHUNK + CHUNK * 32 + dk * 32 + 4 * CHUNK)
}

/// `LATTICE_CUDA_GDN=sequential` runs prompts token by token too (to measure the chunked form).
fn chunked_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("LATTICE_CUDA_GDN").map_or(true, |v| v != "sequential"))
}

/// One GDN layer's launch: where its inputs are and which sequences it covers.
pub struct GdnLaunch<'a> {
    /// The layer's projection [rows, ld]: conv inputs (`conv_dim` columns), then z, then b and
    /// a (`n_v_heads` each) from column `bcol`.
    pub proj: &'a Buf,
    /// Values per projection row.
    pub ld: usize,
    /// First column of b.
    pub bcol: usize,
    /// Convolution weight [conv_dim, kernel].
    pub conv_w: &'a Buf,
    /// Convolution kernel size.
    pub kernel: usize,
    /// `exp(A_log)` [n_v_heads].
    pub a_log_exp: &'a Buf,
    /// `dt_bias` [n_v_heads].
    pub dt_bias: &'a Buf,
    /// The head layout.
    pub heads: GdnHeads,
    /// Every sequence's state block address.
    pub states: &'a [u64],
    /// Each sequence's first row, then the total (states.len() + 1 values).
    pub cu: &'a [i32],
    /// The layer's window and matrices within each block (values from its start).
    pub conv_off: usize,
    /// See `conv_off`.
    pub rec_off: usize,
}

impl CudaDevice {
    /// A GDN layer's convolution and delta rule over `l.cu`'s rows: returns the outputs
    /// [rows, value_dim] (before the gated norm); the states advance in place.
    pub fn gdn_layer(&self, l: &GdnLaunch<'_>) -> Result<Buf> {
        let h = l.heads;
        let (kd, vd) = (h.key_dim(), h.value_dim());
        let conv_dim = 2 * kd + vd;
        let rows = *l.cu.last().unwrap_or(&0) as usize;
        let n_seqs = l.states.len();
        let variant = DELTA_KEY_DIMS
            .iter()
            .position(|&d| h.k_dim <= d)
            .ok_or_else(|| {
                Error::Device(format!(
                    "cuda: Gated DeltaNet key heads of {} dimensions (at most 128)",
                    h.k_dim
                ))
            })?;
        assert!(
            l.cu.len() == n_seqs + 1
                && l.proj.len() >= rows * l.ld
                && l.bcol + 2 * h.n_v_heads <= l.ld
                && conv_dim <= l.ld
                && l.conv_w.len() >= conv_dim * l.kernel
                && l.a_log_exp.len() >= h.n_v_heads
                && l.dt_bias.len() >= h.n_v_heads
                && (1..=8).contains(&l.kernel)
                && h.n_v_heads.is_multiple_of(h.n_k_heads.max(1))
        );
        let mut mixed = self.alloc_buf(rows * conv_dim)?;
        let mut out = self.alloc_buf(rows * vd)?;
        if rows == 0 || n_seqs == 0 {
            return Ok(out);
        }
        let ps = self.input(Input::RecurrentStates, l.states)?;
        let pc = self.input(Input::SeqRows, l.cu)?;
        let (pp, pw, pm, po) = (
            self.ptr(l.proj),
            self.ptr(l.conv_w),
            self.mptr(&mut mixed),
            self.mptr(&mut out),
        );
        let (ld, cd, k, ns) = (l.ld as i32, conv_dim as i32, l.kernel as i32, n_seqs as i32);
        let (conv_off, rec_off) = (l.conv_off as i64, l.rec_off as i64);
        let mut b = self.args(&self.kernels().gdn_conv);
        b.arg(&pp)
            .arg(&ld)
            .arg(&pm)
            .arg(&pw)
            .arg(&ps)
            .arg(&conv_off)
            .arg(&pc)
            .arg(&ns)
            .arg(&cd)
            .arg(&k);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, conv_dim.div_ceil(128) as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: thread (c, t) reads rows t - kernel + 1 ..= t of column c < conv_dim of proj
        // from its sequence's first row on (rows * ld values, asserted), earlier ones from the
        // window of its sequence's block (the caller's offsets lie within every block), and
        // conv_w[c * kernel ..]; writes mixed[t * conv_dim + c].
        unsafe { self.go(&mut b, cfg, "gdn_conv") }?;

        let (pa, pd) = (self.ptr(l.a_log_exp), self.ptr(l.dt_bias));
        let (bcol, nk, nv) = (l.bcol as i32, h.n_k_heads as i32, h.n_v_heads as i32);
        let (dk, dv, tiled) = (h.k_dim as i32, h.v_dim as i32, i32::from(h.v_tiled));
        let q_scale = 1.0 / (h.k_dim as f32).sqrt();
        // A sequence with more new rows than a decode-like pass takes the chunked form (as the
        // CPU does), when its shared memory fits.
        let longest = l.cu.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0) as usize;
        let smem = chunk_smem_bytes(DELTA_KEY_DIMS[variant]);
        let chunked =
            longest > crate::attention::ROW_BY_ROW && smem <= self.max_smem() && chunked_enabled();
        let kernels = self.kernels();
        let f = if chunked {
            &kernels.gdn_chunked[variant]
        } else {
            &kernels.gdn_delta[variant]
        };
        let mut b = self.args(f);
        b.arg(&pm)
            .arg(&pp)
            .arg(&ld)
            .arg(&bcol)
            .arg(&po)
            .arg(&pa)
            .arg(&pd)
            .arg(&ps)
            .arg(&conv_off)
            .arg(&rec_off)
            .arg(&pc)
            .arg(&nk)
            .arg(&nv)
            .arg(&dk)
            .arg(&dv)
            .arg(&tiled)
            .arg(&q_scale)
            .arg(&k);
        let cfg = LaunchConfig {
            grid_dim: (
                h.v_dim.div_ceil(32) as u32,
                h.n_v_heads as u32,
                n_seqs as u32,
            ),
            // Token by token: a warp per 32 rows of the key width of the variant.
            block_dim: (
                if chunked {
                    CHUNK_THREADS
                } else {
                    DELTA_KEY_DIMS[variant] as u32
                },
                1,
                1,
            ),
            shared_mem_bytes: if chunked { smem as u32 } else { 0 },
        };
        // SAFETY: block (x, h, s) reads rows cu[s]..cu[s+1] of mixed (rows * conv_dim) and of
        // proj's b, a and conv-input columns (asserted within ld), a_log_exp[h], dt_bias[h], and
        // the [dk, dv] matrix of head h at rec_off in its sequence's block; writes out[t * vd +
        // h * dv + j] for its columns j < dv, that matrix, and its share of the sequence's
        // window at conv_off.
        unsafe { self.go(&mut b, cfg, "gdn_delta") }?;
        Ok(out)
    }

    /// Gated RMSNorm in place over x [rows * n_heads, dim]: `w ⊙ norm(x) ⊙ silu(z)`, z of row
    /// r and head h at `z[r * ld + z_col + h * dim ..]`.
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm_silu_gate(
        &self,
        x: &mut Buf,
        w: &Buf,
        z: &Buf,
        ld: usize,
        z_col: usize,
        rows: usize,
        n_heads: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        assert!(
            x.len() >= rows * n_heads * dim
                && w.len() >= dim
                && z_col + n_heads * dim <= ld
                && z.len() >= rows * ld
        );
        if rows * n_heads == 0 {
            return Ok(());
        }
        let (px, pw) = (self.mptr(x), self.ptr(w));
        let pz = self.ptr(z) + 4 * z_col as u64;
        let (ld_i, nh, d) = (ld as i32, n_heads as i32, dim as i32);
        let mut b = self.args(&self.kernels().rms_norm_silu_gate);
        b.arg(&px)
            .arg(&pw)
            .arg(&pz)
            .arg(&ld_i)
            .arg(&nh)
            .arg(&d)
            .arg(&eps);
        let threads = (dim.div_ceil(32) * 32).clamp(32, 256) as u32;
        // SAFETY: block i = r * n_heads + h touches x[i * dim ..][.. dim] and reads w[..dim]
        // and z[r * ld + z_col + h * dim ..][.. dim], all within the buffers (asserted).
        unsafe {
            self.go(
                &mut b,
                per_row(rows * n_heads, threads),
                "rms_norm_silu_gate",
            )
        }
    }

    /// x [n] *= sigmoid(gate [n]).
    pub fn sigmoid_gate(&self, x: &mut Buf, gate: &Buf, n: usize) -> Result<()> {
        assert!(x.len() >= n && gate.len() >= n);
        let (px, pg, n64) = (self.mptr(x), self.ptr(gate), n as i64);
        let mut b = self.args(&self.kernels().sigmoid_gate);
        b.arg(&px).arg(&pg).arg(&n64);
        // SAFETY: thread i < n touches x[i] and gate[i].
        unsafe { self.go(&mut b, grid_1d(n), "sigmoid_gate") }
    }

    /// x [rows, width] (per head a query then a gate of `hd`, `n_heads` heads, then `width -
    /// 2 n_heads hd` more columns) into (queries and the rest [rows, width - n_heads hd],
    /// gates [rows, n_heads hd]).
    pub fn split_query_gate(
        &self,
        x: &Buf,
        rows: usize,
        width: usize,
        n_heads: usize,
        hd: usize,
    ) -> Result<(Buf, Buf)> {
        let q_dim = n_heads * hd;
        assert!(x.len() >= rows * width && 2 * q_dim <= width);
        let mut qkv = self.alloc_buf(rows * (width - q_dim))?;
        let mut gate = self.alloc_buf(rows * q_dim)?;
        let n = rows * width;
        if n == 0 {
            return Ok((qkv, gate));
        }
        let (px, pq, pg) = (self.ptr(x), self.mptr(&mut qkv), self.mptr(&mut gate));
        let (nh, hd_i, w, n64) = (n_heads as i32, hd as i32, width as i32, n as i64);
        let mut b = self.args(&self.kernels().split_query_gate);
        b.arg(&px)
            .arg(&pq)
            .arg(&pg)
            .arg(&nh)
            .arg(&hd_i)
            .arg(&w)
            .arg(&n64);
        // SAFETY: thread i < rows * width reads x[i] and writes one value of row i / width of
        // qkv or gate, within their rows * (width - q_dim) and rows * q_dim values.
        unsafe { self.go(&mut b, grid_1d(n), "split_query_gate") }?;
        Ok((qkv, gate))
    }
}
