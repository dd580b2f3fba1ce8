//! `lattice serve`: one process serving generation, embeddings and reranking over HTTP, with
//! the OpenAI routes (`/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`,
//! `/v1/models`) and the text-embeddings-inference ones (`/embed`, `/rerank`, `/tokenize`),
//! plus `/health` and Prometheus `/metrics`.
//!
//! Layout: [`app`] builds the router (API key, metrics, shared state); [`completions`],
//! [`embeddings`] and [`tei`] are the handlers, reading [`protocol`] shapes; [`generation`] is
//! the scheduler thread (continuous batching over
//! [`BatchEngine`](lattice_inference::engine::BatchEngine)) and [`embed_batcher`] the embedding
//! batcher thread. Handlers never run a forward pass themselves.

pub mod adapters;
pub mod app;
pub mod completions;
pub mod embed_batcher;
pub mod embeddings;
mod error;
pub mod fuzz;
pub mod generation;
pub mod images;
mod listen;
pub mod metrics;
pub mod protocol;
pub mod tei;
pub mod tools;

use std::sync::Arc;

use lattice_embed::{Embedder, Reranker};
use lattice_inference::engine::TextModel;

pub use app::{AppState, Served};
pub use error::{ApiError, Error, Result};

/// Limits and network settings.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Address to bind.
    pub host: String,
    /// Port (0 = any free port).
    pub port: u16,
    /// When set, requests need `Authorization: Bearer KEY` (except `/health` and `/metrics`).
    pub api_key: Option<String>,
    /// Sequences decoded together.
    pub max_running: usize,
    /// Generation requests that may wait for a slot; more get 429.
    pub max_queue: usize,
    /// Largest `max_tokens` a request may ask for.
    pub max_tokens: usize,
    /// Largest request body in bytes (413 beyond).
    pub max_body_bytes: usize,
    /// Tokens per embedding batch.
    pub max_batch_tokens: usize,
    /// Bytes of KV memory (pages, recurrent state, cached prefixes) for all sequences; `None`
    /// derives it from the free memory and the model.
    pub kv_cache_memory: Option<usize>,
    /// Reuse cached prompt prefixes across requests.
    pub prefix_cache: bool,
    /// Speculative decoding by default: drafts of up to this many tokens (0: off); a request
    /// overrides it with `speculative` / `draft_tokens`.
    pub draft_tokens: usize,
    /// Where the default drafts come from.
    pub drafter: lattice_inference::engine::Drafter,
    /// Names of the generation model's selectable LoRA adapters, in the order of its plan: a
    /// request whose `model` is one of them runs with that adapter (vLLM's convention).
    pub adapters: Vec<String>,
    /// The folder `POST /v1/load_lora_adapter` may load adapters from (`None`: no loading at
    /// run time).
    pub lora_dir: Option<std::path::PathBuf>,
    /// Most LoRA adapters served at once.
    pub max_loras: usize,
    /// Connections open at once; one more is answered 429 and closed.
    pub max_connections: usize,
    /// Time a client has to send a request's headers, and the longest a kept-alive connection
    /// may sit idle (a client trickling bytes cannot hold a connection longer).
    pub header_timeout: std::time::Duration,
    /// Time a client has to send a request's body once its headers arrived (408 beyond).
    pub body_timeout: std::time::Duration,
    /// Most headers in a request (431 beyond).
    pub max_headers: usize,
    /// Most bytes of a request's start line and headers (431 beyond).
    pub max_header_bytes: usize,
    /// On SIGINT / SIGTERM, how long in-flight requests may take to finish before the
    /// remaining connections are closed.
    pub drain_timeout: std::time::Duration,
    /// Most images in one chat request (400 beyond).
    pub max_images: usize,
    /// Most bytes of one image, encoded (400 beyond).
    pub max_image_bytes: usize,
    /// Most pixels (width × height) of one decoded image (400 beyond).
    pub max_image_pixels: u64,
    /// Fetch `http(s)` image URLs (refused otherwise: data URLs only).
    pub allow_image_urls: bool,
    /// Observe the generation model's layers (`--metrics layers`): per-layer statistics on
    /// `/metrics` (lattice_inference::metrics; slows every pass).
    pub layer_metrics: bool,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 8080,
            api_key: None,
            max_running: 16,
            max_queue: 256,
            max_tokens: 4096,
            max_body_bytes: 4 << 20,
            max_batch_tokens: 16_384,
            kv_cache_memory: None,
            prefix_cache: true,
            draft_tokens: 0,
            drafter: lattice_inference::engine::Drafter::Ngram,
            adapters: Vec::new(),
            lora_dir: None,
            max_loras: 32,
            max_connections: 512,
            header_timeout: std::time::Duration::from_secs(10),
            body_timeout: std::time::Duration::from_secs(30),
            max_headers: 64,
            max_header_bytes: 16 << 10,
            drain_timeout: std::time::Duration::from_secs(30),
            max_images: 8,
            max_image_bytes: 20 << 20,
            max_image_pixels: 40_000_000,
            allow_image_urls: false,
            layer_metrics: false,
        }
    }
}

/// The models to serve, each with its names.
#[derive(Default)]
pub struct Models {
    /// A decoder for the completion routes.
    pub generation: Option<(Vec<String>, TextModel)>,
    /// An embedding model for `/v1/embeddings` and `/embed`.
    pub embedding: Option<(Vec<String>, Embedder)>,
    /// A cross-encoder for `/rerank`.
    pub rerank: Option<(Vec<String>, Reranker)>,
}

fn served<T>(names: Vec<String>, engine: T) -> Served<T> {
    let mut names = names.into_iter();
    let name = names.next().unwrap_or_else(|| "default".into());
    Served {
        name,
        aliases: names.collect(),
        engine,
    }
}

/// Starts the engines, binds, prints `lattice serve: listening on http://ADDR` to stderr, and
/// serves until SIGINT or SIGTERM; then stops accepting, lets in-flight requests finish, and
/// returns. The first name of each model is the id it is reported under.
pub fn serve(models: Models, options: ServeOptions) -> Result<()> {
    let addr = format!("{}:{}", options.host, options.port);
    let state = start(models, options)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(listen::run(&addr, state))
}

/// Starts the engines' threads (scheduler, embedding batcher) and returns the state every
/// route shares.
pub fn start(models: Models, options: ServeOptions) -> Result<Arc<AppState>> {
    if models.generation.is_none() && models.embedding.is_none() && models.rerank.is_none() {
        return Err(Error::NoModel);
    }
    let metrics = Arc::new(metrics::Metrics::default());
    if options.layer_metrics {
        let totals = Arc::new(lattice_inference::metrics::LayerTotals::default());
        metrics.set_layers(Arc::clone(&totals));
        lattice_inference::metrics::install(totals);
    }
    let generation = models.generation.map(|(names, model)| {
        let engine = generation::Generator::start(model, &options, Arc::clone(&metrics));
        served(names, engine)
    });
    let embedding = models.embedding.map(|(names, model)| {
        let engine = embed_batcher::EmbedService::start(
            model,
            options.max_batch_tokens,
            Arc::clone(&metrics),
        );
        served(names, engine)
    });
    let rerank = models
        .rerank
        .map(|(names, model)| served(names, Arc::new(model)));
    Ok(Arc::new(AppState::new(
        generation, embedding, rerank, metrics, options,
    )))
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
pub(crate) async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
