//! `lattice embed`: one `{"embedding": [...]}` line per input text.

use std::path::PathBuf;

use anyhow::Context;
use lattice_embed::{Embedder, EmbedderOptions, TextKind};

/// Arguments of `lattice embed`.
#[derive(clap::Args)]
pub struct Args {
    /// Model directory (sentence-transformers layout or a plain transformers encoder).
    #[arg(long)]
    model: String,
    /// JSONL file with one `{"text": ...}` object per line (`-` for stdin).
    #[arg(long)]
    input: Option<PathBuf>,
    /// Embed as search queries (adds the model's query prefix, e.g. `query: `).
    #[arg(long, conflicts_with = "passage")]
    query: bool,
    /// Embed as passages (adds the model's passage prefix, e.g. `passage: `).
    #[arg(long)]
    passage: bool,
    /// Matryoshka output size: keep the first N dimensions (renormalized when the model
    /// normalizes), for models trained for it (e.g. Qwen3-Embedding, 32..full).
    #[arg(long)]
    dimensions: Option<usize>,
    /// Where the model runs (`cpu`, `cuda`, `cuda:N`; BERT-family encoders on a GPU).
    #[arg(long, default_value = "cpu")]
    device: String,
    #[command(flatten)]
    precision: super::EncoderMode,
    /// Texts to embed (after those of --input).
    texts: Vec<String>,
}

#[derive(serde::Serialize)]
struct Line<'a> {
    embedding: &'a [f32],
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<()> {
    let device = lattice_inference::backend::Device::open(&args.device)?;
    let texts = super::input::read_texts(args.input.as_deref(), &args.texts)?;
    let options = EmbedderOptions {
        dimensions: args.dimensions,
        device,
        mode: args.precision.mode(),
        ..Default::default()
    };
    let embedder = lattice_embed::resolve_model_dir(&args.model)
        .and_then(|dir| Embedder::load_dir(&dir, options))
        .with_context(|| format!("cannot load model `{}`", args.model))?;
    let kind = if args.query {
        TextKind::Query
    } else if args.passage {
        TextKind::Passage
    } else {
        TextKind::Plain
    };
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let vectors = embedder.embed_as(&refs, kind)?;
    super::print_jsonl(vectors.iter().map(|v| Line { embedding: v }))
}
