//! Pre-tokenizers: split normalized text into the words the model tokenizes one at a time.
//!
//! - `BertPreTokenizer` drops whitespace (`char::is_whitespace`) and makes every punctuation
//!   character (ASCII punctuation or a Unicode P* category) a word of its own;
//! - `Split` cuts at the matches of a regex (or a literal string) with HF's delimiter behaviours
//!   (`Removed`, `Isolated`, `MergedWithPrevious`, `MergedWithNext`, `Contiguous`) and `invert`;
//! - `ByteLevel` splits with GPT-2's pattern when `use_regex` (the byte-to-unicode spelling
//!   itself is done by the BPE model, and `add_prefix_space` by [`super::Tokenizer`]);
//! - `Whitespace` (`\w+|[^\w\s]+`), `WhitespaceSplit`, `Digits`, and `Sequence`, which applies
//!   each stage to every word of the previous one.
//!
//! Without a pre-tokenizer the whole piece is one word. Regexes use `fancy-regex`, which, like
//! HF's Oniguruma, backtracks with leftmost-first alternation and supports `(?!\S)`. If the regex
//! engine gives up on an input (its backtracking limit), the rest of that text is one word.
//! This module only finds word boundaries; it does not look words up in a vocabulary.

use fancy_regex::Regex;

use super::normalize::NormalizedText;
use super::unicode::is_bert_punctuation;

/// GPT-2's split pattern, used by `ByteLevel` with `use_regex`.
pub(crate) const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// What `Split` does with the matched delimiters (HF `SplitDelimiterBehavior`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Behavior {
    /// Drop them.
    Removed,
    /// Keep each as its own word.
    Isolated,
    /// Glue each to the word before it.
    MergedWithPrevious,
    /// Glue each to the word after it.
    MergedWithNext,
    /// Merge runs of consecutive delimiters into one word.
    Contiguous,
}

/// `Metaspace`'s `prepend_scheme`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Prepend {
    /// Before every piece of text that does not start with the replacement.
    Always,
    /// Only before the piece that starts the input.
    First,
    /// Never.
    Never,
}

/// The pattern of a `Split`.
#[derive(Debug, Clone)]
pub(crate) enum SplitPattern {
    /// A literal string (never empty).
    Literal(String),
    /// A regex.
    Regex(Box<Regex>),
    /// Each character for which the function holds is a match (`Digits`).
    Class(fn(char) -> bool),
}

/// The pre-tokenizer named in `tokenizer.json`.
#[derive(Debug, Clone)]
pub(crate) enum PreTokenizer {
    /// `BertPreTokenizer`: split on whitespace, isolate punctuation.
    Bert,
    /// `Split` (also the form `ByteLevel`, `Whitespace`, `WhitespaceSplit`, `Digits` take).
    Split {
        /// What to find.
        pattern: SplitPattern,
        /// What to do with matches.
        behavior: Behavior,
        /// Swap matches and non-matches first.
        invert: bool,
    },
    /// `ByteLevel`: GPT-2 split if `use_regex`; `add_prefix_space` is applied by the caller.
    ByteLevel {
        /// Put a space before text that does not start with one.
        add_prefix_space: bool,
        /// The GPT-2 regex, when `use_regex`.
        regex: Option<SplitPattern>,
    },
    /// `Metaspace`: spaces become `replacement`, which is also put before the text (per
    /// `prepend_scheme`); with `split`, each word starts at a `replacement`. The rewriting is
    /// [`PreTokenizer::rewrite`]; [`PreTokenizer::split`] sees the rewritten text.
    Metaspace {
        /// The space replacement (`▁`).
        replacement: char,
        /// When to put `replacement` before the text.
        prepend: Prepend,
        /// Split before each `replacement`.
        split: bool,
    },
    /// `Sequence`: each stage splits the words of the previous one.
    Sequence(Vec<PreTokenizer>),
    /// No pre-tokenizer: each piece of text is one word.
    None,
}

/// 1 = whitespace, 2 = punctuation, 0 = part of a word; for ASCII bytes.
const ASCII_CLASS: [u8; 128] = {
    let mut t = [0u8; 128];
    let mut i = 0;
    while i < 128 {
        let c = i as u8;
        t[i] = if c.is_ascii_whitespace() || c == 0x0b {
            1
        } else if c.is_ascii_punctuation() {
            2
        } else {
            0
        };
        i += 1;
    }
    t
};

fn split_bert(text: &str, word: &mut dyn FnMut(usize, usize)) {
    let bytes = text.as_bytes();
    let mut start: Option<usize> = None;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let (class, len) = if b < 0x80 {
            (ASCII_CLASS[b as usize], 1)
        } else {
            let Some(c) = text[i..].chars().next() else {
                break;
            };
            let class = if c.is_whitespace() {
                1
            } else if is_bert_punctuation(c) {
                2
            } else {
                0
            };
            (class, c.len_utf8())
        };
        if class == 0 {
            if start.is_none() {
                start = Some(i);
            }
        } else {
            if let Some(s) = start.take() {
                word(s, i);
            }
            if class == 2 {
                word(i, i + len);
            }
        }
        i += len;
    }
    if let Some(s) = start {
        word(s, bytes.len());
    }
}

/// HF `find_matches`: the text cut into (start, end, is_match) pieces covering all of it.
fn find_matches(pattern: &SplitPattern, text: &str, out: &mut Vec<(usize, usize, bool)>) {
    let mut prev = 0;
    let mut push = |start: usize, end: usize, out: &mut Vec<(usize, usize, bool)>| {
        if prev != start {
            out.push((prev, start, false));
        }
        out.push((start, end, true));
        prev = end;
    };
    match pattern {
        SplitPattern::Literal(lit) => {
            for (i, m) in text.match_indices(lit.as_str()) {
                push(i, i + m.len(), out);
            }
        }
        SplitPattern::Class(f) => {
            for (i, c) in text.char_indices() {
                if f(c) {
                    push(i, i + c.len_utf8(), out);
                }
            }
        }
        SplitPattern::Regex(re) => {
            for m in re.find_iter(text) {
                match m {
                    Ok(m) => push(m.start(), m.end(), out),
                    // The engine gave up (backtrack limit): the rest stays one piece.
                    Err(_) => break,
                }
            }
        }
    }
    if prev != text.len() {
        out.push((prev, text.len(), false));
    }
}

/// Applies a delimiter behaviour to `find_matches` output, HF's way, dropping empty words.
fn apply_behavior(
    behavior: Behavior,
    invert: bool,
    pieces: &mut [(usize, usize, bool)],
    word: &mut dyn FnMut(usize, usize),
) {
    if invert {
        for p in pieces.iter_mut() {
            p.2 = !p.2;
        }
    }
    let mut out: Vec<(usize, usize, bool)> = Vec::with_capacity(pieces.len());
    let mut previous_match = false;
    match behavior {
        Behavior::Removed => out.extend(pieces.iter().filter(|p| !p.2)),
        Behavior::Isolated => out.extend(pieces.iter()),
        Behavior::MergedWithPrevious => {
            for &(s, e, m) in pieces.iter() {
                match out.last_mut() {
                    Some(last) if m && !previous_match => last.1 = e,
                    _ => out.push((s, e, false)),
                }
                previous_match = m;
            }
        }
        Behavior::MergedWithNext => {
            for &(s, e, m) in pieces.iter().rev() {
                match out.last_mut() {
                    Some(last) if m && !previous_match => last.0 = s,
                    _ => out.push((s, e, false)),
                }
                previous_match = m;
            }
            out.reverse();
        }
        Behavior::Contiguous => {
            for &(s, e, m) in pieces.iter() {
                match out.last_mut() {
                    Some(last) if m == previous_match => last.1 = e,
                    _ => out.push((s, e, false)),
                }
                previous_match = m;
            }
        }
    }
    for (s, e, _) in out {
        if s < e {
            word(s, e);
        }
    }
}

impl PreTokenizer {
    /// Calls `word(start, end)` for each word of `text` (byte offsets into `text`), in order.
    pub fn split(&self, text: &str, mut word: impl FnMut(usize, usize)) {
        self.split_dyn(text, &mut word);
    }

    /// The text a top-level rewriting pre-tokenizer makes of `norm.text[from..to]`, aligned to
    /// the input: `ByteLevel` with `add_prefix_space` puts a space before text that does not
    /// start with one; `Metaspace` replaces spaces and prepends its replacement. `None` when
    /// the text stays as it is.
    pub fn rewrite(&self, norm: &NormalizedText, from: usize, to: usize) -> Option<NormalizedText> {
        let text = norm.text.get(from..to)?;
        let first = text.chars().next()?;
        let first_orig = norm.original_range(from, from + first.len_utf8());
        let (space, prepend) = match self {
            PreTokenizer::ByteLevel {
                add_prefix_space: true,
                ..
            } => (' ', !text.starts_with(' ')),
            PreTokenizer::Metaspace {
                replacement,
                prepend,
                ..
            } => {
                // HF checks after replacing spaces, so a leading space counts as one.
                let starts = text.starts_with(*replacement) || text.starts_with(' ');
                let prepend = !starts
                    && match prepend {
                        Prepend::Always => true,
                        Prepend::First => first_orig.0 == 0,
                        Prepend::Never => false,
                    };
                (*replacement, prepend)
            }
            _ => return None,
        };
        let mut out = NormalizedText::default();
        if prepend {
            out.push(space, first_orig);
        }
        for (i, c) in text.char_indices() {
            let at = from + i;
            let orig = norm.original_range(at, at + c.len_utf8());
            out.push(if c == ' ' { space } else { c }, orig);
        }
        Some(out)
    }

    /// Whether a `ByteLevel` stage is present (words are then spelled byte-level by the model).
    pub fn is_byte_level(&self) -> bool {
        match self {
            PreTokenizer::ByteLevel { .. } => true,
            PreTokenizer::Sequence(list) => list.iter().any(PreTokenizer::is_byte_level),
            _ => false,
        }
    }

    fn split_dyn(&self, text: &str, word: &mut dyn FnMut(usize, usize)) {
        match self {
            PreTokenizer::None => {
                if !text.is_empty() {
                    word(0, text.len());
                }
            }
            PreTokenizer::Bert => split_bert(text, word),
            PreTokenizer::Metaspace {
                replacement, split, ..
            } => {
                if text.is_empty() {
                    return;
                }
                if !split {
                    return word(0, text.len());
                }
                let mut pieces = Vec::new();
                let pattern = SplitPattern::Literal(replacement.to_string());
                find_matches(&pattern, text, &mut pieces);
                apply_behavior(Behavior::MergedWithNext, false, &mut pieces, word);
            }
            PreTokenizer::Split {
                pattern,
                behavior,
                invert,
            } => {
                if text.is_empty() {
                    return;
                }
                let mut pieces = Vec::new();
                find_matches(pattern, text, &mut pieces);
                apply_behavior(*behavior, *invert, &mut pieces, word);
            }
            PreTokenizer::ByteLevel { regex, .. } => match regex {
                Some(pattern) => {
                    if text.is_empty() {
                        return;
                    }
                    let mut pieces = Vec::new();
                    find_matches(pattern, text, &mut pieces);
                    apply_behavior(Behavior::Isolated, false, &mut pieces, word);
                }
                None => {
                    if !text.is_empty() {
                        word(0, text.len());
                    }
                }
            },
            PreTokenizer::Sequence(list) => {
                let mut words = vec![(0, text.len())];
                let mut next = Vec::new();
                for stage in list {
                    next.clear();
                    for &(s, e) in &words {
                        stage.split_dyn(&text[s..e], &mut |a, b| next.push((s + a, s + b)));
                    }
                    std::mem::swap(&mut words, &mut next);
                }
                for (s, e) in words {
                    if s < e {
                        word(s, e);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words<'a>(t: &PreTokenizer, s: &'a str) -> Vec<&'a str> {
        let mut out = Vec::new();
        t.split(s, |a, b| out.push(&s[a..b]));
        out
    }

    #[test]
    fn bert_splits_whitespace_and_punctuation() {
        assert_eq!(
            words(&PreTokenizer::Bert, "  Hello, world!!\u{3000}a«b»  "),
            ["Hello", ",", "world", "!", "!", "a", "«", "b", "»"]
        );
        assert!(words(&PreTokenizer::Bert, " \t\n").is_empty());
    }

    #[test]
    fn none_keeps_one_word() {
        assert_eq!(words(&PreTokenizer::None, "a b"), ["a b"]);
        assert!(words(&PreTokenizer::None, "").is_empty());
    }

    fn split(pattern: &str, behavior: Behavior, invert: bool) -> PreTokenizer {
        let re = Regex::new(pattern).expect("valid regex");
        PreTokenizer::Split {
            pattern: SplitPattern::Regex(Box::new(re)),
            behavior,
            invert,
        }
    }

    #[test]
    fn gpt2_regex_and_behaviors() {
        let gpt2 = split(GPT2_PATTERN, Behavior::Isolated, false);
        assert_eq!(
            words(&gpt2, "Hello's  world 42!\n"),
            ["Hello", "'s", " ", " world", " 42", "!", "\n"]
        );
        let dash = |b| split("-", b, false);
        assert_eq!(words(&dash(Behavior::Removed), "a-b--c"), ["a", "b", "c"]);
        assert_eq!(
            words(&dash(Behavior::MergedWithPrevious), "a-b--c"),
            ["a-", "b-", "-", "c"]
        );
        assert_eq!(
            words(&dash(Behavior::MergedWithNext), "a-b--c"),
            ["a", "-b", "-", "-c"]
        );
        assert_eq!(
            words(&dash(Behavior::Contiguous), "a-b--c"),
            ["a", "-", "b", "--", "c"]
        );
        assert_eq!(words(&split("-", Behavior::Removed, true), "a-b"), ["-"]);
    }
}
