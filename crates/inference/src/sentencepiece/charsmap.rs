//! SentencePiece text normalization: the precompiled charsmap and the whitespace rules.
//!
//! A precompiled charsmap (`NormalizerSpec.precompiled_charsmap`, also the `precompiled_charsmap`
//! of the HF `Precompiled` normalizer) is a blob laid out as
//! `[u32 LE trie_bytes][double-array trie: trie_bytes / 4 units][pool of NUL-terminated strings]`.
//! The trie maps a UTF-8 byte prefix to an offset into the pool, where the replacement lives.
//! [`CharsMap`] reads that blob and answers prefix queries with every index checked.
//! [`Normalizer`] is SentencePiece's `Normalizer::Normalize`: longest-prefix replacement, dropping
//! leading/trailing/repeated spaces, the dummy `▁` prefix and the escaping of spaces to `▁`.
//! [`CharsMap::normalize_graphemes`] is the HF `Precompiled` variant, which works per grapheme
//! cluster. Segmentation into pieces is not here (see `unigram`).

use std::collections::HashSet;

use unicode_segmentation::UnicodeSegmentation;

/// The meta symbol that stands for a space in pieces (U+2581, `▁`).
pub const SPACE_SYMBOL: &str = "\u{2581}";

/// A parsed precompiled charsmap: a Darts double-array trie over UTF-8 prefixes plus its
/// replacement string pool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CharsMap {
    /// Double-array units (u32 [n_units]).
    units: Vec<u32>,
    /// NUL-separated replacement strings.
    pool: Vec<u8>,
}

fn has_leaf(unit: u32) -> bool {
    (unit >> 8) & 1 == 1
}

fn value(unit: u32) -> u32 {
    unit & ((1 << 31) - 1)
}

fn label(unit: u32) -> u32 {
    unit & ((1 << 31) | 0xff)
}

fn offset(unit: u32) -> usize {
    ((unit >> 10) << ((unit & (1 << 9)) >> 6)) as usize
}

impl CharsMap {
    /// Parses a charsmap blob. An empty blob is the identity map.
    pub fn parse(blob: &[u8]) -> Result<Self, String> {
        if blob.is_empty() {
            return Ok(Self::default());
        }
        if blob.len() <= 4 {
            return Err(format!("charsmap of {} bytes is too short", blob.len()));
        }
        let trie_bytes = u32::from_le_bytes([blob[0], blob[1], blob[2], blob[3]]) as usize;
        let rest = &blob[4..];
        if trie_bytes >= rest.len() + 4 || trie_bytes > rest.len() {
            return Err(format!(
                "charsmap trie size {trie_bytes} exceeds the blob ({} bytes)",
                blob.len()
            ));
        }
        let units = rest[..trie_bytes]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Ok(Self {
            units,
            pool: rest[trie_bytes..].to_vec(),
        })
    }

    /// True when the map has no rules.
    pub fn is_empty(&self) -> bool {
        self.units.is_empty()
    }

    /// Calls `f(prefix_bytes, pool_offset)` for every rule whose key is a prefix of `key`, shortest
    /// first.
    fn common_prefixes(&self, key: &[u8], mut f: impl FnMut(usize, usize)) {
        let Some(&root) = self.units.first() else {
            return;
        };
        let mut node = offset(root);
        for (i, &c) in key.iter().enumerate() {
            node ^= usize::from(c);
            let Some(&unit) = self.units.get(node) else {
                return;
            };
            if label(unit) != u32::from(c) {
                return;
            }
            node ^= offset(unit);
            if has_leaf(unit) {
                let Some(&leaf) = self.units.get(node) else {
                    return;
                };
                f(i + 1, value(leaf) as usize);
            }
        }
    }

    /// The replacement string stored at `pool_offset` (up to the next NUL), if it is valid.
    fn replacement(&self, pool_offset: usize) -> Option<&str> {
        let tail = self.pool.get(pool_offset..)?;
        let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
        std::str::from_utf8(&tail[..end]).ok()
    }

    /// SentencePiece's rule lookup: the longest rule matching a prefix of `text`, as
    /// `(matched_bytes, replacement)`.
    pub fn longest_match<'s>(&'s self, text: &str) -> Option<(usize, &'s str)> {
        let mut best: Option<(usize, usize)> = None;
        let mut n_results = 0usize;
        self.common_prefixes(text.as_bytes(), |len, off| {
            // SentencePiece keeps at most 32 results per lookup.
            if n_results < 32 && best.is_none_or(|(l, _)| len > l) {
                best = Some((len, off));
            }
            n_results += 1;
        });
        let (len, off) = best?;
        // A rule must end on a character boundary and point at a valid string to be usable.
        if !text.is_char_boundary(len) {
            return None;
        }
        self.replacement(off).map(|r| (len, r))
    }

    /// HF `Precompiled::transform`: the replacement of the first (shortest) rule that matches a
    /// prefix of `chunk`, applied to the whole chunk.
    pub(crate) fn transform(&self, chunk: &str) -> Option<&str> {
        let mut first = None;
        self.common_prefixes(chunk.as_bytes(), |_, off| {
            if first.is_none() {
                first = Some(off);
            }
        });
        self.replacement(first?)
    }

    /// The HF `Precompiled` normalizer: each grapheme cluster shorter than 6 bytes that starts
    /// with a rule is replaced whole by that rule's output; otherwise each character is looked up
    /// on its own and kept when no rule matches it.
    pub fn normalize_graphemes(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        for grapheme in text.graphemes(true) {
            if grapheme.len() < 6 {
                if let Some(norm) = self.transform(grapheme) {
                    out.push_str(norm);
                    continue;
                }
            }
            for (i, c) in grapheme.char_indices() {
                match self.transform(&grapheme[i..i + c.len_utf8()]) {
                    Some(norm) => out.push_str(norm),
                    None => out.push(c),
                }
            }
        }
        out
    }
}

/// SentencePiece's normalizer (`normalizer.cc`): charsmap rules, whitespace clean-up, the dummy
/// prefix and `▁` escaping, with user-defined symbols passed through untouched.
#[derive(Debug, Clone, Default)]
pub struct Normalizer {
    /// The replacement rules (empty for `identity`).
    pub charsmap: CharsMap,
    /// Put a space before the text (after the text with `treat_whitespace_as_suffix`).
    pub add_dummy_prefix: bool,
    /// Drop leading and trailing spaces and collapse runs of spaces.
    pub remove_extra_whitespaces: bool,
    /// Write spaces as `▁`.
    pub escape_whitespaces: bool,
    /// The dummy space goes at the end instead of the start.
    pub treat_whitespace_as_suffix: bool,
    /// User-defined symbols, matched longest first and never normalized.
    user_symbols: HashSet<String>,
    /// Length in bytes of the longest user-defined symbol.
    max_user_bytes: usize,
}

impl Normalizer {
    /// Builds a normalizer from its rules and flags.
    pub fn new(
        charsmap: CharsMap,
        add_dummy_prefix: bool,
        remove_extra_whitespaces: bool,
        escape_whitespaces: bool,
        treat_whitespace_as_suffix: bool,
    ) -> Self {
        Self {
            charsmap,
            add_dummy_prefix,
            remove_extra_whitespaces,
            escape_whitespaces,
            treat_whitespace_as_suffix,
            user_symbols: HashSet::new(),
            max_user_bytes: 0,
        }
    }

    /// Sets the user-defined symbols that bypass normalization.
    pub fn set_user_symbols(&mut self, symbols: Vec<String>) {
        self.user_symbols = symbols.into_iter().filter(|s| !s.is_empty()).collect();
        self.max_user_bytes = self.user_symbols.iter().map(String::len).max().unwrap_or(0);
    }

    /// Length of the longest user-defined symbol that starts `text`, if any.
    fn user_symbol_prefix(&self, text: &str) -> Option<usize> {
        if self.user_symbols.is_empty() {
            return None;
        }
        let limit = self.max_user_bytes.min(text.len());
        (1..=limit)
            .rev()
            .filter(|&n| text.is_char_boundary(n))
            .find(|&n| self.user_symbols.contains(&text[..n]))
    }

    /// One step of normalization: `(replacement, consumed_bytes)` for the start of `text`, which
    /// must not be empty.
    fn normalize_prefix<'s>(&'s self, text: &'s str) -> (&'s str, usize) {
        if let Some(n) = self.user_symbol_prefix(text) {
            return (&text[..n], n);
        }
        if let Some((len, rep)) = self.charsmap.longest_match(text) {
            return (rep, len);
        }
        let len = text.chars().next().map_or(text.len(), char::len_utf8);
        (&text[..len], len)
    }

    fn push_space(&self, out: &mut String) {
        out.push_str(if self.escape_whitespaces {
            SPACE_SYMBOL
        } else {
            " "
        });
    }

    /// Normalizes `text` the way SentencePiece does before segmentation.
    pub fn normalize(&self, text: &str) -> String {
        let mut input = text;
        if self.remove_extra_whitespaces {
            while !input.is_empty() {
                let (rep, n) = self.normalize_prefix(input);
                if rep != " " {
                    break;
                }
                input = &input[n..];
            }
        }
        let mut out = String::with_capacity(text.len() * 3 / 2 + 3);
        if input.is_empty() {
            return out;
        }
        if !self.treat_whitespace_as_suffix && self.add_dummy_prefix {
            self.push_space(&mut out);
        }
        let mut is_prev_space = self.remove_extra_whitespaces;
        while !input.is_empty() {
            let (rep, n) = self.normalize_prefix(input);
            let mut sp = rep;
            if is_prev_space {
                sp = sp.trim_start_matches(' ');
            }
            if !sp.is_empty() {
                if self.escape_whitespaces {
                    for (i, part) in sp.split(' ').enumerate() {
                        if i > 0 {
                            out.push_str(SPACE_SYMBOL);
                        }
                        out.push_str(part);
                    }
                } else {
                    out.push_str(sp);
                }
                is_prev_space = sp.ends_with(' ');
            }
            input = &input[n..];
            if !self.remove_extra_whitespaces {
                is_prev_space = false;
            }
        }
        if self.remove_extra_whitespaces {
            let space = if self.escape_whitespaces {
                SPACE_SYMBOL
            } else {
                " "
            };
            while out.ends_with(space) {
                out.truncate(out.len() - space.len());
            }
        }
        if self.treat_whitespace_as_suffix && self.add_dummy_prefix {
            self.push_space(&mut out);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_normalizer_handles_whitespace() {
        let n = Normalizer::new(CharsMap::default(), true, true, true, false);
        assert_eq!(n.normalize("  a  b "), "\u{2581}a\u{2581}b");
        assert_eq!(n.normalize("   "), "");
        let keep = Normalizer::new(CharsMap::default(), false, false, true, false);
        assert_eq!(keep.normalize(" a  b"), "\u{2581}a\u{2581}\u{2581}b");
    }

    #[test]
    fn corrupt_charsmap_is_rejected_or_harmless() {
        assert!(CharsMap::parse(&[1, 2, 3]).is_err());
        assert!(CharsMap::parse(&[200, 0, 0, 0, 1, 2]).is_err());
        let m = CharsMap::parse(&[4, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, b'x']).expect("sizes fit");
        assert_eq!(m.longest_match("abc"), None);
        let _ = m.normalize_graphemes("a\u{301}bc");
    }
}
