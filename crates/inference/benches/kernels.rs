//! CPU kernel benchmark (plain `main`, `harness = false`): GFLOP/s of the SGEMMs on the
//! BERT-base / MiniLM encoder shapes and attention products, for every instruction set this
//! CPU supports and for 1 and 2 threads, plus the throughput of the elementwise kernels.
//!
//! Every number is the median of several timed runs after a warm-up (the best run is shown
//! too). `%meas` is against the measured f32 peak of the dev VM (114 GFLOP/s per core, see
//! [`MEASURED_PEAK_PER_CORE`]), `%nominal` against the 270 GFLOP/s per core of a Zen 5 at
//! 4.2 GHz (2 × 512-bit FMA pipes), i.e. 540 for 2 threads.
//!
//! ```text
//! cargo bench -p lattice-inference --bench kernels               # everything
//! cargo bench -p lattice-inference --bench kernels -- --quick    # fewer shapes
//! cargo bench -p lattice-inference --bench kernels -- --isa avx512 --threads 1
//! cargo bench -p lattice-inference --bench kernels -- --bf16     # only bf16 against f32
//! ```
//!
//! The bf16 group compares `bf16::gemm_bt_bf16` (`vdpbf16ps` where the CPU has AVX512_BF16)
//! with the f32 `gemm_bt_packed` on the Qwen3.5-0.8B prefill shapes (512 tokens); its
//! `%meas` is against twice the measured f32 peak, since `vdpbf16ps` does twice the flops of
//! an FMA per instruction at the same rate.

use std::hint::black_box;
use std::time::{Duration, Instant};

use lattice_inference::backend::cpu::{bf16, kernels, kernels_for, Isa, Kernels};

/// Nominal f32 peak of one core of the machine we were asked to target, GFLOP/s.
const PEAK_PER_CORE: f64 = 270.0;
/// f32 peak of one core of the dev VM as measured (a register-only loop of independent FMAs,
/// zmm or ymm alike): 114 GFLOP/s = 32 flops/cycle at ~3.55 GHz. The CPU reports family 25
/// (Zen 4: 512-bit FMAs run as two 256-bit halves), not Zen 5, so 540 is out of reach here.
const MEASURED_PEAK_PER_CORE: f64 = 114.0;

struct Args {
    quick: bool,
    bf16_only: bool,
    isa: Option<String>,
    threads: Option<usize>,
}

fn parse_args() -> Args {
    let mut args = Args {
        quick: false,
        bf16_only: false,
        isa: None,
        threads: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => args.quick = true,
            "--bf16" => args.bf16_only = true,
            "--isa" => args.isa = it.next(),
            "--threads" => args.threads = it.next().and_then(|t| t.parse().ok()),
            _ => {} // `cargo bench` passes `--bench`; ignore what we do not know.
        }
    }
    args
}

/// Median and best wall time of `f` over enough runs to fill about `budget` (at least 5, at
/// most 200). On a shared machine the best run is the better estimate of the kernel itself.
fn time_runs(budget: Duration, mut f: impl FnMut()) -> (Duration, Duration) {
    f(); // warm-up: page in buffers, grow the packing scratch
    let t0 = Instant::now();
    f();
    let once = t0.elapsed().max(Duration::from_nanos(100));
    let runs = (budget.as_secs_f64() / once.as_secs_f64()).clamp(5.0, 200.0) as usize;
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    times.sort();
    (times[runs / 2], times[0])
}

/// Median wall time of `f`, see [`time_runs`].
fn median_time(budget: Duration, f: impl FnMut()) -> Duration {
    time_runs(budget, f).0
}

/// Deterministic pseudo-random data in `[-1, 1)`.
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

/// One GEMM case: `C[m×n] = A[m×k] · op(B)` with the given leading dimensions.
struct Gemm {
    name: &'static str,
    trans: bool,
    /// Use weights packed beforehand (`gemm_bt_packed`); only with `trans`.
    packed: bool,
    m: usize,
    n: usize,
    k: usize,
    lda: usize,
    ldb: usize,
    ldc: usize,
}

impl Gemm {
    fn linear(m: usize, n: usize, k: usize) -> Self {
        let (lda, ldb, ldc) = (k, k, n);
        Gemm {
            name: "linear a·wᵀ",
            trans: true,
            packed: false,
            m,
            n,
            k,
            lda,
            ldb,
            ldc,
        }
    }

    fn linear_packed(m: usize, n: usize, k: usize) -> Self {
        Gemm {
            name: "packed a·wᵀ",
            packed: true,
            ..Gemm::linear(m, n, k)
        }
    }

    fn run(&self, kt: &Kernels, budget: Duration) -> (Duration, Duration) {
        let a = data(self.m * self.lda, 1);
        let b_rows = if self.trans { self.n } else { self.k };
        let b = data(b_rows * self.ldb, 2);
        let mut c = vec![0.0f32; self.m * self.ldc];
        let (m, n, k, lda, ldb, ldc) = (self.m, self.n, self.k, self.lda, self.ldb, self.ldc);
        let w = self.packed.then(|| kt.pack_weights(n, k, &b, ldb));
        time_runs(budget, || {
            if let Some(w) = &w {
                kt.gemm_bt_packed(m, &a, lda, w, &mut c, ldc, false, None, false);
            } else if self.trans {
                kt.gemm_bt(m, n, k, &a, lda, &b, ldb, &mut c, ldc, false);
            } else {
                kt.gemm_nn(m, n, k, &a, lda, &b, ldb, &mut c, ldc, false);
            }
            black_box(&mut c);
        })
    }
}

fn gemm_cases(quick: bool) -> Vec<Gemm> {
    let tokens: &[usize] = if quick {
        &[128, 512]
    } else {
        &[8, 128, 512, 2048]
    };
    let weights = [
        (384, 384),
        (1536, 384),
        (384, 1536),
        (768, 768),
        (3072, 768),
        (768, 3072),
    ];
    let mut cases = Vec::new();
    for &m in tokens {
        for &(n, k) in &weights {
            cases.push(Gemm::linear(m, n, k));
        }
    }
    let few: &[usize] = if quick {
        &[8, 128]
    } else {
        &[1, 8, 32, 128, 512]
    };
    for &m in few {
        for &(n, k) in &[(768, 768), (3072, 768)] {
            cases.push(Gemm::linear_packed(m, n, k));
        }
    }
    let seqs: &[usize] = if quick { &[128] } else { &[16, 128, 512] };
    for &seq in seqs {
        for head_dim in [32, 64] {
            // Q·Kᵀ of one head, read in place from [tokens × hidden] activations.
            let (lda, ldb, ldc) = (768, 768, seq);
            cases.push(Gemm {
                name: "attn q·kᵀ",
                trans: true,
                packed: false,
                m: seq,
                n: seq,
                k: head_dim,
                lda,
                ldb,
                ldc,
            });
        }
        // P·V of one head, written in place into [tokens × hidden].
        let (lda, ldb, ldc) = (seq, 768, 768);
        cases.push(Gemm {
            name: "attn p·v",
            trans: false,
            packed: false,
            m: seq,
            n: 64,
            k: seq,
            lda,
            ldb,
            ldc,
        });
    }
    cases
}

fn bench_gemm(kt: &Kernels, threads: usize, quick: bool) {
    let budget = Duration::from_millis(if quick { 150 } else { 300 });
    let peak = PEAK_PER_CORE * threads as f64;
    for case in gemm_cases(quick) {
        // The portable GEMM is slow; keep its table to the medium shapes.
        if kt.isa() == Isa::Scalar && case.m * case.n * case.k > 128 * 3072 * 768 {
            continue;
        }
        let (median, best) = case.run(kt, budget);
        let flops = 2.0 * (case.m * case.n * case.k) as f64;
        let gflops = flops / median.as_secs_f64() / 1e9;
        let best_gflops = flops / best.as_secs_f64() / 1e9;
        println!(
            "{:<7} {:>2}  {:<12} {:>5} {:>5} {:>5} {:>10.1} {:>8.1} {:>8.1} {:>6.1}% {:>6.1}%",
            kt.isa().name(),
            threads,
            case.name,
            case.m,
            case.n,
            case.k,
            median.as_secs_f64() * 1e6,
            gflops,
            best_gflops,
            100.0 * gflops / (MEASURED_PEAK_PER_CORE * threads as f64),
            100.0 * gflops / peak
        );
    }
}

fn bench_elementwise(kt: &Kernels, quick: bool) {
    let budget = Duration::from_millis(if quick { 100 } else { 200 });
    let (rows, hidden, ffn) = (512, 768, 3072);
    let x = data(rows * ffn, 3);
    let gamma = data(hidden, 4);
    let beta = data(hidden, 5);
    let mut buf = x.clone();
    let report = |name: &str, n: usize, t: Duration| {
        println!(
            "{:<7}     {:<22} {:>9} {:>11.1} {:>9.2}",
            kt.isa().name(),
            name,
            n,
            t.as_secs_f64() * 1e6,
            n as f64 / t.as_secs_f64() / 1e9
        );
    };
    let n = rows * ffn;
    let t = median_time(budget, || {
        buf.copy_from_slice(&x);
        kt.gelu_erf(&mut buf);
    });
    report("gelu_erf (+copy)", n, t);
    let t = median_time(budget, || {
        buf.copy_from_slice(&x);
        kt.tanh(&mut buf);
    });
    report("tanh (+copy)", n, t);
    let n = rows * hidden;
    let t = median_time(budget, || {
        buf[..n].copy_from_slice(&x[..n]);
        kt.layer_norm(&mut buf[..n], hidden, &gamma, &beta, 1e-12);
    });
    report("layer_norm 768 (+copy)", n, t);
    let seq = 128;
    let n = 12 * seq * seq;
    let t = median_time(budget, || {
        buf[..n].copy_from_slice(&x[..n]);
        for row in buf[..n].chunks_exact_mut(seq) {
            kt.softmax(row);
        }
    });
    report("softmax rows of 128", n, t);
    let n = rows * hidden;
    let t = median_time(budget, || {
        kt.add_assign(&mut buf[..n], &x[..n]);
    });
    report("add_assign", n, t);
    let dim = 1024;
    let t = median_time(budget, || {
        let mut s = 0.0;
        for v in x[..n].chunks_exact(dim) {
            s += kt.cosine(v, &x[..dim]);
        }
        black_box(s);
    });
    report("cosine 1024-d", n, t);
}

/// bf16 against f32 (both with weights packed at load) on the Qwen3.5-0.8B prefill shapes.
fn bench_bf16(threads: usize, quick: bool) {
    let budget = Duration::from_millis(if quick { 300 } else { 1000 });
    let m = 512;
    let shapes = [(1024, 1024), (3584, 1024), (1024, 3584), (6144, 1024)];
    let native = if bf16::native_supported() {
        "avx512bf16"
    } else {
        "portable"
    };
    for (n, k) in shapes {
        let x = data(m * k, 1);
        let w = data(n * k, 2);
        let mut y = vec![0.0f32; m * n];
        let flops = 2.0 * (m * n * k) as f64;
        let wb = bf16::Bf16Weights::from_f32(n, k, &w).expect("n·k weights");
        let (med_b, best_b) = time_runs(budget, || {
            bf16::gemm_bt_bf16(m, n, k, &x, &wb, &mut y, n, false).expect("shapes");
            black_box(&mut y);
        });
        let kt = kernels();
        let wf = kt.pack_weights(n, k, &w, k);
        let (med_f, best_f) = time_runs(budget, || {
            kt.gemm_bt_packed(m, &x, k, &wf, &mut y, n, false, None, false);
            black_box(&mut y);
        });
        for (name, med, best, peak) in [
            (native, med_b, best_b, 2.0 * MEASURED_PEAK_PER_CORE),
            (kt.isa().name(), med_f, best_f, MEASURED_PEAK_PER_CORE),
        ] {
            let gflops = flops / med.as_secs_f64() / 1e9;
            println!(
                "{:<10} {:>2} {:>5} {:>5} {:>5} {:>10.1} {:>8.1} {:>8.1} {:>6.1}%",
                name,
                threads,
                m,
                n,
                k,
                med.as_secs_f64() * 1e6,
                gflops,
                flops / best.as_secs_f64() / 1e9,
                100.0 * gflops / (peak * threads as f64),
            );
        }
    }
}

fn main() {
    let args = parse_args();
    if args.bf16_only {
        let thread_counts = args.threads.map_or(vec![1, 2], |t| vec![t]);
        println!("bf16 vs f32 (packed weights), prefill shapes of Qwen3.5-0.8B");
        println!("kernel    thr     m     n     k  median µs  GFLOP/s   (best)  %meas");
        for threads in thread_counts {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("building a rayon pool only fails if threads cannot be spawned");
            pool.install(|| bench_bf16(threads, args.quick));
        }
        return;
    }
    let tables: Vec<&Kernels> = Isa::ALL
        .into_iter()
        .filter_map(kernels_for)
        .filter(|kt| match args.isa.as_deref() {
            Some(want) => want == kt.isa().name(),
            None => true,
        })
        .collect();
    let thread_counts: Vec<usize> = match args.threads {
        Some(t) => vec![t],
        None => vec![1, 2],
    };
    println!(
        "kernels: selected isa = {}",
        lattice_inference::backend::cpu::isa()
    );
    println!(
        "isa    thr  op               m     n     k   median µs  GFLOP/s  (best)  %meas  %nominal"
    );
    for &kt in &tables {
        for &threads in &thread_counts {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("building a rayon pool only fails if threads cannot be spawned");
            pool.install(|| bench_gemm(kt, threads, args.quick));
        }
    }
    println!();
    println!("isa         op                      elements   median µs  Gelem/s  (1 thread)");
    for &kt in &tables {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .expect("building a rayon pool only fails if threads cannot be spawned");
        pool.install(|| bench_elementwise(kt, args.quick));
    }
    println!();
    println!(
        "kernel    thr     m     n     k  median µs  GFLOP/s   (best)  %meas (bf16: of 2× f32)"
    );
    for &threads in &thread_counts {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("building a rayon pool only fails if threads cannot be spawned");
        pool.install(|| bench_bf16(threads, args.quick));
    }
}
