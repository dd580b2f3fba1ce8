//! `POST /v1/embeddings` (OpenAI) and `POST /embed` (text-embeddings-inference): inputs are
//! tokenized (truncated to the model's limit, as `lattice embed` and sentence-transformers do)
//! and sent to the [`EmbedService`](crate::embed_batcher::EmbedService) batcher.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde_json::{json, Value};

use crate::app::AppState;
use crate::embed_batcher::EmbedService;
use crate::error::ApiError;
use crate::protocol::{read_json, EmbeddingsRequest, Input, TeiEmbedRequest};

/// Most inputs in one request (OpenAI's limit).
const MAX_INPUTS: usize = 2048;

fn service<'a>(state: &'a AppState, model: Option<&str>) -> Result<&'a EmbedService, ApiError> {
    crate::app::engine(&state.embedding, model, "embedding", "--embedding-model")
}

/// Tokenizes `inputs` off the async threads; token-id inputs are checked and truncated.
async fn tokenize(service: &EmbedService, inputs: Vec<Input>) -> Result<Vec<Vec<u32>>, ApiError> {
    if inputs.is_empty() || inputs.len() > MAX_INPUTS {
        return Err(ApiError::invalid_param(
            "input",
            format!("give 1 to {MAX_INPUTS} inputs, got {}", inputs.len()),
        ));
    }
    let embedder = Arc::clone(&service.embedder);
    tokio::task::spawn_blocking(move || {
        let vocab = embedder.tokenizer().vocab_size();
        let max = embedder.max_tokens();
        inputs
            .into_iter()
            .enumerate()
            .map(|(i, input)| match input {
                Input::Text(t) => Ok(embedder.token_ids(&t)?),
                Input::Tokens(mut ids) => {
                    if ids.is_empty() {
                        return Err(ApiError::invalid_param(
                            format!("input[{i}]"),
                            "an input has no tokens",
                        ));
                    }
                    if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
                        return Err(ApiError::invalid_param(
                            format!("input[{i}]"),
                            format!("token id {bad} is outside the vocabulary of {vocab} tokens"),
                        ));
                    }
                    ids.truncate(max);
                    Ok(ids)
                }
            })
            .collect()
    })
    .await
    .map_err(|e| ApiError::internal(format!("tokenization failed: {e}")))?
}

/// `POST /v1/embeddings`.
pub async fn embeddings(
    State(state): State<Arc<AppState>>,
    body: Body,
) -> Result<Response, ApiError> {
    let req: EmbeddingsRequest = read_json(body, &state.options).await?;
    let service = service(&state, req.model.as_deref())?;
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::invalid_param(
                "encoding_format",
                format!("`encoding_format` must be `float` or `base64`, got `{other}`"),
            ))
        }
    };
    let dim = service.embedder.dim();
    if let Some(d) = req.dimensions {
        if d == 0 || d > dim {
            return Err(ApiError::invalid_param(
                "dimensions",
                format!("`dimensions` must be between 1 and {dim}, got {d}"),
            ));
        }
    }
    let ids = tokenize(service, req.input.into_inputs()).await?;
    let tokens: usize = ids.iter().map(Vec::len).sum();
    let mut vectors = service.embed(ids).await?;
    if let Some(d) = req.dimensions.filter(|&d| d < dim) {
        for v in &mut vectors {
            v.truncate(d);
            if service.embedder.normalizes() {
                lattice_embed::vector::normalize(v);
            }
        }
    }
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    let name = state.embedding.as_ref().map(|e| e.name.clone());
    Ok(axum::Json(json!({
        "object": "list",
        "data": data,
        "model": name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
    .into_response())
}

/// `POST /embed` (text-embeddings-inference): a list of vectors.
pub async fn tei_embed(
    State(state): State<Arc<AppState>>,
    body: Body,
) -> Result<Response, ApiError> {
    let req: TeiEmbedRequest = read_json(body, &state.options).await?;
    let service = service(&state, None)?;
    let inputs = req.inputs.into_vec().into_iter().map(Input::Text).collect();
    let ids = tokenize(service, inputs).await?;
    let mut vectors = service.embed(ids).await?;
    if req.normalize.unwrap_or(true) && !service.embedder.normalizes() {
        vectors
            .iter_mut()
            .for_each(|v| lattice_embed::vector::normalize(v));
    }
    Ok(axum::Json(vectors).into_response())
}
