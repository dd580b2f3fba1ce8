//! LoRA adapters (PEFT) against transformers + peft: tiny random adapters made by
//! scripts/gen_lora_fixtures.py on the Llama, Qwen3 and Qwen3.5 fixtures (attention-only r 4;
//! MLP-only r 8 with rsLoRA), applied beside the weights and merged into them: last-position
//! logits within 1e-4 (relative) of peft's and 40 greedy tokens equal; a mixture equals peft's
//! weighted combination of the same adapters; bad adapters are refused naming what is wrong.

mod common;

use std::sync::Arc;

use common::lora::{
    adapter_dir, check_adapters_match_peft, check_requests_pick_their_adapters, last_logits,
    load_on,
};
use common::{fixture, greedy, read_json, rel_err, u32s};
use lattice_inference::backend::Device;
use lattice_inference::engine::TextModel;
use lattice_inference::lora::{Adapter, LoraPlan};
use lattice_inference::model::source::{Placement, WeightMode};

#[test]
fn adapters_match_peft_unmerged_and_merged() {
    check_adapters_match_peft(
        &Device::Cpu,
        &["tiny-llama", "tiny-qwen3", "tiny-qwen35"],
        |m, ids, steps| greedy(m, ids, steps).1,
    );
}

#[test]
fn bad_adapters_are_refused_naming_what_is_wrong() {
    // An adapter for another model: its tensors have other shapes or name missing modules.
    let mut place = Placement::new(WeightMode::F32, Device::Cpu);
    place.lora = Some(Arc::new(LoraPlan::new(Vec::new(), false)));
    let e = load_err(|| TextModel::load_on(&fixture("tiny-qwen3"), &place).map(|_| ()));
    assert!(e.is_empty(), "no adapter loads fine: {e}");
    let list = vec![(
        Adapter::load(&adapter_dir("tiny-qwen35", "attn")).unwrap(),
        1.0,
    )];
    let mut place = Placement::new(WeightMode::F32, Device::Cpu);
    place.lora = Some(Arc::new(LoraPlan::new(list, false)));
    let e = TextModel::load_on(&fixture("tiny-llama"), &place)
        .unwrap_err()
        .to_string();
    assert!(e.contains("lora_A") || e.contains("lora_B"), "{e}");
    // Options this engine does not apply, and pickled weights.
    let dir = std::env::temp_dir().join(format!("lattice-lora-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = adapter_dir("tiny-qwen3", "attn");
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("adapter_config.json")).unwrap())
            .unwrap();
    for (field, value, want) in [
        ("use_dora", serde_json::json!(true), "use_dora"),
        (
            "modules_to_save",
            serde_json::json!(["lm_head"]),
            "modules_to_save",
        ),
        ("peft_type", serde_json::json!("IA3"), "peft_type"),
        ("r", serde_json::json!(0), "`r`"),
    ] {
        let mut c = cfg.clone();
        c[field] = value;
        std::fs::write(dir.join("adapter_config.json"), c.to_string()).unwrap();
        std::fs::copy(
            src.join("adapter_model.safetensors"),
            dir.join("adapter_model.safetensors"),
        )
        .unwrap();
        let e = Adapter::load(&dir).unwrap_err().to_string();
        assert!(
            e.contains(want) && e.contains("adapter_config.json"),
            "{field}: {e}"
        );
    }
    std::fs::write(dir.join("adapter_config.json"), cfg.to_string()).unwrap();
    std::fs::remove_file(dir.join("adapter_model.safetensors")).unwrap();
    std::fs::write(dir.join("adapter_model.bin"), b"pickle").unwrap();
    let e = Adapter::load(&dir).unwrap_err().to_string();
    assert!(e.contains("pickle") && e.contains("safetensors"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

fn load_err(f: impl FnOnce() -> lattice_inference::Result<()>) -> String {
    f().err().map(|e| e.to_string()).unwrap_or_default()
}

/// A selectable plan: requests of one batch pick different adapters, a weighted mixture, an
/// adapter prepared after the model was loaded, or none; each output equals that request run
/// alone on a model loaded with just those adapters (or none). Selections that do not fit are
/// refused, by the engine and by a raw forward pass.
#[test]
fn requests_pick_their_adapters_within_one_batch() {
    check_requests_pick_their_adapters(&Device::Cpu, &["tiny-qwen3", "tiny-qwen35"]);
}

/// An adapter saved in bf16 keeps its factors in 16 bits (half the bytes) and gives exactly the
/// logits of the same values saved in f32.
#[test]
fn bf16_adapters_run_in_16_bits_with_the_same_numbers() {
    use lattice_inference::io::store::WeightStore;
    use lattice_inference::lora::Selection;
    use lattice_inference::model::batch::{ForwardBatch, RowOutputs};
    let base = "tiny-qwen3";
    let src = adapter_dir(base, "attn");
    let file = src.join("adapter_model.safetensors");
    let store = WeightStore::open_files(&src, &[file]).unwrap();
    let root = std::env::temp_dir().join(format!("lattice-lora-bf16-{}", std::process::id()));
    let mut dirs = Vec::new();
    for (dtype, bf16) in [("F32", false), ("BF16", true)] {
        let dir = root.join(dtype);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(
            src.join("adapter_config.json"),
            dir.join("adapter_config.json"),
        )
        .unwrap();
        let tensors: std::collections::BTreeMap<_, _> = store
            .names()
            .map(|n| {
                let w = store.get(n, store.shape(n).unwrap()).unwrap();
                let bits: Vec<u32> = w
                    .as_slice()
                    .iter()
                    .map(|x| x.to_bits() & 0xffff_0000)
                    .collect();
                let bytes: Vec<u8> = if bf16 {
                    bits.iter()
                        .flat_map(|b| ((b >> 16) as u16).to_le_bytes())
                        .collect()
                } else {
                    bits.iter().flat_map(|b| b.to_le_bytes()).collect()
                };
                (n.to_owned(), (dtype, w.shape().to_vec(), bytes))
            })
            .collect();
        common::write_safetensors(&dir.join("adapter_model.safetensors"), &tensors);
        dirs.push(dir);
    }
    let adapters = dirs.iter().map(|d| Adapter::load(d).unwrap()).collect();
    let mut place = Placement::new(WeightMode::F32, Device::Cpu);
    place.lora = Some(Arc::new(LoraPlan::selectable(adapters)));
    let m = TextModel::load_on(&fixture(base), &place).unwrap();
    let loaded = m.lora.as_ref().unwrap().loaded();
    assert_eq!(
        loaded[0].bytes(),
        2 * loaded[1].bytes(),
        "bf16 factors take half the bytes"
    );
    let r = read_json(&fixture("lora").join(base).join("reference.json"));
    let ids = u32s(&r["prompt_ids"]);
    let logits: Vec<Vec<f32>> = loaded
        .iter()
        .map(|a| {
            let mut batch = ForwardBatch::tokens(&ids, &[ids.len()], RowOutputs::LastLogits);
            batch.adapters = Some(vec![Selection::new(vec![(a.clone(), 1.0)]).unwrap()]);
            let mut cache = m.decoder.new_cache(ids.len() + 1);
            m.decoder.forward_batch(&batch, &mut [&mut cache]).unwrap()
        })
        .collect();
    assert_eq!(logits[0], logits[1]);
    let plain = last_logits(&m, &ids);
    assert!(rel_err(&plain, &logits[0]) > 1e-2, "the adapter acts");
    std::fs::remove_dir_all(&root).ok();
}

/// The prefix cache keys prompts by the adapters they ran with: a prompt first run on the base
/// model is not reused for an adapter request (other keys and values), a second request with
/// the same adapter reuses the first's pages, and every output equals the request run alone.
#[test]
fn prefix_cache_keeps_adapters_apart() {
    use lattice_inference::engine::{generate, BatchEngine, GenerateRequest};
    use lattice_inference::lora::Selection;
    use lattice_inference::sample::SamplingParams;
    for base in ["tiny-qwen3", "tiny-qwen35"] {
        let mut place = Placement::new(WeightMode::F32, Device::Cpu);
        let attn = Adapter::load(&adapter_dir(base, "attn")).unwrap();
        place.lora = Some(Arc::new(LoraPlan::selectable(vec![attn])));
        let m = TextModel::load_on(&fixture(base), &place).unwrap();
        let a = m.lora.as_ref().unwrap().loaded()[0].clone();
        let with_a = Selection::new(vec![(a, 1.0)]).unwrap();
        let r = read_json(&fixture(base).join("reference.json"));
        let prompt: Vec<u32> = r["prompts"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|p| u32s(&p["ids"]))
            // Past a recurrent-state snapshot (every 128 tokens) for the hybrid model.
            .take(200)
            .collect();
        assert_eq!(prompt.len(), 200);
        let req = |lora: &Selection| {
            let mut q = GenerateRequest::new(prompt.clone(), 12, SamplingParams::greedy());
            q.ignore_eos = true;
            q.lora = lora.clone();
            q
        };
        let alone_a = generate(
            &load_on(base, &[("attn", 1.0)], false, &Device::Cpu).unwrap(),
            &req(&Selection::default()),
            &mut |_| true,
        )
        .unwrap();
        let mut engine = BatchEngine::new(&m, 4);
        let mut run = |q: GenerateRequest| {
            engine.submit(q).unwrap();
            engine.run_all().unwrap().pop().unwrap().1
        };
        let plain = run(req(&Selection::default()));
        let first = run(req(&with_a));
        assert_eq!(
            first.cached_prompt_tokens, 0,
            "{base}: base pages reused for an adapter"
        );
        assert_eq!(first.token_ids, alone_a.token_ids, "{base}");
        let second = run(req(&with_a));
        assert!(
            second.cached_prompt_tokens > 0,
            "{base}: the adapter's own pages not reused"
        );
        assert_eq!(second.token_ids, alone_a.token_ids, "{base}");
        let again = run(req(&Selection::default()));
        assert!(again.cached_prompt_tokens > 0);
        assert_eq!(again.token_ids, plain.token_ids, "{base}");
    }
}
