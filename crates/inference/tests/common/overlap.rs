//! Decode steps run ahead of their read, shared by the CPU tests (tests/overlap.rs) and the
//! GPU's (tests/cuda_parity.rs): greedy requests with joins, cancellations and early ends
//! through an engine, and the comparison of two runs' outputs.

use lattice_inference::engine::{BatchEngine, GenerateRequest, Generation, TextModel};
use lattice_inference::sample::SamplingParams;

use super::prompts_of;

/// Batch configurations to run: slots, steps before the second half joins, and (request,
/// tokens) after which its update callback cancels it.
/// With 2 or 3 slots, requests wait while every slot is taken (steps still run ahead).
pub const RUNS: [(usize, usize, (usize, usize)); 4] = [
    (8, 0, (usize::MAX, 0)),
    (3, 4, (3, 2)),
    (8, 7, (4, 9)),
    (2, 0, (usize::MAX, 0)),
];

/// Greedy requests of 1 to 40 tokens; every third may stop at the end-of-sequence token.
pub fn greedy(model: &str) -> Vec<GenerateRequest> {
    prompts_of(model)
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let mut r =
                GenerateRequest::new(p, [1, 2, 5, 17, 40, 3][i % 6], SamplingParams::greedy());
            r.ignore_eos = i % 3 != 0;
            r
        })
        .collect()
}

/// Runs `reqs` (the second half joining after `join_after` steps), streaming every update;
/// request `cancel_at.0` is cancelled by its update callback once it has `cancel_at.1` tokens.
/// Returns the results in submission order, the streamed texts and the steps run ahead.
pub fn run(
    e: &mut BatchEngine<'_>,
    reqs: &[GenerateRequest],
    join_after: usize,
    cancel_at: (usize, usize),
) -> (Vec<Generation>, Vec<String>, u64) {
    let half = reqs.len() / 2;
    let mut ids: Vec<u64> = reqs[..half]
        .iter()
        .map(|r| e.submit(r.clone()).unwrap())
        .collect();
    let mut streamed = vec![String::new(); reqs.len()];
    let mut done = Vec::new();
    let mut steps = 0;
    while e.pending() > 0 || ids.len() < reqs.len() {
        if steps == join_after {
            ids.extend(reqs[half..].iter().map(|r| e.submit(r.clone()).unwrap()));
        }
        steps += 1;
        let step = e.step_with(&mut |u| {
            let k = ids.iter().position(|&i| i == u.id).unwrap();
            streamed[k].push_str(u.text);
            !(k == cancel_at.0 && u.generated >= cancel_at.1)
        });
        done.extend(step.unwrap());
    }
    done.sort_by_key(|(id, _)| *id);
    assert_eq!(done.len(), reqs.len());
    (
        done.into_iter().map(|(_, g)| g).collect(),
        streamed,
        e.steps_ahead(),
    )
}

/// What [`run_both`] returns: the serial engine's results and steps run ahead, and the other
/// engine's results, streamed texts and steps run ahead.
pub struct Both {
    pub serial: Vec<Generation>,
    pub serial_ahead: u64,
    pub ahead: Vec<Generation>,
    pub texts: Vec<String>,
    pub steps: u64,
}

/// [`run`] of `reqs` through `serial` and then `ahead` (`join_after`, `cancel_at` as there),
/// asserting the same outputs ([`assert_same`]) and streamed texts.
pub fn run_both(
    serial: &mut BatchEngine<'_>,
    ahead: &mut BatchEngine<'_>,
    reqs: &[GenerateRequest],
    join_after: usize,
    cancel_at: (usize, usize),
    what: &str,
) -> Both {
    let (want, want_texts, serial_ahead) = run(serial, reqs, join_after, cancel_at);
    let (got, texts, steps) = run(ahead, reqs, join_after, cancel_at);
    assert_same(&got, &want, what);
    assert_eq!(texts, want_texts, "{what}: streamed text");
    Both {
        serial: want,
        serial_ahead,
        ahead: got,
        texts,
        steps,
    }
}

/// Asserts that `a` and `b` hold the same tokens, texts and finish reasons.
pub fn assert_same(a: &[Generation], b: &[Generation], what: &str) {
    for (k, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.token_ids, y.token_ids, "{what}: request {k}'s tokens");
        assert_eq!(x.text, y.text, "{what}: request {k}'s text");
        assert_eq!(
            x.finish_reason, y.finish_reason,
            "{what}: request {k}'s end"
        );
    }
}

/// [`greedy`]'s requests made sampled (seeded; temperature alone, with top-p and top-k), but
/// request 5 greedy with a logit bias and request 4 with every logit biased to -inf (nothing
/// drawable: each pick rewinds the random stream, voiding the draw planned after it).
pub fn sampled(m: &TextModel, model: &str) -> Vec<GenerateRequest> {
    let mut reqs = greedy(model);
    for (i, r) in reqs.iter_mut().enumerate() {
        r.sampling = SamplingParams {
            temperature: 0.8,
            top_p: if i % 2 == 0 { 0.9 } else { 1.0 },
            top_k: if i % 3 == 0 { 20 } else { 0 },
            seed: Some(100 + i as u64),
            ..SamplingParams::default()
        };
    }
    reqs[5].sampling = SamplingParams::greedy();
    reqs[5].logit_bias = vec![(3, 2.5), (17, -1.0)];
    let vocab = m.decoder.info().config.vocab_size as u32;
    reqs[4].logit_bias = (0..vocab).map(|id| (id, f32::NEG_INFINITY)).collect();
    reqs
}
