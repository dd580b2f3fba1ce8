//! One module per subcommand, plus the shared input reader.

pub mod bench;
pub mod bench_generate;
pub mod bench_grammar;
pub mod bench_peaks;
pub mod bench_serve;
pub mod bench_vision;
pub mod chat;
#[cfg(feature = "download")]
pub mod download;
pub mod embed;
pub mod eval;
pub mod generate;
pub mod input;
pub mod metrics;
pub mod perplexity;
pub mod prune;
pub mod quantize;
pub mod rerank;
pub mod serve;
pub mod tokenize;

use std::io::Write;

/// Writes one JSON value per line to stdout, flushing at the end.
pub fn print_jsonl<T: serde::Serialize>(items: impl IntoIterator<Item = T>) -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    for item in items {
        serde_json::to_writer(&mut out, &item)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

/// `--bf16` / `--q8` of the encoder commands (embed, rerank, bench, eval, serve): how an
/// encoder's matrices are held. Neither: f32, exact.
#[derive(clap::Args, Clone, Copy, Debug, Default)]
pub struct EncoderMode {
    /// Round the encoder's matrices to bf16 and multiply them with bf16-rounded activations,
    /// summing in f32 (half the weight memory; faster on CPUs with AVX512-BF16; not bit-equal
    /// to f32: docs/benchmarks.md states the cost).
    #[arg(long, conflicts_with = "q8")]
    pub bf16: bool,
    /// Quantize the encoder's matrices to int8 per output row at load and multiply with
    /// activations quantized to int8 per row (exact integer products, a quarter of the weight
    /// memory; Q8_0 blocks on a GPU; not bit-equal to f32: docs/benchmarks.md states the cost).
    #[arg(long)]
    pub q8: bool,
}

impl EncoderMode {
    /// The weight mode the flags ask for.
    pub fn mode(self) -> lattice_inference::model::source::WeightMode {
        use lattice_inference::model::source::WeightMode;
        if self.q8 {
            WeightMode::Q8
        } else if self.bf16 {
            WeightMode::Bf16
        } else {
            WeightMode::F32
        }
    }

    /// The name of how the matrices are held on `device` (`--q8` is int8 rows on the CPU).
    pub fn held_as(self, device: &lattice_inference::backend::Device) -> &'static str {
        let place = lattice_inference::model::source::Placement::new(self.mode(), device.clone());
        place.for_encoder().mode.name()
    }
}

/// Checks `--device` for the encoder commands (embed, rerank), which run on the CPU only for
/// now: anything else is refused with the reason rather than ignored.
pub fn encoder_device(spec: &str) -> anyhow::Result<()> {
    let device = lattice_inference::backend::Device::open(spec)?;
    if !device.is_cpu() {
        anyhow::bail!(
            "encoder models (embeddings, reranking) do not run on {device} yet; use --device cpu"
        );
    }
    Ok(())
}

/// A `--model` argument as a local path: an existing file or folder as is, else a hub id
/// (`ORG/NAME[@REV]`) through the Hugging Face cache, downloaded when missing.
pub fn resolve_model(model: &std::path::Path) -> anyhow::Result<std::path::PathBuf> {
    use anyhow::Context;
    match model.to_str() {
        Some(name) if !model.exists() => {
            lattice_hub::resolve_model(name).with_context(|| format!("cannot load model `{name}`"))
        }
        _ => Ok(model.to_path_buf()),
    }
}

/// The CPU model, from /proc/cpuinfo (empty elsewhere).
pub fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|n| n.trim().to_owned())
        })
        .unwrap_or_default()
}

/// Builds the global worker pool once: `threads` workers (default one per core), each flushing
/// subnormal floats to zero unless `LATTICE_SUBNORMALS=keep`
/// (`lattice_inference::backend::cpu::pool_builder`). A later call with no count, or the same
/// count, does nothing; asking for another count once the pool runs is an error.
pub fn init_pool(threads: Option<usize>) -> anyhow::Result<()> {
    use anyhow::Context;
    use lattice_inference::backend::cpu;
    static BUILT: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    if BUILT.get().is_some() {
        return match threads {
            Some(t) if t.max(1) != rayon::current_num_threads() => anyhow::bail!(
                "the thread pool already runs {} threads (asked for {t})",
                rayon::current_num_threads()
            ),
            _ => Ok(()),
        };
    }
    let flush = cpu::flush_wanted()?;
    cpu::pool_builder(threads)?
        .build_global()
        .context("cannot configure the thread pool")?;
    if flush {
        cpu::flush_subnormals();
    }
    let _ = BUILT.set(());
    Ok(())
}
