//! int8 weight matrices times int8 activations, with exact i32 sums: the products of the
//! encoders' `--q8` (weights quantized per output row, activations per input row, as ONNX
//! Runtime's dynamic quantization does per channel).
//!
//! This file owns [`Int8Matrix`] (the packed layout), its tile (`tile8`, generic over the
//! ternary tiles' vector vocabulary `TSimd`) and the per-row weight quantization
//! ([`Int8Matrix::quantize_rows`]). The tables, the selection and the threaded driver are the
//! ternary ones (`super::ternary`): both layouts are groups of 32 rows in 128-byte chunks.
//!
//! Layout: rows in groups of 32 (the last one padded), `k` padded to a multiple of 4. Chunk `c`
//! of a group holds columns `4c..4c + 4` of its 32 rows: row `R` at bytes
//! `64·(R / 16) + 4·(R % 16) + i` for column `4c + i`, each value `v` (-127..=127) stored as
//! the code `v + 128` (padding 128, value 0). One 64-byte load thus gives the 4 values of each
//! of 16 rows per 32-bit lane, lined up with 4 activation bytes that one broadcast puts in
//! every lane; `vpdpbusd` adds the 4 products of codes (u8) and activations (i8) into each
//! row's lane, and the tile subtracts `128 · Σ x` once at the end (AVX2 and the portable
//! tile multiply the signed values directly). 16 rows per instruction, no horizontal sums;
//! the matrix is read front to back in one stream.

use super::detect::Isa;
use super::ternary::{
    self, matmul_chunks, row_offset, Chunk, ChunkView, TKernel, TSimd, TTable, TileArgs, TileOut,
    CHUNK_BYTES, GROUP, HALF, MAX_MR, PREFETCH_CHUNKS,
};
use super::threads::OutPtr;
use super::Dequant;
use crate::{Error, Result};

/// Columns per chunk.
const CHUNK: usize = 4;
/// The code of value 0 (`code = value + 128`).
const ZERO_CODE: u8 = 128;

/// An int8 weight matrix `[n_rows, k]` (values -127..=127) in the kernel layout (see the
/// module documentation). `Debug` shows the shape, not the values.
#[derive(Clone)]
pub struct Int8Matrix {
    n: usize,
    k: usize,
    /// Chunks per group (`k` rounded up to a multiple of 4, over 4).
    nch: usize,
    /// `ceil(n / 32)` groups of `nch` chunks.
    data: Vec<Chunk>,
}

impl std::fmt::Debug for Int8Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (n, k) = (self.n, self.k);
        write!(
            f,
            "Int8Matrix {{ n_rows: {n}, k: {k}, packed_bytes: {} }}",
            self.packed_bytes()
        )
    }
}

impl Int8Matrix {
    /// From row-major values in -127..=127; any `n_rows >= 1` and `k >= 1`.
    ///
    /// Fails ([`Error::Shape`]) on a zero dimension or when `values` is not `n_rows · k` long,
    /// and ([`Error::InvalidInput`]) on -128 (the kernels need symmetric values).
    pub fn from_values(n_rows: usize, k: usize, values: &[i8]) -> Result<Self> {
        let op = "Int8Matrix::from_values";
        ternary::check_shape(op, n_rows, k, values.len())?;
        if let Some(i) = values.iter().position(|&v| v == i8::MIN) {
            return Err(Error::InvalidInput(format!(
                "{op}: value -128 at row {}, column {} (values must be in -127..=127)",
                i / k,
                i % k
            )));
        }
        let nch = k.div_ceil(CHUNK);
        let mut data = vec![Chunk([ZERO_CODE; CHUNK_BYTES]); n_rows.div_ceil(GROUP) * nch];
        let pack_group = |(g, chunks): (usize, &mut [Chunk])| {
            let rows = &values[g * GROUP * k..((g + 1) * GROUP).min(n_rows) * k];
            for (r, vals) in rows.chunks_exact(k).enumerate() {
                let o = row_offset(r);
                for (chunk, cols) in chunks.iter_mut().zip(vals.chunks(CHUNK)) {
                    for (i, &v) in cols.iter().enumerate() {
                        chunk.0[o + i] = (v as u8) ^ 0x80;
                    }
                }
            }
        };
        use rayon::prelude::*;
        data.par_chunks_mut(nch)
            .enumerate()
            .with_min_len(64)
            .for_each(pack_group);
        Ok(Int8Matrix {
            n: n_rows,
            k,
            nch,
            data,
        })
    }

    /// Quantizes the f32 rows `w` [n_rows, k] to int8, each row by its largest magnitude
    /// (`round_half_even(w · 127 / max|w|)`, as [`ternary::quantize_row_absmax`]); returns the
    /// matrix and each row's step (`max|w| / 127`: value · step ≈ weight). Fails as
    /// [`Int8Matrix::from_values`], and ([`Error::InvalidInput`]) on a row that is not finite.
    pub fn quantize_rows(w: &[f32], n_rows: usize, k: usize) -> Result<(Self, Vec<f32>)> {
        ternary::check_shape("Int8Matrix::quantize_rows", n_rows, k, w.len())?;
        let mut q = vec![0i8; w.len()];
        let scales = ternary::quantize_rows_absmax(w, n_rows, k, &mut q);
        if let Some(r) = scales.iter().position(|s| !s.is_finite() || *s == 0.0) {
            return Err(Error::InvalidInput(format!(
                "Int8Matrix::quantize_rows: row {r} holds a value that is not finite"
            )));
        }
        let steps = scales.iter().map(|s| s.recip()).collect();
        Ok((Self::from_values(n_rows, k, &q)?, steps))
    }

    /// Rows (output features).
    pub fn n_rows(&self) -> usize {
        self.n
    }

    /// Columns (input features).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Bytes of packed weights one product streams (`n_rows · k`, rows padded to a multiple
    /// of 32, columns to a multiple of 4).
    pub fn packed_bytes(&self) -> usize {
        self.data.len() * CHUNK_BYTES
    }

    /// Unpacks row `row` into `out` (`k` long).
    ///
    /// Panics if `row >= n_rows` or `out.len() != k` (a caller bug).
    pub fn row_values(&self, row: usize, out: &mut [i8]) {
        assert!(
            row < self.n && out.len() == self.k,
            "Int8Matrix::row_values: row {row} of {}, out is {} (want {})",
            self.n,
            out.len(),
            self.k
        );
        let (g, o) = (row / GROUP, row_offset(row % GROUP));
        for (c, cols) in out.chunks_mut(CHUNK).enumerate() {
            let bytes = &self.data[g * self.nch + c].0[o..o + CHUNK];
            for (v, &b) in cols.iter_mut().zip(bytes) {
                *v = (b ^ 0x80) as i8;
            }
        }
    }

    /// Integer products `sums[r·ldy + o] = Σ_c x[r·k + c] · w[o][c]` for `r < m`,
    /// `o < n_rows` (exact i32; nothing else of `sums` is written). `x` holds `m` rows of `k`
    /// int8 activations in -127..=127. Threaded over output rows (and activation-row tiles
    /// when there are few weight rows) on the rayon pool, with the best kernels for this CPU.
    ///
    /// Panics if `x.len() != m · k`, `ldy < n_rows`, `sums` is shorter than
    /// `(m − 1) · ldy + n_rows` or `x` holds -128 (a caller bug).
    pub fn matmul_i8(&self, x: &[i8], m: usize, sums: &mut [i32], ldy: usize) {
        self.run(ternary::table(), x, m, TileOut::Sums(sums, ldy));
    }

    /// [`Int8Matrix::matmul_i8`] with the kernels of a given instruction set (tests,
    /// benches); fails if this CPU does not support it. Panics as `matmul_i8`.
    pub fn matmul_i8_with(
        &self,
        isa: Isa,
        x: &[i8],
        m: usize,
        sums: &mut [i32],
        ldy: usize,
    ) -> Result<()> {
        let tab = ternary::table_for(isa).ok_or_else(|| {
            Error::InvalidInput(format!("instruction set {isa} not supported (int8)"))
        })?;
        self.run(tab, x, m, TileOut::Sums(sums, ldy));
        Ok(())
    }

    /// The product scaled back to real values, as `deq` says: `y[r·ldy + o] (+)= Σ_c x[r·k + c]
    /// · w[o][c] · deq.x_steps[r] · deq.w_steps[o] (+ deq.bias[o])`, then GELU if asked
    /// (see [`Dequant::gelu`]); each tile is finished, all its rows in one call, by the worker
    /// that computed it, while it is in cache.
    ///
    /// Panics if `x.len() != m · k`, `ldy < n_rows`, `y` is shorter than
    /// `(m − 1) · ldy + n_rows`, a step or bias slice has the wrong length or `x` holds -128
    /// (a caller bug).
    pub fn matmul_dequant(&self, x: &[i8], m: usize, deq: &Dequant<'_>, y: &mut [f32], ldy: usize) {
        let n = self.n;
        assert!(
            ldy >= n
                && (m == 0 || y.len() >= (m - 1) * ldy + n)
                && deq.x_steps.len() == m
                && deq.w_steps.len() == n
                && deq.bias.is_none_or(|b| b.len() == n),
            "Int8Matrix::matmul_dequant: y is {} with ldy {ldy}, {} row steps, {} weight steps \
             (m = {m}, n = {n})",
            y.len(),
            deq.x_steps.len(),
            deq.w_steps.len()
        );
        let out = OutPtr(y.as_mut_ptr());
        let kernels = super::kernels();
        let finish = |r0: usize, o0: usize, sums: &[i32], cols: usize| {
            let rows = sums.len() / GROUP;
            let mut dst: [&mut [f32]; MAX_MR] = std::array::from_fn(|r| {
                if r >= rows {
                    return &mut [][..];
                }
                // SAFETY: r0 + r < m and o0 + cols ≤ n ≤ ldy: inside `y` (checked above); the
                // driver hands each (row, group) over once, so no other worker touches these.
                unsafe { std::slice::from_raw_parts_mut(out.get().add((r0 + r) * ldy + o0), cols) }
            });
            let tile = Dequant {
                x_steps: &deq.x_steps[r0..r0 + rows],
                w_steps: &deq.w_steps[o0..],
                bias: deq.bias.map(|b| &b[o0..]),
                ..*deq
            };
            kernels.dequant_i32(&mut dst[..rows], sums, GROUP, &tile);
        };
        self.run(ternary::table(), x, m, TileOut::Sink(&finish));
    }

    /// [`Int8Matrix::matmul_i8`] on the AMX-INT8 tiles (tests, benches); fails where the CPU
    /// or the process has no AMX-INT8. Panics as `matmul_i8`.
    pub fn matmul_i8_amx(&self, x: &[i8], m: usize, sums: &mut [i32], ldy: usize) -> Result<()> {
        let tile = amx_tile(m, true).ok_or_else(|| {
            Error::InvalidInput("AMX-INT8 not available on this CPU or process".into())
        })?;
        self.run_with(tile, x, m, TileOut::Sums(sums, ldy));
        Ok(())
    }

    /// The product with `tab`'s vector tile, or the AMX-INT8 one where it pays.
    fn run(&self, tab: &TTable, x: &[i8], m: usize, out: TileOut<'_>) {
        let tile = amx_tile(m, false).unwrap_or((tab.kernel8, tab.mr8));
        self.run_with(tile, x, m, out)
    }

    fn run_with(&self, (kernel, mr): (TKernel, usize), x: &[i8], m: usize, out: TileOut<'_>) {
        let op = "Int8Matrix::matmul_i8";
        // (A fold, not `all`: it vectorizes.)
        let has_min = x.iter().fold(false, |a, &v| a | (v == i8::MIN));
        assert!(!has_min, "{op}: an activation is -128 (want -127..=127)");
        let view = ChunkView {
            n: self.n,
            k: self.k,
            nch: self.nch,
            cols: CHUNK,
            data: &self.data,
        };
        matmul_chunks(kernel, mr, view, 128, x, m, out, op);
    }
}

/// Activation rows from which the AMX tile is used (fewer would waste most of a tile).
const AMX_MIN_ROWS: usize = 16;

/// The AMX-INT8 tile and its height, for a product of `m` rows, where this CPU and process
/// have AMX-INT8 and `m` is at least [`AMX_MIN_ROWS`] (any `m` when `force`d).
fn amx_tile(m: usize, force: bool) -> Option<(TKernel, usize)> {
    #[cfg(target_arch = "x86_64")]
    if (force || m >= AMX_MIN_ROWS) && super::x86::amx::int8_available() {
        use super::x86::amx::{int8_tile, INT8_MR};
        return Some((int8_tile, INT8_MR));
    }
    let _ = (m, force);
    None
}

/// The int8 tile: one group (32 rows) times `MR` activation rows over the full depth; the two
/// 16-row halves of the group share each activation broadcast. `a.xsum` holds `128 · Σ x` of
/// each row (subtracted when the token multiplies codes, see [`TSimd::SIGNED8`]).
///
/// # Safety
/// `a.w` points at a group of `a.nch` chunks; `a.x` at `MR` rows of `4 · a.nch` bytes in
/// -127..=127 (`a.ldx` apart), `a.xsum` at `MR` sums; `a.out` has room for `MR` rows of 32 i32
/// (`a.ldo` apart).
#[inline(always)]
#[allow(clippy::needless_range_loop)] // one index walks several per-row arrays
pub(crate) unsafe fn tile8<S: TSimd, const MR: usize>(s: S, a: &TileArgs) {
    const G: usize = GROUP / HALF;
    // SAFETY (whole body): offsets stay inside the group and activation rows (contract).
    unsafe {
        // Vectors of fewer than 16 rows (AVX2) take each half in parts.
        for h in 0..HALF / S::ROWS {
            let lane = 4 * S::ROWS * h;
            let mut acc = [[s.zero(); MR]; G];
            for c in 0..a.nch {
                let ahead = a.w.wrapping_add(CHUNK_BYTES * (c + PREFETCH_CHUNKS));
                s.prefetch(ahead);
                s.prefetch(ahead.wrapping_add(64));
                let mut w = [s.zero(); G];
                for g in 0..G {
                    w[g] = s.load(a.w.add(CHUNK_BYTES * c + 64 * g + lane));
                }
                for r in 0..MR {
                    // Four activation bytes as one i32 (memory order).
                    let y = (a.x.add(r * a.ldx + CHUNK * c) as *const i32).read_unaligned();
                    for g in 0..G {
                        acc[g][r] = s.dot8(acc[g][r], w[g], y);
                    }
                }
            }
            for g in 0..G {
                for r in 0..MR {
                    let v = if S::SIGNED8 {
                        acc[g][r]
                    } else {
                        s.sub_splat(acc[g][r], *a.xsum.add(r))
                    };
                    s.store(a.out.add(r * a.ldo + HALF * g + S::ROWS * h), v);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::ternary::tests::{check_tables, reference, Rng};
    use super::*;

    impl Rng {
        /// Values in -127..=127.
        fn values(&mut self, n: usize) -> Vec<i8> {
            (0..n)
                .map(|_| ((self.next() % 255) as i32 - 127) as i8)
                .collect()
        }
    }

    /// [`check_tables`] for an int8 matrix of `w` and the activations `x`.
    fn check(w: &[i8], n: usize, k: usize, x: &[i8], m: usize, ldy: usize) {
        let t = Int8Matrix::from_values(n, k, w).expect("valid matrix");
        let want = reference(w, n, k, x, m);
        check_tables(&want, n, m, ldy, |isa, sums, ldy| {
            t.matmul_i8_with(isa, x, m, sums, ldy).expect("supported")
        });
    }

    #[test]
    fn every_isa_matches_the_definition_on_awkward_sizes() {
        let mut rng = Rng(0x9E37_79B9);
        for &k in &[1, 3, 5, 31, 64, 100, 257, 1000] {
            for &n in &[1, 5, 16, 17, 33] {
                for &m in &[1, 2, 5, 9] {
                    let w = rng.values(n * k);
                    let x = rng.values(m * k);
                    check(&w, n, k, &x, m, n);
                    check(&w, n, k, &x, m, n + 3);
                }
            }
        }
    }

    /// The AMX-INT8 tile against the definition: depth tails, partial groups, 1 to 40 rows
    /// (one and two A tiles, several tiles), an output stride. Skipped, saying so, without
    /// AMX-INT8.
    #[test]
    fn amx_tile_matches_the_definition() {
        let probe = Int8Matrix::from_values(1, 1, &[1]).expect("valid");
        if probe.matmul_i8_amx(&[1], 1, &mut [0], 1).is_err() {
            println!("SKIPPED: no AMX-INT8 on this CPU (or LATTICE_AMX=0)");
            return;
        }
        let mut rng = Rng(4711);
        for &k in &[1, 4, 63, 64, 65, 200, 384, 1536] {
            for &n in &[1, 17, 32, 70] {
                for &m in &[1, 5, 16, 17, 32, 40] {
                    let w = rng.values(n * k);
                    let x = rng.values(m * k);
                    let want = reference(&w, n, k, &x, m);
                    let t = Int8Matrix::from_values(n, k, &w).expect("valid");
                    let ldy = n + 2;
                    let mut sums = vec![i32::MIN; (m - 1) * ldy + n];
                    t.matmul_i8_amx(&x, m, &mut sums, ldy).expect("AMX");
                    for r in 0..m {
                        for o in 0..n {
                            assert_eq!(
                                sums[r * ldy + o] as i64,
                                want[r * n + o],
                                "AMX n {n} k {k} m {m}: row {r} col {o}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn threaded_splits_match_the_definition() {
        let mut rng = Rng(12345);
        // Many groups, one tile (split over groups); few groups, many rows (the tile grid);
        // many groups and rows in several L2 blocks.
        for &(n, k, m) in &[
            (600, 1000, 1),
            (40, 2000, 30),
            (70, 1000, 13),
            (200, 1536, 700),
        ] {
            let w = rng.values(n * k);
            let x = rng.values(m * k);
            check(&w, n, k, &x, m, n + 1);
        }
    }

    #[test]
    fn extreme_values_do_not_overflow_or_saturate() {
        let (n, k) = (19, 6000);
        let mut rng = Rng(7);
        // Rows: all +127, all -127, alternating, then random; activations likewise.
        let mut w = vec![127i8; k];
        w.extend(std::iter::repeat_n(-127i8, k));
        w.extend((0..k).map(|c| if c % 2 == 0 { 127 } else { -127 }));
        w.extend(rng.values((n - 3) * k));
        let mut x = vec![-127i8; k];
        x.extend(std::iter::repeat_n(127i8, k));
        x.extend((0..k).map(|c| if c % 2 == 0 { 127 } else { -127 }));
        check(&w, n, k, &x, 3, n);
        let t = Int8Matrix::from_values(n, k, &w).expect("valid");
        let mut sums = vec![0i32; 3 * n];
        t.matmul_i8(&x, 3, &mut sums, n);
        assert_eq!(sums[0], -127 * 127 * k as i32);
        assert_eq!(sums[n + 1], -127 * 127 * k as i32);
        assert_eq!(sums[2 * n + 2], 127 * 127 * k as i32);
    }

    #[test]
    fn from_values_rejects_bad_input() {
        for (n, k, len) in [
            (2, 3, 5),
            (2, 3, 7),
            (0, 3, 0),
            (3, 0, 0),
            (usize::MAX, 2, 4),
        ] {
            let r = Int8Matrix::from_values(n, k, &vec![0; len]);
            assert!(
                matches!(r, Err(Error::Shape { .. })),
                "{n} × {k}, {len} values"
            );
        }
        let mut v = vec![0i8; 6];
        v[4] = -128;
        let e = Int8Matrix::from_values(2, 3, &v).expect_err("-128");
        assert!(matches!(e, Error::InvalidInput(_)), "{e}");
        assert!(e.to_string().contains("row 1, column 1"), "{e}");
        let e = Int8Matrix::quantize_rows(&[1.0, f32::NAN, 0.0, 2.0], 2, 2).expect_err("NaN");
        assert!(e.to_string().contains("row 0"), "{e}");
        let e = Int8Matrix::quantize_rows(&[1.0, 2.0, f32::INFINITY, 2.0], 2, 2).expect_err("inf");
        assert!(e.to_string().contains("row 1"), "{e}");
    }

    #[test]
    #[should_panic(expected = "-128")]
    fn an_activation_of_minus_128_is_refused() {
        let t = Int8Matrix::from_values(1, 4, &[1, 2, 3, 4]).expect("valid");
        t.matmul_i8(&[0, -128, 0, 0], 1, &mut [0], 1);
    }

    #[test]
    fn row_values_round_trip_and_sizes() {
        let mut rng = Rng(99);
        for &(n, k) in &[(1, 1), (5, 3), (17, 31), (33, 257), (16, 64)] {
            let w = rng.values(n * k);
            let t = Int8Matrix::from_values(n, k, &w).expect("valid");
            assert_eq!((t.n_rows(), t.k()), (n, k));
            assert_eq!(t.packed_bytes(), n.div_ceil(32) * 32 * k.div_ceil(4) * 4);
            let mut row = vec![9i8; k];
            for r in 0..n {
                t.row_values(r, &mut row);
                assert_eq!(row, w[r * k..(r + 1) * k], "row {r} of {n} × {k}");
            }
        }
    }

    /// `matmul_dequant` against the integer definition scaled in f64: outputs with bias,
    /// accumulation and GELU, an output stride wider than the matrix, a partial last group.
    #[test]
    fn dequantized_products_match_the_definition() {
        let mut rng = Rng(31337);
        let (n, k, m, ldy) = (45, 70, 11, 50);
        let w = rng.values(n * k);
        let x = rng.values(m * k);
        let t = Int8Matrix::from_values(n, k, &w).expect("valid");
        let sums = reference(&w, n, k, &x, m);
        let x_steps: Vec<f32> = (0..m).map(|r| 0.01 + r as f32 * 1e-3).collect();
        let w_steps: Vec<f32> = (0..n).map(|o| 0.002 + o as f32 * 1e-4).collect();
        let bias: Vec<f32> = (0..n).map(|o| o as f32 * 0.01 - 0.2).collect();
        let gelu = |v: f64| 0.5 * v * (1.0 + erf(v / std::f64::consts::SQRT_2));
        for (accumulate, with_bias, with_gelu) in [
            (false, false, false),
            (true, true, false),
            (false, true, true),
        ] {
            let deq = Dequant {
                x_steps: &x_steps,
                w_steps: &w_steps,
                bias: with_bias.then_some(&bias[..]),
                accumulate,
                gelu: with_gelu,
            };
            let mut y = vec![0.5f32; (m - 1) * ldy + n];
            t.matmul_dequant(&x, m, &deq, &mut y, ldy);
            for r in 0..m {
                for o in 0..ldy.min(y.len() - r * ldy) {
                    let got = y[r * ldy + o] as f64;
                    if o >= n {
                        assert_eq!(got, 0.5, "wrote outside the output at {r}, {o}");
                        continue;
                    }
                    let mut want = sums[r * n + o] as f64 * x_steps[r] as f64 * w_steps[o] as f64;
                    if with_bias {
                        want += bias[o] as f64;
                    }
                    if accumulate {
                        want += 0.5;
                    }
                    if with_gelu {
                        want = gelu(want);
                    }
                    assert!(
                        (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                        "{accumulate} {with_bias} {with_gelu}: [{r}, {o}] {got} vs {want}"
                    );
                }
            }
        }
    }

    /// erf in f64, from the scalar reference's erfc.
    fn erf(x: f64) -> f64 {
        1.0 - crate::backend::cpu::scalar::erfc_f64(x)
    }

    #[test]
    fn quantized_rows_reconstruct_within_half_a_step() {
        let mut rng = Rng(4242);
        let (n, k) = (7, 301);
        let mut w: Vec<f32> = (0..n * k)
            .map(|_| (rng.next() as f32 / u32::MAX as f32 - 0.5) * 3.0)
            .collect();
        w[2 * k..3 * k].fill(0.0); // an all-zero row
        let (q, steps) = Int8Matrix::quantize_rows(&w, n, k).expect("finite");
        let mut row = vec![0i8; k];
        for (r, &step) in steps.iter().enumerate() {
            q.row_values(r, &mut row);
            let amax = w[r * k..(r + 1) * k]
                .iter()
                .fold(0f32, |a, v| a.max(v.abs()));
            assert!(row.iter().all(|&v| v != i8::MIN));
            if amax > 0.0 {
                assert!(row.iter().any(|&v| v.unsigned_abs() == 127), "row {r}");
            }
            for (c, &v) in row.iter().enumerate() {
                let err = (v as f32 * step - w[r * k + c]).abs();
                assert!(
                    err <= 0.5001 * step,
                    "row {r} col {c}: {err} vs step {step}"
                );
            }
        }
    }
}
