//! `xla.CompileOptionsProto`, encoded by hand.
//!
//! Only a handful of fields are ever written, so a few dozen lines of protobuf wire format
//! replace a protobuf toolchain and the XLA `.proto` tree. The bytes are always built here from
//! typed values: malformed compile-option bytes can crash a plugin, so raw bytes are never
//! accepted.
//!
//! Field numbers (xla/pjrt/proto/compile_options.proto, xla/xla_data.proto):
//! `CompileOptionsProto.executable_build_options = 3` (message);
//! `ExecutableBuildOptionsProto.device_ordinal = 1`, `num_replicas = 4`, `num_partitions = 5`
//! (int64), `use_spmd_partitioning = 6` (bool), `device_assignment = 9` (message);
//! `DeviceAssignmentProto.replica_count = 1`, `computation_count = 2` (int32),
//! `computation_devices = 3` (repeated message, one per computation, i.e. per partition);
//! `DeviceAssignmentProto.ComputationDevice.replica_device_ids = 1` (repeated int64, written
//! packed as proto3 does); `CompileOptionsProto.env_option_overrides = 7` (a
//! `map<string, OptionOverrideProto>`, on the wire one entry message per key: `key = 1`,
//! `value = 2`), `OptionOverrideProto.string_field = 1`, `bool_field = 2`, `int_field = 3`.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::{Error, Result};

/// Which device runs each (replica, partition) of a program: `xla.DeviceAssignmentProto`.
///
/// Stored as the proto lays it out: one row per partition (XLA's "computation"), each row
/// holding the device id of every replica of that partition. Rectangular, non-empty, with no
/// device used twice; [`DeviceAssignment::new`] refuses anything else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAssignment {
    by_partition: Vec<Vec<i32>>,
}

impl DeviceAssignment {
    /// `by_partition[p][r]` is the id ([`Device::id`](crate::Device::id)) of the device that runs
    /// replica `r` of partition `p`. Refused unless there is at least one partition, every
    /// partition lists the same number (at least one) of replicas, and no id is negative or
    /// repeated.
    pub fn new(by_partition: Vec<Vec<i32>>) -> Result<DeviceAssignment> {
        let replicas = by_partition.first().map_or(0, Vec::len);
        if replicas == 0 {
            return Err(Error::InvalidArgument(format!(
                "device assignment {by_partition:?} is empty; give one row per partition, each \
                 with one device id per replica (e.g. [[0], [1]] for 2 partitions of 1 replica)"
            )));
        }
        if let Some((partition, row)) = by_partition
            .iter()
            .enumerate()
            .find(|(_, row)| row.len() != replicas)
        {
            return Err(Error::InvalidArgument(format!(
                "device assignment {by_partition:?}: partition {partition} lists {} devices, \
                 partition 0 lists {replicas}; every partition needs one device per replica",
                row.len()
            )));
        }
        let mut seen = BTreeSet::new();
        for &id in by_partition.iter().flatten() {
            if id < 0 || !seen.insert(id) {
                return Err(Error::InvalidArgument(format!(
                    "device assignment {by_partition:?}: device id {id} is {}; each (replica, \
                     partition) needs its own device id, 0 or more",
                    if id < 0 { "negative" } else { "used twice" }
                )));
            }
        }
        Ok(DeviceAssignment { by_partition })
    }

    /// One replica of `device_ids.len()` partitions, partition `p` on `device_ids[p]` (the
    /// assignment of an SPMD program).
    pub fn partitions(device_ids: &[i32]) -> Result<DeviceAssignment> {
        DeviceAssignment::new(device_ids.iter().map(|&id| vec![id]).collect())
    }

    /// Number of replicas (`replica_count`).
    pub fn num_replicas(&self) -> usize {
        self.by_partition[0].len()
    }

    /// Number of partitions (`computation_count`).
    pub fn num_partitions(&self) -> usize {
        self.by_partition.len()
    }

    /// The id of the device that runs `replica` of `partition`.
    pub fn device_id(&self, replica: usize, partition: usize) -> Option<i32> {
        self.by_partition.get(partition)?.get(replica).copied()
    }

    fn to_proto_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        put_tag(&mut out, 1, WIRE_VARINT);
        put_varint(&mut out, self.num_replicas() as u64);
        put_tag(&mut out, 2, WIRE_VARINT);
        put_varint(&mut out, self.num_partitions() as u64);
        for row in &self.by_partition {
            let mut ids = Vec::new();
            for &id in row {
                // Non-negative (checked in `new`), so the int64 varint is the plain value.
                put_varint(&mut ids, u64::from(id.unsigned_abs()));
            }
            let mut computation = Vec::with_capacity(ids.len() + 2);
            put_tag(&mut computation, 1, WIRE_LEN);
            put_varint(&mut computation, ids.len() as u64);
            computation.extend_from_slice(&ids);
            put_tag(&mut out, 3, WIRE_LEN);
            put_varint(&mut out, computation.len() as u64);
            out.extend_from_slice(&computation);
        }
        out
    }
}

/// The value of one XLA compiler option ([`CompileOptions::xla_options`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum XlaOptionValue {
    Bool(bool),
    Int(i64),
    String(String),
}

impl XlaOptionValue {
    /// `true`/`false` as a bool, an integer as an int, anything else as a string: how the
    /// options are written on a command line (`xla_gpu_enable_command_buffer=` is the empty
    /// string).
    pub fn parse(text: &str) -> XlaOptionValue {
        match text {
            "true" => XlaOptionValue::Bool(true),
            "false" => XlaOptionValue::Bool(false),
            _ => text
                .parse::<i64>()
                .map(XlaOptionValue::Int)
                .unwrap_or_else(|_| XlaOptionValue::String(text.to_string())),
        }
    }
}

impl std::fmt::Display for XlaOptionValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            XlaOptionValue::Bool(v) => write!(f, "{v}"),
            XlaOptionValue::Int(v) => write!(f, "{v}"),
            XlaOptionValue::String(v) => f.write_str(v),
        }
    }
}

/// Typed compile options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileOptions {
    pub num_replicas: u32,
    pub num_partitions: u32,
    pub use_spmd_partitioning: bool,
    /// A static device assignment; when `None` the plugin picks its default one. When set it
    /// must have `num_replicas` replicas and `num_partitions` partitions
    /// ([`Client::compile`](crate::Client::compile) refuses it otherwise).
    pub device_assignment: Option<DeviceAssignment>,
    /// XLA compiler options (fields of `xla.DebugOptions`, e.g. `xla_gpu_enable_command_buffer`)
    /// for this compile alone, sent as the proto's `env_option_overrides`: unlike `XLA_FLAGS`
    /// they belong to one executable, not to the process. A name XLA does not know is refused
    /// by the plugin when compiling. Kept sorted, so equal options encode to equal bytes.
    pub xla_options: BTreeMap<String, XlaOptionValue>,
}

impl Default for CompileOptions {
    fn default() -> CompileOptions {
        CompileOptions {
            num_replicas: 1,
            num_partitions: 1,
            use_spmd_partitioning: false,
            device_assignment: None,
            xla_options: BTreeMap::new(),
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
    /// SPMD options for one replica of `device_ids.len()` partitions, partition `p` on device
    /// `device_ids[p]`.
    pub fn spmd(device_ids: &[i32]) -> Result<CompileOptions> {
        let assignment = DeviceAssignment::partitions(device_ids)?;
        Ok(CompileOptions {
            num_replicas: 1,
            num_partitions: u32::try_from(assignment.num_partitions()).map_err(|_| {
                Error::InvalidArgument(format!("{} partitions is too many", device_ids.len()))
            })?,
            use_spmd_partitioning: true,
            device_assignment: Some(assignment),
            xla_options: BTreeMap::new(),
        })
    }

    /// Refuses options whose device assignment disagrees with the replica and partition counts
    /// (a plugin would fail later with a less clear message, or abort).
    pub fn validate(&self) -> Result<()> {
        if let Some(assignment) = &self.device_assignment {
            let (replicas, partitions) = (assignment.num_replicas(), assignment.num_partitions());
            if replicas != self.num_replicas as usize || partitions != self.num_partitions as usize
            {
                return Err(Error::InvalidArgument(format!(
                    "the device assignment has {replicas} replicas x {partitions} partitions, \
                     the options ask for num_replicas = {} and num_partitions = {}; they must agree",
                    self.num_replicas, self.num_partitions
                )));
            }
        }
        Ok(())
    }

    /// The serialized `xla.CompileOptionsProto`.
    ///
    /// `device_ordinal` is written as -1 ("not set"), the value XLA's own
    /// `ExecutableBuildOptions` serializes by default; `use_spmd_partitioning` only when true
    /// (proto3 omits a false bool); `device_assignment` only when set; one
    /// `env_option_overrides` entry per XLA option, in name order.
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
        if let Some(assignment) = &self.device_assignment {
            let assignment = assignment.to_proto_bytes();
            put_tag(&mut build, 9, WIRE_LEN);
            put_varint(&mut build, assignment.len() as u64);
            build.extend_from_slice(&assignment);
        }
        let mut out = Vec::with_capacity(build.len() + 3);
        put_tag(&mut out, 3, WIRE_LEN);
        put_varint(&mut out, build.len() as u64);
        out.extend_from_slice(&build);
        for (name, value) in &self.xla_options {
            let mut value_bytes = Vec::new();
            match value {
                XlaOptionValue::String(text) => put_bytes(&mut value_bytes, 1, text.as_bytes()),
                XlaOptionValue::Bool(flag) => {
                    put_tag(&mut value_bytes, 2, WIRE_VARINT);
                    put_varint(&mut value_bytes, u64::from(*flag));
                }
                XlaOptionValue::Int(number) => {
                    put_tag(&mut value_bytes, 3, WIRE_VARINT);
                    // int64: two's complement, as for device_ordinal above.
                    put_varint(&mut value_bytes, *number as u64);
                }
            }
            let mut entry = Vec::new();
            put_bytes(&mut entry, 1, name.as_bytes());
            put_bytes(&mut entry, 2, &value_bytes);
            put_bytes(&mut out, 7, &entry);
        }
        out
    }
}

/// A length-delimited field: tag, length, bytes.
fn put_bytes(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    put_tag(out, field, WIRE_LEN);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
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
    fn xla_options_encode_as_env_option_override_entries_in_name_order() {
        let mut options = CompileOptions::default();
        options
            .xla_options
            .insert("b".into(), XlaOptionValue::parse("true"));
        options
            .xla_options
            .insert("a".into(), XlaOptionValue::parse("-2"));
        options
            .xla_options
            .insert("c".into(), XlaOptionValue::parse(""));
        let mut expected = CompileOptions::default().to_proto_bytes();
        expected.extend([
            // 0x3a = field 7 (env_option_overrides), wire type 2; 16 bytes of entry:
            // 0x0a 0x01 'a' = key; 0x12 = field 2 (value), 11 bytes of OptionOverrideProto:
            // 0x18 = field 3 (int_field), -2 as a ten-byte two's complement varint.
            0x3a, 0x10, 0x0a, 0x01, b'a', 0x12, 0x0b, 0x18, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff,
            0xff, 0xff, 0xff, 0x01, // key 'b', value: 0x10 = field 2 (bool_field), 1.
            0x3a, 0x07, 0x0a, 0x01, b'b', 0x12, 0x02, 0x10, 0x01,
            // key 'c', value: 0x0a = field 1 (string_field), empty.
            0x3a, 0x07, 0x0a, 0x01, b'c', 0x12, 0x02, 0x0a, 0x00,
        ]);
        assert_eq!(options.to_proto_bytes(), expected);
    }

    #[test]
    fn spmd_and_large_counts_encode_as_varints() {
        let options = CompileOptions {
            num_replicas: 300,
            num_partitions: 2,
            use_spmd_partitioning: true,
            device_assignment: None,
            xla_options: BTreeMap::new(),
        };
        // 300 = 0b10_0101100 -> 0xac 0x02; 0x30 = field 6 (use_spmd_partitioning), varint 1.
        let expected = [
            0x1a, 0x12, 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x20,
            0xac, 0x02, 0x28, 0x02, 0x30, 0x01,
        ];
        assert_eq!(options.to_proto_bytes(), expected);
    }

    #[test]
    fn spmd_device_assignment_encodes_one_computation_per_partition() {
        let options = CompileOptions::spmd(&[0, 1]).unwrap();
        // 0x1a = field 3 (executable_build_options), wire type 2; 0x21 = 33 bytes follow:
        //   11 bytes of device_ordinal -1 (as in the test above),
        //   0x20 0x01 num_replicas 1, 0x28 0x02 num_partitions 2, 0x30 0x01 use_spmd true,
        //   0x4a = field 9 (device_assignment) << 3 | 2; 0x0e = 14 bytes of DeviceAssignmentProto:
        //     0x08 0x01 = field 1 (replica_count) 1; 0x10 0x02 = field 2 (computation_count) 2;
        //     0x1a 0x03 = field 3 (computation_devices), a 3-byte ComputationDevice:
        //       0x0a 0x01 0x00 = field 1 (replica_device_ids) packed, 1 byte: device 0;
        //     0x1a 0x03 0x0a 0x01 0x01 = the second partition's ComputationDevice: device 1.
        // 33 = 11 + 2 + 2 + 2 + 2 + 14.
        let expected = [
            0x1a, 0x21, 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x20,
            0x01, 0x28, 0x02, 0x30, 0x01, 0x4a, 0x0e, 0x08, 0x01, 0x10, 0x02, 0x1a, 0x03, 0x0a,
            0x01, 0x00, 0x1a, 0x03, 0x0a, 0x01, 0x01,
        ];
        assert_eq!(options.to_proto_bytes(), expected);
        options.validate().unwrap();
    }

    #[test]
    fn replica_device_ids_are_packed_varints() {
        // One partition of two replicas, on devices 5 and 300: the packed list's length counts
        // bytes (1 for 5, 2 for 300 = 0xac 0x02), not elements.
        let options = CompileOptions {
            num_replicas: 2,
            num_partitions: 1,
            use_spmd_partitioning: false,
            device_assignment: Some(DeviceAssignment::new(vec![vec![5, 300]]).unwrap()),
            xla_options: BTreeMap::new(),
        };
        // 0x1a 0x1c: 28 bytes = 11 (device_ordinal) + 0x20 0x02 + 0x28 0x01 + 0x4a 0x0b + 11:
        //   0x08 0x02 replica_count 2, 0x10 0x01 computation_count 1,
        //   0x1a 0x05 one ComputationDevice of 5 bytes: 0x0a 0x03 (packed, 3 bytes) 0x05 0xac 0x02.
        let expected = [
            0x1a, 0x1c, 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x20,
            0x02, 0x28, 0x01, 0x4a, 0x0b, 0x08, 0x02, 0x10, 0x01, 0x1a, 0x05, 0x0a, 0x03, 0x05,
            0xac, 0x02,
        ];
        assert_eq!(options.to_proto_bytes(), expected);
        assert_eq!(
            options.device_assignment.as_ref().unwrap().device_id(1, 0),
            Some(300)
        );
    }

    #[test]
    fn malformed_device_assignments_are_refused() {
        for (table, says) in [
            (vec![], "empty"),
            (vec![vec![]], "empty"),
            (vec![vec![0], vec![1, 2]], "partition 1 lists 2 devices"),
            (vec![vec![0], vec![0]], "device id 0 is used twice"),
            (vec![vec![-1]], "device id -1 is negative"),
        ] {
            match DeviceAssignment::new(table.clone()) {
                Err(Error::InvalidArgument(message)) => {
                    assert!(message.contains(says), "{table:?}: {message}")
                }
                other => panic!("{table:?}: {other:?}"),
            }
        }
        let mut options = CompileOptions::spmd(&[0, 1]).unwrap();
        options.num_partitions = 4;
        match options.validate() {
            Err(Error::InvalidArgument(message)) => assert!(
                message.contains("1 replicas x 2 partitions") && message.contains("= 4"),
                "{message}"
            ),
            other => panic!("{other:?}"),
        }
    }
}
