//! lattice-hub: turns a model argument into a local path, offline first.
//!
//! Resolution order ([`resolve_model`]):
//! 1. an existing local path (a model folder or a `.gguf` file) as is;
//! 2. a hub id (`ORG/NAME[@REVISION]`) found complete in the Hugging Face cache
//!    (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`), the layout
//!    `huggingface_hub` uses, so models are shared with Python tools;
//! 3. a download from the hub (`$HF_ENDPOINT`, token from `$HF_TOKEN` or `$HF_HOME/token`),
//!    with feature `download` (on by default) and unless `HF_HUB_OFFLINE` is set.
//!
//! Modules: [`cache`] (the cache layout, no network), [`select`] (which repo files a model
//! needs), [`hash`] (the hub's file hashes), `download` (the HTTP client, feature `download`),
//! [`error`].

#![deny(unsafe_code)]

pub mod cache;
#[cfg(feature = "download")]
pub mod download;
pub mod error;
pub mod hash;
pub mod select;

use std::path::{Path, PathBuf};

pub use cache::{Cache, RepoRef};
#[cfg(feature = "download")]
pub use download::{download, Snapshot};
pub use error::{Error, Result};

/// The default hub endpoint.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Where and how to reach the hub; [`HubConfig::from_env`] reads the `HF_*` variables.
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// Base URL of the hub (`HF_ENDPOINT`).
    pub endpoint: String,
    /// The cache folder holding `models--*` (`HF_HUB_CACHE`, `HF_HOME/hub`, or the default).
    pub cache_dir: PathBuf,
    /// Bearer token (`HF_TOKEN`, else the file `HF_HOME/token`).
    pub token: Option<String>,
    /// Never use the network (`HF_HUB_OFFLINE=1`).
    pub offline: bool,
    /// Draw a progress bar on stderr while downloading (only shown on a terminal).
    pub progress: bool,
}

impl HubConfig {
    /// The configuration the environment describes, as `huggingface_hub` reads it.
    pub fn from_env() -> HubConfig {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// The configuration described by the variables `lookup` returns (`HF_ENDPOINT`,
    /// `HF_HOME`, `HF_HUB_CACHE`, `XDG_CACHE_HOME`, `HF_TOKEN`, `HF_HUB_OFFLINE`); empty values
    /// count as unset.
    pub fn from_vars(lookup: impl Fn(&str) -> Option<String>) -> HubConfig {
        let var = |k: &str| lookup(k).filter(|v| !v.trim().is_empty());
        let hf_home = var("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
            var("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| home_dir().map(|h| h.join(".cache")))
                .unwrap_or_else(|| PathBuf::from(".cache"))
                .join("huggingface")
        });
        let cache_dir = var("HF_HUB_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| hf_home.join("hub"));
        let token = var("HF_TOKEN").or_else(|| {
            std::fs::read_to_string(hf_home.join("token"))
                .ok()
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty())
        });
        let offline = var("HF_HUB_OFFLINE").is_some_and(|v| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "1" | "on" | "yes" | "true"
            )
        });
        HubConfig {
            endpoint: var("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.to_string()),
            cache_dir,
            token: token.map(|t| t.trim().to_string()),
            offline,
            progress: true,
        }
    }
}

fn home_dir() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .or_else(|| std::env::var_os("USERPROFILE"))
        .map(PathBuf::from)
}

/// Resolves `model` with the configuration of the environment; see [`resolve_model_with`].
pub fn resolve_model(model: &str) -> Result<PathBuf> {
    resolve_model_with(model, &HubConfig::from_env())
}

/// Resolves `model` to a local model folder or `.gguf` file: an existing path as is, else the
/// hub id's complete snapshot in the cache, else a download (feature `download`, not offline).
/// A snapshot holding a single `.gguf` and no `config.json` resolves to that file.
pub fn resolve_model_with(model: &str, config: &HubConfig) -> Result<PathBuf> {
    let path = Path::new(model);
    if path.exists() {
        return Ok(path.to_path_buf());
    }
    let repo = RepoRef::parse(model).ok_or_else(|| Error::InvalidModelId(model.to_string()))?;
    let cache = Cache::new(&config.cache_dir);
    if let Some(dir) = cache.complete_snapshot(&repo) {
        return Ok(model_path(dir));
    }
    fetch(&repo, config, &cache).map(model_path)
}

#[cfg(feature = "download")]
fn fetch(repo: &RepoRef, config: &HubConfig, _cache: &Cache) -> Result<PathBuf> {
    let snapshot = download(config, repo, &[])?;
    let missing = cache::missing_files(&snapshot.dir);
    if missing.is_empty() {
        Ok(snapshot.dir)
    } else {
        Err(Error::Ambiguous {
            repo: repo.repo_id.clone(),
            reason: format!(
                "downloaded, but the model folder still lacks {}",
                missing.join(", ")
            ),
        })
    }
}

#[cfg(not(feature = "download"))]
fn fetch(repo: &RepoRef, config: &HubConfig, cache: &Cache) -> Result<PathBuf> {
    let why = if config.offline {
        ": HF_HUB_OFFLINE is set, so it cannot be downloaded"
    } else {
        ": this build has no `download` feature; fetch it with another tool"
    };
    Err(cache::not_cached(repo, cache, why.to_string()))
}

/// The snapshot folder, or its single `.gguf` when it has no `config.json`.
fn model_path(dir: PathBuf) -> PathBuf {
    if dir.join("config.json").is_file() {
        return dir;
    }
    let ggufs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "gguf") && p.is_file())
                .collect()
        })
        .unwrap_or_default();
    match <[PathBuf; 1]>::try_from(ggufs) {
        Ok([one]) => one,
        Err(_) => dir,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(vars: &[(&str, &str)]) -> HubConfig {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        HubConfig::from_vars(move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    }

    #[test]
    fn reads_the_hf_variables() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("token"), "hf_from_file\n").unwrap();
        let home = tmp.path().to_str().unwrap();
        let c = config(&[("HF_HOME", home)]);
        assert_eq!(c.endpoint, DEFAULT_ENDPOINT);
        assert_eq!(c.cache_dir, tmp.path().join("hub"));
        assert_eq!(c.token.as_deref(), Some("hf_from_file"));
        assert!(!c.offline);
        let c = config(&[
            ("HF_HOME", home),
            ("HF_HUB_CACHE", "/elsewhere"),
            ("HF_TOKEN", "hf_env"),
            ("HF_HUB_OFFLINE", "True"),
            ("HF_ENDPOINT", "http://127.0.0.1:9"),
        ]);
        assert_eq!(c.cache_dir, Path::new("/elsewhere"));
        assert_eq!(c.token.as_deref(), Some("hf_env"));
        assert!(c.offline);
        assert_eq!(c.endpoint, "http://127.0.0.1:9");
        assert!(!config(&[("HF_HUB_OFFLINE", "0"), ("HF_HOME", home)]).offline);
        let c = config(&[("XDG_CACHE_HOME", "/xdg")]);
        assert_eq!(c.cache_dir, Path::new("/xdg/huggingface/hub"));
    }

    #[test]
    fn single_gguf_snapshot_resolves_to_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("m-Q4_K_M.gguf"), b"GGUF").unwrap();
        assert_eq!(
            model_path(tmp.path().to_path_buf()),
            tmp.path().join("m-Q4_K_M.gguf")
        );
        assert!(cache::missing_files(tmp.path()).is_empty());
        std::fs::write(tmp.path().join("config.json"), b"{}").unwrap();
        assert_eq!(model_path(tmp.path().to_path_buf()), tmp.path());
    }
}
