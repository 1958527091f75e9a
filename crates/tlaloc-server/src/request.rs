//! The request bodies as they arrive: serde mirrors of the OpenAI fields this server reads,
//! with their OpenAPI schemas. Unknown fields are refused here (by name, through the JSON
//! extractor), and so is `null` where the OpenAI API has no use for it (`model`); every value is
//! checked once, in [`crate::validate`].

use serde::{Deserialize, Deserializer};
use utoipa::ToSchema;

/// Reads a field that may be left out but not sent as `null` (an `Option` field alone reads
/// both as `None`); used with `#[serde(default)]`.
fn non_null<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(deserializer).map(Some)
}

/// `prompt`: a string, a list of token ids, or a one-element list of either.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Prompt {
    /// Text.
    Text(String),
    /// Token ids.
    Ids(Vec<u32>),
    /// A batch of texts (only one is served per request).
    Texts(Vec<String>),
    /// A batch of token lists (only one is served per request).
    IdLists(Vec<Vec<u32>>),
}

/// `stop`: one string or several.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Stop {
    /// One.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    /// Send a last chunk with `usage`.
    #[serde(default)]
    pub include_usage: Option<bool>,
    /// Accepted for compatibility: usage is only sent in the last chunk.
    #[serde(default)]
    pub continuous_usage_stats: Option<bool>,
}

/// Passes the fields both generation endpoints share, written once, to `$callback`, after the
/// tokens in `{ ... }`.
macro_rules! with_shared_fields {
    ($callback:ident { $($before:tt)* }) => {
        $callback! {
            $($before)*
            /// Generated tokens at most (at least 1).
            max_tokens: Option<i64>,
            /// Sampling temperature in [0, 2] (0 is greedy; default 1).
            temperature: Option<f32>,
            /// Nucleus mass in (0, 1] (default 1).
            top_p: Option<f32>,
            /// Top-k: a count >= 1, or `-1` / `0` for no limit (the default).
            top_k: Option<i64>,
            /// Min-p in [0, 1] (default 0).
            min_p: Option<f32>,
            /// Seed of the sampler, non-negative; choice `i` draws with `seed + i`.
            seed: Option<i64>,
            /// Up to 16 stop strings, none empty; a choice's text ends before the first found.
            stop: Option<Stop>,
            /// Token ids that end a choice.
            stop_token_ids: Option<Vec<u32>>,
            /// Presence penalty in [-2, 2] (default 0).
            presence_penalty: Option<f32>,
            /// Frequency penalty in [-2, 2] (default 0).
            frequency_penalty: Option<f32>,
            /// Repetition penalty in (0, 10] (1, the default, is off).
            repetition_penalty: Option<f32>,
            /// Choices, 1 to 16 (default 1).
            n: Option<i64>,
            /// Answer with server-sent events, one chunk at a time.
            stream: Option<bool>,
            /// Only with `stream`.
            stream_options: Option<StreamOptions>,
            /// End-user id (accepted, not used).
            user: Option<String>,
            /// Keep generating past end-of-sequence tokens.
            ignore_eos: Option<bool>,
            /// Accepted only when it equals `n`.
            best_of: Option<i64>,
            /// Token id (as a string) to a bias in [-100, 100], added to its logit before
            /// sampling (greedy too).
            logit_bias: Option<serde_json::Map<String, serde_json::Value>>,
            /// `text`, `json_object`, or `json_schema` with a schema the output follows.
            response_format: Option<crate::structured::ResponseFormat>,
            /// vLLM's constraints: one of `json`, `regex`, `choice`, `grammar`, `json_object`.
            structured_outputs: Option<crate::structured::StructuredOutputs>,
        }
    };
}

macro_rules! shared_fields_struct {
    ($( $(#[$doc:meta])* $field:ident: $ty:ty, )*) => {
        /// Fields shared by both endpoints.
        #[derive(Debug, Clone, Default)]
        pub struct CommonFields {
            $( $(#[$doc])* pub $field: $ty, )*
        }
    };
}

with_shared_fields!(shared_fields_struct {});

/// Declares a request body with its own fields and the shared ones (serde's `flatten` cannot be
/// combined with `deny_unknown_fields`, and unknown fields are refused here). A shared field's
/// attributes are also put on [`CommonFields`], which has no serde derive, so a field that needs
/// serde attributes (`model`) is declared among each request's own fields.
macro_rules! request_struct {
    (
        $(#[$meta:meta])* $name:ident { $( $(#[$own_doc:meta])* $own:ident: $own_ty:ty, )* }
        $( $(#[$doc:meta])* $field:ident: $ty:ty, )*
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Deserialize, ToSchema)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $( $(#[$own_doc])* pub $own: $own_ty, )*
            $( $(#[$doc])* pub $field: $ty, )*
        }

        impl $name {
            /// The shared fields.
            pub fn common(&self) -> CommonFields {
                CommonFields { $( $field: self.$field.clone(), )* }
            }
        }
    };
}

with_shared_fields!(request_struct {
    /// `POST /v1/completions`.
    CompletionRequest {
        /// The prompt.
        #[schema(required = true, value_type = Prompt)]
        prompt: Option<Prompt>,
        /// Top log-probabilities per token, 0 to 20.
        logprobs: Option<i64>,
        /// Accepted only when false.
        echo: Option<bool>,
        /// Accepted only when absent.
        suffix: Option<String>,
        /// The served model name; any other is refused, and so is `null`.
        #[serde(default, deserialize_with = "non_null")]
        #[schema(value_type = String)]
        model: Option<String>,
    }
});

/// Message content: a string or a list of text parts.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Content {
    /// Text.
    Text(String),
    /// Parts (only `{"type": "text"}` is served).
    Parts(Vec<ContentPart>),
}

/// One part of a message's content.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct ContentPart {
    /// `text`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a text part.
    pub text: Option<String>,
}

/// One chat message.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool` (`developer` is read as `system`).
    pub role: String,
    /// The text; required of `system`, `developer`, `user` and `tool` messages.
    pub content: Option<Content>,
    /// Passed to the template (some use it for a tool message's function).
    pub name: Option<String>,
    /// An assistant turn's tool calls, passed back to the template.
    pub tool_calls: Option<Vec<crate::tools::MessageToolCall>>,
    /// The call a `tool` message answers (required of `tool` messages).
    pub tool_call_id: Option<String>,
}

with_shared_fields!(request_struct {
    /// `POST /v1/chat/completions`.
    ChatRequest {
        /// The conversation, at least one message.
        #[schema(required = true, value_type = Vec<ChatMessage>)]
        messages: Option<Vec<ChatMessage>>,
        /// The newer name of `max_tokens`.
        max_completion_tokens: Option<i64>,
        /// Return log-probabilities of the chosen tokens.
        logprobs: Option<bool>,
        /// Top log-probabilities per token, 0 to 20 (needs `logprobs`).
        top_logprobs: Option<i64>,
        /// End the rendered prompt with the assistant's turn opener (default true).
        add_generation_prompt: Option<bool>,
        /// Functions the model may call; the chat template receives them.
        tools: Option<Vec<crate::tools::Tool>>,
        /// `none`, `auto` (the default with tools; needs `--tool-call-parser`), `required`, or
        /// `{"type": "function", "function": {"name": ...}}`; `required` and a named function
        /// are enforced with a grammar.
        tool_choice: Option<crate::tools::ToolChoice>,
        /// Allow more than one call in a reply (default true).
        parallel_tool_calls: Option<bool>,
        /// The served model name; any other is refused, and so is `null`.
        #[serde(default, deserialize_with = "non_null")]
        #[schema(value_type = String)]
        model: Option<String>,
    }
});

/// `POST /tokenize`: a prompt or a conversation.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenizeRequest {
    /// The served model name; `null` is refused.
    #[serde(default, deserialize_with = "non_null")]
    #[schema(value_type = String)]
    pub model: Option<String>,
    /// Text to tokenize.
    pub prompt: Option<String>,
    /// A conversation to render with the chat template and tokenize.
    pub messages: Option<Vec<ChatMessage>>,
    /// Add the tokenizer's special tokens (default true for a prompt, false for messages).
    pub add_special_tokens: Option<bool>,
    /// For messages (default true).
    pub add_generation_prompt: Option<bool>,
}

/// `POST /detokenize`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DetokenizeRequest {
    /// The served model name; `null` is refused.
    #[serde(default, deserialize_with = "non_null")]
    #[schema(value_type = String)]
    pub model: Option<String>,
    /// Ids to turn into text.
    pub tokens: Vec<u32>,
}
