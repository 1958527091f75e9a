//! Host kernels for the CPU serving path: `y = x · wᵀ` with the weight matrix as stored in the
//! artifact (`[out, inner]`, row-major; f32, bf16, or the GGUF blocks Q8_0, Q4_0, Q4_1, Q5_0, Q4_K
//! and Q6_K), and paged attention over the K/V pools read in place ([`paged_attention`], its own
//! module doc).
//!
//! Decode multiplies a handful of activation rows by every weight matrix once per step, so the work is
//! bound by memory bandwidth, not arithmetic. The design decision that follows: each weight row is
//! streamed from memory exactly once per call and used for *all* activation rows while it is in cache.
//! The output rows (`out`) are split into chunks run on all cores through rayon; inside a chunk the
//! weights are walked in cache-sized tiles, and each tile is applied to every block of activation rows
//! before the next tile is loaded. The SIMD inner loops live in `simd` and are dispatched at run
//! time on the CPU's features (the binary is built for baseline x86-64).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod attention;
mod simd;

pub use attention::{AttentionError, AttentionInputs, AttentionShape, KvPool, paged_attention};

use rayon::prelude::*;

/// A weight matrix `[out, inner]`, row-major, as stored in the artifact (the block formats named as
/// llama.cpp names them).
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy)]
pub enum Matrix<'a> {
    /// f32 elements, `out * inner` of them.
    F32(&'a [f32]),
    /// Raw bf16 bits (the upper half of an f32), `out * inner` of them.
    Bf16(&'a [u16]),
    /// GGUF Q8_0 blocks: each row is `inner / 32` blocks of 34 bytes, a little-endian f16 scale `d`
    /// followed by 32 `i8` codes; element value = `d * code`. Needs `inner % 32 == 0`.
    Q8_0(&'a [u8]),
    /// GGUF Q4_0 blocks: each row is `inner / 32` blocks of 18 bytes, a little-endian f16 scale `d`
    /// followed by 16 bytes of two 4-bit codes each; element `j < 16` of a block is
    /// `d * ((byte[j] & 0xF) - 8)` and element `j + 16` is `d * ((byte[j] >> 4) - 8)`.
    Q4_0(&'a [u8]),
    /// GGUF Q4_1 blocks: each row is `inner / 32` blocks of 20 bytes, little-endian f16 `d` and `m`
    /// followed by 16 bytes of codes as in Q4_0; element value = `d * code + m` (no offset), the
    /// product exact in f32 and the sum rounded once.
    Q4_1(&'a [u8]),
    /// GGUF Q5_0 blocks: each row is `inner / 32` blocks of 22 bytes, a little-endian f16 scale `d`,
    /// a little-endian u32 `qh`, then 16 code bytes as in Q4_0; the code of element `e` is its
    /// nibble with bit `e` of `qh` as bit 4, and the element is `d * (code - 16)`.
    Q5_0(&'a [u8]),
    /// GGUF Q4_K super-blocks: each row is `inner / 256` blocks of 144 bytes, little-endian f16 `d`
    /// and `dmin`, 12 bytes of eight packed 6-bit (scale, min) pairs (llama.cpp's
    /// `get_scale_min_k4`), then 128 code bytes; sub-block `j` (32 elements) takes the low (`j`
    /// even) or high (`j` odd) nibbles of code bytes `32 (j / 2) ..`, and its element is
    /// `(d * sc[j]) * code - dmin * mn[j]`, rounded once to f32. Needs `inner % 256 == 0`.
    Q4_K(&'a [u8]),
    /// GGUF Q6_K super-blocks: each row is `inner / 256` blocks of 210 bytes: 128 bytes of low
    /// nibbles, 64 bytes of 2-bit high parts, 16 `i8` scales, and a little-endian f16 `d`; element
    /// `e` is `(d * scale[e / 16]) * (code - 32)`, exact in f32 (layout in `tlaloc-artifact`'s
    /// `BlockFormat::Q6_K`). Needs `inner % 256 == 0`.
    Q6_K(&'a [u8]),
}

impl Matrix<'_> {
    fn dtype(&self) -> &'static str {
        match self {
            Matrix::F32(_) => "f32",
            Matrix::Bf16(_) => "bf16",
            Matrix::Q8_0(_) => "Q8_0",
            Matrix::Q4_0(_) => "Q4_0",
            Matrix::Q4_1(_) => "Q4_1",
            Matrix::Q5_0(_) => "Q5_0",
            Matrix::Q4_K(_) => "Q4_K",
            Matrix::Q6_K(_) => "Q6_K",
        }
    }

    /// `(elements, bytes)` per block for the block formats, `None` for dense matrices.
    fn block_layout(&self) -> Option<(usize, usize)> {
        match self {
            Matrix::F32(_) | Matrix::Bf16(_) => None,
            Matrix::Q8_0(_) => Some((Q8_0_BLOCK_ELEMS, Q8_0_BLOCK_BYTES)),
            Matrix::Q4_0(_) => Some((Q4_BLOCK_ELEMS, Q4_0_BLOCK_BYTES)),
            Matrix::Q4_1(_) => Some((Q4_BLOCK_ELEMS, Q4_1_BLOCK_BYTES)),
            Matrix::Q5_0(_) => Some((Q4_BLOCK_ELEMS, Q5_0_BLOCK_BYTES)),
            Matrix::Q4_K(_) => Some((K_BLOCK_ELEMS, Q4_K_BLOCK_BYTES)),
            Matrix::Q6_K(_) => Some((K_BLOCK_ELEMS, Q6_K_BLOCK_BYTES)),
        }
    }

    /// Number of storage units in the slice (elements, or bytes for the block formats).
    fn len(&self) -> usize {
        match self {
            Matrix::F32(s) => s.len(),
            Matrix::Bf16(s) => s.len(),
            Matrix::Q8_0(s)
            | Matrix::Q4_0(s)
            | Matrix::Q4_1(s)
            | Matrix::Q5_0(s)
            | Matrix::Q4_K(s)
            | Matrix::Q6_K(s) => s.len(),
        }
    }

    /// Bytes of one weight row of `inner` elements (`inner` whole blocks for the block formats).
    fn row_bytes(&self, inner: usize) -> usize {
        match (self, self.block_layout()) {
            (Matrix::F32(_), _) => inner * 4,
            (_, None) => inner * 2,
            (_, Some((elems, bytes))) => inner / elems * bytes,
        }
    }
}

/// Elements per Q8_0 block.
pub const Q8_0_BLOCK_ELEMS: usize = 32;
/// Bytes per Q8_0 block: an f16 scale and 32 `i8` codes.
pub const Q8_0_BLOCK_BYTES: usize = 34;
/// Elements per Q4_0, Q4_1 and Q5_0 block.
pub const Q4_BLOCK_ELEMS: usize = 32;
/// Bytes per Q4_0 block: an f16 scale and 16 bytes of 4-bit codes.
pub const Q4_0_BLOCK_BYTES: usize = 18;
/// Bytes per Q4_1 block: f16 scale and minimum, and 16 bytes of 4-bit codes.
pub const Q4_1_BLOCK_BYTES: usize = 20;
/// Bytes per Q5_0 block: an f16 scale, 4 bytes of high bits and 16 bytes of 4-bit codes.
pub const Q5_0_BLOCK_BYTES: usize = 22;
/// Elements per Q4_K and Q6_K super-block.
pub const K_BLOCK_ELEMS: usize = 256;
/// Bytes per Q4_K super-block: f16 `d` and `dmin`, 12 bytes of scales and mins, 128 code bytes.
pub const Q4_K_BLOCK_BYTES: usize = 144;
/// Bytes per Q6_K super-block: 128 bytes of low nibbles, 64 of high bits, 16 scales, f16 `d`.
pub const Q6_K_BLOCK_BYTES: usize = 210;

/// Why a kernel call was refused.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum KernelError {
    /// An operand's slice does not have the length its shape needs.
    #[error(
        "matmul_xwt: operand `{operand}` ({dtype}) has {actual} {unit}, but its shape {shape} needs {expected}"
    )]
    Shape {
        /// `x`, `w` or `y`.
        operand: &'static str,
        /// The operand's element type.
        dtype: &'static str,
        /// The shape it was given, e.g. `[rows=2, inner=576]`.
        shape: String,
        /// What the slice length should be.
        expected: usize,
        /// What it is.
        actual: usize,
        /// `elements` or `bytes`.
        unit: &'static str,
    },
    /// A shape whose element count does not fit in `usize`.
    #[error("matmul_xwt: operand `{operand}` shape {shape} overflows usize")]
    Overflow {
        /// `x`, `w` or `y`.
        operand: &'static str,
        /// The shape it was given.
        shape: String,
    },
    /// Block-quantized weights whose rows are not whole blocks.
    #[error(
        "matmul_xwt: {format} weights need inner to be a multiple of {block_elements}, got inner = {inner}"
    )]
    InnerNotBlockMultiple {
        /// `Q8_0`, `Q4_0`, `Q4_1`, `Q5_0`, `Q4_K` or `Q6_K`.
        format: &'static str,
        /// Elements per block of the format.
        block_elements: usize,
        /// The inner length given.
        inner: usize,
    },
    /// [`matmul_xwt_int8`] given dense weights.
    #[error(
        "matmul_xwt_int8 takes block-quantized weights (Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K), not {format}; matmul_xwt takes dense ones"
    )]
    NotBlockQuantized {
        /// The weights' dtype.
        format: &'static str,
    },
}

/// `y[n, o] = Σ_k x[n, k] · w[o, k]` (`y = x · wᵀ`): `x` is `[rows, inner]` f32, `w` is `[out, inner]`,
/// `y` is `[rows, out]` f32 and is overwritten. Runs on the current rayon pool (all cores by default;
/// call inside `ThreadPool::install` to choose).
///
/// Accumulation is in f32; bf16 and block weights are widened to f32 inside the loop (exactly: every
/// bf16, every Q8_0, Q4_0, Q5_0 and Q6_K weight is an f32; a Q4_1 or Q4_K weight is a product plus or
/// minus a product, rounded once to f32, as the dequantized matrix holds it). Each output's error is within `γ_inner · Σ_k |x w|`
/// (`γ_n = n·u / (1 - n·u)`, `u = 2^-24`, `w` the f32 weight), and its bits do not depend on the
/// thread count. Matrices under 128 KiB run on the calling thread. Allocates per call: the
/// transposed output for `rows > 1`, and a permuted copy of `x` for bf16 and the 32-element block
/// formats (both `rows * inner` or smaller).
pub fn matmul_xwt(
    x: &[f32],
    rows: usize,
    inner: usize,
    w: Matrix<'_>,
    out: usize,
    y: &mut [f32],
) -> Result<(), KernelError> {
    matmul(x, rows, inner, w, out, y, false)
}

/// `y ≈ x̃ · wᵀ` for a block-quantized `w`, where `x̃` is `x` with each 32-element block of every
/// row rounded to 8-bit codes, llama.cpp's arithmetic for these formats: `scale = max|x| / 127`,
/// `code = round_half_even(x / scale)`, `x̃ = scale · code` ([`round_activations`]; an all-zero
/// block has scale 0, a non-finite element makes its block's scale NaN).
///
/// With Q8_0, Q4_0 or Q4_1 weights and at most [`INT_DOT_MAX_ROWS`] rows, the weight codes are
/// multiplied by the activation codes as integers, exactly, with one f32 multiply-add of
/// `d_w · scale` per block (and Q4_1's `m · scale · Σcode`): about four times fewer instructions
/// per weight than widening codes to f32. Otherwise (more rows, or a format without an integer
/// dot: Q5_0, Q4_K, Q6_K) `x̃` is formed in f32 and multiplied as [`matmul_xwt`] does. Both are the
/// same function up to f32 rounding. The rounding moves each activation by at most `scale / 2`,
/// so against [`matmul_xwt`] of the unrounded `x` each output moves by at most
/// `Σ_blocks (scale / 2) · Σ|w|` (plus f32 rounding). Dense weights are refused
/// ([`KernelError::NotBlockQuantized`]): nothing is read faster by rounding their activations.
pub fn matmul_xwt_int8(
    x: &[f32],
    rows: usize,
    inner: usize,
    w: Matrix<'_>,
    out: usize,
    y: &mut [f32],
) -> Result<(), KernelError> {
    match w {
        Matrix::F32(_) | Matrix::Bf16(_) => {
            Err(KernelError::NotBlockQuantized { format: w.dtype() })
        }
        Matrix::Q8_0(_) | Matrix::Q4_0(_) | Matrix::Q4_1(_) if rows <= INT_DOT_MAX_ROWS => {
            matmul(x, rows, inner, w, out, y, true)
        }
        _ => {
            check_len("x", "f32", x.len(), &[("rows", rows), ("inner", inner)], 1)?;
            let elems = w.block_layout().map_or(1, |(elems, _)| elems);
            if inner % elems != 0 {
                return Err(KernelError::InnerNotBlockMultiple {
                    format: w.dtype(),
                    block_elements: elems,
                    inner,
                });
            }
            let rounded = round_activations(x);
            matmul(&rounded, rows, inner, w, out, y, false)
        }
    }
}

/// The most activation rows for which [`matmul_xwt_int8`] multiplies integers: each weight block
/// is then decoded once and used for few rows, so its integer decoding is the cheaper one; with
/// more rows the f32 path, which widens a weight once for up to 8 rows, is faster
/// (`examples/matmul_bandwidth.rs --int8 --rows`, docs/benchmarks.md).
pub const INT_DOT_MAX_ROWS: usize = 4;

/// `x` (any length that is whole 32-element blocks, e.g. `[rows, inner]` with `inner` a
/// multiple of 32) with each block rounded as [`matmul_xwt_int8`] rounds it: `scale · code`, one
/// f32 rounding of the product. The definition the portable graph's rounding follows.
pub fn round_activations(x: &[f32]) -> Vec<f32> {
    simd::round_activations(x)
}

fn matmul(
    x: &[f32],
    rows: usize,
    inner: usize,
    w: Matrix<'_>,
    out: usize,
    y: &mut [f32],
    int8: bool,
) -> Result<(), KernelError> {
    check_len("x", "f32", x.len(), &[("rows", rows), ("inner", inner)], 1)?;
    check_len("y", "f32", y.len(), &[("rows", rows), ("out", out)], 1)?;
    let w_dims = [("out", out), ("inner", inner)];
    match w.block_layout() {
        None => check_len("w", w.dtype(), w.len(), &w_dims, 1)?,
        Some((elems, bytes)) => {
            if inner % elems != 0 {
                return Err(KernelError::InnerNotBlockMultiple {
                    format: w.dtype(),
                    block_elements: elems,
                    inner,
                });
            }
            // Bytes = out * blocks * block bytes, exact because inner is whole blocks.
            let blocks_dims = [("out", out), ("blocks", inner / elems)];
            check_len("w", w.dtype(), w.len(), &blocks_dims, bytes)?;
        }
    }
    if rows == 0 || out == 0 {
        return Ok(());
    }
    if inner == 0 {
        y.fill(0.0);
        return Ok(());
    }

    let acts = simd::Activations::new(x, rows, inner, &w, int8);
    let plan = Plan::new(out, w.row_bytes(inner));

    if rows == 1 {
        // y [1, out] is already laid out as the transposed [out, 1] buffer.
        run_chunks(&acts, &w, &plan, y);
    } else {
        let mut yt = vec![0.0f32; out * rows];
        run_chunks(&acts, &w, &plan, &mut yt);
        for (o, col) in yt.chunks_exact(rows).enumerate() {
            for (n, &v) in col.iter().enumerate() {
                y[n * out + o] = v;
            }
        }
    }
    Ok(())
}

/// How the output rows are split: `chunk` rows per parallel task, `tile` rows per cache tile.
#[derive(Debug, Clone, Copy)]
struct Plan {
    chunk: usize,
    tile: usize,
    parallel: bool,
}

/// Below this many weight bytes a call runs on the calling thread: waking the pool costs more.
const PARALLEL_MIN_BYTES: usize = 128 * 1024;
/// Weight bytes per cache tile: re-read from L1/L2 for each block of activation rows.
const TILE_BYTES: usize = 32 * 1024;
/// Tasks per pool thread, so a core slowed by a neighbour does not hold up the call.
const TASKS_PER_THREAD: usize = 8;

impl Plan {
    fn new(out: usize, row_bytes: usize) -> Self {
        let tile = (TILE_BYTES / row_bytes.max(1)).max(4) / 4 * 4;
        let threads = rayon::current_num_threads();
        let parallel = threads > 1 && out.saturating_mul(row_bytes) >= PARALLEL_MIN_BYTES;
        let chunk = if parallel {
            let tasks = threads * TASKS_PER_THREAD;
            out.div_ceil(tasks).next_multiple_of(4)
        } else {
            out
        };
        Plan {
            chunk,
            tile,
            parallel,
        }
    }
}

/// Computes `yt[o, n]` (the transposed output, `[out, rows]`) for every output row.
fn run_chunks(acts: &simd::Activations<'_>, w: &Matrix<'_>, plan: &Plan, yt: &mut [f32]) {
    let rows = acts.rows();
    let work = |(c, ytc): (usize, &mut [f32])| {
        let o0 = c * plan.chunk;
        simd::chunk(acts, w, o0, ytc.len() / rows, plan.tile, ytc);
    };
    if plan.parallel {
        yt.par_chunks_mut(plan.chunk * rows)
            .enumerate()
            .for_each(work);
    } else {
        yt.chunks_mut(plan.chunk * rows).enumerate().for_each(work);
    }
}

fn check_len(
    operand: &'static str,
    dtype: &'static str,
    actual: usize,
    dims: &[(&str, usize)],
    unit_size: usize,
) -> Result<(), KernelError> {
    let shape = || {
        let parts: Vec<String> = dims.iter().map(|(n, v)| format!("{n}={v}")).collect();
        format!("[{}]", parts.join(", "))
    };
    let expected = dims
        .iter()
        .try_fold(unit_size, |acc, &(_, v)| acc.checked_mul(v))
        .ok_or_else(|| KernelError::Overflow {
            operand,
            shape: shape(),
        })?;
    if actual != expected {
        return Err(KernelError::Shape {
            operand,
            dtype,
            shape: shape(),
            expected,
            actual,
            unit: if unit_size == 1 { "elements" } else { "bytes" },
        });
    }
    Ok(())
}
