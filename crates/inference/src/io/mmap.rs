//! Read-only memory maps of model files. The one place outside `backend::cpu` that holds
//! `unsafe`: creating the map itself.

#![allow(unsafe_code)]

use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// A whole file mapped read-only into memory.
#[derive(Debug)]
pub struct MappedFile {
    path: PathBuf,
    map: memmap2::Mmap,
}

impl MappedFile {
    /// Maps `path` read-only.
    pub fn open(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the map is read-only and private to this process. Model files are not expected
        // to be modified while loaded; if another process truncates the file the OS may deliver
        // SIGBUS, which is the documented caveat of every mmap-based loader (safetensors, GGUF).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        Ok(Self {
            path: path.to_path_buf(),
            map,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }
}
