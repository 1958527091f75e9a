//! The GGUF container: magic, version, typed metadata and tensor infos, parsed from untrusted
//! bytes. Every count and length is capped and bounded by the bytes that remain, all arithmetic is
//! checked, and every tensor must lie, aligned, inside the file. Written by hand because the Rust
//! GGUF readers on crates.io come bundled with inference stacks (candle) this crate does not want.

use std::collections::BTreeMap;

use super::dequant::{DequantError, GgmlType};

/// Longest string accepted (chat templates are a few KB; 16 MiB leaves room).
pub const MAX_STRING_LEN: u64 = 1 << 24;
/// Most elements accepted in one metadata array (vocabularies are ~10^5).
pub const MAX_ARRAY_LEN: u64 = 1 << 24;
/// Most metadata keys accepted.
pub const MAX_KV_COUNT: u64 = 1 << 16;
/// Most tensors accepted.
pub const MAX_TENSOR_COUNT: u64 = 1 << 20;
/// Most dimensions of one tensor (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: u32 = 4;
const DEFAULT_ALIGNMENT: u64 = 32;

/// Why a GGUF header was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// The bytes are not a well-formed GGUF header (a sentence naming what and where).
    #[error("{0}")]
    Malformed(String),
    /// A tensor names an element type id that is not a current ggml type, so its size (and
    /// everything after it) cannot be known.
    #[error("tensor {tensor:?}: {error}")]
    UnknownType {
        /// The tensor's name.
        tensor: String,
        /// The refusal, naming the id.
        error: DequantError,
    },
}

impl From<String> for HeaderError {
    fn from(reason: String) -> Self {
        HeaderError::Malformed(reason)
    }
}

impl From<&str> for HeaderError {
    fn from(reason: &str) -> Self {
        HeaderError::Malformed(reason.to_string())
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    /// `UINT8`.
    U8(u8),
    /// `INT8`.
    I8(i8),
    /// `UINT16`.
    U16(u16),
    /// `INT16`.
    I16(i16),
    /// `UINT32`.
    U32(u32),
    /// `INT32`.
    I32(i32),
    /// `FLOAT32`.
    F32(f32),
    /// `BOOL`.
    Bool(bool),
    /// `STRING` (UTF-8).
    String(String),
    /// `UINT64`.
    U64(u64),
    /// `INT64`.
    I64(i64),
    /// `FLOAT64`.
    F64(f64),
    /// `ARRAY` of scalars or strings (nested arrays are refused).
    Array(Vec<MetaValue>),
}

impl MetaValue {
    /// The value as a non-negative integer, if it is an integer type holding one.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, if it is a float type.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The value as a string, if it is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as an array, if it is one.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(v) => Some(v),
            _ => None,
        }
    }

    /// The value as a bool, if it is one.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }
}

/// One tensor's description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufTensorInfo {
    /// Name (`blk.0.attn_q.weight`, ...).
    pub name: String,
    /// ggml dimensions, fastest first (`ne[0]` is the row length).
    pub ne: Vec<usize>,
    /// Element encoding (possibly one [`super::dequantize`] does not read; the checkpoint
    /// refuses those by name when it opens).
    pub ggml_type: GgmlType,
    /// Absolute byte offset of the data in the file.
    pub offset: usize,
    /// Bytes of data.
    pub byte_len: usize,
}

impl GgufTensorInfo {
    /// Dimensions outermost first, as Hugging Face and numpy write them.
    pub fn hf_dims(&self) -> Vec<usize> {
        self.ne.iter().rev().copied().collect()
    }

    /// Number of elements.
    pub fn element_count(&self) -> usize {
        self.ne.iter().product()
    }
}

/// A parsed GGUF header.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufHeader {
    /// Format version (2 or 3).
    pub version: u32,
    /// Metadata in key order.
    pub metadata: BTreeMap<String, MetaValue>,
    /// Tensors in file order.
    pub tensors: Vec<GgufTensorInfo>,
    /// Alignment of tensor data.
    pub alignment: usize,
    /// Absolute offset where tensor data starts.
    pub data_offset: usize,
}

impl GgufHeader {
    /// A metadata value.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    /// Parses the header of a whole GGUF file held in `bytes`, checking that every tensor's data
    /// lies inside it. Errors name what is wrong and where. Tensors of any current ggml type are
    /// accepted here (their sizes are known); only an unknown type id stops the parse.
    pub fn parse(bytes: &[u8]) -> Result<Self, HeaderError> {
        let mut r = Reader { bytes, pos: 0 };
        let magic = r.take(4)?;
        if magic != b"GGUF" {
            return Err(format!("bad magic {magic:02x?}; a GGUF file starts with \"GGUF\"").into());
        }
        let version = r.u32()?;
        if !(version == 2 || version == 3) {
            return Err(format!(
                "GGUF version {version} is not supported; versions 2 and 3 (little-endian) are read"
            )
            .into());
        }
        let tensor_count = r.count(MAX_TENSOR_COUNT, 24, "tensor count")?;
        let kv_count = r.count(MAX_KV_COUNT, 12, "metadata count")?;
        let mut metadata = BTreeMap::new();
        for _ in 0..kv_count {
            let at = r.pos;
            let key = r.string()?;
            let value = r.value(0)?;
            if metadata.insert(key.clone(), value).is_some() {
                return Err(
                    format!("metadata key {key:?} appears twice (second at byte {at})").into(),
                );
            }
        }
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(MetaValue::U32(a)) if a.is_power_of_two() => u64::from(*a),
            Some(other) => {
                return Err(format!(
                    "general.alignment is {other:?}; a UINT32 power of two is accepted"
                )
                .into());
            }
        };
        let mut tensors = Vec::with_capacity(tensor_count.min(4096));
        let mut raw_offsets = Vec::with_capacity(tensor_count.min(4096));
        let mut names = std::collections::BTreeSet::new();
        for _ in 0..tensor_count {
            let at = r.pos;
            let name = r.string()?;
            if !names.insert(name.clone()) {
                return Err(format!("tensor {name:?} appears twice (second at byte {at})").into());
            }
            let n_dims = r.u32()?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(format!(
                    "tensor {name:?} has {n_dims} dimensions; 1 to {MAX_DIMS} are accepted"
                )
                .into());
            }
            let mut ne = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                let d = r.u64()?;
                let d = usize::try_from(d)
                    .ok()
                    .filter(|&d| d > 0 && d <= i64::MAX as usize)
                    .ok_or_else(|| {
                        format!("tensor {name:?} has dimension {d}; positive sizes are accepted")
                    })?;
                ne.push(d);
            }
            let type_id = r.u32()?;
            let ggml_type =
                GgmlType::from_id(type_id).map_err(|error| HeaderError::UnknownType {
                    tensor: name.clone(),
                    error,
                })?;
            let offset = r.u64()?;
            if offset % alignment != 0 {
                return Err(format!(
                    "tensor {name:?} data offset {offset} is not a multiple of the alignment {alignment}"
                )
                .into());
            }
            let elements = ne
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .ok_or_else(|| {
                    format!(
                        "tensor {name:?} ({}) dimensions {ne:?} overflow",
                        ggml_type.name()
                    )
                })?;
            let (block, block_bytes) = ggml_type.block();
            if ne[0] % block != 0 {
                return Err(format!(
                    "tensor {name:?} row length {} is not a multiple of the {} block size {block}",
                    ne[0],
                    ggml_type.name()
                )
                .into());
            }
            let byte_len = (elements / block).checked_mul(block_bytes).ok_or_else(|| {
                format!(
                    "tensor {name:?} ({}, dimensions {ne:?}) byte size overflows",
                    ggml_type.name()
                )
            })?;
            raw_offsets.push(offset);
            tensors.push(GgufTensorInfo {
                name,
                ne,
                ggml_type,
                offset: 0,
                byte_len,
            });
        }
        let data_offset = (r.pos as u64)
            .checked_next_multiple_of(alignment)
            .ok_or("data offset overflows")?;
        let file_len = bytes.len() as u64;
        if data_offset > file_len {
            return Err(format!(
                "tensor data would start at byte {data_offset}, past the end ({file_len})"
            )
            .into());
        }
        for (t, raw) in tensors.iter_mut().zip(raw_offsets) {
            let start = data_offset.checked_add(raw);
            let end = start.and_then(|s| s.checked_add(t.byte_len as u64));
            match (start, end) {
                (Some(s), Some(e)) if e <= file_len => t.offset = s as usize,
                _ => {
                    return Err(format!(
                        "tensor {:?} ({} bytes of {} at data offset {raw}) lies past the end of the file ({file_len} bytes)",
                        t.name,
                        t.byte_len,
                        t.ggml_type.name()
                    )
                    .into());
                }
            }
        }
        Ok(Self {
            version,
            metadata,
            tensors,
            alignment: alignment as usize,
            data_offset: data_offset as usize,
        })
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.remaining() {
            return Err(format!(
                "truncated: {n} bytes needed at byte {} but the file has {}",
                self.pos,
                self.bytes.len()
            ));
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A u64 count, capped and bounded by what `min_bytes` per item leaves room for.
    fn count(&mut self, cap: u64, min_bytes: u64, what: &str) -> Result<usize, String> {
        let at = self.pos;
        let n = self.u64()?;
        if n > cap || n.saturating_mul(min_bytes) > self.remaining() as u64 {
            return Err(format!(
                "{what} {n} at byte {at} is over the limit ({cap}) or larger than the file can hold"
            ));
        }
        Ok(n as usize)
    }

    fn string(&mut self) -> Result<String, String> {
        let at = self.pos;
        let len = self.u64()?;
        if len > MAX_STRING_LEN || len > self.remaining() as u64 {
            return Err(format!(
                "string length {len} at byte {at} exceeds the limit ({MAX_STRING_LEN}) or the file"
            ));
        }
        let raw = self.take(len as usize)?;
        String::from_utf8(raw.to_vec()).map_err(|_| format!("string at byte {at} is not UTF-8"))
    }

    fn value(&mut self, depth: u32) -> Result<MetaValue, String> {
        let at = self.pos;
        let ty = self.u32()?;
        self.typed_value(ty, depth, at)
    }

    fn typed_value(&mut self, ty: u32, depth: u32, at: usize) -> Result<MetaValue, String> {
        Ok(match ty {
            0 => MetaValue::U8(u8::from_le_bytes(self.array()?)),
            1 => MetaValue::I8(i8::from_le_bytes(self.array()?)),
            2 => MetaValue::U16(u16::from_le_bytes(self.array()?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.array()?)),
            4 => MetaValue::U32(self.u32()?),
            5 => MetaValue::I32(i32::from_le_bytes(self.array()?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.array()?)),
            7 => match self.take(1)?[0] {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                b => {
                    return Err(format!(
                        "bool at byte {at} has value {b}; 0 or 1 is accepted"
                    ));
                }
            },
            8 => MetaValue::String(self.string()?),
            9 => {
                if depth > 0 {
                    return Err(format!(
                        "nested array at byte {at}; arrays of scalars or strings are accepted"
                    ));
                }
                let elem_at = self.pos;
                let elem_ty = self.u32()?;
                let min_bytes = match elem_ty {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10..=12 => 8,
                    9 => {
                        return Err(format!(
                            "nested array at byte {elem_at}; arrays of scalars or strings are accepted"
                        ));
                    }
                    other => {
                        return Err(format!("unknown metadata type {other} at byte {elem_at}"));
                    }
                };
                let n = self.count(MAX_ARRAY_LEN, min_bytes, "array length")?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.typed_value(elem_ty, depth + 1, elem_at)?);
                }
                MetaValue::Array(items)
            }
            10 => MetaValue::U64(self.u64()?),
            11 => MetaValue::I64(i64::from_le_bytes(self.array()?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.array()?)),
            other => {
                return Err(format!(
                    "unknown metadata type {other} at byte {at}; types 0 to 12 are accepted"
                ));
            }
        })
    }
}
