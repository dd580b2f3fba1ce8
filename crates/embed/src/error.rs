//! The crate's single error type.

use std::path::PathBuf;

/// Every fallible operation in lattice-embed returns this error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An engine error (weights, tokenizer, model).
    #[error(transparent)]
    Inference(#[from] lattice_inference::Error),
    /// A sentence-transformers file that is present but unusable.
    #[error("{path}: {reason}")]
    InvalidConfig {
        /// The offending file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A model name that is neither a directory nor in the catalog.
    #[error(
        "unknown model `{0}`: not a directory and not a catalog name (see `EmbeddingModel::ALL`)"
    )]
    UnknownModel(String),
    /// Input that cannot be embedded.
    #[error("invalid input: {0}")]
    InvalidInput(String),
}

/// Shorthand for `Result<T, lattice_embed::Error>`.
pub type Result<T> = std::result::Result<T, Error>;
