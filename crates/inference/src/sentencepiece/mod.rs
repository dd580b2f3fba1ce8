//! SentencePiece models read straight from a `.model` file: normalization, Unigram and BPE
//! segmentation and decoding, id-for-id with the `sentencepiece` library.
//!
//! The pieces: [`model_proto`] reads the protobuf, [`charsmap`] normalizes text (precompiled
//! charsmap, whitespace rules, `▁`), [`unigram`] or [`bpe`] segments it. [`SentencePieceModel`] ties them
//! together the way `SentencePieceProcessor` does. The `tokenizer` module builds on it: a folder
//! with only a `tokenizer.model` loads through [`SentencePieceModel`]
//! (`Tokenizer::from_sentencepiece`, which adds special tokens and BOS/EOS), and the
//! `tokenizer.json` Unigram model reuses the piece trie of [`unigram`] with HF's scoring rules.
//! The Unigram and BPE model types encode here (Llama / Mistral `tokenizer.model` files are BPE);
//! WORD and CHAR `.model` files parse but are refused by `open`.

pub mod bpe;
pub mod charsmap;
pub mod model_proto;
pub mod unigram;

use std::path::{Path, PathBuf};

use crate::{Error, Result};
use bpe::Bpe;
use charsmap::{CharsMap, Normalizer, SPACE_SYMBOL};
use model_proto::Piece;
use model_proto::{ModelProto, ModelType, PieceType};
use unigram::Unigram;

/// The segmentation algorithm of a [`SentencePieceModel`].
#[derive(Debug, Clone)]
pub enum Segmenter {
    /// Viterbi over piece scores.
    Unigram(Unigram),
    /// Score-ordered merges of adjacent symbols.
    Bpe(Bpe),
}

impl Segmenter {
    /// The vocabulary in id order.
    pub fn pieces(&self) -> &[Piece] {
        match self {
            Self::Unigram(m) => m.pieces(),
            Self::Bpe(m) => m.pieces(),
        }
    }
}

/// A SentencePiece model (Unigram or BPE): normalizer, vocabulary and decoder settings.
#[derive(Debug, Clone)]
pub struct SentencePieceModel {
    /// The text normalizer (charsmap rules and whitespace handling).
    normalizer: Normalizer,
    /// The segmentation model.
    segmenter: Segmenter,
    /// What decoding prints for the unknown piece.
    unk_surface: String,
    /// Decoding drops the leading `▁` (set when the normalizer adds or strips spaces).
    strip_leading_space: bool,
    /// Decoding keeps stripping leading `▁` until text appears (`remove_extra_whitespaces`).
    strip_all_leading: bool,
}

fn invalid(path: &Path, reason: impl Into<String>) -> Error {
    Error::InvalidTokenizer {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

impl SentencePieceModel {
    /// Reads and parses a `.model` file without building an encoder (any model type).
    pub fn read_proto(path: impl AsRef<Path>) -> Result<ModelProto> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| invalid(path, format!("cannot read: {e}")))?;
        ModelProto::parse(&bytes).map_err(|reason| invalid(path, reason))
    }

    /// Opens a Unigram or BPE `.model` file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let proto = Self::read_proto(path)?;
        Self::from_proto(proto, path)
    }

    /// Builds the model from a parsed proto; `path` only names the file in errors.
    pub fn from_proto(proto: ModelProto, path: &Path) -> Result<Self> {
        let spec = &proto.trainer_spec;
        if !matches!(spec.model_type, ModelType::Unigram | ModelType::Bpe) {
            return Err(invalid(
                path,
                format!(
                    "model_type {:?} is not supported (only Unigram and Bpe encode here)",
                    spec.model_type
                ),
            ));
        }
        let ns = &proto.normalizer_spec;
        let charsmap = CharsMap::parse(&ns.precompiled_charsmap)
            .map_err(|r| invalid(path, format!("precompiled_charsmap: {r}")))?;
        let mut normalizer = Normalizer::new(
            charsmap,
            ns.add_dummy_prefix,
            ns.remove_extra_whitespaces,
            ns.escape_whitespaces,
            spec.treat_whitespace_as_suffix,
        );
        normalizer.set_user_symbols(
            proto
                .pieces
                .iter()
                .filter(|p| p.kind == PieceType::UserDefined)
                .map(|p| p.piece.clone())
                .collect(),
        );
        let unk_surface = spec.unk_surface.clone();
        let strip_leading_space = ns.add_dummy_prefix || ns.remove_extra_whitespaces;
        let strip_all_leading = ns.remove_extra_whitespaces;
        let byte_fallback = spec.byte_fallback;
        let segmenter = if spec.model_type == ModelType::Bpe {
            Segmenter::Bpe(Bpe::new(proto.pieces, byte_fallback).map_err(|r| invalid(path, r))?)
        } else {
            Segmenter::Unigram(
                Unigram::new(proto.pieces, byte_fallback).map_err(|r| invalid(path, r))?,
            )
        };
        Ok(Self {
            normalizer,
            segmenter,
            unk_surface,
            strip_leading_space,
            strip_all_leading,
        })
    }

    /// Builds a model from a `tokenizer.json`-style Unigram vocabulary with an identity
    /// normalizer that adds the dummy prefix and escapes spaces (no whitespace clean-up).
    pub fn from_vocab(vocab: Vec<(String, f32)>, unk_id: u32, byte_fallback: bool) -> Result<Self> {
        let unigram = Unigram::from_vocab(vocab, unk_id, byte_fallback)
            .map_err(|r| invalid(&PathBuf::from("tokenizer.json"), r))?;
        Ok(Self {
            normalizer: Normalizer::new(CharsMap::default(), true, false, true, false),
            segmenter: Segmenter::Unigram(unigram),
            unk_surface: " \u{2047} ".to_string(),
            strip_leading_space: true,
            strip_all_leading: false,
        })
    }

    /// The normalizer applied before segmentation.
    pub fn normalizer(&self) -> &Normalizer {
        &self.normalizer
    }

    /// The segmentation model.
    pub fn segmenter(&self) -> &Segmenter {
        &self.segmenter
    }

    /// The Unigram segmentation model (`None` for a BPE model).
    pub fn unigram(&self) -> Option<&Unigram> {
        match &self.segmenter {
            Segmenter::Unigram(m) => Some(m),
            Segmenter::Bpe(_) => None,
        }
    }

    /// Number of pieces in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.segmenter.pieces().len()
    }

    /// The text of piece `id`.
    pub fn id_to_piece(&self, id: u32) -> Option<&str> {
        self.segmenter
            .pieces()
            .get(id as usize)
            .map(|p| p.piece.as_str())
    }

    /// The bytes piece `id` adds to decoded text in the middle of a sequence: a byte piece its
    /// byte, control pieces nothing, the unknown piece its surface, others with `▁` as spaces.
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        let p = self.segmenter.pieces().get(id as usize)?;
        Some(match p.kind {
            PieceType::Byte => match byte_value(&p.piece) {
                Some(b) => vec![b],
                None => p.piece.as_bytes().to_vec(),
            },
            PieceType::Control => Vec::new(),
            PieceType::Unknown => self.unk_surface.as_bytes().to_vec(),
            _ => p.piece.replace(SPACE_SYMBOL, " ").into_bytes(),
        })
    }

    /// The id of a piece.
    pub fn piece_to_id(&self, piece: &str) -> Option<u32> {
        match &self.segmenter {
            Segmenter::Unigram(m) => m.piece_to_id(piece),
            Segmenter::Bpe(m) => m.piece_to_id(piece),
        }
    }

    /// Encodes text into `(id, piece)` pairs, as `SentencePieceProcessor::Encode`.
    pub fn encode_with_pieces(&self, text: &str) -> Vec<(u32, String)> {
        let normalized = self.normalizer.normalize(text);
        match &self.segmenter {
            Segmenter::Unigram(m) => m.encode(&normalized),
            Segmenter::Bpe(m) => m.encode(&normalized),
        }
    }

    /// Encodes text into ids (no BOS/EOS).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let normalized = self.normalizer.normalize(text);
        match &self.segmenter {
            Segmenter::Unigram(m) => m.encode_ids(&normalized),
            Segmenter::Bpe(m) => m.encode_ids(&normalized),
        }
    }

    /// Encodes text into piece strings (unknown text appears as itself).
    pub fn encode_pieces(&self, text: &str) -> Vec<String> {
        self.encode_with_pieces(text)
            .into_iter()
            .map(|p| p.1)
            .collect()
    }

    /// Decodes ids back to text, as `SentencePieceProcessor::Decode`: control pieces vanish, the
    /// unknown piece prints as `unk_surface`, runs of byte pieces are read as UTF-8 (each invalid
    /// byte gives U+FFFD), `▁` becomes a space and the leading dummy space is dropped. Ids outside
    /// the vocabulary are skipped.
    pub fn decode(&self, ids: &[u32]) -> String {
        let pieces = self.segmenter.pieces();
        let mut out = String::new();
        let mut is_bos_ws = true;
        let mut bytes: Vec<u8> = Vec::new();
        for &id in ids {
            let Some(p) = pieces.get(id as usize) else {
                continue;
            };
            if p.kind == PieceType::Byte {
                if let Some(b) = byte_value(&p.piece) {
                    bytes.push(b);
                    continue;
                }
            }
            if !bytes.is_empty() {
                flush_bytes(&mut bytes, &mut out, &mut is_bos_ws);
            }
            let (text, consumed_ws) = match p.kind {
                PieceType::Control => (String::new(), false),
                PieceType::Unknown => (self.unk_surface.clone(), false),
                _ => {
                    let mut piece = p.piece.as_str();
                    let mut consumed = false;
                    if is_bos_ws && self.strip_leading_space {
                        if let Some(rest) = piece.strip_prefix(SPACE_SYMBOL) {
                            piece = rest;
                            consumed = !self.strip_all_leading;
                        }
                    }
                    (piece.replace(SPACE_SYMBOL, " "), consumed)
                }
            };
            if is_bos_ws && (!text.is_empty() || consumed_ws) {
                is_bos_ws = false;
            }
            out.push_str(&text);
        }
        if !bytes.is_empty() {
            flush_bytes(&mut bytes, &mut out, &mut is_bos_ws);
        }
        out
    }
}

/// The byte a `<0xXX>` piece stands for.
fn byte_value(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// Appends a run of byte pieces as UTF-8, one U+FFFD per byte that does not start a valid
/// character.
fn flush_bytes(bytes: &mut Vec<u8>, out: &mut String, is_bos_ws: &mut bool) {
    let mut rest = bytes.as_slice();
    while !rest.is_empty() {
        let len = match rest[0] {
            0x00..=0x7f => 1,
            0xc0..=0xdf => 2,
            0xe0..=0xef => 3,
            0xf0..=0xf7 => 4,
            _ => 0,
        };
        match rest.get(..len).map(std::str::from_utf8) {
            Some(Ok(s)) if len > 0 => {
                out.push_str(s);
                rest = &rest[len..];
            }
            _ => {
                out.push('\u{fffd}');
                rest = &rest[1..];
            }
        }
    }
    *is_bos_ws = false;
    bytes.clear();
}
