//! Sampling: distributions (chi-square against softmax), filters, penalties, determinism by
//! seed, greedy ties, non-finite logits, top logprobs and stop strings.

use lattice_inference::sample::processors;
use lattice_inference::sample::{
    top_logprobs, Sampled, Sampler, SamplingParams, StopMatcher, StopResult,
};

/// softmax(logits / t) in f64, with NaN as -inf.
fn softmax(logits: &[f32], t: f64) -> Vec<f64> {
    let xs: Vec<f64> = logits
        .iter()
        .map(|&x| {
            if x.is_nan() {
                f64::NEG_INFINITY
            } else {
                x as f64 / t
            }
        })
        .collect();
    let m = xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = xs.iter().map(|x| (x - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|x| x / s).collect()
}

fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
    let mut p = SamplingParams {
        seed: Some(7),
        ..SamplingParams::default()
    };
    f(&mut p);
    p
}

fn histogram(p: SamplingParams, logits: &[f32], n: usize) -> Vec<usize> {
    let mut s = Sampler::new(p);
    let mut h = vec![0usize; logits.len()];
    for _ in 0..n {
        h[s.sample(logits, &[], 0).token as usize] += 1;
    }
    h
}

/// Pearson chi-square of observed counts against expected probabilities (zero-probability
/// bins must be empty), asserted below `critical` (p = 0.001 for the degrees of freedom).
fn assert_chi_square(h: &[usize], probs: &[f64], critical: f64) {
    let n: usize = h.iter().sum();
    let mut chi = 0.0;
    for (&o, &p) in h.iter().zip(probs) {
        if p == 0.0 {
            assert_eq!(o, 0, "a token with probability 0 was drawn");
            continue;
        }
        let e = p * n as f64;
        chi += (o as f64 - e).powi(2) / e;
    }
    assert!(
        chi < critical,
        "chi-square {chi:.2} >= {critical} ({h:?} vs {probs:?})"
    );
}

const LOGITS8: [f32; 8] = [1.0, 2.0, 0.5, -1.0, 3.0, 2.5, 0.0, -0.5];
/// Chi-square critical values at p = 0.001 by degrees of freedom.
const CHI_CRIT: [f64; 8] = [0.0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32];

#[test]
fn temperature_one_matches_softmax() {
    for seed in [1, 2, 3] {
        let h = histogram(params(|p| p.seed = Some(seed)), &LOGITS8, 20_000);
        assert_chi_square(&h, &softmax(&LOGITS8, 1.0), CHI_CRIT[7]);
    }
}

#[test]
fn temperature_scales_the_distribution() {
    for t in [0.5f32, 2.0, 0.2] {
        let h = histogram(params(|p| p.temperature = t), &LOGITS8, 20_000);
        assert_chi_square(&h, &softmax(&LOGITS8, t as f64), CHI_CRIT[7]);
    }
    // A tiny temperature is greedy in effect, and must not overflow into NaN.
    let h = histogram(params(|p| p.temperature = 1e-30), &LOGITS8, 1000);
    assert_eq!(h[4], 1000);
    // A huge one is uniform.
    let h = histogram(params(|p| p.temperature = 1e30), &LOGITS8, 16_000);
    assert_chi_square(&h, &[0.125; 8], CHI_CRIT[7]);
}

/// Renormalized distribution over `keep`.
fn restricted(probs: &[f64], keep: &[usize]) -> Vec<f64> {
    let s: f64 = keep.iter().map(|&i| probs[i]).sum();
    (0..probs.len())
        .map(|i| if keep.contains(&i) { probs[i] / s } else { 0.0 })
        .collect()
}

#[test]
fn top_k_draws_only_the_k_best_in_proportion() {
    let h = histogram(params(|p| p.top_k = 3), &LOGITS8, 20_000);
    // The three best are ids 4 (3.0), 5 (2.5), 1 (2.0).
    assert_chi_square(
        &h,
        &restricted(&softmax(&LOGITS8, 1.0), &[4, 5, 1]),
        CHI_CRIT[2],
    );
    // Ties at the cut go to the lower id.
    let tied = [1.0f32, 2.0, 2.0, 2.0, 0.0];
    let h = histogram(params(|p| p.top_k = 2), &tied, 4000);
    assert_eq!((h[0], h[3], h[4]), (0, 0, 0), "{h:?}");
    assert!(h[1] > 1500 && h[2] > 1500, "{h:?}");
}

#[test]
fn top_p_keeps_the_smallest_nucleus() {
    // Probabilities 0.5, 0.3, 0.15, 0.05 (as logits).
    let probs = [0.5f64, 0.3, 0.15, 0.05];
    let logits: Vec<f32> = probs.iter().map(|p| p.ln() as f32).collect();
    let h = histogram(params(|p| p.top_p = 0.75), &logits, 20_000);
    assert_chi_square(&h, &restricted(&probs, &[0, 1]), CHI_CRIT[1]);
    let h = histogram(params(|p| p.top_p = 0.85), &logits, 20_000);
    assert_chi_square(&h, &restricted(&probs, &[0, 1, 2]), CHI_CRIT[2]);
    // At least one token survives, however small p is.
    let h = histogram(params(|p| p.top_p = 1e-9), &logits, 500);
    assert_eq!(h[0], 500);
}

#[test]
fn min_p_drops_tokens_below_the_scaled_top() {
    let probs = [0.5f64, 0.3, 0.15, 0.05];
    let logits: Vec<f32> = probs.iter().map(|p| p.ln() as f32).collect();
    // Threshold 0.2 * 0.5 = 0.1: drops only the 0.05 token.
    let h = histogram(params(|p| p.min_p = 0.2), &logits, 20_000);
    assert_chi_square(&h, &restricted(&probs, &[0, 1, 2]), CHI_CRIT[2]);
    // Threshold 0.25: keeps 0.5 and 0.3.
    let h = histogram(params(|p| p.min_p = 0.5), &logits, 20_000);
    assert_chi_square(&h, &restricted(&probs, &[0, 1]), CHI_CRIT[1]);
    // min_p applies to the temperature-scaled distribution: at t = 2 the probabilities are
    // ∝ sqrt(p) = .707, .548, .387, .224; threshold 0.5 * .707 = .354 keeps three.
    let h = histogram(
        params(|p| {
            p.min_p = 0.5;
            p.temperature = 2.0;
        }),
        &logits,
        20_000,
    );
    let scaled = softmax(&logits, 2.0);
    assert_chi_square(&h, &restricted(&scaled, &[0, 1, 2]), CHI_CRIT[2]);
}

/// Pseudo-random logits (a fixed LCG), so that large-vocabulary tests need no dependency.
fn lcg_logits(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale
        })
        .collect()
}

/// The brute-force filter chain in f64 over the whole vocabulary: every id best first, and how
/// many of them the filters keep.
fn reference_kept(
    logits: &[f32],
    t: f64,
    top_k: usize,
    top_p: f64,
    min_p: f64,
) -> (Vec<u32>, usize) {
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    order.sort_by(|&a, &b| {
        logits[b as usize]
            .total_cmp(&logits[a as usize])
            .then(a.cmp(&b))
    });
    let pool = if top_k > 0 { top_k } else { order.len() };
    let m = logits[order[0] as usize] as f64;
    let w: Vec<f64> = order[..pool]
        .iter()
        .map(|&i| ((logits[i as usize] as f64 - m) / t).exp())
        .collect();
    let z: f64 = w.iter().sum();
    let mut keep = 0;
    let mut acc = 0.0;
    for &wj in &w {
        if wj < min_p {
            break;
        }
        keep += 1;
        acc += wj;
        if acc >= top_p * z {
            break;
        }
    }
    (order, keep)
}

#[test]
fn filters_on_a_large_vocabulary_match_brute_force() {
    let n = 151_936; // Qwen's vocabulary size
    let logits = lcg_logits(n, 11, 12.0);
    for &(t, k, p, mp) in &[
        (1.0f32, 0usize, 0.9f32, 0.0f32),
        (0.7, 0, 0.5, 0.0),
        (1.3, 0, 0.999, 0.0), // nearly everything: the nucleus is most of the vocabulary
        (0.05, 0, 0.9, 0.0),  // peaked: a handful of tokens
        (1.0, 40, 0.8, 0.0),
        (1.0, 0, 1.0, 0.05),
        (0.8, 100, 0.95, 0.02),
        (1.0, 1000, 1.0, 0.0), // a k too large for the one-pass selection
    ] {
        let (order, want) = reference_kept(&logits, t as f64, k, p as f64, mp as f64);
        let mut cand: Vec<u32> = (0..n as u32).collect();
        processors::top_k(&logits, &mut cand, k);
        let max = cand
            .iter()
            .map(|&i| logits[i as usize])
            .fold(f32::NEG_INFINITY, f32::max);
        let mut w = Vec::new();
        processors::weights_into(&logits, &cand, max, t, &mut w);
        if p < 1.0 {
            processors::top_p(&logits, &mut cand, &mut w, p);
        }
        if mp > 0.0 {
            processors::min_p(&mut cand, &mut w, mp);
        }
        cand.sort();
        // The kept set is a best-first prefix of the reference order; its length may differ by
        // one token exactly at the cut, where f32 and f64 rounding can disagree.
        let got = cand.len();
        assert!(
            got.abs_diff(want) <= 1,
            "t={t} k={k} p={p} min_p={mp}: kept {got}, want {want}"
        );
        let mut prefix = order[..got].to_vec();
        prefix.sort();
        assert!(
            cand == prefix,
            "t={t} k={k} p={p} min_p={mp}: not the best {got}"
        );
        // And the sampler never leaves that set.
        let mut s = Sampler::new(params(|q| {
            q.temperature = t;
            q.top_k = k;
            q.top_p = p;
            q.min_p = mp;
        }));
        for _ in 0..100 {
            let tok = s.sample(&logits, &[], 0).token;
            assert!(cand.binary_search(&tok).is_ok(), "drew removed token {tok}");
        }
    }
}

#[test]
fn penalties_hand_computed() {
    let mut logits = vec![2.0f32, -1.0, 0.5, 3.0, 1.0];
    let history = [0u32, 1, 1, 99, 0, 0]; // 99 is outside the vocabulary: ignored
    let p = params(|p| {
        p.repetition_penalty = 2.0;
        p.presence_penalty = 0.5;
        p.frequency_penalty = 0.25;
    });
    let (mut counts, mut seen) = (Vec::new(), Vec::new());
    processors::apply_penalties(&mut logits, &history, 0, &p, &mut counts, &mut seen);
    // id 0: 2.0 / 2 - 0.5 - 3 * 0.25 = -0.25; id 1: -1.0 * 2 - 0.5 - 2 * 0.25 = -3.0.
    assert_eq!(logits, vec![-0.25, -3.0, 0.5, 3.0, 1.0]);
    assert!(
        counts.iter().all(|&c| c == 0),
        "scratch counts must be reset"
    );

    // Repetition only (HF): positive divided, negative multiplied, once per distinct id.
    let mut logits = vec![1.5f32, -0.5, 4.0];
    let p = params(|p| p.repetition_penalty = 1.5);
    processors::apply_penalties(&mut logits, &[0, 0, 0, 1], 0, &p, &mut counts, &mut seen);
    assert_eq!(logits, vec![1.0, -0.75, 4.0]);

    // Negative presence / frequency penalties encourage repeats (OpenAI allows -2..2).
    let mut logits = vec![0.0f32, 0.0];
    let p = params(|p| {
        p.presence_penalty = -1.0;
        p.frequency_penalty = -0.5;
    });
    processors::apply_penalties(&mut logits, &[1, 1], 0, &p, &mut counts, &mut seen);
    assert_eq!(logits, vec![0.0, 2.0]);

    // Presence / frequency count generated tokens only (OpenAI, vLLM); the repetition penalty
    // also covers the prompt (HF). History [0, 0 | 0, 1]: two prompt ids, then 0 and 1 generated.
    let mut logits = vec![2.0f32, 2.0, 2.0];
    let p = params(|p| {
        p.repetition_penalty = 2.0;
        p.presence_penalty = 0.5;
        p.frequency_penalty = 0.25;
    });
    processors::apply_penalties(&mut logits, &[0, 0, 0, 1], 2, &p, &mut counts, &mut seen);
    // id 0: 2 / 2 - 0.5 - 1 * 0.25 = 0.25; id 1: the same; id 2 unseen.
    assert_eq!(logits, vec![0.25, 0.25, 2.0]);
    let mut logits = vec![2.0f32, 2.0];
    processors::apply_penalties(&mut logits, &[0, 1], 2, &p, &mut counts, &mut seen);
    // Prompt only: repetition applies, presence / frequency do not.
    assert_eq!(logits, vec![1.0, 1.0]);
    assert!(counts.iter().all(|&c| c == 0));

    // Penalties change greedy picks: 2.0 / 2 = 1.0 < 1.9.
    let mut s = Sampler::new(params(|p| {
        p.temperature = 0.0;
        p.repetition_penalty = 2.0;
    }));
    assert_eq!(s.sample(&[2.0, 1.9], &[0], 0).token, 1);
    assert_eq!(s.sample(&[2.0, 1.9], &[], 0).token, 0);
}

#[test]
fn penalized_distribution_matches_softmax_of_penalized_logits() {
    let logits = [1.0f32, 1.0, 1.0, 1.0];
    let p = params(|p| p.frequency_penalty = 0.5);
    let mut s = Sampler::new(p);
    let mut h = vec![0usize; 4];
    for _ in 0..20_000 {
        h[s.sample(&logits, &[2, 2, 3], 0).token as usize] += 1;
    }
    assert_chi_square(&h, &softmax(&[1.0, 1.0, 0.0, 0.5], 1.0), CHI_CRIT[3]);
}

#[test]
fn same_seed_same_tokens() {
    let logits = lcg_logits(5000, 3, 8.0);
    let p = params(|p| {
        p.seed = Some(1234);
        p.top_p = 0.95;
        p.temperature = 0.9;
    });
    let run = |p: SamplingParams| {
        let mut s = Sampler::new(p);
        let mut hist = Vec::new();
        for _ in 0..50 {
            let t = s.sample(&logits, &hist, 0).token;
            hist.push(t);
        }
        hist
    };
    let a = run(p.clone());
    assert_eq!(a, run(p.clone()));
    let mut other = p.clone();
    other.seed = Some(1235);
    assert_ne!(a, run(other));
    // Golden values: the same seed must give these tokens on every machine and build.
    assert_eq!(&a[..8], GOLDEN);
    // An entropy-seeded sampler reports its seed, and that seed reproduces it.
    let s = Sampler::new(params(|q| q.seed = None));
    let mut replay = p.clone();
    replay.seed = Some(s.seed());
    assert_eq!(run(replay.clone()), run(replay));
}

const GOLDEN: &[u32] = &[245, 4182, 3454, 4293, 492, 4433, 2248, 962];

#[test]
fn greedy_is_argmax_with_ties_to_lowest_id_whatever_the_rest() {
    let logits = [1.0f32, 3.0, 3.0, 2.0, -1.0];
    let base = SamplingParams::greedy();
    assert!(base.is_greedy());
    let variants = [
        base.clone(),
        SamplingParams {
            top_p: 0.1,
            min_p: 0.9,
            seed: Some(99),
            ..base.clone()
        },
        SamplingParams {
            top_k: 3,
            seed: None,
            ..base.clone()
        },
        SamplingParams {
            temperature: 0.7,
            top_k: 1,
            top_p: 0.5,
            ..SamplingParams::default()
        },
        SamplingParams {
            temperature: 5.0,
            top_k: 1,
            ..SamplingParams::default()
        },
    ];
    let want = Sampled {
        token: 1,
        logprob: softmax(&logits, 1.0)[1].ln() as f32,
    };
    for v in variants {
        let mut s = Sampler::new(v.clone());
        for _ in 0..20 {
            let got = s.sample(&logits, &[], 0);
            assert_eq!(got.token, want.token, "{v:?}");
            assert_eq!(
                got.logprob.to_bits(),
                s.sample(&logits, &[], 0).logprob.to_bits()
            );
            assert!((got.logprob - want.logprob).abs() < 1e-6);
        }
    }
}

#[test]
fn logprob_is_raw_log_softmax() {
    let logits = LOGITS8;
    let raw = softmax(&logits, 1.0);
    let mut s = Sampler::new(params(|p| {
        p.temperature = 0.3;
        p.repetition_penalty = 1.7;
        p.presence_penalty = 1.0;
        p.top_k = 4;
    }));
    for _ in 0..50 {
        let got = s.sample(&logits, &[4, 5], 0);
        let want = raw[got.token as usize].ln();
        assert!(
            (got.logprob as f64 - want).abs() < 1e-5,
            "{got:?} vs {want}"
        );
    }
}

#[test]
fn non_finite_logits_do_not_panic() {
    let mut s = Sampler::new(params(|_| {}));
    // NaN is never drawn.
    let logits = [f32::NAN, 0.0, f32::NAN, 0.0];
    for _ in 0..200 {
        let got = s.sample(&logits, &[], 0);
        assert!(got.token == 1 || got.token == 3);
        assert!((got.logprob - 0.5f32.ln()).abs() < 1e-6);
    }
    // +inf wins outright; several +inf share the mass.
    let logits = [1.0, f32::INFINITY, 5.0, f32::INFINITY];
    let mut seen = [0usize; 4];
    for _ in 0..400 {
        let got = s.sample(&logits, &[], 0);
        seen[got.token as usize] += 1;
        assert!((got.logprob - 0.5f32.ln()).abs() < 1e-6);
    }
    assert_eq!((seen[0], seen[2]), (0, 0));
    assert!(seen[1] > 100 && seen[3] > 100, "{seen:?}");
    // All -inf / NaN, empty logits, greedy on NaN: token 0, logprob -inf.
    for logits in [
        &[f32::NEG_INFINITY, f32::NAN][..],
        &[][..],
        &[f32::NAN, f32::NAN, f32::NAN][..],
    ] {
        for p in [params(|_| {}), SamplingParams::greedy()] {
            let got = Sampler::new(p).sample(logits, &[0, 1, 7], 0);
            assert_eq!(got.token, 0);
            assert_eq!(got.logprob, f32::NEG_INFINITY);
        }
    }
    let mut g = Sampler::new(SamplingParams::greedy());
    assert_eq!(g.sample(&[f32::NAN, -5.0, f32::NAN], &[], 0).token, 1);
    // Out-of-range parameters act as documented instead of panicking.
    let odd = SamplingParams {
        temperature: f32::NAN,
        top_p: f32::NAN,
        min_p: 7.0,
        repetition_penalty: -1.0,
        presence_penalty: f32::INFINITY,
        frequency_penalty: f32::NAN,
        ..SamplingParams::default()
    };
    assert!(odd.validate().is_err());
    assert_eq!(Sampler::new(odd).sample(&LOGITS8, &[4], 0).token, 4);
}

#[test]
fn top_logprobs_ranks_by_raw_logits_with_id_ties() {
    let logits = [0.5f32, 2.0, f32::NAN, 2.0, 1.0];
    let raw = softmax(&logits, 1.0);
    let top = top_logprobs(&logits, 3);
    let ids: Vec<u32> = top.iter().map(|t| t.0).collect();
    assert_eq!(ids, vec![1, 3, 4]);
    for (id, lp) in &top {
        assert!((*lp as f64 - raw[*id as usize].ln()).abs() < 1e-6);
    }
    assert_eq!(top_logprobs(&logits, 10).len(), 5);
    assert_eq!(top_logprobs(&logits, 10)[4], (2, f32::NEG_INFINITY));
    assert!(top_logprobs(&logits, 0).is_empty());
    assert!(top_logprobs(&[], 3).is_empty());
}

#[test]
fn validate_names_the_bad_field() {
    assert!(SamplingParams::default().validate().is_ok());
    assert!(SamplingParams::greedy().validate().is_ok());
    let cases: [(SamplingParams, &str); 6] = [
        (params(|p| p.temperature = -0.1), "temperature"),
        (params(|p| p.top_p = 0.0), "top_p"),
        (params(|p| p.top_p = 1.5), "top_p"),
        (params(|p| p.min_p = -0.5), "min_p"),
        (params(|p| p.repetition_penalty = 0.0), "repetition_penalty"),
        (
            params(|p| p.frequency_penalty = f32::NAN),
            "frequency_penalty",
        ),
    ];
    for (p, field) in cases {
        let e = p.validate().unwrap_err().to_string();
        assert!(e.contains(&format!("`{field}`")), "{e}");
    }
}

// ---------------------------------------------------------------- stop strings

/// Feeds `pieces` and returns (everything emitted, whether it stopped).
fn stream(stops: &[&str], pieces: &[&str]) -> (String, bool) {
    let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
    let mut out = String::new();
    for p in pieces {
        match m.push(p) {
            StopResult::Continue(t) => out.push_str(&t),
            StopResult::Stop(t) => {
                out.push_str(&t);
                return (out, true);
            }
        }
    }
    out.push_str(&m.finish());
    (out, false)
}

#[test]
fn stop_split_across_pieces() {
    assert_eq!(
        stream(&["<|im_end|>"], &["Hello", " world<|im", "_e", "nd|>after"]),
        ("Hello world".into(), true)
    );
    // Held text is released as soon as it can no longer start the stop.
    let mut m = StopMatcher::new(vec!["STOP".into()]);
    assert_eq!(m.push("aST"), StopResult::Continue("a".into()));
    assert_eq!(m.push("x"), StopResult::Continue("STx".into()));
    assert_eq!(m.push("S"), StopResult::Continue(String::new()));
    assert_eq!(m.finish(), "S");
}

#[test]
fn multiple_and_overlapping_stops() {
    // The earliest start wins, whichever stop is listed first.
    assert_eq!(
        stream(&["world", "lo w"], &["hello world"]),
        ("hel".into(), true)
    );
    // A stop that is a prefix of another: the shorter completes first at the same start.
    assert_eq!(stream(&["abcd", "ab"], &["xa", "bcd"]), ("x".into(), true));
    // Overlapping self-prefix: "aab" in "aaab" found across pieces.
    assert_eq!(
        stream(&["aab"], &["a", "a", "a", "b", "z"]),
        ("a".into(), true)
    );
    // A near miss is released in full at the end.
    assert_eq!(
        stream(&["</s>", "###"], &["a </", "s", " ##"]),
        ("a </s ##".into(), false)
    );
    // A stop at the very start emits nothing.
    assert_eq!(stream(&["\n\n"], &["\n", "\nrest"]), (String::new(), true));
}

#[test]
fn multibyte_utf8_stops() {
    assert_eq!(
        stream(&["終わり", "🛑"], &["こんにちは終", "わり です"]),
        ("こんにちは".into(), true)
    );
    assert_eq!(stream(&["🛑"], &["x", "é🛑y"]), ("xé".into(), true));
    // A stop sharing only the leading bytes of a character never splits that character.
    let mut m = StopMatcher::new(vec!["é!".into()]);
    assert_eq!(m.push("aè"), StopResult::Continue("aè".into()));
    assert_eq!(m.push("é"), StopResult::Continue(String::new()));
    assert_eq!(m.push("?"), StopResult::Continue("é?".into()));
}

#[test]
fn stop_matcher_agrees_with_a_whole_text_search() {
    let alphabet = ['a', 'b', 'c', 'é', '\n'];
    let stops = ["abc", "cab", "ééa", "b\nb", "aaaa"];
    let mut s = 99u64;
    let mut next = |n: usize| {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1);
        (s >> 33) as usize % n
    };
    for _ in 0..2000 {
        let len = next(30);
        let text: String = (0..len).map(|_| alphabet[next(alphabet.len())]).collect();
        let cuts: Vec<usize> = {
            let mut c: Vec<usize> = text
                .char_indices()
                .map(|(i, _)| i)
                .filter(|_| next(3) == 0)
                .collect();
            c.push(text.len());
            c
        };
        let mut pieces = Vec::new();
        let mut start = 0;
        for c in cuts {
            pieces.push(&text[start..c]);
            start = c;
        }
        let want = stops.iter().filter_map(|st| text.find(st)).min();
        let got = stream(&stops, &pieces);
        match want {
            Some(at) => assert_eq!(got, (text[..at].to_string(), true), "{text:?} {pieces:?}"),
            None => assert_eq!(got, (text.clone(), false), "{text:?} {pieces:?}"),
        }
    }
}

#[test]
fn params_deserialize_with_defaults() {
    let p: SamplingParams = serde_json::from_str(r#"{"temperature": 0.7, "seed": 5}"#).unwrap();
    assert_eq!(
        p,
        SamplingParams {
            temperature: 0.7,
            seed: Some(5),
            ..SamplingParams::default()
        }
    );
}

/// A step planned by the sampler and chosen from the logits by [`Pick::choose`] (the CPU side
/// of what a GPU runs where the logits are) picks the token `Sampler::sample` picks, step after
/// step with the history growing, so the random streams stay in step: through the filters,
/// penalties, the logit bias, ties, NaN, +inf and rows with nothing drawable (where the draw is
/// given back).
#[test]
fn planned_picks_match_sample() {
    let n = 3001;
    let settings: Vec<SamplingParams> = vec![
        params(|_| {}),
        params(|p| p.temperature = 0.7),
        params(|p| {
            p.top_k = 40;
            p.top_p = 0.9;
        }),
        params(|p| {
            p.temperature = 1.3;
            p.top_p = 0.5;
            p.min_p = 0.05;
            p.repetition_penalty = 1.3;
        }),
        params(|p| {
            p.top_k = 1000;
            p.presence_penalty = 0.5;
            p.frequency_penalty = 0.25;
        }),
        params(|p| {
            p.temperature = 0.0;
            p.repetition_penalty = 1.5;
        }),
        params(|p| p.top_k = 1),
    ];
    let bias = vec![(5u32, 3.0f32), (5, -0.5), (2999, 8.0), (n as u32 + 7, 1.0)];
    for (case, sp) in settings.into_iter().enumerate() {
        for with_bias in [false, true] {
            let mut a = Sampler::new(sp.clone());
            let mut b = Sampler::new(sp.clone());
            let mut history: Vec<u32> = vec![1, 2, 3, 2, 40];
            let prompt_len = 3;
            for step in 0..60u64 {
                let mut logits = lcg_logits(n, 1000 * case as u64 + step, 14.0);
                match step % 10 {
                    // Ties: few distinct values.
                    3 => logits.iter_mut().for_each(|x| *x = (*x * 0.5).round()),
                    5 => logits[17] = f32::NAN,
                    7 => {
                        logits[100] = f32::INFINITY;
                        logits[2000] = f32::INFINITY;
                    }
                    9 => logits.iter_mut().for_each(|x| *x = f32::NEG_INFINITY),
                    _ => {}
                }
                let bias: &[(u32, f32)] = if with_bias { &bias } else { &[] };
                let mut shaped = logits.clone();
                for &(id, v) in bias {
                    if let Some(x) = shaped.get_mut(id as usize) {
                        *x += v;
                    }
                }
                let want = a.sample(&shaped, &history, prompt_len).token;
                let pick = b.plan(&history, prompt_len, bias, n);
                let got = pick.choose(&logits);
                b.settle(got);
                assert_eq!(
                    got.token, want,
                    "setting {case} bias {with_bias} step {step}"
                );
                history.push(want);
            }
        }
    }
}

/// Plans made one step ahead (a decode step run ahead of its read: plan n + 1 before pick n is
/// settled) pick what plans made one by one pick: when a pick draws nothing (every logit -inf)
/// its settle rewinds the stream and says the plan made after it is void; that plan is made
/// again.
#[test]
fn plans_made_ahead_pick_what_serial_plans_pick() {
    let n = 300;
    let logits_at = |step: u64| {
        let mut l = lcg_logits(n, 77 + step, 6.0);
        if step % 7 == 3 {
            l.iter_mut().for_each(|x| *x = f32::NEG_INFINITY);
        }
        l
    };
    for sp in [
        params(|p| p.temperature = 0.8),
        params(|p| {
            p.temperature = 1.0;
            p.top_p = 0.9;
            p.top_k = 40;
        }),
    ] {
        let mut serial = Sampler::new(sp.clone());
        let want: Vec<u32> = (0..40u64)
            .map(|step| {
                let got = serial.plan(&[], 0, &[], n).choose(&logits_at(step));
                assert!(!serial.settle(got), "nothing is void one by one");
                got.token
            })
            .collect();
        let mut ahead = Sampler::new(sp.clone());
        let mut got = Vec::new();
        let mut next = ahead.plan(&[], 0, &[], n);
        let mut voided = 0;
        while got.len() < want.len() {
            let step = got.len() as u64;
            let this = next;
            next = ahead.plan(&[], 0, &[], n); // made before this step's pick is settled
            let picked = this.choose(&logits_at(step));
            if ahead.settle(picked) {
                voided += 1;
                next = ahead.plan(&[], 0, &[], n);
            }
            got.push(picked.token);
        }
        assert_eq!(got, want);
        assert!(voided > 0, "the all -inf steps voided the plan after them");
    }
}
