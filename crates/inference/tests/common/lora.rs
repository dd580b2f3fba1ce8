//! LoRA checks shared by the CPU tests (tests/lora.rs) and the GPU's (tests/cuda_parity.rs):
//! the tiny random adapters of scripts/gen_lora_fixtures.py against transformers + peft, and
//! requests picking their adapters within one batch against each run alone.

use std::path::PathBuf;
use std::sync::Arc;

use super::{fixture, read_json, rel_err, u32s};
use lattice_inference::backend::Device;
use lattice_inference::engine::TextModel;
use lattice_inference::lora::{Adapter, LoadedAdapter, LoraPlan, Selection};
use lattice_inference::model::decoder::{Decoder, Outputs};
use lattice_inference::model::source::{Placement, WeightMode};

/// The fixture adapter `name` of base model `base`.
pub fn adapter_dir(base: &str, name: &str) -> PathBuf {
    fixture("lora").join(base).join(name)
}

/// The f32 fixture `base` on `dev` with `adapters` (name, scale) applied to every request,
/// merged into the weights or beside them (none: the plain model).
pub fn load_on(
    base: &str,
    adapters: &[(&str, f32)],
    merge: bool,
    dev: &Device,
) -> lattice_inference::Result<TextModel> {
    let list = adapters
        .iter()
        .map(|&(n, s)| Ok((Adapter::load(&adapter_dir(base, n))?, s)))
        .collect::<lattice_inference::Result<Vec<_>>>()?;
    let mut place = Placement::new(WeightMode::F32, dev.clone());
    if !list.is_empty() {
        place.lora = Some(Arc::new(LoraPlan::new(list, merge)));
    }
    TextModel::load_on(&fixture(base), &place)
}

/// The prompt's last-position logits.
pub fn last_logits(m: &TextModel, ids: &[u32]) -> Vec<f32> {
    let mut cache = m.decoder.new_cache(ids.len() + 1);
    m.decoder
        .forward(ids, &[ids.len()], &mut [&mut cache], Outputs::LastLogits)
        .unwrap()
}

/// Each base's attention-only and MLP-only adapters, unmerged and merged, and their mixture, on
/// `dev`: last-position logits within 1e-4 (relative) of peft's and the greedy tokens
/// (`greedy(model, prompt, steps)`) equal to peft's.
pub fn check_adapters_match_peft(
    dev: &Device,
    bases: &[&str],
    greedy: impl Fn(&dyn Decoder, &[u32], usize) -> Vec<u32>,
) {
    for &base in bases {
        let r = read_json(&fixture("lora").join(base).join("reference.json"));
        let ids = u32s(&r["prompt_ids"]);
        let steps = r["steps"].as_u64().unwrap() as usize;
        let plain = load_on(base, &[], false, dev).unwrap();
        let plain_logits = last_logits(&plain, &ids);
        for name in ["attn", "mlp"] {
            let want = &r["adapters"][name];
            for merge in [false, true] {
                let m = load_on(base, &[(name, 1.0)], merge, dev).unwrap();
                let (key, gkey) = if merge {
                    ("merged_logits", "merged_greedy")
                } else {
                    ("logits", "greedy")
                };
                let want_logits: Vec<f32> = super::f32s(&want[key]);
                let got = last_logits(&m, &ids);
                let e = rel_err(&got, &want_logits);
                let moved = rel_err(&plain_logits, &want_logits);
                eprintln!("{base}/{name} merge={merge} on {dev}: rel err {e:.2e} (the adapter moves the logits by {moved:.2e})");
                assert!(
                    e < 1e-4,
                    "{base}/{name} merge={merge}: logits rel err {e:e}"
                );
                assert!(
                    moved > 1e-2,
                    "{base}/{name}: the adapter barely changes the logits"
                );
                assert_eq!(
                    greedy(m.decoder.as_ref(), &ids, steps),
                    u32s(&want[gkey]),
                    "{base}/{name} merge={merge}: greedy"
                );
            }
        }
        // A mixture: the scaled deltas of both adapters add (peft's "cat" combination).
        let mix: Vec<(String, f32)> = r["mixture"]["adapters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                (
                    a[0].as_str().unwrap().to_owned(),
                    a[1].as_f64().unwrap() as f32,
                )
            })
            .collect();
        let mix_ref: Vec<(&str, f32)> = mix.iter().map(|(n, s)| (n.as_str(), *s)).collect();
        for merge in [false, true] {
            let m = load_on(base, &mix_ref, merge, dev).unwrap();
            let e = rel_err(
                &last_logits(&m, &ids),
                &super::f32s(&r["mixture"]["logits"]),
            );
            eprintln!("{base} mixture merge={merge} on {dev}: rel err {e:.2e}");
            assert!(e < 1e-4, "{base} mixture merge={merge}: rel err {e:e}");
            assert_eq!(
                greedy(m.decoder.as_ref(), &ids, steps),
                u32s(&r["mixture"]["greedy"]),
                "{base} mixture greedy"
            );
        }
    }
}

/// A model on `dev` with a selectable plan (the attention adapter at load, the MLP one prepared
/// after): a batch whose requests pick none, one, the other and a mixture generates, request
/// for request, what each generates alone on a model loaded with just those adapters; adapters
/// of another model's plan, or for a model loaded without adapters, are refused.
pub fn check_requests_pick_their_adapters(dev: &Device, bases: &[&str]) {
    use lattice_inference::engine::{generate, BatchEngine, GenerateRequest};
    use lattice_inference::model::batch::{ForwardBatch, RowOutputs};
    use lattice_inference::sample::SamplingParams;
    for &base in bases {
        let mut place = Placement::new(WeightMode::F32, dev.clone());
        let attn = Adapter::load(&adapter_dir(base, "attn")).unwrap();
        place.lora = Some(Arc::new(LoraPlan::selectable(vec![attn])));
        let multi = TextModel::load_on(&fixture(base), &place).unwrap();
        let plan = multi.lora.clone().unwrap();
        let attn = plan.loaded()[0].clone();
        // Prepared while the model is loaded (what the server's load route does).
        let mlp = plan
            .prepare(&Adapter::load(&adapter_dir(base, "mlp")).unwrap())
            .unwrap();
        let one = |a: &Arc<LoadedAdapter>| Selection::new(vec![(a.clone(), 1.0)]).unwrap();
        let mix = Selection::new(vec![(attn.clone(), 0.7), (mlp.clone(), -0.4)]).unwrap();
        let r = read_json(&fixture(base).join("reference.json"));
        let prompts: Vec<Vec<u32>> = r["prompts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| u32s(&p["ids"]))
            .collect();
        let picks = [
            Selection::default(),
            one(&attn),
            one(&mlp),
            mix.clone(),
            Selection::default(),
            one(&attn),
        ];
        let alone: Vec<&[(&str, f32)]> = vec![
            &[],
            &[("attn", 1.0)],
            &[("mlp", 1.0)],
            &[("attn", 0.7), ("mlp", -0.4)],
            &[],
            &[("attn", 1.0)],
        ];
        let req = |k: usize, pick: &Selection| {
            let mut q = GenerateRequest::new(
                prompts[k % prompts.len()].clone(),
                24,
                SamplingParams::greedy(),
            );
            q.ignore_eos = true;
            q.lora = pick.clone();
            q
        };
        let mut engine = BatchEngine::new(&multi, 8);
        for (k, pick) in picks.iter().enumerate() {
            engine.submit(req(k, pick)).unwrap();
        }
        let done = engine.run_all().unwrap();
        for ((k, list), (_, got)) in alone.iter().enumerate().zip(&done) {
            let m = load_on(base, list, false, dev).unwrap();
            let want = generate(&m, &req(k, &Selection::default()), &mut |_| true).unwrap();
            assert_eq!(
                got.token_ids, want.token_ids,
                "{base} on {dev}: request {k} ({list:?})"
            );
        }
        // Adapters prepared by another model's plan, or for a model loaded without adapters.
        let other = load_on(base, &[("attn", 1.0)], false, dev).unwrap();
        let e = BatchEngine::new(&other, 2)
            .submit(req(0, &one(&attn)))
            .unwrap_err()
            .to_string();
        assert!(e.contains("every request"), "{e}");
        let plain = load_on(base, &[], false, dev).unwrap();
        let e = BatchEngine::new(&plain, 2)
            .submit(req(0, &one(&attn)))
            .unwrap_err()
            .to_string();
        assert!(e.contains("without"), "{e}");
        let ids = &prompts[0];
        let mut batch = ForwardBatch::tokens(ids, &[ids.len()], RowOutputs::LastLogits);
        batch.adapters = Some(vec![one(&attn)]);
        let forward_err = |m: &TextModel| {
            let mut cache = m.decoder.new_cache(ids.len() + 1);
            m.decoder
                .forward_batch(&batch, &mut [&mut cache])
                .unwrap_err()
                .to_string()
        };
        let e = forward_err(&plain);
        assert!(e.contains("without LoRA"), "{e}");
        let mut place = Placement::new(WeightMode::F32, dev.clone());
        place.lora = Some(Arc::new(LoraPlan::selectable(Vec::new())));
        let e = forward_err(&TextModel::load_on(&fixture(base), &place).unwrap());
        assert!(e.contains("another model"), "{e}");
    }
}
