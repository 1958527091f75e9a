//! Constant element data and its exact MLIR spelling.
//!
//! Floats are printed as hexadecimal bit patterns (`0x3F800000`), which MLIR's dense-elements
//! parser reads back bit for bit, NaN payloads and infinities included; a decimal rendering
//! would need a round-trip guarantee for every float width and has no spelling for NaN.

use std::fmt;

use half::{bf16, f16};

use crate::types::ScalarType;

/// One element of a given type.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    F32(f32),
    Bf16(bf16),
    F16(f16),
    I32(i32),
    I64(i64),
    I8(i8),
    U8(u8),
    /// An `f8E4M3FN` element by its bits.
    F8E4M3FN(u8),
    Pred(bool),
}

/// Bits of the largest finite `f8E4M3FN` value, 448 (`S.1111.110`; `S.1111.111` is NaN).
const F8E4M3FN_MAX_BITS: u8 = 0x7E;

impl Scalar {
    pub fn dtype(self) -> ScalarType {
        match self {
            Scalar::F32(_) => ScalarType::F32,
            Scalar::Bf16(_) => ScalarType::Bf16,
            Scalar::F16(_) => ScalarType::F16,
            Scalar::I32(_) => ScalarType::I32,
            Scalar::I64(_) => ScalarType::I64,
            Scalar::I8(_) => ScalarType::I8,
            Scalar::U8(_) => ScalarType::U8,
            Scalar::F8E4M3FN(_) => ScalarType::F8E4M3FN,
            Scalar::Pred(_) => ScalarType::Pred,
        }
    }

    /// `value` as an element of `dtype`: floats round to nearest; integers and `i1` must be
    /// represented exactly, otherwise `None`.
    pub fn from_f64(dtype: ScalarType, value: f64) -> Option<Scalar> {
        let integral = value.fract() == 0.0;
        let in_range = |lo: f64, hi: f64| integral && value >= lo && value <= hi;
        Some(match dtype {
            ScalarType::F32 => Scalar::F32(value as f32),
            ScalarType::Bf16 => Scalar::Bf16(bf16::from_f64(value)),
            ScalarType::F16 => Scalar::F16(f16::from_f64(value)),
            ScalarType::I32 if in_range(i32::MIN.into(), i32::MAX.into()) => {
                Scalar::I32(value as i32)
            }
            // i64::MAX is not an f64; 2^63 is the first value past the range.
            ScalarType::I64 if integral && value >= -(2f64.powi(63)) && value < 2f64.powi(63) => {
                Scalar::I64(value as i64)
            }
            ScalarType::I8 if in_range(i8::MIN.into(), i8::MAX.into()) => Scalar::I8(value as i8),
            ScalarType::U8 if in_range(0.0, u8::MAX.into()) => Scalar::U8(value as u8),
            ScalarType::Pred if value == 0.0 || value == 1.0 => Scalar::Pred(value == 1.0),
            // Only zero: fp8 constants are not needed by any program, and a rounding of every
            // other value would be code with nothing to check it against.
            ScalarType::F8E4M3FN if value == 0.0 => Scalar::F8E4M3FN(0),
            _ => return None,
        })
    }

    /// The lowest value of the type (`-inf` for floats): the identity of `max`.
    pub fn lowest(dtype: ScalarType) -> Scalar {
        match dtype {
            ScalarType::F32 => Scalar::F32(f32::NEG_INFINITY),
            ScalarType::Bf16 => Scalar::Bf16(bf16::NEG_INFINITY),
            ScalarType::F16 => Scalar::F16(f16::NEG_INFINITY),
            ScalarType::I32 => Scalar::I32(i32::MIN),
            ScalarType::I64 => Scalar::I64(i64::MIN),
            ScalarType::I8 => Scalar::I8(i8::MIN),
            ScalarType::U8 => Scalar::U8(0),
            // No infinities: the lowest is -448.
            ScalarType::F8E4M3FN => Scalar::F8E4M3FN(0x80 | F8E4M3FN_MAX_BITS),
            ScalarType::Pred => Scalar::Pred(false),
        }
    }

    /// The highest value of the type (`+inf` for floats): the identity of `min`.
    pub fn highest(dtype: ScalarType) -> Scalar {
        match dtype {
            ScalarType::F32 => Scalar::F32(f32::INFINITY),
            ScalarType::Bf16 => Scalar::Bf16(bf16::INFINITY),
            ScalarType::F16 => Scalar::F16(f16::INFINITY),
            ScalarType::I32 => Scalar::I32(i32::MAX),
            ScalarType::I64 => Scalar::I64(i64::MAX),
            ScalarType::I8 => Scalar::I8(i8::MAX),
            ScalarType::U8 => Scalar::U8(u8::MAX),
            ScalarType::F8E4M3FN => Scalar::F8E4M3FN(F8E4M3FN_MAX_BITS),
            ScalarType::Pred => Scalar::Pred(true),
        }
    }

    /// Zero of the type (`false` for `i1`).
    pub fn zero(dtype: ScalarType) -> Scalar {
        match dtype {
            ScalarType::F32 => Scalar::F32(0.0),
            ScalarType::Bf16 => Scalar::Bf16(bf16::ZERO),
            ScalarType::F16 => Scalar::F16(f16::ZERO),
            ScalarType::I32 => Scalar::I32(0),
            ScalarType::I64 => Scalar::I64(0),
            ScalarType::I8 => Scalar::I8(0),
            ScalarType::U8 => Scalar::U8(0),
            ScalarType::F8E4M3FN => Scalar::F8E4M3FN(0),
            ScalarType::Pred => Scalar::Pred(false),
        }
    }
}

/// Prints the element as MLIR's dense-elements parser reads it exactly.
impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Scalar::F32(v) => write!(f, "0x{:08X}", v.to_bits()),
            Scalar::Bf16(v) => write!(f, "0x{:04X}", v.to_bits()),
            Scalar::F16(v) => write!(f, "0x{:04X}", v.to_bits()),
            Scalar::I32(v) => write!(f, "{v}"),
            Scalar::I64(v) => write!(f, "{v}"),
            Scalar::I8(v) => write!(f, "{v}"),
            Scalar::U8(v) => write!(f, "{v}"),
            Scalar::F8E4M3FN(v) => write!(f, "0x{v:02X}"),
            Scalar::Pred(v) => write!(f, "{v}"),
        }
    }
}

impl From<f32> for Scalar {
    fn from(v: f32) -> Self {
        Scalar::F32(v)
    }
}
impl From<bf16> for Scalar {
    fn from(v: bf16) -> Self {
        Scalar::Bf16(v)
    }
}
impl From<f16> for Scalar {
    fn from(v: f16) -> Self {
        Scalar::F16(v)
    }
}
impl From<i32> for Scalar {
    fn from(v: i32) -> Self {
        Scalar::I32(v)
    }
}
impl From<i64> for Scalar {
    fn from(v: i64) -> Self {
        Scalar::I64(v)
    }
}
impl From<i8> for Scalar {
    fn from(v: i8) -> Self {
        Scalar::I8(v)
    }
}
impl From<u8> for Scalar {
    fn from(v: u8) -> Self {
        Scalar::U8(v)
    }
}
impl From<bool> for Scalar {
    fn from(v: bool) -> Self {
        Scalar::Pred(v)
    }
}

/// Dense constant data of one element type, row-major.
#[derive(Debug, Clone, PartialEq)]
pub enum ConstData {
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
    F16(Vec<f16>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    I8(Vec<i8>),
    U8(Vec<u8>),
    /// `f8E4M3FN` elements by their bits.
    F8E4M3FN(Vec<u8>),
    Pred(Vec<bool>),
}

impl ConstData {
    pub fn dtype(&self) -> ScalarType {
        match self {
            ConstData::F32(_) => ScalarType::F32,
            ConstData::Bf16(_) => ScalarType::Bf16,
            ConstData::F16(_) => ScalarType::F16,
            ConstData::I32(_) => ScalarType::I32,
            ConstData::I64(_) => ScalarType::I64,
            ConstData::I8(_) => ScalarType::I8,
            ConstData::U8(_) => ScalarType::U8,
            ConstData::F8E4M3FN(_) => ScalarType::F8E4M3FN,
            ConstData::Pred(_) => ScalarType::Pred,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            ConstData::F32(v) => v.len(),
            ConstData::Bf16(v) => v.len(),
            ConstData::F16(v) => v.len(),
            ConstData::I32(v) => v.len(),
            ConstData::I64(v) => v.len(),
            ConstData::I8(v) => v.len(),
            ConstData::U8(v) => v.len(),
            ConstData::F8E4M3FN(v) => v.len(),
            ConstData::Pred(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i`; `None` past the end.
    pub fn get(&self, i: usize) -> Option<Scalar> {
        Some(match self {
            ConstData::F32(v) => Scalar::F32(*v.get(i)?),
            ConstData::Bf16(v) => Scalar::Bf16(*v.get(i)?),
            ConstData::F16(v) => Scalar::F16(*v.get(i)?),
            ConstData::I32(v) => Scalar::I32(*v.get(i)?),
            ConstData::I64(v) => Scalar::I64(*v.get(i)?),
            ConstData::I8(v) => Scalar::I8(*v.get(i)?),
            ConstData::U8(v) => Scalar::U8(*v.get(i)?),
            ConstData::F8E4M3FN(v) => Scalar::F8E4M3FN(*v.get(i)?),
            ConstData::Pred(v) => Scalar::Pred(*v.get(i)?),
        })
    }
}

macro_rules! const_data_from_vec {
    ($($t:ty => $variant:ident),* $(,)?) => {$(
        impl From<Vec<$t>> for ConstData {
            fn from(v: Vec<$t>) -> Self {
                ConstData::$variant(v)
            }
        }
        impl From<&[$t]> for ConstData {
            fn from(v: &[$t]) -> Self {
                ConstData::$variant(v.to_vec())
            }
        }
    )*};
}
const_data_from_vec!(f32 => F32, bf16 => Bf16, f16 => F16, i32 => I32, i64 => I64, i8 => I8,
    u8 => U8, bool => Pred);
