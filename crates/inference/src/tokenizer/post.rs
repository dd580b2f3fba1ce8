//! Post-processing: truncation of one or two token sequences to a length budget (HF
//! `longest_first`), then the special tokens and type ids of `BertProcessing`,
//! `RobertaProcessing` or `TemplateProcessing`, all three held as one template, and the offset
//! trimming of RoBERTa and `ByteLevel` (`trim_offsets`). This module does not tokenize text; it
//! works on the token lists [`super::Tokenizer`] produced.

use super::Encoding;

/// Tokens of one input sequence before post-processing.
#[derive(Debug, Clone, Default)]
pub(crate) struct SeqTokens {
    /// Token ids.
    pub ids: Vec<u32>,
    /// Token strings.
    pub tokens: Vec<String>,
    /// Byte offsets into the input.
    pub offsets: Vec<(usize, usize)>,
}

impl SeqTokens {
    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Keeps the first `n` tokens.
    pub fn truncate(&mut self, n: usize) {
        self.ids.truncate(n);
        self.tokens.truncate(n);
        self.offsets.truncate(n);
    }
}

/// One element of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Piece {
    /// A special token (possibly several ids) with this type id.
    Special {
        /// Ids to insert.
        ids: Vec<u32>,
        /// Their token strings.
        tokens: Vec<String>,
        /// Type id of each.
        type_id: u32,
    },
    /// The first sequence, with this type id.
    A(u32),
    /// The second sequence, with this type id.
    B(u32),
}

/// A post-processor: templates for one and two sequences, plus RoBERTa / `ByteLevel` offset
/// trimming.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PostProcessor {
    single: Vec<Piece>,
    pair: Vec<Piece>,
    /// `Some(add_prefix_space)` when offsets are trimmed of surrounding whitespace (RoBERTa,
    /// `ByteLevel` with `trim_offsets`).
    trim_offsets: Option<bool>,
}

fn special(token: &(String, u32), type_id: u32) -> Piece {
    Piece::Special {
        ids: vec![token.1],
        tokens: vec![token.0.clone()],
        type_id,
    }
}

impl PostProcessor {
    /// `BertProcessing`: `[CLS] A [SEP]` and `[CLS] A [SEP] B [SEP]`, B part with type id 1.
    pub fn bert(cls: (String, u32), sep: (String, u32)) -> Self {
        Self {
            single: vec![special(&cls, 0), Piece::A(0), special(&sep, 0)],
            pair: vec![
                special(&cls, 0),
                Piece::A(0),
                special(&sep, 0),
                Piece::B(1),
                special(&sep, 1),
            ],
            trim_offsets: None,
        }
    }

    /// `RobertaProcessing`: `<s> A </s>` and `<s> A </s> </s> B </s>`, every type id 0.
    pub fn roberta(
        cls: (String, u32),
        sep: (String, u32),
        trim_offsets: bool,
        add_prefix_space: bool,
    ) -> Self {
        Self {
            single: vec![special(&cls, 0), Piece::A(0), special(&sep, 0)],
            pair: vec![
                special(&cls, 0),
                Piece::A(0),
                special(&sep, 0),
                special(&sep, 0),
                Piece::B(0),
                special(&sep, 0),
            ],
            trim_offsets: trim_offsets.then_some(add_prefix_space),
        }
    }

    /// `TemplateProcessing` (the caller checks `single` has `A` and `pair` has `A` and `B`).
    pub fn template(single: Vec<Piece>, pair: Vec<Piece>) -> Self {
        Self {
            single,
            pair,
            trim_offsets: None,
        }
    }

    /// `ByteLevel` with `trim_offsets`: no tokens added (A with type id 0, B with 1), offsets
    /// trimmed.
    pub fn trim_only(add_prefix_space: bool) -> Self {
        Self {
            single: vec![Piece::A(0)],
            pair: vec![Piece::A(0), Piece::B(1)],
            trim_offsets: Some(add_prefix_space),
        }
    }

    fn is_trim_only(&self) -> bool {
        self.added_tokens(true) == 0 && self.added_tokens(false) == 0
    }

    /// Combines two processors of a `Sequence` when at most one of them adds tokens; the
    /// other's offset trimming carries over. `None` when both add tokens.
    pub fn merge(self, other: Self) -> Option<Self> {
        let (mut keep, extra) = if other.is_trim_only() {
            (self, other)
        } else if self.is_trim_only() {
            (other, self)
        } else {
            return None;
        };
        keep.trim_offsets = keep.trim_offsets.or(extra.trim_offsets);
        Some(keep)
    }

    fn template_for(&self, is_pair: bool) -> &[Piece] {
        if is_pair {
            &self.pair
        } else {
            &self.single
        }
    }

    /// How many special tokens the template adds.
    pub fn added_tokens(&self, is_pair: bool) -> usize {
        self.template_for(is_pair)
            .iter()
            .map(|p| match p {
                Piece::Special { ids, .. } => ids.len(),
                _ => 0,
            })
            .sum()
    }

    /// Builds the final encoding. Without special tokens the sequences keep the type ids their
    /// template gives them.
    pub fn process(
        &self,
        mut a: SeqTokens,
        mut b: Option<SeqTokens>,
        add_special_tokens: bool,
    ) -> Encoding {
        if let Some(add_prefix_space) = self.trim_offsets {
            trim_offsets(&mut a, add_prefix_space);
            if let Some(b) = b.as_mut() {
                trim_offsets(b, add_prefix_space);
            }
        }
        let template = self.template_for(b.is_some());
        let mut enc = Encoding::with_capacity(
            a.len() + b.as_ref().map_or(0, SeqTokens::len) + self.added_tokens(b.is_some()),
        );
        for piece in template {
            match piece {
                Piece::Special {
                    ids,
                    tokens,
                    type_id,
                } if add_special_tokens => {
                    for (id, tok) in ids.iter().zip(tokens) {
                        enc.push(*id, *type_id, tok.clone(), (0, 0), 1);
                    }
                }
                Piece::Special { .. } => {}
                Piece::A(type_id) => enc.append(&mut a, *type_id),
                Piece::B(type_id) => {
                    if let Some(b) = b.as_mut() {
                        enc.append(b, *type_id);
                    }
                }
            }
        }
        enc
    }
}

/// Without a post-processor: A with type id 0, then B with type id 1.
pub(crate) fn concat(mut a: SeqTokens, b: Option<SeqTokens>) -> Encoding {
    let mut enc = Encoding::with_capacity(a.len() + b.as_ref().map_or(0, SeqTokens::len));
    enc.append(&mut a, 0);
    if let Some(mut b) = b {
        enc.append(&mut b, 1);
    }
    enc
}

/// RoBERTa's / `ByteLevel`'s offset trimming: offsets of tokens whose text starts or ends with
/// whitespace (or the byte-level space `Ġ`) shrink to exclude it. HF adds the number of
/// *characters* to a byte offset; we add the input bytes they stand for (1 for `Ġ`, the UTF-8
/// length of a real whitespace character), which is the same for byte-level tokens and keeps
/// byte offsets on character boundaries otherwise.
fn trim_offsets(seq: &mut SeqTokens, add_prefix_space: bool) {
    let is_space = |c: char| c == '\u{120}' || c.is_whitespace();
    let input_len = |c: char| if c == '\u{120}' { 1 } else { c.len_utf8() };
    for (i, (tok, off)) in seq.tokens.iter().zip(seq.offsets.iter_mut()).enumerate() {
        let lead_chars = tok.chars().take_while(|&c| is_space(c)).count();
        let lead: usize = tok.chars().take(lead_chars).map(input_len).sum();
        let trail: usize = tok
            .chars()
            .rev()
            .take_while(|&c| is_space(c))
            .map(input_len)
            .sum();
        if lead > 0 {
            let is_first = i == 0 || off.0 == 0;
            if !(is_first && add_prefix_space && lead_chars == 1) {
                off.0 = (off.0 + lead).min(off.1);
            }
        }
        if trail > 0 && off.1 >= trail {
            off.1 = (off.1 - trail).max(off.0);
        }
    }
}

/// Token counts to keep for HF `longest_first` truncation of sequences of `len_a` and `len_b`
/// tokens to `max_len` tokens in all (special tokens already subtracted).
pub(crate) fn longest_first(
    len_a: usize,
    len_b: Option<usize>,
    max_len: usize,
) -> (usize, Option<usize>) {
    let total = len_a + len_b.unwrap_or(0);
    if total <= max_len {
        return (len_a, len_b);
    }
    let Some(len_b) = len_b else {
        return (max_len, None);
    };
    let swap = len_a > len_b;
    let mut n1 = len_a.min(len_b);
    // n1 is the shorter one. Keep it whole if the longer one can absorb the cut.
    let mut n2 = if n1 > max_len {
        n1
    } else {
        n1.max(max_len - n1)
    };
    if n1 + n2 > max_len {
        n1 = max_len / 2;
        n2 = n1 + max_len % 2;
    }
    if swap {
        (n2, Some(n1))
    } else {
        (n1, Some(n2))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(ids: &[u32]) -> SeqTokens {
        SeqTokens {
            ids: ids.to_vec(),
            tokens: ids.iter().map(|i| i.to_string()).collect(),
            offsets: ids.iter().map(|&i| (i as usize, i as usize + 1)).collect(),
        }
    }

    #[test]
    fn longest_first_matches_hf() {
        assert_eq!(longest_first(3, None, 5), (3, None));
        assert_eq!(longest_first(9, None, 5), (5, None));
        assert_eq!(longest_first(7, Some(10), 2), (1, Some(1)));
        assert_eq!(longest_first(7, Some(2), 2), (1, Some(1)));
        assert_eq!(longest_first(60, Some(100), 100), (50, Some(50)));
        assert_eq!(longest_first(10, Some(100), 50), (10, Some(40)));
        assert_eq!(longest_first(8, Some(4), 3), (2, Some(1)));
    }

    #[test]
    fn bert_pair_layout() {
        let p = PostProcessor::bert(("[CLS]".into(), 101), ("[SEP]".into(), 102));
        let e = p.process(seq(&[1, 2]), Some(seq(&[3])), true);
        assert_eq!(e.ids, [101, 1, 2, 102, 3, 102]);
        assert_eq!(e.type_ids, [0, 0, 0, 0, 1, 1]);
        assert_eq!(e.special_tokens_mask, [1, 0, 0, 1, 0, 1]);
        assert_eq!(p.added_tokens(true), 3);
        let e = p.process(seq(&[1]), Some(seq(&[3])), false);
        assert_eq!((e.ids, e.type_ids), (vec![1, 3], vec![0, 1]));
    }

    #[test]
    fn roberta_trims_leading_space() {
        let p = PostProcessor::roberta(("<s>".into(), 0), ("</s>".into(), 2), true, false);
        let mut a = seq(&[7]);
        a.tokens[0] = " <mask>".into();
        a.offsets[0] = (4, 11);
        let e = p.process(a, None, true);
        assert_eq!(e.offsets, [(0, 0), (5, 11), (0, 0)]);
    }
}
