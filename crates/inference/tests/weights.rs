//! Weight loading: f16 / bf16 conversion at load, sharded checkpoints with an index, and the
//! errors for missing tensors, wrong shapes and bad files. Test checkpoints are written here
//! from the tiny BERT fixture.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::*;
use lattice_inference::io::safetensors::SafetensorsFile;
use lattice_inference::io::store::WeightStore;
use lattice_inference::model::{load_encoder, PackedBatch};
use lattice_inference::Error;

/// The tiny BERT fixture's tensors as f32 values.
fn tiny_bert_tensors() -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    let f = SafetensorsFile::open(&fixture("tiny-bert").join("model.safetensors")).unwrap();
    let store = WeightStore::open_dir(&fixture("tiny-bert")).unwrap();
    f.tensors
        .iter()
        .filter(|(_, info)| info.dtype.size_bytes().is_some())
        .map(|(name, info)| {
            let w = store.get(name, &info.shape).unwrap();
            (name.clone(), (info.shape.clone(), w.as_slice().to_vec()))
        })
        .collect()
}

fn copy_side_files(to: &Path) {
    for f in ["config.json", "tokenizer.json", "vocab.txt"] {
        std::fs::copy(fixture("tiny-bert").join(f), to.join(f)).unwrap();
    }
}

fn hidden_states(dir: &Path) -> Vec<f32> {
    let enc = load_encoder(dir).unwrap();
    let mut b = PackedBatch::new();
    b.push(&[2, 50, 60, 70, 3], &[]);
    b.push(&[2, 80, 3], &[]);
    enc.forward(&b).unwrap()
}

#[test]
fn f32_tensors_are_mapped_without_copy() {
    let store = WeightStore::open_dir(&fixture("tiny-bert")).unwrap();
    let w = store.get("embeddings.LayerNorm.weight", &[32]).unwrap();
    assert!(w.is_mapped());
}

#[test]
fn half_precision_checkpoints_convert_at_load() {
    let reference = hidden_states(&fixture("tiny-bert"));
    for dtype in ["F16", "BF16"] {
        let tmp = tempfile::tempdir().unwrap();
        copy_side_files(tmp.path());
        let tensors = tiny_bert_tensors()
            .into_iter()
            .map(|(name, (shape, values))| {
                let bytes: Vec<u8> = values
                    .iter()
                    .flat_map(|&v| match dtype {
                        "F16" => half::f16::from_f32(v).to_le_bytes(),
                        _ => half::bf16::from_f32(v).to_le_bytes(),
                    })
                    .collect();
                (name, (dtype, shape, bytes))
            })
            .collect();
        write_safetensors(&tmp.path().join("model.safetensors"), &tensors);
        let store = WeightStore::open_dir(tmp.path()).unwrap();
        let w = store.get("embeddings.LayerNorm.weight", &[32]).unwrap();
        assert!(!w.is_mapped());
        let got = hidden_states(tmp.path());
        // Rounded weights: close to the f32 model, not equal.
        let tol = if dtype == "F16" { 0.05 } else { 0.3 };
        let diff = max_abs_diff(&got, &reference);
        assert!(diff < tol && diff > 0.0, "{dtype}: max diff {diff}");
    }
}

#[test]
fn sharded_checkpoint_equals_single_file() {
    let reference = hidden_states(&fixture("tiny-bert"));
    let tmp = tempfile::tempdir().unwrap();
    copy_side_files(tmp.path());
    let tensors = tiny_bert_tensors();
    let (mut a, mut b) = (BTreeMap::new(), BTreeMap::new());
    let mut weight_map = serde_json::Map::new();
    for (i, (name, (shape, values))) in tensors.into_iter().enumerate() {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let shard = if i % 2 == 0 {
            "model-00001-of-00002.safetensors"
        } else {
            "model-00002-of-00002.safetensors"
        };
        weight_map.insert(name.clone(), shard.into());
        if i % 2 == 0 { &mut a } else { &mut b }.insert(name, ("F32", shape, bytes));
    }
    write_safetensors(&tmp.path().join("model-00001-of-00002.safetensors"), &a);
    write_safetensors(&tmp.path().join("model-00002-of-00002.safetensors"), &b);
    std::fs::write(
        tmp.path().join("model.safetensors.index.json"),
        serde_json::json!({"metadata": {}, "weight_map": weight_map}).to_string(),
    )
    .unwrap();
    assert_eq!(hidden_states(tmp.path()), reference);
    // An index that points outside the directory is refused.
    std::fs::write(
        tmp.path().join("model.safetensors.index.json"),
        r#"{"weight_map": {"x": "../evil.safetensors"}}"#,
    )
    .unwrap();
    assert!(matches!(
        WeightStore::open_dir(tmp.path()),
        Err(Error::InvalidWeights { .. })
    ));
}

#[test]
fn missing_tensors_and_wrong_shapes_are_named() {
    let store = WeightStore::open_dir(&fixture("tiny-bert")).unwrap();
    let e = store.get("no.such.tensor", &[1]).unwrap_err().to_string();
    assert!(e.contains("no.such.tensor"), "{e}");
    let e = store
        .get("embeddings.LayerNorm.weight", &[33])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("[33]") && e.contains("[32]") && e.contains("model.safetensors"),
        "{e}"
    );
    let tmp = tempfile::tempdir().unwrap();
    let mut ints = BTreeMap::new();
    ints.insert(
        "position_ids".to_string(),
        ("I64", vec![1, 4], vec![0u8; 32]),
    );
    let path = tmp.path().join("model.safetensors");
    write_safetensors(&path, &ints);
    let e = WeightStore::open_dir(tmp.path())
        .unwrap()
        .get("position_ids", &[1, 4])
        .unwrap_err();
    assert!(e.to_string().contains("I64"), "{e}");
    std::fs::remove_file(&path).unwrap();
    let e = WeightStore::open_dir(tmp.path()).unwrap_err().to_string();
    assert!(e.contains("model.safetensors"), "{e}");
}
