//! lattice-embed: what applications call to turn text into vectors.
//!
//! - [`catalog`]: known models (`EmbeddingModel`) with pooling, normalization, prefixes, limits.
//! - [`st_config`]: the sentence-transformers files of a model directory.
//! - [`Embedder`]: loads a model directory and embeds texts, batched by a token budget,
//!   equal to `SentenceTransformer(dir).encode(texts)`.
//! - [`Reranker`]: a cross-encoder scoring (query, passage) pairs.
//! - [`vector`]: SIMD dot / cosine / normalize.
//! - [`eval`]: Spearman / Pearson correlation for benchmarks such as STS-B.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod catalog;
mod embedder;
mod error;
pub mod eval;
mod reranker;
pub mod st_config;
pub mod vector;

pub use catalog::{EmbeddingModel, ModelSpec};
pub use embedder::{resolve_model_dir, Embedder, EmbedderOptions, TextKind};
pub use error::{Error, Result};
pub use lattice_inference::model::heads::Pooling;
pub use lattice_inference::model::source::WeightMode;
pub use reranker::{Activation, Reranker};
