//! Harness: arbitrary bytes as a GGUF file. Whatever the header parser accepts must lie inside
//! the bytes: every tensor of a type that is read dequantizes from the range it claims to exactly
//! its element count, and every other tensor is refused by `dequantize` by name, not by a panic.
//! Shared by the cargo-fuzz target and the stable test that runs the seeds and their mutations.

use tlaloc_export::gguf::{DequantError, GgufHeader, dequantize};

pub fn run(data: &[u8]) {
    let Ok(header) = GgufHeader::parse(data) else {
        return;
    };
    for t in &header.tensors {
        let bytes = &data[t.offset..t.offset + t.byte_len];
        match dequantize(t.ggml_type, bytes) {
            Ok(values) => assert_eq!(values.len(), t.element_count(), "{}", t.name),
            Err(DequantError::Unsupported { name, .. }) => {
                assert!(
                    !t.ggml_type.is_supported(),
                    "{name} refused but listed as read"
                )
            }
            Err(other) => panic!("{}: accepted header but {other}", t.name),
        }
    }
}
