//! Decoders (Llama, Qwen2, Qwen3) against transformers on the tiny random-weight checkpoints
//! made by scripts/gen_decoder_fixtures.py: last-position logits of every prompt within 1e-4
//! relative error (f32), and 64 greedy tokens equal, decoding one token at a time over the KV
//! cache. Also: chunked prefill and batching do not change results, and bad input is refused.

mod common;

use common::{f32s, fixture, greedy, read_json, rel_err, u32s};
use lattice_inference::model::decoder::{load_decoder, Outputs};
use lattice_inference::model::source::WeightMode;

const MODELS: [&str; 3] = ["tiny-qwen3", "tiny-llama", "tiny-qwen2"];

#[test]
fn logits_and_greedy_match_transformers() {
    for name in MODELS {
        let dir = fixture(name);
        let model = load_decoder(&dir, WeightMode::F32).unwrap();
        let reference = read_json(&dir.join("reference.json"));
        let prompts = reference["prompts"].as_array().unwrap();
        assert!(prompts.len() >= 6);
        let mut worst = 0.0f64;
        for p in prompts {
            let ids = u32s(&p["ids"]);
            let want_logits = f32s(&p["last_logits"]);
            let want_greedy = u32s(&p["greedy_ids"]);
            assert_eq!(want_greedy.len(), 64);
            let (logits, got) = greedy(model.as_ref(), &ids, 64);
            let err = rel_err(&logits, &want_logits);
            worst = worst.max(err);
            assert!(err < 1e-4, "{name}/{}: relative error {err:e}", p["name"]);
            assert_eq!(
                got, want_greedy,
                "{name}/{}: greedy tokens differ",
                p["name"]
            );
        }
        eprintln!(
            "{name}: {} prompts, worst relative logit error {worst:.2e}",
            prompts.len()
        );
    }
}

#[test]
fn chunked_prefill_and_batching_do_not_change_logits() {
    for name in MODELS {
        let dir = fixture(name);
        let model = load_decoder(&dir, WeightMode::F32).unwrap();
        let reference = read_json(&dir.join("reference.json"));
        let long = reference["prompts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "long")
            .unwrap();
        let ids = u32s(&long["ids"]);
        assert!(ids.len() >= 300);

        // All positions at once.
        let mut c_all = model.new_cache(1024);
        let all = model
            .forward(&ids, &[ids.len()], &mut [&mut c_all], Outputs::AllLogits)
            .unwrap();
        let vocab = all.len() / ids.len();

        // The same prompt in uneven chunks.
        let mut c_chunk = model.new_cache(1024);
        let mut start = 0;
        for len in [1, 63, 64, 100, ids.len() - 228] {
            let part = model
                .forward(
                    &ids[start..start + len],
                    &[len],
                    &mut [&mut c_chunk],
                    Outputs::AllLogits,
                )
                .unwrap();
            let want = &all[start * vocab..(start + len) * vocab];
            let err = rel_err(&part, want);
            assert!(err < 1e-5, "{name}: chunk at {start}: {err:e}");
            start += len;
        }
        assert_eq!(c_chunk.len(), ids.len());

        // Two sequences in one batch: one decoding, one prefilling.
        let short = u32s(&reference["prompts"][1]["ids"]);
        let mut c_a = model.new_cache(1024);
        let mut c_b = model.new_cache(1024);
        let mut batch_ids = ids[..10].to_vec();
        batch_ids.extend_from_slice(&short);
        let batched = model
            .forward(
                &batch_ids,
                &[10, short.len()],
                &mut [&mut c_a, &mut c_b],
                Outputs::LastLogits,
            )
            .unwrap();
        let err_a = rel_err(&batched[..vocab], &all[9 * vocab..10 * vocab]);
        let want_b = f32s(&reference["prompts"][1]["last_logits"]);
        let err_b = rel_err(&batched[vocab..], &want_b);
        assert!(
            err_a < 1e-5 && err_b < 1e-4,
            "{name}: batched {err_a:e} {err_b:e}"
        );
    }
}

#[test]
fn bad_input_is_an_error() {
    let model = load_decoder(&fixture("tiny-qwen3"), WeightMode::F32).unwrap();
    let vocab = model.info().config.vocab_size as u32;
    let mut cache = model.new_cache(16);
    let e = model
        .forward(&[vocab], &[1], &mut [&mut cache], Outputs::LastLogits)
        .unwrap_err();
    assert!(e.to_string().contains("outside the vocabulary"), "{e}");
    assert_eq!(cache.len(), 0);
    let e = model
        .forward(&[1; 17], &[17], &mut [&mut cache], Outputs::LastLogits)
        .unwrap_err();
    assert!(e.to_string().contains("at most 16"), "{e}");
    assert!(model
        .forward(&[1, 2], &[1], &mut [&mut cache], Outputs::LastLogits)
        .is_err());
    // The cache is still usable after refused calls.
    assert!(model
        .forward(&[1, 2], &[2], &mut [&mut cache], Outputs::LastLogits)
        .is_ok());
    assert_eq!(cache.len(), 2);
}
