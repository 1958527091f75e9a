//! A request body taken within the server's bounds: its `Content-Type` (JSON only), its size
//! (refused at once when `Content-Length` declares too much, else as soon as the bytes read pass
//! the limit), and the time between arriving bytes. Each refusal is a [`BodyError`], answered as
//! an OpenAI-style error; those that leave the body unread also close the connection, since the
//! rest of the body cannot be told apart from a next request.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, header};
use http_body_util::BodyExt;
use thiserror::Error;

use crate::error::ApiError;

/// The one media type request bodies are read as.
pub const JSON: &str = "application/json";

/// Why a request body was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BodyError {
    /// No `Content-Type` was sent.
    #[error("a request body without a Content-Type refused: send it as `Content-Type: {JSON}`")]
    NoContentType,
    /// A `Content-Type` other than JSON was sent.
    #[error("Content-Type `{0}` refused: send the body as `Content-Type: {JSON}`")]
    NotJson(String),
    /// `Content-Length` declares more than the limit (nothing of the body was read).
    #[error(
        "request body refused: Content-Length declares {declared} bytes, over the limit of {limit} bytes"
    )]
    DeclaredTooLarge {
        /// What `Content-Length` says.
        declared: u64,
        /// The limit.
        limit: usize,
    },
    /// More bytes arrived than the limit.
    #[error("request body refused: over the limit of {limit} bytes")]
    TooLarge {
        /// The limit.
        limit: usize,
    },
    /// No byte of the body arrived for the idle timeout.
    #[error("request body refused: no byte of it arrived for {} s", .after.as_secs_f64())]
    Idle {
        /// The idle timeout.
        after: Duration,
    },
    /// The connection failed or broke the body's framing.
    #[error("request body unreadable: {0}")]
    Unreadable(String),
}

impl From<BodyError> for ApiError {
    fn from(e: BodyError) -> Self {
        let message = e.to_string();
        match e {
            BodyError::NoContentType | BodyError::NotJson(_) => {
                ApiError::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, message)
            }
            BodyError::DeclaredTooLarge { .. } | BodyError::TooLarge { .. } => {
                ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, message).closing_connection()
            }
            BodyError::Idle { .. } => {
                ApiError::new(StatusCode::REQUEST_TIMEOUT, message).closing_connection()
            }
            BodyError::Unreadable(_) => ApiError::invalid("body", message).closing_connection(),
        }
    }
}

/// Accepts `Content-Type: application/json`, with parameters (`; charset=utf-8`) and in any
/// case; refuses every other type, and none. Anything looser would let a browser post here
/// cross-site without a preflight (`text/plain` is a "simple" request).
pub fn require_json(headers: &HeaderMap) -> Result<(), BodyError> {
    let value = headers
        .get(header::CONTENT_TYPE)
        .ok_or(BodyError::NoContentType)?;
    let text = String::from_utf8_lossy(value.as_bytes());
    let media_type = text.split(';').next().unwrap_or_default().trim();
    if media_type.eq_ignore_ascii_case(JSON) {
        Ok(())
    } else {
        Err(BodyError::NotJson(text.into_owned()))
    }
}

/// Refuses a request whose `Content-Length` declares more than `limit` bytes, before any of
/// the body is read. (A malformed `Content-Length` never gets here: the HTTP layer refuses it.)
pub fn require_declared_within(headers: &HeaderMap, limit: usize) -> Result<(), BodyError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match declared {
        Some(declared) if declared > limit as u64 => {
            Err(BodyError::DeclaredTooLarge { declared, limit })
        }
        _ => Ok(()),
    }
}

/// Reads `body` to its end: at most `limit` bytes, each wait for more at most `idle`.
pub async fn read_within(mut body: Body, limit: usize, idle: Duration) -> Result<Bytes, BodyError> {
    let mut collected = Vec::new();
    loop {
        let frame = match tokio::time::timeout(idle, body.frame()).await {
            Err(_) => return Err(BodyError::Idle { after: idle }),
            Ok(None) => return Ok(Bytes::from(collected)),
            Ok(Some(Err(e))) => return Err(BodyError::Unreadable(e.to_string())),
            Ok(Some(Ok(frame))) => frame,
        };
        // Trailers carry nothing this server reads.
        if let Ok(data) = frame.into_data() {
            if collected.len() + data.len() > limit {
                return Err(BodyError::TooLarge { limit });
            }
            collected.extend_from_slice(&data);
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn with(name: header::HeaderName, value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(name, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn json_is_accepted_with_parameters_and_in_any_case_and_nothing_else_is() {
        for ok in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON ;charset=UTF-8",
        ] {
            assert_eq!(
                require_json(&with(header::CONTENT_TYPE, ok)),
                Ok(()),
                "{ok}"
            );
        }
        for refused in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/jsonp",
            "application/json-seq",
        ] {
            assert_eq!(
                require_json(&with(header::CONTENT_TYPE, refused)),
                Err(BodyError::NotJson(refused.to_owned())),
            );
        }
        assert_eq!(
            require_json(&HeaderMap::new()),
            Err(BodyError::NoContentType)
        );
    }

    #[test]
    fn a_declared_length_is_refused_only_past_the_limit() {
        let length = |n: u64| with(header::CONTENT_LENGTH, &n.to_string());
        assert_eq!(require_declared_within(&length(100), 100), Ok(()));
        assert_eq!(require_declared_within(&HeaderMap::new(), 100), Ok(()));
        assert_eq!(
            require_declared_within(&length(99_999_999_999_999), 100),
            Err(BodyError::DeclaredTooLarge {
                declared: 99_999_999_999_999,
                limit: 100
            })
        );
    }
}
