//! The runtime's integration tests, linked into one binary.

mod constrained;
mod engine_runs;
mod fake;
mod model_runs;
mod parked;
mod prefix;
mod scheduler_steps;
mod shipped_executables;
mod step_rows;
mod streams;
mod toy;
