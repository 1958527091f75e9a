//! Element types and static tensor types, and how they are spelled in MLIR.

use std::fmt;

/// The element types the builder can produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScalarType {
    F32,
    Bf16,
    F16,
    I32,
    I64,
    I8,
    U8,
    /// fp8 e4m3 without infinities (`f8E4M3FN`), max 448.
    F8E4M3FN,
    /// `i1`, the type of comparison results.
    Pred,
}

impl ScalarType {
    /// Every supported element type, in a fixed order.
    pub const ALL: [ScalarType; 9] = [
        ScalarType::F32,
        ScalarType::Bf16,
        ScalarType::F16,
        ScalarType::I32,
        ScalarType::I64,
        ScalarType::I8,
        ScalarType::U8,
        ScalarType::F8E4M3FN,
        ScalarType::Pred,
    ];

    /// The MLIR spelling (`f32`, `bf16`, `ui8`, `i1`, ...).
    pub fn mlir_name(self) -> &'static str {
        match self {
            ScalarType::F32 => "f32",
            ScalarType::Bf16 => "bf16",
            ScalarType::F16 => "f16",
            ScalarType::I32 => "i32",
            ScalarType::I64 => "i64",
            ScalarType::I8 => "i8",
            ScalarType::U8 => "ui8",
            ScalarType::F8E4M3FN => "f8E4M3FN",
            ScalarType::Pred => "i1",
        }
    }

    pub fn is_float(self) -> bool {
        matches!(
            self,
            ScalarType::F32 | ScalarType::Bf16 | ScalarType::F16 | ScalarType::F8E4M3FN
        )
    }

    pub fn is_signed_int(self) -> bool {
        matches!(self, ScalarType::I32 | ScalarType::I64 | ScalarType::I8)
    }

    pub fn is_unsigned_int(self) -> bool {
        matches!(self, ScalarType::U8)
    }

    pub fn is_int(self) -> bool {
        self.is_signed_int() || self.is_unsigned_int()
    }

    /// Floats and integers: the types arithmetic is defined on (not `i1`).
    pub fn is_numeric(self) -> bool {
        self.is_float() || self.is_int()
    }

    /// Size of one element in bytes as PJRT stores it (`i1` takes a byte).
    pub fn byte_size(self) -> usize {
        match self {
            ScalarType::F32 | ScalarType::I32 => 4,
            ScalarType::Bf16 | ScalarType::F16 => 2,
            ScalarType::I64 => 8,
            ScalarType::I8 | ScalarType::U8 | ScalarType::F8E4M3FN | ScalarType::Pred => 1,
        }
    }
}

impl fmt::Display for ScalarType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.mlir_name())
    }
}

/// A ranked tensor type with static dimensions; rank 0 is a scalar.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: ScalarType,
    pub dims: Vec<usize>,
}

impl TensorType {
    pub fn new(dtype: ScalarType, dims: impl Into<Vec<usize>>) -> Self {
        TensorType {
            dtype,
            dims: dims.into(),
        }
    }

    pub fn scalar(dtype: ScalarType) -> Self {
        TensorType {
            dtype,
            dims: Vec::new(),
        }
    }

    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// The number of elements, or `None` when it overflows `usize`.
    pub fn element_count(&self) -> Option<usize> {
        self.dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
    }

    /// The same dims with another element type.
    pub fn with_dtype(&self, dtype: ScalarType) -> Self {
        TensorType {
            dtype,
            dims: self.dims.clone(),
        }
    }
}

/// Prints the MLIR type, e.g. `tensor<2x3xf32>` or `tensor<i32>`.
impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tensor<")?;
        for d in &self.dims {
            write!(f, "{d}x")?;
        }
        write!(f, "{}>", self.dtype)
    }
}
