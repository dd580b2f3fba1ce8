//! The normalizer stage as one enum over HF's normalizer types (`NFC`, `NFD`, `NFKC`,
//! `Lowercase`, `Prepend`, `Replace` with a string or regex pattern, `Strip`, `Sequence`,
//! `Precompiled` (a SentencePiece charsmap, applied per grapheme as HF does), `BertNormalizer`), each keeping the byte alignment of [`NormalizedText`] so that offsets point
//! into the input. Like HF, the Unicode forms use Unicode 9.0 behaviour for characters assigned
//! later ([`super::hf_unicode`]). The BERT normalizer itself lives in [`super::normalize`]; this
//! module only adds the other types and composes them. It does not parse `tokenizer.json`.

use fancy_regex::Regex;
use unicode_normalization::{IsNormalized, UnicodeNormalization};
use unicode_segmentation::UnicodeSegmentation;

use super::hf_unicode::is_hf_inert;
use super::normalize::{BertNormalizer, NormalizedText};
use crate::sentencepiece::charsmap::CharsMap;

/// A compiled regex that compares equal by its source text.
#[derive(Debug, Clone)]
pub(crate) struct Pattern(pub Box<Regex>);

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.0.as_str() == other.0.as_str()
    }
}

impl Eq for Pattern {}

/// Unicode normalization forms HF exposes as normalizers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Form {
    /// Canonical composition.
    Nfc,
    /// Canonical decomposition.
    Nfd,
    /// Compatibility composition.
    Nfkc,
}

/// One normalizer of `tokenizer.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Normalizer {
    /// `BertNormalizer`.
    Bert(BertNormalizer),
    /// `NFC` / `NFD` / `NFKC`.
    Unicode(Form),
    /// `Lowercase` (per-character full lowercase mapping).
    Lowercase,
    /// `Prepend`: put this string before non-empty text.
    Prepend(String),
    /// `Replace` with a string pattern: every occurrence of `pattern` becomes `content`.
    Replace {
        /// Literal text to find (never empty).
        pattern: String,
        /// Replacement.
        content: String,
    },
    /// `Replace` with a regex pattern: every non-empty match becomes `content`.
    ReplaceRegex {
        /// The pattern.
        pattern: Pattern,
        /// Replacement.
        content: String,
    },
    /// `Precompiled`: SentencePiece charsmap rules, per grapheme cluster (HF's mode); boxed, the
    /// tables are large.
    Precompiled(Box<CharsMap>),
    /// `Strip`: remove leading and/or trailing whitespace.
    Strip {
        /// Strip on the left.
        left: bool,
        /// Strip on the right.
        right: bool,
    },
    /// `Sequence`: each normalizer in turn.
    Sequence(Vec<Normalizer>),
}

/// Whether a normalization form may change text across a boundary before `c`. A character with
/// combining class 0 that passes the quick check starts a new independent segment.
fn is_boundary(form: Form, c: char) -> bool {
    if unicode_normalization::char::canonical_combining_class(c) != 0 {
        return false;
    }
    let mut buf = [0u8; 4];
    let s: &str = c.encode_utf8(&mut buf);
    let quick = match form {
        Form::Nfc => unicode_normalization::is_nfc_quick(s.chars()),
        Form::Nfd => unicode_normalization::is_nfd_quick(s.chars()),
        Form::Nfkc => unicode_normalization::is_nfkc_quick(s.chars()),
    };
    quick == IsNormalized::Yes
}

fn normalize_segment(form: Form, seg: &str, orig: (usize, usize), out: &mut NormalizedText) {
    let mut push_all = |it: &mut dyn Iterator<Item = char>| {
        for c in it {
            out.push(c, orig);
        }
    };
    match form {
        Form::Nfc => push_all(&mut seg.nfc()),
        Form::Nfd => push_all(&mut seg.nfd()),
        Form::Nfkc => push_all(&mut seg.nfkc()),
    }
}

/// Applies `form` to `input`: segments between boundaries are normalized on their own; a
/// segment that changes maps each of its output characters to the whole segment.
fn unicode_form(form: Form, input: &str, base: usize, out: &mut NormalizedText) {
    let mut seg_start = 0;
    let flush = |start: usize, end: usize, out: &mut NormalizedText| {
        if start >= end {
            return;
        }
        let seg = &input[start..end];
        let unchanged = match form {
            Form::Nfc => unicode_normalization::is_nfc(seg),
            Form::Nfd => unicode_normalization::is_nfd(seg),
            Form::Nfkc => unicode_normalization::is_nfkc(seg),
        };
        if unchanged {
            out.push_identity(seg, base + start);
        } else {
            normalize_segment(form, seg, (base + start, base + end), out);
        }
    };
    for (i, c) in input.char_indices() {
        if c.is_ascii() {
            flush(seg_start, i, out);
            seg_start = i;
        } else if is_hf_inert(c) {
            // A starter that neither decomposes nor composes in HF's tables: its own segment.
            flush(seg_start, i, out);
            out.push_identity(&input[i..i + c.len_utf8()], base + i);
            seg_start = i + c.len_utf8();
        } else if is_boundary(form, c) {
            flush(seg_start, i, out);
            seg_start = i;
        }
    }
    flush(seg_start, input.len(), out);
}

/// HF `Precompiled::normalize`: a grapheme shorter than 6 bytes with a rule is replaced whole;
/// otherwise each character is replaced by its rule or kept. Output maps to the replaced span.
fn precompiled(map: &CharsMap, input: &str, base: usize, out: &mut NormalizedText) {
    let mut emit = |norm: &str, start: usize, end: usize| {
        for c in norm.chars() {
            out.push(c, (base + start, base + end));
        }
    };
    for (g_start, grapheme) in input.grapheme_indices(true) {
        if grapheme.len() < 6 {
            if let Some(norm) = map.transform(grapheme) {
                emit(norm, g_start, g_start + grapheme.len());
                continue;
            }
        }
        for (i, c) in grapheme.char_indices() {
            let (start, end) = (g_start + i, g_start + i + c.len_utf8());
            match map.transform(&input[start..end]) {
                Some(norm) => emit(norm, start, end),
                None => emit(&input[start..end], start, end),
            }
        }
    }
}

impl Normalizer {
    /// Normalizes `input` (whose first byte sits at original offset `base`) into `out`, which is
    /// cleared first.
    pub fn normalize(&self, input: &str, base: usize, out: &mut NormalizedText) {
        out.clear();
        match self {
            Normalizer::Bert(b) => b.normalize(input, base, out),
            Normalizer::Unicode(form) => unicode_form(*form, input, base, out),
            Normalizer::Lowercase => {
                for (i, c) in input.char_indices() {
                    let orig = (base + i, base + i + c.len_utf8());
                    for l in c.to_lowercase() {
                        out.push(l, orig);
                    }
                }
            }
            Normalizer::Prepend(prefix) => {
                if let Some(first) = input.chars().next() {
                    let orig = (base, base + first.len_utf8());
                    for c in prefix.chars() {
                        out.push(c, orig);
                    }
                }
                out.push_identity(input, base);
            }
            Normalizer::Replace { pattern, content } => {
                let mut done = 0;
                for (i, m) in input.match_indices(pattern.as_str()) {
                    out.push_identity(&input[done..i], base + done);
                    let orig = (base + i, base + i + m.len());
                    for c in content.chars() {
                        out.push(c, orig);
                    }
                    done = i + m.len();
                }
                out.push_identity(&input[done..], base + done);
            }
            Normalizer::ReplaceRegex { pattern, content } => {
                let mut done = 0;
                // A regex that fails at run time (backtracking limit) leaves the rest unchanged.
                for m in pattern.0.find_iter(input).map_while(|m| m.ok()) {
                    if m.start() == m.end() {
                        continue;
                    }
                    out.push_identity(&input[done..m.start()], base + done);
                    let orig = (base + m.start(), base + m.end());
                    for c in content.chars() {
                        out.push(c, orig);
                    }
                    done = m.end();
                }
                out.push_identity(&input[done..], base + done);
            }
            Normalizer::Precompiled(map) => precompiled(map, input, base, out),
            Normalizer::Strip { left, right } => {
                let mut s = input;
                if *left {
                    s = s.trim_start();
                }
                if *right {
                    s = s.trim_end();
                }
                let offset = s.as_ptr() as usize - input.as_ptr() as usize;
                out.push_identity(s, base + offset);
            }
            Normalizer::Sequence(list) => {
                out.push_identity(input, base);
                let mut next = NormalizedText::default();
                for n in list {
                    n.normalize(&out.text, 0, &mut next);
                    // Compose: `next` points into `out.text`; map through `out.align`.
                    let align = next
                        .align
                        .iter()
                        .map(|&(s, e)| out.original_range(s, e))
                        .collect();
                    next.align = align;
                    std::mem::swap(out, &mut next);
                }
            }
        }
    }

    /// Normalizes a standalone string (used for added-token patterns).
    pub fn normalize_str(&self, input: &str) -> String {
        let mut out = NormalizedText::default();
        self.normalize(input, 0, &mut out);
        out.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(n: &Normalizer, s: &str) -> NormalizedText {
        let mut out = NormalizedText::default();
        n.normalize(s, 10, &mut out);
        assert_eq!(out.text.len(), out.align.len());
        out
    }

    #[test]
    fn nfc_composes_and_keeps_alignment() {
        let out = run(&Normalizer::Unicode(Form::Nfc), "ae\u{301}b");
        assert_eq!(out.text, "aéb");
        assert_eq!(out.align[0], (10, 11));
        assert_eq!(out.align[1], (11, 14));
        assert_eq!(out.align[3], (14, 15));
        assert_eq!(Normalizer::Unicode(Form::Nfkc).normalize_str("ﬁ½"), "fi1⁄2");
    }

    #[test]
    fn sentencepiece_sequence() {
        let n = Normalizer::Sequence(vec![
            Normalizer::Prepend("▁".into()),
            Normalizer::Replace {
                pattern: " ".into(),
                content: "▁".into(),
            },
        ]);
        let out = run(&n, "a b");
        assert_eq!(out.text, "▁a▁b");
        assert_eq!(out.original_range(0, 3), (10, 11));
        assert_eq!(out.original_range(4, 7), (11, 12));
        assert_eq!(n.normalize_str(""), "");
        let strip = Normalizer::Strip {
            left: true,
            right: false,
        };
        assert_eq!(run(&strip, "  x ").align[0], (12, 13));
    }
}
