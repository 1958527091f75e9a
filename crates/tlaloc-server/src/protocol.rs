//! The OpenAI request bodies as they arrive (serde mirrors), and their checked form: every
//! field validated once, with errors that name the field, before anything reaches the engine.
//! Fields this server cannot honour are refused by name rather than ignored.

use serde::Deserialize;
use tlaloc_runtime::{GenerateRequest, SamplingParams, StopParams};

use crate::error::ApiError;

/// The most choices one request may ask for.
pub const MAX_N: u32 = 16;
/// The most top log-probabilities per token.
pub const MAX_TOP_LOGPROBS: u32 = 20;
/// The most stop strings.
pub const MAX_STOP_STRINGS: usize = 16;

/// `prompt`: a string, a list of token ids, or a one-element list of either.
#[derive(Debug, Clone, Deserialize)]
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
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
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
            /// The served model name.
            model: Option<String>,
            /// Generated tokens at most.
            max_tokens: Option<i64>,
            /// Sampling temperature (0 is greedy).
            temperature: Option<f32>,
            /// Nucleus mass.
            top_p: Option<f32>,
            /// Top-k (`-1` or `0`: off).
            top_k: Option<i64>,
            /// Min-p.
            min_p: Option<f32>,
            /// Seed of the sampler.
            seed: Option<i64>,
            /// Stop strings.
            stop: Option<Stop>,
            /// Stop token ids.
            stop_token_ids: Option<Vec<u32>>,
            /// Presence penalty.
            presence_penalty: Option<f32>,
            /// Frequency penalty.
            frequency_penalty: Option<f32>,
            /// Repetition penalty.
            repetition_penalty: Option<f32>,
            /// Choices.
            n: Option<i64>,
            /// Stream with SSE.
            stream: Option<bool>,
            /// Stream options.
            stream_options: Option<StreamOptions>,
            /// End-user id (logged, not used).
            user: Option<String>,
            /// Keep going past end-of-sequence tokens.
            ignore_eos: Option<bool>,
            /// Accepted only when it equals `n`.
            best_of: Option<i64>,
            /// Accepted only when empty.
            logit_bias: Option<serde_json::Map<String, serde_json::Value>>,
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
/// combined with `deny_unknown_fields`, and unknown fields are refused here).
macro_rules! request_struct {
    (
        $(#[$meta:meta])* $name:ident { $( $(#[$own_doc:meta])* $own:ident: $own_ty:ty, )* }
        $( $(#[$doc:meta])* $field:ident: $ty:ty, )*
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Deserialize)]
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
        prompt: Option<Prompt>,
        /// Top log-probabilities per token (0..=20).
        logprobs: Option<i64>,
        /// Accepted only when false.
        echo: Option<bool>,
        /// Accepted only when absent.
        suffix: Option<String>,
    }
});

/// Message content: a string or a list of text parts.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Text.
    Text(String),
    /// Parts (only `{"type": "text"}` is served).
    Parts(Vec<ContentPart>),
}

/// One part of a message's content.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    /// `text`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a text part.
    pub text: Option<String>,
}

/// One chat message.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` (`developer` is read as `system`).
    pub role: String,
    /// The text.
    pub content: Option<Content>,
    /// Accepted and ignored (the templates here do not use it).
    pub name: Option<String>,
}

with_shared_fields!(request_struct {
    /// `POST /v1/chat/completions`.
    ChatRequest {
        /// The conversation.
        messages: Option<Vec<ChatMessage>>,
        /// The newer name of `max_tokens`.
        max_completion_tokens: Option<i64>,
        /// Return log-probabilities of the chosen tokens.
        logprobs: Option<bool>,
        /// Top log-probabilities per token (needs `logprobs`).
        top_logprobs: Option<i64>,
        /// End the rendered prompt with the assistant's turn opener (default true).
        add_generation_prompt: Option<bool>,
    }
});

/// `POST /tokenize`: a prompt or a conversation.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizeRequest {
    /// The served model name.
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
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetokenizeRequest {
    /// The served model name.
    pub model: Option<String>,
    /// Ids to turn into text.
    pub tokens: Vec<u32>,
}

/// Everything the generation loop needs, checked.
#[derive(Debug, Clone)]
pub struct Checked {
    /// One engine request (cloned per choice, with its own seed).
    pub request: GenerateRequest,
    /// Choices.
    pub n: usize,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Stream.
    pub stream: bool,
    /// Send a usage chunk at the end of a stream.
    pub include_usage: bool,
}

fn range_f32(
    field: &str,
    value: Option<f32>,
    default: f32,
    ok: impl Fn(f32) -> bool,
    accepted: &str,
) -> Result<f32, ApiError> {
    match value {
        None => Ok(default),
        Some(v) if v.is_finite() && ok(v) => Ok(v),
        Some(v) => Err(ApiError::invalid(
            field,
            format!("`{field}` = {v} refused: {accepted}"),
        )),
    }
}

impl CommonFields {
    /// Checks the sampling, stop and streaming fields; `max_tokens` and `logprobs` come from
    /// the endpoint (they are spelled differently in each).
    pub fn check(
        &self,
        max_tokens: (Option<i64>, &str),
        logprobs: Option<usize>,
        prompt_ids: Vec<u32>,
    ) -> Result<Checked, ApiError> {
        let (max_tokens, max_field) = max_tokens;
        let max_tokens = match max_tokens {
            None => None,
            Some(m) if m >= 1 => Some(m as usize),
            Some(m) => {
                return Err(ApiError::invalid(
                    max_field,
                    format!("`{max_field}` = {m} refused: ask for at least 1 token"),
                ));
            }
        };
        let n = match self.n {
            None => 1,
            Some(n) if (1..=MAX_N as i64).contains(&n) => n as usize,
            Some(n) => {
                return Err(ApiError::invalid(
                    "n",
                    format!("`n` = {n} refused: a count from 1 to {MAX_N}"),
                ));
            }
        };
        if let Some(b) = self.best_of
            && b != n as i64
        {
            return Err(ApiError::invalid(
                "best_of",
                format!("`best_of` = {b} refused: only best_of equal to n ({n}) is served"),
            ));
        }
        if self.logit_bias.as_ref().is_some_and(|b| !b.is_empty()) {
            return Err(ApiError::invalid(
                "logit_bias",
                "`logit_bias` refused: it is not served; send it empty or leave it out",
            ));
        }
        let temperature = range_f32(
            "temperature",
            self.temperature,
            1.0,
            |v| (0.0..=2.0).contains(&v),
            "a number in [0, 2] (0 is greedy)",
        )?;
        let top_p = range_f32(
            "top_p",
            self.top_p,
            1.0,
            |v| v > 0.0 && v <= 1.0,
            "a number in (0, 1]",
        )?;
        let min_p = range_f32(
            "min_p",
            self.min_p,
            0.0,
            |v| (0.0..=1.0).contains(&v),
            "a number in [0, 1]",
        )?;
        let penalty = |field, value| {
            range_f32(
                field,
                value,
                0.0,
                |v| (-2.0..=2.0).contains(&v),
                "a number in [-2, 2]",
            )
        };
        let presence_penalty = penalty("presence_penalty", self.presence_penalty)?;
        let frequency_penalty = penalty("frequency_penalty", self.frequency_penalty)?;
        let repetition_penalty = range_f32(
            "repetition_penalty",
            self.repetition_penalty,
            1.0,
            |v| v > 0.0 && v <= 10.0,
            "a number in (0, 10] (1 is off)",
        )?;
        let top_k = match self.top_k {
            None | Some(-1) | Some(0) => None,
            Some(k) if k >= 1 => Some(k as usize),
            Some(k) => {
                return Err(ApiError::invalid(
                    "top_k",
                    format!("`top_k` = {k} refused: a count >= 1, or -1 / 0 for no limit"),
                ));
            }
        };
        let seed = match self.seed {
            None => None,
            Some(s) if s >= 0 => Some(s as u64),
            Some(s) => {
                return Err(ApiError::invalid(
                    "seed",
                    format!("`seed` = {s} refused: a non-negative integer"),
                ));
            }
        };
        let stop = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stop.len() > MAX_STOP_STRINGS {
            return Err(ApiError::invalid(
                "stop",
                format!(
                    "{} stop strings refused: at most {MAX_STOP_STRINGS}",
                    stop.len()
                ),
            ));
        }
        if stop.iter().any(|s| s.is_empty()) {
            return Err(ApiError::invalid(
                "stop",
                "an empty stop string refused: every stop string needs at least one character",
            ));
        }
        let stream = self.stream.unwrap_or(false);
        if self.stream_options.is_some() && !stream {
            return Err(ApiError::invalid(
                "stream_options",
                "`stream_options` refused: it only applies when `stream` is true",
            ));
        }
        let include_usage = self
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        Ok(Checked {
            request: GenerateRequest {
                prompt_ids,
                sampling: SamplingParams {
                    temperature,
                    top_k,
                    top_p,
                    min_p,
                    seed,
                    repetition_penalty,
                    presence_penalty,
                    frequency_penalty,
                },
                stop: StopParams {
                    stop_token_ids: self.stop_token_ids.clone().unwrap_or_default(),
                },
                max_tokens,
                logprobs,
                ignore_eos: self.ignore_eos.unwrap_or(false),
                sequence: None,
            },
            n,
            stop,
            stream,
            include_usage,
        })
    }
}

/// Checks a top-logprobs count.
pub fn check_top_logprobs(field: &str, value: Option<i64>) -> Result<Option<usize>, ApiError> {
    match value {
        None => Ok(None),
        Some(k) if (0..=MAX_TOP_LOGPROBS as i64).contains(&k) => Ok(Some(k as usize)),
        Some(k) => Err(ApiError::invalid(
            field,
            format!("`{field}` = {k} refused: a count from 0 to {MAX_TOP_LOGPROBS}"),
        )),
    }
}
