//! Tool calling on `/v1/chat/completions`: the `tools` / `tool_choice` request fields, what a
//! validated request asks of its reply ([`ToolReply`]), the grammar that enforces `required` and
//! a named function, the parsers that read the formats of the families served
//! (`--tool-call-parser hermes|llama3_json|mistral`), and the reading of a reply, whole or as it
//! streams, into `tool_calls`.
//!
//! `required` and a named function are enforced, not hoped for: the reply is constrained with
//! llguidance (as structured outputs are) to a JSON schema built from the declared tools. A
//! named function's reply is its arguments object; a `required` reply is one
//! `{"name": ..., "arguments": ...}` object (an array of them when `parallel_tool_calls`) whose
//! name is one of the tools and whose arguments follow that tool's `parameters`. `auto` leaves
//! the model free and reads its text with the configured parser: text that parses as calls
//! becomes `tool_calls`, other text stays `content`.
//!
//! The parsers are written here rather than taken from the `tool-parser` crate (SGLang's Rust
//! gateway): that crate parses through an async trait over its own OpenAI protocol types
//! (`openai-protocol`, a second copy of the types [`crate::request`] owns) and links a Python
//! parser (`rustpython-parser`) for the pythonic format, none of which the three formats served
//! here need; each of them is a marker and JSON, which `serde_json` reads.
//!
//! Streaming: a named function's arguments stream as they are generated (the id and name go
//! first). A `required` reply, and an `auto` reply from where a call may begin, are held until
//! the choice ends and then sent as whole calls (one delta with id and name, one with the
//! arguments); `auto` text before that streams as content at once.
//!
//! Mistral's templates refuse tool-call ids other than nine alphanumerics, so under the
//! `mistral` parser ids are nine characters; otherwise they are `call_` and hex.

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Deserialize;
use serde_json::{Value, json};
use utoipa::ToSchema;

use crate::error::ApiError;
use crate::response::{FunctionCall, FunctionCallDelta, FunctionKind, ToolCall, ToolCallDelta};

/// One entry of `tools`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct Tool {
    /// `function` (the only kind served).
    #[serde(rename = "type")]
    pub kind: String,
    /// The function.
    pub function: Option<FunctionDefinition>,
}

/// A function the model may call.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FunctionDefinition {
    /// Its name: letters, digits, `_` and `-`, at most 64.
    pub name: String,
    /// What it does (the template shows it to the model).
    pub description: Option<String>,
    /// A JSON schema of its arguments object; left out, it takes none.
    #[schema(value_type = Object)]
    pub parameters: Option<Value>,
    /// Arguments always follow `parameters` when the call is enforced; accepted either way.
    pub strict: Option<bool>,
}

/// `tool_choice`: `none`, `auto`, `required`, or one named function.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum ToolChoice {
    /// `none`, `auto` or `required`.
    Mode(String),
    /// `{"type": "function", "function": {"name": ...}}`.
    Named(NamedToolChoice),
}

/// `tool_choice` naming a function.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NamedToolChoice {
    /// `function`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The function to call.
    pub function: NamedFunction,
}

/// The function a named `tool_choice` calls.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NamedFunction {
    /// One of the declared tools' names.
    pub name: String,
}

/// A call of an earlier assistant turn, sent back with the conversation.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct MessageToolCall {
    /// The call's id (a `role: "tool"` message answers it by this id).
    pub id: String,
    /// `function`.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// The function called.
    pub function: MessageFunctionCall,
}

/// The function of an earlier call.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct MessageFunctionCall {
    /// Its name.
    pub name: String,
    /// Its arguments, a JSON object as a string (as the server sent it).
    pub arguments: String,
}

/// The format a model family writes its tool calls in (`--tool-call-parser`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolCallParser {
    /// Hermes and Qwen: `<tool_call>{"name": ..., "arguments": ...}</tool_call>`, one block per
    /// call, after optional text.
    Hermes,
    /// Llama 3.1+: the reply is `{"name": ..., "parameters": ...}` (after an optional
    /// `<|python_tag|>`), calls separated by `;`.
    Llama3Json,
    /// Mistral: `[TOOL_CALLS]` then a JSON array of `{"name": ..., "arguments": ...}`, or (v11
    /// tokenizers) `[TOOL_CALLS]name[ARGS]{...}` per call. Both markers are control tokens
    /// that decoding drops, so a reply that is the bare array, or one bare `name{...}`, is read
    /// as calls too.
    Mistral,
}

impl ToolCallParser {
    /// The names `--tool-call-parser` takes.
    pub const NAMES: &'static str = "hermes, llama3_json, mistral";
}

impl FromStr for ToolCallParser {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "hermes" => Ok(Self::Hermes),
            "llama3_json" => Ok(Self::Llama3Json),
            "mistral" => Ok(Self::Mistral),
            other => Err(format!(
                "tool-call parser `{other}` refused: one of {}",
                Self::NAMES
            )),
        }
    }
}

/// One call read from a reply: a function name and its arguments as compact JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    /// The function.
    pub name: String,
    /// Its arguments object, as JSON text.
    pub arguments: String,
}

/// A reply read by a parser: the text that is not calls, and the calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedReply {
    /// Text outside the calls (`None` when there is none).
    pub content: Option<String>,
    /// The calls, in order.
    pub calls: Vec<ParsedCall>,
}

impl ParsedReply {
    fn text(text: &str) -> Self {
        Self {
            content: Some(text.to_owned()),
            calls: Vec::new(),
        }
    }
}

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const LLAMA_PYTHON_TAG: &str = "<|python_tag|>";
const MISTRAL_MARKER: &str = "[TOOL_CALLS]";
const MISTRAL_ARGS: &str = "[ARGS]";

/// A call object: `name` and its arguments under `arguments_key` (an object, or a string
/// holding one).
fn call_from(value: &Value, arguments_keys: &[&str]) -> Option<ParsedCall> {
    let object = value.as_object()?;
    let name = object.get("name")?.as_str()?.to_owned();
    let arguments = arguments_keys
        .iter()
        .find_map(|k| object.get(*k))
        .cloned()
        .unwrap_or_else(|| json!({}));
    let arguments = match arguments {
        Value::String(text) => serde_json::from_str::<Value>(&text).ok()?,
        other => other,
    };
    arguments.is_object().then(|| ParsedCall {
        name,
        arguments: arguments.to_string(),
    })
}

/// JSON values one after another in `text`, separated by whitespace or `separator`; `None`
/// unless all of `text` is read.
fn json_values(text: &str, separator: Option<char>) -> Option<Vec<Value>> {
    let mut values = Vec::new();
    let mut rest = text;
    loop {
        rest = rest.trim_start();
        if let Some(sep) = separator
            && !values.is_empty()
        {
            rest = rest.strip_prefix(sep).unwrap_or(rest).trim_start();
        }
        if rest.is_empty() {
            return (!values.is_empty()).then_some(values);
        }
        let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let value = stream.next()?.ok()?;
        rest = &rest[stream.byte_offset()..];
        values.push(value);
    }
}

/// `text`, or `None` when it is only whitespace (kept as it is otherwise, so that the content
/// of a streamed reply equals the whole reply's).
fn nonempty(text: &str) -> Option<String> {
    (!text.trim().is_empty()).then(|| text.to_owned())
}

impl ToolCallParser {
    /// Reads a whole reply. Text that does not parse as calls in this format is all content.
    pub fn parse(self, text: &str) -> ParsedReply {
        let parsed = match self {
            Self::Hermes => parse_hermes(text),
            Self::Llama3Json => parse_llama3_json(text),
            Self::Mistral => parse_mistral(text),
        };
        parsed.unwrap_or_else(|| ParsedReply::text(text))
    }

    /// Where in `text` (a reply so far) a call may begin: text before it is content whatever
    /// follows; from it on, the rest of the reply decides.
    pub fn held_from(self, text: &str) -> usize {
        let lead = text.len() - text.trim_start().len();
        let start = &text[lead..];
        match self {
            Self::Hermes => marker_or_its_start(text, HERMES_OPEN),
            Self::Llama3Json => {
                if start.is_empty()
                    || start.starts_with('{')
                    || start.starts_with(LLAMA_PYTHON_TAG)
                    || LLAMA_PYTHON_TAG.starts_with(start)
                {
                    0
                } else {
                    text.len()
                }
            }
            Self::Mistral => {
                // A bare `name{...}` call may be forming while the reply is a name so far.
                let name_end = start
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
                    .unwrap_or(start.len());
                let after_name = &start[name_end..];
                if start.starts_with('[') || after_name.is_empty() || after_name.starts_with('{') {
                    0
                } else {
                    marker_or_its_start(text, MISTRAL_MARKER)
                }
            }
        }
    }
}

/// Where `marker` begins in `text`, or where a suffix of `text` that could begin it does, or the
/// end.
fn marker_or_its_start(text: &str, marker: &str) -> usize {
    if let Some(at) = text.find(marker) {
        return at;
    }
    text.char_indices()
        .map(|(i, _)| i)
        .find(|&i| marker.starts_with(&text[i..]))
        .unwrap_or(text.len())
}

fn parse_hermes(text: &str) -> Option<ParsedReply> {
    let first = text.find(HERMES_OPEN)?;
    let mut calls = Vec::new();
    let mut rest = &text[first..];
    while let Some(body) = rest.strip_prefix(HERMES_OPEN) {
        // The last block may lack its close when the reply ended on end-of-sequence.
        let (inner, after) = match body.find(HERMES_CLOSE) {
            Some(end) => (&body[..end], &body[end + HERMES_CLOSE.len()..]),
            None => (body, ""),
        };
        let value: Value = serde_json::from_str(inner.trim()).ok()?;
        calls.push(call_from(&value, &["arguments", "parameters"])?);
        rest = after.trim_start();
    }
    // Only whitespace may follow the last call.
    if !rest.is_empty() {
        return None;
    }
    Some(ParsedReply {
        content: nonempty(&text[..first]),
        calls,
    })
}

fn parse_llama3_json(text: &str) -> Option<ParsedReply> {
    let body = text.trim_start();
    let body = body.strip_prefix(LLAMA_PYTHON_TAG).unwrap_or(body);
    if !body.trim_start().starts_with('{') {
        return None;
    }
    let calls = json_values(body, Some(';'))?
        .iter()
        .map(|v| call_from(v, &["parameters", "arguments"]))
        .collect::<Option<Vec<_>>>()?;
    Some(ParsedReply {
        content: None,
        calls,
    })
}

fn parse_mistral(text: &str) -> Option<ParsedReply> {
    let (content, body) = match text.find(MISTRAL_MARKER) {
        Some(at) => (nonempty(&text[..at]), &text[at + MISTRAL_MARKER.len()..]),
        None if text.trim_start().starts_with('[') => (None, text),
        None => return parse_mistral_unmarked_v11(text),
    };
    let body = body.trim_start();
    let calls = if body.starts_with('[') {
        // [{"name": ..., "arguments": ...}, ...] (an `id` key, as the template writes it, is
        // ignored).
        let values = json_values(body, None)?;
        let [Value::Array(items)] = values.as_slice() else {
            return None;
        };
        items
            .iter()
            .map(|v| call_from(v, &["arguments"]))
            .collect::<Option<Vec<_>>>()?
    } else {
        // name[ARGS]{...}[TOOL_CALLS]name[ARGS]{...}
        body.split(MISTRAL_MARKER)
            .map(|one| {
                let (name, arguments) = one.split_once(MISTRAL_ARGS)?;
                let arguments: Value = serde_json::from_str(arguments.trim()).ok()?;
                let name = name.trim();
                (!name.is_empty() && arguments.is_object()).then(|| ParsedCall {
                    name: name.to_owned(),
                    arguments: arguments.to_string(),
                })
            })
            .collect::<Option<Vec<_>>>()?
    };
    (!calls.is_empty()).then_some(ParsedReply { content, calls })
}

/// A v11 call whose control tokens decoding dropped: `name{...}` and nothing else, the name
/// a function name.
fn parse_mistral_unmarked_v11(text: &str) -> Option<ParsedReply> {
    let text = text.trim();
    let brace = text.find('{')?;
    let name = &text[..brace];
    let valid_name = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    let arguments: Value = serde_json::from_str(&text[brace..]).ok()?;
    (valid_name && arguments.is_object()).then(|| ParsedReply {
        content: None,
        calls: vec![ParsedCall {
            name: name.to_owned(),
            arguments: arguments.to_string(),
        }],
    })
}

/// What a validated chat request asks of its reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolReply {
    /// `auto`: the reply is read with the parser; `parallel` false keeps its first call only.
    Auto {
        /// The server's parser.
        parser: ToolCallParser,
        /// `parallel_tool_calls`.
        parallel: bool,
    },
    /// `required`: the reply is one call object, or an array of them when `parallel`.
    Required {
        /// `parallel_tool_calls`.
        parallel: bool,
    },
    /// A named function: the reply is its arguments object.
    Named {
        /// The function.
        name: String,
    },
}

/// The JSON schema the reply of `required` follows: a call of one of `tools`, or an array of
/// at least one when `parallel`. Each tool's parameters move under the call's `arguments`, so
/// their local definitions (`$defs`, `definitions`, as pydantic writes them) move to the new
/// root, renamed per tool, and their `$ref`s with them.
pub fn required_schema(tools: &[(String, Value)], parallel: bool) -> Value {
    let mut defs = serde_json::Map::new();
    let calls: Vec<Value> = tools
        .iter()
        .enumerate()
        .map(|(i, (name, parameters))| {
            let parameters = hoist_definitions(i, parameters, &mut defs);
            json!({
                "type": "object",
                "properties": {"name": {"const": name}, "arguments": parameters},
                "required": ["name", "arguments"],
                "additionalProperties": false,
            })
        })
        .collect();
    let call = if calls.len() == 1 {
        calls.into_iter().next().expect("one")
    } else {
        json!({"anyOf": calls})
    };
    let mut schema = if parallel {
        json!({"type": "array", "items": call, "minItems": 1})
    } else {
        call
    };
    if !defs.is_empty() {
        schema["$defs"] = Value::Object(defs);
    }
    schema
}

/// Tool `i`'s parameters with their definitions moved into `defs` as `t{i}_{name}` and their
/// local references rewritten to match (a reference to the parameters' own root becomes one to
/// `t{i}_root`, kept in `defs`).
fn hoist_definitions(
    i: usize,
    parameters: &Value,
    defs: &mut serde_json::Map<String, Value>,
) -> Value {
    let mut parameters = parameters.clone();
    let mut own = Vec::new();
    if let Some(object) = parameters.as_object_mut() {
        for key in ["$defs", "definitions"] {
            if let Some(Value::Object(d)) = object.remove(key) {
                own.extend(d);
            }
        }
    }
    let mut refers_to_root = false;
    rewrite_refs(i, &mut parameters, &mut refers_to_root);
    for (name, mut def) in own {
        rewrite_refs(i, &mut def, &mut refers_to_root);
        defs.insert(format!("t{i}_{name}"), def);
    }
    if refers_to_root {
        defs.insert(format!("t{i}_root"), parameters.clone());
    }
    parameters
}

fn rewrite_refs(i: usize, value: &mut Value, refers_to_root: &mut bool) {
    match value {
        Value::Object(object) => {
            if let Some(Value::String(target)) = object.get_mut("$ref") {
                let local = target
                    .strip_prefix("#/$defs/")
                    .or_else(|| target.strip_prefix("#/definitions/"));
                if let Some(rest) = local {
                    *target = format!("#/$defs/t{i}_{rest}");
                } else if target == "#" {
                    *target = format!("#/$defs/t{i}_root");
                    *refers_to_root = true;
                }
            }
            for (_, v) in object.iter_mut() {
                rewrite_refs(i, v, refers_to_root);
            }
        }
        Value::Array(items) => {
            for v in items {
                rewrite_refs(i, v, refers_to_root);
            }
        }
        _ => {}
    }
}

/// The parameters of a function that declares none: an empty object.
pub fn no_parameters() -> Value {
    json!({"type": "object", "properties": {}, "additionalProperties": false})
}

/// Checks a function name as OpenAI does: 1 to 64 of `a-z A-Z 0-9 _ -`.
pub fn check_function_name(field: &str, name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(
            field,
            format!(
                "function name `{name}` refused: 1 to 64 letters, digits, underscores or dashes"
            ),
        ))
    }
}

static NEXT_CALL: AtomicU64 = AtomicU64::new(0);

/// A new tool-call id: `call_` and hex (unique within the process and across restarts, as
/// response ids are), or nine alphanumerics under the Mistral parser.
pub fn next_call_id(started_at: u64, parser: Option<ToolCallParser>) -> String {
    let n = NEXT_CALL.fetch_add(1, Ordering::Relaxed);
    if parser == Some(ToolCallParser::Mistral) {
        // Nine base-62 digits of a mix of the start time and the counter.
        const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
        let mut x = (started_at << 24 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        return (0..9)
            .map(|_| {
                let d = DIGITS[(x % 62) as usize] as char;
                x /= 62;
                d
            })
            .collect();
    }
    format!("call_{started_at:x}{n:08x}")
}

fn tool_call(id: String, call: ParsedCall) -> ToolCall {
    ToolCall {
        id,
        kind: FunctionKind::Function,
        function: FunctionCall {
            name: call.name,
            arguments: call.arguments,
        },
    }
}

/// Reads a whole reply of `text` as `reply` asks: its content and calls. A reply that does not
/// read as calls (cut by its budget, or free text under `auto`) is all content.
pub fn read_reply(reply: &ToolReply, text: &str, mut id: impl FnMut() -> String) -> Reading {
    let parsed = match reply {
        ToolReply::Named { name } => match serde_json::from_str::<Value>(text) {
            Ok(v) if v.is_object() => Some(ParsedReply {
                content: None,
                calls: vec![ParsedCall {
                    name: name.clone(),
                    arguments: v.to_string(),
                }],
            }),
            _ => None,
        },
        ToolReply::Required { parallel } => {
            let value = serde_json::from_str::<Value>(text).ok();
            let items = match (value, parallel) {
                (Some(Value::Array(items)), true) => Some(items),
                (Some(one), false) => Some(vec![one]),
                _ => None,
            };
            items
                .and_then(|items| {
                    items
                        .iter()
                        .map(|v| call_from(v, &["arguments"]))
                        .collect::<Option<Vec<_>>>()
                })
                .map(|calls| ParsedReply {
                    content: None,
                    calls,
                })
        }
        ToolReply::Auto { parser, parallel } => {
            let mut parsed = parser.parse(text);
            if !parallel {
                parsed.calls.truncate(1);
            }
            Some(parsed)
        }
    };
    let parsed = parsed
        .filter(|p| !p.calls.is_empty())
        .unwrap_or_else(|| ParsedReply::text(text));
    Reading {
        content: parsed.content,
        calls: parsed
            .calls
            .into_iter()
            .map(|c| tool_call(id(), c))
            .collect(),
    }
}

/// A reply read into content and calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reading {
    /// Text that is not calls.
    pub content: Option<String>,
    /// The calls.
    pub calls: Vec<ToolCall>,
}

/// What a streamed piece of a reply gives: content text and call deltas.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamedPiece {
    /// Content to send now.
    pub content: String,
    /// Call deltas to send now.
    pub calls: Vec<ToolCallDelta>,
}

/// Reads one choice's reply as it streams (see the module doc for what is held back).
#[derive(Debug)]
pub struct ToolStream {
    reply: ToolReply,
    text: String,
    /// Bytes of `text` already sent as content (auto) or as arguments (named).
    sent: usize,
    calls_sent: usize,
}

impl ToolStream {
    /// A reader for a reply that `reply` asks for.
    pub fn new(reply: ToolReply) -> Self {
        Self {
            reply,
            text: String::new(),
            sent: 0,
            calls_sent: 0,
        }
    }

    /// Takes the next piece of the reply's text.
    pub fn push(&mut self, piece: &str, mut id: impl FnMut() -> String) -> StreamedPiece {
        self.text.push_str(piece);
        let mut out = StreamedPiece::default();
        match &self.reply {
            ToolReply::Named { name } => {
                if self.sent == self.text.len() {
                    return out;
                }
                let mut delta = ToolCallDelta {
                    index: 0,
                    id: None,
                    kind: None,
                    function: FunctionCallDelta {
                        name: None,
                        arguments: self.text[self.sent..].to_owned(),
                    },
                };
                if self.calls_sent == 0 {
                    delta.id = Some(id());
                    delta.kind = Some(FunctionKind::Function);
                    delta.function.name = Some(name.clone());
                    self.calls_sent = 1;
                }
                self.sent = self.text.len();
                out.calls.push(delta);
            }
            ToolReply::Required { .. } => {}
            ToolReply::Auto { parser, .. } => {
                let held = parser.held_from(&self.text).max(self.sent);
                out.content = self.text[self.sent..held].to_owned();
                self.sent = held;
            }
        }
        out
    }

    /// The end of the reply: what was held, as calls or content; and whether the reply made
    /// calls (its finish reason is then `tool_calls` where it would have been `stop`).
    pub fn finish(&mut self, id: impl FnMut() -> String) -> (StreamedPiece, bool) {
        let mut out = StreamedPiece::default();
        if let ToolReply::Named { .. } = self.reply {
            return (out, self.calls_sent > 0);
        }
        let held = &self.text[self.sent..];
        let reading = read_reply(&self.reply, held, id);
        if reading.calls.is_empty() {
            out.content = held.to_owned();
            return (out, false);
        }
        out.content = reading.content.unwrap_or_default();
        for (index, call) in reading.calls.into_iter().enumerate() {
            out.calls.push(ToolCallDelta {
                index,
                id: Some(call.id),
                kind: Some(FunctionKind::Function),
                function: FunctionCallDelta {
                    name: Some(call.function.name),
                    arguments: String::new(),
                },
            });
            out.calls.push(ToolCallDelta {
                index,
                id: None,
                kind: None,
                function: FunctionCallDelta {
                    name: None,
                    arguments: call.function.arguments,
                },
            });
        }
        self.calls_sent = out.calls.len() / 2;
        (out, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, arguments: Value) -> ParsedCall {
        ParsedCall {
            name: name.into(),
            arguments: arguments.to_string(),
        }
    }

    /// Qwen2.5-Instruct's chat template (tokenizer_config.json) tells the model: "For each
    /// function call, return a json object with function name and arguments within
    /// <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>,
    /// \"arguments\": <args-json-object>}\n</tool_call>", and writes earlier calls back the same
    /// way, one block per call after the turn's text.
    #[test]
    fn hermes_reads_qwen_tool_call_blocks() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}\n</tool_call>";
        let parsed = ToolCallParser::Hermes.parse(text);
        assert_eq!(parsed.content.as_deref(), Some("Let me check.\n"));
        assert_eq!(
            parsed.calls,
            vec![
                call("get_weather", json!({"city": "Paris", "unit": "celsius"})),
                call("get_time", json!({"zone": "CET"})),
            ]
        );
        // Ended on end-of-sequence before the close tag.
        let unclosed = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n";
        assert_eq!(
            ToolCallParser::Hermes.parse(unclosed).calls,
            vec![call("f", json!({}))]
        );
        // Not a call: all content.
        for text in [
            "The weather is fine.",
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call>",
            "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call> and then text",
        ] {
            assert_eq!(ToolCallParser::Hermes.parse(text), ParsedReply::text(text));
        }
    }

    /// Llama 3.1/3.2 Instruct's template asks for "a JSON for a function call ... in the format
    /// {\"name\": function name, \"parameters\": dictionary of argument name and its value}" and
    /// writes an earlier call as `{"name": "<name>", "parameters": <arguments>}`;
    /// `<|python_tag|>` may open the reply.
    #[test]
    fn llama3_json_reads_bare_json_calls() {
        let text = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"San Francisco, CA\"}}";
        let parsed = ToolCallParser::Llama3Json.parse(text);
        assert_eq!(parsed.content, None);
        assert_eq!(
            parsed.calls,
            vec![call("get_weather", json!({"city": "San Francisco, CA"}))]
        );
        let two = "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", \"parameters\": {}}";
        assert_eq!(
            ToolCallParser::Llama3Json.parse(two).calls,
            vec![call("a", json!({"x": 1})), call("b", json!({}))]
        );
        for text in [
            "It is sunny in Paris.",
            "{\"answer\": 42}",
            "{\"name\": \"a\", \"parameters\"",
        ] {
            assert_eq!(
                ToolCallParser::Llama3Json.parse(text),
                ParsedReply::text(text)
            );
        }
    }

    /// Mistral-7B-Instruct-v0.3's template writes calls as `[TOOL_CALLS] [{"name": ...,
    /// "arguments": {...}, "id": "<9 chars>"}]`; tokenizers v11+ (Mistral Small 3.2, Devstral)
    /// write `[TOOL_CALLS]name[ARGS]{...}` per call.
    #[test]
    fn mistral_reads_both_tool_call_forms() {
        let v3 = "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"a1b2c3d4e\"}, {\"name\": \"get_time\", \"arguments\": {}}]";
        let parsed = ToolCallParser::Mistral.parse(v3);
        assert_eq!(parsed.content, None);
        assert_eq!(
            parsed.calls,
            vec![
                call("get_weather", json!({"city": "Paris"})),
                call("get_time", json!({}))
            ]
        );
        // With the control token dropped by decoding.
        assert_eq!(ToolCallParser::Mistral.parse(&v3[12..]).calls, parsed.calls);
        let v11 = "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[ARGS]{}";
        assert_eq!(ToolCallParser::Mistral.parse(v11).calls, parsed.calls);
        // v11 with its control tokens dropped by decoding: one `name{...}` call.
        assert_eq!(
            ToolCallParser::Mistral
                .parse("get_weather{\"city\": \"Paris\"}")
                .calls,
            vec![call("get_weather", json!({"city": "Paris"}))]
        );
        for text in [
            "Bonjour.",
            "[TOOL_CALLS] [{\"name\": \"f\"",
            "[1, 2]",
            "Use {\"a\": 1}",
        ] {
            assert_eq!(ToolCallParser::Mistral.parse(text), ParsedReply::text(text));
        }
    }

    /// Qwen2.5-Instruct's chat template (tokenizer_config.json), its tool parts as published.
    const QWEN25_TEMPLATE: &str = r#"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}"#;

    /// Llama 3.1-Instruct's template, the part that writes an assistant's call back.
    const LLAMA31_CALL_TEMPLATE: &str = r#"{%- for message in messages %}{%- if 'tool_calls' in message %}
    {%- set tool_call = message.tool_calls[0].function %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
    {{- '{"name": "' + tool_call.name + '", ' }}
    {{- '"parameters": ' }}
    {{- tool_call.arguments | tojson }}
    {{- "}" }}
    {{- "<|eot_id|>" }}
{%- endif %}{%- endfor %}"#;

    /// Mistral-7B-Instruct-v0.3's template, the part that writes an assistant's calls back.
    const MISTRAL_V03_CALL_TEMPLATE: &str = r#"{%- for message in messages %}{%- if message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
{%- endif %}{%- endfor %}"#;

    fn assistant_with_calls(calls: &[(&str, &str, Value)]) -> crate::chat::TemplateMessage {
        crate::chat::TemplateMessage {
            role: "assistant".into(),
            tool_calls: Some(
                calls
                    .iter()
                    .map(|(id, name, arguments)| {
                        json!({"id": id, "type": "function",
                            "function": {"name": name, "arguments": arguments}})
                    })
                    .collect(),
            ),
            ..Default::default()
        }
    }

    /// Each family's own template writes a call back in the format its parser reads: what the
    /// template renders for an assistant turn with calls parses back to the same calls.
    #[test]
    fn each_parser_reads_the_calls_its_familys_template_writes() {
        use crate::chat::{ChatTemplate, TemplateMessage};
        let weather = json!({"city": "Paris", "unit": "celsius"});
        let time = json!({"zone": "CET"});
        let tools = [
            json!({"type": "function", "function": {"name": "get_weather",
            "description": "The weather now.", "parameters": {"type": "object"}}}),
        ];
        let user = TemplateMessage {
            role: "user".into(),
            content: "Weather and time in Paris?".into(),
            ..Default::default()
        };
        let tool = TemplateMessage {
            role: "tool".into(),
            content: "{\"temperature\": 21}".into(),
            tool_call_id: Some("call_1".into()),
            ..Default::default()
        };

        let qwen = ChatTemplate::new(QWEN25_TEMPLATE.into(), String::new(), String::new()).unwrap();
        let assistant = assistant_with_calls(&[
            ("call_1", "get_weather", weather.clone()),
            ("call_2", "get_time", time.clone()),
        ]);
        let text = qwen
            .render(&[user.clone(), assistant, tool], Some(&tools), true)
            .unwrap();
        // The template received the tools, and the tool's answer.
        assert!(text.contains("<tools>\n{"), "{text}");
        assert!(text.contains("get_weather") && text.contains("The weather now."));
        assert!(text.contains("<tool_response>\n{\"temperature\": 21}\n</tool_response>"));
        let turn = text
            .split("<|im_start|>assistant")
            .nth(1)
            .and_then(|t| t.split("<|im_end|>").next())
            .unwrap();
        assert_eq!(
            ToolCallParser::Hermes.parse(turn).calls,
            vec![
                call("get_weather", weather.clone()),
                call("get_time", time.clone())
            ]
        );

        let llama =
            ChatTemplate::new(LLAMA31_CALL_TEMPLATE.into(), String::new(), String::new()).unwrap();
        let text = llama
            .render(
                &[assistant_with_calls(&[(
                    "c",
                    "get_weather",
                    weather.clone(),
                )])],
                None,
                false,
            )
            .unwrap();
        let turn = text
            .trim_start_matches("<|start_header_id|>assistant<|end_header_id|>\n\n")
            .trim_end_matches("<|eot_id|>");
        assert_eq!(
            ToolCallParser::Llama3Json.parse(turn).calls,
            vec![call("get_weather", weather.clone())]
        );

        let mistral = ChatTemplate::new(
            MISTRAL_V03_CALL_TEMPLATE.into(),
            String::new(),
            "</s>".into(),
        )
        .unwrap();
        let (a, b) = (
            next_call_id(7, Some(ToolCallParser::Mistral)),
            next_call_id(7, Some(ToolCallParser::Mistral)),
        );
        let text = mistral
            .render(
                &[assistant_with_calls(&[
                    (&a, "get_weather", weather.clone()),
                    (&b, "get_time", time.clone()),
                ])],
                None,
                false,
            )
            .unwrap();
        let turn = text.trim_end_matches("</s>");
        assert_eq!(
            ToolCallParser::Mistral.parse(turn).calls,
            vec![call("get_weather", weather), call("get_time", time)]
        );
    }

    #[test]
    fn auto_streams_text_before_a_possible_call_and_holds_the_rest() {
        let p = ToolCallParser::Hermes;
        assert_eq!(p.held_from("Sure, I will"), 12);
        assert_eq!(p.held_from("Sure <tool"), 5);
        assert_eq!(p.held_from("Sure <tool_call>{"), 5);
        assert_eq!(ToolCallParser::Llama3Json.held_from("  {\"na"), 0);
        assert_eq!(ToolCallParser::Llama3Json.held_from("Hello"), 5);
        assert_eq!(ToolCallParser::Mistral.held_from("get_weather{\"ci"), 0);
        assert_eq!(ToolCallParser::Mistral.held_from("Hello there [TOOL"), 12);
        let mut ids = 0;
        let mut next = || {
            ids += 1;
            format!("id{ids}")
        };
        let mut s = ToolStream::new(ToolReply::Auto {
            parser: p,
            parallel: true,
        });
        let text = "Checking. <tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call>";
        let mut content = String::new();
        for c in text.chars() {
            let piece = s.push(&c.to_string(), &mut next);
            assert!(piece.calls.is_empty());
            content.push_str(&piece.content);
        }
        assert_eq!(content, "Checking. ");
        let (last, called) = s.finish(&mut next);
        assert!(called);
        assert_eq!(last.content, "");
        assert_eq!(last.calls.len(), 2);
        assert_eq!(last.calls[0].function.name.as_deref(), Some("f"));
        assert_eq!(last.calls[1].function.arguments, "{\"a\":1}");
    }

    #[test]
    fn a_required_reply_reads_as_calls_and_a_cut_one_as_content() {
        let reply = ToolReply::Required { parallel: true };
        let text = r#"[{"name":"f","arguments":{"a":1}},{"name":"g","arguments":{}}]"#;
        let r = read_reply(&reply, text, || "x".into());
        assert_eq!(r.content, None);
        assert_eq!(r.calls.len(), 2);
        assert_eq!(r.calls[1].function.name, "g");
        let cut = &text[..20];
        let r = read_reply(&reply, cut, || "x".into());
        assert_eq!(r.content.as_deref(), Some(cut));
        assert!(r.calls.is_empty());
    }

    /// A tool whose parameters use local definitions (as pydantic's `model_json_schema()`
    /// writes them) still compiles under `required`, where its parameters are no longer the
    /// root, and the grammar accepts a call that uses the definition.
    #[test]
    fn required_keeps_each_tools_definitions_reachable() {
        let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/data/fixtures/tiny-llama-tied/tokenizer.json");
        let tokenizer = tokenizers::Tokenizer::from_file(&path).unwrap();
        let grammars = crate::structured::Grammars::new(path);
        let vocab = tokenizer.get_vocab_size(true);
        let eos = tokenizer.token_to_id("<|im_end|>").unwrap();
        let place = json!({"type": "object", "properties": {
                "where": {"$ref": "#/$defs/City"}},
            "required": ["where"], "additionalProperties": false,
            "$defs": {"City": {"type": "object", "properties": {"name": {"type": "string"}},
                "required": ["name"], "additionalProperties": false}}});
        let other = json!({"type": "object", "properties": {"n": {"$ref": "#/definitions/City"}},
            "definitions": {"City": {"type": "integer"}}});
        let tools = vec![("visit".to_owned(), place), ("count".to_owned(), other)];
        let schema = required_schema(&tools, false);
        let spec = ("tools".to_owned(), format!("json:{schema}"));
        let compiled = grammars.compile(&spec, vocab, &[eos]).unwrap();
        let constraint = compiled.constraint();
        let mut c = constraint.lock();
        let reply = r#"{"name":"visit","arguments":{"where":{"name":"Oslo"}}}"#;
        for t in tokenizer.encode(reply, false).unwrap().get_ids() {
            assert!(
                c.next_mask().unwrap().allows(*t),
                "{reply}: token {t} refused"
            );
            c.commit(*t).unwrap();
        }
        // The second tool's `City` is its own integer, not the first tool's object.
        assert_eq!(schema["$defs"]["t1_City"], json!({"type": "integer"}));
    }

    #[test]
    fn call_ids_are_unique_and_mistral_ids_are_nine_alphanumerics() {
        let a = next_call_id(1, None);
        let b = next_call_id(1, None);
        assert!(a.starts_with("call_") && a != b);
        let m = next_call_id(1_700_000_000, Some(ToolCallParser::Mistral));
        assert_eq!(m.len(), 9);
        assert!(m.chars().all(|c| c.is_ascii_alphanumeric()), "{m}");
        assert_ne!(
            m,
            next_call_id(1_700_000_000, Some(ToolCallParser::Mistral))
        );
    }
}
