//! The crate's error type: what a plugin reported (message and status code) and what the binding
//! itself refuses (an unloadable or incompatible plugin, a bad argument, a GPU client without
//! create options).

use std::path::PathBuf;

use crate::ffi;

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A PJRT status code (`PJRT_Error_Code`, the abseil status codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    Cancelled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
    /// A code this binding does not know (or `OK` on an error, which a plugin should never send).
    Other(i32),
}

impl ErrorCode {
    pub(crate) fn from_raw(code: ffi::PJRT_Error_Code) -> ErrorCode {
        match code {
            ffi::PJRT_Error_Code_CANCELLED => ErrorCode::Cancelled,
            ffi::PJRT_Error_Code_UNKNOWN => ErrorCode::Unknown,
            ffi::PJRT_Error_Code_INVALID_ARGUMENT => ErrorCode::InvalidArgument,
            ffi::PJRT_Error_Code_DEADLINE_EXCEEDED => ErrorCode::DeadlineExceeded,
            ffi::PJRT_Error_Code_NOT_FOUND => ErrorCode::NotFound,
            ffi::PJRT_Error_Code_ALREADY_EXISTS => ErrorCode::AlreadyExists,
            ffi::PJRT_Error_Code_PERMISSION_DENIED => ErrorCode::PermissionDenied,
            ffi::PJRT_Error_Code_RESOURCE_EXHAUSTED => ErrorCode::ResourceExhausted,
            ffi::PJRT_Error_Code_FAILED_PRECONDITION => ErrorCode::FailedPrecondition,
            ffi::PJRT_Error_Code_ABORTED => ErrorCode::Aborted,
            ffi::PJRT_Error_Code_OUT_OF_RANGE => ErrorCode::OutOfRange,
            ffi::PJRT_Error_Code_UNIMPLEMENTED => ErrorCode::Unimplemented,
            ffi::PJRT_Error_Code_INTERNAL => ErrorCode::Internal,
            ffi::PJRT_Error_Code_UNAVAILABLE => ErrorCode::Unavailable,
            ffi::PJRT_Error_Code_DATA_LOSS => ErrorCode::DataLoss,
            ffi::PJRT_Error_Code_UNAUTHENTICATED => ErrorCode::Unauthenticated,
            other => ErrorCode::Other(other),
        }
    }
}

/// Everything that can go wrong in this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The shared library could not be opened or has no `GetPjrtApi`.
    #[error("cannot load PJRT plugin {path}: {reason}")]
    Load { path: PathBuf, reason: String },

    /// The plugin's `PJRT_Api` table is shorter than what this binding reads.
    #[error(
        "PJRT plugin {path} has a function table of {found} bytes; this binding needs at least \
         {needed} bytes (up to `{entry}`); use a plugin built against PJRT C API 0.81 or newer"
    )]
    TableTooShort {
        path: PathBuf,
        found: usize,
        needed: usize,
        entry: &'static str,
    },

    /// The plugin speaks a PJRT major version other than 0.
    #[error(
        "PJRT plugin {path} reports C API version {major}.{minor}; this binding accepts major \
         version 0 only"
    )]
    UnsupportedVersion {
        path: PathBuf,
        major: i32,
        minor: i32,
    },

    /// A function-table entry the call needs is null or past the end of the plugin's table.
    #[error("PJRT plugin {path} does not provide `{entry}`")]
    MissingEntry { path: PathBuf, entry: &'static str },

    /// The plugin returned an error from a call.
    #[error("{call} failed ({code:?}): {message}")]
    Pjrt {
        call: &'static str,
        code: ErrorCode,
        message: String,
    },

    /// An execute was given a different number of arguments than the program takes.
    #[error("the executable takes {expected} arguments, {found} were given")]
    ArgumentCount { expected: usize, found: usize },

    /// A GPU client was requested without GPU create options.
    #[error(
        "the plugin created a `{platform}` client without GPU create options; pass \
         `ClientOptions::gpu(GpuOptions::default())` (or `ClientOptions::for_platform_hint`) so \
         that device memory is not preallocated by default"
    )]
    GpuWithoutOptions { platform: String },

    /// A caller-supplied value was refused before reaching the plugin.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// The plugin reported an element type this binding does not map.
    #[error(
        "element type code {0} is not supported; supported: PRED, S8, S16, S32, S64, U8, U16, U32, U64, F16, BF16, F32, F64"
    )]
    UnsupportedElementType(i32),

    /// The plugin cannot register custom-call handlers (no usable PJRT FFI extension).
    #[error("PJRT plugin {path} cannot register custom-call handlers: {reason}")]
    FfiUnsupported { path: PathBuf, reason: String },

    /// A different host kernel is already registered under this target in this plugin.
    #[error(
        "custom-call target `{target}` already has a different host kernel in PJRT plugin \
         {path}; XLA cannot replace a registered handler"
    )]
    HostKernelConflict { path: PathBuf, target: String },

    /// Every host-kernel trampoline of the process is in use.
    #[error(
        "cannot register host kernel `{target}`: all {slots} host-kernel slots of this process \
         are in use"
    )]
    HostKernelSlotsExhausted { target: String, slots: usize },

    /// Bytes given to `deserialize_executable` were not made by `LoadedExecutable::serialize`.
    #[error("serialized executable refused: {0}")]
    BadSerializedExecutable(String),
}

impl Error {
    /// The PJRT status code, when the plugin reported this error.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Error::Pjrt { code, .. } => Some(*code),
            _ => None,
        }
    }
}
