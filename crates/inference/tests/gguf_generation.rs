//! Real GGUF decoders (SmolLM2-135M-Instruct Q4_1, arch llama; Qwen2.5-Coder-0.5B-Instruct with
//! Q5_0/Q8_0/Q4_K/Q6_K, arch qwen2) against the references in tests/fixtures/gguf/ made by
//! scripts/gen_gguf_reference.py:
//! - tokenizer and chat template from the file: the same prompt ids and text as llama.cpp;
//! - weights dequantized to f32: logits within 1e-3 relative error of transformers (which
//!   dequantizes the same file) over a 64-token teacher-forced sequence;
//! - quantized kernels: greedy text equal to llama.cpp's for 32 tokens on most prompts, and
//!   any divergence at a near-tie of the two best logits.

mod common;

use common::{argmax, f32s, fixture, read_gz, real_gguf, u32s};
use lattice_inference::chat::{ChatMessage, RenderOptions};
use lattice_inference::engine::TextModel;
use lattice_inference::model::decoder::Outputs;
use lattice_inference::model::source::WeightMode;
use serde_json::Value;

const MODELS: [(&str, &str); 2] = [
    (
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "SmolLM2-135M-Instruct.Q4_1",
    ),
    (
        "Qwen2.5-Coder-0.5B-Instruct.gguf",
        "Qwen2.5-Coder-0.5B-Instruct",
    ),
];

fn reference(stem: &str, kind: &str) -> Value {
    let path = fixture("gguf").join(format!("{stem}.{kind}.json.gz"));
    serde_json::from_str(&read_gz(&path)).unwrap()
}

fn top2_gap(x: &[f32]) -> f32 {
    let a = argmax(x) as usize;
    let second = x
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != a)
        .map(|(_, &v)| v)
        .fold(f32::MIN, f32::max);
    x[a] - second
}

#[test]
fn tokenizer_and_chat_template_match_llama_cpp() {
    for (file, stem) in MODELS {
        let model = TextModel::load(&real_gguf(file), WeightMode::Quantized).unwrap();
        let r = reference(stem, "llamacpp");
        for p in r["prompts"].as_array().unwrap() {
            let text = p["text"].as_str().unwrap();
            let ids = model.encode_prompt(text, true).unwrap();
            assert_eq!(ids, u32s(&p["prompt_ids"]), "{stem}/{}", p["name"]);
            if p["kind"] == "chat" {
                // Rendered from the GGUF's template with this one user message.
                let user = "What is the boiling point of water at sea level, in Celsius?";
                let ids = model
                    .encode_chat(
                        &[ChatMessage::new("user", user)],
                        &RenderOptions {
                            add_generation_prompt: true,
                            ..Default::default()
                        },
                    )
                    .unwrap();
                assert_eq!(ids, u32s(&p["prompt_ids"]), "{stem}: chat template");
                let rendered = model
                    .chat_template
                    .as_ref()
                    .unwrap()
                    .render(
                        &[ChatMessage::new("user", user)],
                        &RenderOptions {
                            add_generation_prompt: true,
                            ..Default::default()
                        },
                    )
                    .unwrap();
                assert_eq!(rendered, text, "{stem}: chat template text");
            }
        }
        let tf = &r["teacher_forced"];
        let ids = model
            .encode_prompt(tf["text"].as_str().unwrap(), true)
            .unwrap();
        assert_eq!(ids, u32s(&tf["text_ids"]), "{stem}: teacher-forced text");
    }
}

#[test]
fn dequantized_logits_match_transformers() {
    for (file, stem) in MODELS {
        let model = TextModel::load(&real_gguf(file), WeightMode::F32).unwrap();
        let dec = model.decoder.as_ref();
        let vocab = dec.info().config.vocab_size;

        // Full logits of the last position of the shortest prompt.
        let last = reference(stem, "last_logits");
        let ids = u32s(&last["prompt_ids"]);
        let mut cache = dec.new_cache(4096);
        let got = dec
            .forward(&ids, &[ids.len()], &mut [&mut cache], Outputs::LastLogits)
            .unwrap();
        let want = f32s(&last["logits"]);
        let max_abs = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        // The reference is rounded to f16: allow its rounding on top of 1e-3.
        let err = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs() - b.abs() * 2f32.powi(-11))
            .fold(0.0f32, f32::max)
            / max_abs;
        assert!(err < 1e-3, "{stem}: last-position relative error {err:e}");

        // 64 teacher-forced positions: top-64 and 256 probe logits at every position.
        let t = reference(stem, "transformers");
        let tf = &t["teacher_forced"];
        let ids = u32s(&tf["ids"]);
        assert_eq!(ids.len(), 64);
        let probe = u32s(&tf["probe_ids"]);
        let mut cache = dec.new_cache(4096);
        let all = dec
            .forward(&ids, &[ids.len()], &mut [&mut cache], Outputs::AllLogits)
            .unwrap();
        let mut worst = 0.0f32;
        let mut top1_equal = 0;
        for (pos, p) in tf["positions"].as_array().unwrap().iter().enumerate() {
            let row = &all[pos * vocab..(pos + 1) * vocab];
            let max_abs = p["max_abs"].as_f64().unwrap() as f32;
            let pairs = u32s(&p["top_ids"])
                .into_iter()
                .zip(f32s(&p["top_logits"]))
                .chain(probe.iter().copied().zip(f32s(&p["probe_logits"])));
            for (id, want) in pairs {
                worst = worst.max((row[id as usize] - want).abs() / max_abs);
            }
            top1_equal += usize::from(argmax(row) == u32s(&p["top_ids"])[0]);
        }
        eprintln!("{stem}: f32 vs transformers, worst relative error {worst:.2e}, top-1 equal {top1_equal}/64");
        assert!(worst < 1e-3, "{stem}: relative error {worst:e}");
        assert_eq!(top1_equal, 64, "{stem}");
    }
}

#[test]
fn quantized_greedy_matches_llama_cpp() {
    for (file, stem) in MODELS {
        let model = TextModel::load(&real_gguf(file), WeightMode::Quantized).unwrap();
        let dec = model.decoder.as_ref();
        let r = reference(stem, "llamacpp");
        let prompts = r["prompts"].as_array().unwrap();
        let mut equal = 0;
        // Tokens equal to llama.cpp's before the first difference, over all prompts.
        let mut matched = 0;
        for p in prompts {
            let ids = u32s(&p["prompt_ids"]);
            let want = u32s(&p["generated_ids"]);
            let gaps = f32s(&p["top2_gap"]);
            let mut cache = dec.new_cache(4096);
            let mut logits = dec
                .forward(&ids, &[ids.len()], &mut [&mut cache], Outputs::LastLogits)
                .unwrap();
            let mut diverged = None;
            for (step, &w) in want.iter().enumerate() {
                let got = argmax(&logits);
                if got != w {
                    diverged = Some((step, got, top2_gap(&logits)));
                    break;
                }
                logits = dec
                    .forward(&[w], &[1], &mut [&mut cache], Outputs::LastLogits)
                    .unwrap();
            }
            matched += diverged.map_or(want.len(), |(step, _, _)| step);
            match diverged {
                None => equal += 1,
                Some((step, got, our_gap)) => {
                    let their_gap = gaps[step];
                    eprintln!(
                        "{stem}/{}: diverges at step {step} (llama.cpp {} gap {their_gap:.3}, ours {got} gap {our_gap:.3})",
                        p["name"], want[step]
                    );
                    assert!(
                        their_gap.min(our_gap) < 0.25,
                        "{stem}/{}: divergence at step {step} is not a near-tie",
                        p["name"]
                    );
                }
            }
        }
        let mean = matched as f64 / prompts.len() as f64;
        eprintln!(
            "{stem}: {equal}/{} prompts equal to llama.cpp for 32 tokens, {mean:.1} tokens equal \
             before the first difference on average",
            prompts.len()
        );
        // Every difference is a near-tie (above). How many continuations stay equal for all 32
        // tokens depends on both engines' summation order: llama.cpp's own AVX2 and AVX-512
        // builds agree on 5 of these 10 (measured), and this reference comes from an AVX-512
        // build. So the bar is on length: on average, at least half of each continuation
        // equals llama.cpp's before any near-tie flips it.
        assert!(
            2.0 * mean >= r["gen_tokens"].as_f64().unwrap(),
            "{stem}: only {mean:.1} tokens equal on average ({equal} prompts equal throughout)"
        );
    }
}
