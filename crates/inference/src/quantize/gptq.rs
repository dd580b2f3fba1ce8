//! GPTQ (Frantar et al., arXiv 2210.17323): a layer's weights are rounded one input column at a
//! time, and each column's rounding error is spread over the columns not yet rounded so that
//! the layer's outputs on calibration inputs move least: the error is weighted by the upper
//! Cholesky factor of `H⁻¹`, `H = Σ x xᵀ` over the layer's calibration input rows `x`.
//!
//! [`Hessians`] collects `H` per layer as an [`InputProbe`] while a model runs calibration
//! text; [`quantize_matrix`] rounds a matrix into Q4_0 / Q4_1 blocks with it. As in the GPTQ
//! reference: `H` is damped by 1% of its mean diagonal, columns no input ever reached are
//! zeroed, columns are processed in batches of 128 with the error of a batch applied to the
//! later columns as one product, and each block's parameters (scale, minimum) are chosen when
//! the rounding reaches the block, from the weights as the earlier errors left them (here by
//! the least-squares search of [`super::search`], then fixed for the block's 32 values).
//! Output rows are independent given `H`, so they are processed in parallel.

use std::sync::{Mutex, RwLock};

use faer::linalg::matmul::matmul;
use faer::{Accum, Mat, MatMut, MatRef, Par, Side};

use super::search::{Q4Params, BLOCK};
use crate::ops::InputProbe;
use crate::quant::QuantType;
use crate::{Error, Result};

/// Columns rounded before their error is applied to the later columns as one product.
const BATCH: usize = 128;

/// Fraction of the mean diagonal added to `H`'s diagonal (GPTQ's `percdamp`).
const DAMP: f64 = 0.01;

/// One layer's calibration statistics.
#[derive(Debug)]
struct Site {
    /// The tensors that read this input (e.g. `blk.0.attn_q`, `blk.0.attn_k`, `blk.0.attn_v`).
    names: Vec<String>,
    dim: usize,
    /// `Σ x xᵀ` (row-major `[dim, dim]`, allocated at the first rows) and the number of rows
    /// summed.
    sum: Mutex<(Vec<f64>, u64)>,
}

/// The input Hessians `H = Σ x xᵀ` of every layer a model loaded with this probe runs.
#[derive(Debug, Default)]
pub struct Hessians {
    sites: RwLock<Vec<Site>>,
}

/// The mean `x xᵀ` over a layer's calibration rows.
#[derive(Debug, Clone)]
pub struct Hessian {
    /// Input features.
    pub dim: usize,
    /// Row-major `[dim, dim]`.
    pub values: Vec<f64>,
    /// Calibration rows it averages.
    pub rows: u64,
}

impl Hessians {
    /// An empty collection.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes the sums take once every registered layer has seen rows.
    pub fn bytes_needed(&self) -> usize {
        let sites = self.sites.read().unwrap_or_else(|e| e.into_inner());
        sites.iter().map(|s| s.dim * s.dim * 8).sum()
    }

    /// The Hessian of the input of tensor `name` (`blk.3.ffn_down`, without `.weight`), when a
    /// layer reading it ran at least one row.
    pub fn get(&self, name: &str) -> Option<Hessian> {
        let sites = self.sites.read().ok()?;
        let site = sites.iter().find(|s| s.names.iter().any(|n| n == name))?;
        let sum = site.sum.lock().ok()?;
        if sum.1 == 0 {
            return None;
        }
        let inv = 1.0 / sum.1 as f64;
        Some(Hessian {
            dim: site.dim,
            values: sum.0.iter().map(|v| v * inv).collect(),
            rows: sum.1,
        })
    }
}

impl InputProbe for Hessians {
    fn add_site(&self, names: Vec<String>, in_dim: usize) -> usize {
        let mut sites = self.sites.write().unwrap_or_else(|e| e.into_inner());
        sites.push(Site {
            names,
            dim: in_dim,
            sum: Mutex::new((Vec::new(), 0)),
        });
        sites.len() - 1
    }

    fn observe(&self, site: usize, x: &[f32], rows: usize) {
        let sites = self.sites.read().unwrap_or_else(|e| e.into_inner());
        let Some(site) = sites.get(site) else {
            return;
        };
        let dim = site.dim;
        if rows == 0 || x.len() != rows * dim {
            return;
        }
        // The rows' product in f32 (a few hundred rows), summed in f64 over the calibration.
        let xm = MatRef::from_row_major_slice(x, rows, dim);
        let mut xtx = Mat::<f32>::zeros(dim, dim);
        matmul(
            xtx.as_mut(),
            Accum::Replace,
            xm.transpose(),
            xm,
            1.0,
            Par::rayon(0),
        );
        let mut sum = site.sum.lock().unwrap_or_else(|e| e.into_inner());
        if sum.0.is_empty() {
            sum.0 = vec![0.0; dim * dim];
        }
        // H is symmetric: column j of the product is added as row j, in order.
        for (j, row) in sum.0.chunks_exact_mut(dim).enumerate() {
            for (acc, &v) in row.iter_mut().zip(xtx.col(j).iter()) {
                *acc += f64::from(v);
            }
        }
        sum.1 += rows as u64;
    }
}

/// Rounds `w` (row-major `[rows, h.dim]`) into Q4_0 or Q4_1 blocks with GPTQ over `h`;
/// returns the blocks (`rows` rows of `qt.row_bytes(h.dim)`).
pub fn quantize_matrix(qt: QuantType, w: &[f32], h: &Hessian) -> Result<Vec<u8>> {
    let n = h.dim;
    if !matches!(qt, QuantType::Q4_0 | QuantType::Q4_1)
        || n == 0
        || !n.is_multiple_of(BLOCK)
        || !w.len().is_multiple_of(n)
    {
        return Err(Error::InvalidInput(format!(
            "GPTQ rounds rows of whole {BLOCK}-value Q4_0 / Q4_1 blocks, not {} rows of {n} \
             values to {}",
            w.len() as f64 / n.max(1) as f64,
            qt.name()
        )));
    }
    let rows = w.len() / n;
    let mut w = w.to_vec();
    let u = inverse_factor(h, &mut w)?;
    let row_bytes = qt.block_bytes() * (n / BLOCK);
    let mut out = vec![0u8; rows * row_bytes];
    // Rows in chunks (each chunk runs the whole column sweep), in parallel.
    let chunk_rows = 32;
    let mut chunks: Vec<(&mut [f32], &mut [u8])> = w
        .chunks_mut(chunk_rows * n)
        .zip(out.chunks_mut(chunk_rows * row_bytes))
        .collect();
    crate::ops::par_map_mut(&mut chunks, true, |(wc, oc)| {
        sweep(qt, wc, n, &u, oc);
    });
    Ok(out)
}

/// The upper triangular `U` with `Uᵀ U = (H + λI)⁻¹` (row-major f32 `[n, n]`), `λ` = 1% of
/// the mean diagonal. Columns of `w` whose inputs were always zero are zeroed (and their
/// diagonal set to 1), as GPTQ does. Computed as `J L⁻¹ J` where `L Lᵀ = J H J` and `J`
/// reverses the order: one Cholesky factorization and one triangular inverse.
fn inverse_factor(h: &Hessian, w: &mut [f32]) -> Result<Vec<f32>> {
    let n = h.dim;
    let mut diag: Vec<f64> = (0..n).map(|i| h.values[i * n + i]).collect();
    for (i, d) in diag.iter_mut().enumerate() {
        if *d == 0.0 {
            *d = 1.0;
            for row in w.chunks_exact_mut(n) {
                row[i] = 0.0;
            }
        }
    }
    let mean = diag.iter().sum::<f64>() / n as f64;
    let mut damp = DAMP * mean;
    // A Hessian from few rows can be too close to singular for the first damping.
    for _ in 0..4 {
        let p = Mat::<f64>::from_fn(n, n, |i, j| {
            let (a, b) = (n - 1 - i, n - 1 - j);
            if a == b {
                diag[a] + damp
            } else {
                h.values[a * n + b]
            }
        });
        if let Ok(llt) = p.llt(Side::Lower) {
            let mut linv = Mat::<f64>::identity(n, n);
            llt.L().solve_lower_triangular_in_place(linv.as_mut());
            let mut u = vec![0f32; n * n];
            for i in 0..n {
                for j in i..n {
                    u[i * n + j] = linv[(n - 1 - i, n - 1 - j)] as f32;
                }
            }
            return Ok(u);
        }
        damp *= 10.0;
    }
    Err(Error::InvalidInput(format!(
        "GPTQ: the input Hessian ({n}×{n}, {} calibration rows) is not positive definite even \
         damped by {damp:.3e}; calibrate with more text",
        h.rows
    )))
}

/// GPTQ's column sweep over the rows `w` (row-major `[rows, n]`, updated in place), writing
/// their blocks into `out`.
fn sweep(qt: QuantType, w: &mut [f32], n: usize, u: &[f32], out: &mut [u8]) {
    let rows = w.len() / n;
    let bb = qt.block_bytes();
    let row_bytes = bb * (n / BLOCK);
    let mut params = vec![Q4Params::search(qt, &[0.0; BLOCK]); rows];
    let mut codes = vec![0u8; rows * BLOCK];
    let mut err = vec![0f32; rows * BATCH];
    for i1 in (0..n).step_by(BATCH) {
        let i2 = (i1 + BATCH).min(n);
        let width = i2 - i1;
        for i in i1..i2 {
            let g = i % BLOCK;
            if g == 0 {
                for (r, p) in params.iter_mut().enumerate() {
                    *p = Q4Params::search(qt, &w[r * n + i..r * n + i + BLOCK]);
                }
            }
            let u_row = &u[i * n..(i + 1) * n];
            let d = u_row[i];
            for r in 0..rows {
                let row = &mut w[r * n..(r + 1) * n];
                let (code, value) = params[r].code(row[i]);
                codes[r * BLOCK + g] = code;
                let e = (row[i] - value) / d;
                err[r * BATCH + (i - i1)] = e;
                for (x, &uj) in row[i + 1..i2].iter_mut().zip(&u_row[i + 1..i2]) {
                    *x -= e * uj;
                }
            }
            if g == BLOCK - 1 {
                let b = i / BLOCK;
                for (r, p) in params.iter().enumerate() {
                    let dst = &mut out[r * row_bytes + b * bb..r * row_bytes + (b + 1) * bb];
                    p.write(&codes[r * BLOCK..(r + 1) * BLOCK], dst);
                }
            }
        }
        if i2 < n {
            // w[:, i2..] -= err[:, ..width] · U[i1..i2, i2..]
            let e = MatRef::from_row_major_slice_with_stride(&err, rows, width, BATCH);
            let ub = MatRef::from_row_major_slice(&u[i1 * n..i2 * n], width, n);
            let wm = MatMut::from_row_major_slice_mut(w, rows, n);
            matmul(
                wm.subcols_mut(i2, n - i2),
                Accum::Add,
                e,
                ub.subcols(i2, n - i2),
                -1.0,
                Par::Seq,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize_row;

    /// A deterministic pseudo-random stream in [-1, 1).
    fn noise(seed: u64, n: usize) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// `Σ_rows (w − q) H (w − q)ᵀ`: the output error GPTQ minimizes.
    fn output_error(w: &[f32], q: &[f32], h: &Hessian) -> f64 {
        let n = h.dim;
        let mut total = 0.0;
        for (wr, qr) in w.chunks_exact(n).zip(q.chunks_exact(n)) {
            let d: Vec<f64> = wr.iter().zip(qr).map(|(a, b)| f64::from(a - b)).collect();
            for i in 0..n {
                for j in 0..n {
                    total += d[i] * h.values[i * n + j] * d[j];
                }
            }
        }
        total
    }

    #[test]
    fn gptq_lowers_the_output_error_of_correlated_inputs() {
        // 160 inputs (5 blocks and a partial batch of columns) mixing 20 latent features, so
        // H is far from diagonal; 37 rows (an odd chunk).
        let (n, rows, samples, latent) = (160, 37, 600, 20);
        let mix = noise(1, latent * n);
        let z = noise(2, samples * latent);
        let mut x = vec![0f32; samples * n];
        for s in 0..samples {
            for j in 0..n {
                let v: f32 = (0..latent)
                    .map(|k| z[s * latent + k] * mix[k * n + j])
                    .sum();
                x[s * n + j] = v + 0.05 * noise(3 + s as u64, 1)[0];
            }
        }
        let hs = Hessians::new();
        let site = hs.add_site(vec!["blk.0.ffn_down".into()], n);
        for chunk in x.chunks(n * 128) {
            hs.observe(site, chunk, chunk.len() / n);
        }
        let h = hs.get("blk.0.ffn_down").expect("observed");
        assert_eq!(h.rows, samples as u64);
        let w = noise(9, rows * n);
        for qt in [QuantType::Q4_0, QuantType::Q4_1] {
            let decode = |bytes: &[u8]| {
                let mut q = vec![0f32; rows * n];
                let rb = qt.row_bytes(n).unwrap();
                for (r, out) in q.chunks_exact_mut(n).enumerate() {
                    dequantize_row(qt, &bytes[r * rb..(r + 1) * rb], out).unwrap();
                }
                q
            };
            let gptq = decode(&quantize_matrix(qt, &w, &h).unwrap());
            let mut rtn_bytes = vec![0u8; rows * qt.row_bytes(n).unwrap()];
            for (r, dst) in rtn_bytes
                .chunks_exact_mut(qt.row_bytes(n).unwrap())
                .enumerate()
            {
                super::super::search::quantize_row_searched(qt, &w[r * n..(r + 1) * n], dst);
            }
            let rtn = decode(&rtn_bytes);
            let (eg, er) = (output_error(&w, &gptq, &h), output_error(&w, &rtn, &h));
            assert!(eg < 0.7 * er, "{}: GPTQ {eg} vs rounding {er}", qt.name());
        }
    }

    #[test]
    fn the_factor_inverts_the_damped_hessian() {
        let n = 64;
        let a = noise(4, n * n);
        // H = A Aᵀ / n + I: positive definite.
        let mut values = vec![0f64; n * n];
        for i in 0..n {
            for j in 0..n {
                let dot: f32 = (0..n).map(|k| a[i * n + k] * a[j * n + k]).sum();
                values[i * n + j] = f64::from(dot) / n as f64 + if i == j { 1.0 } else { 0.0 };
            }
        }
        let h = Hessian {
            dim: n,
            values: values.clone(),
            rows: 1,
        };
        let u = inverse_factor(&h, &mut []).unwrap();
        let mean = (0..n).map(|i| values[i * n + i]).sum::<f64>() / n as f64;
        // (H + λI) · Uᵀ U = I
        for i in 0..n {
            for j in 0..n {
                let mut v = 0.0f64;
                for k in 0..n {
                    let hk = values[i * n + k] + if i == k { DAMP * mean } else { 0.0 };
                    let utu: f64 = (0..n)
                        .map(|m| f64::from(u[m * n + k]) * f64::from(u[m * n + j]))
                        .sum();
                    v += hk * utu;
                }
                let want = if i == j { 1.0 } else { 0.0 };
                assert!((v - want).abs() < 1e-4, "({i}, {j}): {v}");
                if j < i {
                    assert_eq!(u[i * n + j], 0.0, "upper triangular");
                }
            }
        }
    }
}
