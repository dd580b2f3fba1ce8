//! `lattice serve`: loads the models named on the command line and runs the HTTP server of
//! lattice-server (OpenAI and text-embeddings-inference routes) until SIGINT / SIGTERM.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use lattice_embed::{Embedder, EmbedderOptions, Reranker};
use lattice_inference::backend::Device;
use lattice_server::{Models, ServeOptions};

/// Arguments of `lattice serve`.
#[derive(clap::Args)]
pub struct Args {
    /// Generation model: folder, `.gguf` file or hub id (serves /v1/chat/completions and
    /// /v1/completions).
    #[arg(long)]
    model: Option<std::path::PathBuf>,
    /// Embedding model: folder, catalog name or hub id (serves /v1/embeddings and /embed).
    #[arg(long)]
    embedding_model: Option<String>,
    /// Cross-encoder: folder or hub id (serves /rerank).
    #[arg(long)]
    rerank_model: Option<std::path::PathBuf>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port (0 picks a free one; the address is printed when ready).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on every route but /health and /metrics.
    #[arg(long, env = "LATTICE_API_KEY")]
    api_key: Option<String>,
    /// The id the generation model is served under (default: the --model argument).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Sequences decoded together in one batch.
    #[arg(long, default_value_t = 16)]
    max_running: usize,
    /// Generation requests that may wait for a slot; more are refused with 429.
    #[arg(long, default_value_t = 256)]
    max_queue: usize,
    /// Largest `max_tokens` a request may ask for.
    #[arg(long, default_value_t = 4096)]
    max_tokens: usize,
    /// Largest request body in bytes (413 beyond).
    #[arg(long, default_value_t = 4 << 20)]
    max_body_bytes: usize,
    /// Tokens per embedding batch (requests from many clients are merged up to this).
    #[arg(long, default_value_t = 16_384)]
    max_batch_tokens: usize,
    /// Quantize the matrices of every safetensors model served (generation, embedding,
    /// rerank) to Q8_0 at load; integer products over activations quantized per block of 32.
    #[arg(long, conflicts_with = "bf16")]
    q8: bool,
    /// Keep the matrices of every safetensors model served in bf16 (bf16 products, f32 sums).
    #[arg(long)]
    bf16: bool,
    /// Store the KV caches in f16 (half the memory per sequence).
    #[arg(long)]
    kv_f16: bool,
    /// Where the generation model runs: `cpu`, `cuda` or `cuda:N` (a build with
    /// `--features cuda`); embedding and rerank models run on the CPU.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// KV memory for all sequences: pages of keys and values, recurrent state and cached
    /// prefixes (e.g. `2GiB`, `512MiB`, `1.5G`; default: enough for --max-running full
    /// contexts, at most half the free memory). Requests beyond it wait or are preempted.
    #[arg(long, value_parser = parse_size)]
    kv_cache_memory: Option<usize>,
    /// Do not reuse cached prompt prefixes across requests (every prompt is computed whole).
    #[arg(long)]
    no_prefix_cache: bool,
    /// Speculative decoding by default (a request overrides it with `speculative` /
    /// `draft_tokens`).
    #[command(flatten)]
    speculative: super::generate::SpeculativeArgs,
    /// A LoRA adapter (PEFT folder) served over the generation model as `NAME=DIR`; repeatable.
    /// A request whose `model` is NAME runs with it (vLLM's convention); requests for different
    /// adapters and the base model share a batch.
    #[arg(long, value_name = "NAME=DIR")]
    lora: Vec<String>,
    /// Merge the one `--lora` adapter into the weights at load: the model is served under its
    /// names and NAME, at no cost per token (no base model then).
    #[arg(long, requires = "lora", conflicts_with = "lora_dir")]
    lora_merge: bool,
    /// Let clients load and unload LoRA adapters at run time (`POST /v1/load_lora_adapter`,
    /// `/v1/unload_lora_adapter`) from folders under DIR only.
    #[arg(long, value_name = "DIR")]
    lora_dir: Option<std::path::PathBuf>,
    /// Most LoRA adapters served at once.
    #[arg(long, default_value_t = 32)]
    max_loras: usize,
    /// Connections open at once; one more is answered 429 and closed.
    #[arg(long, default_value_t = 512)]
    max_connections: usize,
    /// Seconds a client has to send a request's headers; also the longest a kept-alive
    /// connection may sit idle.
    #[arg(long, default_value_t = 10.0, value_parser = parse_seconds)]
    header_timeout: f64,
    /// Seconds a client has to send a request's body once its headers arrived (408 beyond).
    #[arg(long, default_value_t = 30.0, value_parser = parse_seconds)]
    body_timeout: f64,
    /// Most headers in a request (431 beyond).
    #[arg(long, default_value_t = 64)]
    max_headers: usize,
    /// Most bytes of a request's start line and headers (431 beyond).
    #[arg(long, default_value_t = 16 << 10)]
    max_header_bytes: usize,
    /// On SIGINT / SIGTERM, seconds in-flight requests may take to finish before the server
    /// closes what remains and exits.
    #[arg(long, default_value_t = 30.0, value_parser = parse_seconds)]
    drain_timeout: f64,
    /// Most images in one chat request (vision-language models; 400 beyond).
    #[arg(long, default_value_t = 8)]
    max_images: usize,
    /// Most bytes of one image as sent (400 beyond; the body limit --max-body-bytes applies
    /// to the whole request first).
    #[arg(long, default_value_t = 20 << 20)]
    max_image_bytes: usize,
    /// Most pixels (width × height) of one decoded image (400 beyond).
    #[arg(long, default_value_t = 40_000_000)]
    max_image_pixels: u64,
    /// Fetch `http(s)` image URLs of chat requests (10 s and --max-image-bytes each);
    /// without it only `data:` URLs are taken.
    #[arg(long)]
    allow_image_urls: bool,
    /// Observe the generation model's layers (`layers`): per-layer norms, residual-update
    /// ratio, block influence, attention entropy and time on `/metrics` (slows every pass).
    #[arg(long, value_enum)]
    metrics: Option<super::metrics::MetricsKind>,
    /// Worker threads for the forward passes (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
}

/// A positive, finite number of seconds (at most a day).
fn parse_seconds(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s <= 86_400.0 => Ok(s),
        _ => Err(format!(
            "`{text}` is not a number of seconds between 0 and 86400"
        )),
    }
}

/// The names a model answers to: the argument as written, then its last path component.
fn names(arg: &str, preferred: Option<&str>) -> Vec<String> {
    let mut v = Vec::new();
    if let Some(p) = preferred {
        v.push(p.to_string());
    }
    v.push(arg.to_string());
    if let Some(last) = Path::new(arg).file_name().and_then(|s| s.to_str()) {
        v.push(last.to_string());
    }
    v.dedup();
    v
}

/// The `--lora NAME=DIR` values as names and folders (names unique and non-empty).
fn adapters(specs: &[String]) -> anyhow::Result<(Vec<String>, Vec<std::path::PathBuf>)> {
    let mut names: Vec<String> = Vec::new();
    let mut dirs = Vec::new();
    for spec in specs {
        let Some((name, dir)) = spec
            .split_once('=')
            .filter(|(n, d)| !n.is_empty() && !d.is_empty())
        else {
            anyhow::bail!("--lora `{spec}`: expected NAME=DIR (a name for requests' `model`, a PEFT adapter folder)");
        };
        if names.iter().any(|n| n == name) {
            anyhow::bail!("--lora: the name `{name}` is given twice");
        }
        names.push(name.to_owned());
        dirs.push(dir.into());
    }
    Ok((names, dirs))
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<()> {
    if args.model.is_none() && args.embedding_model.is_none() && args.rerank_model.is_none() {
        anyhow::bail!("nothing to serve: give --model, --embedding-model and/or --rerank-model");
    }
    if args.model.is_none() && !Device::open(&args.device)?.is_cpu() {
        anyhow::bail!(
            "--device {} applies to the generation model (--model); embedding and rerank models \
             run on the CPU",
            args.device
        );
    }
    let mut models = Models::default();
    let (adapter_names, adapter_dirs) = adapters(&args.lora)?;
    if (!adapter_names.is_empty() || args.lora_dir.is_some()) && args.model.is_none() {
        anyhow::bail!("--lora and --lora-dir need a generation model (--model)");
    }
    if let Some(dir) = &args.lora_dir {
        if !dir.is_dir() {
            anyhow::bail!("--lora-dir {}: not a folder", dir.display());
        }
    }
    if args.lora_merge && adapter_names.len() != 1 {
        anyhow::bail!(
            "--lora-merge merges one adapter into the weights; {} are given",
            adapter_names.len()
        );
    }
    if adapter_names.len() > args.max_loras {
        anyhow::bail!(
            "{} --lora adapters are given; --max-loras is {}",
            adapter_names.len(),
            args.max_loras
        );
    }
    if let Some(model) = &args.model {
        let loader = super::generate::ModelArgs {
            model: model.clone(),
            f32: false,
            q8: args.q8,
            bf16: args.bf16,
            kv_f16: args.kv_f16,
            threads: args.threads,
            device: args.device.clone(),
            lora: adapter_dirs,
            lora_scale: Vec::new(),
            lora_merge: args.lora_merge,
            lora_selectable: !args.lora_merge
                && (!adapter_names.is_empty() || args.lora_dir.is_some()),
            metrics: None,
            metrics_file: None,
        };
        let text_model = loader.load()?;
        if args.speculative.draft_tokens() > 0 {
            if let Some(why) = text_model.draft_refusal() {
                anyhow::bail!("--speculative: {why}");
            }
        }
        let arg = model.to_string_lossy();
        let mut served = names(&arg, args.served_model_name.as_deref());
        if args.lora_merge {
            // The merged model answers to the adapter's name too.
            served.extend(adapter_names.iter().cloned());
        }
        models.generation = Some((served, text_model));
    } else {
        super::init_pool(args.threads)?;
    }
    let encoder_mode = super::EncoderMode {
        bf16: args.bf16,
        q8: args.q8,
    }
    .mode();
    if let Some(name) = &args.embedding_model {
        let options = EmbedderOptions {
            max_batch_tokens: args.max_batch_tokens,
            mode: encoder_mode,
            ..Default::default()
        };
        let embedder = lattice_embed::resolve_model_dir(name)
            .and_then(|dir| Embedder::load_dir(&dir, options))
            .with_context(|| format!("cannot load embedding model `{name}`"))?;
        eprintln!(
            "loaded embedding model {name} (dimension {}, {} weights)",
            embedder.dim(),
            encoder_mode.name()
        );
        models.embedding = Some((names(name, None), embedder));
    }
    if let Some(path) = &args.rerank_model {
        let reranker = Reranker::load_dir_with(&super::resolve_model(path)?, encoder_mode)
            .with_context(|| format!("cannot load cross-encoder `{}`", path.display()))?;
        let arg = path.to_string_lossy();
        eprintln!(
            "loaded cross-encoder {arg} ({} weights)",
            encoder_mode.name()
        );
        models.rerank = Some((names(&arg, None), reranker));
    }
    let options = ServeOptions {
        host: args.host,
        port: args.port,
        api_key: args.api_key.filter(|k| !k.is_empty()),
        max_running: args.max_running.max(1),
        max_queue: args.max_queue,
        max_tokens: args.max_tokens.max(1),
        max_body_bytes: args.max_body_bytes,
        max_batch_tokens: args.max_batch_tokens.max(1),
        kv_cache_memory: args.kv_cache_memory,
        prefix_cache: !args.no_prefix_cache,
        draft_tokens: args.speculative.draft_tokens(),
        drafter: args.speculative.drafter(),
        adapters: if args.lora_merge {
            Vec::new()
        } else {
            adapter_names
        },
        lora_dir: args.lora_dir,
        max_loras: args.max_loras,
        max_connections: args.max_connections.max(1),
        header_timeout: Duration::from_secs_f64(args.header_timeout),
        body_timeout: Duration::from_secs_f64(args.body_timeout),
        max_headers: args.max_headers.max(1),
        max_header_bytes: args.max_header_bytes.max(1024),
        drain_timeout: Duration::from_secs_f64(args.drain_timeout),
        max_images: args.max_images,
        max_image_bytes: args.max_image_bytes,
        max_image_pixels: args.max_image_pixels,
        allow_image_urls: args.allow_image_urls,
        layer_metrics: args.metrics == Some(super::metrics::MetricsKind::Layers),
    };
    lattice_server::serve(models, options)?;
    Ok(())
}

/// Parses a byte size: a number with an optional unit (`B`, `K`/`KB`/`KiB`, `M`, `G`, `T`;
/// powers of 1024), e.g. `2GiB`, `512M`, `1.5G`, `1000000`.
pub fn parse_size(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("`{text}` is not a size (e.g. 2GiB, 512MiB)"))?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" | "kib" => 1024.0,
        "m" | "mb" | "mib" => 1024.0 * 1024.0,
        "g" | "gb" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tb" | "tib" => 1024.0f64.powi(4),
        other => {
            return Err(format!(
                "unknown size unit `{other}` in `{text}` (B, KiB, MiB, GiB, TiB)"
            ))
        }
    };
    let bytes = value * scale;
    if !(bytes.is_finite() && bytes >= 1.0 && bytes < usize::MAX as f64) {
        return Err(format!("`{text}` is not a usable size"));
    }
    Ok(bytes as usize)
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("1.5g"), Ok(3 << 29));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("2 parsecs").is_err());
        assert!(parse_size("0").is_err());
    }
}
