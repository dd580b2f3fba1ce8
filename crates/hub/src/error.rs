//! The crate's single error type.

use std::path::PathBuf;

/// Every fallible operation in lattice-hub returns this error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A model argument that is neither an existing path nor a valid hub id.
    #[error(
        "`{0}` is not a local directory or file, and not a hub model id (ORG/NAME[@REVISION])"
    )]
    InvalidModelId(String),
    /// A file or directory could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The hub has no such repo, revision or file (HTTP 404).
    #[error("{repo}: {what} not found on the hub ({url})")]
    NotFound {
        /// The repo id.
        repo: String,
        /// What is missing (`file `x` at revision main`, `revision main`).
        what: String,
        /// The URL that answered 404.
        url: String,
    },
    /// The hub refused the request (HTTP 401/403): a private or gated repo, or a missing one.
    #[error("{repo}: access denied (HTTP {status}) for {url}: the repo is private, gated or does not exist; {hint}")]
    Unauthorized {
        /// The repo id.
        repo: String,
        /// 401 or 403.
        status: u16,
        /// The URL refused.
        url: String,
        /// What to do about it (set HF_TOKEN, or check its rights).
        hint: &'static str,
    },
    /// Any other HTTP failure or an unreachable server.
    #[error("{repo}: request to {url} failed: {reason}")]
    Network {
        /// The repo id.
        repo: String,
        /// The URL requested.
        url: String,
        /// The status or transport error.
        reason: String,
    },
    /// The hub answered with something this client cannot use.
    #[error("{repo}: unexpected answer from {url}: {reason}")]
    InvalidResponse {
        /// The repo id.
        repo: String,
        /// The URL requested.
        url: String,
        /// What was wrong.
        reason: String,
    },
    /// A downloaded file does not match the hub's hash; it was deleted, not used.
    #[error("{repo}: `{file}` is corrupt: {algorithm} {actual} != expected {expected}; the file was discarded")]
    HashMismatch {
        /// The repo id.
        repo: String,
        /// The file's path in the repo.
        file: String,
        /// `sha256` or `git-sha1`.
        algorithm: &'static str,
        /// The hub's hash.
        expected: String,
        /// The hash of the bytes received.
        actual: String,
    },
    /// The model is not (completely) in the cache and the network may not be used.
    #[error("{repo}@{revision} is not in the cache ({cache}){reason}")]
    NotCached {
        /// The repo id.
        repo: String,
        /// The revision asked for.
        revision: String,
        /// The cache searched.
        cache: PathBuf,
        /// Why no download was tried (offline mode, feature off) and what is missing.
        reason: String,
    },
    /// A repo whose files do not say which weights to take.
    #[error("{repo}: {reason}")]
    Ambiguous {
        /// The repo id.
        repo: String,
        /// What to choose and how.
        reason: String,
    },
}

/// Shorthand for `Result<T, lattice_hub::Error>`.
pub type Result<T> = std::result::Result<T, Error>;

/// Wraps an I/O error with its path.
pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.into();
    move |source| Error::Io { path, source }
}
