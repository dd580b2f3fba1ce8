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
        ..Default::default()
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

/// Qwen3-Embedding (a Qwen3 decoder as encoder): EOS appended by the tokenizer, last-token
/// pooling, L2 normalization, the "query" instruction prompt, and Matryoshka truncation.
#[test]
fn qwen3_embedding_matches_sentence_transformers() {
    let dir = tiny("tiny-qwen3-embedding");
    let reference = json(&dir.join("reference.json"));
    let e = Embedder::load_dir(&dir, EmbedderOptions::default()).unwrap();
    assert_eq!(e.dim(), 64);
    let ids_of = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    let texts = |key: &str| -> Vec<String> {
        reference[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|q| q["text"].as_str().unwrap().to_string())
            .collect()
    };
    let queries = texts("queries");
    let docs = texts("documents");
    let q_refs: Vec<&str> = queries.iter().map(String::as_str).collect();
    let d_refs: Vec<&str> = docs.iter().map(String::as_str).collect();
    let q = e.embed_as(&q_refs, lattice_embed::TextKind::Query).unwrap();
    let d = e.embed(&d_refs).unwrap();
    let prompt = reference["query_prompt"].as_str().unwrap();
    for (i, r) in reference["queries"].as_array().unwrap().iter().enumerate() {
        let ids = e.token_ids(&format!("{prompt}{}", queries[i])).unwrap();
        assert_eq!(ids, ids_of(&r["ids"]), "query {i} ids");
        let err = one_minus_cos(&q[i], &f32s(&r["embedding"]));
        assert!(err < 1e-6, "query {i}: 1 - cos = {err:e}");
    }
    for (i, r) in reference["documents"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
    {
        assert_eq!(
            e.token_ids(&docs[i]).unwrap(),
            ids_of(&r["ids"]),
            "doc {i} ids"
        );
        let err = one_minus_cos(&d[i], &f32s(&r["embedding"]));
        assert!(err < 1e-6, "document {i}: 1 - cos = {err:e}");
    }

    // Matryoshka: the first 32 dimensions, renormalized (sentence-transformers' truncate_dim
    // slices without renormalizing; the direction is the same).
    let opts = EmbedderOptions {
        dimensions: Some(32),
        ..Default::default()
    };
    let e32 = Embedder::load_dir(&dir, opts).unwrap();
    assert_eq!(e32.dim(), 32);
    let q32 = e32
        .embed_as(&q_refs, lattice_embed::TextKind::Query)
        .unwrap();
    for (i, want) in reference["queries_dim32"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
    {
        assert_eq!(q32[i].len(), 32);
        let norm: f32 = q32[i].iter().map(|x| x * x).sum();
        assert!((norm - 1.0).abs() < 1e-5);
        let err = one_minus_cos(&q32[i], &f32s(want));
        assert!(err < 1e-6, "query {i} at 32 dims: 1 - cos = {err:e}");
    }
    for bad in [0, 65] {
        let opts = EmbedderOptions {
            dimensions: Some(bad),
            ..Default::default()
        };
        assert!(Embedder::load_dir(&dir, opts).is_err());
    }
}
