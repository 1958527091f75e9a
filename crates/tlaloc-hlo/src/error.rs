//! The error every builder call returns: which op refused, and why.

use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HloError {
    /// An op was given operands or attributes it cannot accept; `detail` names the mismatch
    /// and what would have been accepted.
    #[error("stablehlo.{op}: {detail}")]
    Invalid { op: &'static str, detail: String },
    /// A `Value` made by another builder, or one that does not exist.
    #[error("stablehlo.{op}: value #{index} was not made by this function builder")]
    ForeignValue { op: &'static str, index: usize },
    /// The function signature is inconsistent (results, donation, names).
    #[error("function @{function}: {detail}")]
    Signature { function: String, detail: String },
}

pub(crate) fn invalid(op: &'static str, detail: impl Into<String>) -> HloError {
    HloError::Invalid {
        op,
        detail: detail.into(),
    }
}
