//! Loaders besides `tokenizer.json`: a BERT `vocab.txt` (one token per line, the line number is
//! the id) with the defaults of transformers' `BertTokenizerFast`, a SentencePiece Unigram
//! `tokenizer.model`, and a model folder (prefer `tokenizer.json`, then `tokenizer.model` with
//! `add_bos_token` / `add_eos_token` from `tokenizer_config.json`, else `vocab.txt` with its casing
//! options). This module builds tokenizers; it does not tokenize.

use std::path::Path;

use serde_json::Value;

use super::added::AddedToken;
use super::bpe::{Bpe, BpeOptions};
use super::decode::Decoder;
use super::json::invalid;
use super::model::Model;
use super::normalize::BertNormalizer;
use super::normalizers::Normalizer;
use super::post::{Piece, PostProcessor};
use super::pretokenize::{PreTokenizer, SplitPattern, GPT2_PATTERN};
use super::wordpiece::WordPiece;
use super::Tokenizer;
use crate::sentencepiece::model_proto::PieceType;
use crate::sentencepiece::SentencePieceModel;
use crate::{Error, Result};

/// BERT's special tokens, in the order transformers registers them.
const BERT_SPECIALS: [&str; 5] = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"];

/// The id of `token` in vocabulary lines (the last line wins, as in HF's vocabulary map).
pub(crate) fn line_id(tokens: &[String], token: &str) -> Option<u32> {
    tokens.iter().rposition(|t| t == token).map(|i| i as u32)
}

/// Builds a BERT-style WordPiece pipeline: the given normalizer, `BertPreTokenizer`, WordPiece
/// over `tokens` (line number = id), `[CLS] A [SEP]` post-processing with `cls` / `sep`, the
/// WordPiece decoder, and `added` as special tokens.
pub(crate) fn bert_pipeline(
    path: &Path,
    tokens: Vec<String>,
    unk: &str,
    cls: (String, u32),
    sep: (String, u32),
    added: Vec<AddedToken>,
    normalizer: BertNormalizer,
) -> Result<Tokenizer> {
    let entries = tokens.into_iter().enumerate().map(|(i, t)| (t, i as u32));
    let model =
        WordPiece::new(entries, unk, "##", 100).map_err(|e| invalid(path, e.to_string()))?;
    Ok(Tokenizer::from_parts(
        Some(Normalizer::Bert(normalizer)),
        PreTokenizer::Bert,
        Model::WordPiece(model),
        added,
        Some(PostProcessor::bert(cls, sep)),
        Decoder::WordPiece {
            prefix: "##".into(),
            cleanup: true,
        },
    ))
}

/// A BERT tokenizer from `vocab.txt` lines with transformers' special tokens.
fn bert_from_vocab(
    path: &Path,
    tokens: Vec<String>,
    normalizer: BertNormalizer,
) -> Result<Tokenizer> {
    let id = |t: &str| {
        line_id(&tokens, t)
            .map(|i| (t.to_owned(), i))
            .ok_or_else(|| invalid(path, format!("the vocabulary has no `{t}` token")))
    };
    let (cls, sep) = (id("[CLS]")?, id("[SEP]")?);
    let added = BERT_SPECIALS
        .iter()
        .filter_map(|t| line_id(&tokens, t).map(|i| AddedToken::special(i, t)))
        .collect();
    bert_pipeline(path, tokens, "[UNK]", cls, sep, added, normalizer)
}

/// GPT-2's end-of-text token, a special token when the vocabulary has it.
const GPT2_EOT: &str = "<|endoftext|>";

/// Parses a GPT-2 `merges.txt`: one `a b` pair per line in rank order; a first line starting
/// with `#version` and blank lines are skipped. Every token of a pair and their concatenation
/// must be in `vocab` (an error names the line otherwise).
fn parse_merges(
    path: &Path,
    text: &str,
    vocab: &std::collections::HashMap<String, u32>,
) -> Result<Vec<(String, String)>> {
    let mut pairs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        if (i == 0 && line.starts_with("#version")) || line.trim().is_empty() {
            continue;
        }
        let mut parts = line.split(' ');
        let (a, b) = match (parts.next(), parts.next(), parts.next()) {
            (Some(a), Some(b), None) if !a.is_empty() && !b.is_empty() => (a, b),
            _ => {
                return Err(invalid(
                    path,
                    format!(
                        "line {line_no}: expected two tokens separated by one space, got {line:?}"
                    ),
                ))
            }
        };
        for t in [a, b, &format!("{a}{b}")] {
            if !vocab.contains_key(t) {
                return Err(invalid(
                    path,
                    format!(
                        "line {line_no}: merge `{a} {b}` uses `{t}`, which is not in vocab.json"
                    ),
                ));
            }
        }
        pairs.push((a.to_owned(), b.to_owned()));
    }
    Ok(pairs)
}

/// Loads the tokenizer of a model folder; the same as [`Tokenizer::from_dir`].
pub fn load_tokenizer(dir: impl AsRef<Path>) -> Result<Tokenizer> {
    Tokenizer::from_dir(dir)
}

impl Tokenizer {
    /// Loads a BERT `vocab.txt` with transformers' defaults: `[CLS] A [SEP]` /
    /// `[CLS] A [SEP] B [SEP]`, `BertNormalizer` with clean text and CJK spacing, accents stripped
    /// exactly when `lowercase` is set. No truncation.
    pub fn from_vocab_txt(path: impl AsRef<Path>, lowercase: bool) -> Result<Self> {
        let normalizer = BertNormalizer {
            clean_text: true,
            handle_chinese_chars: true,
            strip_accents: lowercase,
            lowercase,
        };
        Self::vocab_txt_with(path.as_ref(), normalizer)
    }

    fn vocab_txt_with(path: &Path, normalizer: BertNormalizer) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        // `lines` drops "\n" and "\r\n"; nothing else is trimmed, so odd tokens survive.
        let tokens: Vec<String> = text.lines().map(str::to_owned).collect();
        if tokens.is_empty() {
            return Err(invalid(path, "vocab.txt is empty"));
        }
        bert_from_vocab(path, tokens, normalizer)
    }

    /// Loads a GPT-2 style byte-level BPE from `vocab.json` (token → id) and `merges.txt`, with
    /// the defaults of transformers' `GPT2TokenizerFast`: the ByteLevel pre-tokenizer with GPT-2's
    /// split regex and no prefix space, the ByteLevel decoder, `<|endoftext|>` as a special token
    /// when the vocabulary has it, and no post-processor.
    pub fn from_vocab_merges(vocab: impl AsRef<Path>, merges: impl AsRef<Path>) -> Result<Self> {
        let (vocab, merges) = (vocab.as_ref(), merges.as_ref());
        let bytes = std::fs::read(vocab).map_err(|e| Error::io(vocab, e))?;
        let map: std::collections::HashMap<String, u32> = serde_json::from_slice(&bytes)
            .map_err(|e| invalid(vocab, format!("not a JSON object of token to id: {e}")))?;
        if map.is_empty() {
            return Err(invalid(vocab, "vocab.json is empty"));
        }
        let text = std::fs::read_to_string(merges).map_err(|e| Error::io(merges, e))?;
        let pairs = parse_merges(merges, &text, &map)?;
        let added = map
            .get(GPT2_EOT)
            .map(|&id| AddedToken::special(id, GPT2_EOT))
            .into_iter()
            .collect();
        let entries: Vec<(String, u32)> = map.into_iter().collect();
        let model = Bpe::new(entries, pairs, BpeOptions::default())
            .map_err(|e| invalid(merges, e.to_string()))?;
        let re = fancy_regex::Regex::new(GPT2_PATTERN)
            .map_err(|e| invalid(vocab, format!("GPT-2 split pattern: {e}")))?;
        Ok(Tokenizer::from_parts(
            None,
            PreTokenizer::ByteLevel {
                add_prefix_space: false,
                regex: Some(SplitPattern::Regex(Box::new(re))),
            },
            Model::Bpe(Box::new(model)),
            added,
            None,
            Decoder::ByteLevel,
        ))
    }

    /// Loads a SentencePiece `.model` (Unigram, or BPE as Llama / Mistral `tokenizer.model`):
    /// SentencePiece's normalizer, segmentation and decoding (id-for-id with the `sentencepiece`
    /// library), its control and unknown pieces as special tokens, and the model's BOS / EOS pieces
    /// around each sequence when asked (`<s> A </s> <s> B </s>` for pairs, B with type id 1). Token
    /// offsets cover the whole text between special tokens, since SentencePiece keeps no alignment.
    pub fn from_sentencepiece(
        path: impl AsRef<Path>,
        add_bos: bool,
        add_eos: bool,
    ) -> Result<Self> {
        let path = path.as_ref();
        let proto = SentencePieceModel::read_proto(path)?;
        let piece = |id: i32, flag: bool, what: &str| -> Result<Option<(String, u32)>> {
            if !flag {
                return Ok(None);
            }
            usize::try_from(id)
                .ok()
                .and_then(|i| proto.pieces.get(i))
                .map(|p| Some((p.piece.clone(), id as u32)))
                .ok_or_else(|| {
                    invalid(
                        path,
                        format!("add_{what}_token is set but the model has no {what} piece"),
                    )
                })
        };
        let bos = piece(proto.trainer_spec.bos_id, add_bos, "bos")?;
        let eos = piece(proto.trainer_spec.eos_id, add_eos, "eos")?;
        let added = (0u32..)
            .zip(&proto.pieces)
            .filter(|(_, p)| matches!(p.kind, PieceType::Control | PieceType::Unknown))
            .map(|(id, p)| AddedToken::special(id, &p.piece))
            .collect();
        let template = |seq: Piece, type_id: u32| -> Vec<Piece> {
            let special = |(t, id): &(String, u32)| Piece::Special {
                ids: vec![*id],
                tokens: vec![t.clone()],
                type_id,
            };
            let mut out: Vec<Piece> = bos.iter().map(special).collect();
            out.push(seq);
            out.extend(eos.iter().map(special));
            out
        };
        let post = (bos.is_some() || eos.is_some()).then(|| {
            let mut pair = template(Piece::A(0), 0);
            pair.extend(template(Piece::B(1), 1));
            PostProcessor::template(template(Piece::A(0), 0), pair)
        });
        let model = SentencePieceModel::from_proto(proto, path)?;
        Ok(Tokenizer::from_parts(
            None,
            PreTokenizer::None,
            Model::SentencePiece(Box::new(model)),
            added,
            post,
            Decoder::Metaspace {
                replacement: '\u{2581}',
                strip_first: true,
            },
        ))
    }

    /// Loads the tokenizer of a model folder: `tokenizer.json` if present, else GPT-2 style
    /// `vocab.json` + `merges.txt` ([`Self::from_vocab_merges`]), else a SentencePiece
    /// `tokenizer.model` ([`Self::from_sentencepiece`] with `add_bos_token` / `add_eos_token` from
    /// `tokenizer_config.json`, both off by default), else `vocab.txt` with `do_lower_case`,
    /// `strip_accents` and `tokenize_chinese_chars` from `tokenizer_config.json` (transformers'
    /// defaults where absent).
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let json = dir.join("tokenizer.json");
        if json.is_file() {
            return Self::from_file(json);
        }
        let config = dir.join("tokenizer_config.json");
        let value = if config.is_file() {
            let bytes = std::fs::read(&config).map_err(|e| Error::io(&config, e))?;
            serde_json::from_slice(&bytes)
                .map_err(|e| invalid(&config, format!("not valid JSON: {e}")))?
        } else {
            Value::Null
        };
        let flag = |key: &str| value.get(key).and_then(Value::as_bool);
        let (vocab_json, merges_txt) = (dir.join("vocab.json"), dir.join("merges.txt"));
        if vocab_json.is_file() && merges_txt.is_file() {
            return Self::from_vocab_merges(vocab_json, merges_txt);
        }
        let sp = dir.join("tokenizer.model");
        if sp.is_file() {
            let (bos, eos) = (flag("add_bos_token"), flag("add_eos_token"));
            return Self::from_sentencepiece(sp, bos.unwrap_or(false), eos.unwrap_or(false));
        }
        let vocab = dir.join("vocab.txt");
        if !vocab.is_file() {
            return Err(invalid(
                dir,
                "no tokenizer.json, vocab.json + merges.txt, tokenizer.model or vocab.txt in this folder",
            ));
        }
        let mut normalizer = BertNormalizer::default();
        if config.is_file() {
            normalizer.lowercase = flag("do_lower_case").unwrap_or(true);
            normalizer.strip_accents = flag("strip_accents").unwrap_or(normalizer.lowercase);
            normalizer.handle_chinese_chars = flag("tokenize_chinese_chars").unwrap_or(true);
        }
        Self::vocab_txt_with(&vocab, normalizer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocab_lines_become_ids() {
        let vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "caf", "##e"];
        let tok = bert_from_vocab(
            Path::new("vocab.txt"),
            vocab.iter().map(|s| s.to_string()).collect(),
            BertNormalizer::default(),
        )
        .expect("valid vocabulary");
        assert_eq!(tok.encode("CAFÉ [MASK]", true).ids, [2, 5, 6, 4, 3]);
    }

    #[test]
    fn missing_cls_is_an_error() {
        let err = bert_from_vocab(
            Path::new("vocab.txt"),
            vec!["[UNK]".into()],
            BertNormalizer::default(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("[CLS]"));
    }
}
