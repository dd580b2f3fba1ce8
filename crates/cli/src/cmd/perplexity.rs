//! `lattice perplexity`: a decoder's perplexity over a text file, with llama.cpp's
//! `llama-perplexity` semantics (lattice_inference::perplexity), so `lattice perplexity --model
//! F.gguf --text T --ctx 512` and `llama-perplexity -m F.gguf -f T -c 512` give the same figure.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use lattice_inference::perplexity::{perplexity, PerplexityOptions};

use super::generate::ModelArgs;

/// Arguments of `lattice perplexity`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// The text (UTF-8), tokenized whole.
    #[arg(long)]
    text: PathBuf,
    /// Tokens per chunk; the second half of each is scored (llama-perplexity's `-c`).
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Score only the first N chunks (llama-perplexity's `--chunks`).
    #[arg(long)]
    chunks: Option<usize>,
    /// Print one JSON object (perplexity, its ±, tokens, timing) on stdout at the end.
    #[arg(long)]
    json: bool,
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<()> {
    let bytes = std::fs::read(&args.text)
        .with_context(|| format!("cannot read the text `{}`", args.text.display()))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "the text `{}` is not UTF-8 (byte {})",
            args.text.display(),
            e.utf8_error().valid_up_to()
        )
    })?;
    let model = args.model.load()?;
    let t0 = std::time::Instant::now();
    let tokens = model.encode_prompt(&text, true)?;
    let tokenize_s = t0.elapsed().as_secs_f64();
    // The chunk's first token becomes the BOS when the model adds one (llama.cpp's rule).
    let bos = model
        .bos_prefix
        .or_else(|| model.tokenizer.encode("", true).ids.first().copied())
        .filter(|b| tokens.first() == Some(b));
    eprintln!(
        "perplexity: {} bytes, {} tokens (tokenized in {tokenize_s:.2} s), {} chunks of {}{}",
        text.len(),
        tokens.len(),
        (tokens.len() / args.ctx.max(1)).min(args.chunks.unwrap_or(usize::MAX)),
        args.ctx,
        bos.map_or(String::new(), |b| format!(", BOS {b} first"))
    );
    let t1 = std::time::Instant::now();
    let opts = PerplexityOptions {
        ctx: args.ctx,
        max_chunks: args.chunks,
        bos,
    };
    let mut err = std::io::stderr();
    let result = perplexity(
        model.decoder.as_ref(),
        |n| model.new_cache(n),
        &tokens,
        &opts,
        |done, total, ppl| {
            let _ = write!(err, "[{done}]{ppl:.4},");
            if done == total {
                let _ = writeln!(err);
            }
            let _ = err.flush();
        },
    )?;
    let eval_s = t1.elapsed().as_secs_f64();
    let tokens_per_s = (result.chunks * args.ctx) as f64 / eval_s;
    eprintln!(
        "Final estimate: PPL = {:.4} +/- {:.5} ({} tokens scored, {:.1} tokens/s evaluated)",
        result.ppl, result.ppl_error, result.scored, tokens_per_s
    );
    if args.json {
        let out = serde_json::json!({
            "model": args.model.model,
            "text": args.text,
            "ctx": args.ctx,
            "ppl": result.ppl,
            "ppl_error": result.ppl_error,
            "nll": result.nll,
            "scored": result.scored,
            "chunks": result.chunks,
            "tokens": result.tokens,
            "running": result.running,
            "tokenize_s": tokenize_s,
            "eval_s": eval_s,
            "tokens_per_s": tokens_per_s,
        });
        println!("{out}");
    }
    Ok(())
}
