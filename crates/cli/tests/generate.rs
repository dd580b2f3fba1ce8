//! `lattice generate`, `lattice chat` and `lattice bench generate` end to end on the tiny
//! decoder fixtures (greedy output equal to transformers) and on bad input: a clear message on
//! stderr, a non-zero exit, never a panic.

mod support;

use std::io::Write;
use std::process::{Command, Stdio};

use support::{assert_fails_with, fixture, lattice, stderr};

fn reference(model: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(fixture(model).join("reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

#[test]
fn greedy_json_equals_transformers() {
    for model in ["tiny-qwen3", "tiny-llama", "tiny-qwen2", "tiny-qwen35"] {
        let r = reference(model);
        let p = r["prompts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "sentence")
            .unwrap();
        let dir = fixture(model);
        let o = lattice(&[
            "generate",
            "--model",
            dir.to_str().unwrap(),
            "--prompt",
            // (The Qwen3.5 reference stores ids only; its "sentence" prompt is this text.)
            p["text"].as_str().unwrap_or("The capital of France is"),
            "--temperature",
            "0",
            "--max-tokens",
            "64",
            "--ignore-eos",
            "--json",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let line = String::from_utf8(o.stdout.clone()).unwrap();
        let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
        assert_eq!(ids(&v["token_ids"]), ids(&p["greedy_ids"]), "{model}");
        assert_eq!(v["prompt_tokens"], p["ids"].as_array().unwrap().len());
        assert_eq!(v["completion_tokens"], 64);
        assert!(v["text"].is_string());
        let err = stderr(&o);
        assert!(err.contains("tokens/s"), "no speed report: {err}");
    }
}

#[test]
fn seeded_sampling_is_reproducible_and_streams_text() {
    let dir = fixture("tiny-qwen3");
    let run = |seed: &str| {
        let o = lattice(&[
            "generate",
            "--model",
            dir.to_str().unwrap(),
            "--prompt",
            "Once upon a time",
            "--temperature",
            "1.0",
            "--top-k",
            "50",
            "--top-p",
            "0.9",
            "--seed",
            seed,
            "--max-tokens",
            "20",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        String::from_utf8(o.stdout).unwrap()
    };
    assert_eq!(run("7"), run("7"));
    assert!(!run("7").trim().is_empty());
}

#[test]
fn chat_streams_replies_and_keeps_the_conversation() {
    let dir = fixture("tiny-qwen3");
    let mut child = Command::new(env!("CARGO_BIN_EXE_lattice"))
        .args([
            "chat",
            "--model",
            dir.to_str().unwrap(),
            "--temperature",
            "0",
            "--max-tokens",
            "8",
            "--thinking",
            "false",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"What is the capital of France?\nAnd of Japan?\n/reset\nHello\n/exit\n")
        .unwrap();
    let o = child.wait_with_output().unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert_eq!(err.matches("prompt:").count(), 3, "{err}");
    // The second turn reuses the first turn's cache.
    assert!(err.contains("reused from the cache"), "{err}");
    assert!(err.contains("conversation reset"), "{err}");
}

#[test]
fn bench_generate_reports_both_rates() {
    let dir = fixture("tiny-llama");
    let o = lattice(&[
        "bench",
        "generate",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-tokens",
        "64",
        "--gen-tokens",
        "8",
        "--runs",
        "1",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["prompt_tokens_per_s"].as_f64().unwrap() > 0.0);
    assert!(v["gen_tokens_per_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn bad_input_gives_clear_errors() {
    let dir = fixture("tiny-qwen3");
    let d = dir.to_str().unwrap();
    // Prompt longer than the context (1,024 tokens).
    let long = "word ".repeat(3000);
    assert_fails_with(
        &lattice(&[
            "generate",
            "--model",
            d,
            "--prompt",
            &long,
            "--max-tokens",
            "4",
        ]),
        &["context holds"],
    );
    assert_fails_with(
        &lattice(&["generate", "--model", d, "--prompt", "hi", "--top-p", "1.5"]),
        &["top_p"],
    );
    // Speculative decoding's bad values are refused, naming the flag.
    for (bad, names) in [
        (&["--speculative", "tree"][..], &["--speculative", "suffix"]),
        (
            &["--speculative", "ngram", "--draft-tokens", "99"],
            &["--draft-tokens", "99"],
        ),
    ] {
        let args = [&["generate", "--model", d, "--prompt", "hi"][..], bad].concat();
        assert_fails_with(&lattice(&args), names);
    }
    assert_fails_with(
        &lattice(&[
            "generate",
            "--model",
            "/nonexistent/model",
            "--prompt",
            "hi",
        ]),
        &["cannot load model", "/nonexistent/model"],
    );
    // A model without a chat template.
    let llama = fixture("tiny-llama");
    assert_fails_with(
        &lattice(&[
            "generate",
            "--model",
            llama.to_str().unwrap(),
            "--prompt",
            "hi",
            "--chat",
        ]),
        &["no chat template"],
    );
    // A truncated GGUF file and a file that is not GGUF at all.
    let tmp = tempfile::tempdir().unwrap();
    let trunc = tmp.path().join("trunc.gguf");
    let mut bytes = b"GGUF".to_vec();
    bytes.extend_from_slice(&3u32.to_le_bytes());
    bytes.extend_from_slice(&1000u64.to_le_bytes()); // tensors
    bytes.extend_from_slice(&5u64.to_le_bytes()); // metadata entries, then nothing
    std::fs::write(&trunc, &bytes).unwrap();
    assert_fails_with(
        &lattice(&[
            "generate",
            "--model",
            trunc.to_str().unwrap(),
            "--prompt",
            "hi",
        ]),
        &["trunc.gguf"],
    );
    let junk = tmp.path().join("junk.gguf");
    std::fs::write(&junk, b"this is not a model").unwrap();
    assert_fails_with(
        &lattice(&[
            "generate",
            "--model",
            junk.to_str().unwrap(),
            "--prompt",
            "hi",
        ]),
        &["junk.gguf"],
    );
}

#[test]
fn embed_with_a_qwen3_embedding_model_and_matryoshka_dimensions() {
    let dir = fixture("tiny-qwen3-embedding");
    let d = dir.to_str().unwrap();
    let o = lattice(&[
        "embed",
        "--model",
        d,
        "--query",
        "--dimensions",
        "32",
        "What is the capital of France?",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let e: Vec<f64> = v["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert_eq!(e.len(), 32);
    let r = reference("tiny-qwen3-embedding");
    let want: Vec<f64> = r["queries_dim32"][0]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    let dot: f64 = e.iter().zip(&want).map(|(a, b)| a * b).sum();
    let norm = |x: &[f64]| x.iter().map(|a| a * a).sum::<f64>().sqrt();
    assert!(1.0 - dot / (norm(&e) * norm(&want)) < 1e-6);
    assert_fails_with(
        &lattice(&["embed", "--model", d, "--dimensions", "65", "x"]),
        &["dimensions 65"],
    );
}

/// `--device` names a device this build or machine cannot use: a clear error naming it, never a
/// panic (without `--features cuda`: no CUDA backend; with it but no driver: no CUDA driver).
#[test]
fn unusable_devices_are_refused_with_the_reason() {
    let dir = fixture("tiny-qwen3");
    let model = dir.to_str().unwrap();
    for device in ["cuda", "cuda:3"] {
        let o = lattice(&[
            "generate", "--model", model, "--prompt", "hi", "--device", device,
        ]);
        assert_fails_with(&o, &["cuda"]);
        let err = stderr(&o);
        assert!(
            err.contains("no CUDA backend")
                || err.contains("no CUDA driver")
                || err.contains("no such device"),
            "{err}"
        );
    }
    let o = lattice(&["bench", "generate", "--model", model, "--device", "tpu"]);
    assert_fails_with(&o, &["unknown device `tpu`"]);
    // Encoders refuse a GPU before looking at the model.
    let o = lattice(&["embed", "--model", model, "--device", "cuda", "text"]);
    assert_fails_with(&o, &["cuda"]);
    // `serve --device` without a generation model would not place anything: refused.
    let o = lattice(&["serve", "--embedding-model", model, "--device", "cuda"]);
    assert_fails_with(&o, &["cuda"]);
    // The CPU stays the default and `--device cpu` is accepted everywhere.
    let o = lattice(&[
        "generate",
        "--model",
        model,
        "--prompt",
        "hi",
        "--max-tokens",
        "2",
        "--device",
        "cpu",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// Constrained generation on real GGUF models through the command line: every output that
/// completes is valid under its schema (every 29th schema of the corpus: all kinds, greedy; SmolLM2-135M
/// with a repetition penalty, since greedy it repeats itself inside free strings until the
/// limit), and the regex flag holds too.
#[test]
fn constrained_outputs_of_real_models_are_valid() {
    let corpus = std::fs::read_to_string(support::fixture("schemas").join("corpus.jsonl")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (model, extra) in [
        ("Qwen2.5-Coder-0.5B-Instruct.gguf", "1.0"),
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "1.3"),
    ] {
        let path = support::fetched_model(model, "");
        let m = path.to_str().unwrap();
        let (mut complete, mut total) = (0, 0);
        for (i, line) in corpus.lines().enumerate().step_by(29) {
            let entry: serde_json::Value = serde_json::from_str(line).unwrap();
            let schema = &entry["schema"];
            let file = dir.path().join(format!("s{i}.json"));
            std::fs::write(&file, schema.to_string()).unwrap();
            let o = support::lattice(&[
                "generate",
                "--model",
                m,
                "--chat",
                "--prompt",
                "Fill in one example JSON record for this form.",
                "--json-schema",
                file.to_str().unwrap(),
                "--max-tokens",
                "192",
                "--temperature",
                "0",
                "--json",
                "--repetition-penalty",
                extra,
            ]);
            let refused = String::from_utf8_lossy(&o.stderr).contains("Unsatisfiable");
            if refused {
                continue; // the corpus's unsatisfiable schemas are refused with the reason
            }
            assert!(
                o.status.success(),
                "{model} {}: {}",
                entry["name"],
                String::from_utf8_lossy(&o.stderr)
            );
            total += 1;
            let out: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            if out["finish_reason"] != "stop" {
                continue;
            }
            complete += 1;
            let text = out["text"].as_str().unwrap();
            let v: serde_json::Value = serde_json::from_str(text)
                .unwrap_or_else(|e| panic!("{model} {}: not JSON ({e}): {text:?}", entry["name"]));
            let validator = jsonschema::draft202012::new(schema).unwrap();
            if let Err(e) = validator.validate(&v) {
                panic!("{model} {}: {text} is invalid: {e}", entry["name"]);
            }
        }
        eprintln!("{model}: {complete} of {total} constrained outputs completed, all valid");
        assert!(
            complete * 2 >= total,
            "{model}: only {complete} of {total} completed"
        );
        let o = support::lattice(&[
            "generate",
            "--model",
            m,
            "--chat",
            "--prompt",
            "A product code, please.",
            "--regex",
            "[A-Z]{3}-[0-9]{4}",
            "--max-tokens",
            "16",
            "--temperature",
            "0",
            "--json",
        ]);
        let out: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let t = out["text"].as_str().unwrap();
        assert!(t.len() == 8 && t.as_bytes()[3] == b'-', "{model}: {t:?}");
    }
}

/// `--lora` (repeatable, with `--lora-scale`) and `--lora-merge`: the CLI's greedy output
/// equals the library's with the same adapters (held to peft by crates/inference/tests/lora.rs),
/// unmerged and merged alike, and differs from the base model's; bad flags name the problem.
#[test]
fn lora_adapters_from_the_cli() {
    use lattice_inference::engine::{generate, GenerateRequest, TextModel};
    use lattice_inference::lora::{Adapter, LoraPlan};
    use lattice_inference::model::source::{Placement, WeightMode};
    use lattice_inference::sample::SamplingParams;
    let base = "tiny-qwen3";
    let dir = fixture(base);
    let adapter = |n: &str| fixture("lora").join(base).join(n);
    let (attn, mlp) = (adapter("attn"), adapter("mlp"));
    let prompt = "The capital of France is";
    let run = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--model",
            dir.to_str().unwrap(),
            "--prompt",
            prompt,
            "--temperature",
            "0",
            "--max-tokens",
            "40",
            "--ignore-eos",
            "--json",
        ];
        args.extend_from_slice(extra);
        let o = lattice(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value =
            serde_json::from_str(String::from_utf8(o.stdout).unwrap().trim()).unwrap();
        ids(&v["token_ids"])
    };
    let library = |adapters: &[(&std::path::Path, f32)]| {
        let list = adapters
            .iter()
            .map(|&(p, s)| (Adapter::load(p).unwrap(), s))
            .collect();
        let mut place = Placement::new(WeightMode::F32, Default::default());
        place.lora = Some(std::sync::Arc::new(LoraPlan::new(list, false)));
        let m = TextModel::load_on(&dir, &place).unwrap();
        let mut req = GenerateRequest::new(
            m.encode_prompt(prompt, true).unwrap(),
            40,
            SamplingParams::greedy(),
        );
        req.ignore_eos = true;
        let g = generate(&m, &req, &mut |_| true).unwrap();
        g.token_ids
            .iter()
            .map(|&t| u64::from(t))
            .collect::<Vec<_>>()
    };
    let (a, m) = (attn.to_str().unwrap(), mlp.to_str().unwrap());
    let one = run(&["--lora", a]);
    assert_eq!(one, library(&[(&attn, 1.0)]));
    assert_eq!(
        run(&["--lora", a, "--lora-merge"]),
        one,
        "merged vs unmerged"
    );
    assert_ne!(one, run(&[]), "the adapter changes the output");
    let mix = run(&[
        "--lora",
        a,
        "--lora-scale",
        "0.7",
        "--lora",
        m,
        "--lora-scale",
        "0.5",
    ]);
    assert_eq!(mix, library(&[(&attn, 0.7), (&mlp, 0.5)]));
    let d = dir.to_str().unwrap();
    let fails = |extra: &[&str], names: &[&str]| {
        let args = [&["generate", "--model", d, "--prompt", "hi"][..], extra].concat();
        assert_fails_with(&lattice(&args), names);
    };
    fails(
        &["--lora", "/nonexistent/adapter"],
        &["LoRA adapter", "/nonexistent/adapter"],
    );
    fails(
        &["--lora", a, "--lora-scale", "1", "--lora-scale", "2"],
        &["--lora-scale", "2 times"],
    );
    // An adapter made for another model.
    let other = fixture("lora").join("tiny-qwen35").join("attn");
    fails(
        &["--lora", other.to_str().unwrap()],
        &["cannot load model", "lora_"],
    );
}

/// `lattice perplexity`, `lattice prune` and `--metrics layers` on the tiny fixtures: they run,
/// write what they promise, and bad input fails with a message naming what is wrong.
#[test]
fn perplexity_prune_and_layer_metrics() {
    let dir = std::env::temp_dir().join(format!("lattice-cli-ppl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = dir.join("text.txt");
    std::fs::write(
        &text,
        "Call me Ishmael. Some years ago, never mind how long precisely, having little or no \
         money in my purse, and nothing particular to interest me on shore, I thought I would \
         sail about a little and see the watery part of the world. "
            .repeat(4),
    )
    .unwrap();
    let model = fixture("tiny-qwen3");
    let (m, t) = (model.to_str().unwrap(), text.to_str().unwrap());
    let o = lattice(&[
        "perplexity",
        "--model",
        m,
        "--text",
        t,
        "--ctx",
        "32",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["ppl"].as_f64().unwrap() > 1.0);
    assert_eq!(v["scored"], v["chunks"].as_u64().unwrap() * 15);
    assert!(stderr(&o).contains("Final estimate: PPL = "));
    assert_fails_with(
        &lattice(&["perplexity", "--model", m, "--text", t, "--ctx", "512"]),
        &["556 tokens", "a context of 512 needs at least 1024"],
    );
    assert_fails_with(
        &lattice(&["perplexity", "--model", m, "--text", t, "--ctx", "4096"]),
        &["must be 4..=1024 tokens", "got 4096"],
    );
    assert_fails_with(
        &lattice(&["perplexity", "--model", m, "--text", "/nonexistent/t.txt"]),
        &["cannot read the text `/nonexistent/t.txt`"],
    );
    // Per-layer JSON lines: one per layer and pass, the documented fields.
    let metrics = dir.join("m.jsonl");
    let o = lattice(&[
        "generate",
        "--model",
        m,
        "--prompt",
        "Hello",
        "--max-tokens",
        "2",
        "--temperature",
        "0",
        "--metrics",
        "layers",
        "--metrics-file",
        metrics.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        !lines.is_empty() && lines.len().is_multiple_of(2),
        "{}",
        lines.len()
    );
    for key in [
        "pass",
        "layer",
        "rows",
        "input_norm",
        "output_norm",
        "update_ratio",
        "influence",
        "attention_entropy",
        "seconds",
    ] {
        assert!(lines.iter().all(|l| l.get(key).is_some()), "{key}");
    }
    // prune takes GGUF files only, and says so.
    assert_fails_with(
        &lattice(&[
            "prune",
            "--model",
            m,
            "--calibration",
            t,
            "--remove",
            "1",
            "out.gguf",
        ]),
        &["reads a .gguf model"],
    );
    // quantize: GGUF in and out, named methods only.
    assert_fails_with(
        &lattice(&["quantize", "--method", "q4_0", m, "out.gguf"]),
        &["reads and writes GGUF"],
    );
    assert_fails_with(
        &lattice(&["quantize", "--method", "q3_k", m, "out.gguf"]),
        &["--method `q3_k` is not one of", "quarot-w4a8"],
    );
    let gguf = fixture("tiny-qwen35").join("tiny-qwen35.bf16.gguf");
    let out = dir.join("q8.gguf");
    let (g, o) = (gguf.to_str().unwrap(), out.to_str().unwrap());
    // Flags that do not fit the method or each other, and calibration texts that cannot serve.
    let readme = concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md");
    let refusals: [(&[&str], &str); 7] = [
        (
            &["q8_0", "--seed", "3"],
            "--seed applies to the QuaRot methods only",
        ),
        (
            &["q8_0", "--rounding", "mse"],
            "--rounding applies to 4-bit groups",
        ),
        (
            &["q8_0", "--calibration", g],
            "--calibration applies to 4-bit groups",
        ),
        (
            &["q4_0", "--rounding", "gptq"],
            "--rounding gptq needs --calibration",
        ),
        (
            &["q4_0", "--rounding", "mse", "--calibration", g],
            "--calibration is used by --rounding gptq only",
        ),
        (
            &["q4_0", "--calibration", readme, "--ctx", "100000000"],
            "longer than the model's context",
        ),
        (
            &["q4_0", "--calibration", "/nonexistent.txt"],
            "cannot read the calibration text `/nonexistent.txt`",
        ),
    ];
    for (flags, expect) in refusals {
        let mut args = vec!["quantize", "--method"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&[g, o]);
        assert_fails_with(&lattice(&args), &[expect]);
    }
    let o = lattice(&[
        "quantize",
        "--method",
        "q8_0",
        gguf.to_str().unwrap(),
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = lattice(&[
        "generate",
        "--model",
        out.to_str().unwrap(),
        "--prompt",
        "Hello",
        "--max-tokens",
        "2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_fails_with(
        &lattice(&[
            "quantize",
            "--method",
            "quarot-w4a8",
            gguf.to_str().unwrap(),
            out.to_str().unwrap(),
        ]),
        &["`qwen35` is not one"],
    );
    let _ = std::fs::remove_dir_all(&dir);
}
