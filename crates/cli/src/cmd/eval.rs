//! `lattice eval sts`: Spearman correlation (×100) between the cosine similarity of each
//! sentence pair's embeddings and the gold score, as sentence-transformers'
//! `EmbeddingSimilarityEvaluator` reports it.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use lattice_embed::{eval, vector, Embedder, EmbedderOptions, WeightMode};

/// Evaluation tasks.
#[derive(clap::Subcommand)]
pub enum EvalCommand {
    /// Semantic textual similarity on a CSV of sentence1, sentence2, score.
    Sts(StsArgs),
}

/// Arguments of `lattice eval sts`.
#[derive(clap::Args)]
pub struct StsArgs {
    /// Model directory.
    #[arg(long)]
    model: String,
    /// CSV with columns sentence1, sentence2, score (a header row is optional).
    #[arg(long)]
    data: PathBuf,
    /// With --bf16 / --q8: the model is also run in f32 and the report gives how far each
    /// sentence's embedding is from the f32 one (1 − cos: max, mean).
    #[command(flatten)]
    precision: super::EncoderMode,
}

/// Runs the subcommand.
pub fn run(cmd: EvalCommand) -> anyhow::Result<()> {
    match cmd {
        EvalCommand::Sts(a) => sts(a),
    }
}

/// One STS pair.
pub struct StsPair {
    /// First sentence.
    pub a: String,
    /// Second sentence.
    pub b: String,
    /// Gold similarity.
    pub score: f64,
}

/// Reads `sentence1,sentence2,score` rows (RFC 4180 quoting); a first row whose score is not a
/// number is taken as a header.
pub fn read_sts_csv(path: &Path) -> anyhow::Result<Vec<StsPair>> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_path(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    let mut pairs = Vec::new();
    for (i, rec) in reader.records().enumerate() {
        let rec = rec.with_context(|| format!("{}: bad CSV at row {}", path.display(), i + 1))?;
        if rec.len() < 3 {
            bail!(
                "{}: row {} has {} columns, expected 3 (sentence1, sentence2, score)",
                path.display(),
                i + 1,
                rec.len()
            );
        }
        let score = match rec[2].trim().parse::<f64>() {
            Ok(s) => s,
            Err(_) if i == 0 => continue,
            Err(_) => bail!(
                "{}: row {}: score `{}` is not a number",
                path.display(),
                i + 1,
                &rec[2]
            ),
        };
        pairs.push(StsPair {
            a: rec[0].to_string(),
            b: rec[1].to_string(),
            score,
        });
    }
    if pairs.is_empty() {
        bail!("{}: no rows", path.display());
    }
    Ok(pairs)
}

fn sts(args: StsArgs) -> anyhow::Result<()> {
    let pairs = read_sts_csv(&args.data)?;
    let mode = args.precision.mode();
    let load = |mode| {
        let options = EmbedderOptions {
            mode,
            ..Default::default()
        };
        lattice_embed::resolve_model_dir(&args.model)
            .and_then(|dir| Embedder::load_dir(&dir, options))
            .with_context(|| format!("cannot load model `{}`", args.model))
    };
    let embedder = load(mode)?;
    let reference = (mode != WeightMode::F32)
        .then(|| load(WeightMode::F32))
        .transpose()?;
    let start = std::time::Instant::now();
    let mut sims = Vec::with_capacity(pairs.len());
    let mut drift: Vec<f64> = Vec::new();
    for chunk in pairs.chunks(64) {
        let texts: Vec<&str> = chunk
            .iter()
            .flat_map(|p| [p.a.as_str(), p.b.as_str()])
            .collect();
        let v = embedder.embed(&texts)?;
        for pair in v.chunks_exact(2) {
            sims.push(vector::cosine(&pair[0], &pair[1]) as f64);
        }
        if let Some(r) = &reference {
            let w = r.embed(&texts)?;
            drift.extend(
                v.iter()
                    .zip(&w)
                    .map(|(a, b)| 1.0 - vector::cosine(a, b) as f64),
            );
        }
        eprint!("\reval sts: {}/{} pairs", sims.len(), pairs.len());
    }
    eprintln!(" ({:.1} s)", start.elapsed().as_secs_f64());
    let gold: Vec<f64> = pairs.iter().map(|p| p.score).collect();
    let rho = eval::spearman(&sims, &gold) * 100.0;
    let mut report = serde_json::json!({
        "task": "sts",
        "pairs": pairs.len(),
        "weights": args.precision.held_as(&lattice_inference::backend::Device::Cpu),
        "spearman": (rho * 1e4).round() / 1e4,
    });
    if !drift.is_empty() {
        let max = drift.iter().copied().fold(0.0f64, f64::max);
        let mean = drift.iter().sum::<f64>() / drift.len() as f64;
        report["vs_f32"] = serde_json::json!({
            "max_1_minus_cos": max,
            "mean_1_minus_cos": mean,
        });
    }
    println!("{report}");
    Ok(())
}
