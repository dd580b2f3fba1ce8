//! Vision-language models end to end (issue 18): `lattice generate|chat --image` and the
//! server's OpenAI `image_url` content parts, on the tiny Qwen3-VL and Qwen3.5-VL fixtures with
//! the images of crates/inference/tests/fixtures/vlm-images. Greedy output with images equals
//! transformers (reference.json); the server answers what the command line answers, streamed or
//! not, alone or beside requests with other images (the prefix cache keys image tokens by the
//! image's content); bad images, bad URLs and images a model cannot take are refused with a
//! clear message naming the file or the JSON path: a non-zero exit or a 400, never a panic.

mod support;

use std::sync::{Arc, Barrier};

use serde_json::{json, Value};
use support::assert_fails_with;
use support::server::*;

const VL_MODELS: [&str; 2] = ["tiny-qwen3-vl", "tiny-qwen35-vl"];

fn reference(model: &str) -> Value {
    let text = std::fs::read_to_string(support::fixture(model).join("reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The reference case `name` (`one_image`, `two_images`, `text_only`).
fn case<'a>(r: &'a Value, name: &str) -> &'a Value {
    r["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no case {name}"))
}

/// The text part of a case's user message (after its images).
fn case_text(c: &Value) -> &str {
    c["messages"][0]["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["type"] == "text")
        .and_then(|p| p["text"].as_str())
        .unwrap()
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

/// The path of a test image (`a.png`, `b.png`).
fn image(name: &str) -> String {
    fixture(&format!("vlm-images/{name}"))
}

fn image_bytes(name: &str) -> Vec<u8> {
    std::fs::read(image(name)).unwrap()
}

/// `lattice generate --json` at temperature 0 for 32 tokens past EOS, with `images` (before the
/// text: in the user message with `chat`, else before the raw prompt).
fn cli_vision(model: &str, prompt: &str, images: &[&str], chat: bool) -> Value {
    let paths: Vec<String> = images.iter().map(|i| image(i)).collect();
    let mut extra = vec!["--ignore-eos"];
    if chat {
        extra.push("--chat");
    }
    for p in &paths {
        extra.extend(["--image", p.as_str()]);
    }
    cli_generate(model, prompt, 32, &extra)
}

// ---- request bodies ---------------------------------------------------------------------

/// Standard base64 (with padding) of `bytes`.
fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ABC[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn data_url(bytes: &[u8]) -> String {
    format!("data:image/png;base64,{}", base64(bytes))
}

/// A chat request at temperature 0 for 32 tokens past EOS: one user message of `urls` as
/// `image_url` parts, then `text`.
fn chat_req(urls: &[String], text: &str) -> Value {
    let mut content: Vec<Value> = urls
        .iter()
        .map(|u| json!({"type": "image_url", "image_url": {"url": u}}))
        .collect();
    content.push(json!({"type": "text", "text": text}));
    json!({
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 32,
        "temperature": 0,
        "ignore_eos": true,
    })
}

/// The same, with the images `names` of vlm-images as data URLs.
fn chat_with(names: &[&str], text: &str) -> Value {
    let urls: Vec<String> = names.iter().map(|n| data_url(&image_bytes(n))).collect();
    chat_req(&urls, text)
}

fn content(reply: &Value) -> &str {
    reply["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no message content: {reply}"))
}

fn cached_tokens(reply: &Value) -> u64 {
    reply["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0)
}

/// The concatenated `delta.content` of a finished chat stream.
fn streamed_content(r: &Response) -> String {
    assert_eq!(r.status, 200, "stream: {}", r.text());
    sse_events(&r.text())
        .iter()
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}

// ---- crafted PNGs -----------------------------------------------------------------------

/// CRC-32 (IEEE, as PNG chunks use it).
fn crc32(bytes: &[u8]) -> u32 {
    let table: Vec<u32> = (0..256u32)
        .map(|n| {
            (0..8).fold(n, |c, _| {
                if c & 1 == 1 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                }
            })
        })
        .collect();
    !bytes.iter().fold(!0u32, |c, &b| {
        table[((c ^ u32::from(b)) & 0xFF) as usize] ^ (c >> 8)
    })
}

/// A PNG chunk: length, type, data, CRC of type and data.
fn png_chunk(kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
    let mut body = kind.to_vec();
    body.extend_from_slice(data);
    let mut out = (data.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out.extend_from_slice(&crc32(&body).to_be_bytes());
    out
}

/// A well-formed PNG header claiming `width` x `height` 8-bit RGB pixels, with no image data.
fn png_claiming(width: u32, height: u32) -> Vec<u8> {
    let mut ihdr = width.to_be_bytes().to_vec();
    ihdr.extend_from_slice(&height.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    png.extend(png_chunk(b"IHDR", &ihdr));
    png.extend(png_chunk(b"IEND", &[]));
    png
}

#[test]
fn crafted_png_helpers_are_right() {
    assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    // The IEND chunk every PNG ends with.
    assert_eq!(png_chunk(b"IEND", &[])[8..], [0xAE, 0x42, 0x60, 0x82]);
    assert_eq!(base64(b"Man"), "TWFu");
    assert_eq!(base64(b"Ma"), "TWE=");
    assert_eq!(base64(b"M"), "TQ==");
    assert_eq!(base64(&[0xFB, 0xFF]), "+/8=");
}

// ---- the command line -------------------------------------------------------------------

/// `generate --chat --image ...`: every reference case (one image, two images, none) gives
/// transformers' 32 greedy tokens from transformers' prompt length.
#[test]
fn chat_prompts_with_images_equal_transformers() {
    for model in VL_MODELS {
        let r = reference(model);
        let dir = fixture(model);
        for name in ["one_image", "two_images", "text_only"] {
            let c = case(&r, name);
            let images: Vec<&str> = c["images"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i.as_str().unwrap())
                .collect();
            let g = cli_vision(&dir, case_text(c), &images, true);
            let want = ids(&c["greedy_ids"]);
            assert_eq!(want.len(), 32);
            assert_eq!(ids(&g["token_ids"]), want, "{model} {name}");
            assert_eq!(
                g["prompt_tokens"],
                c["input_ids"].as_array().unwrap().len(),
                "{model} {name}"
            );
            assert_eq!(g["completion_tokens"], 32, "{model} {name}");
        }
    }
}

/// Without --chat each image goes before the raw prompt as
/// `<|vision_start|><|image_pad|>...<|vision_end|>`: the prompt is those tokens and the text's.
#[test]
fn raw_prompts_take_the_images_first() {
    let prompt = "Describe the picture.";
    for model in VL_MODELS {
        let dir = fixture(model);
        let r = reference(model);
        let config: Value = serde_json::from_str(
            &std::fs::read_to_string(support::fixture(model).join("config.json")).unwrap(),
        )
        .unwrap();
        let pad = config["image_token_id"].as_u64().unwrap();
        let pads = |name: &str| {
            ids(&case(&r, name)["input_ids"])
                .into_iter()
                .filter(|&t| t == pad)
                .count()
        };
        // Image tokens of a (one_image) and of b (two_images less a).
        let (a, b) = (pads("one_image"), pads("two_images") - pads("one_image"));
        assert!(a > 0 && b > 0, "{model}: {a} and {b} image tokens");
        let text = json_lines(&lattice(&["tokenize", "--model", &dir, prompt])).remove(0);
        let text_tokens = text["ids"].as_array().unwrap().len();
        for (images, n_image) in [(&["a.png"][..], 2 + a), (&["a.png", "b.png"], 4 + a + b)] {
            let g = cli_vision(&dir, prompt, images, false);
            assert_eq!(g["completion_tokens"], 32, "{model} {images:?}: {g}");
            assert_eq!(ids(&g["token_ids"]).len(), 32);
            assert_eq!(
                g["prompt_tokens"],
                n_image + text_tokens,
                "{model} {images:?}: the markers, the image tokens and the text's {text_tokens}"
            );
        }
    }
}

/// `lattice chat --image`: the first reply equals `generate --chat` with the image; the image
/// stays in the conversation for the next turn, which reuses the cache.
#[test]
fn chat_keeps_the_image_in_the_conversation() {
    use std::io::Write;
    use std::process::{Command, Stdio};

    let dir = fixture("tiny-qwen3-vl");
    let prompt = "Describe the picture.";
    let want = cli_generate(&dir, prompt, 16, &["--chat", "--image", &image("a.png")]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_lattice"))
        .args(["chat", "--model", &dir, "--temperature", "0"])
        .args(["--max-tokens", "16", "--image", &image("a.png")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{prompt}\nAnd the colours?\n/exit\n").as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    let err = support::stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(err.matches("prompt:").count(), 2, "{err}");
    assert!(err.contains("reused from the cache"), "{err}");
    let out = support::stdout(&o);
    let first = want["text"].as_str().unwrap();
    assert!(
        out.starts_with(&format!("{first}\n")),
        "chat's first reply vs generate --chat `{first}`:\n{out}"
    );
}

/// Images a model cannot take, missing files, truncated PNGs and non-images: a clear message
/// naming the file, a non-zero exit, no panic.
#[test]
fn bad_images_on_the_command_line_fail_cleanly() {
    let text_only = fixture("tiny-qwen3");
    let vl = fixture("tiny-qwen3-vl");
    let a = image("a.png");
    let run = |model: &str, img: &str, chat: bool| {
        let mut args = vec!["generate", "--model", model, "--prompt", "Describe."];
        args.extend(["--max-tokens", "4", "--image", img]);
        if chat {
            args.push("--chat");
        }
        support::lattice(&args)
    };
    for chat in [false, true] {
        assert_fails_with(&run(&text_only, &a, chat), &["takes no images"]);
    }
    let o = support::lattice(&["chat", "--model", &text_only, "--image", &a]);
    assert_fails_with(&o, &["takes no images"]);

    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("no-such-image.png");
    let missing = missing.to_str().unwrap();
    assert_fails_with(&run(&vl, missing, true), &[missing]);

    let truncated = tmp.path().join("truncated.png");
    std::fs::write(&truncated, &image_bytes("a.png")[..100]).unwrap();
    let truncated = truncated.to_str().unwrap();
    assert_fails_with(
        &run(&vl, truncated, true),
        &[truncated, "image", "truncated PNG"],
    );

    let notes = tmp.path().join("notes.txt");
    std::fs::write(&notes, "This is not a picture, only words.\n").unwrap();
    let notes = notes.to_str().unwrap();
    assert_fails_with(&run(&vl, notes, false), &[notes, "not an image"]);

    let empty = tmp.path().join("empty.png");
    std::fs::write(&empty, b"").unwrap();
    let empty = empty.to_str().unwrap();
    assert_fails_with(&run(&vl, empty, true), &[empty, "empty"]);
}

// ---- the server -------------------------------------------------------------------------

/// One image, two images, streamed, and several requests at once with different images: each
/// answer equals `lattice generate --chat --image` (and the prompt has transformers' length).
#[test]
fn served_images_equal_the_command_line() {
    for model in VL_MODELS {
        let dir = fixture(model);
        let r = reference(model);
        let server = Server::start(&["--model", &dir]);

        for (name, images) in [
            ("one_image", &["a.png"][..]),
            ("two_images", &["a.png", "b.png"]),
        ] {
            let c = case(&r, name);
            let text = case_text(c);
            let want = cli_vision(&dir, text, images, true);
            assert_eq!(
                ids(&want["token_ids"]),
                ids(&c["greedy_ids"]),
                "{model} {name}"
            );
            let body = chat_with(images, text);
            let got = server.post("/v1/chat/completions", &body).ok(name);
            assert_eq!(content(&got), want["text"], "{model} {name}: served vs CLI");
            assert_eq!(
                got["usage"]["prompt_tokens"],
                c["input_ids"].as_array().unwrap().len(),
                "{model} {name}"
            );
            assert_eq!(got["usage"]["completion_tokens"], 32, "{model} {name}");

            let mut stream = body.clone();
            stream["stream"] = json!(true);
            let streamed = streamed_content(&server.post("/v1/chat/completions", &stream));
            assert_eq!(streamed, content(&got), "{model} {name}: streamed vs not");
        }

        // The same text after image a or image b: the prompts differ only in the image tokens'
        // content, so b must not reuse a's cached pages, while a again does. (About 200 prompt
        // tokens: past Qwen3.5's first recurrent snapshot at 128, several 32-token pages.)
        let text = "Describe the picture, its colours and its shapes. ".repeat(6);
        let text = text.trim_end();
        let alone: Vec<Value> = ["a.png", "b.png", "a.png"]
            .iter()
            .map(|i| {
                server
                    .post("/v1/chat/completions", &chat_with(&[i], text))
                    .ok(i)
            })
            .collect();
        for (k, img) in ["a.png", "b.png"].iter().enumerate() {
            let want = cli_vision(&dir, text, &[img], true);
            assert_eq!(content(&alone[k]), want["text"], "{model}: {img} vs CLI");
            assert_eq!(alone[k]["usage"]["prompt_tokens"], want["prompt_tokens"]);
        }
        assert!(alone[0]["usage"]["prompt_tokens"].as_u64().unwrap() > 160);
        assert_eq!(content(&alone[2]), content(&alone[0]), "{model}: a twice");
        assert_eq!(
            cached_tokens(&alone[1]),
            0,
            "{model}: b reused a's pages: {}",
            alone[1]
        );
        assert!(
            cached_tokens(&alone[2]) >= 32,
            "{model}: a again reused nothing: {}",
            alone[2]
        );

        let n = 6;
        let barrier = Arc::new(Barrier::new(n));
        let port = server.port;
        let handles: Vec<_> = (0..n)
            .map(|k| {
                let img = if k % 2 == 0 { "a.png" } else { "b.png" };
                let body = chat_with(&[img], text).to_string();
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    barrier.wait();
                    http(port, "POST", "/v1/chat/completions", &[], body.as_bytes())
                })
            })
            .collect();
        for (k, h) in handles.into_iter().enumerate() {
            let got = h.join().unwrap().ok("concurrent");
            let want = &alone[k % 2];
            assert_eq!(
                content(&got),
                content(want),
                "{model}: concurrent request {k} (image {}) vs alone",
                if k % 2 == 0 { "a" } else { "b" }
            );
        }
        let m = server.metrics();
        let (sum, count) = (
            metric(&m, "lattice_batch_size_sum").unwrap(),
            metric(&m, "lattice_batch_size_count").unwrap(),
        );
        eprintln!("{model}: {count} decode steps, {sum} sequences in all");
        assert!(
            sum > count,
            "no decode step ran more than one sequence:\n{m}"
        );
        server.assert_no_panic();
    }
}

/// Asserts a 400 whose `param` is `path` and whose message contains every `needle`.
fn assert_refused(server: &Server, body: &Value, path: &str, needles: &[&str], what: &str) {
    let r = server.post("/v1/chat/completions", body);
    let e = r.error(400, what);
    assert_eq!(e["type"], "invalid_request_error", "{what}: {e}");
    assert_eq!(e["param"], path, "{what}: {e}");
    let msg = e["message"].as_str().unwrap();
    for n in needles {
        assert!(msg.contains(n), "{what}: the message lacks `{n}`: {e}");
    }
}

/// Every bad image is a 400 naming the content part and what is wrong; the server keeps
/// serving.
#[test]
fn bad_images_over_http_are_400s() {
    let vl = fixture("tiny-qwen3-vl");
    let server = Server::start(&["--model", &vl, "--max-images", "2"]);
    let mut low = chat_with(&["a.png"], "Hi");
    low["messages"][0]["content"][0]["image_url"]["detail"] = json!("low");
    assert_refused(
        &server,
        &low,
        "messages[0].content[0].image_url.detail",
        &["low", "full resolution"],
        "detail: low",
    );
    let mut high = chat_with(&["a.png"], "Hi");
    high["messages"][0]["content"][0]["image_url"]["detail"] = json!("high");
    server
        .post("/v1/chat/completions", &high)
        .ok("detail: high");
    let url = "messages[0].content[0].image_url.url";
    let a = image_bytes("a.png");
    let text = "Describe the picture.";
    let one = |u: &str| chat_req(&[u.to_owned()], text);

    assert_refused(
        &server,
        &one("http://example.com/x.png"),
        url,
        &["--allow-image-urls"],
        "an http URL",
    );
    assert_refused(
        &server,
        &one("data:image/png,abc"),
        url,
        &["base64"],
        "a data URL that is not base64",
    );
    assert_refused(
        &server,
        &one("data:image/png;base64,@@@not-base64@@@"),
        url,
        &["base64"],
        "invalid base64",
    );
    assert_refused(
        &server,
        &one(&data_url(b"these bytes are no picture at all")),
        url,
        &["not an image"],
        "base64 of garbage",
    );
    assert_refused(
        &server,
        &one(&data_url(&a[..100])),
        url,
        &["truncated PNG"],
        "a truncated PNG",
    );
    assert_refused(
        &server,
        &one(&data_url(&png_claiming(20_000, 20_000))),
        url,
        &["20000 x 20000", "pixels"],
        "a PNG of 20,000 x 20,000 pixels",
    );
    assert_refused(
        &server,
        &one("ftp://example.com/x.png"),
        url,
        &["data:"],
        "an ftp URL",
    );
    let three = vec![data_url(&a); 3];
    assert_refused(
        &server,
        &chat_req(&three, text),
        "messages[0].content[2].image_url.url",
        &["--max-images", "3"],
        "three images with --max-images 2",
    );
    let mut no_url = one("unused");
    no_url["messages"][0]["content"][0] = json!({"type": "image_url"});
    assert_refused(
        &server,
        &no_url,
        "messages[0].content[0]",
        &["image_url"],
        "an image_url part without image_url",
    );
    // The second message's second part: the path names it.
    let bad = json!({"type": "image_url", "image_url": {"url": "data:image/png,abc"}});
    let mut later = one("unused");
    later["messages"] = json!([
        {"role": "user", "content": "Hello"},
        {"role": "user", "content": [{"type": "text", "text": text}, bad]},
    ]);
    assert_refused(
        &server,
        &later,
        "messages[1].content[1].image_url.url",
        &["base64"],
        "a bad image in a later message",
    );

    // Still serving, images and all.
    let ok = server
        .post(
            "/v1/chat/completions",
            &chat_with(&["a.png", "b.png"], text),
        )
        .ok("two images after the errors");
    assert_eq!(ok["usage"]["completion_tokens"], 32);
    server.assert_no_panic();

    // Tighter limits: a.png has 18,285 bytes (101 x 67 pixels), b.png 17,359 (75 x 90).
    let server = Server::start(&[
        "--model",
        &vl,
        "--max-image-bytes",
        "18000",
        "--max-image-pixels",
        "6760",
    ]);
    assert_refused(
        &server,
        &chat_with(&["b.png", "a.png"], text),
        "messages[0].content[1].image_url.url",
        &["18000", "--max-image-bytes"],
        "an image over --max-image-bytes",
    );
    assert_refused(
        &server,
        &one(&data_url(&png_claiming(100, 100))),
        url,
        &["10000 pixels", "6760"],
        "an image over --max-image-pixels",
    );
    server
        .post("/v1/chat/completions", &chat_with(&["b.png"], text))
        .ok("an image within both limits");
    server.assert_no_panic();

    let text_model = fixture("tiny-qwen3");
    let server = Server::start(&["--model", &text_model]);
    assert_refused(
        &server,
        &chat_with(&["a.png"], text),
        url,
        &["takes no images"],
        "an image to a text-only model",
    );
    let mut plain = chat_req(&[], text);
    plain["max_tokens"] = json!(4);
    server
        .post("/v1/chat/completions", &plain)
        .ok("the text-only model after the refusal");
    server.assert_no_panic();
}

/// Serves `body` to every GET on a local port, for `--allow-image-urls`; `stall` answers with
/// headers and never sends the body (the fetch must give up, not hang the request).
fn image_host(body: Vec<u8>, stall: bool) -> (String, std::thread::JoinHandle<()>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/img.png", listener.local_addr().unwrap());
    let handle = std::thread::spawn(move || {
        for stream in listener.incoming().take(4) {
            let Ok(mut s) = stream else { continue };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = s.write_all(head.as_bytes());
            if stall {
                std::thread::sleep(std::time::Duration::from_secs(15));
            } else {
                let _ = s.write_all(&body);
            }
        }
    });
    (url, handle)
}

/// With `--allow-image-urls` an `http` image is fetched and answers as its data URL does; one
/// over `--max-image-bytes` is a 400; a host that never sends the body times out with a 400.
#[test]
fn allowed_image_urls_are_fetched_within_limits() {
    let vl = fixture("tiny-qwen3-vl");
    let text = "Describe the picture.";
    let server = Server::start(&[
        "--model",
        &vl,
        "--allow-image-urls",
        "--max-image-bytes",
        "60000",
    ]);
    let by_data = server
        .post("/v1/chat/completions", &chat_with(&["a.png"], text))
        .ok("data URL");
    let (url, _host) = image_host(image_bytes("a.png"), false);
    let by_url = server
        .post("/v1/chat/completions", &chat_req(&[url], text))
        .ok("fetched URL");
    assert_eq!(content(&by_url), content(&by_data), "fetched vs data URL");

    let mut big = image_bytes("a.png");
    big.resize(70_000, 0);
    let (url, _host) = image_host(big, false);
    assert_refused(
        &server,
        &chat_req(&[url], text),
        "messages[0].content[0].image_url.url",
        &["60000"],
        "a fetched image over --max-image-bytes",
    );

    let (url, _host) = image_host(image_bytes("a.png"), true);
    let t = std::time::Instant::now();
    assert_refused(
        &server,
        &chat_req(&[url], text),
        "messages[0].content[0].image_url.url",
        &["timed out"],
        "a host that never sends the image",
    );
    assert!(
        t.elapsed().as_secs() < 14,
        "the fetch gave up after {:?}",
        t.elapsed()
    );
}
