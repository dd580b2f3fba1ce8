//! The hub client (feature `download`): asks the hub which commit a revision is and which files
//! it holds, fetches the files a model needs into the cache with a progress bar, resumes
//! interrupted transfers (HTTP `Range` on `blobs/{etag}.incomplete`), checks each file against
//! the hub's hash before it is renamed into `blobs/`, and only then links it into the snapshot:
//! a half-written or corrupt file is never visible under `snapshots/`.
//!
//! Routes used (as `huggingface_hub` does): `GET {endpoint}/api/models/{repo}/revision/{rev}`
//! (`sha`, `siblings`), `HEAD {endpoint}/{repo}/resolve/{commit}/{file}` (`ETag`,
//! `X-Linked-Etag`, `X-Linked-Size`, a redirect for LFS files) and `GET` of the same URL or of
//! its redirect target.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::cache::{self, Cache, RepoRef};
use crate::error::{io, Error, Result};
use crate::hash::{hash_file, normalize_etag, HashKind};
use crate::select;
use crate::HubConfig;

/// How many times one file transfer is tried (each retry resumes where the last stopped).
const ATTEMPTS: usize = 4;

/// A model fetched into the cache.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The repo id.
    pub repo_id: String,
    /// The commit the revision resolved to.
    pub commit: String,
    /// `snapshots/{commit}` in the cache: the model folder.
    pub dir: PathBuf,
    /// The repo paths of the files this call made sure of, sorted (empty when offline mode
    /// returned a complete cached snapshot).
    pub files: Vec<String>,
    /// Bytes received over the network by this call (0 when everything was cached).
    pub downloaded_bytes: u64,
}

/// Fetches the files of `repo` that a model needs (or those matching `include`, when given)
/// into the cache, and returns the snapshot. Files already in the cache are not fetched
/// again. In offline mode, returns the cached snapshot when it is complete, else an error.
pub fn download(config: &HubConfig, repo: &RepoRef, include: &[String]) -> Result<Snapshot> {
    let cache = Cache::new(&config.cache_dir);
    if config.offline {
        if let Some(dir) = cache.complete_snapshot(repo) {
            return Ok(Snapshot {
                repo_id: repo.repo_id.clone(),
                commit: cache.commit_of(repo).unwrap_or_default(),
                files: Vec::new(),
                dir,
                downloaded_bytes: 0,
            });
        }
        return Err(cache::not_cached(
            repo,
            &cache,
            ": HF_HUB_OFFLINE is set, so it cannot be downloaded".into(),
        ));
    }
    let client = Client::new(config, &repo.repo_id);
    let (commit, siblings) = client.revision_info(&repo.revision)?;
    cache.write_ref(repo, &commit)?;
    let dir = cache.snapshot_dir(&repo.repo_id, &commit);
    let fetch = |file: &str, bytes: &mut u64| -> Result<()> {
        *bytes += client.fetch_file(&cache, &commit, file)?;
        Ok(())
    };
    let mut bytes = 0u64;
    let files = if include.is_empty() {
        if siblings.iter().any(|s| s == "modules.json") {
            fetch("modules.json", &mut bytes)?;
        }
        let modules = cache::module_dirs(&dir.join("modules.json")).unwrap_or_default();
        let mut files = select::small_files(&siblings, &modules);
        for f in &files {
            fetch(f, &mut bytes)?;
        }
        let index = dir.join("model.safetensors.index.json");
        let shards = if index.is_file() {
            Some(
                cache::shards_of_index(&index).ok_or_else(|| Error::InvalidResponse {
                    repo: repo.repo_id.clone(),
                    url: index.display().to_string(),
                    reason: "model.safetensors.index.json has no `weight_map`".into(),
                })?,
            )
        } else {
            None
        };
        let weights =
            select::weight_files(&siblings, shards).map_err(|reason| Error::Ambiguous {
                repo: repo.repo_id.clone(),
                reason,
            })?;
        for f in &weights {
            fetch(f, &mut bytes)?;
        }
        files.extend(weights);
        files
    } else {
        let files: Vec<String> = siblings
            .iter()
            .filter(|s| include.iter().any(|p| select::glob_match(p, s)))
            .cloned()
            .collect();
        if files.is_empty() {
            return Err(Error::Ambiguous {
                repo: repo.repo_id.clone(),
                reason: format!("no file of the repo matches {}", include.join(", ")),
            });
        }
        for f in &files {
            fetch(f, &mut bytes)?;
        }
        files
    };
    let mut files = files;
    files.sort();
    files.dedup();
    Ok(Snapshot {
        repo_id: repo.repo_id.clone(),
        commit,
        dir,
        files,
        downloaded_bytes: bytes,
    })
}

/// What `HEAD` on a file's resolve URL says.
struct FileMeta {
    /// Normalized `X-Linked-Etag` or `ETag`: the blob name and, when it is a hash, the hash.
    etag: String,
    /// `X-Linked-Size` or `Content-Length`.
    size: Option<u64>,
    /// Where the content is (the redirect target for LFS files).
    url: String,
}

struct Client<'a> {
    config: &'a HubConfig,
    repo_id: &'a str,
    agent: ureq::Agent,
}

impl<'a> Client<'a> {
    fn new(config: &'a HubConfig, repo_id: &'a str) -> Self {
        let agent = ureq::AgentBuilder::new()
            .redirects(0)
            .timeout_connect(Duration::from_secs(20))
            .timeout_read(Duration::from_secs(60))
            .user_agent(concat!("lattice/", env!("CARGO_PKG_VERSION")))
            .build();
        Client {
            config,
            repo_id,
            agent,
        }
    }

    fn endpoint(&self) -> &str {
        self.config.endpoint.trim_end_matches('/')
    }

    /// Sends `method url` with the token when `url` is on the endpoint; maps error statuses.
    fn send(
        &self,
        method: &str,
        url: &str,
        what: &str,
        range: Option<u64>,
    ) -> Result<ureq::Response> {
        let mut req = self.agent.request(method, url);
        if let (Some(token), true) = (&self.config.token, url.starts_with(self.endpoint())) {
            req = req.set("Authorization", &format!("Bearer {token}"));
        }
        if let Some(start) = range {
            req = req.set("Range", &format!("bytes={start}-"));
        }
        match req.call() {
            Ok(resp) => Ok(resp),
            Err(ureq::Error::Status(status, resp)) => {
                Err(self.status_error(status, resp, url, what))
            }
            Err(ureq::Error::Transport(t)) => Err(Error::Network {
                repo: self.repo_id.to_string(),
                url: url.to_string(),
                reason: t.to_string(),
            }),
        }
    }

    fn status_error(&self, status: u16, resp: ureq::Response, url: &str, what: &str) -> Error {
        let repo = self.repo_id.to_string();
        let url = url.to_string();
        match status {
            401 | 403 => Error::Unauthorized {
                repo,
                status,
                url,
                hint: if self.config.token.is_some() {
                    "HF_TOKEN is set: check that it grants access to this repo"
                } else {
                    "set HF_TOKEN to a token that grants access"
                },
            },
            404 => Error::NotFound {
                repo,
                what: what.to_string(),
                url,
            },
            416 => Error::InvalidResponse {
                repo,
                url,
                reason: "range not satisfiable".into(),
            },
            _ => {
                let code = resp.header("x-error-message").unwrap_or("").to_string();
                Error::Network {
                    repo,
                    url,
                    reason: format!("HTTP {status} {code}").trim_end().to_string(),
                }
            }
        }
    }

    /// The commit `revision` points at and the repo's file list.
    fn revision_info(&self, revision: &str) -> Result<(String, Vec<String>)> {
        let url = format!(
            "{}/api/models/{}/revision/{}",
            self.endpoint(),
            self.repo_id,
            encode_path(revision)
        );
        let resp = self.send("GET", &url, &format!("revision `{revision}`"), None)?;
        let bad = |reason: String| Error::InvalidResponse {
            repo: self.repo_id.to_string(),
            url: url.clone(),
            reason,
        };
        let json: serde_json::Value = serde_json::from_reader(resp.into_reader())
            .map_err(|e| bad(format!("not JSON: {e}")))?;
        let commit = json
            .get("sha")
            .and_then(|s| s.as_str())
            .filter(|s| cache::is_commit_hash(s))
            .ok_or_else(|| bad("no commit `sha`".into()))?
            .to_ascii_lowercase();
        let siblings = json
            .get("siblings")
            .and_then(|s| s.as_array())
            .ok_or_else(|| bad("no `siblings` list".into()))?
            .iter()
            .filter_map(|s| s.get("rfilename")?.as_str().map(str::to_string))
            .filter(|f| is_safe_repo_path(f))
            .collect();
        Ok((commit, siblings))
    }

    fn head(&self, commit: &str, file: &str) -> Result<FileMeta> {
        let url = format!(
            "{}/{}/resolve/{commit}/{}",
            self.endpoint(),
            self.repo_id,
            encode_path(file)
        );
        let what = format!("file `{file}` at commit {commit}");
        let resp = self.send("HEAD", &url, &what, None)?;
        let header = |name: &str| resp.header(name).map(str::to_string);
        let etag = header("x-linked-etag")
            .or_else(|| header("etag"))
            .map(|e| normalize_etag(&e))
            .filter(|e| !e.is_empty() && is_safe_repo_path(e) && !e.contains('/'))
            .ok_or_else(|| Error::InvalidResponse {
                repo: self.repo_id.to_string(),
                url: url.clone(),
                reason: format!("no usable ETag for `{file}`"),
            })?;
        let size = header("x-linked-size")
            .or_else(|| header("content-length"))
            .and_then(|s| s.trim().parse().ok());
        let url = if (300..400).contains(&resp.status()) {
            let loc = header("location").ok_or_else(|| Error::InvalidResponse {
                repo: self.repo_id.to_string(),
                url: url.clone(),
                reason: "redirect without Location".into(),
            })?;
            absolute(&url, &loc)
        } else {
            url
        };
        Ok(FileMeta { etag, size, url })
    }

    /// Puts `file` into the snapshot of `commit`; returns the bytes received.
    fn fetch_file(&self, cache: &Cache, commit: &str, file: &str) -> Result<u64> {
        let link = cache.snapshot_dir(self.repo_id, commit).join(file);
        if link.is_file() {
            return Ok(0);
        }
        let meta = self.head(commit, file)?;
        let blob = cache.blob_path(self.repo_id, &meta.etag);
        if blob.is_file() {
            cache.install(self.repo_id, commit, file, &meta.etag, None)?;
            return Ok(0);
        }
        // One writer per blob across processes (the lock huggingface_hub takes too); a second
        // downloader waits, then finds the blob done.
        let _lock = self.lock_blob(cache, &meta.etag, file)?;
        if blob.is_file() {
            cache.install(self.repo_id, commit, file, &meta.etag, None)?;
            return Ok(0);
        }
        let partial = blob.with_file_name(format!("{}.incomplete", meta.etag));
        let received = self.transfer(&meta, file, &partial)?;
        if let Some(kind) = HashKind::of_etag(&meta.etag) {
            let actual = hash_file(&partial, kind)?;
            if actual != meta.etag {
                let _ = std::fs::remove_file(&partial);
                return Err(Error::HashMismatch {
                    repo: self.repo_id.to_string(),
                    file: file.to_string(),
                    algorithm: kind.name(),
                    expected: meta.etag,
                    actual,
                });
            }
        }
        cache.install(self.repo_id, commit, file, &meta.etag, Some(&partial))?;
        Ok(received)
    }

    /// Takes the exclusive lock `{cache}/.locks/models--ORG--NAME/{etag}.lock`, waiting for
    /// another process that holds it. The lock is released when the file is closed.
    fn lock_blob(&self, cache: &Cache, etag: &str, file: &str) -> Result<std::fs::File> {
        let dir = cache
            .root()
            .join(".locks")
            .join(cache.repo_dir(self.repo_id).file_name().unwrap_or_default());
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        let path = dir.join(format!("{etag}.lock"));
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io(&path))?;
        if lock.try_lock().is_err() {
            if self.config.progress {
                eprintln!("waiting for another download of `{file}` to finish");
            }
            lock.lock().map_err(io(&path))?;
        }
        Ok(lock)
    }

    /// Downloads into `partial`, resuming from its current length, retrying cut transfers.
    fn transfer(&self, meta: &FileMeta, file: &str, partial: &Path) -> Result<u64> {
        let parent = partial.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(parent).map_err(io(parent))?;
        let bar = progress_bar(self.config.progress, file, meta.size);
        let mut received = 0u64;
        let mut last_error = None;
        for _ in 0..ATTEMPTS {
            let have = std::fs::metadata(partial).map(|m| m.len()).unwrap_or(0);
            if meta.size.is_some_and(|s| have == s) {
                last_error = None;
                break;
            }
            if meta.size.is_some_and(|s| have > s) {
                std::fs::remove_file(partial).map_err(io(partial))?;
                continue;
            }
            let what = format!("file `{file}`");
            let resp = match self.send("GET", &meta.url, &what, (have > 0).then_some(have)) {
                Ok(r) => r,
                Err(e @ Error::Network { .. }) => {
                    last_error = Some(e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            // 206: the server resumes at `have`; 200: it sends everything again.
            let append = resp.status() == 206 && have > 0;
            let mut out = OpenOptions::new()
                .create(true)
                .write(true)
                .append(append)
                .truncate(!append)
                .open(partial)
                .map_err(io(partial))?;
            bar.set_position(if append { have } else { 0 });
            match copy_with_progress(resp.into_reader(), &mut out, &bar) {
                Ok(n) => {
                    received += n;
                    out.flush().map_err(io(partial))?;
                    last_error = None;
                    if meta.size.is_none() {
                        break;
                    }
                }
                Err((n, e)) => {
                    received += n;
                    let _ = out.flush();
                    last_error = Some(Error::Network {
                        repo: self.repo_id.to_string(),
                        url: meta.url.clone(),
                        reason: format!("transfer of `{file}` cut: {e}"),
                    });
                }
            }
        }
        bar.finish_and_clear();
        if let Some(e) = last_error {
            return Err(e);
        }
        let have = std::fs::metadata(partial).map_err(io(partial))?.len();
        if let Some(size) = meta.size.filter(|&s| s != have) {
            return Err(Error::Network {
                repo: self.repo_id.to_string(),
                url: meta.url.clone(),
                reason: format!("`{file}`: got {have} of {size} bytes after {ATTEMPTS} attempts"),
            });
        }
        Ok(received)
    }
}

/// Copies until EOF; on a read or write error returns the bytes copied so far with it.
fn copy_with_progress(
    mut from: impl Read,
    to: &mut impl Write,
    bar: &indicatif::ProgressBar,
) -> std::result::Result<u64, (u64, std::io::Error)> {
    let mut buf = vec![0u8; 256 << 10];
    let mut n = 0u64;
    loop {
        let k = match from.read(&mut buf) {
            Ok(0) => return Ok(n),
            Ok(k) => k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err((n, e)),
        };
        to.write_all(&buf[..k]).map_err(|e| (n, e))?;
        n += k as u64;
        bar.inc(k as u64);
    }
}

fn progress_bar(show: bool, file: &str, size: Option<u64>) -> indicatif::ProgressBar {
    if !show {
        return indicatif::ProgressBar::hidden();
    }
    let bar =
        indicatif::ProgressBar::with_draw_target(size, indicatif::ProgressDrawTarget::stderr());
    let style = indicatif::ProgressStyle::with_template(
        "{msg:30!} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    )
    .map(|s| s.progress_chars("=> "))
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_message(file.to_string());
    bar
}

/// A repo path that stays inside the snapshot: relative, no `..`, no empty segment.
fn is_safe_repo_path(p: &str) -> bool {
    !p.is_empty()
        && !p.starts_with('/')
        && !p.contains('\\')
        && p.split('/')
            .all(|seg| !seg.is_empty() && seg != "." && seg != "..")
}

/// Percent-encodes a repo path for a URL, keeping `/`.
fn encode_path(p: &str) -> String {
    let mut out = String::with_capacity(p.len());
    for b in p.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `location` made absolute against `base` (`http://host:port/...`).
fn absolute(base: &str, location: &str) -> String {
    if location.contains("://") {
        return location.to_string();
    }
    let origin_end = base
        .find("://")
        .and_then(|i| base[i + 3..].find('/').map(|j| i + 3 + j))
        .unwrap_or(base.len());
    if location.starts_with('/') {
        format!("{}{location}", &base[..origin_end])
    } else {
        let dir_end = base.rfind('/').map_or(base.len(), |i| i + 1);
        format!("{}{location}", &base[..dir_end])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(absolute("http://h:1/a/b", "/c"), "http://h:1/c");
        assert_eq!(absolute("http://h:1/a/b", "c"), "http://h:1/a/c");
        assert_eq!(absolute("http://h:1/a", "https://x/y"), "https://x/y");
        assert_eq!(encode_path("a b/c.json"), "a%20b/c.json");
        assert!(is_safe_repo_path("1_Pooling/config.json"));
        assert!(
            !is_safe_repo_path("../x") && !is_safe_repo_path("/x") && !is_safe_repo_path("a//b")
        );
    }
}
