//! Writing GGUF v3 files (what `lattice prune` outputs): the header, the metadata, the tensor
//! table and the tensors' bytes at the file's alignment, the layout [`super::gguf`] reads.

use std::io::Write;
use std::path::Path;

use super::gguf::{GgufArray, GgufValue};
use crate::{Error, Result};

/// One tensor to write: its name, GGML dimensions (innermost first), GGML type and bytes.
#[derive(Debug, Clone)]
pub struct TensorOut<'a> {
    /// Name.
    pub name: String,
    /// Dimensions, innermost first (as GGML stores them).
    pub dims: Vec<u64>,
    /// GGML type id.
    pub ggml_type: u32,
    /// The data, in the type's block layout.
    pub bytes: &'a [u8],
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn value_type(v: &GgufValue) -> u32 {
    match v {
        GgufValue::U8(_) => 0,
        GgufValue::I8(_) => 1,
        GgufValue::U16(_) => 2,
        GgufValue::I16(_) => 3,
        GgufValue::U32(_) => 4,
        GgufValue::I32(_) => 5,
        GgufValue::F32(_) => 6,
        GgufValue::Bool(_) => 7,
        GgufValue::String(_) => 8,
        GgufValue::Array(_) => 9,
        GgufValue::U64(_) => 10,
        GgufValue::I64(_) => 11,
        GgufValue::F64(_) => 12,
    }
}

fn array_type(a: &GgufArray) -> u32 {
    match a {
        GgufArray::U8(_) => 0,
        GgufArray::I8(_) => 1,
        GgufArray::U16(_) => 2,
        GgufArray::I16(_) => 3,
        GgufArray::U32(_) => 4,
        GgufArray::I32(_) => 5,
        GgufArray::F32(_) => 6,
        GgufArray::Bool(_) => 7,
        GgufArray::String(_) => 8,
        GgufArray::Array(_) => 9,
        GgufArray::U64(_) => 10,
        GgufArray::I64(_) => 11,
        GgufArray::F64(_) => 12,
    }
}

fn put_array(out: &mut Vec<u8>, a: &GgufArray) {
    out.extend_from_slice(&array_type(a).to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! each {
        ($v:expr) => {
            for x in $v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        GgufArray::U8(v) => out.extend_from_slice(v),
        GgufArray::I8(v) => each!(v),
        GgufArray::U16(v) => each!(v),
        GgufArray::I16(v) => each!(v),
        GgufArray::U32(v) => each!(v),
        GgufArray::I32(v) => each!(v),
        GgufArray::F32(v) => each!(v),
        GgufArray::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
        GgufArray::String(v) => v.iter().for_each(|s| put_str(out, s)),
        GgufArray::Array(v) => v.iter().for_each(|a| put_array(out, a)),
        GgufArray::U64(v) => each!(v),
        GgufArray::I64(v) => each!(v),
        GgufArray::F64(v) => each!(v),
    }
}

fn put_value(out: &mut Vec<u8>, v: &GgufValue) {
    out.extend_from_slice(&value_type(v).to_le_bytes());
    match v {
        GgufValue::U8(x) => out.push(*x),
        GgufValue::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::Bool(x) => out.push(u8::from(*x)),
        GgufValue::String(s) => put_str(out, s),
        GgufValue::Array(a) => put_array(out, a),
        GgufValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

/// Writes a GGUF v3 file: `metadata` in order, then `tensors`, each at a multiple of
/// `alignment` bytes from the start of the data section (a power of two; the metadata should
/// say it as `general.alignment` when it is not 32).
pub fn write_gguf(
    path: &Path,
    metadata: &[(String, GgufValue)],
    tensors: &[TensorOut<'_>],
    alignment: u64,
) -> Result<()> {
    if !alignment.is_power_of_two() {
        return Err(Error::InvalidInput(format!(
            "GGUF alignment {alignment} is not a power of two"
        )));
    }
    let mut head = Vec::new();
    head.extend_from_slice(b"GGUF");
    head.extend_from_slice(&3u32.to_le_bytes());
    head.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    head.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (k, v) in metadata {
        put_str(&mut head, k);
        put_value(&mut head, v);
    }
    let mut offset = 0u64;
    let mut offsets = Vec::with_capacity(tensors.len());
    for t in tensors {
        put_str(&mut head, &t.name);
        head.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            head.extend_from_slice(&d.to_le_bytes());
        }
        head.extend_from_slice(&t.ggml_type.to_le_bytes());
        head.extend_from_slice(&offset.to_le_bytes());
        offsets.push(offset);
        offset = (offset + t.bytes.len() as u64).next_multiple_of(alignment);
    }
    let pad = |n: u64| vec![0u8; (n.next_multiple_of(alignment) - n) as usize];
    let io = |e| Error::io(path, e);
    let file = std::fs::File::create(path).map_err(io)?;
    let mut w = std::io::BufWriter::new(file);
    w.write_all(&head).map_err(io)?;
    w.write_all(&pad(head.len() as u64)).map_err(io)?;
    let mut at = 0u64;
    for (t, &o) in tensors.iter().zip(&offsets) {
        w.write_all(&vec![0u8; (o - at) as usize]).map_err(io)?;
        w.write_all(t.bytes).map_err(io)?;
        at = o + t.bytes.len() as u64;
    }
    w.flush().map_err(io)
}
