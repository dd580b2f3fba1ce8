//! `POST /v1/chat/completions` and `POST /v1/completions`: requests are validated and turned
//! into [`GenerateRequest`]s (one per choice), handed to the [`Generator`], and answered as one
//! JSON object or as server-sent events. Dropping the response (client gone) drops the event
//! receiver, which cancels the sequences.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use lattice_inference::chat::{ChatMessage, ContentPart, RenderOptions};
use lattice_inference::engine::{Drafter, GenerateRequest, Generation, TextModel, TokenLogprob};
use lattice_inference::grammar::{Constraint, Spec};
use lattice_inference::lora::Selection;
use lattice_inference::sample::SamplingParams;
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::app::AppState;
use crate::error::ApiError;
use crate::generation::{GenEvent, Generator};
use crate::images::ImageRef;
use crate::protocol::{
    from_value, read_body, ChatRequest, CompletionRequest, Content, Input, Message, Sampling,
};

/// Which API shape a response takes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Api {
    Chat,
    Completion,
}

/// Everything a response needs besides the events.
struct Reply {
    api: Api,
    id: String,
    created: u64,
    model_name: String,
    model: Arc<TextModel>,
    /// Choices in all; `per_prompt` per prompt.
    choices: usize,
    per_prompt: usize,
    prompt_tokens: usize,
    /// Prompt text put in front of each choice's text (completions `echo`), by choice.
    echo: Vec<String>,
    logprobs: Option<usize>,
    include_usage: bool,
    arrived: Instant,
    /// Parse tool calls in this format out of the choices (chat with `tools`).
    tools: Option<crate::tools::Format>,
}

impl Reply {
    #[allow(clippy::too_many_arguments)]
    fn new(
        api: Api,
        state: &AppState,
        model: Arc<TextModel>,
        prompt_tokens: usize,
        echo: Vec<String>,
        logprobs: Option<usize>,
        sampling: &Sampling,
        arrived: Instant,
    ) -> Self {
        let prefix = if api == Api::Chat { "chatcmpl" } else { "cmpl" };
        Reply {
            api,
            id: format!("{prefix}-{}", state.next_id()),
            created: unix_now(),
            model_name: state
                .generation
                .as_ref()
                .map(|g| g.name.clone())
                .unwrap_or_default(),
            model,
            choices: 0,
            per_prompt: 1,
            prompt_tokens,
            echo,
            logprobs,
            include_usage: sampling
                .stream_options
                .as_ref()
                .is_some_and(|o| o.include_usage),
            arrived,
            tools: None,
        }
    }
}

/// Submits the choices and answers: a stream of events or one JSON object.
async fn start(
    state: &Arc<AppState>,
    gen: &Generator,
    mut reply: Reply,
    requests: Vec<GenerateRequest>,
    sampling: &Sampling,
) -> Result<Response, ApiError> {
    reply.choices = requests.len();
    reply.per_prompt = sampling.n.map_or(1, |n| n.max(1) as usize);
    let events = gen.submit(requests)?;
    if sampling.stream.unwrap_or(false) {
        Ok(sse_response(Arc::clone(state), reply, events))
    } else {
        collect(state, reply, events).await
    }
}

fn range(param: &str, v: Option<f32>, lo: f32, hi: f32) -> Result<(), ApiError> {
    match v {
        Some(x) if !(x.is_finite() && x >= lo && x <= hi) => Err(ApiError::invalid_param(
            param,
            format!("`{param}` must be between {lo} and {hi}, got {x}"),
        )),
        _ => Ok(()),
    }
}

/// The output constraint a request asks for (`response_format`, or one of the `json_schema` /
/// `regex` / `guided_*` extensions), if any; what cannot be enforced is refused.
fn constraint_spec(s: &Sampling) -> Result<Option<(&'static str, Spec)>, ApiError> {
    // A schema given as a JSON string is read as JSON.
    let schema = |field: &'static str, v: &Value| -> Result<Spec, ApiError> {
        match v {
            Value::String(text) => serde_json::from_str(text)
                .map(Spec::JsonSchema)
                .map_err(|e| ApiError::invalid_param(field, format!("`{field}` is not JSON: {e}"))),
            Value::Object(_) | Value::Bool(_) => Ok(Spec::JsonSchema(v.clone())),
            _ => Err(ApiError::invalid_param(
                field,
                format!("`{field}` must be a JSON Schema object"),
            )),
        }
    };
    let mut found: Vec<(&'static str, Spec)> = Vec::new();
    if let Some(f) = &s.response_format {
        match f.get("type").and_then(|t| t.as_str()) {
            Some("text") => {}
            Some("json_object") => found.push(("response_format", Spec::JsonObject)),
            Some("json_schema") => {
                let v = f.pointer("/json_schema/schema").ok_or_else(|| {
                    ApiError::invalid_param(
                        "response_format.json_schema.schema",
                        "`response_format` of type `json_schema` needs `json_schema.schema`",
                    )
                })?;
                found.push((
                    "response_format",
                    schema("response_format.json_schema.schema", v)?,
                ));
            }
            other => {
                return Err(ApiError::invalid_param(
                    "response_format.type",
                    format!(
                    "`response_format.type` must be `text`, `json_object` or `json_schema`, got {}",
                    other.map_or_else(|| "nothing".to_owned(), |k| format!("`{k}`"))
                ),
                ))
            }
        }
    }
    if let Some(v) = &s.json_schema {
        found.push(("json_schema", schema("json_schema", v)?));
    }
    if let Some(v) = &s.guided_json {
        found.push(("guided_json", schema("guided_json", v)?));
    }
    if let Some(r) = &s.regex {
        found.push(("regex", Spec::Regex(r.clone())));
    }
    if let Some(r) = &s.guided_regex {
        found.push(("guided_regex", Spec::Regex(r.clone())));
    }
    match &s.grammar {
        None => {}
        Some(Value::String(g)) => found.push(("grammar", Spec::Gbnf(g.clone()))),
        Some(_) => {
            return Err(ApiError::invalid_param(
                "grammar",
                "`grammar` must be GBNF text (a string)",
            ))
        }
    }
    if let Some(g) = &s.guided_grammar {
        found.push(("guided_grammar", Spec::Lark(g.clone())));
    }
    if let Some(choices) = &s.guided_choice {
        if choices.is_empty() {
            return Err(ApiError::invalid_param(
                "guided_choice",
                "`guided_choice` is empty",
            ));
        }
        let alts: Vec<String> = choices
            .iter()
            .map(|c| serde_json::to_string(c).unwrap_or_default())
            .collect();
        found.push((
            "guided_choice",
            Spec::Lark(format!("start: {}", alts.join(" | "))),
        ));
    }
    if found.len() > 1 {
        let names: Vec<&str> = found.iter().map(|f| f.0).collect();
        return Err(ApiError::invalid_param(
            names[1],
            format!(
                "one output constraint per request, got {}",
                names.join(", ")
            ),
        ));
    }
    Ok(found.pop())
}

/// `logit_bias`: token id → offset in [-100, 100], ids inside the vocabulary.
fn logit_bias(s: &Sampling, vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(m) = &s.logit_bias else {
        return Ok(Vec::new());
    };
    m.iter()
        .map(|(k, v)| {
            let param = format!("logit_bias.{k}");
            let id: u32 =
                k.parse()
                    .ok()
                    .filter(|&i: &u32| (i as usize) < vocab)
                    .ok_or_else(|| {
                        ApiError::invalid_param(
                    param.clone(),
                    format!("`logit_bias` key `{k}` is not a token id of this model (0..{vocab})"),
                )
                    })?;
            let b = v
                .as_f64()
                .filter(|b| (-100.0..=100.0).contains(b))
                .ok_or_else(|| {
                    ApiError::invalid_param(
                        param.clone(),
                        format!("`logit_bias` values must be numbers in [-100, 100], got {v}"),
                    )
                })?;
            Ok((id, b as f32))
        })
        .collect()
}

/// Compiles the request's output constraint over the model's vocabulary (on the blocking pool:
/// the first one builds the vocabulary); an invalid one is a 400 naming the field.
async fn compile_constraint(
    model: &Arc<TextModel>,
    spec: Option<(&'static str, Spec)>,
) -> Result<Option<Constraint>, ApiError> {
    let Some((field, spec)) = spec else {
        return Ok(None);
    };
    let model = Arc::clone(model);
    blocking(move || {
        model
            .compile_constraint(&spec)
            .map(Some)
            .map_err(|e| ApiError::invalid_param(field, format!("`{field}`: {e}")))
    })
    .await
}

/// Validates the shared sampling fields; returns the sampler parameters for choice 0 and `n`.
fn sampling_params(s: &Sampling) -> Result<(SamplingParams, usize), ApiError> {
    range("temperature", s.temperature, 0.0, 2.0)?;
    range("presence_penalty", s.presence_penalty, -2.0, 2.0)?;
    range("frequency_penalty", s.frequency_penalty, -2.0, 2.0)?;
    range("min_p", s.min_p, 0.0, 1.0)?;
    if let Some(p) = s.top_p {
        if !(p.is_finite() && p > 0.0 && p <= 1.0) {
            return Err(ApiError::invalid_param(
                "top_p",
                format!("`top_p` must be in (0, 1], got {p}"),
            ));
        }
    }
    if let Some(r) = s.repetition_penalty {
        if !(r.is_finite() && r > 0.0) {
            return Err(ApiError::invalid_param(
                "repetition_penalty",
                format!("`repetition_penalty` must be > 0, got {r}"),
            ));
        }
    }
    let n = s.n.unwrap_or(1) as usize;
    if !(1..=16).contains(&n) {
        return Err(ApiError::invalid_param(
            "n",
            format!("`n` must be between 1 and 16, got {n}"),
        ));
    }
    let top_k = match s.top_k {
        None | Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => k as usize,
        Some(k) => {
            return Err(ApiError::invalid_param(
                "top_k",
                format!("`top_k` must be -1, 0 or positive, got {k}"),
            ))
        }
    };
    let params = SamplingParams {
        temperature: s.temperature.unwrap_or(1.0),
        top_k,
        top_p: s.top_p.unwrap_or(1.0),
        min_p: s.min_p.unwrap_or(0.0),
        repetition_penalty: s.repetition_penalty.unwrap_or(1.0),
        presence_penalty: s.presence_penalty.unwrap_or(0.0),
        frequency_penalty: s.frequency_penalty.unwrap_or(0.0),
        seed: s.seed.map(|x| x as u64),
    };
    Ok((params, n))
}

/// Builds the choices of one prompt.
#[allow(clippy::too_many_arguments)]
fn requests_for(
    model: &TextModel,
    prompt_ids: Vec<u32>,
    s: &Sampling,
    max_tokens: Option<u32>,
    default_max: usize,
    limit: usize,
    logprobs: Option<usize>,
    constraint: &Option<Constraint>,
    default_draft: (usize, Drafter),
    lora: &Selection,
) -> Result<Vec<GenerateRequest>, ApiError> {
    let (params, n) = sampling_params(s)?;
    let context = model.decoder.info().config.max_positions;
    let vocab = model.decoder.info().config.vocab_size;
    if prompt_ids.is_empty() {
        return Err(ApiError::invalid("the prompt is empty (no tokens)"));
    }
    if prompt_ids.len() >= context {
        return Err(ApiError::invalid(format!(
            "the prompt has {} tokens; the model's context holds {context}",
            prompt_ids.len()
        )));
    }
    if let Some(bad) = prompt_ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::invalid_param(
            "prompt",
            format!("token id {bad} is outside the vocabulary of {vocab} tokens"),
        ));
    }
    let max_tokens = match max_tokens {
        Some(0) => {
            return Err(ApiError::invalid_param(
                "max_tokens",
                "`max_tokens` must be at least 1",
            ))
        }
        Some(m) if m as usize > limit => {
            return Err(ApiError::invalid_param(
                "max_tokens",
                format!("`max_tokens` is {m}; this server allows at most {limit}"),
            ))
        }
        Some(m) => m as usize,
        None => default_max
            .min(limit)
            .min(context - prompt_ids.len())
            .max(1),
    };
    let stop = stop_strings(&s.stop)?;
    let bias = logit_bias(s, vocab)?;
    let (draft_tokens, drafter) = speculation(s, default_draft)?;
    (0..n)
        .map(|i| {
            let mut p = params.clone();
            p.seed = params.seed.map(|x| x.wrapping_add(i as u64));
            let mut r = GenerateRequest::new(prompt_ids.clone(), max_tokens, p);
            r.stop = stop.clone();
            r.logprobs = logprobs;
            r.ignore_eos = s.ignore_eos.unwrap_or(false);
            r.constraint = constraint.clone();
            r.logit_bias = bias.clone();
            r.draft_tokens = draft_tokens;
            r.drafter = drafter;
            r.lora = lora.clone();
            r
        })
        .map(|r| {
            // Asked for by the request itself: refused where it would not act (the server's
            // default is refused at start).
            let asked = r.draft_tokens > 0
                && (s.speculative.as_deref().is_some_and(|x| x != "off")
                    || s.draft_tokens.is_some());
            match model.draft_refusal() {
                Some(why) if asked => Err(ApiError::invalid_param("speculative", why)),
                _ => Ok(r),
            }
        })
        .collect()
}

/// The `speculative` and `draft_tokens` extensions: tokens per draft (0: off) and the
/// drafter, the server's `default` unless the request says.
fn speculation(s: &Sampling, default: (usize, Drafter)) -> Result<(usize, Drafter), ApiError> {
    let n = match s.draft_tokens {
        Some(n) if !(1..=15).contains(&n) => {
            return Err(ApiError::invalid_param(
                "draft_tokens",
                format!("`draft_tokens` is {n}; it must be between 1 and 15"),
            ))
        }
        Some(n) => Some(n as usize),
        None => None,
    };
    let drafter = match s.speculative.as_deref() {
        None => return Ok((n.unwrap_or(default.0), default.1)),
        Some("off") if n.is_some() => {
            return Err(ApiError::invalid_param(
                "draft_tokens",
                "`draft_tokens` needs `speculative` \"ngram\" or \"suffix\" (it is \"off\")",
            ))
        }
        Some("off") => return Ok((0, default.1)),
        Some("ngram") => Drafter::Ngram,
        Some("suffix") => Drafter::Suffix,
        Some(other) => {
            return Err(ApiError::invalid_param(
                "speculative",
                format!("`speculative` is \"{other}\"; supported: \"off\", \"ngram\", \"suffix\""),
            ))
        }
    };
    let len = n.unwrap_or(if default.0 > 0 { default.0 } else { 10 });
    Ok((len, drafter))
}

/// The `stop` field: one string or up to 16.
fn stop_strings(stop: &Option<crate::protocol::OneOrMany>) -> Result<Vec<String>, ApiError> {
    let v: Vec<String> = match stop {
        None => Vec::new(),
        Some(crate::protocol::OneOrMany::One(s)) => vec![s.clone()],
        Some(crate::protocol::OneOrMany::Many(v)) => v.clone(),
    };
    if v.len() > 16 {
        return Err(ApiError::invalid_param(
            "stop",
            format!("at most 16 stop strings, got {}", v.len()),
        ));
    }
    Ok(v.into_iter().filter(|s| !s.is_empty()).collect())
}

/// A chat message of the API as the chat template sees it; its image parts' URLs are added
/// to `images`.
fn chat_message(m: Message, i: usize, images: &mut Vec<ImageRef>) -> Result<ChatMessage, ApiError> {
    let mut parts = Vec::new();
    let content = match m.content {
        None => String::new(),
        Some(Content::Text(t)) => t,
        Some(Content::Parts(list)) => {
            let mut text = String::new();
            for (j, p) in list.into_iter().enumerate() {
                let path = format!("messages[{i}].content[{j}]");
                match (p.kind.as_str(), p.text, p.image_url) {
                    ("text", Some(t), _) => {
                        text.push_str(&t);
                        parts.push(ContentPart::Text(t));
                    }
                    ("image_url", _, Some(u)) => {
                        // Images are always used whole, at the model's own resolution limits:
                        // that is `auto` and `high`; `low` (a downscaled image) is refused.
                        if let Some(d) = u.detail.as_deref().filter(|d| !matches!(*d, "auto" | "high")) {
                            return Err(ApiError::invalid_param(
                                format!("{path}.image_url.detail"),
                                format!("`detail` \"{d}\" is not supported: images are used at full resolution (\"auto\" or \"high\")"),
                            ));
                        }
                        images.push(ImageRef {
                            path: format!("{path}.image_url.url"),
                            url: u.url,
                        });
                        parts.push(ContentPart::Image);
                    }
                    ("image_url", _, None) => {
                        return Err(ApiError::invalid_param(
                            path,
                            "an `image_url` part needs `image_url: {\"url\": ...}`",
                        ))
                    }
                    (kind, _, _) => {
                        return Err(ApiError::invalid_param(
                            path,
                            format!("content parts of type `{kind}` are not supported (`text`, `image_url`)"),
                        ))
                    }
                }
            }
            text
        }
    };
    if !parts.iter().any(|p| matches!(p, ContentPart::Image)) {
        parts.clear();
    }
    Ok(ChatMessage {
        role: m.role,
        content,
        reasoning_content: m.reasoning_content,
        tool_calls: m.tool_calls,
        name: m.name,
        tool_call_id: m.tool_call_id,
        parts,
    })
}

/// Runs CPU-bound request preparation (template rendering, tokenization) off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("request preparation failed: {e}")))?
}

/// The generation engine a request's `model` names, the served LoRA adapter's name when it
/// names one, and the adapters the request runs with (that one, or its `lora` mixture).
fn generator<'a>(
    state: &'a AppState,
    model: Option<&str>,
    sampling: &Sampling,
) -> Result<(&'a Generator, Option<String>, Selection), ApiError> {
    let (adapter, lora) = state.adapters.pick(model, sampling.lora.as_deref())?;
    let model = if adapter.is_some() { None } else { model };
    let g = crate::app::engine(&state.generation, model, "generation", "--model")?;
    Ok((g, adapter, lora))
}

/// `POST /v1/chat/completions`.
pub async fn chat(State(state): State<Arc<AppState>>, body: Body) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let value = read_body(body, &state.options).await?;
    let req: ChatRequest = from_value(&value)?;
    let sampling: Sampling = from_value(&value)?;
    let (gen, adapter, lora) = generator(&state, req.model.as_deref(), &sampling)?;
    if req.messages.is_empty() {
        return Err(ApiError::invalid_param("messages", "`messages` is empty"));
    }
    if let Some(t) = req.top_logprobs {
        if t > 20 {
            return Err(ApiError::invalid_param(
                "top_logprobs",
                format!("`top_logprobs` must be between 0 and 20, got {t}"),
            ));
        }
    }
    let logprobs = req
        .logprobs
        .unwrap_or(false)
        .then(|| req.top_logprobs.unwrap_or(0) as usize);
    let mut image_refs = Vec::new();
    let messages = req
        .messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| chat_message(m, i, &mut image_refs))
        .collect::<Result<Vec<_>, _>>()?;
    // Tools: rendered by the template unless `tool_choice` is "none"; calls in the output are
    // parsed; "required" or a named function forces one under a grammar of the parameters.
    let choice = sampling.tool_choice.clone();
    let tools = req
        .tools
        .filter(|t| !t.as_array().is_some_and(Vec::is_empty))
        .filter(|_| choice.as_ref().and_then(Value::as_str) != Some("none"));
    let forced = match (&choice, &tools) {
        (None, _) => false,
        (Some(c), _) if matches!(c.as_str(), Some("auto") | Some("none")) => false,
        (Some(c), Some(_)) if c.as_str() == Some("required") || c.pointer("/function/name").is_some() => true,
        (Some(c), None) if c.as_str() == Some("required") || c.pointer("/function/name").is_some() => {
            return Err(ApiError::invalid_param("tool_choice", "`tool_choice` forces a call but `tools` is empty"))
        }
        (Some(c), _) => {
            return Err(ApiError::invalid_param(
                "tool_choice",
                format!("`tool_choice` must be `none`, `auto`, `required` or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {c}"),
            ))
        }
    };
    if let Some(t) = &tools {
        crate::tools::validate(t)?;
    }
    let format = crate::tools::format_of(&gen.model);
    if tools.is_some() && format.is_none() {
        return Err(ApiError::invalid_param(
            "tools",
            "this model's chat template has no tool-call format Lattice parses (Hermes / Qwen `<tool_call>`, Mistral `[TOOL_CALLS]`, Llama 3 JSON)",
        ));
    }
    let mut spec = constraint_spec(&sampling)?;
    if forced {
        if let Some((field, _)) = spec {
            return Err(ApiError::invalid_param(
                field,
                format!("`{field}` and a forced `tool_choice` cannot be combined"),
            ));
        }
        let t = tools.as_ref().expect("forced implies tools");
        let c = choice.as_ref().expect("forced implies a choice");
        spec = Some((
            "tool_choice",
            crate::tools::forced_call(
                format.expect("checked above"),
                t,
                c,
                req.parallel_tool_calls.unwrap_or(true),
            )?,
        ));
    }
    let parse_tools = format.filter(|_| tools.is_some());
    let mut opts = RenderOptions {
        add_generation_prompt: true,
        tools,
        ..Default::default()
    };
    if let Some(mut kw) = req.chat_template_kwargs {
        if let Some(v) = kw.remove("enable_thinking") {
            opts.enable_thinking = v.as_bool();
        }
        opts.extra = kw;
    }
    let model = Arc::clone(&gen.model);
    let (ids, images) = {
        let model = Arc::clone(&model);
        let options = state.options.clone();
        blocking(move || {
            let images = crate::images::prepare(&model, &image_refs, &options)?;
            let ids = model.encode_chat(&messages, &opts)?;
            Ok((model.expand_images(ids, &images)?, images))
        })
        .await?
    };
    let prompt_tokens = ids.len();
    let max_tokens = req.max_completion_tokens.or(sampling.max_tokens);
    let constraint = compile_constraint(&model, spec).await?;
    let requests = requests_for(
        &model,
        ids,
        &sampling,
        max_tokens,
        usize::MAX,
        state.options.max_tokens,
        logprobs,
        &constraint,
        (state.options.draft_tokens, state.options.drafter),
        &lora,
    )?;
    let mut reply = Reply::new(
        Api::Chat,
        &state,
        model,
        prompt_tokens,
        Vec::new(),
        logprobs,
        &sampling,
        arrived,
    );
    if let Some(name) = adapter {
        reply.model_name = name;
    }
    reply.tools = parse_tools;
    let mut requests = requests;
    for r in &mut requests {
        r.images = images.clone();
    }
    if parse_tools.is_some() {
        // Tool-call markers are special tokens in some vocabularies (Qwen2.5's GGUF, Mistral).
        for r in &mut requests {
            r.keep_special_tokens = true;
        }
    }
    start(&state, gen, reply, requests, &sampling).await
}

/// `POST /v1/completions`.
pub async fn completions(
    State(state): State<Arc<AppState>>,
    body: Body,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let value = read_body(body, &state.options).await?;
    let req: CompletionRequest = from_value(&value)?;
    let sampling: Sampling = from_value(&value)?;
    let (gen, adapter, lora) = generator(&state, req.model.as_deref(), &sampling)?;
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid_param(
            "suffix",
            "`suffix` is not supported",
        ));
    }
    if req
        .best_of
        .is_some_and(|b| b as usize != sampling.n.unwrap_or(1) as usize)
    {
        return Err(ApiError::invalid_param(
            "best_of",
            "`best_of` other than `n` is not supported",
        ));
    }
    if let Some(l) = req.logprobs {
        if l > 20 {
            return Err(ApiError::invalid_param(
                "logprobs",
                format!("`logprobs` must be between 0 and 20, got {l}"),
            ));
        }
    }
    let echo = req.echo.unwrap_or(false);
    let inputs = req.prompt.into_inputs();
    if inputs.is_empty() || inputs.len() > 64 {
        return Err(ApiError::invalid_param(
            "prompt",
            format!("give 1 to 64 prompts, got {}", inputs.len()),
        ));
    }
    let model = Arc::clone(&gen.model);
    let prompts: Vec<(Vec<u32>, String)> = {
        let model = Arc::clone(&model);
        blocking(move || {
            inputs
                .into_iter()
                .map(|input| match input {
                    Input::Text(t) => Ok((model.encode_prompt(&t, true)?, t)),
                    Input::Tokens(ids) => {
                        let text = model.tokenizer.decode(&ids, false);
                        Ok((ids, text))
                    }
                })
                .collect::<Result<Vec<_>, ApiError>>()
        })
        .await?
    };
    let logprobs = req.logprobs.map(|l| l as usize);
    let mut requests = Vec::new();
    let mut echo_text = Vec::new();
    let mut prompt_tokens = 0;
    if sampling.tool_choice.is_some() {
        return Err(ApiError::invalid_param(
            "tool_choice",
            "`tool_choice` belongs to /v1/chat/completions (with `tools`)",
        ));
    }
    let constraint = compile_constraint(&model, constraint_spec(&sampling)?).await?;
    for (ids, text) in prompts {
        prompt_tokens += ids.len();
        let choices = requests_for(
            &model,
            ids,
            &sampling,
            sampling.max_tokens,
            16,
            state.options.max_tokens,
            logprobs,
            &constraint,
            (state.options.draft_tokens, state.options.drafter),
            &lora,
        )?;
        for _ in 0..choices.len() {
            echo_text.push(if echo { text.clone() } else { String::new() });
        }
        requests.extend(choices);
    }
    let mut reply = Reply::new(
        Api::Completion,
        &state,
        model,
        prompt_tokens,
        echo_text,
        logprobs,
        &sampling,
        arrived,
    );
    if let Some(name) = adapter {
        reply.model_name = name;
    }
    start(&state, gen, reply, requests, &sampling).await
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Waits for every choice and answers one JSON object.
async fn collect(
    state: &AppState,
    reply: Reply,
    mut events: UnboundedReceiver<GenEvent>,
) -> Result<Response, ApiError> {
    let mut results: Vec<Option<Generation>> = vec![None; reply.choices];
    let mut done = 0;
    let mut first = true;
    while done < reply.choices {
        match events.recv().await {
            Some(GenEvent::Delta { .. }) => {
                if first {
                    first = false;
                    state
                        .metrics
                        .time_to_first_token(reply.arrived.elapsed().as_secs_f64());
                }
            }
            Some(GenEvent::Done { index, generation }) => {
                if results[index].replace(generation).is_none() {
                    done += 1;
                }
            }
            Some(GenEvent::Failed(m)) => return Err(ApiError::internal(m)),
            None => return Err(ApiError::internal("the generation engine stopped")),
        }
    }
    let results: Vec<Generation> = results.into_iter().flatten().collect();
    let completion_tokens: usize = results.iter().map(|g| g.token_ids.len()).sum();
    let choices: Vec<Value> = results
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let lp = reply.logprobs.map(|_| {
                logprobs_json(
                    &reply,
                    &g.logprobs,
                    reply.echo.get(i).map_or(0, String::len),
                )
            });
            match reply.api {
                Api::Chat => {
                    let (content, calls) = if let Some(f) = reply.tools {
                        crate::tools::parse(f, &g.text)
                    } else {
                        (g.text.clone(), Vec::new())
                    };
                    if calls.is_empty() {
                        json!({
                            "index": i,
                            "message": {"role": "assistant", "content": g.text},
                            "logprobs": lp,
                            "finish_reason": g.finish_reason.as_str(),
                        })
                    } else {
                        json!({
                            "index": i,
                            "message": {
                                "role": "assistant",
                                "content": if content.is_empty() { Value::Null } else { json!(content) },
                                "tool_calls": crate::tools::calls_json(&calls, &reply.id, i, false),
                            },
                            "logprobs": lp,
                            "finish_reason": "tool_calls",
                        })
                    }
                }
                Api::Completion => json!({
                    "index": i,
                    "text": format!("{}{}", reply.echo[i], g.text),
                    "logprobs": lp,
                    "finish_reason": g.finish_reason.as_str(),
                }),
            }
        })
        .collect();
    let body = json!({
        "id": reply.id,
        "object": if reply.api == Api::Chat { "chat.completion" } else { "text_completion" },
        "created": reply.created,
        "model": reply.model_name,
        "choices": choices,
        "usage": usage(
            reply.prompt_tokens,
            completion_tokens,
            cached_tokens(&reply, results.iter().enumerate()),
        ),
    });
    Ok(axum::Json(body).into_response())
}

fn usage(prompt: usize, completion: usize, cached: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

/// Prompt tokens that were already in the prefix cache when the request arrived: for each
/// prompt, what its first choice found (its other choices reuse what the first computed).
fn cached_tokens<'a>(
    reply: &Reply,
    results: impl Iterator<Item = (usize, &'a Generation)>,
) -> usize {
    results
        .filter(|(i, _)| i % reply.per_prompt == 0)
        .map(|(_, g)| g.cached_prompt_tokens)
        .sum()
}

/// The `logprobs` object of a choice (or of a stream chunk): chat's `content` list, or the
/// completions shape (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`, offsets
/// counted from `offset`).
fn logprobs_json(reply: &Reply, lps: &[TokenLogprob], offset: usize) -> Value {
    let tok = &reply.model.tokenizer;
    let text = |id: u32| tok.decode(&[id], false);
    match reply.api {
        Api::Chat => {
            let content: Vec<Value> = lps
                .iter()
                .map(|lp| {
                    let t = text(lp.token);
                    json!({
                        "token": t,
                        "logprob": lp.logprob,
                        "bytes": t.as_bytes(),
                        "top_logprobs": lp.top.iter().map(|&(id, l)| {
                            let t = text(id);
                            json!({"token": t, "logprob": l, "bytes": t.as_bytes()})
                        }).collect::<Vec<_>>(),
                    })
                })
                .collect();
            json!({ "content": content })
        }
        Api::Completion => {
            let mut tokens = Vec::new();
            let mut token_logprobs = Vec::new();
            let mut top = Vec::new();
            let mut offsets = Vec::new();
            let mut at = offset;
            for lp in lps {
                let t = text(lp.token);
                offsets.push(at);
                at += t.len();
                tokens.push(t);
                token_logprobs.push(lp.logprob);
                let alts: serde_json::Map<String, Value> =
                    lp.top.iter().map(|&(id, l)| (text(id), json!(l))).collect();
                top.push(Value::Object(alts));
            }
            json!({
                "tokens": tokens,
                "token_logprobs": token_logprobs,
                "top_logprobs": top,
                "text_offset": offsets,
            })
        }
    }
}

/// Streaming state: what has been sent, per choice.
struct Streamer {
    state: Arc<AppState>,
    reply: Reply,
    events: UnboundedReceiver<GenEvent>,
    outbox: VecDeque<Bytes>,
    /// Text bytes sent per choice (for completions' `text_offset`).
    sent: Vec<usize>,
    done: usize,
    completion_tokens: usize,
    cached_tokens: usize,
    first: bool,
    ended: bool,
    /// Per choice, with tools: content streams until a call may be starting.
    tool_streams: Vec<crate::tools::ToolStream>,
}

impl Streamer {
    fn chunk(&self, choices: Vec<Value>, usage: Option<Value>) -> Bytes {
        let mut v = json!({
            "id": self.reply.id,
            "object": if self.reply.api == Api::Chat { "chat.completion.chunk" } else { "text_completion" },
            "created": self.reply.created,
            "model": self.reply.model_name,
            "choices": choices,
        });
        if self.reply.include_usage {
            v["usage"] = usage.unwrap_or(Value::Null);
        }
        Bytes::from(format!("data: {v}\n\n"))
    }

    fn choice(&self, index: usize, text: &str, logprobs: Value, finish: Value) -> Value {
        match self.reply.api {
            Api::Chat => {
                let delta = if text.is_empty() {
                    json!({})
                } else {
                    json!({"content": text})
                };
                json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
            }
            Api::Completion => {
                json!({"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish})
            }
        }
    }

    fn start(&mut self) {
        for i in 0..self.reply.choices {
            let c = match self.reply.api {
                Api::Chat => json!({
                    "index": i,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": null,
                    "finish_reason": null,
                }),
                Api::Completion => {
                    if self.reply.echo[i].is_empty() {
                        continue;
                    }
                    let echo = self.reply.echo[i].clone();
                    self.sent[i] += echo.len();
                    json!({"index": i, "text": echo, "logprobs": null, "finish_reason": null})
                }
            };
            let b = self.chunk(vec![c], None);
            self.outbox.push_back(b);
        }
    }

    fn on_event(&mut self, ev: Option<GenEvent>) {
        match ev {
            Some(GenEvent::Delta {
                index,
                text,
                logprobs,
            }) => {
                if self.first {
                    self.first = false;
                    self.state
                        .metrics
                        .time_to_first_token(self.reply.arrived.elapsed().as_secs_f64());
                }
                if text.is_empty() && logprobs.is_empty() {
                    return;
                }
                let lp = match self.reply.logprobs {
                    Some(_) if !logprobs.is_empty() => {
                        logprobs_json(&self.reply, &logprobs, self.sent[index])
                    }
                    _ => Value::Null,
                };
                let text = match self.tool_streams.get_mut(index) {
                    Some(ts) => ts.push(&text),
                    None => text,
                };
                if text.is_empty() && lp.is_null() {
                    return;
                }
                self.sent[index] += text.len();
                let c = self.choice(index, &text, lp, Value::Null);
                let b = self.chunk(vec![c], None);
                self.outbox.push_back(b);
            }
            Some(GenEvent::Done { index, generation }) => {
                self.done += 1;
                self.completion_tokens += generation.token_ids.len();
                self.cached_tokens +=
                    cached_tokens(&self.reply, [(index, &generation)].into_iter());
                let mut finish = json!(generation.finish_reason.as_str());
                if let Some(f) = self.reply.tools {
                    let (_, calls) = crate::tools::parse(f, &generation.text);
                    let c = if calls.is_empty() {
                        // No call after all: the rest of the text is content.
                        let rest = generation
                            .text
                            .get(self.sent[index]..)
                            .unwrap_or("")
                            .to_owned();
                        self.sent[index] = generation.text.len();
                        self.choice(index, &rest, Value::Null, Value::Null)
                    } else {
                        finish = json!("tool_calls");
                        let calls = crate::tools::calls_json(&calls, &self.reply.id, index, true);
                        json!({"index": index, "delta": {"tool_calls": calls}, "logprobs": null, "finish_reason": null})
                    };
                    let b = self.chunk(vec![c], None);
                    self.outbox.push_back(b);
                }
                let c = self.choice(index, "", Value::Null, finish);
                let b = self.chunk(vec![c], None);
                self.outbox.push_back(b);
                if self.done == self.reply.choices {
                    if self.reply.include_usage {
                        let u = usage(
                            self.reply.prompt_tokens,
                            self.completion_tokens,
                            self.cached_tokens,
                        );
                        let b = self.chunk(Vec::new(), Some(u));
                        self.outbox.push_back(b);
                    }
                    self.finish();
                }
            }
            Some(GenEvent::Failed(m)) => {
                let e = ApiError::internal(m).body();
                self.outbox.push_back(Bytes::from(format!("data: {e}\n\n")));
                self.finish();
            }
            None => {
                let e = ApiError::internal("the generation engine stopped").body();
                self.outbox.push_back(Bytes::from(format!("data: {e}\n\n")));
                self.finish();
            }
        }
    }

    fn finish(&mut self) {
        self.outbox
            .push_back(Bytes::from_static(b"data: [DONE]\n\n"));
        self.ended = true;
    }
}

fn sse_response(
    state: Arc<AppState>,
    reply: Reply,
    events: UnboundedReceiver<GenEvent>,
) -> Response {
    let choices = reply.choices;
    let mut s = Streamer {
        state,
        reply,
        events,
        outbox: VecDeque::new(),
        sent: vec![0; choices],
        done: 0,
        completion_tokens: 0,
        cached_tokens: 0,
        first: true,
        ended: false,
        tool_streams: Vec::new(),
    };
    if let Some(f) = s.reply.tools {
        s.tool_streams = (0..choices)
            .map(|_| crate::tools::ToolStream::new(f))
            .collect();
    }
    s.start();
    let stream = futures_util::stream::unfold(s, |mut s| async move {
        loop {
            if let Some(b) = s.outbox.pop_front() {
                return Some((Ok::<Bytes, std::convert::Infallible>(b), s));
            }
            if s.ended {
                return None;
            }
            let ev = s.events.recv().await;
            s.on_event(ev);
        }
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}
