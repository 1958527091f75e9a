//! ggml element encodings and their dequantization to f32, bit-identical to the Python `gguf`
//! package's `gguf.quants.dequantize` (which is what transformers loads GGUF weights with). The
//! numpy code computes every product and sum in f32, one operation at a time and in a fixed
//! order (`d * q + m`, `d * sc * q - dmin * m`, ...); the loops here do the same operations in the
//! same order, and Rust never fuses a multiply and an add on its own, so the bits agree.

use half::{bf16, f16};

use crate::checkpoint::TensorData;

/// The encodings this crate reads, by name.
pub const ACCEPTED_TYPES: &str = "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K";

const QK_K: usize = 256;

/// A supported ggml element encoding (named as ggml names them).
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
    /// Blocks of 32: f16 scale + 32 i8.
    Q8_0,
    /// Blocks of 32: f16 scale + 32 nibbles offset by 8.
    Q4_0,
    /// Blocks of 32: f16 scale, f16 minimum + 32 nibbles.
    Q4_1,
    /// Super-blocks of 256: f16 scale and min, 8 six-bit sub-scales and mins, 256 nibbles.
    Q4_K,
    /// Super-blocks of 256: 4+2-bit quants, 16 i8 sub-scales, f16 scale.
    Q6_K,
}

/// ggml's names for type ids, so that an unsupported one is refused by name.
const GGML_TYPE_NAMES: [(u32, &str); 34] = [
    (0, "F32"),
    (1, "F16"),
    (2, "Q4_0"),
    (3, "Q4_1"),
    (4, "Q4_2"),
    (5, "Q4_3"),
    (6, "Q5_0"),
    (7, "Q5_1"),
    (8, "Q8_0"),
    (9, "Q8_1"),
    (10, "Q2_K"),
    (11, "Q3_K"),
    (12, "Q4_K"),
    (13, "Q5_K"),
    (14, "Q6_K"),
    (15, "Q8_K"),
    (16, "IQ2_XXS"),
    (17, "IQ2_XS"),
    (18, "IQ3_XXS"),
    (19, "IQ1_S"),
    (20, "IQ4_NL"),
    (21, "IQ3_S"),
    (22, "IQ2_S"),
    (23, "IQ4_XS"),
    (24, "I8"),
    (25, "I16"),
    (26, "I32"),
    (27, "I64"),
    (28, "F64"),
    (29, "IQ1_M"),
    (30, "BF16"),
    (34, "TQ1_0"),
    (35, "TQ2_0"),
    (39, "MXFP4"),
];

impl GgmlType {
    /// The supported type with ggml id `id`, or a sentence refusing it by name.
    pub fn from_id(id: u32) -> Result<Self, String> {
        Ok(match id {
            0 => Self::F32,
            1 => Self::F16,
            30 => Self::BF16,
            8 => Self::Q8_0,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            12 => Self::Q4_K,
            14 => Self::Q6_K,
            other => {
                let name = GGML_TYPE_NAMES
                    .iter()
                    .find(|(i, _)| *i == other)
                    .map_or("an unknown ggml type", |(_, n)| n);
                return Err(format!(
                    "element type {name} (id {other}) is not supported; supported: {ACCEPTED_TYPES}"
                ));
            }
        })
    }

    /// ggml's name for the type.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::BF16 => "BF16",
            Self::Q8_0 => "Q8_0",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q4_K => "Q4_K",
            Self::Q6_K => "Q6_K",
        }
    }

    /// `(elements per block, bytes per block)`.
    pub fn block(self) -> (usize, usize) {
        match self {
            Self::F32 => (1, 4),
            Self::F16 | Self::BF16 => (1, 2),
            Self::Q8_0 => (32, 34),
            Self::Q4_0 => (32, 18),
            Self::Q4_1 => (32, 20),
            Self::Q4_K => (QK_K, 144),
            Self::Q6_K => (QK_K, 210),
        }
    }
}

fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([bytes[at], bytes[at + 1]])).to_f32()
}

/// Decodes `bytes` (a whole number of blocks) of type `ty`. Float types keep their dtype;
/// quantized ones become f32. `bytes.len()` must be a multiple of the block byte size.
pub fn dequantize(ty: GgmlType, bytes: &[u8]) -> TensorData {
    let (block, block_bytes) = ty.block();
    let blocks = bytes.chunks_exact(block_bytes);
    match ty {
        GgmlType::F32 => TensorData::F32(
            blocks
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        GgmlType::F16 => TensorData::F16(
            blocks
                .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
        ),
        GgmlType::BF16 => TensorData::BF16(
            blocks
                .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
        ),
        _ => {
            let mut out = Vec::with_capacity(bytes.len() / block_bytes * block);
            for b in blocks {
                match ty {
                    GgmlType::Q8_0 => q8_0(b, &mut out),
                    GgmlType::Q4_0 => q4_0(b, &mut out),
                    GgmlType::Q4_1 => q4_1(b, &mut out),
                    GgmlType::Q4_K => q4_k(b, &mut out),
                    _ => q6_k(b, &mut out),
                }
            }
            TensorData::F32(out)
        }
    }
}

fn q8_0(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    out.extend(b[2..34].iter().map(|&x| (x as i8) as f32 * d));
}

/// Element `j < 16` is the low nibble of byte `j`, element `j + 16` its high nibble.
fn nibbles(qs: &[u8]) -> impl Iterator<Item = u8> + '_ {
    qs.iter().map(|q| q & 0x0F).chain(qs.iter().map(|q| q >> 4))
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

/// The eight 6-bit (scale, min) pairs of a Q4_K super-block (ggml's `get_scale_min_k4`).
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

#[cfg(test)]
#[allow(clippy::needless_range_loop)] // the reference keeps llama.cpp's index loops
mod tests {
    //! The reference here is llama.cpp's scalar `dequantize_row_*` (ggml-quants.c), transcribed
    //! with its own loop structure; it evaluates the same f32 operations in the same order as the
    //! `gguf` package's numpy code, so agreement is asserted on the bits.

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
                _ => unreachable!("float types are not block-quantized"),
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
            let TensorData::F32(got) = dequantize(ty, &data) else {
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
            dequantize(GgmlType::F16, &bytes[..4]).to_f32(),
            vec![1.0, -2.0]
        );
        assert_eq!(
            dequantize(GgmlType::BF16, &bytes[4..]).to_f32(),
            vec![1.0, 0.0]
        );
        assert_eq!(
            dequantize(GgmlType::F32, &1.5f32.to_le_bytes()).to_f32(),
            vec![1.5]
        );
    }

    #[test]
    fn unsupported_types_are_refused_by_name() {
        assert!(GgmlType::from_id(13).unwrap_err().contains("Q5_K"));
        assert!(GgmlType::from_id(1000).unwrap_err().contains("unknown"));
    }
}
