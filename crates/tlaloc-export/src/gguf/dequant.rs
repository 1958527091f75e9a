//! ggml element encodings: the one table of every type id a GGUF file may name (id, name, block
//! elements, block bytes, whether it is read here) and the dequantization of the read ones to
//! f32, bit-identical to the Python `gguf` package's `gguf.quants.dequantize` (which is what
//! transformers loads GGUF weights with). The numpy code computes every product and sum in f32,
//! one operation at a time and in a fixed order (`d * q + m`, `(d * sc) * q - dmin * m`, ...); the
//! loops here do the same operations in the same order, and Rust never fuses a multiply and an
//! add on its own, so the bits agree. Written by hand: the crates.io implementations come bundled
//! with inference stacks (candle, ggml bindings) this crate does not link.

use half::{bf16, f16};

use crate::checkpoint::TensorData;

/// The encodings this crate reads, by name (the `supported` rows of [`GGML_TYPES`], in order;
/// a unit test keeps the two in step).
pub const ACCEPTED_TYPES: &str = "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, \
                                  Q5_K, Q6_K, IQ4_NL, IQ4_XS";

const QK_K: usize = 256;

/// A ggml element encoding, named as ggml names it. Every type a current GGUF file may name has a
/// variant; [`GgmlType::is_supported`] says whether this crate dequantizes it.
#[allow(non_camel_case_types, missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
    NVFP4,
    Q1_0,
}

/// One row of the ggml type table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgmlTypeInfo {
    /// The type.
    pub ty: GgmlType,
    /// Its id in a GGUF tensor info.
    pub id: u32,
    /// ggml's name for it.
    pub name: &'static str,
    /// Elements per block.
    pub block_elements: usize,
    /// Bytes per block.
    pub block_bytes: usize,
    /// Whether [`dequantize`] reads it.
    pub supported: bool,
}

const fn row(
    ty: GgmlType,
    id: u32,
    name: &'static str,
    block_elements: usize,
    block_bytes: usize,
    supported: bool,
) -> GgmlTypeInfo {
    GgmlTypeInfo {
        ty,
        id,
        name,
        block_elements,
        block_bytes,
        supported,
    }
}

/// Every ggml type id in use (ggml.h's `ggml_type`; sizes as in ggml's type traits and gguf-py's
/// `GGML_QUANT_SIZES`), in id order.
pub const GGML_TYPES: [GgmlTypeInfo; 34] = {
    use GgmlType as T;
    [
        row(T::F32, 0, "F32", 1, 4, true),
        row(T::F16, 1, "F16", 1, 2, true),
        row(T::Q4_0, 2, "Q4_0", 32, 18, true),
        row(T::Q4_1, 3, "Q4_1", 32, 20, true),
        row(T::Q5_0, 6, "Q5_0", 32, 22, true),
        row(T::Q5_1, 7, "Q5_1", 32, 24, true),
        row(T::Q8_0, 8, "Q8_0", 32, 34, true),
        row(T::Q8_1, 9, "Q8_1", 32, 40, false),
        row(T::Q2_K, 10, "Q2_K", QK_K, 84, true),
        row(T::Q3_K, 11, "Q3_K", QK_K, 110, true),
        row(T::Q4_K, 12, "Q4_K", QK_K, 144, true),
        row(T::Q5_K, 13, "Q5_K", QK_K, 176, true),
        row(T::Q6_K, 14, "Q6_K", QK_K, 210, true),
        row(T::Q8_K, 15, "Q8_K", QK_K, 292, false),
        row(T::IQ2_XXS, 16, "IQ2_XXS", QK_K, 66, false),
        row(T::IQ2_XS, 17, "IQ2_XS", QK_K, 74, false),
        row(T::IQ3_XXS, 18, "IQ3_XXS", QK_K, 98, false),
        row(T::IQ1_S, 19, "IQ1_S", QK_K, 50, false),
        row(T::IQ4_NL, 20, "IQ4_NL", 32, 18, true),
        row(T::IQ3_S, 21, "IQ3_S", QK_K, 110, false),
        row(T::IQ2_S, 22, "IQ2_S", QK_K, 82, false),
        row(T::IQ4_XS, 23, "IQ4_XS", QK_K, 136, true),
        row(T::I8, 24, "I8", 1, 1, false),
        row(T::I16, 25, "I16", 1, 2, false),
        row(T::I32, 26, "I32", 1, 4, false),
        row(T::I64, 27, "I64", 1, 8, false),
        row(T::F64, 28, "F64", 1, 8, false),
        row(T::IQ1_M, 29, "IQ1_M", QK_K, 56, false),
        row(T::BF16, 30, "BF16", 1, 2, true),
        row(T::TQ1_0, 34, "TQ1_0", QK_K, 54, false),
        row(T::TQ2_0, 35, "TQ2_0", QK_K, 66, false),
        row(T::MXFP4, 39, "MXFP4", 32, 17, false),
        row(T::NVFP4, 40, "NVFP4", 64, 36, false),
        row(T::Q1_0, 41, "Q1_0", 128, 18, false),
    ]
};

/// Ids ggml once used and has since removed (no current writer produces them), so that a file
/// naming one is refused by that name rather than as an unknown number.
const RETIRED_TYPES: [(u32, &str); 8] = [
    (4, "Q4_2"),
    (5, "Q4_3"),
    (31, "Q4_0_4_4"),
    (32, "Q4_0_4_8"),
    (33, "Q4_0_8_8"),
    (36, "IQ4_NL_4_4"),
    (37, "IQ4_NL_4_8"),
    (38, "IQ4_NL_8_8"),
];

/// Why bytes could not be dequantized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DequantError {
    /// The type is valid ggml but not read by this crate.
    #[error("element type {name} (ggml type {id}) is not supported; supported: {ACCEPTED_TYPES}")]
    Unsupported {
        /// ggml's name.
        name: &'static str,
        /// ggml's id.
        id: u32,
    },
    /// The id names no ggml type this crate knows (or one ggml has removed).
    #[error(
        "element type {} (ggml type {id}) is not supported; supported: {ACCEPTED_TYPES}",
        retired_name(*id).unwrap_or("unknown")
    )]
    UnknownId {
        /// The id as stored.
        id: u32,
    },
    /// The byte count is not a whole number of blocks.
    #[error(
        "{len} bytes of {name} data are not a whole number of {block_bytes}-byte blocks \
         ({block_elements} elements each)"
    )]
    PartialBlock {
        /// ggml's name.
        name: &'static str,
        /// Bytes given.
        len: usize,
        /// Bytes per block.
        block_bytes: usize,
        /// Elements per block.
        block_elements: usize,
    },
}

fn retired_name(id: u32) -> Option<&'static str> {
    RETIRED_TYPES
        .iter()
        .find(|(i, _)| *i == id)
        .map(|(_, n)| *n)
}

impl GgmlType {
    /// This type's row of [`GGML_TYPES`].
    pub fn info(self) -> &'static GgmlTypeInfo {
        // Every variant has exactly one row (a unit test checks); the fallback is unreachable.
        GGML_TYPES
            .iter()
            .find(|r| r.ty == self)
            .unwrap_or(&GGML_TYPES[0])
    }

    /// The type with ggml id `id`, whether or not it is read here; an id that is not a current
    /// ggml type is an error (with its old name if ggml once used it).
    pub fn from_id(id: u32) -> Result<Self, DequantError> {
        GGML_TYPES
            .iter()
            .find(|r| r.id == id)
            .map(|r| r.ty)
            .ok_or(DequantError::UnknownId { id })
    }

    /// The type ggml calls `name`, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        GGML_TYPES.iter().find(|r| r.name == name).map(|r| r.ty)
    }

    /// ggml's name for the type.
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// ggml's id for the type.
    pub fn id(self) -> u32 {
        self.info().id
    }

    /// `(elements per block, bytes per block)`.
    pub fn block(self) -> (usize, usize) {
        let r = self.info();
        (r.block_elements, r.block_bytes)
    }

    /// Whether [`dequantize`] reads this type.
    pub fn is_supported(self) -> bool {
        self.info().supported
    }

    /// `Ok` when the type is read here, else the refusal naming it.
    pub fn check_supported(self) -> Result<(), DequantError> {
        if self.is_supported() {
            Ok(())
        } else {
            Err(DequantError::Unsupported {
                name: self.name(),
                id: self.id(),
            })
        }
    }
}

fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([bytes[at], bytes[at + 1]])).to_f32()
}

/// Decodes `bytes` of type `ty`. Float types keep their dtype; quantized ones become f32.
/// Refuses a type not read here and a byte count that is not a whole number of blocks.
pub fn dequantize(ty: GgmlType, bytes: &[u8]) -> Result<TensorData, DequantError> {
    ty.check_supported()?;
    let (block, block_bytes) = ty.block();
    if bytes.len() % block_bytes != 0 {
        return Err(DequantError::PartialBlock {
            name: ty.name(),
            len: bytes.len(),
            block_bytes,
            block_elements: block,
        });
    }
    let blocks = bytes.chunks_exact(block_bytes);
    let block_fn: fn(&[u8], &mut Vec<f32>) = match ty {
        GgmlType::F32 => {
            return Ok(TensorData::F32(
                blocks
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            ));
        }
        GgmlType::F16 => {
            return Ok(TensorData::F16(
                blocks
                    .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                    .collect(),
            ));
        }
        GgmlType::BF16 => {
            return Ok(TensorData::BF16(
                blocks
                    .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                    .collect(),
            ));
        }
        GgmlType::Q4_0 => q4_0,
        GgmlType::Q4_1 => q4_1,
        GgmlType::Q5_0 => q5_0,
        GgmlType::Q5_1 => q5_1,
        GgmlType::Q8_0 => q8_0,
        GgmlType::Q2_K => q2_k,
        GgmlType::Q3_K => q3_k,
        GgmlType::Q4_K => q4_k,
        GgmlType::Q5_K => q5_k,
        GgmlType::Q6_K => q6_k,
        GgmlType::IQ4_NL => iq4_nl,
        GgmlType::IQ4_XS => iq4_xs,
        other => {
            return Err(DequantError::Unsupported {
                name: other.name(),
                id: other.id(),
            });
        }
    };
    let mut out = Vec::with_capacity(bytes.len() / block_bytes * block);
    for b in blocks {
        block_fn(b, &mut out);
    }
    Ok(TensorData::F32(out))
}

fn q8_0(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    out.extend(b[2..34].iter().map(|&x| (x as i8) as f32 * d));
}

/// Element `j < 16` is the low nibble of byte `j`, element `j + 16` its high nibble.
fn nibbles(qs: &[u8]) -> impl Iterator<Item = u8> + '_ {
    qs.iter().map(|q| q & 0x0F).chain(qs.iter().map(|q| q >> 4))
}

/// The 5-bit quants of a Q5_0/Q5_1 block: nibbles as in Q4, bit `j` of the little-endian `qh`
/// word as bit 4 of element `j`.
fn five_bit<'a>(qh: &[u8], qs: &'a [u8]) -> impl Iterator<Item = u8> + 'a {
    let high = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    nibbles(qs)
        .enumerate()
        .map(move |(j, l)| l | ((((high >> j) & 1) as u8) << 4))
}

fn q4_0(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    out.extend(nibbles(&b[2..18]).map(|q| d * ((q as i8 - 8) as f32)));
}

fn q4_1(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    out.extend(nibbles(&b[4..20]).map(|q| (d * q as f32) + m));
}

fn q5_0(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    out.extend(five_bit(&b[2..6], &b[6..22]).map(|q| d * ((q as i8 - 16) as f32)));
}

fn q5_1(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    out.extend(five_bit(&b[4..8], &b[8..24]).map(|q| (d * q as f32) + m));
}

/// Q2_K: 16 scale bytes (low nibble scale, high nibble min), 64 bytes of 2-bit quants, f16 `d`
/// and `dmin`. Element `e = 128h + 32s + l` is bits `2s..2s+2` of quant byte `32h + l`.
fn q2_k(b: &[u8], out: &mut Vec<f32>) {
    let scales = &b[0..16];
    let qs = &b[16..80];
    let d = f16_at(b, 80);
    let dmin = f16_at(b, 82);
    for e in 0..QK_K {
        let (h, s, l) = (e / 128, (e % 128) / 32, e % 32);
        let q = ((qs[32 * h + l] >> (2 * s)) & 3) as f32;
        let sc = scales[e / 16];
        let dl = d * (sc & 0x0F) as f32;
        let ml = dmin * (sc >> 4) as f32;
        out.push(dl * q - ml);
    }
}

/// Q3_K: 32 bytes of high-bit mask, 64 bytes of 2-bit quants, 12 bytes of sixteen 6-bit signed
/// scales, f16 `d`. A clear mask bit subtracts 4.
fn q3_k(b: &[u8], out: &mut Vec<f32>) {
    let hmask = &b[0..32];
    let qs = &b[32..96];
    let packed = &b[96..108];
    let d = f16_at(b, 108);
    let mut dl = [0f32; 16];
    for (i, slot) in dl.iter_mut().enumerate() {
        let low = (packed[i % 8] >> (4 * (i / 8))) & 0x0F;
        let high = (packed[8 + i % 4] >> (2 * (i / 4))) & 0x03;
        let scale = ((low | (high << 4)) as i8).wrapping_sub(32);
        *slot = d * scale as f32;
    }
    for e in 0..QK_K {
        let (h, s, l) = (e / 128, (e % 128) / 32, e % 32);
        let low = ((qs[32 * h + l] >> (2 * s)) & 3) as i8;
        let high = ((hmask[l] >> (e / 32)) & 1) ^ 1;
        let q = (low - ((high << 2) as i8)) as f32;
        out.push(dl[e / 16] * q);
    }
}

/// The eight 6-bit (scale, min) pairs of a Q4_K/Q5_K super-block (ggml's `get_scale_min_k4`).
fn k_scale_min(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for j in 0..4 {
        sc[j] = s[j] & 0x3F;
        mn[j] = s[j + 4] & 0x3F;
        sc[j + 4] = (s[j + 8] & 0x0F) | ((s[j] >> 2) & 0x30);
        mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 2) & 0x30);
    }
    (sc, mn)
}

fn q4_k(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let (sc, mn) = k_scale_min(&b[4..16]);
    let qs = &b[16..144];
    // Sub-block 2i takes the low nibbles of bytes 32i..32i+32, sub-block 2i+1 their high ones.
    for j in 0..8 {
        let scale = d * sc[j] as f32;
        let min = dmin * mn[j] as f32;
        let shift = 4 * (j % 2);
        for &q in &qs[32 * (j / 2)..32 * (j / 2) + 32] {
            let q = ((q >> shift) & 0x0F) as f32;
            out.push(scale * q - min);
        }
    }
}

/// Q5_K: Q4_K's layout with 32 bytes of fifth bits before the nibbles; bit `j` of byte `l` is
/// bit 4 of element `32j + l`.
fn q5_k(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let (sc, mn) = k_scale_min(&b[4..16]);
    let qh = &b[16..48];
    let qs = &b[48..176];
    for j in 0..8 {
        let scale = d * sc[j] as f32;
        let min = dmin * mn[j] as f32;
        let shift = 4 * (j % 2);
        for l in 0..32 {
            let low = (qs[32 * (j / 2) + l] >> shift) & 0x0F;
            let high = (qh[l] >> j) & 1;
            out.push(scale * (low | (high << 4)) as f32 - min);
        }
    }
}

fn q6_k(b: &[u8], out: &mut Vec<f32>) {
    let ql = &b[0..128];
    let qh = &b[128..192];
    let scales = &b[192..208];
    let d = f16_at(b, 208);
    for e in 0..QK_K {
        let (half, r) = (e / 128, e % 128);
        let low = (ql[half * 64 + r % 64] >> (4 * (r / 64))) & 0x0F;
        let high = (qh[half * 32 + r % 32] >> (2 * (r / 32))) & 0x03;
        let q = ((low | (high << 4)) as i8 - 32) as f32;
        let scale = d * (scales[e / 16] as i8) as f32;
        out.push(scale * q);
    }
}

/// The non-linear 4-bit code book of IQ4_NL and IQ4_XS (ggml's `kvalues_iq4nl`).
const IQ4_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

fn iq4_nl(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    out.extend(nibbles(&b[2..18]).map(|q| d * IQ4_VALUES[q as usize] as f32));
}

/// IQ4_XS: f16 `d`, a u16 of eight 2-bit high scale parts, 4 bytes of eight 4-bit low parts,
/// then eight 32-element sub-blocks of IQ4_NL nibbles (16 bytes each).
fn iq4_xs(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    let scales_l = &b[4..8];
    let qs = &b[8..136];
    for ib in 0..8 {
        let low = (scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0F;
        let high = ((scales_h >> (2 * ib)) as u8) & 0x03;
        let scale = ((low | (high << 4)) as i8).wrapping_sub(32);
        let dl = d * scale as f32;
        out.extend(nibbles(&qs[16 * ib..16 * ib + 16]).map(|q| dl * IQ4_VALUES[q as usize] as f32));
    }
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)] // the reference keeps llama.cpp's index loops
mod tests {
    //! The reference here is llama.cpp's scalar `dequantize_row_*` (ggml-quants.c), transcribed
    //! with its own loop structure; it evaluates the same f32 operations in the same order as the
    //! `gguf` package's numpy code, so agreement is asserted on the bits. The gguf-py goldens
    //! (tests/gguf_quants.rs) are the independent check of every type.

    use super::*;

    fn blocks(ty: GgmlType, count: usize, scale_offsets: &[usize], seed: u64) -> Vec<u8> {
        let (_, size) = ty.block();
        let mut state = seed;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut out = vec![0u8; count * size];
        for b in out.iter_mut() {
            *b = next() as u8;
        }
        for block in out.chunks_exact_mut(size) {
            for &at in scale_offsets {
                let scale = f16::from_f32(((next() % 2000) as f32 - 1000.0) * 1e-4);
                block[at..at + 2].copy_from_slice(&scale.to_le_bytes());
            }
        }
        out
    }

    fn half(b: &[u8], at: usize) -> f32 {
        f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
    }

    fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
        if j < 4 {
            (q[j] & 63, q[j + 4] & 63)
        } else {
            (
                (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
                (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
            )
        }
    }

    fn reference(ty: GgmlType, data: &[u8]) -> Vec<f32> {
        let (_, size) = ty.block();
        let mut y = Vec::new();
        for x in data.chunks_exact(size) {
            match ty {
                GgmlType::Q8_0 => {
                    let d = half(x, 0);
                    for j in 0..32 {
                        y.push(x[2 + j] as i8 as f32 * d);
                    }
                }
                GgmlType::Q4_0 | GgmlType::Q4_1 => {
                    let d = half(x, 0);
                    let (m, qs) = if ty == GgmlType::Q4_1 {
                        (half(x, 2), &x[4..20])
                    } else {
                        (0.0, &x[2..18])
                    };
                    let mut row = [0f32; 32];
                    for j in 0..16 {
                        if ty == GgmlType::Q4_1 {
                            row[j] = (qs[j] & 0x0F) as f32 * d + m;
                            row[j + 16] = (qs[j] >> 4) as f32 * d + m;
                        } else {
                            row[j] = ((qs[j] & 0x0F) as i32 - 8) as f32 * d;
                            row[j + 16] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
                        }
                    }
                    y.extend(row);
                }
                GgmlType::Q4_K => {
                    let (d, min) = (half(x, 0), half(x, 2));
                    let scales = &x[4..16];
                    let mut q = &x[16..144];
                    let mut is = 0;
                    for _ in (0..QK_K).step_by(64) {
                        let (sc, m) = scale_min_k4(is, scales);
                        let (d1, m1) = (d * sc as f32, min * m as f32);
                        let (sc, m) = scale_min_k4(is + 1, scales);
                        let (d2, m2) = (d * sc as f32, min * m as f32);
                        for l in 0..32 {
                            y.push(d1 * (q[l] & 0xF) as f32 - m1);
                        }
                        for l in 0..32 {
                            y.push(d2 * (q[l] >> 4) as f32 - m2);
                        }
                        q = &q[32..];
                        is += 2;
                    }
                }
                GgmlType::Q6_K => {
                    let d = half(x, 208);
                    let (mut ql, mut qh, mut sc) = (&x[0..128], &x[128..192], &x[192..208]);
                    for _ in (0..QK_K).step_by(128) {
                        let mut out = [0f32; 128];
                        for l in 0..32 {
                            let is = l / 16;
                            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
                            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
                            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
                            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
                            out[l] = d * sc[is] as i8 as f32 * q1 as f32;
                            out[l + 32] = d * sc[is + 2] as i8 as f32 * q2 as f32;
                            out[l + 64] = d * sc[is + 4] as i8 as f32 * q3 as f32;
                            out[l + 96] = d * sc[is + 6] as i8 as f32 * q4 as f32;
                        }
                        y.extend(out);
                        ql = &ql[64..];
                        qh = &qh[32..];
                        sc = &sc[8..];
                    }
                }
                _ => unreachable!("only the types listed in the test"),
            }
        }
        y
    }

    #[test]
    fn quantized_types_match_llama_cpp_scalar_reference_bit_for_bit() {
        for (ty, scales) in [
            (GgmlType::Q8_0, &[0usize][..]),
            (GgmlType::Q4_0, &[0]),
            (GgmlType::Q4_1, &[0, 2]),
            (GgmlType::Q4_K, &[0, 2]),
            (GgmlType::Q6_K, &[208]),
        ] {
            let data = blocks(ty, 40, scales, 0x9E37_79B9_7F4A_7C15);
            let Ok(TensorData::F32(got)) = dequantize(ty, &data) else {
                panic!("{ty:?} gave a float type")
            };
            let want = reference(ty, &data);
            assert_eq!(got.len(), want.len(), "{ty:?}");
            let differ: Vec<usize> = (0..got.len())
                .filter(|&i| got[i].to_bits() != want[i].to_bits())
                .collect();
            assert!(
                differ.is_empty(),
                "{ty:?}: {} values differ, first at {:?}",
                differ.len(),
                differ.first()
            );
        }
    }

    #[test]
    fn float_types_keep_their_bits() {
        let bytes = [0x00, 0x3C, 0x00, 0xC0, 0x80, 0x3F, 0x00, 0x00];
        assert_eq!(
            dequantize(GgmlType::F16, &bytes[..4]).unwrap().to_f32(),
            vec![1.0, -2.0]
        );
        assert_eq!(
            dequantize(GgmlType::BF16, &bytes[4..]).unwrap().to_f32(),
            vec![1.0, 0.0]
        );
        assert_eq!(
            dequantize(GgmlType::F32, &1.5f32.to_le_bytes())
                .unwrap()
                .to_f32(),
            vec![1.5]
        );
    }

    #[test]
    fn the_type_table_has_one_row_per_type_and_accepted_types_lists_the_supported_rows() {
        for (i, a) in GGML_TYPES.iter().enumerate() {
            for b in &GGML_TYPES[i + 1..] {
                assert!(
                    a.ty != b.ty && a.id != b.id && a.name != b.name,
                    "{a:?} / {b:?}"
                );
            }
            assert_eq!(a.ty.info(), a, "{}", a.name);
            assert_eq!(GgmlType::from_id(a.id), Ok(a.ty));
            assert_eq!(GgmlType::from_name(a.name), Some(a.ty));
            assert_eq!(format!("{:?}", a.ty), a.name);
            assert!(retired_name(a.id).is_none(), "{}", a.name);
        }
        // In ACCEPTED_TYPES the float types come first, then the rest in id order.
        let floats = ["F32", "F16", "BF16"];
        let listed: Vec<&str> = floats
            .into_iter()
            .chain(
                GGML_TYPES
                    .iter()
                    .filter(|r| r.supported && !floats.contains(&r.name))
                    .map(|r| r.name),
            )
            .collect();
        assert_eq!(listed.join(", "), ACCEPTED_TYPES);
        // Every supported type dequantizes a zero block; every other one is refused by name.
        for r in &GGML_TYPES {
            let zero = vec![0u8; r.block_bytes];
            match dequantize(r.ty, &zero) {
                Ok(values) => {
                    assert!(r.supported, "{}", r.name);
                    assert_eq!(values.len(), r.block_elements, "{}", r.name);
                }
                Err(e) => {
                    assert!(!r.supported, "{}: {e}", r.name);
                    let text = e.to_string();
                    assert!(
                        text.contains(r.name) && text.contains("is not supported"),
                        "{text}"
                    );
                }
            }
        }
    }

    #[test]
    fn unsupported_and_unknown_types_are_refused_by_name() {
        for (id, name) in [(16, "IQ2_XXS"), (34, "TQ1_0"), (9, "Q8_1"), (4, "Q4_2")] {
            let text = match GgmlType::from_id(id) {
                Ok(ty) => dequantize(ty, &[]).unwrap_err().to_string(),
                Err(e) => e.to_string(),
            };
            assert!(
                text.contains(&format!("{name} (ggml type {id}) is not supported")),
                "{text}"
            );
        }
        let unknown = GgmlType::from_id(1000).unwrap_err().to_string();
        assert!(
            unknown.contains("unknown") && unknown.contains("ggml type 1000"),
            "{unknown}"
        );
    }

    #[test]
    fn partial_blocks_are_refused_not_a_panic() {
        for r in GGML_TYPES
            .iter()
            .filter(|r| r.supported && r.block_bytes > 1)
        {
            for len in [
                1,
                r.block_bytes - 1,
                r.block_bytes + 1,
                3 * r.block_bytes - 1,
            ] {
                let err = dequantize(r.ty, &vec![0u8; len]).unwrap_err();
                assert!(
                    matches!(err, DequantError::PartialBlock { len: l, .. } if l == len),
                    "{}: {err}",
                    r.name
                );
                assert!(err.to_string().contains(r.name), "{err}");
            }
        }
    }
}
