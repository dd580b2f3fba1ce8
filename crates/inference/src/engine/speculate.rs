//! Speculative decoding without a draft model: where drafts come from ([`Drafter`]: prompt
//! lookup here, the tokens that followed the latest earlier occurrence of the sequence's last
//! few tokens; suffix matches in `suffix.rs`) and the adaptive draft length of a sequence. The
//! batch engine verifies a draft in the same forward pass as the other sequences' steps (one
//! row per drafted token) and keeps the longest prefix the model itself would have chosen
//! (greedy: outputs are unchanged) or that the rejection rule keeps (sampling: the output
//! distribution is unchanged).

/// Where a request's drafts come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Drafter {
    /// Prompt lookup ([`ngram_draft`]).
    #[default]
    Ngram,
    /// The longest suffix match in the request's history and the outputs of earlier requests,
    /// the continuation chosen by frequency ([`super::suffix::suffix_draft`]).
    Suffix,
}

/// Tokens of earlier outputs an engine keeps for suffix drafts (about 16 bytes each).
pub const SUFFIX_CACHE_TOKENS: usize = 1 << 18;

/// Most tokens per draft: a draft and the token before it must attend row by row in the
/// verifying pass (see [`crate::attention::ROW_BY_ROW`]) for its logits to equal decode's.
pub const MAX_DRAFT: usize = crate::attention::ROW_BY_ROW - 1;

/// Longest suffix of the history that is looked up.
const MAX_NGRAM: usize = 3;

/// Shortest suffix that is looked up (see [`ngram_draft`]).
const MIN_NGRAM: usize = 2;

/// The draft after `history`: for n = 3, then 2, the latest earlier occurrence of the last n
/// tokens and up to `max` tokens that followed it (empty when nothing matches; 1-token matches
/// drafted mostly wrong tokens: Qwen2.5-Coder answering over a passage kept 17 of 45 with them,
/// 34 of 45 without).
pub fn ngram_draft(history: &[u32], max: usize) -> Vec<u32> {
    let len = history.len();
    if max == 0 {
        return Vec::new();
    }
    for n in (MIN_NGRAM..=MAX_NGRAM.min(len.saturating_sub(1))).rev() {
        let suffix = &history[len - n..];
        // Latest match first: recent text predicts the next tokens best.
        for start in (0..len - n).rev() {
            if &history[start..start + n] == suffix {
                let from = start + n;
                let to = (from + max).min(len);
                if from < to {
                    return history[from..to].to_vec();
                }
            }
        }
    }
    Vec::new()
}

/// A sequence's draft length: starts at `max`, halves after a draft with nothing accepted and
/// grows back by one per fully accepted draft, so text that does not repeat stops paying for
/// rejected rows (a length of 0 drafts again after `RETRY` steps). It also estimates the
/// chance that a drafted token is kept once the ones before it were (for [`StepCost`]).
#[derive(Debug, Clone, Copy)]
pub struct DraftLength {
    max: usize,
    now: usize,
    idle: usize,
    /// Drafted tokens the model looked at (each kept one, and the first rejected one).
    tried: usize,
    /// Of those, kept.
    kept: usize,
}

/// Steps without drafting before a sequence whose drafts failed tries a 1-token draft again.
const RETRY: usize = 16;

impl DraftLength {
    /// Up to `max` tokens per draft (0: off; at most [`MAX_DRAFT`]).
    pub fn new(max: usize) -> Self {
        let max = max.min(MAX_DRAFT);
        Self {
            max,
            now: max,
            idle: 0,
            tried: 0,
            kept: 0,
        }
    }

    /// The estimated chance that a drafted token is kept when the ones before it were
    /// (kept / tried, starting from one of each in two).
    pub fn acceptance(&self) -> f64 {
        (self.kept + 1) as f64 / (self.tried + 2) as f64
    }

    /// The longest draft whose last token still pays at `threshold` ([`StepCost::threshold`]):
    /// the largest `d` with acceptance^d ≥ threshold (every length when the threshold is 0).
    pub fn paying(&self, threshold: f64) -> usize {
        let a = self.acceptance();
        if threshold <= 0.0 {
            return MAX_DRAFT;
        }
        let mut d = 0;
        let mut p = a;
        while d < MAX_DRAFT && p >= threshold {
            d += 1;
            p *= a;
        }
        d
    }

    /// Tokens to draft this step.
    pub fn next(&mut self) -> usize {
        if self.max == 0 {
            return 0;
        }
        if self.now == 0 {
            self.idle += 1;
            if self.idle >= RETRY {
                self.idle = 0;
                self.now = 1;
            }
        }
        self.now
    }

    /// Records that `accepted` of `drafted` tokens were kept.
    pub fn update(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        self.kept += accepted;
        self.tried += (accepted + 1).min(drafted);
        if accepted == 0 {
            self.now /= 2;
        } else if accepted == drafted {
            self.now = (self.now + 1).min(self.max);
        } else {
            self.now = accepted.max(1).min(self.max);
        }
    }
}

/// What a step's forward pass costs, fitted online as `secs = base + per_row * rows` over recent
/// steps (least squares, older steps weighing less), so the engine drafts only what pays: on
/// a few CPU cores a decode step streams the weights (`base`) and extra rows cost little
/// until the batch becomes compute-bound, when each row costs nearly what a decode token does.
#[derive(Debug, Clone, Default)]
pub struct StepCost {
    /// Decayed sums: weight, x, y, x², xy (x = rows, y = seconds).
    w: f64,
    x: f64,
    y: f64,
    xx: f64,
    xy: f64,
}

/// Step time (seconds) below which [`StepCost::threshold`] does not trust the fit.
const MIN_TIMED_STEP: f64 = 0.002;

/// How much each recorded step's weight decays per later step.
const DECAY: f64 = 0.99;

impl StepCost {
    /// Records a forward pass of `rows` rows that took `secs`.
    pub fn record(&mut self, rows: usize, secs: f64) {
        let x = rows as f64;
        for s in [
            &mut self.w,
            &mut self.x,
            &mut self.y,
            &mut self.xx,
            &mut self.xy,
        ] {
            *s *= DECAY;
        }
        self.w += 1.0;
        self.x += x;
        self.y += secs;
        self.xx += x * x;
        self.xy += x * secs;
    }

    /// `(base, per_row)` seconds, once steps of different sizes were seen.
    pub fn fit(&self) -> Option<(f64, f64)> {
        let var = self.xx * self.w - self.x * self.x;
        if self.w < 4.0 || var <= 1e-9 * self.xx * self.w {
            return None;
        }
        let per_row = (self.xy * self.w - self.x * self.y) / var;
        let base = (self.y - per_row * self.x) / self.w;
        (per_row >= 0.0 && base >= 0.0).then_some((base, per_row))
    }

    /// The least chance of being kept a drafted token needs to pay in a step that runs `rows`
    /// rows without drafts: its row's cost over the step's cost per token it yields,
    /// `per_row * rows / (base + per_row * rows)` (0 until the fit exists: draft freely).
    pub fn threshold(&self, rows: usize) -> f64 {
        match self.fit() {
            // Steps of a few milliseconds or less (tiny models) are timed mostly as noise and
            // drafts cost nothing measurable there: draft freely.
            Some((base, per_row)) if base + per_row * (rows as f64) < MIN_TIMED_STEP => 0.0,
            Some((base, per_row)) if rows > 0 => {
                let r = rows as f64;
                per_row * r / (base + per_row * r)
            }
            _ => 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drafts_follow_the_latest_match_of_the_longest_suffix() {
        // ... 1 2 3 [4 5] ... 1 2 3 -> 4 5 (3-gram), bounded by the history's end and `max`.
        let h = [9, 1, 2, 3, 4, 5, 7, 1, 2, 3];
        assert_eq!(ngram_draft(&h, 2), vec![4, 5]);
        assert_eq!(ngram_draft(&h, 10), vec![4, 5, 7, 1, 2, 3]);
        // The latest of two matches wins.
        let h = [1, 2, 8, 1, 2, 6, 1, 2];
        assert_eq!(ngram_draft(&h, 1), vec![6]);
        assert!(ngram_draft(&[1, 2, 3], 4).is_empty());
        assert!(ngram_draft(&[5, 5, 5], 0).is_empty());
        assert_eq!(ngram_draft(&[5, 5, 5], 3), vec![5]);
        // A single matching token is not enough (such drafts are mostly wrong).
        assert!(ngram_draft(&[7, 1, 8, 1], 3).is_empty());
    }

    #[test]
    fn the_draft_length_adapts_to_acceptance() {
        let mut d = DraftLength::new(8);
        assert_eq!(d.next(), 8);
        d.update(8, 0);
        assert_eq!(d.next(), 4);
        d.update(4, 2);
        assert_eq!(d.next(), 2);
        d.update(2, 2);
        assert_eq!(d.next(), 3);
        d.update(3, 0);
        d.update(1, 0);
        assert_eq!(d.next(), 0);
        for _ in 0..RETRY - 2 {
            assert_eq!(d.next(), 0);
        }
        assert_eq!(d.next(), 1);
        assert_eq!(DraftLength::new(0).next(), 0);
    }

    #[test]
    fn the_cost_model_fits_steps_and_drafts_what_pays() {
        let mut c = StepCost::default();
        assert_eq!(c.threshold(8), 0.0, "no fit yet: draft freely");
        // 30 ms to stream the weights, 2 ms per row.
        for rows in [1, 8, 512, 3, 16, 1, 100, 8] {
            c.record(rows, 0.030 + 0.002 * rows as f64);
        }
        let (base, per_row) = c.fit().unwrap();
        assert!((base - 0.030).abs() < 1e-9 && (per_row - 0.002).abs() < 1e-12);
        // One stream: a row costs 2 ms of a 32 ms step; 64 streams: 128 of 158 ms.
        assert!((c.threshold(1) - 0.0625).abs() < 1e-9);
        assert!((c.threshold(64) - 0.128 / 0.158).abs() < 1e-9);
        let mut d = DraftLength::new(10);
        d.update(10, 7); // 7 kept of 8 looked at
        assert!((d.acceptance() - 0.8).abs() < 1e-12);
        // 0.8^d >= 0.0625 up to d = 12; >= 0.81 for no d.
        assert_eq!(d.paying(c.threshold(1)), 12);
        assert_eq!(d.paying(c.threshold(64)), 0);
        assert_eq!(d.paying(0.0), MAX_DRAFT);
        // Sub-millisecond steps (tiny models) are not trusted: draft freely.
        let mut tiny = StepCost::default();
        for rows in [1, 8, 3, 16, 1, 2] {
            tiny.record(rows, 1e-5 * rows as f64);
        }
        assert!(tiny.fit().is_some());
        assert_eq!(tiny.threshold(1), 0.0);
    }
}
