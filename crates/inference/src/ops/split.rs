//! Column groups of packed rows: splitting a fused projection's output (Q | K | V, a query |
//! gate pair per head, ...) into one buffer per group, and taking or writing back one column
//! range (e.g. one head) of every row.

use std::ops::Range;

use crate::backend::cpu;
use crate::tensor::{host_scratch, Storage, Tensor};
use crate::{Error, Result};

/// A gated query projection's output `x` [rows, n_heads * 2 head_dim + rest] (per head a query
/// then a gate of `head_dim`, then `rest` more columns, e.g. keys and values) into (queries
/// followed by the rest [rows, n_heads * head_dim + rest], gates [rows, n_heads * head_dim]),
/// on `x`'s device.
pub fn split_query_gate(x: &Tensor, n_heads: usize, head_dim: usize) -> Result<(Tensor, Tensor)> {
    let (rows, width, q_dim) = (x.rows(), x.cols(), n_heads * head_dim);
    if 2 * q_dim > width || head_dim == 0 {
        return Err(Error::Shape {
            op: "split_query_gate",
            reason: format!("rows of {width} for {n_heads} query/gate heads of {head_dim}"),
        });
    }
    match x.storage() {
        Storage::Cpu(v) => {
            let rest = width - 2 * q_dim;
            let mut qkv = host_scratch(rows * (width - q_dim));
            let mut gate = host_scratch(rows * q_dim);
            for h in (0..n_heads).filter(|_| rows > 0) {
                let at = h * 2 * head_dim;
                let q_ld = width - q_dim;
                cpu::copy_rows(
                    &v[at..],
                    width,
                    &mut qkv[h * head_dim..],
                    q_ld,
                    rows,
                    head_dim,
                );
                let g = &v[at + head_dim..];
                cpu::copy_rows(g, width, &mut gate[h * head_dim..], q_dim, rows, head_dim);
            }
            if rest > 0 && rows > 0 {
                cpu::copy_rows(
                    &v[2 * q_dim..],
                    width,
                    &mut qkv[q_dim..],
                    width - q_dim,
                    rows,
                    rest,
                );
            }
            Ok((
                Tensor::cpu(rows, width - q_dim, qkv),
                Tensor::cpu(rows, q_dim, gate),
            ))
        }
        #[cfg(feature = "cuda")]
        Storage::Cuda(s) => {
            let (qkv, gate) = s
                .dev
                .split_query_gate(&s.buf, rows, width, n_heads, head_dim)?;
            Ok((
                Tensor::cuda(&s.dev, rows, width - q_dim, qkv),
                Tensor::cuda(&s.dev, rows, q_dim, gate),
            ))
        }
    }
}

/// Splits every row of `x` (rows of `widths.iter().sum()` values) into `N` column groups:
/// group `i` holds columns of width `widths[i]` of every row, in row order, f32
/// [n, widths[i]]. A "row" may be narrower than a token: `[head_dim, head_dim]` splits
/// per-head (query, gate) pairs into queries and gates.
pub fn split_columns<const N: usize>(x: &[f32], widths: [usize; N]) -> [Vec<f32>; N] {
    let width: usize = widths.iter().sum();
    assert!(
        width > 0 && x.len().is_multiple_of(width),
        "split_columns: {} values are not rows of {width}",
        x.len()
    );
    let mut col = 0;
    widths.map(|w| {
        let part = take_columns(x, width, col..col + w);
        col += w;
        part
    })
}

/// Columns `cols` of every row of `x` (rows of `width`): f32 [n, cols.len()].
pub fn take_columns(x: &[f32], width: usize, cols: Range<usize>) -> Vec<f32> {
    assert!(
        cols.end <= width && x.len().is_multiple_of(width),
        "take_columns: columns {cols:?} of {} values in rows of {width}",
        x.len()
    );
    let (n, w) = (x.len() / width, cols.len());
    let mut out = host_scratch(n * w);
    cpu::copy_rows(
        x.get(cols.start..).unwrap_or_default(),
        width,
        &mut out,
        w,
        n,
        w,
    );
    out
}

/// Writes `part` (rows of `cols.len()`) into columns `cols` of the rows of `x` (rows of
/// `width`, as many as `part` has): the inverse of [`take_columns`].
pub fn put_columns(x: &mut [f32], width: usize, cols: Range<usize>, part: &[f32]) {
    let w = cols.len();
    assert!(
        cols.end <= width && w > 0 && part.len() / w * width <= x.len(),
        "put_columns: {} values into columns {cols:?} of {} values in rows of {width}",
        part.len(),
        x.len()
    );
    let dst = x.get_mut(cols.start..).unwrap_or_default();
    cpu::copy_rows(part, w, dst, width, part.len() / w, w);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_take_and_put_agree() {
        // Two rows of widths 2 | 1 | 3.
        let x: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let [a, b, c] = split_columns(&x, [2, 1, 3]);
        assert_eq!(a, [0.0, 1.0, 6.0, 7.0]);
        assert_eq!(b, [2.0, 8.0]);
        assert_eq!(c, [3.0, 4.0, 5.0, 9.0, 10.0, 11.0]);
        assert_eq!(take_columns(&x, 6, 3..6), c);
        let mut y = vec![0.0f32; 12];
        put_columns(&mut y, 6, 0..2, &a);
        put_columns(&mut y, 6, 2..3, &b);
        put_columns(&mut y, 6, 3..6, &c);
        assert_eq!(y, x);
    }
}
