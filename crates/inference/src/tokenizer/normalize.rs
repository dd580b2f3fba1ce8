//! The BERT normalizer (`BertNormalizer` in `tokenizer.json`) and the normalized-text buffer that
//! remembers, for every byte it holds, which bytes of the original input it came from.
//!
//! The steps run in HF's order: `clean_text` (drop NUL, U+FFFD and control characters, turn
//! whitespace into a space), `handle_chinese_chars` (surround CJK ideographs with spaces),
//! `strip_accents` (NFD, then drop nonspacing marks), `lowercase` (per-character
//! `char::to_lowercase`). They are fused into one pass over the input. This module does not
//! split text into words ([`super::pretokenize`] does).

use super::unicode::{
    combining_class, decompose_canonical, is_bert_whitespace, is_chinese_char, is_control,
    is_mark_nonspacing, is_plain,
};

/// Normalized text plus, for each of its bytes, the original byte range it came from.
#[derive(Debug, Default, Clone)]
pub(crate) struct NormalizedText {
    /// The normalized text.
    pub text: String,
    /// One entry per byte of `text`: `(start, end)` byte offsets into the original input.
    pub align: Vec<(usize, usize)>,
}

impl NormalizedText {
    /// Empties the buffer, keeping its capacity.
    pub fn clear(&mut self) {
        self.text.clear();
        self.align.clear();
    }

    /// Appends `c`, which came from original bytes `orig`.
    #[inline]
    pub fn push(&mut self, c: char, orig: (usize, usize)) {
        self.text.push(c);
        for _ in 0..c.len_utf8() {
            self.align.push(orig);
        }
    }

    /// Appends `s` unchanged, its bytes starting at original offset `base`.
    pub fn push_identity(&mut self, s: &str, base: usize) {
        self.text.push_str(s);
        for (i, c) in s.char_indices() {
            let orig = (base + i, base + i + c.len_utf8());
            for _ in 0..c.len_utf8() {
                self.align.push(orig);
            }
        }
    }

    /// The original byte range covered by normalized bytes `start..end` (`end > start`).
    #[inline]
    pub fn original_range(&self, start: usize, end: usize) -> (usize, usize) {
        match (
            self.align.get(start),
            end.checked_sub(1).and_then(|e| self.align.get(e)),
        ) {
            (Some(s), Some(e)) if end > start => (s.0, e.1),
            (Some(s), _) => (s.0, s.0),
            _ => (0, 0),
        }
    }
}

/// `BertNormalizer` settings. `strip_accents: null` in the file means "same as `lowercase`".
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BertNormalizer {
    /// Drop control characters and map whitespace to a space.
    pub clean_text: bool,
    /// Put spaces around CJK ideographs.
    pub handle_chinese_chars: bool,
    /// NFD, then drop nonspacing marks.
    pub strip_accents: bool,
    /// Lowercase every character.
    pub lowercase: bool,
}

impl Default for BertNormalizer {
    fn default() -> Self {
        Self {
            clean_text: true,
            handle_chinese_chars: true,
            strip_accents: true,
            lowercase: true,
        }
    }
}

/// A combining character (ccc > 0) of the current run, waiting for canonical reordering.
#[derive(Clone, Copy)]
struct Pending {
    c: char,
    ccc: u8,
    /// First character of its source character's decomposition.
    first: bool,
    /// The source character's original range.
    orig: (usize, usize),
}

/// Per-call state of one normalization pass.
struct Pass<'a> {
    cfg: &'a BertNormalizer,
    out: &'a mut NormalizedText,
    /// The run of combining characters since the last starter, in input order. NFD sorts each
    /// run by combining class; it is flushed when the next starter arrives.
    pending: Vec<Pending>,
    /// Original range given to the last "first" character of a decomposition. HF assigns
    /// alignments by position after reordering: a first character takes the next source's
    /// range, any other character the range taken last. We do the same.
    last: (usize, usize),
    /// Scratch for [`Self::flush`]: source ranges of the run, in input order.
    sources: Vec<(usize, usize)>,
}

impl Pass<'_> {
    /// The last step: lowercase (when asked) and append.
    #[inline]
    fn emit(&mut self, c: char, orig: (usize, usize)) {
        if self.cfg.lowercase {
            for l in c.to_lowercase() {
                self.out.push(l, orig);
            }
        } else {
            self.out.push(c, orig);
        }
    }

    /// Emits the pending run in canonical order, dropping nonspacing marks.
    fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let mut run = std::mem::take(&mut self.pending);
        let mut sources = std::mem::take(&mut self.sources);
        sources.extend(run.iter().filter(|p| p.first).map(|p| p.orig));
        // Stable sort: equal classes keep their input order, as canonical ordering requires.
        run.sort_by_key(|p| p.ccc);
        let mut next = sources.iter();
        for p in &run {
            if p.first {
                if let Some(&a) = next.next() {
                    self.last = a;
                }
            }
            if !is_mark_nonspacing(p.c) {
                self.emit(p.c, self.last);
            }
        }
        run.clear();
        sources.clear();
        self.pending = run;
        self.sources = sources;
    }

    /// The accent step (NFD, canonical reordering, drop nonspacing marks), then [`Self::emit`].
    #[inline]
    fn strip_then_emit(&mut self, c: char, orig: (usize, usize)) {
        if !self.cfg.strip_accents {
            self.emit(c, orig);
            return;
        }
        let mut first = true;
        decompose_canonical(c, |d| {
            let ccc = combining_class(d);
            if ccc == 0 {
                self.flush();
                if first {
                    self.last = orig;
                }
                if !is_mark_nonspacing(d) {
                    self.emit(d, self.last);
                }
            } else {
                self.pending.push(Pending {
                    c: d,
                    ccc,
                    first,
                    orig,
                });
            }
            first = false;
        });
    }

    fn char(&mut self, c: char, orig: (usize, usize)) {
        if c.is_ascii() {
            self.ascii(c as u8, orig);
            return;
        }
        if is_plain(c) {
            self.flush();
            self.last = orig;
            self.out.push(c, orig);
            return;
        }
        let mut c = c;
        if self.cfg.clean_text {
            if c == '\u{FFFD}' || is_control(c) {
                return;
            }
            if is_bert_whitespace(c) {
                c = ' ';
            }
        }
        if self.cfg.handle_chinese_chars && is_chinese_char(c) {
            self.strip_then_emit(' ', orig);
            self.strip_then_emit(c, orig);
            self.strip_then_emit(' ', orig);
        } else {
            self.strip_then_emit(c, orig);
        }
    }

    #[inline]
    fn ascii(&mut self, b: u8, orig: (usize, usize)) {
        let mut b = b;
        if self.cfg.clean_text {
            match b {
                b'\t' | b'\n' | b'\r' => b = b' ',
                0..=0x1f | 0x7f => return,
                _ => {}
            }
        }
        if !self.pending.is_empty() {
            self.flush();
        }
        self.last = orig;
        if self.cfg.lowercase {
            b = b.to_ascii_lowercase();
        }
        self.out.text.push(b as char);
        self.out.align.push(orig);
    }
}

impl BertNormalizer {
    /// Normalizes `input` (whose first byte sits at original offset `base`) into `out`, which is
    /// cleared first.
    pub fn normalize(&self, input: &str, base: usize, out: &mut NormalizedText) {
        out.clear();
        out.text.reserve(input.len());
        out.align.reserve(input.len());
        let mut pass = Pass {
            cfg: self,
            out,
            pending: Vec::new(),
            last: (base, base),
            sources: Vec::new(),
        };
        let bytes = input.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            if b < 0x80 {
                pass.ascii(b, (base + i, base + i + 1));
                i += 1;
                continue;
            }
            let Some(c) = input[i..].chars().next() else {
                break;
            };
            let len = c.len_utf8();
            pass.char(c, (base + i, base + i + len));
            i += len;
        }
        pass.flush();
    }

    /// Normalizes a standalone string.
    #[cfg(test)]
    pub fn normalize_str(&self, input: &str) -> String {
        let mut out = NormalizedText::default();
        self.normalize(input, 0, &mut out);
        out.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(s: &str) -> String {
        BertNormalizer::default().normalize_str(s)
    }

    #[test]
    fn bert_defaults() {
        assert_eq!(norm("Héllo\tWÖRLD\u{0}\u{200B}!"), "hello world!");
        assert_eq!(norm("中文"), " 中  文 ");
        assert_eq!(norm("İstanbul"), "istanbul");
        assert_eq!(norm("한"), "\u{1112}\u{1161}\u{11AB}");
        assert_eq!(norm("ﬁ ½"), "ﬁ ½");
    }

    #[test]
    fn alignment_points_at_source_chars() {
        let mut out = NormalizedText::default();
        BertNormalizer::default().normalize("aÉ中", 10, &mut out);
        assert_eq!(out.text, "ae 中 ");
        assert_eq!(out.original_range(1, 2), (11, 13));
        assert_eq!(out.original_range(3, 6), (13, 16));
    }

    #[test]
    fn canonical_reordering_of_kept_marks() {
        // Two spacing combining marks (ccc 226 then 216) are put in canonical order; alignments
        // stay with the positions, as in HF.
        let mut out = NormalizedText::default();
        BertNormalizer::default().normalize("x\u{1D16D}\u{1D165}", 0, &mut out);
        assert_eq!(out.text, "x\u{1D165}\u{1D16D}");
        assert_eq!(out.original_range(1, 5), (1, 5));
        assert_eq!(out.original_range(5, 9), (5, 9));
    }

    #[test]
    fn flags_off_is_identity() {
        let n = BertNormalizer {
            clean_text: false,
            handle_chinese_chars: false,
            strip_accents: false,
            lowercase: false,
        };
        assert_eq!(n.normalize_str("Ä\t中\u{0}"), "Ä\t中\u{0}");
    }
}
