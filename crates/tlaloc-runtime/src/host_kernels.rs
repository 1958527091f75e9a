//! The runtime's custom-call kernels: each target of `tlaloc_artifact::kernels` that this
//! runtime can serve, as a [`HostKernel`] over `tlaloc_kernels`. This module checks the
//! operands against the target's contract (count, dtypes, dims) and refuses by name what the
//! contract does not allow; the arithmetic is `tlaloc_kernels`'.

use std::sync::Arc;

use tlaloc_artifact::kernels::CPU_MATMUL;
use tlaloc_kernels::Matrix;
use tlaloc_pjrt::{HostBuffer, HostBufferMut, HostElementType, HostKernel};

/// The kernel registered for `target`, if this runtime has one.
pub(crate) fn kernel_for(target: &str) -> Option<Arc<dyn HostKernel>> {
    match target {
        CPU_MATMUL => Some(Arc::new(CpuMatmul)),
        _ => None,
    }
}

/// [`CPU_MATMUL`]: `y [N, O] = x [N, K] · w [O, K]ᵀ`, x f32, w f32 or bf16, y f32.
struct CpuMatmul;

fn dims2(what: &str, dims: &[i64]) -> Result<(usize, usize), String> {
    match dims {
        [a, b] if *a >= 0 && *b >= 0 => Ok((*a as usize, *b as usize)),
        _ => Err(format!(
            "{CPU_MATMUL}: {what} must have two dims, it has {dims:?}"
        )),
    }
}

impl HostKernel for CpuMatmul {
    fn execute(
        &self,
        args: &[HostBuffer<'_>],
        results: &mut [HostBufferMut<'_>],
    ) -> Result<(), String> {
        let [x, w] = args else {
            return Err(format!(
                "{CPU_MATMUL} takes two operands (x, w), it was given {}",
                args.len()
            ));
        };
        let [y] = results else {
            return Err(format!(
                "{CPU_MATMUL} has one result, it was given {}",
                results.len()
            ));
        };
        let (rows, inner) = dims2("x", x.dims())?;
        let (out, w_inner) = dims2("w", w.dims())?;
        let (y_rows, y_out) = dims2("y", y.dims())?;
        if w_inner != inner || y_rows != rows || y_out != out {
            return Err(format!(
                "{CPU_MATMUL}: x is [{rows}, {inner}], w [{out}, {w_inner}] and y [{y_rows}, {y_out}]; \
                 they must be [N, K], [O, K] and [N, O]"
            ));
        }
        let x = x
            .as_f32()
            .ok_or_else(|| format!("{CPU_MATMUL}: x must be f32, it is {:?}", x.dtype()))?;
        let w = match w.dtype() {
            HostElementType::F32 => Matrix::F32(w.as_f32().ok_or("w: unaligned f32")?),
            HostElementType::Bf16 => Matrix::Bf16(w.as_u16().ok_or("w: unaligned bf16")?),
            other => {
                return Err(format!(
                    "{CPU_MATMUL}: w must be f32 or bf16, it is {other:?}"
                ));
            }
        };
        let dtype = y.dtype();
        let y = y
            .as_f32_mut()
            .ok_or_else(|| format!("{CPU_MATMUL}: y must be f32, it is {dtype:?}"))?;
        tlaloc_kernels::matmul_xwt(x, rows, inner, w, out, y).map_err(|e| e.to_string())
    }
}
