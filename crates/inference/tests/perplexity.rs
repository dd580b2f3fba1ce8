//! `lattice_inference::perplexity` (llama-perplexity's semantics):
//! - on the tiny Llama fixture, against the same scoring done by hand from every position's
//!   logits (chunking, BOS replacement, the scored half, the ± formula) and its input checks;
//! - on a real GGUF (SmolLM2-135M-Instruct Q4_1) over the first chunks of Moby-Dick
//!   (scripts/fetch_text.sh), against llama.cpp's own `llama-perplexity` figure on the same file
//!   and text (tests/fixtures/gguf/perplexity.json, made by the command recorded there): within
//!   the 0.5%.

mod common;

use common::{fixture, real_gguf};
use lattice_inference::engine::TextModel;
use lattice_inference::model::decoder::{load_decoder, Outputs};
use lattice_inference::model::source::WeightMode;
use lattice_inference::perplexity::{log_prob, perplexity, PerplexityOptions};
use serde_json::Value;

fn stream(n: usize, vocab: u32) -> Vec<u32> {
    // A fixed pseudo-random stream (LCG), ids in 3..vocab.
    let mut s = 0x2545_f491_4f6c_dd1du64;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            3 + ((s >> 33) as u32) % (vocab - 3)
        })
        .collect()
}

#[test]
fn scores_the_second_half_of_each_chunk_as_llama_perplexity() {
    let dec = load_decoder(&fixture("tiny-llama"), WeightMode::F32).unwrap();
    let vocab = dec.info().config.vocab_size;
    let ctx = 16;
    let tokens = stream(ctx * 3 + 5, vocab as u32);
    let opts = PerplexityOptions {
        ctx,
        max_chunks: None,
        bos: Some(1),
    };
    let mut seen = Vec::new();
    let got = perplexity(
        dec.as_ref(),
        |n| dec.new_cache(n),
        &tokens,
        &opts,
        |done, total, ppl| seen.push((done, total, ppl)),
    )
    .unwrap();
    // By hand: three whole chunks (the 5 left over are not scored), BOS first, every
    // position's logits, positions 8..=14 predicting tokens 9..=15.
    let (mut nll, mut nll2, mut count) = (0.0f64, 0.0f64, 0usize);
    for c in 0..3 {
        let mut ids = tokens[c * ctx..(c + 1) * ctx].to_vec();
        ids[0] = 1;
        let mut st = dec.new_cache(ctx);
        let all = dec
            .forward(&ids, &[ctx], &mut [&mut st], Outputs::AllLogits)
            .unwrap();
        for p in ctx / 2..ctx - 1 {
            let v = log_prob(&all[p * vocab..(p + 1) * vocab], ids[p + 1] as usize);
            nll -= v;
            nll2 += v * v;
            count += 1;
        }
    }
    let mean = nll / count as f64;
    let want = mean.exp();
    let err = ((nll2 / count as f64 - mean * mean) / (count - 1) as f64).sqrt() * want;
    assert_eq!((got.chunks, got.scored, got.tokens), (3, 21, tokens.len()));
    assert!(
        (got.ppl - want).abs() <= 1e-9 * want,
        "{} vs {want}",
        got.ppl
    );
    assert!((got.ppl_error - err).abs() <= 1e-9 * err);
    assert_eq!(seen.len(), 3);
    assert_eq!((seen[2].0, seen[2].1), (3, 3));
    assert!((seen[2].2 - got.ppl).abs() <= 1e-12 * want);
    assert_eq!(got.running.len(), 3);
    assert!(got.ppl.is_finite() && got.ppl > 1.0, "{}", got.ppl);

    // --chunks caps the chunks.
    let one = PerplexityOptions {
        max_chunks: Some(1),
        ..opts
    };
    let got1 = perplexity(
        dec.as_ref(),
        |n| dec.new_cache(n),
        &tokens,
        &one,
        |_, _, _| {},
    )
    .unwrap();
    assert_eq!((got1.chunks, got1.scored), (1, 7));
    assert_eq!(got1.running[0], got.running[0]);

    // Bad input: a text shorter than two chunks, a context too small or past the model's,
    // ids outside the vocabulary; each error says which.
    let short = perplexity(
        dec.as_ref(),
        |n| dec.new_cache(n),
        &tokens[..31],
        &opts,
        |_, _, _| {},
    );
    let msg = short.unwrap_err().to_string();
    assert!(
        msg.contains("31 tokens") && msg.contains("at least 32"),
        "{msg}"
    );
    let max = dec.info().config.max_positions;
    for bad_ctx in [2, max + 1] {
        let o = PerplexityOptions {
            ctx: bad_ctx,
            ..opts
        };
        let long = stream(2 * bad_ctx + 2, vocab as u32);
        let msg = perplexity(dec.as_ref(), |n| dec.new_cache(n), &long, &o, |_, _, _| {})
            .unwrap_err()
            .to_string();
        assert!(msg.contains("context"), "{msg}");
    }
    let mut oov = tokens.clone();
    oov[20] = vocab as u32 + 7;
    let msg = perplexity(
        dec.as_ref(),
        |n| dec.new_cache(n),
        &oov,
        &opts,
        |_, _, _| {},
    )
    .unwrap_err()
    .to_string();
    assert!(msg.contains(&format!("{}", vocab + 7)), "{msg}");
}

#[test]
fn equals_llama_perplexity_on_a_real_gguf() {
    let refs: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("gguf").join("perplexity.json")).unwrap(),
    )
    .unwrap();
    let text = common::real_text(refs["text"].as_str().unwrap());
    for r in refs["runs"].as_array().unwrap() {
        let file = r["model"].as_str().unwrap();
        if r["ci"].as_bool() != Some(true) {
            continue;
        }
        let model = TextModel::load(&real_gguf(file), WeightMode::Quantized).unwrap();
        let tokens = model.encode_prompt(&text, true).unwrap();
        assert_eq!(
            tokens.len() as u64,
            r["tokens"].as_u64().unwrap(),
            "{file}: tokens"
        );
        let opts = PerplexityOptions {
            ctx: r["ctx"].as_u64().unwrap() as usize,
            max_chunks: Some(r["chunks"].as_u64().unwrap() as usize),
            bos: None,
        };
        let got = common::perplexity_of(&model, &tokens, &opts);
        let want = r["ppl"].as_f64().unwrap();
        let rel = (got.ppl - want).abs() / want;
        println!(
            "{file}: lattice {:.4} llama-perplexity {want:.4} ({rel:.2e})",
            got.ppl
        );
        assert!(
            rel < 5e-3,
            "{file}: {} vs llama.cpp {want} ({rel:.2e})",
            got.ppl
        );
    }
}
