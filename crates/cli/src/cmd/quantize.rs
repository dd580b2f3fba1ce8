//! `lattice quantize`: re-quantizes a GGUF decoder (lattice_inference::quantize): plain block
//! types, or QuaRot (norms folded, residual stream rotated, Q4 weights, int8 activations).

use std::path::PathBuf;

use anyhow::Context;
use lattice_inference::quant::QuantType;
use lattice_inference::quantize::{quantize_gguf, Calibration, Method, Rounding};

/// Arguments of `lattice quantize`.
#[derive(clap::Args)]
pub struct Args {
    /// f32 | f16 | q8_0 | q4_0 | q4_1 (every matrix to that type), quarot-w4a8 (QuaRot, Q4_1
    /// layers), quarot-w4a8-sym (QuaRot, Q4_0 layers), rotate-f32 (QuaRot's rotation alone);
    /// a QuaRot name + `-online` also rotates the down projections' inputs at run time (such
    /// files run correctly in Lattice only).
    #[arg(long)]
    method: String,
    /// How 4-bit groups are rounded: `nearest` (ggml's reference quantizers), `mse` (each
    /// group's scale / range searched for the least squared error) or `gptq` (GPTQ over the
    /// layers' input Hessians on --calibration). Default: gptq with --calibration, else mse
    /// for QuaRot and nearest for the plain types.
    #[arg(long)]
    rounding: Option<String>,
    /// Calibration text (UTF-8) for GPTQ: its first --calibration-tokens tokens are run.
    #[arg(long)]
    calibration: Option<PathBuf>,
    /// Calibration tokens (whole chunks of --ctx).
    #[arg(long, default_value_t = 16384, requires = "calibration")]
    calibration_tokens: usize,
    /// Tokens per calibration chunk (each run from an empty cache).
    #[arg(long, default_value_t = 512, requires = "calibration")]
    ctx: usize,
    /// Seed of QuaRot's random Hadamard signs (QuaRot methods only; default 0).
    #[arg(long)]
    seed: Option<u64>,
    /// The GGUF decoder to read (any block types; dequantized first).
    input: PathBuf,
    /// The GGUF file to write.
    output: PathBuf,
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<()> {
    let method = Method::parse(&args.method, args.seed.unwrap_or(0)).ok_or_else(|| {
        anyhow::anyhow!(
            "--method `{}` is not one of: {}",
            args.method,
            Method::NAMES.join(", ")
        )
    })?;
    if let (Some(_), Method::Plain(_)) = (args.seed, method) {
        anyhow::bail!(
            "--seed applies to the QuaRot methods only, not `{}`",
            args.method
        );
    }
    let four_bit = match method {
        Method::Plain(t) | Method::Quarot { weights: t, .. } => {
            matches!(t, QuantType::Q4_0 | QuantType::Q4_1)
        }
    };
    for (given, flag) in [
        (args.rounding.is_some(), "--rounding"),
        (args.calibration.is_some(), "--calibration"),
    ] {
        if given && !four_bit {
            anyhow::bail!(
                "{flag} applies to 4-bit groups (q4_0, q4_1, quarot-w4a8*), not `{}`",
                args.method
            );
        }
    }
    let rounding = match (args.rounding.as_deref(), method) {
        (Some("nearest"), _) => Rounding::Nearest,
        (Some("mse"), _) => Rounding::Mse,
        (Some("gptq"), _) => Rounding::Gptq,
        (Some(other), _) => anyhow::bail!("--rounding `{other}` is not nearest, mse or gptq"),
        (None, _) if args.calibration.is_some() => Rounding::Gptq,
        (None, Method::Quarot { .. }) => Rounding::Mse,
        (None, Method::Plain(_)) => Rounding::Nearest,
    };
    match (rounding, &args.calibration) {
        (Rounding::Gptq, None) => {
            anyhow::bail!("--rounding gptq needs --calibration TEXT (the layers' inputs)")
        }
        (Rounding::Nearest | Rounding::Mse, Some(_)) => {
            anyhow::bail!("--calibration is used by --rounding gptq only")
        }
        _ => {}
    }
    let text = match &args.calibration {
        Some(path) => Some(std::fs::read_to_string(path).with_context(|| {
            format!(
                "cannot read the calibration text `{}` (UTF-8)",
                path.display()
            )
        })?),
        None => None,
    };
    let calibration = text.as_deref().map(|text| Calibration {
        text,
        tokens: args.calibration_tokens,
        ctx: args.ctx,
    });
    let input = super::resolve_model(&args.input)?;
    if input.extension().and_then(|e| e.to_str()) != Some("gguf") {
        anyhow::bail!(
            "`{}`: lattice quantize reads and writes GGUF (convert a checkpoint with llama.cpp's \
             convert_hf_to_gguf.py first)",
            input.display()
        );
    }
    if args.output == input {
        anyhow::bail!("the output `{}` is the input itself", args.output.display());
    }
    let t0 = std::time::Instant::now();
    let mut last = None;
    let q = quantize_gguf(
        &input,
        &args.output,
        method,
        rounding,
        calibration.as_ref(),
        |stage, done, total| {
            if last.is_some_and(|s| s != stage) {
                eprintln!();
            }
            last = Some(stage);
            eprint!("\rquantize: {} {done}/{total}", stage.name());
        },
    )?;
    eprintln!(
        "\nwrote {} ({} tensors, {:.1} MB of tensors from {:.1} MB) in {:.1} s",
        args.output.display(),
        q.tensors,
        q.bytes_after as f64 / 1e6,
        q.bytes_before as f64 / 1e6,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
