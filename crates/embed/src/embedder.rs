//! [`Embedder`]: text in, vectors out, exactly as `SentenceTransformer(dir).encode(texts)`:
//! tokenize with truncation to the model's limit, run the encoder over packed batches cut by a
//! token budget, pool, and normalize when the model's pipeline says so.

use std::path::{Path, PathBuf};

use lattice_inference::backend::Device;
use lattice_inference::model::heads::{self, Pooling};
use lattice_inference::model::source::{Placement, WeightMode};
use lattice_inference::model::{load_encoder_with, Encoder, PackedBatch};
use lattice_inference::tokenizer::Tokenizer;

use crate::catalog::EmbeddingModel;
use crate::st_config::StConfig;
use crate::{Error, Result};

/// Options for loading an [`Embedder`].
#[derive(Debug, Clone)]
pub struct EmbedderOptions {
    /// Most tokens (padding-free) per forward pass; larger batches are split. Default 16,384.
    pub max_batch_tokens: usize,
    /// Matryoshka output size: keep the first `n` dimensions of each embedding (then
    /// L2-normalize, when the model normalizes). `None` keeps the model's full width.
    pub dimensions: Option<usize>,
    /// Where the encoder runs (BERT-family encoders on a GPU; the others on the CPU only).
    pub device: Device,
    /// How the encoder's matrices are held: [`WeightMode::F32`] (exact, the default),
    /// [`WeightMode::Bf16`] (`--bf16`) or [`WeightMode::Q8`] (`--q8`), faster on CPUs with
    /// bf16 / int8 instructions and not bit-equal to f32 (docs/benchmarks.md states the cost).
    pub mode: WeightMode,
}

impl Default for EmbedderOptions {
    fn default() -> Self {
        Self {
            max_batch_tokens: 16_384,
            dimensions: None,
            device: Device::Cpu,
            mode: WeightMode::F32,
        }
    }
}

/// Whether a text is a search query or a passage, for models with asymmetric prefixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextKind {
    /// Embed as is.
    Plain,
    /// Prepend the model's query prefix (e.g. `query: `).
    Query,
    /// Prepend the model's passage prefix (e.g. `passage: `).
    Passage,
}

/// A loaded embedding model.
pub struct Embedder {
    dir: PathBuf,
    tokenizer: Tokenizer,
    encoder: Box<dyn Encoder>,
    pooling: Pooling,
    normalize: bool,
    max_tokens: usize,
    query_prefix: Option<String>,
    passage_prefix: Option<String>,
    options: EmbedderOptions,
}

impl std::fmt::Debug for Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedder")
            .field("dir", &self.dir)
            .field("pooling", &self.pooling)
            .field("normalize", &self.normalize)
            .field("max_tokens", &self.max_tokens)
            .finish()
    }
}

/// Resolves a model argument to a directory: an existing directory as is; a catalog name
/// (`all-MiniLM-L6-v2`) as its hub id; a hub id (`ORG/NAME[@REVISION]`) through the Hugging
/// Face cache, downloaded there when missing (feature `download`, unless `HF_HUB_OFFLINE`).
pub fn resolve_model_dir(model: &str) -> Result<PathBuf> {
    let p = Path::new(model);
    if p.is_dir() {
        return Ok(p.to_path_buf());
    }
    let id = EmbeddingModel::from_name(model).map_or(model, |m| m.spec().hub_id);
    match lattice_hub::resolve_model(id) {
        Ok(dir) => Ok(dir),
        Err(lattice_hub::Error::InvalidModelId(_)) => Err(Error::UnknownModel(model.to_string())),
        Err(e) => Err(Error::InvalidInput(format!("model `{model}`: {e}"))),
    }
}

impl Embedder {
    /// Loads the model named `model` (a directory) with default options.
    pub fn load(model: &str) -> Result<Embedder> {
        Self::load_dir(&resolve_model_dir(model)?, EmbedderOptions::default())
    }

    /// Loads the model in `dir`. Pooling, normalization, prefixes and the token limit come from
    /// the directory's sentence-transformers files, then from the catalog (matched by the
    /// directory name), then from defaults (mean pooling, no normalization, the model's position
    /// limit).
    pub fn load_dir(dir: &Path, options: EmbedderOptions) -> Result<Embedder> {
        let config_path = dir.join("config.json");
        if !config_path.is_file() {
            return Err(Error::InvalidConfig {
                path: config_path,
                reason: "not found: the model directory needs config.json".into(),
            });
        }
        let st = StConfig::read(dir)?;
        // The catalog entry: by folder name, or by hub id for a Hugging Face cache snapshot
        // (`models--ORG--NAME/snapshots/REV`).
        let catalog = dir
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(EmbeddingModel::from_name)
            .or_else(|| {
                lattice_hub::cache::repo_id_of(dir).and_then(|id| EmbeddingModel::from_name(&id))
            })
            .map(EmbeddingModel::spec);
        let tokenizer = Tokenizer::from_dir(dir)?;
        let place = Placement::new(options.mode, options.device.clone());
        let encoder = load_encoder_with(dir, &place)?;
        let info = encoder.info();
        if let Some(d) = options.dimensions {
            if d == 0 || d > info.hidden_size {
                return Err(Error::InvalidInput(format!(
                    "dimensions {d} must be between 1 and the model's width {}",
                    info.hidden_size
                )));
            }
        }
        let pooling = st
            .pooling
            .or(catalog.map(|c| c.pooling))
            .unwrap_or(Pooling::Mean);
        let normalize = st
            .normalize
            .or(catalog.map(|c| c.normalize))
            .unwrap_or(false);
        let max_tokens = st
            .max_seq_length
            .or(catalog.map(|c| c.max_tokens))
            .unwrap_or(info.max_positions)
            .min(info.max_positions);
        let query_prefix = st
            .prompts
            .get("query")
            .cloned()
            .or(catalog.and_then(|c| c.query_prefix.map(str::to_string)));
        let passage_prefix = st
            .prompts
            .get("passage")
            .or(st.prompts.get("document"))
            .cloned()
            .or(catalog.and_then(|c| c.passage_prefix.map(str::to_string)));
        Ok(Embedder {
            dir: dir.to_path_buf(),
            tokenizer,
            encoder,
            pooling,
            normalize,
            max_tokens,
            query_prefix,
            passage_prefix,
            options,
        })
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Shape facts of the underlying encoder.
    pub fn encoder_info(&self) -> &lattice_inference::model::EncoderInfo {
        self.encoder.info()
    }

    /// Output dimension (the Matryoshka size when one was chosen).
    pub fn dim(&self) -> usize {
        self.options
            .dimensions
            .unwrap_or(self.encoder.info().hidden_size)
    }

    /// Longest input in tokens; longer texts are truncated.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// The pooling mode in use.
    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// Whether outputs are L2-normalized.
    pub fn normalizes(&self) -> bool {
        self.normalize
    }

    /// Token ids of `text` as the model will see them (special tokens, truncation).
    pub fn token_ids(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self
            .tokenizer
            .encode_with(text, None, true, Some(self.max_tokens))
            .ids)
    }

    /// Embeds each text; one vector of [`Embedder::dim`] values per text, in order.
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        self.embed_as(texts, TextKind::Plain)
    }

    /// Embeds texts as queries or passages, adding the model's prefix for that kind.
    pub fn embed_as(&self, texts: &[&str], kind: TextKind) -> Result<Vec<Vec<f32>>> {
        let prefix = match kind {
            TextKind::Plain => None,
            TextKind::Query => self.query_prefix.as_deref(),
            TextKind::Passage => self.passage_prefix.as_deref(),
        };
        let mut ids = Vec::with_capacity(texts.len());
        for t in texts {
            let ids_one = match prefix {
                Some(p) => self.token_ids(&format!("{p}{t}"))?,
                None => self.token_ids(t)?,
            };
            ids.push(ids_one);
        }
        self.embed_ids(&ids)
    }

    /// Embeds already tokenized sequences (each within [`Embedder::max_tokens`]).
    pub fn embed_ids(&self, seqs: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
        let width = self.encoder.info().hidden_size;
        let dim = self.dim();
        let mut out = Vec::with_capacity(seqs.len());
        let mut start = 0;
        while start < seqs.len() {
            let mut batch = PackedBatch::new();
            let mut end = start;
            while end < seqs.len()
                && (end == start
                    || batch.n_tokens() + seqs[end].len() <= self.options.max_batch_tokens)
            {
                batch.push(&seqs[end], &[]);
                end += 1;
            }
            let hidden = self.encoder.forward(&batch)?;
            let mut pooled = heads::pool(&hidden, width, &batch.cu_seqlens, self.pooling);
            if dim < width {
                pooled = pooled
                    .chunks_exact(width)
                    .flat_map(|row| &row[..dim])
                    .copied()
                    .collect();
            }
            if self.normalize {
                heads::l2_normalize_rows(&mut pooled, dim);
            }
            out.extend(pooled.chunks_exact(dim).map(<[f32]>::to_vec));
            start = end;
        }
        Ok(out)
    }
}
