//! A minimal, bounds-checked reader for SentencePiece `.model` files (protobuf `ModelProto`).
//!
//! This module owns the protobuf wire format (varints, fixed32, length-delimited fields) and the
//! three messages the encoder needs: the piece table, `TrainerSpec` and `NormalizerSpec`. Unknown
//! fields are skipped, absent fields take the proto2 defaults of `sentencepiece_model.proto`. It does
//! not interpret the fields: normalization lives in `charsmap`, segmentation in `unigram`. Every read
//! is checked against the buffer, so a truncated or corrupt file gives an error, never a panic, and
//! no allocation is larger than the file itself.

/// The type of one piece in the vocabulary (`ModelProto.SentencePiece.Type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PieceType {
    /// An ordinary piece, found by segmentation.
    Normal,
    /// The unknown piece (`<unk>`).
    Unknown,
    /// A control symbol (`<s>`, `</s>`): never produced from text, invisible on decode.
    Control,
    /// A user-defined symbol: always matched whole, before normalization.
    UserDefined,
    /// A byte piece (`<0x41>`) used by byte fallback.
    Byte,
    /// A piece kept in the table but never produced.
    Unused,
}

impl PieceType {
    fn from_wire(v: u64) -> Option<Self> {
        Some(match v {
            1 => Self::Normal,
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => return None,
        })
    }
}

/// One vocabulary entry: its text, its log-probability score and its type.
#[derive(Debug, Clone, PartialEq)]
pub struct Piece {
    /// The piece's text (`▁` stands for a space).
    pub piece: String,
    /// The piece's score (a log probability for Unigram, a merge priority for BPE).
    pub score: f32,
    /// The piece's type.
    pub kind: PieceType,
}

/// The segmentation algorithm a model was trained for (`TrainerSpec.ModelType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelType {
    /// Unigram language model (Viterbi over piece scores).
    Unigram,
    /// Byte-pair encoding.
    Bpe,
    /// Whitespace-delimited words.
    Word,
    /// Single characters.
    Char,
}

/// The fields of `TrainerSpec` that matter at encode time.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainerSpec {
    /// Segmentation algorithm (default Unigram).
    pub model_type: ModelType,
    /// Vocabulary size the model was trained with.
    pub vocab_size: i32,
    /// Unknown characters are decomposed into `<0xXX>` byte pieces.
    pub byte_fallback: bool,
    /// Whitespace is attached to the end of a piece rather than the start.
    pub treat_whitespace_as_suffix: bool,
    /// Digits are split into single characters.
    pub split_digits: bool,
    /// Pieces may not cross Unicode script boundaries (training-time only).
    pub split_by_unicode_script: bool,
    /// Pieces may not cross whitespace (training-time only).
    pub split_by_whitespace: bool,
    /// Pieces made only of whitespace are allowed.
    pub allow_whitespace_only_pieces: bool,
    /// Id of the unknown piece (default 0).
    pub unk_id: i32,
    /// Id of the beginning-of-sentence piece (default 1, -1 when absent).
    pub bos_id: i32,
    /// Id of the end-of-sentence piece (default 2, -1 when absent).
    pub eos_id: i32,
    /// Id of the padding piece (default -1: absent).
    pub pad_id: i32,
    /// Text that decoding prints for the unknown piece (default `" ⁇ "`).
    pub unk_surface: String,
}

impl Default for TrainerSpec {
    fn default() -> Self {
        Self {
            model_type: ModelType::Unigram,
            vocab_size: 8000,
            byte_fallback: false,
            treat_whitespace_as_suffix: false,
            split_digits: false,
            split_by_unicode_script: true,
            split_by_whitespace: true,
            allow_whitespace_only_pieces: false,
            unk_id: 0,
            bos_id: 1,
            eos_id: 2,
            pad_id: -1,
            unk_surface: " \u{2047} ".to_string(),
        }
    }
}

/// `NormalizerSpec`: how raw text becomes the string that is segmented.
#[derive(Debug, Clone, PartialEq)]
pub struct NormalizerSpec {
    /// Rule name (`nmt_nfkc`, `identity`, ...).
    pub name: String,
    /// The compiled rule set (see `charsmap::CharsMap`); empty for `identity`.
    pub precompiled_charsmap: Vec<u8>,
    /// A `▁` is put before the text (default true).
    pub add_dummy_prefix: bool,
    /// Leading, trailing and repeated spaces are removed (default true).
    pub remove_extra_whitespaces: bool,
    /// Spaces become `▁` (default true).
    pub escape_whitespaces: bool,
}

impl Default for NormalizerSpec {
    fn default() -> Self {
        Self {
            name: String::new(),
            precompiled_charsmap: Vec::new(),
            add_dummy_prefix: true,
            remove_extra_whitespaces: true,
            escape_whitespaces: true,
        }
    }
}

/// A parsed `ModelProto`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelProto {
    /// The vocabulary, in id order.
    pub pieces: Vec<Piece>,
    /// Training-time settings that also drive encoding.
    pub trainer_spec: TrainerSpec,
    /// The normalizer settings.
    pub normalizer_spec: NormalizerSpec,
}

/// Why a protobuf buffer could not be read (turned into `Error::InvalidTokenizer` by the caller).
pub type WireError = String;

/// A cursor over one protobuf message.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

/// One decoded field value.
enum Value<'a> {
    Varint(u64),
    Fixed32(u32),
    Fixed64,
    Bytes(&'a [u8]),
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    fn varint(&mut self) -> Result<u64, WireError> {
        let mut out = 0u64;
        for i in 0..10 {
            let Some(&b) = self.buf.get(self.pos) else {
                return Err(format!("truncated varint at byte {}", self.pos));
            };
            self.pos += 1;
            out |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(out);
            }
        }
        Err(format!("varint longer than 10 bytes at byte {}", self.pos))
    }

    fn take(&mut self, n_bytes: usize) -> Result<&'a [u8], WireError> {
        let end = self
            .pos
            .checked_add(n_bytes)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| {
                format!(
                    "field of {n_bytes} bytes at byte {} runs past the end ({} bytes)",
                    self.pos,
                    self.buf.len()
                )
            })?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    /// Reads the next `(field number, value)`, or `None` at the end of the message.
    fn next_field(&mut self) -> Result<Option<(u64, Value<'a>)>, WireError> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let field = key >> 3;
        let value = match key & 7 {
            0 => Value::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Value::Fixed64
            }
            2 => {
                let len = self.varint()?;
                let len = usize::try_from(len).map_err(|_| format!("length {len} too large"))?;
                Value::Bytes(self.take(len)?)
            }
            5 => {
                let b = self.take(4)?;
                Value::Fixed32(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            }
            w => return Err(format!("unsupported wire type {w} for field {field}")),
        };
        Ok(Some((field, value)))
    }
}

fn as_varint(v: &Value<'_>, what: &str) -> Result<u64, WireError> {
    match v {
        Value::Varint(x) => Ok(*x),
        _ => Err(format!("{what}: expected a varint")),
    }
}

fn as_bool(v: &Value<'_>, what: &str) -> Result<bool, WireError> {
    as_varint(v, what).map(|x| x != 0)
}

/// An `int32` field: negative values are sign-extended 64-bit varints; truncation is the proto rule.
fn as_i32(v: &Value<'_>, what: &str) -> Result<i32, WireError> {
    as_varint(v, what).map(|x| x as i64 as i32)
}

fn as_bytes<'a>(v: &Value<'a>, what: &str) -> Result<&'a [u8], WireError> {
    match v {
        Value::Bytes(b) => Ok(b),
        _ => Err(format!("{what}: expected a length-delimited field")),
    }
}

fn as_string(v: &Value<'_>, what: &str) -> Result<String, WireError> {
    let b = as_bytes(v, what)?;
    String::from_utf8(b.to_vec()).map_err(|_| format!("{what}: not valid UTF-8"))
}

fn parse_piece(buf: &[u8]) -> Result<Piece, WireError> {
    let mut p = Piece {
        piece: String::new(),
        score: 0.0,
        kind: PieceType::Normal,
    };
    let mut r = Reader::new(buf);
    while let Some((field, v)) = r.next_field()? {
        match field {
            1 => p.piece = as_string(&v, "piece")?,
            2 => match v {
                Value::Fixed32(bits) => p.score = f32::from_bits(bits),
                _ => return Err("piece score: expected a fixed32".into()),
            },
            3 => {
                let t = as_varint(&v, "piece type")?;
                p.kind =
                    PieceType::from_wire(t).ok_or_else(|| format!("unknown piece type {t}"))?;
            }
            _ => {}
        }
    }
    Ok(p)
}

fn parse_trainer_spec(buf: &[u8]) -> Result<TrainerSpec, WireError> {
    let mut t = TrainerSpec::default();
    let mut r = Reader::new(buf);
    while let Some((field, v)) = r.next_field()? {
        match field {
            3 => {
                t.model_type = match as_varint(&v, "model_type")? {
                    1 => ModelType::Unigram,
                    2 => ModelType::Bpe,
                    3 => ModelType::Word,
                    4 => ModelType::Char,
                    x => return Err(format!("unknown model_type {x}")),
                }
            }
            4 => t.vocab_size = as_i32(&v, "vocab_size")?,
            24 => t.treat_whitespace_as_suffix = as_bool(&v, "treat_whitespace_as_suffix")?,
            25 => t.split_by_unicode_script = as_bool(&v, "split_by_unicode_script")?,
            26 => t.split_by_whitespace = as_bool(&v, "split_by_whitespace")?,
            27 => t.split_digits = as_bool(&v, "split_digits")?,
            32 => t.allow_whitespace_only_pieces = as_bool(&v, "allow_whitespace_only_pieces")?,
            35 => t.byte_fallback = as_bool(&v, "byte_fallback")?,
            40 => t.unk_id = as_i32(&v, "unk_id")?,
            41 => t.bos_id = as_i32(&v, "bos_id")?,
            42 => t.eos_id = as_i32(&v, "eos_id")?,
            43 => t.pad_id = as_i32(&v, "pad_id")?,
            44 => t.unk_surface = as_string(&v, "unk_surface")?,
            _ => {}
        }
    }
    Ok(t)
}

fn parse_normalizer_spec(buf: &[u8]) -> Result<NormalizerSpec, WireError> {
    let mut n = NormalizerSpec::default();
    let mut r = Reader::new(buf);
    while let Some((field, v)) = r.next_field()? {
        match field {
            1 => n.name = as_string(&v, "normalizer name")?,
            2 => n.precompiled_charsmap = as_bytes(&v, "precompiled_charsmap")?.to_vec(),
            3 => n.add_dummy_prefix = as_bool(&v, "add_dummy_prefix")?,
            4 => n.remove_extra_whitespaces = as_bool(&v, "remove_extra_whitespaces")?,
            5 => n.escape_whitespaces = as_bool(&v, "escape_whitespaces")?,
            _ => {}
        }
    }
    Ok(n)
}

impl ModelProto {
    /// Parses a serialized `ModelProto`. Fails on truncated or malformed input, and on a model
    /// without pieces.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let mut m = ModelProto::default();
        let mut r = Reader::new(buf);
        while let Some((field, v)) = r.next_field()? {
            match field {
                1 => m.pieces.push(parse_piece(as_bytes(&v, "pieces")?)?),
                2 => m.trainer_spec = parse_trainer_spec(as_bytes(&v, "trainer_spec")?)?,
                3 => m.normalizer_spec = parse_normalizer_spec(as_bytes(&v, "normalizer_spec")?)?,
                _ => {}
            }
        }
        if m.pieces.is_empty() {
            return Err("the model has no pieces".into());
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_tiny_model_and_rejects_truncation() {
        // pieces { piece: "a" score: 1.5 type: NORMAL }, trainer_spec { unk_id: -1 }
        let mut buf = vec![0x0a, 0x0a, 0x0a, 0x01, b'a', 0x15];
        buf.extend_from_slice(&1.5f32.to_le_bytes());
        buf.extend_from_slice(&[0x18, 0x01]);
        buf.extend_from_slice(&[0x12, 0x0c, 0xc0, 0x02]);
        buf.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
        let m = ModelProto::parse(&buf).expect("valid model");
        assert_eq!(m.pieces[0].piece, "a");
        assert_eq!(m.pieces[0].score, 1.5);
        assert_eq!(m.trainer_spec.unk_id, -1);
        assert!(m.normalizer_spec.add_dummy_prefix);
        for cut in 0..buf.len() {
            let _ = ModelProto::parse(&buf[..cut]);
        }
        assert!(ModelProto::parse(&buf[..buf.len() - 1]).is_err());
    }
}
