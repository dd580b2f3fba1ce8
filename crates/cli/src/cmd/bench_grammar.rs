//! `lattice bench grammar`: compile and per-step mask times of JSON Schema constraints over a
//! real vocabulary (the issue-14 figures), on the same schemas in the same run for `lattice`
//! (what Lattice serves with: the DFA engine, llguidance where the DFA engine refuses a
//! schema), `dfa` (the DFA engine alone, grammar/dfa/) and `llguidance` (alone). For each JSON
//! Schema of a corpus (one `{"name", "schema"}` per line, as scripts/make_schema_corpus.py
//! writes them) and each engine: the compile time, then
//! - `random` walk: up to `--steps` tokens, each step timing the mask of a full logit row (what
//!   a decode step pays) and then taking a random allowed token (seeded per schema, the same
//!   seeds for each engine; tokens that close strings and structures are preferred so that
//!   walks finish);
//! - `canonical` walk: the text of that random walk when it finished, tokenized as the model's
//!   tokenizer writes it, masked along exactly those tokens on a freshly compiled constraint (as
//!   MaskBench masks along real outputs); a token its mask does not allow is counted (a bug).
//!
//! Reports p50 / p99 / mean over all masks and compiles of each engine (and, for `lattice`, how
//! many schemas each engine served), then again over only the schemas every engine compiled
//! (the fair subset); with two engines or more, a cross-check (how many of one engine's
//! finished outputs each other accepts) and a shared walk: every engine masking along exactly
//! the same tokens (each finished output that all of them accept, re-tokenized).

mod engines;
mod report;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use engines::{Kind, Vocab, Walk};
use lattice_inference::grammar::dfa::Backend;
use lattice_inference::grammar::Engine;
use lattice_inference::sample::rng::Rng;
use lattice_inference::tokenizer::Tokenizer;
use serde_json::{json, Value};

/// Which engines to run.
#[derive(clap::ValueEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum EngineArg {
    /// What Lattice serves with: the DFA engine, llguidance where it refuses a schema.
    Lattice,
    /// The DFA engine alone.
    Dfa,
    /// llguidance alone.
    Llguidance,
    /// All three, on the same schemas.
    All,
}

/// Which walks to report.
#[derive(clap::ValueEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum WalkArg {
    /// The seeded random walk.
    Random,
    /// Masks along the re-tokenized output of the random walk.
    Canonical,
    /// Both.
    Both,
}

/// The DFA engine's automaton (when it runs alone; `lattice` always uses the lazy one).
#[derive(clap::ValueEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum DfaBackend {
    /// `regex_automata::hybrid`, determinized while masks walk the trie.
    Lazy,
    /// `regex_automata::dfa::dense`, determinized at compile time.
    Dense,
}

impl DfaBackend {
    fn backend(self) -> Backend {
        match self {
            DfaBackend::Lazy => Backend::Lazy,
            DfaBackend::Dense => Backend::Dense,
        }
    }
}

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
    /// Engines to race.
    #[arg(long, value_enum, default_value_t = EngineArg::All)]
    engine: EngineArg,
    /// Walks to time.
    #[arg(long, value_enum, default_value_t = WalkArg::Both)]
    walk: WalkArg,
    /// The DFA engine's automaton when it runs alone: `lazy` (determinized on demand) or
    /// `dense` (at compile).
    #[arg(long, value_enum, default_value_t = DfaBackend::Lazy)]
    dfa_backend: DfaBackend,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// One engine on one schema.
#[derive(Default)]
struct SchemaRun {
    /// `None`: refused.
    compile_ms: Option<f64>,
    /// The engine that compiled it.
    served: Option<Engine>,
    random: Walk,
    /// The finished random walk's text.
    text: Option<String>,
    canonical_us: Vec<f64>,
    canonical_walked: bool,
    rejected: usize,
}

/// One engine on the corpus.
struct EngineRun {
    kind: Kind,
    vocab_s: f64,
    /// `lattice`: the build of llguidance's vocabulary (on first use in the product).
    llguidance_vocab_s: Option<f64>,
    runs: Vec<SchemaRun>,
    /// Finished texts whose tokenization does not spell them back (not walked).
    retokenize_mismatch: usize,
}

/// The fixed inputs of a run.
struct Setup<'a> {
    tok: &'a Tokenizer,
    n_vocab: usize,
    eos: u32,
    schemas: &'a [Value],
    closers: &'a [bool],
    steps: usize,
    canonical: bool,
    backend: Backend,
}

fn run_engine(kind: Kind, s: &Setup) -> anyhow::Result<EngineRun> {
    let t0 = Instant::now();
    let vocab = Vocab::new(kind, s.tok, s.n_vocab, s.eos, s.backend)?;
    let vocab_s = t0.elapsed().as_secs_f64();
    // The product builds llguidance's vocabulary on the first spec that needs it: built here,
    // timed apart, so that no compile time holds it.
    let t0 = Instant::now();
    let llguidance_vocab_s = match &vocab {
        Vocab::Lattice(v) => v.llguidance().map(|_| Some(t0.elapsed().as_secs_f64()))?,
        _ => None,
    };
    let mut logits = vec![0.0f32; s.n_vocab];
    let (mut runs, mut retokenize_mismatch) = (Vec::new(), 0);
    for (i, schema) in s.schemas.iter().enumerate() {
        // Seeded per schema: every engine that compiles a schema to the same automaton walks
        // it the same way, whatever the other schemas did.
        let mut rng = Rng::from_seed(0x9e37_79b9_7f4a_7c15 ^ i as u64);
        let mut r = SchemaRun::default();
        let t = Instant::now();
        let Ok(c) = vocab.compile(schema) else {
            runs.push(r);
            continue;
        };
        let mut w = c.walker();
        r.compile_ms = Some(t.elapsed().as_secs_f64() * 1e3);
        r.served = Some(c.engine());
        r.random = engines::random_walk(&mut w, s.steps, s.eos, s.closers, &mut rng, &mut logits)?;
        drop((w, c));
        if r.random.finished {
            r.text = engines::text_of(s.tok, &r.random.tokens);
        }
        if let (true, Some(text)) = (s.canonical, &r.text) {
            match engines::retokenize(s.tok, text) {
                None => retokenize_mismatch += 1,
                Some(ids) => {
                    let mut w = vocab.compile(schema)?.walker();
                    (r.canonical_us, r.rejected) =
                        engines::canonical_walk(&mut w, &ids, s.eos, &mut logits)?;
                    r.canonical_walked = true;
                }
            }
        }
        runs.push(r);
    }
    Ok(EngineRun {
        kind,
        vocab_s,
        llguidance_vocab_s,
        runs,
        retokenize_mismatch,
    })
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
    let closers: Vec<bool> = (0..n_vocab as u32)
        .map(|id| {
            tok.token_bytes(id).is_some_and(|(b, s)| {
                !s && !b.is_empty() && b.iter().all(|c| b"\"}], ".contains(c))
            })
        })
        .collect();
    let corpus = std::fs::read_to_string(&args.schemas)
        .with_context(|| format!("reading {}", args.schemas.display()))?;
    let schemas = corpus
        .lines()
        .enumerate()
        .map(|(i, line)| {
            let e: Value =
                serde_json::from_str(line).with_context(|| format!("corpus line {}", i + 1))?;
            Ok(e["schema"].clone())
        })
        .collect::<anyhow::Result<Vec<Value>>>()?;
    let setup = Setup {
        tok: &tok,
        n_vocab,
        eos,
        schemas: &schemas,
        closers: &closers,
        steps: args.steps,
        canonical: args.walk != WalkArg::Random,
        backend: args.dfa_backend.backend(),
    };
    let kinds = match args.engine {
        EngineArg::Lattice => vec![Kind::Lattice],
        EngineArg::Dfa => vec![Kind::Dfa],
        EngineArg::Llguidance => vec![Kind::Llguidance],
        EngineArg::All => vec![Kind::Lattice, Kind::Dfa, Kind::Llguidance],
    };
    let runs = kinds
        .iter()
        .map(|&k| run_engine(k, &setup))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let all_compiled = |i: usize| runs.iter().all(|e| e.runs[i].compile_ms.is_some());
    let fair_n = (0..schemas.len()).filter(|&i| all_compiled(i)).count();
    let mut out = json!({
        "tokenizer": args.tokenizer.display().to_string(),
        "vocab": n_vocab,
        "schemas": schemas.len(),
        "steps": args.steps,
        "dfa_backend": format!("{:?}", args.dfa_backend).to_lowercase(),
        "fair_schemas": fair_n,
        "cpu": super::cpu_name(),
        "isa": lattice_inference::backend::cpu::isa(),
        "engines": runs.iter().map(|e| {
            let compiled = e.runs.iter().filter(|r| r.compile_ms.is_some()).count();
            let served = |g: Engine| e.runs.iter().filter(|r| r.served == Some(g)).count();
            json!({
                "engine": e.kind.name(),
                "vocab_build_s": e.vocab_s,
                "llguidance_vocab_build_s": e.llguidance_vocab_s,
                "compiled": compiled,
                "served_by_dfa": served(Engine::Dfa),
                "served_by_llguidance": served(Engine::Llguidance),
                "refused": schemas.len() - compiled,
                "retokenize_mismatch": e.retokenize_mismatch,
                "all": report::summary(e, &|_| true, args.walk),
                "fair": report::summary(e, &all_compiled, args.walk),
            })
        }).collect::<Vec<_>>(),
    });
    if runs.len() >= 2 {
        // Vocabularies again for the cross-check and the shared walk (outside other timings).
        let vocabs = runs
            .iter()
            .map(|e| Vocab::new(e.kind, &tok, n_vocab, eos, setup.backend))
            .collect::<lattice_inference::Result<Vec<_>>>()?;
        out["cross_check"] = report::cross(&runs, &vocabs, &setup)?;
    }
    if args.json {
        println!("{out}");
    } else {
        report::print(&out, &runs);
    }
    Ok(())
}
