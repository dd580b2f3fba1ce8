//! Tensor data of a GGUF file: the parsed header ([`GgufFile`]) plus a memory map of the file,
//! handing out each tensor's raw bytes (bounds-checked at parse time) or its values as f32.

use std::path::Path;
use std::sync::Arc;

use super::gguf::{GgufFile, GgufTensorInfo};
use super::mmap::MappedFile;
use super::store::Weight;
use crate::quant::{self, QuantType};
use crate::{Error, Result};

/// A GGUF file opened for reading tensors.
#[derive(Debug)]
pub struct GgufTensors {
    header: GgufFile,
    file: Arc<MappedFile>,
}

/// One tensor's raw data, in the file's block layout.
#[derive(Debug, Clone)]
pub struct RawTensor<'a> {
    /// The tensor's entry in the header.
    pub info: &'a GgufTensorInfo,
    /// Storage type.
    pub qtype: QuantType,
    /// Shape, outermost dimension first (the reverse of GGML's `ne` order), e.g. `[rows, cols]`.
    pub shape: Vec<usize>,
    /// The data bytes.
    pub bytes: &'a [u8],
}

impl GgufTensors {
    /// Maps `path` and parses its header.
    pub fn open(path: &Path) -> Result<Self> {
        let file = Arc::new(MappedFile::open(path)?);
        let header = GgufFile::from_bytes(file.bytes(), path)?;
        Ok(Self { header, file })
    }

    /// The header: metadata and tensor table.
    pub fn header(&self) -> &GgufFile {
        &self.header
    }

    /// Whether a tensor named `name` exists.
    pub fn contains(&self, name: &str) -> bool {
        self.header.tensor(name).is_some()
    }

    fn missing(&self, name: &str) -> Error {
        Error::MissingTensor {
            name: name.to_string(),
            location: self.header.path().display().to_string(),
        }
    }

    fn invalid(&self, reason: String) -> Error {
        Error::InvalidWeights {
            path: self.header.path().to_path_buf(),
            reason,
        }
    }

    /// The raw bytes and type of tensor `name`.
    pub fn raw(&self, name: &str) -> Result<RawTensor<'_>> {
        let info = self.header.tensor(name).ok_or_else(|| self.missing(name))?;
        let qtype =
            QuantType::from_ggml(info.ggml_type).ok_or_else(|| Error::UnsupportedDtype {
                name: name.to_string(),
                path: self.header.path().to_path_buf(),
                dtype: super::gguf::ggml_type_layout(info.ggml_type)
                    .map(|(n, _, _)| n.to_string())
                    .unwrap_or_else(|| format!("GGML type {}", info.ggml_type)),
            })?;
        let (info, shape, bytes) = self.raw_untyped(name)?;
        Ok(RawTensor {
            info,
            qtype,
            shape,
            bytes,
        })
    }

    /// Tensor `name`'s header entry, shape (outermost first) and bytes, of any GGML type whose
    /// size the header knows (e.g. the ternary types, which [`QuantType`] does not cover).
    pub fn raw_untyped(&self, name: &str) -> Result<(&GgufTensorInfo, Vec<usize>, &[u8])> {
        let info = self.header.tensor(name).ok_or_else(|| self.missing(name))?;
        let n_bytes = info
            .n_bytes
            .ok_or_else(|| self.invalid(format!("tensor `{name}` has an unknown size")))?;
        // The header parser checked offset + n_bytes against the file size.
        let start = self.header.data_offset() + info.offset;
        let range = usize::try_from(start)
            .ok()
            .zip(usize::try_from(start + n_bytes).ok())
            .filter(|&(_, end)| end <= self.file.bytes().len())
            .ok_or_else(|| {
                self.invalid(format!("tensor `{name}` lies past the end of the file"))
            })?;
        let shape: Vec<usize> = info.dims.iter().rev().map(|&d| d as usize).collect();
        Ok((info, shape, &self.file.bytes()[range.0..range.1]))
    }

    /// Checks that tensor `name` has `shape` (outermost first) and returns it.
    pub fn raw_with_shape(&self, name: &str, shape: &[usize]) -> Result<RawTensor<'_>> {
        let t = self.raw(name)?;
        if t.shape != shape {
            return Err(Error::ShapeMismatch {
                name: name.to_string(),
                path: self.header.path().to_path_buf(),
                expected: shape.to_vec(),
                found: t.shape,
            });
        }
        Ok(t)
    }

    /// Tensor `name` as f32 values with the expected `shape`: F32 data is viewed in place,
    /// anything else is converted (dequantized) once.
    pub fn f32(&self, name: &str, shape: &[usize]) -> Result<Weight> {
        let t = self.raw_with_shape(name, shape)?;
        if t.qtype == QuantType::F32 && bytemuck::try_cast_slice::<u8, f32>(t.bytes).is_ok() {
            let start = t.bytes.as_ptr() as usize - self.file.bytes().as_ptr() as usize;
            return Ok(Weight::mapped(
                self.file.clone(),
                start..start + t.bytes.len(),
                shape.to_vec(),
            ));
        }
        Ok(Weight::from_vec(dequantize(&t)?, shape.to_vec()))
    }
}

/// All values of a raw tensor as f32.
pub fn dequantize(t: &RawTensor<'_>) -> Result<Vec<f32>> {
    let n: usize = t.shape.iter().product();
    let mut out = vec![0.0f32; n];
    quant::dequantize_row(t.qtype, t.bytes, &mut out)?;
    Ok(out)
}
