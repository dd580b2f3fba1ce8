//! Tool calls in chat completions: the tool-call format of a model's chat template ([`Format`]:
//! Qwen / Hermes `<tool_call>` blocks, Mistral `[TOOL_CALLS]`, Llama 3.x JSON), the calls parsed
//! out of its output into OpenAI's `tool_calls`, the constraint that forces a call
//! (`tool_choice: "required"` or a named function: the call is generated under a grammar of
//! the tools' parameter schemas), and the streamed form (text before a call streams; the calls
//! arrive as deltas when the choice ends).

use lattice_inference::engine::TextModel;
use lattice_inference::grammar::Spec;
use serde_json::{json, Value};

use crate::error::ApiError;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const MISTRAL: &str = "[TOOL_CALLS]";
const PYTHON_TAG: &str = "<|python_tag|>";

/// How a model writes tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Qwen / Hermes: `<tool_call>\n{"name": N, "arguments": {...}}\n</tool_call>`, one block
    /// per call.
    Hermes,
    /// Mistral: `[TOOL_CALLS][{"name": N, "arguments": {...}}, ...]`.
    Mistral,
    /// Llama 3.x: the reply is `{"name": N, "parameters": {...}}` (after an optional
    /// `<|python_tag|>`), calls separated by `;`.
    Llama3,
}

/// The tool-call format `model`'s chat template asks for, if it is one of [`Format`]'s.
pub fn format_of(model: &TextModel) -> Option<Format> {
    let src = model.chat_template.as_ref()?.source();
    if src.contains(OPEN) {
        Some(Format::Hermes)
    } else if src.contains(MISTRAL) {
        Some(Format::Mistral)
    } else if src.contains(PYTHON_TAG) || src.contains("JSON for a function call") {
        Some(Format::Llama3)
    } else {
        None
    }
}

/// A call from its JSON object (`name` and `arguments` or `parameters`).
fn call_of(v: &Value) -> Option<ToolCall> {
    let name = v.get("name")?.as_str()?.to_owned();
    let args = v
        .get("arguments")
        .or_else(|| v.get("parameters"))
        .cloned()
        .unwrap_or_else(|| json!({}));
    let arguments = match args {
        Value::String(s) => s,
        other => other.to_string(),
    };
    Some(ToolCall { name, arguments })
}

/// One call: the function's name and its arguments as a JSON string.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The function.
    pub name: String,
    /// Its arguments, JSON text.
    pub arguments: String,
}

/// Splits `text` into the content and the calls `format` writes; text that does not parse as
/// calls stays content.
pub fn parse(format: Format, text: &str) -> (String, Vec<ToolCall>) {
    match format {
        Format::Hermes => parse_hermes(text),
        Format::Mistral => {
            let Some(at) = text.find(MISTRAL) else {
                return (text.trim().to_owned(), Vec::new());
            };
            let list = text[at + MISTRAL.len()..].trim();
            let calls: Option<Vec<ToolCall>> = serde_json::from_str::<Vec<Value>>(list)
                .ok()
                .and_then(|l| l.iter().map(call_of).collect());
            match calls {
                Some(c) if !c.is_empty() => (text[..at].trim().to_owned(), c),
                _ => (text.trim().to_owned(), Vec::new()),
            }
        }
        Format::Llama3 => {
            let body = text.trim();
            let body = body.strip_prefix(PYTHON_TAG).unwrap_or(body).trim();
            let calls: Option<Vec<ToolCall>> = body
                .split(';')
                .map(|p| {
                    serde_json::from_str::<Value>(p.trim())
                        .ok()
                        .as_ref()
                        .and_then(call_of)
                })
                .collect();
            match calls {
                Some(c) if !c.is_empty() => (String::new(), c),
                _ => (text.trim().to_owned(), Vec::new()),
            }
        }
    }
}

fn parse_hermes(text: &str) -> (String, Vec<ToolCall>) {
    // A reply that is only the call's JSON, without the tags (small models do this): a call
    // when it is exactly {"name": string, "arguments": object}.
    if let Ok(Value::Object(o)) = serde_json::from_str::<Value>(text.trim()) {
        if o.len() == 2
            && o.get("name").is_some_and(Value::is_string)
            && o.get("arguments").is_some_and(Value::is_object)
        {
            if let Some(c) = call_of(&Value::Object(o)) {
                return (String::new(), vec![c]);
            }
        }
    }
    let (mut content, mut calls) = (String::new(), Vec::new());
    let mut rest = text;
    while let Some(start) = rest.find(OPEN) {
        let after = &rest[start + OPEN.len()..];
        let Some(end) = after.find(CLOSE) else { break };
        let body = after[..end].trim();
        match serde_json::from_str::<Value>(body)
            .ok()
            .as_ref()
            .and_then(call_of)
        {
            Some(c) => {
                content.push_str(&rest[..start]);
                calls.push(c);
            }
            None => content.push_str(&rest[..start + OPEN.len() + end + CLOSE.len()]),
        }
        rest = &after[end + CLOSE.len()..];
    }
    content.push_str(rest);
    (content.trim().to_owned(), calls)
}

/// `tool_calls` as OpenAI writes them (`id`, `type`, `function.name`, `function.arguments`);
/// with `index` for streamed deltas.
pub fn calls_json(calls: &[ToolCall], id: &str, choice: usize, delta: bool) -> Value {
    Value::Array(
        calls
            .iter()
            .enumerate()
            .map(|(k, c)| {
                let mut v = json!({
                    "id": format!("call_{id}_{choice}_{k}"),
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                });
                if delta {
                    v["index"] = json!(k);
                }
                v
            })
            .collect(),
    )
}

/// Checks `tools` (OpenAI's `[{type: "function", function: {name, parameters}}]`); errors
/// name the JSON path.
pub fn validate(tools: &Value) -> Result<(), ApiError> {
    functions(tools).map(drop)
}

/// The names and parameter schemas of `tools`; errors name the JSON path.
fn functions(tools: &Value) -> Result<Vec<(String, Value)>, ApiError> {
    let list = tools
        .as_array()
        .ok_or_else(|| ApiError::invalid_param("tools", "`tools` must be an array"))?;
    list.iter()
        .enumerate()
        .map(|(i, t)| {
            let f = t.get("function").ok_or_else(|| {
                ApiError::invalid_param(format!("tools[{i}].function"), "a tool needs `function`")
            })?;
            let name = f.get("name").and_then(Value::as_str).ok_or_else(|| {
                ApiError::invalid_param(
                    format!("tools[{i}].function.name"),
                    "a function needs `name`",
                )
            })?;
            let params = f
                .get("parameters")
                .cloned()
                .unwrap_or_else(|| json!({"type": "object"}));
            Ok((name.to_owned(), params))
        })
        .collect()
}

/// The constraint of a forced call: `required` (any of `tools`) or a named function, one call
/// or (with `parallel`) several, each `<tool_call>\n{"name": N, "arguments": ARGS}\n</tool_call>`
/// with ARGS under that function's parameter schema.
pub fn forced_call(
    format: Format,
    tools: &Value,
    choice: &Value,
    parallel: bool,
) -> Result<Spec, ApiError> {
    let mut fns = functions(tools)?;
    if let Some(name) = choice.pointer("/function/name").and_then(Value::as_str) {
        fns.retain(|(n, _)| n == name);
        if fns.is_empty() {
            return Err(ApiError::invalid_param(
                "tool_choice.function.name",
                format!("`tool_choice` names `{name}`, which is not in `tools`"),
            ));
        }
    }
    if fns.is_empty() {
        return Err(ApiError::invalid_param(
            "tools",
            "`tool_choice` needs at least one tool",
        ));
    }
    let args_key = if format == Format::Llama3 {
        "parameters"
    } else {
        "arguments"
    };
    let one: Vec<Value> = fns
        .iter()
        .map(|(n, p)| {
            json!({
                "type": "object",
                "properties": {"name": {"const": n}, args_key: p},
                "required": ["name", args_key],
                "additionalProperties": false,
            })
        })
        .collect();
    let compact =
        json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "});
    let schema = json!({"anyOf": one, "x-guidance": compact});
    let lark = match format {
        Format::Hermes => {
            let call = format!("\"{OPEN}\\n\" %json {schema} \"\\n{CLOSE}\"");
            let more = if parallel { " (\"\\n\" call)*" } else { "" };
            format!("start: call{more}\ncall: {call}\n")
        }
        Format::Mistral => {
            // The whole list is one JSON value.
            let mut list = json!({"type": "array", "items": {"anyOf": one}, "minItems": 1, "x-guidance": compact});
            if !parallel {
                list["maxItems"] = json!(1);
            }
            format!("start: \"{}\" %json {list}\n", MISTRAL)
        }
        Format::Llama3 => {
            let more = if parallel { " (\"; \" call)*" } else { "" };
            format!("start: call{more}\ncall: %json {schema}\n")
        }
    };
    Ok(Spec::Lark(lark))
}

/// Streaming with tools: content streams until a tool-call block may be starting; from there
/// on the rest is held for [`parse`] at the end.
#[derive(Debug)]
pub struct ToolStream {
    format: Format,
    held: String,
    calling: bool,
    /// Whether any text came yet (Llama 3 calls are the whole reply).
    started: bool,
}

impl ToolStream {
    /// A stream of text in `format`.
    pub fn new(format: Format) -> Self {
        ToolStream {
            format,
            held: String::new(),
            calling: false,
            started: false,
        }
    }

    /// Takes the next piece of text; returns what may be sent now.
    pub fn push(&mut self, piece: &str) -> String {
        if self.calling {
            return String::new();
        }
        self.held.push_str(piece);
        // A reply that starts as a call's JSON (Llama 3, or Hermes without its tags) is held
        // whole.
        if !self.started {
            let t = self.held.trim_start();
            if t.is_empty() {
                return String::new();
            }
            self.started = true;
            let llama = self.format == Format::Llama3
                && (PYTHON_TAG.starts_with(t) || t.starts_with(PYTHON_TAG));
            if t.starts_with('{') || llama {
                self.calling = true;
                self.held.clear();
                return String::new();
            }
        }
        if self.format == Format::Llama3 {
            return std::mem::take(&mut self.held);
        }
        let open = if self.format == Format::Mistral {
            MISTRAL
        } else {
            OPEN
        };
        if let Some(at) = self.held.find(open) {
            self.calling = true;
            let send = self.held[..at].to_owned();
            self.held.clear();
            return send;
        }
        // Keep a tail that could be the start of the call marker.
        let keep = (1..open.len().min(self.held.len() + 1))
            .rev()
            .find(|&n| {
                self.held.is_char_boundary(self.held.len() - n)
                    && open.starts_with(&self.held[self.held.len() - n..])
            })
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let send = self.held[..cut].to_owned();
        self.held.drain(..cut);
        send
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_calls_and_keeps_the_rest() {
        let t = "Sure.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>";
        let (content, calls) = parse(Format::Hermes, t);
        assert_eq!(content, "Sure.");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].name, "f");
        assert_eq!(calls[0].arguments, "{\"a\":1}");
        let (content, calls) = parse(
            Format::Hermes,
            " {\"name\": \"f\", \"arguments\": {\"a\": 2}}",
        );
        assert_eq!((content.as_str(), calls.len()), ("", 1));
        let (_, calls) = parse(Format::Hermes, "{\"name\": \"f\", \"other\": 1}");
        assert!(calls.is_empty());
        let (content, calls) = parse(Format::Hermes, "<tool_call>not json</tool_call> x");
        assert!(calls.is_empty());
        assert_eq!(content, "<tool_call>not json</tool_call> x");
    }

    #[test]
    fn parses_mistral_and_llama3_calls() {
        let (content, calls) = parse(
            Format::Mistral,
            "Checking.[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": 1}}, {\"name\": \"g\", \"arguments\": {}}]",
        );
        assert_eq!(content, "Checking.");
        assert_eq!((calls[0].name.as_str(), calls[1].name.as_str()), ("f", "g"));
        let (content, calls) = parse(
            Format::Llama3,
            "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"a\": 1}}; {\"name\": \"g\", \"parameters\": {}}",
        );
        assert!(content.is_empty());
        assert_eq!(calls[0].arguments, "{\"a\":1}");
        assert_eq!(calls[1].name, "g");
        let (content, calls) = parse(Format::Llama3, "Just text {not a call}");
        assert!(calls.is_empty());
        assert_eq!(content, "Just text {not a call}");
    }

    #[test]
    fn forced_calls_compile_to_grammars_for_every_format() {
        let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
        for f in [Format::Hermes, Format::Mistral, Format::Llama3] {
            for parallel in [false, true] {
                let Spec::Lark(g) = forced_call(f, &tools, &json!("required"), parallel).unwrap()
                else {
                    panic!("not lark");
                };
                assert!(g.starts_with("start: "), "{g}");
            }
        }
    }

    #[test]
    fn arbitrary_output_never_panics() {
        let pieces = [
            "<tool_call>",
            "</tool_call>",
            "[TOOL_CALLS]",
            "<|python_tag|>",
            "{",
            "}",
            "[",
            "]",
            "\"name\"",
            ": ",
            "\"f\"",
            ", ",
            "\"arguments\"",
            ";",
            "é",
            "\n",
            "<to",
            "x",
        ];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            let mut text = String::new();
            for _ in 0..(x % 20) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                text.push_str(pieces[(x % pieces.len() as u64) as usize]);
            }
            for f in [Format::Hermes, Format::Mistral, Format::Llama3] {
                let _ = parse(f, &text);
                let mut s = ToolStream::new(f);
                for piece in text.split_inclusive(['<', ' ']) {
                    let _ = s.push(piece);
                }
            }
        }
    }

    #[test]
    fn streams_content_and_holds_calls() {
        let mut s = ToolStream::new(Format::Hermes);
        let mut sent = String::new();
        for piece in [
            "Hel",
            "lo <to",
            "ol",
            "_call>\n{",
            "\"name\"",
            "}</tool_call>",
        ] {
            sent.push_str(&s.push(piece));
        }
        assert_eq!(sent, "Hello ");
        assert!(s.calling);
        let mut s = ToolStream::new(Format::Hermes);
        let mut sent = String::new();
        for piece in ["a <", "b", " <too"] {
            sent.push_str(&s.push(piece));
        }
        sent.push_str(&std::mem::take(&mut s.held));
        assert_eq!(sent, "a <b <too");
        let mut s = ToolStream::new(Format::Llama3);
        assert_eq!(s.push(" {\"name\""), "");
        assert!(s.calling);
        let mut s = ToolStream::new(Format::Llama3);
        assert_eq!(s.push("Hi"), "Hi");
        assert_eq!(s.push(" there"), " there");
    }
}
