//! Hostile clients against a real `lattice serve` on loopback (bounded in time): malformed and
//! oversized bodies, slow headers and bodies and a reader that never reads beside normal
//! traffic, idle and excess
//! connections, header floods, pipelining, abandoned streams. The server must answer every
//! probe it can answer with the right 4xx in the OpenAI error shape, close what it must, keep
//! serving normal requests within a second or two, never panic, and keep its memory bounded.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::server::{fixture, http, parse_response, read_until_closed, Response, Server};

/// The server under test: tiny Qwen3 and tiny BERT, short deadlines (1 s unless `extra` sets
/// `--header-timeout`) so the test is quick.
fn start(extra: &[&str]) -> Server {
    let gen = fixture("tiny-qwen3");
    let emb = fixture("tiny-bert");
    let mut args = vec![
        "--model",
        &gen,
        "--embedding-model",
        &emb,
        "--body-timeout",
        "1",
        "--max-body-bytes",
        "65536",
    ];
    if !extra.contains(&"--header-timeout") {
        args.extend(["--header-timeout", "1"]);
    }
    args.extend_from_slice(extra);
    Server::start(&args)
}

fn completion() -> Vec<u8> {
    json!({"prompt": "Hello", "max_tokens": 4, "temperature": 0})
        .to_string()
        .into_bytes()
}

/// A normal request must be answered, and quickly.
fn assert_serving(server: &Server, what: &str) {
    let t0 = Instant::now();
    let r = http(server.port, "POST", "/v1/completions", &[], &completion());
    let took = t0.elapsed();
    assert_eq!(r.status, 200, "{what}: {}", r.text());
    assert!(
        took < Duration::from_secs(3),
        "{what}: a normal request took {took:?}"
    );
}

/// The bytes of a JSON `POST /v1/completions` announcing `length` bytes of body, followed by
/// `body` (which may be shorter than announced, or empty).
fn completion_bytes(length: usize, body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {length}\r\n\r\n"
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

/// A request for a 4,000-token stream (the tiny model decodes it in well under a second).
fn long_stream() -> Vec<u8> {
    let body = json!({"prompt": "Once", "max_tokens": 4000, "stream": true, "ignore_eos": true})
        .to_string();
    completion_bytes(body.len(), body.as_bytes())
}

/// Sends raw bytes on a new connection and reads the answer until the server closes or
/// `wait` passes; returns the parsed answer (if any) and when the connection ended.
fn raw(port: u16, bytes: &[u8], wait: Duration) -> (Option<Response>, Duration) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(wait)).unwrap();
    let t0 = Instant::now();
    let _ = s.write_all(bytes);
    let out = read_until_closed(&mut s, Some(t0 + wait)).unwrap_or_default();
    (parse_response(&out), t0.elapsed())
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc")
}

#[test]
fn malformed_and_oversized_requests_get_4xx() {
    let server = start(&[]);
    let port = server.port;
    let post = |path: &str, body: &[u8]| http(port, "POST", path, &[], body);
    // Not JSON, not an object, wrong types, values out of range or not numbers.
    post("/v1/completions", b"{\"prompt\": ").error(400, "truncated JSON");
    post("/v1/completions", b"[1, 2]").error(400, "a JSON list");
    post("/v1/completions", b"\xff\xfe").error(400, "not UTF-8");
    let cases: &[(&str, Value, &str)] = &[
        ("/v1/completions", json!({"prompt": 5}), "prompt"),
        (
            "/v1/completions",
            json!({"prompt": "x", "max_tokens": -1}),
            "max_tokens",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "max_tokens": 1_000_000}),
            "max_tokens",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "temperature": 1e39}),
            "temperature",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "top_p": 0}),
            "top_p",
        ),
        ("/v1/completions", json!({"prompt": "x", "n": 1000}), "n"),
        (
            "/v1/completions",
            json!({"prompt": [1, 2, 999_999]}),
            "prompt",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "stop": vec!["a"; 100]}),
            "stop",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "logprobs": 1000}),
            "logprobs",
        ),
        ("/v1/chat/completions", json!({"messages": []}), "messages"),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user"}], "top_logprobs": 99, "logprobs": true}),
            "top_logprobs",
        ),
        ("/v1/embeddings", json!({"input": []}), "input"),
        (
            "/v1/embeddings",
            json!({"input": [[1, 2, 999_999]]}),
            "input",
        ),
    ];
    for (path, body, param) in cases {
        let r = post(path, body.to_string().as_bytes());
        let e = r.error(400, &format!("{path} {body}"));
        let named = e["param"].as_str().unwrap_or("").contains(param)
            || e["message"].as_str().unwrap_or("").contains(param);
        assert!(
            named,
            "{path} {body}: the error does not name `{param}`: {e}"
        );
    }
    // A body over the limit is refused as soon as the limit passes: the client announces 100 MB
    // and the answer comes before it has sent them.
    let bytes = completion_bytes(100 << 20, &[b' '; 70_000]);
    let (r, took) = raw(port, &bytes, Duration::from_secs(5));
    let r = r.expect("an answer to the oversized body");
    r.error(413, "100 MB announced");
    assert!(took < Duration::from_secs(3), "413 took {took:?}");
    // The same, chunked (no length announced).
    let mut chunked =
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..20 {
        chunked.extend_from_slice(b"1000\r\n");
        chunked.extend(std::iter::repeat_n(b' ', 4096));
        chunked.extend_from_slice(b"\r\n");
    }
    let (r, _) = raw(port, &chunked, Duration::from_secs(5));
    r.expect("an answer to the chunked body")
        .error(413, "chunked 80 KiB");
    // Not HTTP at all, an unknown route, a wrong method.
    let (r, _) = raw(port, b"HELLO THERE\r\n\r\n", Duration::from_secs(3));
    assert_eq!(r.expect("an answer to garbage").status, 400);
    assert_eq!(post("/v2/nothing", b"{}").status, 404);
    assert_eq!(http(port, "GET", "/v1/completions", &[], b"").status, 405);
    assert_serving(&server, "after malformed requests");
    server.assert_no_panic();
}

#[test]
fn slow_clients_are_cut_off_beside_normal_traffic() {
    let server = start(&[]);
    let port = server.port;
    // Slowloris: 24 connections sending their headers a byte at a time.
    let mut slow: Vec<TcpStream> = (0..24)
        .map(|_| {
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            s.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
                .unwrap();
            s
        })
        .collect();
    // A slow body: headers complete, 10 of the 100 bytes announced, then nothing.
    let mut slow_body = TcpStream::connect(("127.0.0.1", port)).unwrap();
    slow_body
        .write_all(&completion_bytes(100, b"{\"prompt\":"))
        .unwrap();
    // An idle kept-alive connection: one request answered, then silence.
    let mut idle = TcpStream::connect(("127.0.0.1", port)).unwrap();
    idle.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    // A reader that never reads: its long stream fills the socket buffers while it decodes.
    let mut deaf = TcpStream::connect(("127.0.0.1", port)).unwrap();
    deaf.write_all(&long_stream()).unwrap();
    let t0 = Instant::now();
    // Normal traffic goes on meanwhile, answered promptly.
    while t0.elapsed() < Duration::from_millis(2500) {
        for s in &mut slow {
            let _ = s.write_all(b"X");
        }
        assert_serving(&server, "beside slow clients");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Every slow connection has been closed by the server (header deadline 1 s).
    for (i, s) in slow.iter_mut().enumerate() {
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut buf = [0u8; 1024];
        let mut got = Vec::new();
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut =>
                {
                    panic!("slow connection {i} is still open after {:?}", t0.elapsed())
                }
                Err(_) => break, // reset: closed
            }
        }
    }
    drop(deaf);
    // The slow body got a 408.
    slow_body
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut out = Vec::new();
    let _ = slow_body.read_to_end(&mut out);
    let r = parse_response(&out).expect("an answer to the slow body");
    r.error(408, "a body that stopped");
    // The idle connection got its answer and was then closed.
    idle.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut out = Vec::new();
    let _ = idle.read_to_end(&mut out);
    assert!(
        String::from_utf8_lossy(&out).starts_with("HTTP/1.1 200"),
        "idle connection: {}",
        String::from_utf8_lossy(&out)
    );
    server.assert_no_panic();
}

#[test]
fn excess_connections_header_floods_and_pipelining() {
    // Idle connections hold their slots until the header deadline: 5 s here, so the 9th
    // connection surely meets 8 open ones.
    let server = start(&["--max-connections", "8", "--header-timeout", "5"]);
    let port = server.port;
    // Eight connections hold every slot; the ninth is answered 429 and closed.
    let held: Vec<TcpStream> = (0..8)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let (r, _) = raw(
        port,
        b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
        Duration::from_secs(3),
    );
    let e = r
        .expect("an answer over the limit")
        .error(429, "9th connection");
    assert_eq!(e["code"], "too_many_connections", "{e}");
    drop(held);
    // Slots come back as connections close.
    let t0 = Instant::now();
    while http(port, "GET", "/health", &[], b"").status != 200 {
        assert!(t0.elapsed() < Duration::from_secs(3), "slots not released");
        std::thread::sleep(Duration::from_millis(50));
    }
    // 200 headers, and one header of 64 KiB: 431.
    let mut many = b"GET /health HTTP/1.1\r\nHost: x\r\n".to_vec();
    for i in 0..200 {
        many.extend_from_slice(format!("X-Flood-{i}: y\r\n").as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    let (r, _) = raw(port, &many, Duration::from_secs(3));
    assert_eq!(r.expect("an answer to 200 headers").status, 431);
    let mut big = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
    big.extend(std::iter::repeat_n(b'a', 64 << 10));
    big.extend_from_slice(b"\r\n\r\n");
    let (r, _) = raw(port, &big, Duration::from_secs(3));
    assert_eq!(r.expect("an answer to a 64 KiB header").status, 431);
    // Three pipelined requests in one write are answered in order.
    let body = completion();
    let mut pipe = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
    pipe.extend_from_slice(&completion_bytes(body.len(), &body));
    pipe.extend_from_slice(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&pipe).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out);
    let answers: Vec<usize> = text.match_indices("HTTP/1.1 200").map(|m| m.0).collect();
    assert_eq!(answers.len(), 3, "pipelined answers: {text}");
    assert!(
        text[answers[0]..answers[1]].contains("\"status\""),
        "{text}"
    );
    assert!(
        text[answers[1]..answers[2]].contains("text_completion"),
        "{text}"
    );
    assert!(text[answers[2]..].contains("\"list\""), "{text}");
    assert_serving(&server, "after floods");
    server.assert_no_panic();
}

#[test]
fn abandoned_streams_and_repeated_abuse_keep_memory_bounded() {
    let server = start(&[]);
    let port = server.port;
    let pid = server.child.id();
    assert_serving(&server, "warm-up");
    let base = rss_kib(pid);
    let stream = long_stream();
    let mut peak = base;
    for round in 0..5 {
        // 16 streams opened and dropped after their first bytes.
        for _ in 0..16 {
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s.write_all(&stream).unwrap();
            let mut buf = [0u8; 256];
            let _ = s.read(&mut buf);
        }
        // Oversized and malformed bodies, abandoned half-sent requests.
        for _ in 0..16 {
            let _ = raw(
                port,
                &completion_bytes(60_000, b"{"),
                Duration::from_millis(10),
            );
            let _ = http(
                port,
                "POST",
                "/v1/chat/completions",
                &[],
                b"{\"messages\": 7}",
            );
        }
        assert_serving(&server, &format!("round {round}"));
        peak = peak.max(rss_kib(pid));
    }
    // The abandoned streams were cancelled: nothing keeps decoding.
    let t0 = Instant::now();
    loop {
        let m = server.metrics();
        let running = m
            .lines()
            .find_map(|l| l.strip_prefix("lattice_running_sequences "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(-1.0);
        if running == 0.0 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "abandoned streams still decode ({running} running)"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let end = rss_kib(pid);
    eprintln!("RSS: start {base} KiB, peak {peak} KiB, end {end} KiB");
    assert!(
        peak < base + 64 * 1024,
        "RSS grew from {base} KiB to {peak} KiB under abuse"
    );
    server.assert_no_panic();
}
