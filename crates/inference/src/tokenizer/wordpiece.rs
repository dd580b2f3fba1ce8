//! The WordPiece model: greedy longest-match-first over a vocabulary, with a continuing-subword
//! prefix (`##`) for pieces that do not start a word, `[UNK]` for a word that cannot be covered or
//! that is longer than `max_input_chars_per_word` characters.
//!
//! Lookups never allocate: the vocabulary is held twice, once keyed by the full token and once,
//! for tokens that carry the prefix, keyed by the rest of the token, so `word[start..end]` is
//! looked up as a plain `&str`. Candidate ends are capped at the longest token's length. This
//! module does not normalize or split text.

use super::vocab::{IdTable, VocabMap};

/// One token produced by [`WordPiece::tokenize_word`]: id and byte range within the word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    /// Vocabulary id.
    pub id: u32,
    /// Start byte within the word.
    pub start: usize,
    /// End byte within the word.
    pub end: usize,
    /// The word could not be tokenized: this is the unknown token covering all of it.
    pub unk: bool,
}

/// Why a vocabulary cannot make a WordPiece model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum VocabError {
    /// No tokens at all.
    Empty,
    /// The unknown token (named) is not in the vocabulary.
    MissingUnk(String),
}

impl std::fmt::Display for VocabError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VocabError::Empty => write!(f, "the WordPiece vocabulary is empty"),
            VocabError::MissingUnk(t) => {
                write!(
                    f,
                    "the unknown token `{t}` is not in the WordPiece vocabulary"
                )
            }
        }
    }
}

/// A loaded WordPiece vocabulary and its settings.
#[derive(Debug, Clone)]
pub(crate) struct WordPiece {
    /// Full token string → id.
    vocab: VocabMap,
    /// For tokens that start with the prefix: the rest of the token → id.
    continuation: VocabMap,
    /// id → token (None for ids the vocabulary skips).
    id_to_token: IdTable,
    unk_id: u32,
    unk_token: String,
    prefix: String,
    max_input_chars_per_word: usize,
    /// Longest key in `vocab` / `continuation`, in bytes.
    max_len: usize,
    max_continuation_len: usize,
}

impl WordPiece {
    /// Builds the model. Fails (with the reason) if the vocabulary is empty or lacks the unknown
    /// token.
    pub fn new(
        vocab: impl IntoIterator<Item = (String, u32)>,
        unk_token: &str,
        prefix: &str,
        max_input_chars_per_word: usize,
    ) -> Result<Self, VocabError> {
        let entries: Vec<(String, u32)> = vocab.into_iter().collect();
        let map: VocabMap = entries
            .iter()
            .map(|(t, id)| (t.as_str().into(), *id))
            .collect();
        if map.is_empty() {
            return Err(VocabError::Empty);
        }
        let id_to_token = IdTable::reverse(entries, &map);
        let Some(&unk_id) = map.get(unk_token) else {
            return Err(VocabError::MissingUnk(unk_token.to_owned()));
        };
        // With an empty prefix a continuation is looked up as the bare string, like a word start.
        let mut continuation = VocabMap::default();
        for (token, &id) in &map {
            if let Some(rest) = token.strip_prefix(prefix) {
                continuation.insert(rest.into(), id);
            }
        }
        let max_len = map.keys().map(|k| k.len()).max().unwrap_or(0);
        let max_continuation_len = continuation.keys().map(|k| k.len()).max().unwrap_or(0);
        Ok(Self {
            vocab: map,
            continuation,
            id_to_token,
            unk_id,
            unk_token: unk_token.to_owned(),
            prefix: prefix.to_owned(),
            max_input_chars_per_word,
            max_len,
            max_continuation_len,
        })
    }

    /// The id of `token`, if it is in the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.vocab.get(token).copied()
    }

    /// The token of `id`, if any.
    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        self.id_to_token.get(id)
    }

    /// Number of distinct tokens in the vocabulary.
    pub fn len(&self) -> usize {
        self.vocab.len()
    }

    /// The unknown token.
    pub fn unk_token(&self) -> &str {
        &self.unk_token
    }

    /// The continuing-subword prefix (`##`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Tokenizes one pre-tokenized word (non-empty) and appends its pieces to `out`.
    pub fn tokenize_word(&self, word: &str, out: &mut Vec<Piece>) {
        let unk = Piece {
            id: self.unk_id,
            start: 0,
            end: word.len(),
            unk: true,
        };
        // chars <= bytes, so the char count is only needed for long words.
        if word.len() > self.max_input_chars_per_word
            && word.chars().count() > self.max_input_chars_per_word
        {
            out.push(unk);
            return;
        }
        if let Some(&id) = self.vocab.get(word) {
            out.push(Piece {
                id,
                start: 0,
                end: word.len(),
                unk: false,
            });
            return;
        }
        let mark = out.len();
        let mut start = 0;
        while start < word.len() {
            let (map, cap) = if start == 0 {
                (&self.vocab, self.max_len)
            } else {
                (&self.continuation, self.max_continuation_len)
            };
            let mut end = word.len().min(start.saturating_add(cap));
            while !word.is_char_boundary(end) {
                end -= 1;
            }
            let mut found = None;
            while end > start {
                if let Some(&id) = map.get(&word[start..end]) {
                    found = Some(id);
                    break;
                }
                end -= 1;
                while !word.is_char_boundary(end) {
                    end -= 1;
                }
            }
            match found {
                Some(id) => {
                    out.push(Piece {
                        id,
                        start,
                        end,
                        unk: false,
                    });
                    start = end;
                }
                None => {
                    out.truncate(mark);
                    out.push(unk);
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> WordPiece {
        let toks = ["[UNK]", "un", "##aff", "##able", "a", "##b", "é"];
        WordPiece::new(
            toks.iter()
                .enumerate()
                .map(|(i, t)| (t.to_string(), i as u32)),
            "[UNK]",
            "##",
            5,
        )
        .expect("valid test vocabulary")
    }

    fn ids(m: &WordPiece, w: &str) -> Vec<u32> {
        let mut out = Vec::new();
        m.tokenize_word(w, &mut out);
        out.iter().map(|p| p.id).collect()
    }

    #[test]
    fn greedy_longest_match() {
        let m = model();
        assert_eq!(ids(&m, "unaffable"), [0], "9 chars > max 5 → [UNK]");
        assert_eq!(ids(&m, "unaff"), [1, 2]);
        assert_eq!(ids(&m, "abb"), [4, 5, 5]);
        assert_eq!(ids(&m, "abx"), [0], "uncoverable → one [UNK] for the word");
        assert_eq!(ids(&m, "é"), [6]);
    }

    #[test]
    fn missing_unk_is_an_error() {
        let err = WordPiece::new([("a".to_string(), 0)], "[UNK]", "##", 100).unwrap_err();
        assert!(err.to_string().contains("[UNK]"));
    }

    #[test]
    fn id_table_keeps_dense_and_sparse_ids() {
        // An id near 2^32 (a fuzzed tokenizer.json once asked for a table of that many slots).
        let vocab = [("[UNK]", 0), ("a", 1), ("b", 4_000_000_000), ("a2", 1)];
        let m = WordPiece::new(vocab.map(|(t, id)| (t.to_string(), id)), "[UNK]", "##", 100)
            .expect("valid test vocabulary");
        assert!(matches!(m.id_to_token, IdTable::Sparse(_)));
        assert_eq!(m.id_to_token(4_000_000_000), Some("b"));
        assert_eq!(
            m.id_to_token(1),
            Some("a2"),
            "one id, two strings: the later one"
        );
        assert_eq!(m.id_to_token(2), None);
        let dense = model();
        assert!(matches!(dense.id_to_token, IdTable::Dense(_)));
        assert_eq!(dense.id_to_token(6), Some("é"));
        assert_eq!(dense.id_to_token(7), None);
    }
}
