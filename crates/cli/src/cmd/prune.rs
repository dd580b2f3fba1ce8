//! `lattice prune`: ShortGPT layer pruning of a GGUF decoder (lattice_inference::prune): block
//! influence over a calibration text, the K least influential layers removed, a loadable GGUF
//! written.

use std::path::PathBuf;

use anyhow::Context;
use lattice_inference::prune::{block_influence, least_influential, prune_gguf};

use super::generate::ModelArgs;

/// Arguments of `lattice prune`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Calibration text (UTF-8): its first --calibration-tokens tokens are run.
    #[arg(long)]
    calibration: PathBuf,
    /// Layers to remove.
    #[arg(long)]
    remove: usize,
    /// Calibration tokens (whole chunks of --ctx).
    #[arg(long, default_value_t = 4096)]
    calibration_tokens: usize,
    /// Tokens per calibration chunk (each run from an empty cache).
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Print one JSON object (influence per layer, removed layers, sizes) on stdout.
    #[arg(long)]
    json: bool,
    /// The pruned GGUF file to write.
    out: PathBuf,
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<()> {
    let src = super::resolve_model(&args.model.model)?;
    if src.extension().and_then(|e| e.to_str()) != Some("gguf") {
        anyhow::bail!(
            "`{}`: lattice prune writes GGUF and reads a .gguf model (convert a checkpoint with \
             llama.cpp's convert_hf_to_gguf.py first)",
            src.display()
        );
    }
    if args.out == src {
        anyhow::bail!("the output `{}` is the model itself", args.out.display());
    }
    let text = std::fs::read_to_string(&args.calibration).with_context(|| {
        format!(
            "cannot read the calibration text `{}` (UTF-8)",
            args.calibration.display()
        )
    })?;
    let model = args.model.load()?;
    let n_layers = model.decoder.info().config.n_layers;
    if args.remove >= n_layers {
        anyhow::bail!(
            "--remove {} leaves no layer: the model has {n_layers}",
            args.remove
        );
    }
    let mut tokens = model.encode_prompt(&text, true)?;
    let ctx = args.ctx.max(1);
    let want = (args.calibration_tokens / ctx).max(1) * ctx;
    tokens.truncate(want);
    let t0 = std::time::Instant::now();
    let influence = block_influence(
        model.decoder.as_ref(),
        |n| model.new_cache(n),
        &tokens,
        ctx,
        |done, total| eprint!("\rcalibration: chunk {done}/{total}"),
    )?;
    eprintln!(" ({:.1} s)", t0.elapsed().as_secs_f64());
    let removed = least_influential(&influence, args.remove);
    for (i, b) in influence.iter().enumerate() {
        let mark = if removed.contains(&i) {
            "  removed"
        } else {
            ""
        };
        eprintln!("layer {i:3}: block influence {b:.5}{mark}");
    }
    drop(model);
    let pruned = prune_gguf(&src, &args.out, &removed)?;
    eprintln!(
        "wrote {}: {} -> {} layers, {:.1} -> {:.1} MB of tensors",
        args.out.display(),
        pruned.layers_before,
        pruned.layers_after,
        pruned.bytes_before as f64 / 1e6,
        pruned.bytes_after as f64 / 1e6
    );
    if args.json {
        let out = serde_json::json!({
            "model": src,
            "out": args.out,
            "calibration": args.calibration,
            "calibration_tokens": tokens.len(),
            "influence": influence,
            "removed": removed,
            "pruned": pruned,
        });
        println!("{out}");
    }
    Ok(())
}
