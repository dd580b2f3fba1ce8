//! The generation loop on the tiny Qwen3 fixture: greedy equal to transformers through
//! `engine::generate`, stop strings, token limits, log-probabilities, seeded sampling, and a
//! session that reuses its cached prefix giving the same tokens as a fresh run.

mod common;

use common::{fixture, read_json, u32s};
use lattice_inference::engine::{
    generate, generate_in, FinishReason, GenerateRequest, Session, TextModel,
};
use lattice_inference::model::source::WeightMode;
use lattice_inference::sample::SamplingParams;

fn model() -> TextModel {
    TextModel::load(&fixture("tiny-qwen3"), WeightMode::F32).unwrap()
}

fn prompt(name: &str) -> (Vec<u32>, Vec<u32>) {
    let r = read_json(&fixture("tiny-qwen3").join("reference.json"));
    let p = r["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap()
        .clone();
    (u32s(&p["ids"]), u32s(&p["greedy_ids"]))
}

#[test]
fn greedy_stop_strings_and_limits() {
    let m = model();
    let (ids, want) = prompt("code");
    let mut req = GenerateRequest::new(ids.clone(), 64, SamplingParams::greedy());
    req.ignore_eos = true;
    let mut streamed = String::new();
    let g = generate(&m, &req, &mut |t| {
        streamed.push_str(t);
        true
    })
    .unwrap();
    assert_eq!(g.token_ids, want);
    assert_eq!(g.finish_reason, FinishReason::Length);
    assert_eq!(streamed, g.text);
    assert_eq!(g.text, m.tokenizer.decode(&want, true));

    // A stop string from the middle of that text: the output ends right before it.
    let chars: Vec<char> = g.text.chars().collect();
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 3].iter().collect();
    let at = g.text.find(&stop).unwrap();
    req.stop = vec![stop.clone()];
    let s = generate(&m, &req, &mut |_| true).unwrap();
    assert_eq!(s.finish_reason, FinishReason::Stop);
    assert_eq!(s.text, g.text[..at], "stop {stop:?}");
    assert!(s.token_ids.len() < 64);

    req.stop.clear();
    req.max_tokens = 5;
    let l = generate(&m, &req, &mut |_| true).unwrap();
    assert_eq!(l.token_ids, want[..5]);
    assert_eq!(l.finish_reason, FinishReason::Length);

    // Cancelling from the callback.
    req.max_tokens = 64;
    let mut pieces = 0;
    let c = generate(&m, &req, &mut |_| {
        pieces += 1;
        false
    })
    .unwrap();
    assert_eq!(pieces, 1);
    assert_eq!(c.finish_reason, FinishReason::Cancelled);
    assert!(c.token_ids.len() < 64);
}

#[test]
fn logprobs_are_consistent_with_greedy_choices() {
    let m = model();
    let (ids, want) = prompt("short");
    let mut req = GenerateRequest::new(ids, 16, SamplingParams::greedy());
    req.ignore_eos = true;
    req.logprobs = Some(3);
    let g = generate(&m, &req, &mut |_| true).unwrap();
    assert_eq!(g.token_ids, want[..16]);
    assert_eq!(g.logprobs.len(), 16);
    for (lp, &tok) in g.logprobs.iter().zip(&g.token_ids) {
        assert_eq!(lp.token, tok);
        assert!(lp.logprob <= 0.0);
        assert_eq!(lp.top.len(), 3);
        assert_eq!(lp.top[0].0, tok, "greedy picks the most likely token");
        assert!((lp.top[0].1 - lp.logprob).abs() < 1e-6);
        assert!(lp.top[0].1 >= lp.top[1].1 && lp.top[1].1 >= lp.top[2].1);
    }
}

#[test]
fn seeded_sampling_is_reproducible() {
    let m = model();
    let (ids, _) = prompt("sentence");
    let params = SamplingParams {
        temperature: 0.9,
        top_k: 40,
        top_p: 0.95,
        seed: Some(1234),
        ..Default::default()
    };
    let mut req = GenerateRequest::new(ids, 32, params);
    req.ignore_eos = true;
    let a = generate(&m, &req, &mut |_| true).unwrap();
    let b = generate(&m, &req, &mut |_| true).unwrap();
    assert_eq!(a.token_ids, b.token_ids);
    req.sampling.seed = Some(99);
    let c = generate(&m, &req, &mut |_| true).unwrap();
    assert_ne!(a.token_ids, c.token_ids);
}

#[test]
fn session_reuses_its_prefix_and_matches_a_fresh_run() {
    let m = model();
    let (ids, want) = prompt("long");
    let mut session = Session::new(&m, 1024);
    let mut req = GenerateRequest::new(ids[..200].to_vec(), 8, SamplingParams::greedy());
    req.ignore_eos = true;
    let first = generate_in(&m, &req, &mut session, &mut |_| true).unwrap();
    assert_eq!(first.cached_prompt_tokens, 0);
    assert_eq!(session.len(), 200 + 7);

    // A longer prompt sharing the first 200 tokens (not the generated ones).
    req.prompt_ids = ids.clone();
    req.max_tokens = 64;
    let second = generate_in(&m, &req, &mut session, &mut |_| true).unwrap();
    assert_eq!(second.cached_prompt_tokens, 200);
    assert_eq!(second.token_ids, want);
    let fresh = generate(&m, &req, &mut |_| true).unwrap();
    assert_eq!(fresh.token_ids, want);

    // The same prompt again: everything but the last token comes from the cache.
    let third = generate_in(&m, &req, &mut session, &mut |_| true).unwrap();
    assert_eq!(third.cached_prompt_tokens, ids.len() - 1);
    assert_eq!(third.token_ids, want);
}
