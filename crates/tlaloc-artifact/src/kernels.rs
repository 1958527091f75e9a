//! The custom-call kernels that body variants call, and the variants that call them: the one
//! place the exporter (which emits the calls) and the runtime (which registers the handlers)
//! learn a kernel's target name, operands and result.
//!
//! A kernel is a contract, not code: the exporter writes `stablehlo.custom_call @<target>`
//! with operands of the stated types and the runtime registers a handler for `<target>` with
//! the plugin's FFI extension (typed FFI, `api_version = 4`) before it compiles anything. A
//! variant's body computes the same function as the portable body; where a kernel's
//! arithmetic differs from the portable body's (summation order), the variant is tested
//! against the portable body within the tolerance of the dtype.

use crate::quant::BlockFormat;

/// Variant names: what `--kernels` and the load log call the portable body.
pub const PORTABLE: &str = "portable";

/// The CPU variant: the portable body with its matrix multiplications of few rows replaced by
/// [`CPU_MATMUL`] calls (for block-quantized weights of an f32 export, the call
/// [`cpu_matmul_blocks`] names) and, over unquantized K/V pools, its attention by
/// [`CPU_PAGED_ATTENTION`].
pub const CPU_VARIANT: &str = "cpu";

/// The platform name of the CPU plugins' clients.
pub const CPU_PLATFORM: &str = "cpu";

/// `y = x · wᵀ` on the host: operand 0 `x [N, K]` f32, operand 1 `w [O, K]` f32 or bf16 (a
/// weight as the artifact stores it, rows are output features), result `y [N, O]` f32, every
/// product accumulated in f32. No attributes. For a bf16 `w` the caller rounds `x` to bf16
/// first (as the portable body's bf16 dot does), so each product is exact in f32 and only the
/// order of the sums differs from the portable body.
pub const CPU_MATMUL: &str = "tlaloc.cpu.matmul";

/// `y = x · wᵀ` on the host against a Q8_0 weight as the artifact stores it: operand 0
/// `x [N, K]` f32, operand 1 `w [O, K / 32 * 34]` u8, the raw blocks of a weight of logical dims
/// `[O, K]` ([`crate::quant::BlockFormat::Q8_0`]'s layout: each row is `K / 32` blocks of an f16
/// scale and 32 i8 codes), result `y [N, O]` f32. No attributes. Each weight element `d * q`
/// is exact in f32 and every product is accumulated in f32, so only the order of the sums
/// differs from the portable body, which dequantizes the blocks to f32 in the graph.
pub const CPU_MATMUL_Q8_0: &str = "tlaloc.cpu.matmul_q8_0";

/// [`CPU_MATMUL_Q8_0`]'s contract for a Q4_0 weight: operand 1 `w [O, K / 32 * 18]` u8
/// ([`crate::quant::BlockFormat::Q4_0`]'s layout). Each weight `d * (code - 8)` is exact in f32.
pub const CPU_MATMUL_Q4_0: &str = "tlaloc.cpu.matmul_q4_0";

/// [`CPU_MATMUL_Q8_0`]'s contract for a Q4_1 weight: operand 1 `w [O, K / 32 * 20]` u8
/// ([`crate::quant::BlockFormat::Q4_1`]'s layout). Each weight is `d * code + m` rounded once to
/// f32, the value the portable body's dequantized matrix holds.
pub const CPU_MATMUL_Q4_1: &str = "tlaloc.cpu.matmul_q4_1";

/// [`CPU_MATMUL_Q8_0`]'s contract for a Q5_0 weight: operand 1 `w [O, K / 32 * 22]` u8
/// ([`crate::quant::BlockFormat::Q5_0`]'s layout). Each weight `d * (code - 16)` is exact in f32.
pub const CPU_MATMUL_Q5_0: &str = "tlaloc.cpu.matmul_q5_0";

/// [`CPU_MATMUL_Q8_0`]'s contract for a Q4_K weight: operand 1 `w [O, K / 256 * 144]` u8
/// ([`crate::quant::BlockFormat::Q4_K`]'s layout). Each weight is `(d * sc) * code - dmin * mn`
/// rounded once to f32, the value the portable body's dequantized matrix holds.
pub const CPU_MATMUL_Q4_K: &str = "tlaloc.cpu.matmul_q4_k";

/// [`CPU_MATMUL_Q8_0`]'s contract for a Q6_K weight: operand 1 `w [O, K / 256 * 210]` u8
/// ([`crate::quant::BlockFormat::Q6_K`]'s layout). Each weight `(d * scale) * (code - 32)` is
/// exact in f32.
pub const CPU_MATMUL_Q6_K: &str = "tlaloc.cpu.matmul_q6_k";

/// The kernel that multiplies by a weight stored as `format`'s raw blocks.
pub const fn cpu_matmul_blocks(format: BlockFormat) -> &'static str {
    match format {
        BlockFormat::Q8_0 => CPU_MATMUL_Q8_0,
        BlockFormat::Q4_0 => CPU_MATMUL_Q4_0,
        BlockFormat::Q4_1 => CPU_MATMUL_Q4_1,
        BlockFormat::Q5_0 => CPU_MATMUL_Q5_0,
        BlockFormat::Q4_K => CPU_MATMUL_Q4_K,
        BlockFormat::Q6_K => CPU_MATMUL_Q6_K,
    }
}

/// [`cpu_matmul_blocks`]' contract with the activations rounded first (an export with
/// activations quantized, `--quantize-activations`): `y ≈ x̃ · wᵀ`, where `x̃` is `x` with each
/// 32-element block of every row replaced by `s · code`, `s = max|x| / 127` and `code =
/// round_half_even(x / s)` clamped to `[-127, 127]` (an all-zero block stays zero; a block with a
/// non-finite element becomes NaN). The portable body rounds the same way in the graph before
/// its dequantized matrix multiplication, so both bodies compute the same function up to f32
/// rounding; the kernel may multiply the weight codes by the activation codes as integers.
pub const CPU_MATMUL_Q8_0_XQ8: &str = "tlaloc.cpu.matmul_q8_0_xq8";
/// [`CPU_MATMUL_Q8_0_XQ8`]'s contract for Q4_0 blocks.
pub const CPU_MATMUL_Q4_0_XQ8: &str = "tlaloc.cpu.matmul_q4_0_xq8";
/// [`CPU_MATMUL_Q8_0_XQ8`]'s contract for Q4_1 blocks.
pub const CPU_MATMUL_Q4_1_XQ8: &str = "tlaloc.cpu.matmul_q4_1_xq8";
/// [`CPU_MATMUL_Q8_0_XQ8`]'s contract for Q5_0 blocks.
pub const CPU_MATMUL_Q5_0_XQ8: &str = "tlaloc.cpu.matmul_q5_0_xq8";
/// [`CPU_MATMUL_Q8_0_XQ8`]'s contract for Q4_K blocks.
pub const CPU_MATMUL_Q4_K_XQ8: &str = "tlaloc.cpu.matmul_q4_k_xq8";
/// [`CPU_MATMUL_Q8_0_XQ8`]'s contract for Q6_K blocks.
pub const CPU_MATMUL_Q6_K_XQ8: &str = "tlaloc.cpu.matmul_q6_k_xq8";

/// Elements per block of the activations' rounding in the `_xq8` kernels.
pub const ACTIVATION_BLOCK: usize = 32;
/// The largest activation code of the `_xq8` kernels' rounding.
pub const ACTIVATION_CODE_MAX: f64 = 127.0;

/// The kernel that multiplies by `format`'s raw blocks after rounding the activations
/// ([`CPU_MATMUL_Q8_0_XQ8`]).
pub const fn cpu_matmul_blocks_xq8(format: BlockFormat) -> &'static str {
    match format {
        BlockFormat::Q8_0 => CPU_MATMUL_Q8_0_XQ8,
        BlockFormat::Q4_0 => CPU_MATMUL_Q4_0_XQ8,
        BlockFormat::Q4_1 => CPU_MATMUL_Q4_1_XQ8,
        BlockFormat::Q5_0 => CPU_MATMUL_Q5_0_XQ8,
        BlockFormat::Q4_K => CPU_MATMUL_Q4_K_XQ8,
        BlockFormat::Q6_K => CPU_MATMUL_Q6_K_XQ8,
    }
}

/// Paged attention on the host, reading the K/V pools in place (no gathered pages): operand 0
/// `q [N, heads, D]` f32 (`N = B * T`, after RoPE), operands 1 and 2 the layer's K and V pools
/// `[numBlocks, blockSize, kvHeads, D]` as the step's K/V write left them (both f32 or both
/// bf16), operand 3 `blockTables [B, C / blockSize]`, 4 `positions [B, T]`, 5 `seqLens [B]`
/// (all i32, the step's inputs), 6 the score scale `f32 []`, 7 the layer's window `i32 []` (0:
/// none); result `[N, heads * D]` f32. No attributes. It computes the portable body's attention:
/// query head `h` of row `b` at position `p` sees key `c` (in page `blockTables[b, c /
/// blockSize]`, an index past the pool clamped into it, slot `c % blockSize`) when `c <= p`,
/// `c < seqLens[b]` and, with a window `w`, `c > p - w`; scores `(q · k) · scale` in f32, a
/// softmax with the maximum subtracted, the probability-weighted sum of the values; a query
/// that sees no key weighs all `C` keys alike, as the masked softmax does. With bf16 pools q
/// and the probabilities are rounded to bf16 before their dots, as the portable body's bf16
/// dots take them. Only the order of the f32 sums differs from the portable body.
pub const CPU_PAGED_ATTENTION: &str = "tlaloc.cpu.paged_attention";

/// Every kernel a variant may call, with the platform it runs on.
pub const KERNELS: [(&str, &str); 14] = [
    (CPU_MATMUL, CPU_PLATFORM),
    (CPU_MATMUL_Q8_0, CPU_PLATFORM),
    (CPU_MATMUL_Q4_0, CPU_PLATFORM),
    (CPU_MATMUL_Q4_1, CPU_PLATFORM),
    (CPU_MATMUL_Q5_0, CPU_PLATFORM),
    (CPU_MATMUL_Q4_K, CPU_PLATFORM),
    (CPU_MATMUL_Q6_K, CPU_PLATFORM),
    (CPU_MATMUL_Q8_0_XQ8, CPU_PLATFORM),
    (CPU_MATMUL_Q4_0_XQ8, CPU_PLATFORM),
    (CPU_MATMUL_Q4_1_XQ8, CPU_PLATFORM),
    (CPU_MATMUL_Q5_0_XQ8, CPU_PLATFORM),
    (CPU_MATMUL_Q4_K_XQ8, CPU_PLATFORM),
    (CPU_MATMUL_Q6_K_XQ8, CPU_PLATFORM),
    (CPU_PAGED_ATTENTION, CPU_PLATFORM),
];

/// The most rows (`B * T` of an entry) for which the CPU variant replaces a matrix
/// multiplication by [`CPU_MATMUL`]: the kernel streams each weight once for all rows, which
/// wins when the product is bound by reading the weights (decode, short prefill chunks); past
/// it XLA's own matrix multiplication, which blocks for the caches, is the faster one
/// (docs/benchmarks.md, "CPU kernels").
pub const CPU_VARIANT_MAX_ROWS: usize = 16;

/// Checks a variant name: lowercase letters, digits and `-`, not [`PORTABLE`].
pub fn check_variant_name(name: &str) -> Result<(), String> {
    if name == PORTABLE {
        return Err(format!(
            "{PORTABLE:?} names the portable body; a variant needs another name"
        ));
    }
    let ok = name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a variant name: a lowercase letter, then lowercase letters, digits or `-`"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variant_names_are_checked() {
        assert!(check_variant_name(CPU_VARIANT).is_ok());
        assert!(check_variant_name("cuda-triton").is_ok());
        for bad in ["", PORTABLE, "Cpu", "1cpu", "cpu variant", "cpu_1"] {
            let err = check_variant_name(bad).unwrap_err();
            assert!(err.contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn every_block_format_has_a_listed_kernel() {
        for format in BlockFormat::ALL {
            let target = cpu_matmul_blocks(format);
            assert!(target.ends_with(format.name()), "{target} for {format}");
            assert!(KERNELS.contains(&(target, CPU_PLATFORM)), "{target}");
            let rounded = cpu_matmul_blocks_xq8(format);
            assert_eq!(rounded, format!("{target}_xq8"));
            assert!(KERNELS.contains(&(rounded, CPU_PLATFORM)), "{rounded}");
        }
    }

    #[test]
    fn every_kernel_target_is_namespaced() {
        for (target, platform) in KERNELS {
            assert!(
                target.starts_with(&format!("tlaloc.{platform}.")),
                "{target}"
            );
        }
    }
}
