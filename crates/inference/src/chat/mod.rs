//! Chat messages and chat templates: a conversation in, the model's prompt text out.
//!
//! This module owns [`ChatMessage`], loading a model's Jinja chat template (from
//! `tokenizer_config.json`, a `chat_template.jinja` beside it, or any string such as a GGUF
//! `tokenizer.chat_template`) and rendering it the way Hugging Face transformers'
//! `apply_chat_template(tokenize=False)` does: trim_blocks + lstrip_blocks, Python string methods
//! (`startswith`, `split`, `strip`, ...), `raise_exception`, `strftime_now`, `namespace`, loop
//! controls, and `tojson` formatted like Python's `json.dumps`. It does not tokenize the result.
//!
//! Known differences from Jinja2 (rarely seen in chat templates): `{{ x }}` prints `None`,
//! `True` and `False` as Python does, but the `string` filter and `~` concatenation of those
//! values give minijinja's `none` / `true` / `false`; `strftime_now` uses UTC, not local time.

pub mod pyfmt;

use std::path::Path;

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, ErrorKind, Output, State};

use crate::{Error, Result};

/// One message of a conversation, in the OpenAI / transformers shape.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`, ...
    pub role: String,
    /// The text; a JSON `null` reads as empty.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub content: String,
    /// The assistant's reasoning, shown to templates as `reasoning_content` (and `thinking`,
    /// as transformers aliases it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Tool calls of an assistant turn: a list of `{"type": "function", "function": {"name",
    /// "arguments"}}` as the OpenAI API sends them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<serde_json::Value>,
    /// Name of the speaker or tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The call a `tool` message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// Content with images: the parts in order (templates then see `content` as the list of
    /// `{"type": "text", "text": ...}` and `{"type": "image"}` items); empty for plain text.
    #[serde(skip)]
    pub parts: Vec<ContentPart>,
}

/// One part of a message's content.
#[derive(Clone, Debug, PartialEq)]
pub enum ContentPart {
    /// Text.
    Text(String),
    /// An image (its pixels travel beside the prompt; the template writes its placeholder).
    Image,
}

fn null_as_empty<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<String, D::Error> {
    use serde::Deserialize;
    Ok(Option::<String>::deserialize(d)?.unwrap_or_default())
}

impl ChatMessage {
    /// A message with just a role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            ..Default::default()
        }
    }
}

/// Inputs of a render besides the messages.
#[derive(Clone, Debug, Default)]
pub struct RenderOptions {
    /// End the prompt with the header of an assistant turn.
    pub add_generation_prompt: bool,
    /// Passed as `enable_thinking` when set (Qwen3-style templates); left undefined when `None`.
    pub enable_thinking: Option<bool>,
    /// The tool definitions (`tools`), usually a list of OpenAI function specs; `None` → `none`.
    pub tools: Option<serde_json::Value>,
    /// More template variables (e.g. `documents`, `date_string`); they may override
    /// `bos_token`, `eos_token` and `documents` but not `messages`, `tools`,
    /// `add_generation_prompt` or `enable_thinking`.
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// A compiled chat template with the special tokens it may print.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_bytes", &self.source.len())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

/// The name the template is registered under; it appears in error locations.
const NAME: &str = "chat_template";
/// Instructions a render may execute (minijinja's fuel): a real template over a long
/// conversation with tools uses well under 1% of it; a looping one stops with an error.
pub const RENDER_FUEL: u64 = 5_000_000;
/// Nesting depth of macro calls and includes a render may reach.
pub const RENDER_RECURSION: usize = 64;
/// Marks errors raised by the template's own `raise_exception(msg)`.
const RAISED: &str = "\u{1}raised:";

impl ChatTemplate {
    /// Compiles `source`. `bos_token` / `eos_token` become the template variables of the same
    /// name when given. A syntax error is reported with its line.
    pub fn new(source: &str, bos_token: Option<String>, eos_token: Option<String>) -> Result<Self> {
        let mut env = environment()?;
        env.add_template_owned(NAME, rewrite_generation_blocks(source))
            .map_err(|e| template_error("does not compile", &e))?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
            bos_token,
            eos_token,
        })
    }

    /// Loads the chat template of a Hugging Face tokenizer: a `chat_template.jinja` file beside
    /// `path` wins (transformers saves it there), else `chat_template` in `path` (a string, or a
    /// list of `{name, template}` from which `default` is taken). `bos_token` / `eos_token` are
    /// read as strings or `{"content": ...}`. `Ok(None)` when there is no template.
    pub fn from_tokenizer_config(path: &Path) -> Result<Option<Self>> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let bad = |reason: String| Error::InvalidConfig {
            path: path.to_path_buf(),
            reason,
        };
        let config: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let sibling = path.with_file_name("chat_template.jinja");
        let source = if sibling.is_file() {
            std::fs::read_to_string(&sibling).map_err(|e| Error::io(&sibling, e))?
        } else {
            match config.get("chat_template") {
                None | Some(serde_json::Value::Null) => return Ok(None),
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(serde_json::Value::Array(list)) => {
                    let named = |want: &str| {
                        list.iter().find_map(|t| {
                            (t.get("name")?.as_str()? == want)
                                .then(|| t.get("template")?.as_str().map(str::to_string))?
                        })
                    };
                    named("default").ok_or_else(|| {
                        let names: Vec<&str> = list
                            .iter()
                            .filter_map(|t| t.get("name")?.as_str())
                            .collect();
                        bad(format!(
                            "chat_template has no template named `default` (found {names:?})"
                        ))
                    })?
                }
                Some(other) => {
                    let want = "a string or a list of {name, template}";
                    return Err(bad(format!("chat_template must be {want}, found {other}")));
                }
            }
        };
        let token = |key: &str| -> Result<Option<String>> {
            match config.get(key) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
                Some(v) => match v.get("content").and_then(|c| c.as_str()) {
                    Some(s) => Ok(Some(s.to_string())),
                    None => Err(bad(format!(
                        "{key} must be a string or {{\"content\": ...}}, found {v}"
                    ))),
                },
            }
        };
        let (bos, eos) = (token("bos_token")?, token("eos_token")?);
        ChatTemplate::new(&source, bos, eos)
            .map(Some)
            .map_err(|e| bad(e.to_string()))
    }

    /// The template source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The `bos_token` variable, if any.
    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    /// The `eos_token` variable, if any.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// Renders `messages` into prompt text. The template sees `messages` (each message as a
    /// map without its unset fields; reasoning also as `thinking`), `tools` (`none` when
    /// absent), `documents` (`none`), `add_generation_prompt`, `bos_token` / `eos_token` when
    /// known, `enable_thinking` when set, and `opts.extra`. A `raise_exception(msg)` in the
    /// template or any render failure is an [`Error::ChatTemplate`] carrying the message.
    pub fn render(&self, messages: &[ChatMessage], opts: &RenderOptions) -> Result<String> {
        use serde_json::Value as J;
        let mut ctx = serde_json::Map::new();
        if let Some(b) = &self.bos_token {
            ctx.insert("bos_token".into(), J::String(b.clone()));
        }
        if let Some(e) = &self.eos_token {
            ctx.insert("eos_token".into(), J::String(e.clone()));
        }
        ctx.insert("documents".into(), J::Null);
        for (k, v) in &opts.extra {
            ctx.insert(k.clone(), v.clone());
        }
        let mut msgs = Vec::with_capacity(messages.len());
        for m in messages {
            let plain = serde_json::to_value(m)
                .map_err(|e| Error::ChatTemplate(format!("message not serializable: {e}")))?;
            let J::Object(mut fields) = plain else {
                unreachable!("a struct serializes to a map")
            };
            if !m.parts.is_empty() {
                let parts = m
                    .parts
                    .iter()
                    .map(|p| match p {
                        ContentPart::Text(t) => serde_json::json!({"type": "text", "text": t}),
                        ContentPart::Image => serde_json::json!({"type": "image"}),
                    })
                    .collect();
                fields.insert("content".into(), J::Array(parts));
            }
            let msg = match &m.reasoning_content {
                // transformers: {"thinking": r, **message, "reasoning_content": r}
                Some(r) => {
                    let mut aliased = serde_json::Map::new();
                    aliased.insert("thinking".into(), J::String(r.clone()));
                    aliased.extend(fields);
                    aliased
                }
                None => fields,
            };
            msgs.push(J::Object(msg));
        }
        ctx.insert("messages".into(), J::Array(msgs));
        ctx.insert("tools".into(), opts.tools.clone().unwrap_or(J::Null));
        ctx.insert(
            "add_generation_prompt".into(),
            J::Bool(opts.add_generation_prompt),
        );
        if let Some(t) = opts.enable_thinking {
            ctx.insert("enable_thinking".into(), J::Bool(t));
        }
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| template_error("is missing", &e))?;
        template
            .render(Value::from(minijinja::value::Serde(&J::Object(ctx))))
            .map_err(|e| template_error("failed to render", &e))
    }
}

/// Rewrites transformers' `{% generation %}` / `{% endgeneration %}` tags (its assistant-mask
/// extension, which renders the body unchanged) into `{% if true %}` / `{% endif %}`, keeping the
/// whitespace-control markers so the output is the same.
fn rewrite_generation_blocks(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        // The closing `%}` comes after the opening `{%` (`{%}` does not close itself).
        let Some(close) = tag[2..].find("%}").map(|i| i + 2) else {
            break;
        };
        let inner = &tag[2..close];
        let (lead, body) = match inner.strip_prefix(['-', '+']) {
            Some(b) => (&inner[..1], b),
            None => ("", inner),
        };
        let (body, trail) = match body.strip_suffix(['-', '+']) {
            Some(b) => (b, &body[body.len() - 1..]),
            None => (body, ""),
        };
        let replacement = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(r) => out.push_str(&format!("{{%{lead} {r} {trail}%}}")),
            None => out.push_str(&tag[..close + 2]),
        }
        rest = &tag[close + 2..];
    }
    out.push_str(rest);
    out
}

/// Maps a minijinja error to ours: the template's own `raise_exception` message as is, anything
/// else with what failed and where.
fn template_error(what: &str, e: &minijinja::Error) -> Error {
    if let Some(msg) = e.detail().and_then(|d| d.strip_prefix(RAISED)) {
        let line = e.line().map(|l| format!(" (line {l})")).unwrap_or_default();
        return Error::ChatTemplate(format!("raise_exception: {msg}{line}"));
    }
    let line = e
        .line()
        .map(|l| format!(" at line {l}"))
        .unwrap_or_default();
    let mut text = format!("{what}{line}: {e}");
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    Error::ChatTemplate(text)
}

/// The Jinja environment transformers renders chat templates in, rebuilt on minijinja.
fn environment() -> Result<Environment<'static>> {
    let mut env = Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .keep_trailing_newline(false)
        .build()
        .map_err(|e| Error::ChatTemplate(format!("syntax config: {e}")))?;
    env.set_syntax(syntax);
    // Templates come with model files: bound the work a hostile one may do per render.
    env.set_fuel(Some(RENDER_FUEL));
    env.set_recursion_limit(RENDER_RECURSION);
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_formatter(python_formatter);
    env.add_filter("tojson", tojson);
    env.add_filter("truncate", truncate);
    env.add_filter(
        "string",
        |v: Value| -> std::result::Result<String, minijinja::Error> {
            check_nesting(&v)?;
            Ok(v.to_string())
        },
    );
    // Jinja2's tests, where minijinja's differ: `none` is not iterable; strings and dicts are
    // sequences (they have a length and item access).
    env.add_test("iterable", |v: &Value| !v.is_none() && v.try_iter().is_ok());
    env.add_test("sequence", |v: &Value| {
        matches!(
            v.kind(),
            ValueKind::String | ValueKind::Seq | ValueKind::Map | ValueKind::Undefined
        )
    });
    env.add_function("cycler", minijinja_contrib::globals::cycler);
    env.add_function("joiner", minijinja_contrib::globals::joiner);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    Ok(env)
}

/// How deep lists and maps may nest in a value a template prints or serializes.
const MAX_NESTING: usize = 64;
/// How many items such a value may hold in all (shared parts counted each time they appear).
const MAX_ITEMS: usize = 1 << 20;

/// Refuses a value nested deeper than [`MAX_NESTING`] or holding more than [`MAX_ITEMS`]
/// items before it is printed or serialized: a template can build a namespace that contains
/// itself (`{% set ns.x = ns %}`), which minijinja's printing would follow until the stack
/// overflows.
fn check_nesting(value: &Value) -> std::result::Result<(), minijinja::Error> {
    fn walk(v: &Value, depth: usize, budget: &mut usize) -> std::result::Result<(), ()> {
        if !matches!(
            v.kind(),
            ValueKind::Seq | ValueKind::Map | ValueKind::Iterable
        ) {
            return Ok(());
        }
        if depth >= MAX_NESTING {
            return Err(());
        }
        let Ok(items) = v.try_iter() else {
            return Ok(());
        };
        let is_map = v.kind() == ValueKind::Map;
        for item in items {
            *budget = budget.checked_sub(1).ok_or(())?;
            walk(&item, depth + 1, budget)?;
            if is_map {
                if let Ok(inner) = v.get_item(&item) {
                    walk(&inner, depth + 1, budget)?;
                }
            }
        }
        Ok(())
    }
    let mut budget = MAX_ITEMS;
    walk(value, 0, &mut budget).map_err(|()| {
        minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "a value nests deeper than {MAX_NESTING} levels or holds more than {MAX_ITEMS} \
                 items (does a namespace contain itself?)"
            ),
        )
    })
}

/// Prints values as Jinja2 does in Python: `None`, `True`, `False`, `repr` floats.
fn python_formatter(
    out: &mut Output,
    state: &mut State,
    value: &Value,
) -> std::result::Result<(), minijinja::Error> {
    check_nesting(value)?;
    let text = match value.kind() {
        ValueKind::None => "None".to_string(),
        ValueKind::Bool => if value.is_true() { "True" } else { "False" }.to_string(),
        ValueKind::Number if !value.is_integer() => match f64::try_from(value.clone()) {
            Ok(f) => pyfmt::float_repr(f, false),
            Err(_) => return minijinja::escape_formatter(out, state, value),
        },
        _ => return minijinja::escape_formatter(out, state, value),
    };
    out.write_str(&text)
        .map_err(|e| minijinja::Error::new(ErrorKind::WriteFailure, e.to_string()))
}

/// `raise_exception(msg)`: fails the render with `msg`.
fn raise_exception(msg: Value) -> std::result::Result<Value, minijinja::Error> {
    let text = match msg.as_str() {
        Some(s) => s.to_string(),
        None => msg.to_string(),
    };
    Err(minijinja::Error::new(
        ErrorKind::InvalidOperation,
        format!("{RAISED}{text}"),
    ))
}

/// `strftime_now(fmt)`: the current UTC time formatted with `strftime` directives.
fn strftime_now(fmt: &str) -> std::result::Result<String, minijinja::Error> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    pyfmt::strftime(now, fmt).map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, e))
}

/// `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`, exactly
/// transformers' filter (Python `json.dumps`); `sort_keys` by keyword only (minijinja filters
/// take at most five arguments).
fn tojson(
    value: Value,
    ensure_ascii: Option<bool>,
    indent: Option<Value>,
    separators: Option<Value>,
    kwargs: Kwargs,
) -> std::result::Result<Value, minijinja::Error> {
    let invalid = |msg: String| minijinja::Error::new(ErrorKind::InvalidOperation, msg);
    let ensure_ascii = ensure_ascii
        .or(kwargs.get::<Option<bool>>("ensure_ascii")?)
        .unwrap_or(false);
    let indent = indent.or(kwargs.get::<Option<Value>>("indent")?);
    let separators = separators.or(kwargs.get::<Option<Value>>("separators")?);
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    kwargs.assert_all_used()?;
    if value.is_undefined() {
        return Err(invalid("tojson: the value is undefined".into()));
    }
    check_nesting(&value)?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match (v.as_str(), v.as_i64()) {
            (Some(s), _) => Some(s.to_string()),
            (None, Some(n)) => Some(" ".repeat(n.max(0) as usize)),
            _ => return Err(invalid(format!("tojson: bad indent {v}"))),
        },
    };
    let separators = match separators {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => {
            let parts: Vec<String> = v
                .try_iter()?
                .map(|p| p.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .ok_or_else(|| invalid(format!("tojson: separators must be strings, got {v}")))?;
            match <[String; 2]>::try_from(parts) {
                Ok([a, b]) => Some((a, b)),
                Err(_) => {
                    return Err(invalid(format!(
                        "tojson: separators must be a pair, got {v}"
                    )))
                }
            }
        }
    };
    let json = serde_json::to_value(&value)
        .map_err(|e| invalid(format!("tojson: value not serializable: {e}")))?;
    let opts = pyfmt::JsonOptions {
        ensure_ascii,
        indent,
        separators,
        sort_keys,
    };
    Ok(Value::from_safe_string(pyfmt::json_dumps(&json, &opts)))
}

/// Jinja2's `truncate(s, length=255, killwords=False, end='...', leeway=5)`: strings up to
/// `length + leeway` characters pass unchanged; longer ones are cut to `length - len(end)`
/// characters (back to the last space unless `killwords`) and `end` is appended.
fn truncate(
    value: Value,
    length: Option<usize>,
    killwords: Option<bool>,
    end: Option<String>,
    kwargs: Kwargs,
) -> std::result::Result<Value, minijinja::Error> {
    let invalid = |msg: String| minijinja::Error::new(ErrorKind::InvalidOperation, msg);
    let length = length.or(kwargs.get("length")?).unwrap_or(255);
    let killwords = killwords.or(kwargs.get("killwords")?).unwrap_or(false);
    let end = end
        .or(kwargs.get("end")?)
        .unwrap_or_else(|| "...".to_string());
    let leeway: usize = kwargs.get::<Option<usize>>("leeway")?.unwrap_or(5);
    kwargs.assert_all_used()?;
    let s = match value.as_str() {
        Some(s) => s.to_string(),
        None => value.to_string(),
    };
    let end_len = end.chars().count();
    if length < end_len {
        return Err(invalid(format!(
            "truncate: expected length >= {end_len}, got {length}"
        )));
    }
    if s.chars().count() <= length + leeway {
        return Ok(Value::from(s));
    }
    let head: String = s.chars().take(length - end_len).collect();
    let head = match (killwords, head.rfind(' ')) {
        (false, Some(i)) => &head[..i],
        _ => head.as_str(),
    };
    Ok(Value::from(format!("{head}{end}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, msgs: &[ChatMessage]) -> Result<String> {
        ChatTemplate::new(src, Some("<s>".into()), None)?.render(msgs, &RenderOptions::default())
    }

    #[test]
    fn python_printing_and_methods() {
        let m = [ChatMessage::new("user", "  Hi there  ")];
        let out = render(
            concat!(
                "{{ bos_token }}{{ none }} {{ true }} {{ 1.5 }} ",
                "{{ messages[0].content.strip() }}|{{ tools }}"
            ),
            &m,
        )
        .unwrap();
        assert_eq!(out, "<s>None True 1.5 Hi there|None");
    }

    #[test]
    fn generation_blocks_render_their_body() {
        let src = concat!(
            "a{%- generation %} b {% endgeneration -%} c",
            "{% generation %}{{ 'd' }}{% endgeneration %}"
        );
        assert_eq!(
            rewrite_generation_blocks(src),
            "a{%- if true %} b {% endif -%} c{% if true %}{{ 'd' }}{% endif %}"
        );
        assert_eq!(render(src, &[]).unwrap(), "a b cd");
        // Unterminated tags are left for the parser to report.
        assert!(render("{% generation", &[]).is_err());
    }

    #[test]
    fn raise_exception_carries_message() {
        let err = render("{{ raise_exception('roles must alternate') }}", &[]).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("roles must alternate"), "{text}");
        assert!(!text.contains(RAISED), "{text}");
    }

    #[test]
    fn errors_not_panics() {
        assert!(ChatTemplate::new("{% if %}", None, None).is_err());
        assert!(ChatTemplate::new("{% for x in y %}", None, None).is_err());
        let e = render("{{ 'a' | no_such_filter }}", &[]).unwrap_err();
        assert!(e.to_string().contains("no_such_filter"), "{e}");
        let e = render("{{ 'a'.no_such_method() }}", &[]).unwrap_err();
        assert!(
            e.to_string().contains("no_such_method") || e.to_string().contains("unknown method"),
            "{e}"
        );
    }
}
