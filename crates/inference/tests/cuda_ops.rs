//! CUDA op parity (feature `cuda`), in the manner of ggml's test-backend-ops: every op the CUDA
//! backend runs, through the same public seam models use (tensors, ops, `attend_tensors`,
//! device KV pages), against the CPU backend on random inputs of awkward shapes, by normalized
//! error ‖gpu − cpu‖ / ‖cpu‖. Without a GPU each test prints `SKIPPED` and why; the kernel source
//! is still compiled with NVRTC when the library can be loaded.
#![cfg(feature = "cuda")]

mod common;

use common::{gpu, Rng};
use lattice_inference::attention::{attend_qkv, attend_tensors, CausalShape, QkvHeads};
use lattice_inference::backend::cpu::bf16::round_to_bf16;
use lattice_inference::backend::cuda::compile_kernels;
use lattice_inference::backend::Device;
use lattice_inference::io::store::Weight;
use lattice_inference::ops;
use lattice_inference::ops::{swiglu, Linear, QuantMatrix, RmsNorm, Rope, RopeConfig, RopeScaling};
use lattice_inference::quant::{quantize_row, QuantType};
use lattice_inference::sample::{Filters, Pick, Picked};
use lattice_inference::state::{KvDtype, LayerKind, SeqState};
use lattice_inference::tensor::Tensor;

/// `w` rounded to bf16 and widened back: the f32 weights a bf16 matrix holds.
fn bf16_values(w: &[f32]) -> Vec<f32> {
    w.iter()
        .map(|&v| f32::from_bits(u32::from(round_to_bf16(v)) << 16))
        .collect()
}

fn nerr(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    assert!(got.iter().all(|x| x.is_finite()), "non-finite output");
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| ((a - b) as f64).powi(2))
        .sum();
    let den: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

/// A layer of weights `w` [n, k] on the CPU and on `dev` (bf16 there when `bf16`): bf16 weights
/// on the GPU multiply f32 activations, so the CPU's f32 product of the same (rounded) weights
/// is the reference.
fn linear_pair(
    dev: &Device,
    w: &[f32],
    n: usize,
    k: usize,
    bias: Option<Vec<f32>>,
    bf16: bool,
) -> (Linear, Linear) {
    if bf16 {
        (
            Linear::from_f32(&bf16_values(w), n, k, bias.clone()).unwrap(),
            Linear::from_bf16_on(dev, w, n, k, bias).unwrap(),
        )
    } else {
        (
            Linear::from_f32(w, n, k, bias.clone()).unwrap(),
            Linear::from_f32_on(dev, w, n, k, bias).unwrap(),
        )
    }
}

fn pair(dev: &Device, rows: usize, cols: usize, data: Vec<f32>) -> (Tensor, Tensor) {
    (
        Tensor::cpu(rows, cols, data.clone()),
        Tensor::from_host(dev, rows, cols, data).unwrap(),
    )
}

fn check(name: &str, got: &Tensor, want: &Tensor, tol: f64) {
    let (g, w) = (got.to_host().unwrap(), want.to_host().unwrap());
    let e = nerr(&g, &w);
    eprintln!("{name}: normalized error {e:.2e}");
    assert!(
        e < tol,
        "{name}: normalized error {e:e} (tolerance {tol:e})"
    );
}

/// The kernels compile for Hopper and for the older architectures' paths (int8 tensor-core
/// products from 8.0, dp4a before), and, where `LATTICE_PTXAS` names a ptxas (scripts/test.sh
/// fetches one), the PTX assembles for those GPUs, with no register spills in the quantized
/// products and the token picks: what a GPU would otherwise only report when it loads the
/// module.
#[test]
fn kernels_compile_with_nvrtc() {
    let ptxas = std::env::var("LATTICE_PTXAS")
        .ok()
        .filter(|p| std::path::Path::new(p).is_file());
    for cc in [(9, 0), (8, 0), (7, 5)] {
        let ptx = match compile_kernels(cc) {
            Ok(ptx) => ptx,
            Err(e) if e.to_string().contains("could not be loaded") => {
                eprintln!("SKIPPED kernels_compile_with_nvrtc: {e}");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        eprintln!("kernels.cu compiled for compute_{}{}", cc.0, cc.1);
        let Some(ptxas) = &ptxas else {
            eprintln!("kernels_compile_with_nvrtc: ptxas check SKIPPED (LATTICE_PTXAS not set)");
            continue;
        };
        let dir = std::env::temp_dir().join(format!("lattice-ptx-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join(format!("k{}{}.ptx", cc.0, cc.1));
        std::fs::write(&src, ptx.to_src()).unwrap();
        let out = std::process::Command::new(ptxas)
            .arg(format!("-arch=sm_{}{}", cc.0, cc.1))
            .arg("-v")
            .arg(&src)
            .arg("-o")
            .arg(dir.join("k.cubin"))
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "ptxas sm_{}{}: {log}", cc.0, cc.1);
        // The log names each entry, then its stack frame and spills.
        let mut entry = "";
        for line in log.lines() {
            if let Some(at) = line.find("entry function '") {
                entry = &line[at + 16..];
            } else if line.contains("spill stores")
                && (entry.starts_with("gemv_q")
                    || entry.starts_with("gemm_q")
                    || entry.starts_with("pick_rows"))
            {
                assert!(
                    line.contains(" 0 bytes spill stores"),
                    "sm_{}{} {entry} {line}",
                    cc.0,
                    cc.1
                );
            }
        }
        eprintln!("kernels.cu assembled for sm_{}{} by ptxas", cc.0, cc.1);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn norms_rope_activations_and_layout_ops() {
    let Some(dev) = gpu("norms_rope_activations_and_layout_ops") else {
        return;
    };
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for &(rows, dim) in &[(1, 64), (7, 1000), (33, 4096), (5, 67)] {
        let w = Weight::from_vec(rng.vec(dim, 1.0), vec![dim]);
        let norm = RmsNorm::new(w, 1e-6);
        let (mut c, mut g) = pair(&dev, rows, dim, rng.vec(rows * dim, 3.0));
        norm.apply(&mut c).unwrap();
        norm.apply(&mut g).unwrap();
        check(&format!("rms_norm {rows}x{dim}"), &g, &c, 1e-6);

        let (c, g) = pair(&dev, rows, 2 * dim, rng.vec(rows * 2 * dim, 6.0));
        check(
            &format!("swiglu {rows}x{dim}"),
            &swiglu(&g).unwrap(),
            &swiglu(&c).unwrap(),
            1e-6,
        );
        let (c, g) = pair(&dev, rows, dim, rng.vec(rows * dim, 1.0));
        let idx: Vec<usize> = (0..rows).rev().chain([0]).collect();
        check(
            "gather_rows",
            &g.gather_rows(&idx).unwrap(),
            &c.gather_rows(&idx).unwrap(),
            0.0 + f64::MIN_POSITIVE,
        );
        let w3 = dim / 3;
        let [a, b, cc] = g.split_columns([w3, dim - 2 * w3, w3]).unwrap();
        let [a2, b2, c2] = c.split_columns([w3, dim - 2 * w3, w3]).unwrap();
        for (x, y) in [(a, a2), (b, b2), (cc, c2)] {
            assert_eq!(x.to_host().unwrap(), y.to_host().unwrap(), "split_columns");
        }
    }
    for (n_heads, hd, partial, scaling) in [
        (3, 10, 1.0, RopeScaling::None),
        (16, 128, 1.0, RopeScaling::Linear { factor: 4.0 }),
        (8, 256, 0.25, RopeScaling::None),
        (
            4,
            64,
            1.0,
            RopeScaling::Yarn {
                factor: 4.0,
                original_max_position_embeddings: 4096,
                beta_fast: 32.0,
                beta_slow: 1.0,
                attention_factor: None,
                mscale: None,
                mscale_all_dim: None,
                truncate: true,
            },
        ),
    ] {
        let cfg = RopeConfig {
            theta: 1_000_000.0,
            rotary_dim: ((hd as f32 * partial) as usize) & !1,
            scaling,
        };
        let rope = Rope::new(&cfg, hd).unwrap();
        let positions: Vec<usize> = vec![0, 1, 17, 4095, 31_000, 100_000, 7];
        let rows = positions.len();
        let (mut c, mut g) = pair(&dev, rows, n_heads * hd, rng.vec(rows * n_heads * hd, 2.0));
        rope.rotate(&mut c, n_heads, &positions).unwrap();
        rope.rotate(&mut g, n_heads, &positions).unwrap();
        check(
            &format!("rope {n_heads}x{hd} partial {partial}"),
            &g,
            &c,
            1e-5,
        );
    }
}

#[test]
fn linear_f32_and_bf16_match_the_cpu() {
    let Some(dev) = gpu("linear_f32_and_bf16_match_the_cpu") else {
        return;
    };
    let mut rng = Rng(0xfeed_beef_1234_5678);
    // (1, 9001, 1024) and (2, 40000, 256): the matrix-vector kernel with several columns per
    // warp, an odd last one; 40000 outputs as an LM head takes it. (1, 6144, 1024), (2, 5000,
    // 1000), (1, 1024, 3072), (1, 20000, 2048): a decode layer's gate/up and down shapes, up
    // to 3 columns a warp on 132 SMs, a lane's last chunk short, two passes over a row.
    for &(m, n, k) in &[
        (1, 67, 64),
        (5, 1000, 130),
        (33, 3072, 1024),
        (128, 151, 896),
        (1, 9001, 1024),
        (2, 40000, 256),
        (1, 6144, 1024),
        (2, 5000, 1000),
        (1, 1024, 3072),
        (1, 20000, 2048),
    ] {
        let w = rng.vec(n * k, 0.05);
        let bias = Some(rng.vec(n, 0.1));
        let x = rng.vec(m * k, 1.0);
        let res = rng.vec(m * n, 1.0);
        for bf16 in [false, true] {
            let (cpu_l, gpu_l) = linear_pair(&dev, &w, n, k, bias.clone(), bf16);
            let tol = if bf16 { 1e-5 } else { 1e-6 };
            let (xc, xg) = pair(&dev, m, k, x.clone());
            let tag = format!("linear {m}x{n}x{k} bf16={bf16}");
            check(
                &tag,
                &gpu_l.apply(&xg).unwrap(),
                &cpu_l.apply(&xc).unwrap(),
                tol,
            );
            let (rc, rg) = pair(&dev, m, n, res.clone());
            check(
                &format!("{tag} +residual"),
                &gpu_l.apply_residual(&xg, rg).unwrap(),
                &cpu_l.apply_residual(&xc, rc).unwrap(),
                tol,
            );
            check(
                &format!("{tag} gelu"),
                &gpu_l.apply_gelu(&xg).unwrap(),
                &cpu_l.apply_gelu(&xc).unwrap(),
                tol,
            );
        }
    }
}

/// One attention call of `lens` new rows per sequence (q, k, v for all rows) on the CPU and the
/// GPU states, compared by normalized error.
#[allow(clippy::too_many_arguments)]
fn check_attention(
    dev: &Device,
    cpu: &mut [SeqState],
    gpu: &mut [SeqState],
    lens: &[usize],
    (q, k, v): (&[f32], &[f32], &[f32]),
    layer: usize,
    shape: &CausalShape,
    tag: &str,
) {
    let rows: usize = lens.iter().sum();
    let (q_dim, kv_dim) = (
        shape.n_heads * shape.head_dim,
        shape.n_kv_heads * shape.head_dim,
    );
    let scale = 1.0 / (shape.head_dim as f32).sqrt();
    let (qc, qg) = pair(dev, rows, q_dim, q.to_vec());
    let (kc, kg) = pair(dev, rows, kv_dim, k.to_vec());
    let (vc, vg) = pair(dev, rows, kv_dim, v.to_vec());
    let mut cs: Vec<&mut SeqState> = cpu.iter_mut().collect();
    let mut gs: Vec<&mut SeqState> = gpu.iter_mut().collect();
    let want = attend_tensors(&qc, &kc, &vc, lens, &mut cs, layer, shape, scale).unwrap();
    let got = attend_tensors(&qg, &kg, &vg, lens, &mut gs, layer, shape, scale).unwrap();
    check(tag, &got, &want, 1e-5);
}

/// Commits `lens` new rows to each state.
fn commit_all(states: &mut [SeqState], lens: &[usize]) {
    for (s, &n) in states.iter_mut().zip(lens) {
        s.commit(n);
    }
}

/// Prefill then decode steps of several sequences at once, against the CPU on states of the
/// same layout: shapes of real models and awkward ones, windows, f16 pages, shared prefixes.
#[test]
fn paged_attention_matches_the_cpu() {
    let Some(dev) = gpu("paged_attention_matches_the_cpu") else {
        return;
    };
    let mut rng = Rng(0x0bad_cafe_f00d_d00d);
    let cases: &[(usize, usize, usize, Option<usize>, KvDtype)] = &[
        (16, 8, 128, None, KvDtype::F32),
        (8, 2, 256, None, KvDtype::F32),
        (4, 4, 16, Some(5), KvDtype::F32),
        (6, 2, 80, None, KvDtype::F16),
        (14, 2, 64, Some(40), KvDtype::F16),
    ];
    for &(n_heads, n_kv_heads, hd, window, dtype) in cases {
        let shape = CausalShape {
            n_heads,
            n_kv_heads,
            head_dim: hd,
            sliding_window: window,
        };
        let (q_dim, kv_dim) = (n_heads * hd, n_kv_heads * hd);
        let kinds = [LayerKind::Attention, LayerKind::Attention];
        let new =
            |d: &Device| SeqState::with_layers_on(d, &kinds, kv_dim, 4096).with_kv_dtype(dtype);
        let mut cpu_states: Vec<SeqState> = (0..3).map(|_| new(&Device::Cpu)).collect();
        let mut gpu_states: Vec<SeqState> = (0..3).map(|_| new(&dev)).collect();
        let scale = 1.0 / (hd as f32).sqrt();
        // Prefill of 1, 45 and 600 rows, then six decode steps of all three (the decode
        // kernel splits 600 keys over its warps in several rounds).
        let steps: Vec<Vec<usize>> = std::iter::once(vec![1, 45, 600])
            .chain(std::iter::repeat_n(vec![1, 1, 1], 6))
            .collect();
        for (step, lens) in steps.iter().enumerate() {
            let rows: usize = lens.iter().sum();
            let q = rng.vec(rows * q_dim, 1.5);
            let k = rng.vec(rows * kv_dim, 1.5);
            let v = rng.vec(rows * kv_dim, 1.0);
            for layer in 0..2 {
                check_attention(
                    &dev,
                    &mut cpu_states,
                    &mut gpu_states,
                    lens,
                    (&q, &k, &v),
                    layer,
                    &shape,
                    &format!("attention {n_heads}/{n_kv_heads}x{hd} {window:?} {dtype:?} step {step} layer {layer}"),
                );
            }
            commit_all(&mut cpu_states, lens);
            commit_all(&mut gpu_states, lens);
        }
        // A fork shares the prefix pages (copy on write) and diverges.
        let forked = gpu_states[2].fork(60).unwrap();
        let cpu_fork = cpu_states[2].fork(60).unwrap();
        let (mut fg, mut fc) = (forked, cpu_fork);
        let q = rng.vec(3 * q_dim, 1.5);
        let k = rng.vec(3 * kv_dim, 1.5);
        let v = rng.vec(3 * kv_dim, 1.0);
        for layer in 0..2 {
            let (qc, qg) = pair(&dev, 3, q_dim, q.clone());
            let (kc, kg) = pair(&dev, 3, kv_dim, k.clone());
            let (vc, vg) = pair(&dev, 3, kv_dim, v.clone());
            let want =
                attend_tensors(&qc, &kc, &vc, &[3], &mut [&mut fc], layer, &shape, scale).unwrap();
            let got =
                attend_tensors(&qg, &kg, &vg, &[3], &mut [&mut fg], layer, &shape, scale).unwrap();
            check("attention after fork", &got, &want, 1e-5);
        }
    }
}

/// The fused paths decode steps take on a GPU (RMSNorm into the product, SwiGLU into the down
/// product, split + head norms + RoPE + KV write in one kernel for a prompt, inside decode
/// attention for a decode step) against the separate CPU ops.
#[test]
fn fused_products_and_qkv_preparation_match_the_cpu() {
    let Some(dev) = gpu("fused_products_and_qkv_preparation_match_the_cpu") else {
        return;
    };
    let mut rng = Rng(0x5eed_0fca_fe00_0001);
    for &(m, n, k) in &[(1, 3072, 1024), (3, 1000, 2048), (8, 1024, 3072)] {
        for bf16 in [false, true] {
            let (lc, lg) = linear_pair(&dev, &rng.vec(n * k, 0.05), n, k, None, bf16);
            let norm = RmsNorm::new(Weight::from_vec(rng.vec(k, 1.0), vec![k]), 1e-6);
            let (xc, xg) = pair(&dev, m, k, rng.vec(m * k, 2.0));
            let tag = format!("{m}x{n}x{k} bf16={bf16}");
            check(
                &format!("normed product {tag}"),
                &lg.apply_normed(&xg, &norm).unwrap(),
                &lc.apply_normed(&xc, &norm).unwrap(),
                1e-5,
            );
            let (gc, gg) = pair(&dev, m, 2 * k, rng.vec(m * 2 * k, 3.0));
            let (rc, rg) = pair(&dev, m, n, rng.vec(m * n, 1.0));
            check(
                &format!("swiglu product {tag}"),
                &lg.apply_swiglu_residual(&gg, rg).unwrap(),
                &lc.apply_swiglu_residual(&gc, rc).unwrap(),
                1e-5,
            );
        }
    }
    // A prompt long enough that the decode kernel's splits span more than 128 keys (the
    // current key beyond the staged rows), then decode steps that read the rows earlier steps
    // wrote.
    let steps = [vec![1300usize, 5], vec![1, 1], vec![1, 1], vec![1, 1]];
    for case in [
        (16, 8, 128, 128, true, KvDtype::F32),
        (14, 2, 64, 64, false, KvDtype::F16),
    ] {
        check_attend_qkv(&dev, &mut rng, case, &steps, 4096);
    }
}

/// The heads of an [`attend_qkv`] case: (query heads, KV heads, head size, rotary dimensions,
/// per-head norms, page type).
type HeadsCase = (usize, usize, usize, usize, bool, KvDtype);

/// [`attend_qkv`] (per-head norms and RoPE of a layer's fused Q/K/V rows, the new keys and
/// values into the pages, attention) on the GPU against the CPU, over passes of `steps` rows
/// per sequence (one state per sequence, as long as the first step names).
fn check_attend_qkv(
    dev: &Device,
    rng: &mut Rng,
    case: HeadsCase,
    steps: &[Vec<usize>],
    max_len: usize,
) {
    let (n_heads, n_kv_heads, hd, rotary_dim, with_norms, dtype) = case;
    let shape = CausalShape {
        n_heads,
        n_kv_heads,
        head_dim: hd,
        sliding_window: None,
    };
    let width = (n_heads + 2 * n_kv_heads) * hd;
    let kv_dim = n_kv_heads * hd;
    let rope = Rope::new(
        &RopeConfig {
            theta: 1_000_000.0,
            rotary_dim,
            scaling: RopeScaling::None,
        },
        hd,
    )
    .unwrap();
    let qn = RmsNorm::new(Weight::from_vec(rng.vec(hd, 1.0), vec![hd]), 1e-6);
    let kn = RmsNorm::new(Weight::from_vec(rng.vec(hd, 1.0), vec![hd]), 1e-6);
    let kinds = [LayerKind::Attention];
    let new =
        |d: &Device| SeqState::with_layers_on(d, &kinds, kv_dim, max_len).with_kv_dtype(dtype);
    let seqs = steps[0].len();
    let mut cpu: Vec<SeqState> = (0..seqs).map(|_| new(&Device::Cpu)).collect();
    let mut gpu: Vec<SeqState> = (0..seqs).map(|_| new(dev)).collect();
    let scale = 1.0 / (hd as f32).sqrt();
    for (step, lens) in steps.iter().enumerate() {
        let rows: usize = lens.iter().sum();
        let positions: Vec<usize> = (cpu.iter().zip(lens))
            .flat_map(|(s, &n)| s.len()..s.len() + n)
            .collect();
        let heads = QkvHeads {
            norms: with_norms.then_some((&qn, &kn)),
            rope: &rope,
            positions: &positions,
            positions_3d: None,
        };
        let (xc, xg) = pair(dev, rows, width, rng.vec(rows * width, 1.5));
        let run = |x: &Tensor, states: &mut [SeqState]| {
            let mut refs: Vec<&mut SeqState> = states.iter_mut().collect();
            attend_qkv(x, &heads, lens, &mut refs, 0, &shape, scale).unwrap()
        };
        let want = run(&xc, &mut cpu);
        let got = run(&xg, &mut gpu);
        check(
            &format!(
                "attend_qkv {seqs} sequences {n_heads}/{n_kv_heads}x{hd} rotary {rotary_dim} norms={with_norms} {dtype:?} step {step}"
            ),
            &got,
            &want,
            1e-5,
        );
        commit_all(&mut cpu, lens);
        commit_all(&mut gpu, lens);
    }
}

/// Decode steps from fused Q/K/V rows (`qkv_prep`, then decode attention in its one-head and
/// many-heads entries) of many sequences and of one with its keys split over blocks, against
/// the CPU; partial rotary, f16 pages, heads of 32 to 256.
#[test]
fn qkv_decode_steps_match_the_cpu() {
    let Some(dev) = gpu("qkv_decode_steps_match_the_cpu") else {
        return;
    };
    let mut rng = Rng(0x6675_7365_6444_6563);
    let prompt: Vec<usize> = (0..72).map(|i| 1 + (i * 37) % 200).collect();
    let steps: Vec<Vec<usize>> = std::iter::once(prompt)
        .chain(std::iter::repeat_n(vec![1; 72], 3))
        .collect();
    for case in [
        (16, 8, 128, 128, true, KvDtype::F32),
        (8, 2, 256, 64, false, KvDtype::F16),
        (14, 2, 80, 80, true, KvDtype::F32),
        (6, 6, 32, 32, true, KvDtype::F16),
    ] {
        check_attend_qkv(&dev, &mut rng, case, &steps, 512);
        // One sequence: a block per query head, the keys split over blocks.
        let one = [vec![700usize], vec![1], vec![1]];
        check_attend_qkv(&dev, &mut rng, case, &one, 1024);
    }
}

/// Decode steps of many sequences at once (more (row, head) blocks than two per SM, so the
/// decode kernel's entries with three blocks resident per SM run), against the CPU.
#[test]
fn decode_attention_of_many_sequences_matches_the_cpu() {
    let Some(dev) = gpu("decode_attention_of_many_sequences_matches_the_cpu") else {
        return;
    };
    let mut rng = Rng(0x6d61_6e79_5345_5153);
    // Query heads per KV head: 2 and 4 (two per block), 7 (the last block of a group holds
    // one), and 1 (a block per head).
    for (n_heads, n_kv_heads, hd, dtype) in [
        (16, 8, 128, KvDtype::F32),
        (8, 2, 256, KvDtype::F16),
        (14, 2, 64, KvDtype::F32),
        (6, 6, 32, KvDtype::F16),
    ] {
        let shape = CausalShape {
            n_heads,
            n_kv_heads,
            head_dim: hd,
            sliding_window: None,
        };
        let (q_dim, kv_dim) = (n_heads * hd, n_kv_heads * hd);
        let kinds = [LayerKind::Attention];
        let new =
            |d: &Device| SeqState::with_layers_on(d, &kinds, kv_dim, 512).with_kv_dtype(dtype);
        let seqs = 72;
        let mut cpu_states: Vec<SeqState> = (0..seqs).map(|_| new(&Device::Cpu)).collect();
        let mut gpu_states: Vec<SeqState> = (0..seqs).map(|_| new(&dev)).collect();
        // Prompts of 1 to 200 rows, then three decode steps of all of them.
        let prompt: Vec<usize> = (0..seqs).map(|i| 1 + (i * 37) % 200).collect();
        let steps: Vec<Vec<usize>> = std::iter::once(prompt)
            .chain(std::iter::repeat_n(vec![1; seqs], 3))
            .collect();
        for (step, lens) in steps.iter().enumerate() {
            let rows: usize = lens.iter().sum();
            check_attention(
                &dev,
                &mut cpu_states,
                &mut gpu_states,
                lens,
                (
                    &rng.vec(rows * q_dim, 1.5),
                    &rng.vec(rows * kv_dim, 1.5),
                    &rng.vec(rows * kv_dim, 1.0),
                ),
                0,
                &shape,
                &format!("attention of {seqs} sequences {n_heads}/{n_kv_heads}x{hd} {dtype:?} step {step}"),
            );
            commit_all(&mut cpu_states, lens);
            commit_all(&mut gpu_states, lens);
        }
    }
}

/// A matrix in GGUF blocks of type `t`, as a GGUF file holds it: random values quantized where
/// the crate has a quantizer (Q4_0, Q4_1, Q8_0, F16), else random code bytes with random f16
/// scales of both signs (Q5_0, Q4_K, Q6_K).
fn quant_matrix(rng: &mut Rng, t: QuantType, n: usize, k: usize) -> QuantMatrix {
    let w = rng.vec(n * k, 0.05);
    let rb = t.row_bytes(k).unwrap();
    let mut bytes = vec![0u8; n * rb];
    for (src, dst) in w.chunks_exact(k).zip(bytes.chunks_exact_mut(rb)) {
        if quantize_row(t, src, dst).is_err() {
            for b in dst.iter_mut() {
                *b = ((rng.next() + 1.0) * 128.0) as u8;
            }
            let scales: &[usize] = match t {
                QuantType::Q4_K => &[0, 2],
                QuantType::Q6_K => &[208],
                _ => &[0],
            };
            for blk in dst.chunks_exact_mut(t.block_bytes()) {
                for &o in scales {
                    let v = half::f16::from_f32(rng.next() * 0.004);
                    blk[o..o + 2].copy_from_slice(&v.to_bits().to_le_bytes());
                }
            }
        }
    }
    QuantMatrix::new(t, n, k, &bytes).unwrap()
}

/// `parts` placed on the GPU and on the CPU, checked on m rows of k: plain, with a residual,
/// with a fused RMSNorm and with a fused SwiGLU. Plain products quantize the same activations,
/// so they differ only in the order of the f32 block terms. With a fused RMSNorm or SwiGLU the
/// two devices compute the row's factor (a sum of squares, `expf`) in their own order, and an
/// activation one ulp apart can round to the next code: one such code moves the normalized
/// error by about d / (|x| sqrt(m k)) ~ 0.02 / sqrt(m k) (d = a unit's largest value / 127),
/// so those checks allow about two of them, while a wrong scale, row or unit is off by far more.
fn check_quant_products(dev: &Device, rng: &mut Rng, tag: &str, parts: Vec<QuantMatrix>, m: usize) {
    let k = parts[0].k();
    let n: usize = parts.iter().map(QuantMatrix::n_rows).sum();
    let bias = Some(rng.vec(n, 0.1));
    let lc = Linear::from_quant(parts.clone(), bias.clone()).unwrap();
    let lg = Linear::from_quant_on(dev, parts, bias).unwrap();
    let tag = format!("{tag} {m}x{n}x{k}");
    // A zero super-block and an outlier, as real activations have.
    let mut x = rng.vec(m * k, 1.0);
    x[..256.min(k)].fill(0.0);
    x[m * k - 7] = 40.0;
    let (xc, xg) = pair(dev, m, k, x);
    let code_flips = (0.05 / ((m * k) as f64).sqrt()).max(1e-4);
    check(&tag, &lg.apply(&xg).unwrap(), &lc.apply(&xc).unwrap(), 1e-6);
    let (rc, rg) = pair(dev, m, n, rng.vec(m * n, 1.0));
    check(
        &format!("{tag} +residual"),
        &lg.apply_residual(&xg, rg).unwrap(),
        &lc.apply_residual(&xc, rc).unwrap(),
        1e-6,
    );
    let norm = RmsNorm::new(Weight::from_vec(rng.vec(k, 1.0), vec![k]), 1e-6);
    check(
        &format!("{tag} normed"),
        &lg.apply_normed(&xg, &norm).unwrap(),
        &lc.apply_normed(&xc, &norm).unwrap(),
        code_flips,
    );
    let (gc, gg) = pair(dev, m, 2 * k, rng.vec(m * 2 * k, 3.0));
    let (rc, rg) = pair(dev, m, n, rng.vec(m * n, 1.0));
    check(
        &format!("{tag} swiglu"),
        &lg.apply_swiglu_residual(&gg, rg).unwrap(),
        &lc.apply_swiglu_residual(&gc, rc).unwrap(),
        code_flips,
    );
}

/// GGUF Q8_0 products (the matrix-vector kernel up to 8 rows, the tiled one beyond) against
/// the CPU's integer products of the same blocks (both quantize the activations per block of
/// 32 the same way; see `check_quant_products` for the tolerances).
#[test]
fn q8_0_products_match_the_cpu() {
    let Some(dev) = gpu("q8_0_products_match_the_cpu") else {
        return;
    };
    let mut rng = Rng(0x0a8b_0c0d_1e2f_3a4b);
    for &(m, n, k) in &[
        (1, 67, 64),
        (2, 1000, 160),
        (4, 3072, 1024),
        (5, 1000, 2048),
        (33, 896, 4864),
        (64, 1024, 3072),
        (130, 151, 896),
    ] {
        let q = quant_matrix(&mut rng, QuantType::Q8_0, n, k);
        check_quant_products(&dev, &mut rng, "q8_0", vec![q], m);
    }
}

/// The other block types (Q4_0, Q4_1, Q5_0, Q4_K, Q6_K) and a matrix fused from parts of
/// different types (as a Q4_K_M file's q/k/v), against the CPU's integer products with the
/// activations quantized as the CPU does for each type (Q8_0, Q8_1, Q8_K); a part mixing float
/// and quantized tensors is refused, naming the types.
#[test]
fn gguf_block_products_match_the_cpu() {
    let Some(dev) = gpu("gguf_block_products_match_the_cpu") else {
        return;
    };
    let mut rng = Rng(0x4b0c_6d5e_0f1a_2b3c);
    let types = [
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q5_0,
        QuantType::Q4_K,
        QuantType::Q6_K,
    ];
    for t in types {
        for &(m, n, k) in &[
            (1, 67, 256),
            (2, 1000, 768),
            (8, 3072, 1024),
            (9, 200, 2048),
            (64, 1024, 3072),
            (130, 151, 512),
        ] {
            let q = quant_matrix(&mut rng, t, n, k);
            check_quant_products(&dev, &mut rng, t.name(), vec![q], m);
        }
    }
    for m in [1, 5, 40] {
        let parts = vec![
            quant_matrix(&mut rng, QuantType::Q4_K, 100, 512),
            quant_matrix(&mut rng, QuantType::Q6_K, 36, 512),
            quant_matrix(&mut rng, QuantType::Q8_0, 20, 512),
            quant_matrix(&mut rng, QuantType::Q5_0, 12, 512),
        ];
        check_quant_products(&dev, &mut rng, "q4_K|q6_K|q8_0|q5_0", parts, m);
    }
    let mixed = vec![
        quant_matrix(&mut rng, QuantType::Q4_K, 8, 256),
        quant_matrix(&mut rng, QuantType::F16, 8, 256),
    ];
    let e = Linear::from_quant_on(&dev, mixed, None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("q4_K, f16") && e.contains("all float or all quantized"),
        "{e}"
    );
}

/// Both recurrent layers' windows and matrices of a state, in the device block's order.
fn recurrent_values(state: &mut SeqState, layers: usize) -> Vec<f32> {
    if let Some((block, _, _)) = state.recurrent_block(0) {
        return block.to_host().unwrap();
    }
    (0..layers)
        .flat_map(|l| {
            let (conv, s) = state.recurrent(l);
            conv.iter().chain(s).copied().collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn gated_delta_net_matches_the_cpu() {
    use lattice_inference::attention::gdn::GdnHeads;
    use lattice_inference::attention::GdnLayer;
    use lattice_inference::ops::{sigmoid_gate, split_query_gate};
    let Some(dev) = gpu("gated_delta_net_matches_the_cpu") else {
        return;
    };
    let mut rng = Rng(0x0bad_cafe_f00d_1234);
    // (key heads, value heads, key width, value width, tiled value heads, conv kernel)
    for (nk, nv, dk, dv, v_tiled, kernel) in [
        (2, 4, 16, 24, false, 4),
        (1, 2, 64, 64, true, 3),
        (4, 8, 128, 128, false, 4),
        (2, 6, 100, 40, true, 4),
    ] {
        let heads = GdnHeads {
            n_k_heads: nk,
            n_v_heads: nv,
            k_dim: dk,
            v_dim: dv,
            v_tiled,
        };
        let conv_dim = 2 * nk * dk + nv * dv;
        let kinds = [LayerKind::Recurrent {
            conv: (kernel - 1) * conv_dim,
            recurrent: heads.state_len(),
        }; 2];
        let layers: Vec<GdnLayer> = (0..2)
            .map(|_| {
                let a_log_exp = (0..nv).map(|_| 0.55 + 0.45 * rng.next()).collect();
                GdnLayer::new(
                    heads,
                    kernel,
                    rng.vec(conv_dim * kernel, 0.6),
                    a_log_exp,
                    rng.vec(nv, 1.0),
                )
                .unwrap()
            })
            .collect();
        let norm = RmsNorm::new(Weight::from_vec(rng.vec(dv, 1.0), vec![dv]), 1e-6);
        let proj_dim = layers[0].proj_dim();
        let mut cpu: Vec<SeqState> = (0..3)
            .map(|_| SeqState::with_layers(&kinds, 8, 4096))
            .collect();
        let mut gpu_s: Vec<SeqState> = (0..3)
            .map(|_| SeqState::with_layers_on(&dev, &kinds, 8, 4096))
            .collect();
        let name = format!("gdn nk {nk} nv {nv} dk {dk} dv {dv} kernel {kernel}");
        // A prompt pass (chunked from 17 tokens on both), decode steps, a short pass with an
        // empty sequence, a chunked pass with one, then a fork decoding on its own.
        for (pass, lens) in [
            vec![1, 45, 70],
            vec![1, 1, 1],
            vec![1, 1, 1],
            vec![3, 0, 2],
            vec![20, 0, 1],
        ]
        .into_iter()
        .enumerate()
        {
            let rows: usize = lens.iter().sum();
            let mut c_refs: Vec<&mut SeqState> = cpu.iter_mut().collect();
            let mut g_refs: Vec<&mut SeqState> = gpu_s.iter_mut().collect();
            for (l, layer) in layers.iter().enumerate() {
                let (pc, pg) = pair(&dev, rows, proj_dim, rng.vec(rows * proj_dim, 2.0));
                let mut oc = layer.apply(l, &pc, &lens, &mut c_refs).unwrap();
                let mut og = layer.apply(l, &pg, &lens, &mut g_refs).unwrap();
                check(
                    &format!("{name} pass {pass} layer {l} core"),
                    &og,
                    &oc,
                    2e-5,
                );
                layer.gated_norm(&mut oc, &pc, &norm).unwrap();
                layer.gated_norm(&mut og, &pg, &norm).unwrap();
                check(
                    &format!("{name} pass {pass} layer {l} gated norm"),
                    &og,
                    &oc,
                    2e-5,
                );
            }
            for ((c, g), &n) in cpu.iter_mut().zip(gpu_s.iter_mut()).zip(&lens) {
                c.commit(n);
                g.commit(n);
            }
            for (i, (c, g)) in cpu.iter_mut().zip(gpu_s.iter_mut()).enumerate() {
                let (vc, vg) = (recurrent_values(c, 2), recurrent_values(g, 2));
                let e = nerr(&vg, &vc);
                assert!(e < 2e-5, "{name} pass {pass} state {i}: {e:e}");
            }
        }
        let mut cf = cpu[1].fork(cpu[1].len()).unwrap();
        let mut gf = gpu_s[1].fork(gpu_s[1].len()).unwrap();
        let (pc, pg) = pair(&dev, 1, proj_dim, rng.vec(proj_dim, 2.0));
        let oc = layers[1].apply(1, &pc, &[1], &mut [&mut cf]).unwrap();
        let og = layers[1].apply(1, &pg, &[1], &mut [&mut gf]).unwrap();
        check(&format!("{name} fork"), &og, &oc, 2e-5);
        assert!(
            gpu_s[0].keep_previous().is_err(),
            "GPU states cannot undo a pass"
        );
    }

    // Gated attention's layout ops.
    for (rows, nh, hd, rest) in [(1, 2, 8, 12), (37, 8, 256, 1024), (5, 3, 20, 0)] {
        let width = nh * 2 * hd + rest;
        let (c, g) = pair(&dev, rows, width, rng.vec(rows * width, 3.0));
        let (qc, gc) = split_query_gate(&c, nh, hd).unwrap();
        let (qg, gg) = split_query_gate(&g, nh, hd).unwrap();
        assert_eq!(
            qg.to_host().unwrap(),
            qc.to_host().unwrap(),
            "split_query_gate"
        );
        assert_eq!(
            gg.to_host().unwrap(),
            gc.to_host().unwrap(),
            "split_query_gate"
        );
        let (mut xc, mut xg) = pair(&dev, rows, nh * hd, rng.vec(rows * nh * hd, 3.0));
        sigmoid_gate(&mut xc, &gc).unwrap();
        sigmoid_gate(&mut xg, &gg).unwrap();
        check(&format!("sigmoid_gate {rows}x{}", nh * hd), &xg, &xc, 1e-6);
    }
}

/// Token picks on the device ([`ops::pick_rows`], the sampler's steps in a kernel) are the
/// CPU's ([`Pick::choose`]) token for token, draw flag included: vocabularies of awkward sizes,
/// every filter (top-k below and above the candidates, top-p from 0 to nearly 1, min-p), logit
/// bias with repeated and out-of-range ids, penalties, ties (logits on a coarse grid), NaN,
/// +inf, rows with nothing drawable, and draws at the ends of [0, 1).
#[test]
fn token_picks_match_the_cpu() {
    let Some(dev) = gpu("token_picks_match_the_cpu") else {
        return;
    };
    let mut rng = Rng(0x005e_ed0f_f00d);
    let filters = [
        (1.0f32, 0usize, 1.0f32, 0.0f32),
        (0.7, 0, 0.9, 0.0),
        (1.0, 40, 1.0, 0.0),
        (1.3, 40, 0.8, 0.0),
        (1.0, 0, 0.999, 0.0),
        (0.05, 0, 0.5, 0.0),
        (1.0, 0, 0.0, 0.0),
        (2.0, 1000, 0.95, 0.02),
        (1.0, 0, 1.0, 0.1),
        (0.9, 7, 0.3, 0.0),
        (0.0, 0, 1.0, 0.0),
        (1.0, 1, 1.0, 0.0),
        (1.0, 1 << 20, 0.7, 0.0),
    ];
    for &n in &[1000usize, 32_001, 151_936] {
        let mut data = Vec::new();
        let mut picks = Vec::new();
        for case in 0..48 {
            let (t, k, p, mp) = filters[case % filters.len()];
            let mut row = rng.vec(n, 12.0);
            match case % 8 {
                1 => row.iter_mut().for_each(|x| *x = (*x * 0.5).round()),
                2 => row[n / 3] = 40.0,
                3 => {
                    row[5] = f32::NAN;
                    row[n - 1] = f32::NEG_INFINITY;
                }
                4 if case % 16 == 4 => {
                    row[n / 2] = f32::INFINITY;
                    row[n / 7] = f32::INFINITY;
                }
                5 if case % 16 == 5 => row.iter_mut().for_each(|x| *x = f32::NEG_INFINITY),
                6 => row.iter_mut().for_each(|x| *x = 0.0),
                _ => {}
            }
            let u = match case % 5 {
                0 => 0.0,
                1 => 1.0 - f64::EPSILON,
                _ => ((rng.next() as f64) + 1.0) / 2.0 * 0.999_999,
            };
            let bias = if case % 3 == 1 {
                vec![
                    (3u32, 5.0f32),
                    (3, -1.5),
                    (n as u32 - 2, 30.0),
                    (n as u32 + 9, 1.0),
                ]
            } else {
                Vec::new()
            };
            let (repetition, penalized) = if case % 4 == 2 {
                let ids = [0u32, 7, 99, (n / 2) as u32, n as u32 - 2, n as u32 + 1];
                (
                    1.3,
                    ids.iter()
                        .enumerate()
                        .map(|(j, &id)| (id, 0.25 * j as f32))
                        .collect(),
                )
            } else {
                (1.0, Vec::new())
            };
            picks.push(Pick {
                filters: Filters {
                    temperature: t,
                    top_k: k,
                    top_p: p,
                    min_p: mp,
                },
                u,
                bias,
                repetition,
                penalized,
            });
            data.extend_from_slice(&row);
        }
        let rows = picks.len();
        let want: Vec<Picked> = data
            .chunks_exact(n)
            .zip(&picks)
            .map(|(row, p)| p.choose(row))
            .collect();
        let x = Tensor::from_host(&dev, rows, n, data.clone()).unwrap();
        let got = ops::pick_rows(&x, &picks).unwrap();
        for (r, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g, w, "vocabulary {n}, row {r}: {:?}", picks[r].filters);
        }
        // Again in launches of 1-12 rows: few rows take a cluster of blocks per row (compute
        // capability 9.0), each block over a slice of the row.
        let mut r0 = 0;
        for len in [1usize, 5, 6, 12].iter().cycle() {
            if r0 == rows {
                break;
            }
            let r1 = (r0 + len).min(rows);
            let x = Tensor::from_host(&dev, r1 - r0, n, data[r0 * n..r1 * n].to_vec()).unwrap();
            let got = ops::pick_rows(&x, &picks[r0..r1]).unwrap();
            for (r, (g, w)) in (r0..).zip(got.iter().zip(&want[r0..r1])) {
                assert_eq!(
                    g, w,
                    "vocabulary {n}, row {r} of {}..{r1}: {:?}",
                    r0, picks[r].filters
                );
            }
            r0 = r1;
        }
        let drew = want.iter().filter(|p| p.drew).count();
        eprintln!(
            "pick_rows: vocabulary {n}: {rows} rows equal to the CPU ({drew} drawn), at once and \
             in launches of 1-12 rows"
        );
    }
}

/// LoRA's low-rank updates (each row its own factor pairs): rows with none, one, and several
/// pairs (a mixture, a negative scale), ranks across the kernel's chunk of 16, outputs across
/// its column tiles and a pair starting inside a tile, inputs across two slices of 256, with
/// each input mode of the fused products (as is, RMSNorm, SwiGLU), against the CPU kernel
/// over the transformed rows.
#[test]
fn low_rank_updates_match_the_cpu() {
    use lattice_inference::backend::cpu::{add_low_rank, Delta, Values};
    use lattice_inference::backend::cuda::{Buf, GemvInput, LowRankTerm};
    let Some(Device::Cuda(d)) = gpu("low_rank_updates_match_the_cpu") else {
        return;
    };
    let mut rng = Rng(0x10_4a);
    let (m, in_dim, out_dim, eps) = (7, 300, 2100, 1e-6f32);
    // (rank, first column, outputs)
    let shapes = [(3, 0, 2100), (40, 1000, 900), (8, 5, 17)];
    let host: Vec<(Vec<f32>, Vec<f32>)> = shapes
        .iter()
        .map(|&(r, _, n)| (rng.vec(r * in_dim, 0.2), rng.vec(r * n, 0.2)))
        .collect();
    let devs: Vec<(Buf, Buf)> = host
        .iter()
        .map(|(a, bt)| (d.upload(a).unwrap().into(), d.upload(bt).unwrap().into()))
        .collect();
    let picks: [&[(usize, f32)]; 7] = [
        &[],
        &[(0, 1.0)],
        &[(1, 0.5)],
        &[(0, 0.7), (1, -0.4), (2, 2.0)],
        &[(2, 1.0), (2, 1.0)],
        &[],
        &[(1, 1.0), (0, 1.0)],
    ];
    let cpu_rows: Vec<Vec<Delta>> = picks
        .iter()
        .map(|row| {
            row.iter()
                .map(|&(i, scale)| Delta {
                    a: Values::F32(&host[i].0),
                    bt: Values::F32(&host[i].1),
                    rank: shapes[i].0,
                    col: shapes[i].1,
                    scale,
                })
                .collect()
        })
        .collect();
    let gpu_rows: Vec<Vec<LowRankTerm>> = picks
        .iter()
        .map(|row| {
            row.iter()
                .map(|&(i, scale)| LowRankTerm {
                    a: &devs[i].0,
                    bt: &devs[i].1,
                    rank: shapes[i].0,
                    col: shapes[i].1,
                    scale,
                })
                .collect()
        })
        .collect();
    let y0 = rng.vec(m * out_dim, 1.0);
    let norm_w = rng.vec(in_dim, 1.0);
    let norm_dev: Buf = d.upload(&norm_w).unwrap().into();
    let delta = |v: &[f32]| -> Vec<f32> { v.iter().zip(&y0).map(|(a, b)| a - b).collect() };
    for mode in ["plain", "normed", "swiglu"] {
        // The rows the kernel is given, and the product's input they stand for.
        let (x, v, input) = match mode {
            "swiglu" => {
                let x = rng.vec(m * 2 * in_dim, 2.0);
                let v: Vec<f32> = x
                    .chunks_exact(2 * in_dim)
                    .flat_map(|r| {
                        let (g, u) = r.split_at(in_dim);
                        g.iter()
                            .zip(u)
                            .map(|(&g, &u)| g / (1.0 + (-g).exp()) * u)
                            .collect::<Vec<_>>()
                    })
                    .collect();
                (x, v, GemvInput::Swiglu)
            }
            "normed" => {
                let x = rng.vec(m * in_dim, 3.0);
                let v: Vec<f32> = x
                    .chunks_exact(in_dim)
                    .flat_map(|r| {
                        let ss: f32 = r.iter().map(|a| a * a).sum();
                        let inv = 1.0 / (ss / in_dim as f32 + eps).sqrt();
                        r.iter()
                            .zip(&norm_w)
                            .map(|(&a, &w)| w * (a * inv))
                            .collect::<Vec<_>>()
                    })
                    .collect();
                (x, v, GemvInput::Normed(&norm_dev, eps))
            }
            _ => {
                let x = rng.vec(m * in_dim, 1.0);
                (x.clone(), x, GemvInput::Plain)
            }
        };
        let mut want = y0.clone();
        add_low_rank(&v, in_dim, &mut want, out_dim, &cpu_rows);
        let xd: Buf = d.upload(&x).unwrap().into();
        let mut yd: Buf = d.upload(&y0).unwrap().into();
        // Twice with other picks in between: the step input of the same key takes new lists.
        let none: Vec<Vec<LowRankTerm>> = vec![Vec::new(); m];
        let key = (u64::MAX, 0);
        d.add_low_rank(&xd, in_dim, input, &mut yd, out_dim, &none, key)
            .unwrap();
        d.add_low_rank(&xd, in_dim, input, &mut yd, out_dim, &gpu_rows, key)
            .unwrap();
        let got = d.download(&yd, m * out_dim).unwrap();
        let e = nerr(&delta(&got), &delta(&want));
        eprintln!("low-rank updates ({mode} input): normalized error of the update {e:.2e}");
        assert!(
            e < 1e-5,
            "low-rank updates ({mode}): normalized error {e:e}"
        );
        // A pair that does not fit the product is an error, not a launch.
        let bad = vec![vec![LowRankTerm {
            col: out_dim - 10,
            ..gpu_rows[1][0]
        }]];
        assert!(d
            .add_low_rank(&xd, in_dim, input, &mut yd, out_dim, &bad, key)
            .is_err());
    }
}
