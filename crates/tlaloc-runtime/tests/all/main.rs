//! The runtime's integration tests, linked into one binary.

mod engine_runs;
mod fake;
mod model_runs;
mod scheduler_steps;
mod streams;
mod toy;
