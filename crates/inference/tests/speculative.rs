//! Speculative decoding (`GenerateRequest::draft_tokens`, by prompt lookup or suffix match):
//! greedy outputs with drafts equal those without, token for token, alone and in a batch that
//! mixes drafting, sampled and prefilling requests, on the decoder fixtures (Llama, Qwen2,
//! Qwen3 and the hybrid Qwen3.5, whose recurrent state is rolled back after a rejected draft),
//! under an output constraint, and on the real Qwen2.5-Coder GGUF rewriting a code file;
//! sampled outputs keep the model's distribution (a chi-square test of the first tokens'
//! joint frequencies against the probabilities computed from the logits); drafts are
//! accepted where text repeats, and suffix drafts come from earlier requests' outputs too.

mod common;

use common::{
    check_drafts_leave_outputs_unchanged, drafting_greedy, fixture, generate_alone, prompts_of,
    real_gguf,
};
use lattice_inference::chat::{ChatMessage, RenderOptions};
use lattice_inference::engine::{BatchEngine, Drafter, GenerateRequest, TextModel};
use lattice_inference::grammar::Spec;
use lattice_inference::model::decoder::Outputs;
use lattice_inference::model::source::WeightMode;
use lattice_inference::sample::SamplingParams;

#[test]
fn drafts_leave_greedy_outputs_unchanged_on_the_fixtures() {
    for name in ["tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-qwen35"] {
        let m = TextModel::load(&fixture(name), WeightMode::F32).unwrap();
        check_drafts_leave_outputs_unchanged(&m, name);
    }
}

#[test]
fn drafts_leave_constrained_outputs_unchanged() {
    // The draft is cut to what the constraint allows, then verified under its masks.
    for name in ["tiny-qwen3", "tiny-qwen35"] {
        let m = TextModel::load(&fixture(name), WeightMode::F32).unwrap();
        let c = m
            .compile_constraint(&Spec::Regex("[a-z ]{0,400}".into()))
            .unwrap();
        let (mut drafted, mut accepted) = (0, 0);
        for p in prompts_of(name) {
            let mut plain = drafting_greedy(p, 64, 0);
            plain.ignore_eos = false;
            plain.constraint = Some(c.clone());
            let want = generate_alone(&m, &plain);
            let mut req = plain.clone();
            req.draft_tokens = 8;
            let got = generate_alone(&m, &req);
            assert_eq!(got.token_ids, want.token_ids, "{name}: constrained drafts");
            assert_eq!(got.text, want.text);
            drafted += got.drafted_tokens;
            accepted += got.accepted_tokens;
        }
        eprintln!("{name}, constrained: {accepted} of {drafted} drafted tokens accepted");
        assert!(drafted > 0, "{name}: no constrained request drafted");
    }
}

/// The probability of each token under `params` (temperature and top-k; nothing else set)
/// at the end of `context`, from the model's logits plus `bias`.
fn target(m: &TextModel, context: &[u32], bias: &[(u32, f32)], t: f64, k: usize) -> Vec<f64> {
    let mut cache = m.decoder.new_cache(context.len() + 1);
    let mut l = m
        .decoder
        .forward(
            context,
            &[context.len()],
            &mut [&mut cache],
            Outputs::LastLogits,
        )
        .unwrap();
    for &(id, b) in bias {
        l[id as usize] += b;
    }
    let mut order: Vec<usize> = (0..l.len()).collect();
    order.sort_by(|&a, &b| l[b].total_cmp(&l[a]).then(a.cmp(&b)));
    let max = l[order[0]] as f64;
    let mut p = vec![0.0; l.len()];
    for &i in &order[..k] {
        p[i] = ((l[i] as f64 - max) / t).exp();
    }
    let sum: f64 = p.iter().sum();
    p.iter().map(|x| x / sum).collect()
}

#[test]
fn sampled_drafts_keep_the_models_distribution() {
    // A prompt that repeats three tokens, made likely by a bias, so prompt lookup drafts them
    // and the rejection rule both keeps and rejects drafts; the frequencies of the first three
    // tokens over many seeds are tested against their exact probabilities.
    for name in ["tiny-qwen3", "tiny-qwen35"] {
        let m = TextModel::load(&fixture(name), WeightMode::F32).unwrap();
        let (a, b, c) = (11u32, 12, 13);
        let prompt = vec![a, b, c, a, b, c, a, b, c, a, b];
        let bias: Vec<(u32, f32)> = vec![(a, 40.0), (b, 40.0), (c, 40.0)];
        let (t, k) = (8.0, 3);
        let runs = 3000u64;
        let mut seen: std::collections::BTreeMap<Vec<u32>, u64> = Default::default();
        let (mut drafted, mut accepted) = (0, 0);
        for seed in 0..runs {
            let mut req = GenerateRequest::new(
                prompt.clone(),
                3,
                SamplingParams {
                    temperature: t as f32,
                    top_k: k,
                    seed: Some(seed),
                    ..SamplingParams::default()
                },
            );
            req.ignore_eos = true;
            req.logit_bias = bias.clone();
            req.draft_tokens = 4;
            let out = generate_alone(&m, &req);
            drafted += out.drafted_tokens;
            accepted += out.accepted_tokens;
            *seen.entry(out.token_ids).or_default() += 1;
        }
        assert!(
            accepted > 100 && drafted - accepted > 100,
            "{name}: drafts must be both kept and rejected ({accepted} of {drafted}); outputs {seen:?}"
        );
        // Exact probability of every 3-token output (each step: the top-k tokens); cells
        // expected fewer than 5 times are pooled.
        let p1 = target(&m, &prompt, &bias, t, k);
        let mut cells: Vec<(f64, f64)> = Vec::new(); // (expected, seen)
        let mut pooled = (0.0, 0.0);
        let mut total = 0.0;
        for (x1, &q1) in p1.iter().enumerate().filter(|(_, &q)| q > 0.0) {
            let mut c1 = prompt.clone();
            c1.push(x1 as u32);
            let p2 = target(&m, &c1, &bias, t, k);
            for (x2, &q2) in p2.iter().enumerate().filter(|(_, &q)| q > 0.0) {
                let mut c2 = c1.clone();
                c2.push(x2 as u32);
                let p3 = target(&m, &c2, &bias, t, k);
                for (x3, &q3) in p3.iter().enumerate().filter(|(_, &q)| q > 0.0) {
                    let q = q1 * q2 * q3;
                    total += q;
                    let key = vec![x1 as u32, x2 as u32, x3 as u32];
                    let n = seen.remove(&key).unwrap_or(0) as f64;
                    let e = q * runs as f64;
                    if e >= 5.0 {
                        cells.push((e, n));
                    } else {
                        pooled.0 += e;
                        pooled.1 += n;
                    }
                }
            }
        }
        assert!((total - 1.0).abs() < 1e-9);
        assert!(
            seen.is_empty(),
            "{name}: outputs outside the top-k: {seen:?}"
        );
        if pooled.0 > 0.0 {
            cells.push(pooled);
        }
        let chi2: f64 = cells.iter().map(|&(e, n)| (n - e) * (n - e) / e).sum();
        // The chi-square quantile at 1e-4 (Wilson-Hilferty): a right sampler fails 1 in 10^4.
        let df = (cells.len() - 1) as f64;
        let z = 3.719;
        let limit = df * (1.0 - 2.0 / (9.0 * df) + z * (2.0 / (9.0 * df)).sqrt()).powi(3);
        eprintln!(
            "{name}: chi2 = {chi2:.1} over {} cells (limit {limit:.1}); {accepted} of {drafted} drafted kept",
            cells.len()
        );
        assert!(cells.len() >= 10, "{name}: too few cells to test");
        assert!(
            chi2 < limit,
            "{name}: sampled drafts changed the distribution"
        );
    }
}

#[test]
fn suffix_drafts_come_from_earlier_outputs() {
    // A second request whose prompt does not hold the text gets it drafted from the first
    // request's output, in the same engine.
    let m = TextModel::load(&fixture("tiny-qwen3"), WeightMode::F32).unwrap();
    let prompts = prompts_of("tiny-qwen3");
    let mut engine = BatchEngine::new(&m, 4);
    let mut first = drafting_greedy(prompts[0].clone(), 48, 8);
    first.drafter = Drafter::Suffix;
    engine.submit(first.clone()).unwrap();
    let done = engine.run_all().unwrap();
    let out = &done[0].1.token_ids;
    // The same prompt again: its whole output is in the cache.
    engine.submit(first.clone()).unwrap();
    let again = engine.run_all().unwrap();
    let g = &again[0].1;
    assert_eq!(&g.token_ids, out);
    eprintln!(
        "repeat from the cache: {} of {} drafted kept over {} tokens",
        g.accepted_tokens,
        g.drafted_tokens,
        out.len()
    );
    assert!(
        g.accepted_tokens * 2 >= out.len(),
        "an output seen before should mostly be drafted from the cache"
    );
    assert!(g.accepted_tokens > done[0].1.accepted_tokens);
}

#[test]
fn drafts_leave_a_real_models_code_rewrite_unchanged_and_pay() {
    let m = TextModel::load(
        &real_gguf("Qwen2.5-Coder-0.5B-Instruct.gguf"),
        WeightMode::Quantized,
    )
    .unwrap();
    let code = "def total(items):\n    result = 0\n    for item in items:\n        result += item.price * item.count\n    return result\n\n\ndef average(items):\n    if not items:\n        return 0\n    return total(items) / len(items)\n";
    let ask = format!(
        "Rename the function `total` to `sum_prices` everywhere in this file and reply with the whole file:\n\n```python\n{code}```"
    );
    let opts = RenderOptions {
        add_generation_prompt: true,
        ..RenderOptions::default()
    };
    let prompt = m
        .encode_chat(&[ChatMessage::new("user", &ask)], &opts)
        .unwrap();
    let want = generate_alone(&m, &drafting_greedy(prompt.clone(), 80, 0));
    let got = generate_alone(&m, &drafting_greedy(prompt, 80, 10));
    assert_eq!(got.token_ids, want.token_ids, "drafts changed the output");
    eprintln!(
        "Qwen2.5-Coder code rewrite: {} of {} drafted tokens accepted over {} tokens",
        got.accepted_tokens,
        got.drafted_tokens,
        got.token_ids.len()
    );
    assert!(
        got.accepted_tokens * 4 >= got.token_ids.len(),
        "a rewrite of the prompt's file should mostly be drafted"
    );
}
