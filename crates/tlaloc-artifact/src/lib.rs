//! The serving artifact: manifest schema, bucket ladder, padding contract, loader and
//! integrity check. Reads JSON, text and bytes; knows nothing of plugins or graphs.
//!
//! Layout of an artifact directory (see `paths`):
//! `tlaloc-serving.json`, `bodies/<sha256>.mlir`, `programs/<entry>.json`,
//! `weights/NNNN_<slot>.bin`, `tokenizer/<name>`.

#![forbid(unsafe_code)]

mod dtype;
mod error;
mod ladder;
mod loader;
mod manifest;
pub mod paths;
mod program;
mod writer;

pub use dtype::{Dtype, UnknownDtype};
pub use error::{ArtifactError, IntegrityProblem};
pub use ladder::{
    EntryKind, Ladder, LadderError, LadderOptions, LadderPoint, MIN_CONTEXT_BUCKET, PREFILL_BATCH,
};
pub use loader::{Artifact, VerifyReport};
pub use manifest::{
    Entry, FORMAT_VERSION, KvCacheLayout, MANIFEST_FILE, Manifest, ModelConfig, PaddingContract,
    Provenance, RopeScaling, SourceCheckpoint, SourceFile, TokenizerFile, TokenizerFiles,
    WeightEntry,
};
pub use program::{
    Donation, NUM_STEP_INPUTS, NUM_STEP_OUTPUTS, ProgramSignature, Role, SignatureMismatch,
    TensorSpec,
};
pub use writer::{ArtifactWriter, ExistingDir};
