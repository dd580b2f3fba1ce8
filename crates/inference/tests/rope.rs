//! RoPE inverse frequencies and attention scaling for every scaling type Lattice reads from a
//! config.json (default, linear, llama3, yarn with and without mscale / truncation / an explicit
//! attention factor), against transformers' modeling_rope_utils (scripts/gen_rope_reference.py).

mod common;

use common::{f32s, fixture, read_json};
use lattice_inference::model::decoder::DecoderConfig;
use lattice_inference::ops::Rope;

#[test]
fn inverse_frequencies_match_transformers() {
    let cases = read_json(&fixture("rope").join("reference.json"));
    for case in cases.as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let hd = case["head_dim"].as_u64().unwrap();
        let config = serde_json::json!({
            "model_type": "llama",
            "vocab_size": 32,
            "hidden_size": hd * 4,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "head_dim": hd,
            "max_position_embeddings": case["max_position_embeddings"],
            "rope_parameters": case["rope_parameters"],
        });
        let cfg = DecoderConfig::from_hf_json(&config, std::path::Path::new(name)).unwrap();
        let rope = Rope::new(&cfg.rope, cfg.head_dim).unwrap();
        let want = f32s(&case["inv_freq"]);
        assert_eq!(rope.inv_freq().len(), want.len(), "{name}");
        for (i, (&a, &b)) in rope.inv_freq().iter().zip(&want).enumerate() {
            assert!(
                (a - b).abs() <= 2.0 * f32::EPSILON * b.abs(),
                "{name}: inv_freq[{i}] = {a:e}, transformers {b:e}"
            );
        }
        let s = case["attention_scaling"].as_f64().unwrap() as f32;
        assert!(
            (rope.attention_scaling() - s).abs() < 1e-6,
            "{name}: scaling {} vs {s}",
            rope.attention_scaling()
        );
    }
}

#[test]
fn unsupported_rope_types_are_named() {
    let config = serde_json::json!({
        "model_type": "llama", "vocab_size": 32, "hidden_size": 64, "intermediate_size": 64,
        "num_hidden_layers": 1, "num_attention_heads": 4, "max_position_embeddings": 128,
        "rope_scaling": {"rope_type": "longrope", "factor": 2.0},
    });
    let e = DecoderConfig::from_hf_json(&config, std::path::Path::new("config.json")).unwrap_err();
    assert!(e.to_string().contains("longrope"), "{e}");
}
