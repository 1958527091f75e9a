//! The one error type of checkpoint ingestion. Every variant names the thing refused and,
//! where there is a choice, what would have been accepted.

use std::path::PathBuf;

/// Why a checkpoint could not be read.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// A file could not be opened, mapped or read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's reason.
        #[source]
        source: std::io::Error,
    },
    /// A JSON file (config, index, tokenizer) did not parse.
    #[error("{path} is not valid JSON of the expected shape: {reason}")]
    Json {
        /// The file.
        path: PathBuf,
        /// What serde reported.
        reason: String,
    },
    /// The path is neither a Hugging Face checkpoint directory nor a `.gguf` file.
    #[error("{path} is not a checkpoint: {reason}")]
    NotACheckpoint {
        /// What was given.
        path: PathBuf,
        /// Why it was not recognised and what would be.
        reason: String,
    },
    /// The checkpoint's architecture is not one Tlaloc builds.
    #[error("unsupported architecture {found:?}; supported: {accepted}")]
    UnsupportedArchitecture {
        /// The architecture as written in the checkpoint.
        found: String,
        /// The architectures that are accepted.
        accepted: &'static str,
    },
    /// A config field is missing.
    #[error("config field `{field}` is missing; {accepted}")]
    MissingField {
        /// The field.
        field: &'static str,
        /// What a valid value looks like.
        accepted: &'static str,
    },
    /// A config field has a value Tlaloc cannot build correctly.
    #[error("config field `{field}` = {value} is not supported; accepted: {accepted}")]
    UnsupportedValue {
        /// The field (dotted path for nested ones).
        field: String,
        /// The value as found.
        value: String,
        /// What would be accepted.
        accepted: String,
    },
    /// A safetensors file is malformed.
    #[error("malformed safetensors file {path}: {reason}")]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A GGUF file is malformed.
    #[error("malformed GGUF file {path}: {reason}")]
    Gguf {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the byte offset where it was found.
        reason: String,
    },
    /// A GGUF tensor is stored in a ggml element type Tlaloc does not read (the file itself may
    /// be perfectly valid).
    #[error("GGUF file {path}: tensor `{tensor}`: {reason}")]
    UnsupportedGgmlType {
        /// The file.
        path: PathBuf,
        /// The tensor's name in the file.
        tensor: String,
        /// The refusal, naming the type and listing the supported ones.
        reason: crate::gguf::DequantError,
    },
    /// A tensor is stored in an element type Tlaloc does not read.
    #[error("tensor `{tensor}` has dtype {dtype}; supported: {accepted}")]
    UnsupportedDtype {
        /// The tensor's name in the checkpoint.
        tensor: String,
        /// Its stored type.
        dtype: String,
        /// The types that are read.
        accepted: &'static str,
    },
    /// A tensor's shape disagrees with what the config implies for its role.
    #[error("tensor `{tensor}` has shape {found:?} but the config implies {expected:?}")]
    ShapeMismatch {
        /// The tensor's name in the checkpoint.
        tensor: String,
        /// The shape the config implies (Hugging Face layout).
        expected: Vec<usize>,
        /// The shape stored.
        found: Vec<usize>,
    },
    /// Tensors the config requires are absent.
    #[error(
        "missing tensors: {}{}",
        names.join(", "),
        if *more > 0 { format!(" and {more} more") } else { String::new() }
    )]
    MissingTensors {
        /// Their names in the checkpoint's naming scheme (the first [`crate::checkpoint::MAX_NAMED_MISSING`]).
        names: Vec<String>,
        /// How many more are missing beyond those named.
        more: usize,
    },
    /// Tensors are present that no role accounts for.
    #[error("unexpected tensors (no role for them in this architecture): {}", names.join(", "))]
    UnexpectedTensors {
        /// Their names.
        names: Vec<String>,
    },
    /// A role was asked for that this checkpoint does not have.
    #[error("this checkpoint has no tensor for role {role}")]
    NoSuchRole {
        /// The role, rendered.
        role: String,
    },
    /// The tokenizer could not be built or read.
    #[error("tokenizer: {reason}")]
    Tokenizer {
        /// What went wrong and what would be accepted.
        reason: String,
    },
}

/// Result of ingestion calls.
pub type Result<T, E = IngestError> = std::result::Result<T, E>;

pub(crate) fn io_error(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> IngestError {
    let path = path.into();
    move |source| IngestError::Io { path, source }
}
