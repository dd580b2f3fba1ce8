//! Speculative decoding by prompt lookup (`GenerateRequest::draft_tokens`): greedy outputs with
//! drafts equal those without, token for token, alone and in a batch that mixes drafting,
//! sampled and prefilling requests, on the decoder fixtures (Llama, Qwen2, Qwen3; the hybrid
//! Qwen3.5 does not draft: its recurrent state cannot be rewound) and on the real
//! Qwen2.5-Coder GGUF rewriting a code file; drafts are accepted where text repeats.

mod common;

use common::{fixture, read_json, real_gguf, u32s};
use lattice_inference::chat::{ChatMessage, RenderOptions};
use lattice_inference::engine::{generate, BatchEngine, GenerateRequest, Generation, TextModel};
use lattice_inference::model::source::WeightMode;
use lattice_inference::sample::SamplingParams;

fn greedy(prompt: Vec<u32>, max_tokens: usize, draft_tokens: usize) -> GenerateRequest {
    let mut r = GenerateRequest::new(prompt, max_tokens, SamplingParams::greedy());
    r.ignore_eos = true;
    r.draft_tokens = draft_tokens;
    r
}

fn alone(m: &TextModel, req: &GenerateRequest) -> Generation {
    generate(m, req, &mut |_| true).unwrap()
}

#[test]
fn drafts_leave_greedy_outputs_unchanged_on_the_fixtures() {
    for name in ["tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-qwen35"] {
        let m = TextModel::load(&fixture(name), WeightMode::F32).unwrap();
        let r = read_json(&fixture(name).join("reference.json"));
        let prompts: Vec<Vec<u32>> = r["prompts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| u32s(&p["ids"]))
            .collect();
        let (mut drafted, mut accepted) = (0, 0);
        for p in &prompts {
            let want = alone(&m, &greedy(p.clone(), 96, 0));
            let got = alone(&m, &greedy(p.clone(), 96, 8));
            assert_eq!(
                got.token_ids, want.token_ids,
                "{name}: drafts changed the output"
            );
            assert_eq!(got.finish_reason, want.finish_reason);
            drafted += got.drafted_tokens;
            accepted += got.accepted_tokens;
        }
        // In a batch: drafting requests beside sampled ones and ones still prefilling.
        let mut engine = BatchEngine::new(&m, 8);
        let mut want = Vec::new();
        for (k, p) in prompts.iter().enumerate() {
            let req = if k % 3 == 2 {
                let mut s = GenerateRequest::new(
                    p.clone(),
                    40,
                    SamplingParams {
                        temperature: 0.8,
                        seed: Some(k as u64),
                        ..SamplingParams::default()
                    },
                );
                s.ignore_eos = true;
                s
            } else {
                greedy(p.clone(), 96, 6)
            };
            let mut plain = req.clone();
            plain.draft_tokens = 0;
            want.push(alone(&m, &plain).token_ids);
            engine.submit(req).unwrap();
        }
        let done = engine.run_all().unwrap();
        for ((_, g), w) in done.iter().zip(&want) {
            assert_eq!(
                &g.token_ids, w,
                "{name}: drafts in a batch changed an output"
            );
        }
        eprintln!("{name}: {accepted} of {drafted} drafted tokens accepted (alone)");
        if name == "tiny-qwen35" {
            assert_eq!(drafted, 0, "a recurrent model must not draft");
        } else {
            assert!(accepted > 0, "{name}: no draft was ever accepted");
        }
    }
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
    let want = alone(&m, &greedy(prompt.clone(), 80, 0));
    let got = alone(&m, &greedy(prompt, 80, 10));
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
