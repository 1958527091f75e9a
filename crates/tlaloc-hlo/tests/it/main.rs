//! The crate's integration tests, linked into one binary.

mod cases;
mod errors;
mod execution;
mod snapshots;
mod support;
