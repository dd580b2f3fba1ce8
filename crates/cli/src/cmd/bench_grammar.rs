//! `lattice bench grammar`: compile and per-step mask times of output constraints over a real
//! vocabulary (the issue-14 figures). For each JSON Schema of a corpus (one `{"name", "schema"}`
//! per line, as scripts/make_schema_corpus.py writes them): the compile time, then a walk of up
//! to `--steps` tokens, each step timing the mask of a full logit row (what a decode step pays)
//! and then taking a random allowed token (seeded; tokens that close strings and structures
//! are preferred so that walks finish). Reports p50 / p99 / mean over all masks and compiles.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use lattice_inference::grammar::{Spec, Vocabulary};
use lattice_inference::tokenizer::Tokenizer;
use serde_json::Value;

/// Arguments of `lattice bench grammar`.
#[derive(clap::Args)]
pub struct Args {
    /// tokenizer.json of the vocabulary.
    #[arg(long)]
    tokenizer: PathBuf,
    /// Schema corpus (JSON lines of {"name", "schema"}).
    #[arg(long)]
    schemas: PathBuf,
    /// Most tokens walked per schema.
    #[arg(long, default_value_t = 64)]
    steps: usize,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// The CPU model, from /proc/cpuinfo (empty elsewhere).
fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|n| n.trim().to_owned())
        })
        .unwrap_or_default()
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return 0.0;
    }
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<()> {
    let tok = Tokenizer::from_file(&args.tokenizer)
        .with_context(|| format!("reading {}", args.tokenizer.display()))?;
    let n_vocab = tok.vocab_size();
    let eos = tok
        .token_to_id("<|endoftext|>")
        .or_else(|| tok.token_to_id("</s>"))
        .unwrap_or(0);
    let t0 = Instant::now();
    let vocab = Vocabulary::new(&tok, n_vocab, eos)?;
    let vocab_s = t0.elapsed().as_secs_f64();
    // Token classes for the walk: closers are preferred 1 in 2 steps when allowed.
    let closers: Vec<bool> = (0..n_vocab as u32)
        .map(|id| {
            tok.token_bytes(id).is_some_and(|(b, s)| {
                !s && !b.is_empty() && b.iter().all(|c| b"\"}], ".contains(c))
            })
        })
        .collect();
    let corpus = std::fs::read_to_string(&args.schemas)
        .with_context(|| format!("reading {}", args.schemas.display()))?;
    let (mut compile_ms, mut mask_us) = (Vec::new(), Vec::new());
    let (mut refused, mut finished) = (0usize, 0usize);
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut logits = vec![0.0f32; n_vocab];
    for (i, line) in corpus.lines().enumerate() {
        let entry: Value =
            serde_json::from_str(line).with_context(|| format!("corpus line {}", i + 1))?;
        let t = Instant::now();
        let Ok(c) = vocab.compile(&Spec::JsonSchema(entry["schema"].clone())) else {
            refused += 1;
            continue;
        };
        let mut m = c.matcher();
        compile_ms.push(t.elapsed().as_secs_f64() * 1e3);
        for _ in 0..args.steps {
            logits.fill(0.0);
            let t = Instant::now();
            m.mask(&mut logits)?;
            mask_us.push(t.elapsed().as_secs_f64() * 1e6);
            let allowed: Vec<u32> = (0..n_vocab as u32)
                .filter(|&id| logits[id as usize] == 0.0)
                .collect();
            if allowed.is_empty() {
                break;
            }
            let close: Vec<u32> = allowed
                .iter()
                .copied()
                .filter(|&id| closers[id as usize])
                .collect();
            let pool = if !close.is_empty() && next() % 2 == 0 {
                &close
            } else {
                &allowed
            };
            let token = pool[(next() % pool.len() as u64) as usize];
            if token == eos {
                finished += 1;
                break;
            }
            m.accept(token)?;
            if m.is_done() {
                finished += 1;
                break;
            }
        }
    }
    let n_masks = mask_us.len();
    let mean = mask_us.iter().sum::<f64>() / n_masks.max(1) as f64;
    let (m50, m99) = (pct(&mut mask_us, 0.5), pct(&mut mask_us, 0.99));
    let (c50, c99) = (pct(&mut compile_ms, 0.5), pct(&mut compile_ms, 0.99));
    let v = serde_json::json!({
        "tokenizer": args.tokenizer.display().to_string(),
        "vocab": n_vocab,
        "vocab_build_s": vocab_s,
        "schemas": corpus.lines().count(),
        "refused": refused,
        "walks_finished": finished,
        "masks": n_masks,
        "mask_us_p50": m50,
        "mask_us_p99": m99,
        "mask_us_mean": mean,
        "compile_ms_p50": c50,
        "compile_ms_p99": c99,
        "cpu": cpu_name(),
        "isa": lattice_inference::backend::cpu::isa(),
    });
    if args.json {
        println!("{v}");
    } else {
        println!(
            "{} tokens (vocabulary built in {vocab_s:.2} s); {} schemas, {refused} refused; {n_masks} masks: p50 {m50:.1} us, p99 {m99:.1} us, mean {mean:.1} us; compile p50 {c50:.2} ms, p99 {c99:.2} ms",
            n_vocab,
            corpus.lines().count()
        );
    }
    Ok(())
}
