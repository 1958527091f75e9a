//! Loads a serving artifact onto a PJRT device and generates tokens from it: the paged K/V
//! block manager, the continuous-batching scheduler, sampling, the executor that runs compiled
//! entries, and the engine thread that the server and the CLI talk to.
//!
//! Nothing here links the exporter or the graph builder: an artifact is JSON, text and bytes.

#![forbid(unsafe_code)]

pub mod block_manager;
pub mod compile_cache;
pub mod engine;
pub mod executor;
pub mod model;
pub mod request;
pub mod sampling;
pub mod scheduler;

pub use engine::{
    Engine, EngineError, EngineHandle, EngineStats, GenerateResult, StepStats, TokenEvent,
};
pub use executor::{
    DECODE_CHAIN_WINDOW, EntryKind, ExecutorError, Ladder, LadderPoint, LoadTimings, ModelExecutor,
    ModelShape, StepInputs, StepOutput, StepTimings,
};
pub use model::{CompileMode, DEFAULT_MAX_DECODE_CHAIN, LoadError, LoadOptions, Model, Platform};
pub use request::{
    FinishReason, GenerateRequest, Refusal, RequestId, RequestTimings, StopParams, Usage,
    ValidatedRequest,
};
pub use sampling::{Sampled, SamplingParams};
