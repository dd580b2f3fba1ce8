//! Causal depthwise 1-D convolution over time (the short convolution of Gated DeltaNet layers).

use crate::backend::cpu;

/// `out[t][c] = Σ_j weight[c][j] · r[t + j][c]` over the rows `r` = the `kernel − 1` rows of
/// `window` (kept from earlier tokens: zeros at the start of a sequence) followed by the `n`
/// rows of `x`, whose rows are `ld` values apart (their first `channels` values are read: a
/// projection's leading columns in place). `weight` is f32 [channels, kernel] (PyTorch's
/// `Conv1d(groups = channels)` weight without its middle axis). Returns f32 [n, channels].
pub fn causal_conv1d(
    window: &[f32],
    x: &[f32],
    ld: usize,
    weight: &[f32],
    channels: usize,
    kernel: usize,
) -> Vec<f32> {
    debug_assert_eq!(weight.len(), channels * kernel);
    let kept = kernel.saturating_sub(1);
    debug_assert_eq!(window.len(), kept * channels);
    let n = if x.len() < channels {
        0
    } else {
        (x.len() - channels) / ld.max(1) + 1
    };
    let row = |r: usize| -> &[f32] {
        if r < kept {
            &window[r * channels..(r + 1) * channels]
        } else {
            &x[(r - kept) * ld..][..channels]
        }
    };
    // Every value is written below (the taps' products are added to 0.0, in tap order).
    let mut out = crate::tensor::host_scratch(n * channels);
    if n <= 1 {
        for (t, o_row) in out.chunks_exact_mut(channels).enumerate() {
            for (ch, o) in o_row.iter_mut().enumerate() {
                let w = &weight[ch * kernel..(ch + 1) * kernel];
                let mut acc = 0.0f32;
                for (j, &wj) in w.iter().enumerate() {
                    acc += wj * row(t + j)[ch];
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
    // Rows in parallel, 32 per task; within a task, a block of channels over all its rows, so
    // that the block's taps and the `kernel` input rows it slides over stay in L1.
    const ROWS: usize = 32;
    const BLOCK: usize = 512;
    cpu::par_chunks_mut(&mut out, ROWS * channels, n > ROWS, |i, rows| {
        for c0 in (0..channels).step_by(BLOCK) {
            let c1 = (c0 + BLOCK).min(channels);
            for (r, o_row) in rows.chunks_exact_mut(channels).enumerate() {
                let o_row = &mut o_row[c0..c1];
                o_row.fill(0.0);
                for j in 0..kernel {
                    let tap = &taps[j * channels + c0..j * channels + c1];
                    cpu::add_product(o_row, tap, &row(i * ROWS + r + j)[c0..c1]);
                }
            }
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_definition_with_a_window() {
        // 2 channels, kernel 3, window of 2 rows then 3 new rows.
        let x = [1.0, 10.0, 2.0, 20.0, 3.0, 30.0, 4.0, 40.0, 5.0, 50.0];
        let w = [1.0, 0.5, 0.25, 2.0, 0.0, -1.0];
        let out = causal_conv1d(&x[..4], &x[4..], 2, &w, 2, 3);
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
        let kept = (kernel - 1) * channels;
        let all = causal_conv1d(&x[..kept], &x[kept..], channels, &w, channels, kernel);
        for t in 0..rows - (kernel - 1) {
            let one = causal_conv1d(
                &x[t * channels..t * channels + kept],
                &x[t * channels + kept..(t + kernel) * channels],
                channels,
                &w,
                channels,
                kernel,
            );
            assert_eq!(one, all[t * channels..(t + 1) * channels]);
        }
    }
}
