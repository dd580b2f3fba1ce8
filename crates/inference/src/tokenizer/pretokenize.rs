//! Pre-tokenizers: split normalized text into the words the model tokenizes one at a time.
//! `BertPreTokenizer` drops whitespace (`char::is_whitespace`) and makes every punctuation
//! character (ASCII punctuation or a Unicode P* category) a word of its own. Without a
//! pre-tokenizer the whole piece is one word. This module only finds word boundaries; it does not
//! look words up in a vocabulary.

use super::unicode::is_bert_punctuation;

/// The pre-tokenizer named in `tokenizer.json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PreTokenizer {
    /// `BertPreTokenizer`: split on whitespace, isolate punctuation.
    Bert,
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

impl PreTokenizer {
    /// Calls `word(start, end)` for each word of `text` (byte offsets into `text`), in order.
    pub fn split(self, text: &str, mut word: impl FnMut(usize, usize)) {
        if self == PreTokenizer::None {
            if !text.is_empty() {
                word(0, text.len());
            }
            return;
        }
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(t: PreTokenizer, s: &str) -> Vec<&str> {
        let mut out = Vec::new();
        t.split(s, |a, b| out.push(&s[a..b]));
        out
    }

    #[test]
    fn bert_splits_whitespace_and_punctuation() {
        assert_eq!(
            words(PreTokenizer::Bert, "  Hello, world!!\u{3000}a«b»  "),
            ["Hello", ",", "world", "!", "!", "a", "«", "b", "»"]
        );
        assert!(words(PreTokenizer::Bert, " \t\n").is_empty());
    }

    #[test]
    fn none_keeps_one_word() {
        assert_eq!(words(PreTokenizer::None, "a b"), ["a b"]);
        assert!(words(PreTokenizer::None, "").is_empty());
    }
}
