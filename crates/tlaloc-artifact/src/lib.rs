//! The serving artifact: manifest schema, bucket ladder, step contract (operands, results and
//! padding values of every forward program), loader and integrity check. Reads JSON, text and bytes; knows nothing of plugins or graphs.
//!
//! Layout of an artifact directory (see `paths`):
//! `tlaloc-serving.json`, `bodies/<sha256>.mlir`, `programs/<entry>.json`,
//! `weights/NNNN_<slot>.bin`, `tokenizer/<name>`, and optionally `executables/<sha256>.bin`
//! (compiled executables, see `executables`), body variants of entries and the custom-call
//! kernels they call ([`kernels`]) and `tlaloc-serving.json.sig` (see [`signature`]). A
//! tensor-parallel artifact stores each split weight as one file per device
//! (`weights/NNNN_<slot>.shard<k>.bin`, see [`tensor_parallel`]).

#![forbid(unsafe_code)]

mod dtype;
mod error;
mod executables;
pub mod hf_config;
pub mod kernels;
mod ladder;
mod loader;
mod manifest;
pub mod paths;
mod program;
pub mod quant;
pub mod signature;
pub mod step;
pub mod tensor_parallel;
mod writer;

pub use dtype::{Dtype, UnknownDtype};
pub use error::{ArtifactError, IntegrityProblem};
pub use executables::{
    AddedExecutables, CompilerIdentity, ExecutableEntry, ExecutableSet, add_executables,
};
pub use ladder::{
    EntryKind, Ladder, LadderError, LadderOptions, LadderPoint, MIN_CONTEXT_BUCKET, PREFILL_BATCH,
};
pub use loader::{Artifact, VerifyReport, parse_manifest};
pub use manifest::{
    BodyVariant, Entry, FORMAT_VERSION, KvCacheLayout, KvScaleGranularity, KvScales, MANIFEST_FILE,
    Manifest, ManifestModel, ManifestRopeScaling, ManifestSourceFile, ManifestTokenizer,
    PaddingContract, Provenance, SourceCheckpoint, TokenizerFile, WeightEntry,
};
pub use program::{Donation, OperandRole, ProgramSignature, SignatureMismatch, TensorSpec};
pub use quant::BlockFormat;
pub use step::{KvPool, PoolOperand, StepInput, StepOutput, next_decode_row};
pub use tensor_parallel::{TensorParallel, WeightShard, WeightSplit};
pub use writer::{ArtifactWriter, ExistingDir};
