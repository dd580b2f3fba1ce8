//! A fake Hugging Face hub on 127.0.0.1 for the tests: the routes `huggingface_hub` uses
//! (`/api/models/{repo}/revision/{rev}`, `HEAD`/`GET /{repo}/resolve/{rev}/{file}`, LFS files
//! redirected to `/cdn/{sha256}`), serving the real all-MiniLM-L6-v2 files, with faults to
//! inject: a cut connection, corrupted bytes, a file listed but missing, a required token.
//! Shared by the lattice-hub and lattice-cli tests (`#[path]`).

#![allow(dead_code)]

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

use lattice_hub::hash::{hash_file, HashKind};

/// The repo id the fake hub serves.
pub const REPO: &str = "sentence-transformers/all-MiniLM-L6-v2";
/// The commit `main` points at.
pub const COMMIT: &str = "c9745ed1d9f207416be6d2e6f8de32d1f16199bf";

/// One file of the served repo.
#[derive(Clone, Debug)]
pub struct RepoFile {
    /// Path in the repo.
    pub name: String,
    /// Where its bytes are.
    pub disk: PathBuf,
    /// Size in bytes.
    pub size: u64,
    /// Served through LFS (sha256 etag + redirect) rather than git (sha1 etag).
    pub lfs: bool,
    /// The etag (sha256 or git sha1).
    pub etag: String,
}

/// The MiniLM model folder fetched by scripts/fetch_models.sh; panics (fails the test) when
/// it is missing.
pub fn minilm_dir() -> PathBuf {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache/models/all-MiniLM-L6-v2");
    assert!(
        dir.join("model.safetensors").is_file(),
        "{} is missing: run scripts/fetch_models.sh",
        dir.display()
    );
    dir
}

/// Every file of the MiniLM folder with its hash (computed once per test binary).
pub fn minilm_files() -> &'static [RepoFile] {
    static FILES: OnceLock<Vec<RepoFile>> = OnceLock::new();
    FILES.get_or_init(|| {
        let dir = minilm_dir();
        let mut out = Vec::new();
        walk(&dir, &dir, &mut out);
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    })
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<RepoFile>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            walk(root, &p, out);
            continue;
        }
        let name = p
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        let lfs = name.ends_with(".safetensors");
        let kind = if lfs {
            HashKind::Sha256
        } else {
            HashKind::GitSha1
        };
        let size = p.metadata().unwrap().len();
        out.push(RepoFile {
            etag: hash_file(&p, kind).unwrap(),
            name,
            disk: p,
            size,
            lfs,
        });
    }
}

/// One request the server saw.
#[derive(Clone, Debug)]
pub struct Seen {
    /// `GET` or `HEAD`.
    pub method: String,
    /// The path and query.
    pub path: String,
    /// The `Range` header, if any.
    pub range: Option<String>,
    /// Body bytes sent in reply.
    pub body_bytes: u64,
}

/// Faults and rules, changeable while the server runs.
#[derive(Default)]
pub struct Rules {
    /// Bearer token every `/api` and `/resolve` request must carry.
    pub token: Option<String>,
    /// (file, absolute offset, times): cut the connection at that offset of the file's
    /// content, for the next `times` transfers of it.
    pub cut: Option<(String, u64, usize)>,
    /// (file, absolute offset): send the file's content up to that offset, then hold the
    /// connection without sending more until the rule is cleared (at most 30 s), then close it.
    pub stall: Option<(String, u64)>,
    /// Files served with one byte flipped.
    pub corrupt: HashSet<String>,
    /// Files listed in `siblings` but answered 404.
    pub missing: HashSet<String>,
}

/// The running fake hub; stops when dropped.
pub struct FakeHub {
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    /// Faults to inject.
    pub rules: Arc<Mutex<Rules>>,
    /// Requests seen, in order.
    pub seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
    addr: std::net::SocketAddr,
    thread: Option<JoinHandle<()>>,
}

impl FakeHub {
    /// Starts a server on a free loopback port.
    pub fn start() -> FakeHub {
        let files = minilm_files();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let rules = Arc::new(Mutex::new(Rules::default()));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, s, st) = (rules.clone(), seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let (r, s) = (r.clone(), s.clone());
                std::thread::spawn(move || {
                    let _ = handle(conn, files, &r, &s);
                });
            }
        });
        FakeHub {
            endpoint: format!("http://{addr}"),
            rules,
            seen,
            stop,
            addr,
            thread: Some(thread),
        }
    }

    /// Stops accepting connections (the port then refuses them).
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// The requests seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for FakeHub {
    fn drop(&mut self) {
        self.stop();
    }
}

fn handle(
    conn: TcpStream,
    files: &[RepoFile],
    rules: &Mutex<Rules>,
    seen: &Mutex<Vec<Seen>>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let path = parts.next().unwrap_or("").to_string();
    let (mut range, mut auth) = (None, None);
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            match k.trim().to_ascii_lowercase().as_str() {
                "range" => range = Some(v.trim().to_string()),
                "authorization" => auth = Some(v.trim().to_string()),
                _ => {}
            }
        }
    }
    let mut out = conn;
    // Logged before the body goes out, so a client that has read a reply always finds it here.
    let log = |body_bytes: u64| {
        seen.lock().unwrap().push(Seen {
            method: method.clone(),
            path: path.clone(),
            range: range.clone(),
            body_bytes,
        })
    };
    let req = Request {
        method: &method,
        path: &path,
        range: range.as_deref(),
        auth: auth.as_deref(),
    };
    respond(&mut out, &req, files, rules, &log)?;
    Ok(())
}

fn reply(
    out: &mut TcpStream,
    status: &str,
    headers: &[(&str, String)],
    body: &[u8],
    head: bool,
    log: &dyn Fn(u64),
) -> std::io::Result<u64> {
    log(if head { 0 } else { body.len() as u64 });
    let mut s = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
    let has_len = headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-length"));
    for (k, v) in headers {
        s.push_str(&format!("{k}: {v}\r\n"));
    }
    if !has_len {
        s.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    s.push_str("\r\n");
    out.write_all(s.as_bytes())?;
    if !head {
        out.write_all(body)?;
    }
    out.flush()?;
    Ok(if head { 0 } else { body.len() as u64 })
}

/// The parts of a request the fake hub looks at.
struct Request<'a> {
    method: &'a str,
    path: &'a str,
    range: Option<&'a str>,
    auth: Option<&'a str>,
}

fn respond(
    out: &mut TcpStream,
    req: &Request,
    files: &[RepoFile],
    rules: &Mutex<Rules>,
    log: &dyn Fn(u64),
) -> std::io::Result<u64> {
    let Request {
        method,
        path,
        range,
        auth,
    } = *req;
    let head = method == "HEAD";
    let not_found = |out: &mut TcpStream, code: &str| {
        reply(
            out,
            "404 Not Found",
            &[("X-Error-Code", code.to_string())],
            b"not found",
            head,
            log,
        )
    };
    if let Some(sha) = path.strip_prefix("/cdn/") {
        let sha = sha.split('?').next().unwrap_or("");
        return match files.iter().find(|f| f.lfs && f.etag == sha) {
            Some(f) => serve_file(out, f, range, head, rules, log),
            None => not_found(out, "EntryNotFound"),
        };
    }
    let token = rules.lock().unwrap().token.clone();
    if let Some(t) = token {
        if auth != Some(format!("Bearer {t}").as_str()) {
            return reply(
                out,
                "401 Unauthorized",
                &[("X-Error-Code", "GatedRepo".into())],
                b"unauthorized",
                head,
                log,
            );
        }
    }
    if let Some(rest) = path.strip_prefix("/api/models/") {
        let Some((repo, rev)) = rest.split_once("/revision/") else {
            return not_found(out, "RepoNotFound");
        };
        if repo != REPO {
            return not_found(out, "RepoNotFound");
        }
        if rev != "main" && rev != COMMIT {
            return not_found(out, "RevisionNotFound");
        }
        let siblings: Vec<serde_json::Value> = files
            .iter()
            .map(|f| serde_json::json!({ "rfilename": f.name }))
            .collect();
        let body =
            serde_json::json!({ "id": REPO, "sha": COMMIT, "siblings": siblings }).to_string();
        return reply(
            out,
            "200 OK",
            &[("Content-Type", "application/json".into())],
            body.as_bytes(),
            head,
            log,
        );
    }
    let prefix = format!("/{REPO}/resolve/");
    let Some(rest) = path.strip_prefix(&prefix) else {
        return not_found(out, "RepoNotFound");
    };
    let Some((rev, name)) = rest.split_once('/') else {
        return not_found(out, "EntryNotFound");
    };
    if rev != "main" && rev != COMMIT {
        return not_found(out, "RevisionNotFound");
    }
    let missing = rules.lock().unwrap().missing.contains(name);
    let Some(f) = files.iter().find(|f| f.name == name).filter(|_| !missing) else {
        return not_found(out, "EntryNotFound");
    };
    if f.lfs {
        let headers = [
            ("Location", format!("/cdn/{}?name={}", f.etag, f.name)),
            ("X-Linked-Etag", format!("\"{}\"", f.etag)),
            ("X-Linked-Size", f.size.to_string()),
            ("X-Repo-Commit", COMMIT.to_string()),
            ("ETag", "\"0123abcd-not-the-content-hash\"".to_string()),
        ];
        return reply(out, "302 Found", &headers, b"", head, log);
    }
    serve_file(out, f, range, head, rules, log)
}

/// Serves a file's bytes (with `Range: bytes=N-`), applying the cut and corruption rules.
fn serve_file(
    out: &mut TcpStream,
    f: &RepoFile,
    range: Option<&str>,
    head: bool,
    rules: &Mutex<Rules>,
    log: &dyn Fn(u64),
) -> std::io::Result<u64> {
    let start: u64 = range
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    if start > f.size {
        return reply(out, "416 Range Not Satisfiable", &[], b"", head, log);
    }
    let len = f.size - start;
    let mut headers = vec![
        ("ETag", format!("\"{}\"", f.etag)),
        ("X-Repo-Commit", COMMIT.to_string()),
        ("Content-Length", len.to_string()),
        ("Accept-Ranges", "bytes".to_string()),
    ];
    let status = if start > 0 {
        headers.push((
            "Content-Range",
            format!("bytes {start}-{}/{}", f.size - 1, f.size),
        ));
        "206 Partial Content"
    } else {
        "200 OK"
    };
    reply(out, status, &headers, b"", true, &|_| {})?;
    if head {
        log(0);
        return Ok(0);
    }
    let (cut_at, corrupt) = {
        let mut r = rules.lock().unwrap();
        let corrupt = r.corrupt.contains(&f.name);
        let mut cut_at = None;
        if let Some((name, at, times)) = r.cut.as_mut() {
            if *name == f.name && *times > 0 {
                *times -= 1;
                cut_at = Some(*at);
            }
        }
        (cut_at, corrupt)
    };
    let stall_at = {
        let r = rules.lock().unwrap();
        r.stall
            .as_ref()
            .filter(|(name, at)| *name == f.name && *at > start)
            .map(|(_, at)| *at)
    };
    let end = cut_at
        .or(stall_at)
        .map_or(f.size, |c| c.clamp(start, f.size));
    log(end - start);
    let mut file = std::fs::File::open(&f.disk)?;
    file.seek(SeekFrom::Start(start))?;
    let mut left = end - start;
    let mut pos = start;
    let mut buf = vec![0u8; 256 << 10];
    while left > 0 {
        let n = (left as usize).min(buf.len());
        file.read_exact(&mut buf[..n])?;
        if corrupt && pos <= f.size / 2 && f.size / 2 < pos + n as u64 {
            buf[(f.size / 2 - pos) as usize] ^= 0x55;
        }
        out.write_all(&buf[..n])?;
        left -= n as u64;
        pos += n as u64;
    }
    out.flush()?;
    if cut_at.is_none() && stall_at.is_some() {
        let t0 = std::time::Instant::now();
        while rules.lock().unwrap().stall.is_some() && t0.elapsed().as_secs() < 30 {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    if cut_at.is_some() || stall_at.is_some() {
        let _ = out.shutdown(std::net::Shutdown::Both);
    }
    Ok(end - start)
}

/// The test repo's blobs in the cache at `cache` (HF_HUB_CACHE, or HF_HOME/hub): the sizes of
/// the `.incomplete` transfers and the names of the finished blobs.
pub fn blob_state(cache: &Path) -> (Vec<u64>, Vec<String>) {
    let blobs = cache.join(format!("models--{}/blobs", REPO.replace('/', "--")));
    let mut partial = Vec::new();
    let mut done = Vec::new();
    if let Ok(rd) = std::fs::read_dir(blobs) {
        for e in rd.filter_map(|e| e.ok()) {
            let name = e.file_name().to_string_lossy().into_owned();
            match name.strip_suffix(".incomplete") {
                Some(_) => partial.push(e.metadata().unwrap().len()),
                None => done.push(name),
            }
        }
    }
    (partial, done)
}
