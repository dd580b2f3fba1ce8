//! `lattice_inference::quantize` on a real GGUF (SmolLM2-135M-Instruct Q4_1, scripts/fetch_models.sh):
//! - QuaRot's rotation alone (`rotate-f32`: norms folded, residual stream rotated by a randomized
//!   Hadamard matrix of order 576 = 36 · 16, head untied) computes the same function: last
//!   logits within 1e-4 of the original (f32), greedy tokens equal;
//! - the same with the down projections' inputs rotated at run time (`rotate-f32-online`);
//! - the 4-bit files (`quarot-w4a8`, plain `q4_0`) load and stay close to the original, and the
//!   rotation lowers the 4-bit error against the same rounding without it;
//! - GPTQ rounding (calibrated on one part of Moby-Dick, scripts/fetch_text.sh) gives a lower
//!   perplexity on another part than the searched rounding of the same QuaRot Q4_0 file;
//! - files are GGUF the loader reads, with the method recorded; bad requests are refused.

mod common;

use common::{greedy, real_gguf, rel_err};
use lattice_inference::engine::TextModel;
use lattice_inference::io::gguf::GgufFile;
use lattice_inference::model::decoder::load_decoder;
use lattice_inference::model::source::WeightMode;
use lattice_inference::perplexity::PerplexityOptions;
use lattice_inference::quant::QuantType;
use lattice_inference::quantize::{quantize_gguf, Calibration, Method, Rounding};

const PROMPT: [u32; 12] = [1, 504, 3458, 282, 4649, 314, 7042, 30, 378, 3458, 282, 2801];

#[test]
fn rotation_preserves_the_model_and_helps_four_bit_weights() {
    let src = real_gguf("SmolLM2-135M-Instruct.Q4_1.gguf");
    let tmp = std::env::temp_dir().join(format!("lattice-quantize-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let make = |name: &str, method: Method, rounding: Rounding| {
        let out = tmp.join(format!("{name}.gguf"));
        quantize_gguf(&src, &out, method, rounding, None, |_, _, _| {}).unwrap();
        out
    };
    let base = load_decoder(&src, WeightMode::F32).unwrap();
    let (want, want_ids) = greedy(base.as_ref(), &PROMPT, 16);

    let rotated = make(
        "rot",
        Method::parse("rotate-f32", 5).unwrap(),
        Rounding::Nearest,
    );
    let header = GgufFile::open(&rotated).unwrap();
    assert_eq!(
        header
            .metadata("lattice.quantize.method")
            .and_then(|v| v.as_str()),
        Some("quarot-f32")
    );
    assert!(header.tensor("output.weight").is_some(), "head untied");
    let m = load_decoder(&rotated, WeightMode::F32).unwrap();
    let (got, ids) = greedy(m.as_ref(), &PROMPT, 16);
    let err = rel_err(&got, &want);
    eprintln!("rotate-f32: relative logit error {err:.2e}");
    assert!(err < 1e-4, "rotation changed the logits by {err:e}");
    assert_eq!(ids, want_ids);

    // With the down projections' inputs rotated too (applied by the loader at run time).
    let online = make(
        "rot-online",
        Method::parse("rotate-f32-online", 5).unwrap(),
        Rounding::Nearest,
    );
    let m = load_decoder(&online, WeightMode::F32).unwrap();
    let (got, ids) = greedy(m.as_ref(), &PROMPT, 16);
    let err = rel_err(&got, &want);
    eprintln!("rotate-f32-online: relative logit error {err:.2e}");
    assert!(err < 1e-4, "online rotation changed the logits by {err:e}");
    assert_eq!(ids, want_ids);
    let err = quantize_gguf(
        &online,
        &tmp.join("again.gguf"),
        Method::parse("quarot-w4a8", 0).unwrap(),
        Rounding::Mse,
        None,
        |_, _, _| {},
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("already"), "{err}");

    // 4-bit: same rounding (ggml's nearest, Q4_0), with and without the rotation.
    let q4 = make("q4", Method::Plain(QuantType::Q4_0), Rounding::Nearest);
    let quarot = make(
        "quarot",
        Method::Quarot {
            weights: QuantType::Q4_0,
            seed: 5,
            online: false,
        },
        Rounding::Nearest,
    );
    let err_of = |path: &std::path::Path| {
        let m = load_decoder(path, WeightMode::Quantized).unwrap();
        let (got, _) = greedy(m.as_ref(), &PROMPT, 1);
        rel_err(&got, &want)
    };
    let (e_q4, e_quarot) = (err_of(&q4), err_of(&quarot));
    eprintln!("4-bit logit error: plain Q4_0 {e_q4:.3}, QuaRot Q4_0 {e_quarot:.3}");
    assert!(
        e_quarot < e_q4,
        "rotation did not help: {e_quarot} vs {e_q4}"
    );
    assert!(e_quarot < 0.5, "QuaRot Q4_0 logits off by {e_quarot}");
    std::fs::remove_dir_all(&tmp).ok();
}

#[test]
fn gptq_beats_searched_rounding_on_held_out_text() {
    let src = real_gguf("SmolLM2-135M-Instruct.Q4_1.gguf");
    let text = common::real_text("moby-dick.txt");
    // Evaluate on the start of the book, calibrate on lines from its second half.
    let (eval, rest) = text.split_at(text.char_indices().nth(40_000).unwrap().0);
    let cal_start = rest.len() / 2 + rest[rest.len() / 2..].find('\n').unwrap() + 1;
    let calibration = Calibration {
        text: &rest[cal_start..],
        tokens: 2048,
        ctx: 256,
    };
    let tmp = std::env::temp_dir().join(format!("lattice-gptq-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let method = Method::parse("quarot-w4a8-sym", 3).unwrap();
    let ppl_of = |path: &std::path::Path| {
        let model = TextModel::load(path, WeightMode::Quantized).unwrap();
        let tokens = model.encode_prompt(eval, true).unwrap();
        let opts = PerplexityOptions {
            ctx: 256,
            max_chunks: Some(4),
            bos: model.bos_prefix,
        };
        common::perplexity_of(&model, &tokens, &opts).ppl
    };
    let searched = tmp.join("searched.gguf");
    quantize_gguf(&src, &searched, method, Rounding::Mse, None, |_, _, _| {}).unwrap();
    let gptq = tmp.join("gptq.gguf");
    let mut stages = Vec::new();
    quantize_gguf(
        &src,
        &gptq,
        method,
        Rounding::Gptq,
        Some(&calibration),
        |stage, done, total| {
            if done == total {
                stages.push(stage)
            }
        },
    )
    .unwrap();
    use lattice_inference::quantize::Stage;
    assert_eq!(stages, [Stage::Rewrite, Stage::Calibrate, Stage::Encode]);
    let header = GgufFile::open(&gptq).unwrap();
    assert_eq!(
        header
            .metadata("lattice.quantize.rounding")
            .and_then(|v| v.as_str()),
        Some("gptq")
    );
    let leftovers: Vec<_> = std::fs::read_dir(&tmp)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains("tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
    let base = ppl_of(&src);
    let (p_searched, p_gptq) = (ppl_of(&searched), ppl_of(&gptq));
    eprintln!("perplexity (4 x 256 tokens): original {base:.3}, QuaRot Q4_0 searched {p_searched:.3}, GPTQ {p_gptq:.3}");
    assert!(
        p_gptq < p_searched,
        "GPTQ {p_gptq} is not below searched rounding {p_searched}"
    );
    let refused = |method, rounding, text: Option<&Calibration>| {
        quantize_gguf(&src, &gptq, method, rounding, text, |_, _, _| {})
            .unwrap_err()
            .to_string()
    };
    // GPTQ without a calibration text is refused.
    let err = refused(method, Rounding::Gptq, None);
    assert!(err.contains("calibration"), "{err}");
    // A calibration text without GPTQ, and GPTQ on a method without 4-bit blocks, are refused.
    let err = refused(method, Rounding::Mse, Some(&calibration));
    assert!(err.contains("GPTQ rounding only"), "{err}");
    let err = refused(
        Method::Plain(QuantType::Q8_0),
        Rounding::Gptq,
        Some(&calibration),
    );
    assert!(err.contains("writes none"), "{err}");
    std::fs::remove_dir_all(&tmp).ok();
}

#[test]
fn unsupported_requests_are_refused() {
    let src = real_gguf("SmolLM2-135M-Instruct.Q4_1.gguf");
    let out =
        std::env::temp_dir().join(format!("lattice-quantize-bad-{}.gguf", std::process::id()));
    let q4k = Method::Quarot {
        weights: QuantType::Q4_K,
        seed: 0,
        online: false,
    };
    let err = quantize_gguf(&src, &out, q4k, Rounding::Mse, None, |_, _, _| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("Q4_0, Q4_1 or F32"), "{err}");
    let qwen35 = common::fixture("tiny-qwen35").join("tiny-qwen35.bf16.gguf");
    let err = quantize_gguf(
        &qwen35,
        &out,
        Method::parse("quarot-w4a8", 0).unwrap(),
        Rounding::Mse,
        None,
        |_, _, _| {},
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("qwen35"), "{err}");
    assert!(Method::parse("q4_k", 0).is_none());
}
