//! A Triton Inference Server backend over the tlaloc engine: `libtriton_tlaloc.so`, loaded by
//! `tritonserver` as the `tlaloc` backend.
//!
//! Two modes, chosen by the model configuration ([`config`]): **generate** (decoupled; the
//! contract of Triton's vLLM backend: `text_input`, `stream`, `sampling_parameters` in,
//! `text_output`, `finish_reason` out) and **sequence** (the sequence batcher's START / END /
//! CORRID controls with the `oldest` strategy; a sequence's K/V pages stay in the pool between
//! its requests). [`backend`] owns one engine per model and answers every request from the
//! engine's side through its response factory; [`ffi`] is the C boundary and the only module
//! with `unsafe`.

#![deny(unsafe_code)]

pub mod backend;
pub mod config;
pub mod error;
#[allow(unsafe_code)]
pub mod ffi;
pub mod params;
pub mod text;

pub use error::{BackendError, Code};
