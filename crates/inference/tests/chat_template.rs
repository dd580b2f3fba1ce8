//! Chat templates against transformers, rendered by its own code in
//! scripts/gen_chat_template_reference.py: `tests/fixtures/chat_template/reference.json` (Qwen3,
//! SmolLM2, Qwen2.5-Coder and a feature-coverage template over 15 conversations) and
//! `llama_cpp_reference.json.gz` (23 real templates of other families that llama.cpp keeps as
//! test data) must render byte for byte, or fail with the same `raise_exception` message. Plus
//! loading from `tokenizer_config.json` and clear errors for broken templates.

use std::collections::HashMap;

use lattice_inference::chat::{pyfmt, ChatMessage, ChatTemplate, RenderOptions};
use lattice_inference::Error;
use serde_json::Value;

fn fixture() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/chat_template/reference.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("json")
}

fn opt_str(v: &Value) -> Option<String> {
    v.as_str().map(str::to_string)
}

/// Renders every case of a fixture; returns (byte-identical renders, matching errors) and
/// panics listing every mismatch. Errors must carry transformers' `raise_exception` message
/// (stored as "TemplateError: msg"); where Python itself failed (TypeError, ...) Lattice may fail
/// or render. `clock` cases get today's date put back where the generator pinned
/// 2024-07-26.
fn check_cases(data: &Value) -> (usize, usize) {
    let mut templates = HashMap::new();
    for (name, t) in data["templates"].as_object().unwrap() {
        let tpl = ChatTemplate::new(
            t["source"].as_str().unwrap(),
            opt_str(&t["bos_token"]),
            opt_str(&t["eos_token"]),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        templates.insert(name.clone(), tpl);
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let pinned = 1_721_995_200; // 2024-07-26 12:00:00 UTC
    let mut n_ok = 0;
    let mut n_err = 0;
    let mut n_lenient = 0;
    let mut failures = Vec::new();
    for case in data["cases"].as_array().unwrap() {
        let tname = case["template"].as_str().unwrap();
        let conv = case["conversation"].as_str().unwrap();
        let messages: Vec<ChatMessage> =
            serde_json::from_value(data["conversations"][conv].clone()).unwrap();
        let opts = RenderOptions {
            add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
            enable_thinking: case.get("enable_thinking").and_then(Value::as_bool),
            tools: case["tools"]
                .as_bool()
                .unwrap()
                .then(|| data["tools"].clone()),
            extra: case
                .get("extra")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default(),
        };
        let label = format!(
            "{tname}/{conv} agp={} thinking={:?}",
            opts.add_generation_prompt, opts.enable_thinking
        );
        let got = templates[tname].render(&messages, &opts);
        match (case.get("expected"), got) {
            (Some(want), Ok(got)) => {
                let mut want = want.as_str().unwrap().to_string();
                if case.get("clock") == Some(&Value::Bool(true)) {
                    for fmt in ["%Y-%m-%d", "%B %d, %Y", "%d %b %Y"] {
                        let from = pyfmt::strftime(pinned, fmt).unwrap();
                        want = want.replace(&from, &pyfmt::strftime(now, fmt).unwrap());
                    }
                }
                if want == got {
                    n_ok += 1;
                } else {
                    failures.push(format!("{label}\n--- want\n{want}\n--- got\n{got}"));
                }
            }
            (None, Err(e)) => {
                assert!(matches!(e, Error::ChatTemplate(_)), "{label}: {e:?}");
                let stored = case["error"].as_str().unwrap();
                match stored.strip_prefix("TemplateError: ") {
                    Some(msg) if !e.to_string().contains(msg) => {
                        failures.push(format!("{label}: error {e} lacks {msg:?}"))
                    }
                    _ => n_err += 1,
                }
            }
            (Some(_), Err(e)) => failures.push(format!("{label}: failed: {e}")),
            (None, Ok(got)) => {
                // Python-level failures (e.g. TypeError: iterating `none`, which minijinja
                // treats as empty) may render here; raise_exception must not.
                if case["error"].as_str().unwrap().starts_with("TemplateError") {
                    failures.push(format!("{label}: rendered {got:?}, want an error"));
                } else {
                    n_lenient += 1;
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    // Only a few cases may be this lenient.
    assert!(n_lenient <= 15, "{n_lenient} Python failures rendered");
    (n_ok, n_err)
}

#[test]
fn renders_like_transformers_byte_for_byte() {
    let data = fixture();
    let (n_ok, n_err) = check_cases(&data);
    assert!(n_err >= 1 && n_ok >= 100, "{n_ok} rendered, {n_err} errors");
}

#[test]
fn renders_real_templates_of_other_families_like_transformers() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/chat_template/llama_cpp_reference.json.gz"
    );
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut flate2::read::GzDecoder::new(std::fs::File::open(path).expect("fixture")),
        &mut text,
    )
    .expect("gzip");
    let data: Value = serde_json::from_str(&text).expect("json");
    assert!(data["templates"].as_object().unwrap().len() >= 20);
    let (n_ok, n_err) = check_cases(&data);
    assert!(
        n_ok >= 300 && n_err >= 20,
        "{n_ok} rendered, {n_err} errors"
    );
}

#[test]
fn qwen3_thinking_switch() {
    let data = fixture();
    let t = &data["templates"]["qwen3"];
    let tpl = ChatTemplate::new(
        t["source"].as_str().unwrap(),
        None,
        opt_str(&t["eos_token"]),
    )
    .unwrap();
    let msgs = [ChatMessage::new("user", "Hi")];
    let mut opts = RenderOptions {
        add_generation_prompt: true,
        ..Default::default()
    };
    let plain = tpl.render(&msgs, &opts).unwrap();
    assert_eq!(
        plain,
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    opts.enable_thinking = Some(false);
    let off = tpl.render(&msgs, &opts).unwrap();
    assert_eq!(off, format!("{plain}<think>\n\n</think>\n\n"));
    opts.enable_thinking = Some(true);
    assert_eq!(tpl.render(&msgs, &opts).unwrap(), plain);
}

fn write(dir: &std::path::Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn loads_from_tokenizer_config() {
    let dir = tempfile::tempdir().unwrap();
    let msgs = [ChatMessage::new("user", "x")];
    let opts = RenderOptions::default();

    // A plain string template; tokens as a string and as an AddedToken dict.
    let p = write(
        dir.path(),
        "tokenizer_config.json",
        r#"{"chat_template":
              "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}",
            "bos_token": "<s>", "eos_token": {"content": "</s>", "lstrip": false}}"#,
    );
    let tpl = ChatTemplate::from_tokenizer_config(&p).unwrap().unwrap();
    assert_eq!(
        (tpl.bos_token(), tpl.eos_token()),
        (Some("<s>"), Some("</s>"))
    );
    assert_eq!(tpl.render(&msgs, &opts).unwrap(), "<s>x</s>");

    // A list of named templates: `default` is chosen.
    write(
        dir.path(),
        "tokenizer_config.json",
        r#"{"chat_template": [{"name": "tool_use", "template": "T"},
                              {"name": "default", "template": "D{{ messages|length }}"}],
            "bos_token": null}"#,
    );
    let tpl = ChatTemplate::from_tokenizer_config(&p).unwrap().unwrap();
    assert_eq!(tpl.bos_token(), None);
    assert_eq!(tpl.render(&msgs, &opts).unwrap(), "D1");

    // No `default` in the list: an error naming what is there.
    write(
        dir.path(),
        "tokenizer_config.json",
        r#"{"chat_template": [{"name": "tool_use", "template": "T"}]}"#,
    );
    let e = ChatTemplate::from_tokenizer_config(&p)
        .unwrap_err()
        .to_string();
    assert!(e.contains("default") && e.contains("tool_use"), "{e}");

    // No template at all.
    write(
        dir.path(),
        "tokenizer_config.json",
        r#"{"eos_token": "</s>"}"#,
    );
    assert!(ChatTemplate::from_tokenizer_config(&p).unwrap().is_none());

    // A chat_template.jinja beside it wins.
    write(
        dir.path(),
        "chat_template.jinja",
        "J{{ messages[0].content }}\n",
    );
    let tpl = ChatTemplate::from_tokenizer_config(&p).unwrap().unwrap();
    assert_eq!(tpl.render(&msgs, &opts).unwrap(), "Jx");
    std::fs::remove_file(dir.path().join("chat_template.jinja")).unwrap();

    // Broken files: named errors.
    write(dir.path(), "tokenizer_config.json", "{not json");
    let e = ChatTemplate::from_tokenizer_config(&p)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("tokenizer_config.json") && e.contains("JSON"),
        "{e}"
    );
    write(
        dir.path(),
        "tokenizer_config.json",
        r#"{"chat_template": "{% for %}"}"#,
    );
    let e = ChatTemplate::from_tokenizer_config(&p)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("tokenizer_config.json") && e.contains("compile"),
        "{e}"
    );
    write(
        dir.path(),
        "tokenizer_config.json",
        r#"{"chat_template": 3}"#,
    );
    assert!(ChatTemplate::from_tokenizer_config(&p).is_err());
    let missing = dir.path().join("nope.json");
    let e = ChatTemplate::from_tokenizer_config(&missing).unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e:?}");
}

fn render(src: &str) -> lattice_inference::Result<String> {
    let msgs = [ChatMessage::new("user", "hi")];
    ChatTemplate::new(src, None, None)?.render(&msgs, &RenderOptions::default())
}

#[test]
fn broken_templates_give_clear_errors() {
    let e = ChatTemplate::new("line one\n{% if messages %}\n{{ x }", None, None).unwrap_err();
    assert!(matches!(e, Error::ChatTemplate(_)));
    let e = e.to_string();
    assert!(e.contains("compile") && e.contains("line"), "{e}");

    let cases = [
        ("{{ messages | frobnicate }}", "frobnicate"),
        ("{% if messages is frobnicated %}{% endif %}", "frobnicated"),
        ("{{ messages[0].content.frobnicate() }}", "frobnicate"),
        ("{{ nothing.attr }}", "undefined"),
        ("{{ nothing | tojson }}", "undefined"),
        ("{{ strftime_now('%Q') }}", "%Q"),
        (
            "{{ raise_exception('Conversation roles must alternate') }}",
            "Conversation roles must alternate",
        ),
        ("{{ messages | tojson(bogus=1) }}", "bogus"),
        ("{% include 'other' %}", "other"),
        // Hostile templates stop with an error instead of looping, recursing or following a
        // value that contains itself (found by fuzzing: a stack overflow).
        (
            "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}",
            "fuel",
        ),
        (
            "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
            "recursion",
        ),
        (
            "{% set ns = namespace(a=0) %}{% set ns.a = ns %}{{ ns }}",
            "contain itself",
        ),
        (
            "{% set ns = namespace(a=0) %}{% set ns.a = ns %}{{ ns | string }}",
            "contain itself",
        ),
        (
            "{% set ns = namespace(a=0) %}{% set ns.a = [ns] %}{{ ns | tojson }}",
            "contain itself",
        ),
    ];
    for (src, needle) in cases {
        let e = render(src).unwrap_err();
        assert!(matches!(e, Error::ChatTemplate(_)), "{src}: {e:?}");
        assert!(e.to_string().contains(needle), "{src}: {e}");
    }
}

#[test]
fn messages_deserialize_from_openai_json() {
    let m: Vec<ChatMessage> = serde_json::from_str(
        r#"[{"role": "assistant", "content": null,
             "tool_calls": [{"id": "1", "type": "function",
                             "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "content": "ok", "tool_call_id": "1"}]"#,
    )
    .unwrap();
    assert_eq!(m[0].content, "");
    assert!(m[0].tool_calls.is_some());
    assert_eq!(m[1].tool_call_id.as_deref(), Some("1"));
    // Unset optional fields are absent to the template, not `none`.
    let out = ChatTemplate::new(
        concat!(
            "{% for m in messages %}",
            "{{ m.name is defined }},{{ m.tool_call_id is defined }};",
            "{% endfor %}"
        ),
        None,
        None,
    )
    .unwrap()
    .render(&m, &RenderOptions::default())
    .unwrap();
    assert_eq!(out, "False,False;False,True;");
}

#[test]
fn template_is_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ChatTemplate>();
    let tpl =
        std::sync::Arc::new(ChatTemplate::new("{{ messages[0].content }}", None, None).unwrap());
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let tpl = tpl.clone();
            std::thread::spawn(move || {
                let m = [ChatMessage::new("user", format!("t{i}"))];
                tpl.render(&m, &RenderOptions::default()).unwrap()
            })
        })
        .collect();
    let out: Vec<String> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(out, ["t0", "t1", "t2", "t3"]);
}

#[test]
fn committed_qwen3_tokenizer_config_renders_like_the_reference() {
    // tests/fixtures/tiny-qwen3 carries the real Qwen3 tokenizer_config.json (same template).
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tiny-qwen3/tokenizer_config.json");
    let tpl = ChatTemplate::from_tokenizer_config(&path)
        .unwrap()
        .expect("a chat template");
    assert_eq!(tpl.eos_token(), Some("<|im_end|>"));
    assert_eq!(tpl.bos_token(), None);
    let data = fixture();
    let case = data["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| {
            c["template"] == "qwen3"
                && c["conversation"] == "tool_multi"
                && c.get("enable_thinking") == Some(&Value::Bool(false))
        })
        .expect("case");
    let messages: Vec<ChatMessage> =
        serde_json::from_value(data["conversations"]["tool_multi"].clone()).unwrap();
    let opts = RenderOptions {
        add_generation_prompt: true,
        enable_thinking: Some(false),
        tools: Some(data["tools"].clone()),
        extra: Default::default(),
    };
    assert_eq!(
        tpl.render(&messages, &opts).unwrap(),
        case["expected"].as_str().unwrap()
    );
}
