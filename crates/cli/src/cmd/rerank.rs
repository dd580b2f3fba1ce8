//! `lattice rerank`: scores passages against a query with a cross-encoder and prints
//! `{"index": i, "score": s}` lines, best first.

use std::path::PathBuf;

use anyhow::Context;
use lattice_embed::Reranker;

/// Arguments of `lattice rerank`.
#[derive(clap::Args)]
pub struct Args {
    /// Cross-encoder model directory (BertForSequenceClassification).
    #[arg(long)]
    model: PathBuf,
    /// The query.
    #[arg(long)]
    query: String,
    /// JSONL file with one `{"text": ...}` passage per line (`-` for stdin).
    #[arg(long)]
    input: Option<PathBuf>,
    /// Print raw logits instead of activated scores.
    #[arg(long)]
    raw: bool,
    /// Where the model runs (`cpu`; GPUs are not yet supported for encoders).
    #[arg(long, default_value = "cpu")]
    device: String,
    #[command(flatten)]
    precision: super::EncoderMode,
    /// Passages (after those of --input).
    passages: Vec<String>,
}

#[derive(serde::Serialize)]
struct Line {
    index: usize,
    score: f32,
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<()> {
    super::encoder_device(&args.device)?;
    let passages = super::input::read_texts(args.input.as_deref(), &args.passages)?;
    let reranker =
        Reranker::load_dir_with(&super::resolve_model(&args.model)?, args.precision.mode())
            .with_context(|| format!("cannot load cross-encoder {}", args.model.display()))?;
    let refs: Vec<&str> = passages.iter().map(String::as_str).collect();
    let scores = if args.raw {
        reranker.logits(&args.query, &refs)?
    } else {
        reranker.scores(&args.query, &refs)?
    };
    let mut lines: Vec<Line> = scores
        .into_iter()
        .enumerate()
        .map(|(index, score)| Line { index, score })
        .collect();
    lines.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.index.cmp(&b.index)));
    super::print_jsonl(lines)
}
