//! SentencePiece Unigram parity with the `sentencepiece` 0.2.3 library on the test models of its
//! sdist (`botchan_en_unigram_1000`, `kyoto_ja_unigram_8000`): ids, pieces and decode, line by
//! line, plus four variants of them edited the same way as the generator does (byte fallback and
//! user-defined pieces; raw whitespace; identity normalizer with whitespace as suffix; spaces not
//! escaped); the BPE test model parses (WORD models are refused); the charsmap's HF grapheme mode
//! matches HF `tokenizers`' `Precompiled`; and robustness (truncated/corrupt files give errors, no
//! input panics).
//!
//! Needs the cache: run `scripts/fetch_sentencepiece.sh`. The fixture is written by
//! `scripts/gen_sentencepiece_reference.py`.

mod common;

use common::u32s;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use lattice_inference::sentencepiece::charsmap::CharsMap;
use lattice_inference::sentencepiece::model_proto::{ModelProto, ModelType, Piece, PieceType};
use lattice_inference::sentencepiece::SentencePieceModel;
use lattice_inference::Error;
use serde_json::Value;

const CORPUS: &str = "tests/fixtures/sentencepiece/corpus.jsonl.gz";
/// The reference files, one per base model (with its variants).
const FIXTURES: [&str; 2] = [
    "tests/fixtures/sentencepiece/unigram_reference_botchan.jsonl.gz",
    "tests/fixtures/sentencepiece/unigram_reference_kyoto.jsonl.gz",
];
const UNIGRAM_MODELS: [&str; 2] = ["botchan_en_unigram_1000", "kyoto_ja_unigram_8000"];
/// `(fixture name, base model, edit)` for the edited variants.
const VARIANTS: [(&str, &str, &str); 4] = [
    (
        "botchan_en_unigram_1000+bytes_user",
        "botchan_en_unigram_1000",
        "bytes_user",
    ),
    (
        "kyoto_ja_unigram_8000+raw_ws",
        "kyoto_ja_unigram_8000",
        "raw_ws",
    ),
    (
        "botchan_en_unigram_1000+identity_suffix",
        "botchan_en_unigram_1000",
        "identity_suffix",
    ),
    (
        "kyoto_ja_unigram_8000+no_escape",
        "kyoto_ja_unigram_8000",
        "no_escape",
    ),
];

/// `.cache/sentencepiece/<name>.model`; fails (never skips) when missing.
fn model_path(name: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../.cache/sentencepiece")
        .join(format!("{name}.model"));
    assert!(
        p.is_file(),
        "{} is missing: run scripts/fetch_sentencepiece.sh to fetch the SentencePiece test models",
        p.display()
    );
    p
}

fn open(name: &str) -> SentencePieceModel {
    SentencePieceModel::open(model_path(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The user-defined pieces of the `bytes_user` variant (as in the generator).
const USER_SYMBOLS: [&str; 5] = ["<mask>", "\u{2581}Botchan", "ｈｅｌｌｏ", "12", "\u{1F600}"];

/// A base model with one of the generator's edits applied (`scripts/gen_sentencepiece_reference.py`).
fn variant(base: &str, edit: &str) -> SentencePieceModel {
    let path = model_path(base);
    let mut proto = SentencePieceModel::read_proto(&path).expect("base model parses");
    let piece = |piece: String, kind| Piece {
        piece,
        score: 0.0,
        kind,
    };
    match edit {
        "bytes_user" => {
            proto.trainer_spec.byte_fallback = true;
            for sym in USER_SYMBOLS {
                proto
                    .pieces
                    .push(piece(sym.to_string(), PieceType::UserDefined));
            }
            for b in 0..=255u8 {
                proto
                    .pieces
                    .push(piece(format!("<0x{b:02X}>"), PieceType::Byte));
            }
        }
        "raw_ws" => {
            proto.normalizer_spec.add_dummy_prefix = false;
            proto.normalizer_spec.remove_extra_whitespaces = false;
        }
        "identity_suffix" => {
            proto.normalizer_spec.name = "identity".into();
            proto.normalizer_spec.precompiled_charsmap.clear();
            proto.trainer_spec.treat_whitespace_as_suffix = true;
        }
        "no_escape" => proto.normalizer_spec.escape_whitespaces = false,
        _ => panic!("unknown variant {edit}"),
    }
    SentencePieceModel::from_proto(proto, &path).unwrap_or_else(|e| panic!("{base}+{edit}: {e}"))
}

fn is_unknown(model: &SentencePieceModel, id: u32) -> bool {
    model
        .segmenter()
        .pieces()
        .get(id as usize)
        .is_some_and(|p| p.kind == PieceType::Unknown)
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .expect("pieces array")
        .iter()
        .map(|x| x.as_str().expect("piece").to_string())
        .collect()
}

/// The shared SentencePiece corpus (`tests/fixtures/sentencepiece/corpus.jsonl.gz`): one JSON
/// string per line; reference lines name a string by its line number.
fn corpus() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(CORPUS);
    common::read_gz(&path)
        .split('\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str(l).expect("corpus line is a JSON string"))
        .collect()
}

#[test]
fn unigram_matches_sentencepiece_id_for_id() {
    let mut models: HashMap<&str, SentencePieceModel> =
        UNIGRAM_MODELS.iter().map(|&n| (n, open(n))).collect();
    for (name, base, edit) in VARIANTS {
        models.insert(name, variant(base, edit));
    }
    let texts = corpus();
    assert!(texts.len() >= 5000, "corpus has {} strings", texts.len());
    let mut n_checked: HashMap<&str, usize> = HashMap::new();
    let (mut n_lossless, mut n_long) = (0usize, 0usize);
    let mut failures = Vec::new();
    for file in FIXTURES {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
        let text = common::read_gz(&path);
        for (lineno, line) in text.split('\n').filter(|l| !l.is_empty()).enumerate() {
            let at = format!("{file}:{}", lineno + 1);
            let rec: Value = serde_json::from_str(line).expect("fixture line is JSON");
            if let Some(ids) = rec.get("decode_ids") {
                let name = rec["model"].as_str().expect("model name");
                let model = models
                    .get(name)
                    .unwrap_or_else(|| panic!("{at}: unknown model {name}"));
                let (ids, want) = (u32s(ids), rec["decoded"].as_str().expect("decoded"));
                let got = model.decode(&ids);
                if got != want {
                    failures.push(format!(
                        "{at} [{name}] decode {ids:?}\n  want {want:?}\n  got  {got:?}"
                    ));
                }
                continue;
            }
            let index = rec["i"].as_u64().expect("corpus index") as usize;
            let input = texts[index].as_str();
            for (name, want_ids) in rec["ids"].as_object().expect("ids by model") {
                let (name, model) = models
                    .get_key_value(name.as_str())
                    .unwrap_or_else(|| panic!("{at}: unknown model {name}"));
                let want_ids = u32s(want_ids);
                // Pieces are the vocabulary spelling of the ids, except unknown pieces, which
                // keep the text they cover (listed in the fixture).
                let mut unk = rec
                    .get("unk_pieces")
                    .and_then(|u| u.get(*name))
                    .map(strings)
                    .unwrap_or_default()
                    .into_iter();
                let want_pieces: Vec<String> = want_ids
                    .iter()
                    .map(|&id| match model.id_to_piece(id) {
                        Some(p) if !is_unknown(model, id) => p.to_string(),
                        _ => unk.next().unwrap_or_default(),
                    })
                    .collect();
                let want_decoded = rec
                    .get("decoded")
                    .and_then(|d| d.get(*name))
                    .map(|d| d.as_str().expect("decoded"))
                    .unwrap_or(input);
                let got = model.encode_with_pieces(input);
                let got_ids: Vec<u32> = got.iter().map(|p| p.0).collect();
                let got_pieces: Vec<String> = got.into_iter().map(|p| p.1).collect();
                let decoded = model.decode(&want_ids);
                if got_ids != want_ids
                    || model.encode(input) != want_ids
                    || got_pieces != want_pieces
                    || decoded != want_decoded
                {
                    let short: String = input.chars().take(200).collect();
                    failures.push(format!(
                        "{at} [{name}] {short:?}\n  want ids {want_ids:?} pieces {want_pieces:?}\n  \
                         got  ids {got_ids:?} pieces {got_pieces:?}\n  want decode \
                         {want_decoded:?}\n  got  decode {decoded:?}"
                    ));
                }
                if decoded == input {
                    n_lossless += 1;
                }
                if input.chars().count() >= 10_000 {
                    n_long += 1;
                }
                *n_checked.entry(name).or_default() += 1;
            }
        }
    }
    for (n, _, _) in VARIANTS {
        assert!(
            n_checked.get(n).copied().unwrap_or(0) >= 800,
            "{n}: {n_checked:?}"
        );
    }
    for n in UNIGRAM_MODELS {
        assert!(
            n_checked.get(n).copied().unwrap_or(0) >= 5000,
            "fixture has too few strings for {n}: {n_checked:?}"
        );
    }
    // decode(encode(x)) == x wherever the model gives x back (checked above as the reference
    // decode); plain text survives often, and the 10,000-character inputs are there.
    assert!(n_lossless >= 1000, "{n_lossless} lossless round trips");
    assert!(n_long >= 20, "{n_long} checks of 10,000-character inputs");
    assert!(
        failures.is_empty(),
        "{} checks differ from sentencepiece; first ones:\n{}",
        failures.len(),
        failures[..failures.len().min(15)].join("\n")
    );
    eprintln!("strings checked per model: {n_checked:?}; {n_lossless} lossless");
}

#[test]
fn bpe_test_model_parses_and_word_models_are_refused() {
    // BPE parity lives in tests/sentencepiece_bpe.rs; here only the proto and the refusal of the
    // model types that do not encode (WORD, CHAR).
    let path = model_path("botchan_en_bpe_1000");
    let mut proto = SentencePieceModel::read_proto(&path).expect("BPE model parses");
    assert_eq!(proto.pieces.len(), 1000);
    assert_eq!(proto.trainer_spec.model_type, ModelType::Bpe);
    assert_eq!(proto.pieces[0].piece, "<unk>");
    assert_eq!(proto.normalizer_spec.name, "nmt_nfkc");
    proto.trainer_spec.model_type = ModelType::Word;
    match SentencePieceModel::from_proto(proto, &path) {
        Err(Error::InvalidTokenizer { reason, .. }) => assert!(reason.contains("Word"), "{reason}"),
        other => panic!("expected InvalidTokenizer, got {other:?}"),
    }
}

#[test]
fn unigram_models_expose_their_specs() {
    let proto =
        SentencePieceModel::read_proto(model_path("kyoto_ja_unigram_8000")).expect("parses");
    assert_eq!(proto.pieces.len(), 8000);
    assert_eq!(proto.trainer_spec.model_type, ModelType::Unigram);
    assert_eq!(
        (proto.trainer_spec.unk_id, proto.trainer_spec.bos_id),
        (0, 1)
    );
    assert_eq!(
        (proto.trainer_spec.eos_id, proto.trainer_spec.pad_id),
        (2, -1)
    );
    assert!(proto.normalizer_spec.add_dummy_prefix);
    assert!(!proto.normalizer_spec.precompiled_charsmap.is_empty());
    let m = open("kyoto_ja_unigram_8000");
    assert_eq!(m.vocab_size(), 8000);
    assert_eq!(m.id_to_piece(0), Some("<unk>"));
    assert_eq!(m.piece_to_id("<unk>"), Some(0));
}

#[test]
fn truncated_or_corrupt_model_files_give_errors_not_panics() {
    let bytes = std::fs::read(model_path("botchan_en_unigram_1000")).expect("readable");
    let dir = tempfile::tempdir().expect("tempdir");
    let cut = dir.path().join("cut.model");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).expect("write");
    match SentencePieceModel::open(&cut) {
        Err(Error::InvalidTokenizer { path, .. }) => assert_eq!(path, cut),
        other => panic!("expected InvalidTokenizer for a truncated file, got {other:?}"),
    }
    let mut rng = Rng(0x5eed);
    for _ in 0..400 {
        let n = rng.below(bytes.len() + 1);
        let _ = ModelProto::parse(&bytes[..n]);
        let mut corrupt = bytes.clone();
        for _ in 0..1 + rng.below(8) {
            let i = rng.below(corrupt.len());
            corrupt[i] = rng.next() as u8;
        }
        if let Ok(proto) = ModelProto::parse(&corrupt) {
            if let Ok(m) = SentencePieceModel::from_proto(proto, Path::new("corrupt.model")) {
                let _ = m.encode("corrupt model still encodes ｈｅｌｌｏ ①");
            }
        }
    }
    assert!(ModelProto::parse(&[0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f]).is_err());
}

#[test]
fn grapheme_mode_matches_hf_precompiled() {
    use tokenizers::normalizers::precompiled::Precompiled;
    use tokenizers::{NormalizedString, Normalizer};
    let mut rng = Rng(7);
    for name in UNIGRAM_MODELS {
        let proto = SentencePieceModel::read_proto(model_path(name)).expect("parses");
        let blob = &proto.normalizer_spec.precompiled_charsmap;
        let ours = CharsMap::parse(blob).expect("charsmap parses");
        let hf = Precompiled::from(blob).expect("HF parses the charsmap");
        let mut inputs: Vec<String> = [
            "ｈｅｌｌｏ ﬁ ① ㍻ ｶﾞ e\u{301} 👨‍👩‍👧 🇯🇵 \u{200b} \u{3000}x",
            "Å ǅ ½ ™ ﾊﾟ क्षि",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        inputs.extend((0..500).map(|_| random_text(&mut rng, 24)));
        for s in inputs {
            let mut n = NormalizedString::from(s.as_str());
            hf.normalize(&mut n).expect("HF normalizes");
            assert_eq!(ours.normalize_graphemes(&s), n.get(), "{name}: {s:?}");
        }
    }
}

#[test]
fn random_unicode_never_panics_and_pieces_cover_the_normalized_text() {
    let mut rng = Rng(0xdecade);
    for name in UNIGRAM_MODELS {
        let m = open(name);
        for _ in 0..3000 {
            let s = random_text(&mut rng, 40);
            let normalized = m.normalizer().normalize(&s);
            let pieces = m.encode_pieces(&s);
            assert_eq!(pieces.concat(), normalized, "{name}: {s:?}");
            let ids = m.encode(&s);
            assert_eq!(ids.len(), pieces.len());
            let _ = m.decode(&ids);
            let junk: Vec<u32> = (0..8).map(|_| rng.next() as u32 % 9000).collect();
            let _ = m.decode(&junk);
        }
    }
}

/// xorshift64*: a small deterministic generator for the property tests.
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

/// Random text mixing ASCII, whitespace, combining marks, ZWJ, CJK, full-width, emoji and any
/// scalar value.
fn random_text(rng: &mut Rng, max_chars: usize) -> String {
    const POOLS: [(u32, u32); 10] = [
        (0x20, 0x7e),
        (0x09, 0x0d),
        (0x300, 0x36f),
        (0x200b, 0x200d),
        (0x3000, 0x30ff),
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
