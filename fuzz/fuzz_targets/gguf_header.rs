//! Arbitrary bytes through the GGUF header parser; every tensor it accepts is then dequantized
//! from the bytes it claims, so an accepted offset or size that is wrong shows up as a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tlaloc_export::gguf::{dequantize, GgufHeader};

fuzz_target!(|data: &[u8]| {
    if let Ok(header) = GgufHeader::parse(data) {
        for t in &header.tensors {
            let bytes = &data[t.offset..t.offset + t.byte_len];
            let values = dequantize(t.ggml_type, bytes);
            assert_eq!(values.len(), t.element_count());
        }
    }
});
