//! Causal depthwise 1-D convolution over time (the short convolution of Gated DeltaNet layers).

/// `out[t][c] = Σ_j weight[c][j] · x[t + j][c]` for the `n = rows − (kernel − 1)` newest rows of
/// `x` f32 [rows, channels], whose first `kernel − 1` rows are the window kept from earlier
/// tokens (zeros at the start of a sequence). `weight` is f32 [channels, kernel] (PyTorch's
/// `Conv1d(groups = channels)` weight without its middle axis). Returns f32 [n, channels].
pub fn causal_conv1d(x: &[f32], weight: &[f32], channels: usize, kernel: usize) -> Vec<f32> {
    debug_assert_eq!(weight.len(), channels * kernel);
    let rows = x.len() / channels.max(1);
    let n = rows.saturating_sub(kernel - 1);
    let mut out = vec![0.0f32; n * channels];
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
        let out = causal_conv1d(&x, &w, 2, 3);
        assert_eq!(out.len(), 6);
        assert_eq!(out[0], 1.0 + 1.0 + 0.75); // 1·1 + 0.5·2 + 0.25·3
        assert_eq!(out[1], 20.0 - 30.0);
        assert_eq!(out[4], 3.0 + 2.0 + 1.25);
    }
}
