//! The crate's typed errors. Every refusal names the file, field or value refused and what
//! would have been accepted.

use std::fmt;
use std::path::PathBuf;

use crate::ladder::LadderError;
use crate::program::SignatureMismatch;

#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not valid JSON for this format: {source}")]
    Json {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "manifest formatVersion {found} is not supported; this build reads formatVersion {supported}"
    )]
    UnsupportedFormatVersion { found: u64, supported: u32 },
    #[error("manifest field {field}: {reason}")]
    InvalidManifest { field: String, reason: String },
    #[error("manifest ladder: {source}")]
    InvalidLadder {
        #[source]
        source: LadderError,
    },
    #[error("path {path:?} in manifest field {field} is refused: {reason}")]
    PathEscapes {
        path: String,
        field: String,
        reason: String,
    },
    #[error("file {path} named by manifest field {field} is missing (or is not a regular file)")]
    MissingFile { path: String, field: String },
    #[error("program {file} of entry {entry} disagrees with the contract at {mismatch}")]
    ProgramSignatureMismatch {
        entry: String,
        file: String,
        mismatch: SignatureMismatch,
    },
    #[error(
        "weight file {file} (slot {slot}) is {found} bytes; the manifest says byteLength {expected}"
    )]
    WeightLengthMismatch {
        file: String,
        slot: String,
        expected: u64,
        found: u64,
    },
    #[error("body file {file} hashes to {found}, not the sha256 in its name")]
    BodyHashMismatch { file: String, found: String },
    #[error(
        "executable {file} (entry {entry}) hashes to {found}, not the sha256 in its name; it is not loaded (run `tlaloc compile` again, or `tlaloc verify`)"
    )]
    ExecutableHashMismatch {
        file: String,
        entry: String,
        found: String,
    },
    #[error(
        "executable {file} (entry {entry}) is {found} bytes; the manifest says byteLength {expected}"
    )]
    ExecutableLengthMismatch {
        file: String,
        entry: String,
        expected: u64,
        found: u64,
    },
    #[error("body file {file} is not UTF-8 text")]
    BodyNotUtf8 { file: String },
    #[error("no entry named {name:?} in the manifest")]
    UnknownEntry { name: String },
    #[error("no weight slot {slot:?} in the manifest")]
    UnknownWeightSlot { slot: String },
    #[error(
        "weight {slot} is split over the {degree} devices of a tensor-parallel artifact; read it shard by shard"
    )]
    WeightIsSplit { slot: String, degree: usize },
    #[error("weight {slot}: no shard {shard}; the artifact's tensor-parallel degree is {degree}")]
    UnknownShard {
        slot: String,
        shard: usize,
        degree: usize,
    },
    #[error("integrity check failed for {} file(s): {}", problems.len(), ProblemList(problems))]
    IntegrityFailed { problems: Vec<IntegrityProblem> },
    #[error("{} is not empty; write into an empty directory or ask to replace an existing artifact", path.display())]
    DirectoryNotEmpty { path: PathBuf },
    #[error("{} holds no {} so it is not replaced; only an existing artifact directory may be replaced", path.display(), crate::manifest::MANIFEST_FILE)]
    NotAnArtifact { path: PathBuf },
    #[error("{what} {name:?}: {reason}")]
    InvalidName {
        what: &'static str,
        name: String,
        reason: String,
    },
    #[error("weight {slot}: {found} bytes given, but {dtype} dims {dims:?} need {expected}")]
    WeightSizeMismatch {
        slot: String,
        dtype: crate::Dtype,
        dims: Vec<usize>,
        expected: String,
        found: usize,
    },
    #[error("{what} {name:?} was already written to this artifact")]
    Duplicate { what: &'static str, name: String },
}

/// One file that failed [`crate::Artifact::verify`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IntegrityProblem {
    HashMismatch {
        file: String,
        expected: String,
        found: String,
    },
    Unreadable {
        file: String,
        reason: String,
    },
}

impl IntegrityProblem {
    /// The artifact-relative path of the file.
    pub fn file(&self) -> &str {
        match self {
            IntegrityProblem::HashMismatch { file, .. }
            | IntegrityProblem::Unreadable { file, .. } => file,
        }
    }
}

impl fmt::Display for IntegrityProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IntegrityProblem::HashMismatch {
                file,
                expected,
                found,
            } => write!(f, "{file} has sha256 {found}, expected {expected}"),
            IntegrityProblem::Unreadable { file, reason } => {
                write!(f, "{file} could not be read: {reason}")
            }
        }
    }
}

struct ProblemList<'a>(&'a [IntegrityProblem]);

impl fmt::Display for ProblemList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}
