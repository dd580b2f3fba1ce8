//! BPE parity with HF `tokenizers` 0.23.3 on three real `tokenizer.json` files: Qwen3 (byte-level
//! BPE, NFC, the Qwen2/Qwen3 split regex), Llama 2 / Mistral-style SentencePiece BPE (byte
//! fallback, `▁` spaces, `<s>` template) and Gemma 3, plus the Mistral file rewritten with a
//! `Metaspace` pre-tokenizer and decoder. Checks ids with and without special tokens on every fixture line,
//! decode against HF, decode(encode(x)) == x for the lossless byte-level tokenizer (after its
//! NFC normalizer) and the Mistral file, offsets against the HF crate in process (the three
//! files, `ByteLevel` `trim_offsets` variants, and NFC / NFD / NFKC on random text), streaming
//! decode, llama.cpp's GGUF test vectors for eight byte-level BPE vocabularies, and that random
//! bytes / random Unicode never make encoding panic.
//!
//! Needs the tokenizer cache: run `scripts/fetch_models.sh`. The reference fixture is written by
//! `scripts/gen_bpe_reference.py`.

mod common;

use common::u32s;

use std::path::{Path, PathBuf};

use lattice_inference::io::gguf::GgufFile;
use lattice_inference::tokenizer::Tokenizer;
use serde_json::Value;

const FIXTURE: &str = "tests/fixtures/tokenizer/bpe_reference.jsonl.gz";

/// The tokenizers of the fixture: key, npm package folder, ids the template puts before `A`.
const TOKENIZERS: [(&str, &str, &[u32]); 3] = [
    ("qwen3", "qwen3", &[]),
    ("llama2", "llama2", &[1]),
    ("gemma3", "gemma3", &[2]),
];

fn tokenizer_file(folder: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../.cache/npm")
        .join(folder)
        .join("package/models/tokenizer.json");
    assert!(
        path.exists(),
        "{} is missing: run scripts/fetch_models.sh to fetch the tokenizer files",
        path.display()
    );
    path
}

fn load(folder: &str) -> Tokenizer {
    Tokenizer::from_file(tokenizer_file(folder))
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
        let shown: Vec<&String> = self.failures.iter().take(15).collect();
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
        eprintln!("{name}: {} checks equal to HF", self.checked);
    }
}

fn parity(key: &str, folder: &str, prefix: &[u32]) {
    parity_with(key, &load(folder), prefix);
}

/// The llama2 file the way newer transformers save SentencePiece BPE (the same edit as
/// `llama2_metaspace` in scripts/gen_bpe_reference.py).
fn llama2_metaspace() -> Tokenizer {
    let path = tokenizer_file("llama2");
    let bytes = std::fs::read(&path).expect("read llama2 tokenizer.json");
    let mut v: Value = serde_json::from_slice(&bytes).expect("JSON");
    v["normalizer"] = Value::Null;
    v["pre_tokenizer"] = serde_json::json!({"type": "Metaspace", "replacement": "\u{2581}",
        "prepend_scheme": "first", "split": false});
    v["decoder"] = serde_json::json!({"type": "Sequence", "decoders": [
        {"type": "Metaspace", "replacement": "\u{2581}", "prepend_scheme": "first", "split": true},
        {"type": "ByteFallback"}, {"type": "Fuse"}]});
    let bytes = serde_json::to_vec(&v).expect("serialize");
    Tokenizer::from_json_bytes(&bytes, &path).expect("Metaspace variant loads")
}

/// Checks `tok` against the fixture records under `key` (a missing `llama2_meta` record, or
/// missing `ids` in it, means "same ids as llama2").
fn parity_with(key: &str, tok: &Tokenizer, prefix: &[u32]) {
    let lines = fixture();
    assert!(lines.len() >= 5000, "fixture has {} lines", lines.len());
    let mut report = Report::default();
    let empty = Value::Object(Default::default());
    for line in &lines {
        let text = line["text"].as_str().expect("text");
        let rec = line.get(key).unwrap_or(&empty);
        let want = u32s(rec.get("ids").unwrap_or(&line["llama2"]["ids"]));
        let want_s = match rec.get("ids_s") {
            Some(v) => u32s(v),
            None => prefix.iter().copied().chain(want.iter().copied()).collect(),
        };
        let enc = tok.encode(text, false);
        report.check("ids", text, &enc.ids, &want);
        report.check("ids+special", text, &tok.encode(text, true).ids, &want_s);
        let want_dec = rec.get("dec").and_then(Value::as_str).unwrap_or(text);
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
    report.finish(key);
}

#[test]
fn qwen3_matches_hf() {
    let (key, folder, prefix) = TOKENIZERS[0];
    parity(key, folder, prefix);
}

#[test]
fn llama2_matches_hf() {
    let (key, folder, prefix) = TOKENIZERS[1];
    parity(key, folder, prefix);
}

#[test]
fn gemma3_matches_hf() {
    let (key, folder, prefix) = TOKENIZERS[2];
    parity(key, folder, prefix);
}

/// Byte-level BPE loses nothing but what its normalizer (NFC) changes.
#[test]
fn llama2_metaspace_matches_hf() {
    parity_with("llama2_meta", &llama2_metaspace(), &[1]);
}

#[test]
fn byte_level_round_trips() {
    let tok = load("qwen3");
    for line in fixture() {
        let text = line["text"].as_str().expect("text");
        let ids = tok.encode(text, false).ids;
        let normalized = tok.normalize(text);
        assert_eq!(
            tok.decode(&ids, false),
            normalized,
            "round trip of {text:?}"
        );
    }
}

/// The Mistral SentencePiece-BPE file (byte fallback) is lossless too: every fixture string
/// without `▁` (which decodes as a space) or a special-token string (matched as a token, and the
/// text after it gets its own `▁` prefix) comes back whole.
#[test]
fn sentencepiece_bpe_round_trips() {
    // (The Metaspace re-save is not: it drops a leading space, as HF does.)
    let tok = load("llama2");
    let mut n = 0;
    for line in fixture() {
        let text = line["text"].as_str().expect("text");
        if text.contains('\u{2581}') || ["<s>", "</s>", "<unk>"].iter().any(|s| text.contains(s)) {
            continue;
        }
        let ids = tok.encode(text, false).ids;
        assert_eq!(tok.decode(&ids, false), text, "round trip of {text:?}");
        n += 1;
    }
    assert!(n >= 4500, "{n} strings");
}

/// llama.cpp's `.inp` holds test strings, each followed by "\n__ggml_vocab_test__\n"; the
/// `.out` line of the same index holds HF's ids (no special tokens), space-separated.
fn llama_cpp_vectors(name: &str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache/llama-vocab");
    let file = |ext: &str| {
        let p = dir.join(format!("ggml-vocab-{name}.gguf{ext}"));
        assert!(
            p.exists(),
            "{} is missing: run scripts/fetch_models.sh",
            p.display()
        );
        p
    };
    let gguf = GgufFile::open(file("")).expect("GGUF parses");
    let tok = Tokenizer::from_gguf(&gguf).expect("GGUF vocabulary builds a tokenizer");
    let inp = std::fs::read_to_string(file(".inp")).expect("read .inp");
    let out = std::fs::read_to_string(file(".out")).expect("read .out");
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
    for (text, ids) in inputs.iter().zip(&expected) {
        report.check("ids", text, &tok.encode(text, false).ids, ids);
    }
    report.finish(name);
}

#[test]
fn llama_cpp_gguf_vectors() {
    let mut failed = Vec::new();
    for name in [
        "qwen2",
        "qwen35",
        "llama-bpe",
        "gpt-2",
        "mpt",
        "starcoder",
        "refact",
        "command-r",
    ] {
        if std::panic::catch_unwind(|| llama_cpp_vectors(name)).is_err() {
            failed.push(name);
        }
    }
    assert!(failed.is_empty(), "vocabularies that differ: {failed:?}");
}

/// Streaming decode releases the text `decode` gives for all ids, one valid piece at a time;
/// like HF's `DecodeStream`, it holds text back only while the decoded text ends in U+FFFD.
#[test]
fn stream_decode_matches_decode() {
    for (_, folder, _) in TOKENIZERS {
        let tok = load(folder);
        for line in fixture().iter().step_by(3) {
            let text = line["text"].as_str().expect("text");
            let ids = tok.encode(text, true).ids;
            let mut stream = tok.decode_stream(false);
            let streamed: String = ids.iter().filter_map(|&id| stream.step(id)).collect();
            let full = tok.decode(&ids, false);
            let held = full.strip_prefix(streamed.as_str());
            assert!(
                held.is_some_and(|h| h.is_empty() || h.ends_with('\u{fffd}')),
                "{folder}: streamed {streamed:?} vs decoded {full:?}"
            );
        }
    }
}

/// A small deterministic generator (xorshift), so the property test needs no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn random_input_never_panics() {
    let toks: Vec<Tokenizer> = TOKENIZERS.iter().map(|(_, f, _)| load(f)).collect();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..3000 {
        let len = (rng.next() % 64) as usize;
        let text = if round % 2 == 0 {
            let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        } else {
            (0..len)
                .filter_map(|_| char::from_u32((rng.next() % 0x11_0000) as u32))
                .collect()
        };
        for tok in &toks {
            let ids = tok.encode(&text, true).ids;
            let _ = tok.encode_pair(&text, "x", true);
            let _ = tok.decode(&ids, true);
            let random_ids: Vec<u32> = (0..len).map(|_| (rng.next() % 200_000) as u32).collect();
            let _ = tok.decode(&random_ids, false);
        }
        let ids = toks[0].encode(&text, false).ids;
        assert_eq!(toks[0].decode(&ids, false), toks[0].normalize(&text));
    }
}

/// NFC / NFD / NFKC alignment equals HF's on random text dense in combining marks, Hangul,
/// compatibility characters and emoji: a character-level BPE over the 256 `<0xNN>` byte tokens
/// (no merges, byte fallback) turns every normalized character into byte tokens that carry its
/// original range, so offsets show the alignment of every normalized character.
#[test]
fn unicode_normalizer_offsets_match_hf_on_random_text() {
    let mut vocab = serde_json::Map::new();
    vocab.insert("<unk>".into(), 0.into());
    for b in 0..=255u32 {
        vocab.insert(format!("<0x{b:02X}>"), (b + 1).into());
    }
    const POOLS: [(u32, u32); 8] = [
        (0x41, 0x7a),
        (0xc0, 0x17f),
        (0x300, 0x36f),
        (0x1e00, 0x1fff),
        (0x1100, 0x11ff),
        (0xac00, 0xac40),
        (0xfb00, 0xfb4f),
        (0x3300, 0x33ff),
    ];
    let mut rng = Rng(0x0ff5_e75e_ed00_0001);
    let texts: Vec<String> = (0..3000)
        .map(|_| {
            let n = (rng.next() % 12) as usize;
            (0..n)
                .filter_map(|_| {
                    let (lo, hi) = POOLS[(rng.next() % POOLS.len() as u64) as usize];
                    char::from_u32(lo + (rng.next() % u64::from(hi - lo + 1)) as u32)
                })
                .collect()
        })
        .collect();
    for form in ["NFC", "NFD", "NFKC"] {
        let json = serde_json::json!({
            "normalizer": {"type": form},
            "model": {"type": "BPE", "vocab": vocab, "merges": [], "byte_fallback": true,
                      "unk_token": "<unk>"},
        });
        let bytes = serde_json::to_vec(&json).expect("serialize");
        let tok = Tokenizer::from_json_bytes(&bytes, "nf.json").expect("loads");
        let hf = tokenizers::Tokenizer::from_bytes(&bytes).expect("HF loads");
        let mut report = Report::default();
        for text in &texts {
            let want = hf.encode(text.as_str(), false).expect("HF encodes");
            let got = tok.encode(text, false);
            report.check("ids", text, got.ids.as_slice(), want.get_ids());
            report.check("offsets", text, got.offsets.as_slice(), want.get_offsets());
        }
        report.finish(form);
    }
}

#[test]
fn malformed_bpe_files_give_clear_errors() {
    let err = |json: &str| match Tokenizer::from_json_bytes(json.as_bytes(), "t.json") {
        Ok(_) => panic!("expected an error for {json}"),
        Err(e) => e.to_string(),
    };
    assert!(err(r#"{"model": {"type": "BPE", "vocab": {"a": 0}}}"#).contains("merges"));
    assert!(
        err(r#"{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}}"#).contains("`b`")
    );
    let unknown = r#"{"model": {"type": "BPE", "vocab": {}, "merges": []},
                      "pre_tokenizer": {"type": "Nope"}}"#;
    assert!(err(unknown).contains("`Nope`"));
}

/// Checks ids and offsets of `tok` against HF's `Encoding::get_offsets()` (byte offsets into the
/// input; the `tokenizers` crate 0.23 in process, the library the PyPI package wraps, loaded from
/// the same JSON) on every fixture string, with and without special tokens, and on pairs of
/// neighbouring strings.
fn offsets_parity(name: &str, tok: &Tokenizer, json: &[u8]) {
    let mut hf = tokenizers::Tokenizer::from_bytes(json).expect("HF loads");
    hf.with_truncation(None).expect("no truncation");
    let mut report = Report::default();
    let lines = fixture();
    let texts: Vec<&str> = lines
        .iter()
        .map(|l| l["text"].as_str().expect("text"))
        .collect();
    for (i, text) in texts.iter().enumerate() {
        for special in [false, true] {
            let want = hf.encode(*text, special).expect("HF encodes");
            let got = tok.encode(text, special);
            report.check("ids", text, got.ids.as_slice(), want.get_ids());
            report.check("offsets", text, got.offsets.as_slice(), want.get_offsets());
        }
        if i % 10 == 0 {
            let b = texts[(i + 1) % texts.len()];
            let want = hf.encode((*text, b), true).expect("HF encodes a pair");
            let got = tok.encode_pair(text, b, true);
            report.check("pair ids", text, got.ids.as_slice(), want.get_ids());
            report.check(
                "pair type ids",
                text,
                got.type_ids.as_slice(),
                want.get_type_ids(),
            );
            report.check(
                "pair offsets",
                text,
                got.offsets.as_slice(),
                want.get_offsets(),
            );
        }
    }
    assert!(
        report.checked >= 20_000,
        "{name}: {} checks",
        report.checked
    );
    report.finish(name);
}

/// Offsets equal HF's for the Qwen3 file (byte-level: a token holding part of a multi-byte
/// character spans the whole character; NFC-composed characters map to their first source
/// character), the Mistral file (`▁` spaces, byte fallback) and the Gemma 3 file.
#[test]
fn offsets_match_hf() {
    for folder in ["qwen3", "llama2", "gemma3"] {
        let path = tokenizer_file(folder);
        let json = std::fs::read(&path).expect("read tokenizer.json");
        offsets_parity(folder, &load(folder), &json);
    }
}

/// `ByteLevel` offset trimming (GPT-2 / RoBERTa style `trim_offsets: true`), alone and in a
/// `Sequence` before a template, on the Qwen3 vocabulary: offsets equal HF's.
#[test]
fn byte_level_trim_offsets_match_hf() {
    let path = tokenizer_file("qwen3");
    let bytes = std::fs::read(&path).expect("read qwen3 tokenizer.json");
    let base: Value = serde_json::from_slice(&bytes).expect("JSON");
    let trim = |prefix: bool| {
        serde_json::json!({"type": "ByteLevel", "add_prefix_space": prefix,
            "trim_offsets": true, "use_regex": false})
    };
    let template = serde_json::json!({"type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "<|im_end|>", "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {
            "<|im_start|>": {"id": "<|im_start|>", "ids": [151644], "tokens": ["<|im_start|>"]},
            "<|im_end|>": {"id": "<|im_end|>", "ids": [151645], "tokens": ["<|im_end|>"]}}});
    let variants = [
        ("qwen3+trim", trim(false)),
        ("qwen3+trim_prefix", trim(true)),
        (
            "qwen3+trim+template",
            serde_json::json!({"type": "Sequence", "processors": [trim(false), template]}),
        ),
    ];
    for (name, post) in variants {
        let mut v = base.clone();
        v["post_processor"] = post;
        let json = serde_json::to_vec(&v).expect("serialize");
        let tok = Tokenizer::from_json_bytes(&json, &path)
            .expect("variant loads")
            .with_truncation(None);
        offsets_parity(name, &tok, &json);
    }
}
