//! A typed graph builder that prints StableHLO text.
//!
//! A [`FunctionBuilder`] holds an arena of typed [`Value`]s; every op checks its operands'
//! dtypes and dims when it is added and returns [`HloError`] naming the op and the mismatch, so
//! a malformed graph fails in Rust rather than inside a plugin's compiler. [`FunctionBuilder::finish`]
//! yields a [`Module`] whose printer writes deterministic text (`module { func.func @main }`)
//! that PJRT plugins compile.
//!
//! ```
//! use tlaloc_hlo::{FunctionBuilder, ScalarType, TensorType};
//! let mut f = FunctionBuilder::new("double");
//! let x = f.arg(TensorType::new(ScalarType::F32, [4]));
//! let y = f.add(x, x)?;
//! let text = f.finish(&[y])?.to_text();
//! assert!(text.contains("stablehlo.add"));
//! # Ok::<(), tlaloc_hlo::HloError>(())
//! ```

#![forbid(unsafe_code)]

mod builder;
mod error;
mod literal;
mod module;
mod ops;
mod sharding;
mod types;

pub use builder::{FunctionBuilder, Value};
pub use error::HloError;
pub use half::{bf16, f16};
pub use literal::{ConstData, Scalar};
pub use module::{Argument, Module};
pub use ops::{
    BinaryOp, CompareDirection, CompareType, CustomCallAttr, DotDims, GatherSpec, Precision,
    ReduceOp, ScatterSpec, ScatterUpdate, UnaryOp,
};
pub use sharding::Sharding;
pub use types::{ScalarType, TensorType};
