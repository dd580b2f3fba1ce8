//! File hashes as the hub reports them: the sha256 of LFS files (their `X-Linked-Etag`) and the
//! git blob sha1 of small files kept in git (their `ETag`).

use std::io::Read;
use std::path::Path;

use sha1::Sha1;
use sha2::{Digest, Sha256};

use crate::error::{io, Result};

/// Which hash an etag is, judged by its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HashKind {
    /// 64 hex digits: sha256 of the content (LFS files).
    Sha256,
    /// 40 hex digits: git blob sha1, `sha1("blob {len}\0" + content)` (files in git).
    GitSha1,
}

impl HashKind {
    /// The kind of `etag` (already unquoted), or `None` for an etag that is no known hash.
    pub fn of_etag(etag: &str) -> Option<HashKind> {
        if !etag.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        match etag.len() {
            64 => Some(HashKind::Sha256),
            40 => Some(HashKind::GitSha1),
            _ => None,
        }
    }

    /// The name used in messages.
    pub fn name(self) -> &'static str {
        match self {
            HashKind::Sha256 => "sha256",
            HashKind::GitSha1 => "git-sha1",
        }
    }
}

/// Normalizes an `ETag` header value: drops a weak `W/` prefix and the quotes, lowercases.
pub fn normalize_etag(raw: &str) -> String {
    let s = raw.trim();
    let s = s.strip_prefix("W/").unwrap_or(s);
    s.trim_matches('"').to_ascii_lowercase()
}

/// The lowercase hex hash of kind `kind` of the file at `path`.
pub fn hash_file(path: &Path, kind: HashKind) -> Result<String> {
    let mut file = std::fs::File::open(path).map_err(io(path))?;
    let len = file.metadata().map_err(io(path))?.len();
    let mut buf = vec![0u8; 1 << 20];
    match kind {
        HashKind::Sha256 => {
            let mut h = Sha256::new();
            loop {
                let n = file.read(&mut buf).map_err(io(path))?;
                if n == 0 {
                    break;
                }
                h.update(&buf[..n]);
            }
            Ok(hex(&h.finalize()))
        }
        HashKind::GitSha1 => {
            let mut h = Sha1::new();
            h.update(format!("blob {len}\0").as_bytes());
            loop {
                let n = file.read(&mut buf).map_err(io(path))?;
                if n == 0 {
                    break;
                }
                h.update(&buf[..n]);
            }
            Ok(hex(&h.finalize()))
        }
    }
}

/// The hash of kind `kind` of `bytes` (for small in-memory content).
pub fn hash_bytes(bytes: &[u8], kind: HashKind) -> String {
    match kind {
        HashKind::Sha256 => hex(&Sha256::digest(bytes)),
        HashKind::GitSha1 => {
            let mut h = Sha1::new();
            h.update(format!("blob {}\0", bytes.len()).as_bytes());
            h.update(bytes);
            hex(&h.finalize())
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_hashes() {
        // `git hash-object` of an empty file, and sha256 of "abc".
        assert_eq!(
            hash_bytes(b"", HashKind::GitSha1),
            "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
        );
        assert_eq!(
            hash_bytes(b"abc", HashKind::Sha256),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn etags() {
        assert_eq!(normalize_etag("W/\"ABC\""), "abc");
        assert_eq!(HashKind::of_etag(&"a".repeat(64)), Some(HashKind::Sha256));
        assert_eq!(HashKind::of_etag(&"a".repeat(40)), Some(HashKind::GitSha1));
        assert_eq!(HashKind::of_etag("xyz"), None);
    }
}
