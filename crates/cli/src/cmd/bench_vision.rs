//! `lattice bench vision`: how fast a vision-language model takes an image. Preprocessing
//! (decode, resize, patches), the vision tower alone (GFLOP/s from its operation count), and
//! time to first token of an image plus a short question through the engine; medians of
//! `--runs` runs, beside the CPU model and the kernels chosen.

use std::path::PathBuf;
use std::time::Instant;

use lattice_inference::chat::RenderOptions;
use lattice_inference::engine::{generate, GenerateRequest};
use lattice_inference::model::vision::ImagePatches;
use lattice_inference::sample::SamplingParams;
use lattice_inference::vision::ImageLimits;

use super::generate::{user_message, ModelArgs};

/// Arguments of `lattice bench vision`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// The image (PNG, JPEG or WebP).
    #[arg(long)]
    image: PathBuf,
    /// The question asked with the image for the time to first token.
    #[arg(long, default_value = "What is in this picture?")]
    prompt: String,
    /// Timed runs (medians are reported).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<()> {
    let model = args.model.load()?;
    let vision = model
        .vision
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("{} has no vision tower", args.model.model.display()))?;
    let bytes =
        std::fs::read(&args.image).map_err(|e| anyhow::anyhow!("{}: {e}", args.image.display()))?;
    let runs = args.runs.max(1);
    let limits = ImageLimits::default();
    let (mut prep, mut encode, mut ttft) = (Vec::new(), Vec::new(), Vec::new());
    let mut image = None;
    for _ in 0..runs {
        let t = Instant::now();
        let img = model
            .prepare_image(&bytes, &limits)
            .map_err(|e| anyhow::anyhow!("{}: {e}", args.image.display()))?;
        prep.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        vision.tower.encode(&[ImagePatches {
            pixel_values: &img.pixel_values,
            grid_thw: img.grid_thw,
        }])?;
        encode.push(t.elapsed().as_secs_f64());
        image = Some(img);
    }
    let img = image.expect("at least one run");
    let opts = RenderOptions {
        add_generation_prompt: true,
        ..Default::default()
    };
    let ids = model.encode_chat(&[user_message(&args.prompt, 1)], &opts)?;
    let ids = model.expand_images(ids, std::slice::from_ref(&img))?;
    let prompt_tokens = ids.len();
    for _ in 0..runs {
        let mut req = GenerateRequest::new(ids.clone(), 1, SamplingParams::greedy());
        req.images = vec![img.clone()];
        let t = Instant::now();
        generate(&model, &req, &mut |_| true)?;
        ttft.push(t.elapsed().as_secs_f64());
    }
    let flops = vision.tower.flops(img.grid_thw);
    let (prep, encode, ttft) = (median(&mut prep), median(&mut encode), median(&mut ttft));
    let [_, gh, gw] = img.grid_thw;
    let patch = vision.processor.patch_size;
    if args.json {
        let v = serde_json::json!({
            "cpu": super::cpu_name(),
            "isa": lattice_inference::backend::cpu::isa(),
            "threads": rayon::current_num_threads(),
            "resized": [gh * patch, gw * patch],
            "patches": img.pixel_values.len() / vision.tower.config().patch_values(),
            "image_tokens": vision.tokens_of(&img),
            "prompt_tokens": prompt_tokens,
            "preprocess_s": prep,
            "encode_s": encode,
            "encode_gflops": flops / 1e9,
            "encode_gflop_per_s": flops / encode / 1e9,
            "ttft_s": ttft,
            "runs": runs,
        });
        println!("{v}");
        return Ok(());
    }
    println!(
        "CPU: {}; kernels: {}; {} threads; image resized to {}x{} ({} patches, {} tokens); medians of {runs} runs",
        super::cpu_name(),
        lattice_inference::backend::cpu::isa(),
        rayon::current_num_threads(),
        gw * patch,
        gh * patch,
        gh * gw,
        vision.tokens_of(&img),
    );
    println!("| step | seconds |");
    println!("|---|---|");
    println!("| preprocess (decode, resize, patches) | {prep:.4} |");
    println!(
        "| vision tower ({:.1} GFLOP, {:.1} GFLOP/s) | {encode:.3} |",
        flops / 1e9,
        flops / encode / 1e9
    );
    println!("| time to first token ({prompt_tokens} prompt tokens) | {ttft:.3} |");
    Ok(())
}
