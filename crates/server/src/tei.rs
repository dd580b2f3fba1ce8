//! text-embeddings-inference routes besides `/embed`: `POST /rerank` (cross-encoder scores,
//! best first) and `POST /tokenize` (tokens with their byte offsets).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use lattice_inference::tokenizer::Tokenizer;
use serde_json::{json, Value};

use crate::app::AppState;
use crate::error::ApiError;
use crate::protocol::{read_json, TeiRerankRequest, TeiTokenizeRequest};

/// Most passages in one rerank request.
const MAX_TEXTS: usize = 1024;

/// `POST /rerank`.
pub async fn rerank(State(state): State<Arc<AppState>>, body: Body) -> Result<Response, ApiError> {
    let req: TeiRerankRequest = read_json(body, state.options.max_body_bytes).await?;
    let reranker = crate::app::engine(&state.rerank, None, "rerank", "--rerank-model")?;
    if req.texts.is_empty() || req.texts.len() > MAX_TEXTS {
        return Err(ApiError::invalid_param(
            "texts",
            format!("give 1 to {MAX_TEXTS} texts, got {}", req.texts.len()),
        ));
    }
    let reranker = Arc::clone(reranker);
    let raw = req.raw_scores.unwrap_or(false);
    let texts = req.texts;
    let query = req.query;
    let (scores, texts, tokens) = tokio::task::spawn_blocking(move || {
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let scores = if raw {
            reranker.logits(&query, &refs)
        } else {
            reranker.scores(&query, &refs)
        };
        let tokens: usize = refs
            .iter()
            .map(|p| reranker.tokenizer().encode_pair(&query, p, true).ids.len())
            .sum();
        scores.map(|s| (s, texts, tokens))
    })
    .await
    .map_err(|e| ApiError::internal(format!("reranking failed: {e}")))??;
    state.metrics.embedding_tokens(tokens);
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    let with_text = req.return_text.unwrap_or(false);
    let out: Vec<Value> = order
        .into_iter()
        .map(|i| {
            let mut v = json!({"index": i, "score": scores[i]});
            if with_text {
                v["text"] = json!(texts[i]);
            }
            v
        })
        .collect();
    Ok(axum::Json(out).into_response())
}

/// The tokenizer `/tokenize` uses: the embedding model's, else the reranker's, else the
/// generation model's.
fn tokenizer(state: &AppState) -> Option<&Tokenizer> {
    if let Some(e) = &state.embedding {
        return Some(e.engine.embedder.tokenizer());
    }
    if let Some(r) = &state.rerank {
        return Some(r.engine.tokenizer());
    }
    state.generation.as_ref().map(|g| &g.engine.model.tokenizer)
}

/// `POST /tokenize`.
pub async fn tokenize(
    State(state): State<Arc<AppState>>,
    body: Body,
) -> Result<Response, ApiError> {
    let req: TeiTokenizeRequest = read_json(body, state.options.max_body_bytes).await?;
    let inputs = req.inputs.into_vec();
    if inputs.len() > 2048 {
        return Err(ApiError::invalid_param(
            "inputs",
            format!("give at most 2048 inputs, got {}", inputs.len()),
        ));
    }
    let special = req.add_special_tokens.unwrap_or(true);
    let state2 = Arc::clone(&state);
    let out = tokio::task::spawn_blocking(move || {
        let tok = tokenizer(&state2).ok_or_else(|| ApiError::not_loaded("", "a model"))?;
        Ok::<_, ApiError>(
            inputs
                .iter()
                .map(|text| {
                    let enc = tok.encode_with(text, None, special, None);
                    enc.ids
                        .iter()
                        .enumerate()
                        .map(|(k, &id)| {
                            let (start, stop) = enc.offsets[k];
                            let is_special = enc.special_tokens_mask[k] == 1;
                            let piece = if is_special || stop <= start {
                                enc.tokens[k].clone()
                            } else {
                                text.get(start..stop).unwrap_or(&enc.tokens[k]).to_string()
                            };
                            json!({"id": id, "text": piece, "special": is_special,
                                   "start": start, "stop": stop})
                        })
                        .collect::<Vec<_>>()
                })
                .collect::<Vec<_>>(),
        )
    })
    .await
    .map_err(|e| ApiError::internal(format!("tokenization failed: {e}")))??;
    Ok(axum::Json(out).into_response())
}
