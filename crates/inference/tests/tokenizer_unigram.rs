//! Unigram parity with HF `tokenizers` 0.23.3 on `tokenizer.json` files built from the
//! SentencePiece Unigram test models (`botchan_en_unigram_1000`: ALBERT/XLNet-style normalizers,
//! Metaspace, `<s> A </s>`; `kyoto_ja_unigram_8000`: Precompiled + Strip + regex Replace, Metaspace
//! with `prepend_scheme: first` and no split, `A </s>`; `botchan_en_unigram_1000_bytes`: 256 byte
//! pieces added, `byte_fallback` on, Llama-style ByteFallback decoder). Checks ids with and without
//! special tokens and both decodes on every fixture line, offsets against the HF crate in
//! process, that random bytes / random Unicode never make encoding panic, and the
//! `tokenizer.model` fallback of `Tokenizer::from_dir`.
//!
//! The fixtures (tokenizer.json files and `reference_<NAME>.jsonl.gz`, which name their inputs by
//! line number in the shared SentencePiece corpus `tests/fixtures/sentencepiece/corpus.jsonl.gz`)
//! are written by
//! `scripts/gen_unigram_json_reference.py`; they are committed, so this test needs no cache except
//! for the `from_dir` test, which reads `.cache/sentencepiece` (`scripts/fetch_sentencepiece.sh`).

mod common;

use common::u32s;

use std::path::{Path, PathBuf};

use lattice_inference::tokenizer::Tokenizer;
use serde_json::Value;

const MODELS: [&str; 3] = [
    "botchan_en_unigram_1000",
    "kyoto_ja_unigram_8000",
    "botchan_en_unigram_1000_bytes",
];

fn dir() -> PathBuf {
    common::fixture("tokenizer/unigram")
}

fn load(name: &str) -> Tokenizer {
    let path = dir().join(name).join("tokenizer.json.gz");
    Tokenizer::from_json_bytes(common::read_gz(&path).as_bytes(), &path).expect("fixture loads")
}

/// The shared SentencePiece corpus (`tests/fixtures/sentencepiece/corpus.jsonl.gz`, one JSON
/// string per line), which the reference lines name by line number.
fn corpus() -> Vec<String> {
    common::read_gz(&common::fixture("sentencepiece/corpus.jsonl.gz"))
        .split('\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str(l).expect("corpus line is a JSON string"))
        .collect()
}

#[test]
fn every_fixture_line_matches_hf() {
    let texts = corpus();
    assert!(texts.len() >= 5000, "corpus has {} strings", texts.len());
    let mut n_lines = [0usize; 3];
    let mut n_lossless = [0usize; 3];
    let mut failures = Vec::new();
    for (i, model) in MODELS.iter().enumerate() {
        let tok = load(model);
        let file = dir().join(format!("reference_{model}.jsonl.gz"));
        let data = common::read_gz(&file);
        let mut lines = data.split('\n').filter(|l| !l.is_empty());
        // The first line: the ids the template puts around one sequence.
        let head: Value = serde_json::from_str(lines.next().expect("header")).expect("JSON");
        assert_eq!(head["model"], *model);
        let (prefix, suffix) = (u32s(&head["prefix"]), u32s(&head["suffix"]));
        for line in lines {
            let d: Value = serde_json::from_str(line).expect("fixture lines are JSON");
            assert_eq!(d["model"], *model);
            n_lines[i] += 1;
            let input = match d.get("i").and_then(Value::as_u64) {
                Some(n) => texts[n as usize].as_str(),
                None => d["text"].as_str().expect("text"),
            };
            let short: String = input.chars().take(200).collect();
            let plain = u32s(&d["ids_plain"]);
            let ids = match d.get("ids") {
                Some(v) => u32s(v),
                None => [prefix.as_slice(), &plain, &suffix].concat(),
            };
            let got = tok.encode(input, true).ids;
            if got != ids {
                failures.push(format!("{model} {short:?}: ids {got:?} != {ids:?}"));
            }
            let got = tok.encode(input, false).ids;
            if got != plain {
                failures.push(format!("{model} {short:?}: plain ids {got:?} != {plain:?}"));
            }
            let want = d
                .get("decoded")
                .map_or(input, |v| v.as_str().expect("decoded"));
            let got = tok.decode(&ids, true);
            if got != want {
                failures.push(format!("{model} {short:?}: decode {got:?} != {want:?}"));
            }
            if got == input {
                n_lossless[i] += 1;
            }
            let want = d
                .get("decoded_all")
                .map_or(want, |v| v.as_str().expect("decoded_all"));
            let got = tok.decode(&ids, false);
            if got != want {
                failures.push(format!(
                    "{model} {short:?}: decode (all) {got:?} != {want:?}"
                ));
            }
        }
    }
    eprintln!("strings per model: {n_lines:?}; decode(encode(x)) == x: {n_lossless:?}");
    assert!(n_lines[..2].iter().all(|&n| n >= 5000), "{n_lines:?} lines");
    assert!(n_lines[2] >= 2500, "{n_lines:?} lines");
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures[..failures.len().min(20)].join("\n")
    );
}

/// Offsets equal HF's `Encoding::get_offsets()` (byte offsets; the `tokenizers` crate 0.23 in
/// process, loading the same file) on every corpus string, with and without special tokens: the
/// Precompiled charsmap and the regex `Replace` of whitespace runs map their output to the
/// original characters the way HF's `transform` does.
#[test]
fn offsets_match_hf() {
    let texts = corpus();
    for model in MODELS {
        let tok = load(model);
        let hf = tokenizers::Tokenizer::from_bytes(common::read_gz(
            &dir().join(model).join("tokenizer.json.gz"),
        ))
        .expect("HF loads");
        let mut failures = Vec::new();
        let mut n = 0;
        for text in &texts {
            for special in [false, true] {
                let want = hf.encode(text.as_str(), special).expect("HF encodes");
                let got = tok.encode(text, special);
                n += 1;
                if got.ids != want.get_ids() || got.offsets != want.get_offsets() {
                    let short: String = text.chars().take(80).collect();
                    failures.push(format!(
                        "{model} {short:?}\n  got  {:?}\n  want {:?}",
                        got.offsets,
                        want.get_offsets()
                    ));
                }
            }
        }
        assert!(n >= 10_000, "{model}: {n} encodings");
        assert!(
            failures.is_empty(),
            "{} of {n} encodings differ from HF:\n{}",
            failures.len(),
            failures[..failures.len().min(10)].join("\n")
        );
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
    let toks: Vec<Tokenizer> = MODELS.iter().map(|m| load(m)).collect();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for round in 0..2000 {
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
            let enc = tok.encode(&text, true);
            assert_eq!(enc.ids.len(), enc.offsets.len());
            let _ = tok.decode(&enc.ids, false);
        }
    }
}

#[test]
fn malformed_unigram_files_are_errors() {
    let err = |json: &str| match Tokenizer::from_json_bytes(json.as_bytes(), "t.json") {
        Ok(_) => panic!("expected an error for {json}"),
        Err(e) => e.to_string(),
    };
    let m = r#""model": {"type": "Unigram", "vocab": [["<unk>", 0.0]], "unk_id": 0}"#;
    assert!(
        err(r#"{"model": {"type": "Unigram", "vocab": [["a"]], "unk_id": 0}}"#)
            .contains("vocab[0]")
    );
    assert!(
        err(r#"{"model": {"type": "Unigram", "vocab": [["a", 0]], "unk_id": 3}}"#)
            .contains("unk_id")
    );
    let bad_b64 = format!(
        r#"{{{m}, "normalizer": {{"type": "Precompiled", "precompiled_charsmap": "a!"}}}}"#
    );
    assert!(err(&bad_b64).contains("base64"));
    let bad_map = format!(
        r#"{{{m}, "normalizer": {{"type": "Precompiled", "precompiled_charsmap": "AAAA"}}}}"#
    );
    assert!(err(&bad_map).contains("Precompiled"));
}

fn sp_model(name: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../.cache/sentencepiece")
        .join(format!("{name}.model"));
    assert!(
        p.is_file(),
        "{} is missing: run scripts/fetch_sentencepiece.sh",
        p.display()
    );
    p
}

/// A folder with only `tokenizer.model` and a `tokenizer_config.json` asking for BOS and EOS
/// encodes like `SentencePieceModel` (itself checked against `sentencepiece` in
/// `tests/sentencepiece_unigram.rs`) with the model's `<s>` / `</s>` ids around it.
#[test]
fn from_dir_loads_a_sentencepiece_model() {
    use lattice_inference::sentencepiece::SentencePieceModel;
    let texts = corpus();
    for name in ["botchan_en_unigram_1000", "kyoto_ja_unigram_8000"] {
        let model = sp_model(name);
        let sp = SentencePieceModel::open(&model).expect("model opens");
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::copy(&model, dir.path().join("tokenizer.model")).expect("copy");
        std::fs::write(
            dir.path().join("tokenizer_config.json"),
            r#"{"add_bos_token": true, "add_eos_token": true}"#,
        )
        .expect("write config");
        let tok = Tokenizer::from_dir(dir.path()).expect("tokenizer.model loads");
        let plain = Tokenizer::from_sentencepiece(&model, false, false).expect("loads");
        let (bos, eos) = (sp.piece_to_id("<s>"), sp.piece_to_id("</s>"));
        let (bos, eos) = (bos.expect("<s>"), eos.expect("</s>"));
        let mut n_checked = 0;
        for text in &texts {
            let text = text.as_str();
            if ["<s>", "</s>", "<unk>"].iter().any(|s| text.contains(s)) {
                continue;
            }
            let ids = sp.encode(text);
            assert_eq!(plain.encode(text, true).ids, ids, "{name} {text:?}");
            let mut full = vec![bos];
            full.extend(&ids);
            full.push(eos);
            assert_eq!(tok.encode(text, true).ids, full, "{name} {text:?}");
            assert_eq!(tok.decode(&full, false), sp.decode(&ids), "{name} {text:?}");
            n_checked += 1;
        }
        assert!(n_checked >= 5000, "{name}: {n_checked} strings");
        let pair = tok.encode_pair("a", "b", true);
        assert_eq!(pair.ids.first(), Some(&bos));
        assert_eq!(pair.ids.iter().filter(|&&i| i == eos).count(), 2);
        assert_eq!(
            tok.encode("x<s>y", false)
                .ids
                .iter()
                .filter(|&&i| i == bos)
                .count(),
            1
        );
    }
}
