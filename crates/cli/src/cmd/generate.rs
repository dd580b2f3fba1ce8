//! `lattice generate`: complete a prompt with a decoder (model folder or `.gguf` file),
//! streaming the text to stdout, or printing one JSON object with `--json`. Prompt and
//! generation speed go to stderr.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use lattice_inference::backend::Device;
use lattice_inference::chat::{ChatMessage, ContentPart, RenderOptions};
use lattice_inference::engine::{generate, Drafter, GenerateRequest, Generation, TextModel};
use lattice_inference::grammar::{Constraint, Spec};
use lattice_inference::model::source::{Placement, WeightMode};
use lattice_inference::sample::SamplingParams;
use lattice_inference::state::KvDtype;

/// How drafts are made for speculative decoding.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Speculative {
    /// No drafts.
    Off,
    /// Prompt lookup: the tokens that followed the latest earlier occurrence of the last few
    /// tokens (prompt and output so far).
    Ngram,
    /// Suffix match: the longest match of the last tokens in the prompt, the output so far and
    /// earlier requests' outputs, the continuation chosen by frequency.
    Suffix,
}

/// Speculative decoding flags shared by `generate`, `chat`, `serve` and `bench generate`.
#[derive(clap::Args, Clone, Debug)]
pub struct SpeculativeArgs {
    /// Speculative decoding: draft tokens and verify them in one pass per step (greedy output
    /// is the same, sampled output has the same distribution; on a GPU, models with
    /// recurrent layers refuse it for now).
    #[arg(long, value_enum, default_value_t = Speculative::Off)]
    pub speculative: Speculative,
    /// Most tokens per draft (1-15; the length adapts to how many are accepted).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=15))]
    pub draft_tokens: u32,
}

impl SpeculativeArgs {
    /// Refuses `--speculative` where it would not act (the model cannot draft).
    pub fn check(&self, model: &TextModel) -> anyhow::Result<()> {
        if self.speculative == Speculative::Off {
            return Ok(());
        }
        match model.draft_refusal() {
            Some(why) => anyhow::bail!("--speculative: {why}"),
            None => Ok(()),
        }
    }

    /// The requests' `draft_tokens` (0: off).
    pub fn draft_tokens(&self) -> usize {
        match self.speculative {
            Speculative::Off => 0,
            Speculative::Ngram | Speculative::Suffix => self.draft_tokens as usize,
        }
    }

    /// Where the drafts come from.
    pub fn drafter(&self) -> Drafter {
        match self.speculative {
            Speculative::Suffix => Drafter::Suffix,
            Speculative::Off | Speculative::Ngram => Drafter::Ngram,
        }
    }

    /// Sets `req`'s speculative decoding.
    pub fn apply(&self, req: &mut GenerateRequest) {
        req.draft_tokens = self.draft_tokens();
        req.drafter = self.drafter();
    }
}

/// Sampling flags shared by `generate` and `chat`.
#[derive(clap::Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Softmax temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f32,
    /// Keep the K most likely tokens (0 = off).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Nucleus sampling mass (1 = off).
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens below this fraction of the top probability (0 = off).
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// Repetition penalty (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    /// Presence penalty.
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Frequency penalty.
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Seed for reproducible sampling.
    #[arg(long)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    /// The engine's sampling parameters.
    pub fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
        }
    }
}

/// Output-constraint flags shared by `generate` and `chat` (at most one).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ConstraintArgs {
    /// Constrain the output to JSON matching the JSON Schema in FILE.
    #[arg(long, value_name = "FILE", group = "constraint")]
    pub json_schema: Option<PathBuf>,
    /// Constrain the output to any JSON object.
    #[arg(long, group = "constraint")]
    pub json_object: bool,
    /// Constrain the output to match this regular expression.
    #[arg(long, value_name = "RE", group = "constraint")]
    pub regex: Option<String>,
    /// Constrain the output to the Lark grammar in FILE (llguidance's dialect).
    #[arg(long, value_name = "FILE", group = "constraint")]
    pub lark: Option<PathBuf>,
    /// Constrain the output to the GBNF grammar in FILE (llama.cpp's format).
    #[arg(long, value_name = "FILE", group = "constraint")]
    pub grammar: Option<PathBuf>,
}

impl ConstraintArgs {
    /// The constraint asked for, compiled over `model`'s vocabulary.
    pub fn compile(&self, model: &TextModel) -> anyhow::Result<Option<Constraint>> {
        let read = |p: &PathBuf| {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
        };
        let spec = if let Some(p) = &self.json_schema {
            let schema = serde_json::from_str(&read(p)?)
                .with_context(|| format!("{} is not JSON", p.display()))?;
            Spec::JsonSchema(schema)
        } else if self.json_object {
            Spec::JsonObject
        } else if let Some(r) = &self.regex {
            Spec::Regex(r.clone())
        } else if let Some(p) = &self.lark {
            Spec::Lark(read(p)?)
        } else if let Some(p) = &self.grammar {
            Spec::Gbnf(read(p)?)
        } else {
            return Ok(None);
        };
        let what = match self
            .json_schema
            .as_ref()
            .or(self.lark.as_ref())
            .or(self.grammar.as_ref())
        {
            Some(p) => format!(" in {}", p.display()),
            None => String::new(),
        };
        let c = model
            .compile_constraint(&spec)
            .with_context(|| format!("the {}{what}", spec.kind()))?;
        Ok(Some(c))
    }
}

/// Model flags shared by `generate`, `chat` and `bench generate`.
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// Model folder (config.json + safetensors + tokenizer), `.gguf` file, or hub id
    /// (`ORG/NAME[@REVISION]`, looked up in the Hugging Face cache, else downloaded).
    #[arg(long)]
    pub model: PathBuf,
    /// Hold every matrix in f32: GGUF weights dequantized at load, bf16 checkpoints widened at
    /// load (by default they stay in 16 bits with the same f32 results; slower; the reference
    /// path).
    #[arg(long, conflicts_with = "q8")]
    pub f32: bool,
    /// Quantize the matrices of a safetensors model to Q8_0 at load (about 3.8x fewer bytes
    /// per token than f32).
    #[arg(long, conflicts_with = "bf16")]
    pub q8: bool,
    /// Keep the matrices of a safetensors model in bf16 and multiply in bf16 with f32 sums
    /// (half the bytes of f32, about twice the prompt speed with AVX512-BF16; not bit-equal
    /// to the f32 reference).
    #[arg(long, conflicts_with = "f32")]
    pub bf16: bool,
    /// Store the KV cache in f16 (half the cache memory and bytes read per decode step; keys
    /// and values rounded to f16, so not bit-equal to the f32 reference).
    #[arg(long)]
    pub kv_f16: bool,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Where the model runs: `cpu`, `cuda` or `cuda:N` (needs a build with `--features cuda`).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// A PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors) applied to
    /// the model; repeat it for a mixture (the adapters' deltas add).
    #[arg(long, value_name = "DIR")]
    pub lora: Vec<PathBuf>,
    /// The scale of each `--lora` adapter, in the same order (default 1).
    #[arg(
        long,
        value_name = "S",
        allow_negative_numbers = true,
        requires = "lora"
    )]
    pub lora_scale: Vec<f32>,
    /// Merge the adapters into the weights at load (no cost per token; f32, bf16 or Q8 weights
    /// made from a safetensors checkpoint, or a GGUF file with --f32).
    #[arg(long, requires = "lora")]
    pub lora_merge: bool,
    /// The adapters are picked per request (`lattice serve --lora NAME=DIR` or `--lora-dir`),
    /// not applied to every row; the model takes adapters even when none is given yet.
    #[arg(skip)]
    pub lora_selectable: bool,
    /// Observe every layer of every forward pass (`layers`): input and output norms, the
    /// residual-update ratio, the 1 − cos block influence, attention entropy and time, one JSON
    /// line per layer and pass (to --metrics-file, else stderr). Off: no cost; on: each pass
    /// copies every layer's rows to the host.
    #[arg(long, value_enum)]
    pub metrics: Option<super::metrics::MetricsKind>,
    /// Where --metrics writes its JSON lines (default: stderr).
    #[arg(long, requires = "metrics", value_name = "FILE")]
    pub metrics_file: Option<PathBuf>,
}

impl ModelArgs {
    /// The `--lora` adapters with their `--lora-scale`s (`None` without adapters, unless they
    /// are selectable: a server may load them later).
    fn lora_plan(
        &self,
    ) -> anyhow::Result<Option<std::sync::Arc<lattice_inference::lora::LoraPlan>>> {
        if self.lora.is_empty() && !self.lora_selectable {
            return Ok(None);
        }
        if self.lora_scale.len() > self.lora.len() {
            anyhow::bail!(
                "--lora-scale is given {} times for {} --lora adapter(s)",
                self.lora_scale.len(),
                self.lora.len()
            );
        }
        if let Some(s) = self.lora_scale.iter().find(|s| !s.is_finite()) {
            anyhow::bail!("--lora-scale must be a finite number, got {s}");
        }
        let mut adapters = Vec::with_capacity(self.lora.len());
        for (i, dir) in self.lora.iter().enumerate() {
            let a = lattice_inference::lora::Adapter::load(dir)
                .with_context(|| format!("cannot load the LoRA adapter `{}`", dir.display()))?;
            adapters.push((a, self.lora_scale.get(i).copied().unwrap_or(1.0)));
        }
        let plan = if self.lora_selectable {
            lattice_inference::lora::LoraPlan::selectable(
                adapters.into_iter().map(|(a, _)| a).collect(),
            )
        } else {
            lattice_inference::lora::LoraPlan::new(adapters, self.lora_merge)
        };
        Ok(Some(std::sync::Arc::new(plan)))
    }

    /// Sets up the thread pool and loads the model, reporting the load time on stderr.
    pub fn load(&self) -> anyhow::Result<TextModel> {
        super::init_pool(self.threads)?;
        let mode = if self.f32 {
            WeightMode::F32
        } else if self.q8 {
            WeightMode::Q8
        } else if self.bf16 {
            WeightMode::Bf16
        } else {
            WeightMode::Quantized
        };
        let device = Device::open(&self.device)?;
        let path = super::resolve_model(&self.model)?;
        let t0 = std::time::Instant::now();
        let mut place = Placement::new(mode, device.clone());
        place.lora = self.lora_plan()?;
        let mut model = TextModel::load_on(&path, &place)
            .with_context(|| format!("cannot load model `{}`", self.model.display()))?;
        super::metrics::start(self.metrics, self.metrics_file.as_deref())?;
        if self.kv_f16 {
            model.kv_dtype = KvDtype::F16;
        }
        let c = &model.decoder.info().config;
        eprintln!(
            "loaded {} ({} layers, hidden {}, vocab {}, {} weights) on {device:?} in {:.2} s",
            c.model_type,
            c.n_layers,
            c.hidden_size,
            c.vocab_size,
            model.decoder.info().weight_mode.name(),
            t0.elapsed().as_secs_f64()
        );
        Ok(model)
    }
}

/// Arguments of `lattice generate`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// The prompt.
    #[arg(long)]
    prompt: String,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long)]
    chat: bool,
    /// An image for a vision-language model (PNG, JPEG or WebP; repeatable): with --chat it
    /// goes into the user message before the text, else before the prompt.
    #[arg(long)]
    image: Vec<std::path::PathBuf>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Stop when this string appears (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Keep going after end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    #[command(flatten)]
    constraint: ConstraintArgs,
    #[command(flatten)]
    speculative: SpeculativeArgs,
    /// Print one JSON object `{text, token_ids, prompt_tokens, completion_tokens}` instead of
    /// streaming text.
    #[arg(long)]
    json: bool,
}

/// Prints prompt and generation speed to stderr.
pub fn report_speed(g: &Generation) {
    let n = g.token_ids.len();
    let decode_tokens = n.saturating_sub(1);
    let run = g.prompt_tokens - g.cached_prompt_tokens;
    let cached = if g.cached_prompt_tokens > 0 {
        format!(" ({} reused from the cache)", g.cached_prompt_tokens)
    } else {
        String::new()
    };
    let drafts = if g.drafted_tokens > 0 {
        format!(
            "; drafts: {} of {} tokens accepted",
            g.accepted_tokens, g.drafted_tokens
        )
    } else {
        String::new()
    };
    eprintln!(
        "prompt: {} tokens{cached}, {run} run in {:.3} s ({:.1} tokens/s); generation: {n} tokens, {:.1} tokens/s after the first{drafts}",
        g.prompt_tokens,
        g.prefill_secs,
        run as f64 / g.prefill_secs.max(1e-9),
        decode_tokens as f64 / g.decode_secs.max(1e-9)
    );
}

/// Reads and prepares the images of `paths` for `model`; errors name the file.
pub fn read_images(model: &TextModel, paths: &[std::path::PathBuf]) -> anyhow::Result<Images> {
    let limits = lattice_inference::vision::ImageLimits::default();
    paths
        .iter()
        .map(|p| {
            let bytes = std::fs::read(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
            model
                .prepare_image(&bytes, &limits)
                .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))
        })
        .collect()
}

/// Prepared images of a prompt.
pub type Images = Vec<std::sync::Arc<lattice_inference::vision::PreparedImage>>;

/// A user message: `images` images (their placeholders), then `text`.
pub fn user_message(text: &str, images: usize) -> ChatMessage {
    let mut m = ChatMessage::new("user", text);
    if images > 0 {
        m.parts = std::iter::repeat_n(ContentPart::Image, images)
            .chain([ContentPart::Text(text.to_string())])
            .collect();
    }
    m
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<()> {
    args.sampling.params().validate()?;
    let model = args.model.load()?;
    let images = read_images(&model, &args.image)?;
    let prompt_ids = if args.chat {
        let opts = RenderOptions {
            add_generation_prompt: true,
            ..Default::default()
        };
        model.encode_chat(&[user_message(&args.prompt, images.len())], &opts)?
    } else {
        let mut ids = Vec::new();
        for _ in &images {
            ids.extend(model.image_marker()?);
        }
        ids.extend(model.encode_prompt(&args.prompt, images.is_empty())?);
        ids
    };
    let prompt_ids = model.expand_images(prompt_ids, &images)?;
    let mut req = GenerateRequest::new(prompt_ids, args.max_tokens, args.sampling.params());
    req.images = images;
    req.stop = args.stop.clone();
    req.ignore_eos = args.ignore_eos;
    req.constraint = args.constraint.compile(&model)?;
    args.speculative.apply(&mut req);
    args.speculative.check(&model)?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let g = if args.json {
        generate(&model, &req, &mut |_| true)?
    } else {
        let g = generate(&model, &req, &mut |piece| {
            // A closed pipe ends generation instead of failing it.
            out.write_all(piece.as_bytes())
                .and_then(|_| out.flush())
                .is_ok()
        })?;
        writeln!(out)?;
        g
    };
    if args.json {
        let v = serde_json::json!({
            "text": g.text,
            "token_ids": g.token_ids,
            "prompt_tokens": g.prompt_tokens,
            "completion_tokens": g.token_ids.len(),
            "finish_reason": g.finish_reason.as_str(),
            "drafted_tokens": g.drafted_tokens,
            "drafts": g.drafts,
            "accepted_tokens": g.accepted_tokens,
            "decode_tokens_per_s": g.token_ids.len().saturating_sub(1) as f64 / g.decode_secs.max(1e-9),
        });
        writeln!(out, "{v}")?;
    }
    report_speed(&g);
    Ok(())
}
