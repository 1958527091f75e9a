//! Element types named by the manifest and the program signatures, with their byte sizes.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The element type of a weight, a pool or a program operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    F32,
    Bf16,
    F16,
    I32,
    I8,
    U8,
    /// fp8 e4m3 without infinities (`f8E4M3FN`): 4 exponent bits, 3 mantissa bits, max 448;
    /// the code type of fp8 K/V pools.
    #[serde(rename = "f8e4m3fn")]
    F8E4M3FN,
}

impl Dtype {
    /// Every dtype the format names, in a stable order (used in error messages).
    pub const ALL: [Dtype; 7] = [
        Dtype::F32,
        Dtype::Bf16,
        Dtype::F16,
        Dtype::I32,
        Dtype::I8,
        Dtype::U8,
        Dtype::F8E4M3FN,
    ];

    /// Bytes per element.
    pub const fn byte_size(self) -> usize {
        match self {
            Dtype::F32 | Dtype::I32 => 4,
            Dtype::Bf16 | Dtype::F16 => 2,
            Dtype::I8 | Dtype::U8 | Dtype::F8E4M3FN => 1,
        }
    }

    /// The name used in JSON (`"f32"`, `"bf16"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "f16",
            Dtype::I32 => "i32",
            Dtype::I8 => "i8",
            Dtype::U8 => "u8",
            Dtype::F8E4M3FN => "f8e4m3fn",
        }
    }

    /// Whether weights, activations and KV pools may use this dtype in format version 1.
    pub const fn is_model_dtype(self) -> bool {
        matches!(self, Dtype::F32 | Dtype::Bf16)
    }

    /// Whether K/V pools may hold this dtype: a model dtype, or a quantized code type (i8,
    /// f8e4m3fn) whose pools carry f32 scales beside them.
    pub const fn is_kv_dtype(self) -> bool {
        self.is_model_dtype() || self.is_kv_code_dtype()
    }

    /// Whether K/V pools of this dtype hold quantized codes with per-group scales.
    pub const fn is_kv_code_dtype(self) -> bool {
        matches!(self, Dtype::I8 | Dtype::F8E4M3FN)
    }

    /// Byte length of a dense tensor of this dtype with `dims`, or `None` on overflow.
    pub fn byte_length(self, dims: &[usize]) -> Option<u64> {
        dims.iter()
            .try_fold(self.byte_size() as u64, |acc, &d| acc.checked_mul(d as u64))
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Dtype {
    type Err = UnknownDtype;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Dtype::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| UnknownDtype(s.to_owned()))
    }
}

/// A dtype name the format does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown dtype {0:?}; known: f32, bf16, f16, i32, i8, u8, f8e4m3fn")]
pub struct UnknownDtype(pub String);
