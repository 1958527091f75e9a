//! Safe Rust binding of the PJRT C API, loaded at run time.
//!
//! Every `unsafe` block of the project lives in this crate.
