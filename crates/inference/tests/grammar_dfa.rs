//! The DFA engine (grammar/dfa/, both backends) on the tiny Qwen3 fixture's byte-level
//! vocabulary: its masks (trie walks and pure-token bit sets) equal the brute-force answer
//! (every token's bytes run through the automaton), its walks over the schema corpus produce
//! JSON valid under each schema (grammar_check.rs: the `jsonschema` crate, formats included), its
//! number, string and object translations accept exactly what they should, and unsupported
//! features are refused with their JSON path.

mod common;
#[path = "grammar_check.rs"]
mod grammar_check;

use common::fixture;
use grammar_check::{check, Checked};
use lattice_inference::grammar::dfa::{Backend, DfaConstraint, DfaMatcher, DfaVocabulary};
use lattice_inference::sample::rng::Rng;
use lattice_inference::tokenizer::Tokenizer;
use serde_json::{json, Value};

fn tokenizer() -> Tokenizer {
    Tokenizer::from_file(fixture("tiny-qwen3").join("tokenizer.json")).unwrap()
}

fn vocab(tok: &Tokenizer) -> (DfaVocabulary, u32) {
    let eos = tok.token_to_id("<|endoftext|>").unwrap();
    (DfaVocabulary::new(tok, tok.vocab_size(), eos).unwrap(), eos)
}

fn bit(bits: &[u32], id: u32) -> bool {
    bits[id as usize / 32] >> (id % 32) & 1 == 1
}

/// Tokens made only of closing or separating bytes (preferred so that walks finish).
fn closers(tok: &Tokenizer) -> Vec<bool> {
    (0..tok.vocab_size() as u32)
        .map(|id| {
            tok.token_bytes(id)
                .is_some_and(|(b, s)| !s && !b.is_empty() && b.iter().all(|c| b"\"}],".contains(c)))
        })
        .collect()
}

/// A seeded walk: random allowed tokens (closers preferred 2 in 3 steps), until the
/// constraint is done or EOS is taken. Returns the text when it completed; calls `check` with
/// the matcher before every step.
fn walk(
    c: &DfaConstraint,
    tok: &Tokenizer,
    eos: u32,
    rng: &mut Rng,
    steps: usize,
    check: &mut dyn FnMut(&DfaMatcher),
) -> Option<String> {
    let close = closers(tok);
    let mut m = c.matcher();
    let mut out = Vec::new();
    for _ in 0..steps {
        check(&m);
        let bits = m.allowed().unwrap();
        let allowed: Vec<u32> = (0..tok.vocab_size() as u32)
            .filter(|&id| bit(&bits, id))
            .collect();
        assert!(!allowed.is_empty(), "a live state allows some token");
        let pref: Vec<u32> = allowed
            .iter()
            .copied()
            .filter(|&id| close[id as usize])
            .collect();
        let pool = if !pref.is_empty() && !rng.next_u64().is_multiple_of(3) {
            &pref
        } else {
            &allowed
        };
        let t = pool[(rng.next_u64() % pool.len() as u64) as usize];
        m.accept(t).unwrap();
        if t == eos {
            return Some(String::from_utf8(out).unwrap());
        }
        out.extend(tok.token_bytes(t).unwrap().0);
        if m.is_done() {
            return Some(String::from_utf8(out).unwrap());
        }
    }
    None
}

#[test]
fn masks_equal_the_brute_force_answer() {
    let tok = tokenizer();
    let (v, eos) = vocab(&tok);
    let schemas = [
        json!({"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 5},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["a", "bc"]}, "maxItems": 3},
            "ok": {"type": ["boolean", "null"]},
            "note": {"type": "string", "maxLength": 300},
            "free": {"type": "string", "pattern": "x"}
        }, "required": ["name", "age", "note", "free"]}),
        json!({"type": "array", "items": {"type": "number", "exclusiveMinimum": 0, "maximum": 10}}),
        json!({"type": "string", "format": "date-time"}),
        json!({"anyOf": [{"type": "string", "pattern": "^[A-Z]{2}-[0-9]{2,4}$"}, {"const": {"x": [1, null]}}]}),
    ];
    let mut states = 0;
    for (i, schema) in schemas.iter().enumerate() {
        for backend in [Backend::Dense, Backend::Lazy] {
            let c = v.compile_with(schema, backend).unwrap();
            let mut rng = Rng::from_seed(0x1234_5678 + i as u64);
            for _ in 0..4 {
                walk(&c, &tok, eos, &mut rng, 300, &mut |m| {
                    let bits = m.allowed().unwrap();
                    for id in 0..tok.vocab_size() as u32 {
                        let brute = m.clone().accept(id).is_ok();
                        assert_eq!(
                            bit(&bits, id),
                            brute,
                            "schema {i}, token {id} {:?}",
                            tok.id_to_token(id)
                        );
                    }
                    states += 1;
                });
            }
        }
    }
    assert!(states > 100, "{states} states checked");
}

#[test]
fn corpus_walks_are_valid_under_their_schemas() {
    let tok = tokenizer();
    let (v, eos) = vocab(&tok);
    let corpus = std::fs::read_to_string(fixture("schemas").join("corpus.jsonl")).unwrap();
    let (mut compiled, mut refused, mut complete, mut beyond_f64) = (0, 0, 0, 0);
    let mut rng = Rng::from_seed(0x9e37_79b9_7f4a_7c15);
    for (line, backend) in corpus
        .lines()
        .flat_map(|l| [(l, Backend::Dense), (l, Backend::Lazy)])
    {
        let entry: Value = serde_json::from_str(line).unwrap();
        let (name, schema) = (entry["name"].as_str().unwrap(), &entry["schema"]);
        let c = match v.compile_with(schema, backend) {
            Ok(c) => c,
            Err(e) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("JSON schema") && msg.contains("(at #"),
                    "{name}: {msg}"
                );
                eprintln!("refused {name}: {msg}");
                refused += 1;
                continue;
            }
        };
        compiled += 1;
        for _ in 0..2 {
            let Some(text) = walk(&c, &tok, eos, &mut rng, 4000, &mut |_| {}) else {
                continue;
            };
            complete += 1;
            assert!(c.matches(text.as_bytes()), "{name}: {text}");
            if check(name, schema, &text, true) == Checked::BeyondF64 {
                beyond_f64 += 1;
            }
        }
    }
    eprintln!("{compiled} compiled, {refused} refused, {complete} complete walks valid ({beyond_f64} with numbers past f64, not checked)");
    assert!(
        beyond_f64 * 20 <= complete,
        "{beyond_f64} outputs with numbers past f64"
    );
    assert!(
        compiled >= 2 * 280,
        "{compiled} compiled, {refused} refused (both backends)"
    );
    assert!(
        complete >= compiled,
        "{complete} complete walks of {compiled} schemas"
    );
}

/// Whether both backends' automata of `c`'s schema accept `text` (and agree).
fn accepts(c: &(DfaConstraint, DfaConstraint), text: &str) -> bool {
    let (d, l) = (c.0.matches(text.as_bytes()), c.1.matches(text.as_bytes()));
    assert_eq!(d, l, "dense and lazy disagree on {text:?}");
    d
}

/// Both backends' constraints of a schema.
fn both(v: &DfaVocabulary, schema: &Value) -> (DfaConstraint, DfaConstraint) {
    (
        v.compile_with(schema, Backend::Dense).unwrap(),
        v.compile_with(schema, Backend::Lazy).unwrap(),
    )
}

/// Whether an integer is valid under a case's schema.
type InRange = fn(i64) -> bool;

#[test]
fn integer_and_number_bounds_are_exact() {
    let (v, _) = vocab(&tokenizer());
    let cases: &[(Value, InRange)] = &[
        (
            json!({"type": "integer", "minimum": -37, "maximum": 1234}),
            |x| (-37..=1234).contains(&x),
        ),
        (
            json!({"type": "integer", "exclusiveMinimum": 9, "exclusiveMaximum": 101}),
            |x| x > 9 && x < 101,
        ),
        (json!({"type": "integer", "minimum": 1}), |x| x >= 1),
        (json!({"type": "integer", "maximum": -5}), |x| x <= -5),
        (
            json!({"type": "integer", "minimum": -10, "maximum": 990, "multipleOf": 5}),
            |x| (-10..=990).contains(&x) && x % 5 == 0,
        ),
        (json!({"type": "integer", "multipleOf": 2}), |x| x % 2 == 0),
        (json!({"type": "integer"}), |_| true),
    ];
    for (schema, ok) in cases {
        let c = both(&v, schema);
        for x in -1500..1500 {
            assert_eq!(accepts(&c, &x.to_string()), ok(x), "{schema} {x}");
        }
        for bad in ["-0", "007", "1.0", "+1", "", "1e3"] {
            assert!(!accepts(&c, bad), "{schema} {bad}");
        }
    }
    let c = both(
        &v,
        &json!({"type": "number", "exclusiveMinimum": 0, "maximum": 100}),
    );
    for (text, ok) in [
        ("0", false),
        ("0.0", false),
        ("0.5", true),
        ("0.000001", true),
        ("1", true),
        ("99.99", true),
        ("100", true),
        ("100.000", true),
        ("100.5", false),
        ("101", false),
        ("-1", false),
        ("-0.5", false),
        ("1e2", false),
        ("00.5", false),
    ] {
        assert_eq!(accepts(&c, text), ok, "(0, 100] {text}");
    }
    let c = both(
        &v,
        &json!({"type": "number", "minimum": -10, "exclusiveMaximum": -2}),
    );
    for (text, ok) in [
        ("-10", true),
        ("-10.0", true),
        ("-10.5", false),
        ("-9.75", true),
        ("-2", false),
        ("-2.5", true),
        ("-2.0", false),
        ("-1.5", false),
        ("0", false),
        ("-11", false),
    ] {
        assert_eq!(accepts(&c, text), ok, "[-10, -2) {text}");
    }
    let c = both(&v, &json!({"type": "number"}));
    for (text, ok) in [
        ("-0.5e-7", true),
        ("12", true),
        ("1.", false),
        (".5", false),
        ("01", false),
    ] {
        assert_eq!(accepts(&c, text), ok, "number {text}");
    }
}

#[test]
fn strings_objects_arrays_and_refs_follow_the_schema() {
    let (v, _) = vocab(&tokenizer());
    let c = both(
        &v,
        &json!({"type": "string", "minLength": 2, "maxLength": 3}),
    );
    for (text, ok) in [
        (r#""ab""#, true),
        (r#""abc""#, true),
        (r#""abcd""#, false),
        (r#""a""#, false),
        (r#""\u00e9\n""#, true),
        (r#""é€𝄞""#, true),
        (r#""a"b""#, false),
        (r#""\ud800a""#, false),
        ("\"a\tb\"", false),
        (r#""\x""#, false),
    ] {
        assert_eq!(accepts(&c, text), ok, "string {text}");
    }
    let c = both(
        &v,
        &json!({"type": "object", "properties": {
            "a": {"type": "boolean"}, "b": {"type": "null"}, "c": {"const": 1}
        }, "required": ["b"], "additionalProperties": false}),
    );
    for (text, ok) in [
        (r#"{"b": null}"#, true),
        (r#"{"a": true, "b": null, "c": 1}"#, true),
        (r#"{"a": false, "b": null}"#, true),
        (r#"{"b": null, "c": 1}"#, true),
        (r#"{"b": null, "a": true}"#, false),
        (r#"{"a": true}"#, false),
        (r#"{"b":null}"#, false),
        (r#"{"b": null, "d": 1}"#, false),
    ] {
        assert_eq!(accepts(&c, text), ok, "object {text}");
    }
    let c = both(
        &v,
        &json!({"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}}),
    );
    for (text, ok) in [
        ("{}", true),
        (r#"{"y": 2}"#, true),
        (r#"{"x": 1, "y": 2}"#, true),
        (r#"{, "y": 2}"#, false),
    ] {
        assert_eq!(accepts(&c, text), ok, "optional {text}");
    }
    let c = both(
        &v,
        &json!({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": {"type": "null"}, "minItems": 1, "maxItems": 3}),
    );
    for (text, ok) in [
        ("[]", false),
        (r#"["a"]"#, true),
        (r#"["a", 1]"#, true),
        (r#"["a", 1, null]"#, true),
        (r#"["a", 1, null, null]"#, false),
        ("[1]", false),
    ] {
        assert_eq!(accepts(&c, text), ok, "tuple {text}");
    }
    let tree = json!({
        "$defs": {"node": {"type": "object", "properties": {
            "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}
        }, "required": ["v"]}},
        "$ref": "#/$defs/node"
    });
    let c = both(&v, &tree);
    let nest = |d: usize| {
        (0..d).fold(r#"{"v": 0}"#.to_owned(), |s, _| {
            format!(r#"{{"v": 1, "kids": [{s}]}}"#)
        })
    };
    for d in 0..3 {
        assert!(accepts(&c, &nest(d)), "depth {d}");
    }
    assert!(!accepts(&c, &nest(3)), "recursion is cut at depth 3");
    let c = both(
        &v,
        &json!({"oneOf": [{"type": "string", "format": "uuid"}, {"enum": [1, null, [true]]}]}),
    );
    for (text, ok) in [
        (r#""123e4567-e89b-12d3-a456-426614174000""#, true),
        ("1", true),
        ("null", true),
        (r#""x""#, false),
        ("[true]", true),
        ("2", false),
        (r#""123e4567""#, false),
    ] {
        assert_eq!(accepts(&c, text), ok, "oneOf {text}");
    }
    let c = both(
        &v,
        &json!({"allOf": [
            {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}}, "required": ["a"]},
            {"properties": {"a": {"maximum": 5}, "b": {"type": "boolean"}}, "required": ["b"]}
        ]}),
    );
    for (text, ok) in [
        (r#"{"a": 5, "b": true}"#, true),
        (r#"{"a": 6, "b": true}"#, false),
        (r#"{"a": 1}"#, false),
    ] {
        assert_eq!(accepts(&c, text), ok, "allOf {text}");
    }
}

#[test]
fn eos_and_special_tokens() {
    let tok = tokenizer();
    let (v, eos) = vocab(&tok);
    for backend in [Backend::Dense, Backend::Lazy] {
        let c = v
            .compile_with(&json!({"type": "integer", "maximum": 40}), backend)
            .unwrap();
        let mut m = c.matcher();
        let specials: Vec<u32> = (0..tok.vocab_size() as u32)
            .filter(|&id| tok.token_bytes(id).is_some_and(|(_, s)| s))
            .collect();
        assert!(!specials.is_empty());
        let bits = m.allowed().unwrap();
        assert!(!bit(&bits, eos), "EOS before any digit");
        assert!(specials.iter().all(|&s| !bit(&bits, s)));
        let four = tok.token_to_id("4").unwrap();
        m.accept(four).unwrap();
        assert!(m.is_accepting() && !m.is_done());
        let bits = m.allowed().unwrap();
        assert!(bit(&bits, eos));
        assert!(
            bit(&bits, tok.token_to_id("0").unwrap()) && !bit(&bits, tok.token_to_id("1").unwrap())
        );
        let mut logits = vec![0.0f32; tok.vocab_size()];
        m.mask(&mut logits).unwrap();
        let allowed: Vec<usize> = (0..logits.len()).filter(|&i| logits[i] == 0.0).collect();
        assert_eq!(
            allowed.len(),
            (0..tok.vocab_size() as u32)
                .filter(|&i| bit(&bits, i))
                .count()
        );
        m.accept(tok.token_to_id("0").unwrap()).unwrap();
        assert!(m.is_done(), "40 allows nothing more");
        assert!(m.clone().accept(four).is_err());
        m.accept(eos).unwrap();
        assert!(m.allowed().is_err());
    }
}

#[test]
fn unsupported_features_are_refused_with_their_path() {
    let (v, _) = vocab(&tokenizer());
    let cases = [
        (
            json!({"type": "object", "properties": {"a": {"type": "object", "patternProperties": {"x": {}}}}}),
            "`patternProperties`",
            "#/properties/a",
        ),
        (
            json!({"type": "array", "items": {}}),
            "unconstrained value",
            "#/items",
        ),
        (
            json!({"type": "array", "items": {"type": "integer"}, "uniqueItems": true}),
            "`uniqueItems`",
            "(at #)",
        ),
        (
            json!({"$ref": "https://example.com/s.json"}),
            "non-local reference",
            "(at #)",
        ),
        (
            json!({"type": "number", "multipleOf": 0.5}),
            "`multipleOf` on a number",
            "(at #)",
        ),
        (
            json!({"type": "number", "minimum": 0.5}),
            "non-integral number bound",
            "(at #)",
        ),
        (
            json!({"type": "string", "format": "ipv6"}),
            "format \"ipv6\"",
            "(at #)",
        ),
        (
            json!({"properties": {"a/b": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 4}}}),
            "`pattern` together with length bounds",
            "#/properties/a~1b",
        ),
        (
            json!({"oneOf": [{"type": "number"}, {"type": "integer"}]}),
            "`oneOf` with branches that may overlap",
            "(at #)",
        ),
        (
            json!({"$defs": {"x": {"type": "string", "not": {"const": "a"}}}, "$ref": "#/$defs/x"}),
            "`not`",
            "#/$defs/x",
        ),
        (
            json!({"type": "string", "maxLength": 400000}),
            "too large for the DFA engine",
            "",
        ),
    ];
    for (schema, feature, path) in cases {
        let msg = v.compile(&schema).unwrap_err().to_string();
        assert!(
            msg.contains(feature) && msg.contains(path),
            "{schema}: {msg}"
        );
    }
}

#[test]
fn regular_expressions_match_the_whole_output() {
    let (v, _) = vocab(&tokenizer());
    for backend in [Backend::Dense, Backend::Lazy] {
        let c = v.compile_regex("[a-z]{3}-[0-9]{2}|é+", backend).unwrap();
        for (text, ok) in [
            ("abc-12", true),
            ("éé", true),
            ("abc-123", false),
            ("xabc-12", false),
            ("ab-12", false),
            ("", false),
        ] {
            assert_eq!(c.matches(text.as_bytes()), ok, "{text:?}");
        }
    }
    for (re, want) in [
        ("^[0-9]+$", "anchors and word boundaries"),
        (r"\bx", "anchors and word boundaries"),
        ("(unclosed", "invalid regular expression"),
    ] {
        let e = v.compile_regex(re, Backend::Lazy).unwrap_err().to_string();
        assert!(
            e.contains(want) && e.contains("regular expression"),
            "{re}: {e}"
        );
    }
}
