//! Integration tests of the artifact crate, linked into one binary.

mod dtype;
mod executables;
mod fixture;
mod hostile_json;
mod ladder;
mod loader;
mod tensor_parallel;
mod variants;
mod writer;
