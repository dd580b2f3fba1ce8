//! Replays the fuzz corpora (`fuzz/corpus/<target>`: minimised by `cargo fuzz cmin`) and the
//! inputs of past findings (`fuzz/regressions/<target>`) through the same entry points the fuzz
//! targets call, on the stable toolchain: every input must return without a panic.

use std::path::Path;

use lattice_inference::fuzz;

fn replay(target: &str, f: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let n = fuzz::replay(&dir, target, f);
    eprintln!("{target}: {n} inputs replayed");
}

#[test]
fn safetensors_corpus() {
    replay("safetensors", fuzz::safetensors);
}

#[test]
fn gguf_corpus() {
    replay("gguf", fuzz::gguf);
}

#[test]
fn tokenizer_json_corpus() {
    replay("tokenizer_json", fuzz::tokenizer_json);
}

#[test]
fn sentencepiece_corpus() {
    replay("sentencepiece", fuzz::sentencepiece);
}

#[test]
fn config_json_corpus() {
    replay("config_json", fuzz::config_json);
}

#[test]
fn chat_template_corpus() {
    replay("chat_template", fuzz::chat_template);
}

#[test]
fn constraint_corpus() {
    replay("constraint", fuzz::constraint);
}

#[test]
fn image_corpus() {
    replay("image", fuzz::image);
}
