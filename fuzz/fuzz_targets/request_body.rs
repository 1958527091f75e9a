//! cargo-fuzz target over the shared harness `fuzz/harness/request_body.rs` (the stable test suite runs
//! the same harness over `fuzz/seeds/request_body` and seeded mutations of it).
#![no_main]

#[path = "../harness/request_body.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::run(data));
