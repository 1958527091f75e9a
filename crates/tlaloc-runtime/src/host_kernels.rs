//! The runtime's custom-call kernels: each target of `tlaloc_artifact::kernels` that this
//! runtime can serve, as a [`HostKernel`] over `tlaloc_kernels`. This module checks the
//! operands against the target's contract (count, dtypes, dims) and refuses by name what the
//! contract does not allow; the arithmetic is `tlaloc_kernels`'.

use std::sync::{Arc, OnceLock};

use tlaloc_artifact::BlockFormat;
use tlaloc_artifact::kernels::{
    CPU_MATMUL, CPU_PAGED_ATTENTION, cpu_matmul_blocks, cpu_matmul_blocks_xq8,
};
use tlaloc_kernels::{AttentionInputs, AttentionShape, KvPool, Matrix};
use tlaloc_pjrt::{HostBuffer, HostBufferMut, HostElementType, HostKernel};

/// The kernel registered for `target`, if this runtime has one: one instance per target for
/// the whole process, so that every engine loaded on a plugin registers the same kernel (a
/// plugin refuses a second, different kernel under a target it already has).
pub(crate) fn kernel_for(target: &str) -> Option<Arc<dyn HostKernel>> {
    static MATMUL: OnceLock<Arc<dyn HostKernel>> = OnceLock::new();
    static BLOCKS: [OnceLock<Arc<dyn HostKernel>>; BlockFormat::ALL.len()] =
        [const { OnceLock::new() }; BlockFormat::ALL.len()];
    static BLOCKS_XQ8: [OnceLock<Arc<dyn HostKernel>>; BlockFormat::ALL.len()] =
        [const { OnceLock::new() }; BlockFormat::ALL.len()];
    static ATTENTION: OnceLock<Arc<dyn HostKernel>> = OnceLock::new();
    if target == CPU_MATMUL {
        return Some(MATMUL.get_or_init(|| Arc::new(CpuMatmul)).clone());
    }
    if target == CPU_PAGED_ATTENTION {
        return Some(
            ATTENTION
                .get_or_init(|| Arc::new(CpuPagedAttention))
                .clone(),
        );
    }
    for (i, &format) in BlockFormat::ALL.iter().enumerate() {
        for (round_activations, name, cell) in [
            (false, cpu_matmul_blocks(format), &BLOCKS[i]),
            (true, cpu_matmul_blocks_xq8(format), &BLOCKS_XQ8[i]),
        ] {
            if name == target {
                let kernel = CpuMatmulBlocks {
                    format,
                    round_activations,
                };
                return Some(cell.get_or_init(|| Arc::new(kernel)).clone());
            }
        }
    }
    None
}

/// [`CPU_MATMUL`]: `y [N, O] = x [N, K] · w [O, K]ᵀ`, x f32, w f32 or bf16, y f32.
struct CpuMatmul;

fn dims2(target: &str, what: &str, dims: &[i64]) -> Result<(usize, usize), String> {
    match dims {
        [a, b] if *a >= 0 && *b >= 0 => Ok((*a as usize, *b as usize)),
        _ => Err(format!(
            "{target}: {what} must have two dims, it has {dims:?}"
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
        let (rows, inner) = dims2(CPU_MATMUL, "x", x.dims())?;
        let (out, w_inner) = dims2(CPU_MATMUL, "w", w.dims())?;
        let (y_rows, y_out) = dims2(CPU_MATMUL, "y", y.dims())?;
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

/// The block kernels (`cpu_matmul_blocks`): `y [N, O] = x [N, K] · w [O, K]ᵀ`, x f32, w the raw
/// blocks of `format`, `u8 [O, K / 32 * block bytes]`, y f32; with `round_activations`
/// (`cpu_matmul_blocks_xq8`) x is first rounded to 8-bit codes per 32-element block.
struct CpuMatmulBlocks {
    format: BlockFormat,
    round_activations: bool,
}

impl HostKernel for CpuMatmulBlocks {
    fn execute(
        &self,
        args: &[HostBuffer<'_>],
        results: &mut [HostBufferMut<'_>],
    ) -> Result<(), String> {
        let format = self.format;
        let t = if self.round_activations {
            cpu_matmul_blocks_xq8(format)
        } else {
            cpu_matmul_blocks(format)
        };
        let [x, w] = args else {
            return Err(format!(
                "{t} takes two operands (x, w), it was given {}",
                args.len()
            ));
        };
        let [y] = results else {
            return Err(format!(
                "{t} has one result, it was given {}",
                results.len()
            ));
        };
        let (rows, inner) = dims2(t, "x", x.dims())?;
        let (out, w_bytes) = dims2(t, "w", w.dims())?;
        let (y_rows, y_out) = dims2(t, "y", y.dims())?;
        if format.row_bytes(inner) != Some(w_bytes) || y_rows != rows || y_out != out {
            return Err(format!(
                "{t}: x is [{rows}, {inner}], w [{out}, {w_bytes}] and y [{y_rows}, {y_out}]; \
                 they must be [N, K] with K a multiple of {}, [O, K / {} * {}] and [N, O]",
                format.block_elements(),
                format.block_elements(),
                format.block_bytes(),
            ));
        }
        if w.dtype() != HostElementType::U8 {
            return Err(format!("{t}: w must be u8 blocks, it is {:?}", w.dtype()));
        }
        let x = x
            .as_f32()
            .ok_or_else(|| format!("{t}: x must be f32, it is {:?}", x.dtype()))?;
        let dtype = y.dtype();
        let y = y
            .as_f32_mut()
            .ok_or_else(|| format!("{t}: y must be f32, it is {dtype:?}"))?;
        let bytes = w.bytes();
        let w = match format {
            BlockFormat::Q8_0 => Matrix::Q8_0(bytes),
            BlockFormat::Q4_0 => Matrix::Q4_0(bytes),
            BlockFormat::Q4_1 => Matrix::Q4_1(bytes),
            BlockFormat::Q5_0 => Matrix::Q5_0(bytes),
            BlockFormat::Q4_K => Matrix::Q4_K(bytes),
            BlockFormat::Q6_K => Matrix::Q6_K(bytes),
        };
        let matmul = if self.round_activations {
            tlaloc_kernels::matmul_xwt_int8
        } else {
            tlaloc_kernels::matmul_xwt
        };
        matmul(x, rows, inner, w, out, y).map_err(|e| e.to_string())
    }
}

/// [`CPU_PAGED_ATTENTION`]: `out [N, heads * D]` from `q [N, heads, D]`, the K and V pools
/// `[numBlocks, blockSize, kvHeads, D]` (f32 or bf16), `blockTables [B, pages]`, `positions
/// [B, T]`, `seqLens [B]`, `scale f32 []` and `window i32 []`.
struct CpuPagedAttention;

/// `dims` as `N` non-negative sizes, or the contract's refusal naming `what`.
fn dims_n<const N: usize>(what: &str, dims: &[i64]) -> Result<[usize; N], String> {
    let sizes: Option<Vec<usize>> = dims.iter().map(|&d| usize::try_from(d).ok()).collect();
    sizes
        .and_then(|v| <[usize; N]>::try_from(v).ok())
        .ok_or_else(|| format!("{CPU_PAGED_ATTENTION}: {what} must have {N} dims, it has {dims:?}"))
}

fn i32_operand<'a>(what: &str, b: &HostBuffer<'a>) -> Result<&'a [i32], String> {
    b.as_i32().ok_or_else(|| {
        format!(
            "{CPU_PAGED_ATTENTION}: {what} must be i32, it is {:?}",
            b.dtype()
        )
    })
}

fn pool<'a>(what: &str, b: &HostBuffer<'a>) -> Result<KvPool<'a>, String> {
    match b.dtype() {
        HostElementType::F32 => b.as_f32().map(KvPool::F32),
        HostElementType::Bf16 => b.as_u16().map(KvPool::Bf16),
        _ => None,
    }
    .ok_or_else(|| {
        format!(
            "{CPU_PAGED_ATTENTION}: the {what} pool must be f32 or bf16, it is {:?}",
            b.dtype()
        )
    })
}

impl HostKernel for CpuPagedAttention {
    fn execute(
        &self,
        args: &[HostBuffer<'_>],
        results: &mut [HostBufferMut<'_>],
    ) -> Result<(), String> {
        let t = CPU_PAGED_ATTENTION;
        let [q, k, v, block_tables, positions, seq_lens, scale, window] = args else {
            return Err(format!(
                "{t} takes eight operands (q, k, v, blockTables, positions, seqLens, scale, \
                 window), it was given {}",
                args.len()
            ));
        };
        let [out] = results else {
            return Err(format!(
                "{t} has one result, it was given {}",
                results.len()
            ));
        };
        let [rows, heads, head_dim] = dims_n("q", q.dims())?;
        let [num_blocks, block_size, kv_heads, pool_dim] = dims_n("k", k.dims())?;
        let [batch, pages] = dims_n("blockTables", block_tables.dims())?;
        let [position_rows, tokens] = dims_n("positions", positions.dims())?;
        let [out_rows, out_cols] = dims_n("the result", out.dims())?;
        if k.dims() != v.dims()
            || pool_dim != head_dim
            || position_rows != batch
            || rows != batch * tokens
            || out_rows != rows
            || out_cols != heads * head_dim
        {
            return Err(format!(
                "{t}: q {:?}, k {:?}, v {:?}, blockTables {:?}, positions {:?} and the result \
                 {:?} must be [B * T, heads, D], two pools [blocks, blockSize, kvHeads, D], \
                 [B, pages], [B, T] and [B * T, heads * D]",
                q.dims(),
                k.dims(),
                v.dims(),
                block_tables.dims(),
                positions.dims(),
                out.dims()
            ));
        }
        let shape = AttentionShape {
            batch,
            tokens,
            heads,
            kv_heads,
            head_dim,
            num_blocks,
            block_size,
            context: pages * block_size,
        };
        let scale = match scale.as_f32() {
            Some(&[s]) => s,
            _ => {
                return Err(format!(
                    "{t}: scale must be one f32, it is {:?} {:?}",
                    scale.dtype(),
                    scale.dims()
                ));
            }
        };
        let window = match i32_operand("window", window)? {
            &[0] => None,
            &[w] if w > 0 => Some(w as usize),
            other => {
                return Err(format!(
                    "{t}: window must be one i32, 0 (none) or positive, it is {other:?}"
                ));
            }
        };
        let inputs = AttentionInputs {
            q: q.as_f32()
                .ok_or_else(|| format!("{t}: q must be f32, it is {:?}", q.dtype()))?,
            block_tables: i32_operand("blockTables", block_tables)?,
            positions: i32_operand("positions", positions)?,
            seq_lens: i32_operand("seqLens", seq_lens)?,
            scale,
            window,
        };
        let (k, v) = (pool("K", k)?, pool("V", v)?);
        let dtype = out.dtype();
        let out = out
            .as_f32_mut()
            .ok_or_else(|| format!("{t}: the result must be f32, it is {dtype:?}"))?;
        tlaloc_kernels::paged_attention(&shape, &inputs, k, v, out).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tlaloc_artifact::BlockFormat;
    use tlaloc_artifact::kernels::KERNELS;

    /// Every target of the contract has a kernel here, the same instance each time.
    #[test]
    fn every_kernel_target_has_one_kernel_per_process() {
        for (target, _) in KERNELS {
            let a = super::kernel_for(target).expect(target);
            let b = super::kernel_for(target).expect(target);
            assert!(Arc::ptr_eq(&a, &b), "{target}");
        }
        assert!(super::kernel_for("tlaloc.cpu.nothing").is_none());
    }

    /// The artifact's block layouts and the kernels crate's are the same numbers.
    #[test]
    fn the_block_layouts_agree_with_tlaloc_kernels() {
        let q = BlockFormat::Q8_0;
        assert_eq!(q.block_elements(), tlaloc_kernels::Q8_0_BLOCK_ELEMS);
        assert_eq!(q.block_bytes(), tlaloc_kernels::Q8_0_BLOCK_BYTES);
        for (q, bytes) in [
            (BlockFormat::Q4_0, tlaloc_kernels::Q4_0_BLOCK_BYTES),
            (BlockFormat::Q4_1, tlaloc_kernels::Q4_1_BLOCK_BYTES),
            (BlockFormat::Q5_0, tlaloc_kernels::Q5_0_BLOCK_BYTES),
        ] {
            assert_eq!(q.block_elements(), tlaloc_kernels::Q4_BLOCK_ELEMS, "{q}");
            assert_eq!(q.block_bytes(), bytes, "{q}");
        }
        for (q, bytes) in [
            (BlockFormat::Q4_K, tlaloc_kernels::Q4_K_BLOCK_BYTES),
            (BlockFormat::Q6_K, tlaloc_kernels::Q6_K_BLOCK_BYTES),
        ] {
            assert_eq!(q.block_elements(), tlaloc_kernels::K_BLOCK_ELEMS, "{q}");
            assert_eq!(q.block_bytes(), bytes, "{q}");
        }
    }
}
