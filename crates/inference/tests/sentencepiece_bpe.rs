//! SentencePiece BPE parity with the `sentencepiece` 0.2.3 library on two `.model` files:
//! `botchan_en_bpe_1000` (the sdist's BPE test model, `nmt_nfkc` normalizer) and Mistral's
//! `tokenizer.model.v1` (PyPI `mistral-common` 1.13.1: 32,000 pieces, byte fallback, identity
//! normalizer, Llama-style). Every fixture line is checked id for id and `decode(ids)` for both
//! models, and for an edited variant of the botchan model (byte fallback, user-defined pieces,
//! some pieces made UNUSED: the edit is replayed here as the generator does it); random input never
//! panics and the pieces cover the normalized text; and `Tokenizer::from_sentencepiece` with BOS
//! on the Mistral model gives `[1] + ids`.
//!
//! Needs the cache: run `scripts/fetch_sentencepiece.sh` (fails, never skips, when missing). The
//! fixture is written by `scripts/gen_sentencepiece_bpe_reference.py`.

mod common;

use common::u32s;

use std::path::{Path, PathBuf};

use lattice_inference::sentencepiece::model_proto::{ModelType, Piece, PieceType};
use lattice_inference::sentencepiece::SentencePieceModel;
use lattice_inference::tokenizer::Tokenizer;
use serde_json::Value;

const FIXTURE: &str = "tests/fixtures/sentencepiece/bpe_reference.jsonl.gz";
/// The shared corpus: one JSON string per line; fixture lines name a string by its line number.
const CORPUS: &str = "tests/fixtures/sentencepiece/corpus.jsonl.gz";
/// `(fixture name, file in .cache/sentencepiece)`.
const MODELS: [(&str, &str); 2] = [
    ("botchan_en_bpe_1000", "botchan_en_bpe_1000.model"),
    ("mistral_tokenizer.model.v1", "mistral_tokenizer.model.v1"),
];
const MISTRAL: &str = "mistral_tokenizer.model.v1";
/// The edited botchan model (see `variant`).
const VARIANT: &str = "botchan_en_bpe_1000+bytes_user_unused";
/// The user-defined pieces the variant appends (as the generator's `USER_SYMBOLS`).
const USER_SYMBOLS: [&str; 6] = [
    "<mask>",
    "\u{2581}Botchan",
    "12",
    "\u{1F600}",
    "ing\u{2581}",
    "\u{ff48}\u{ff45}\u{ff4c}\u{ff4c}\u{ff4f}",
];

/// `.cache/sentencepiece/<file>`; fails (never skips) when missing.
fn model_path(file: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../.cache/sentencepiece")
        .join(file);
    assert!(
        p.is_file(),
        "{} is missing: run scripts/fetch_sentencepiece.sh to fetch the SentencePiece BPE models",
        p.display()
    );
    p
}

fn open(file: &str) -> SentencePieceModel {
    SentencePieceModel::open(model_path(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn models() -> Vec<(&'static str, SentencePieceModel)> {
    MODELS
        .iter()
        .map(|&(name, file)| (name, open(file)))
        .collect()
}

/// The botchan BPE model with the generator's `bytes_user_unused` edit: every NORMAL piece of at
/// least two characters whose id is 3 mod 7 becomes UNUSED, byte fallback is on, and the
/// user-defined pieces and the 256 byte pieces are appended.
fn variant() -> SentencePieceModel {
    let path = model_path("botchan_en_bpe_1000.model");
    let mut proto = SentencePieceModel::read_proto(&path).expect("parses");
    for (i, p) in proto.pieces.iter_mut().enumerate() {
        if p.kind == PieceType::Normal && i % 7 == 3 && p.piece.chars().count() >= 2 {
            p.kind = PieceType::Unused;
        }
    }
    proto.trainer_spec.byte_fallback = true;
    let add = |piece: String, kind| Piece {
        piece,
        score: 0.0,
        kind,
    };
    for sym in USER_SYMBOLS {
        proto
            .pieces
            .push(add(sym.to_string(), PieceType::UserDefined));
    }
    for b in 0..=255u8 {
        proto
            .pieces
            .push(add(format!("<0x{b:02X}>"), PieceType::Byte));
    }
    SentencePieceModel::from_proto(proto, &path).unwrap_or_else(|e| panic!("{VARIANT}: {e}"))
}

fn fixture_lines() -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(FIXTURE);
    common::read_gz(&path)
        .split('\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str(l).expect("fixture line is JSON"))
        .collect()
}

fn corpus() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(CORPUS);
    common::read_gz(&path)
        .split('\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str(l).expect("corpus line is a JSON string"))
        .collect()
}

/// The input of a fixture line: corpus string `i`, or the line's own `text`.
fn input<'a>(rec: &'a Value, corpus: &'a [String]) -> &'a str {
    match rec.get("i").and_then(Value::as_u64) {
        Some(i) => corpus[i as usize].as_str(),
        None => rec["text"].as_str().expect("text"),
    }
}

#[test]
fn models_are_bpe_with_the_expected_specs() {
    for (name, file) in MODELS {
        let proto = SentencePieceModel::read_proto(model_path(file)).expect("parses");
        assert_eq!(proto.trainer_spec.model_type, ModelType::Bpe, "{name}");
    }
    let proto = SentencePieceModel::read_proto(model_path(MISTRAL)).expect("parses");
    assert_eq!(proto.pieces.len(), 32000);
    assert!(proto.trainer_spec.byte_fallback);
    assert_eq!(
        proto
            .pieces
            .iter()
            .filter(|p| p.kind == PieceType::Byte)
            .count(),
        256
    );
    let m = open(MISTRAL);
    assert_eq!(m.vocab_size(), 32000);
    assert_eq!(m.id_to_piece(1), Some("<s>"));
    assert_eq!(m.piece_to_id("<0x41>"), Some(3 + 0x41));
}

#[test]
fn bpe_matches_sentencepiece_id_for_id() {
    let models = models();
    let edited = variant();
    let mut n_checked = vec![0usize; models.len()];
    let mut n_decode = vec![0usize; models.len()];
    let mut n_variant = 0usize;
    let mut n_lossless = vec![0usize; models.len()];
    let mut n_plain = 0usize;
    let mut failures = Vec::new();
    let texts = corpus();
    assert!(texts.len() >= 5000, "corpus has {} strings", texts.len());
    for (lineno, rec) in fixture_lines().iter().enumerate() {
        if rec.get("model").and_then(Value::as_str) == Some(VARIANT) {
            let input = input(rec, &texts);
            let (want_ids, want_decoded) = (u32s(&rec["ids"]), rec["decoded"].as_str());
            let got_ids = edited.encode(input);
            let decoded = edited.decode(&want_ids);
            let pieces_ids: Vec<u32> = edited
                .encode_with_pieces(input)
                .iter()
                .map(|p| p.0)
                .collect();
            if got_ids != want_ids
                || pieces_ids != want_ids
                || Some(decoded.as_str()) != want_decoded
            {
                failures.push(format!(
                    "line {} [{VARIANT}] {input:?}\n  want ids {want_ids:?}\n  got  ids {got_ids:?}\n  \
                     want decode {want_decoded:?}\n  got  decode {decoded:?}",
                    lineno + 1
                ));
            }
            n_variant += 1;
            continue;
        }
        if let Some(ids) = rec.get("decode_ids") {
            let name = rec["model"].as_str().expect("model name");
            let i = models
                .iter()
                .position(|m| m.0 == name)
                .unwrap_or_else(|| panic!("line {}: unknown model {name}", lineno + 1));
            let (ids, want) = (u32s(ids), rec["decoded"].as_str().expect("decoded"));
            let got = models[i].1.decode(&ids);
            if got != want {
                failures.push(format!(
                    "line {} [{name}] decode {ids:?}\n  want {want:?}\n  got  {got:?}",
                    lineno + 1
                ));
            }
            n_decode[i] += 1;
            continue;
        }
        let input = input(rec, &texts);
        if !input.contains('\u{2581}') {
            n_plain += 1;
        }
        for (i, (name, model)) in models.iter().enumerate() {
            let want_ids = u32s(&rec["ids"][name]);
            // A decode is in the fixture only where it is not the input.
            let want_decoded = match rec.get("decoded").and_then(|d| d.get(*name)) {
                Some(d) => d.as_str().expect("decoded"),
                None => input,
            };
            if want_decoded == input {
                n_lossless[i] += 1;
            } else if *name == MISTRAL && !input.contains('\u{2581}') {
                failures.push(format!("{name}: {input:?} does not round-trip"));
            }
            let got = model.encode_with_pieces(input);
            let got_ids: Vec<u32> = got.iter().map(|p| p.0).collect();
            let decoded = model.decode(&want_ids);
            if got_ids != want_ids || model.encode(input) != want_ids || decoded != want_decoded {
                failures.push(format!(
                    "line {} [{name}] {input:?}\n  want ids {want_ids:?}\n  got  ids {got_ids:?}\n  \
                     got pieces {:?}\n  want decode {want_decoded:?}\n  got  decode {decoded:?}",
                    lineno + 1,
                    got.iter().map(|p| p.1.as_str()).collect::<Vec<_>>(),
                ));
            }
            n_checked[i] += 1;
        }
    }
    eprintln!("strings checked: {n_checked:?}, decode(encode(x)) == x: {n_lossless:?}");
    // Mistral's model is lossless (identity normalizer, byte fallback): every string without a
    // `▁` (which decodes as a space) comes back whole (checked per string above).
    let mistral = models.iter().position(|m| m.0 == MISTRAL).expect("mistral");
    assert!(n_lossless[mistral] >= n_plain, "Mistral round trips");
    assert!(n_plain >= 5000, "{n_plain}");
    for (i, (name, _)) in models.iter().enumerate() {
        assert!(
            n_checked[i] >= 5000 && n_decode[i] >= 100,
            "fixture has too few lines for {name}: {} strings, {} decode-only",
            n_checked[i],
            n_decode[i]
        );
    }
    assert!(n_variant >= 700, "only {n_variant} lines for {VARIANT}");
    assert!(
        failures.is_empty(),
        "{} encodings/decodings differ from sentencepiece; first ones:\n{}",
        failures.len(),
        failures[..failures.len().min(15)].join("\n")
    );
}

#[test]
fn tokenizer_from_sentencepiece_adds_bos_on_mistral() {
    let model = open(MISTRAL);
    let tok = Tokenizer::from_sentencepiece(model_path(MISTRAL), true, false)
        .expect("Mistral tokenizer.model loads");
    let mut n = 0;
    let texts = corpus();
    for rec in fixture_lines() {
        if rec.get("model").is_some() {
            continue; // a line of the edited variant, or decode-only
        }
        let text = input(&rec, &texts);
        // Text that spells a control piece is matched as that special token by the tokenizer.
        if ["<s>", "</s>", "<unk>"].iter().any(|s| text.contains(s)) {
            continue;
        }
        let want = u32s(&rec["ids"][MISTRAL]);
        assert_eq!(model.encode(text), want, "{text:?}");
        let enc = tok.encode(text, true);
        let mut expected = vec![1];
        expected.extend(&want);
        assert_eq!(enc.ids, expected, "{text:?}");
        assert_eq!(tok.encode(text, false).ids, want, "{text:?}");
        n += 1;
    }
    assert!(n >= 5000, "only {n} strings checked");
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

/// Random text mixing ASCII, whitespace, combining marks, ZWJ, CJK, full-width, emoji, byte
/// pieces' spellings and any scalar value.
fn random_text(rng: &mut Rng, max_chars: usize) -> String {
    const POOLS: [(u32, u32); 10] = [
        (0x20, 0x7e),
        (0x09, 0x0d),
        (0x300, 0x36f),
        (0x200b, 0x200d),
        (0x2580, 0x2582),
        (0x4e00, 0x4fff),
        (0xff00, 0xffef),
        (0x1f300, 0x1f6ff),
        (0x2460, 0x24ff),
        (0, 0x10ffff),
    ];
    let n = rng.below(max_chars + 1);
    (0..n)
        .filter_map(|_| {
            let (lo, hi) = POOLS[rng.below(POOLS.len())];
            char::from_u32(lo + rng.below((hi - lo + 1) as usize) as u32)
        })
        .collect()
}

#[test]
fn random_input_never_panics_and_pieces_cover_the_normalized_text() {
    let mut rng = Rng(0x0b9e_5eed);
    for (name, m) in models() {
        let byte_fallback = name == MISTRAL;
        for _ in 0..3000 {
            let s = random_text(&mut rng, 40);
            let normalized = m.normalizer().normalize(&s);
            let pieces = m.encode_with_pieces(&s);
            let ids = m.encode(&s);
            assert_eq!(ids, pieces.iter().map(|p| p.0).collect::<Vec<_>>());
            if !byte_fallback {
                let text: String = pieces.iter().map(|p| p.1.as_str()).collect();
                assert_eq!(text, normalized, "{name}: {s:?}");
            } else {
                // Byte fallback: no unknown piece, and decoding gives the text back
                // (the identity normalizer only adds the dummy prefix).
                assert!(!ids.contains(&0), "{name}: {s:?} gave <unk>");
                assert_eq!(m.decode(&ids), s.replace('\u{2581}', " "), "{name}: {s:?}");
            }
            let junk: Vec<u32> = (0..8).map(|_| rng.next() as u32 % 33000).collect();
            let _ = m.decode(&junk);
        }
    }
    let m = variant();
    for _ in 0..3000 {
        let mut s = random_text(&mut rng, 40);
        s.push_str(USER_SYMBOLS[rng.below(USER_SYMBOLS.len())]);
        s.push_str(&random_text(&mut rng, 10));
        let ids = m.encode(&s);
        let pieces = m.encode_with_pieces(&s);
        assert_eq!(ids, pieces.iter().map(|p| p.0).collect::<Vec<_>>(), "{s:?}");
        assert!(!ids.contains(&0), "{VARIANT}: {s:?} gave <unk>");
        let _ = m.decode(&ids);
    }
}
