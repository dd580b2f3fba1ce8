//! Reranking and tokenization: `POST /rerank` (text-embeddings-inference) and `POST /v1/rerank`
//! (the Cohere / Jina shape), cross-encoder scores best first; `POST /tokenize` (TEI: tokens
//! with their byte offsets).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use lattice_inference::tokenizer::Tokenizer;
use serde_json::{json, Value};

use crate::app::AppState;
use crate::error::ApiError;
use crate::protocol::{read_json, Document, RerankRequest, TeiRerankRequest, TeiTokenizeRequest};

/// Most passages in one rerank request.
const MAX_TEXTS: usize = 1024;

/// Scores `texts` against `query` off the async threads (activated scores, or raw logits);
/// returns them in input order, with the texts and the tokens run.
async fn score(
    state: &AppState,
    model: Option<&str>,
    query: String,
    texts: Vec<String>,
    raw: bool,
) -> Result<(Vec<f32>, Vec<String>, usize), ApiError> {
    let reranker = crate::app::engine(&state.rerank, model, "rerank", "--rerank-model")?;
    if texts.is_empty() || texts.len() > MAX_TEXTS {
        return Err(ApiError::invalid_param(
            "texts",
            format!("give 1 to {MAX_TEXTS} texts, got {}", texts.len()),
        ));
    }
    let reranker = Arc::clone(reranker);
    let (scores, texts, tokens) = tokio::task::spawn_blocking(move || {
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let (mut scores, tokens) = reranker.logits_with_tokens(&query, &refs)?;
        if !raw {
            reranker.activate(&mut scores);
        }
        Ok::<_, lattice_embed::Error>((scores, texts, tokens))
    })
    .await
    .map_err(|e| ApiError::internal(format!("reranking failed: {e}")))??;
    state.metrics.embedding_tokens(tokens);
    Ok((scores, texts, tokens))
}

/// Indices of `scores`, best first (ties: lower index first).
fn ranking(scores: &[f32]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    order
}

/// `POST /rerank` (text-embeddings-inference): `[{"index", "score", "text"?}]`, best first.
pub async fn rerank(State(state): State<Arc<AppState>>, body: Body) -> Result<Response, ApiError> {
    let req: TeiRerankRequest = read_json(body, &state.options).await?;
    let raw = req.raw_scores.unwrap_or(false);
    let (scores, texts, _) = score(&state, None, req.query, req.texts, raw).await?;
    let with_text = req.return_text.unwrap_or(false);
    let out: Vec<Value> = ranking(&scores)
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

/// `POST /v1/rerank` (Cohere / Jina shape): `{"results": [{"index", "relevance_score",
/// "document": {"text"}}], "usage"}`, best first, at most `top_n`.
pub async fn rerank_v1(
    State(state): State<Arc<AppState>>,
    body: Body,
) -> Result<Response, ApiError> {
    let req: RerankRequest = read_json(body, &state.options).await?;
    let texts: Vec<String> = req
        .documents
        .into_iter()
        .map(|d| match d {
            Document::Text(t) | Document::Object { text: t } => t,
        })
        .collect();
    let (scores, texts, tokens) =
        score(&state, req.model.as_deref(), req.query, texts, false).await?;
    let with_docs = req.return_documents.unwrap_or(true);
    let results: Vec<Value> = ranking(&scores)
        .into_iter()
        .take(req.top_n.unwrap_or(usize::MAX))
        .map(|i| {
            let mut v = json!({"index": i, "relevance_score": scores[i]});
            if with_docs {
                v["document"] = json!({"text": texts[i]});
            }
            v
        })
        .collect();
    let name = state.rerank.as_ref().map(|r| r.name.clone());
    Ok(axum::Json(json!({
        "id": format!("rerank-{}", state.next_id()),
        "model": name,
        "results": results,
        "usage": {"total_tokens": tokens},
    }))
    .into_response())
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
    let req: TeiTokenizeRequest = read_json(body, &state.options).await?;
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
