//! The server's integration tests, linked into one binary.

mod fake;
mod routes;
mod text;
