//! `lattice`: the command line. This file only parses arguments; each subcommand lives in
//! `cmd/<name>.rs`.

mod cmd;

use clap::{Parser, Subcommand};

/// Lattice: a pure-Rust inference engine.
#[derive(Parser)]
#[command(name = "lattice", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Embed texts: one JSON object `{"embedding": [...]}` per text on stdout.
    Embed(cmd::embed::Args),
    /// Tokenize texts: one JSON object `{"ids": [...], "tokens": [...]}` per text on stdout.
    Tokenize(cmd::tokenize::Args),
    /// Score passages against a query with a cross-encoder: `{"index": i, "score": s}` per
    /// passage, best first.
    Rerank(cmd::rerank::Args),
    /// Evaluate a model on a benchmark.
    #[command(subcommand)]
    Eval(cmd::eval::EvalCommand),
    /// Measure speed: embedding throughput and latency on a dataset (`lattice bench --model
    /// DIR --data CSV`), or prompt and generation tokens/s (`lattice bench generate`).
    Bench(cmd::bench::Args),
    /// Complete a prompt with a decoder (model folder or .gguf file).
    Generate(cmd::generate::Args),
    /// Perplexity of a decoder over a text file (llama.cpp's `llama-perplexity` semantics).
    Perplexity(cmd::perplexity::Args),
    /// Remove the K layers of least block influence (ShortGPT) from a GGUF decoder.
    Prune(cmd::prune::Args),
    /// Re-quantize a GGUF decoder: plain block types, or QuaRot (rotated, 4-bit weights with
    /// int8 activations).
    Quantize(cmd::quantize::Args),
    /// Chat interactively with a decoder, using its chat template.
    Chat(cmd::chat::Args),
    /// Serve generation, embeddings and reranking over HTTP (OpenAI and text-embeddings-inference
    /// routes) with continuous batching.
    Serve(cmd::serve::Args),
    /// Fetch a model from the Hugging Face hub into the shared cache; prints its folder.
    #[cfg(feature = "download")]
    Download(cmd::download::Args),
}

/// Keeps freed memory in the process for the next allocation (glibc): every forward pass
/// allocates its activations afresh (a 512-token prompt's products take up to ~15 MB each), and
/// with glibc's defaults those come from fresh `mmap` pages (page faults and kernel zeroing)
/// and go back to the kernel when freed. Measured (docs/benchmarks.md, "Freed memory kept"):
/// pp512 +16% on BitNet's 2B4T shape, +12% on SmolLM2-135M. `LATTICE_MALLOC=default` keeps
/// glibc's defaults (memory freed is returned to the system sooner).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn keep_freed_memory() {
    if std::env::var_os("LATTICE_MALLOC").is_some_and(|v| v == "default") {
        return;
    }
    // SAFETY: mallopt only sets glibc allocator parameters; it is called before any other
    // thread exists, with valid parameter numbers and values in range.
    unsafe {
        // Blocks below 32 MiB (glibc's largest accepted threshold) come from the heap...
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        // ...and the heap is returned to the system only past 1 GiB of free space at its top.
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}

fn main() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    keep_freed_memory();
    let cli = Cli::parse();
    // Commands with a --threads option build the worker pool themselves (as they load their
    // model); every other one gets the default pool here, before any parallel work.
    let own_pool = matches!(
        cli.command,
        Command::Bench(_)
            | Command::Generate(_)
            | Command::Chat(_)
            | Command::Perplexity(_)
            | Command::Prune(_)
            | Command::Serve(_)
    );
    if !own_pool {
        if let Err(e) = cmd::init_pool(None) {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
    }
    let result = match cli.command {
        Command::Embed(a) => cmd::embed::run(a),
        Command::Tokenize(a) => cmd::tokenize::run(a),
        Command::Rerank(a) => cmd::rerank::run(a),
        Command::Eval(c) => cmd::eval::run(c),
        Command::Bench(a) => cmd::bench::run(a),
        Command::Generate(a) => cmd::generate::run(a),
        Command::Chat(a) => cmd::chat::run(a),
        Command::Perplexity(a) => cmd::perplexity::run(a),
        Command::Prune(a) => cmd::prune::run(a),
        Command::Quantize(a) => cmd::quantize::run(a),
        Command::Serve(a) => cmd::serve::run(a),
        #[cfg(feature = "download")]
        Command::Download(a) => cmd::download::run(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
