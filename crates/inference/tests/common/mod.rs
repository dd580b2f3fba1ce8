//! Helpers shared by the integration tests: fixture paths and numeric comparisons.
#![allow(dead_code)]

use std::path::PathBuf;

pub mod lora;
pub mod overlap;

/// `crates/inference/tests/fixtures/<name>` (of the crate `CARGO_MANIFEST_DIR` names when the
/// test binary runs, so a binary built here also runs in a copy of the repo elsewhere).
pub fn fixture(name: &str) -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
        .join("tests/fixtures")
        .join(name)
}

/// A real model fetched by `scripts/fetch_models.sh`; fails (never skips) when missing.
pub fn real_model(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../.cache/models")
        .join(name);
    assert!(
        p.join("config.json").is_file(),
        "{} is missing: run scripts/fetch_models.sh",
        p.display()
    );
    p
}

/// A real GGUF file fetched by `scripts/fetch_models.sh`; fails (never skips) when missing.
pub fn real_gguf(name: &str) -> PathBuf {
    cached_file("models", name, "fetch_models.sh")
}

/// `.cache/<dir>/<name>`, asserting it exists (made by `scripts/<script>`).
fn cached_file(dir: &str, name: &str, script: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../.cache")
        .join(dir)
        .join(name);
    assert!(
        p.is_file(),
        "{} is missing: run scripts/{script}",
        p.display()
    );
    p
}

/// A text fetched by `scripts/fetch_text.sh` (`.cache/text/<name>`); fails (never skips) when
/// missing.
pub fn real_text(name: &str) -> String {
    let p = cached_file("text", name, "fetch_text.sh");
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// `model`'s perplexity over `tokens` (lattice_inference::perplexity, no progress reports).
pub fn perplexity_of(
    model: &lattice_inference::engine::TextModel,
    tokens: &[u32],
    opts: &lattice_inference::perplexity::PerplexityOptions,
) -> lattice_inference::perplexity::Perplexity {
    lattice_inference::perplexity::perplexity(
        model.decoder.as_ref(),
        |n| model.new_cache(n),
        tokens,
        opts,
        |_, _, _| {},
    )
    .unwrap()
}

/// Reads a JSON file.
pub fn read_json(path: &std::path::Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// A JSON array of numbers as f32.
pub fn f32s(v: &serde_json::Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// A JSON array of arrays of numbers, flattened.
pub fn f32s_2d(v: &serde_json::Value) -> Vec<f32> {
    v.as_array().unwrap().iter().flat_map(f32s).collect()
}

/// A JSON array of ids.
pub fn u32s(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// `1 - cosine(a, b)` computed in f64.
pub fn one_minus_cos(a: &[f32], b: &[f32]) -> f64 {
    let (mut d, mut na, mut nb) = (0.0f64, 0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        d += x as f64 * y as f64;
        na += x as f64 * x as f64;
        nb += y as f64 * y as f64;
    }
    1.0 - d / (na.sqrt() * nb.sqrt())
}

/// Largest absolute elementwise difference.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Reads a gzip-compressed text fixture (reference corpora are committed as `.jsonl.gz`).
pub fn read_gz(path: &std::path::Path) -> String {
    use std::io::Read;
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut text = String::new();
    flate2::read::GzDecoder::new(file)
        .read_to_string(&mut text)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text
}

/// `max |a - b| / max |b|`: the relative error used for logits.
pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() as f64)
        .fold(0.0, f64::max);
    let den = b.iter().map(|y| y.abs() as f64).fold(0.0, f64::max);
    num / den
}

/// Index of the largest value (the lowest index on ties): greedy decoding.
pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// The token ids of the prompt called `name` in `fixtures/<model>/reference.json`.
pub fn reference_prompt(model: &str, name: &str) -> Vec<u32> {
    let r = read_json(&fixture(model).join("reference.json"));
    let prompt = r["prompts"]
        .as_array()
        .expect("reference.json lists prompts")
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("{model}: no prompt `{name}` in reference.json"));
    u32s(&prompt["ids"])
}

/// Greedy decoding one token at a time over the KV cache: the last-position logits of the
/// prompt and the `steps` tokens picked.
pub fn greedy(
    model: &dyn lattice_inference::model::decoder::Decoder,
    prompt: &[u32],
    steps: usize,
) -> (Vec<f32>, Vec<u32>) {
    use lattice_inference::model::decoder::Outputs;
    let mut cache = model.new_cache(4096);
    let first = model
        .forward(
            prompt,
            &[prompt.len()],
            &mut [&mut cache],
            Outputs::LastLogits,
        )
        .unwrap();
    let mut out = vec![argmax(&first)];
    while out.len() < steps {
        let logits = model
            .forward(
                &out[out.len() - 1..],
                &[1],
                &mut [&mut cache],
                Outputs::LastLogits,
            )
            .unwrap();
        out.push(argmax(&logits));
    }
    (first, out)
}

/// The GPU for a CUDA test, or `None` after printing that `test` was skipped and why (no CUDA
/// in this build, no driver, no device).
pub fn gpu(test: &str) -> Option<lattice_inference::backend::Device> {
    match lattice_inference::backend::Device::open("cuda") {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("SKIPPED {test}: {e}");
            None
        }
    }
}

/// Serializes tensors (name → (dtype, shape, bytes)) as a safetensors file.
pub fn write_safetensors(
    path: &std::path::Path,
    tensors: &std::collections::BTreeMap<String, (&str, Vec<usize>, Vec<u8>)>,
) {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, (dtype, shape, bytes)) in tensors {
        let start = data.len();
        data.extend_from_slice(bytes);
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let mut h = serde_json::Value::Object(header).to_string().into_bytes();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(&data);
    std::fs::write(path, out).unwrap();
}

/// A greedy request of `max_tokens` (EOS ignored) that drafts up to `draft_tokens` a step.
pub fn drafting_greedy(
    prompt: Vec<u32>,
    max_tokens: usize,
    draft_tokens: usize,
) -> lattice_inference::engine::GenerateRequest {
    use lattice_inference::engine::GenerateRequest;
    use lattice_inference::sample::SamplingParams;
    let mut r = GenerateRequest::new(prompt, max_tokens, SamplingParams::greedy());
    r.ignore_eos = true;
    r.draft_tokens = draft_tokens;
    r
}

/// `req` run alone to the end.
pub fn generate_alone(
    m: &lattice_inference::engine::TextModel,
    req: &lattice_inference::engine::GenerateRequest,
) -> lattice_inference::engine::Generation {
    lattice_inference::engine::generate(m, req, &mut |_| true).unwrap()
}

/// The reference prompts of decoder fixture `name`.
pub fn prompts_of(name: &str) -> Vec<Vec<u32>> {
    let r = read_json(&fixture(name).join("reference.json"));
    r["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| u32s(&p["ids"]))
        .collect()
}

/// Speculative decoding leaves outputs unchanged on fixture `name` loaded as `m`: greedy
/// outputs with prompt-lookup and suffix drafts equal those without, token for token, and some
/// drafts are accepted and some rejected (the rollback runs); then in a batch that mixes
/// drafting, sampled and prefilling requests, every output equals the request's alone.
pub fn check_drafts_leave_outputs_unchanged(m: &lattice_inference::engine::TextModel, name: &str) {
    use lattice_inference::engine::{BatchEngine, Drafter, GenerateRequest};
    use lattice_inference::sample::SamplingParams;
    let prompts = prompts_of(name);
    for drafter in [Drafter::Ngram, Drafter::Suffix] {
        let (mut drafted, mut accepted) = (0, 0);
        for p in &prompts {
            let want = generate_alone(m, &drafting_greedy(p.clone(), 96, 0));
            let mut req = drafting_greedy(p.clone(), 96, 8);
            req.drafter = drafter;
            let got = generate_alone(m, &req);
            assert_eq!(
                got.token_ids, want.token_ids,
                "{name}, {drafter:?}: drafts changed the output"
            );
            assert_eq!(got.finish_reason, want.finish_reason);
            drafted += got.drafted_tokens;
            accepted += got.accepted_tokens;
        }
        eprintln!("{name}, {drafter:?}: {accepted} of {drafted} drafted tokens accepted");
        assert!(accepted > 0, "{name}: no draft was ever accepted");
        assert!(
            accepted < drafted,
            "{name}: no draft was ever rejected (the rollback went untested)"
        );
    }
    // In a batch: drafting requests beside sampled ones and ones still prefilling.
    let mut engine = BatchEngine::new(m, 8);
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
            let mut g = drafting_greedy(p.clone(), 96, 6);
            g.drafter = if k % 2 == 0 {
                Drafter::Ngram
            } else {
                Drafter::Suffix
            };
            g
        };
        let mut plain = req.clone();
        plain.draft_tokens = 0;
        want.push(generate_alone(m, &plain).token_ids);
        engine.submit(req).unwrap();
    }
    let done = engine.run_all().unwrap();
    for ((_, g), w) in done.iter().zip(&want) {
        assert_eq!(
            &g.token_ids, w,
            "{name}: drafts in a batch changed an output"
        );
    }
}

/// A fixed-seed xorshift generator of values in [-1, 1): random test inputs without a
/// dependency.
pub struct Rng(pub u64);

impl Rng {
    /// The next value in [-1, 1).
    pub fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// `n` values in [-scale, scale).
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale).collect()
    }
}
