//! Integer dot products for [`crate::matmul_xwt_int8`]: the activations rounded to 8-bit codes per
//! 32-element block ([`QuantizedRows`]), multiplied against Q8_0, Q4_0 and Q4_1 weight codes as
//! integers, scaled once per block.
//!
//! Why: widening each weight code to f32 costs about six vector instructions per eight elements,
//! which bounds the f32 path at a third of memory bandwidth on two cores (measured: one SmolLM2
//! decode step's matmuls 10.5 ms at Q8_0, 13.6 GB/s). Multiplying bytes does 32 elements in about
//! six: `vpmaddubsw` forms `u8 × i8` products summed in pairs to i16, `vpmaddwd` sums pairs of those
//! to i32 (all exact: `|w| ≤ 128`, `|q| ≤ 127`, a pair at most 32 512), and one float multiply-add
//! per block applies `d_w · d_x`. This is llama.cpp's arithmetic for these formats.
//!
//! `vpmaddubsw` wants its first operand unsigned: Q8_0's signed codes go in as `|w|` with the
//! activation code given `w`'s sign (`vpsignb`), which leaves every product unchanged; Q4_0's
//! nibbles are made signed first (`code - 8`); Q4_1's nibbles are unsigned already and its
//! minimum is added per block as `m · (d_x · Σq)`, with `Σq` summed once per activation block.
//!
//! The vector path is AVX2 through pulp's safe `V3` token (no stable portable SIMD type multiplies
//! bytes into pair sums, and pulp's generic `Simd` has no such operation); every other CPU takes
//! the scalar loop, which does the same integer arithmetic.

// Accumulators are small const-size arrays indexed by the same `r`/`i` across several arrays.
#![allow(clippy::needless_range_loop)]

use super::{Activations, Dot, HasActs, Prefetch, f16_at};
use crate::{Q4_0_BLOCK_BYTES, Q4_1_BLOCK_BYTES, Q8_0_BLOCK_BYTES};
use pulp::Simd;

/// Elements per block of activation codes, the same as the weight blocks they meet.
pub(crate) const BLOCK: usize = 32;

/// The activations `[rows, inner]` as 8-bit codes per 32-element block: for block `b` of row `n`,
/// `x ≈ scale · code`, `scale = max|x| / 127`, `code = round_half_even(x / scale)` (0 where the
/// block is all zero; a non-finite element makes the block's scale NaN, so it reaches the output).
#[derive(Debug)]
pub(crate) struct QuantizedRows {
    /// `[rows, inner]` codes in `-127 ..= 127`.
    codes: Vec<i8>,
    /// `[rows, inner / 32]` block scales.
    scale: Vec<f32>,
    /// `[rows, inner / 32]`: `scale · Σ codes`, Q4_1's minimum term.
    scaled_sum: Vec<f32>,
    blocks: usize,
}

impl QuantizedRows {
    /// `x` is `[rows, inner]` with `inner` a multiple of [`BLOCK`].
    pub(crate) fn new(x: &[f32], inner: usize) -> Self {
        let mut codes = vec![0i8; x.len()];
        let n = x.len() / BLOCK;
        let (mut scale, mut scaled_sum) = (Vec::with_capacity(n), Vec::with_capacity(n));
        pulp::Arch::new().dispatch(QuantizeBlocks {
            x,
            codes: &mut codes,
            scale: &mut scale,
            scaled_sum: &mut scaled_sum,
        });
        QuantizedRows {
            codes,
            scale,
            scaled_sum,
            blocks: inner / BLOCK,
        }
    }
}

/// The rounding of [`QuantizedRows::new`] as a dispatched operation rather than a closure: a
/// closure passed to the dispatcher is compiled as its own function, outside the dispatched one's
/// target features, and the x86-64 baseline has no rounding instruction, so each element became a
/// call to libm's `rintf` (measured: 2% of a Q8_0 decode step). Inlined here, the loops vectorize.
struct QuantizeBlocks<'a> {
    x: &'a [f32],
    codes: &'a mut [i8],
    scale: &'a mut Vec<f32>,
    scaled_sum: &'a mut Vec<f32>,
}

impl pulp::WithSimd for QuantizeBlocks<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) {
        for (xb, qb) in self
            .x
            .chunks_exact(BLOCK)
            .zip(self.codes.chunks_exact_mut(BLOCK))
        {
            let (d, sum) = quantize_block(xb, qb);
            self.scale.push(d);
            self.scaled_sum.push(d * sum as f32);
        }
    }
}

/// `x` (whole 32-element blocks) with each block replaced by `scale · code`, the values the
/// integer dots multiply by (a block holding a non-finite element becomes NaN).
pub(crate) fn round_activations(x: &[f32]) -> Vec<f32> {
    let mut rounded = vec![0.0f32; x.len()];
    pulp::Arch::new().dispatch(RoundBlocks {
        x,
        rounded: &mut rounded,
    });
    rounded
}

/// [`round_activations`]'s loop, dispatched for the reason [`QuantizeBlocks`] is.
struct RoundBlocks<'a> {
    x: &'a [f32],
    rounded: &'a mut [f32],
}

impl pulp::WithSimd for RoundBlocks<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) {
        let mut codes = [0i8; BLOCK];
        for (xb, rb) in self
            .x
            .chunks_exact(BLOCK)
            .zip(self.rounded.chunks_exact_mut(BLOCK))
        {
            let (d, _) = quantize_block(xb, &mut codes);
            for (r, &c) in rb.iter_mut().zip(&codes) {
                *r = d * f32::from(c);
            }
        }
    }
}

/// One block's scale and codes (see [`QuantizedRows`]); returns the scale and the codes' sum.
#[inline(always)]
fn quantize_block(x: &[f32], codes: &mut [i8]) -> (f32, i32) {
    // Branch-free over the elements so that the loops vectorize.
    let finite = x.iter().fold(true, |ok, v| ok & v.is_finite());
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    if !finite {
        codes.fill(0);
        return (f32::NAN, 0);
    }
    let d = amax / 127.0;
    if d == 0.0 {
        codes.fill(0);
        return (0.0, 0);
    }
    let mut sum = 0i32;
    for (c, &v) in codes.iter_mut().zip(x) {
        // |v / d| <= 127 up to one rounding; the clamp keeps 127.00001 from wrapping.
        let q = (v / d).round_ties_even().clamp(-127.0, 127.0) as i8;
        *c = q;
        sum += i32::from(q);
    }
    (d, sum)
}

/// A weight format with an integer path: where its block's fields are and how its codes become
/// signed or unsigned bytes. Each is its own type so that the inner loop is compiled per format,
/// with no branch on it.
pub(crate) trait Codes {
    const BLOCK_BYTES: usize;
    /// Whether the codes are signed (`d · code`) or unsigned with a minimum (`d · code + m`).
    const SIGNED: bool;
    /// The block's `d` and `m` (0 for signed formats).
    fn header(blk: &[u8]) -> (f32, f32);
    /// The integer code of element `e` (without the minimum).
    fn code(blk: &[u8], e: usize) -> i32;
    /// The 32 codes in element order as bytes: signed for signed formats.
    #[cfg(target_arch = "x86_64")]
    fn bytes(v3: pulp::x86::V3, blk: &[u8]) -> core::arch::x86_64::__m256i;
}

/// `d · code`, `code: i8`.
pub(crate) struct Q8_0Codes;
/// `d · (nibble - 8)`.
pub(crate) struct Q4_0Codes;
/// `d · nibble + m`.
pub(crate) struct Q4_1Codes;

/// Element `e`'s nibble of 16 code bytes: low nibbles are elements 0..16, high ones 16..32.
#[inline(always)]
fn nibble(codes: &[u8], e: usize) -> i32 {
    let byte = codes[e % 16];
    i32::from(if e < 16 { byte & 0xF } else { byte >> 4 })
}

/// The 32 nibbles of 16 code bytes as bytes in element order.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn nibble_bytes(v3: pulp::x86::V3, codes: &[u8]) -> core::arch::x86_64::__m256i {
    let packed: core::arch::x86_64::__m128i = pulp::bytemuck::pod_read_unaligned(&codes[..16]);
    let high = v3.sse2._mm_srli_epi16::<4>(packed);
    let both = v3.avx._mm256_set_m128i(high, packed);
    v3.avx2
        ._mm256_and_si256(both, v3.avx._mm256_set1_epi8(0x0F))
}

impl Codes for Q8_0Codes {
    const BLOCK_BYTES: usize = Q8_0_BLOCK_BYTES;
    const SIGNED: bool = true;
    #[inline(always)]
    fn header(blk: &[u8]) -> (f32, f32) {
        (f16_at(blk, 0), 0.0)
    }
    #[inline(always)]
    fn code(blk: &[u8], e: usize) -> i32 {
        i32::from(blk[2 + e] as i8)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn bytes(_: pulp::x86::V3, blk: &[u8]) -> core::arch::x86_64::__m256i {
        pulp::bytemuck::pod_read_unaligned(&blk[2..34])
    }
}

impl Codes for Q4_0Codes {
    const BLOCK_BYTES: usize = Q4_0_BLOCK_BYTES;
    const SIGNED: bool = true;
    #[inline(always)]
    fn header(blk: &[u8]) -> (f32, f32) {
        (f16_at(blk, 0), 0.0)
    }
    #[inline(always)]
    fn code(blk: &[u8], e: usize) -> i32 {
        nibble(&blk[2..], e) - 8
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn bytes(v3: pulp::x86::V3, blk: &[u8]) -> core::arch::x86_64::__m256i {
        let nibbles = nibble_bytes(v3, &blk[2..]);
        v3.avx2._mm256_sub_epi8(nibbles, v3.avx._mm256_set1_epi8(8))
    }
}

impl Codes for Q4_1Codes {
    const BLOCK_BYTES: usize = Q4_1_BLOCK_BYTES;
    const SIGNED: bool = false;
    #[inline(always)]
    fn header(blk: &[u8]) -> (f32, f32) {
        (f16_at(blk, 0), f16_at(blk, 2))
    }
    #[inline(always)]
    fn code(blk: &[u8], e: usize) -> i32 {
        nibble(&blk[4..], e)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn bytes(v3: pulp::x86::V3, blk: &[u8]) -> core::arch::x86_64::__m256i {
        nibble_bytes(v3, &blk[4..])
    }
}

pub(crate) struct IntDot<'a, C> {
    acts: &'a Activations<'a>,
    q: &'a QuantizedRows,
    pf: Prefetch,
    /// The chunk's weight rows, blocks of `C`.
    w: &'a [u8],
    row_bytes: usize,
    #[cfg(target_arch = "x86_64")]
    v3: Option<pulp::x86::V3>,
    codes: core::marker::PhantomData<C>,
}

impl<C> HasActs for IntDot<'_, C> {
    fn acts(&self) -> &Activations<'_> {
        self.acts
    }
}

impl<'a, C: Codes> IntDot<'a, C> {
    pub(crate) fn new(
        acts: &'a Activations<'a>,
        q: &'a QuantizedRows,
        pf: Prefetch,
        w: &'a [u8],
        o0: usize,
        n_out: usize,
    ) -> Self {
        let row_bytes = q.blocks * C::BLOCK_BYTES;
        IntDot {
            acts,
            q,
            pf,
            w: &w[o0 * row_bytes..(o0 + n_out) * row_bytes],
            row_bytes,
            #[cfg(target_arch = "x86_64")]
            v3: pulp::x86::V3::try_new(),
            codes: core::marker::PhantomData,
        }
    }

    /// Weight row `o`'s blocks.
    #[inline(always)]
    fn weight_row(&self, o: usize) -> &[u8] {
        &self.w[o * self.row_bytes..][..self.row_bytes]
    }

    /// Activation row `n`'s codes, block scales and scaled code sums.
    #[inline(always)]
    fn act_row(&self, n: usize) -> (&[i8], &[f32], &[f32]) {
        let blocks = self.q.blocks;
        (
            &self.q.codes[n * blocks * BLOCK..][..blocks * BLOCK],
            &self.q.scale[n * blocks..][..blocks],
            &self.q.scaled_sum[n * blocks..][..blocks],
        )
    }

    /// The scalar loop: the same integer sums and per-block scaling as the vector path.
    fn dot_scalar<const R: usize, const W: usize>(&self, r0: usize, o: usize) -> [[f32; W]; R] {
        let mut res = [[0.0f32; W]; R];
        for r in 0..R {
            let (qx, dx, sx) = self.act_row(r0 + r);
            for i in 0..W {
                let w = self.weight_row(o + i);
                let mut s = 0.0f32;
                for b in 0..self.q.blocks {
                    let blk = &w[b * C::BLOCK_BYTES..][..C::BLOCK_BYTES];
                    let (d, m) = C::header(blk);
                    let qb = &qx[b * BLOCK..][..BLOCK];
                    let isum: i32 = (0..BLOCK).map(|e| C::code(blk, e) * i32::from(qb[e])).sum();
                    s += (d * dx[b]) * isum as f32 + m * sx[b];
                }
                res[r][i] = s;
            }
        }
        res
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn dot_avx2<const R: usize, const W: usize>(
        &self,
        v3: pulp::x86::V3,
        r0: usize,
        o: usize,
        ahead: usize,
    ) -> [[f32; W]; R] {
        use core::arch::x86_64::{__m256, __m256i};
        use pulp::bytemuck::pod_read_unaligned;
        let (avx, avx2, fma) = (v3.avx, v3.avx2, v3.fma);
        let ones = avx._mm256_set1_epi16(1);
        let mut acc: [[__m256; W]; R] = [[avx._mm256_setzero_ps(); W]; R];
        let mut min_acc = [[0.0f32; W]; R];
        let ws: [&[u8]; W] = core::array::from_fn(|i| self.weight_row(o + i));
        let xs: [(&[i8], &[f32], &[f32]); R] = core::array::from_fn(|r| self.act_row(r0 + r));
        let ahead = ahead * self.row_bytes;
        for b in 0..self.q.blocks {
            for i in 0..W {
                let blk = &ws[i][b * C::BLOCK_BYTES..][..C::BLOCK_BYTES];
                if b % 2 == 0 {
                    self.pf.line(blk.as_ptr().wrapping_add(ahead));
                }
                let (d, m) = C::header(blk);
                let w = C::bytes(v3, blk);
                // `vpmaddubsw` takes its first operand unsigned: |w|, with w's sign moved onto x.
                let unsigned_w = if C::SIGNED {
                    avx2._mm256_sign_epi8(w, w)
                } else {
                    w
                };
                for r in 0..R {
                    // Loaded per use, not held: eight rows of codes would not fit the registers
                    // beside the accumulators.
                    let (qx, dx, sx) = xs[r];
                    let xq: __m256i =
                        pod_read_unaligned(pulp::bytemuck::cast_slice(&qx[b * BLOCK..][..BLOCK]));
                    let x = if C::SIGNED {
                        avx2._mm256_sign_epi8(xq, w)
                    } else {
                        xq
                    };
                    let pairs = avx2._mm256_maddubs_epi16(unsigned_w, x);
                    let sums = avx2._mm256_madd_epi16(pairs, ones);
                    let scale = avx._mm256_set1_ps(d * dx[b]);
                    acc[r][i] = fma._mm256_fmadd_ps(avx._mm256_cvtepi32_ps(sums), scale, acc[r][i]);
                    if !C::SIGNED {
                        min_acc[r][i] += m * sx[b];
                    }
                }
            }
        }
        core::array::from_fn(|r| {
            core::array::from_fn(|i| {
                let lanes: [f32; 8] = pulp::bytemuck::cast(acc[r][i]);
                lanes.iter().sum::<f32>() + min_acc[r][i]
            })
        })
    }
}

impl<C: Codes> Dot for IntDot<'_, C> {
    const WIDE_ROWS: bool = true;

    #[inline(always)]
    fn dot<S: Simd, const R: usize, const W: usize>(
        &self,
        _simd: S,
        r0: usize,
        o: usize,
        ahead: usize,
    ) -> [[f32; W]; R] {
        // With AVX2 present the dispatcher runs this inside an AVX2 (or AVX-512) function, so the
        // V3 intrinsics inline.
        #[cfg(target_arch = "x86_64")]
        if let Some(v3) = self.v3 {
            return self.dot_avx2::<R, W>(v3, r0, o, ahead);
        }
        let _ = ahead;
        self.dot_scalar::<R, W>(r0, o)
    }
}
