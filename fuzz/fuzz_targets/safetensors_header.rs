//! Arbitrary bytes through the whole in-memory safetensors read path: header length, JSON,
//! offsets, dtype policy and decoding. Any outcome but a panic (or a sanitizer report) passes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(tensors) = tlaloc_export::safetensors::decode_all(data) {
        for (_, tensor) in tensors {
            let _ = tensor.to_f32();
        }
    }
});
