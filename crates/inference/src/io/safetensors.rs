//! One safetensors file: the header parsed and validated against the file size, each tensor's
//! dtype, shape and byte range recorded. Tensor bytes stay in the memory map.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use super::mmap::MappedFile;
use crate::{Error, Result};

/// Element type of a stored tensor (the subset the engine reads).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    /// IEEE f32.
    F32,
    /// IEEE f16.
    F16,
    /// bfloat16.
    BF16,
    /// Any other dtype (integers, f64, ...), kept by name for error messages.
    Other(&'static str),
}

impl Dtype {
    /// Bytes per element, where known.
    pub fn size_bytes(self) -> Option<usize> {
        match self {
            Dtype::F32 => Some(4),
            Dtype::F16 | Dtype::BF16 => Some(2),
            Dtype::Other(_) => None,
        }
    }

    /// The dtype's name as safetensors writes it.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "F32",
            Dtype::F16 => "F16",
            Dtype::BF16 => "BF16",
            Dtype::Other(s) => s,
        }
    }
}

/// Where one tensor lives inside its file.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    /// Element type.
    pub dtype: Dtype,
    /// Shape, outermost dimension first.
    pub shape: Vec<usize>,
    /// Absolute byte range in the file.
    pub range: std::ops::Range<usize>,
}

/// A mapped safetensors file with its validated tensor table.
#[derive(Debug)]
pub struct SafetensorsFile {
    /// The mapped bytes.
    pub file: Arc<MappedFile>,
    /// Tensor name → location.
    pub tensors: HashMap<String, TensorInfo>,
}

fn invalid(path: &Path, reason: impl Into<String>) -> Error {
    Error::InvalidWeights {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

impl SafetensorsFile {
    /// Maps and validates `path`: header length, JSON, every tensor's byte range inside the file
    /// and consistent with its dtype and shape.
    pub fn open(path: &Path) -> Result<Self> {
        let file = Arc::new(MappedFile::open(path)?);
        let tensors = parse_header(path, file.bytes())?;
        Ok(Self { file, tensors })
    }
}

fn parse_dtype(s: &str) -> Dtype {
    match s {
        "F32" => Dtype::F32,
        "F16" => Dtype::F16,
        "BF16" => Dtype::BF16,
        "F64" => Dtype::Other("F64"),
        "I64" => Dtype::Other("I64"),
        "I32" => Dtype::Other("I32"),
        "I16" => Dtype::Other("I16"),
        "I8" => Dtype::Other("I8"),
        "U8" => Dtype::Other("U8"),
        "BOOL" => Dtype::Other("BOOL"),
        _ => Dtype::Other("unknown"),
    }
}

fn dtype_bytes_by_name(s: &str) -> Option<usize> {
    Some(match s {
        "F64" | "I64" | "U64" => 8,
        "F32" | "I32" | "U32" => 4,
        "F16" | "BF16" | "I16" | "U16" => 2,
        "I8" | "U8" | "BOOL" | "F8_E4M3" | "F8_E5M2" => 1,
        _ => return None,
    })
}

#[derive(serde::Deserialize)]
struct RawInfo {
    dtype: String,
    shape: Vec<usize>,
    data_offsets: [usize; 2],
}

/// Parses and validates a safetensors header against the whole file `bytes`.
pub fn parse_header(path: &Path, bytes: &[u8]) -> Result<HashMap<String, TensorInfo>> {
    if bytes.len() < 8 {
        return Err(invalid(
            path,
            format!(
                "file is {} bytes, shorter than the 8-byte header length",
                bytes.len()
            ),
        ));
    }
    let mut len_bytes = [0u8; 8];
    len_bytes.copy_from_slice(&bytes[..8]);
    let header_len = u64::from_le_bytes(len_bytes);
    let available = (bytes.len() - 8) as u64;
    if header_len > available {
        return Err(invalid(
            path,
            format!("header length {header_len} exceeds the file ({available} bytes after it): truncated or not safetensors"),
        ));
    }
    let data_start = 8 + header_len as usize;
    let header = std::str::from_utf8(&bytes[8..data_start])
        .map_err(|_| invalid(path, "header is not valid UTF-8"))?;
    let raw: HashMap<String, serde_json::Value> = serde_json::from_str(header.trim_end())
        .map_err(|e| invalid(path, format!("header is not valid JSON: {e}")))?;
    let data_len = bytes.len() - data_start;
    let mut tensors = HashMap::with_capacity(raw.len());
    for (name, value) in raw {
        if name == "__metadata__" {
            continue;
        }
        let info: RawInfo = serde_json::from_value(value)
            .map_err(|e| invalid(path, format!("tensor `{name}`: bad header entry: {e}")))?;
        let [start, end] = info.data_offsets;
        if start > end || end > data_len {
            return Err(invalid(
                path,
                format!(
                    "tensor `{name}`: data range {start}..{end} lies outside the {data_len} data bytes (truncated file?)"
                ),
            ));
        }
        let elem = dtype_bytes_by_name(&info.dtype).ok_or_else(|| {
            invalid(
                path,
                format!("tensor `{name}`: unknown dtype {}", info.dtype),
            )
        })?;
        let n_elems = info
            .shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| {
                invalid(
                    path,
                    format!("tensor `{name}`: shape {:?} overflows", info.shape),
                )
            })?;
        if n_elems.checked_mul(elem) != Some(end - start) {
            return Err(invalid(
                path,
                format!(
                    "tensor `{name}`: {} bytes stored but dtype {} and shape {:?} need {}",
                    end - start,
                    info.dtype,
                    info.shape,
                    n_elems.saturating_mul(elem)
                ),
            ));
        }
        tensors.insert(
            name,
            TensorInfo {
                dtype: parse_dtype(&info.dtype),
                shape: info.shape,
                range: data_start + start..data_start + end,
            },
        );
    }
    Ok(tensors)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(header: &str, data: &[u8]) -> Vec<u8> {
        let mut v = (header.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(header.as_bytes());
        v.extend_from_slice(data);
        v
    }

    #[test]
    fn parses_valid_header() {
        let b = file(
            r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
            &[0; 8],
        );
        let t = parse_header(Path::new("x"), &b).unwrap();
        assert_eq!(t["a"].shape, vec![2]);
        assert_eq!(t["a"].dtype, Dtype::F32);
    }

    #[test]
    fn rejects_truncated_and_inconsistent() {
        let p = Path::new("x.safetensors");
        assert!(parse_header(p, &[1, 2, 3]).is_err());
        let short = file(
            r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#,
            &[0; 8],
        );
        let e = parse_header(p, &short).unwrap_err().to_string();
        assert!(e.contains("outside"), "{e}");
        let wrong = file(
            r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
            &[0; 8],
        );
        assert!(parse_header(p, &wrong)
            .unwrap_err()
            .to_string()
            .contains("need 12"));
        let mut huge = file("{}", &[]);
        huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(parse_header(p, &huge).is_err());
        assert!(parse_header(p, &file("{not json", &[])).is_err());
    }
}
