//! Tokenizers: text → token ids, and back. The pipeline mirrors HF `tokenizers` stage by stage
//! and is checked id-for-id against it (`tests/tokenizer_wordpiece.rs` for WordPiece,
//! `tests/tokenizer_bpe.rs` for byte-level and SentencePiece-style BPE):
//!
//! 1. added tokens (`added`): special tokens such as `[CLS]` / `<|im_start|>` are cut out first,
//!    honouring `lstrip` / `rstrip` / `single_word` / `normalized`;
//! 2. normalizer (`normalizers`, BERT's in `normalize`): `BertNormalizer`, NFC / NFD / NFKC (with
//!    HF's Unicode 9.0 behaviour, `hf_unicode`), `Lowercase`, `Prepend`, `Replace` (string or
//!    regex), `Strip`, `Precompiled` (SentencePiece charsmap), `Sequence`, tracking where every normalized byte came from so offsets point into the input;
//! 3. pre-tokenizer (`pretokenize`): `BertPreTokenizer`, regex `Split` (GPT-2, Llama 3, Qwen
//!    patterns, read from the file), `ByteLevel`, `Metaspace`, `Whitespace`, `Digits`,
//!    `Sequence`;
//! 4. model (`model`): WordPiece (`wordpiece`, greedy longest-match-first), BPE (`bpe`, ranked
//!    merges; byte-level, or per character with byte fallback) or Unigram (`unigram`, Viterbi
//!    over piece scores with HF's scoring; `tests/tokenizer_unigram.rs`);
//! 5. post-processor (`post`): truncation, then `[CLS] A [SEP]`-style templates and type ids;
//! 6. decoder (`decode`): ids back to text (`ByteLevel`, `ByteFallback`, `Fuse`, `Strip`,
//!    `Replace`, `Metaspace`, `WordPiece`, `Sequence`); `stream` decodes incrementally.
//!
//! Loaders: `tokenizer.json` (`json`, with the `type`-tagged stages in `json_stages`), BERT
//! `vocab.txt` and model folders (`load`, also [`load_tokenizer`]), and the `tokenizer.ggml.*`
//! vocabulary of a GGUF file (`gguf_vocab` for WordPiece, `gguf_bpe` for byte-level BPE).
//! A folder with only a SentencePiece `tokenizer.model` loads through [`crate::sentencepiece`]
//! (`load`). Component types not listed above are rejected with an error naming them.
//!
//! Padding is parsed from `tokenizer.json` (see [`Tokenizer::padding`]) but never applied by
//! [`Tokenizer::encode`]: packing and padding are the batcher's job. The file's truncation length
//! is the default; [`Tokenizer::with_truncation`] overrides it.
//!
//! Offsets are byte offsets into the input, HF's `Encoding::get_offsets()` (checked equal on the
//! Qwen3, Mistral and Gemma 3 files and with `ByteLevel` `trim_offsets` in
//! `tests/tokenizer_bpe.rs`, on the Unigram files in `tests/tokenizer_unigram.rs`): a byte-level
//! token holding part of a multi-byte character spans the whole character; NFC / NFD / NFKC and
//! `Precompiled` give each output character HF's alignment (a replacing character maps to the
//! first source character it replaces, an inserted one to the source character before it), and
//! `Replace` maps its replacement to the last character of the match, as HF does.
//! Where we knowingly differ from HF: offsets always fall on character boundaries (HF's offset
//! trimming adds a character count to a byte offset, which can land inside a multi-byte space
//! before an `lstrip` token); truncation sections other than `LongestFirst` / `Right` are refused at
//! load, and overflowing tokens (`stride`) are not kept.

mod added;
mod bpe;
mod decode;
mod gguf_bpe;
mod gguf_spm;
mod gguf_vocab;
mod hf_unicode;
mod json;
mod json_stages;
mod load;
mod model;
mod normalize;
mod normalizers;
mod post;
mod pretokenize;
mod stream;
mod unicode;
mod unigram;
mod vocab;
mod wordpiece;

use std::path::Path;

use added::{AddedToken, AddedVocab, Split};
use decode::Decoder;
pub use load::load_tokenizer;
use model::Model;
use normalize::NormalizedText;
use normalizers::Normalizer;
use post::{PostProcessor, SeqTokens};
use pretokenize::PreTokenizer;
pub use stream::DecodeStream;

use crate::{Error, Result};

/// The output of [`Tokenizer::encode`]: one entry per token in every vector.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Encoding {
    /// Token ids.
    pub ids: Vec<u32>,
    /// Segment (token type) ids: 0 for the first sequence, usually 1 for the second.
    pub type_ids: Vec<u32>,
    /// Token strings (`##` continuations included; an added token's matched text).
    pub tokens: Vec<String>,
    /// Byte offsets `(start, end)` into the input string the token came from; `(0, 0)` for the
    /// special tokens the post-processor inserts.
    pub offsets: Vec<(usize, usize)>,
    /// 1 for special tokens inserted by the post-processor, else 0.
    pub special_tokens_mask: Vec<u8>,
}

impl Encoding {
    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether there are no tokens.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    fn with_capacity(n: usize) -> Self {
        Self {
            ids: Vec::with_capacity(n),
            type_ids: Vec::with_capacity(n),
            tokens: Vec::with_capacity(n),
            offsets: Vec::with_capacity(n),
            special_tokens_mask: Vec::with_capacity(n),
        }
    }

    fn push(&mut self, id: u32, type_id: u32, token: String, offsets: (usize, usize), special: u8) {
        self.ids.push(id);
        self.type_ids.push(type_id);
        self.tokens.push(token);
        self.offsets.push(offsets);
        self.special_tokens_mask.push(special);
    }

    fn append(&mut self, seq: &mut SeqTokens, type_id: u32) {
        let n = seq.ids.len();
        self.ids.append(&mut seq.ids);
        self.tokens.append(&mut seq.tokens);
        self.offsets.append(&mut seq.offsets);
        self.type_ids.resize(self.type_ids.len() + n, type_id);
        self.special_tokens_mask
            .resize(self.special_tokens_mask.len() + n, 0);
    }
}

/// Side on which `tokenizer.json` asks for padding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaddingDirection {
    /// Pad after the tokens.
    Right,
    /// Pad before the tokens.
    Left,
}

/// The `padding` section of `tokenizer.json`, for callers that batch. Never applied by `encode`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Padding {
    /// `Some(n)` for the `Fixed` strategy, `None` for `BatchLongest`.
    pub fixed_length: Option<usize>,
    /// Which side to pad.
    pub direction: PaddingDirection,
    /// Round padded lengths up to a multiple of this.
    pub pad_to_multiple_of: Option<usize>,
    /// Id of the padding token.
    pub pad_id: u32,
    /// Type id of padding positions.
    pub pad_type_id: u32,
    /// The padding token.
    pub pad_token: String,
}

/// A loaded tokenizer. Cheap to share across threads (`&self` everywhere).
#[derive(Debug, Clone)]
pub struct Tokenizer {
    normalizer: Option<Normalizer>,
    pre_tokenizer: PreTokenizer,
    model: Model,
    added: AddedVocab,
    post: Option<PostProcessor>,
    decoder: Decoder,
    truncation: Option<usize>,
    padding: Option<Padding>,
}

impl Tokenizer {
    /// Loads a `tokenizer.json`. Its truncation length (if any) becomes the default
    /// [`Self::truncation`]; its padding is kept for [`Self::padding`] but not applied.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        json::parse(path, &bytes)
    }

    /// Loads a `tokenizer.json` held in memory; `path` is only used in error messages.
    pub fn from_json_bytes(bytes: &[u8], path: impl AsRef<Path>) -> Result<Self> {
        json::parse(path.as_ref(), bytes)
    }

    fn from_parts(
        normalizer: Option<Normalizer>,
        pre_tokenizer: PreTokenizer,
        mut model: Model,
        added: Vec<AddedToken>,
        post: Option<PostProcessor>,
        decoder: Decoder,
    ) -> Self {
        if let Model::Bpe(bpe) = &mut model {
            bpe.set_byte_level(pre_tokenizer.is_byte_level() || decoder.is_byte_level());
        }
        let added = AddedVocab::new(added, normalizer.as_ref());
        Self {
            normalizer,
            pre_tokenizer,
            model,
            added,
            post,
            decoder,
            truncation: None,
            padding: None,
        }
    }

    /// Sets the maximum number of tokens per encoding, special tokens included (HF
    /// `longest_first`); `None` turns truncation off. Overrides the file's setting.
    pub fn with_truncation(mut self, max_len: Option<usize>) -> Self {
        self.truncation = max_len;
        self
    }

    /// Sets how many words a BPE model caches (default 10,000, as HF; words of 256 bytes or more
    /// are never cached); 0 turns the cache off. Other models have no cache. Empties the cache.
    pub fn with_word_cache(mut self, words: usize) -> Self {
        if let Model::Bpe(bpe) = &mut self.model {
            bpe.set_cache_capacity(words);
        }
        self
    }

    /// In-place form of [`Self::with_truncation`].
    pub fn set_truncation(&mut self, max_len: Option<usize>) {
        self.truncation = max_len;
    }

    /// The truncation length `encode` uses (the file's, until changed).
    pub fn truncation(&self) -> Option<usize> {
        self.truncation
    }

    fn set_file_padding(&mut self, padding: Option<Padding>) {
        self.padding = padding;
    }

    /// The padding settings of `tokenizer.json`, if it has any. `encode` never pads.
    pub fn padding(&self) -> Option<&Padding> {
        self.padding.as_ref()
    }

    /// Encodes one sequence, truncated to [`Self::truncation`].
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Encoding {
        self.encode_with(text, None, add_special_tokens, self.truncation)
    }

    /// Encodes a pair of sequences (second one with type id 1 for BERT), truncated to
    /// [`Self::truncation`].
    pub fn encode_pair(&self, a: &str, b: &str, add_special_tokens: bool) -> Encoding {
        self.encode_with(a, Some(b), add_special_tokens, self.truncation)
    }

    /// Encodes one or two sequences with an explicit truncation length (`None` = no truncation).
    ///
    /// Truncation is HF `longest_first`: the length counts the special tokens that will be
    /// added; for a pair, tokens come off the longer sequence first. Like HF, a `max_len` smaller
    /// than the number of special tokens disables truncation.
    pub fn encode_with(
        &self,
        a: &str,
        b: Option<&str>,
        add_special_tokens: bool,
        max_len: Option<usize>,
    ) -> Encoding {
        let n_added = match (&self.post, add_special_tokens) {
            (Some(p), true) => p.added_tokens(b.is_some()),
            _ => 0,
        };
        let budget = max_len.and_then(|m| m.checked_sub(n_added));
        // A single sequence keeps a prefix, so tokenizing can stop at the budget.
        let limit = if b.is_none() {
            budget.unwrap_or(usize::MAX)
        } else {
            usize::MAX
        };
        let mut seq_a = SeqTokens::default();
        self.encode_sequence(a, limit, &mut seq_a);
        let mut seq_b = b.map(|b| {
            let mut s = SeqTokens::default();
            self.encode_sequence(b, usize::MAX, &mut s);
            s
        });
        if let Some(budget) = budget {
            let (na, nb) =
                post::longest_first(seq_a.len(), seq_b.as_ref().map(SeqTokens::len), budget);
            seq_a.truncate(na);
            if let (Some(s), Some(nb)) = (seq_b.as_mut(), nb) {
                s.truncate(nb);
            }
        }
        match &self.post {
            Some(p) => p.process(seq_a, seq_b, add_special_tokens),
            None => post::concat(seq_a, seq_b),
        }
    }

    /// Tokenizes one input sequence (no special tokens, no truncation beyond `limit` tokens).
    fn encode_sequence(&self, text: &str, limit: usize, out: &mut SeqTokens) {
        let mut splits = Vec::new();
        if self.added.has_raw() {
            self.added.split_raw(text, &mut splits);
        } else if !text.is_empty() {
            splits.push(Split::Text(0, text.len()));
        }
        let mut norm = NormalizedText::default();
        let mut inner = Vec::new();
        let mut pieces = Vec::new();
        for split in splits {
            if out.len() >= limit {
                break;
            }
            match split {
                Split::Added(index, start, end) => {
                    self.push_added(index, &text[start..end], (start, end), out);
                }
                Split::Text(start, end) => {
                    let piece = &text[start..end];
                    match &self.normalizer {
                        Some(n) => n.normalize(piece, start, &mut norm),
                        None => {
                            norm.clear();
                            norm.push_identity(piece, start);
                        }
                    }
                    if !self.added.has_normalized() {
                        self.tokenize_words(&norm, 0, norm.text.len(), limit, &mut pieces, out);
                        continue;
                    }
                    inner.clear();
                    self.added.split_normalized(&norm.text, &mut inner);
                    for &s in &inner {
                        match s {
                            Split::Added(index, s, e) => {
                                let orig = norm.original_range(s, e);
                                self.push_added(index, &norm.text[s..e], orig, out);
                            }
                            Split::Text(s, e) => {
                                self.tokenize_words(&norm, s, e, limit, &mut pieces, out);
                            }
                        }
                    }
                }
            }
        }
        out.truncate(limit);
    }

    fn push_added(&self, index: usize, text: &str, orig: (usize, usize), out: &mut SeqTokens) {
        if let Some(t) = self.added.token(index) {
            out.ids.push(t.id);
            out.tokens.push(text.to_owned());
            out.offsets.push(orig);
        }
    }

    /// Pre-tokenizes `norm.text[from..to]` and runs the model on each word. Pre-tokenizers
    /// that rewrite text (`ByteLevel` with `add_prefix_space`, `Metaspace`) work on a rewritten
    /// copy that keeps the alignment to the input.
    fn tokenize_words(
        &self,
        norm: &NormalizedText,
        from: usize,
        to: usize,
        limit: usize,
        pieces: &mut Vec<wordpiece::Piece>,
        out: &mut SeqTokens,
    ) {
        if let Some(rewritten) = self.pre_tokenizer.rewrite(norm, from, to) {
            let end = rewritten.text.len();
            return self.model_words(&rewritten, 0, end, limit, pieces, out);
        }
        self.model_words(norm, from, to, limit, pieces, out);
    }

    /// Splits `norm.text[from..to]` into words and runs the model on each.
    fn model_words(
        &self,
        norm: &NormalizedText,
        from: usize,
        to: usize,
        limit: usize,
        pieces: &mut Vec<wordpiece::Piece>,
        out: &mut SeqTokens,
    ) {
        let text = &norm.text[from..to];
        let model = match &self.model {
            Model::WordPiece(m) => m,
            Model::Bpe(m) => return self.bpe_words(m, norm, from, to, limit, out),
            Model::Unigram(m) => return self.unigram_words(m, norm, from, to, limit, out),
            Model::SentencePiece(m) => {
                // SentencePiece normalizes internally and keeps no alignment: every token points
                // at the whole text span.
                let span = norm.original_range(from, to);
                for (id, piece) in m.encode_with_pieces(text) {
                    out.ids.push(id);
                    out.tokens.push(piece);
                    out.offsets.push(span);
                }
                return;
            }
        };
        let prefix = model.prefix();
        self.pre_tokenizer.split(text, |ws, we| {
            if out.len() >= limit {
                return;
            }
            let word = &text[ws..we];
            pieces.clear();
            model.tokenize_word(word, pieces);
            for p in pieces.iter() {
                let token = if p.unk {
                    model.unk_token().to_owned()
                } else if p.start == 0 {
                    word[p.start..p.end].to_owned()
                } else {
                    let mut s = String::with_capacity(prefix.len() + p.end - p.start);
                    s.push_str(prefix);
                    s.push_str(&word[p.start..p.end]);
                    s
                };
                out.ids.push(p.id);
                out.tokens.push(token);
                out.offsets
                    .push(norm.original_range(from + ws + p.start, from + ws + p.end));
            }
        });
    }

    /// [`Self::tokenize_words`] for a BPE model.
    fn bpe_words(
        &self,
        model: &bpe::Bpe,
        norm: &NormalizedText,
        from: usize,
        to: usize,
        limit: usize,
        out: &mut SeqTokens,
    ) {
        let text = &norm.text[from..to];
        let mut pieces = Vec::new();
        self.pre_tokenizer.split(text, |ws, we| {
            if out.len() >= limit {
                return;
            }
            let word = &text[ws..we];
            pieces.clear();
            model.tokenize_word(word, &mut pieces);
            for p in &pieces {
                let token = model.id_to_token(p.id).unwrap_or_default().to_owned();
                out.ids.push(p.id);
                out.tokens.push(token);
                out.offsets
                    .push(norm.original_range(from + ws + p.start, from + ws + p.end));
            }
        });
    }

    /// [`Self::tokenize_words`] for a Unigram model. Token strings are HF's: the segment text
    /// (a fused run of unknown characters stays as its text), or `<0xXX>` for byte fallback.
    fn unigram_words(
        &self,
        model: &unigram::Unigram,
        norm: &NormalizedText,
        from: usize,
        to: usize,
        limit: usize,
        out: &mut SeqTokens,
    ) {
        let text = &norm.text[from..to];
        let mut pieces = Vec::new();
        self.pre_tokenizer.split(text, |ws, we| {
            if out.len() >= limit {
                return;
            }
            let word = &text[ws..we];
            model.tokenize_word(word, &mut pieces);
            for p in &pieces {
                let token = match p.byte {
                    Some(b) => format!("<0x{b:02X}>"),
                    None => word[p.start..p.end].to_owned(),
                };
                out.ids.push(p.id);
                out.tokens.push(token);
                out.offsets
                    .push(norm.original_range(from + ws + p.start, from + ws + p.end));
            }
        });
    }

    /// Runs only the normalizer (HF's `normalizer.normalize_str`); the identity without one.
    pub fn normalize(&self, text: &str) -> String {
        match &self.normalizer {
            Some(n) => n.normalize_str(text),
            None => text.to_owned(),
        }
    }

    /// Turns ids back into text. Unknown ids are skipped; with `skip_special_tokens`, so are
    /// special added tokens.
    /// A SentencePiece `.model` tokenizer decodes as `SentencePieceProcessor::Decode` does.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> String {
        if let Model::SentencePiece(m) = &self.model {
            let ids: Vec<u32> = ids
                .iter()
                .copied()
                .filter(|&id| {
                    !skip_special_tokens
                        || !self
                            .id_to_token(id)
                            .is_some_and(|t| self.added.is_special_token(t))
                })
                .collect();
            return m.decode(&ids);
        }
        let tokens = ids
            .iter()
            .filter_map(|&id| self.id_to_token(id))
            .filter(|t| !skip_special_tokens || !self.added.is_special_token(t));
        self.decoder.decode(tokens)
    }

    /// The bytes token `id` adds to decoded text in the middle of a sequence, and whether it
    /// is a special token (those decode to nothing unless asked for); `None` for an id
    /// without a token. Grammar-constrained decoding matches tokens by these bytes.
    pub fn token_bytes(&self, id: u32) -> Option<(Vec<u8>, bool)> {
        if let Some(t) = self.added.id_to_token(id) {
            return Some((t.as_bytes().to_vec(), self.added.is_special_token(t)));
        }
        let t = self.model.id_to_token(id)?;
        if let Model::SentencePiece(m) = &self.model {
            return Some((
                m.token_bytes(id).unwrap_or_else(|| t.as_bytes().to_vec()),
                false,
            ));
        }
        Some((self.decoder.token_bytes(t), false))
    }

    /// The token string of `id` (added tokens first, then the model vocabulary).
    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        self.added
            .id_to_token(id)
            .or_else(|| self.model.id_to_token(id))
    }

    /// The id of `token` (added tokens first, then the model vocabulary).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.added
            .token_to_id(token)
            .or_else(|| self.model.token_to_id(token))
    }

    /// Number of distinct tokens: the model vocabulary plus added tokens not already in it.
    pub fn vocab_size(&self) -> usize {
        let extra = self
            .added
            .tokens()
            .iter()
            .filter(|t| self.model.token_to_id(&t.content).is_none())
            .map(|t| t.content.as_str())
            .collect::<std::collections::HashSet<_>>()
            .len();
        self.model.len() + extra
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Tokenizer {
        let vocab = [
            "[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello", "world", "##s", "!",
        ];
        let model = wordpiece::WordPiece::new(
            vocab
                .iter()
                .enumerate()
                .map(|(i, t)| (t.to_string(), i as u32)),
            "[UNK]",
            "##",
            100,
        )
        .expect("valid vocabulary");
        let added = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
            .iter()
            .enumerate()
            .map(|(i, t)| AddedToken::special(i as u32, t))
            .collect();
        let post = PostProcessor::bert(("[CLS]".into(), 2), ("[SEP]".into(), 3));
        Tokenizer::from_parts(
            Some(Normalizer::Bert(normalize::BertNormalizer::default())),
            PreTokenizer::Bert,
            Model::WordPiece(model),
            added,
            Some(post),
            Decoder::WordPiece {
                prefix: "##".into(),
                cleanup: true,
            },
        )
    }

    #[test]
    fn encode_single_and_pair() {
        let t = tiny();
        let e = t.encode("Hello worlds!", true);
        assert_eq!(e.ids, [2, 4, 5, 6, 7, 3]);
        assert_eq!(e.tokens, ["[CLS]", "hello", "world", "##s", "!", "[SEP]"]);
        assert_eq!(
            e.offsets,
            [(0, 0), (0, 5), (6, 11), (11, 12), (12, 13), (0, 0)]
        );
        let e = t.encode_pair("hello", "xyz [SEP]", true);
        assert_eq!(e.ids, [2, 4, 3, 1, 3, 3]);
        assert_eq!(e.type_ids, [0, 0, 0, 1, 1, 1]);
    }

    #[test]
    fn truncation_counts_special_tokens() {
        let t = tiny().with_truncation(Some(4));
        assert_eq!(t.encode("hello world hello", true).ids, [2, 4, 5, 3]);
        assert_eq!(t.encode("hello world hello", false).ids, [4, 5, 4]);
    }

    #[test]
    fn tokenizer_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Tokenizer>();
        check::<Encoding>();
    }

    #[test]
    fn decode_skips_specials() {
        let t = tiny();
        assert_eq!(t.decode(&[2, 4, 5, 6, 7, 3, 99], true), "hello worlds!");
        assert_eq!(t.decode(&[2, 4, 3], false), "[CLS] hello [SEP]");
        assert_eq!(t.vocab_size(), 8);
    }
}
