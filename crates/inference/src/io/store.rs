//! [`WeightStore`]: every tensor of a checkpoint (one safetensors file or a sharded set listed in
//! `model.safetensors.index.json`) by name, handed out as f32 [`Weight`]s. f32 tensors are views
//! into the memory map (no copy); f16 and bf16 are converted to f32 at load, or bf16 handed out
//! as its bits ([`WeightStore::get_bf16`]) for layers that keep them.
//!
//! Model code reads weights through a [`Scope`], which prefixes names the way the checkpoint nests
//! them (`store.scope("encoder").pp("layer.3")`), so the struct tree mirrors the tensor tree.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::mmap::MappedFile;
use super::safetensors::{Dtype, SafetensorsFile, TensorInfo};
use crate::{Error, Result};

/// f32 weight data: a view into a mapped file, or an owned buffer (after dtype conversion).
#[derive(Debug, Clone)]
pub struct Weight {
    data: WeightData,
    shape: Vec<usize>,
}

#[derive(Debug, Clone)]
enum WeightData {
    Mapped {
        file: Arc<MappedFile>,
        range: std::ops::Range<usize>,
    },
    Owned(Arc<Vec<f32>>),
}

impl Weight {
    /// Wraps an owned buffer (used for weights built at load time, e.g. fused projections).
    pub fn from_vec(data: Vec<f32>, shape: Vec<usize>) -> Self {
        debug_assert_eq!(data.len(), shape.iter().product::<usize>());
        Self {
            data: WeightData::Owned(Arc::new(data)),
            shape,
        }
    }

    /// A view of `range` (f32 data, 4-byte aligned) of a mapped file.
    pub(crate) fn mapped(
        file: Arc<MappedFile>,
        range: std::ops::Range<usize>,
        shape: Vec<usize>,
    ) -> Self {
        debug_assert!(bytemuck::try_cast_slice::<u8, f32>(&file.bytes()[range.clone()]).is_ok());
        Self {
            data: WeightData::Mapped { file, range },
            shape,
        }
    }

    /// The values, row-major.
    pub fn as_slice(&self) -> &[f32] {
        match &self.data {
            WeightData::Mapped { file, range } => {
                bytemuck::cast_slice(&file.bytes()[range.clone()])
            }
            WeightData::Owned(v) => v,
        }
    }

    /// Shape, outermost dimension first.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Whether the data is borrowed from the memory map (no copy was made).
    pub fn is_mapped(&self) -> bool {
        matches!(self.data, WeightData::Mapped { .. })
    }
}

/// All tensors of one checkpoint, by full name.
#[derive(Debug)]
pub struct WeightStore {
    location: PathBuf,
    files: Vec<SafetensorsFile>,
    index: HashMap<String, (usize, TensorInfo)>,
}

#[derive(serde::Deserialize)]
struct ShardIndex {
    weight_map: HashMap<String, String>,
}

impl WeightStore {
    /// Opens the checkpoint in `dir`: `model.safetensors`, or the shards listed in
    /// `model.safetensors.index.json`.
    pub fn open_dir(dir: &Path) -> Result<Self> {
        let index_path = dir.join("model.safetensors.index.json");
        let single = dir.join("model.safetensors");
        if single.is_file() {
            return Self::open_files(dir, &[single]);
        }
        if index_path.is_file() {
            let text =
                std::fs::read_to_string(&index_path).map_err(|e| Error::io(&index_path, e))?;
            let index: ShardIndex =
                serde_json::from_str(&text).map_err(|e| Error::InvalidWeights {
                    path: index_path.clone(),
                    reason: format!("not a valid shard index: {e}"),
                })?;
            let mut shards: Vec<String> = index.weight_map.into_values().collect();
            shards.sort();
            shards.dedup();
            for s in &shards {
                if s.contains("..") || Path::new(s).is_absolute() {
                    return Err(Error::InvalidWeights {
                        path: index_path,
                        reason: format!("shard name `{s}` points outside the model directory"),
                    });
                }
            }
            let paths: Vec<PathBuf> = shards.iter().map(|s| dir.join(s)).collect();
            return Self::open_files(dir, &paths);
        }
        Err(Error::MissingTensor {
            name: "model.safetensors".into(),
            location: format!(
                "{} (no model.safetensors or model.safetensors.index.json)",
                dir.display()
            ),
        })
    }

    /// Opens the given safetensors files as one checkpoint. `location` names it in errors.
    pub fn open_files(location: &Path, paths: &[PathBuf]) -> Result<Self> {
        let mut files = Vec::with_capacity(paths.len());
        let mut index = HashMap::new();
        for (i, p) in paths.iter().enumerate() {
            let f = SafetensorsFile::open(p)?;
            for (name, info) in &f.tensors {
                index.insert(name.clone(), (i, info.clone()));
            }
            files.push(f);
        }
        Ok(Self {
            location: location.to_path_buf(),
            files,
            index,
        })
    }

    /// Whether a tensor of that full name exists.
    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// All tensor names (unordered).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(String::as_str)
    }

    /// The root scope (no prefix).
    pub fn root(&self) -> Scope<'_> {
        Scope {
            store: self,
            prefix: String::new(),
        }
    }

    /// A scope whose names are prefixed with `prefix` + `.` (empty prefix = root).
    pub fn scope(&self, prefix: &str) -> Scope<'_> {
        self.root().pp(prefix)
    }

    /// The shape of the tensor `name`, if present.
    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.index.get(name).map(|(_, info)| info.shape.as_slice())
    }

    /// Whether the tensor `name` is stored as bf16 (false when absent).
    pub fn is_bf16(&self, name: &str) -> bool {
        self.index
            .get(name)
            .is_some_and(|(_, info)| matches!(info.dtype, Dtype::BF16))
    }

    /// The file and header entry of tensor `name`, checking its shape equals `shape`.
    fn entry(&self, name: &str, shape: &[usize]) -> Result<(&Arc<MappedFile>, &TensorInfo)> {
        let (file_idx, info) = self.index.get(name).ok_or_else(|| Error::MissingTensor {
            name: name.to_string(),
            location: self.location.display().to_string(),
        })?;
        let file = &self.files[*file_idx].file;
        if info.shape != shape {
            return Err(Error::ShapeMismatch {
                name: name.to_string(),
                path: file.path().to_path_buf(),
                expected: shape.to_vec(),
                found: info.shape.clone(),
            });
        }
        Ok((file, info))
    }

    /// The bytes of the `U8` tensor `name` (e.g. packed ternary weights), checking its shape.
    pub fn get_u8(&self, name: &str, shape: &[usize]) -> Result<&[u8]> {
        let (file, info) = self.entry(name, shape)?;
        if !matches!(info.dtype, Dtype::Other("U8")) {
            return Err(Error::UnsupportedDtype {
                name: name.to_string(),
                path: file.path().to_path_buf(),
                dtype: format!("{} (packed weights are U8)", info.dtype.name()),
            });
        }
        Ok(&file.bytes()[info.range.clone()])
    }

    /// The bits of the bf16 tensor `name` as stored (borrowed from the mapped file where they
    /// are 2-byte aligned), checking its shape; `None` for a tensor of another type.
    pub fn get_bf16(&self, name: &str, shape: &[usize]) -> Result<Option<Cow<'_, [u16]>>> {
        let (file, info) = self.entry(name, shape)?;
        if !matches!(info.dtype, Dtype::BF16) {
            return Ok(None);
        }
        let bytes = &file.bytes()[info.range.clone()];
        Ok(Some(match bytemuck::try_cast_slice::<u8, u16>(bytes) {
            Ok(bits) if cfg!(target_endian = "little") => Cow::Borrowed(bits),
            _ => Cow::Owned(
                bytes
                    .chunks_exact(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]]))
                    .collect(),
            ),
        }))
    }

    /// Loads the tensor `name` as f32, checking its shape equals `shape`.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Weight> {
        let (file, info) = self.entry(name, shape)?;
        let bytes = &file.bytes()[info.range.clone()];
        let data = match info.dtype {
            Dtype::F32 => {
                if bytemuck::try_cast_slice::<u8, f32>(bytes).is_ok() {
                    WeightData::Mapped {
                        file: file.clone(),
                        range: info.range.clone(),
                    }
                } else {
                    // Misaligned tensor data (legal in safetensors): copy once.
                    WeightData::Owned(Arc::new(
                        bytes
                            .chunks_exact(4)
                            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                            .collect(),
                    ))
                }
            }
            Dtype::F16 => WeightData::Owned(Arc::new(
                bytes
                    .chunks_exact(2)
                    .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect(),
            )),
            Dtype::BF16 => WeightData::Owned(Arc::new(
                bytes
                    .chunks_exact(2)
                    .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect(),
            )),
            Dtype::Other(d) => {
                return Err(Error::UnsupportedDtype {
                    name: name.to_string(),
                    path: file.path().to_path_buf(),
                    dtype: d.to_string(),
                })
            }
        };
        Ok(Weight {
            data,
            shape: shape.to_vec(),
        })
    }
}

/// A view of a [`WeightStore`] under a name prefix.
#[derive(Debug, Clone)]
pub struct Scope<'a> {
    store: &'a WeightStore,
    prefix: String,
}

impl<'a> Scope<'a> {
    /// A nested scope: `self.prefix + "." + name`.
    pub fn pp(&self, name: &str) -> Scope<'a> {
        let prefix = match (self.prefix.is_empty(), name.is_empty()) {
            (_, true) => self.prefix.clone(),
            (true, false) => name.to_string(),
            (false, false) => format!("{}.{}", self.prefix, name),
        };
        Scope {
            store: self.store,
            prefix,
        }
    }

    /// The full name of `name` under this scope.
    pub fn full_name(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{}", self.prefix, name)
        }
    }

    /// Loads `name` under this scope as f32 with the expected `shape`.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Weight> {
        self.store.get(&self.full_name(name), shape)
    }

    /// Whether `name` exists under this scope.
    pub fn contains(&self, name: &str) -> bool {
        self.store.contains(&self.full_name(name))
    }
}
