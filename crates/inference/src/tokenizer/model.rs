//! The model stage as one enum: WordPiece, BPE, Unigram, or a whole SentencePiece `.model`. It
//! answers vocabulary questions (token ↔ id, size) the same way for all; tokenizing a word is done
//! by the variant's own module, called from [`super::Tokenizer`].

use super::bpe::Bpe;
use super::unigram::Unigram;
use super::wordpiece::WordPiece;
use crate::sentencepiece::SentencePieceModel;

/// The `model` of a tokenizer.
#[derive(Debug, Clone)]
pub(crate) enum Model {
    /// Greedy longest-match-first WordPiece (BERT).
    WordPiece(WordPiece),
    /// Ranked-merge BPE (byte-level or SentencePiece-style); boxed, its tables are large.
    Bpe(Box<Bpe>),
    /// Viterbi over piece scores (SentencePiece Unigram, HF rules); boxed like BPE.
    Unigram(Box<Unigram>),
    /// A SentencePiece `.model` (Unigram or BPE) run with SentencePiece's own normalizer and
    /// rules; the
    /// tokenizer then has no normalizer or pre-tokenizer of its own.
    SentencePiece(Box<SentencePieceModel>),
}

impl Model {
    /// Id of a token string.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        match self {
            Model::WordPiece(m) => m.token_to_id(token),
            Model::Bpe(m) => m.token_to_id(token),
            Model::Unigram(m) => m.token_to_id(token),
            Model::SentencePiece(m) => m.piece_to_id(token),
        }
    }

    /// Token string of an id.
    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        match self {
            Model::WordPiece(m) => m.id_to_token(id),
            Model::Bpe(m) => m.id_to_token(id),
            Model::Unigram(m) => m.id_to_token(id),
            Model::SentencePiece(m) => m.id_to_piece(id),
        }
    }

    /// Vocabulary size.
    pub fn len(&self) -> usize {
        match self {
            Model::WordPiece(m) => m.len(),
            Model::Bpe(m) => m.len(),
            Model::Unigram(m) => m.len(),
            Model::SentencePiece(m) => m.vocab_size(),
        }
    }
}
