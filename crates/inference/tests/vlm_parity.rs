//! Vision-language models (Qwen3-VL, Qwen3.5 with its vision tower) against transformers on the
//! tiny random-weight checkpoints of scripts/gen_vlm_fixtures.py: the tower's merged image
//! embeddings and DeepStack features; the images read from their PNG files equal the
//! processor's pixel values; logits and greedy tokens of prompts with one image, two images
//! and none, straight through the decoder and through the engine.

mod common;

use std::sync::Arc;

use common::{f32s, fixture, read_json, rel_err, u32s};
use lattice_inference::engine::{BatchEngine, GenerateRequest, TextModel};
use lattice_inference::io::store::WeightStore;
use lattice_inference::model::batch::{ForwardBatch, InjectedRows, Positions, RowOutputs};
use lattice_inference::model::source::WeightMode;
use lattice_inference::model::vision::{
    mrope_positions, ImagePatches, VisionConfig, VisionTower, VisionWeights,
};
use lattice_inference::sample::SamplingParams;
use lattice_inference::vision::{ImageLimits, PreparedImage};

fn tower(name: &str) -> VisionTower {
    let dir = fixture(name);
    let cfg_path = dir.join("config.json");
    let cfg = VisionConfig::from_hf_json(&read_json(&cfg_path), &cfg_path)
        .unwrap()
        .expect("a vision config");
    let store = WeightStore::open_dir(&dir).unwrap();
    VisionTower::load(cfg, &store, "model.visual", VisionWeights::Exact).unwrap()
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
            let deep = img["deepstack"]
                .as_array()
                .map_or(&[][..], |a| a.as_slice());
            assert_eq!(feats[0].deepstack.len(), deep.len(), "{name} {file}");
            for (k, (got, want)) in feats[0].deepstack.iter().zip(deep).enumerate() {
                let err = rel_err(got, &f32s(want));
                assert!(
                    err < 1e-5,
                    "{name} {file}: DeepStack {k} relative error {err:e}"
                );
            }
            eprintln!(
                "{name} {file}: {} tokens, embeds rel err {err:e}",
                feats[0].tokens
            );
        }
    }
}

/// A fixture image read from its file by the model's own preprocessing, checked against
/// the processor's pixel values.
fn prepared(model: &TextModel, file: &str) -> Arc<PreparedImage> {
    let bytes = std::fs::read(fixture("vlm-images").join(file)).unwrap();
    let img = model
        .prepare_image(&bytes, &ImageLimits::default())
        .unwrap();
    assert_eq!(img.pixel_values, pixels(file), "{file}: pixel values");
    img
}

fn grid_of(r: &serde_json::Value, file: &str) -> [usize; 3] {
    let img = r["images"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["file"] == file)
        .unwrap();
    let g = u32s(&img["grid_thw"]);
    [g[0] as usize, g[1] as usize, g[2] as usize]
}

/// Logits of the prompt's last token straight through the decoder (positions from
/// `mrope_positions`, image rows injected), and 32 greedy tokens through the engine, for
/// each case of the reference.
fn cases_match_transformers(name: &str) {
    let dir = fixture(name);
    let r = read_json(&dir.join("reference.json"));
    let model = TextModel::load(&dir, WeightMode::F32).unwrap();
    let vision = model
        .vision
        .as_ref()
        .expect("the fixture has a vision tower");
    for case in r["cases"].as_array().unwrap() {
        let label = format!("{name} {}", case["name"]);
        let ids = u32s(&case["input_ids"]);
        let files: Vec<&str> = case["images"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap())
            .collect();
        let images: Vec<Arc<PreparedImage>> = files.iter().map(|f| prepared(&model, f)).collect();
        for (img, f) in images.iter().zip(&files) {
            assert_eq!(img.grid_thw, grid_of(&r, f), "{label}: {f} grid");
        }
        // The positions transformers' get_rope_index gives.
        let grids: Vec<[usize; 3]> = images.iter().map(|i| i.grid_thw).collect();
        let (pos, delta) = mrope_positions(&ids, vision.image_token_id, &grids, 2).unwrap();
        let want_pos = &case["positions"];
        for axis in 0..3 {
            let got: Vec<u32> = pos.iter().map(|p| p[axis] as u32).collect();
            assert_eq!(got, u32s(&want_pos[axis]), "{label}: axis {axis}");
        }
        assert_eq!(delta, case["rope_delta"].as_i64().unwrap(), "{label}");

        // Last-token logits through the decoder.
        let patches: Vec<ImagePatches<'_>> = images
            .iter()
            .map(|i| ImagePatches {
                pixel_values: &i.pixel_values,
                grid_thw: i.grid_thw,
            })
            .collect();
        let feats = vision.tower.encode(&patches).unwrap();
        let mut injected = InjectedRows {
            rows: ids
                .iter()
                .enumerate()
                .filter(|(_, &t)| t == vision.image_token_id)
                .map(|(i, _)| i)
                .collect(),
            ..Default::default()
        };
        for f in &feats {
            injected.embeds.extend_from_slice(&f.embeds);
            injected.deepstack.resize(f.deepstack.len(), Vec::new());
            for (d, l) in injected.deepstack.iter_mut().zip(&f.deepstack) {
                d.extend_from_slice(l);
            }
        }
        let mut batch = ForwardBatch::tokens(&ids, &[ids.len()], RowOutputs::LastLogits);
        batch.positions = Positions::Rope3d(pos.clone());
        if !injected.rows.is_empty() {
            batch.injected = Some(injected);
        }
        let mut state = model.new_cache(4096);
        let logits = model
            .decoder
            .forward_batch(&batch, &mut [&mut state])
            .unwrap();
        let err = rel_err(&logits, &f32s(&case["last_logits"]));
        assert!(err < 1e-4, "{label}: last logits relative error {err:e}");

        // Greedy decoding through the engine (prompt chunks of 16 tokens split the images).
        let mut req = GenerateRequest::new(ids.clone(), 32, SamplingParams::greedy());
        req.ignore_eos = true;
        req.images = images.clone();
        let mut engine = BatchEngine::with_config(
            &model,
            lattice_inference::engine::EngineConfig {
                prefill_chunk: 16,
                ..Default::default()
            },
        );
        engine.submit(req).unwrap();
        let out = engine.run_all().unwrap().remove(0).1;
        assert_eq!(
            out.token_ids,
            u32s(&case["greedy_ids"]),
            "{label}: greedy tokens"
        );
        eprintln!("{label}: logits rel err {err:e}, 32 greedy tokens equal");
    }
}

#[test]
fn qwen3_vl_matches_transformers() {
    cases_match_transformers("tiny-qwen3-vl");
}

#[test]
fn qwen35_vl_matches_transformers() {
    cases_match_transformers("tiny-qwen35-vl");
}

/// `--bf16` towers (bf16 products where the CPU has them, else bf16-rounded weights) stay
/// within a stated distance of the exact tower: 1 − cos of every image token.
#[test]
fn bf16_tower_stays_close_to_exact() {
    let name = "tiny-qwen3-vl";
    let dir = fixture(name);
    let cfg_path = dir.join("config.json");
    let cfg = VisionConfig::from_hf_json(&read_json(&cfg_path), &cfg_path)
        .unwrap()
        .unwrap();
    let store = WeightStore::open_dir(&dir).unwrap();
    let exact =
        VisionTower::load(cfg.clone(), &store, "model.visual", VisionWeights::Exact).unwrap();
    let bf16 = VisionTower::load(cfg, &store, "model.visual", VisionWeights::Bf16).unwrap();
    let r = read_json(&dir.join("reference.json"));
    let mut worst = 0f64;
    for file in ["a.png", "b.png"] {
        let px = pixels(file);
        let img = ImagePatches {
            pixel_values: &px,
            grid_thw: grid_of(&r, file),
        };
        let (a, b) = (
            &exact.encode(&[img]).unwrap()[0],
            &bf16.encode(&[img]).unwrap()[0],
        );
        for (x, y) in a.embeds.chunks(64).zip(b.embeds.chunks(64)) {
            worst = worst.max(common::one_minus_cos(x, y));
        }
    }
    eprintln!("bf16 tower: max 1 - cos {worst:e} per image token");
    assert!(worst < 1e-3, "bf16 tower: 1 - cos {worst:e}");
}
