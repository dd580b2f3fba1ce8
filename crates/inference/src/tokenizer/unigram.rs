//! The `Unigram` model of `tokenizer.json`, segmenting exactly as HF `tokenizers` does.
//!
//! It reuses the piece trie of [`crate::sentencepiece::unigram`] but follows HF's
//! `Unigram::encode_optimized` rather than SentencePiece where the two differ: path scores are
//! summed in `f64`; every vocabulary entry (unknown, control and byte pieces included) is in the
//! trie; a character no single piece covers costs `min(all scores) - 10`; consecutive unknown
//! segments are fused; and each resulting string is looked up in the vocabulary again (the last
//! duplicate wins), falling back to `<0xXX>` byte pieces when `byte_fallback` is on and every byte
//! has one, else to the unknown id. Normalization and pre-tokenization happen before this module;
//! the SentencePiece (`.model`) path keeps its own rules in `sentencepiece`.

use std::collections::HashMap;

use crate::sentencepiece::model_proto::PieceType;
use crate::sentencepiece::unigram::{child, densify, insert, piece_at, TrieNode};

/// Penalty below the lowest score given to the unknown piece (HF `K_UNK_PENALTY`).
const UNK_PENALTY: f64 = 10.0;

/// One token of a word: its id, its byte range in the word, and the byte it spells when it is a
/// byte-fallback piece.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UnigramPiece {
    /// Token id.
    pub id: u32,
    /// Start of the segment in the word (bytes).
    pub start: usize,
    /// End of the segment in the word (bytes, exclusive).
    pub end: usize,
    /// `Some(b)` for a `<0xXX>` byte-fallback token.
    pub byte: Option<u8>,
}

/// A `tokenizer.json` Unigram model.
#[derive(Debug, Clone)]
pub(crate) struct Unigram {
    /// `(piece, score)` in id order.
    vocab: Vec<(String, f64)>,
    /// Piece to id; for duplicate pieces the last id wins, as in HF.
    piece_to_id: HashMap<String, u32>,
    /// Trie over every non-empty piece; node values hold the `piece_to_id` id.
    trie: Vec<TrieNode>,
    /// Id of the unknown piece.
    unk_id: u32,
    /// Score of an unknown character: the lowest score minus 10.
    unk_score: f64,
    /// Spell unknown strings with `<0xXX>` pieces when all their bytes have one.
    byte_fallback: bool,
}

impl Unigram {
    /// Builds the model from `(piece, score)` pairs in id order.
    pub fn new(
        vocab: Vec<(String, f64)>,
        unk_id: u32,
        byte_fallback: bool,
    ) -> Result<Self, String> {
        if vocab.is_empty() {
            return Err("the Unigram vocabulary is empty".into());
        }
        let n = u32::try_from(vocab.len()).map_err(|_| "too many pieces".to_string())?;
        if unk_id >= n {
            return Err(format!(
                "unk_id {unk_id} is outside the vocabulary ({n} pieces)"
            ));
        }
        let mut piece_to_id = HashMap::with_capacity(vocab.len());
        let mut min_score = f64::INFINITY;
        for (id, (piece, score)) in (0..n).zip(&vocab) {
            piece_to_id.insert(piece.clone(), id);
            min_score = min_score.min(*score);
        }
        let mut trie = vec![TrieNode::default()];
        for (piece, &id) in &piece_to_id {
            if !piece.is_empty() {
                insert(&mut trie, piece.as_bytes(), (id, 0.0, PieceType::Normal));
            }
        }
        densify(&mut trie);
        Ok(Self {
            vocab,
            piece_to_id,
            trie,
            unk_id,
            unk_score: min_score - UNK_PENALTY,
            byte_fallback,
        })
    }

    /// Id of a piece.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.piece_to_id.get(token).copied()
    }

    /// Piece of an id.
    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        self.vocab.get(id as usize).map(|(p, _)| p.as_str())
    }

    /// Vocabulary size.
    pub fn len(&self) -> usize {
        self.vocab.len()
    }

    /// The best segmentation of `word` as `(start, end, is_unknown)`, unknown runs fused.
    fn segments(&self, word: &str) -> Vec<(usize, usize)> {
        let bytes = word.as_bytes();
        let size = bytes.len();
        // best[i]: (score of the best path ending at byte i, start of its last piece, its id).
        let mut best: Vec<(f64, usize, u32)> = vec![(0.0, usize::MAX, 0); size + 1];
        let mut starts_at = 0;
        while starts_at < size {
            let here = best[starts_at].0;
            let mblen = word[starts_at..].chars().next().map_or(1, char::len_utf8);
            let mut has_single_node = false;
            let mut node = 0usize;
            for (key_pos, &b) in bytes.iter().enumerate().skip(starts_at) {
                let Some(next) = child(&self.trie, node, b) else {
                    break;
                };
                node = next;
                let Some((id, _, _)) = piece_at(&self.trie, node) else {
                    continue;
                };
                let end = key_pos + 1;
                let score = self.vocab.get(id as usize).map_or(0.0, |v| v.1);
                let candidate = score + here;
                let target = &mut best[end];
                if target.1 == usize::MAX || candidate > target.0 {
                    *target = (candidate, starts_at, id);
                }
                if end - starts_at == mblen {
                    has_single_node = true;
                }
            }
            if !has_single_node {
                let candidate = self.unk_score + here;
                let target = &mut best[starts_at + mblen];
                if target.1 == usize::MAX || candidate > target.0 {
                    *target = (candidate, starts_at, self.unk_id);
                }
            }
            starts_at += mblen;
        }
        // Walk back; consecutive unknown segments become one string.
        let mut out: Vec<(usize, usize)> = Vec::new();
        let mut end = size;
        let mut unk_run_end: Option<usize> = None;
        while end > 0 {
            let (_, start, id) = best[end];
            if start >= end {
                break;
            }
            if id == self.unk_id {
                unk_run_end.get_or_insert(end);
            } else {
                if let Some(run_end) = unk_run_end.take() {
                    out.push((end, run_end));
                }
                out.push((start, end));
            }
            end = start;
        }
        if let Some(run_end) = unk_run_end {
            out.push((end, run_end));
        }
        out.reverse();
        out
    }

    /// Tokenizes one pre-tokenized word into `out` (cleared first).
    pub fn tokenize_word(&self, word: &str, out: &mut Vec<UnigramPiece>) {
        out.clear();
        for (start, end) in self.segments(word) {
            let text = &word[start..end];
            if let Some(id) = self.token_to_id(text) {
                out.push(UnigramPiece {
                    id,
                    start,
                    end,
                    byte: None,
                });
                continue;
            }
            if self.byte_fallback {
                let ids: Option<Vec<u32>> = text
                    .bytes()
                    .map(|b| self.token_to_id(&format!("<0x{b:02X}>")))
                    .collect();
                if let Some(ids) = ids {
                    out.extend(
                        ids.into_iter()
                            .zip(text.bytes())
                            .map(|(id, b)| UnigramPiece {
                                id,
                                start,
                                end,
                                byte: Some(b),
                            }),
                    );
                    continue;
                }
            }
            out.push(UnigramPiece {
                id: self.unk_id,
                start,
                end,
                byte: None,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toy(byte_fallback: bool) -> Unigram {
        let vocab = [
            ("<unk>", 0.0),
            ("a", -1.0),
            ("b", -2.0),
            ("ab", -2.5),
            ("<0x41>", -9.0),
        ];
        let vocab = vocab.iter().map(|(p, s)| (p.to_string(), *s)).collect();
        Unigram::new(vocab, 0, byte_fallback).expect("valid vocabulary")
    }

    fn ids(m: &Unigram, word: &str) -> Vec<u32> {
        let mut out = Vec::new();
        m.tokenize_word(word, &mut out);
        out.iter().map(|p| p.id).collect()
    }

    #[test]
    fn best_path_and_fused_unknowns() {
        let m = toy(false);
        assert_eq!(ids(&m, "abab"), [3, 3]);
        assert_eq!(ids(&m, "a\u{e9}\u{e8}b"), [1, 0, 2]);
        assert_eq!(ids(&m, ""), [0u32; 0]);
    }

    #[test]
    fn byte_fallback_needs_every_byte() {
        let m = toy(true);
        assert_eq!(ids(&m, "aAb"), [1, 4, 2]);
        assert_eq!(ids(&m, "a\u{e9}"), [1, 0]);
        assert!(Unigram::new(Vec::new(), 0, false).is_err());
    }
}
