//! Quantized matrix benchmark (plain `main`, `harness = false`): for every quantized type,
//! - matrix-vector products (decode, `m = 1`) as GB/s of weight bytes streamed (GGUF size),
//!   cycling through a stack of matrices larger than the L3 (like the layers of a model), next
//!   to this machine's memory bandwidth (a read-only sum and a copy of 512 MiB);
//! - prompt-sized products (`m = 512`) as GOP/s (`2·m·n·k` per product) on the SmolLM2-135M
//!   FFN shape (k 576 → n 1536) and the Qwen2.5-0.5B one (k 896 → n 4864) (K-quants: the
//!   transposed shapes, as their k must be a multiple of 256).
//!
//! On 1 and 2 threads, with the best kernels (or `--isa avx512|avx2|scalar`). Every number is
//! the median of several timed runs after a warm-up, as wall-clock rate and (in parentheses)
//! as rate per on-CPU time of the process divided by the threads: on a shared machine, where
//! other processes take turns on the cores, the second is the speed of the code while it runs.
//!
//! ```text
//! cargo bench -p lattice-inference --bench quant                 # everything
//! cargo bench -p lattice-inference --bench quant -- --quick      # fewer types
//! cargo bench -p lattice-inference --bench quant -- --threads 1 --isa avx2
//! cargo bench -p lattice-inference --bench quant -- --prompt-only  # only the m = 512 products
//! cargo bench -p lattice-inference --bench quant -- --type q6_K     # one type
//! cargo bench -p lattice-inference --bench quant -- --acts          # the activation quantizers
//! ```
//!
//! `--acts` times only the quantization of activation rows (512 rows of 1024, Q8_0 / Q8_1
//! blocks of 32 and Q8_K super-blocks of 256, one thread) as G values per second.

use std::hint::black_box;
use std::time::Duration;

mod common;
use common::{rates, time_runs};

use lattice_inference::backend::cpu::{Isa, QuantMatrix};
use lattice_inference::quant::act::{quantize_act, ActFormat};
use lattice_inference::quant::{quantize_row, QuantType};
use rayon::prelude::*;

struct Args {
    quick: bool,
    /// Only the prompt-sized products (no memory or matrix-vector runs).
    prompt_only: bool,
    isa: Option<Isa>,
    threads: Option<usize>,
    /// Only this type (`--type q6_K`).
    only: Option<QuantType>,
    /// Only the activation quantizers.
    acts: bool,
}

fn parse_args() -> Args {
    let mut a = Args {
        quick: false,
        prompt_only: false,
        isa: None,
        threads: None,
        only: None,
        acts: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(s) = it.next() {
        match s.as_str() {
            "--quick" => a.quick = true,
            "--prompt-only" => a.prompt_only = true,
            "--acts" => a.acts = true,
            "--isa" => {
                a.isa = it
                    .next()
                    .and_then(|n| Isa::ALL.into_iter().find(|i| i.name() == n))
            }
            "--threads" => a.threads = it.next().and_then(|t| t.parse().ok()),
            "--type" => {
                a.only = it
                    .next()
                    .and_then(|n| QuantType::ALL.into_iter().find(|t| t.name() == n))
            }
            _ => {}
        }
    }
    a
}

fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2_654_435_761).max(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x as f32 / u32::MAX as f32) * 2.0 - 1.0
        })
        .collect()
}

/// A random `n × k` matrix of type `t`: with `real`, Q4_0 / Q8_0 are made by our quantizer;
/// otherwise random code bytes with small finite scales (the same work per block).
fn matrix(t: QuantType, n: usize, k: usize, seed: u32, real: bool) -> QuantMatrix {
    let rb = t.row_bytes(k).expect("k multiple of the block");
    let mut raw = vec![0u8; n * rb];
    if real && matches!(t, QuantType::Q4_0 | QuantType::Q8_0) {
        let v = data(n * k, seed);
        quantize_row(t, &v, &mut raw).expect("quantize");
    } else {
        let mut x = seed.max(1);
        for b in raw.iter_mut() {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            *b = x as u8;
        }
        let scale = half::f16::from_f32(0.01).to_bits().to_le_bytes();
        let offs: &[usize] = match t {
            QuantType::Q4_1 | QuantType::Q4_K => &[0, 2],
            QuantType::Q6_K => &[208],
            _ => &[0],
        };
        for blk in raw.chunks_exact_mut(t.block_bytes()) {
            for &o in offs {
                blk[o..o + 2].copy_from_slice(&scale);
            }
        }
    }
    QuantMatrix::new(t, n, k, &raw).expect("matrix")
}

/// Memory bandwidth: GB/s of a read-only sum and of a copy (bytes read + written) of 512 MiB,
/// each as (wall, on-CPU) rates.
fn bandwidth(threads: usize) -> ((f64, f64), (f64, f64)) {
    let n = 64 << 20; // u64 words
    let src: Vec<u64> = (0..n as u64).collect();
    let mut dst = vec![0u64; n];
    let chunk = n / threads / 4;
    let read = time_runs(Duration::from_secs(2), threads, || {
        let s: u64 = src
            .par_chunks(chunk)
            .map(|c| c.iter().fold(0u64, |a, &v| a.wrapping_add(v)))
            .sum();
        black_box(s);
    });
    let copy = time_runs(Duration::from_secs(2), threads, || {
        dst.par_chunks_mut(chunk)
            .zip(src.par_chunks(chunk))
            .for_each(|(d, s)| d.copy_from_slice(s));
        black_box(&dst);
    });
    let bytes = (n * 8) as f64;
    (rates(bytes, read), rates(2.0 * bytes, copy))
}

fn run_matmul(w: &QuantMatrix, isa: Option<Isa>, x: &[f32], m: usize, y: &mut [f32]) {
    match isa {
        Some(i) => w.matmul_with(i, x, m, y).expect("isa supported"),
        None => w.matmul(x, m, y),
    }
}

fn bench(args: &Args, threads: usize) {
    if !args.prompt_only {
        let (rd, cp) = bandwidth(threads);
        println!(
            "memory: read {:.1} GB/s ({:.1} on-CPU), copy {:.1} GB/s ({:.1} on-CPU; read + write bytes)",
            rd.0, rd.1, cp.0, cp.1
        );
    }
    let types: &[QuantType] = if args.quick {
        &[QuantType::Q4_0, QuantType::Q8_0, QuantType::Q4_K]
    } else {
        &[
            QuantType::Q4_0,
            QuantType::Q4_1,
            QuantType::Q5_0,
            QuantType::Q8_0,
            QuantType::Q4_K,
            QuantType::Q6_K,
        ]
    };
    println!(
        "{:<6} {:>17} {:>17} {:>16} {:>16}",
        "type", "matvec DRAM GB/s", "cached GB/s", "m512 576·1536", "m512 896·4864"
    );
    println!("       (GOP/s; in parentheses: per on-CPU second of each thread)");
    println!("       (K-quants: the transposed shapes, k 4864 → n 896 and k 1536 → n 576)");
    for &t in types.iter().filter(|t| args.only.is_none_or(|o| o == **t)) {
        // K-quants need k to be a multiple of 256: use the FFN down projections for them.
        let kq = t.block_len() == 256;
        // Decode: a stack of FFN matrices of ~256 MB in total (8× the L3), one product each
        // per pass, as the layers of a model.
        let (k, n) = if kq { (4864, 896) } else { (896, 4864) };
        let one = t.row_bytes(k).unwrap() * n;
        let count = if args.prompt_only {
            1
        } else {
            ((256 << 20) / one).max(2)
        };
        let stack: Vec<QuantMatrix> = (0..count)
            .map(|i| matrix(t, n, k, 7 + i as u32, false))
            .collect();
        let x = data(k, 3);
        let mut y = vec![0f32; n];
        let budget = Duration::from_millis(if args.prompt_only { 1 } else { 1500 });
        let d = time_runs(budget, threads, || {
            for w in &stack {
                run_matmul(w, args.isa, &x, 1, &mut y);
            }
            black_box(&y);
        });
        let dram = rates((count * one) as f64, d);
        // The same matrix again and again (from cache: kernel speed, not memory).
        let dc = time_runs(budget / 2, threads, || {
            run_matmul(&stack[0], args.isa, &x, 1, &mut y);
            black_box(&y);
        });
        let cached = rates(one as f64, dc);
        drop(stack);
        let mut gops = Vec::new();
        let shapes = if kq {
            [(1536, 576), (4864, 896)]
        } else {
            [(576, 1536), (896, 4864)]
        };
        for (k, n) in shapes {
            let m = 512;
            let w = matrix(t, n, k, 11, true);
            let x = data(m * k, 5);
            let mut y = vec![0f32; m * n];
            let dt = time_runs(Duration::from_secs(1), threads, || {
                run_matmul(&w, args.isa, &x, m, &mut y);
                black_box(&y);
            });
            gops.push(rates(2.0 * (m * n * k) as f64, dt));
        }
        let decode = if args.prompt_only {
            format!("{:>17} {:>17}", "-", "-")
        } else {
            format!(
                "{:>9.1} ({:>5.1}) {:>9.1} ({:>5.1})",
                dram.0, dram.1, cached.0, cached.1
            )
        };
        println!(
            "{:<6} {decode} {:>9.0} ({:>4.0}) {:>9.0} ({:>4.0})",
            t.name(),
            gops[0].0,
            gops[0].1,
            gops[1].0,
            gops[1].1
        );
    }
}

/// The activation quantizers on 512 rows of 1024 values, on the calling thread.
fn bench_acts() {
    let x: Vec<f32> = (0..512 * 1024)
        .map(|i| ((i * 7919) % 1000) as f32 * 0.001 - 0.5)
        .collect();
    for f in [ActFormat::Q8_0, ActFormat::Q8K] {
        let t = time_runs(Duration::from_millis(1500), 1, || {
            for row in x.chunks_exact(1024) {
                black_box(quantize_act(f, row));
            }
        });
        let (wall, cpu) = rates(x.len() as f64, t);
        println!("activations {f:?}: {wall:.2} G values/s ({cpu:.2} on-CPU)");
    }
}

fn main() {
    let args = parse_args();
    if args.acts {
        println!("CPU: {}", common::cpu_model());
        bench_acts();
        return;
    }
    let isa_name = args.isa.map_or("best", |i| i.name());
    for threads in [1, 2] {
        if args.threads.is_some_and(|t| t != threads) {
            continue;
        }
        println!("\n== {threads} thread(s), kernels: {isa_name} ==");
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("thread pool");
        pool.install(|| bench(&args, threads));
    }
}
