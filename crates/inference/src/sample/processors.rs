//! Logit processors: the steps between a model's raw logits and the draw.
//!
//! Each step is a plain function over a logits buffer or a candidate list so that it can be tested
//! on hand-computed cases. The order they run in is fixed by [`super::Sampler::sample`]. Every
//! exponential goes through [`exp_neg`], plain IEEE arithmetic (no FMA, no platform libm), and
//! every sum runs in a fixed order in `f64`, so the same inputs give the same result on any
//! machine.

use super::SamplingParams;

/// `e^x` for `x <= 0` (the only range the sampler needs, after subtracting the maximum), within
/// about 2 ulp of the true value; `0` below -87 (where `f32` would go subnormal), for `-inf` and
/// for NaN. Pure arithmetic on bits, so results are identical on every machine.
#[inline]
pub fn exp_neg(x: f32) -> f32 {
    // Branch-free so that loops over it vectorize: NaN and everything below the cutoff compute
    // on a clamped input and are replaced by 0 at the end.
    let live = x > -87.0;
    let xc = if live { x.min(0.0) } else { -87.0 };
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75; // ln 2 split in two so that k * LN2_HI is exact
    const LN2_LO: f32 = 1.428_606_8e-6;
    // 1.5 * 2^23: adding it rounds to an integer held in the low mantissa bits (ulp 1 there).
    const ROUND: f32 = 12_582_912.0;
    let kr = xc * LOG2E + ROUND;
    let k = kr - ROUND; // in [-126, 0]
    let ki = (kr.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let r = (xc - k * LN2_HI) - k * LN2_LO; // |r| <= 0.35
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    let scale = f32::from_bits(((ki + 127) as u32) << 23);
    if live {
        p * scale
    } else {
        0.0
    }
}

/// Sum of `xs` in a fixed order: eight `f64` lanes (vectorizable, deterministic because the lane
/// assignment is fixed), then the lanes in order.
pub fn sum_lanes(xs: &[f32]) -> f64 {
    let mut lanes = [0f64; 8];
    let mut chunks = xs.chunks_exact(8);
    for c in &mut chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l += x as f64;
        }
    }
    let mut total: f64 = lanes.iter().sum();
    for &x in chunks.remainder() {
        total += x as f64;
    }
    total
}

/// The largest value (NaN ignored), `-inf` for an empty slice; eight lanes.
pub fn max_lanes(xs: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut chunks = xs.chunks_exact(8);
    for c in &mut chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l = if x > *l { x } else { *l };
        }
    }
    let mut m = f32::NEG_INFINITY;
    for &x in lanes.iter().chain(chunks.remainder()) {
        m = if x > m { x } else { m };
    }
    m
}

/// The log-softmax normalizer of a logits vector, with NaN and infinite logits given a meaning:
/// NaN counts as `-inf` (probability 0); if any logit is `+inf`, the `+inf` logits share all of
/// the probability equally and every other token gets 0.
#[derive(Clone, Copy, Debug)]
pub struct LogNorm {
    /// The largest logit (NaN ignored); `+inf` when some logit is `+inf`.
    max: f32,
    /// `ln sum(exp(x - max))` over the sanitized logits (the count of `+inf` logits in inf mode).
    ln_sum: f64,
}

impl LogNorm {
    /// Computes the normalizer of `logits` in two passes (max, then a fixed-order sum).
    pub fn new(logits: &[f32]) -> Self {
        let max = max_lanes(logits);
        if max == f32::INFINITY {
            let n_inf = logits.iter().filter(|&&x| x == f32::INFINITY).count();
            return LogNorm {
                max,
                ln_sum: libm::log(n_inf as f64),
            };
        }
        if max == f32::NEG_INFINITY {
            return LogNorm {
                max,
                ln_sum: f64::INFINITY,
            };
        }
        LogNorm {
            max,
            ln_sum: libm::log(sum_exp_shifted(logits, max)),
        }
    }

    /// The log-probability of a token whose raw logit is `x`: `x - logsumexp(logits)`, with the
    /// meanings above for NaN / `+inf`; `-inf` when every logit is `-inf` or NaN.
    pub fn logprob(&self, x: f32) -> f32 {
        if x.is_nan() || self.max == f32::NEG_INFINITY {
            f32::NEG_INFINITY
        } else if self.max == f32::INFINITY {
            if x == f32::INFINITY {
                (-self.ln_sum) as f32
            } else {
                f32::NEG_INFINITY
            }
        } else {
            ((x - self.max) as f64 - self.ln_sum) as f32
        }
    }

    /// True when some logit is `+inf` (see the type's doc).
    pub fn inf_mode(&self) -> bool {
        self.max == f32::INFINITY
    }
}

/// `sum(exp(x - max))` in a fixed order: blocks of 1024 exponentials go through a stack buffer
/// (so the exp loop vectorizes) and are summed with [`sum_lanes`], block after block.
fn sum_exp_shifted(xs: &[f32], max: f32) -> f64 {
    let mut buf = [0f32; 1024];
    let mut total = 0f64;
    for block in xs.chunks(buf.len()) {
        let b = &mut buf[..block.len()];
        for (o, &x) in b.iter_mut().zip(block) {
            *o = exp_neg(x - max);
        }
        total += sum_lanes(b);
    }
    total
}

/// Copies `logits` into `out` with NaN turned into `-inf`; in inf mode (some `+inf`), `+inf`
/// becomes `0` and everything else `-inf`, which is the limit distribution.
pub fn sanitize_into(logits: &[f32], inf_mode: bool, out: &mut Vec<f32>) {
    out.clear();
    if inf_mode {
        out.extend(logits.iter().map(|&x| {
            if x == f32::INFINITY {
                0.0
            } else {
                f32::NEG_INFINITY
            }
        }));
    } else {
        out.extend(
            logits
                .iter()
                .map(|&x| if x.is_nan() { f32::NEG_INFINITY } else { x }),
        );
    }
}

/// Applies the history penalties to `logits` in place: first the repetition penalty (Hugging
/// Face `RepetitionPenaltyLogitsProcessor`: a token seen anywhere in `history`, prompt included,
/// has its logit divided by the penalty when positive and multiplied by it when negative), then
/// the OpenAI presence and frequency penalties over the generated tokens only, `history[prompt_len..]`
/// (`logit -= presence * [count > 0] + frequency * count`, as OpenAI and vLLM count them).
/// Ids in `history` outside the vocabulary are ignored. `counts` and `entries` are scratch
/// buffers; `counts` is left all zero.
pub fn apply_penalties(
    logits: &mut [f32],
    history: &[u32],
    prompt_len: usize,
    params: &SamplingParams,
    counts: &mut Vec<u32>,
    entries: &mut Vec<(u32, f32)>,
) {
    let rep = penalty_entries(history, prompt_len, params, logits.len(), counts, entries);
    apply_penalty_entries(logits, rep, entries);
}

/// [`apply_penalties`] as data, for applying where the logits are: returns the repetition
/// penalty (1 when off) and fills `entries` with every distinct id of `history` below `vocab`,
/// in order of first appearance, with the amount subtracted after the repetition penalty
/// (`presence + frequency * count` over the generated ids, 0 for an id only in the prompt).
/// `entries` is left empty when every penalty is off; `counts` is scratch, left all zero.
pub fn penalty_entries(
    history: &[u32],
    prompt_len: usize,
    params: &SamplingParams,
    vocab: usize,
    counts: &mut Vec<u32>,
    entries: &mut Vec<(u32, f32)>,
) -> f32 {
    entries.clear();
    let rep = params.repetition_penalty;
    let rep = if rep.is_finite() && rep > 0.0 {
        rep
    } else {
        1.0
    };
    let pres = if params.presence_penalty.is_finite() {
        params.presence_penalty
    } else {
        0.0
    };
    let freq = if params.frequency_penalty.is_finite() {
        params.frequency_penalty
    } else {
        0.0
    };
    if rep == 1.0 && pres == 0.0 && freq == 0.0 {
        return 1.0;
    }
    if counts.len() < vocab {
        counts.resize(vocab, 0);
    }
    // counts[i] = 0: not seen; else 1 + occurrences among the generated tokens.
    for (k, &id) in history.iter().enumerate() {
        let i = id as usize;
        if i >= vocab {
            continue;
        }
        if counts[i] == 0 {
            entries.push((id, 0.0));
            counts[i] = 1;
        }
        if k >= prompt_len {
            counts[i] += 1;
        }
    }
    for e in entries.iter_mut() {
        let i = e.0 as usize;
        let generated = counts[i] - 1;
        if generated > 0 {
            e.1 = pres + freq * generated as f32;
        }
        counts[i] = 0;
    }
    rep
}

/// Applies [`penalty_entries`]' result: for each entry's id, `x / rep` when `x > 0` else
/// `x * rep`, then minus the entry's amount. Ids outside `logits` are ignored.
pub fn apply_penalty_entries(logits: &mut [f32], rep: f32, entries: &[(u32, f32)]) {
    for &(id, sub) in entries {
        if let Some(x) = logits.get_mut(id as usize) {
            let y = if *x > 0.0 { *x / rep } else { *x * rep };
            *x = y - sub;
        }
    }
}

/// Index of the largest value, ties to the lowest index; 0 when the slice is empty or holds
/// nothing above `-inf`. One vectorized pass over blocks of 1024, then a scan of the winning block.
pub fn argmax(xs: &[f32]) -> usize {
    const BLOCK: usize = 1024;
    let block_max: Vec<f32> = xs.chunks(BLOCK).map(max_lanes).collect();
    let m = max_lanes(&block_max);
    if m == f32::NEG_INFINITY {
        return 0;
    }
    let b = block_max.iter().position(|&x| x == m).unwrap_or(0);
    let block = &xs[b * BLOCK..xs.len().min((b + 1) * BLOCK)];
    b * BLOCK + block.iter().position(|&x| x == m).unwrap_or(0)
}

/// Orders candidates best first: higher logit, then lower id. A total order on finite logits
/// (`-0` counts as `0`), so every selection and sort built on it has one answer whatever the
/// algorithm.
#[inline]
pub fn better(logits: &[f32], a: u32, b: u32) -> std::cmp::Ordering {
    (logits[b as usize] + 0.0)
        .total_cmp(&(logits[a as usize] + 0.0))
        .then(a.cmp(&b))
}

/// Fractional bits of a weight's fixed-point [`units`].
pub const UNIT_BITS: u32 = 40;

/// A weight in `[0, 1]` as an integer count of `2^-40`, rounded down: the sums of the top-p
/// filter and of the draw add these, so they are exact and the same in any order (on a GPU as
/// on the CPU); a weight below `2^-40` of the best token's counts as 0 and is never drawn.
#[inline]
pub fn units(w: f32) -> u64 {
    (w as f64 * (1u64 << UNIT_BITS) as f64) as u64
}

/// Keeps the `k` best candidates (by [`better`]) and returns them sorted by id. `k == 0` or
/// `k >= len` keeps everything.
pub fn top_k(logits: &[f32], cand: &mut Vec<u32>, k: usize) {
    if k == 0 || k >= cand.len() {
        return;
    }
    if k <= SMALL_K && cand.len() == logits.len() {
        let best = best_k(logits, k);
        cand.clear();
        cand.extend(best.into_iter().map(|(_, id)| id));
    } else {
        cand.select_nth_unstable_by(k - 1, |&a, &b| better(logits, a, b));
        cand.truncate(k);
    }
    cand.sort_unstable();
}

/// Up to this k, [`best_k`]'s single pass beats a selection over the whole vocabulary.
pub const SMALL_K: usize = 256;

/// The `k` best `(value, id)` of `xs` (no NaN) by [`better`]'s order, best first, in one pass
/// that keeps a sorted list (cheap for small `k`: later values rarely beat the k-th best).
pub fn best_k(xs: &[f32], k: usize) -> Vec<(f32, u32)> {
    let mut best: Vec<(f32, u32)> = Vec::with_capacity(k + 1);
    if k == 0 {
        return best;
    }
    const BLOCK: usize = 64;
    for (b, block) in xs.chunks(BLOCK).enumerate() {
        // Whole blocks that cannot enter the list are skipped after one vectorized max.
        if best.len() == k && max_lanes(block) <= best[k - 1].0 {
            continue;
        }
        for (j, &x) in block.iter().enumerate() {
            // Ids come in increasing order, so an equal value never beats one already kept.
            if best.len() == k && x <= best[k - 1].0 {
                continue;
            }
            let at = best.partition_point(|&(y, _)| y >= x);
            best.insert(at, (x, (b * BLOCK + j) as u32));
            best.truncate(k);
        }
    }
    best
}

/// Unnormalized probabilities of the candidates at temperature `t`: `exp((logit - max) / t)`,
/// written to `weights` in candidate order. `max` is the best candidate logit.
pub fn weights_into(logits: &[f32], cand: &[u32], max: f32, t: f32, weights: &mut Vec<f32>) {
    weights.clear();
    if cand.len() == logits.len() {
        // Every token is a candidate (ids 0..n in order): no gather.
        weights.extend(logits.iter().map(|&x| exp_neg((x - max) / t)));
    } else {
        weights.extend(
            cand.iter()
                .map(|&id| exp_neg((logits[id as usize] - max) / t)),
        );
    }
}

/// Nucleus (top-p) filter: keeps the smallest set of best candidates whose mass reaches `p` of
/// the total (at least one); on return `cand` and `weights` hold the kept candidates in id
/// order. Masses are sums of [`units`]: the set is the shortest best-first prefix whose sum
/// `s` has `s as f64 >= p as f64 * total as f64`.
///
/// Only the head of the distribution is sorted: a histogram over the weights' float bits (32
/// bins per octave, monotonic in the weight) finds the bin where the mass is reached; the
/// candidates from one bin below it upward are gathered, sorted, and scanned exactly. If that
/// prefix falls short of the mass (a weight out of order by an ulp), everything is sorted.
pub fn top_p(logits: &[f32], cand: &mut Vec<u32>, weights: &mut Vec<f32>, p: f32) {
    let total: u64 = weights.iter().map(|&w| units(w)).sum();
    let target = p as f64 * total as f64;
    let bin = |w: f32| (w.to_bits() >> 18) as usize;
    let top_bin = bin(1.0);
    let mut hist = vec![0u64; top_bin + 1];
    for &w in weights.iter() {
        hist[bin(w).min(top_bin)] += units(w);
    }
    let mut acc = 0u64;
    let mut cut = 0;
    for b in (0..hist.len()).rev() {
        acc += hist[b];
        if acc as f64 >= target {
            cut = b;
            break;
        }
    }
    let cut = cut.saturating_sub(1);
    let cmp = |a: &(u32, f32), b: &(u32, f32)| better(logits, a.0, b.0);
    let mut head: Vec<(u32, f32)> = cand
        .iter()
        .zip(weights.iter())
        .filter(|(_, &w)| bin(w) >= cut)
        .map(|(&id, &w)| (id, w))
        .collect();
    head.sort_unstable_by(cmp);
    let mut keep = nucleus_len(&head, target);
    if keep.is_none() && head.len() < cand.len() {
        head = cand.iter().copied().zip(weights.iter().copied()).collect();
        head.sort_unstable_by(cmp);
        keep = nucleus_len(&head, target);
    }
    head.truncate(keep.unwrap_or(head.len()).max(1));
    head.sort_unstable_by_key(|&(id, _)| id);
    cand.clear();
    weights.clear();
    for (id, w) in head {
        cand.push(id);
        weights.push(w);
    }
}

/// Length of the shortest prefix of `sorted` (best first) whose [`units`] reach `target`.
fn nucleus_len(sorted: &[(u32, f32)], target: f64) -> Option<usize> {
    let mut acc = 0u64;
    for (j, &(_, w)) in sorted.iter().enumerate() {
        acc += units(w);
        if acc as f64 >= target {
            return Some(j + 1);
        }
    }
    None
}

/// Min-p filter: drops candidates whose probability is below `min_p` times the best one's. The
/// weights are relative to the best candidate (which has weight 1), so this compares weights
/// directly; the best candidate always stays.
pub fn min_p(cand: &mut Vec<u32>, weights: &mut Vec<f32>, min_p: f32) {
    let mut kept = 0;
    for j in 0..cand.len() {
        if weights[j] >= min_p || weights[j] == 1.0 {
            cand[kept] = cand[j];
            weights[kept] = weights[j];
            kept += 1;
        }
    }
    cand.truncate(kept);
    weights.truncate(kept);
}

/// Draws one candidate with probability proportional to its weight's [`units`], from a uniform
/// `u` in `[0, 1)`: with `total` the units' sum and `r = min(u × total, total − 1)` (in `f64`,
/// rounded down), the first candidate, in the order given, whose running sum of units exceeds
/// `r`. Integer sums make it exact: blocks of 256 are summed first, then the one block that
/// holds `r` is scanned. The first candidate when every weight is below one unit.
pub fn draw(cand: &[u32], weights: &[f32], u: f64) -> u32 {
    const BLOCK: usize = 256;
    let block_sums: Vec<u64> = weights
        .chunks(BLOCK)
        .map(|b| b.iter().map(|&w| units(w)).sum())
        .collect();
    let total: u64 = block_sums.iter().sum();
    if total == 0 {
        return cand.first().copied().unwrap_or(0);
    }
    let r = ((u * total as f64) as u64).min(total - 1);
    let mut acc = 0u64;
    for (b, &bs) in block_sums.iter().enumerate() {
        if r < acc + bs {
            for (j, &w) in weights.iter().enumerate().skip(b * BLOCK) {
                acc += units(w);
                if r < acc {
                    return cand[j];
                }
            }
        }
        acc += bs;
    }
    // Not reached (r < total, so some block holds it).
    cand.last().copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_neg_matches_std_within_2ulp_relative() {
        let mut x = -86.9f32;
        while x <= 0.0 {
            let want = (x as f64).exp();
            let got = exp_neg(x) as f64;
            assert!(((got - want) / want).abs() < 3e-7, "x={x}: {got} vs {want}");
            x += 0.013;
        }
        assert_eq!(exp_neg(0.0), 1.0);
        assert_eq!(exp_neg(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_neg(f32::NAN), 0.0);
        assert_eq!(exp_neg(-100.0), 0.0);
    }

    #[test]
    fn lognorm_handles_nan_and_inf() {
        let n = LogNorm::new(&[0.0, 0.0, f32::NAN]);
        assert!((n.logprob(0.0) - (0.5f32).ln()).abs() < 1e-6);
        assert_eq!(n.logprob(f32::NAN), f32::NEG_INFINITY);
        let n = LogNorm::new(&[1.0, f32::INFINITY, f32::INFINITY]);
        assert!(n.inf_mode());
        assert!((n.logprob(f32::INFINITY) - (0.5f32).ln()).abs() < 1e-6);
        assert_eq!(n.logprob(1.0), f32::NEG_INFINITY);
        let n = LogNorm::new(&[f32::NEG_INFINITY, f32::NAN]);
        assert_eq!(n.logprob(f32::NEG_INFINITY), f32::NEG_INFINITY);
    }

    #[test]
    fn argmax_and_best_k_match_naive_with_ties() {
        // Few distinct values, so ties cross block boundaries; -inf mixed in.
        let mut s = 1u64;
        for n in [0usize, 1, 63, 64, 65, 1023, 1024, 1025, 5000] {
            let xs: Vec<f32> = (0..n)
                .map(|_| {
                    s = s.wrapping_mul(6364136223846793005).wrapping_add(1);
                    match (s >> 60) % 8 {
                        0 => f32::NEG_INFINITY,
                        v => v as f32 * 0.5,
                    }
                })
                .collect();
            let naive = xs
                .iter()
                .enumerate()
                .fold(
                    (0, f32::NEG_INFINITY),
                    |b, (i, &x)| if x > b.1 { (i, x) } else { b },
                );
            assert_eq!(argmax(&xs), naive.0, "n={n}");
            let mut order: Vec<u32> = (0..n as u32).collect();
            order.sort_by(|&a, &b| better(&xs, a, b));
            for k in [1usize, 5, 70, 300] {
                let got: Vec<u32> = best_k(&xs, k).into_iter().map(|(_, id)| id).collect();
                assert_eq!(got, order[..k.min(n)].to_vec(), "n={n} k={k}");
            }
        }
        assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), 0);
    }

    #[test]
    fn draw_picks_by_cumulative_weight() {
        let cand = [3, 5, 9];
        let w = [1.0, 2.0, 1.0];
        assert_eq!(draw(&cand, &w, 0.0), 3);
        assert_eq!(draw(&cand, &w, 0.26), 5);
        assert_eq!(draw(&cand, &w, 0.74), 5);
        assert_eq!(draw(&cand, &w, 0.76), 9);
        assert_eq!(draw(&cand, &w, 0.999_999_999), 9);
    }
}
