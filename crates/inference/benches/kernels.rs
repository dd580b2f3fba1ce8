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
//! cargo bench -p lattice-inference --bench kernels -- --decode   # only decode attention
//! ```
//!
//! The bf16 group compares `bf16::gemm_bt_bf16` (`vdpbf16ps` where the CPU has AVX512_BF16)
//! with the f32 `gemm_bt_packed` on the Qwen3.5-0.8B prefill shapes (512 tokens); its
//! `%meas` is against twice the measured f32 peak, since `vdpbf16ps` does twice the flops of
//! an FMA per instruction at the same rate.
//!
//! The decode group times `attn::DecodeKernels` at 4,096 cached keys (one thread, all key/value
//! heads of a layer, on the Qwen2.5-Coder-0.5B and Qwen3.5 head shapes), reading K/V from pages
//! of 32 rows scattered in a pool against one contiguous buffer, f32 and f16; the two layouts
//! alternate step by step so that a noisy neighbour slows both alike.

use std::hint::black_box;
use std::time::{Duration, Instant};

use half::f16;
use lattice_inference::backend::cpu::attn::{DecodeGroup, DecodeKernels, KvRows, KvView};
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
    decode_only: bool,
    isa: Option<String>,
    threads: Option<usize>,
}

fn parse_args() -> Args {
    let mut args = Args {
        quick: false,
        bf16_only: false,
        decode_only: false,
        isa: None,
        threads: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => args.quick = true,
            "--bf16" => args.bf16_only = true,
            "--decode" => args.decode_only = true,
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
    let native = if bf16::amx_supported() {
        "amx-bf16"
    } else if bf16::native_supported() {
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
            bf16::gemm_bt_bf16(m, n, k, &x, &wb, &mut y, n, false, None, false).expect("shapes");
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

/// Cached keys of the decode benchmark.
const DECODE_KEYS: usize = 4096;
/// Rows per page of the paged layout.
const DECODE_PAGE_ROWS: usize = 32;
/// Fewest timed pairs (contiguous, paged) per case.
const MIN_PAIRS: usize = 40;
/// Layers cycled per timed run, so that each layer's rows come from beyond L2 as in a step.
const DECODE_LAYERS: usize = 8;

/// One layer's keys or values in both layouts, f32 and f16: rows in order, and the same rows in
/// pages of [`DECODE_PAGE_ROWS`] placed in a pool in a shuffled order.
struct DecodeRows {
    flat: Vec<f32>,
    flat16: Vec<f16>,
    pool: Vec<f32>,
    pool16: Vec<f16>,
    /// Pool slot of each page.
    slots: Vec<usize>,
    ld: usize,
}

impl DecodeRows {
    fn new(ld: usize, seed: u32) -> Self {
        let flat = data(DECODE_KEYS * ld, seed);
        let n_pages = DECODE_KEYS.div_ceil(DECODE_PAGE_ROWS);
        // A fixed permutation: page i goes to slot (i · 37) mod n (37 is prime to 128).
        let slots: Vec<usize> = (0..n_pages)
            .map(|i| (i * 37 + seed as usize) % n_pages)
            .collect();
        let page = DECODE_PAGE_ROWS * ld;
        let mut pool = vec![0.0f32; n_pages * page];
        for (i, rows) in flat.chunks(page).enumerate() {
            pool[slots[i] * page..][..rows.len()].copy_from_slice(rows);
        }
        let half = |x: &[f32]| x.iter().map(|&v| f16::from_f32(v)).collect::<Vec<_>>();
        Self {
            flat16: half(&flat),
            pool16: half(&pool),
            flat,
            pool,
            slots,
            ld,
        }
    }

    /// The rows as a view: contiguous or paged, f32 or f16.
    fn view(&self, paged: bool, f16: bool) -> KvView<'_> {
        let page = DECODE_PAGE_ROWS * self.ld;
        if !paged {
            let rows = if f16 {
                KvRows::F16(&self.flat16)
            } else {
                KvRows::F32(&self.flat)
            };
            return KvView::contiguous(rows, self.ld);
        }
        let pages = self
            .slots
            .iter()
            .map(|&s| {
                if f16 {
                    KvRows::F16(&self.pool16[s * page..][..page])
                } else {
                    KvRows::F32(&self.pool[s * page..][..page])
                }
            })
            .collect();
        KvView::new(pages, DECODE_PAGE_ROWS, DECODE_KEYS, self.ld)
    }
}

/// Decode attention at [`DECODE_KEYS`] keys, paged against contiguous (see the module comment).
fn bench_decode(quick: bool, only: Option<&str>) {
    let budget = Duration::from_millis(if quick { 1000 } else { 4000 });
    // (name, query heads, key/value heads, head dim)
    let shapes = [
        ("qwen2.5-coder 14/2x64", 14, 2, 64),
        ("qwen3.5 8/2x256", 8, 2, 256),
    ];
    for (name, n_heads, n_kv, hd) in shapes {
        let ld = n_kv * hd;
        let g = n_heads / n_kv;
        let layers: Vec<(DecodeRows, DecodeRows)> = (0..DECODE_LAYERS as u32)
            .map(|l| {
                (
                    DecodeRows::new(ld, 2 * l + 1),
                    DecodeRows::new(ld, 2 * l + 2),
                )
            })
            .collect();
        let q = data(n_heads * hd, 99);
        let available = DecodeKernels::available();
        for &kernels in available
            .iter()
            .filter(|k| only.is_none_or(|n| n == k.name()))
        {
            for f16 in [false, true] {
                let views = |paged| -> Vec<(KvView<'_>, KvView<'_>)> {
                    layers
                        .iter()
                        .map(|(k, v)| (k.view(paged, f16), v.view(paged, f16)))
                        .collect()
                };
                let (flat, paged) = (views(false), views(true));
                let mut scores = Vec::new();
                let mut out = vec![0.0f32; n_heads * hd];
                // One layer: every key/value head's group.
                let mut step = |(k, v): &(KvView<'_>, KvView<'_>)| {
                    for h in 0..n_kv {
                        let sh = DecodeGroup {
                            g,
                            hd,
                            first: 0,
                            col: h * hd,
                            scale: 1.0 / (hd as f32).sqrt(),
                        };
                        let o = &mut out[h * g * hd..(h + 1) * g * hd];
                        kernels.run(&sh, &q[h * g * hd..], k, v, &mut scores, o);
                    }
                    black_box(&mut out);
                };
                // Layer steps of the two layouts alternate (the order swapped every pair, the
                // layer advancing), so that the load of a shared machine hits both alike.
                for l in 0..DECODE_LAYERS {
                    step(&flat[l]);
                    step(&paged[l]);
                }
                let deadline = Instant::now() + budget;
                let (mut t_flat, mut t_paged, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
                while ratios.len() < MIN_PAIRS || Instant::now() < deadline {
                    let i = ratios.len();
                    let l = i % DECODE_LAYERS;
                    let mut pair = [0.0f64; 2];
                    for which in if i % 2 == 0 { [0, 1] } else { [1, 0] } {
                        let t = Instant::now();
                        step(if which == 0 { &flat[l] } else { &paged[l] });
                        pair[which] = t.elapsed().as_secs_f64() * 1e6;
                    }
                    t_flat.push(pair[0]);
                    t_paged.push(pair[1]);
                    ratios.push(pair[1] / pair[0]);
                }
                for x in [&mut t_flat, &mut t_paged, &mut ratios] {
                    x.sort_by(f64::total_cmp);
                }
                // Median and 10th percentile (preemptions only ever add time).
                let (med, p10) = (|x: &[f64]| x[x.len() / 2], |x: &[f64]| x[x.len() / 10]);
                let bytes = 2.0 * (DECODE_KEYS * ld * if f16 { 2 } else { 4 }) as f64;
                println!(
                    "{:<10} {:<22} {:<4} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>7.3} {:>7.3} {:>6.1} {:>6}",
                    kernels.name(),
                    name,
                    if f16 { "f16" } else { "f32" },
                    med(&t_flat),
                    med(&t_paged),
                    p10(&t_flat),
                    p10(&t_paged),
                    med(&ratios),
                    p10(&t_paged) / p10(&t_flat),
                    bytes / p10(&t_flat) / 1e3,
                    ratios.len(),
                );
            }
        }
    }
}

/// Prints the decode attention table.
fn decode_table(quick: bool, only: Option<&str>) {
    println!(
        "decode attention, {DECODE_KEYS} keys, 1 thread, µs per layer (all key/value heads), \
         {DECODE_LAYERS} layers cycled; paged = pages of {DECODE_PAGE_ROWS} rows scattered in a \
         pool; med / p10 of alternating layer steps; p/c = median of the pairs' ratios and \
         ratio of the p10s"
    );
    println!(
        "kernels    shape                  kv    med(c)   med(p)   p10(c)   p10(p) p/c med p/c p10  GB/s  pairs"
    );
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("building a rayon pool only fails if threads cannot be spawned");
    pool.install(|| bench_decode(quick, only));
}

fn main() {
    let args = parse_args();
    if args.decode_only {
        decode_table(args.quick, args.isa.as_deref());
        return;
    }
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
    println!();
    decode_table(args.quick, args.isa.as_deref());
}
