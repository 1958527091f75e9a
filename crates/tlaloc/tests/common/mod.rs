//! Helpers shared by this crate's integration tests (each test file is its own crate and
//! declares `mod common;`).

use std::path::{Path, PathBuf};

/// A path under Cargo's per-test scratch directory, emptied: whatever an earlier run left there
/// is removed, and the path does not exist on return.
pub fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).unwrap();
    }
    dir
}
