//! Every request body checked once, before anything reaches the engine: one `check` per
//! request type, each giving the validated form its handler runs, or a 400 that names the field
//! at fault. Fields this server cannot honour are refused by name rather than ignored.
//!
//! What only the engine knows (the context limit, the pool, the vocabulary of submitted ids) the
//! engine checks; a generation's validated form carries the names of the fields its refusals are
//! reported against, so they name the field the client sent.

use tlaloc_runtime::{EngineError, GenerateRequest, Refusal, SamplingParams, StopParams};

use crate::chat::TemplateMessage;
use crate::error::{ApiError, ErrorCode};
use crate::request::{
    ChatMessage, ChatRequest, CommonFields, CompletionRequest, Content, DetokenizeRequest, Prompt,
    Stop, TokenizeRequest,
};
use crate::state::AppState;
use crate::structured::{self, CompiledGrammar};
use crate::tools::{self, Tool, ToolChoice, ToolReply};

/// The most choices one request may ask for.
pub const MAX_N: u32 = 16;
/// The most top log-probabilities per token.
pub const MAX_TOP_LOGPROBS: u32 = 20;
/// The most stop strings.
pub const MAX_STOP_STRINGS: usize = 16;

/// The request fields an engine refusal is reported against (the generation endpoints spell
/// them differently).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefusalFields {
    /// Where the prompt's tokens came from: `prompt` or `messages`.
    pub prompt: &'static str,
    /// The token budget: `max_tokens`, or `max_completion_tokens` when a chat request sent it.
    pub max_tokens: &'static str,
}

impl RefusalFields {
    /// The API error for an engine error at submission: a refusal is a 400 naming its field.
    pub fn api_error(self, error: EngineError) -> ApiError {
        match error {
            EngineError::Refused(refusal) => {
                let param = match &refusal {
                    Refusal::EmptyPrompt
                    | Refusal::TokenOutOfVocabulary { .. }
                    | Refusal::SequenceBusy { .. } => self.prompt,
                    Refusal::ContextTooLong { .. }
                    | Refusal::PoolTooSmall { .. }
                    | Refusal::ZeroMaxTokens => self.max_tokens,
                    Refusal::Sampling(s) => s.field,
                    Refusal::TooManyLogprobs { .. } => "logprobs",
                    Refusal::BiasTokenOutOfVocabulary { .. } => "logit_bias",
                };
                let e = ApiError::invalid(param, refusal.to_string());
                match refusal {
                    Refusal::ContextTooLong { .. } => e.with_code(ErrorCode::ContextLengthExceeded),
                    _ => e,
                }
            }
            EngineError::Stopped => ApiError::not_ready("the engine is stopped"),
            other => ApiError::internal(other.to_string()),
        }
    }
}

/// A completion or chat completion request with every field checked: what the engine runs for
/// each choice, and how to answer.
#[derive(Debug, Clone)]
pub struct ValidatedGeneration {
    /// One engine request (cloned per choice, with its own seed).
    pub request: GenerateRequest,
    /// Choices.
    pub n: usize,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Answer with server-sent events.
    pub stream: bool,
    /// Send a usage chunk at the end of a stream.
    pub include_usage: bool,
    /// Where the engine's refusals of this request point.
    pub fields: RefusalFields,
    /// The grammar its output follows (`response_format`, `structured_outputs`, or the tools of
    /// `tool_choice` `required` or named).
    pub grammar: Option<CompiledGrammar>,
    /// How a chat reply is read into tool calls (`None`: it is all content).
    pub tools: Option<ToolReply>,
}

/// A `/tokenize` request, checked and tokenized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidatedTokenize {
    /// The prompt's or the rendered conversation's ids.
    pub tokens: Vec<u32>,
}

/// A `/detokenize` request whose ids are all in the vocabulary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidatedDetokenize {
    /// Ids to decode.
    pub tokens: Vec<u32>,
}

impl CompletionRequest {
    /// Checks every field and tokenizes the prompt.
    pub fn check(self, state: &AppState) -> Result<ValidatedGeneration, ApiError> {
        let common = self.common();
        check_model(state, self.model.as_deref())?;
        if self.echo == Some(true) {
            return Err(ApiError::invalid(
                "echo",
                "`echo` = true refused: it is not served",
            ));
        }
        if self.suffix.is_some() {
            return Err(ApiError::invalid(
                "suffix",
                "`suffix` refused: it is not served",
            ));
        }
        let logprobs = check_top_logprobs("logprobs", self.logprobs)?;
        let prompt_ids = prompt_ids(state, self.prompt)?;
        let fields = RefusalFields {
            prompt: "prompt",
            max_tokens: "max_tokens",
        };
        let mut validated = common.check(common.max_tokens, logprobs, prompt_ids, fields)?;
        validated.grammar = grammar(state, &common)?;
        Ok(validated)
    }
}

impl ChatRequest {
    /// Checks every field, renders the conversation with the chat template and tokenizes it.
    pub fn check(self, state: &AppState) -> Result<ValidatedGeneration, ApiError> {
        let common = self.common();
        check_model(state, self.model.as_deref())?;
        let logprobs = match (self.logprobs, self.top_logprobs) {
            (Some(true), top) => Some(check_top_logprobs("top_logprobs", top)?.unwrap_or(0)),
            (_, Some(_)) => {
                return Err(ApiError::invalid(
                    "top_logprobs",
                    "`top_logprobs` refused without `logprobs`: true",
                ));
            }
            _ => None,
        };
        let plan = tool_plan(
            state,
            self.tools.as_deref(),
            self.tool_choice.as_ref(),
            self.parallel_tool_calls,
        )?;
        let text = render_messages(
            state,
            self.messages.as_deref(),
            plan.template_tools.as_deref(),
            self.add_generation_prompt.unwrap_or(true),
        )?;
        let prompt_ids = state
            .text
            .codec
            .encode(&text, false)
            .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
        let (max_tokens, max_field) = match self.max_completion_tokens {
            Some(m) => (Some(m), "max_completion_tokens"),
            None => (common.max_tokens, "max_tokens"),
        };
        let fields = RefusalFields {
            prompt: "messages",
            max_tokens: max_field,
        };
        let mut validated = common.check(max_tokens, logprobs, prompt_ids, fields)?;
        validated.grammar = grammar(state, &common)?;
        if let Some(specs) = plan.grammar {
            if validated.grammar.is_some() {
                return Err(ApiError::invalid(
                    "tool_choice",
                    "`tool_choice` `required` or a named function refused together with \
                     `response_format` or `structured_outputs`: the tool call is the reply's format",
                ));
            }
            let shape = state.ready_engine()?.shape();
            let mut compiled = None;
            for spec in &specs {
                compiled = Some(state.grammars.compile(
                    spec,
                    shape.vocab_size,
                    &shape.eos_token_ids,
                )?);
            }
            validated.grammar = compiled;
        }
        validated.tools = plan.reply;
        Ok(validated)
    }
}

/// What a chat request's tool fields ask for.
#[derive(Debug, Default)]
struct ToolPlan {
    /// `tools` as the template receives them.
    template_tools: Option<Vec<serde_json::Value>>,
    /// How the reply is read.
    reply: Option<ToolReply>,
    /// Grammars to compile, in order: each enforced tool's parameters alone (so that a schema
    /// llguidance refuses is named by its tool), then the reply's; the last one constrains.
    grammar: Option<Vec<(String, String)>>,
}

fn tool_plan(
    state: &AppState,
    tools: Option<&[Tool]>,
    choice: Option<&ToolChoice>,
    parallel: Option<bool>,
) -> Result<ToolPlan, ApiError> {
    let Some(tools) = tools else {
        if choice.is_some() {
            return Err(ApiError::invalid(
                "tool_choice",
                "`tool_choice` refused without `tools`: declare the functions it may call in `tools`",
            ));
        }
        return Ok(ToolPlan::default());
    };
    if tools.is_empty() {
        return Err(ApiError::invalid(
            "tools",
            "an empty `tools` list refused: declare at least one function, or leave `tools` out",
        ));
    }
    let mut declared: Vec<(String, serde_json::Value)> = Vec::with_capacity(tools.len());
    let mut template_tools = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        if tool.kind != "function" {
            return Err(ApiError::invalid(
                format!("tools[{i}].type"),
                format!(
                    "tool type `{}` refused: only `function` tools are served",
                    tool.kind
                ),
            ));
        }
        let Some(function) = &tool.function else {
            return Err(ApiError::invalid(
                format!("tools[{i}].function"),
                "a function tool without `function` refused: send its name and parameters",
            ));
        };
        tools::check_function_name(&format!("tools[{i}].function.name"), &function.name)?;
        if declared.iter().any(|(n, _)| *n == function.name) {
            return Err(ApiError::invalid(
                format!("tools[{i}].function.name"),
                format!(
                    "function `{}` refused: declared twice; each tool needs its own name",
                    function.name
                ),
            ));
        }
        let parameters = match &function.parameters {
            None => tools::no_parameters(),
            Some(p) if p.is_object() => p.clone(),
            Some(_) => {
                return Err(ApiError::invalid(
                    format!("tools[{i}].function.parameters"),
                    "`parameters` refused: a JSON schema object",
                ));
            }
        };
        let mut function_json = serde_json::Map::new();
        function_json.insert("name".into(), function.name.clone().into());
        if let Some(d) = &function.description {
            function_json.insert("description".into(), d.clone().into());
        }
        if let Some(p) = &function.parameters {
            function_json.insert("parameters".into(), p.clone());
        }
        template_tools.push(serde_json::json!({"type": "function", "function": function_json}));
        declared.push((function.name.clone(), parameters));
    }
    let parallel = parallel.unwrap_or(true);
    let parameters_spec = |i: usize| {
        (
            format!("tools[{i}].function.parameters"),
            format!("json:{}", declared[i].1),
        )
    };
    let (reply, grammar) = match choice {
        None => (auto_reply(state, parallel)?, None),
        Some(ToolChoice::Mode(mode)) => match mode.as_str() {
            "none" => (None, None),
            "auto" => (auto_reply(state, parallel)?, None),
            "required" => {
                let mut specs: Vec<_> = (0..declared.len()).map(parameters_spec).collect();
                specs.push((
                    "tools".to_owned(),
                    format!("json:{}", tools::required_schema(&declared, parallel)),
                ));
                (Some(ToolReply::Required { parallel }), Some(specs))
            }
            other => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!(
                        "`tool_choice` = `{other}` refused: `none`, `auto`, `required`, or \
                         {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"
                    ),
                ));
            }
        },
        Some(ToolChoice::Named(named)) => {
            if named.kind != "function" {
                return Err(ApiError::invalid(
                    "tool_choice.type",
                    format!(
                        "`tool_choice.type` `{}` refused: only `function` is served",
                        named.kind
                    ),
                ));
            }
            let name = &named.function.name;
            let Some(i) = declared.iter().position(|(n, _)| n == name) else {
                let names: Vec<&str> = declared.iter().map(|(n, _)| n.as_str()).collect();
                return Err(ApiError::invalid(
                    "tool_choice.function.name",
                    format!(
                        "`tool_choice` names `{name}`, which is not among `tools`: {}",
                        names.join(", ")
                    ),
                ));
            };
            (
                Some(ToolReply::Named { name: name.clone() }),
                Some(vec![parameters_spec(i)]),
            )
        }
    };
    Ok(ToolPlan {
        template_tools: Some(template_tools),
        reply,
        grammar,
    })
}

/// `tool_choice` `auto` reads the reply with the server's parser; without one it is refused.
fn auto_reply(state: &AppState, parallel: bool) -> Result<Option<ToolReply>, ApiError> {
    match state.config.tool_call_parser {
        Some(parser) => Ok(Some(ToolReply::Auto { parser, parallel })),
        None => Err(ApiError::invalid(
            "tool_choice",
            format!(
                "`tool_choice` `auto` (the default when `tools` are sent) refused: this server \
                 reads no tool-call format; start it with `--tool-call-parser` ({}), or send \
                 `tool_choice` `required`, a named function, or `none`",
                tools::ToolCallParser::NAMES
            ),
        )),
    }
}

impl TokenizeRequest {
    /// Checks the fields and tokenizes the prompt, or the conversation rendered with the chat
    /// template.
    pub fn check(self, state: &AppState) -> Result<ValidatedTokenize, ApiError> {
        check_model(state, self.model.as_deref())?;
        let (text, add_special) = match (&self.prompt, &self.messages) {
            (Some(p), None) => (p.clone(), self.add_special_tokens.unwrap_or(true)),
            (None, Some(m)) => (
                render_messages(
                    state,
                    Some(m),
                    None,
                    self.add_generation_prompt.unwrap_or(true),
                )?,
                self.add_special_tokens.unwrap_or(false),
            ),
            _ => {
                return Err(ApiError::invalid(
                    "prompt",
                    "send exactly one of `prompt` and `messages`",
                ));
            }
        };
        let tokens = state
            .text
            .codec
            .encode(&text, add_special)
            .map_err(|e| ApiError::invalid("prompt", e.to_string()))?;
        Ok(ValidatedTokenize { tokens })
    }
}

impl DetokenizeRequest {
    /// Checks the model and that every id is in the vocabulary.
    pub fn check(self, state: &AppState) -> Result<ValidatedDetokenize, ApiError> {
        check_model(state, self.model.as_deref())?;
        let vocab = state.text.codec.vocab_size();
        if let Some((i, t)) = self
            .tokens
            .iter()
            .enumerate()
            .find(|(_, t)| **t as usize >= vocab)
        {
            return Err(ApiError::invalid(
                format!("tokens[{i}]"),
                format!("token id {t} refused: the vocabulary has ids 0..{vocab}"),
            ));
        }
        Ok(ValidatedDetokenize {
            tokens: self.tokens,
        })
    }
}

/// The grammar `response_format` or `structured_outputs` asks for, compiled (or taken from the
/// cache) for the served vocabulary.
fn grammar(state: &AppState, common: &CommonFields) -> Result<Option<CompiledGrammar>, ApiError> {
    let Some(spec) = structured::requested(
        common.response_format.as_ref(),
        common.structured_outputs.as_ref(),
    )?
    else {
        return Ok(None);
    };
    let shape = state.ready_engine()?.shape();
    state
        .grammars
        .compile(&spec, shape.vocab_size, &shape.eos_token_ids)
        .map(Some)
}

fn check_model(state: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    let served = &state.config.served_model_name;
    match model {
        None => Ok(()),
        Some(m) if m == served => Ok(()),
        Some(m) => Err(ApiError::invalid(
            "model",
            format!("model `{m}` refused: this server serves only `{served}`"),
        )
        .with_code(ErrorCode::ModelNotFound)),
    }
}

fn check_top_logprobs(field: &str, value: Option<i64>) -> Result<Option<usize>, ApiError> {
    match value {
        None => Ok(None),
        Some(k) if (0..=MAX_TOP_LOGPROBS as i64).contains(&k) => Ok(Some(k as usize)),
        Some(k) => Err(ApiError::invalid(
            field,
            format!("`{field}` = {k} refused: a count from 0 to {MAX_TOP_LOGPROBS}"),
        )),
    }
}

fn prompt_ids(state: &AppState, prompt: Option<Prompt>) -> Result<Vec<u32>, ApiError> {
    let one = |n: usize| {
        ApiError::invalid(
            "prompt",
            format!("a batch of {n} prompts refused: send one prompt per request"),
        )
    };
    let text = match prompt {
        None => return Err(ApiError::invalid("prompt", "`prompt` is required")),
        Some(Prompt::Text(t)) => t,
        Some(Prompt::Ids(ids)) => return Ok(ids),
        Some(Prompt::Texts(mut v)) if v.len() == 1 => v.remove(0),
        Some(Prompt::Texts(v)) => return Err(one(v.len())),
        Some(Prompt::IdLists(mut v)) if v.len() == 1 => return Ok(v.remove(0)),
        Some(Prompt::IdLists(v)) => return Err(one(v.len())),
    };
    state
        .text
        .codec
        .encode(&text, true)
        .map_err(|e| ApiError::invalid("prompt", e.to_string()))
}

/// The conversation rendered with the model's chat template.
fn render_messages(
    state: &AppState,
    messages: Option<&[ChatMessage]>,
    tools: Option<&[serde_json::Value]>,
    add_generation_prompt: bool,
) -> Result<String, ApiError> {
    let template = state.text.chat.as_ref().ok_or_else(|| {
        ApiError::invalid(
            "messages",
            "chat refused: this model's artifact carries no chat template; use /v1/completions",
        )
    })?;
    let messages =
        messages.ok_or_else(|| ApiError::invalid("messages", "`messages` is required"))?;
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "an empty `messages` list refused: send at least one message",
        ));
    }
    let mut rendered = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let role = match m.role.as_str() {
            "system" | "developer" => "system",
            "user" => "user",
            "assistant" => "assistant",
            "tool" => "tool",
            other => {
                return Err(ApiError::invalid(
                    format!("messages[{i}].role"),
                    format!("role `{other}` refused: system, developer, user, assistant or tool"),
                ));
            }
        };
        if role == "tool" && m.tool_call_id.is_none() {
            return Err(ApiError::invalid(
                format!("messages[{i}].tool_call_id"),
                "a `tool` message without `tool_call_id` refused: send the id of the call it answers",
            ));
        }
        let tool_calls = match &m.tool_calls {
            None => None,
            Some(_) if role != "assistant" => {
                return Err(ApiError::invalid(
                    format!("messages[{i}].tool_calls"),
                    format!(
                        "`tool_calls` on a `{}` message refused: only assistant turns make calls",
                        m.role
                    ),
                ));
            }
            Some(calls) => Some(template_tool_calls(i, calls)?),
        };
        let content = match &m.content {
            // An assistant turn may be empty; a system or user turn without text is a mistake.
            None if role == "assistant" => String::new(),
            None => {
                return Err(ApiError::invalid(
                    format!("messages[{i}].content"),
                    format!(
                        "a `{}` message without `content` refused: send a string or a list of text parts",
                        m.role
                    ),
                ));
            }
            Some(Content::Text(t)) => t.clone(),
            Some(Content::Parts(parts)) => {
                let mut text = String::new();
                for (j, p) in parts.iter().enumerate() {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => text.push_str(t),
                        (kind, _) => {
                            return Err(ApiError::invalid(
                                format!("messages[{i}].content[{j}]"),
                                format!(
                                    "content part of type `{kind}` refused: only text parts with a `text` field are served"
                                ),
                            ));
                        }
                    }
                }
                text
            }
        };
        rendered.push(TemplateMessage {
            role: role.to_owned(),
            content,
            name: m.name.clone(),
            tool_calls,
            tool_call_id: m.tool_call_id.clone(),
        });
    }
    template
        .render(&rendered, tools, add_generation_prompt)
        .map_err(|e| ApiError::invalid("messages", e.to_string()))
}

/// An assistant turn's calls as templates read them: the arguments string parsed into the
/// object it holds (as vLLM passes them; templates print them with `tojson`).
fn template_tool_calls(
    i: usize,
    calls: &[tools::MessageToolCall],
) -> Result<Vec<serde_json::Value>, ApiError> {
    calls
        .iter()
        .enumerate()
        .map(|(j, call)| {
            if let Some(kind) = call.kind.as_deref()
                && kind != "function"
            {
                return Err(ApiError::invalid(
                    format!("messages[{i}].tool_calls[{j}].type"),
                    format!("tool call type `{kind}` refused: only `function` calls are served"),
                ));
            }
            let field = format!("messages[{i}].tool_calls[{j}].function.arguments");
            let arguments: serde_json::Value = serde_json::from_str(&call.function.arguments)
                .map_err(|e| {
                    ApiError::invalid(
                        field.clone(),
                        format!("`{field}` refused: not a JSON object as text: {e}"),
                    )
                })?;
            if !arguments.is_object() {
                return Err(ApiError::invalid(
                    field.clone(),
                    format!("`{field}` refused: a JSON object as text"),
                ));
            }
            Ok(serde_json::json!({
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": arguments},
            }))
        })
        .collect()
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
    /// Checks the budget, sampling, stop and streaming fields both generation endpoints share;
    /// the budget and the log-probability count come from the endpoint, which spells them its
    /// own way.
    fn check(
        &self,
        max_tokens: Option<i64>,
        logprobs: Option<usize>,
        prompt_ids: Vec<u32>,
        fields: RefusalFields,
    ) -> Result<ValidatedGeneration, ApiError> {
        let max_field = fields.max_tokens;
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
        let logit_bias = check_logit_bias(self.logit_bias.as_ref())?;
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
        Ok(ValidatedGeneration {
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
                    logit_bias,
                },
                stop: StopParams {
                    stop_token_ids: self.stop_token_ids.clone().unwrap_or_default(),
                },
                max_tokens,
                logprobs,
                ignore_eos: self.ignore_eos.unwrap_or(false),
                sequence: None,
                constraint: None,
            },
            n,
            stop,
            stream,
            include_usage,
            fields,
            grammar: None,
            tools: None,
        })
    }
}

/// `logit_bias`: token ids as decimal strings, each to a number in [-100, 100] (the engine
/// checks the ids against the vocabulary).
fn check_logit_bias(
    bias: Option<&serde_json::Map<String, serde_json::Value>>,
) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(bias) = bias else {
        return Ok(Vec::new());
    };
    bias.iter()
        .map(|(key, value)| {
            let token: u32 = key.parse().map_err(|_| {
                ApiError::invalid(
                    "logit_bias",
                    format!("`logit_bias` key `{key}` refused: keys are token ids (decimal integers)"),
                )
            })?;
            match value.as_f64() {
                Some(b) if (-100.0..=100.0).contains(&b) => Ok((token, b as f32)),
                _ => Err(ApiError::invalid(
                    "logit_bias",
                    format!("`logit_bias` value {value} for token {token} refused: a number in [-100, 100]"),
                )),
            }
        })
        .collect()
}
