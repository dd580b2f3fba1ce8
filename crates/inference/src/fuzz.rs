//! Entry points for the fuzz targets (`fuzz/`, `cargo fuzz`) and their corpus-replay tests
//! (`tests/fuzz_corpus.rs`): each takes untrusted bytes, drives one parser of this crate the way
//! a load or a request does, and must return — an error is a correct answer, a panic, a hang or
//! an unbounded allocation is a finding. Inputs that carry two parts (a file and a text to
//! encode, a template and its messages) are split at their first NUL byte.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::chat::{ChatMessage, ChatTemplate, RenderOptions};
use crate::grammar::{Spec, Vocabulary};
use crate::io::gguf::GgufFile;
use crate::model::bert::BertConfig;
use crate::model::decoder::DecoderConfig;
use crate::model::mpnet::MpnetConfig;
use crate::sentencepiece::model_proto::ModelProto;
use crate::sentencepiece::SentencePieceModel;
use crate::tokenizer::Tokenizer;
use crate::vision::{ImageLimits, ImageProcessorConfig};

/// The parts of a two-part input: before and after its first NUL byte (all of it and nothing
/// when there is none).
pub fn split(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[]),
    }
}

/// Runs `f` over every input of `target` under the fuzz folder `fuzz_dir`: the corpus
/// (`corpus/<target>`, which must exist) and past findings (`regressions/<target>`), catching
/// panics. Returns how many inputs ran; panics naming the first input that panicked.
pub fn replay(
    fuzz_dir: &Path,
    target: &str,
    f: impl Fn(&[u8]) + std::panic::RefUnwindSafe,
) -> usize {
    let mut n = 0;
    for kind in ["corpus", "regressions"] {
        let dir = fuzz_dir.join(kind).join(target);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            assert!(kind != "corpus", "{} is missing", dir.display());
            continue;
        };
        let mut files: Vec<PathBuf> = entries.filter_map(|e| Some(e.ok()?.path())).collect();
        files.sort();
        for p in files {
            let data = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            let r = std::panic::catch_unwind(|| f(&data));
            assert!(r.is_ok(), "{} panicked", p.display());
            n += 1;
        }
    }
    assert!(n > 0, "no inputs for {target}");
    n
}

/// Ids read from bytes, two at a time, for decoding arbitrary ids (in and out of range).
fn ids_of(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks(2)
        .map(|c| u32::from(c[0]) | u32::from(*c.get(1).unwrap_or(&0)) << 8)
        .collect()
}

/// A safetensors file: the header and tensor table validated against the file's length.
pub fn safetensors(data: &[u8]) {
    let path = Path::new("fuzz.safetensors");
    if let Ok(table) = crate::io::safetensors::parse_header(path, data) {
        for info in table.values() {
            // Every accepted entry lies inside the file.
            assert!(
                info.range.start <= info.range.end && info.range.end <= data.len(),
                "tensor outside the file"
            );
        }
    }
}

/// A GGUF file: header, metadata and tensor table, then what a load reads from them: the
/// decoder's hyper-parameters, the tokenizer (encoding and decoding a fixed text) and the
/// chat template (one render).
pub fn gguf(data: &[u8]) {
    let Ok(file) = GgufFile::from_bytes(data, "fuzz.gguf") else {
        return;
    };
    for t in file.tensors() {
        if let Some(n) = t.n_bytes {
            let end = file
                .data_offset()
                .saturating_add(t.offset)
                .saturating_add(n);
            assert!(end <= file.file_bytes(), "tensor past the end");
        }
    }
    let _ = DecoderConfig::from_gguf(&file);
    if let Ok(tok) = Tokenizer::from_gguf(&file) {
        exercise(&tok, "Hello, world! 12 ünïcode\n\tтекст 漢字".as_bytes());
    }
    if let Some(src) = file
        .metadata("tokenizer.chat_template")
        .and_then(|v| v.as_str())
    {
        if let Ok(t) = ChatTemplate::new(src, Some("<s>".into()), Some("</s>".into())) {
            let _ = t.render(&[ChatMessage::new("user", "hi")], &generation_prompt());
        }
    }
}

fn generation_prompt() -> RenderOptions {
    RenderOptions {
        add_generation_prompt: true,
        ..Default::default()
    }
}

/// A `tokenizer.json`, then the text after the NUL encoded (alone and as a pair), its ids
/// decoded, and arbitrary ids decoded.
pub fn tokenizer_json(data: &[u8]) {
    let (json, text) = split(data);
    let Ok(tok) = Tokenizer::from_json_bytes(json, "fuzz/tokenizer.json") else {
        return;
    };
    exercise(&tok, text);
}

/// Encodes `text` (lossily UTF-8) alone and split as a pair, decodes its ids with and without
/// special tokens, and decodes the bytes read as arbitrary ids.
fn exercise(tok: &Tokenizer, text: &[u8]) {
    let s = String::from_utf8_lossy(text);
    let enc = tok.encode(&s, true);
    let _ = tok.decode(&enc.ids, false);
    let _ = tok.decode(&enc.ids, true);
    let (a, b) = s.split_at(
        s.char_indices()
            .nth(s.chars().count() / 2)
            .map_or(0, |c| c.0),
    );
    let _ = tok.encode_pair(a, b, true);
    let _ = tok.decode(&ids_of(text), false);
}

/// A SentencePiece `.model` (protobuf), then the text after the NUL encoded (to ids and to
/// pieces) and decoded, and arbitrary ids decoded.
pub fn sentencepiece(data: &[u8]) {
    let (model, text) = split(data);
    let Ok(proto) = ModelProto::parse(model) else {
        return;
    };
    let path = Path::new("fuzz.model");
    let Ok(sp) = SentencePieceModel::from_proto(proto, path) else {
        return;
    };
    let s = String::from_utf8_lossy(text);
    let ids = sp.encode(&s);
    let _ = sp.decode(&ids);
    let _ = sp.decode(&ids_of(text));
    let _ = sp.encode_pieces(&s);
}

/// A `config.json` read as each model family reads it: a decoder's (Llama, Qwen2/3, Qwen3.5),
/// BERT's and MPNet's (with their checks).
pub fn config_json(data: &[u8]) {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let path = Path::new("fuzz/config.json");
    let _ = DecoderConfig::from_hf_json(&value, path);
    if let Ok(c) = serde_json::from_value::<BertConfig>(value.clone()) {
        let _ = c.validate(path);
    }
    if let Ok(c) = serde_json::from_value::<MpnetConfig>(value) {
        let _ = c.validate(path);
    }
}

/// A chat template (before the NUL) rendered over the messages after it: a JSON list of
/// OpenAI-style messages when it parses, else one user message holding those bytes.
pub fn chat_template(data: &[u8]) {
    let (source, rest) = split(data);
    let Ok(source) = std::str::from_utf8(source) else {
        return;
    };
    let Ok(t) = ChatTemplate::new(source, Some("<s>".into()), Some("</s>".into())) else {
        return;
    };
    let messages = serde_json::from_slice::<Vec<ChatMessage>>(rest).unwrap_or_else(|_| {
        vec![
            ChatMessage::new("system", "be brief"),
            ChatMessage::new("user", String::from_utf8_lossy(rest)),
        ]
    });
    let mut opts = generation_prompt();
    opts.enable_thinking = Some(rest.len() % 2 == 0);
    let _ = t.render(&messages, &opts);
}

/// The vocabulary output constraints compile over: the tiny Qwen3 fixture's tokenizer (a
/// byte-level BPE of a few hundred tokens), built once.
fn vocabulary() -> &'static (Vocabulary, usize) {
    static VOCAB: OnceLock<(Vocabulary, usize)> = OnceLock::new();
    VOCAB.get_or_init(|| {
        let tok = Tokenizer::from_json_bytes(
            include_bytes!("../tests/fixtures/tiny-qwen3/tokenizer.json"),
            "tiny-qwen3/tokenizer.json",
        )
        .expect("the tiny Qwen3 tokenizer loads");
        let n = tok.vocab_size();
        let v = Vocabulary::new(&tok, n, (n - 1) as u32).expect("the tiny Qwen3 vocabulary builds");
        (v, n)
    })
}

/// An output constraint compiled over a small vocabulary, then followed for a few steps (mask,
/// take the first allowed token). The first byte picks the kind: a JSON Schema, a regular
/// expression, a Lark or a GBNF grammar; the rest is its text.
pub fn constraint(data: &[u8]) {
    let Some((&kind, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let spec = match kind % 4 {
        0 => match serde_json::from_str(text) {
            Ok(v) => Spec::JsonSchema(v),
            Err(_) => return,
        },
        1 => Spec::Regex(text.to_string()),
        2 => Spec::Lark(text.to_string()),
        _ => Spec::Gbnf(text.to_string()),
    };
    let (vocab, n_vocab) = vocabulary();
    let Ok(c) = vocab.compile(&spec) else {
        return;
    };
    let mut m = c.matcher();
    let mut logits = vec![0.0f32; *n_vocab];
    for _ in 0..8 {
        if m.is_done() || m.mask(&mut logits).is_err() {
            break;
        }
        let Some(t) = logits.iter().position(|l| l.is_finite()) else {
            break;
        };
        if m.accept(t as u32).is_err() {
            break;
        }
        logits.fill(0.0);
    }
}

/// An image (the format told by its content) decoded under the default limits, then
/// preprocessed with the Qwen3-VL layout at small sizes (32*32 to 64*64*4 pixels, so any
/// accepted image costs one small resize): an accepted image gives finite pixel values of the
/// shape its grid implies.
pub fn image(data: &[u8]) {
    let cfg = ImageProcessorConfig {
        min_pixels: 32 * 32,
        max_pixels: 64 * 64 * 4,
        ..ImageProcessorConfig::default()
    };
    let Ok(p) = crate::vision::load(data, &ImageLimits::default(), &cfg) else {
        return;
    };
    assert_eq!(
        p.pixel_values.len(),
        p.n_patches() * cfg.patch_dim(),
        "pixel_values length"
    );
    assert!(
        p.pixel_values.iter().all(|v| v.is_finite()),
        "non-finite pixel value"
    );
}
