//! Loads a serving artifact onto a PJRT device and generates tokens from it.
//!
//! Rooms, bottom up: [`model`] loads an artifact and runs compiled entries ([`executor`] is the
//! trait it implements), each the body [`bodies`] chose (a variant's custom calls run the
//! runtime's own kernels); [`layout`] lays out one step's inputs; [`step_executor`] runs rows laid
//! out by any caller (the seam for an external scheduler); [`block_manager`] hands out K/V
//! pages, shared between sequences through [`prefix_cache`]'s block hashes; [`request`] is what a caller asks and its one validation; [`bucket`] chooses decode
//! buckets by measurement; [`stop`] decides stops; [`sampling`] draws tokens, within a request's
//! [`constraint`] when it has one; [`scheduler`]
//! queues, admits, preempts, parks and completes sequences; [`engine`] is the thread that owns
//! all of it and the handle the server and the CLI talk to.
//!
//! Nothing here links the exporter or the graph builder: an artifact is JSON, text and bytes.

#![forbid(unsafe_code)]

pub mod block_manager;
pub mod bodies;
pub mod bucket;
pub mod compile_cache;
pub mod constraint;
pub mod engine;
pub mod executor;
mod host_kernels;
pub mod kv_dtype;
pub mod layout;
pub mod model;
pub mod prefix_cache;
pub mod request;
pub mod sampling;
pub mod scheduler;
pub mod step_executor;
pub mod stop;
mod tensor_parallel;

pub use bodies::KernelChoice;
pub use constraint::{Constraint, ConstraintError, TokenConstraint, TokenMask};
pub use engine::{
    Engine, EngineError, EngineHandle, EngineOptions, EngineStats, GenerateResult, StepMark,
    StepMarks, StepStats, TokenEvent,
};
pub use executor::{
    DECODE_CHAIN_WINDOW, EntryKind, ExecutorError, Ladder, LadderPoint, LoadTimings, ModelExecutor,
    ModelShape, StepInputs, StepOutput, StepTimings,
};
pub use model::{
    CompileMode, CompiledArtifact, DEFAULT_MAX_DECODE_CHAIN, LoadError, LoadOptions, Model,
    Platform, compile_into_artifact,
};
pub use prefix_cache::PrefixCacheStats;
pub use request::{
    FinishReason, GenerateRequest, Refusal, RequestId, RequestTimings, SequenceControl,
    SequenceKey, StopParams, Usage, ValidatedRequest,
};
pub use sampling::{Sampled, SamplingParams};
pub use scheduler::DEFAULT_MAX_PREFILL_TOKENS;
pub use step_executor::{RowOutput, StepError, StepExecutor, StepRow};
