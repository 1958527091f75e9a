//! Checkpoint readers (safetensors, GGUF), Llama-family model graphs and the artifact
//! writer.
//!
//! Ingestion: [`Checkpoint::open`] reads a Hugging Face directory or a `.gguf` file into a checked
//! [`ModelConfig`], [`TokenizerFiles`] and tensors addressed by [`TensorRole`]; [`describe`]
//! renders what `tlaloc inspect` prints about an accepted one, and [`Survey`] what it says first
//! about any: architecture, tensors per element type, and whether export accepts it.

#![forbid(unsafe_code)]

pub mod checkpoint;
pub mod config;
pub mod error;
pub mod export;
pub mod gguf;
pub mod graph;
pub mod hf_config;
mod mapped;
pub mod safetensors;
pub mod survey;
pub mod tensor_parallel;
pub mod tokenizer;

pub use checkpoint::{
    Checkpoint, LayerRole, SourceFile, SourceInfo, SourceKind, Tensor, TensorData, TensorMeta,
    TensorRole, describe,
};
pub use config::{Activation, Architecture, HfConfig, LayerWindows, ModelConfig, RopeScaling};
pub use error::{IngestError, Result};
pub use export::{
    ExportError, ExportOptions, ExportProgress, ExportSummary, export, export_checkpoint,
};
pub use survey::{Survey, TypeCount};
pub use tokenizer::TokenizerFiles;
