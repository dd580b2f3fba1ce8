//! The sentence-transformers files of a model directory: `modules.json` (which modules run),
//! `1_Pooling/config.json` (pooling mode), `sentence_bert_config.json` (max_seq_length) and
//! `config_sentence_transformers.json` (named prompts such as `query`).

use std::collections::HashMap;
use std::path::Path;

use lattice_inference::model::heads::Pooling;
use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::{Error, Result};

/// What the sentence-transformers files say about the pipeline after the transformer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StConfig {
    /// Pooling mode, when a Pooling module is present.
    pub pooling: Option<Pooling>,
    /// Whether a Normalize module follows pooling (`None` when there is no `modules.json`).
    pub normalize: Option<bool>,
    /// `max_seq_length` from `sentence_bert_config.json`.
    pub max_seq_length: Option<usize>,
    /// Named prompts (e.g. `query` → `"query: "`).
    pub prompts: HashMap<String, String>,
}

#[derive(Deserialize)]
struct Module {
    path: String,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize, Default)]
struct PoolingFile {
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(default)]
    pooling_mode_mean_sqrt_len_tokens: bool,
    #[serde(default)]
    pooling_mode_lasttoken: bool,
    #[serde(default)]
    pooling_mode_weightedmean_tokens: bool,
}

#[derive(Deserialize)]
struct SentenceBertFile {
    max_seq_length: Option<usize>,
}

#[derive(Deserialize)]
struct StModelFile {
    #[serde(default)]
    prompts: HashMap<String, String>,
}

fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Inference(lattice_inference::Error::io(path, e)))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| Error::InvalidConfig {
            path: path.to_path_buf(),
            reason: format!("invalid JSON: {e}"),
        })
}

impl StConfig {
    /// Reads whichever of the files exist in `dir`.
    pub fn read(dir: &Path) -> Result<StConfig> {
        let mut cfg = StConfig::default();
        let modules_path = dir.join("modules.json");
        if let Some(modules) = read_json::<Vec<Module>>(&modules_path)? {
            cfg.normalize = Some(modules.iter().any(|m| m.kind.ends_with(".Normalize")));
            for m in modules.iter().filter(|m| m.kind.ends_with(".Pooling")) {
                let path = dir.join(&m.path).join("config.json");
                let file: PoolingFile = read_json(&path)?.ok_or_else(|| Error::InvalidConfig {
                    path: path.clone(),
                    reason: format!(
                        "not found (modules.json names a Pooling module in `{}`)",
                        m.path
                    ),
                })?;
                cfg.pooling = Some(pooling_mode(&file).ok_or_else(|| Error::InvalidConfig {
                    path: path.clone(),
                    reason: "unsupported pooling mode (supported: cls, mean, max, lasttoken; exactly one)".into(),
                })?);
            }
            if let Some(m) = modules.iter().find(|m| {
                !m.kind.ends_with(".Transformer")
                    && !m.kind.ends_with(".Pooling")
                    && !m.kind.ends_with(".Normalize")
            }) {
                return Err(Error::InvalidConfig {
                    path: modules_path,
                    reason: format!("module `{}` is not supported", m.kind),
                });
            }
        }
        if let Some(f) = read_json::<SentenceBertFile>(&dir.join("sentence_bert_config.json"))? {
            cfg.max_seq_length = f.max_seq_length;
        }
        if let Some(f) = read_json::<StModelFile>(&dir.join("config_sentence_transformers.json"))? {
            cfg.prompts = f.prompts;
        }
        Ok(cfg)
    }
}

fn pooling_mode(f: &PoolingFile) -> Option<Pooling> {
    let modes = [
        (f.pooling_mode_cls_token, Some(Pooling::Cls)),
        (f.pooling_mode_mean_tokens, Some(Pooling::Mean)),
        (f.pooling_mode_max_tokens, Some(Pooling::Max)),
        (f.pooling_mode_lasttoken, Some(Pooling::LastToken)),
        (f.pooling_mode_mean_sqrt_len_tokens, None),
        (f.pooling_mode_weightedmean_tokens, None),
    ];
    let on: Vec<_> = modes.iter().filter(|(flag, _)| *flag).collect();
    match on.as_slice() {
        [(_, mode)] => *mode,
        _ => None,
    }
}
