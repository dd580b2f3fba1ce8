//! The Hugging Face cache layout, shared with Python tools: `{cache}/models--ORG--NAME/` holds
//! `refs/{revision}` (the commit a branch or tag points at), `blobs/{etag}` (file contents by
//! hash) and `snapshots/{commit}/{path}` (symlinks into `blobs/`). This module reads that layout
//! and installs finished blobs into it; it does no network I/O.

use std::path::{Path, PathBuf};

use crate::error::{io, Error, Result};

/// A model repo and revision named by the user: `ORG/NAME`, `NAME`, optionally `@REVISION`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoRef {
    /// The repo id (`sentence-transformers/all-MiniLM-L6-v2`).
    pub repo_id: String,
    /// A branch, tag or commit hash (`main` by default).
    pub revision: String,
}

impl RepoRef {
    /// Parses `ORG/NAME[@REVISION]` (or `NAME[@REVISION]`); `None` when `s` is no valid id.
    pub fn parse(s: &str) -> Option<RepoRef> {
        let (id, revision) = match s.split_once('@') {
            Some((id, rev)) if !rev.is_empty() && !rev.contains(['/', '\\', '@']) => (id, rev),
            Some(_) => return None,
            None => (s, "main"),
        };
        let parts: Vec<&str> = id.split('/').collect();
        let valid_part = |p: &str| {
            !p.is_empty()
                && !p.starts_with(['.', '-'])
                && !p.contains("..")
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        };
        if parts.is_empty() || parts.len() > 2 || !parts.iter().all(|p| valid_part(p)) {
            return None;
        }
        Some(RepoRef {
            repo_id: id.to_string(),
            revision: revision.to_string(),
        })
    }
}

/// Whether `rev` is a full commit hash (40 hex digits).
pub fn is_commit_hash(rev: &str) -> bool {
    rev.len() == 40 && rev.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The hub cache directory (`.../hub`), holding one folder per repo.
#[derive(Debug, Clone)]
pub struct Cache {
    root: PathBuf,
}

impl Cache {
    /// A cache rooted at `root` (the folder that holds `models--*`).
    pub fn new(root: impl Into<PathBuf>) -> Cache {
        Cache { root: root.into() }
    }

    /// The cache root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `{root}/models--ORG--NAME`.
    pub fn repo_dir(&self, repo_id: &str) -> PathBuf {
        self.root
            .join(format!("models--{}", repo_id.replace('/', "--")))
    }

    /// The commit `revision` points at in the cache: the revision itself when it is a commit
    /// hash, else the content of `refs/{revision}`.
    pub fn commit_of(&self, repo: &RepoRef) -> Option<String> {
        if is_commit_hash(&repo.revision) {
            return Some(repo.revision.to_ascii_lowercase());
        }
        let path = self
            .repo_dir(&repo.repo_id)
            .join("refs")
            .join(&repo.revision);
        let commit = std::fs::read_to_string(path).ok()?.trim().to_string();
        is_commit_hash(&commit).then_some(commit)
    }

    /// Records that `revision` points at `commit` (`refs/{revision}`), unless it is a hash.
    pub fn write_ref(&self, repo: &RepoRef, commit: &str) -> Result<()> {
        if is_commit_hash(&repo.revision) {
            return Ok(());
        }
        let path = self
            .repo_dir(&repo.repo_id)
            .join("refs")
            .join(&repo.revision);
        write_atomic(&path, commit.as_bytes())
    }

    /// `snapshots/{commit}` of the repo.
    pub fn snapshot_dir(&self, repo_id: &str, commit: &str) -> PathBuf {
        self.repo_dir(repo_id).join("snapshots").join(commit)
    }

    /// `blobs/{etag}` of the repo.
    pub fn blob_path(&self, repo_id: &str, etag: &str) -> PathBuf {
        self.repo_dir(repo_id).join("blobs").join(etag)
    }

    /// The cached snapshot for `repo` when it is complete (see [`missing_files`]).
    pub fn complete_snapshot(&self, repo: &RepoRef) -> Option<PathBuf> {
        let dir = self.snapshot_dir(&repo.repo_id, &self.commit_of(repo)?);
        missing_files(&dir).is_empty().then_some(dir)
    }

    /// Moves a verified blob into `blobs/{etag}` (atomic rename) and links
    /// `snapshots/{commit}/{file}` to it. `finished` must be on the same filesystem.
    pub fn install(
        &self,
        repo_id: &str,
        commit: &str,
        file: &str,
        etag: &str,
        finished: Option<&Path>,
    ) -> Result<PathBuf> {
        let blob = self.blob_path(repo_id, etag);
        if let Some(src) = finished {
            std::fs::rename(src, &blob).map_err(io(&blob))?;
        }
        let link = self.snapshot_dir(repo_id, commit).join(file);
        let parent = link.parent().unwrap_or(&self.root).to_path_buf();
        std::fs::create_dir_all(&parent).map_err(io(&parent))?;
        // Replace whatever is there (a stale link) with a fresh one, atomically.
        let tmp = unique_tmp(&link);
        link_or_copy(&blob, &tmp, file)?;
        std::fs::rename(&tmp, &link).map_err(io(&link))?;
        Ok(link)
    }
}

#[cfg(unix)]
fn link_or_copy(blob: &Path, link: &Path, file: &str) -> Result<()> {
    // Relative target as huggingface_hub writes it: ../../blobs/{etag}, one more `..` per
    // folder level of `file`.
    let depth = file.matches('/').count() + 2;
    let mut target = PathBuf::new();
    for _ in 0..depth {
        target.push("..");
    }
    target.push("blobs");
    target.push(blob.file_name().unwrap_or_default());
    std::os::unix::fs::symlink(&target, link).map_err(io(link))
}

#[cfg(not(unix))]
fn link_or_copy(blob: &Path, link: &Path, _file: &str) -> Result<()> {
    std::fs::copy(blob, link).map(|_| ()).map_err(io(link))
}

/// The repo id of a cache snapshot folder (`.../models--ORG--NAME/snapshots/{commit}` gives
/// `ORG/NAME`), so callers can recognize a downloaded model by name; `None` for other paths.
pub fn repo_id_of(snapshot_dir: &Path) -> Option<String> {
    let snapshots = snapshot_dir.parent()?;
    if snapshots.file_name()? != "snapshots" {
        return None;
    }
    let repo = snapshots.parent()?.file_name()?.to_str()?;
    Some(repo.strip_prefix("models--")?.replace("--", "/"))
}

/// A temporary name next to `path`, unique to this process and call, so that concurrent
/// writers (threads or processes) never share one.
fn unique_tmp(path: &Path) -> PathBuf {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    path.with_file_name(format!(".{name}.{}.{n}.tmp", std::process::id()))
}

/// Writes `bytes` to `path` through a temporary file and a rename.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let parent = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(io(parent))?;
    let tmp = unique_tmp(path);
    std::fs::write(&tmp, bytes).map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

/// What a model folder lacks to be loaded, as a list of descriptions (empty when complete):
/// `config.json` (unless it holds a `.gguf`), the weights (every shard its index names, or a
/// `.safetensors` file), a tokenizer (`tokenizer.json` or `vocab.txt`), and every module
/// folder named in `modules.json`.
pub fn missing_files(dir: &Path) -> Vec<String> {
    if !dir.is_dir() {
        return vec![format!("the folder {}", dir.display())];
    }
    let names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.path().is_file())
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    if names.iter().any(|n| n.ends_with(".gguf")) && !names.iter().any(|n| n == "config.json") {
        return Vec::new();
    }
    let mut missing = Vec::new();
    if !names.iter().any(|n| n == "config.json") {
        missing.push("config.json".to_string());
    }
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        match shards_of_index(&index) {
            Some(shards) => missing.extend(shards.into_iter().filter(|s| !dir.join(s).is_file())),
            None => missing.push("a readable model.safetensors.index.json".into()),
        }
    } else if !names.iter().any(|n| n.ends_with(".safetensors")) {
        missing.push("weights (*.safetensors)".into());
    }
    if !names
        .iter()
        .any(|n| n == "tokenizer.json" || n == "vocab.txt" || n == "vocab.json")
    {
        missing.push("tokenizer.json".into());
    }
    if let Some(modules) = module_dirs(&dir.join("modules.json")) {
        missing.extend(
            modules
                .into_iter()
                .filter(|m| !dir.join(m).is_dir())
                .map(|m| format!("{m}/")),
        );
    }
    missing
}

/// The shard file names a `model.safetensors.index.json` lists (its `weight_map` values),
/// sorted and deduplicated; `None` when the file is unreadable.
pub fn shards_of_index(path: &Path) -> Option<Vec<String>> {
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    let map = json.get("weight_map")?.as_object()?;
    let mut shards: Vec<String> = map
        .values()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    shards.sort();
    shards.dedup();
    Some(shards)
}

/// The non-root module folders a sentence-transformers `modules.json` names (`1_Pooling`),
/// except those of file-less `Normalize` modules;
/// `None` when there is no such file or it is unreadable.
pub fn module_dirs(path: &Path) -> Option<Vec<String>> {
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    Some(
        json.as_array()?
            .iter()
            .filter(|m| {
                // Normalize keeps no files, so its folder may not exist.
                !m.get("type")
                    .and_then(|t| t.as_str())
                    .is_some_and(|t| t.ends_with("Normalize"))
            })
            .filter_map(|m| m.get("path")?.as_str())
            .filter(|p| !p.is_empty())
            .map(|p| p.trim_end_matches('/').to_string())
            .collect(),
    )
}

/// An [`Error::NotCached`] for `repo` in `cache`.
pub(crate) fn not_cached(repo: &RepoRef, cache: &Cache, reason: String) -> Error {
    Error::NotCached {
        repo: repo.repo_id.clone(),
        revision: repo.revision.clone(),
        cache: cache.root().to_path_buf(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ids() {
        let r = RepoRef::parse("sentence-transformers/all-MiniLM-L6-v2").unwrap();
        assert_eq!(r.repo_id, "sentence-transformers/all-MiniLM-L6-v2");
        assert_eq!(r.revision, "main");
        let r = RepoRef::parse("gpt2@v1.0").unwrap();
        assert_eq!((r.repo_id.as_str(), r.revision.as_str()), ("gpt2", "v1.0"));
        for bad in [
            "",
            "a/b/c",
            "../x",
            "./x",
            "a/",
            "a b",
            "a@",
            "/abs/path",
            "x.gguf/..",
        ] {
            assert_eq!(RepoRef::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn repo_dir_layout() {
        let c = Cache::new("/c");
        assert_eq!(c.repo_dir("a/b"), Path::new("/c/models--a--b"));
        let snap = c.snapshot_dir("a/b", "0123");
        assert_eq!(repo_id_of(&snap).as_deref(), Some("a/b"));
        assert_eq!(repo_id_of(Path::new("/x/y")), None);
    }
}
