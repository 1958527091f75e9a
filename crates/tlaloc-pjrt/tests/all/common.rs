//! Helpers shared by the tests.

use std::path::Path;

use tlaloc_pjrt::{Client, CompileOptions, LoadedExecutable};

/// Runs `check` once per test plugin, naming the plugin when it fails.
pub fn on_each_plugin(check: impl Fn(&Path, &Client)) {
    for (path, client) in tlaloc_pjrt::testing::test_clients() {
        eprintln!("plugin {}", path.display());
        check(&path, &client);
    }
}

pub fn compile(client: &Client, mlir: &str) -> LoadedExecutable {
    client
        .compile(mlir, &CompileOptions::default())
        .unwrap_or_else(|e| panic!("compile failed: {e}\n{mlir}"))
}

/// Deterministic pseudo-random values in [-1, 1) (a 64-bit LCG), so inputs are not symmetric.
pub fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}
