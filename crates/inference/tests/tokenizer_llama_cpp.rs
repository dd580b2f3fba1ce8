//! llama.cpp's tokenizer test vectors (`ggml-vocab-*.gguf` with `.inp` / `.out`) for the GGUF
//! vocabularies not covered by `tokenizer_bpe.rs` / `tokenizer_wordpiece.rs`: every input must
//! give exactly the ids llama.cpp's reference lists (encoded without special tokens).
//!
//! Needs the llama.cpp vocabulary cache: run `scripts/fetch_models.sh`. A missing file fails.

use std::path::Path;

use lattice_inference::io::gguf::GgufFile;
use lattice_inference::tokenizer::Tokenizer;

/// Checks every vector of `ggml-vocab-{name}.gguf`; returns the number of vectors checked.
fn llama_cpp_vectors(name: &str) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache/llama-vocab");
    let file = |ext: &str| {
        let p = dir.join(format!("ggml-vocab-{name}.gguf{ext}"));
        assert!(
            p.exists(),
            "{} is missing: run scripts/fetch_models.sh",
            p.display()
        );
        p
    };
    let gguf = GgufFile::open(file("")).expect("GGUF parses");
    let tok = Tokenizer::from_gguf(&gguf).expect("GGUF vocabulary builds a tokenizer");
    let inp = std::fs::read_to_string(file(".inp")).expect("read .inp");
    let out = std::fs::read_to_string(file(".out")).expect("read .out");
    // Older files end with a separator, newer ones (gemma-4) with the last input.
    let mut inputs: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    if inputs.last() == Some(&"") {
        inputs.pop();
    }
    let expected: Vec<Vec<u32>> = out
        .lines()
        .map(|l| {
            l.split_whitespace()
                .map(|x| x.parse().expect("id"))
                .collect()
        })
        .collect();
    assert_eq!(
        inputs.len(),
        expected.len(),
        "{name}: .inp and .out differ in length"
    );
    assert!(!inputs.is_empty(), "{name}: no vectors");
    let mut failures = Vec::new();
    for (text, want) in inputs.iter().zip(&expected) {
        let got = tok.encode(text, false).ids;
        if &got != want {
            let short: String = text.chars().take(60).collect();
            failures.push(format!("{short:?}:\n  got  {got:?}\n  want {want:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: {} of {} vectors differ:\n{}",
        failures.len(),
        inputs.len(),
        failures[..failures.len().min(10)].join("\n")
    );
    eprintln!("{name}: {} vectors equal to llama.cpp", inputs.len());
    inputs.len()
}

#[test]
fn deepseek_llm_vectors() {
    llama_cpp_vectors("deepseek-llm");
}

#[test]
fn deepseek_coder_vectors() {
    llama_cpp_vectors("deepseek-coder");
}

#[test]
fn falcon_vectors() {
    llama_cpp_vectors("falcon");
}

#[test]
fn llama_spm_vectors() {
    llama_cpp_vectors("llama-spm");
}

#[test]
fn phi_3_vectors() {
    llama_cpp_vectors("phi-3");
}

#[test]
fn gemma_4_vectors() {
    llama_cpp_vectors("gemma-4");
}
