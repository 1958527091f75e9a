//! The one error type of the HTTP API and its two renderings: an HTTP status with an
//! OpenAI-style JSON body (`{"error": {"message", "type", "param", "code"}}`), and, once a stream
//! has started and the status is already sent, an SSE `data:` event carrying the same body.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response, sse::Event};
use serde_json::json;

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
    pub code: Option<&'static str>,
    /// Seconds a client should wait before retrying (429 and 503).
    pub retry_after_s: Option<u64>,
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
        }
    }

    /// Names the field at fault.
    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    /// Sets the machine-readable code.
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// 401.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "missing or wrong API key; send the key the server was started with as `Authorization: Bearer <key>`",
        )
        .with_code("invalid_api_key")
    }

    /// 429 with `Retry-After`.
    pub fn queue_full(limit: usize) -> Self {
        let mut e = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "the server already holds {limit} sequences (running plus --max-queue); retry later"
            ),
        )
        .with_code("queue_full");
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
    pub fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::PAYLOAD_TOO_LARGE => "invalid_request_error",
            StatusCode::SERVICE_UNAVAILABLE => "service_unavailable_error",
            s if s.is_client_error() => "invalid_request_error",
            _ => "server_error",
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": self.param,
                "code": self.code,
            }
        })
    }

    /// The rendering inside an event stream whose status is already sent.
    pub fn to_event(&self) -> Event {
        Event::default().data(self.body().to_string())
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
        response
    }
}
