//! The runtime's integration tests, linked into one binary.

mod engine_runs;
mod fake;
mod scheduler_steps;
