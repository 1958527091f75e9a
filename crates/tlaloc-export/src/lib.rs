//! Checkpoint readers (safetensors, GGUF), Llama-family model graphs and the artifact
//! writer.
//!
//! Ingestion: [`Checkpoint::open`] reads a Hugging Face directory or a `.gguf` file into a checked
//! [`ModelConfig`], [`TokenizerFiles`] and tensors addressed by [`TensorRole`]; [`describe`]
//! renders what `tlaloc inspect` prints.

#![forbid(unsafe_code)]

pub mod checkpoint;
pub mod config;
pub mod error;
pub mod export;
pub mod gguf;
pub mod graph;
mod mapped;
pub mod safetensors;
pub mod tokenizer;

pub use checkpoint::{
    Checkpoint, LayerRole, SourceFile, SourceInfo, SourceKind, Tensor, TensorData, TensorMeta,
    TensorRole, describe,
};
pub use config::{Architecture, HfConfig, ModelConfig, RopeScaling};
pub use error::{IngestError, Result};
pub use export::{ExportError, ExportOptions, ExportProgress, ExportSummary, export};
pub use tokenizer::TokenizerFiles;
