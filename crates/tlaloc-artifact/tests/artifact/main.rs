//! Integration tests of the artifact crate, linked into one binary.

mod dtype;
mod fixture;
mod ladder;
mod loader;
mod writer;
