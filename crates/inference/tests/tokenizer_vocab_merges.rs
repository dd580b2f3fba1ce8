//! GPT-2 style `vocab.json` + `merges.txt` folders: the Qwen3 vocabulary and merges written as
//! those two files load through `Tokenizer::from_dir` and give the same ids as a `tokenizer.json`
//! with the same vocabulary and merges and GPT-2's pipeline (ByteLevel pre-tokenizer with the
//! GPT-2 regex, no prefix space, `<|endoftext|>` special, ByteLevel decoder) on every text of
//! the BPE reference fixture. Malformed `merges.txt` lines give an error naming the line.
//!
//! Needs the tokenizer cache: run `scripts/fetch_models.sh`.

mod common;

use std::path::Path;

use lattice_inference::tokenizer::Tokenizer;
use serde_json::{json, Map, Value};

const FIXTURE: &str = "tests/fixtures/tokenizer/bpe_reference.jsonl.gz";

/// Qwen3's model vocabulary (plus `<|endoftext|>` at its id) and merges as `a b` lines.
fn qwen3_vocab_merges() -> (Map<String, Value>, Vec<String>) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../.cache/npm/qwen3/package/models/tokenizer.json");
    assert!(
        path.exists(),
        "{} is missing: run scripts/fetch_models.sh to fetch the tokenizer files",
        path.display()
    );
    let bytes = std::fs::read(&path).expect("read qwen3 tokenizer.json");
    let v: Value = serde_json::from_slice(&bytes).expect("JSON");
    let mut vocab = v["model"]["vocab"].as_object().expect("vocab").clone();
    let eot = v["added_tokens"]
        .as_array()
        .expect("added_tokens")
        .iter()
        .find(|t| t["content"] == "<|endoftext|>")
        .expect("<|endoftext|> in added_tokens");
    vocab.insert("<|endoftext|>".into(), eot["id"].clone());
    let merges = v["model"]["merges"]
        .as_array()
        .expect("merges")
        .iter()
        .map(|m| match m {
            Value::String(s) => s.clone(),
            Value::Array(p) => format!(
                "{} {}",
                p[0].as_str().expect("merge token"),
                p[1].as_str().expect("merge token")
            ),
            other => panic!("unexpected merge {other}"),
        })
        .collect();
    (vocab, merges)
}

fn write_folder(dir: &Path, vocab: &Map<String, Value>, merges: &[String]) {
    std::fs::write(
        dir.join("vocab.json"),
        serde_json::to_vec(vocab).expect("serialize"),
    )
    .expect("write vocab.json");
    let mut text = String::from("#version: 0.2\n");
    for m in merges {
        text.push_str(m);
        text.push('\n');
    }
    std::fs::write(dir.join("merges.txt"), text).expect("write merges.txt");
}

/// The same vocabulary and merges as a GPT-2 style `tokenizer.json`.
fn gpt2_json(vocab: &Map<String, Value>, merges: &[String]) -> Tokenizer {
    let eot = vocab["<|endoftext|>"].clone();
    let v = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [{"id": eot, "content": "<|endoftext|>", "single_word": false,
            "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
            "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
            "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": false,
            "byte_fallback": false, "vocab": vocab, "merges": merges},
    });
    let bytes = serde_json::to_vec(&v).expect("serialize");
    Tokenizer::from_json_bytes(&bytes, "gpt2-style/tokenizer.json")
        .expect("GPT-2 style tokenizer.json loads")
}

#[test]
fn vocab_merges_folder_matches_gpt2_tokenizer_json() {
    let (vocab, merges) = qwen3_vocab_merges();
    let dir = tempfile::tempdir().expect("temp dir");
    write_folder(dir.path(), &vocab, &merges);
    let from_dir = Tokenizer::from_dir(dir.path()).expect("vocab.json + merges.txt loads");
    let reference = gpt2_json(&vocab, &merges);
    let text = common::read_gz(&Path::new(env!("CARGO_MANIFEST_DIR")).join(FIXTURE));
    let mut texts: Vec<String> = text
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("fixture lines are JSON");
            v["text"].as_str().expect("text").to_owned()
        })
        .collect();
    texts.push("hello<|endoftext|> world".into());
    assert!(texts.len() > 100, "fixture has {} texts", texts.len());
    let mut failures = Vec::new();
    for t in &texts {
        for special in [true, false] {
            let got = from_dir.encode(t, special).ids;
            let want = reference.encode(t, special).ids;
            if got != want {
                let short: String = t.chars().take(80).collect();
                failures.push(format!(
                    "{short:?} (special {special}):\n  got  {got:?}\n  want {want:?}"
                ));
            }
        }
        let ids = from_dir.encode(t, false).ids;
        assert_eq!(from_dir.decode(&ids, false), *t, "decode(encode(x)) == x");
    }
    let eot = vocab["<|endoftext|>"].as_u64().expect("id") as u32;
    assert!(from_dir.encode("a<|endoftext|>b", true).ids.contains(&eot));
    assert!(
        failures.is_empty(),
        "{} of {} texts differ:\n{}",
        failures.len(),
        texts.len(),
        failures[..failures.len().min(10)].join("\n")
    );
}

fn load_err(vocab: &str, merges: &str) -> String {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("vocab.json"), vocab).expect("write");
    std::fs::write(dir.path().join("merges.txt"), merges).expect("write");
    Tokenizer::from_dir(dir.path())
        .expect_err("malformed files must not load")
        .to_string()
}

#[test]
fn malformed_vocab_merges_give_clear_errors() {
    let vocab = r#"{"a": 0, "b": 1, "ab": 2}"#;
    let err = load_err(vocab, "#version: 0.2\na b\na c\n");
    assert!(err.contains("line 3") && err.contains("`c`"), "{err}");
    let err = load_err(vocab, "a b\nab\n");
    assert!(
        err.contains("line 2") && err.contains("two tokens"),
        "{err}"
    );
    let err = load_err(vocab, "a b c\n");
    assert!(err.contains("line 1"), "{err}");
    let err = load_err(r#"{"a": 0, "b": 1}"#, "a b\n");
    assert!(err.contains("`ab`"), "{err}");
    let err = load_err("[1, 2]", "a b\n");
    assert!(err.contains("vocab.json"), "{err}");
    let ok = {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("vocab.json"), vocab).expect("write");
        std::fs::write(dir.path().join("merges.txt"), "#version: 0.2\na b\n").expect("write");
        Tokenizer::from_dir(dir.path()).expect("valid files load")
    };
    assert_eq!(ok.encode("ab", false).ids, [2]);
}
