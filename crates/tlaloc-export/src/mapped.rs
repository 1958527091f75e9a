//! Read-only memory maps of checkpoint files: the one `unsafe` call of this crate.
//!
//! Mapping is unsafe because the bytes could change under the map if another process truncated or
//! rewrote the file. Checkpoints are immutable inputs (the safetensors and candle readers make the
//! same assumption), and multi-gigabyte weights are not worth copying into memory to avoid it.

use std::fs::File;

use memmap2::Mmap;

/// Maps `file` read-only.
pub(crate) fn map_file(file: &File) -> std::io::Result<Mmap> {
    // SAFETY: the map is read-only and checkpoint files are not modified while a checkpoint is
    // open; every read through it is bounds-checked against its length.
    unsafe { Mmap::map(file) }
}
