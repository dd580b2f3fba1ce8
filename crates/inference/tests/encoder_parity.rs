//! Encoders against transformers / sentence-transformers, given the reference token ids (so
//! this checks the model math alone; tokenizer parity is tested separately): tiny random-weight
//! BERT / MPNet / cross-encoder fixtures and the real all-MiniLM-L6-v2 and all-mpnet-base-v2.
//! Bar: 1 - cosine < 1e-6 and max |difference| < 1e-5 in f32; scores within 1e-5.

mod common;

use common::*;
use lattice_inference::model::bert::BertForSequenceClassification;
use lattice_inference::model::heads::{self, Pooling};
use lattice_inference::model::{load_encoder, PackedBatch};

fn pooling(name: &str) -> Pooling {
    match name {
        "mean" => Pooling::Mean,
        "cls" => Pooling::Cls,
        other => panic!("unexpected pooling {other}"),
    }
}

/// Runs every reference text through the encoder as one packed batch and as single-sequence
/// batches; checks pooled embeddings (and per-token states where the reference has them).
fn check_encoder(
    dir: &std::path::Path,
    reference: &serde_json::Value,
    pool: Pooling,
    normalize: bool,
) {
    let enc = load_encoder(dir).unwrap();
    let d = enc.info().hidden_size;
    let ids: Vec<Vec<u32>> = reference["input_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(u32s)
        .collect();
    let mut batch = PackedBatch::new();
    for s in &ids {
        batch.push(s, &[]);
    }
    let hidden = enc.forward(&batch).unwrap();
    let mut pooled = heads::pool(&hidden, d, &batch.cu_seqlens, pool);
    if normalize {
        heads::l2_normalize_rows(&mut pooled, d);
    }
    let want = reference["embeddings"].as_array().unwrap();
    assert_eq!(want.len(), ids.len());
    for (i, w) in want.iter().enumerate() {
        let w = f32s(w);
        let got = &pooled[i * d..(i + 1) * d];
        let (c, m) = (one_minus_cos(got, &w), max_abs_diff(got, &w));
        assert!(
            c < 1e-6 && m < 1e-5,
            "{}: text {i}: 1-cos {c:e}, max diff {m:e}",
            dir.display()
        );
        if let Some(states) = reference.get("last_hidden_state") {
            let s = f32s_2d(&states[i]);
            let got = &hidden[batch.cu_seqlens[i] * d..batch.cu_seqlens[i + 1] * d];
            let m = max_abs_diff(got, &s);
            assert!(
                m < 1e-5,
                "{}: text {i}: hidden state max diff {m:e}",
                dir.display()
            );
        }
    }
    // Packing must not change results: the last sequence alone gives the same states.
    let mut single = PackedBatch::new();
    single.push(&ids[ids.len() - 1], &[]);
    let h1 = enc.forward(&single).unwrap();
    let last = ids.len() - 1;
    let hb = &hidden[batch.cu_seqlens[last] * d..];
    assert!(max_abs_diff(&h1, hb) < 1e-6, "packed vs single differ");
}

fn check_tiny(name: &str) {
    let dir = fixture(name);
    let r = read_json(&dir.join("reference.json"));
    check_encoder(
        &dir,
        &r,
        pooling(r["pooling"].as_str().unwrap()),
        r["normalize"].as_bool().unwrap(),
    );
}

#[test]
fn tiny_bert_matches_transformers() {
    check_tiny("tiny-bert");
}

#[test]
fn tiny_bert_cls_matches_transformers() {
    check_tiny("tiny-bert-cls");
}

#[test]
fn tiny_mpnet_matches_transformers() {
    check_tiny("tiny-mpnet");
}

#[test]
fn tiny_cross_encoder_scores_match_transformers() {
    let dir = fixture("tiny-cross-encoder");
    let r = read_json(&dir.join("reference.json"));
    let model = BertForSequenceClassification::load_dir(&dir).unwrap();
    let mut batch = PackedBatch::new();
    let ids = r["input_ids"].as_array().unwrap();
    let types = r["token_type_ids"].as_array().unwrap();
    for (i, t) in ids.iter().zip(types) {
        batch.push(&u32s(i), &u32s(t));
    }
    let logits = model.forward(&batch).unwrap();
    let want = f32s(&r["scores"]);
    assert_eq!(logits.len(), want.len());
    for (i, (g, w)) in logits.iter().zip(&want).enumerate() {
        assert!((g - w).abs() < 1e-5, "pair {i}: {g} vs {w}");
    }
}

fn check_real(name: &str) {
    let dir = real_model(name);
    let r = read_json(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../embed/tests/fixtures/real")
            .join(format!("{name}.json")),
    );
    check_encoder(&dir, &r, Pooling::Mean, true);
}

#[test]
fn real_all_minilm_l6_v2_matches_sentence_transformers() {
    check_real("all-MiniLM-L6-v2");
}

#[test]
fn real_all_mpnet_base_v2_matches_sentence_transformers() {
    check_real("all-mpnet-base-v2");
}
