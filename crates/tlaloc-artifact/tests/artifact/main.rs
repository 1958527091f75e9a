//! Integration tests of the artifact crate, linked into one binary.

mod fixture;
mod ladder;
mod loader;
mod writer;
