//! `lattice tokenize`: one `{"ids": [...], "tokens": [...]}` line per input text, exactly as HF
//! `tokenizers` encodes with the model's `tokenizer.json`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use lattice_inference::tokenizer::Tokenizer;

/// Arguments of `lattice tokenize`.
#[derive(clap::Args)]
pub struct Args {
    /// Model directory holding tokenizer.json (or vocab.txt).
    #[arg(long)]
    model: PathBuf,
    /// JSONL file with one `{"text": ...}` object per line (`-` for stdin).
    #[arg(long)]
    input: Option<PathBuf>,
    /// Leave special tokens ([CLS], [SEP], ...) out.
    #[arg(long)]
    no_special: bool,
    /// Texts to tokenize (after those of --input).
    texts: Vec<String>,
}

#[derive(serde::Serialize)]
struct Line<'a> {
    ids: &'a [u32],
    tokens: &'a [String],
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<()> {
    let texts = super::input::read_texts(args.input.as_deref(), &args.texts)?;
    let tokenizer = load(&super::resolve_model(&args.model)?)?;
    let mut encodings = Vec::with_capacity(texts.len());
    for t in &texts {
        encodings.push(tokenizer.encode(t, !args.no_special));
    }
    super::print_jsonl(encodings.iter().map(|e| Line {
        ids: &e.ids,
        tokens: &e.tokens,
    }))
}

fn load(dir: &Path) -> anyhow::Result<Tokenizer> {
    Tokenizer::from_dir(dir)
        .with_context(|| format!("cannot load a tokenizer from {}", dir.display()))
}
