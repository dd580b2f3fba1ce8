//! End to end, text in → vector out, against sentence-transformers: the tiny random-weight
//! fixtures and the real all-MiniLM-L6-v2 / all-mpnet-base-v2 (including texts truncated at the
//! 256 / 384 token limits), the cross-encoder on text pairs, and STS-B dev Spearman.

use std::path::{Path, PathBuf};

use lattice_embed::{eval, vector, Embedder, EmbedderOptions, Reranker};

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn tiny(name: &str) -> PathBuf {
    manifest().join("../inference/tests/fixtures").join(name)
}

fn real(name: &str) -> PathBuf {
    let p = manifest().join("../../.cache/models").join(name);
    assert!(
        p.join("config.json").is_file(),
        "{} missing: run scripts/fetch_models.sh",
        p.display()
    );
    p
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn f32s(v: &serde_json::Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn one_minus_cos(a: &[f32], b: &[f32]) -> f64 {
    let (mut d, mut na, mut nb) = (0.0f64, 0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        d += x as f64 * y as f64;
        na += x as f64 * x as f64;
        nb += y as f64 * y as f64;
    }
    1.0 - d / (na.sqrt() * nb.sqrt())
}

/// Embeds the reference texts (small token budget, so several packed batches run) and compares
/// token ids and vectors.
fn check(dir: &Path, reference: &serde_json::Value) {
    let opts = EmbedderOptions {
        max_batch_tokens: 300,
    };
    let e = Embedder::load_dir(dir, opts).unwrap();
    let texts: Vec<&str> = reference["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let got = e.embed(&texts).unwrap();
    for (i, t) in texts.iter().enumerate() {
        let ids: Vec<u32> = reference["input_ids"][i]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(
            e.token_ids(t).unwrap(),
            ids,
            "{}: token ids of text {i}",
            dir.display()
        );
        let want = f32s(&reference["embeddings"][i]);
        let c = one_minus_cos(&got[i], &want);
        let m = got[i]
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            c < 1e-6 && m < 1e-5,
            "{}: text {i}: 1-cos {c:e} max diff {m:e}",
            dir.display()
        );
    }
}

#[test]
fn tiny_fixtures_end_to_end() {
    for name in ["tiny-bert", "tiny-bert-cls", "tiny-mpnet"] {
        let dir = tiny(name);
        check(&dir, &json(&dir.join("reference.json")));
    }
}

#[test]
fn real_models_end_to_end() {
    for (name, limit) in [("all-MiniLM-L6-v2", 256), ("all-mpnet-base-v2", 384)] {
        let r = json(
            &manifest()
                .join("tests/fixtures/real")
                .join(format!("{name}.json")),
        );
        let lens: Vec<usize> = r["input_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_array().unwrap().len())
            .collect();
        assert!(
            lens.contains(&limit),
            "{name}: the reference must include texts at the {limit}-token limit"
        );
        let dir = real(name);
        let e = Embedder::load_dir(&dir, EmbedderOptions::default()).unwrap();
        assert_eq!(e.max_tokens(), limit);
        check(&dir, &r);
    }
}

#[test]
fn cross_encoder_scores_text_pairs() {
    let dir = tiny("tiny-cross-encoder");
    let r = json(&dir.join("reference.json"));
    let reranker = Reranker::load_dir(&dir).unwrap();
    let want = f32s(&r["scores"]);
    for (i, pair) in r["pairs"].as_array().unwrap().iter().enumerate() {
        let (q, p) = (pair[0].as_str().unwrap(), pair[1].as_str().unwrap());
        let got = reranker.logits(q, &[p]).unwrap()[0];
        assert!(
            (got - want[i]).abs() < 1e-5,
            "pair {i}: {got} vs {}",
            want[i]
        );
        let s = reranker.scores(q, &[p]).unwrap()[0];
        assert!((s - 1.0 / (1.0 + (-want[i]).exp())).abs() < 1e-6);
    }
}

fn stsb() -> Vec<(String, String, f64)> {
    let path = manifest().join("../../../shared/data/stsb/stsb-en-dev.csv");
    let mut rd = csv::ReaderBuilder::new()
        .has_headers(false)
        .from_path(&path)
        .unwrap();
    rd.records()
        .map(|r| {
            let r = r.unwrap();
            (r[0].to_string(), r[1].to_string(), r[2].parse().unwrap())
        })
        .collect()
}

#[test]
fn stsb_spearman_equals_sentence_transformers() {
    let reference = json(&manifest().join("tests/fixtures/real/stsb_reference.json"));
    let pairs = stsb();
    assert_eq!(pairs.len(), 1500);
    for name in ["all-MiniLM-L6-v2", "all-mpnet-base-v2"] {
        let e = Embedder::load_dir(&real(name), EmbedderOptions::default()).unwrap();
        let a: Vec<&str> = pairs.iter().map(|p| p.0.as_str()).collect();
        let b: Vec<&str> = pairs.iter().map(|p| p.1.as_str()).collect();
        let (va, vb) = (e.embed(&a).unwrap(), e.embed(&b).unwrap());
        let sims: Vec<f64> = va
            .iter()
            .zip(&vb)
            .map(|(x, y)| vector::cosine(x, y) as f64)
            .collect();
        let gold: Vec<f64> = pairs.iter().map(|p| p.2).collect();
        let rho = eval::spearman(&sims, &gold) * 100.0;
        let want = reference[name].as_f64().unwrap();
        assert!(
            (rho - want).abs() < 0.01,
            "{name}: Spearman {rho} vs sentence-transformers {want}"
        );
    }
}
