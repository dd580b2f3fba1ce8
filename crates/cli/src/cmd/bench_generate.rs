//! `lattice bench generate`: prompt processing and generation speed of a decoder, measured the
//! way llama.cpp's `llama-bench` does (scripts/bench_generate.sh runs both side by side):
//! `pp N` = one forward pass over N prompt tokens from an empty cache; `tg M` = M one-token
//! decode steps from an empty cache (or after `--context` tokens, prefilled untimed). Token ids are pseudo-random (speed does not depend on
//! them). One untimed warm-up of each, then `--runs` timed runs; medians are reported, and the
//! generation rate is also given as weight bytes streamed per second.

use std::time::Instant;

use lattice_inference::engine::{BatchEngine, GenerateRequest};
use lattice_inference::model::batch::{ForwardBatch, RowOutputs};
use lattice_inference::model::decoder::Outputs;
use lattice_inference::sample::SamplingParams;

use super::bench::median;
use super::generate::ModelArgs;

/// Arguments of `lattice bench generate`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt tokens processed in one pass.
    #[arg(long, default_value_t = 512)]
    prompt_tokens: usize,
    /// Tokens generated one at a time.
    #[arg(long, default_value_t = 128)]
    gen_tokens: usize,
    /// Tokens already in the context before the generation test (prefilled untimed), to
    /// measure decode speed at long context.
    #[arg(long, default_value_t = 0)]
    context: usize,
    /// Timed runs of each test.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Also measure aggregate generation with this many concurrent streams (continuous
    /// batching: each step decodes every stream in one pass); 0 skips it.
    #[arg(long, default_value_t = 0)]
    streams: usize,
    /// Constrain the streams of the aggregate test to this regular expression (the cost of
    /// output constraints; a pattern that never completes keeps every stream running).
    #[arg(long, value_name = "RE")]
    regex: Option<String>,
    /// The streams' prompt: this file's text as a user message in the chat template (a real
    /// workload, e.g. a file to rewrite) instead of 16 tokens of the generation test.
    #[arg(long, value_name = "FILE")]
    stream_prompt: Option<std::path::PathBuf>,
    /// The streams sample at this temperature (seeded, one seed per stream) instead of
    /// decoding greedily.
    #[arg(long, default_value_t = 0.0, value_name = "T")]
    stream_temperature: f32,
    /// The streams' nucleus (top-p) mass when they sample.
    #[arg(long, default_value_t = 1.0, value_name = "P")]
    stream_top_p: f32,
    /// The streams' top-k when they sample (0: off).
    #[arg(long, default_value_t = 0, value_name = "K")]
    stream_top_k: usize,
    /// Speculative decoding in the streams test.
    #[command(flatten)]
    speculative: super::generate::SpeculativeArgs,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<()> {
    let model = args.model.load()?;
    let decoder = model.decoder.as_ref();
    let info = decoder.info();
    let vocab = info.config.vocab_size as u64;
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next_id = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % vocab) as u32
    };
    let prompt: Vec<u32> = (0..args.prompt_tokens.max(1)).map(|_| next_id()).collect();
    let gen_ids: Vec<u32> = (0..args.gen_tokens.max(1)).map(|_| next_id()).collect();

    let pp = |ids: &[u32]| -> anyhow::Result<f64> {
        let mut cache = model.new_cache(ids.len());
        let t = Instant::now();
        decoder.forward(ids, &[ids.len()], &mut [&mut cache], Outputs::LastLogits)?;
        Ok(t.elapsed().as_secs_f64())
    };
    let context: Vec<u32> = (0..args.context).map(|_| next_id()).collect();
    let tg = |ids: &[u32]| -> anyhow::Result<f64> {
        let mut cache = model.new_cache(context.len() + ids.len());
        for chunk in context.chunks(512) {
            decoder.forward(
                chunk,
                &[chunk.len()],
                &mut [&mut cache],
                Outputs::LastLogits,
            )?;
        }
        // Each step picks its token as greedy generation does (on the device for a GPU
        // model, whose decode steps are then recorded and replayed).
        let t = Instant::now();
        for &id in ids {
            let step =
                ForwardBatch::tokens(std::slice::from_ref(&id), &[1], RowOutputs::LastLogits);
            decoder.forward_greedy(&step, &mut [&mut cache])?;
        }
        Ok(t.elapsed().as_secs_f64())
    };
    let runs = args.runs.max(1);
    pp(&prompt)?;
    tg(&gen_ids[..gen_ids.len().min(8)])?;
    let mut pp_rates = Vec::with_capacity(runs);
    let mut tg_rates = Vec::with_capacity(runs);
    for r in 0..runs {
        let p = prompt.len() as f64 / pp(&prompt)?;
        let g = gen_ids.len() as f64 / tg(&gen_ids)?;
        eprintln!(
            "bench: run {}/{runs}: pp{} {p:.1} tokens/s, tg{} {g:.1} tokens/s",
            r + 1,
            prompt.len(),
            gen_ids.len()
        );
        pp_rates.push(p);
        tg_rates.push(g);
    }
    let pp_med = median(&mut pp_rates);
    let tg_med = median(&mut tg_rates);
    // Aggregate decode rate of `streams` sequences batched together (16-token prompts).
    let mut batch_rates = Vec::new();
    let constraint = match &args.regex {
        Some(re) => {
            Some(model.compile_constraint(&lattice_inference::grammar::Spec::Regex(re.clone()))?)
        }
        None => None,
    };
    let stream_prompt = match &args.stream_prompt {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
            let opts = lattice_inference::chat::RenderOptions {
                add_generation_prompt: true,
                ..Default::default()
            };
            Some(model.encode_chat(
                &[lattice_inference::chat::ChatMessage::new("user", &text)],
                &opts,
            )?)
        }
        None => None,
    };
    let (mut drafted, mut accepted, mut drafts) = (0usize, 0usize, 0usize);
    for _ in 0..if args.streams > 0 { runs } else { 0 } {
        let mut engine = BatchEngine::new(&model, args.streams);
        for s in 0..args.streams {
            let prompt: Vec<u32> = match &stream_prompt {
                Some(p) => p.clone(),
                None => gen_ids.iter().cycle().skip(s).take(16).copied().collect(),
            };
            let sampling = SamplingParams {
                temperature: args.stream_temperature,
                top_p: args.stream_top_p,
                top_k: args.stream_top_k,
                seed: Some(s as u64),
                ..SamplingParams::default()
            };
            let mut req = GenerateRequest::new(prompt, gen_ids.len(), sampling);
            req.ignore_eos = true;
            req.constraint = constraint.clone();
            args.speculative.apply(&mut req);
            args.speculative.check(&model)?;
            engine.submit(req)?;
        }
        // Prefill all streams first, then time the decode steps only.
        engine.step()?;
        let t = Instant::now();
        let done = engine.run_all()?;
        let tokens: usize = done
            .iter()
            .map(|(_, g)| g.token_ids.len().saturating_sub(1))
            .sum();
        drafted += done.iter().map(|(_, g)| g.drafted_tokens).sum::<usize>();
        drafts += done.iter().map(|(_, g)| g.drafts).sum::<usize>();
        accepted += done.iter().map(|(_, g)| g.accepted_tokens).sum::<usize>();
        batch_rates.push(tokens as f64 / t.elapsed().as_secs_f64());
    }
    let batch_med = (!batch_rates.is_empty()).then(|| median(&mut batch_rates));
    let gb_s = tg_med * info.weight_bytes as f64 / 1e9;
    if args.json {
        let v = serde_json::json!({
            "engine": "lattice",
            "model": args.model.model.display().to_string(),
            "weights": info.weight_mode.name(),
            "weight_bytes": info.weight_bytes,
            "cpu": super::cpu_name(),
            "isa": lattice_inference::backend::cpu::isa(),
            "bf16_isa": lattice_inference::backend::cpu::bf16::linear_products(),
            "q8_0_isa": lattice_inference::backend::cpu::qdot::q8_0_kernel_name(),
            "threads": rayon::current_num_threads(),
            "prompt_tokens": prompt.len(),
            "gen_tokens": gen_ids.len(),
            "context": context.len(),
            "runs": runs,
            "prompt_tokens_per_s": pp_med,
            "gen_tokens_per_s": tg_med,
            "gen_weight_gb_per_s": gb_s,
            "streams": args.streams,
            "stream_temperature": args.stream_temperature,
            "stream_top_p": args.stream_top_p,
            "stream_top_k": args.stream_top_k,
            "batched_gen_tokens_per_s": batch_med,
            "drafted_tokens": drafted,
            "drafts": drafts,
            "accepted_tokens": accepted,
        });
        println!("{v}");
    } else {
        println!(
            "CPU: {}; kernels: {} (bf16 products: {}; Q8_0 prompts: {}); {} threads; weights {}",
            super::cpu_name(),
            lattice_inference::backend::cpu::isa(),
            lattice_inference::backend::cpu::bf16::linear_products(),
            lattice_inference::backend::cpu::qdot::q8_0_kernel_name(),
            rayon::current_num_threads(),
            info.weight_mode.name()
        );
        println!("| test | tokens/s (median of {runs}) |");
        println!("|---|---|");
        println!("| pp{} | {pp_med:.1} |", prompt.len());
        let at = if context.is_empty() {
            String::new()
        } else {
            format!(" @ {} context", context.len())
        };
        println!(
            "| tg{}{at} | {tg_med:.1} ({gb_s:.1} GB/s of weights) |",
            gen_ids.len()
        );
        if let Some(b) = batch_med {
            let how = if args.stream_temperature > 0.0 {
                format!(
                    ", sampled: temperature {} top-p {} top-k {}",
                    args.stream_temperature, args.stream_top_p, args.stream_top_k
                )
            } else {
                String::new()
            };
            println!(
                "| tg{} x {} streams (aggregate{how}) | {b:.1} ({:.2}x one stream) |",
                gen_ids.len(),
                args.streams,
                b / tg_med
            );
        }
    }
    Ok(())
}
