//! Whole-file reads of checkpoint files.
//!
//! The files are read into memory rather than memory-mapped: mapping is an `unsafe` call, and the
//! project keeps every `unsafe` block in the PJRT binding. Export is a one-off step that visits
//! every byte anyway, so the cost is memory (the size of the largest file), not time.

use std::fs::File;
use std::io::Read;

/// Reads all of `file`.
pub(crate) fn map_file(file: &File) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    (&*file).read_to_end(&mut bytes)?;
    Ok(bytes)
}
