//! The server's integration tests, linked into one binary.

mod fake;
mod hostile_bodies;
mod openapi;
mod routes;
mod text;
mod wire;
