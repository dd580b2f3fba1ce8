//! WordPiece parity with HF `tokenizers` 0.23.3 on the real MiniLM and MPNet tokenizer files,
//! llama.cpp's bert-bge test vectors through the GGUF vocabulary, and robustness (no input
//! panics, malformed files give errors that name the problem).
//!
//! Needs the model cache: run `scripts/fetch_models.sh`. The reference fixture is written by
//! `scripts/gen_tokenizer_reference.py`.

mod common;

use common::u32s;

use std::path::{Path, PathBuf};

use lattice_inference::io::gguf::GgufFile;
use lattice_inference::tokenizer::{Encoding, Tokenizer};
use serde_json::Value;

const FIXTURE: &str = "tests/fixtures/tokenizer/wordpiece_reference.jsonl.gz";

fn cache() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache")
}

fn require(path: PathBuf) -> PathBuf {
    assert!(
        path.exists(),
        "{} is missing: run scripts/fetch_models.sh to fetch the models and test vectors",
        path.display()
    );
    path
}

fn model_file(model: &str, file: &str) -> PathBuf {
    require(cache().join("models").join(model).join(file))
}

fn load(key: &str) -> Tokenizer {
    let folder = match key {
        "minilm" => "all-MiniLM-L6-v2",
        _ => "all-mpnet-base-v2",
    };
    Tokenizer::from_file(model_file(folder, "tokenizer.json"))
        .expect("the cached tokenizer.json loads")
        .with_truncation(None)
}

fn fixture() -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(FIXTURE);
    let text = common::read_gz(&path);
    text.lines()
        .map(|l| serde_json::from_str(l).expect("fixture lines are JSON"))
        .collect()
}

/// Byte offsets → character offsets, the way HF's Python binding reports them. Tokens from
/// index `b_start` on point into `b` (the second sequence of a pair), the others into `a`.
fn char_offsets(a: &str, b: &str, b_start: usize, enc: &Encoding) -> Vec<(usize, usize)> {
    enc.offsets
        .iter()
        .zip(&enc.special_tokens_mask)
        .enumerate()
        .map(|(i, (&(s, e), &special))| {
            if special == 1 {
                return (s, e);
            }
            let text = if i >= b_start { b } else { a };
            assert!(text.is_char_boundary(s) && text.is_char_boundary(e) && s <= e);
            (text[..s].chars().count(), text[..e].chars().count())
        })
        .collect()
}

/// Collects mismatches instead of stopping at the first, so a failure shows the pattern.
#[derive(Default)]
struct Report {
    checked: usize,
    failures: Vec<String>,
}

impl Report {
    fn check<T: PartialEq + std::fmt::Debug>(&mut self, what: &str, input: &str, ours: T, hf: T) {
        self.checked += 1;
        if ours != hf && self.failures.len() < 12 {
            let shown: String = input.chars().take(80).collect();
            self.failures.push(format!(
                "{what} for {shown:?}:\n  ours {ours:?}\n  hf   {hf:?}"
            ));
        } else if ours != hf {
            self.failures.push(String::new());
        }
    }

    fn finish(self, name: &str) {
        let n = self.failures.len();
        let shown: Vec<&String> = self.failures.iter().filter(|f| !f.is_empty()).collect();
        assert!(
            n == 0,
            "{name}: {n} of {} checks differ from HF:\n{}",
            self.checked,
            shown
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("\n")
        );
        eprintln!("{name}: all {} checks equal HF", self.checked);
    }
}

fn check_model(key: &str) {
    let tok = load(key);
    let mut r = Report::default();
    let (mut n_texts, mut n_pairs) = (0, 0);
    for line in fixture() {
        let m = &line[key];
        let (a, b) = match line.get("pair") {
            Some(p) => (
                p[0].as_str().expect("str"),
                Some(p[1].as_str().expect("str")),
            ),
            None => (line["text"].as_str().expect("str"), None),
        };
        let label = if b.is_some() { "pair" } else { "text" };
        if b.is_some() {
            n_pairs += 1;
        } else {
            n_texts += 1;
        }
        let full = tok.encode_with(a, b, true, None);
        let plain = tok.encode_with(a, b, false, None);
        r.check(&format!("{label} ids"), a, &full.ids, &u32s(&m["ids"]));
        r.check(
            &format!("{label} ids_plain"),
            a,
            &plain.ids,
            &u32s(&m["ids_plain"]),
        );
        let zeros = |n: usize| vec![0u32; n];
        let (hf_types, hf_types_plain) = match b {
            Some(_) => (u32s(&m["type_ids"]), u32s(&m["type_ids_plain"])),
            None => (zeros(full.len()), zeros(plain.len())),
        };
        r.check(&format!("{label} type_ids"), a, &full.type_ids, &hf_types);
        r.check(
            &format!("{label} type_ids_plain"),
            a,
            &plain.type_ids,
            &hf_types_plain,
        );
        if let Some(tokens) = m.get("tokens") {
            let hf: Vec<&str> = tokens
                .as_array()
                .expect("array")
                .iter()
                .filter_map(Value::as_str)
                .collect();
            let ours: Vec<&str> = full.tokens.iter().map(String::as_str).collect();
            r.check(&format!("{label} tokens"), a, ours, hf);
            let mask: Vec<u8> = u32s(&m["special_tokens_mask"])
                .iter()
                .map(|&x| x as u8)
                .collect();
            r.check(
                &format!("{label} special_tokens_mask"),
                a,
                &full.special_tokens_mask,
                &mask,
            );
            let hf_offsets: Vec<(usize, usize)> = m["offsets"]
                .as_array()
                .expect("array")
                .iter()
                .map(|o| {
                    (
                        o[0].as_u64().expect("int") as usize,
                        o[1].as_u64().expect("int") as usize,
                    )
                })
                .collect();
            let ours = match b {
                None => char_offsets(a, "", usize::MAX, &full),
                Some(b) => {
                    // MiniLM: `[CLS] A [SEP] B [SEP]`; MPNet: `<s> A </s> </s> B </s>`.
                    let n_before_b = if key == "minilm" { 2 } else { 3 };
                    let b_start = tok.encode(a, false).len() + n_before_b;
                    char_offsets(a, b, b_start, &full)
                }
            };
            r.check(&format!("{label} offsets"), a, ours, hf_offsets);
            let decode = &m["decode"];
            r.check(
                "decode(skip)",
                a,
                tok.decode(&full.ids, true).as_str(),
                decode[0].as_str().expect("str"),
            );
            r.check(
                "decode(keep)",
                a,
                tok.decode(&full.ids, false).as_str(),
                decode[1].as_str().expect("str"),
            );
        }
        for n in [128usize, 256, 384] {
            let ours = tok.encode_with(a, b, true, Some(n));
            let hf = m.get("trunc").and_then(|t| t.get(n.to_string()));
            let (hf_ids, hf_types) = match hf {
                Some(t) => (
                    u32s(&t["ids"]),
                    t.get("type_ids").map_or_else(|| zeros(ours.len()), u32s),
                ),
                None => (full.ids.clone(), full.type_ids.clone()),
            };
            r.check(
                &format!("{label} ids truncated to {n}"),
                a,
                &ours.ids,
                &hf_ids,
            );
            r.check(
                &format!("{label} type_ids truncated to {n}"),
                a,
                &ours.type_ids,
                &hf_types,
            );
        }
    }
    assert!(
        n_texts >= 2000 && n_pairs >= 300,
        "fixture too small: {n_texts} texts, {n_pairs} pairs"
    );
    eprintln!("{key}: {n_texts} texts, {n_pairs} pairs");
    r.finish(key);
}

#[test]
fn minilm_matches_hf_reference() {
    check_model("minilm");
}

#[test]
fn mpnet_matches_hf_reference() {
    check_model("mpnet");
}

#[test]
fn vocab_txt_loader_matches_tokenizer_json() {
    let from_txt = Tokenizer::from_vocab_txt(model_file("all-MiniLM-L6-v2", "vocab.txt"), true)
        .expect("vocab.txt loads");
    let from_json = load("minilm");
    let mut r = Report::default();
    for line in fixture() {
        let Some(text) = line.get("text").and_then(Value::as_str) else {
            continue;
        };
        r.check(
            "vocab.txt ids",
            text,
            from_txt.encode(text, true).ids,
            u32s(&line["minilm"]["ids"]),
        );
        r.check(
            "vocab.txt offsets",
            text,
            from_txt.encode(text, true).offsets,
            from_json.encode(text, true).offsets,
        );
    }
    assert_eq!(from_txt.vocab_size(), from_json.vocab_size());
    r.finish("vocab.txt");
}

#[test]
fn from_dir_falls_back_to_vocab_txt_and_tokenizer_config() {
    let dir = std::env::temp_dir().join(format!("lattice-tok-dir-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::copy(
        model_file("all-MiniLM-L6-v2", "vocab.txt"),
        dir.join("vocab.txt"),
    )
    .expect("copy");
    let text = "Héllo WORLD, naïve café!";
    let uncased = Tokenizer::from_dir(&dir).expect("vocab.txt folder loads");
    assert_eq!(
        uncased.encode(text, true).ids,
        load("minilm").encode(text, true).ids
    );
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"do_lower_case": false}"#,
    )
    .expect("write");
    let cased = Tokenizer::from_dir(&dir).expect("vocab.txt folder loads");
    assert_eq!(
        cased.normalize(text),
        text,
        "no lowercasing, no accent stripping"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn from_dir_prefers_tokenizer_json_and_keeps_its_truncation() {
    let dir = model_file("all-MiniLM-L6-v2", "tokenizer.json");
    let tok = Tokenizer::from_dir(dir.parent().expect("folder")).expect("folder loads");
    assert_eq!(tok.truncation(), Some(128));
    assert_eq!(tok.padding().and_then(|p| p.fixed_length), Some(128));
    let long = "word ".repeat(500);
    assert_eq!(
        tok.encode(&long, true).len(),
        128,
        "file truncation is the default"
    );
    assert_eq!(tok.encode("hi", true).len(), 3, "padding is never applied");
    assert_eq!(
        tok.clone().with_truncation(None).encode(&long, true).len(),
        502
    );
}

#[test]
fn api_lookups() {
    let tok = load("mpnet");
    assert_eq!(tok.vocab_size(), 30527);
    assert_eq!(tok.token_to_id("<mask>"), Some(30526));
    assert_eq!(tok.id_to_token(3), Some("<unk>"));
    let mini = load("minilm");
    assert_eq!(mini.vocab_size(), 30522);
    assert_eq!(mini.token_to_id("<mask>"), None);
    assert_eq!(mini.id_to_token(3), Some("[unused2]"));
    assert_eq!(
        mini.decode(&[2000, 2003, 999_999, 1029, 1005, 1055], true),
        "to is? ' s"
    );
}

/// llama.cpp's `.inp` holds test strings, each followed by "\n__ggml_vocab_test__\n"; the
/// `.out` line of the same index holds the expected ids (no special tokens), space-separated.
#[test]
fn llama_cpp_bert_bge_vectors() {
    let dir = cache().join("llama-vocab");
    let gguf = GgufFile::open(require(dir.join("ggml-vocab-bert-bge.gguf"))).expect("GGUF parses");
    let tok = Tokenizer::from_gguf(&gguf).expect("GGUF vocabulary builds a tokenizer");
    let inp =
        std::fs::read_to_string(require(dir.join("ggml-vocab-bert-bge.gguf.inp"))).expect("read");
    let out =
        std::fs::read_to_string(require(dir.join("ggml-vocab-bert-bge.gguf.out"))).expect("read");
    let sep = "\n__ggml_vocab_test__\n";
    let inputs: Vec<&str> = inp.split(sep).collect();
    let (inputs, rest) = inputs.split_at(inputs.len() - 1);
    assert!(rest[0].is_empty(), "the .inp ends with a separator");
    let expected: Vec<Vec<u32>> = out
        .lines()
        .map(|l| {
            l.split_whitespace()
                .map(|x| x.parse().expect("id"))
                .collect()
        })
        .collect();
    assert_eq!(inputs.len(), expected.len());
    let mut r = Report::default();
    for (text, ids) in inputs.iter().zip(&expected) {
        r.check("bert-bge ids", text, &tok.encode(text, false).ids, ids);
    }
    assert_eq!(tok.encode("hello", true).ids, [101, 7592, 102]);
    r.finish("llama.cpp bert-bge");
}

fn char_ranges(v: &Value) -> Vec<(u32, u32)> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|r| {
            (
                r[0].as_u64().expect("int") as u32,
                r[1].as_u64().expect("int") as u32,
            )
        })
        .collect()
}

fn in_any(ranges: &[(u32, u32)], cp: u32) -> bool {
    ranges.iter().any(|&(lo, hi)| (lo..=hi).contains(&cp))
}

fn tokenizer_json(normalizer: &str, pre_tokenizer: &str) -> Tokenizer {
    let json = format!(
        r###"{{"normalizer": {normalizer}, "pre_tokenizer": {pre_tokenizer},
            "model": {{"type": "WordPiece", "vocab": {{"[UNK]": 0, "a": 1, "b": 2, "##b": 3}}}}}}"###
    );
    Tokenizer::from_json_bytes(json.as_bytes(), "inline.json").expect("valid inline tokenizer")
}

/// Every Unicode scalar value through each BERT normalizer step and the BERT pre-tokenizer,
/// against HF (`bert_chars.json`).
#[test]
fn every_code_point_matches_hf_char_classes() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer/bert_chars.json");
    let data: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("JSON");
    let [removed, space, cjk, punct, split] =
        ["removed", "space", "cjk", "punct", "split"].map(|k| char_ranges(&data[k]));
    let strip_lower = data["strip_lower"].as_object().expect("object");
    let bert = |clean: bool, cjk: bool, strip: bool, lower: bool| {
        let n = format!(
            r#"{{"type": "BertNormalizer", "clean_text": {clean}, "handle_chinese_chars": {cjk},
                "strip_accents": {strip}, "lowercase": {lower}}}"#
        );
        tokenizer_json(&n, "null")
    };
    let clean_only = bert(true, false, false, false);
    let cjk_only = bert(false, true, false, false);
    let strip_lower_only = bert(false, false, true, true);
    let pre = tokenizer_json("null", r#"{"type": "BertPreTokenizer"}"#);
    let mut r = Report::default();
    for c in (0..0x11_0000u32).filter_map(char::from_u32) {
        let cp = c as u32;
        let s = format!("a{c}b");
        let want = if in_any(&removed, cp) {
            "ab".to_string()
        } else if in_any(&space, cp) {
            "a b".to_string()
        } else {
            s.clone()
        };
        r.check("clean_text", &s, clean_only.normalize(&s), want);
        let want = if in_any(&cjk, cp) {
            format!(" {c} ")
        } else {
            c.to_string()
        };
        r.check(
            "handle_chinese_chars",
            &s,
            cjk_only.normalize(&c.to_string()),
            want,
        );
        if !(0xAC00..=0xD7A3).contains(&cp) || cp & 63 == 0 {
            let want = strip_lower
                .get(&cp.to_string())
                .map_or_else(|| c.to_string(), |v| v.as_str().expect("str").to_owned());
            r.check(
                "strip_accents+lowercase",
                &s,
                strip_lower_only.normalize(&c.to_string()),
                want,
            );
        }
        if c != 'a' && c != 'b' {
            let want: &[u32] = if in_any(&punct, cp) {
                &[1, 0, 2]
            } else if in_any(&split, cp) {
                &[1, 2]
            } else {
                &[0]
            };
            r.check(
                "BertPreTokenizer",
                &s,
                pre.encode(&s, false).ids.as_slice(),
                want,
            );
        }
    }
    r.finish("char classes");
}

/// xorshift64*: a fixed-seed generator, enough for fuzz-style inputs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn check_sane(text: &str, enc: &Encoding) {
    assert_eq!(enc.ids.len(), enc.tokens.len());
    assert_eq!(enc.ids.len(), enc.offsets.len());
    for &(s, e) in &enc.offsets {
        assert!(s <= e && e <= text.len() && text.is_char_boundary(s) && text.is_char_boundary(e));
    }
}

#[test]
fn random_input_never_panics() {
    let toks = [load("minilm"), load("mpnet")];
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for round in 0..3000 {
        let len = rng.below(if round % 100 == 0 { 3000 } else { 60 }) as usize;
        let text = if round % 2 == 0 {
            let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        } else {
            (0..len)
                .filter_map(|_| {
                    let cp = match rng.below(4) {
                        0 => rng.below(0x80),
                        1 => rng.below(0x800),
                        2 => rng.below(0x10000),
                        _ => rng.below(0x11_0000),
                    };
                    char::from_u32(cp as u32)
                })
                .collect()
        };
        for tok in &toks {
            let enc = tok.encode(&text, true);
            check_sane(&text, &enc);
            let mid = (0..=text.len() / 2)
                .rev()
                .find(|&i| text.is_char_boundary(i))
                .unwrap_or(0);
            let pair = tok.encode_with(&text[..mid], Some(&text[mid..]), true, Some(64));
            assert!(pair.len() <= 64);
            let _ = tok.decode(&enc.ids, rng.below(2) == 0);
        }
    }
    let huge = "x".repeat(100_000) + &"é".repeat(10_000) + &"中".repeat(10_000);
    for tok in &toks {
        check_sane(&huge, &tok.encode(&huge, true));
    }
}

#[test]
fn malformed_tokenizer_files_are_clear_errors() {
    let dir = std::env::temp_dir().join(format!("lattice-tok-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let cases = [
        ("bad.json", "{\"model\": ", "not valid JSON"),
        (
            "wordlevel.json",
            r#"{"model": {"type": "WordLevel", "vocab": {}}}"#,
            "unsupported model type `WordLevel`",
        ),
        (
            "novocab.json",
            r#"{"model": {"type": "WordPiece", "unk_token": "[UNK]"}}"#,
            "model.vocab is missing",
        ),
        (
            "nounk.json",
            r#"{"model": {"type": "WordPiece", "vocab": {"a": 0}}}"#,
            "unknown token `[UNK]`",
        ),
        (
            "norm.json",
            r#"{"normalizer": {"type": "Precompiled"}, "model": {"type": "WordPiece", "vocab": {"[UNK]": 0}}}"#,
            "normalizer type `Precompiled`",
        ),
    ];
    for (name, body, needle) in cases {
        let path = dir.join(name);
        std::fs::write(&path, body).expect("write");
        let err = Tokenizer::from_file(&path)
            .expect_err("malformed file must not load")
            .to_string();
        assert!(err.contains(needle) && err.contains(name), "{name}: {err}");
    }
    let err = Tokenizer::from_file(dir.join("absent.json"))
        .expect_err("missing file")
        .to_string();
    assert!(err.contains("absent.json"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn truncated_gguf_is_an_error_not_a_panic() {
    let path = require(cache().join("llama-vocab/ggml-vocab-bert-bge.gguf"));
    let bytes = std::fs::read(&path).expect("read");
    let mut rng = Rng(7);
    let mut cuts: Vec<usize> = (0..200).collect();
    cuts.extend((0..300).map(|_| rng.below(bytes.len() as u64) as usize));
    for cut in cuts {
        assert!(
            GgufFile::from_bytes(&bytes[..cut], &path).is_err(),
            "cut at {cut}"
        );
    }
    // Flip bytes in the header: any outcome but a panic is fine.
    for _ in 0..300 {
        let mut b = bytes[..4096].to_vec();
        let i = rng.below(b.len() as u64) as usize;
        b[i] = rng.next() as u8;
        let _ = GgufFile::from_bytes(&b, &path);
    }
}
