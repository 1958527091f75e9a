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
}

impl Dtype {
    /// Every dtype the format names, in a stable order (used in error messages).
    pub const ALL: [Dtype; 6] = [
        Dtype::F32,
        Dtype::Bf16,
        Dtype::F16,
        Dtype::I32,
        Dtype::I8,
        Dtype::U8,
    ];

    /// Bytes per element.
    pub const fn byte_size(self) -> usize {
        match self {
            Dtype::F32 | Dtype::I32 => 4,
            Dtype::Bf16 | Dtype::F16 => 2,
            Dtype::I8 | Dtype::U8 => 1,
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
        }
    }

    /// Whether weights, activations and KV pools may use this dtype in format version 1.
    pub const fn is_model_dtype(self) -> bool {
        matches!(self, Dtype::F32 | Dtype::Bf16)
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
#[error("unknown dtype {0:?}; known: f32, bf16, f16, i32, i8, u8")]
pub struct UnknownDtype(pub String);
