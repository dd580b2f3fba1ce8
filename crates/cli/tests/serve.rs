//! `lattice serve` end to end: the real binary on a loopback port (`--port 0`), driven by the
//! official OpenAI Python client (scripts/openai_client_check.py) and by hand-written HTTP/1.1
//! requests. Answers are checked against the `lattice` command line (embed, generate, rerank,
//! tokenize) and the OpenAI error conventions; batching, client disconnects, a full queue and
//! SIGTERM during a request are exercised on tiny-qwen3 and SmolLM2-135M (Q4_1).
//!
//! Needs `.cache/models/all-MiniLM-L6-v2` and `SmolLM2-135M-Instruct.Q4_1.gguf`
//! (scripts/fetch_models.sh) and, for the client test, Python 3 with pip and venv
//! (scripts/setup_openai_client.sh makes `.cache/venv-openai`).
//!
//! On a GPU machine (issue 13): `LATTICE_TEST_DEVICE=cuda` serves and generates with
//! `--device cuda`; `LATTICE_TEST_SLOW_MODEL` replaces SmolLM2 (whose quantized matrices are
//! CPU-only) with a model the device runs, `LATTICE_TEST_EMBED_MODEL` replaces MiniLM, and
//! `LATTICE_TEST_PYTHON` names a Python with the `openai` package instead of the venv.

mod support;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use serde_json::{json, Value};
use support::repo_root;
use support::server::*;

// ---- a. the official OpenAI client ------------------------------------------------------

#[test]
fn openai_client_matches_the_command_line() {
    let root = repo_root();
    let python = std::env::var("LATTICE_TEST_PYTHON").unwrap_or_else(|_| {
        let setup = Command::new("bash")
            .arg(root.join("scripts/setup_openai_client.sh"))
            .output()
            .expect("bash runs");
        assert!(
            setup.status.success(),
            "scripts/setup_openai_client.sh failed (Python 3 with pip and venv is required): {}",
            String::from_utf8_lossy(&setup.stderr)
        );
        String::from_utf8(setup.stdout).unwrap().trim().to_owned()
    });
    assert!(Path::new(&python).is_file(), "no python at {python:?}");

    let gen = fixture("tiny-qwen3");
    let emb = minilm();
    let rerank = fixture("tiny-cross-encoder");
    let texts = [
        "The cat sits on the mat.",
        "A quick brown fox jumps over the lazy dog.",
        "Lattice serves embeddings over HTTP.",
    ];
    let mut args = vec!["embed", "--model", emb.as_str()];
    args.extend(texts);
    let vectors: Vec<Value> = json_lines(&lattice(&args))
        .into_iter()
        .map(|l| l["embedding"].clone())
        .collect();
    let expected_gen = |prompt: &str, chat: bool| {
        let g = cli_generate(&gen, prompt, 12, if chat { &["--chat"] } else { &[] });
        json!({
            "prompt": prompt,
            "max_tokens": 12,
            "text": g["text"],
            "prompt_tokens": g["prompt_tokens"],
            "completion_tokens": g["completion_tokens"],
            "finish_reason": g["finish_reason"],
        })
    };
    let prompt = "The capital of France is";
    let mut completion = expected_gen(prompt, false);
    let ids = json_lines(&lattice(&["tokenize", "--model", &gen, prompt])).remove(0);
    completion["prompt_ids"] = ids["ids"].clone();
    let expected = json!({
        "embedding": {"texts": texts, "vectors": vectors},
        "completion": completion,
        "chat": expected_gen("What is the capital of France?", true),
    });
    let tmp = tempfile::tempdir().unwrap();
    let exp_path = tmp.path().join("expected.json");
    std::fs::write(&exp_path, expected.to_string()).unwrap();

    let server = Server::start(&[
        "--model",
        &gen,
        "--embedding-model",
        &emb,
        "--rerank-model",
        &rerank,
        "--api-key",
        KEY,
    ]);
    let o = Command::new(&python)
        .arg(root.join("scripts/openai_client_check.py"))
        .args([
            "--base-url",
            &format!("http://127.0.0.1:{}/v1", server.port),
        ])
        .args(["--api-key", KEY, "--gen-model", &gen, "--embed-model", &emb])
        .args(["--extra-model", &rerank])
        .arg("--expected")
        .arg(&exp_path)
        .output()
        .expect("python runs");
    let out = String::from_utf8_lossy(&o.stdout);
    println!("{out}");
    assert!(
        o.status.success(),
        "openai_client_check.py failed:\n{out}\n{}\nserver stderr:\n{}",
        String::from_utf8_lossy(&o.stderr),
        server.stderr()
    );
    assert!(out.contains("all checks passed"), "{out}");
    server.assert_no_panic();
}

// ---- b. raw HTTP ------------------------------------------------------------------------

#[test]
fn errors_auth_limits_and_metrics() {
    let gen = fixture("tiny-qwen3");
    let emb = minilm();
    let server = Server::start(&[
        "--model",
        &gen,
        "--embedding-model",
        &emb,
        "--api-key",
        KEY,
        "--max-body-bytes",
        "16384",
        "--max-tokens",
        "64",
    ]);
    let port = server.port;

    // /health and /metrics are open; everything else needs the bearer key.
    assert_eq!(http(port, "GET", "/health", &[], b"").status, 200);
    let m0 = server.metrics();
    let before = metric(&m0, "lattice_requests_total").unwrap_or(0.0);
    let emb_req = json!({"model": emb, "input": ["hello world"]});
    let body = emb_req.to_string();
    http(port, "POST", "/v1/embeddings", &[], body.as_bytes()).error(401, "no key");
    let wrong = [("Authorization", "Bearer wrong-key".to_owned())];
    http(port, "POST", "/v1/embeddings", &wrong, body.as_bytes()).error(401, "wrong key");
    http(port, "GET", "/v1/models", &[], b"").error(401, "GET /v1/models without a key");
    let models = server.get("/v1/models").ok("GET /v1/models");
    let ids: Vec<&Value> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| &m["id"])
        .collect();
    assert_eq!(ids.len(), 2, "{models}");
    assert!(
        ids.contains(&&json!(gen)) && ids.contains(&&json!(emb)),
        "{models}"
    );
    for _ in 0..3 {
        server.post("/v1/embeddings", &emb_req).ok("embeddings");
    }
    server
        .post(
            "/v1/completions",
            &json!({"model": gen, "prompt": "Hello", "max_tokens": 4, "temperature": 0}),
        )
        .ok("completion");
    // The supported forms of those fields are accepted.
    server
        .post(
            "/v1/chat/completions",
            &json!({"model": gen, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                    "response_format": {"type": "text"}, "logit_bias": {}, "tool_choice": "auto"}),
        )
        .ok("chat with response_format text, empty logit_bias, tool_choice auto");

    // Invalid JSON.
    let r = http(
        port,
        "POST",
        "/v1/embeddings",
        &server.auth(),
        br#"{"model": "x", "input": ["a","#,
    );
    let e = r.error(400, "invalid JSON");
    assert_eq!(e["type"], "invalid_request_error", "{e}");
    // Wrong-typed fields name the field in `param`.
    let cases = [
        (
            "/v1/completions",
            json!({"model": gen, "prompt": "hi", "max_tokens": "ten"}),
            "max_tokens",
        ),
        (
            "/v1/chat/completions",
            json!({"model": gen, "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}),
            "temperature",
        ),
        (
            "/v1/chat/completions",
            json!({"model": gen, "messages": [{"role": "user", "content": 5}]}),
            "messages",
        ),
        (
            "/v1/embeddings",
            json!({"model": emb, "input": "hi", "encoding_format": "hex"}),
            "encoding_format",
        ),
        // Over --max-tokens.
        (
            "/v1/completions",
            json!({"model": gen, "prompt": "hi", "max_tokens": 65}),
            "max_tokens",
        ),
        // More sequences (prompts x n) than the server can hold at once: never satisfiable.
        (
            "/v1/completions",
            json!({"model": gen, "prompt": vec!["hi"; 64], "n": 16, "max_tokens": 2}),
            "n",
        ),
        (
            "/v1/completions",
            json!({"model": gen, "prompt": "hi", "n": 17}),
            "n",
        ),
        (
            "/v1/chat/completions",
            json!({"model": gen, "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 21, "logprobs": true}),
            "top_logprobs",
        ),
        (
            "/v1/completions",
            json!({"model": gen, "prompt": "hi", "stop": vec!["x"; 17]}),
            "stop",
        ),
        (
            "/v1/completions",
            json!({"model": gen, "prompt": "hi", "top_p": 0}),
            "top_p",
        ),
        // Output constraints: what cannot be enforced or compiled is refused, naming the field.
        (
            "/v1/chat/completions",
            json!({"model": gen, "messages": [{"role": "user", "content": "hi"}],
                   "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": 5}}}}),
            "response_format",
        ),
        (
            "/v1/chat/completions",
            json!({"model": gen, "messages": [{"role": "user", "content": "hi"}],
                   "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
            "response_format.json_schema.schema",
        ),
        (
            "/v1/chat/completions",
            json!({"model": gen, "messages": [{"role": "user", "content": "hi"}],
                   "response_format": {"type": "xml"}}),
            "response_format.type",
        ),
        (
            "/v1/completions",
            json!({"model": gen, "prompt": "hi", "logit_bias": {"99999999": 5}}),
            "logit_bias.99999999",
        ),
        (
            "/v1/completions",
            json!({"model": gen, "prompt": "hi", "logit_bias": {"15": 500}}),
            "logit_bias.15",
        ),
        (
            "/v1/chat/completions",
            json!({"model": gen, "messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}),
            "tool_choice",
        ),
        (
            "/v1/completions",
            json!({"model": gen, "prompt": "hi", "regex": "(unclosed"}),
            "regex",
        ),
        (
            "/v1/completions",
            json!({"model": gen, "prompt": "hi", "grammar": "root ::= \"a"}),
            "grammar",
        ),
        (
            "/v1/completions",
            json!({"model": gen, "prompt": "hi", "regex": "a", "guided_choice": ["b"]}),
            "guided_choice",
        ),
    ];
    for (path, body, param) in cases {
        let e = server
            .post(path, &body)
            .error(400, &format!("{path} {body}"));
        let got = e["param"].as_str().unwrap_or("");
        assert!(
            got.contains(param),
            "{path} {body}: param {got:?}, want {param:?}: {e}"
        );
    }
    // A prompt longer than the context (1,024 tokens).
    let long = "word ".repeat(2500);
    server
        .post(
            "/v1/completions",
            &json!({"model": gen, "prompt": long, "max_tokens": 4}),
        )
        .error(400, "prompt longer than the context");
    // Unknown model; the last path component is accepted as an id.
    for (path, body) in [
        ("/v1/embeddings", json!({"model": "nope", "input": "x"})),
        (
            "/v1/completions",
            json!({"model": "nope", "prompt": "x", "max_tokens": 2}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "nope", "messages": [{"role": "user", "content": "x"}]}),
        ),
    ] {
        server
            .post(path, &body)
            .error(404, &format!("unknown model on {path}"));
    }
    server
        .post(
            "/v1/completions",
            &json!({"model": "tiny-qwen3", "prompt": "Hi", "max_tokens": 2}),
        )
        .ok("the model's folder name as id");
    // A body over --max-body-bytes.
    let big = json!({"model": emb, "input": "word ".repeat(5000)});
    let r = server.post("/v1/embeddings", &big);
    assert_eq!(r.status, 413, "body of 25 kB: {}", r.text());

    // Metrics: counts rise and every documented series is there.
    let m1 = server.metrics();
    let after = metric(&m1, "lattice_requests_total").unwrap();
    assert!(
        after >= before + 15.0,
        "lattice_requests_total went from {before} to {after}:\n{m1}"
    );
    let by_status = |s: &str| {
        m1.lines().any(|l| {
            l.starts_with("lattice_requests_total{") && l.contains(&format!("status=\"{s}\""))
        })
    };
    for s in ["200", "400", "401", "404", "413"] {
        assert!(
            by_status(s),
            "no lattice_requests_total with status {s}:\n{m1}"
        );
    }
    for name in [
        "lattice_request_duration_seconds",
        "lattice_prompt_tokens_total",
        "lattice_generation_tokens_total",
        "lattice_embedding_tokens_total",
        "lattice_queue_depth",
        "lattice_running_sequences",
        "lattice_batch_size",
        "lattice_embed_batch_size",
        "lattice_time_to_first_token_seconds",
        "process_resident_memory_bytes",
    ] {
        assert!(m1.contains(name), "/metrics lacks {name}:\n{m1}");
    }
    assert!(
        metric(&m1, "lattice_generation_tokens_total").unwrap() >= 6.0,
        "{m1}"
    );
    assert!(
        metric(&m1, "lattice_embedding_tokens_total").unwrap() > 0.0,
        "{m1}"
    );
    assert!(
        metric(&m1, "process_resident_memory_bytes").unwrap() > 1e6,
        "{m1}"
    );
    server.assert_no_panic();
}

#[test]
fn tei_routes_equal_openai_routes_and_the_command_line() {
    let emb = minilm();
    let rerank = fixture("tiny-cross-encoder");
    let server = Server::start(&["--embedding-model", &emb, "--rerank-model", &rerank]);
    let texts = ["Berlin is a city.", "Paris is in France.", "I like trains."];

    // /embed == /v1/embeddings.
    let tei = server
        .post("/embed", &json!({"inputs": texts}))
        .ok("/embed");
    let oai = server
        .post(
            "/v1/embeddings",
            &json!({"model": emb, "input": texts, "encoding_format": "float"}),
        )
        .ok("/v1/embeddings");
    let tei = tei.as_array().unwrap();
    assert_eq!(tei.len(), 3);
    for (i, t) in tei.iter().enumerate() {
        let d = max_abs_diff(&floats(t), &floats(&oai["data"][i]["embedding"]));
        assert!(d <= 1e-6, "/embed[{i}] vs /v1/embeddings: {d:e}");
    }
    let one = server
        .post("/embed", &json!({"inputs": texts[0]}))
        .ok("/embed one");
    assert!(max_abs_diff(&floats(&one[0]), &floats(&tei[0])) <= 1e-6);

    // /rerank == `lattice rerank`, best first.
    let query = "how many people live in berlin?";
    for raw in [false, true] {
        let mut args = vec!["rerank", "--model", &rerank, "--query", query];
        if raw {
            args.push("--raw");
        }
        args.extend(texts);
        let want = json_lines(&lattice(&args));
        let got = server
            .post(
                "/rerank",
                &json!({"query": query, "texts": texts, "raw_scores": raw, "return_text": true}),
            )
            .ok("/rerank");
        let got = got.as_array().unwrap();
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(
                g["index"], w["index"],
                "order (raw {raw}): {got:?} vs {want:?}"
            );
            let (gs, ws) = (g["score"].as_f64().unwrap(), w["score"].as_f64().unwrap());
            assert!((gs - ws).abs() <= 1e-5, "score {gs} vs {ws} (raw {raw})");
            let i = g["index"].as_u64().unwrap() as usize;
            assert_eq!(g["text"], texts[i]);
        }
        let scores: Vec<f64> = got.iter().map(|g| g["score"].as_f64().unwrap()).collect();
        assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
    }

    // /v1/rerank (Cohere / Jina shape) == /rerank, cut to top_n, documents as strings or objects.
    let tei = server
        .post("/rerank", &json!({"query": query, "texts": texts}))
        .ok("/rerank");
    let docs: Vec<Value> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if i % 2 == 0 {
                json!(t)
            } else {
                json!({"text": t})
            }
        })
        .collect();
    let v1 = server
        .post(
            "/v1/rerank",
            &json!({"model": rerank, "query": query, "documents": docs, "top_n": 2}),
        )
        .ok("/v1/rerank");
    let results = v1["results"].as_array().unwrap();
    assert_eq!(results.len(), 2, "{v1}");
    assert!(v1["usage"]["total_tokens"].as_u64().unwrap() > 0);
    for (r, t) in results.iter().zip(tei.as_array().unwrap()) {
        assert_eq!(r["index"], t["index"]);
        assert_eq!(r["relevance_score"], t["score"]);
        let i = r["index"].as_u64().unwrap() as usize;
        assert_eq!(r["document"]["text"], texts[i]);
    }
    server
        .post(
            "/v1/rerank",
            &json!({"model": "nope", "query": query, "documents": docs}),
        )
        .error(404, "/v1/rerank unknown model");

    // GET /v1/models/{id}: by id (which may hold slashes) and by folder name.
    let by_id = server
        .get(&format!("/v1/models/{rerank}"))
        .ok("model by id");
    assert_eq!(by_id["id"], rerank);
    assert_eq!(by_id["task"], "rerank");
    let short = Path::new(&rerank).file_name().unwrap().to_str().unwrap();
    assert_eq!(
        server.get(&format!("/v1/models/{short}")).ok("by name")["id"],
        rerank
    );
    server.get("/v1/models/nope").error(404, "unknown model id");

    // /tokenize == `lattice tokenize` (the embedding model's tokenizer).
    let input = "Hello world, this is Lattice!";
    for special in [true, false] {
        let mut args = vec!["tokenize", "--model", &emb, input];
        if !special {
            args.push("--no-special");
        }
        let want = json_lines(&lattice(&args));
        let got = server
            .post(
                "/tokenize",
                &json!({"inputs": [input, input], "add_special_tokens": special}),
            )
            .ok("/tokenize");
        assert_eq!(got.as_array().unwrap().len(), 2, "{got}");
        let toks = got[0].as_array().unwrap();
        let ids: Vec<&Value> = toks.iter().map(|t| &t["id"]).collect();
        let want_ids: Vec<&Value> = want[0]["ids"].as_array().unwrap().iter().collect();
        assert_eq!(ids, want_ids, "add_special_tokens {special}");
        assert_eq!(got[0], got[1]);
        for (i, t) in toks.iter().enumerate() {
            let is_special = special && (i == 0 || i == toks.len() - 1);
            assert_eq!(t["special"], is_special, "{t}");
            if !is_special {
                let (a, b) = (t["start"].as_u64().unwrap(), t["stop"].as_u64().unwrap());
                assert_eq!(t["text"], input[a as usize..b as usize], "{t}");
            }
        }
    }
    server.assert_no_panic();
}

fn completion_req(model: &str, prompt: &str, max_tokens: usize) -> Value {
    json!({
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": 1,
        "ignore_eos": true,
    })
}

/// Nine different prompts, alone then all at once at temperature 0: each concurrent answer equals
/// its own sequential one (text, and logprobs within 1e-5); the first `cli` also equal
/// `lattice generate`; and some decode step really ran several sequences.
fn check_batching(model: &str, n: usize, cli: usize) {
    let server = Server::start(&["--model", model]);
    let prompts = [
        "The capital of France is",
        "Once upon a time",
        "Hello",
        "In 1492, Columbus sailed across the ocean and",
        "def fibonacci(n):",
        "The quick brown fox",
        "Water boils at",
        "My favourite colour is blue because the sky on a clear day",
        "1, 2, 3, 4,",
    ];
    let sequential: Vec<Value> = prompts
        .iter()
        .map(|p| {
            server
                .post("/v1/completions", &completion_req(model, p, n))
                .ok(p)
        })
        .collect();
    for (p, s) in prompts.iter().zip(&sequential).take(cli) {
        let want = cli_generate(model, p, n, &["--ignore-eos"]);
        assert_eq!(s["choices"][0]["text"], want["text"], "{p}");
        assert_eq!(s["usage"]["completion_tokens"], n, "{p}");
        assert_eq!(s["usage"]["prompt_tokens"], want["prompt_tokens"], "{p}");
    }
    let barrier = Arc::new(Barrier::new(prompts.len()));
    let port = server.port;
    let handles: Vec<_> = prompts
        .iter()
        .map(|p| {
            let (barrier, body) = (barrier.clone(), completion_req(model, p, n).to_string());
            std::thread::spawn(move || {
                barrier.wait();
                http(port, "POST", "/v1/completions", &[], body.as_bytes())
            })
        })
        .collect();
    for ((p, s), h) in prompts.iter().zip(&sequential).zip(handles) {
        let c = h.join().unwrap().ok(p);
        let (a, b) = (&c["choices"][0], &s["choices"][0]);
        assert_eq!(a["text"], b["text"], "{p}: concurrent vs alone");
        let (la, lb) = (
            floats(&a["logprobs"]["token_logprobs"]),
            floats(&b["logprobs"]["token_logprobs"]),
        );
        assert_eq!(la.len(), n, "{p}: {} token_logprobs", la.len());
        let d = max_abs_diff(&la, &lb);
        assert!(
            d <= 1e-5,
            "{p}: logprobs differ by {d:e} concurrent vs alone"
        );
    }
    let m = server.metrics();
    let (sum, count) = (
        metric(&m, "lattice_batch_size_sum").unwrap(),
        metric(&m, "lattice_batch_size_count").unwrap(),
    );
    eprintln!(
        "{}: {count} decode steps, {:.2} sequences per step on average",
        Path::new(model).file_name().unwrap().to_string_lossy(),
        sum / count
    );
    assert!(
        sum > count,
        "no decode step ran more than one sequence:\n{m}"
    );
    server.assert_no_panic();
}

#[test]
fn batching_does_not_change_results_tiny_qwen3() {
    check_batching(&fixture("tiny-qwen3"), 64, 9);
}

#[test]
fn batching_does_not_change_results_smollm2_q4_1() {
    check_batching(&smollm2(), 12, 2);
}

#[test]
fn a_client_that_leaves_mid_stream_is_cancelled() {
    let gen = smollm2();
    let server = Server::start(&["--model", &gen]);
    let mut body = completion_req(&gen, "Once upon a time", 1000);
    body["stream"] = json!(true);
    let (stream, first) = open_stream(&server, "/v1/completions", &body);
    let first = String::from_utf8_lossy(&first);
    assert!(first.contains("text_completion"), "{first}");
    drop(stream);
    let r = server
        .post("/v1/completions", &completion_req(&gen, "Hello", 8))
        .ok("a request after the disconnect");
    assert_eq!(r["usage"]["completion_tokens"], 8);
    // Left alone the stream would decode 1,000 tokens (about 10 s).
    let m = wait_for_metric(
        &server,
        "lattice_running_sequences",
        0.0,
        Duration::from_secs(5),
    );
    let generated = metric(&m, "lattice_generation_tokens_total").unwrap();
    eprintln!("client left mid-stream: {generated} tokens generated in all");
    assert!(
        generated < 500.0,
        "the abandoned stream kept decoding ({generated} tokens generated)"
    );
    server.assert_no_panic();
}

#[test]
fn a_full_queue_answers_429() {
    let gen = smollm2();
    let server = Server::start(&["--model", &gen, "--max-running", "1", "--max-queue", "1"]);
    // One running and one waiting are admitted; each takes about 0.5 s.
    let clients = 5;
    let barrier = Arc::new(Barrier::new(clients));
    let port = server.port;
    let body = completion_req(&gen, "Once upon a time", 48).to_string();
    let handles: Vec<_> = (0..clients)
        .map(|_| {
            let (barrier, body) = (barrier.clone(), body.clone());
            std::thread::spawn(move || {
                barrier.wait();
                http(port, "POST", "/v1/completions", &[], body.as_bytes())
            })
        })
        .collect();
    let responses: Vec<Response> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let statuses: Vec<u16> = responses.iter().map(|r| r.status).collect();
    let mut ok = 0;
    let mut limited = 0;
    for r in &responses {
        match r.status {
            200 => {
                assert_eq!(r.json()["usage"]["completion_tokens"], 48);
                ok += 1;
            }
            429 => {
                let e = r.error(429, "queue full");
                assert_eq!(e["type"], "rate_limit_error", "{e}");
                limited += 1;
            }
            s => panic!("status {s}: {} (all: {statuses:?})", r.text()),
        }
    }
    eprintln!("queue full: statuses {statuses:?}");
    assert!(ok >= 1 && limited >= 1, "statuses {statuses:?}");
    server.assert_no_panic();
}

#[test]
fn sigterm_finishes_the_request_in_flight_and_exits_0() {
    let gen = smollm2();
    let mut server = Server::start(&["--model", &gen]);
    // About 0.5 s of decoding left when SIGTERM arrives.
    let mut body = completion_req(&gen, "Once upon a time", 48);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let (mut stream, first) = open_stream(&server, "/v1/completions", &body);
    let kill = Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let mut raw = first;
    stream.read_to_end(&mut raw).unwrap();
    let r = parse_response(&raw).expect("a complete chunked response");
    let usage = sse_events(&r.text())
        .into_iter()
        .find(|v| v["usage"].is_object())
        .expect("a usage chunk");
    assert_eq!(usage["usage"]["completion_tokens"], 48, "{usage}");
    let status = server.wait_exit(Duration::from_secs(20));
    assert!(
        status.success(),
        "exit {status:?}; stderr:\n{}",
        server.stderr()
    );
    server.assert_no_panic();
}

/// `n` choices streamed equal the same request answered at once (same seed); several prompts
/// in one completions request; token-id inputs embed like their text.
#[test]
fn streamed_choices_batched_prompts_and_token_inputs() {
    let gen = fixture("tiny-qwen3");
    let emb = minilm();
    let server = Server::start(&["--model", &gen, "--embedding-model", &emb]);
    let mut body = completion_req(&gen, "The quick brown fox", 12);
    body["n"] = json!(3);
    body["seed"] = json!(7);
    body["temperature"] = json!(0.9);
    let whole = server.post("/v1/completions", &body).ok("n = 3");
    let choices = whole["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    body["stream"] = json!(true);
    let sse = server.post("/v1/completions", &body);
    assert_eq!(sse.status, 200);
    let text = sse.text();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let mut streamed = vec![String::new(); 3];
    let mut finished = [false; 3];
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(data).unwrap();
        for c in chunk["choices"].as_array().unwrap() {
            let i = c["index"].as_u64().unwrap() as usize;
            streamed[i].push_str(c["text"].as_str().unwrap());
            if c["finish_reason"].is_string() {
                finished[i] = true;
            }
        }
    }
    assert_eq!(finished, [true; 3]);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(streamed[i], c["text"].as_str().unwrap(), "choice {i}");
    }
    // Seeds differ per choice (seed + i), so sampled choices are not all the same text.
    assert!(
        choices.iter().any(|c| c["text"] != choices[0]["text"]),
        "{choices:?}"
    );

    // Two prompts, two choices each: indices 0..4, prompt tokens summed.
    let mut body = completion_req(&gen, "x", 5);
    body["prompt"] = json!(["Hello world", "Good night"]);
    body["n"] = json!(2);
    let r = server.post("/v1/completions", &body).ok("two prompts");
    let cs = r["choices"].as_array().unwrap();
    assert_eq!(cs.len(), 4);
    for (i, c) in cs.iter().enumerate() {
        assert_eq!(c["index"], i);
    }
    let alone = |p: &str| {
        server
            .post("/v1/completions", &completion_req(&gen, p, 5))
            .ok(p)
    };
    let (a, b) = (alone("Hello world"), alone("Good night"));
    assert_eq!(cs[0]["text"], a["choices"][0]["text"]);
    assert_eq!(cs[1]["text"], a["choices"][0]["text"]);
    assert_eq!(cs[2]["text"], b["choices"][0]["text"]);
    assert_eq!(
        r["usage"]["prompt_tokens"],
        a["usage"]["prompt_tokens"].as_u64().unwrap()
            + b["usage"]["prompt_tokens"].as_u64().unwrap()
    );

    // Token ids embed like the text they came from.
    let toks = server
        .post("/tokenize", &json!({"inputs": "token inputs work"}))
        .ok("tokenize");
    let ids: Vec<u64> = toks[0]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_u64().unwrap())
        .collect();
    let by_ids = server
        .post(
            "/v1/embeddings",
            &json!({"input": [ids], "encoding_format": "float"}),
        )
        .ok("embed ids");
    let by_text = server
        .post(
            "/v1/embeddings",
            &json!({"input": "token inputs work", "encoding_format": "float"}),
        )
        .ok("embed text");
    let d = max_abs_diff(
        &floats(&by_ids["data"][0]["embedding"]),
        &floats(&by_text["data"][0]["embedding"]),
    );
    assert!(d == 0.0, "ids vs text: {d:e}");
    server
        .post("/v1/embeddings", &json!({"input": [[999999]]}))
        .error(400, "token id outside the vocabulary");
    server
        .post("/v1/embeddings", &json!({"input": []}))
        .error(400, "no inputs");
    server.assert_no_panic();
}

/// Prefix caching over HTTP: a request that extends an earlier prompt reuses its pages (the hit
/// shows in /metrics) and answers exactly what a server with `--no-prefix-cache` answers; a
/// request whose sequence could never fit in `--kv-cache-memory` is refused with 400 naming
/// `max_tokens`, while one that fits is served.
#[test]
fn prefix_cache_and_kv_budget_over_http() {
    let model = fixture("tiny-qwen3");
    let long: String = (0..80).map(|i| format!("word{} ", i % 17)).collect();
    let prompts = [long.clone(), format!("{long}and then a few more words")];
    let mut answers = Vec::new();
    for flags in [&[][..], &["--no-prefix-cache"][..]] {
        let mut args = vec!["--model", model.as_str()];
        args.extend_from_slice(flags);
        let server = Server::start(&args);
        let replies: Vec<Value> = prompts
            .iter()
            .map(|p| {
                server
                    .post("/v1/completions", &completion_req(&model, p, 12))
                    .ok(p)
            })
            .collect();
        let texts: Vec<Value> = replies
            .iter()
            .map(|r| r["choices"][0]["text"].clone())
            .collect();
        let cached = |r: &Value| r["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
        assert_eq!(cached(&replies[0]), Some(0));
        let reused = cached(&replies[1]).unwrap();
        assert_eq!(reused >= 64, flags.is_empty(), "cached_tokens {reused}");
        let m = server.metrics();
        let hits = metric(&m, "lattice_prefix_cache_hit_tokens_total").unwrap();
        let lookups = metric(&m, "lattice_prefix_cache_lookups_total").unwrap();
        if flags.is_empty() {
            assert!(
                hits >= 64.0,
                "the second prompt reuses the first one's pages:\n{m}"
            );
            assert_eq!(lookups, 2.0);
            assert!(metric(&m, "lattice_prefix_cache_pages").unwrap() >= 2.0);
        } else {
            assert_eq!((hits, lookups), (0.0, 0.0), "no cache, no lookups:\n{m}");
        }
        assert!(metric(&m, "lattice_kv_budget_bytes").unwrap() > 0.0);
        assert_eq!(metric(&m, "lattice_preemptions_total"), Some(0.0));
        server.assert_no_panic();
        answers.push(texts);
    }
    assert_eq!(answers[0], answers[1], "cache on and off answer alike");

    // Three pages of 32 tokens (tiny-qwen3: 3 layers x 2 x 48 values x 4 bytes per token).
    let server = Server::start(&["--model", &model, "--kv-cache-memory", "108KiB"]);
    let r = server.post("/v1/completions", &completion_req(&model, "Hello", 500));
    assert_eq!(r.status, 400, "{}", r.text());
    let e = r.json();
    assert_eq!(e["error"]["param"], "max_tokens", "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--kv-cache-memory"),
        "{e}"
    );
    server
        .post("/v1/completions", &completion_req(&model, "Hello", 8))
        .ok("a request that fits");
    let bad = Command::new(env!("CARGO_BIN_EXE_lattice"))
        .args(["serve", "--model", &model, "--kv-cache-memory", "lots"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("lots") && err.contains("size"), "{err}");
    server.assert_no_panic();
}
