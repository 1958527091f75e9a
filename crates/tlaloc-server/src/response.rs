//! The response bodies, typed: what each endpoint sends, field by field, with its OpenAPI
//! schema (errors are in [`crate::error`]). A field that may be `null` on the wire is an
//! `Option` marked `required` in the schema (it is always sent); one that is left out when
//! empty says so with `skip_serializing_if`.

use std::collections::BTreeMap;

use axum::response::sse::Event;
use serde::Serialize;
use utoipa::ToSchema;

/// Declares a string that has one possible value (an `object` tag, a fixed role) as a one-variant
/// enum, so that the schema names the value.
macro_rules! one_value_string {
    ($(#[$doc:meta])* $name:ident::$variant:ident = $value:tt) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, ToSchema)]
        pub enum $name {
            #[default]
            #[serde(rename = $value)]
            $variant,
        }
    };
}

one_value_string!(
    /// The `object` of a completion and of its chunks.
    TextCompletionObject::TextCompletion = "text_completion"
);
one_value_string!(
    /// The `object` of a chat completion.
    ChatCompletionObject::ChatCompletion = "chat.completion"
);
one_value_string!(
    /// The `object` of a chat completion chunk.
    ChatCompletionChunkObject::ChatCompletionChunk = "chat.completion.chunk"
);
one_value_string!(
    /// The `object` of the model list.
    ListObject::List = "list"
);
one_value_string!(
    /// The `object` of a model.
    ModelObject::Model = "model"
);
one_value_string!(
    /// The role of a generated message.
    AssistantRole::Assistant = "assistant"
);
one_value_string!(
    /// The status `/ready` reports.
    ReadyStatus::Ready = "ready"
);

/// Why a choice ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A stop string, a stop token or an end-of-sequence token.
    Stop,
    /// The token budget was used up.
    Length,
    /// The sequence was aborted.
    Abort,
    /// The reply is tool calls.
    ToolCalls,
}

impl FinishReason {
    /// The wire spelling (also the metrics label).
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
            FinishReason::ToolCalls => "tool_calls",
        }
    }
}

impl From<tlaloc_runtime::FinishReason> for FinishReason {
    fn from(reason: tlaloc_runtime::FinishReason) -> Self {
        match reason {
            tlaloc_runtime::FinishReason::Stop => FinishReason::Stop,
            tlaloc_runtime::FinishReason::Length => FinishReason::Length,
            tlaloc_runtime::FinishReason::Abort => FinishReason::Abort,
        }
    }
}

/// Token counts of a request, all choices together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct Usage {
    /// Tokens of the prompt.
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
    /// Their sum.
    pub total_tokens: usize,
}

impl Usage {
    /// The counts, with their total.
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
        }
    }
}

// Log-probabilities are computed as f32 and sent as the f64 they widen to: that is how the
// server has always printed them, so the digits on the wire stay the same.

/// Log-probabilities of a completion's tokens, in the legacy completions shape.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct CompletionLogprobs {
    /// Each token's text.
    pub tokens: Vec<String>,
    /// Each token's log-probability.
    pub token_logprobs: Vec<f64>,
    /// For each token, the most likely tokens' texts and log-probabilities.
    pub top_logprobs: Vec<BTreeMap<String, f64>>,
    /// For each token, the byte offset of its text in the choice's text.
    pub text_offset: Vec<usize>,
}

/// One choice of a completion.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct CompletionChoice {
    /// The choice's index (0 to `n - 1`).
    pub index: usize,
    /// The generated text.
    pub text: String,
    /// Log-probabilities, when `logprobs` was sent.
    #[schema(required = true)]
    pub logprobs: Option<CompletionLogprobs>,
    /// Why it ended.
    pub finish_reason: FinishReason,
}

/// The answer of `POST /v1/completions`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct CompletionResponse {
    /// The response id.
    pub id: String,
    /// `text_completion`.
    pub object: TextCompletionObject,
    /// Unix seconds when the response was created.
    pub created: u64,
    /// The served model name.
    pub model: String,
    /// The choices, in index order.
    pub choices: Vec<CompletionChoice>,
    /// Token counts.
    pub usage: Usage,
}

/// One choice's piece in a streamed completion chunk.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct CompletionChunkChoice {
    /// The choice's index.
    pub index: usize,
    /// Text that follows the choice's earlier pieces.
    pub text: String,
    /// Log-probabilities of this piece's tokens, when `logprobs` was sent.
    #[schema(required = true)]
    pub logprobs: Option<CompletionLogprobs>,
    /// Set on the choice's last piece.
    #[schema(required = true)]
    pub finish_reason: Option<FinishReason>,
}

/// One server-sent event of a streamed completion.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct CompletionChunk {
    /// The response id (the same in every chunk).
    pub id: String,
    /// `text_completion`.
    pub object: TextCompletionObject,
    /// Unix seconds when the response was created (the same in every chunk).
    pub created: u64,
    /// The served model name.
    pub model: String,
    /// One choice's piece; empty in the usage chunk.
    pub choices: Vec<CompletionChunkChoice>,
    /// Only in the last chunk, when `stream_options.include_usage` was sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// One of the most likely tokens at a position of a chat reply.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ChatTopLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f64,
    /// The UTF-8 bytes of its text.
    pub bytes: Vec<u8>,
}

/// One token of a chat reply and its log-probability.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ChatTokenLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f64,
    /// The UTF-8 bytes of its text.
    pub bytes: Vec<u8>,
    /// The most likely tokens at this position (`top_logprobs` of them).
    pub top_logprobs: Vec<ChatTopLogprob>,
}

/// Log-probabilities of a chat reply's tokens.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ChatLogprobs {
    /// One entry per token.
    pub content: Vec<ChatTokenLogprob>,
}

one_value_string!(
    /// The `type` of a tool call.
    FunctionKind::Function = "function"
);

/// The function a tool call calls.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct FunctionCall {
    /// One of the request's tools.
    pub name: String,
    /// Its arguments: a JSON object, as a string.
    pub arguments: String,
}

/// A tool call of a reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct ToolCall {
    /// The call's id; a `role: "tool"` message answers it with `tool_call_id`.
    pub id: String,
    /// `function`.
    #[serde(rename = "type")]
    pub kind: FunctionKind,
    /// The call.
    pub function: FunctionCall,
}

/// What a streamed chunk adds to a function call: the name in the call's first delta, then
/// pieces of the arguments text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct FunctionCallDelta {
    /// The function, in the call's first delta.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Text that follows the call's earlier argument pieces.
    pub arguments: String,
}

/// What a streamed chunk adds to one tool call of a choice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct ToolCallDelta {
    /// The call's index among the choice's calls.
    pub index: usize,
    /// The call's id, in its first delta.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `function`, in the call's first delta.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<FunctionKind>,
    /// The function's name and arguments text.
    pub function: FunctionCallDelta,
}

/// The generated message of a chat choice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct AssistantMessage {
    /// `assistant`.
    pub role: AssistantRole,
    /// The generated text; `null` when the reply is only tool calls.
    #[schema(required = true)]
    pub content: Option<String>,
    /// The tool calls of the reply; left out when it made none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

/// One choice of a chat completion.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ChatChoice {
    /// The choice's index (0 to `n - 1`).
    pub index: usize,
    /// The reply.
    pub message: AssistantMessage,
    /// Log-probabilities, when `logprobs` was true.
    #[schema(required = true)]
    pub logprobs: Option<ChatLogprobs>,
    /// Why it ended.
    pub finish_reason: FinishReason,
}

/// The answer of `POST /v1/chat/completions`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ChatCompletionResponse {
    /// The response id.
    pub id: String,
    /// `chat.completion`.
    pub object: ChatCompletionObject,
    /// Unix seconds when the response was created.
    pub created: u64,
    /// The served model name.
    pub model: String,
    /// The choices, in index order.
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    pub usage: Usage,
}

/// What a chat chunk adds to a choice's message: the role in the first chunk of each choice,
/// then text; both are left out when there is nothing to add (the last chunk of a choice may
/// carry only its finish reason).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, ToSchema)]
pub struct ChatDelta {
    /// `assistant`, in the choice's first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<AssistantRole>,
    /// Text that follows the choice's earlier pieces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Tool-call pieces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// One choice's piece in a streamed chat chunk.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ChatChunkChoice {
    /// The choice's index.
    pub index: usize,
    /// What this chunk adds to the message.
    pub delta: ChatDelta,
    /// Log-probabilities of this piece's tokens, when `logprobs` was true.
    #[schema(required = true)]
    pub logprobs: Option<ChatLogprobs>,
    /// Set on the choice's last piece.
    #[schema(required = true)]
    pub finish_reason: Option<FinishReason>,
}

/// One server-sent event of a streamed chat completion.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ChatCompletionChunk {
    /// The response id (the same in every chunk).
    pub id: String,
    /// `chat.completion.chunk`.
    pub object: ChatCompletionChunkObject,
    /// Unix seconds when the response was created (the same in every chunk).
    pub created: u64,
    /// The served model name.
    pub model: String,
    /// One choice's piece; empty in the usage chunk.
    pub choices: Vec<ChatChunkChoice>,
    /// Only in the last chunk, when `stream_options.include_usage` was sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// The served model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct ModelCard {
    /// The served model name.
    pub id: String,
    /// `model`.
    pub object: ModelObject,
    /// Unix seconds when the server started serving the model.
    pub created: u64,
    /// `tlaloc`.
    pub owned_by: String,
    /// The served model name.
    pub root: String,
    /// The longest context the model serves; `null` while it loads.
    #[schema(required = true)]
    pub max_model_len: Option<usize>,
}

/// The answer of `GET /v1/models`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct ModelList {
    /// `list`.
    pub object: ListObject,
    /// The one model this server serves.
    pub data: Vec<ModelCard>,
}

/// The answer of `POST /tokenize`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct TokenizeResponse {
    /// How many tokens.
    pub count: usize,
    /// The longest context the model serves; `null` while it loads.
    #[schema(required = true)]
    pub max_model_len: Option<usize>,
    /// The token ids.
    pub tokens: Vec<u32>,
}

/// The answer of `POST /detokenize`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct DetokenizeResponse {
    /// The text of the ids.
    pub prompt: String,
}

/// The answer of `GET /ready` once the model is loaded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, ToSchema)]
pub struct ReadyResponse {
    /// `ready`.
    pub status: ReadyStatus,
}

/// A server-sent event whose data is `body` as JSON.
pub fn json_event<T: Serialize>(body: &T) -> Event {
    // Every body here is plain data with string map keys, which JSON always represents.
    let json = serde_json::to_string(body).expect("a response body serializes to JSON");
    Event::default().data(json)
}
