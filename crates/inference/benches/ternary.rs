//! Ternary matrix benchmark (plain `main`, `harness = false`): `TernaryMatrix::matmul_i8` at the
//! BitNet-b1.58-2B4T shapes (k 2560 → n 2560, 640, 6912 and k 6912 → n 2560), per instruction
//! set:
//! - `m = 1` (decode) as GB/s of packed weight bytes streamed, cycling through a stack of
//!   copies larger than the L3 (like the layers of a model), next to this machine's memory
//!   bandwidth (a read-only sum of 512 MiB), and on one matrix again and again (from cache);
//! - `m = 64` (a prompt chunk) as GOP/s (`2·m·n·k` per product).
//!
//! On 1 and 2 threads, every available instruction set (or `--isa avx512|avx2|scalar`). Every
//! number is the median of several timed runs after a warm-up, as wall-clock rate and (in
//! parentheses) as rate per on-CPU time of the process divided by the threads: on a shared
//! machine the second is the speed of the code while it runs.
//!
//! ```text
//! cargo bench -p lattice-inference --bench ternary
//! cargo bench -p lattice-inference --bench ternary -- --threads 1 --isa avx2
//! cargo bench -p lattice-inference --bench ternary -- --m 128   # another prompt size
//! cargo bench -p lattice-inference --bench ternary -- --decode   # only m = 1 (or --prompt)
//! cargo bench -p lattice-inference --bench ternary -- --int8 --prompt --m 512
//! ```
//!
//! `--int8` runs `Int8Matrix::matmul_i8` (the encoders' `--q8` products) at the
//! all-MiniLM-L6-v2 shapes instead (k 384 → n 1152, 384, 1536 and k 1536 → n 384).

use std::hint::black_box;
use std::time::Duration;

mod common;
use common::{cpu_model, rates, time_runs};

use lattice_inference::backend::cpu::ternary;
use lattice_inference::backend::cpu::{Int8Matrix, Isa, TernaryMatrix};
use rayon::prelude::*;

/// The BitNet-b1.58-2B4T projections: (name, k, n).
const SHAPES: [(&str, usize, usize); 4] = [
    ("q/o 2560→2560", 2560, 2560),
    ("k/v 2560→640", 2560, 640),
    ("up 2560→6912", 2560, 6912),
    ("down 6912→2560", 6912, 2560),
];

/// The all-MiniLM-L6-v2 projections (`--int8`): (name, k, n).
const INT8_SHAPES: [(&str, usize, usize); 4] = [
    ("qkv 384→1152", 384, 1152),
    ("out 384→384", 384, 384),
    ("up 384→1536", 384, 1536),
    ("down 1536→384", 1536, 384),
];

/// The matrix under test: ternary or int8.
#[derive(Clone)]
enum Matrix {
    Ternary(TernaryMatrix),
    Int8(Int8Matrix),
}

impl Matrix {
    fn new(int8: bool, n: usize, k: usize) -> Self {
        if int8 {
            let v: Vec<i8> = values(n * k, 7, false)
                .iter()
                .map(|&v| v.max(-127))
                .collect();
            Matrix::Int8(Int8Matrix::from_values(n, k, &v).expect("matrix"))
        } else {
            Matrix::Ternary(
                TernaryMatrix::from_values(n, k, &values(n * k, 7, true)).expect("matrix"),
            )
        }
    }
    fn packed_bytes(&self) -> usize {
        match self {
            Matrix::Ternary(w) => w.packed_bytes(),
            Matrix::Int8(w) => w.packed_bytes(),
        }
    }
    /// With the tiles of `isa`, or (None) the AMX-INT8 ones.
    fn run(&self, isa: Option<Isa>, x: &[i8], m: usize, y: &mut [i32], ldy: usize) {
        match (self, isa) {
            (Matrix::Ternary(w), Some(isa)) => w.matmul_i8_with(isa, x, m, y, ldy),
            (Matrix::Int8(w), Some(isa)) => w.matmul_i8_with(isa, x, m, y, ldy),
            (Matrix::Int8(w), None) => w.matmul_i8_amx(x, m, y, ldy),
            (Matrix::Ternary(_), None) => unreachable!("no AMX ternary tile"),
        }
        .expect("isa supported")
    }
}

struct Args {
    isa: Option<Isa>,
    threads: Option<usize>,
    m: usize,
    /// Skip the prompt-sized products.
    decode_only: bool,
    /// Skip the memory and matrix-vector runs.
    prompt_only: bool,
    /// Int8 matrices at the MiniLM shapes instead of ternary ones.
    int8: bool,
}

fn parse_args() -> Args {
    let mut a = Args {
        isa: None,
        threads: None,
        m: 64,
        decode_only: false,
        prompt_only: false,
        int8: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(s) = it.next() {
        match s.as_str() {
            "--isa" => {
                a.isa = it
                    .next()
                    .and_then(|n| Isa::ALL.into_iter().find(|i| i.name() == n))
            }
            "--threads" => a.threads = it.next().and_then(|t| t.parse().ok()),
            "--m" => a.m = it.next().and_then(|t| t.parse().ok()).unwrap_or(64),
            "--decode" => a.decode_only = true,
            "--prompt" => a.prompt_only = true,
            "--int8" => a.int8 = true,
            _ => {}
        }
    }
    a
}

/// xorshift32 values: ternary weights or int8 activations.
fn values(n: usize, seed: u32, ternary: bool) -> Vec<i8> {
    let mut x = seed.wrapping_mul(2_654_435_761).max(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            if ternary {
                (x % 3) as i8 - 1
            } else {
                x as u8 as i8
            }
        })
        .collect()
}

/// GB/s of a read-only sum over 512 MiB, (wall, on-CPU).
fn read_bandwidth(threads: usize) -> (f64, f64) {
    let n = 64 << 20; // u64 words
    let src: Vec<u64> = (0..n as u64).collect();
    let chunk = n / threads / 4;
    let read = time_runs(Duration::from_secs(2), threads, || {
        let s: u64 = src
            .par_chunks(chunk)
            .map(|c| c.iter().fold(0u64, |a, &v| a.wrapping_add(v)))
            .sum();
        black_box(s);
    });
    rates((n * 8) as f64, read)
}

fn bench(args: &Args, threads: usize, isas: &[Isa]) {
    if !args.prompt_only {
        let (rd, rd_cpu) = read_bandwidth(threads);
        println!("memory: read {rd:.1} GB/s ({rd_cpu:.1} on-CPU)");
    }
    let m = args.m;
    println!(
        "{:<7} {:<15} {:>19} {:>19} {:>17}",
        "isa",
        "shape",
        "m=1 DRAM GB/s",
        "m=1 cached GB/s",
        format!("m={m} GOP/s")
    );
    let shapes = if args.int8 { &INT8_SHAPES } else { &SHAPES };
    for &(name, k, n) in shapes {
        let w = Matrix::new(args.int8, n, k);
        let one = w.packed_bytes();
        // A stack of copies of about 128 MB (4× the L3 of this machine) for the DRAM figure.
        let copies = if args.prompt_only {
            0
        } else {
            ((128 << 20) / one).max(2)
        };
        let stack: Vec<Matrix> = (0..copies).map(|_| w.clone()).collect();
        // (-127..=127: the int8 kernels' range.)
        let x1: Vec<i8> = values(k, 3, false).iter().map(|&v| v.max(-127)).collect();
        let xm: Vec<i8> = values(m * k, 5, false)
            .iter()
            .map(|&v| v.max(-127))
            .collect();
        let mut y1 = vec![0i32; n];
        let mut ym = vec![0i32; m * n];
        // The vector tiles, and AMX-INT8 where the CPU has it (int8 only).
        let amx = Int8Matrix::from_values(1, 1, &[1])
            .expect("matrix")
            .matmul_i8_amx(&[1], 1, &mut [0], 1)
            .is_ok();
        let paths = isas
            .iter()
            .map(|&i| Some(i))
            .chain((args.int8 && amx).then_some(None));
        for isa in paths {
            let run = |w: &Matrix, x: &[i8], rows: usize, y: &mut [i32]| w.run(isa, x, rows, y, n);
            let slow = isa == Some(Isa::Scalar);
            let budget = Duration::from_millis(if slow { 300 } else { 1000 });
            let mut line = format!("{:<7} {:<15}", isa.map_or("amx", |i| i.name()), name);
            if args.prompt_only {
                line += &format!(" {:>19} {:>19}", "-", "-");
            } else {
                let d = time_runs(budget, threads, || {
                    for w in &stack {
                        run(w, &x1, 1, &mut y1);
                    }
                    black_box(&y1);
                });
                let dram = rates((stack.len() * one) as f64, d);
                let c = time_runs(budget / 2, threads, || {
                    run(&w, &x1, 1, &mut y1);
                    black_box(&y1);
                });
                let cached = rates(one as f64, c);
                line += &format!(
                    " {:>10.1} ({:>6.1}) {:>10.1} ({:>6.1})",
                    dram.0, dram.1, cached.0, cached.1
                );
            }
            if args.decode_only {
                line += &format!(" {:>17}", "-");
            } else {
                let p = time_runs(budget, threads, || {
                    run(&w, &xm, m, &mut ym);
                    black_box(&ym);
                });
                let gops = rates(2.0 * (m * n * k) as f64, p);
                line += &format!(" {:>8.0} ({:>6.0})", gops.0, gops.1);
            }
            println!("{line}");
        }
    }
}

fn main() {
    let args = parse_args();
    let isas: Vec<Isa> = Isa::ALL
        .into_iter()
        .filter(|&i| args.isa.is_none_or(|a| a == i))
        .filter(|&i| {
            let w = TernaryMatrix::from_values(1, 1, &[0]).expect("matrix");
            w.matmul_i8_with(i, &[0], 1, &mut [0], 1).is_ok()
        })
        .collect();
    println!(
        "cpu: {}; ternary kernels: selected {}, benched {:?}",
        cpu_model(),
        ternary::isa().name(),
        isas.iter().map(|i| i.name()).collect::<Vec<_>>()
    );
    println!(
        "(weights: packed {} bytes; in parentheses: rates per on-CPU second of each thread)",
        if args.int8 { "int8" } else { "2-bit" }
    );
    for threads in [1, 2] {
        if args.threads.is_some_and(|t| t != threads) {
            continue;
        }
        println!("\n== {threads} thread(s) ==");
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("thread pool");
        pool.install(|| bench(&args, threads, &isas));
    }
}
