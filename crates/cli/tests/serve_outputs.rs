//! Structured outputs and tool calls over HTTP on the tiny random-weight Qwen3 fixture: outputs
//! under a JSON Schema, a regex, a choice list and a GBNF grammar follow them whatever the
//! weights (every choice of `n`, streamed too), `logit_bias` forces a token, and tools come
//! back as `tool_calls` (forced calls in the Hermes, Mistral and Llama 3 formats, streamed
//! deltas, tool results through the template, errors naming the field), and speculative requests
//! give the same text. The server's other tests are in serve.rs.

mod support;

use serde_json::{json, Value};
use support::server::*;

/// `response_format`, `regex`, `guided_choice`, `grammar` and `logit_bias` act on the output.
#[test]
fn constrained_outputs_over_http() {
    let gen = fixture("tiny-qwen3");
    let server = Server::start(&["--model", &gen]);
    // Constrained outputs, whatever the (random) weights: a schema, a regex, a choice.
    let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["ok", "n"],
        "additionalProperties": false});
    for seed in 0..3 {
        let r = server
            .post(
                "/v1/chat/completions",
                &json!({"model": gen, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64,
                        "seed": seed, "response_format": {"type": "json_schema",
                        "json_schema": {"name": "t", "schema": schema, "strict": true}}}),
            )
            .ok("json_schema chat");
        let content = r["choices"][0]["message"]["content"].as_str().unwrap();
        let v: Value = serde_json::from_str(content).unwrap_or_else(|e| panic!("{e}: {content:?}"));
        assert!(
            v["ok"].is_boolean() && (1..=9).contains(&v["n"].as_i64().unwrap()),
            "{v}"
        );
        assert_eq!(r["choices"][0]["finish_reason"], "stop", "{r}");
    }
    // Every choice of n follows the schema, streamed too.
    let body = json!({"model": gen, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64,
        "n": 3, "seed": 11, "response_format": {"type": "json_schema",
        "json_schema": {"name": "t", "schema": schema}}});
    let r = server
        .post("/v1/chat/completions", &body)
        .ok("json_schema n=3");
    for c in r["choices"].as_array().unwrap() {
        let v: Value = serde_json::from_str(c["message"]["content"].as_str().unwrap()).unwrap();
        assert!(v["ok"].is_boolean() && v["n"].is_i64(), "{v}");
    }
    let mut body = body.clone();
    body["stream"] = json!(true);
    let text = server.post("/v1/chat/completions", &body).text();
    let mut streamed = vec![String::new(); 3];
    for d in text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
    {
        let chunk: Value = serde_json::from_str(d).unwrap();
        for c in chunk["choices"].as_array().unwrap() {
            if let Some(t) = c["delta"]["content"].as_str() {
                streamed[c["index"].as_u64().unwrap() as usize].push_str(t);
            }
        }
    }
    for (i, s) in streamed.iter().enumerate() {
        assert_eq!(
            s,
            r["choices"][i]["message"]["content"].as_str().unwrap(),
            "choice {i}"
        );
    }
    let r = server
        .post(
            "/v1/completions",
            &json!({"model": gen, "prompt": "id:", "max_tokens": 16, "regex": "[0-9]{4}"}),
        )
        .ok("regex completion");
    let text = r["choices"][0]["text"].as_str().unwrap();
    assert!(
        text.len() == 4 && text.bytes().all(|b| b.is_ascii_digit()),
        "{text:?}"
    );
    let r = server
        .post(
            "/v1/completions",
            &json!({"model": gen, "prompt": "pick:", "max_tokens": 16, "guided_choice": ["alpha", "beta"]}),
        )
        .ok("guided_choice completion");
    let text = r["choices"][0]["text"].as_str().unwrap();
    assert!(["alpha", "beta"].contains(&text), "{text:?}");
    let r = server
        .post(
            "/v1/completions",
            &json!({"model": gen, "prompt": "sum:", "max_tokens": 24,
                    "grammar": "root ::= num \" + \" num\nnum ::= [1-9] [0-9]{0,2}"}),
        )
        .ok("GBNF completion");
    let text = r["choices"][0]["text"].as_str().unwrap();
    let parts: Vec<&str> = text.split(" + ").collect();
    assert!(
        parts.len() == 2
            && parts
                .iter()
                .all(|p| (1..=3).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit())),
        "{text:?}"
    );
    // logit_bias +100 all but forces a token.
    let r = server
        .post(
            "/v1/completions",
            &json!({"model": gen, "prompt": "hi", "max_tokens": 4, "temperature": 0,
                    "ignore_eos": true, "logit_bias": {"42": 100}}),
        )
        .ok("logit_bias completion");
    assert_eq!(r["usage"]["completion_tokens"], 4, "{r}");
}

/// Tools: a forced call (`required` or a named function) is generated under the tools'
/// parameter schemas and comes back as `tool_calls` with finish_reason "tool_calls", whatever
/// the (random) weights; streamed, the call arrives as a `tool_calls` delta; bad tool requests
/// are 400s naming the field.
/// A Mistral-style chat template (tools in `[AVAILABLE_TOOLS]`, calls after `[TOOL_CALLS]`,
/// results in `[TOOL_RESULTS]`), the shape of Mistral's own templates.
const MISTRAL_TEMPLATE: &str = r#"{{- bos_token }}{%- if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{%- endif %}
{%- for m in messages %}
{%- if m.role == 'user' %}[INST]{{ m.content }}[/INST]
{%- elif m.role == 'assistant' and m.tool_calls %}[TOOL_CALLS][{%- for c in m.tool_calls %}{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments }}}{{ ", " if not loop.last }}{%- endfor %}]{{ eos_token }}
{%- elif m.role == 'assistant' %}{{ m.content }}{{ eos_token }}
{%- elif m.role == 'tool' %}[TOOL_RESULTS]{"content": {{ m.content | tojson }}}[/TOOL_RESULTS]
{%- endif %}{%- endfor %}"#;

/// A Llama 3.1-style chat template (JSON calls with `parameters`, results as `ipython`).
const LLAMA3_TEMPLATE: &str = r#"{{- bos_token }}{%- if tools %}<|start_header_id|>system<|end_header_id|>

Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.
{% for t in tools %}{{ t | tojson }}
{% endfor %}<|eot_id|>{%- endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}<|start_header_id|>assistant<|end_header_id|>

{% for c in m.tool_calls %}{"name": "{{ c.function.name }}", "parameters": {{ c.function.arguments }}}{% endfor %}<|eot_id|>
{%- elif m.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>

{{ m.content }}<|eot_id|>
{%- else %}<|start_header_id|>{{ m.role }}<|end_header_id|>

{{ m.content }}<|eot_id|>{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"#;

/// The tiny Qwen3 fixture with another chat template (and so another tool-call format), in a
/// temporary folder.
fn with_template(template: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = std::path::PathBuf::from(fixture("tiny-qwen3"));
    for f in std::fs::read_dir(&src).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.path().join(f.file_name().unwrap())).unwrap();
    }
    let cfg_path = dir.path().join("tokenizer_config.json");
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["chat_template"] = json!(template);
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    dir
}

/// Forced tool calls in each format the server parses: Qwen / Hermes `<tool_call>` (the
/// fixture's own template), Mistral `[TOOL_CALLS]` and Llama 3 JSON.
#[test]
fn tool_calls_forced_parsed_and_streamed() {
    forced_tool_calls(&fixture("tiny-qwen3"));
    for template in [MISTRAL_TEMPLATE, LLAMA3_TEMPLATE] {
        let dir = with_template(template);
        forced_tool_calls(dir.path().to_str().unwrap());
    }
}

fn forced_tool_calls(gen: &str) {
    let server = Server::start(&["--model", gen]);
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city", "days"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {
            "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
            "required": ["zone"], "additionalProperties": false}}}
    ]);
    let check = |call: &Value, want: Option<&str>| {
        assert_eq!(call["type"], "function", "{call}");
        assert!(
            call["id"]
                .as_str()
                .is_some_and(|id| id.starts_with("call_")),
            "{call}"
        );
        let name = call["function"]["name"].as_str().unwrap();
        let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap())
            .unwrap_or_else(|e| panic!("{e}: {call}"));
        match name {
            "get_weather" => {
                assert!(
                    args["city"].as_str().unwrap().chars().count() <= 12,
                    "{args}"
                );
                assert!((1..=7).contains(&args["days"].as_i64().unwrap()), "{args}");
            }
            "get_time" => assert!(["UTC", "CET"].contains(&args["zone"].as_str().unwrap())),
            other => panic!("unknown tool {other}"),
        }
        if let Some(w) = want {
            assert_eq!(name, w);
        }
    };
    for (seed, choice, want) in [
        (1, json!("required"), None),
        (
            2,
            json!({"type": "function", "function": {"name": "get_time"}}),
            Some("get_time"),
        ),
        (
            3,
            json!({"type": "function", "function": {"name": "get_weather"}}),
            Some("get_weather"),
        ),
    ] {
        let body = json!({"model": gen, "messages": [{"role": "user", "content": "weather in Paris?"}],
            "tools": tools, "tool_choice": choice, "parallel_tool_calls": false, "seed": seed,
            "max_tokens": 200});
        let r = server
            .post("/v1/chat/completions", &body)
            .ok("forced tool call");
        let c = &r["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{r}");
        let calls = c["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{r}");
        check(&calls[0], want);
        // Streamed: the same call as one delta, then finish_reason "tool_calls".
        let mut body = body.clone();
        body["stream"] = json!(true);
        let sse = server.post("/v1/chat/completions", &body);
        assert_eq!(sse.status, 200);
        let text = sse.text();
        let chunks: Vec<Value> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        let deltas: Vec<&Value> = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
            .flatten()
            .collect();
        assert_eq!(deltas.len(), 1, "{text}");
        check(deltas[0], want);
        assert_eq!(deltas[0]["index"], 0);
        assert!(
            chunks
                .iter()
                .any(|c| c["choices"][0]["finish_reason"] == "tool_calls"),
            "{text}"
        );
    }
    // A tool's result goes back through the chat template (role "tool" after the assistant's
    // call), and the conversation continues.
    let body = json!({"model": gen, "max_tokens": 8, "messages": [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 1}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}],
        "tools": tools});
    let r = server.post("/v1/chat/completions", &body).ok("tool result");
    assert!(r["usage"]["prompt_tokens"].as_u64().unwrap() > 10, "{r}");
    // Errors name the field.
    for (body, param) in [
        (
            json!({"model": gen, "messages": [{"role": "user", "content": "x"}], "tools": tools,
                "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice.function.name",
        ),
        (
            json!({"model": gen, "messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}),
            "tool_choice",
        ),
        (
            json!({"model": gen, "messages": [{"role": "user", "content": "x"}], "tools": tools,
                "tool_choice": "sometimes"}),
            "tool_choice",
        ),
        (
            json!({"model": gen, "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}),
            "tools[0].function",
        ),
        (
            json!({"model": gen, "messages": [{"role": "user", "content": "x"}], "tools": tools,
                "tool_choice": "required", "response_format": {"type": "json_object"}}),
            "response_format",
        ),
    ] {
        let e = server
            .post("/v1/chat/completions", &body)
            .error(400, &body.to_string());
        assert_eq!(e["param"], param, "{e}");
    }
}

/// Speculative decoding over HTTP (`speculative` / `draft_tokens`, and the server's default):
/// the same greedy text as without it (prompt lookup and suffix drafts), sampled requests
/// drafting too, drafts counted in `/metrics`, bad values refused naming the field.
#[test]
fn speculative_requests_give_the_same_text() {
    let gen = fixture("tiny-qwen3");
    let server = Server::start(&[
        "--model",
        &gen,
        "--speculative",
        "ngram",
        "--draft-tokens",
        "6",
    ]);
    let body = |spec: Value| {
        let mut b = json!({"model": gen, "prompt": "the the the", "max_tokens": 48,
            "temperature": 0, "ignore_eos": true});
        if let Value::Object(m) = spec {
            b.as_object_mut().unwrap().extend(m);
        }
        b
    };
    let text = |spec: Value| {
        let r = server.post("/v1/completions", &body(spec)).ok("completion");
        r["choices"][0]["text"].as_str().unwrap().to_owned()
    };
    let off = text(json!({"speculative": "off"}));
    assert_eq!(text(json!({})), off, "the server's default drafts");
    assert_eq!(
        text(json!({"speculative": "ngram", "draft_tokens": 3})),
        off
    );
    assert_eq!(text(json!({"speculative": "suffix"})), off);
    // Sampled requests draft too (the rejection rule keeps the distribution).
    let sampled = body(json!({"speculative": "ngram", "temperature": 0.8, "seed": 7}));
    let r = server.post("/v1/completions", &sampled).ok("sampled");
    assert_eq!(r["usage"]["completion_tokens"], 48, "{r}");
    let m = server.get("/metrics").text();
    let drafted: f64 = m
        .lines()
        .find_map(|l| l.strip_prefix("lattice_draft_tokens_total "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(drafted > 0.0, "{m}");
    assert!(m.contains("lattice_accepted_draft_tokens_total"));
    for (spec, param) in [
        (json!({"speculative": "tree"}), "speculative"),
        (json!({"draft_tokens": 0}), "draft_tokens"),
        (json!({"draft_tokens": 99}), "draft_tokens"),
        (
            json!({"speculative": "off", "draft_tokens": 3}),
            "draft_tokens",
        ),
    ] {
        let b = body(spec);
        let e = server
            .post("/v1/completions", &b)
            .error(400, &b.to_string());
        assert_eq!(e["param"], param, "{e}");
    }
}

/// LoRA adapters over HTTP (`--lora NAME=DIR`, vLLM's convention): a request whose `model` is
/// an adapter's name runs with it, the base model's name without; requests for different
/// adapters sent at once share the batch, each text equal to `lattice generate` with that one
/// adapter; `/v1/models` lists the adapters with their parent; bad `--lora` values are refused.
#[test]
fn lora_adapters_are_served_by_name() {
    let gen = fixture("tiny-qwen3");
    let dir = |n: &str| {
        format!(
            "{}/../inference/tests/fixtures/lora/tiny-qwen3/{n}",
            env!("CARGO_MANIFEST_DIR")
        )
    };
    let (attn, mlp) = (dir("attn"), dir("mlp"));
    let server = Server::start(&[
        "--model",
        &gen,
        "--lora",
        &format!("a={attn}"),
        "--lora",
        &format!("m={mlp}"),
    ]);
    let prompt = "The capital of France is";
    let body = |model: &str| {
        json!({"model": model, "prompt": prompt, "max_tokens": 24, "temperature": 0,
            "ignore_eos": true})
    };
    let cli = |lora: Option<&str>| {
        let mut args = vec![
            "generate",
            "--model",
            &gen,
            "--prompt",
            prompt,
            "--temperature",
            "0",
            "--max-tokens",
            "24",
            "--ignore-eos",
            "--json",
        ];
        if let Some(l) = lora {
            args.extend(["--lora", l]);
        }
        let o = support::lattice(&args);
        assert!(o.status.success(), "{}", support::stderr(&o));
        let v: Value = serde_json::from_str(String::from_utf8(o.stdout).unwrap().trim()).unwrap();
        v["text"].as_str().unwrap().to_owned()
    };
    let want = [
        ("a", cli(Some(&attn))),
        ("m", cli(Some(&mlp))),
        (gen.as_str(), cli(None)),
    ];
    assert_ne!(want[0].1, want[2].1, "the adapter changes the text");
    std::thread::scope(|s| {
        let handles: Vec<_> = want
            .iter()
            .map(|(model, text)| {
                let server = &server;
                let b = body(model);
                s.spawn(move || {
                    let r = server.post("/v1/completions", &b).ok("completion");
                    assert_eq!(r["choices"][0]["text"].as_str().unwrap(), text, "{model}");
                    assert_eq!(r["model"], *model);
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    });
    let models = server.get("/v1/models").json();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert!(ids.contains(&"a") && ids.contains(&"m"), "{models}");
    let a = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == "a")
        .unwrap();
    assert_eq!(a["parent"], models["data"][0]["id"]);
    for bad in ["nameonly", "=dir", "x=/nonexistent/adapter"] {
        let o = support::lattice(&["serve", "--model", &gen, "--lora", bad, "--port", "0"]);
        assert!(!o.status.success());
        let e = support::stderr(&o);
        assert!(
            e.contains("--lora") || e.contains("LoRA adapter"),
            "{bad}: {e}"
        );
    }
}

/// The text of a finished completion stream (`raw`: the whole HTTP response).
fn stream_text(raw: &[u8]) -> String {
    let r = parse_response(raw).expect("a complete chunked response");
    sse_events(&r.text())
        .iter()
        .filter_map(|v| v["choices"][0]["text"].as_str().map(str::to_owned))
        .collect()
}

/// Adapters loaded and unloaded through vLLM's routes while requests run, from under
/// `--lora-dir` only (`..`, absolute paths elsewhere and symlinks out are 403); a `lora`
/// mixture equals `lattice generate` with the same adapters and scales; a stream that started
/// with an adapter finishes with it after the unload; a merged adapter serves the same text.
#[test]
fn lora_adapters_load_unload_and_mix_at_run_time() {
    use std::io::Read;
    let gen = fixture("tiny-qwen3");
    let src = |n: &str| {
        std::path::PathBuf::from(format!(
            "{}/../inference/tests/fixtures/lora/tiny-qwen3/{n}",
            env!("CARGO_MANIFEST_DIR")
        ))
    };
    let root = std::env::temp_dir().join(format!("lattice-lora-dir-{}", std::process::id()));
    let (dir, outside) = (root.join("adapters"), root.join("outside"));
    for (to, n) in [
        (dir.join("attn"), "attn"),
        (dir.join("mlp"), "mlp"),
        (outside.join("attn"), "attn"),
    ] {
        std::fs::create_dir_all(&to).unwrap();
        for f in ["adapter_config.json", "adapter_model.safetensors"] {
            std::fs::copy(src(n).join(f), to.join(f)).unwrap();
        }
    }
    std::os::unix::fs::symlink(outside.join("attn"), dir.join("escape")).unwrap();
    let sneaky = dir.join("sneaky");
    std::fs::create_dir_all(&sneaky).unwrap();
    std::fs::copy(
        src("attn").join("adapter_config.json"),
        sneaky.join("adapter_config.json"),
    )
    .unwrap();
    std::os::unix::fs::symlink(
        outside.join("attn/adapter_model.safetensors"),
        sneaky.join("adapter_model.safetensors"),
    )
    .unwrap();
    let server = Server::start(&["--model", &gen, "--lora-dir", dir.to_str().unwrap()]);
    let prompt = "The capital of France is";
    let cli = |extra: &[&str], n: usize| {
        cli_generate(&gen, prompt, n, &[&["--ignore-eos"], extra].concat())["text"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let body = |model: &str, n: usize| {
        json!({"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0,
            "ignore_eos": true})
    };
    let (attn, mlp) = (dir.join("attn"), dir.join("mlp"));
    let (attn, mlp) = (attn.to_str().unwrap(), mlp.to_str().unwrap());
    let load = |name: &str, path: &str| {
        server.post(
            "/v1/load_lora_adapter",
            &json!({"lora_name": name, "lora_path": path}),
        )
    };
    // Refused paths, before anything is loaded.
    let out_abs = outside.join("attn");
    for (path, status) in [
        ("../outside/attn", 403),
        (out_abs.to_str().unwrap(), 403),
        ("attn/../../outside/attn", 403),
        ("escape", 403),
        ("sneaky", 403),
        ("", 403),
        ("missing", 404),
    ] {
        let e = load("x", path).error(status, path);
        assert!(
            e["message"].as_str().unwrap().contains("lora"),
            "{path}: {e}"
        );
    }
    // A base stream runs while adapters load.
    let long = json!({"model": gen, "prompt": prompt, "max_tokens": 120, "temperature": 0,
        "ignore_eos": true, "stream": true});
    let (mut base_stream, mut base_raw) = open_stream(&server, "/v1/completions", &long);
    assert_eq!(load("a", "attn").status, 200, "relative to --lora-dir");
    let dup = load("a", mlp).error(400, "a name loaded twice");
    assert!(
        dup["message"].as_str().unwrap().contains("already"),
        "{dup}"
    );
    assert_eq!(load("m", mlp).status, 200);
    let r = server
        .post(
            "/v1/load_lora_adapter",
            &json!({"lora_name": "m", "lora_path": mlp, "load_inplace": true}),
        )
        .status;
    assert_eq!(r, 200, "load_inplace replaces");
    let ids: Vec<String> = server.get("/v1/models").json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        ids.contains(&"a".into()) && ids.contains(&"m".into()),
        "{ids:?}"
    );
    let want_a = cli(&["--lora", attn], 24);
    let got = server
        .post("/v1/completions", &body("a", 24))
        .ok("adapter a");
    assert_eq!(got["choices"][0]["text"], want_a.as_str());
    assert_eq!(got["model"], "a");
    // A weighted mixture through the `lora` extension.
    let want_mix = cli(
        &[
            "--lora",
            attn,
            "--lora-scale",
            "0.7",
            "--lora",
            mlp,
            "--lora-scale",
            "-0.4",
        ],
        24,
    );
    let mut mix = body(&gen, 24);
    mix["lora"] = json!([{"name": "a", "scale": 0.7}, {"name": "m", "scale": -0.4}]);
    let got = server.post("/v1/completions", &mix).ok("mixture");
    assert_eq!(got["choices"][0]["text"], want_mix.as_str());
    assert_ne!(want_mix, want_a);
    for (lora, param) in [
        (json!([{"name": "nope"}]), "lora[0].name"),
        (json!([{"name": "a", "scale": "big"}]), "lora[0].scale"),
        (json!([{"name": "a", "weight": 1}]), "lora[0]"),
    ] {
        let mut b = body(&gen, 4);
        b["lora"] = lora;
        let e = server.post("/v1/completions", &b).error(400, param);
        assert!(e["param"].as_str().unwrap_or("").starts_with(param), "{e}");
    }
    // A stream with `a` keeps it through the unload; new requests no longer find it.
    let mut s = body("a", 64);
    s["stream"] = json!(true);
    let (mut a_stream, mut a_raw) = open_stream(&server, "/v1/completions", &s);
    let r = server.post("/v1/unload_lora_adapter", &json!({"lora_name": "a"}));
    assert_eq!(r.status, 200, "{}", r.text());
    a_stream.read_to_end(&mut a_raw).unwrap();
    assert_eq!(stream_text(&a_raw), cli(&["--lora", attn], 64));
    server
        .post("/v1/completions", &body("a", 4))
        .error(404, "unloaded");
    server
        .post("/v1/unload_lora_adapter", &json!({"lora_name": "a"}))
        .error(404, "unloaded twice");
    // vLLM's numeric id is not used here: refused, not ignored.
    server
        .post(
            "/v1/unload_lora_adapter",
            &json!({"lora_name": "m", "lora_int_id": 2}),
        )
        .error(400, "lora_int_id");
    base_stream.read_to_end(&mut base_raw).unwrap();
    assert_eq!(
        stream_text(&base_raw),
        cli(&[], 120),
        "the base stream is undisturbed"
    );
    server.assert_no_panic();
    drop(server);
    // Without --lora-dir nothing loads at run time.
    let plain = Server::start(&["--model", &gen]);
    let e = plain
        .post(
            "/v1/load_lora_adapter",
            &json!({"lora_name": "a", "lora_path": attn}),
        )
        .error(403, "no --lora-dir");
    assert!(e["message"].as_str().unwrap().contains("--lora-dir"), "{e}");
    drop(plain);
    // Merged into the weights: the same text under the adapter's name and the model's.
    let merged = Server::start(&[
        "--model",
        &gen,
        "--lora",
        &format!("a={attn}"),
        "--lora-merge",
    ]);
    for model in ["a", gen.as_str()] {
        let got = merged
            .post("/v1/completions", &body(model, 24))
            .ok("merged");
        assert_eq!(got["choices"][0]["text"], want_a.as_str(), "{model}");
    }
    drop(merged);
    std::fs::remove_dir_all(&root).ok();
}
