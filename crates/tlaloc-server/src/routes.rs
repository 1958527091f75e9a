//! The HTTP surface: the router, the JSON extractor that turns every body problem into a named
//! 400 (or 413), the API-key check, and the handlers, which check a request, start a
//! [`Generation`] and render its pieces as one JSON response or as an SSE stream.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream::{self, Stream};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use subtle::ConstantTimeEq;

use crate::chat::TemplateMessage;
use crate::error::ApiError;
use crate::generate::{Generation, Piece, TokenLogprob};
use crate::protocol::{
    ChatMessage, ChatRequest, Checked, CompletionRequest, Content, DetokenizeRequest, Prompt,
    TokenizeRequest, check_top_logprobs,
};
use crate::state::SharedState;

/// The router over `state`.
pub fn router(state: SharedState) -> Router {
    let protected = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_api_key,
        ));
    Router::new()
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .merge(protected)
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_refusals,
        ))
        .layer(DefaultBodyLimit::max(state.config.max_body_bytes))
        .with_state(state)
}

/// A JSON body whose every problem is an OpenAI-style error naming the field.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<SharedState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &SharedState) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!(
                        "request body refused: over the limit of {} bytes",
                        state.config.max_body_bytes
                    ),
                )
            } else {
                ApiError::invalid(
                    "body",
                    format!("request body unreadable: {}", e.body_text()),
                )
            }
        })?;
        if bytes.trim_ascii_start().first() != Some(&b'{') {
            return Err(ApiError::invalid(
                "body",
                "malformed JSON body: the request body must be a JSON object",
            ));
        }
        let de = &mut serde_json::Deserializer::from_slice(&bytes);
        serde_path_to_error::deserialize(de)
            .map(ApiJson)
            .map_err(|e| {
                let path = e.path().to_string();
                let inner = e.into_inner();
                let message = inner.to_string();
                if inner.is_syntax() || inner.is_eof() {
                    return ApiError::invalid("body", format!("malformed JSON body: {message}"));
                }
                let named = message
                    .strip_prefix("unknown field `")
                    .or_else(|| message.strip_prefix("missing field `"))
                    .and_then(|rest| rest.split('`').next())
                    .map(str::to_owned);
                let param = match named {
                    Some(field) if path == "." => field,
                    Some(field) if !path.ends_with(field.as_str()) => format!("{path}.{field}"),
                    _ => path,
                };
                ApiError::invalid(param.clone(), format!("field `{param}` refused: {message}"))
            })
    }
}

async fn require_api_key(State(state): State<SharedState>, req: Request, next: Next) -> Response {
    if let Some(key) = &state.config.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        if !bool::from(given.as_bytes().ct_eq(key.as_bytes())) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

async fn count_refusals(State(state): State<SharedState>, req: Request, next: Next) -> Response {
    let response = next.run(req).await;
    let status = response.status();
    if status.is_client_error() || status.is_server_error() {
        state.metrics.observe_rejected(status.as_u16());
    }
    response
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no such route; the server serves /v1/completions, /v1/chat/completions, /v1/models, /tokenize, /detokenize, /health, /ready, /metrics",
    )
}

async fn ready(State(state): State<SharedState>) -> Response {
    match state.ready_engine() {
        Ok(_) => Json(json!({"status": "ready"})).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn metrics(State(state): State<SharedState>) -> Response {
    let text = state.metrics.render(state.engine().map(|e| e.stats()));
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

async fn models(State(state): State<SharedState>) -> Json<Value> {
    let name = &state.config.served_model_name;
    Json(json!({
        "object": "list",
        "data": [{
            "id": name,
            "object": "model",
            "created": state.created,
            "owned_by": "tlaloc",
            "root": name,
            "max_model_len": state.engine().map(|e| e.max_context()),
        }],
    }))
}

fn check_model(state: &SharedState, model: Option<&str>) -> Result<(), ApiError> {
    let served = &state.config.served_model_name;
    match model {
        None => Ok(()),
        Some(m) if m == served => Ok(()),
        Some(m) => Err(ApiError::invalid(
            "model",
            format!("model `{m}` refused: this server serves only `{served}`"),
        )
        .with_code("model_not_found")),
    }
}

fn prompt_ids(state: &SharedState, prompt: Option<Prompt>) -> Result<Vec<u32>, ApiError> {
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

fn render_messages(
    state: &SharedState,
    messages: Option<&[ChatMessage]>,
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
            other => {
                return Err(ApiError::invalid(
                    format!("messages[{i}].role"),
                    format!("role `{other}` refused: system, developer, user or assistant"),
                ));
            }
        };
        let content = match &m.content {
            None => String::new(),
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
        });
    }
    template
        .render(&rendered, add_generation_prompt)
        .map_err(|e| ApiError::invalid("messages", e.to_string()))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Completion,
    Chat,
}

async fn completions(
    State(state): State<SharedState>,
    ApiJson(req): ApiJson<CompletionRequest>,
) -> Result<Response, ApiError> {
    let engine = state.ready_engine()?.clone();
    let common = req.common();
    check_model(&state, common.model.as_deref())?;
    if req.echo == Some(true) {
        return Err(ApiError::invalid(
            "echo",
            "`echo` = true refused: it is not served",
        ));
    }
    if req.suffix.is_some() {
        return Err(ApiError::invalid(
            "suffix",
            "`suffix` refused: it is not served",
        ));
    }
    let logprobs = check_top_logprobs("logprobs", req.logprobs)?;
    let ids = prompt_ids(&state, req.prompt)?;
    let checked = common.check((common.max_tokens, "max_tokens"), logprobs, ids)?;
    let id = state.next_request_id("cmpl");
    let generation = Generation::start(&state, &engine, &checked, id, ("prompt", "max_tokens"))?;
    respond(state, generation, &checked, Endpoint::Completion).await
}

async fn chat_completions(
    State(state): State<SharedState>,
    ApiJson(req): ApiJson<ChatRequest>,
) -> Result<Response, ApiError> {
    let engine = state.ready_engine()?.clone();
    let common = req.common();
    check_model(&state, common.model.as_deref())?;
    let logprobs = match (req.logprobs, req.top_logprobs) {
        (Some(true), top) => Some(check_top_logprobs("top_logprobs", top)?.unwrap_or(0)),
        (_, Some(_)) => {
            return Err(ApiError::invalid(
                "top_logprobs",
                "`top_logprobs` refused without `logprobs`: true",
            ));
        }
        _ => None,
    };
    let text = render_messages(
        &state,
        req.messages.as_deref(),
        req.add_generation_prompt.unwrap_or(true),
    )?;
    let ids = state
        .text
        .codec
        .encode(&text, false)
        .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
    let max = match req.max_completion_tokens {
        Some(m) => (Some(m), "max_completion_tokens"),
        None => (common.max_tokens, "max_tokens"),
    };
    let checked = common.check(max, logprobs, ids)?;
    let id = state.next_request_id("chatcmpl");
    let generation = Generation::start(&state, &engine, &checked, id, ("messages", max.1))?;
    respond(state, generation, &checked, Endpoint::Chat).await
}

fn usage_json(prompt_tokens: usize, completion_tokens: usize) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    })
}

fn token_text(state: &SharedState, id: u32) -> String {
    state.text.codec.decode(&[id], false).unwrap_or_default()
}

/// Log-probabilities in the endpoint's shape; `text_offset` is where each piece's text starts.
fn logprobs_json(
    state: &SharedState,
    endpoint: Endpoint,
    logprobs: &[TokenLogprob],
    text_offset: usize,
) -> Value {
    match endpoint {
        Endpoint::Completion => {
            let tokens: Vec<String> = logprobs.iter().map(|l| token_text(state, l.id)).collect();
            let mut offsets = Vec::with_capacity(tokens.len());
            let mut at = text_offset;
            for t in &tokens {
                offsets.push(at);
                at += t.len();
            }
            json!({
                "tokens": tokens,
                "token_logprobs": logprobs.iter().map(|l| l.logprob).collect::<Vec<_>>(),
                "top_logprobs": logprobs.iter().map(|l| {
                    l.top.iter().map(|(id, lp)| (token_text(state, *id), json!(lp))).collect::<serde_json::Map<_, _>>()
                }).collect::<Vec<_>>(),
                "text_offset": offsets,
            })
        }
        Endpoint::Chat => {
            let entry = |id: u32, lp: f32| {
                let t = token_text(state, id);
                json!({"token": t, "logprob": lp, "bytes": t.as_bytes()})
            };
            json!({
                "content": logprobs.iter().map(|l| {
                    let mut e = entry(l.id, l.logprob);
                    e["top_logprobs"] = l.top.iter().map(|(id, lp)| entry(*id, *lp)).collect();
                    e
                }).collect::<Vec<_>>(),
            })
        }
    }
}

async fn respond(
    state: SharedState,
    generation: Generation,
    checked: &Checked,
    endpoint: Endpoint,
) -> Result<Response, ApiError> {
    if checked.stream {
        let stream = sse_stream(
            state,
            generation,
            endpoint,
            checked.n,
            checked.include_usage,
        );
        return Ok(Sse::new(stream)
            .keep_alive(KeepAlive::new().interval(Duration::from_secs(10)))
            .into_response());
    }
    let mut generation = generation;
    let n = checked.n;
    let mut texts = vec![String::new(); n];
    let mut logprobs: Vec<Vec<TokenLogprob>> = vec![Vec::new(); n];
    let mut finishes = vec!["abort"; n];
    while let Some(piece) = generation.next_piece().await {
        let piece = piece?;
        texts[piece.index].push_str(&piece.text);
        logprobs[piece.index].extend(piece.logprobs);
        if let Some(f) = piece.finish {
            finishes[piece.index] = f;
        }
    }
    let choices: Vec<Value> = (0..n)
        .map(|i| {
            let lp = generation
                .wants_logprobs
                .then(|| logprobs_json(&state, endpoint, &logprobs[i], 0));
            match endpoint {
                Endpoint::Completion => json!({
                    "index": i, "text": texts[i], "logprobs": lp, "finish_reason": finishes[i],
                }),
                Endpoint::Chat => json!({
                    "index": i,
                    "message": {"role": "assistant", "content": texts[i]},
                    "logprobs": lp,
                    "finish_reason": finishes[i],
                }),
            }
        })
        .collect();
    let (object, model) = (
        match endpoint {
            Endpoint::Completion => "text_completion",
            Endpoint::Chat => "chat.completion",
        },
        &state.config.served_model_name,
    );
    Ok(Json(json!({
        "id": generation.id,
        "object": object,
        "created": state.created,
        "model": model,
        "choices": choices,
        "usage": usage_json(generation.prompt_tokens, generation.completion_tokens()),
    }))
    .into_response())
}

struct Streamer {
    state: SharedState,
    generation: Generation,
    endpoint: Endpoint,
    include_usage: bool,
    queue: VecDeque<Event>,
    text_offsets: Vec<usize>,
    done: bool,
}

impl Streamer {
    fn chunk(&self, choices: Vec<Value>, usage: Option<Value>) -> Event {
        let object = match self.endpoint {
            Endpoint::Completion => "text_completion",
            Endpoint::Chat => "chat.completion.chunk",
        };
        let mut body = json!({
            "id": self.generation.id,
            "object": object,
            "created": self.state.created,
            "model": self.state.config.served_model_name,
            "choices": choices,
        });
        if let Some(u) = usage {
            body["usage"] = u;
        }
        Event::default().data(body.to_string())
    }

    fn piece_chunk(&mut self, piece: Piece) -> Option<Event> {
        if piece.text.is_empty() && piece.logprobs.is_empty() && piece.finish.is_none() {
            return None;
        }
        let i = piece.index;
        let lp = self.generation.wants_logprobs.then(|| {
            logprobs_json(
                &self.state,
                self.endpoint,
                &piece.logprobs,
                self.text_offsets[i],
            )
        });
        self.text_offsets[i] += piece.text.len();
        let choice = match self.endpoint {
            Endpoint::Completion => json!({
                "index": i, "text": piece.text, "logprobs": lp, "finish_reason": piece.finish,
            }),
            Endpoint::Chat => {
                let delta = if piece.text.is_empty() {
                    json!({})
                } else {
                    json!({"content": piece.text})
                };
                json!({"index": i, "delta": delta, "logprobs": lp, "finish_reason": piece.finish})
            }
        };
        Some(self.chunk(vec![choice], None))
    }

    async fn next_event(&mut self) -> Option<Event> {
        loop {
            if let Some(e) = self.queue.pop_front() {
                return Some(e);
            }
            if self.done {
                return None;
            }
            match self.generation.next_piece().await {
                Some(Ok(piece)) => {
                    if let Some(e) = self.piece_chunk(piece) {
                        return Some(e);
                    }
                }
                Some(Err(e)) => {
                    self.done = true;
                    self.queue.push_back(e.to_event());
                    self.queue.push_back(Event::default().data("[DONE]"));
                }
                None => {
                    self.done = true;
                    if self.include_usage {
                        let usage = usage_json(
                            self.generation.prompt_tokens,
                            self.generation.completion_tokens(),
                        );
                        let e = self.chunk(Vec::new(), Some(usage));
                        self.queue.push_back(e);
                    }
                    self.queue.push_back(Event::default().data("[DONE]"));
                }
            }
        }
    }
}

fn sse_stream(
    state: SharedState,
    generation: Generation,
    endpoint: Endpoint,
    n: usize,
    include_usage: bool,
) -> impl Stream<Item = Result<Event, Infallible>> + Send + 'static {
    let mut streamer = Streamer {
        state,
        generation,
        endpoint,
        include_usage,
        queue: VecDeque::new(),
        text_offsets: vec![0; n],
        done: false,
    };
    if endpoint == Endpoint::Chat {
        for i in 0..n {
            let first = json!({
                "index": i,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": null,
                "finish_reason": null,
            });
            let e = streamer.chunk(vec![first], None);
            streamer.queue.push_back(e);
        }
    }
    stream::unfold(streamer, |mut s| async move {
        let event = s.next_event().await?;
        Some((Ok(event), s))
    })
}

async fn tokenize(
    State(state): State<SharedState>,
    ApiJson(req): ApiJson<TokenizeRequest>,
) -> Result<Json<Value>, ApiError> {
    check_model(&state, req.model.as_deref())?;
    let (text, add_special) = match (&req.prompt, &req.messages) {
        (Some(p), None) => (p.clone(), req.add_special_tokens.unwrap_or(true)),
        (None, Some(m)) => (
            render_messages(&state, Some(m), req.add_generation_prompt.unwrap_or(true))?,
            req.add_special_tokens.unwrap_or(false),
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
    Ok(Json(json!({
        "count": tokens.len(),
        "max_model_len": state.engine().map(|e| e.max_context()),
        "tokens": tokens,
    })))
}

async fn detokenize(
    State(state): State<SharedState>,
    ApiJson(req): ApiJson<DetokenizeRequest>,
) -> Result<Json<Value>, ApiError> {
    check_model(&state, req.model.as_deref())?;
    let vocab = state.text.codec.vocab_size();
    if let Some((i, t)) = req
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
    let prompt = state
        .text
        .codec
        .decode(&req.tokens, false)
        .map_err(|e| ApiError::invalid("tokens", e.to_string()))?;
    Ok(Json(json!({ "prompt": prompt })))
}
