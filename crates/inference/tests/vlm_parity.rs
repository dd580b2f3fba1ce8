//! Vision-language models (Qwen3-VL, Qwen3.5 with its vision tower) against transformers on the
//! tiny random-weight checkpoints of scripts/gen_vlm_fixtures.py: the tower's merged image
//! embeddings and DeepStack features, then (below) logits and greedy tokens of prompts with
//! one image, two images and none.

mod common;

use common::{f32s, fixture, read_json, rel_err};
use lattice_inference::io::store::WeightStore;
use lattice_inference::model::vision::{ImagePatches, VisionConfig, VisionTower};

fn tower(name: &str) -> VisionTower {
    let dir = fixture(name);
    let cfg_path = dir.join("config.json");
    let cfg = VisionConfig::from_hf_json(&read_json(&cfg_path), &cfg_path)
        .unwrap()
        .expect("a vision config");
    let store = WeightStore::open_dir(&dir).unwrap();
    VisionTower::load(cfg, &store, "model.visual").unwrap()
}

/// The processor's pixel values of a fixture image (raw little-endian f32).
fn pixels(file: &str) -> Vec<f32> {
    let stem = file.split('.').next().unwrap();
    let bytes = std::fs::read(fixture("vlm-images").join(format!("{stem}.pixels.bin"))).unwrap();
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn vision_towers_match_transformers() {
    for name in ["tiny-qwen3-vl", "tiny-qwen35-vl"] {
        let t = tower(name);
        let r = read_json(&fixture(name).join("reference.json"));
        for img in r["images"].as_array().unwrap() {
            let file = img["file"].as_str().unwrap();
            let grid: Vec<usize> = img["grid_thw"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as usize)
                .collect();
            let px = pixels(file);
            let feats = t
                .encode(&[ImagePatches {
                    pixel_values: &px,
                    grid_thw: [grid[0], grid[1], grid[2]],
                }])
                .unwrap();
            let err = rel_err(&feats[0].embeds, &f32s(&img["embeds"]));
            assert!(err < 1e-5, "{name} {file}: embeds relative error {err:e}");
            let deep = img["deepstack"].as_array().map_or(&[][..], |a| a.as_slice());
            assert_eq!(feats[0].deepstack.len(), deep.len(), "{name} {file}");
            for (k, (got, want)) in feats[0].deepstack.iter().zip(deep).enumerate() {
                let err = rel_err(got, &f32s(want));
                assert!(err < 1e-5, "{name} {file}: DeepStack {k} relative error {err:e}");
            }
            eprintln!("{name} {file}: {} tokens, embeds rel err {err:e}", feats[0].tokens);
        }
    }
}
