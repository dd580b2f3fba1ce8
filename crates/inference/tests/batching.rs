//! Continuous batching ([`BatchEngine`]): many requests decoded together, joining between
//! steps, give the same greedy tokens as each request alone (and as transformers), for the
//! attention-only Qwen3 fixture and the hybrid Qwen3.5 one (recurrent state per sequence),
//! including prompts longer than one step's prefill budget.

mod common;

use common::{fixture, read_json, u32s};
use lattice_inference::engine::{generate, BatchEngine, GenerateRequest, TextModel};
use lattice_inference::model::source::WeightMode;
use lattice_inference::sample::SamplingParams;

fn requests(model: &str) -> Vec<(GenerateRequest, Vec<u32>)> {
    let r = read_json(&fixture(model).join("reference.json"));
    r["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let mut req = GenerateRequest::new(u32s(&p["ids"]), 64, SamplingParams::greedy());
            req.ignore_eos = true;
            (req, u32s(&p["greedy_ids"]))
        })
        .collect()
}

fn check(model: &str) {
    let m = TextModel::load(&fixture(model), WeightMode::F32).unwrap();
    let reqs = requests(model);
    assert!(reqs.len() >= 6);

    // All at once.
    let mut engine = BatchEngine::new(&m, 8);
    for (req, _) in &reqs {
        engine.submit(req.clone()).unwrap();
    }
    let done = engine.run_all().unwrap();
    assert_eq!(done.len(), reqs.len());
    for ((_, g), (req, want)) in done.iter().zip(&reqs) {
        assert_eq!(
            &g.token_ids, want,
            "{model}: batched greedy differs from transformers"
        );
        let alone = generate(&m, req, &mut |_| true).unwrap();
        assert_eq!(g.token_ids, alone.token_ids);
        assert_eq!(g.text, alone.text);
    }

    // Joining while others decode, with fewer slots than requests.
    let mut engine = BatchEngine::new(&m, 3);
    let mut ids = Vec::new();
    for (req, _) in reqs.iter().take(2) {
        ids.push(engine.submit(req.clone()).unwrap());
    }
    let mut done = Vec::new();
    for _ in 0..5 {
        done.extend(engine.step().unwrap());
    }
    for (req, _) in reqs.iter().skip(2) {
        ids.push(engine.submit(req.clone()).unwrap());
    }
    done.extend(engine.run_all().unwrap());
    done.sort_by_key(|(id, _)| *id);
    assert_eq!(done.len(), reqs.len());
    for ((_, g), (_, want)) in done.iter().zip(&reqs) {
        assert_eq!(&g.token_ids, want, "{model}: staggered batch differs");
    }
}

#[test]
fn batched_greedy_equals_single_requests_qwen3() {
    check("tiny-qwen3");
}

#[test]
fn batched_greedy_equals_single_requests_hybrid_qwen35() {
    check("tiny-qwen35");
}

#[test]
fn bad_requests_are_refused_at_submission() {
    let m = TextModel::load(&fixture("tiny-qwen3"), WeightMode::F32).unwrap();
    let mut engine = BatchEngine::new(&m, 2);
    let bad = GenerateRequest::new(vec![100_000], 4, SamplingParams::greedy());
    assert!(engine
        .submit(bad)
        .unwrap_err()
        .to_string()
        .contains("outside the vocabulary"));
    assert!(engine
        .submit(GenerateRequest::new(vec![], 4, SamplingParams::greedy()))
        .is_err());
    let mut p = SamplingParams::greedy();
    p.top_p = 2.0;
    assert!(engine.submit(GenerateRequest::new(vec![1], 4, p)).is_err());
    assert_eq!(engine.pending(), 0);
    // max_tokens 0: ends after its prompt, with no tokens.
    engine
        .submit(GenerateRequest::new(
            vec![1, 2, 3],
            0,
            SamplingParams::greedy(),
        ))
        .unwrap();
    let done = engine.run_all().unwrap();
    assert!(done[0].1.token_ids.is_empty());
}
