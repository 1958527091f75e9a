//! The HTTP surface: the router, the JSON extractor that turns every body problem into a named
//! 400 (or 408, 413, 415: see [`crate::body`]), the API-key check, and the handlers, each of
//! which checks its request once ([`crate::validate`]) and answers with a typed body
//! ([`crate::response`]); the generation handlers start a [`Generation`] and leave its answer to
//! [`crate::render`]. Each handler's `#[utoipa::path]` is its entry in the OpenAPI description
//! ([`crate::openapi`](mod@crate::openapi)).

use axum::extract::{FromRequest, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use subtle::ConstantTimeEq;
use tlaloc_runtime::EngineHandle;

use crate::body;
use crate::error::{ApiError, ErrorResponse};
use crate::generate::Generation;
use crate::render::{ChatCompletions, Completions, Endpoint, respond};
use crate::request::{ChatRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest};
use crate::response::{
    ChatCompletionChunk, ChatCompletionResponse, CompletionChunk, CompletionResponse,
    DetokenizeResponse, ListObject, ModelCard, ModelList, ModelObject, ReadyResponse,
    TokenizeResponse,
};
use crate::responses::{ResponseObject, ResponsesRequest};
use crate::state::SharedState;
use crate::validate::ValidatedGeneration;

/// The router over `state`.
pub fn router(state: SharedState) -> Router {
    let protected = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/responses", post(responses))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_api_key,
        ));
    Router::new()
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi_json))
        .merge(protected)
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(
            state.clone(),
            refuse_declared_oversize,
        ))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_refusals,
        ))
        .with_state(state)
}

/// A JSON body whose every problem is an OpenAI-style error naming the field: sent as
/// `application/json` (else 415), within the body bounds (else 408 or 413), one JSON object and
/// nothing after it (else 400 about the body), with fields that deserialize (else 400 naming
/// the field).
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<SharedState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &SharedState) -> Result<Self, ApiError> {
        body::require_json(req.headers())?;
        let config = &state.config;
        let bytes = body::read_within(
            req.into_body(),
            config.max_body_bytes,
            config.body_idle_timeout,
        )
        .await?;
        if bytes.trim_ascii_start().first() != Some(&b'{') {
            return Err(ApiError::invalid(
                "body",
                "malformed JSON body: the request body must be a JSON object",
            ));
        }
        let mut de = serde_json::Deserializer::from_slice(&bytes);
        let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
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
        })?;
        // Whitespace may follow the object; anything else means the body is not one JSON value.
        de.end().map_err(|e| {
            ApiError::invalid(
                "body",
                format!("malformed JSON body: {e}; send one JSON object and nothing after it"),
            )
        })?;
        Ok(ApiJson(value))
    }
}

async fn require_api_key(State(state): State<SharedState>, req: Request, next: Next) -> Response {
    if let Some(key) = &state.config.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token)
            .unwrap_or_default();
        if !bool::from(given.as_bytes().ct_eq(key.as_bytes())) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

/// The credentials of an `Authorization: Bearer <token>` value. The scheme is matched in any
/// case and may be followed by more than one space (RFC 9110, section 11.1 and 11.4).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("Bearer")
        .then(|| token.trim_start_matches(' '))
}

/// Answers 413 before the body is read when its `Content-Length` declares more than the limit.
async fn refuse_declared_oversize(
    State(state): State<SharedState>,
    req: Request,
    next: Next,
) -> Response {
    match body::require_declared_within(req.headers(), state.config.max_body_bytes) {
        Ok(()) => next.run(req).await,
        Err(e) => ApiError::from(e).into_response(),
    }
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
        "no such route; the server serves /v1/completions, /v1/chat/completions, /v1/responses, /v1/models, /tokenize, /detokenize, /health, /ready, /metrics, /openapi.json",
    )
}

/// Whether the server is up.
///
/// 200 whenever the server answers, also while the model loads.
#[utoipa::path(get, path = "/health", tag = "server", responses(
    (status = 200, description = "The server is up"),
))]
async fn health() -> StatusCode {
    StatusCode::OK
}

/// Whether the model is loaded and requests are taken.
#[utoipa::path(get, path = "/ready", tag = "server", responses(
    (status = 200, description = "The model is loaded", body = ReadyResponse),
    (status = 503, description = "The model is still loading, or the server is stopping",
        body = ErrorResponse, headers(("Retry-After" = u64, description = "Seconds to wait"))),
))]
async fn ready(State(state): State<SharedState>) -> Result<Json<ReadyResponse>, ApiError> {
    state.ready_engine()?;
    Ok(Json(ReadyResponse::default()))
}

/// Prometheus metrics, under a `tlaloc:` prefix.
#[utoipa::path(get, path = "/metrics", tag = "server", responses(
    (status = 200, description = "The Prometheus text exposition", body = String,
        content_type = "text/plain; version=0.0.4; charset=utf-8"),
))]
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

/// This OpenAPI description.
#[utoipa::path(get, path = "/openapi.json", tag = "server", responses(
    (status = 200, description = "The OpenAPI description of this server", body = Object),
))]
async fn openapi_json() -> Json<utoipa::openapi::OpenApi> {
    Json(crate::openapi::openapi())
}

/// The served model.
#[utoipa::path(get, path = "/v1/models", tag = "openai", security((), ("api_key" = [])),
    responses(
        (status = 200, description = "The one model this server serves", body = ModelList),
        (status = 401, description = "A missing or wrong API key", body = ErrorResponse),
    ))]
async fn models(State(state): State<SharedState>) -> Json<ModelList> {
    let name = &state.config.served_model_name;
    Json(ModelList {
        object: ListObject::List,
        data: vec![ModelCard {
            id: name.clone(),
            object: ModelObject::Model,
            created: state.started_at,
            owned_by: "tlaloc".to_owned(),
            root: name.clone(),
            max_model_len: state.engine().map(|e| e.max_context()),
        }],
    })
}

/// The error answers of both generation endpoints (the body is always [`ErrorResponse`]).
#[allow(dead_code)] // Only its derived OpenAPI description is used; no handler returns it.
#[derive(utoipa::IntoResponses)]
enum GenerationErrors {
    #[response(status = 400, description = "A field refused; `param` names it")]
    BadRequest(ErrorResponse),
    #[response(status = 401, description = "A missing or wrong API key")]
    Unauthorized(ErrorResponse),
    #[response(
        status = 408,
        description = "The body stopped arriving for the body idle timeout"
    )]
    BodyTimeout(ErrorResponse),
    #[response(
        status = 413,
        description = "The body is over the limit, or its `Content-Length` says it would be"
    )]
    TooLarge(ErrorResponse),
    #[response(
        status = 415,
        description = "The body is not sent as `application/json`"
    )]
    NotJson(ErrorResponse),
    #[response(
        status = 429,
        description = "The server holds all the sequences it may",
        headers(("Retry-After" = u64, description = "Seconds to wait"))
    )]
    Full(ErrorResponse),
    #[response(status = 500, description = "The engine failed")]
    EngineFailed(ErrorResponse),
    #[response(
        status = 503,
        description = "The model is still loading, or the server is stopping",
        headers(("Retry-After" = u64, description = "Seconds to wait"))
    )]
    NotReady(ErrorResponse),
}

/// Generates a completion of a prompt.
///
/// With `stream`, the answer is server-sent events: one `data:` chunk per piece of text, a
/// usage chunk when `stream_options.include_usage` is set, then `data: [DONE]`. A failure after
/// the stream has started is sent as an error body in a `data:` event before `[DONE]`.
#[utoipa::path(post, path = "/v1/completions", tag = "openai", security((), ("api_key" = [])),
    request_body = CompletionRequest,
    responses(
        (status = 200, description = "The completion, or its chunks when streaming", content(
            (CompletionResponse = "application/json"),
            (CompletionChunk = "text/event-stream"),
        )),
        GenerationErrors,
    ))]
async fn completions(
    State(state): State<SharedState>,
    ApiJson(req): ApiJson<CompletionRequest>,
) -> Result<Response, ApiError> {
    let engine = state.ready_engine()?.clone();
    let validated = req.check(&state)?;
    generate::<Completions>(state, &engine, validated).await
}

/// Generates the assistant's reply to a conversation, rendered with the model's chat template.
///
/// With `stream`, the answer is server-sent events: for each choice a first chunk with the
/// assistant's role, then one chunk per piece of text, a usage chunk when
/// `stream_options.include_usage` is set, then `data: [DONE]`. A failure after the stream has
/// started is sent as an error body in a `data:` event before `[DONE]`.
#[utoipa::path(post, path = "/v1/chat/completions", tag = "openai",
    security((), ("api_key" = [])),
    request_body = ChatRequest,
    responses(
        (status = 200, description = "The chat completion, or its chunks when streaming", content(
            (ChatCompletionResponse = "application/json"),
            (ChatCompletionChunk = "text/event-stream"),
        )),
        GenerationErrors,
    ))]
async fn chat_completions(
    State(state): State<SharedState>,
    ApiJson(req): ApiJson<ChatRequest>,
) -> Result<Response, ApiError> {
    let engine = state.ready_engine()?.clone();
    let validated = req.check(&state)?;
    generate::<ChatCompletions>(state, &engine, validated).await
}

/// Generates a response with the Responses API, statelessly (nothing is stored).
///
/// With `stream`, the answer is the Responses event stream: `response.created`,
/// `response.in_progress`, then per output item `response.output_item.added`, its text deltas
/// (`response.content_part.added`, `response.output_text.delta`, `response.output_text.done`,
/// `response.content_part.done`) or its call's arguments
/// (`response.function_call_arguments.delta`, `.done`), `response.output_item.done`, and last
/// `response.completed` (or `response.incomplete` when `max_output_tokens` cut it).
#[utoipa::path(post, path = "/v1/responses", tag = "openai", security((), ("api_key" = [])),
    request_body = ResponsesRequest,
    responses(
        (status = 200, description = "The response, or its events when streaming", content(
            (ResponseObject = "application/json"),
            (Object = "text/event-stream"),
        )),
        GenerationErrors,
    ))]
async fn responses(
    State(state): State<SharedState>,
    ApiJson(req): ApiJson<ResponsesRequest>,
) -> Result<Response, ApiError> {
    crate::responses::respond(state, req).await
}

/// Starts a validated generation and answers in endpoint `E`'s shape.
async fn generate<E: Endpoint>(
    state: SharedState,
    engine: &EngineHandle,
    validated: ValidatedGeneration,
) -> Result<Response, ApiError> {
    let id = state.next_request_id(E::ID_PREFIX);
    let generation = Generation::start(&state, engine, &validated, id)?;
    respond::<E>(state, generation, &validated).await
}

/// Tokenizes a prompt, or a conversation rendered with the chat template.
#[utoipa::path(post, path = "/tokenize", tag = "tlaloc", security((), ("api_key" = [])),
    request_body = TokenizeRequest,
    responses(
        (status = 200, description = "The token ids", body = TokenizeResponse),
        (status = 400, description = "A field refused; `param` names it", body = ErrorResponse),
        (status = 401, description = "A missing or wrong API key", body = ErrorResponse),
        (status = 408, description = "The body stopped arriving for the body idle timeout",
            body = ErrorResponse),
        (status = 413, description = "The body is over the limit, or its `Content-Length` says it \
            would be", body = ErrorResponse),
        (status = 415, description = "The body is not sent as `application/json`",
            body = ErrorResponse),
    ))]
async fn tokenize(
    State(state): State<SharedState>,
    ApiJson(req): ApiJson<TokenizeRequest>,
) -> Result<Json<TokenizeResponse>, ApiError> {
    let tokens = req.check(&state)?.tokens;
    Ok(Json(TokenizeResponse {
        count: tokens.len(),
        max_model_len: state.engine().map(|e| e.max_context()),
        tokens,
    }))
}

/// Turns token ids into text.
#[utoipa::path(post, path = "/detokenize", tag = "tlaloc", security((), ("api_key" = [])),
    request_body = DetokenizeRequest,
    responses(
        (status = 200, description = "The text", body = DetokenizeResponse),
        (status = 400, description = "A field refused; `param` names it", body = ErrorResponse),
        (status = 401, description = "A missing or wrong API key", body = ErrorResponse),
        (status = 408, description = "The body stopped arriving for the body idle timeout",
            body = ErrorResponse),
        (status = 413, description = "The body is over the limit, or its `Content-Length` says it \
            would be", body = ErrorResponse),
        (status = 415, description = "The body is not sent as `application/json`",
            body = ErrorResponse),
    ))]
async fn detokenize(
    State(state): State<SharedState>,
    ApiJson(req): ApiJson<DetokenizeRequest>,
) -> Result<Json<DetokenizeResponse>, ApiError> {
    let tokens = req.check(&state)?.tokens;
    let prompt = state
        .text
        .codec
        .decode(&tokens, false)
        .map_err(|e| ApiError::invalid("tokens", e.to_string()))?;
    Ok(Json(DetokenizeResponse { prompt }))
}
