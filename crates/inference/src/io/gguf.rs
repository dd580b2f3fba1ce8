//! GGUF (v2 / v3) header reader: metadata key/values of every type (arrays included) and the
//! tensor info table. Every count and length read from the file is checked against the bytes that
//! are left before anything is allocated, so a truncated or hostile file gives
//! [`Error::InvalidWeights`], never a panic or an allocation larger than a small multiple of the
//! file. Only the header is read: tensor data stays on disk. Mapping tensor data and dequantizing
//! it are not this module's job.
//!
//! Layout (little-endian): magic `GGUF`, version `u32`, tensor count `u64`, metadata count `u64`,
//! the metadata entries (`string key`, `u32 type`, value), the tensor infos (`string name`,
//! `u32 n_dims`, `u64 dims[n_dims]`, `u32 ggml type`, `u64 offset`), padding to
//! `general.alignment` (default 32), then tensor data. A string is a `u64` length and its bytes.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use crate::{Error, Result};

const MAGIC: [u8; 4] = *b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// Arrays of arrays deeper than this are refused (bounded recursion).
const MAX_ARRAY_DEPTH: usize = 4;
/// GGML tensors have at most 4 dimensions.
const MAX_DIMS: u32 = 4;

/// A typed array from the metadata.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufArray {
    /// `u8` elements.
    U8(Vec<u8>),
    /// `i8` elements.
    I8(Vec<i8>),
    /// `u16` elements.
    U16(Vec<u16>),
    /// `i16` elements.
    I16(Vec<i16>),
    /// `u32` elements.
    U32(Vec<u32>),
    /// `i32` elements.
    I32(Vec<i32>),
    /// `f32` elements.
    F32(Vec<f32>),
    /// `bool` elements.
    Bool(Vec<bool>),
    /// Strings (invalid UTF-8 is replaced with U+FFFD).
    String(Vec<String>),
    /// Nested arrays.
    Array(Vec<GgufArray>),
    /// `u64` elements.
    U64(Vec<u64>),
    /// `i64` elements.
    I64(Vec<i64>),
    /// `f64` elements.
    F64(Vec<f64>),
}

impl GgufArray {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            GgufArray::U8(v) => v.len(),
            GgufArray::I8(v) => v.len(),
            GgufArray::U16(v) => v.len(),
            GgufArray::I16(v) => v.len(),
            GgufArray::U32(v) => v.len(),
            GgufArray::I32(v) => v.len(),
            GgufArray::F32(v) => v.len(),
            GgufArray::Bool(v) => v.len(),
            GgufArray::String(v) => v.len(),
            GgufArray::Array(v) => v.len(),
            GgufArray::U64(v) => v.len(),
            GgufArray::I64(v) => v.len(),
            GgufArray::F64(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` of an integer array, widened to `i64` (None for other types or out of range).
    pub fn int_at(&self, i: usize) -> Option<i64> {
        match self {
            GgufArray::U8(v) => v.get(i).map(|&x| i64::from(x)),
            GgufArray::I8(v) => v.get(i).map(|&x| i64::from(x)),
            GgufArray::U16(v) => v.get(i).map(|&x| i64::from(x)),
            GgufArray::I16(v) => v.get(i).map(|&x| i64::from(x)),
            GgufArray::U32(v) => v.get(i).map(|&x| i64::from(x)),
            GgufArray::I32(v) => v.get(i).map(|&x| i64::from(x)),
            GgufArray::U64(v) => v.get(i).and_then(|&x| i64::try_from(x).ok()),
            GgufArray::I64(v) => v.get(i).copied(),
            _ => None,
        }
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    /// Type 0.
    U8(u8),
    /// Type 1.
    I8(i8),
    /// Type 2.
    U16(u16),
    /// Type 3.
    I16(i16),
    /// Type 4.
    U32(u32),
    /// Type 5.
    I32(i32),
    /// Type 6.
    F32(f32),
    /// Type 7.
    Bool(bool),
    /// Type 8 (invalid UTF-8 is replaced with U+FFFD).
    String(String),
    /// Type 9.
    Array(GgufArray),
    /// Type 10.
    U64(u64),
    /// Type 11.
    I64(i64),
    /// Type 12.
    F64(f64),
}

impl GgufValue {
    /// Any integer value that fits a `u64` (negative values give None).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(x) => Some(u64::from(x)),
            GgufValue::U16(x) => Some(u64::from(x)),
            GgufValue::U32(x) => Some(u64::from(x)),
            GgufValue::U64(x) => Some(x),
            GgufValue::I8(x) => u64::try_from(x).ok(),
            GgufValue::I16(x) => u64::try_from(x).ok(),
            GgufValue::I32(x) => u64::try_from(x).ok(),
            GgufValue::I64(x) => u64::try_from(x).ok(),
            _ => None,
        }
    }

    /// Any integer value that fits a `u32`.
    pub fn as_u32(&self) -> Option<u32> {
        self.as_u64().and_then(|x| u32::try_from(x).ok())
    }

    /// A float (either width) or an integer, as `f64`.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(x) => Some(f64::from(x)),
            GgufValue::F64(x) => Some(x),
            _ => self.as_u64().map(|x| x as f64),
        }
    }

    /// A boolean.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// A string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// An array of any element type.
    pub fn as_array(&self) -> Option<&GgufArray> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// An array of strings.
    pub fn as_string_array(&self) -> Option<&[String]> {
        match self {
            GgufValue::Array(GgufArray::String(v)) => Some(v),
            _ => None,
        }
    }
}

/// One entry of the tensor info table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufTensorInfo {
    /// Tensor name as stored.
    pub name: String,
    /// Dimensions, innermost (fastest-varying) first, as GGML stores them.
    pub dims: Vec<u64>,
    /// GGML type id (0 = F32, 1 = F16, 8 = Q8_0, ...).
    pub ggml_type: u32,
    /// Byte offset of the data, relative to [`GgufFile::data_offset`].
    pub offset: u64,
    /// Size of the data in bytes, when the GGML type is one this reader knows.
    pub n_bytes: Option<u64>,
}

/// `(elements per block, bytes per block)` and name of the GGML types whose layout is known here.
pub fn ggml_type_layout(ggml_type: u32) -> Option<(&'static str, u64, u64)> {
    Some(match ggml_type {
        0 => ("F32", 1, 4),
        1 => ("F16", 1, 2),
        2 => ("Q4_0", 32, 18),
        3 => ("Q4_1", 32, 20),
        6 => ("Q5_0", 32, 22),
        7 => ("Q5_1", 32, 24),
        8 => ("Q8_0", 32, 34),
        9 => ("Q8_1", 32, 36),
        10 => ("Q2_K", 256, 84),
        11 => ("Q3_K", 256, 110),
        12 => ("Q4_K", 256, 144),
        13 => ("Q5_K", 256, 176),
        14 => ("Q6_K", 256, 210),
        15 => ("Q8_K", 256, 292),
        16 => ("IQ2_XXS", 256, 66),
        17 => ("IQ2_XS", 256, 74),
        18 => ("IQ3_XXS", 256, 98),
        19 => ("IQ1_S", 256, 50),
        20 => ("IQ4_NL", 32, 18),
        21 => ("IQ3_S", 256, 110),
        22 => ("IQ2_S", 256, 82),
        23 => ("IQ4_XS", 256, 136),
        24 => ("I8", 1, 1),
        25 => ("I16", 1, 2),
        26 => ("I32", 1, 4),
        27 => ("I64", 1, 8),
        28 => ("F64", 1, 8),
        29 => ("IQ1_M", 256, 56),
        30 => ("BF16", 1, 2),
        34 => ("TQ1_0", 256, 54),
        35 => ("TQ2_0", 256, 66),
        _ => return None,
    })
}

/// A parsed GGUF header.
#[derive(Debug, Clone)]
pub struct GgufFile {
    path: PathBuf,
    version: u32,
    metadata: Vec<(String, GgufValue)>,
    index: HashMap<String, usize>,
    tensors: Vec<GgufTensorInfo>,
    alignment: u64,
    data_offset: u64,
    file_bytes: u64,
}

/// Byte source with a position and a hard end, so every length can be checked before reading.
struct Reader<'p, R> {
    r: R,
    pos: u64,
    len: u64,
    path: &'p Path,
}

impl<R: Read> Reader<'_, R> {
    fn err(&self, reason: impl Into<String>) -> Error {
        Error::InvalidWeights {
            path: self.path.to_path_buf(),
            reason: reason.into(),
        }
    }

    fn remaining(&self) -> u64 {
        self.len.saturating_sub(self.pos)
    }

    /// Fails unless `n` items of at least `min_size` bytes each can still fit in the file.
    fn check_fits(&self, n: u64, min_size: u64, what: &str) -> Result<()> {
        match n.checked_mul(min_size) {
            Some(need) if need <= self.remaining() => Ok(()),
            _ => Err(self.err(format!(
                "{what}: count {n} at byte {} does not fit in the {} bytes left",
                self.pos,
                self.remaining()
            ))),
        }
    }

    fn fill(&mut self, buf: &mut [u8], what: &str) -> Result<()> {
        let n = buf.len() as u64;
        if n > self.remaining() {
            return Err(self.err(format!(
                "truncated: {what} needs {n} bytes at byte {}, {} left",
                self.pos,
                self.remaining()
            )));
        }
        self.r
            .read_exact(buf)
            .map_err(|e| self.err(format!("reading {what} at byte {}: {e}", self.pos)))?;
        self.pos += n;
        Ok(())
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let mut b = [0u8; N];
        self.fill(&mut b, what)?;
        Ok(b)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.u64(what)?;
        self.check_fits(n, 1, what)?;
        let mut buf = vec![0u8; usize::try_from(n).map_err(|_| self.err("string too long"))?];
        self.fill(&mut buf, what)?;
        Ok(match String::from_utf8(buf) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    /// Reads `n` fixed-size elements, after checking they fit.
    fn vec<T, const N: usize>(&mut self, n: u64, f: fn([u8; N]) -> T) -> Result<Vec<T>> {
        self.check_fits(n, N as u64, "array")?;
        let mut out = Vec::with_capacity(n as usize);
        for _ in 0..n {
            out.push(f(self.array("array element")?));
        }
        Ok(out)
    }

    fn array_value(&mut self, depth: usize) -> Result<GgufArray> {
        if depth > MAX_ARRAY_DEPTH {
            return Err(self.err(format!("arrays nested deeper than {MAX_ARRAY_DEPTH}")));
        }
        let ty = self.u32("array type")?;
        let n = self.u64("array length")?;
        Ok(match ty {
            0 => GgufArray::U8(self.vec(n, |b: [u8; 1]| b[0])?),
            1 => GgufArray::I8(self.vec(n, i8::from_le_bytes)?),
            2 => GgufArray::U16(self.vec(n, u16::from_le_bytes)?),
            3 => GgufArray::I16(self.vec(n, i16::from_le_bytes)?),
            4 => GgufArray::U32(self.vec(n, u32::from_le_bytes)?),
            5 => GgufArray::I32(self.vec(n, i32::from_le_bytes)?),
            6 => GgufArray::F32(self.vec(n, f32::from_le_bytes)?),
            7 => GgufArray::Bool(self.vec(n, |b: [u8; 1]| b[0] != 0)?),
            8 => {
                self.check_fits(n, 8, "string array")?;
                let mut v = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    v.push(self.string("array string")?);
                }
                GgufArray::String(v)
            }
            9 => {
                self.check_fits(n, 12, "nested array")?;
                let mut v = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    v.push(self.array_value(depth + 1)?);
                }
                GgufArray::Array(v)
            }
            10 => GgufArray::U64(self.vec(n, u64::from_le_bytes)?),
            11 => GgufArray::I64(self.vec(n, i64::from_le_bytes)?),
            12 => GgufArray::F64(self.vec(n, f64::from_le_bytes)?),
            other => return Err(self.err(format!("unknown array element type {other}"))),
        })
    }

    fn value(&mut self, ty: u32, key: &str) -> Result<GgufValue> {
        Ok(match ty {
            0 => GgufValue::U8(self.array::<1>(key)?[0]),
            1 => GgufValue::I8(i8::from_le_bytes(self.array(key)?)),
            2 => GgufValue::U16(u16::from_le_bytes(self.array(key)?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array(key)?)),
            4 => GgufValue::U32(self.u32(key)?),
            5 => GgufValue::I32(i32::from_le_bytes(self.array(key)?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array(key)?)),
            7 => GgufValue::Bool(self.array::<1>(key)?[0] != 0),
            8 => GgufValue::String(self.string(key)?),
            9 => GgufValue::Array(self.array_value(0)?),
            10 => GgufValue::U64(self.u64(key)?),
            11 => GgufValue::I64(i64::from_le_bytes(self.array(key)?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array(key)?)),
            other => {
                return Err(self.err(format!("metadata `{key}` has unknown value type {other}")))
            }
        })
    }
}

impl GgufFile {
    /// Reads the header of the GGUF file at `path` (tensor data is not read).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        Self::parse(BufReader::new(file), len, path)
    }

    /// Parses a GGUF file held in memory; `path` is only used in error messages.
    pub fn from_bytes(bytes: &[u8], path: impl AsRef<Path>) -> Result<Self> {
        Self::parse(bytes, bytes.len() as u64, path.as_ref())
    }

    fn parse<R: Read>(r: R, len: u64, path: &Path) -> Result<Self> {
        let mut rd = Reader {
            r,
            pos: 0,
            len,
            path,
        };
        let magic: [u8; 4] = rd.array("magic")?;
        if magic != MAGIC {
            return Err(rd.err(format!("bad magic {magic:02x?}, expected \"GGUF\"")));
        }
        let version = rd.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(rd.err(format!("GGUF version {version} is not supported (2 or 3)")));
        }
        let n_tensors = rd.u64("tensor count")?;
        let n_kv = rd.u64("metadata count")?;
        // Smallest entry: 8-byte key length + 4-byte type + 1-byte value.
        rd.check_fits(n_kv, 13, "metadata count")?;
        let mut metadata = Vec::with_capacity(n_kv as usize);
        let mut index = HashMap::with_capacity(n_kv as usize);
        for _ in 0..n_kv {
            let key = rd.string("metadata key")?;
            let ty = rd.u32("metadata type")?;
            let value = rd.value(ty, &key)?;
            if index.insert(key.clone(), metadata.len()).is_some() {
                return Err(rd.err(format!("duplicate metadata key `{key}`")));
            }
            metadata.push((key, value));
        }
        let alignment = match index.get("general.alignment").map(|&i| &metadata[i].1) {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() => a,
                _ => return Err(rd.err(format!("general.alignment {v:?} is not a power of two"))),
            },
        };
        // Smallest tensor info: name length 8 + n_dims 4 + type 4 + offset 8.
        rd.check_fits(n_tensors, 24, "tensor count")?;
        let mut tensors = Vec::with_capacity(n_tensors as usize);
        let mut names = HashMap::with_capacity(n_tensors as usize);
        for _ in 0..n_tensors {
            let info = Self::tensor_info(&mut rd, alignment)?;
            if names.insert(info.name.clone(), ()).is_some() {
                return Err(rd.err(format!("duplicate tensor `{}`", info.name)));
            }
            tensors.push(info);
        }
        let data_offset = rd.pos.div_ceil(alignment) * alignment;
        let data_bytes = len.saturating_sub(data_offset);
        for t in &tensors {
            let end = t.offset.checked_add(t.n_bytes.unwrap_or(0));
            if !matches!(end, Some(e) if e <= data_bytes) {
                return Err(rd.err(format!(
                    "tensor `{}` (offset {}, {:?} bytes) runs past the end of the file",
                    t.name, t.offset, t.n_bytes
                )));
            }
        }
        Ok(Self {
            path: path.to_path_buf(),
            version,
            metadata,
            index,
            tensors,
            alignment,
            data_offset,
            file_bytes: len,
        })
    }

    fn tensor_info<R: Read>(rd: &mut Reader<'_, R>, alignment: u64) -> Result<GgufTensorInfo> {
        let name = rd.string("tensor name")?;
        let n_dims = rd.u32("tensor n_dims")?;
        if n_dims > MAX_DIMS {
            return Err(rd.err(format!(
                "tensor `{name}` has {n_dims} dims (max {MAX_DIMS})"
            )));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(rd.u64("tensor dim")?);
        }
        let ggml_type = rd.u32("tensor type")?;
        let offset = rd.u64("tensor offset")?;
        if offset % alignment != 0 {
            return Err(rd.err(format!(
                "tensor `{name}` offset {offset} is not a multiple of the alignment {alignment}"
            )));
        }
        let n_elements = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| rd.err(format!("tensor `{name}` element count overflows")))?;
        let n_bytes = match ggml_type_layout(ggml_type) {
            // bitnet.cpp's I2_S has no block geometry: 2 bits a value, then a 32-byte tail.
            None if ggml_type == crate::quant::ternary::GGML_I2_S => {
                if n_elements % 128 != 0 {
                    return Err(rd.err(format!(
                        "tensor `{name}`: I2_S holds whole blocks of 128 values, not {n_elements}"
                    )));
                }
                crate::quant::ternary::ggml_ternary_bytes(ggml_type, n_elements)
            }
            None => None,
            Some((type_name, block, block_bytes)) => {
                let row = dims.first().copied().unwrap_or(1);
                if row % block != 0 {
                    return Err(rd.err(format!(
                        "tensor `{name}`: {type_name} rows of {row} are not whole blocks of {block}"
                    )));
                }
                Some(
                    (n_elements / block)
                        .checked_mul(block_bytes)
                        .ok_or_else(|| rd.err(format!("tensor `{name}` byte size overflows")))?,
                )
            }
        };
        Ok(GgufTensorInfo {
            name,
            dims,
            ggml_type,
            offset,
            n_bytes,
        })
    }

    /// The file this header came from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The metadata value stored under `key`.
    pub fn metadata(&self, key: &str) -> Option<&GgufValue> {
        self.index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// All metadata entries, in file order.
    pub fn metadata_entries(&self) -> impl Iterator<Item = (&str, &GgufValue)> {
        self.metadata.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The tensor info table, in file order.
    pub fn tensors(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    /// The tensor info of `name`.
    pub fn tensor(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Alignment of tensor data (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute byte offset where tensor data starts.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Size of the whole file in bytes.
    pub fn file_bytes(&self) -> u64 {
        self.file_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }

    /// A small valid file: two metadata entries and one F32 tensor of 2x2.
    fn sample() -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(1u64.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        string(&mut b, "general.architecture");
        b.extend(8u32.to_le_bytes());
        string(&mut b, "bert");
        string(&mut b, "tokenizer.ggml.tokens");
        b.extend(9u32.to_le_bytes());
        b.extend(8u32.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        string(&mut b, "a");
        string(&mut b, "bc");
        string(&mut b, "w");
        b.extend(2u32.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        b.extend(0u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b.resize(b.len().div_ceil(32) * 32, 0);
        b.extend([0u8; 16]);
        b
    }

    #[test]
    fn parses_sample() {
        let f = GgufFile::from_bytes(&sample(), "mem").expect("valid sample");
        assert_eq!(
            f.metadata("general.architecture").and_then(|v| v.as_str()),
            Some("bert")
        );
        let toks = f
            .metadata("tokenizer.ggml.tokens")
            .and_then(|v| v.as_string_array());
        assert_eq!(toks, Some(&["a".to_string(), "bc".to_string()][..]));
        assert_eq!(f.tensors()[0].n_bytes, Some(16));
        assert_eq!(f.data_offset() % 32, 0);
    }

    #[test]
    fn every_truncation_is_an_error() {
        let b = sample();
        for cut in 0..b.len() - 1 {
            assert!(
                GgufFile::from_bytes(&b[..cut], "mem").is_err(),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn huge_counts_are_refused_without_allocating() {
        let mut b = sample();
        // Array length of the token list (after its key, value type and element type): claim
        // 2^60 strings.
        let key = b"tokenizer.ggml.tokens";
        let pos = b
            .windows(key.len())
            .position(|w| w == key)
            .expect("key present")
            + key.len()
            + 8;
        b[pos..pos + 8].copy_from_slice(&(1u64 << 60).to_le_bytes());
        let err = GgufFile::from_bytes(&b, "mem").unwrap_err().to_string();
        assert!(err.contains("does not fit"), "{err}");
    }
}
