//! Causal depthwise 1-D convolution over time (the short convolution of Gated DeltaNet layers).

use crate::backend::cpu;

/// `out[t][c] = Σ_j weight[c][j] · x[t + j][c]` for the `n = rows − (kernel − 1)` newest rows of
/// `x` f32 [rows, channels], whose first `kernel − 1` rows are the window kept from earlier
/// tokens (zeros at the start of a sequence). `weight` is f32 [channels, kernel] (PyTorch's
/// `Conv1d(groups = channels)` weight without its middle axis). Returns f32 [n, channels].
pub fn causal_conv1d(x: &[f32], weight: &[f32], channels: usize, kernel: usize) -> Vec<f32> {
    debug_assert_eq!(weight.len(), channels * kernel);
    let rows = x.len() / channels.max(1);
    let n = rows.saturating_sub(kernel - 1);
    // Every value is written below (the first tap's product is added to 0.0, as before).
    let mut out = crate::tensor::host_scratch(n * channels);
    if n <= 1 {
        for (t, row) in out.chunks_exact_mut(channels).enumerate() {
            for (ch, o) in row.iter_mut().enumerate() {
                let w = &weight[ch * kernel..(ch + 1) * kernel];
                let mut acc = 0.0f32;
                for (j, &wj) in w.iter().enumerate() {
                    acc += wj * x[(t + j) * channels + ch];
                }
                *o = acc;
            }
        }
        return out;
    }
    // Several rows: tap-major weights [kernel, channels], so each row is `kernel` passes of
    // contiguous multiply-adds across the channels (the same sums, in the same order).
    let mut taps = vec![0.0f32; kernel * channels];
    for (ch, w) in weight.chunks_exact(kernel).enumerate() {
        for (j, &wj) in w.iter().enumerate() {
            taps[j * channels + ch] = wj;
        }
    }
    // Rows in parallel, 32 per task.
    const ROWS: usize = 32;
    cpu::par_chunks_mut(&mut out, ROWS * channels, n > ROWS, |i, rows| {
        for (r, row) in rows.chunks_exact_mut(channels).enumerate() {
            conv_row(row, &taps, x, i * ROWS + r, channels, kernel);
        }
    });
    out
}

/// Row `t` of the convolution over tap-major weights (see [`causal_conv1d`]), in blocks of
/// channels so that the output block stays in L1 across the taps.
fn conv_row(row: &mut [f32], taps: &[f32], x: &[f32], t: usize, channels: usize, kernel: usize) {
    const BLOCK: usize = 512;
    for c0 in (0..channels).step_by(BLOCK) {
        let c1 = (c0 + BLOCK).min(channels);
        for j in 0..kernel {
            let tap = &taps[j * channels + c0..j * channels + c1];
            let xr = &x[(t + j) * channels + c0..(t + j) * channels + c1];
            let out = row[c0..c1].iter_mut().zip(tap).zip(xr);
            if j == 0 {
                out.for_each(|((o, &w), &v)| *o = 0.0 + w * v);
            } else {
                out.for_each(|((o, &w), &v)| *o += w * v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_definition_with_a_window() {
        // 2 channels, kernel 3, window of 2 rows then 3 new rows.
        let x = [1.0, 10.0, 2.0, 20.0, 3.0, 30.0, 4.0, 40.0, 5.0, 50.0];
        let w = [1.0, 0.5, 0.25, 2.0, 0.0, -1.0];
        let out = causal_conv1d(&x, &w, 2, 3);
        assert_eq!(out.len(), 6);
        assert_eq!(out[0], 1.0 + 1.0 + 0.75); // 1·1 + 0.5·2 + 0.25·3
        assert_eq!(out[1], 20.0 - 30.0);
        assert_eq!(out[4], 3.0 + 2.0 + 1.25);
    }

    #[test]
    fn rows_at_once_equal_rows_one_at_a_time() {
        let (channels, kernel, rows) = (37, 4, 80);
        let val = |i: usize| ((i * 7919) % 113) as f32 / 56.0 - 1.0;
        let x: Vec<f32> = (0..rows * channels).map(val).collect();
        let w: Vec<f32> = (0..channels * kernel).map(|i| val(i + 5)).collect();
        let all = causal_conv1d(&x, &w, channels, kernel);
        for t in 0..rows - (kernel - 1) {
            let one = causal_conv1d(
                &x[t * channels..(t + kernel) * channels],
                &w,
                channels,
                kernel,
            );
            assert_eq!(one, all[t * channels..(t + 1) * channels]);
        }
    }
}
