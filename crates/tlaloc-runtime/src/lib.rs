//! Loads a serving artifact onto a PJRT device and generates tokens from it: the paged K/V
//! block manager, the continuous-batching scheduler, sampling, the executor that runs compiled
//! entries, and the engine thread that the server and the CLI talk to.
//!
//! Nothing here links the exporter or the graph builder: an artifact is JSON, text and bytes.

pub mod block_manager;
pub mod executor;
pub mod sampling;
pub mod scheduler;

pub use executor::{
    EntryKey, EntryKind, ExecutorError, ModelExecutor, ModelShape, StepInputs, StepOutput,
    StepTimings,
};
pub use sampling::{Sampled, SamplingParams};
pub use scheduler::{FinishReason, RequestId, StopParams, Usage};
