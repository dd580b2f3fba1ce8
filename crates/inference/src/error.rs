//! The crate's single error type. Variants carry the structure a user needs to act on: the file,
//! the tensor, the expected and found shapes, the config field.

use std::path::PathBuf;

/// Every fallible operation in lattice-inference returns this error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O failure on a named file.
    #[error("{path}: {source}")]
    Io {
        /// The file that could not be read.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A weights file that is not a valid safetensors / GGUF file (truncated, corrupt header, ...).
    #[error("{path}: invalid weights file: {reason}")]
    InvalidWeights {
        /// The offending file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A tensor the model needs is not in any weights file.
    #[error("tensor `{name}` not found in {location}")]
    MissingTensor {
        /// The full tensor name that was looked up.
        name: String,
        /// The file or directory searched.
        location: String,
    },
    /// A tensor has a shape other than the one the config implies.
    #[error("tensor `{name}` in {path}: expected shape {expected:?}, found {found:?}")]
    ShapeMismatch {
        /// The tensor's name.
        name: String,
        /// The file it came from.
        path: PathBuf,
        /// The shape the model expects.
        expected: Vec<usize>,
        /// The shape stored in the file.
        found: Vec<usize>,
    },
    /// A tensor stored in a dtype the loader cannot convert.
    #[error("tensor `{name}` in {path}: unsupported dtype {dtype}")]
    UnsupportedDtype {
        /// The tensor's name.
        name: String,
        /// The file it came from.
        path: PathBuf,
        /// The dtype as written in the file.
        dtype: String,
    },
    /// A `config.json` (or other JSON config) that is missing, unparsable or inconsistent.
    #[error("{path}: invalid config: {reason}")]
    InvalidConfig {
        /// The config file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A tokenizer file that cannot be used.
    #[error("{path}: invalid tokenizer: {reason}")]
    InvalidTokenizer {
        /// The tokenizer file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A model type / architecture this build does not implement.
    #[error("unsupported model: {0}")]
    UnsupportedModel(String),
    /// Caller passed arguments of inconsistent shapes to an op.
    #[error("op `{op}`: {reason}")]
    Shape {
        /// The op that was called.
        op: &'static str,
        /// Which dimensions disagree.
        reason: String,
    },
    /// Input the model cannot process (e.g. an empty batch item with no tokens).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The memory budget of the KV page pool is spent (the engine evicts cached pages or
    /// preempts a sequence and tries again).
    #[error("out of KV memory: {0}")]
    OutOfMemory(String),
    /// A chat template that does not compile, or whose render failed (incl. `raise_exception`).
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// An image that cannot be used: not an image, truncated or corrupt, an unsupported format,
    /// or beyond a size limit (the message names which).
    #[error("image: {0}")]
    InvalidImage(String),
    /// A compute device that cannot be used: not built in, no driver, no such device, or a
    /// failed device call (the message names which).
    #[error("device: {0}")]
    Device(String),
}

/// Shorthand for `Result<T, lattice_inference::Error>`.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// Wraps an I/O error with the path it happened on.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}
