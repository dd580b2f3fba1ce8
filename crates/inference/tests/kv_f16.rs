//! f16 key/value caches (`SeqState::with_kv_dtype(KvDtype::F16)`) against the default f32 ones
//! on the tiny decoders (Llama, Qwen2, Qwen3, Qwen3.5): the same inputs, prompt then 32 decode
//! steps fed the f32 run's greedy tokens, give logits within 1e-2 relative error and the same
//! greedy token wherever f32's top two logits are further apart than the error, with half the
//! cache memory.
//!
//! Why 1e-2: rounding a key or value to f16 moves it by at most 2^-11 ≈ 4.9e-4 of itself, so
//! a score `q·k` moves by at most 4.9e-4 · Σ|q_d k_d| and an attention output (a convex
//! combination of value rows) by about as much of the values' size, per attention layer. The
//! decoders have 2 to 6 attention layers, and the residual stream and norms pass such errors
//! on about unchanged, so the logits should move by a few 1e-3 of their size; 1e-2 leaves a
//! margin without letting a wrong row or dtype mix-up (errors of order 1) through. Exactness
//! of the f16 kernels themselves (bit for bit the f32 kernels on the widened rows) is tested in
//! `backend::cpu::attn`.

mod common;

use common::{argmax, fixture, read_json, rel_err, u32s};
use lattice_inference::model::decoder::{load_decoder, Decoder, Outputs};
use lattice_inference::model::source::WeightMode;
use lattice_inference::state::{KvDtype, SeqState};

const TOL: f64 = 1e-2;

fn step(m: &dyn Decoder, ids: &[u32], s: &mut SeqState) -> Vec<f32> {
    m.forward(ids, &[ids.len()], &mut [s], Outputs::LastLogits)
        .unwrap()
}

/// The gap between the two largest logits.
fn top_gap(x: &[f32]) -> f32 {
    let a = argmax(x) as usize;
    let second = x
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != a)
        .map(|(_, &v)| v)
        .fold(f32::MIN, f32::max);
    x[a] - second
}

#[test]
fn f16_cache_tracks_f32_cache() {
    for name in ["tiny-qwen3", "tiny-llama", "tiny-qwen2", "tiny-qwen35"] {
        let m = load_decoder(&fixture(name), WeightMode::F32).unwrap();
        let r = read_json(&fixture(name).join("reference.json"));
        let mut worst = 0.0f64;
        let mut steps = 0;
        for p in r["prompts"].as_array().unwrap().iter().take(3) {
            let ids = u32s(&p["ids"]);
            let mut s32 = m.new_cache(4096);
            let mut s16 = m.new_cache(4096).with_kv_dtype(KvDtype::F16);
            assert_eq!(s16.kv_dtype(), KvDtype::F16);
            let (mut a, mut b) = (step(&*m, &ids, &mut s32), step(&*m, &ids, &mut s16));
            for _ in 0..32 {
                let err = rel_err(&b, &a);
                assert!(err < TOL, "{name} {}: relative error {err:e}", p["name"]);
                let (ta, tb) = (argmax(&a), argmax(&b));
                let bound = (TOL * a.iter().map(|x| x.abs() as f64).fold(0.0, f64::max)) as f32;
                assert!(
                    ta == tb || top_gap(&a) <= 2.0 * bound,
                    "{name} {}: greedy {ta} vs {tb} with a clear top logit",
                    p["name"]
                );
                worst = worst.max(err);
                steps += 1;
                a = step(&*m, &[ta], &mut s32);
                b = step(&*m, &[ta], &mut s16);
            }
            let (m32, m16) = (s32.memory_bytes(), s16.memory_bytes());
            assert!(m16 < m32, "{name}: f16 cache {m16} bytes, f32 {m32}");
        }
        eprintln!("{name}: {steps} steps, worst relative logit error f16 vs f32 KV {worst:.2e}");
    }
}
