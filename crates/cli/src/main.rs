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

fn main() {
    let cli = Cli::parse();
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
