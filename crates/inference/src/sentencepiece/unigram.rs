//! The Unigram segmentation model: Viterbi over piece scores.
//!
//! [`Unigram`] owns the vocabulary (piece, score, type), a byte trie over the pieces that can be
//! produced, and SentencePiece's optimized Viterbi (`UnigramModel::EncodeOptimized`): the best
//! path maximizes the sum of `f32` piece scores; a character that no single-character piece
//! covers becomes the unknown piece with score `min_score - 10`; user-defined pieces get the bonus
//! `n_bytes * max_score - 0.1` so they always win. After segmentation, [`Unigram::encode`] applies
//! SentencePiece's post-processing: byte fallback (`<0xXX>` pieces) for unknown text when the model
//! has byte pieces, and otherwise fusion of consecutive unknown pieces into one. Normalization
//! happens before this module (see `charsmap`); decoding lives in the parent module.

use std::collections::HashMap;

use super::model_proto::{Piece, PieceType};

/// Penalty below the lowest piece score given to the unknown piece.
const UNK_PENALTY: f32 = 10.0;

/// A node of the piece trie (shared with the `tokenizer.json` Unigram model).
#[derive(Debug, Clone, Default)]
pub(crate) struct TrieNode {
    /// Outgoing edges `(byte, child node)`, sorted by byte.
    edges: Vec<(u8, u32)>,
    /// For nodes with many edges: child by byte (`u32::MAX` = none), filled after building.
    dense: Option<Box<[u32; 256]>>,
    /// The piece ending here, if any: `(id, score, type)`.
    piece: Option<(u32, f32, PieceType)>,
}

/// Nodes with at least this many edges get a dense 256-entry child table.
const DENSE_MIN_EDGES: usize = 8;

/// One segment of a normalized string: the piece id and its byte range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// The piece id.
    pub id: u32,
    /// Start of the segment in the normalized string (bytes).
    pub start: usize,
    /// End of the segment in the normalized string (bytes, exclusive).
    pub end: usize,
}

/// A Unigram model: vocabulary, scores and a trie over the pieces.
#[derive(Debug, Clone)]
pub struct Unigram {
    /// The vocabulary in id order.
    pieces: Vec<Piece>,
    /// Piece text to id (first occurrence wins).
    piece_to_id: HashMap<String, u32>,
    /// Trie over Normal, UserDefined and Unused pieces; node 0 is the root.
    trie: Vec<TrieNode>,
    /// Id of the unknown piece.
    unk_id: u32,
    /// Score of the unknown piece: lowest normal score minus 10.
    unk_score: f32,
    /// Highest normal score, at least `f32::MIN_POSITIVE` (SentencePiece starts from `FLT_MIN`).
    max_score: f32,
    /// Byte id for each byte value when byte fallback is on.
    byte_ids: Option<Vec<u32>>,
}

impl Unigram {
    /// Builds the model from a SentencePiece piece table. `byte_fallback` turns unknown text into
    /// byte pieces; it needs the model's BYTE pieces (missing ones map to the unknown piece).
    pub fn new(pieces: Vec<Piece>, byte_fallback: bool) -> Result<Self, String> {
        let mut piece_to_id = HashMap::with_capacity(pieces.len());
        let mut trie = vec![TrieNode::default()];
        let mut unk_id = None;
        let mut min_score = f32::MAX;
        let mut max_score = f32::MIN_POSITIVE;
        let mut has_bytes = false;
        let n_pieces = u32::try_from(pieces.len()).map_err(|_| "too many pieces".to_string())?;
        for (id, p) in (0..n_pieces).zip(&pieces) {
            if p.piece.is_empty() {
                return Err(format!("piece {id} is empty"));
            }
            if piece_to_id.insert(p.piece.clone(), id).is_some() {
                return Err(format!("piece {:?} is defined twice", p.piece));
            }
            match p.kind {
                PieceType::Normal => {
                    min_score = min_score.min(p.score);
                    max_score = max_score.max(p.score);
                }
                PieceType::Unknown if unk_id.replace(id).is_some() => {
                    return Err("more than one unknown piece".into());
                }
                PieceType::Byte => has_bytes = true,
                _ => {}
            }
            if matches!(
                p.kind,
                PieceType::Normal | PieceType::UserDefined | PieceType::Unused
            ) {
                insert(&mut trie, p.piece.as_bytes(), (id, p.score, p.kind));
            }
        }
        let unk_id = unk_id.ok_or("the model has no unknown piece")?;
        densify(&mut trie);
        let byte_ids = (byte_fallback && has_bytes).then(|| {
            (0..=255u8)
                .map(|b| {
                    piece_to_id
                        .get(&format!("<0x{b:02X}>"))
                        .copied()
                        .unwrap_or(unk_id)
                })
                .collect()
        });
        Ok(Self {
            pieces,
            piece_to_id,
            trie,
            unk_id,
            unk_score: min_score - UNK_PENALTY,
            max_score,
            byte_ids,
        })
    }

    /// Builds the model from a `tokenizer.json`-style vocabulary: `(piece, score)` in id order, the
    /// unknown id, and whether byte fallback is on (`<0xXX>` pieces then count as byte pieces).
    /// Every other piece is a normal piece. Segmentation then follows SentencePiece (`f32` scores,
    /// unknown score from the normal pieces only); HF `tokenizers` sums in `f64` and takes the
    /// minimum over all pieces, which can differ on exact ties or when `<unk>` scores lowest
    /// (the `tokenizer.json` path follows HF in `tokenizer::unigram`).
    pub fn from_vocab(
        vocab: Vec<(String, f32)>,
        unk_id: u32,
        byte_fallback: bool,
    ) -> Result<Self, String> {
        if unk_id as usize >= vocab.len() {
            return Err(format!(
                "unk_id {unk_id} is outside the vocabulary ({} pieces)",
                vocab.len()
            ));
        }
        let pieces = vocab
            .into_iter()
            .enumerate()
            .map(|(i, (piece, score))| {
                let kind = if i == unk_id as usize {
                    PieceType::Unknown
                } else if byte_fallback && is_byte_piece(&piece) {
                    PieceType::Byte
                } else {
                    PieceType::Normal
                };
                Piece { piece, score, kind }
            })
            .collect();
        Self::new(pieces, byte_fallback)
    }

    /// The vocabulary in id order.
    pub fn pieces(&self) -> &[Piece] {
        &self.pieces
    }

    /// The id of a piece, if it is in the vocabulary.
    pub fn piece_to_id(&self, piece: &str) -> Option<u32> {
        self.piece_to_id.get(piece).copied()
    }

    /// The id of the unknown piece.
    pub fn unk_id(&self) -> u32 {
        self.unk_id
    }

    /// True when unknown text is spelled with byte pieces.
    pub fn byte_fallback(&self) -> bool {
        self.byte_ids.is_some()
    }

    /// The type of piece `id` (`None` when out of range).
    pub fn kind(&self, id: u32) -> Option<PieceType> {
        self.pieces.get(id as usize).map(|p| p.kind)
    }

    /// The best segmentation of an already normalized string, before unknown fusion and byte
    /// fallback.
    pub fn viterbi(&self, normalized: &str) -> Vec<Segment> {
        let bytes = normalized.as_bytes();
        let size = bytes.len();
        // best[i]: (score of the best path ending at byte i, start of its last piece, its id).
        let mut best: Vec<(f32, usize, u32)> = vec![(0.0, usize::MAX, 0); size + 1];
        let mut starts_at = 0;
        while starts_at < size {
            let here = best[starts_at].0;
            let mblen = normalized[starts_at..]
                .chars()
                .next()
                .map_or(1, char::len_utf8);
            let mut has_single_node = false;
            let mut node = 0usize;
            for (key_pos, &b) in bytes.iter().enumerate().skip(starts_at) {
                let Some(next) = child(&self.trie, node, b) else {
                    break;
                };
                node = next;
                let Some((id, piece_score, kind)) = self.trie[node].piece else {
                    continue;
                };
                if kind == PieceType::Unused {
                    continue;
                }
                let end = key_pos + 1;
                let length = end - starts_at;
                let target = &mut best[end];
                if kind == PieceType::UserDefined {
                    let score = length as f64 * f64::from(self.max_score) - 0.1;
                    let candidate = score + f64::from(here);
                    if target.1 == usize::MAX || candidate > f64::from(target.0) {
                        *target = (candidate as f32, starts_at, id);
                    }
                } else {
                    let candidate = piece_score + here;
                    if target.1 == usize::MAX || candidate > target.0 {
                        *target = (candidate, starts_at, id);
                    }
                }
                if length == mblen {
                    has_single_node = true;
                }
            }
            if !has_single_node {
                let candidate = self.unk_score + here;
                let target = &mut best[starts_at + mblen];
                if target.1 == usize::MAX || candidate > target.0 {
                    *target = (candidate, starts_at, self.unk_id);
                }
            }
            starts_at += mblen;
        }
        let mut out = Vec::new();
        let mut end = size;
        while end > 0 {
            let (_, start, id) = best[end];
            if start >= end {
                break;
            }
            out.push(Segment { id, start, end });
            end = start;
        }
        out.reverse();
        out
    }

    /// The ids of [`Unigram::encode`] without building the piece strings.
    pub fn encode_ids(&self, normalized: &str) -> Vec<u32> {
        let segments = self.viterbi(normalized);
        let mut out = Vec::with_capacity(segments.len());
        let mut prev_unk = false;
        for seg in segments {
            let is_unk = seg.id == self.unk_id;
            if is_unk {
                if let Some(byte_ids) = &self.byte_ids {
                    let bytes = &normalized.as_bytes()[seg.start..seg.end];
                    out.extend(bytes.iter().map(|&b| byte_ids[usize::from(b)]));
                    continue;
                }
                if prev_unk {
                    continue;
                }
            }
            out.push(seg.id);
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
        for seg in self.viterbi(normalized) {
            let text = &normalized[seg.start..seg.end];
            let is_unk = seg.id == self.unk_id;
            if is_unk {
                if let Some(byte_ids) = &self.byte_ids {
                    for &b in text.as_bytes() {
                        out.push((byte_ids[usize::from(b)], format!("<0x{b:02X}>")));
                    }
                    continue;
                }
            }
            match out.last_mut() {
                Some(last) if is_unk && prev_unk => last.1.push_str(text),
                _ => out.push((seg.id, text.to_string())),
            }
            prev_unk = is_unk;
        }
        out
    }
}

/// Gives nodes with many edges a dense child table; call once after the last [`insert`].
pub(crate) fn densify(trie: &mut [TrieNode]) {
    for node in trie {
        if node.edges.len() >= DENSE_MIN_EDGES {
            let mut dense = Box::new([u32::MAX; 256]);
            for &(b, next) in &node.edges {
                dense[usize::from(b)] = next;
            }
            node.dense = Some(dense);
        }
    }
}

/// The piece ending at `node`: `(id, score, type)`.
pub(crate) fn piece_at(trie: &[TrieNode], node: usize) -> Option<(u32, f32, PieceType)> {
    trie.get(node).and_then(|n| n.piece)
}

/// True for a piece spelled `<0xXX>` with two upper-case hex digits.
fn is_byte_piece(piece: &str) -> bool {
    let b = piece.as_bytes();
    b.len() == 6
        && piece.starts_with("<0x")
        && piece.ends_with('>')
        && b[3..5]
            .iter()
            .all(|c| c.is_ascii_digit() || (b'A'..=b'F').contains(c))
}

/// The child of `node` along byte `b`.
pub(crate) fn child(trie: &[TrieNode], node: usize, b: u8) -> Option<usize> {
    let node = trie.get(node)?;
    if let Some(dense) = &node.dense {
        let next = dense[usize::from(b)];
        return (next != u32::MAX).then_some(next as usize);
    }
    let edges = &node.edges;
    edges
        .binary_search_by_key(&b, |e| e.0)
        .ok()
        .map(|i| edges[i].1 as usize)
}

/// Adds `key` to the trie (node 0 is the root); the first piece inserted for a key is kept.
pub(crate) fn insert(trie: &mut Vec<TrieNode>, key: &[u8], piece: (u32, f32, PieceType)) {
    let mut node = 0usize;
    for &b in key {
        node = match trie[node].edges.binary_search_by_key(&b, |e| e.0) {
            Ok(i) => trie[node].edges[i].1 as usize,
            Err(i) => {
                let next = trie.len();
                trie.push(TrieNode::default());
                // The trie has at most one node per vocabulary byte, far below u32::MAX.
                trie[node].edges.insert(i, (b, next as u32));
                next
            }
        };
    }
    if trie[node].piece.is_none() {
        trie[node].piece = Some(piece);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toy() -> Unigram {
        let vocab = vec![
            ("<unk>".to_string(), 0.0),
            ("a".to_string(), -1.0),
            ("b".to_string(), -2.0),
            ("ab".to_string(), -2.5),
        ];
        Unigram::from_vocab(vocab, 0, false).expect("valid vocab")
    }

    #[test]
    fn viterbi_prefers_the_higher_total_score() {
        let m = toy();
        let ids: Vec<u32> = m.encode("abab").iter().map(|p| p.0).collect();
        assert_eq!(ids, vec![3, 3]);
    }

    #[test]
    fn unknown_runs_are_fused() {
        let m = toy();
        let out = m.encode("a\u{e9}\u{e8}b");
        assert_eq!(
            out,
            vec![
                (1, "a".to_string()),
                (0, "\u{e9}\u{e8}".to_string()),
                (2, "b".to_string())
            ]
        );
    }
}
