//! Perplexity of a decoder over a long token stream, with the semantics of llama.cpp's
//! `llama-perplexity` (its default mode), so the two compare on the same GGUF file and text:
//!
//! - the whole text is tokenized once (with the model's BOS when it adds one); it is cut into
//!   `tokens / ctx` chunks of `ctx` tokens (at most `max_chunks`), each run from an empty state;
//! - with a BOS, the chunk's first token is replaced by it;
//! - only the second half of each chunk is scored: the logits at positions `ctx / 2 ..= ctx - 2`
//!   predict the tokens after them, so every scored token has at least `ctx / 2` of context;
//! - the log-probability of each target is the log-softmax of the raw logits (maximum in f32,
//!   the sum of `exp` in f64, as llama.cpp does), perplexity = exp(mean negative
//!   log-likelihood), and its ± is llama.cpp's: ppl · sqrt(var(nll) / (count − 1)).
//!
//! This module owns the chunking and the scoring; the caller tokenizes and loads the model.

use crate::model::batch::{ForwardBatch, RowOutputs};
use crate::model::decoder::Decoder;
use crate::state::SeqState;
use crate::{Error, Result};

/// How to cut and score the stream.
#[derive(Debug, Clone, Copy)]
pub struct PerplexityOptions {
    /// Tokens per chunk (llama-perplexity's `-c`).
    pub ctx: usize,
    /// Score at most this many chunks (llama-perplexity's `--chunks`); `None`: all.
    pub max_chunks: Option<usize>,
    /// The token that replaces each chunk's first token (the model's BOS, when it adds one).
    pub bos: Option<u32>,
}

/// The result of [`perplexity`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct Perplexity {
    /// exp(mean negative log-likelihood) over every scored token.
    pub ppl: f64,
    /// The ± llama.cpp prints beside it.
    pub ppl_error: f64,
    /// Mean negative log-likelihood (nats per token).
    pub nll: f64,
    /// Tokens scored.
    pub scored: usize,
    /// Chunks run.
    pub chunks: usize,
    /// Tokens in the whole stream.
    pub tokens: usize,
    /// The running perplexity after each chunk (llama.cpp's `[i]ppl` list).
    pub running: Vec<f64>,
}

/// One target's log-probability under `logits`, as llama.cpp's `log_softmax`: the maximum in
/// f32, the sum of `exp(l - max)` (f32 `exp`) in f64.
pub fn log_prob(logits: &[f32], target: usize) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from((l - max).exp())).sum();
    f64::from(logits[target] - max) - sum.ln()
}

/// Runs `decoder` over the chunks of `tokens` (see the module doc), each from a fresh state
/// made by `new_state(ctx)`, calling `on_chunk(done, total, running_ppl)` after each.
pub fn perplexity(
    decoder: &dyn Decoder,
    new_state: impl Fn(usize) -> SeqState,
    tokens: &[u32],
    opts: &PerplexityOptions,
    mut on_chunk: impl FnMut(usize, usize, f64),
) -> Result<Perplexity> {
    let ctx = opts.ctx;
    let info = decoder.info();
    let max_ctx = info.config.max_positions;
    if ctx < 4 || (max_ctx > 0 && ctx > max_ctx) {
        return Err(Error::InvalidInput(format!(
            "the perplexity context must be 4..={max_ctx} tokens (the model's context), got {ctx}"
        )));
    }
    if tokens.len() < 2 * ctx {
        return Err(Error::InvalidInput(format!(
            "the text tokenizes to {} tokens; a context of {ctx} needs at least {}",
            tokens.len(),
            2 * ctx
        )));
    }
    let vocab = info.config.vocab_size;
    if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(Error::InvalidInput(format!(
            "token id {bad} is outside the model's vocabulary of {vocab}"
        )));
    }
    let chunks = (tokens.len() / ctx).min(opts.max_chunks.unwrap_or(usize::MAX));
    if chunks == 0 {
        return Err(Error::InvalidInput("--chunks must be at least 1".into()));
    }
    let first = ctx / 2;
    let rows = ctx - 1 - first;
    let flags: Vec<bool> = (0..ctx).map(|p| p >= first && p < ctx - 1).collect();
    let (mut nll, mut nll2, mut count) = (0.0f64, 0.0f64, 0usize);
    let mut running = Vec::with_capacity(chunks);
    let mut ids = vec![0u32; ctx];
    for c in 0..chunks {
        let start = c * ctx;
        let chunk = &tokens[start..start + ctx];
        ids.copy_from_slice(chunk);
        if let Some(b) = opts.bos {
            ids[0] = b;
        }
        let mut state = new_state(ctx);
        let batch = ForwardBatch::tokens(&ids, &[ctx], RowOutputs::Logits(flags.clone()));
        let logits = decoder.forward_batch(&batch, &mut [&mut state])?;
        if logits.len() != rows * vocab {
            return Err(Error::Shape {
                op: "perplexity",
                reason: format!(
                    "the model returned {} logits for {rows} rows of {vocab}",
                    logits.len()
                ),
            });
        }
        for (r, row) in logits.chunks_exact(vocab).enumerate() {
            let v = log_prob(row, chunk[first + r + 1] as usize);
            nll -= v;
            nll2 += v * v;
        }
        count += rows;
        let ppl = (nll / count as f64).exp();
        running.push(ppl);
        on_chunk(c + 1, chunks, ppl);
    }
    let mean = nll / count as f64;
    let var = nll2 / count as f64 - mean * mean;
    let ppl = mean.exp();
    let ppl_error = if var > 0.0 && count > 1 {
        (var / (count - 1) as f64).sqrt() * ppl
    } else {
        0.0
    };
    Ok(Perplexity {
        ppl,
        ppl_error,
        nll: mean,
        scored: count,
        chunks,
        tokens: tokens.len(),
        running,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_prob_is_a_log_softmax() {
        let l = [1.0f32, 2.0, 3.0, -1.0];
        let z: f64 = l.iter().map(|&x| f64::from(x).exp()).sum();
        for t in 0..4 {
            let want = f64::from(l[t]) - z.ln();
            assert!((log_prob(&l, t) - want).abs() < 1e-6, "{t}");
        }
        // Large logits do not overflow.
        let big = [1000.0f32, 1000.0];
        assert!((log_prob(&big, 0) + std::f64::consts::LN_2).abs() < 1e-9);
    }
}
