//! Tool calls in chat completions: the tool-call format of a model's chat template (Qwen /
//! Hermes: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`), the calls parsed
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

/// Whether `model`'s chat template writes Hermes-style tool calls (the one format parsed).
pub fn template_has_tool_calls(model: &TextModel) -> bool {
    model
        .chat_template
        .as_ref()
        .is_some_and(|t| t.source().contains(OPEN))
}

/// One call: the function's name and its arguments as a JSON string.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The function.
    pub name: String,
    /// Its arguments, JSON text.
    pub arguments: String,
}

/// Splits `text` into the content outside tool-call blocks and the calls inside them; a block
/// that is not a `{"name", "arguments"}` object stays in the content.
pub fn parse(text: &str) -> (String, Vec<ToolCall>) {
    let (mut content, mut calls) = (String::new(), Vec::new());
    let mut rest = text;
    while let Some(start) = rest.find(OPEN) {
        let after = &rest[start + OPEN.len()..];
        let Some(end) = after.find(CLOSE) else { break };
        let body = after[..end].trim();
        let call = serde_json::from_str::<Value>(body).ok().and_then(|v| {
            let name = v.get("name")?.as_str()?.to_owned();
            let args = v.get("arguments").cloned().unwrap_or_else(|| json!({}));
            let arguments = match args {
                Value::String(s) => s,
                other => other.to_string(),
            };
            Some(ToolCall { name, arguments })
        });
        match call {
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
pub fn forced_call(tools: &Value, choice: &Value, parallel: bool) -> Result<Spec, ApiError> {
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
    let one: Vec<Value> = fns
        .iter()
        .map(|(n, p)| {
            json!({
                "type": "object",
                "properties": {"name": {"const": n}, "arguments": p},
                "required": ["name", "arguments"],
                "additionalProperties": false,
            })
        })
        .collect();
    let schema = json!({
        "anyOf": one,
        "x-guidance": {"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "},
    });
    let call = format!("\"{OPEN}\\n\" %json {schema} \"\\n{CLOSE}\"");
    let start = if parallel {
        "start: call (\"\\n\" call)*"
    } else {
        "start: call"
    };
    Ok(Spec::Lark(format!("{start}\ncall: {call}\n")))
}

/// Streaming with tools: content streams until a tool-call block may be starting; from there
/// on the rest is held for [`parse`] at the end.
#[derive(Debug, Default)]
pub struct ToolStream {
    held: String,
    calling: bool,
}

impl ToolStream {
    /// Takes the next piece of text; returns what may be sent now.
    pub fn push(&mut self, piece: &str) -> String {
        if self.calling {
            return String::new();
        }
        self.held.push_str(piece);
        if let Some(at) = self.held.find(OPEN) {
            self.calling = true;
            let send = self.held[..at].to_owned();
            self.held.clear();
            return send;
        }
        // Keep a tail that could be the start of `<tool_call>`.
        let keep = (1..OPEN.len().min(self.held.len() + 1))
            .rev()
            .find(|&n| {
                self.held.is_char_boundary(self.held.len() - n)
                    && OPEN.starts_with(&self.held[self.held.len() - n..])
            })
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let send = self.held[..cut].to_owned();
        self.held.drain(..cut);
        send
    }

    /// Whether a call has begun (the rest of the text is held).
    pub fn calling(&self) -> bool {
        self.calling
    }

    /// Text held back that turned out to be content (at the end, when no call began).
    pub fn take_held(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_calls_and_keeps_the_rest() {
        let t = "Sure.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>";
        let (content, calls) = parse(t);
        assert_eq!(content, "Sure.");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].name, "f");
        assert_eq!(calls[0].arguments, "{\"a\":1}");
        let (content, calls) = parse("<tool_call>not json</tool_call> x");
        assert!(calls.is_empty());
        assert_eq!(content, "<tool_call>not json</tool_call> x");
    }

    #[test]
    fn streams_content_and_holds_calls() {
        let mut s = ToolStream::default();
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
        assert!(s.calling());
        let mut s = ToolStream::default();
        let mut sent = String::new();
        for piece in ["a <", "b", " <too"] {
            sent.push_str(&s.push(piece));
        }
        sent.push_str(&s.take_held());
        assert_eq!(sent, "a <b <too");
    }
}
