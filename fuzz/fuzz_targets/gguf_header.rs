//! cargo-fuzz target over the shared harness `fuzz/harness/gguf_header.rs` (the stable test suite
//! runs the same harness over `fuzz/seeds/gguf_header` and seeded mutations of it).
#![no_main]

#[path = "../harness/gguf_header.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::run(data));
