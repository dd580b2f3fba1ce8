//! The router and what every route shares: [`AppState`] (the engines and the limits), the API
//! key check, per-route metrics, `GET /health`, `GET /v1/models`, `GET /metrics`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use lattice_embed::Reranker;
use serde_json::{json, Value};

use crate::embed_batcher::EmbedService;
use crate::error::ApiError;
use crate::generation::Generator;
use crate::metrics::Metrics;
use crate::ServeOptions;

/// A loaded engine with the names clients may call it by.
pub struct Served<T> {
    /// The id reported in responses and `/v1/models`.
    pub name: String,
    /// Other accepted names (e.g. the folder name of a path).
    pub aliases: Vec<String>,
    /// The engine.
    pub engine: T,
}

impl<T> Served<T> {
    /// Accepts a request's `model` field: absent, empty, or one of the names.
    pub fn check(&self, requested: Option<&str>) -> Result<(), ApiError> {
        match requested {
            None | Some("") => Ok(()),
            Some(m) if m == self.name || self.aliases.iter().any(|a| a == m) => Ok(()),
            Some(m) => Err(ApiError::model_not_found(
                m,
                std::slice::from_ref(&self.name),
            )),
        }
    }
}

/// The engine of a route: `served` when loaded and `model` names it (404 otherwise; `what`
/// and `flag` name the missing model kind and the option that loads it).
pub fn engine<'a, T>(
    served: &'a Option<Served<T>>,
    model: Option<&str>,
    what: &str,
    flag: &str,
) -> Result<&'a T, ApiError> {
    let served = served
        .as_ref()
        .ok_or_else(|| ApiError::not_loaded(what, flag))?;
    served.check(model)?;
    Ok(&served.engine)
}

/// What the handlers share.
pub struct AppState {
    /// The generation scheduler, when a decoder is served.
    pub generation: Option<Served<Generator>>,
    /// The embedding batcher, when an embedding model is served.
    pub embedding: Option<Served<EmbedService>>,
    /// The cross-encoder, when one is served.
    pub rerank: Option<Served<Arc<Reranker>>>,
    /// Counters for `/metrics`.
    pub metrics: Arc<Metrics>,
    /// Limits and settings.
    pub options: ServeOptions,
    /// The LoRA adapters served over the generation model.
    pub adapters: crate::adapters::Adapters,
    /// Start time (seconds since the epoch), the `created` of the models.
    pub created: u64,
    next_id: AtomicU64,
}

impl AppState {
    /// State over the given engines.
    pub fn new(
        generation: Option<Served<Generator>>,
        embedding: Option<Served<EmbedService>>,
        rerank: Option<Served<Arc<Reranker>>>,
        metrics: Arc<Metrics>,
        options: ServeOptions,
    ) -> Self {
        let plan = generation
            .as_ref()
            .and_then(|g| g.engine.model.lora.clone());
        let adapters = crate::adapters::Adapters::new(
            plan,
            &options.adapters,
            options.lora_dir.as_deref(),
            options.max_loras,
        );
        Self {
            generation,
            embedding,
            rerank,
            metrics,
            options,
            adapters,
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            next_id: AtomicU64::new(1),
        }
    }

    /// A fresh id for a response.
    pub fn next_id(&self) -> String {
        format!("{:016x}", self.next_id.fetch_add(1, Ordering::Relaxed))
    }
}

/// Every route, with the API key check and metrics.
pub fn router(state: Arc<AppState>) -> Router {
    let api = Router::new()
        .route("/v1/embeddings", post(crate::embeddings::embeddings))
        .route("/v1/chat/completions", post(crate::completions::chat))
        .route("/v1/completions", post(crate::completions::completions))
        .route("/v1/models", get(models))
        .route("/v1/load_lora_adapter", post(crate::adapters::load))
        .route("/v1/unload_lora_adapter", post(crate::adapters::unload))
        .route("/v1/models/{*id}", get(model))
        .route("/v1/rerank", post(crate::tei::rerank_v1))
        .route("/embed", post(crate::embeddings::tei_embed))
        .route("/rerank", post(crate::tei::rerank))
        .route("/tokenize", post(crate::tei::tokenize))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&state), auth));
    Router::new()
        .merge(api)
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(Arc::clone(&state), record))
        .with_state(state)
}

/// Refuses requests without the right `Authorization: Bearer KEY` when a key is set.
async fn auth(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &state.options.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if !given.is_some_and(|g| constant_time_eq(g.as_bytes(), key.as_bytes())) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

/// Compares without an early exit on the first differing byte.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Counts every answered request by route and status.
async fn record(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "other".to_string(), |p| p.as_str().to_string());
    let t0 = Instant::now();
    let response = next.run(req).await;
    state.metrics.request(
        &route,
        response.status().as_u16(),
        t0.elapsed().as_secs_f64(),
    );
    response
}

async fn not_found() -> ApiError {
    let mut e = ApiError::invalid("no such route; see GET /v1/models and the README");
    e.status = StatusCode::NOT_FOUND;
    e
}

async fn health() -> impl IntoResponse {
    axum::Json(json!({"status": "ok"}))
}

async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
}

/// Every served model as a `/v1/models` entry, with its names.
fn model_list(state: &AppState) -> Vec<(Value, Vec<String>)> {
    let entry = |name: &str, aliases: &[String], kind: &str| {
        let v = json!({
            "id": name,
            "object": "model",
            "created": state.created,
            "owned_by": "lattice",
            "task": kind,
        });
        let mut names = vec![name.to_string()];
        names.extend(aliases.iter().cloned());
        (v, names)
    };
    let mut out = Vec::new();
    if let Some(g) = &state.generation {
        out.push(entry(&g.name, &g.aliases, "generate"));
        // LoRA adapters served over it, as vLLM lists them.
        for a in state.adapters.names() {
            let (mut v, names) = entry(&a, &[], "generate");
            v["parent"] = json!(g.name);
            out.push((v, names));
        }
    }
    if let Some(e) = &state.embedding {
        out.push(entry(&e.name, &e.aliases, "embed"));
    }
    if let Some(r) = &state.rerank {
        out.push(entry(&r.name, &r.aliases, "rerank"));
    }
    out
}

async fn models(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let data: Vec<Value> = model_list(&state).into_iter().map(|(e, _)| e).collect();
    axum::Json(json!({"object": "list", "data": data}))
}

/// `GET /v1/models/{id}` (ids may contain slashes: the rest of the path is the id).
async fn model(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    let list = model_list(&state);
    match list.iter().find(|(_, names)| names.contains(&id)) {
        Some((entry, _)) => axum::Json(entry.clone()).into_response(),
        None => {
            let served: Vec<String> = list.iter().map(|(_, names)| names[0].clone()).collect();
            ApiError::model_not_found(&id, &served).into_response()
        }
    }
}
