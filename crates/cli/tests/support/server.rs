//! What the server tests share: the models and paths they use (and their GPU-machine
//! overrides), `lattice` on the command line, a running `lattice serve` ([`Server`]) and a
//! minimal HTTP/1.1 client.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::fetched_model;

pub const KEY: &str = "sk-lattice-test-key";

// ---- paths and the command line ---------------------------------------------------------

pub fn path_str(p: PathBuf) -> String {
    p.to_str().unwrap().to_owned()
}

pub fn fixture(name: &str) -> String {
    path_str(super::fixture(name))
}

/// The device generation runs on (`LATTICE_TEST_DEVICE`; unset: the CPU).
pub fn device() -> Option<String> {
    std::env::var("LATTICE_TEST_DEVICE")
        .ok()
        .filter(|d| !d.is_empty() && d != "cpu")
}

pub fn minilm() -> String {
    match std::env::var("LATTICE_TEST_EMBED_MODEL") {
        Ok(m) => m,
        Err(_) => path_str(fetched_model("all-MiniLM-L6-v2", "model.safetensors")),
    }
}

/// SmolLM2-135M-Instruct (Q4_1 GGUF): slow enough (about 100 tokens/s on two cores) that a
/// request is reliably still running while the test acts; the tiny fixtures decode over 10,000
/// tokens/s.
pub fn smollm2() -> String {
    match std::env::var("LATTICE_TEST_SLOW_MODEL") {
        Ok(m) => m,
        Err(_) => path_str(fetched_model("SmolLM2-135M-Instruct.Q4_1.gguf", "")),
    }
}

/// Runs `lattice` and asserts success.
pub fn lattice(args: &[&str]) -> Output {
    let o = super::lattice(args);
    assert!(
        o.status.success(),
        "lattice {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

pub fn json_lines(o: &Output) -> Vec<Value> {
    String::from_utf8(o.stdout.clone())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `lattice generate --json` at temperature 0: `{text, token_ids, prompt_tokens, ...}`.
pub fn cli_generate(model: &str, prompt: &str, max_tokens: usize, extra: &[&str]) -> Value {
    let n = max_tokens.to_string();
    let mut args = vec![
        "generate",
        "--model",
        model,
        "--prompt",
        prompt,
        "--max-tokens",
        &n,
        "--temperature",
        "0",
        "--json",
    ];
    args.extend_from_slice(extra);
    let dev = device();
    if let Some(d) = &dev {
        args.extend(["--device", d.as_str()]);
    }
    json_lines(&lattice(&args)).remove(0)
}

pub fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

pub fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

// ---- the server -------------------------------------------------------------------------

/// A running `lattice serve`, killed when dropped.
pub struct Server {
    pub child: Child,
    pub port: u16,
    key: Option<&'static str>,
    log: Arc<Mutex<String>>,
}

impl Server {
    /// Starts `lattice serve --port 0 ARGS` and waits for its "listening on" line.
    pub fn start(args: &[&str]) -> Server {
        let key = args.iter().position(|a| *a == "--api-key").map(|_| KEY);
        let dev: Vec<String> = match device() {
            Some(d) if args.contains(&"--model") => vec!["--device".into(), d],
            _ => Vec::new(),
        };
        let mut child = Command::new(env!("CARGO_BIN_EXE_lattice"))
            .args(["serve", "--port", "0"])
            .args(args)
            .args(&dev)
            .env_remove("LATTICE_API_KEY")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("lattice serve starts");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) =
                    line.strip_prefix("lattice serve: listening on http://127.0.0.1:")
                {
                    let _ = tx.send(rest.trim().parse::<u16>().ok());
                }
                let mut l = sink.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let port = rx.recv_timeout(Duration::from_secs(120));
        let mut server = Server {
            child,
            port: 0,
            key,
            log,
        };
        match port {
            Ok(Some(p)) => server.port = p,
            other => {
                let _ = server.child.kill();
                let _ = server.child.wait();
                std::thread::sleep(Duration::from_millis(100));
                panic!(
                    "lattice serve {args:?} did not print `lattice serve: listening on \
                     http://127.0.0.1:PORT` ({other:?}); stderr:\n{}",
                    server.stderr()
                );
            }
        }
        server
    }

    pub fn stderr(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    pub fn auth(&self) -> Vec<(&'static str, String)> {
        match self.key {
            Some(k) => vec![("Authorization", format!("Bearer {k}"))],
            None => vec![],
        }
    }

    pub fn get(&self, path: &str) -> Response {
        http(self.port, "GET", path, &self.auth(), b"")
    }

    pub fn post(&self, path: &str, body: &Value) -> Response {
        http(
            self.port,
            "POST",
            path,
            &self.auth(),
            body.to_string().as_bytes(),
        )
    }

    /// `GET /metrics` (open without a key).
    pub fn metrics(&self) -> String {
        let r = http(self.port, "GET", "/metrics", &[], b"");
        assert_eq!(r.status, 200, "GET /metrics: {}", r.text());
        r.text()
    }

    /// Waits for the process to exit by itself.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let t0 = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                t0.elapsed() < timeout,
                "lattice serve still runs {timeout:?} after SIGTERM; stderr:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn assert_no_panic(&self) {
        let log = self.stderr();
        assert!(!log.contains("panicked"), "the server panicked:\n{log}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---- a minimal HTTP/1.1 client ----------------------------------------------------------

pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Response {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "status {}: body is not JSON ({e}): {}",
                self.status,
                self.text()
            )
        })
    }

    /// Asserts `status` and an OpenAI error body; returns its `error` object.
    pub fn error(&self, status: u16, what: &str) -> Value {
        assert_eq!(self.status, status, "{what}: body {}", self.text());
        let v = self.json();
        let e = &v["error"];
        let msg = e["message"].as_str().unwrap_or("");
        assert!(!msg.is_empty(), "{what}: no error.message in {v}");
        assert!(e["type"].is_string(), "{what}: no error.type in {v}");
        e.clone()
    }

    pub fn ok(&self, what: &str) -> Value {
        assert_eq!(self.status, 200, "{what}: body {}", self.text());
        self.json()
    }
}

pub fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).expect("connects to lattice serve");
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    s
}

pub fn write_request(
    s: &mut TcpStream,
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: &[u8],
) {
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        head.push_str("Content-Type: application/json\r\n");
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    // The server may answer (413) before reading the whole body.
    let _ = s.write_all(body);
}

pub fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> Response {
    let mut s = connect(port);
    write_request(&mut s, port, method, path, headers, body);
    let raw = read_until_closed(&mut s, None).unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    parse_response(&raw).unwrap_or_else(|| {
        panic!(
            "{method} {path}: malformed response: {:?}",
            String::from_utf8_lossy(&raw)
        )
    })
}

/// Reads until the server closes the connection (or `deadline` passes). A reset or timeout
/// after some bytes arrived ends the answer (the server closed with our body unread); before
/// any, it is the error.
pub fn read_until_closed(s: &mut TcpStream, deadline: Option<Instant>) -> std::io::Result<Vec<u8>> {
    let mut raw = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(_) if !raw.is_empty() => break,
            Err(e) => return Err(e),
        }
        if deadline.is_some_and(|d| Instant::now() > d) {
            break;
        }
    }
    Ok(raw)
}

pub fn parse_response(raw: &[u8]) -> Option<Response> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let mut chunked = false;
    let mut length = None;
    for l in lines {
        let (k, v) = l.split_once(':')?;
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
        if k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked") {
            chunked = true;
        } else if k == "content-length" {
            length = v.parse::<usize>().ok();
        }
    }
    let rest = &raw[end + 4..];
    let body = if chunked {
        dechunk(rest)?
    } else {
        let n = length.unwrap_or(rest.len()).min(rest.len());
        rest[..n].to_vec()
    };
    Some(Response { status, body })
}

pub fn dechunk(mut rest: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = rest.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&rest[..eol]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        rest = &rest[eol + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(rest.get(..size)?);
        rest = rest.get(size + 2..)?;
    }
}

/// Sends a streaming request and reads until the first complete SSE `data:` event; returns the
/// open connection and the bytes read so far.
pub fn open_stream(server: &Server, path: &str, body: &Value) -> (TcpStream, Vec<u8>) {
    let mut s = connect(server.port);
    write_request(
        &mut s,
        server.port,
        "POST",
        path,
        &server.auth(),
        body.to_string().as_bytes(),
    );
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = s.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "the stream ended early: {}",
            String::from_utf8_lossy(&raw)
        );
        raw.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&raw).into_owned();
        assert!(text.starts_with("HTTP/1.1 200"), "stream answer: {text}");
        if let Some(i) = text.find("data: {") {
            if text[i..].contains("\n\n") {
                return (s, raw);
            }
        }
    }
}

/// The JSON events of a finished server-sent-event stream (`data: {...}` blocks up to
/// `data: [DONE]`); fails when the stream was cut before `[DONE]`.
pub fn sse_events(text: &str) -> Vec<Value> {
    let from = text.len().saturating_sub(400);
    let from = (from..text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    assert!(
        text.trim_end().ends_with("data: [DONE]"),
        "the stream was cut: ...{}",
        &text[from..]
    );
    text.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .collect()
}

/// The sum of every sample of `name` (any labels) in Prometheus text.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = l.strip_prefix(name) else {
            continue;
        };
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            continue;
        }
        let value: f64 = l.rsplit(' ').next()?.parse().ok()?;
        *found.get_or_insert(0.0) += value;
    }
    found
}

pub fn wait_for_metric(server: &Server, name: &str, want: f64, timeout: Duration) -> String {
    let t0 = Instant::now();
    loop {
        let m = server.metrics();
        if metric(&m, name) == Some(want) {
            return m;
        }
        assert!(
            t0.elapsed() < timeout,
            "{name} is not {want} after {timeout:?}:\n{m}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
