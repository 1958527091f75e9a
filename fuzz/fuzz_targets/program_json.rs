//! cargo-fuzz target over the shared harness `fuzz/harness/program_json.rs` (the stable test suite runs
//! the same harness over `fuzz/seeds/program_json` and seeded mutations of it).
#![no_main]

#[path = "../harness/program_json.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::run(data));
