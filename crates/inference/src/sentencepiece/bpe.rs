//! The SentencePiece BPE segmentation model (`bpe::Model::SampleEncode` without dropout).
//!
//! SentencePiece BPE keeps no merge list: the normalized text starts as one symbol per character
//! (a user-defined piece found at a position is taken whole and frozen), and the adjacent pair
//! whose concatenation is a piece with the highest score is merged, again and again, until no
//! adjacent pair forms a piece. Ties go to the leftmost pair. A merged piece of type UNUSED is
//! split back into the two symbols it was made from. Each final symbol gets its id (reserved
//! pieces first, then normal ones, else the unknown id); as in `SentencePieceProcessor::Encode`,
//! unknown symbols then become `<0xXX>` byte pieces when the model has byte fallback, and runs of
//! unknown symbols are fused into one otherwise. Normalization happens before this module (see
//! `charsmap`); decoding lives in the parent module.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use super::model_proto::{Piece, PieceType};
use super::unigram::{child, densify, insert, piece_at, TrieNode};

/// A SentencePiece BPE model: the vocabulary and its two lookup tables.
#[derive(Debug, Clone)]
pub struct Bpe {
    /// The vocabulary in id order.
    pieces: Vec<Piece>,
    /// Normal, user-defined and unused pieces: the ones merges can produce.
    normal: HashMap<String, u32>,
    /// Control, unknown and byte pieces (looked up first, as SentencePiece's `reserved_id_map_`).
    reserved: HashMap<String, u32>,
    /// Trie over the user-defined pieces (node 0 is the root; a lone root means none).
    user_trie: Vec<TrieNode>,
    /// Id of the unknown piece.
    unk_id: u32,
    /// The id of `<0xXX>` for each byte when byte fallback is on (the unknown id where missing).
    byte_ids: Option<Vec<u32>>,
}

/// A symbol of the merge loop: a byte range of the normalized text and its neighbours.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    /// Index of the previous live symbol (`usize::MAX` for none).
    prev: usize,
    /// Index of the next live symbol (`usize::MAX` for none).
    next: usize,
    /// Start of the symbol in the normalized text (bytes).
    start: usize,
    /// Length in bytes; 0 once merged into its left neighbour.
    len: usize,
    /// A user-defined piece: never merged.
    freeze: bool,
}

/// A candidate merge of the symbols `left` and `right` into a piece of `size` bytes.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Candidate {}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Candidate {
    /// The max-heap pops the highest score first, then the leftmost pair (SentencePiece's
    /// `SymbolPairComparator`; equal floats, `-0.0` and `0.0` included, compare equal).
    fn cmp(&self, other: &Self) -> Ordering {
        let by_score = if self.score < other.score {
            Ordering::Less
        } else if self.score > other.score {
            Ordering::Greater
        } else {
            Ordering::Equal
        };
        by_score.then_with(|| other.left.cmp(&self.left))
    }
}

/// No neighbour.
const NONE: usize = usize::MAX;

impl Bpe {
    /// Builds the model from a SentencePiece piece table. `byte_fallback` (the trainer spec's flag)
    /// turns unknown text into `<0xXX>` pieces (the unknown id where the model lacks one).
    pub fn new(pieces: Vec<Piece>, byte_fallback: bool) -> Result<Self, String> {
        let mut normal = HashMap::with_capacity(pieces.len());
        let mut reserved = HashMap::new();
        let mut user_trie = vec![TrieNode::default()];
        let mut unk_id = None;
        let n_pieces = u32::try_from(pieces.len()).map_err(|_| "too many pieces".to_string())?;
        for (id, p) in (0..n_pieces).zip(&pieces) {
            if p.piece.is_empty() {
                return Err(format!("piece {id} is empty"));
            }
            let table = match p.kind {
                PieceType::Normal | PieceType::UserDefined | PieceType::Unused => &mut normal,
                PieceType::Control | PieceType::Unknown | PieceType::Byte => &mut reserved,
            };
            if table.insert(p.piece.clone(), id).is_some() {
                return Err(format!("piece {:?} is defined twice", p.piece));
            }
            match p.kind {
                PieceType::Unknown if unk_id.replace(id).is_some() => {
                    return Err("more than one unknown piece".into());
                }
                PieceType::UserDefined => {
                    insert(&mut user_trie, p.piece.as_bytes(), (id, p.score, p.kind));
                }
                _ => {}
            }
        }
        let unk_id = unk_id.ok_or("the model has no unknown piece")?;
        densify(&mut user_trie);
        let byte_ids = byte_fallback.then(|| {
            (0..=255u8)
                .map(|b| {
                    reserved
                        .get(&format!("<0x{b:02X}>"))
                        .or_else(|| normal.get(&format!("<0x{b:02X}>")))
                        .copied()
                        .unwrap_or(unk_id)
                })
                .collect()
        });
        Ok(Self {
            pieces,
            normal,
            reserved,
            user_trie,
            unk_id,
            byte_ids,
        })
    }

    /// The vocabulary in id order.
    pub fn pieces(&self) -> &[Piece] {
        &self.pieces
    }

    /// The id of a piece (`SentencePiece`'s `PieceToId` without the unknown default).
    pub fn piece_to_id(&self, piece: &str) -> Option<u32> {
        self.reserved
            .get(piece)
            .or_else(|| self.normal.get(piece))
            .copied()
    }

    /// The id of the unknown piece.
    pub fn unk_id(&self) -> u32 {
        self.unk_id
    }

    /// True when unknown text is spelled with byte pieces.
    pub fn byte_fallback(&self) -> bool {
        self.byte_ids.is_some()
    }

    /// Length of the first symbol of `text`: the longest user-defined piece it starts with
    /// (frozen), else one character.
    fn first_symbol(&self, text: &str) -> (usize, bool) {
        let mut node = 0usize;
        let mut longest = 0usize;
        if self.user_trie.len() > 1 {
            for (i, &b) in text.as_bytes().iter().enumerate() {
                let Some(next) = child(&self.user_trie, node, b) else {
                    break;
                };
                node = next;
                if piece_at(&self.user_trie, node).is_some() {
                    longest = i + 1;
                }
            }
        }
        if longest > 0 {
            (longest, true)
        } else {
            (text.chars().next().map_or(1, char::len_utf8), false)
        }
    }

    /// The merged segmentation of an already normalized string, as `(piece text, id)` before
    /// byte fallback and unknown fusion.
    pub fn segment<'t>(&self, normalized: &'t str) -> Vec<(&'t str, u32)> {
        let mut symbols: Vec<Symbol> = Vec::with_capacity(normalized.len());
        let mut pos = 0;
        while pos < normalized.len() {
            let (len, freeze) = self.first_symbol(&normalized[pos..]);
            let index = symbols.len();
            symbols.push(Symbol {
                prev: if index == 0 { NONE } else { index - 1 },
                next: if pos + len < normalized.len() {
                    index + 1
                } else {
                    NONE
                },
                start: pos,
                len,
                freeze,
            });
            pos += len;
        }
        if symbols.is_empty() {
            return Vec::new();
        }
        let mut agenda: BinaryHeap<Candidate> = BinaryHeap::with_capacity(symbols.len());
        // Merged UNUSED pieces: how to split them back (the last pair seen for a text wins).
        let mut rev_merge: HashMap<&'t str, (&'t str, &'t str)> = HashMap::new();
        let text_of = |s: &Symbol| &normalized[s.start..s.start + s.len];
        let mut add_pair =
            |symbols: &[Symbol], agenda: &mut BinaryHeap<Candidate>, left: usize, right: usize| {
                if left == NONE || right == NONE {
                    return;
                }
                let (l, r) = (&symbols[left], &symbols[right]);
                if l.freeze || r.freeze {
                    return;
                }
                let size = l.len + r.len;
                let merged = &normalized[l.start..l.start + size];
                let Some(&id) = self.normal.get(merged) else {
                    return;
                };
                let piece = &self.pieces[id as usize];
                agenda.push(Candidate {
                    score: piece.score,
                    left,
                    right,
                    size,
                });
                if piece.kind == PieceType::Unused {
                    rev_merge.insert(merged, (text_of(l), text_of(r)));
                }
            };
        for i in 1..symbols.len() {
            add_pair(&symbols, &mut agenda, i - 1, i);
        }
        while let Some(top) = agenda.pop() {
            let (l, r) = (symbols[top.left], symbols[top.right]);
            if l.len == 0 || r.len == 0 || l.len + r.len != top.size {
                continue;
            }
            symbols[top.left].len = top.size;
            symbols[top.left].next = r.next;
            if r.next != NONE {
                symbols[r.next].prev = top.left;
            }
            symbols[top.right].len = 0;
            add_pair(&symbols, &mut agenda, l.prev, top.left);
            add_pair(&symbols, &mut agenda, top.left, r.next);
        }
        let mut out = Vec::with_capacity(symbols.len());
        let mut index = 0;
        while index != NONE {
            let s = &symbols[index];
            self.resegment(&normalized[s.start..s.start + s.len], &rev_merge, &mut out);
            index = s.next;
        }
        out
    }

    /// Appends `piece` with its id, splitting merged UNUSED pieces back into their parts.
    fn resegment<'t>(
        &self,
        piece: &'t str,
        rev_merge: &HashMap<&'t str, (&'t str, &'t str)>,
        out: &mut Vec<(&'t str, u32)>,
    ) {
        let id = self.piece_to_id(piece).unwrap_or(self.unk_id);
        if self.pieces[id as usize].kind == PieceType::Unused {
            // Both parts are non-empty, so each call is on a shorter string.
            if let Some(&(left, right)) = rev_merge.get(piece) {
                self.resegment(left, rev_merge, out);
                self.resegment(right, rev_merge, out);
                return;
            }
        }
        out.push((piece, id));
    }

    /// The ids of [`Bpe::encode`] without building the piece strings.
    pub fn encode_ids(&self, normalized: &str) -> Vec<u32> {
        let mut out = Vec::new();
        let mut prev_unk = false;
        for (text, id) in self.segment(normalized) {
            let is_unk = id == self.unk_id;
            if is_unk {
                if let Some(byte_ids) = &self.byte_ids {
                    out.extend(text.bytes().map(|b| byte_ids[usize::from(b)]));
                    prev_unk = true;
                    continue;
                }
                if prev_unk {
                    continue;
                }
            }
            out.push(id);
            prev_unk = is_unk;
        }
        out
    }

    /// Segments a normalized string into `(id, piece text)` the way `SentencePieceProcessor`
    /// reports it: unknown text becomes byte pieces under byte fallback, otherwise a run of unknown
    /// pieces is fused into one.
    pub fn encode(&self, normalized: &str) -> Vec<(u32, String)> {
        let mut out: Vec<(u32, String)> = Vec::new();
        let mut prev_unk = false;
        for (text, id) in self.segment(normalized) {
            let is_unk = id == self.unk_id;
            if is_unk {
                if let Some(byte_ids) = &self.byte_ids {
                    for b in text.bytes() {
                        out.push((byte_ids[usize::from(b)], format!("<0x{b:02X}>")));
                    }
                    prev_unk = true;
                    continue;
                }
            }
            match out.last_mut() {
                Some(last) if is_unk && prev_unk => last.1.push_str(text),
                _ => out.push((id, text.to_string())),
            }
            prev_unk = is_unk;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(text: &str, score: f32, kind: PieceType) -> Piece {
        Piece {
            piece: text.to_string(),
            score,
            kind,
        }
    }

    fn toy(byte_fallback: bool) -> Bpe {
        let mut pieces = vec![
            piece("<unk>", 0.0, PieceType::Unknown),
            piece("a", -1.0, PieceType::Normal),
            piece("b", -1.0, PieceType::Normal),
            piece("c", -1.0, PieceType::Normal),
            piece("ab", -3.0, PieceType::Normal),
            piece("bc", -2.0, PieceType::Normal),
            piece("cab", -4.0, PieceType::Normal),
            piece("<u>", 0.0, PieceType::UserDefined),
        ];
        if byte_fallback {
            pieces
                .extend((0..=255u8).map(|b| piece(&format!("<0x{b:02X}>"), 0.0, PieceType::Byte)));
        }
        Bpe::new(pieces, byte_fallback).expect("valid pieces")
    }

    #[test]
    fn merges_the_highest_scoring_pair_first() {
        let m = toy(false);
        // "bc" (-2) beats "ab" (-3), and "a"+"bc" is not a piece.
        assert_eq!(m.encode_ids("abc"), vec![1, 5]);
        // Merged symbols merge again: "c"+"ab" is the piece "cab".
        assert_eq!(m.encode_ids("cab"), vec![6]);
        // Equal scores: the leftmost pair merges first.
        assert_eq!(m.encode_ids("abab"), vec![4, 4]);
    }

    #[test]
    fn user_pieces_are_frozen_and_unknowns_fuse_or_fall_back_to_bytes() {
        let m = toy(false);
        assert_eq!(m.encode_ids("a<u>bc"), vec![1, 7, 5]);
        let pieces = m.encode("\u{e9}\u{e8}a");
        assert_eq!(
            pieces,
            vec![(0, "\u{e9}\u{e8}".to_string()), (1, "a".to_string())]
        );
        let m = toy(true);
        let ids = m.encode_ids("\u{e9}a");
        let byte = |b: u8| m.piece_to_id(&format!("<0x{b:02X}>")).expect("byte piece");
        assert_eq!(ids, vec![byte(0xc3), byte(0xa9), 1]);
    }
}
