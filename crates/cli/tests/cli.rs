//! The `lattice` binary end to end: normal runs on the tiny fixtures and every kind of bad
//! input (invalid UTF-8, corrupt or truncated weights, missing config, missing tensors, wrong
//! shapes): a clear message on stderr, a non-zero exit, never a panic.

mod support;

use std::path::{Path, PathBuf};

use support::{assert_fails_with, fixture, lattice, stderr, stdout};

/// Copies a fixture directory (one level of subdirectories) into a temp dir.
fn copy_fixture(name: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    copy_dir(&fixture(name), tmp.path());
    tmp
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn embed_texts_including_empty_and_over_limit() {
    let model = fixture("tiny-bert");
    let long = "word ".repeat(500);
    let o = lattice(&[
        "embed",
        "--model",
        model.to_str().unwrap(),
        "",
        "hello world",
        &long,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    for l in &lines {
        let v = l["embedding"].as_array().unwrap();
        assert_eq!(v.len(), 32);
        let norm: f64 = v
            .iter()
            .map(|x| x.as_f64().unwrap().powi(2))
            .sum::<f64>()
            .sqrt();
        assert!((norm - 1.0).abs() < 1e-5);
    }
}

#[test]
fn embed_from_jsonl_matches_positional() {
    let model = fixture("tiny-bert");
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    std::fs::write(&input, "{\"text\": \"hello world\"}\n{\"text\": \"\"}\n").unwrap();
    let a = lattice(&[
        "embed",
        "--model",
        model.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
    ]);
    let b = lattice(&[
        "embed",
        "--model",
        model.to_str().unwrap(),
        "hello world",
        "",
    ]);
    assert!(a.status.success(), "{}", stderr(&a));
    assert_eq!(stdout(&a), stdout(&b));
}

#[test]
fn invalid_utf8_input_is_an_error() {
    let model = fixture("tiny-bert");
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("bad.jsonl");
    std::fs::write(&input, b"{\"text\": \"ok\"}\n{\"text\": \"\xff\xfe\"}\n").unwrap();
    let o = lattice(&[
        "embed",
        "--model",
        model.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
    ]);
    assert_fails_with(&o, &["bad.jsonl:2", "not valid UTF-8"]);
    std::fs::write(&input, b"{\"txt\": 3}\n").unwrap();
    let o = lattice(&[
        "embed",
        "--model",
        model.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
    ]);
    assert_fails_with(&o, &["bad.jsonl:1", "\"text\""]);
}

#[test]
fn corrupt_and_truncated_weights_are_errors() {
    let tmp = copy_fixture("tiny-bert");
    let weights = tmp.path().join("model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    // Truncated: the header promises more data than the file holds.
    std::fs::write(&weights, &bytes[..bytes.len() / 2]).unwrap();
    let o = lattice(&["embed", "--model", tmp.path().to_str().unwrap(), "x"]);
    assert_fails_with(&o, &["model.safetensors", "truncated"]);
    // Garbage header.
    let mut garbage = bytes.clone();
    garbage[8..40].fill(b'#');
    std::fs::write(&weights, &garbage).unwrap();
    let o = lattice(&["embed", "--model", tmp.path().to_str().unwrap(), "x"]);
    assert_fails_with(&o, &["model.safetensors", "JSON"]);
    // Not even a header length.
    std::fs::write(&weights, b"abc").unwrap();
    let o = lattice(&["embed", "--model", tmp.path().to_str().unwrap(), "x"]);
    assert_fails_with(&o, &["model.safetensors"]);
}

#[test]
fn subnormal_setting_is_checked() {
    let model = fixture("tiny-bert");
    let run = |v: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_lattice"))
            .args(["embed", "--model", model.to_str().unwrap(), "x"])
            .env("LATTICE_SUBNORMALS", v)
            .output()
            .unwrap()
    };
    assert_fails_with(&run("off"), &["LATTICE_SUBNORMALS", "\"off\"", "keep"]);
    for ok in ["keep", "flush"] {
        let o = run(ok);
        assert!(o.status.success(), "{ok}: {}", stderr(&o));
    }
}

#[test]
fn missing_config_and_unknown_model_are_errors() {
    let tmp = copy_fixture("tiny-bert");
    std::fs::remove_file(tmp.path().join("config.json")).unwrap();
    let o = lattice(&["embed", "--model", tmp.path().to_str().unwrap(), "x"]);
    assert_fails_with(&o, &["config.json"]);
    let o = lattice(&["embed", "--model", "/nonexistent/model", "x"]);
    assert_fails_with(&o, &["/nonexistent/model"]);
    let o = lattice(&["tokenize", "--model", "/nonexistent/model", "x"]);
    assert_fails_with(&o, &["/nonexistent/model"]);
}

#[test]
fn config_that_disagrees_with_weights_names_the_tensor() {
    let tmp = copy_fixture("tiny-bert");
    let cfg_path = tmp.path().join("config.json");
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    let mut more_layers = cfg.clone();
    more_layers["num_hidden_layers"] = 3.into();
    std::fs::write(&cfg_path, more_layers.to_string()).unwrap();
    let o = lattice(&["embed", "--model", tmp.path().to_str().unwrap(), "x"]);
    assert_fails_with(&o, &["encoder.layer.2."]);
    let mut wider = cfg.clone();
    wider["intermediate_size"] = 65.into();
    std::fs::write(&cfg_path, wider.to_string()).unwrap();
    let o = lattice(&["embed", "--model", tmp.path().to_str().unwrap(), "x"]);
    assert_fails_with(&o, &["intermediate.dense.weight", "[65, 32]", "[64, 32]"]);
    let mut act = cfg.clone();
    act["hidden_act"] = "gelu_new".into();
    std::fs::write(&cfg_path, act.to_string()).unwrap();
    let o = lattice(&["embed", "--model", tmp.path().to_str().unwrap(), "x"]);
    assert_fails_with(&o, &["gelu_new"]);
    std::fs::write(&cfg_path, "{not json").unwrap();
    let o = lattice(&["embed", "--model", tmp.path().to_str().unwrap(), "x"]);
    assert_fails_with(&o, &["config.json"]);
}

#[test]
fn tokenize_prints_ids_and_tokens() {
    let model = fixture("tiny-bert");
    let o = lattice(&[
        "tokenize",
        "--model",
        model.to_str().unwrap(),
        "Hello world!",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    let tokens: Vec<&str> = v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tokens.first(), Some(&"[CLS]"));
    assert_eq!(tokens.last(), Some(&"[SEP]"));
    assert_eq!(v["ids"].as_array().unwrap().len(), tokens.len());
    let o = lattice(&[
        "tokenize",
        "--no-special",
        "--model",
        model.to_str().unwrap(),
        "Hello world!",
    ]);
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["ids"].as_array().unwrap().len(), tokens.len() - 2);
}

#[test]
fn rerank_sorts_by_score() {
    let model = fixture("tiny-cross-encoder");
    let o = lattice(&[
        "rerank",
        "--model",
        model.to_str().unwrap(),
        "--query",
        "how many people live in berlin?",
        "Berlin is a city.",
        "Paris is in France.",
        "I like trains.",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    let scores: Vec<f64> = lines.iter().map(|l| l["score"].as_f64().unwrap()).collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
    let mut idx: Vec<u64> = lines.iter().map(|l| l["index"].as_u64().unwrap()).collect();
    idx.sort();
    assert_eq!(idx, vec![0, 1, 2]);
}

#[test]
fn encoder_precision_flags_act_and_conflict() {
    let model = fixture("tiny-bert");
    let m = model.to_str().unwrap();
    let embed = |flag: &str| -> Vec<f64> {
        let mut args = vec!["embed", "--model", m, "hello world"];
        if !flag.is_empty() {
            args.push(flag);
        }
        let o = lattice(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
        v["embedding"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    };
    let exact = embed("");
    for flag in ["--bf16", "--q8"] {
        let got = embed(flag);
        let cos: f64 = got.iter().zip(&exact).map(|(a, b)| a * b).sum();
        assert!(
            got != exact && 1.0 - cos < 1e-3,
            "{flag}: 1 - cos {}",
            1.0 - cos
        );
    }
    let o = lattice(&["embed", "--model", m, "--bf16", "--q8", "x"]);
    assert_fails_with(&o, &["--bf16", "--q8"]);
    // --q8 reranks too: scores close to f32's, not equal.
    let cross = fixture("tiny-cross-encoder");
    let c = cross.to_str().unwrap();
    let scores = |flag: &str| -> Vec<f64> {
        let mut args = vec![
            "rerank",
            "--model",
            c,
            "--query",
            "q",
            "a passage",
            "another one",
        ];
        if !flag.is_empty() {
            args.push(flag);
        }
        let o = lattice(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        let mut lines: Vec<serde_json::Value> = stdout(&o)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        lines.sort_by_key(|l| l["index"].as_u64().unwrap());
        lines.iter().map(|l| l["score"].as_f64().unwrap()).collect()
    };
    let (exact, q8) = (scores(""), scores("--q8"));
    assert!(
        q8 != exact && q8.iter().zip(&exact).all(|(a, b)| (a - b).abs() < 2e-2),
        "{q8:?} vs {exact:?}"
    );
}

#[test]
fn eval_sts_reports_spearman_and_rejects_bad_csv() {
    let model = fixture("tiny-bert");
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("sts.csv");
    std::fs::write(&csv, "sentence1,sentence2,score\na man plays,a man plays,5.0\n\"a dog, running\",a cat sleeping,1.0\nthe sun,the moon,2.5\n").unwrap();
    let o = lattice(&[
        "eval",
        "sts",
        "--model",
        model.to_str().unwrap(),
        "--data",
        csv.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["pairs"], 3);
    assert!(v["spearman"].as_f64().unwrap().abs() <= 100.0);
    // --q8 also reports how far its embeddings are from f32's.
    let o = lattice(&[
        "eval",
        "sts",
        "--model",
        model.to_str().unwrap(),
        "--data",
        csv.to_str().unwrap(),
        "--q8",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["weights"], "int8"); // `--q8` encoders: int8 rows on the CPU
    let drift = v["vs_f32"]["max_1_minus_cos"].as_f64().unwrap();
    assert!(drift > 0.0 && drift < 1e-2, "{v}");
    std::fs::write(&csv, "a,b,5\nc,d,not-a-number\n").unwrap();
    let o = lattice(&[
        "eval",
        "sts",
        "--model",
        model.to_str().unwrap(),
        "--data",
        csv.to_str().unwrap(),
    ]);
    assert_fails_with(&o, &["row 2", "not-a-number"]);
}

#[test]
fn tokenize_works_for_byte_level_and_sentencepiece_bpe() {
    let npm = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache/npm");
    let cases = [
        ("qwen3", vec![9707, 11, 1879, 0]),
        ("llama2", vec![1, 22557, 28725, 1526, 28808]),
    ];
    for (name, want) in cases {
        let dir = npm.join(name).join("package/models");
        assert!(
            dir.join("tokenizer.json").is_file(),
            "{} missing: run scripts/fetch_models.sh",
            dir.display()
        );
        let o = lattice(&[
            "tokenize",
            "--model",
            dir.to_str().unwrap(),
            "Hello, world!",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
        let ids: Vec<u64> = v["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect();
        assert_eq!(ids, want, "{name}");
    }
}

#[test]
fn bench_peaks_reports_the_machine_limits() {
    let o = lattice(&[
        "bench",
        "peaks",
        "--runs",
        "1",
        "--megabytes",
        "16",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert!(
        v["isa"].is_string() && v["bf16_isa"].is_string() && v["threads"].as_u64().unwrap() >= 1,
        "{v}"
    );
    for k in [
        "gemm_f32_gflops_1",
        "gemm_f32_gflops_all",
        "gemm_bf16_gflops_1",
        "gemm_bf16_gflops_all",
        "read_gbps_1",
        "read_gbps_all",
        "decode_f32_weights_gbps",
        "decode_bf16_weights_gbps",
    ] {
        assert!(v[k].as_f64().unwrap() > 0.0, "{k}: {v}");
    }
}
