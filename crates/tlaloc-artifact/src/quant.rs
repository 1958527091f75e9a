//! Block-quantized weight formats: the one place the exporter (which writes the blocks), the
//! graph (which dequantizes them in the portable body or passes them to a kernel) and the
//! runtime (which uploads them and hands them to its kernels) learn a format's block size,
//! byte layout and the operand it makes.
//!
//! A block-quantized weight keeps its logical dims `[out, in]` in the manifest
//! (`WeightEntry::dims`) and names its format (`WeightEntry::block_format`); its file and its
//! program operand are the raw blocks, `u8 [out, in / block_elements * block_bytes]`: each row
//! is its `in / block_elements` blocks one after the other, exactly as llama.cpp stores a
//! tensor row. Rows stay whole blocks, so row operations (concatenating fused projections,
//! permuting Q/K rows) work on the bytes of whole rows.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::Dtype;

/// A block format of quantized weights, named as llama.cpp names it.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BlockFormat {
    /// llama.cpp's `Q8_0`: blocks of 32 elements in 34 bytes, a little-endian IEEE f16 scale
    /// `d` then 32 `i8` codes `q`; element `i` of the block is `d * q[i]` (exact in f32: an
    /// f16 significand of 11 bits times a code of 8 bits needs at most 19).
    #[serde(rename = "q8_0")]
    Q8_0,
    /// llama.cpp's `Q4_0`: blocks of 32 elements in 18 bytes, a little-endian IEEE f16 scale
    /// `d` then 16 bytes `qs` of two 4-bit codes each; element `j < 16` is
    /// `d * ((qs[j] & 0xF) - 8)` and element `j + 16` is `d * ((qs[j] >> 4) - 8)` (exact in
    /// f32).
    #[serde(rename = "q4_0")]
    Q4_0,
    /// llama.cpp's `Q4_1`: blocks of 32 elements in 20 bytes, little-endian IEEE f16 `d` and
    /// `m`, then 16 bytes `qs` of two 4-bit codes each; element `j < 16` is
    /// `d * (qs[j] & 0xF) + m` and element `j + 16` is `d * (qs[j] >> 4) + m` (the product
    /// exact in f32, the sum rounded once).
    #[serde(rename = "q4_1")]
    Q4_1,
    /// llama.cpp's `Q5_0`: blocks of 32 elements in 22 bytes, a little-endian IEEE f16 scale
    /// `d`, a little-endian u32 `qh` of high bits, then 16 bytes `qs` as Q4_0's; the code of
    /// element `e` is its nibble (as Q4_0's) with bit `e` of `qh` as bit 4, and the element is
    /// `d * (code - 16)` (exact in f32).
    #[serde(rename = "q5_0")]
    Q5_0,
    /// llama.cpp's `Q4_K`: super-blocks of 256 elements in 144 bytes, little-endian IEEE f16
    /// `d` and `dmin`, 12 bytes of eight packed 6-bit (scale, min) pairs, then 128 bytes `qs`.
    /// The super-block is eight sub-blocks of 32 elements: sub-block `j` takes the low nibbles
    /// (`j` even) or the high nibbles (`j` odd) of bytes `32 (j / 2) .. 32 (j / 2) + 32` of `qs`.
    /// With the scale bytes read as three groups `a, b, c` of four, pair `j < 4` is
    /// `(a[j] & 63, b[j] & 63)` and pair `j + 4` is `((c[j] & 15) | (a[j] >> 6) << 4,
    /// (c[j] >> 4) | (b[j] >> 6) << 4)` (llama.cpp's `get_scale_min_k4`). An element of
    /// sub-block `j` is `(d * sc[j]) * code - dmin * mn[j]`: both products exact in f32 (at
    /// most 11 + 6 + 4 significant bits), the difference rounded once.
    #[serde(rename = "q4_k")]
    Q4_K,
    /// llama.cpp's `Q6_K`: super-blocks of 256 elements in 210 bytes: 128 bytes `ql` of low
    /// nibbles, 64 bytes `qh` of 2-bit high parts, 16 `i8` sub-block scales, then a
    /// little-endian IEEE f16 `d`. Element `e = 128 h + 32 q + l` (`h < 2`, `q < 4`, `l < 32`)
    /// has the low nibble `ql[64 h + 32 (q % 2) + l] >> 4 (q / 2)` and the high bits
    /// `(qh[32 h + l] >> 2 q) & 3`; its code is `low | high << 4` and it is
    /// `(d * scales[e / 16]) * (code - 32)`, exact in f32 (at most 11 + 8 + 6 bits).
    #[serde(rename = "q6_k")]
    Q6_K,
}

/// Bytes of the f16 scale at the start of a block (each of `d` and `m` in Q4_1).
pub const SCALE_BYTES: usize = 2;

/// Bytes of the f16 scale at the start of a Q8_0 block.
pub const Q8_0_SCALE_BYTES: usize = SCALE_BYTES;

/// What Q4_0 subtracts from each 4-bit code.
pub const Q4_0_CODE_OFFSET: i32 = 8;

/// What Q5_0 subtracts from each 5-bit code.
pub const Q5_0_CODE_OFFSET: i32 = 16;

/// Bytes of Q5_0's `qh`, the high bits of its 32 codes.
pub const Q5_0_HIGH_BITS_BYTES: usize = 4;

/// Elements of a K-quant (Q4_K, Q6_K) super-block.
pub const K_SUPER_BLOCK_ELEMENTS: usize = 256;

/// Bytes of Q4_K's packed 6-bit (scale, min) pairs.
pub const Q4_K_SCALES_BYTES: usize = 12;

/// Elements of a Q4_K sub-block, which has its own scale and min.
pub const Q4_K_SUB_BLOCK_ELEMENTS: usize = 32;

/// Elements of a Q6_K sub-block, which has its own scale.
pub const Q6_K_SUB_BLOCK_ELEMENTS: usize = 16;

/// What Q6_K subtracts from each 6-bit code.
pub const Q6_K_CODE_OFFSET: i32 = 32;

impl BlockFormat {
    /// Every format, in a stable order.
    pub const ALL: [BlockFormat; 6] = [
        BlockFormat::Q8_0,
        BlockFormat::Q4_0,
        BlockFormat::Q4_1,
        BlockFormat::Q5_0,
        BlockFormat::Q4_K,
        BlockFormat::Q6_K,
    ];

    /// The name the manifest and error messages use (`"q8_0"`).
    pub const fn name(self) -> &'static str {
        match self {
            BlockFormat::Q8_0 => "q8_0",
            BlockFormat::Q4_0 => "q4_0",
            BlockFormat::Q4_1 => "q4_1",
            BlockFormat::Q5_0 => "q5_0",
            BlockFormat::Q4_K => "q4_k",
            BlockFormat::Q6_K => "q6_k",
        }
    }

    /// Elements per block (along the input dimension).
    pub const fn block_elements(self) -> usize {
        match self {
            BlockFormat::Q8_0 | BlockFormat::Q4_0 | BlockFormat::Q4_1 | BlockFormat::Q5_0 => 32,
            BlockFormat::Q4_K | BlockFormat::Q6_K => K_SUPER_BLOCK_ELEMENTS,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            BlockFormat::Q8_0 => 34,
            BlockFormat::Q4_0 => 18,
            BlockFormat::Q4_1 => 20,
            BlockFormat::Q5_0 => 22,
            BlockFormat::Q4_K => 144,
            BlockFormat::Q6_K => 210,
        }
    }

    /// The element type of the stored blocks and of the program operand.
    pub const OPERAND_DTYPE: Dtype = Dtype::U8;

    /// Bytes of one row of `inner` elements, or `None` when `inner` is not whole blocks.
    pub const fn row_bytes(self, inner: usize) -> Option<usize> {
        if inner % self.block_elements() != 0 {
            return None;
        }
        Some(inner / self.block_elements() * self.block_bytes())
    }

    /// The operand dims `[out, row_bytes(in)]` of a weight of logical dims `[out, in]`, or why
    /// there is none.
    pub fn operand_dims(self, dims: &[usize]) -> Result<Vec<usize>, String> {
        match dims {
            [out, inner] => match self.row_bytes(*inner) {
                Some(bytes) => Ok(vec![*out, bytes]),
                None => Err(format!(
                    "{self} stores rows of whole {}-element blocks; a row of {inner} elements is not",
                    self.block_elements()
                )),
            },
            _ => Err(format!(
                "{self} stores matrices [out, in]; dims {dims:?} are not two"
            )),
        }
    }

    /// Bytes of a weight of logical dims `dims`, or `None` when it cannot be stored (or the
    /// length overflows).
    pub fn byte_length(self, dims: &[usize]) -> Option<u64> {
        Self::OPERAND_DTYPE.byte_length(&self.operand_dims(dims).ok()?)
    }
}

impl fmt::Display for BlockFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_rows_are_whole_blocks_of_34_bytes_per_32_elements() {
        let q = BlockFormat::Q8_0;
        assert_eq!(q.row_bytes(64), Some(68));
        assert_eq!(q.row_bytes(48), None);
        assert_eq!(q.operand_dims(&[3, 96]).unwrap(), vec![3, 102]);
        assert_eq!(q.byte_length(&[3, 96]), Some(306));
        let err = q.operand_dims(&[3, 40]).unwrap_err();
        assert!(err.contains("q8_0") && err.contains("40"), "{err}");
        assert!(q.operand_dims(&[96]).is_err());
        assert_eq!(Q8_0_SCALE_BYTES + q.block_elements(), q.block_bytes());
        let q = BlockFormat::Q4_0;
        assert_eq!(q.operand_dims(&[3, 64]).unwrap(), vec![3, 36]);
        assert_eq!(SCALE_BYTES + q.block_elements() / 2, q.block_bytes());
        let q = BlockFormat::Q4_1;
        assert_eq!(q.operand_dims(&[3, 64]).unwrap(), vec![3, 40]);
        assert_eq!(2 * SCALE_BYTES + q.block_elements() / 2, q.block_bytes());
        let q = BlockFormat::Q5_0;
        assert_eq!(q.operand_dims(&[3, 64]).unwrap(), vec![3, 44]);
        assert_eq!(
            SCALE_BYTES + Q5_0_HIGH_BITS_BYTES + q.block_elements() / 2,
            q.block_bytes()
        );
    }

    #[test]
    fn k_quant_rows_are_whole_super_blocks() {
        let q = BlockFormat::Q4_K;
        assert_eq!(q.operand_dims(&[3, 512]).unwrap(), vec![3, 288]);
        assert_eq!(
            2 * SCALE_BYTES + Q4_K_SCALES_BYTES + K_SUPER_BLOCK_ELEMENTS / 2,
            q.block_bytes()
        );
        assert_eq!(
            K_SUPER_BLOCK_ELEMENTS / Q4_K_SUB_BLOCK_ELEMENTS * 12 / 8,
            Q4_K_SCALES_BYTES,
            "eight 12-bit pairs"
        );
        let err = q.operand_dims(&[3, 576]).unwrap_err();
        assert!(
            err.contains("q4_k") && err.contains("256") && err.contains("576"),
            "{err}"
        );
        let q = BlockFormat::Q6_K;
        assert_eq!(q.operand_dims(&[2, 256]).unwrap(), vec![2, 210]);
        assert_eq!(
            K_SUPER_BLOCK_ELEMENTS / 2
                + K_SUPER_BLOCK_ELEMENTS / 4
                + K_SUPER_BLOCK_ELEMENTS / Q6_K_SUB_BLOCK_ELEMENTS
                + SCALE_BYTES,
            q.block_bytes()
        );
    }

    #[test]
    fn the_manifest_name_is_the_serde_name() {
        for f in BlockFormat::ALL {
            assert_eq!(
                serde_json::to_string(&f).unwrap(),
                format!("\"{}\"", f.name())
            );
        }
    }
}
