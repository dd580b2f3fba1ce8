//! `lattice bench`: embedding throughput and latency on the sentences of an STS-style CSV,
//! the workload of the ONNX Runtime comparison in docs/benchmarks.md
//! (`scripts/bench_embed.sh` runs both).
//!
//! Throughput: every unique sentence, in file order, embedded in batches of `--batch`; the
//! median over `--runs` runs. Latency: the first `--latency-samples` sentences one at a time,
//! the median. Tokenization is timed separately and excluded from both. The kernel rate is the
//! model's dense + attention FLOPs over the forward time.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use lattice_embed::Embedder;
use lattice_inference::model::PackedBatch;

/// Arguments of `lattice bench`.
#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct Args {
    #[command(subcommand)]
    command: Option<BenchCommand>,
    /// Model directory.
    #[arg(long, required = true)]
    model: Option<String>,
    /// CSV of sentence pairs (sentence1, sentence2, score), e.g. STS-B dev.
    #[arg(long, required = true)]
    data: Option<PathBuf>,
    /// Sentences per batch.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Timed throughput runs (the median is reported).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Sentences embedded one at a time for the latency figure.
    #[arg(long, default_value_t = 200)]
    latency_samples: usize,
    /// Worker threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Where the encoder runs (`cpu`, `cuda`, `cuda:N`; BERT-family encoders on a GPU).
    #[arg(long, default_value = "cpu")]
    device: String,
    #[command(flatten)]
    precision: super::EncoderMode,
}

/// Benchmarks other than embeddings.
#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// Prompt processing and generation tokens/s of a decoder, as llama-bench measures them.
    Generate(super::bench_generate::Args),
    /// Load against a running `lattice serve`: mixed embeddings + chat, or streams scaling.
    Serve(super::bench_serve::Args),
    /// Compile and per-step mask times of JSON-Schema constraints over a vocabulary.
    Grammar(super::bench_grammar::Args),
    /// This machine's limits as the kernels reach them: GEMM GFLOP/s, read GB/s, decode GB/s.
    Peaks(super::bench_peaks::Args),
    /// A vision-language model on one image: preprocessing, the tower, time to first token.
    Vision(super::bench_vision::Args),
}

/// Median of `v` (sorts it).
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        Some(BenchCommand::Generate(a)) => return super::bench_generate::run(a),
        Some(BenchCommand::Serve(a)) => return super::bench_serve::run(a),
        Some(BenchCommand::Grammar(a)) => return super::bench_grammar::run(a),
        Some(BenchCommand::Peaks(a)) => return super::bench_peaks::run(a),
        Some(BenchCommand::Vision(a)) => return super::bench_vision::run(a),
        None => {}
    }
    let (Some(model), Some(data)) = (args.model, args.data) else {
        anyhow::bail!(
            "`lattice bench` needs --model and --data (or the `generate` / `serve` subcommand)"
        );
    };
    super::init_pool(args.threads)?;
    let batch_size = args.batch.max(1);
    let pairs = super::eval::read_sts_csv(&data)?;
    let mut seen = HashSet::new();
    let sentences: Vec<&str> = pairs
        .iter()
        .flat_map(|p| [p.a.as_str(), p.b.as_str()])
        .filter(|s| seen.insert(*s))
        .collect();
    let device = lattice_inference::backend::Device::open(&args.device)?;
    let weights = args.precision.held_as(&device);
    let options = lattice_embed::EmbedderOptions {
        device,
        mode: args.precision.mode(),
        ..Default::default()
    };
    let embedder = lattice_embed::resolve_model_dir(&model)
        .and_then(|dir| Embedder::load_dir(&dir, options))
        .with_context(|| format!("cannot load model `{model}`"))?;

    let t0 = Instant::now();
    let ids: Vec<Vec<u32>> = sentences
        .iter()
        .map(|s| embedder.token_ids(s))
        .collect::<Result<_, _>>()?;
    let tokenize_s = t0.elapsed().as_secs_f64();
    let n_tokens: usize = ids.iter().map(Vec::len).sum();
    let flops: f64 = ids
        .chunks(batch_size)
        .map(|chunk| {
            let mut b = PackedBatch::new();
            for s in chunk {
                b.push(s, &[]);
            }
            embedder.encoder_info().forward_flops(&b)
        })
        .sum();

    // One untimed pass first (page faults, thread pool start-up), as the ORT side does.
    for chunk in ids.chunks(batch_size) {
        embedder.embed_ids(chunk)?;
    }
    let mut secs = Vec::with_capacity(args.runs);
    for run in 0..args.runs.max(1) {
        let t = Instant::now();
        for chunk in ids.chunks(batch_size) {
            embedder.embed_ids(chunk)?;
        }
        let s = t.elapsed().as_secs_f64();
        eprintln!(
            "bench: run {}/{}: {:.0} sentences/s",
            run + 1,
            args.runs.max(1),
            sentences.len() as f64 / s
        );
        secs.push(s);
    }
    let run_s = median(&mut secs);

    let mut lat = Vec::with_capacity(args.latency_samples);
    for s in ids.iter().take(args.latency_samples) {
        let t = Instant::now();
        embedder.embed_ids(std::slice::from_ref(s))?;
        lat.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let latency_ms = if lat.is_empty() {
        f64::NAN
    } else {
        median(&mut lat)
    };

    let report = serde_json::json!({
        "engine": "lattice",
        "device": args.device,
        "weights": weights,
        "cpu": super::cpu_name(),
        "isa": lattice_inference::backend::cpu::isa(),
        "bf16_isa": lattice_inference::backend::cpu::bf16::linear_products(),
        "threads": rayon::current_num_threads(),
        "sentences": sentences.len(),
        "tokens": n_tokens,
        "batch": batch_size,
        "runs": secs.len(),
        "sentences_per_s": sentences.len() as f64 / run_s,
        "tokens_per_s": n_tokens as f64 / run_s,
        "latency_ms_median": latency_ms,
        "gflops": flops / run_s / 1e9,
        "tokenize_s": tokenize_s,
    });
    println!("{report}");
    Ok(())
}
