//! `lattice bench peaks`: this machine's limits as Lattice's own kernels reach them, printed
//! beside the CPU model and the instruction set the kernels chose, so tuned figures can say how
//! far from the limit they are: f32 GEMM throughput on a cache-resident block, memory read
//! bandwidth (one thread and all), and the decode product streaming bf16 / f32 weights.

use lattice_inference::backend::cpu;
use std::time::Instant;

/// Arguments of `lattice bench peaks`.
#[derive(clap::Args)]
pub struct Args {
    /// Timed repetitions of each probe (the median is reported).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Megabytes streamed by the bandwidth probes (well above the last-level cache).
    #[arg(long, default_value_t = 512)]
    megabytes: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// Median seconds of `runs` calls of `f`.
fn timed(runs: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..runs.max(1))
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed().as_secs_f64()
        })
        .collect();
    super::bench::median(&mut t)
}

/// Runs `f` on a pool of `threads` threads.
fn on(threads: usize, f: impl FnOnce() -> f64 + Send) -> anyhow::Result<f64> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?;
    Ok(pool.install(|| cpu::on_pool(f)))
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<()> {
    let all = rayon::current_num_threads().max(1);
    let runs = args.runs;
    // GEMM on blocks that stay in cache: 96 rows × 512 outputs × 256 deep, repeated.
    let (m, n, k, reps) = (96usize, 512usize, 256usize, 64usize);
    let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 * 0.1 - 0.3).collect();
    let b: Vec<f32> = (0..n * k).map(|i| (i % 5) as f32 * 0.1 - 0.2).collect();
    let w = cpu::pack_weights(n, k, &b, k);
    // GFLOP/s of `product` (one cache-resident block of `flops`, into a fresh output of `len`
    // values) run `reps` times on each of `threads` threads at once.
    let rate = |threads: usize,
                len: usize,
                flops: usize,
                reps: usize,
                product: &(dyn Fn(&mut [f32]) + Sync)| {
        on(threads, || {
            let per = threads.max(1);
            let secs = timed(runs, || {
                cpu::par_chunks_mut(&mut vec![0u8; per], 1, per > 1, |_, _| {
                    let mut c = vec![0.0f32; len];
                    for _ in 0..reps {
                        product(&mut c);
                    }
                    std::hint::black_box(&c);
                });
            });
            (flops * reps * per) as f64 / secs / 1e9
        })
    };
    let gemm = |threads: usize| {
        rate(threads, m * n, 2 * m * n * k, reps, &|c| {
            cpu::gemm_bt_packed(m, &a, k, &w, c, n, false, None, false)
        })
    };
    // The bf16 products of `--bf16` (AMX tiles, `vdpbf16ps` or portable) on a cache-resident
    // block of prompt-sized rows (AMX takes products of 16 rows and more).
    let (bm, bn, bk, breps) = (256usize, 512usize, 256usize, 8usize);
    let ba: Vec<f32> = (0..bm * bk).map(|i| (i % 7) as f32 * 0.1 - 0.3).collect();
    let bw = cpu::bf16::Bf16Weights::from_f32(bn, bk, &b[..bn * bk])?;
    let gemm_bf16 = |threads: usize| {
        rate(threads, bm * bn, 2 * bm * bn * bk, breps, &|c| {
            cpu::bf16::gemm_bt_bf16(bm, bn, bk, &ba, &bw, c, bn, false, None, false)
                .expect("shapes")
        })
    };
    // Reading memory: dot products over a buffer far larger than the caches.
    let len = args.megabytes.max(16) << 18;
    let big = vec![0.5f32; len];
    let read = |threads: usize| -> anyhow::Result<f64> {
        on(threads, || {
            let chunk = len.div_ceil(threads.max(1));
            let secs = timed(runs, || {
                let sums = cpu::par_map(threads, 1, |t| {
                    let s = &big[(t * chunk).min(len)..((t + 1) * chunk).min(len)];
                    cpu::dot(s, s)
                });
                std::hint::black_box(sums);
            });
            (len * 4) as f64 / secs / 1e9
        })
    };
    // The decode product (one row) over weights far larger than the caches.
    let (dn, dk) = (4096usize, 1024usize);
    let mats = (args.megabytes.max(16) << 20) / (dn * dk * 4);
    let dw: Vec<f32> = (0..dn * dk)
        .map(|i| f32::from_bits((((i % 251) as f32 / 251.0 - 0.5).to_bits()) & 0xffff_0000))
        .collect();
    let packed: Vec<_> = (0..mats.max(1))
        .map(|_| cpu::pack_weights(dn, dk, &dw, dk))
        .collect();
    let halves: Vec<_> = packed
        .iter()
        .map(|p| cpu::PackedBf16::from_packed(p).expect("bf16 values"))
        .collect();
    let x = vec![0.25f32; dk];
    let mut y = vec![0.0f32; dn];
    let f32_secs = timed(runs, || {
        cpu::on_pool(|| {
            for p in &packed {
                cpu::gemm_bt_packed(1, &x, dk, p, &mut y, dn, false, None, false);
            }
        })
    });
    let bf16_secs = timed(runs, || {
        cpu::on_pool(|| {
            for p in &halves {
                cpu::gemm_bt_packed_bf16(1, &x, dk, p, &mut y, dn, false, None, false);
            }
        })
    });
    let bytes = (packed.len() * dn * dk) as f64;
    let rows = [
        ("gemm_f32_gflops_1", gemm(1)?),
        ("gemm_f32_gflops_all", gemm(all)?),
        ("gemm_bf16_gflops_1", gemm_bf16(1)?),
        ("gemm_bf16_gflops_all", gemm_bf16(all)?),
        ("read_gbps_1", read(1)?),
        ("read_gbps_all", read(all)?),
        ("decode_f32_weights_gbps", bytes * 4.0 / f32_secs / 1e9),
        ("decode_bf16_weights_gbps", bytes * 2.0 / bf16_secs / 1e9),
    ];
    let cpu_name = super::cpu_name();
    if args.json {
        let mut v = serde_json::json!({"cpu": cpu_name, "isa": cpu::isa(),
            "bf16_isa": cpu::bf16::kernel_name(), "threads": all});
        for (k, x) in rows {
            v[k] = serde_json::json!((x * 10.0).round() / 10.0);
        }
        println!("{v}");
        return Ok(());
    }
    println!(
        "CPU: {cpu_name}; kernels: {} (bf16 products: {}); {all} threads; medians of {runs} runs",
        cpu::isa(),
        cpu::bf16::kernel_name()
    );
    println!("| probe | value |");
    println!("|---|---|");
    let label = |k: &str| match k {
        "gemm_f32_gflops_1" => "f32 GEMM, cache-resident, 1 thread (GFLOP/s)".to_owned(),
        "gemm_f32_gflops_all" => format!("f32 GEMM, cache-resident, {all} threads (GFLOP/s)"),
        "gemm_bf16_gflops_1" => format!(
            "bf16 GEMM ({}), cache-resident, 1 thread (GFLOP/s)",
            cpu::bf16::kernel_name()
        ),
        "gemm_bf16_gflops_all" => format!(
            "bf16 GEMM ({}), cache-resident, {all} threads (GFLOP/s)",
            cpu::bf16::kernel_name()
        ),
        "read_gbps_1" => "memory read, 1 thread (GB/s)".to_owned(),
        "read_gbps_all" => format!("memory read, {all} threads (GB/s)"),
        "decode_f32_weights_gbps" => "decode product (1 row), f32 weights streamed (GB/s)".into(),
        _ => "decode product (1 row), bf16 weights streamed (GB/s)".into(),
    };
    for (k, x) in rows {
        println!("| {} | {x:.1} |", label(k));
    }
    Ok(())
}
