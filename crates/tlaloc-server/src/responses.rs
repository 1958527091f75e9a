//! `POST /v1/responses`, stateless: `input` (text, or message and function-call items),
//! `instructions`, `max_output_tokens`, sampling, function `tools` with `tool_choice`, and
//! `stream` with the Responses event sequence (`response.created`, `response.in_progress`,
//! `response.output_item.added`, `response.content_part.added`, `response.output_text.delta`,
//! ..., `response.completed`).
//!
//! A Responses request is read into the chat request it amounts to and checked by the same
//! code ([`crate::validate`]), so the two endpoints cannot disagree about a field; a refusal's
//! `param` is then renamed back to the Responses spelling (`input[2]`, `max_output_tokens`,
//! `tools[0].parameters`). Nothing is stored: `store: true` and `previous_response_id` are
//! refused by name.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::Json;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;

use crate::error::ApiError;
use crate::generate::Generation;
use crate::request::ChatRequest;
use crate::response::{AssistantRole, FinishReason};
use crate::state::SharedState;
use crate::tools::{self, ToolStream};
use crate::validate::ValidatedGeneration;

fn non_null<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(deserializer).map(Some)
}

/// `POST /v1/responses`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResponsesRequest {
    /// The served model name; any other is refused, and so is `null`.
    #[serde(default, deserialize_with = "non_null")]
    #[schema(value_type = String)]
    pub model: Option<String>,
    /// Text, or a list of items: messages (`role`, `content` as text or `input_text` parts),
    /// `function_call` and `function_call_output`.
    #[schema(required = true, value_type = Object)]
    pub input: Option<Value>,
    /// A system message put before the input.
    pub instructions: Option<String>,
    /// Generated tokens at most (at least 1).
    pub max_output_tokens: Option<i64>,
    /// Sampling temperature in [0, 2] (0 is greedy; default 1).
    pub temperature: Option<f32>,
    /// Nucleus mass in (0, 1] (default 1).
    pub top_p: Option<f32>,
    /// Function tools: `{"type": "function", "name", "description", "parameters", "strict"}`.
    #[schema(value_type = Vec<Object>)]
    pub tools: Option<Vec<Value>>,
    /// `none`, `auto`, `required`, or `{"type": "function", "name": ...}`.
    #[schema(value_type = Object)]
    pub tool_choice: Option<Value>,
    /// Allow more than one call in a reply (default true).
    pub parallel_tool_calls: Option<bool>,
    /// Answer with the Responses event stream.
    pub stream: Option<bool>,
    /// Only `false`: responses are not stored.
    pub store: Option<bool>,
    /// Refused: responses are not stored, so none can be continued.
    pub previous_response_id: Option<String>,
    /// Accepted and returned.
    #[schema(value_type = Object)]
    pub metadata: Option<Value>,
    /// End-user id (accepted, not used).
    pub user: Option<String>,
}

/// The `status` of a response or of one of its output items.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ResponseStatus {
    /// Being generated (the opening events).
    InProgress,
    /// Finished.
    Completed,
    /// Cut by `max_output_tokens`.
    Incomplete,
    /// Aborted.
    Cancelled,
}

/// A piece of generated text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct OutputText {
    /// `output_text`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The text.
    pub text: String,
    /// Always empty.
    #[schema(value_type = Vec<Object>)]
    pub annotations: Vec<Value>,
}

fn output_text(text: &str) -> OutputText {
    OutputText {
        kind: "output_text".to_owned(),
        text: text.to_owned(),
        annotations: Vec::new(),
    }
}

/// One item of a response's output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    /// The assistant's text.
    Message {
        /// The item's id (`msg_...`).
        id: String,
        /// Its status.
        status: ResponseStatus,
        /// `assistant`.
        role: AssistantRole,
        /// Its text, in one part (none while it streams).
        content: Vec<OutputText>,
    },
    /// A call of one of the request's tools.
    FunctionCall {
        /// The item's id (`fc_...`).
        id: String,
        /// Its status.
        status: ResponseStatus,
        /// The call's id; a `function_call_output` item answers it.
        call_id: String,
        /// The function.
        name: String,
        /// Its arguments: a JSON object, as a string.
        arguments: String,
    },
}

impl OutputItem {
    fn id(&self) -> &str {
        match self {
            OutputItem::Message { id, .. } | OutputItem::FunctionCall { id, .. } => id,
        }
    }
}

/// Why a response is incomplete.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct IncompleteDetails {
    /// `max_output_tokens`.
    pub reason: String,
}

/// Cached input tokens (none are reported).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct InputTokensDetails {
    /// Always 0.
    pub cached_tokens: usize,
}

/// Reasoning tokens (none are generated).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct OutputTokensDetails {
    /// Always 0.
    pub reasoning_tokens: usize,
}

/// Token counts of a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct ResponsesUsage {
    /// Tokens of the rendered input.
    pub input_tokens: usize,
    /// Cached input tokens.
    pub input_tokens_details: InputTokensDetails,
    /// Tokens generated.
    pub output_tokens: usize,
    /// Reasoning tokens.
    pub output_tokens_details: OutputTokensDetails,
    /// Their sum.
    pub total_tokens: usize,
}

/// The answer of `POST /v1/responses` (also the `response` of its `response.created`,
/// `response.in_progress` and last events).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ResponseObject {
    /// The response id (`resp_...`).
    pub id: String,
    /// `response`.
    pub object: String,
    /// Unix seconds when the request was accepted.
    pub created_at: u64,
    /// Where it stands.
    pub status: ResponseStatus,
    /// Always `null` (a failure is an error answer or an `error` event).
    #[schema(required = true, value_type = Object)]
    pub error: Option<Value>,
    /// Set when `status` is `incomplete`.
    #[schema(required = true)]
    pub incomplete_details: Option<IncompleteDetails>,
    /// The request's `instructions`.
    #[schema(required = true)]
    pub instructions: Option<String>,
    /// The request's `max_output_tokens`.
    #[schema(required = true)]
    pub max_output_tokens: Option<i64>,
    /// The served model name.
    pub model: String,
    /// The output items, in order (empty in the opening events).
    pub output: Vec<OutputItem>,
    /// The request's `parallel_tool_calls`.
    pub parallel_tool_calls: bool,
    /// The sampling temperature.
    pub temperature: f32,
    /// The nucleus mass.
    pub top_p: f32,
    /// The request's `tool_choice`.
    #[schema(value_type = Object)]
    pub tool_choice: Value,
    /// The request's `tools`.
    #[schema(value_type = Vec<Object>)]
    pub tools: Vec<Value>,
    /// Always false: nothing is stored.
    pub store: bool,
    /// `{"format": {"type": "text"}}`.
    #[schema(value_type = Object)]
    pub text: Value,
    /// `disabled`.
    pub truncation: String,
    /// The request's `metadata`.
    #[schema(value_type = Object)]
    pub metadata: Value,
    /// Token counts (`null` in the opening events).
    #[schema(required = true)]
    pub usage: Option<ResponsesUsage>,
}

/// Where a chat message of the translated request came from, for renaming refusals.
type Origins = Vec<String>;

impl ResponsesRequest {
    /// The chat request this amounts to, and the Responses path of each of its messages.
    fn to_chat(&self) -> Result<(ChatRequest, Origins), ApiError> {
        if self.store == Some(true) {
            return Err(ApiError::invalid(
                "store",
                "`store` = true refused: responses are not stored here; send `store`: false or leave it out",
            ));
        }
        if self.previous_response_id.is_some() {
            return Err(ApiError::invalid(
                "previous_response_id",
                "`previous_response_id` refused: responses are not stored here; send the whole conversation as `input`",
            ));
        }
        let mut messages = Vec::new();
        let mut origins = Vec::new();
        if let Some(i) = &self.instructions {
            messages.push(json!({"role": "system", "content": i}));
            origins.push("instructions".to_owned());
        }
        match &self.input {
            None => return Err(ApiError::invalid("input", "`input` is required")),
            Some(Value::String(text)) => {
                messages.push(json!({"role": "user", "content": text}));
                origins.push("input".to_owned());
            }
            Some(Value::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    push_item(&mut messages, &mut origins, format!("input[{i}]"), item)?;
                }
            }
            Some(_) => {
                return Err(ApiError::invalid(
                    "input",
                    "`input` refused: text, or a list of input items",
                ));
            }
        }
        let mut chat = serde_json::Map::new();
        chat.insert("messages".into(), Value::Array(messages));
        let mut put = |key: &str, value: Option<Value>| {
            if let Some(v) = value {
                chat.insert(key.into(), v);
            }
        };
        put("model", self.model.clone().map(Value::from));
        put(
            "max_completion_tokens",
            self.max_output_tokens.map(Value::from),
        );
        put("temperature", self.temperature.map(Value::from));
        put("top_p", self.top_p.map(Value::from));
        put(
            "parallel_tool_calls",
            self.parallel_tool_calls.map(Value::from),
        );
        put("stream", self.stream.map(Value::from));
        if let Some(tools) = &self.tools {
            let nested = tools
                .iter()
                .map(|t| {
                    let mut function = t.clone();
                    let kind = function
                        .as_object_mut()
                        .and_then(|o| o.remove("type"))
                        .unwrap_or(Value::Null);
                    // A tool of another type is refused by its type, whatever else it carries.
                    if kind == "function" {
                        json!({"type": kind, "function": function})
                    } else {
                        json!({"type": kind})
                    }
                })
                .collect();
            put("tools", Some(Value::Array(nested)));
        }
        if let Some(choice) = &self.tool_choice {
            let chat_choice = match choice {
                Value::Object(o) if o.get("type") == Some(&json!("function")) => {
                    json!({"type": "function", "function": {"name": o.get("name")}})
                }
                other => other.clone(),
            };
            put("tool_choice", Some(chat_choice));
        }
        let chat: ChatRequest =
            serde_path_to_error::deserialize(Value::Object(chat)).map_err(|e| {
                let param = rename_param(&e.path().to_string(), &origins);
                ApiError::invalid(param.clone(), format!("`{param}` refused: {}", e.inner()))
            })?;
        Ok((chat, origins))
    }
}

/// Appends the chat message an input item amounts to (calls in a row become one assistant
/// turn), with its Responses path.
fn push_item(
    messages: &mut Vec<Value>,
    origins: &mut Origins,
    field: String,
    item: &Value,
) -> Result<(), ApiError> {
    let kind = item
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("message");
    match kind {
        "message" => {
            let content = match item.get("content") {
                Some(Value::Array(parts)) => {
                    let mut text = String::new();
                    for (j, p) in parts.iter().enumerate() {
                        let t = p.get("type").and_then(Value::as_str);
                        match (t, p.get("text").and_then(Value::as_str)) {
                            (Some("input_text" | "output_text"), Some(s)) => text.push_str(s),
                            _ => {
                                return Err(ApiError::invalid(
                                    format!("{field}.content[{j}]"),
                                    "content part refused: only `input_text` and `output_text` parts with `text` are served",
                                ));
                            }
                        }
                    }
                    Value::String(text)
                }
                Some(other) => other.clone(),
                None => Value::Null,
            };
            let role = item.get("role").cloned().unwrap_or(Value::Null);
            messages.push(json!({"role": role, "content": content}));
            origins.push(field);
        }
        "function_call" => {
            let call = json!({
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments")},
            });
            // Calls in a row are one assistant turn.
            let last = messages
                .last_mut()
                .filter(|m: &&mut Value| m["role"] == "assistant" && m.get("tool_calls").is_some());
            match last {
                Some(m) => m["tool_calls"].as_array_mut().expect("a list").push(call),
                None => {
                    messages
                        .push(json!({"role": "assistant", "content": null, "tool_calls": [call]}));
                    origins.push(field);
                }
            }
        }
        "function_call_output" => {
            let output = match item.get("output") {
                Some(Value::String(s)) => Value::String(s.clone()),
                Some(other) => Value::String(other.to_string()),
                None => Value::Null,
            };
            messages.push(
                json!({"role": "tool", "tool_call_id": item.get("call_id"), "content": output}),
            );
            origins.push(field);
        }
        other => {
            return Err(ApiError::invalid(
                format!("{field}.type"),
                format!(
                    "input item type `{other}` refused: `message`, `function_call` or `function_call_output`"
                ),
            ));
        }
    }
    Ok(())
}

/// A chat field's name as the Responses request spells it.
fn rename_param(param: &str, origins: &Origins) -> String {
    if let Some(rest) = param.strip_prefix("messages[")
        && let Some((index, tail)) = rest.split_once(']')
        && let Ok(i) = index.parse::<usize>()
        && let Some(origin) = origins.get(i)
    {
        let tail = tail
            .replace(".tool_call_id", ".call_id")
            .replace(".tool_calls[0].function.arguments", ".arguments");
        return format!("{origin}{tail}");
    }
    if param == "messages" {
        return "input".to_owned();
    }
    if param == "max_completion_tokens" {
        return "max_output_tokens".to_owned();
    }
    if param == "tool_choice.function.name" {
        return "tool_choice.name".to_owned();
    }
    if let Some(rest) = param.strip_prefix("tools[")
        && let Some((index, tail)) = rest.split_once(']')
    {
        return format!("tools[{index}]{}", tail.replacen(".function", "", 1));
    }
    param.to_owned()
}

fn renamed(mut e: ApiError, origins: &Origins) -> ApiError {
    if let Some(p) = e.param.take() {
        e.param = Some(rename_param(&p, origins));
    }
    e
}

/// Runs a Responses request.
pub async fn respond(state: SharedState, req: ResponsesRequest) -> Result<Response, ApiError> {
    let engine = state.ready_engine()?.clone();
    let (chat, origins) = req.to_chat()?;
    let validated = chat.check(&state).map_err(|e| renamed(e, &origins))?;
    let id = state.next_request_id("resp").replacen('-', "_", 1);
    let generation =
        Generation::start(&state, &engine, &validated, id).map_err(|e| renamed(e, &origins))?;
    let echo = Echo {
        tools: req.tools.clone().unwrap_or_default(),
        tool_choice: req.tool_choice.clone().unwrap_or_else(|| json!("auto")),
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
        temperature: req.temperature,
        top_p: req.top_p,
        max_output_tokens: req.max_output_tokens,
        instructions: req.instructions.clone(),
        metadata: req.metadata.clone().unwrap_or_else(|| json!({})),
    };
    let mut run = Run::new(state, generation, &validated, echo);
    if validated.stream {
        let events = stream::unfold(run, |mut r| async move {
            let event = r.next_event().await?;
            Some((Ok::<_, Infallible>(event), r))
        });
        return Ok(Sse::new(events)
            .keep_alive(KeepAlive::new().interval(Duration::from_secs(10)))
            .into_response());
    }
    while let Some(piece) = run.generation.next_piece().await {
        let piece = piece?;
        run.text.push_str(&piece.text);
        if let Some(f) = piece.finish {
            run.finish = Some(f);
        }
    }
    run.read_whole();
    Ok(Json(run.body(false)).into_response())
}

/// The request fields a response repeats.
#[derive(Debug, Clone)]
struct Echo {
    tools: Vec<Value>,
    tool_choice: Value,
    parallel_tool_calls: bool,
    temperature: Option<f32>,
    top_p: Option<f32>,
    max_output_tokens: Option<i64>,
    instructions: Option<String>,
    metadata: Value,
}

/// One response being generated: its output items so far and, when streaming, the events
/// still to send.
struct Run {
    state: SharedState,
    generation: Generation,
    tools: Option<tools::ToolReply>,
    tool_stream: Option<ToolStream>,
    echo: Echo,
    created_at: u64,
    /// The reply's text (whole replies).
    text: String,
    finish: Option<FinishReason>,
    /// Output items, finished.
    output: Vec<OutputItem>,
    /// The message item being streamed: its output index and text so far.
    open_message: Option<(usize, String)>,
    /// Function-call items being streamed: output index, call id, name, arguments so far.
    open_calls: Vec<(usize, String, String, String)>,
    queue: VecDeque<Event>,
    sequence: u64,
    done: bool,
    started: bool,
}

impl Run {
    fn new(
        state: SharedState,
        generation: Generation,
        validated: &ValidatedGeneration,
        echo: Echo,
    ) -> Self {
        Self {
            created_at: generation.created,
            state,
            generation,
            tools: validated.tools.clone(),
            tool_stream: validated.tools.clone().map(ToolStream::new),
            echo,
            text: String::new(),
            finish: None,
            output: Vec::new(),
            open_message: None,
            open_calls: Vec::new(),
            queue: VecDeque::new(),
            sequence: 0,
            done: false,
            started: false,
        }
    }

    fn id(&self) -> &str {
        &self.generation.id
    }

    fn message_id(&self) -> String {
        format!("msg_{}", &self.id()[5..])
    }

    fn call_item_id(&self, index: usize) -> String {
        format!("fc_{}{index}", &self.id()[5..])
    }

    fn message_item(&self, text: &str, status: ResponseStatus) -> OutputItem {
        OutputItem::Message {
            id: self.message_id(),
            status,
            role: AssistantRole::Assistant,
            content: if status == ResponseStatus::InProgress {
                Vec::new()
            } else {
                vec![output_text(text)]
            },
        }
    }

    fn call_item(
        &self,
        index: usize,
        call_id: &str,
        name: &str,
        arguments: &str,
        status: ResponseStatus,
    ) -> OutputItem {
        OutputItem::FunctionCall {
            id: self.call_item_id(index),
            status,
            call_id: call_id.to_owned(),
            name: name.to_owned(),
            arguments: arguments.to_owned(),
        }
    }

    /// The whole reply read into output items.
    fn read_whole(&mut self) {
        let state = self.state.clone();
        let new_id = || tools::next_call_id(state.started_at, state.config.tool_call_parser);
        let (content, calls) = match &self.tools {
            None => (Some(self.text.clone()), Vec::new()),
            Some(reply) => {
                let r = tools::read_reply(reply, &self.text, new_id);
                (r.content, r.calls)
            }
        };
        if let Some(text) = content.filter(|t| !t.is_empty() || calls.is_empty()) {
            self.output
                .push(self.message_item(&text, ResponseStatus::Completed));
        }
        for (i, c) in calls.iter().enumerate() {
            let item = self.call_item(
                i,
                &c.id,
                &c.function.name,
                &c.function.arguments,
                ResponseStatus::Completed,
            );
            self.output.push(item);
        }
    }

    fn status(&self) -> ResponseStatus {
        match self.finish {
            Some(FinishReason::Length) => ResponseStatus::Incomplete,
            Some(FinishReason::Abort) => ResponseStatus::Cancelled,
            _ => ResponseStatus::Completed,
        }
    }

    /// The response object: in progress (the opening events), or as it ended.
    fn body(&self, in_progress: bool) -> ResponseObject {
        let status = if in_progress {
            ResponseStatus::InProgress
        } else {
            self.status()
        };
        let prompt = self.generation.prompt_tokens;
        let completion = self.generation.completion_tokens();
        ResponseObject {
            id: self.id().to_owned(),
            object: "response".to_owned(),
            created_at: self.created_at,
            status,
            error: None,
            incomplete_details: (status == ResponseStatus::Incomplete).then(|| IncompleteDetails {
                reason: "max_output_tokens".to_owned(),
            }),
            instructions: self.echo.instructions.clone(),
            max_output_tokens: self.echo.max_output_tokens,
            model: self.state.config.served_model_name.clone(),
            output: if in_progress {
                Vec::new()
            } else {
                self.output.clone()
            },
            parallel_tool_calls: self.echo.parallel_tool_calls,
            temperature: self.echo.temperature.unwrap_or(1.0),
            top_p: self.echo.top_p.unwrap_or(1.0),
            tool_choice: self.echo.tool_choice.clone(),
            tools: self.echo.tools.clone(),
            store: false,
            text: json!({"format": {"type": "text"}}),
            truncation: "disabled".to_owned(),
            metadata: self.echo.metadata.clone(),
            usage: (!in_progress).then_some(ResponsesUsage {
                input_tokens: prompt,
                input_tokens_details: InputTokensDetails { cached_tokens: 0 },
                output_tokens: completion,
                output_tokens_details: OutputTokensDetails {
                    reasoning_tokens: 0,
                },
                total_tokens: prompt + completion,
            }),
        }
    }

    fn push(&mut self, kind: &str, mut body: Value) {
        body["type"] = json!(kind);
        body["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        let data = serde_json::to_string(&body).expect("an event body serializes to JSON");
        self.queue
            .push_back(Event::default().event(kind).data(data));
    }

    fn open_message_item(&mut self) -> usize {
        if let Some((index, _)) = &self.open_message {
            return *index;
        }
        let index = self.output.len() + self.open_calls.len();
        let item = self.message_item("", ResponseStatus::InProgress);
        let item_id = item.id().to_owned();
        self.push(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        );
        self.push(
            "response.content_part.added",
            json!({"item_id": item_id, "output_index": index, "content_index": 0,
                "part": output_text("")}),
        );
        self.open_message = Some((index, String::new()));
        index
    }

    fn text_delta(&mut self, delta: &str) {
        if delta.is_empty() {
            return;
        }
        let index = self.open_message_item();
        let item_id = self.message_id();
        self.push(
            "response.output_text.delta",
            json!({"item_id": item_id, "output_index": index, "content_index": 0,
                "delta": delta, "logprobs": []}),
        );
        if let Some((_, text)) = self.open_message.as_mut() {
            text.push_str(delta);
        }
    }

    fn close_message(&mut self) {
        let Some((index, text)) = self.open_message.take() else {
            return;
        };
        let item = self.message_item(&text, ResponseStatus::Completed);
        let item_id = item.id().to_owned();
        self.push(
            "response.output_text.done",
            json!({"item_id": item_id, "output_index": index, "content_index": 0,
                "text": text, "logprobs": []}),
        );
        self.push(
            "response.content_part.done",
            json!({"item_id": item_id, "output_index": index, "content_index": 0,
                "part": output_text(&text)}),
        );
        self.push(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
        self.output.push(item);
    }

    fn call_deltas(&mut self, deltas: Vec<crate::response::ToolCallDelta>) {
        for d in deltas {
            if let Some(call_id) = d.id {
                self.close_message();
                let index = self.output.len() + self.open_calls.len();
                let name = d.function.name.clone().unwrap_or_default();
                let item = self.call_item(d.index, &call_id, &name, "", ResponseStatus::InProgress);
                self.push(
                    "response.output_item.added",
                    json!({"output_index": index, "item": item}),
                );
                self.open_calls.push((index, call_id, name, String::new()));
            }
            if !d.function.arguments.is_empty() {
                let Some(position) = self.open_calls.len().checked_sub(1) else {
                    continue;
                };
                let (index, ..) = self.open_calls[position];
                let item_id = self.call_item_id(d.index);
                self.push(
                    "response.function_call_arguments.delta",
                    json!({"item_id": item_id, "output_index": index, "delta": d.function.arguments}),
                );
                self.open_calls[position].3.push_str(&d.function.arguments);
            }
        }
    }

    fn close_calls(&mut self) {
        for (call_index, (index, call_id, name, arguments)) in
            std::mem::take(&mut self.open_calls).into_iter().enumerate()
        {
            let item = self.call_item(
                call_index,
                &call_id,
                &name,
                &arguments,
                ResponseStatus::Completed,
            );
            self.push(
                "response.function_call_arguments.done",
                json!({"item_id": item.id(), "output_index": index, "arguments": arguments}),
            );
            self.push(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            );
            self.output.push(item);
        }
    }

    async fn next_event(&mut self) -> Option<Event> {
        loop {
            if let Some(e) = self.queue.pop_front() {
                return Some(e);
            }
            if self.done {
                return None;
            }
            if !self.started {
                self.started = true;
                let body = self.body(true);
                self.push("response.created", json!({"response": body}));
                self.push("response.in_progress", json!({"response": body}));
                continue;
            }
            match self.generation.next_piece().await {
                Some(Ok(piece)) => {
                    let state = self.state.clone();
                    let new_id =
                        || tools::next_call_id(state.started_at, state.config.tool_call_parser);
                    let Some(stream) = self.tool_stream.as_mut() else {
                        self.text_delta(&piece.text);
                        if let Some(f) = piece.finish {
                            self.finish = Some(f);
                        }
                        continue;
                    };
                    let mut read = stream.push(&piece.text, new_id);
                    if let Some(f) = piece.finish {
                        let (rest, _) = stream.finish(new_id);
                        read.content.push_str(&rest.content);
                        read.calls.extend(rest.calls);
                        self.finish = Some(f);
                    }
                    self.text_delta(&read.content);
                    self.call_deltas(read.calls);
                }
                Some(Err(e)) => {
                    self.done = true;
                    self.push(
                        "error",
                        json!({"code": null, "message": e.message, "param": e.param}),
                    );
                }
                None => {
                    self.done = true;
                    self.close_message();
                    self.close_calls();
                    let body = self.body(false);
                    let kind = if self.status() == ResponseStatus::Incomplete {
                        "response.incomplete"
                    } else {
                        "response.completed"
                    };
                    self.push(kind, json!({"response": body}));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_refusal_fields_are_renamed_to_the_responses_spelling() {
        let origins: Origins = vec!["instructions".into(), "input[0]".into(), "input[2]".into()];
        for (chat, responses) in [
            ("messages[2].tool_call_id", "input[2].call_id"),
            ("messages[1].content[0]", "input[0].content[0]"),
            ("messages", "input"),
            ("max_completion_tokens", "max_output_tokens"),
            ("tools[1].function.parameters", "tools[1].parameters"),
            ("tools[0].type", "tools[0].type"),
            ("tool_choice.function.name", "tool_choice.name"),
            ("temperature", "temperature"),
        ] {
            assert_eq!(rename_param(chat, &origins), responses);
        }
    }
}
