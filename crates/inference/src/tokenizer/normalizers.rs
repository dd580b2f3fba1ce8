//! The normalizer stage as one enum over HF's normalizer types (`NFC`, `NFD`, `NFKC`,
//! `Lowercase`, `Prepend`, `Replace` with a string or regex pattern, `Strip`, `Sequence`,
//! `Precompiled` (a SentencePiece charsmap, applied per grapheme as HF does), `BertNormalizer`), each keeping the byte alignment of [`NormalizedText`] so that offsets point
//! into the input. Like HF, the Unicode forms use Unicode 9.0 behaviour for characters assigned
//! later ([`super::hf_unicode`]). The BERT normalizer itself lives in [`super::normalize`]; this
//! module only adds the other types and composes them. It does not parse `tokenizer.json`.

use fancy_regex::Regex;
use unicode_normalization::IsNormalized;
use unicode_segmentation::UnicodeSegmentation;

use super::hf_unicode::is_hf_inert;
use super::normalize::{BertNormalizer, NormalizedText};
use super::unicode::{combining_class, decompose_canonical};
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

/// The canonical (or, for NFKC, compatibility) decomposition of `seg`, in canonical order, each
/// character with HF's change marker: 0 for the first character of a source character's
/// decomposition, 1 for the others (`unicode-normalization-alignments`, which HF uses).
fn decompose_with_changes(form: Form, seg: &str) -> Vec<(char, isize)> {
    let mut buf: Vec<(u8, char, isize)> = Vec::with_capacity(seg.len());
    // `buf[ready..]` is the run of combining characters waiting for canonical ordering.
    let mut ready = 0;
    for c in seg.chars() {
        let mut first = true;
        let mut push = |d: char| {
            let ccc = combining_class(d);
            if ccc == 0 {
                // Stable: equal classes keep their input order.
                buf[ready..].sort_by_key(|k| k.0);
                ready = buf.len();
            }
            buf.push((ccc, d, if first { 0 } else { 1 }));
            first = false;
        };
        match form {
            Form::Nfkc => unicode_normalization::char::decompose_compatible(c, &mut push),
            Form::Nfc | Form::Nfd => decompose_canonical(c, &mut push),
        }
    }
    buf[ready..].sort_by_key(|k| k.0);
    buf.into_iter().map(|(_, c, change)| (c, change)).collect()
}

/// Canonical composition of a decomposed sequence, carrying the change markers as HF's
/// alignment-tracking normalizer does: a character that absorbs another takes the sum of both
/// markers minus one.
fn compose_with_changes(input: &[(char, isize)], out: &mut Vec<(char, isize)>) {
    let mut composee: Option<(char, isize)> = None;
    let mut last_ccc: Option<u8> = None;
    let mut blocked: Vec<(char, isize)> = Vec::new();
    for &(ch, change) in input {
        let class = combining_class(ch);
        let Some(k) = composee else {
            if class == 0 {
                composee = Some((ch, change));
            } else {
                out.push((ch, change));
            }
            continue;
        };
        let can_compose = match last_ccc {
            None => true,
            Some(last) => last < class,
        };
        if can_compose {
            if let Some(r) = unicode_normalization::char::compose(k.0, ch) {
                composee = Some((r, k.1 + change - 1));
                continue;
            }
        }
        if class == 0 {
            out.push(k);
            out.append(&mut blocked);
            composee = Some((ch, change));
            last_ccc = None;
        } else {
            blocked.push((ch, change));
            last_ccc = Some(class);
        }
    }
    out.extend(composee);
    out.append(&mut blocked);
}

/// Normalizes a segment that changes (see [`push_transformed`] for the alignment).
fn normalize_segment(form: Form, seg: &str, base: usize, out: &mut NormalizedText) {
    let decomposed = decompose_with_changes(form, seg);
    let chars = match form {
        Form::Nfd => decomposed,
        Form::Nfc | Form::Nfkc => {
            let mut composed = Vec::with_capacity(decomposed.len());
            compose_with_changes(&decomposed, &mut composed);
            composed
        }
    };
    push_transformed(seg, base, &chars, out);
}

/// Appends the rewrite `chars` of `input` (whose first byte sits at original offset `base`) to
/// `out`, each character with HF's change marker (0: replaces the next source character, -n:
/// replaces it and removes n more, +1: inserted). Each output character gets the original range
/// HF's `transform` gives it: a replacing character the range of the (first) source character it
/// replaces, an inserted one the range of the source character before it (the last output
/// character's, at the start of `input`).
fn push_transformed(input: &str, base: usize, chars: &[(char, isize)], out: &mut NormalizedText) {
    let sources: Vec<(usize, usize)> = input
        .char_indices()
        .map(|(i, c)| (base + i, base + i + c.len_utf8()))
        .collect();
    let fallback = |out: &NormalizedText| out.align.last().copied().unwrap_or((base, base));
    let mut next = 0usize;
    for &(c, change) in chars {
        let orig = if change > 0 {
            match next.checked_sub(1).and_then(|i| sources.get(i)) {
                Some(&r) => r,
                None => fallback(out),
            }
        } else {
            let r = match sources.get(next) {
                Some(&r) => r,
                None => fallback(out),
            };
            next += 1 + change.unsigned_abs();
            r
        };
        out.push(c, orig);
    }
}

/// Applies `form` to `input`: segments between boundaries are normalized on their own, with
/// HF's per-character alignment ([`normalize_segment`]).
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
            normalize_segment(form, seg, base + start, out);
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
/// otherwise each character is replaced by its rule or kept. The replacement characters carry
/// HF's change markers (an added character is "inserted", a shorter replacement's last character
/// removes the rest) and get HF's alignment through [`push_transformed`].
fn precompiled(map: &CharsMap, input: &str, base: usize, out: &mut NormalizedText) {
    let mut chars: Vec<(char, isize)> = Vec::with_capacity(input.len());
    let mut modified = false;
    let replace = |chars: &mut Vec<(char, isize)>, old: &str, new: &str| {
        let diff = new.chars().count() as isize - old.chars().count() as isize;
        chars.extend(new.chars().map(|c| (c, 0)));
        if diff > 0 {
            for entry in chars.iter_mut().rev().take(diff.unsigned_abs()) {
                entry.1 = 1;
            }
        } else if diff < 0 {
            if let Some(last) = chars.last_mut() {
                last.1 += diff;
            }
        }
    };
    for grapheme in input.graphemes(true) {
        if grapheme.len() < 6 {
            if let Some(norm) = map.transform(grapheme) {
                modified = true;
                replace(&mut chars, grapheme, norm);
                continue;
            }
        }
        for (i, c) in grapheme.char_indices() {
            let part = &grapheme[i..i + c.len_utf8()];
            match map.transform(part) {
                Some(norm) => {
                    modified = true;
                    replace(&mut chars, part, norm);
                }
                None => chars.push((c, 0)),
            }
        }
    }
    if modified {
        push_transformed(input, base, &chars, out);
    } else {
        out.push_identity(input, base);
    }
}

/// The original range of the character of `input` that ends at byte `end` (> 0): where HF's
/// `replace` maps every character of a replacement (they count as inserted after the match).
fn last_char_range(input: &str, end: usize, base: usize) -> (usize, usize) {
    let start = input[..end]
        .char_indices()
        .next_back()
        .map_or(0, |(i, _)| i);
    (base + start, base + end)
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
                    let orig = last_char_range(input, i + m.len(), base);
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
                    let orig = last_char_range(input, m.end(), base);
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
        // As HF: a composed character maps to its first source character.
        assert_eq!(out.align[1], (11, 12));
        assert_eq!(out.align[3], (14, 15));
        // Reordered marks take the source ranges by position; an added character (NFD) the
        // range of the source character before it.
        let out = run(&Normalizer::Unicode(Form::Nfc), "x\u{1d16d}\u{1d165}");
        assert_eq!(out.text, "x\u{1d165}\u{1d16d}");
        assert_eq!((out.align[1], out.align[5]), ((11, 15), (15, 19)));
        let out = run(&Normalizer::Unicode(Form::Nfd), "é");
        assert_eq!(out.text, "e\u{301}");
        assert_eq!(out.align, [(10, 12); 3]);
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
