//! The backend's error: a Triton error code and a message that names what was refused and
//! what would be accepted.

use thiserror::Error;

/// `TRITONSERVER_Error_Code`, as the backend uses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// Unknown.
    Unknown,
    /// A fault inside the backend or the engine.
    Internal,
    /// Something named does not exist.
    NotFound,
    /// The request or the configuration is wrong.
    InvalidArg,
    /// Not now (the pool is full).
    Unavailable,
    /// Not supported by this backend.
    Unsupported,
    /// Already exists.
    AlreadyExists,
    /// The client cancelled the request.
    Cancelled,
}

/// An error the backend reports to Triton.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{message}")]
pub struct BackendError {
    /// The Triton error code.
    pub code: Code,
    /// What went wrong.
    pub message: String,
}

impl BackendError {
    /// An error with `code`.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// A refused request or configuration.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArg, message)
    }
}
