//! The runtime's integration tests, linked into one binary.

mod constrained;
mod engine_runs;
mod fake;
mod model_runs;
mod parked;
mod prefill_batches;
mod prefix;
mod scheduler_steps;
mod shipped_executables;
mod step_rows;
mod streams;
mod toy;
