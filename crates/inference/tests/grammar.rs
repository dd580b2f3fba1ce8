//! Output constraints (grammar/) through the generation loop on the tiny random-weight Qwen3
//! fixture: whatever the weights, a JSON-Schema-constrained output is valid JSON of that
//! schema, a regex-constrained one matches, and `logit_bias` forces and bans tokens. Invalid
//! schemas and expressions are errors that say what is wrong; each kind of spec goes to the
//! engine that serves it (the DFA engine for the JSON Schemas and regular expressions it
//! supports, llguidance for the rest).

mod common;

use common::fixture;
use lattice_inference::engine::{generate, FinishReason, GenerateRequest, TextModel};
use lattice_inference::grammar::{Engine, Spec};
use lattice_inference::model::source::WeightMode;
use lattice_inference::sample::SamplingParams;
use serde_json::{json, Value};

fn model() -> TextModel {
    TextModel::load(&fixture("tiny-qwen3"), WeightMode::F32).unwrap()
}

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        seed: Some(seed),
        ..SamplingParams::default()
    }
}

fn run(
    m: &TextModel,
    spec: Option<&Spec>,
    sampling: SamplingParams,
    max: usize,
) -> (String, FinishReason, Vec<u32>) {
    let prompt = m.encode_prompt("Give me the record:", true).unwrap();
    let mut req = GenerateRequest::new(prompt, max, sampling);
    req.constraint = spec.map(|s| m.compile_constraint(s).unwrap());
    let g = generate(m, &req, &mut |_| true).unwrap();
    (g.text, g.finish_reason, g.token_ids)
}

#[test]
fn json_schema_outputs_are_valid_whatever_the_weights() {
    let m = model();
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
            "kind": {"anyOf": [{"const": "person"}, {"const": "robot"}]}
        },
        "required": ["name", "age", "tags", "kind"],
        "additionalProperties": false
    });
    let spec = Spec::JsonSchema(schema);
    for seed in 0..6 {
        let (text, finish, _) = run(&m, Some(&spec), sampled(seed), 400);
        assert_eq!(finish, FinishReason::Stop, "seed {seed}: {text:?}");
        let v: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("seed {seed}: {e}: {text:?}"));
        let o = v.as_object().unwrap();
        assert_eq!(o.len(), 4, "{v}");
        assert!(o["name"].as_str().unwrap().chars().count() <= 6, "{v}");
        assert!((0..=120).contains(&o["age"].as_i64().unwrap()), "{v}");
        let tags = o["tags"].as_array().unwrap();
        assert!(
            tags.len() <= 3
                && tags
                    .iter()
                    .all(|t| ["a", "b", "c"].contains(&t.as_str().unwrap())),
            "{v}"
        );
        assert!(
            ["person", "robot"].contains(&o["kind"].as_str().unwrap()),
            "{v}"
        );
    }
}

#[test]
fn regex_outputs_match_and_greedy_too() {
    let m = model();
    let spec = Spec::Regex("[a-z]{3}-[0-9]{2}".into());
    let check = |t: &str| {
        let b = t.as_bytes();
        b.len() == 6
            && b[..3].iter().all(u8::is_ascii_lowercase)
            && b[3] == b'-'
            && b[4..].iter().all(u8::is_ascii_digit)
    };
    for seed in 0..4 {
        let (text, finish, _) = run(&m, Some(&spec), sampled(seed), 50);
        assert!(
            check(&text) && finish == FinishReason::Stop,
            "seed {seed}: {text:?}"
        );
    }
    let (text, finish, _) = run(&m, Some(&spec), SamplingParams::greedy(), 50);
    assert!(
        check(&text) && finish == FinishReason::Stop,
        "greedy: {text:?}"
    );
}

#[test]
fn gbnf_outputs_follow_the_grammar() {
    let m = model();
    let spec = Spec::Gbnf(
        "# a list of one to three colours\nroot ::= \"[\" colour (\", \" colour){0,2} \"]\"\ncolour ::= \"red\" | \"green\" | \"blue\"\n"
            .into(),
    );
    for seed in 0..4 {
        let (text, finish, _) = run(&m, Some(&spec), sampled(seed), 40);
        assert_eq!(finish, FinishReason::Stop, "seed {seed}: {text:?}");
        let inner = text
            .strip_prefix('[')
            .and_then(|t| t.strip_suffix(']'))
            .unwrap();
        let items: Vec<&str> = inner.split(", ").collect();
        assert!((1..=3).contains(&items.len()), "{text:?}");
        assert!(
            items.iter().all(|c| ["red", "green", "blue"].contains(c)),
            "{text:?}"
        );
    }
    let e = m
        .compile_constraint(&Spec::Gbnf("root ::= [a-z".into()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("GBNF") && e.contains("line 1"), "{e}");
}

#[test]
fn json_object_outputs_are_objects_or_their_beginnings() {
    // Random weights rarely close a free string, so these outputs may end at the limit: then
    // they are the start of an object (finish "length", as OpenAI reports it).
    let m = model();
    for seed in 0..4 {
        let (text, finish, _) = run(&m, Some(&Spec::JsonObject), sampled(seed), 60);
        assert!(text.starts_with('{'), "seed {seed}: {text:?}");
        if finish == FinishReason::Stop {
            let v: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("seed {seed}: {e}: {text:?}"));
            assert!(v.is_object(), "{text}");
        } else {
            assert_eq!(finish, FinishReason::Length, "seed {seed}");
        }
    }
}

#[test]
fn logit_bias_forces_and_bans_tokens() {
    let m = model();
    let prompt = m.encode_prompt("Hello", true).unwrap();
    let mut req = GenerateRequest::new(prompt.clone(), 8, SamplingParams::greedy());
    req.ignore_eos = true;
    let plain = generate(&m, &req, &mut |_| true).unwrap().token_ids;
    // +100 on one token: every step picks it.
    let forced = 42u32;
    req.logit_bias = vec![(forced, 100.0)];
    let g = generate(&m, &req, &mut |_| true).unwrap();
    assert!(
        g.token_ids.iter().all(|&t| t == forced),
        "{:?}",
        g.token_ids
    );
    // -100 on the greedy first token: another one comes first.
    req.logit_bias = vec![(plain[0], -100.0)];
    let g = generate(&m, &req, &mut |_| true).unwrap();
    assert_ne!(g.token_ids[0], plain[0]);
    assert!(!g.token_ids.contains(&plain[0]), "{:?}", g.token_ids);
}

#[test]
fn invalid_constraints_say_what_is_wrong() {
    let m = model();
    for (spec, want) in [
        (
            Spec::JsonSchema(json!({"type": "object", "properties": 5})),
            "JSON schema",
        ),
        (Spec::JsonSchema(json!({"type": "strin"})), "JSON schema"),
        (Spec::Regex("(unclosed".into()), "regular expression"),
        (Spec::Lark("start: missing_rule".into()), "grammar"),
    ] {
        let e = m.compile_constraint(&spec).unwrap_err().to_string();
        assert!(e.contains(want), "{spec:?}: {e}");
    }
}

/// The byte spelling constraints match tokens by: for byte-level BPE (Qwen3), SentencePiece BPE
/// with byte fallback (Llama 2 / Mistral) and Gemma 3's, the bytes of the tokens of a text,
/// joined, are the text (past the first token, whose leading space some decoders drop).
#[test]
fn token_bytes_spell_the_text_they_encode() {
    use lattice_inference::tokenizer::Tokenizer;
    let text = "Hello, wörld! 12 <tag> \u{1F600} tabs\tand\nlines — ok";
    for name in ["qwen3", "llama2", "gemma3"] {
        let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../.cache/npm")
            .join(name)
            .join("package/models/tokenizer.json");
        let t = Tokenizer::from_file(&path).unwrap_or_else(|e| {
            panic!(
                "{} (scripts/fetch_models.sh fetches it): {e}",
                path.display()
            )
        });
        let ids = t.encode(text, false).ids;
        let mut bytes = Vec::new();
        for &id in &ids {
            let (b, special) = t.token_bytes(id).unwrap();
            assert!(!special, "{name}: token {id} is special");
            bytes.extend(b);
        }
        let spelled = String::from_utf8(bytes).unwrap();
        assert!(
            spelled == text || spelled.trim_start() == text,
            "{name}: {spelled:?}"
        );
    }
}

#[test]
fn each_spec_goes_to_the_engine_that_serves_it() {
    let m = model();
    let object =
        json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]});
    let mut with_options = object.clone();
    with_options["x-guidance"] = json!({"whitespace_flexible": true});
    // The layout both engines write, asked for explicitly (as the server's tool calls do).
    let mut compact = object.clone();
    compact["x-guidance"] =
        json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "});
    for (spec, want) in [
        (Spec::JsonSchema(object), Engine::Dfa),
        (Spec::Regex("[a-z]{3}-[0-9]{2}".into()), Engine::Dfa),
        // Outside the DFA engine's subset: an unconstrained item, a schema's own layout
        // options, an anchor.
        (
            Spec::JsonSchema(json!({"type": "array", "items": {}})),
            Engine::Llguidance,
        ),
        (Spec::JsonSchema(with_options), Engine::Llguidance),
        (Spec::JsonSchema(compact), Engine::Dfa),
        (Spec::Regex("^[0-9]+".into()), Engine::Llguidance),
        (Spec::JsonObject, Engine::Llguidance),
        (
            Spec::Lark("start: \"a\" | \"b\"".into()),
            Engine::Llguidance,
        ),
        (Spec::Gbnf("root ::= \"x\"".into()), Engine::Llguidance),
    ] {
        let c = m
            .compile_constraint(&spec)
            .unwrap_or_else(|e| panic!("{spec:?}: {e}"));
        assert_eq!(c.engine(), want, "{spec:?}");
    }
    // What both engines refuse stays refused, with llguidance's reason and the spec's kind.
    let e = m
        .compile_constraint(&Spec::JsonSchema(
            json!({"allOf": [{"type": "string"}, {"type": "integer"}]}),
        ))
        .unwrap_err()
        .to_string();
    assert!(e.contains("JSON schema"), "{e}");
    // The fallback's outputs hold too: any item, 1 to 3 of them.
    let spec = Spec::JsonSchema(
        json!({"type": "array", "items": {"type": "array", "items": {}, "maxItems": 2}, "minItems": 1, "maxItems": 3}),
    );
    for seed in 0..3 {
        let (text, finish, _) = run(&m, Some(&spec), sampled(seed), 200);
        if finish == FinishReason::Stop {
            let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
            let a = v.as_array().unwrap();
            assert!((1..=3).contains(&a.len()), "{text}");
            assert!(
                a.iter().all(|x| x.as_array().is_some_and(|x| x.len() <= 2)),
                "{text}"
            );
        } else {
            assert!(text.starts_with('['), "{text:?}");
        }
    }
}
