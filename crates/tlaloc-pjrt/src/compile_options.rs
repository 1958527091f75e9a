//! `xla.CompileOptionsProto`, encoded by hand.
//!
//! Only four fields are ever written, so a dozen lines of protobuf wire format replace a
//! protobuf toolchain and the XLA `.proto` tree. The bytes are always built here from typed
//! values: malformed compile-option bytes can crash a plugin, so raw bytes are never accepted.
//!
//! Field numbers (xla/pjrt/proto/compile_options.proto):
//! `CompileOptionsProto.executable_build_options = 3` (message);
//! `ExecutableBuildOptionsProto.device_ordinal = 1`, `num_replicas = 4`, `num_partitions = 5`
//! (int64), `use_spmd_partitioning = 6` (bool).

/// Typed compile options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompileOptions {
    pub num_replicas: u32,
    pub num_partitions: u32,
    pub use_spmd_partitioning: bool,
}

impl Default for CompileOptions {
    fn default() -> CompileOptions {
        CompileOptions {
            num_replicas: 1,
            num_partitions: 1,
            use_spmd_partitioning: false,
        }
    }
}

const WIRE_VARINT: u64 = 0;
const WIRE_LEN: u64 = 2;

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_tag(out: &mut Vec<u8>, field: u64, wire: u64) {
    put_varint(out, (field << 3) | wire);
}

impl CompileOptions {
    /// The serialized `xla.CompileOptionsProto`.
    ///
    /// `device_ordinal` is written as -1 ("not set"), the value XLA's own
    /// `ExecutableBuildOptions` serializes by default; `use_spmd_partitioning` only when true
    /// (proto3 omits a false bool).
    pub fn to_proto_bytes(&self) -> Vec<u8> {
        let mut build = Vec::new();
        put_tag(&mut build, 1, WIRE_VARINT);
        // int64 -1 is encoded as its two's complement, a ten-byte varint.
        put_varint(&mut build, -1i64 as u64);
        put_tag(&mut build, 4, WIRE_VARINT);
        put_varint(&mut build, u64::from(self.num_replicas));
        put_tag(&mut build, 5, WIRE_VARINT);
        put_varint(&mut build, u64::from(self.num_partitions));
        if self.use_spmd_partitioning {
            put_tag(&mut build, 6, WIRE_VARINT);
            put_varint(&mut build, 1);
        }
        let mut out = Vec::with_capacity(build.len() + 3);
        put_tag(&mut out, 3, WIRE_LEN);
        put_varint(&mut out, build.len() as u64);
        out.extend_from_slice(&build);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_options_encode_to_the_expected_wire_bytes() {
        // 0x1a = field 3 (executable_build_options), wire type 2; 0x0f = 15 bytes follow.
        // 0x08 = field 1 (device_ordinal), varint; -1 as a 64-bit two's complement varint is
        //        nine 0xff bytes and a final 0x01.
        // 0x20 = field 4 (num_replicas), varint 1; 0x28 = field 5 (num_partitions), varint 1.
        let expected = [
            0x1a, 0x0f, 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x20,
            0x01, 0x28, 0x01,
        ];
        assert_eq!(CompileOptions::default().to_proto_bytes(), expected);
    }

    #[test]
    fn spmd_and_large_counts_encode_as_varints() {
        let options = CompileOptions {
            num_replicas: 300,
            num_partitions: 2,
            use_spmd_partitioning: true,
        };
        // 300 = 0b10_0101100 -> 0xac 0x02; 0x30 = field 6 (use_spmd_partitioning), varint 1.
        let expected = [
            0x1a, 0x12, 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x20,
            0xac, 0x02, 0x28, 0x02, 0x30, 0x01,
        ];
        assert_eq!(options.to_proto_bytes(), expected);
    }
}
