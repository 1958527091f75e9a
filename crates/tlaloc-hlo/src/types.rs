//! Element types and static tensor types, and how they are spelled in MLIR.

use std::fmt;

/// The element types the builder can produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    Bf16,
    F16,
    I32,
    I64,
    I8,
    U8,
    /// `i1`, the type of comparison results.
    Pred,
}

impl DType {
    /// Every supported element type, in a fixed order.
    pub const ALL: [DType; 8] = [
        DType::F32,
        DType::Bf16,
        DType::F16,
        DType::I32,
        DType::I64,
        DType::I8,
        DType::U8,
        DType::Pred,
    ];

    /// The MLIR spelling (`f32`, `bf16`, `ui8`, `i1`, ...).
    pub fn mlir_name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::Bf16 => "bf16",
            DType::F16 => "f16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::I8 => "i8",
            DType::U8 => "ui8",
            DType::Pred => "i1",
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::Bf16 | DType::F16)
    }

    pub fn is_signed_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64 | DType::I8)
    }

    pub fn is_unsigned_int(self) -> bool {
        matches!(self, DType::U8)
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
            DType::F32 | DType::I32 => 4,
            DType::Bf16 | DType::F16 => 2,
            DType::I64 => 8,
            DType::I8 | DType::U8 | DType::Pred => 1,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.mlir_name())
    }
}

/// A ranked tensor type with static dimensions; rank 0 is a scalar.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: DType,
    pub dims: Vec<usize>,
}

impl TensorType {
    pub fn new(dtype: DType, dims: impl Into<Vec<usize>>) -> Self {
        TensorType {
            dtype,
            dims: dims.into(),
        }
    }

    pub fn scalar(dtype: DType) -> Self {
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
    pub fn with_dtype(&self, dtype: DType) -> Self {
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
