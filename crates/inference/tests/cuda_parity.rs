//! Whole decoders on a GPU (feature `cuda`) against transformers, on the tiny random-weight
//! fixtures of scripts/gen_decoder_fixtures.py: f32 last-position logits within 1e-5 relative
//! error of the committed references and 64 greedy tokens equal (one token at a time over device
//! KV pages); bf16 weights giving the f32 results; a batch through the engine (continuous
//! batching, prefix cache) generating the CPU's tokens; Qwen3.5 (Gated DeltaNet) likewise;
//! quantized GGUF files against the CPU; LoRA adapters against peft.
//! Skipped, saying so, without a GPU.
#![cfg(feature = "cuda")]

mod common;

use common::gpu;
use common::lora::{check_adapters_match_peft, check_requests_pick_their_adapters};
use common::overlap;
use common::{
    check_drafts_leave_outputs_unchanged, f32s, fixture, greedy, read_json, rel_err, u32s,
};
use lattice_inference::backend::Device;
use lattice_inference::engine::{BatchEngine, GenerateRequest, TextModel};
use lattice_inference::model::batch::{ForwardBatch, RowOutputs};
use lattice_inference::model::decoder::{load_decoder_on, Decoder, Outputs};
use lattice_inference::model::source::{Placement, WeightMode};
use lattice_inference::sample::SamplingParams;

const MODELS: [&str; 3] = ["tiny-qwen3", "tiny-llama", "tiny-qwen2"];

fn greedy_on_device(model: &dyn Decoder, prompt: &[u32], steps: usize) -> Vec<u32> {
    let mut cache = model.new_cache(4096);
    let mut out = Vec::new();
    let mut next: Vec<u32> = prompt.to_vec();
    while out.len() < steps {
        let batch = ForwardBatch::tokens(&next, &[next.len()], RowOutputs::LastLogits);
        let id = model.forward_greedy(&batch, &mut [&mut cache]).unwrap()[0];
        out.push(id);
        next = vec![id];
    }
    out
}

#[test]
fn f32_logits_and_greedy_match_transformers_on_the_gpu() {
    let Some(dev) = gpu("f32_logits_and_greedy_match_transformers_on_the_gpu") else {
        return;
    };
    for name in MODELS {
        let dir = fixture(name);
        let model = load_decoder_on(&dir, &Placement::new(WeightMode::F32, dev.clone())).unwrap();
        let reference = read_json(&dir.join("reference.json"));
        let mut worst = 0.0f64;
        for p in reference["prompts"].as_array().unwrap() {
            let ids = u32s(&p["ids"]);
            let (logits, got) = greedy(model.as_ref(), &ids, 64);
            let err = rel_err(&logits, &f32s(&p["last_logits"]));
            worst = worst.max(err);
            assert!(err < 1e-5, "{name}/{}: relative error {err:e}", p["name"]);
            assert_eq!(got, u32s(&p["greedy_ids"]), "{name}/{}: greedy", p["name"]);
            // The same through `forward_greedy`: ids picked on the device, decode steps
            // recorded once and replayed (CUDA graphs) across page boundaries.
            let picked = greedy_on_device(model.as_ref(), &ids, 64);
            assert_eq!(picked, got, "{name}/{}: greedy on the device", p["name"]);
        }
        eprintln!("{name} on {dev}: worst relative logit error {worst:.2e}, greedy 64 equal");
    }
}

/// A recorded decode step keeps programmatic dependent launch: no allocation or free node
/// stands between its kernels (recordings take their buffers from a pool made outside the
/// capture), so every kernel launched as a dependent but the first follows the one before it
/// on a programmatic edge (H100: batch-1 graph 1.110 -> 0.968 ms when this first held).
#[test]
fn recorded_decode_steps_keep_programmatic_launches() {
    let Some(dev) = gpu("recorded_decode_steps_keep_programmatic_launches") else {
        return;
    };
    let lattice_inference::backend::Device::Cuda(cuda) = &dev else {
        unreachable!("gpu() opens a CUDA device")
    };
    let model = load_decoder_on(
        &fixture("tiny-qwen3"),
        &Placement::new(WeightMode::F32, dev.clone()),
    )
    .unwrap();
    // Eager, recorded, then replayed steps.
    greedy_on_device(model.as_ref(), &[1, 2, 3], 4);
    let shape = cuda.last_recording().expect("a decode step was recorded");
    eprintln!("recorded step of tiny-qwen3: {shape:?}");
    assert_eq!((shape.allocations, shape.frees), (0, 0), "{shape:?}");
    assert!(shape.dependents > 10, "{shape:?}");
    if cuda.dependent_launch() {
        assert!(shape.programmatic + 1 >= shape.dependents, "{shape:?}");
        assert_eq!(shape.full_into_dependents, 0, "{shape:?}");
    }
}

/// bf16 weights on the GPU multiply f32 activations (exactly in the matrix-vector kernel,
/// through a two-term bf16 split of the activations in cuBLAS). tiny-qwen3's weights are
/// exactly bf16 values, so there the bf16 model must give the f32 logits: within the issue's
/// 1e-3 of transformers f32 (in practice ~1e-5) and of the CPU's f32 run, and the same greedy
/// tokens. The other fixtures' f32 weights are rounded to bf16 at load, which alone moves the
/// logits by up to a few 1e-3.
#[test]
fn bf16_weights_give_the_f32_results() {
    let Some(dev) = gpu("bf16_weights_give_the_f32_results") else {
        return;
    };
    for name in MODELS {
        let dir = fixture(name);
        let exact = name == "tiny-qwen3";
        let g = load_decoder_on(&dir, &Placement::new(WeightMode::Bf16, dev.clone())).unwrap();
        let c = load_decoder_on(&dir, &Placement::new(WeightMode::F32, Device::Cpu)).unwrap();
        let reference = read_json(&dir.join("reference.json"));
        let (mut worst, mut worst_hf) = (0.0f64, 0.0f64);
        for p in reference["prompts"].as_array().unwrap() {
            let ids = u32s(&p["ids"]);
            let mut cg = g.new_cache(1024);
            let mut cc = c.new_cache(1024);
            let lg = g
                .forward(&ids, &[ids.len()], &mut [&mut cg], Outputs::AllLogits)
                .unwrap();
            let lc = c
                .forward(&ids, &[ids.len()], &mut [&mut cc], Outputs::AllLogits)
                .unwrap();
            let err = rel_err(&lg, &lc);
            worst = worst.max(err);
            let want = f32s(&p["last_logits"]);
            let vs_hf = rel_err(&lg[lg.len() - want.len()..], &want);
            worst_hf = worst_hf.max(vs_hf);
            let bar = if exact { 1e-3 } else { 3e-2 };
            assert!(
                err < bar,
                "{name}/{}: gpu bf16 vs cpu f32 {err:e}",
                p["name"]
            );
            assert!(
                vs_hf < bar,
                "{name}/{}: bf16 vs transformers f32 {vs_hf:e}",
                p["name"]
            );
            if exact {
                let steps = 32;
                assert_eq!(
                    greedy_on_device(g.as_ref(), &ids, steps),
                    greedy(c.as_ref(), &ids, steps).1,
                    "{name}/{}: greedy tokens of bf16 on the GPU",
                    p["name"]
                );
            }
        }
        eprintln!(
            "{name} bf16 on {dev}: worst relative logit error {worst:.2e} vs the CPU's f32, \
             {worst_hf:.2e} vs transformers f32{}",
            if exact {
                " (weights exactly bf16; greedy 32 equal)"
            } else {
                ""
            }
        );
    }
}

/// Qwen3.5 (Gated DeltaNet + gated attention) on the GPU, from safetensors and from the GGUF
/// that llama.cpp's converter writes (tiled value heads): last logits within 1e-4 of
/// transformers (the CPU test's bar, for prompts up to 2,000 tokens), every position of the
/// long prompt within 5e-5 of the CPU, 64 greedy tokens equal, also through recorded decode
/// steps.
#[test]
fn qwen35_hybrid_on_the_gpu_matches_transformers() {
    let Some(dev) = gpu("qwen35_hybrid_on_the_gpu_matches_transformers") else {
        return;
    };
    let dir = fixture("tiny-qwen35");
    let reference = read_json(&dir.join("reference.json"));
    let cpu = load_decoder_on(&dir, &Placement::new(WeightMode::F32, Device::Cpu)).unwrap();
    for path in [dir.clone(), dir.join("tiny-qwen35.bf16.gguf")] {
        let model = load_decoder_on(&path, &Placement::new(WeightMode::F32, dev.clone())).unwrap();
        let mut worst = 0.0f64;
        for p in reference["prompts"].as_array().unwrap() {
            let ids = u32s(&p["ids"]);
            let (logits, got) = greedy(model.as_ref(), &ids, 64);
            let err = rel_err(&logits, &f32s(&p["last_logits"]));
            worst = worst.max(err);
            assert!(err < 1e-4, "{path:?}/{}: relative error {err:e}", p["name"]);
            assert_eq!(
                got,
                u32s(&p["greedy_ids"]),
                "{path:?}/{}: greedy",
                p["name"]
            );
            let picked = greedy_on_device(model.as_ref(), &ids, 64);
            assert_eq!(picked, got, "{path:?}/{}: greedy on the device", p["name"]);
            if p["name"] == "long" {
                let all = |m: &dyn Decoder| {
                    let mut st = m.new_cache(4096);
                    m.forward(&ids, &[ids.len()], &mut [&mut st], Outputs::AllLogits)
                        .unwrap()
                };
                let e = rel_err(&all(model.as_ref()), &all(cpu.as_ref()));
                // The CPU runs the prompt's delta rule in chunks, the GPU token by token.
                assert!(e < 5e-5, "{path:?}/long: every position vs the CPU {e:e}");
                eprintln!(
                    "tiny-qwen35 {path:?}: all {} positions vs the CPU {e:.2e}",
                    ids.len()
                );
            }
        }
        eprintln!(
            "tiny-qwen35 {path:?} on {dev}: worst relative logit error {worst:.2e}, greedy 64 equal"
        );
    }
}

#[test]
fn engine_batches_on_the_gpu_like_the_cpu() {
    let Some(dev) = gpu("engine_batches_on_the_gpu_like_the_cpu") else {
        return;
    };
    for name in ["tiny-qwen3", "tiny-qwen35"] {
        engine_batches_like_the_cpu(&dev, name);
    }
}

fn engine_batches_like_the_cpu(dev: &Device, name: &str) {
    let dir = fixture(name);
    let g = TextModel::load_on(&dir, &Placement::new(WeightMode::F32, dev.clone())).unwrap();
    let c = TextModel::load(&dir, WeightMode::F32).unwrap();
    let reference = read_json(&dir.join("reference.json"));
    let prompts: Vec<Vec<u32>> = reference["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| u32s(&p["ids"]))
        .collect();
    // 4 running: steps of up to 4 rows; 16 running over three copies of the prompts: steps of
    // 9-16 rows (cuBLAS products, recorded too).
    let run = |m: &TextModel, running: usize, copies: usize| -> Vec<Vec<u32>> {
        let mut engine = BatchEngine::new(m, running);
        // Repeats are served from the prefix cache.
        let all = (0..copies).flat_map(|_| prompts.iter());
        for p in all.chain(prompts.iter().take(2)) {
            let mut req = GenerateRequest::new(p.clone(), 24, SamplingParams::greedy());
            req.ignore_eos = true;
            engine.submit(req).unwrap();
        }
        engine
            .run_all()
            .unwrap()
            .into_iter()
            .map(|(_, g)| g.token_ids)
            .collect()
    };
    for (running, copies) in [(4, 1), (16, 3)] {
        assert_eq!(
            run(&g, running, copies),
            run(&c, running, copies),
            "{name}: engine tokens on {dev} vs cpu, {running} running"
        );
    }
    eprintln!(
        "{name}: engine on {dev}: {} and {} requests, tokens equal to the CPU's",
        prompts.len() + 2,
        3 * prompts.len() + 2
    );
}

/// Decode steps run ahead of their read on the GPU (each step's tokens copied on the device
/// from the picks of the step before): the outputs, streamed texts and ends of greedy
/// requests with joins, cancellations and early ends equal the CPU's read step by step, and
/// steps ran ahead; sampled requests give the GPU's outputs read step by step.
#[test]
fn steps_run_ahead_on_the_gpu_give_the_cpu_outputs() {
    let Some(dev) = gpu("steps_run_ahead_on_the_gpu_give_the_cpu_outputs") else {
        return;
    };
    for name in ["tiny-qwen3", "tiny-qwen35"] {
        let dir = fixture(name);
        let g = TextModel::load_on(&dir, &Placement::new(WeightMode::F32, dev.clone())).unwrap();
        let c = TextModel::load(&dir, WeightMode::F32).unwrap();
        let reqs = overlap::greedy(name);
        for (slots, join_after, cancel_at) in overlap::RUNS {
            let what = format!("{name} on {dev}, {slots} slots, joins after {join_after} steps");
            let mut cpu = BatchEngine::new(&c, slots);
            cpu.set_overlap(false);
            let mut e = BatchEngine::new(&g, slots);
            e.set_overlap(true);
            let n = overlap::run_both(&mut cpu, &mut e, &reqs, join_after, cancel_at, &what).steps;
            assert!(n > 0, "{what}: no step ran ahead");
            eprintln!("{what}: {n} steps ran ahead, outputs equal to the CPU's");
        }
        // Sampled requests: the GPU's steps run ahead against its steps read one by one (the
        // same logits, so the same draws); on Qwen3.5 they do not run ahead.
        let reqs = overlap::sampled(&g, name);
        for (slots, join_after, cancel_at) in overlap::RUNS {
            let what = format!("{name} on {dev}, sampled, {slots} slots, joins after {join_after}");
            let mut serial = BatchEngine::new(&g, slots);
            serial.set_overlap(false);
            let mut e = BatchEngine::new(&g, slots);
            e.set_overlap(true);
            e.set_overlap_sampled(true);
            let n =
                overlap::run_both(&mut serial, &mut e, &reqs, join_after, cancel_at, &what).steps;
            assert_eq!(n > 0, name == "tiny-qwen3", "{what}: {n} steps ran ahead");
            eprintln!("{what}: {n} steps ran ahead, outputs equal to steps read one by one");
        }
    }
}

/// Speculative decoding on the GPU: drafts leave greedy (and seeded sampled) outputs
/// unchanged for the attention-only fixtures (the verifying pass runs the prompt kernels, so
/// its logits agree with decode's to f32 rounding, not bit for bit); the hybrid Qwen3.5, whose
/// recurrent state there cannot be rolled back, refuses to draft.
#[test]
fn speculative_decoding_on_the_gpu_leaves_outputs_unchanged() {
    let Some(dev) = gpu("speculative_decoding_on_the_gpu_leaves_outputs_unchanged") else {
        return;
    };
    for name in ["tiny-qwen3", "tiny-llama"] {
        let place = Placement::new(WeightMode::F32, dev.clone());
        let m = TextModel::load_on(&fixture(name), &place).unwrap();
        assert_eq!(m.draft_refusal(), None, "{name} on {dev}");
        check_drafts_leave_outputs_unchanged(&m, name);
    }
    let place = Placement::new(WeightMode::F32, dev.clone());
    let hybrid = TextModel::load_on(&fixture("tiny-qwen35"), &place).unwrap();
    let why = hybrid
        .draft_refusal()
        .expect("a hybrid model on a GPU refuses to draft");
    assert!(why.contains("recurrent"), "{why}");
}

/// The BERT encoders (tiny-bert, mean pooling; tiny-bert-cls) on the GPU against
/// sentence-transformers' embeddings and the CPU's hidden states: every reference text packed
/// into one batch (sequences of 1 to 48 tokens), 1 - cos < 1e-6 as on the CPU.
/// LoRA adapters beside the weights on the GPU, through the CPU test's checks
/// (common/lora.rs): peft's logits (1e-4) and greedy tokens, unmerged, merged and mixed, with
/// the greedy steps recorded and replayed (the adapters' row lists are step inputs); requests
/// picking their adapters within one batch generate what each does alone.
#[test]
fn lora_adapters_on_the_gpu_match_peft() {
    let Some(dev) = gpu("lora_adapters_on_the_gpu_match_peft") else {
        return;
    };
    check_adapters_match_peft(
        &dev,
        &["tiny-llama", "tiny-qwen3", "tiny-qwen35"],
        greedy_on_device,
    );
    check_requests_pick_their_adapters(&dev, &["tiny-qwen3", "tiny-qwen35"]);
    // Every model and its plan are gone: so are the row lists the device kept for their
    // adapted products.
    if let lattice_inference::backend::Device::Cuda(cuda) = &dev {
        assert_eq!(
            cuda.low_rank_inputs(),
            0,
            "LoRA step inputs outlive their plans"
        );
    }
}

#[test]
fn bert_encoders_on_the_gpu_match_sentence_transformers() {
    use lattice_inference::model::heads::{self, Pooling};
    use lattice_inference::model::{load_encoder, load_encoder_on, PackedBatch};
    let Some(dev) = gpu("bert_encoders_on_the_gpu_match_sentence_transformers") else {
        return;
    };
    for name in ["tiny-bert", "tiny-bert-cls"] {
        let dir = fixture(name);
        let r = read_json(&dir.join("reference.json"));
        let g = load_encoder_on(&dir, &dev).unwrap();
        let c = load_encoder(&dir).unwrap();
        let d = g.info().hidden_size;
        let mut batch = PackedBatch::new();
        let ids: Vec<Vec<u32>> = r["input_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(u32s)
            .collect();
        for s in &ids {
            batch.push(s, &[]);
        }
        let hg = g.forward(&batch).unwrap();
        let hc = c.forward(&batch).unwrap();
        let states = rel_err(&hg, &hc);
        assert!(states < 1e-5, "{name}: hidden states vs the CPU {states:e}");
        let pool = if r["pooling"] == "cls" {
            Pooling::Cls
        } else {
            Pooling::Mean
        };
        let mut pooled = heads::pool(&hg, d, &batch.cu_seqlens, pool);
        if r["normalize"].as_bool().unwrap() {
            heads::l2_normalize_rows(&mut pooled, d);
        }
        let mut worst = 0.0f64;
        for (i, w) in r["embeddings"].as_array().unwrap().iter().enumerate() {
            let (a, b) = (&pooled[i * d..(i + 1) * d], f32s(w));
            let dot: f64 = a
                .iter()
                .zip(&b)
                .map(|(x, y)| f64::from(*x) * f64::from(*y))
                .sum();
            let na: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
            let nb: f64 = b.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
            worst = worst.max(1.0 - dot / (na * nb));
        }
        assert!(
            worst < 1e-6,
            "{name}: 1 - cos {worst:e} vs sentence-transformers"
        );
        eprintln!(
            "{name} on {dev}: {} texts, 1 - cos {worst:.1e} vs sentence-transformers, hidden states {states:.1e} vs the CPU",
            ids.len()
        );
    }
}

/// Quantized GGUF files (the paths in `LATTICE_TEST_GGUF`, comma-separated: on the GPU machine,
/// the Q4_K_M / Q4_0 / Q8_0 files llama-quantize makes of a random Qwen3-0.6B, see
/// scripts/gpu/lattice_device.sh's `gguf` step) on the GPU against the same file on the CPU:
/// every position's logits of a 200-token prompt (the tiled products) and 32 greedy steps (the
/// matrix-vector products, recorded). Both quantize the activations alike and every product
/// matches the CPU's to f32 rounding (tests/cuda_ops.rs), but a rounding difference that moves
/// an activation across a code boundary changes the next layer's codes, and over 28 layers of
/// random weights that grows to the size of the quantization's own error (measured on the
/// H200: 0.71x of it for Q8_0, whose kernels predate this test and whose tiled products equal
/// the CPU's bit for bit; 0.77x for Q4_0, 0.88x for Q4_K_M). So the bar is that error itself
/// (the CPU's quantized logits against the same file dequantized to f32), and the device's
/// own greedy choice must equal the host's argmax of its logits. Skipped, saying so, without a
/// GPU or without files.
#[test]
fn quantized_gguf_on_the_gpu_matches_the_cpu() {
    let Some(dev) = gpu("quantized_gguf_on_the_gpu_matches_the_cpu") else {
        return;
    };
    let Ok(paths) = std::env::var("LATTICE_TEST_GGUF") else {
        eprintln!("quantized_gguf_on_the_gpu_matches_the_cpu: SKIPPED (LATTICE_TEST_GGUF not set)");
        return;
    };
    let prompt: Vec<u32> = (0..200u32).map(|i| (i * 7919 + 13) % 150_000).collect();
    let mut failed = Vec::new();
    for path in paths.split(',').filter(|p| !p.is_empty()) {
        let path = std::path::Path::new(path);
        let on = |mode, d: Device| load_decoder_on(path, &Placement::new(mode, d)).unwrap();
        let all = |m: &dyn Decoder| {
            let mut st = m.new_cache(4096);
            m.forward(&prompt, &[prompt.len()], &mut [&mut st], Outputs::AllLogits)
                .unwrap()
        };
        let (cpu_all, exact_all) = {
            let cpu = on(WeightMode::Quantized, Device::Cpu);
            let exact = on(WeightMode::F32, Device::Cpu);
            (all(cpu.as_ref()), all(exact.as_ref()))
        };
        let cpu = on(WeightMode::Quantized, Device::Cpu);
        let gpu_model = on(WeightMode::Quantized, dev.clone());
        let e = rel_err(&all(gpu_model.as_ref()), &cpu_all);
        let quantization = rel_err(&cpu_all, &exact_all);
        let (lc, gc) = greedy(cpu.as_ref(), &prompt[..16], 32);
        let (lg, gg) = greedy(gpu_model.as_ref(), &prompt[..16], 32);
        let first = rel_err(&lg, &lc);
        let picked = greedy_on_device(gpu_model.as_ref(), &prompt[..16], 32);
        let same = gg.iter().zip(&gc).take_while(|(a, b)| a == b).count();
        eprintln!(
            "{path:?}: 200 positions vs the CPU {e:.2e} (the quantization's own error: \
             {quantization:.2e}); 16-token prompt's logits {first:.2e}; greedy equal for the \
             first {same} of 32 tokens"
        );
        if e.max(first) > quantization || picked != gg {
            failed.push(path.to_path_buf());
        }
    }
    assert!(
        failed.is_empty(),
        "beyond the bar or greedy on the device differs: {failed:?}"
    );
}

/// Full-size random-weight checkpoints on the GPU against transformers on the same GPU
/// (scripts/gpu/torch_logits.py, f32 with TF32 off): `LATTICE_TEST_TORCH_REF` lists
/// `MODE:DIR=REF.json` entries, comma-separated (MODE `f32`, or `bf16` for a checkpoint whose
/// f32 reference was made from the same values in f32). Last-position logits within 1e-4
/// relative error (the project's f32 bar), and greedy tokens equal up to the first step whose
/// reference top-2 gap is below 1e-3 of the largest logit (a near-tie f32 order may flip).
/// Run on the device by scripts/gpu/lattice_device.sh's `fullsize` step; skipped elsewhere.
#[test]
fn full_size_models_match_transformers_on_the_gpu() {
    let Ok(spec) = std::env::var("LATTICE_TEST_TORCH_REF") else {
        eprintln!(
            "SKIPPED full_size_models_match_transformers_on_the_gpu: LATTICE_TEST_TORCH_REF is \
             not set (device runs only)"
        );
        return;
    };
    let Some(dev) = gpu("full_size_models_match_transformers_on_the_gpu") else {
        return;
    };
    for entry in spec.split(',').filter(|e| !e.is_empty()) {
        let (mode, rest) = entry.split_once(':').expect("MODE:DIR=REF");
        let (dir, refp) = rest.split_once('=').expect("MODE:DIR=REF");
        let mode = match mode {
            "f32" => WeightMode::F32,
            "bf16" => WeightMode::Bf16,
            other => panic!("mode {other}: f32 or bf16"),
        };
        let model = load_decoder_on(
            std::path::Path::new(dir),
            &Placement::new(mode, dev.clone()),
        )
        .unwrap();
        let reference = read_json(std::path::Path::new(refp));
        for p in reference["prompts"].as_array().unwrap() {
            let ids = u32s(&p["ids"]);
            let want = f32s(&p["last_logits"]);
            let mut cache = model.new_cache(4096);
            let logits = model
                .forward(&ids, &[ids.len()], &mut [&mut cache], Outputs::LastLogits)
                .unwrap();
            let err = rel_err(&logits, &want);
            let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            let want_ids = u32s(&p["greedy_ids"]);
            let gaps = f32s(&p["gaps"]);
            let got_ids = greedy_on_device(model.as_ref(), &ids, want_ids.len());
            let same = got_ids
                .iter()
                .zip(&want_ids)
                .take_while(|(a, b)| a == b)
                .count();
            eprintln!(
                "{dir} ({mode:?}) prompt of {}: last logits {err:.2e} from transformers, greedy \
                 {same} of {} equal{}",
                ids.len(),
                want_ids.len(),
                if same < want_ids.len() {
                    format!(" (reference gap at step {same}: {:.2e})", gaps[same])
                } else {
                    String::new()
                }
            );
            assert!(err < 1e-4, "{dir} prompt of {}: {err:e}", ids.len());
            if same < want_ids.len() {
                assert!(
                    gaps[same] < 1e-3 * scale,
                    "{dir} prompt of {}: greedy diverged at step {same} where the reference's \
                     top-2 gap is {}",
                    ids.len(),
                    gaps[same]
                );
            }
        }
    }
}
