//! Added tokens (`added_tokens` in `tokenizer.json`): special tokens such as `[CLS]`, `<mask>`
//! that are cut out of the text before the model sees it, so they are never broken up.
//!
//! Matching follows HF `tokenizers`: tokens with `normalized: false` are searched in the raw
//! input, tokens with `normalized: true` (as their normalized form) in each normalized piece that
//! is left. The search is leftmost-longest and non-overlapping, then each match honours
//! `single_word` (no word character right before or after), `lstrip` / `rstrip` (the match
//! swallows the whitespace on that side). This module finds matches; it does not normalize or
//! build encodings.

use std::collections::{HashMap, HashSet};

use super::normalizers::Normalizer;
use super::unicode::is_word_char;

/// One entry of `added_tokens`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AddedToken {
    /// Its id.
    pub id: u32,
    /// The text it matches.
    pub content: String,
    /// Special tokens are skipped by `decode(.., skip_special_tokens = true)`.
    pub special: bool,
    /// Match only when not inside a word.
    pub single_word: bool,
    /// Swallow whitespace on the left.
    pub lstrip: bool,
    /// Swallow whitespace on the right.
    pub rstrip: bool,
    /// Match against normalized text (its normalized form) rather than the raw input.
    pub normalized: bool,
}

impl AddedToken {
    /// A special, non-normalized token without stripping (BERT's `[CLS]`, `[SEP]`, ...).
    pub fn special(id: u32, content: &str) -> Self {
        Self {
            id,
            content: content.to_owned(),
            special: true,
            single_word: false,
            lstrip: false,
            rstrip: false,
            normalized: false,
        }
    }
}

/// A piece of a split: either plain text or an added token, as byte ranges of the searched text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Split {
    /// Text the model still has to tokenize.
    Text(usize, usize),
    /// An added token (index into the vocabulary's token list) covering these bytes.
    Added(usize, usize, usize),
}

/// Leftmost-longest matcher over a handful of patterns, indexed by first byte.
#[derive(Debug, Clone, Default)]
struct Matcher {
    /// (pattern, index of its token), in priority order.
    patterns: Vec<(String, usize)>,
    /// For each first byte, pattern indices sorted longest first.
    by_first: Vec<Vec<usize>>,
}

impl Matcher {
    fn new(patterns: Vec<(String, usize)>) -> Self {
        let mut by_first = vec![Vec::new(); 256];
        for (i, (p, _)) in patterns.iter().enumerate() {
            if let Some(&b) = p.as_bytes().first() {
                by_first[b as usize].push(i);
            }
        }
        for list in &mut by_first {
            // Stable: equal lengths keep priority order.
            list.sort_by_key(|&i| std::cmp::Reverse(patterns[i].0.len()));
        }
        Self { patterns, by_first }
    }

    fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// The leftmost match at or after `from`, longest first: (start, end, token index).
    fn find(&self, text: &str, from: usize) -> Option<(usize, usize, usize)> {
        let bytes = text.as_bytes();
        for i in from..bytes.len() {
            for &p in &self.by_first[bytes[i] as usize] {
                let (pat, token) = &self.patterns[p];
                if bytes[i..].starts_with(pat.as_bytes()) {
                    return Some((i, i + pat.len(), *token));
                }
            }
        }
        None
    }
}

/// The added vocabulary of a tokenizer.
#[derive(Debug, Clone, Default)]
pub(crate) struct AddedVocab {
    tokens: Vec<AddedToken>,
    by_content: HashMap<String, u32>,
    by_id: HashMap<u32, usize>,
    special_contents: HashSet<String>,
    raw: Matcher,
    normalized: Matcher,
}

impl AddedVocab {
    /// Builds the matchers. Normalized tokens are matched through their form under `normalizer`.
    pub fn new(tokens: Vec<AddedToken>, normalizer: Option<&Normalizer>) -> Self {
        let mut by_content = HashMap::new();
        let mut by_id = HashMap::new();
        let mut special_contents = HashSet::new();
        for (i, t) in tokens.iter().enumerate() {
            by_content.insert(t.content.clone(), t.id);
            by_id.insert(t.id, i);
            if t.special {
                special_contents.insert(t.content.clone());
            }
        }
        // HF puts special tokens first, then the others, each in file order.
        let order = tokens
            .iter()
            .enumerate()
            .filter(|(_, t)| t.special)
            .chain(tokens.iter().enumerate().filter(|(_, t)| !t.special));
        let (mut raw, mut norm) = (Vec::new(), Vec::new());
        let mut seen = HashSet::new();
        for (i, t) in order {
            if t.content.is_empty() || !seen.insert((t.normalized, t.content.as_str())) {
                continue;
            }
            if t.normalized {
                let pattern = match normalizer {
                    Some(n) => n.normalize_str(&t.content),
                    None => t.content.clone(),
                };
                if !pattern.is_empty() {
                    norm.push((pattern, i));
                }
            } else {
                raw.push((t.content.clone(), i));
            }
        }
        Self {
            raw: Matcher::new(raw),
            normalized: Matcher::new(norm),
            tokens,
            by_content,
            by_id,
            special_contents,
        }
    }

    /// The token at `index` (as found in a [`Split::Added`]).
    pub fn token(&self, index: usize) -> Option<&AddedToken> {
        self.tokens.get(index)
    }

    /// All added tokens, in file order.
    pub fn tokens(&self) -> &[AddedToken] {
        &self.tokens
    }

    /// The id of an added token with this content.
    pub fn token_to_id(&self, content: &str) -> Option<u32> {
        self.by_content.get(content).copied()
    }

    /// The content of the added token with this id.
    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        self.by_id
            .get(&id)
            .and_then(|&i| self.tokens.get(i))
            .map(|t| t.content.as_str())
    }

    /// Whether `token` is the content of a special added token.
    pub fn is_special_token(&self, token: &str) -> bool {
        self.special_contents.contains(token)
    }

    /// Whether any token is matched against the raw input.
    pub fn has_raw(&self) -> bool {
        !self.raw.is_empty()
    }

    /// Whether any token is matched against normalized text.
    pub fn has_normalized(&self) -> bool {
        !self.normalized.is_empty()
    }

    /// Splits raw input text around the non-normalized added tokens, appending to `out`.
    pub fn split_raw(&self, text: &str, out: &mut Vec<Split>) {
        self.split(&self.raw, text, out);
    }

    /// Splits one normalized piece around the normalized added tokens, appending to `out`.
    pub fn split_normalized(&self, text: &str, out: &mut Vec<Split>) {
        self.split(&self.normalized, text, out);
    }

    fn split(&self, matcher: &Matcher, text: &str, out: &mut Vec<Split>) {
        let mut done = 0; // end of the last emitted piece
        let mut from = 0; // where the search resumes (end of the last raw match)
        while let Some((mut start, mut stop, index)) = matcher.find(text, from) {
            from = stop;
            let Some(token) = self.tokens.get(index) else {
                continue;
            };
            if token.single_word {
                let before_ok = !text[..start].chars().next_back().is_some_and(is_word_char);
                let after_ok = !text[stop..].chars().next().is_some_and(is_word_char);
                if !(before_ok && after_ok) {
                    continue;
                }
            }
            if token.lstrip {
                let trimmed = text[..start].trim_end_matches(char::is_whitespace).len();
                start = trimmed.max(done);
            }
            if token.rstrip {
                let rest = &text[stop..];
                stop += rest.len() - rest.trim_start_matches(char::is_whitespace).len();
            }
            if done < start {
                out.push(Split::Text(done, start));
            }
            out.push(Split::Added(index, start, stop));
            done = stop;
        }
        if done < text.len() {
            out.push(Split::Text(done, text.len()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab() -> AddedVocab {
        let mut mask = AddedToken::special(5, "<mask>");
        mask.lstrip = true;
        let mut unk = AddedToken::special(3, "<unk>");
        unk.normalized = true;
        let mut word = AddedToken::special(7, "ab");
        word.single_word = true;
        word.special = false;
        let toks = vec![AddedToken::special(1, "[CLS]"), mask, unk, word];
        AddedVocab::new(
            toks,
            Some(&Normalizer::Bert(
                super::super::normalize::BertNormalizer::default(),
            )),
        )
    }

    fn split_raw(v: &AddedVocab, s: &str) -> Vec<Split> {
        let mut out = Vec::new();
        v.split_raw(s, &mut out);
        out
    }

    #[test]
    fn raw_split_with_lstrip() {
        let v = vocab();
        assert_eq!(
            split_raw(&v, "x[CLS]  <mask>y"),
            [
                Split::Text(0, 1),
                Split::Added(0, 1, 6),
                Split::Added(1, 6, 14),
                Split::Text(14, 15)
            ]
        );
        assert!(split_raw(&v, "").is_empty());
    }

    #[test]
    fn single_word_and_normalized() {
        let v = vocab();
        assert_eq!(
            split_raw(&v, "cab ab"),
            [Split::Text(0, 4), Split::Added(3, 4, 6)]
        );
        let mut out = Vec::new();
        v.split_normalized("a<unk>", &mut out);
        assert_eq!(out, [Split::Text(0, 1), Split::Added(2, 1, 6)]);
        assert_eq!(v.token_to_id("<mask>"), Some(5));
        assert!(v.is_special_token("[CLS]") && !v.is_special_token("ab"));
    }
}
