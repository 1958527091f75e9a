//! The one error type of the HTTP API, its typed OpenAI-style body
//! (`{"error": {"message", "type", "param", "code"}}`), and its two renderings: an HTTP status
//! with that body, and, once a stream has started and the status is already sent, an SSE
//! `data:` event carrying the same body.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response, sse::Event};
use serde::Serialize;
use utoipa::ToSchema;

/// The OpenAI error `type`, chosen by the HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorType {
    /// 400, 408, 413, 415 and other client errors.
    InvalidRequestError,
    /// 401.
    AuthenticationError,
    /// 404.
    NotFoundError,
    /// 429.
    RateLimitError,
    /// 503.
    ServiceUnavailableError,
    /// 500 and other server errors.
    ServerError,
}

/// A machine-readable error `code`, for the refusals a client may want to act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The API key is missing or wrong.
    InvalidApiKey,
    /// The server holds all the sequences it may; retry later.
    QueueFull,
    /// The request names a model this server does not serve.
    ModelNotFound,
    /// Prompt plus token budget exceed the model's context.
    ContextLengthExceeded,
}

/// The body of every error response (and of the error event of a stream).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct ErrorResponse {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// What an OpenAI client shows of an error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// What was refused and what would be accepted.
    pub message: String,
    /// The kind of error.
    #[serde(rename = "type")]
    pub kind: ErrorType,
    /// The request field at fault (`null` when none is).
    #[schema(required = true)]
    pub param: Option<String>,
    /// A machine-readable code (`null` when none applies).
    #[schema(required = true)]
    pub code: Option<ErrorCode>,
}

/// A request refused or failed, with everything an OpenAI client shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What was refused and what would be accepted.
    pub message: String,
    /// The request field at fault, when one is.
    pub param: Option<String>,
    /// A machine-readable code, when one applies.
    pub code: Option<ErrorCode>,
    /// Seconds a client should wait before retrying (429 and 503).
    pub retry_after_s: Option<u64>,
    /// Answer with `Connection: close`: the request body was not read to its end, so nothing
    /// after it on the connection can be read as a request.
    pub close_connection: bool,
}

impl ApiError {
    /// 400 naming the field.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message).with_param(param)
    }

    /// A response with `status` and `message`.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            param: None,
            code: None,
            retry_after_s: None,
            close_connection: false,
        }
    }

    /// Closes the connection after this answer (see [`ApiError::close_connection`]).
    pub fn closing_connection(mut self) -> Self {
        self.close_connection = true;
        self
    }

    /// Names the field at fault.
    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    /// Sets the machine-readable code.
    pub fn with_code(mut self, code: ErrorCode) -> Self {
        self.code = Some(code);
        self
    }

    /// 401.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "missing or wrong API key; send the key the server was started with as `Authorization: Bearer <key>`",
        )
        .with_code(ErrorCode::InvalidApiKey)
    }

    /// 429 with `Retry-After`.
    pub fn queue_full(limit: usize) -> Self {
        let mut e = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "the server already holds {limit} sequences (running plus --max-queue); retry later"
            ),
        )
        .with_code(ErrorCode::QueueFull);
        e.retry_after_s = Some(1);
        e
    }

    /// 503 while the model loads or the server stops.
    pub fn not_ready(why: &str) -> Self {
        let mut e = Self::new(StatusCode::SERVICE_UNAVAILABLE, why.to_owned());
        e.retry_after_s = Some(1);
        e
    }

    /// 500 for a failure inside the engine.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// The OpenAI error `type` for the status.
    pub fn kind(&self) -> ErrorType {
        match self.status {
            StatusCode::UNAUTHORIZED => ErrorType::AuthenticationError,
            StatusCode::NOT_FOUND => ErrorType::NotFoundError,
            StatusCode::TOO_MANY_REQUESTS => ErrorType::RateLimitError,
            StatusCode::SERVICE_UNAVAILABLE => ErrorType::ServiceUnavailableError,
            s if s.is_client_error() => ErrorType::InvalidRequestError,
            _ => ErrorType::ServerError,
        }
    }

    /// The JSON body.
    pub fn body(&self) -> ErrorResponse {
        ErrorResponse {
            error: ErrorDetail {
                message: self.message.clone(),
                kind: self.kind(),
                param: self.param.clone(),
                code: self.code,
            },
        }
    }

    /// The rendering inside an event stream whose status is already sent.
    pub fn to_event(&self) -> Event {
        crate::response::json_event(&self.body())
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.status.as_u16(), self.message)
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after_s
            && let Ok(v) = HeaderValue::from_str(&s.to_string())
        {
            response.headers_mut().insert(header::RETRY_AFTER, v);
        }
        if self.close_connection {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}
