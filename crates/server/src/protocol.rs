//! The JSON shapes of the OpenAI and text-embeddings-inference APIs that the routes accept,
//! and the reading of a request body into them (size limit, field-naming errors).

use axum::body::Body;
use serde::de::DeserializeOwned;
use serde::Deserialize;

// Request structs are read from a `serde_json::Value` so that errors name the field;
// `#[serde(flatten)]` would lose the path, so shared fields are read separately.

use crate::error::ApiError;
use crate::ServeOptions;

/// Reads a JSON body of at most `limits.max_body_bytes` bytes that arrives within
/// `limits.body_timeout`; a body that is not JSON gives a 400, an oversized one a 413 (as soon
/// as the limit is passed, not after buffering the rest), a slow one a 408. Fields are read
/// from the value with [`from_value`].
pub async fn read_body(body: Body, limits: &ServeOptions) -> Result<serde_json::Value, ApiError> {
    let limit = limits.max_body_bytes;
    let read = tokio::time::timeout(limits.body_timeout, axum::body::to_bytes(body, limit));
    let bytes = match read.await {
        Err(_) => return Err(ApiError::body_timeout(limits.body_timeout)),
        Ok(Ok(b)) => b,
        Ok(Err(e)) => {
            let over = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            return Err(if over {
                ApiError::too_large(limit)
            } else {
                ApiError::invalid(format!("cannot read the request body: {e}"))
            });
        }
    };
    let value: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::invalid(format!("the body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::invalid("the body must be a JSON object"));
    }
    Ok(value)
}

/// Reads `T` from a request's JSON value; a missing or mistyped field gives a 400 whose
/// `param` is the field's JSON path.
pub fn from_value<T: DeserializeOwned>(value: &serde_json::Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." || path.is_empty() {
            ApiError::invalid(format!("invalid request: {inner}"))
        } else {
            ApiError::invalid_param(path.clone(), format!("invalid `{path}`: {inner}"))
        }
    })
}

/// [`read_body`] then [`from_value`].
pub async fn read_json<T: DeserializeOwned>(
    body: Body,
    limits: &ServeOptions,
) -> Result<T, ApiError> {
    from_value(&read_body(body, limits).await?)
}

/// One string or several.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    /// A single string.
    One(String),
    /// A list of strings.
    Many(Vec<String>),
}

impl OneOrMany {
    /// The strings, in order.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

/// Text or token-id input of the embeddings and completions routes.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum TextOrTokens {
    /// One text.
    Text(String),
    /// Several texts.
    Texts(Vec<String>),
    /// One pre-tokenized input.
    Tokens(Vec<u32>),
    /// Several pre-tokenized inputs.
    TokenLists(Vec<Vec<u32>>),
}

/// One input of a [`TextOrTokens`].
#[derive(Debug)]
pub enum Input {
    /// Text to tokenize.
    Text(String),
    /// Token ids to use as they are.
    Tokens(Vec<u32>),
}

impl TextOrTokens {
    /// The inputs, in order.
    pub fn into_inputs(self) -> Vec<Input> {
        match self {
            TextOrTokens::Text(s) => vec![Input::Text(s)],
            TextOrTokens::Texts(v) => v.into_iter().map(Input::Text).collect(),
            TextOrTokens::Tokens(t) => vec![Input::Tokens(t)],
            TextOrTokens::TokenLists(v) => v.into_iter().map(Input::Tokens).collect(),
        }
    }
}

/// `POST /v1/embeddings`.
#[derive(Debug, Deserialize)]
pub struct EmbeddingsRequest {
    /// The model id.
    pub model: Option<String>,
    /// What to embed.
    pub input: TextOrTokens,
    /// `float` (default) or `base64` (little-endian f32).
    pub encoding_format: Option<String>,
    /// Keep the first `dimensions` values (Matryoshka), renormalized when the model normalizes.
    pub dimensions: Option<usize>,
}

/// Content of a chat message: a string or a list of parts.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Typed parts: `text` and `image_url`.
    Parts(Vec<ContentPart>),
}

/// One part of a message's content.
#[derive(Debug, Deserialize)]
pub struct ContentPart {
    /// `text` or `image_url` (others are refused).
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    pub text: Option<String>,
    /// The image of an `image_url` part.
    pub image_url: Option<ImageUrl>,
}

/// The `image_url` of a content part.
#[derive(Debug, Deserialize)]
pub struct ImageUrl {
    /// A `data:image/...;base64,` URL (or `http(s)` where the server allows it).
    pub url: String,
    /// OpenAI's resolution hint: `auto` and `high` (images are used whole, within the model's
    /// pixel limits); `low` is refused.
    pub detail: Option<String>,
}

/// A chat message as the API sends it.
#[derive(Debug, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant`, `tool`, `developer`.
    pub role: String,
    /// The content (null for an assistant turn with tool calls).
    pub content: Option<Content>,
    /// Reasoning of an earlier assistant turn.
    pub reasoning_content: Option<String>,
    /// Tool calls of an earlier assistant turn.
    pub tool_calls: Option<serde_json::Value>,
    /// Name of the speaker or tool.
    pub name: Option<String>,
    /// The call a `tool` message answers.
    pub tool_call_id: Option<String>,
}

/// `stream_options`.
#[derive(Debug, Deserialize, Default)]
pub struct StreamOptions {
    /// Send a last chunk with the usage counts.
    #[serde(default)]
    pub include_usage: bool,
}

/// Sampling and limit fields shared by chat and completions, read from the same body as the
/// route's own fields.
#[derive(Debug, Deserialize, Default)]
pub struct Sampling {
    /// Most tokens to generate.
    pub max_tokens: Option<u32>,
    /// Sampling temperature in [0, 2]; 0 is greedy.
    pub temperature: Option<f32>,
    /// Nucleus sampling mass in (0, 1].
    pub top_p: Option<f32>,
    /// Choices to generate.
    pub n: Option<u32>,
    /// Stream the answer as server-sent events.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Strings that end generation.
    pub stop: Option<OneOrMany>,
    /// Seed of the sampler (choice `i` uses `seed + i`).
    pub seed: Option<i64>,
    /// OpenAI presence penalty in [-2, 2].
    pub presence_penalty: Option<f32>,
    /// OpenAI frequency penalty in [-2, 2].
    pub frequency_penalty: Option<f32>,
    /// Extension: keep the `top_k` most likely tokens (0 or -1 = off).
    pub top_k: Option<i64>,
    /// Extension: min-p filter in [0, 1].
    pub min_p: Option<f32>,
    /// Extension: Hugging Face repetition penalty (> 0).
    pub repetition_penalty: Option<f32>,
    /// Extension: keep generating through end-of-sequence tokens.
    pub ignore_eos: Option<bool>,
    /// Extension: speculative decoding for this request, `"off"`, `"ngram"` (prompt lookup) or
    /// `"suffix"` (suffix match over the request and earlier outputs); the output is the same
    /// (greedy) or has the same distribution (sampling). Default: the server's.
    pub speculative: Option<String>,
    /// Extension: most tokens per draft (1-15) with `speculative`.
    pub draft_tokens: Option<u32>,
    /// Extension: a mixture of served LoRA adapters, `[{"name": "a", "scale": 0.5}, ...]` (the
    /// deltas add; scale default 1).
    pub lora: Option<Vec<crate::adapters::LoraRef>>,
    /// Token id (as a string) → offset in [-100, 100] added to its logit before each choice.
    pub logit_bias: Option<serde_json::Map<String, serde_json::Value>>,
    /// Output format: `{"type": "text"}`, `{"type": "json_object"}` or `{"type":
    /// "json_schema", "json_schema": {"name", "schema", "strict"}}` (the output is constrained
    /// to the schema).
    pub response_format: Option<serde_json::Value>,
    /// Which tool to call; `auto` and `none` are supported (the tools reach the template).
    pub tool_choice: Option<serde_json::Value>,
    /// Extension (llama.cpp, vLLM `guided_json`): constrain the output to this JSON Schema.
    pub json_schema: Option<serde_json::Value>,
    /// vLLM's name for `json_schema`.
    pub guided_json: Option<serde_json::Value>,
    /// Extension (vLLM `guided_regex`): constrain the output to this regular expression.
    pub regex: Option<String>,
    /// vLLM's name for `regex`.
    pub guided_regex: Option<String>,
    /// Extension (vLLM): the output is one of these strings.
    pub guided_choice: Option<Vec<String>>,
    /// Extension (vLLM): a Lark grammar the output follows.
    pub guided_grammar: Option<String>,
    /// Extension (llama.cpp): a GBNF grammar the output follows.
    pub grammar: Option<serde_json::Value>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    /// The model id.
    pub model: Option<String>,
    /// The conversation.
    pub messages: Vec<Message>,
    /// Newer name of `max_tokens`.
    pub max_completion_tokens: Option<u32>,
    /// Return log-probabilities of the generated tokens.
    pub logprobs: Option<bool>,
    /// Alternatives per token (0-20), with `logprobs`.
    pub top_logprobs: Option<u32>,
    /// Tool definitions, passed to the chat template; calls in the output come back as
    /// `tool_calls`.
    pub tools: Option<serde_json::Value>,
    /// Whether a forced call may be several calls (default true).
    pub parallel_tool_calls: Option<bool>,
    /// Extra chat-template variables (e.g. `enable_thinking`).
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
}

/// `POST /v1/completions`.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    /// The model id.
    pub model: Option<String>,
    /// One prompt or several (text or token ids).
    pub prompt: TextOrTokens,
    /// Log-probabilities of the generated tokens and this many alternatives (0-20).
    pub logprobs: Option<u32>,
    /// Put the prompt in front of the completion.
    pub echo: Option<bool>,
    /// Text after the insertion point (not supported).
    pub suffix: Option<String>,
    /// Completions generated per prompt to pick from (only 1 = `n` is supported).
    pub best_of: Option<u32>,
}

/// `POST /embed` (text-embeddings-inference).
#[derive(Debug, Deserialize)]
pub struct TeiEmbedRequest {
    /// Texts.
    pub inputs: OneOrMany,
    /// L2-normalize the vectors (default true).
    pub normalize: Option<bool>,
    /// Accepted for compatibility; inputs are always truncated to the model's limit.
    pub truncate: Option<bool>,
}

/// `POST /rerank` (text-embeddings-inference).
#[derive(Debug, Deserialize)]
pub struct TeiRerankRequest {
    /// The query.
    pub query: String,
    /// Passages to score against it.
    pub texts: Vec<String>,
    /// Return the raw logits instead of activated scores.
    pub raw_scores: Option<bool>,
    /// Return each passage's text with its score.
    pub return_text: Option<bool>,
    /// Accepted for compatibility; pairs are always truncated to the model's limit.
    pub truncate: Option<bool>,
}

/// `POST /tokenize` (text-embeddings-inference).
#[derive(Debug, Deserialize)]
pub struct TeiTokenizeRequest {
    /// Texts.
    pub inputs: OneOrMany,
    /// Add the model's special tokens (default true).
    pub add_special_tokens: Option<bool>,
}

/// `POST /v1/rerank` (the Cohere / Jina shape that vLLM and Infinity also serve).
#[derive(Debug, Deserialize)]
pub struct RerankRequest {
    /// The model id.
    pub model: Option<String>,
    /// The query.
    pub query: String,
    /// Documents: strings, or objects with a `text` field.
    pub documents: Vec<Document>,
    /// Return only the best `top_n` (default: all).
    pub top_n: Option<usize>,
    /// Return each document with its score (default true).
    pub return_documents: Option<bool>,
}

/// A document to rerank.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Document {
    /// Plain text.
    Text(String),
    /// `{"text": ...}`.
    Object {
        /// The text.
        text: String,
    },
}
