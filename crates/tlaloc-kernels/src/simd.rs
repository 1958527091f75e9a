//! The SIMD inner loops of [`crate::matmul_xwt`]: one chunk of output rows, for every activation row.
//!
//! Written once, generically over `pulp::Simd`, and dispatched at run time by `pulp::Arch` (AVX2+FMA,
//! SSE4.2 or scalar on x86-64, NEON on aarch64), so there are no hand-written intrinsics and no
//! `unsafe`. A block computes `R` activation rows against `W` weight rows with `R * W` independent
//! vector accumulators (at most 9, so they stay in registers next to the loaded weights), and every
//! weight vector loaded is used for all `R` rows.
//!
//! One x86 instruction is named directly: a software prefetch of the weight rows ahead (through
//! pulp's safe SSE token, [`Prefetch`]): one group ahead when a tile is walked once, the next tile
//! when it is walked once per block of activation rows. With many rows a block computes long enough
//! that the hardware prefetcher falls behind and memory idles; the hint keeps the stream going (the
//! decode step's matmuls at 8 rows, f32, measured about 2x faster on a shared 2-core EPYC:
//! 150-165 ms without prefetch, 71 ms with).
//!
//! bf16 weights are widened without a lane-widening instruction: a vector of 2N bf16 values read as N
//! u32 lanes holds element `2i` in the low half and `2i + 1` in the high half of lane `i`, so
//! `lane << 16` and `lane & 0xffff_0000` are the even and odd elements as f32. The activations are
//! split once per call into matching even and odd halves ([`Activations`]).
//!
//! Q8_0 codes get the same treatment four ways: a vector of 4N bytes read as N u32 lanes holds
//! elements `4i + k` in byte `k` of lane `i`. Byte `k`, flipped to unsigned (`^ 0x80`) and placed in
//! the mantissa of 2^23 (`| 0x4b00_0000`), is `2^23 + 128 + code` as an f32; subtracting that bias and
//! multiplying by the block's scale gives the weight `d * code` exactly (8-bit times 11-bit
//! significands). The activations are permuted once per call to match ([`Activations`]).
//!
//! Q4_0, Q4_1 and Q5_0 codes are nibbles, 16 bytes per block: too few to fill an AVX2 vector as bytes.
//! Each u32 lane is given two code bytes instead (zero-extended from a u16), so the four nibbles of
//! lane `i` of vector `v` are elements `2(vL + i)`, `16 + 2(vL + i)`, `2(vL + i) + 1` and
//! `17 + 2(vL + i)` of the block (low nibbles are elements 0..16, high nibbles 16..32). A nibble
//! placed in the mantissa of 2^23 is `2^23 + code`; subtracting `2^23 + 8` (Q4_0) or `2^23` (Q4_1)
//! gives the code as an f32, then `d * code` (exact) or `d * code + m` (one rounding, as the
//! dequantized matrix holds it). The activations are permuted once per call to match. Q5_0 adds a
//! fifth bit per code from its 32-bit `qh`: a second u32 vector holds `qh >> 2(vL + i)` in lane
//! `i`, whose bits 0, 16, 1 and 17 are the high bits of the lane's four elements, each moved to
//! bit 4 and or-ed into its nibble before the conversion (bias `2^23 + 16`).
//!
//! Q4_K and Q6_K pack a super-block of 256 elements with sub-block scales (and Q4_K's mins) in
//! 6- and 8-bit fields: no lane trick lines their codes up with a vector cheaply. Each super-block
//! of a weight row is decoded instead into a buffer of 256 f32 on the stack (scalar code in
//! llama.cpp's loop order, which the compiler vectorizes inside the dispatched function), then
//! dotted with the unpermuted activations, which need no per-call copy. The decode is paid once
//! per weight row and super-block and shared by up to 8 activation rows.

// The accumulators are small const-size arrays indexed by the same `r`/`i` across several arrays;
// explicit index loops are what keeps them in registers and readable.
#![allow(clippy::needless_range_loop)]

use crate::{
    K_BLOCK_ELEMS, Matrix, Q4_0_BLOCK_BYTES, Q4_1_BLOCK_BYTES, Q4_BLOCK_ELEMS, Q4_K_BLOCK_BYTES,
    Q5_0_BLOCK_BYTES, Q6_K_BLOCK_BYTES, Q8_0_BLOCK_BYTES, Q8_0_BLOCK_ELEMS,
};
use pulp::Simd;

mod int8;

pub(crate) use int8::round_activations;

/// Software prefetch of weight lines a group of rows ahead, so the memory stream keeps going while a
/// compute-heavy block (many activation rows) runs; the hardware prefetcher alone stops short there.
/// Through pulp's SSE token (baseline on x86-64); a no-op elsewhere.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Prefetch {
    #[cfg(target_arch = "x86_64")]
    sse: Option<pulp::x86::V1>,
}

impl Prefetch {
    pub(crate) fn new() -> Self {
        Prefetch {
            #[cfg(target_arch = "x86_64")]
            sse: pulp::x86::V1::try_new(),
        }
    }

    /// Hints that the cache line holding `p` will be read soon. `p` need not be in bounds: a
    /// prefetch never faults.
    #[inline(always)]
    fn line<T>(self, p: *const T) {
        #[cfg(target_arch = "x86_64")]
        if let Some(v1) = self.sse {
            v1.sse
                ._mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast());
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = p;
    }

    /// [`Prefetch::line`] for every line of the `bytes` bytes from `start`.
    #[inline(always)]
    pub(crate) fn span<T>(self, start: *const T, bytes: usize) {
        for at in (0..bytes).step_by(LINE) {
            self.line(start.cast::<u8>().wrapping_add(at));
        }
    }
}

/// Bytes per cache line, the prefetch granule.
const LINE: usize = 64;

/// The activations `x [rows, inner]`, with whatever per-call layout the weight type needs.
#[derive(Debug)]
pub(crate) struct Activations<'a> {
    x: &'a [f32],
    rows: usize,
    inner: usize,
    /// For bf16 weights only: `x[n, 2m]` and `x[n, 2m + 1]`, each `[rows, inner / 2]`.
    even: Vec<f32>,
    odd: Vec<f32>,
    /// For Q8_0 weights only, when the SIMD path applies: each 32-element block permuted so that
    /// vector `v`, byte `k` of the codes meets `x[32b + 4L·v + 4j + k]` in lane `j` (`L` lanes).
    q8x: Vec<f32>,
    /// The lane count `q8x` was permuted for (0: not permuted, scalar path).
    q8_lanes: usize,
    /// For Q4_0, Q4_1 and Q5_0 weights only, when the SIMD path applies: each block permuted so that
    /// vector `v`, nibble `m` of the codes meets the element it decodes in lane `i` (module doc).
    q4x: Vec<f32>,
    /// The lane count `q4x` was permuted for (0: not permuted, scalar path).
    q4_lanes: usize,
    /// For [`crate::matmul_xwt_int8`] only: the rows rounded to 8-bit codes per block.
    int8: Option<int8::QuantizedRows>,
}

/// The f32 lane count of the SIMD type the dispatcher picks, if the Q4 pair layout fits it: each
/// lane takes two of a block's 16 code bytes, so the lanes must divide 8.
struct Q4Lanes;

impl pulp::WithSimd for Q4Lanes {
    type Output = usize;

    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) -> usize {
        let usable = S::F32_LANES <= Q4_CODE_BYTES / 2 && (Q4_CODE_BYTES / 2) % S::F32_LANES == 0;
        if usable { S::F32_LANES } else { 0 }
    }
}

/// Code bytes per Q4 block.
const Q4_CODE_BYTES: usize = Q4_BLOCK_ELEMS / 2;

/// The block element that lane `i` of vector `v`, nibble `m` (0..4) decodes, with `lanes` lanes.
fn q4_element(lanes: usize, v: usize, m: usize, i: usize) -> usize {
    let byte = 2 * (v * lanes + i);
    match m {
        0 => byte,
        1 => Q4_CODE_BYTES + byte,
        2 => byte + 1,
        _ => Q4_CODE_BYTES + byte + 1,
    }
}

/// The f32 lane count of the SIMD type the dispatcher picks, and whether Q8_0's byte trick applies
/// to it (a byte vector is a u32 vector, and a block is a whole number of them).
struct Q8Lanes;

impl pulp::WithSimd for Q8Lanes {
    type Output = usize;

    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) -> usize {
        let bytes = size_of::<S::u8s>();
        let usable = bytes == size_of::<S::u32s>()
            && bytes <= Q8_0_BLOCK_ELEMS
            && Q8_0_BLOCK_ELEMS % bytes == 0;
        if usable { S::F32_LANES } else { 0 }
    }
}

impl<'a> Activations<'a> {
    /// `int8`: round the rows to 8-bit codes for the integer dots (the caller has checked that
    /// `w` has an integer path); no other copy is made then.
    pub(crate) fn new(x: &'a [f32], rows: usize, inner: usize, w: &Matrix<'_>, int8: bool) -> Self {
        if int8 {
            return Activations {
                x,
                rows,
                inner,
                even: Vec::new(),
                odd: Vec::new(),
                q8x: Vec::new(),
                q8_lanes: 0,
                q4x: Vec::new(),
                q4_lanes: 0,
                int8: Some(int8::QuantizedRows::new(x, inner)),
            };
        }
        let (mut even, mut odd) = (Vec::new(), Vec::new());
        if let Matrix::Bf16(_) = w {
            let half = inner / 2;
            even.reserve_exact(rows * half);
            odd.reserve_exact(rows * half);
            for row in x.chunks_exact(inner) {
                for pair in row.chunks_exact(2) {
                    even.push(pair[0]);
                    odd.push(pair[1]);
                }
            }
        }
        let (mut q8x, mut q8_lanes) = (Vec::new(), 0);
        if let Matrix::Q8_0(_) = w {
            q8_lanes = pulp::Arch::new().dispatch(Q8Lanes);
            if q8_lanes > 0 {
                let l = q8_lanes;
                q8x.reserve_exact(x.len());
                for block in x.chunks_exact(Q8_0_BLOCK_ELEMS) {
                    for v in block.chunks_exact(4 * l) {
                        for k in 0..4 {
                            q8x.extend((0..l).map(|j| v[4 * j + k]));
                        }
                    }
                }
            }
        }
        let (mut q4x, mut q4_lanes) = (Vec::new(), 0);
        if let Matrix::Q4_0(_) | Matrix::Q4_1(_) | Matrix::Q5_0(_) = w {
            q4_lanes = pulp::Arch::new().dispatch(Q4Lanes);
            if q4_lanes > 0 {
                let l = q4_lanes;
                q4x.reserve_exact(x.len());
                for block in x.chunks_exact(Q4_BLOCK_ELEMS) {
                    for v in 0..Q4_CODE_BYTES / (2 * l) {
                        for m in 0..4 {
                            q4x.extend((0..l).map(|i| block[q4_element(l, v, m, i)]));
                        }
                    }
                }
            }
        }
        Activations {
            x,
            rows,
            inner,
            even,
            odd,
            q8x,
            q8_lanes,
            q4x,
            q4_lanes,
            int8: None,
        }
    }

    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    fn row(&self, n: usize) -> &[f32] {
        &self.x[n * self.inner..][..self.inner]
    }
}

/// Computes output rows `o0 .. o0 + n_out` into `yt` (`[n_out, rows]`), `tile` weight rows at a time.
pub(crate) fn chunk(
    acts: &Activations<'_>,
    w: &Matrix<'_>,
    o0: usize,
    n_out: usize,
    tile: usize,
    yt: &mut [f32],
) {
    let arch = pulp::Arch::new();
    let pf = Prefetch::new();
    let inner = acts.inner;
    if let Some(q) = &acts.int8 {
        use int8::{IntDot, Q4_0Codes, Q4_1Codes, Q8_0Codes};
        match *w {
            Matrix::Q8_0(w) => arch.dispatch(Chunk {
                dot: IntDot::<Q8_0Codes>::new(acts, q, pf, w, o0, n_out),
                n_out,
                tile,
                yt,
            }),
            Matrix::Q4_0(w) => arch.dispatch(Chunk {
                dot: IntDot::<Q4_0Codes>::new(acts, q, pf, w, o0, n_out),
                n_out,
                tile,
                yt,
            }),
            Matrix::Q4_1(w) => arch.dispatch(Chunk {
                dot: IntDot::<Q4_1Codes>::new(acts, q, pf, w, o0, n_out),
                n_out,
                tile,
                yt,
            }),
            _ => unreachable!("matmul_xwt_int8 refuses {} before quantizing", w.dtype()),
        }
        return;
    }
    match *w {
        Matrix::F32(w) => arch.dispatch(Chunk {
            dot: F32Dot {
                acts,
                pf,
                w: &w[o0 * inner..(o0 + n_out) * inner],
            },
            n_out,
            tile,
            yt,
        }),
        Matrix::Bf16(w) => arch.dispatch(Chunk {
            dot: Bf16Dot {
                acts,
                pf,
                w: &w[o0 * inner..(o0 + n_out) * inner],
            },
            n_out,
            tile,
            yt,
        }),
        Matrix::Q8_0(w) => {
            let row_bytes = inner / Q8_0_BLOCK_ELEMS * Q8_0_BLOCK_BYTES;
            arch.dispatch(Chunk {
                dot: Q8Dot {
                    acts,
                    pf,
                    w: &w[o0 * row_bytes..(o0 + n_out) * row_bytes],
                    row_bytes,
                },
                n_out,
                tile,
                yt,
            })
        }
        Matrix::Q4_0(w) => arch.dispatch(Chunk {
            dot: Q4Dot::new(acts, pf, w, o0, n_out, Nibbles::Q4_0),
            n_out,
            tile,
            yt,
        }),
        Matrix::Q4_1(w) => arch.dispatch(Chunk {
            dot: Q4Dot::new(acts, pf, w, o0, n_out, Nibbles::Q4_1),
            n_out,
            tile,
            yt,
        }),
        Matrix::Q5_0(w) => arch.dispatch(Chunk {
            dot: Q4Dot::new(acts, pf, w, o0, n_out, Nibbles::Q5_0),
            n_out,
            tile,
            yt,
        }),
        Matrix::Q4_K(w) => arch.dispatch(Chunk {
            dot: KDot::new(acts, pf, w, o0, n_out, Super::Q4K),
            n_out,
            tile,
            yt,
        }),
        Matrix::Q6_K(w) => arch.dispatch(Chunk {
            dot: KDot::new(acts, pf, w, o0, n_out, Super::Q6K),
            n_out,
            tile,
            yt,
        }),
    }
}

/// `R` activation rows (from `r0`) dotted with `W` weight rows (from `o`, relative to the chunk),
/// prefetching the rows `ahead` rows further on.
trait Dot {
    /// Whether blocks of up to 8 activation rows pay (each weight vector widened once for all).
    const WIDE_ROWS: bool = false;

    fn dot<S: Simd, const R: usize, const W: usize>(
        &self,
        simd: S,
        r0: usize,
        o: usize,
        ahead: usize,
    ) -> [[f32; W]; R];
}

struct Chunk<'a, D> {
    dot: D,
    n_out: usize,
    tile: usize,
    yt: &'a mut [f32],
}

impl<D: Dot + HasActs> pulp::WithSimd for Chunk<'_, D> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let rows = self.dot.acts().rows;
        let mut t0 = 0;
        while t0 < self.n_out {
            let t1 = (t0 + self.tile).min(self.n_out);
            let mut r0 = 0;
            while r0 < rows {
                // f32/bf16: blocks of at most 4 rows, with as many weight rows as keep R * W <= 9.
                // Q8_0: up to 8 rows against one weight row (two for a single row), each weight
                // vector widened once for all of them; more weight rows at once measured up to 2x
                // slower (the widening's dependency chains outgrow the out-of-order window).
                let max_rb = if D::WIDE_ROWS { 8 } else { 4 };
                let rb = (rows - r0).min(max_rb);
                // One pass over the tile: prefetch one group of weight rows ahead. Several passes
                // (more rows than a block): the later ones read the tile from cache, so prefetch
                // the next tile, keeping memory busy through every pass.
                let ahead = if rows > max_rb { self.tile } else { 0 };
                let b = Block {
                    dot: &self.dot,
                    r0,
                    t0,
                    t1,
                    rows,
                    ahead,
                };
                let yt = &mut *self.yt;
                match (D::WIDE_ROWS, rb) {
                    (false, 1) => b.run::<S, 1, 4>(simd, yt),
                    (false, 2) => b.run::<S, 2, 4>(simd, yt),
                    (false, 3) => b.run::<S, 3, 3>(simd, yt),
                    (false, _) => b.run::<S, 4, 2>(simd, yt),
                    (true, 1) => b.run::<S, 1, 2>(simd, yt),
                    (true, 2) => b.run::<S, 2, 1>(simd, yt),
                    (true, 3) => b.run::<S, 3, 1>(simd, yt),
                    (true, 4) => b.run::<S, 4, 1>(simd, yt),
                    (true, 5) => b.run::<S, 5, 1>(simd, yt),
                    (true, 6) => b.run::<S, 6, 1>(simd, yt),
                    (true, 7) => b.run::<S, 7, 1>(simd, yt),
                    (true, _) => b.run::<S, 8, 1>(simd, yt),
                }
                r0 += rb;
            }
            t0 = t1;
        }
    }
}

trait HasActs {
    fn acts(&self) -> &Activations<'_>;
}

/// Rows `r0..r0 + R` over weight rows `t0..t1` of a chunk.
#[derive(Clone, Copy)]
struct Block<'a, D> {
    dot: &'a D,
    r0: usize,
    t0: usize,
    t1: usize,
    rows: usize,
    /// Weight rows to prefetch ahead; 0 for one group (`W`).
    ahead: usize,
}

impl<D: Dot> Block<'_, D> {
    /// Each `(R, W)` variant is its own vectorized function: one function holding every variant
    /// grows past what the compiler unrolls, and the accumulators end up in memory.
    #[inline(always)]
    fn run<S: Simd, const R: usize, const W: usize>(self, simd: S, yt: &mut [f32]) {
        simd.vectorize(TileRows::<D, R, W> { b: self, yt });
    }
}

struct TileRows<'a, 'b, D, const R: usize, const W: usize> {
    b: Block<'a, D>,
    yt: &'b mut [f32],
}

impl<D: Dot, const R: usize, const W: usize> pulp::WithSimd for TileRows<'_, '_, D, R, W> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let Block {
            dot,
            r0,
            t0,
            t1,
            rows,
            ahead,
        } = self.b;
        let ahead = if ahead == 0 { W } else { ahead };
        tile_rows::<S, D, R, W>(simd, dot, (r0, t0, t1, rows, ahead), self.yt);
    }
}

#[inline(always)]
fn tile_rows<S: Simd, D: Dot, const R: usize, const W: usize>(
    simd: S,
    dot: &D,
    (r0, t0, t1, rows, ahead): (usize, usize, usize, usize, usize),
    yt: &mut [f32],
) {
    let mut store = |o: usize, res: &[[f32; W]; R], width: usize| {
        for i in 0..width {
            for r in 0..R {
                yt[(o + i) * rows + r0 + r] = res[r][i];
            }
        }
    };
    let mut o = t0;
    while o + W <= t1 {
        let res = dot.dot::<S, R, W>(simd, r0, o, ahead);
        store(o, &res, W);
        o += W;
    }
    while o < t1 {
        let res = dot.dot::<S, R, 1>(simd, r0, o, ahead);
        let wide: [[f32; W]; R] = core::array::from_fn(|r| {
            let mut a = [0.0; W];
            a[0] = res[r][0];
            a
        });
        store(o, &wide, 1);
        o += 1;
    }
}

struct F32Dot<'a> {
    acts: &'a Activations<'a>,
    pf: Prefetch,
    /// The chunk's weight rows.
    w: &'a [f32],
}

impl HasActs for F32Dot<'_> {
    fn acts(&self) -> &Activations<'_> {
        self.acts
    }
}

impl Dot for F32Dot<'_> {
    #[inline(always)]
    fn dot<S: Simd, const R: usize, const W: usize>(
        &self,
        simd: S,
        r0: usize,
        o: usize,
        ahead: usize,
    ) -> [[f32; W]; R] {
        let inner = self.acts.inner;
        let mut xs: [&[S::f32s]; R] = [&[]; R];
        let mut xt: [&[f32]; R] = [&[]; R];
        for r in 0..R {
            (xs[r], xt[r]) = S::as_simd_f32s(self.acts.row(r0 + r));
        }
        let mut ws: [&[S::f32s]; W] = [&[]; W];
        let mut wt: [&[f32]; W] = [&[]; W];
        for i in 0..W {
            (ws[i], wt[i]) = S::as_simd_f32s(&self.w[(o + i) * inner..][..inner]);
        }
        let nv = ws[0].len();
        let zero = simd.splat_f32s(0.0);
        let mut acc = [[zero; W]; R];
        let vec_bytes = size_of::<S::f32s>();
        let every = (LINE / vec_bytes).max(1);
        let ahead = ahead * inner * size_of::<f32>();
        for j in 0..nv {
            if j % every == 0 {
                for i in 0..W {
                    let p = ws[i].as_ptr().cast::<u8>();
                    self.pf.line(p.wrapping_add(j * vec_bytes + ahead));
                }
            }
            let mut wj = [zero; W];
            for i in 0..W {
                wj[i] = ws[i][j];
            }
            for r in 0..R {
                let xj = xs[r][j];
                for i in 0..W {
                    acc[r][i] = simd.mul_add_e_f32s(xj, wj[i], acc[r][i]);
                }
            }
        }
        let mut res = [[0.0f32; W]; R];
        for r in 0..R {
            for i in 0..W {
                let mut s = simd.reduce_sum_f32s(acc[r][i]);
                for (a, b) in xt[r].iter().zip(wt[i]) {
                    s += a * b;
                }
                res[r][i] = s;
            }
        }
        res
    }
}

struct Bf16Dot<'a> {
    acts: &'a Activations<'a>,
    pf: Prefetch,
    /// The chunk's weight rows, raw bf16 bits.
    w: &'a [u16],
}

impl HasActs for Bf16Dot<'_> {
    fn acts(&self) -> &Activations<'_> {
        self.acts
    }
}

#[inline(always)]
fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

impl Dot for Bf16Dot<'_> {
    #[inline(always)]
    fn dot<S: Simd, const R: usize, const W: usize>(
        &self,
        simd: S,
        r0: usize,
        o: usize,
        ahead: usize,
    ) -> [[f32; W]; R] {
        let acts = self.acts;
        let inner = acts.inner;
        let half = inner / 2;
        // The pair trick needs a u16 vector to be exactly a u32 vector (not so for the scalar
        // fallback, whose "vectors" are single elements): then everything goes to the scalar tail.
        let paired = size_of::<S::u16s>() == size_of::<S::u32s>();
        let mut ws: [&[S::u16s]; W] = [&[]; W];
        let mut wt: [&[u16]; W] = [&[]; W];
        for i in 0..W {
            let row = &self.w[(o + i) * inner..][..inner];
            (ws[i], wt[i]) = if paired {
                S::as_simd_u16s(row)
            } else {
                (&[][..], row)
            };
        }
        let nv = ws[0].len();
        let tail_start = inner - wt[0].len();
        let mut xe: [&[S::f32s]; R] = [&[]; R];
        let mut xo: [&[S::f32s]; R] = [&[]; R];
        for r in 0..R {
            let n = r0 + r;
            xe[r] = S::as_simd_f32s(&acts.even[n * half..][..half]).0;
            xo[r] = S::as_simd_f32s(&acts.odd[n * half..][..half]).0;
        }
        let shift = simd.splat_u32s(16);
        let high = simd.splat_u32s(0xffff_0000);
        let zero = simd.splat_f32s(0.0);
        let mut acc = [[zero; W]; R];
        let vec_bytes = size_of::<S::u16s>();
        let every = (LINE / vec_bytes).max(1);
        let ahead = ahead * inner * size_of::<u16>();
        for j in 0..nv {
            if j % every == 0 {
                for i in 0..W {
                    let p = ws[i].as_ptr().cast::<u8>();
                    self.pf.line(p.wrapping_add(j * vec_bytes + ahead));
                }
            }
            let mut we = [zero; W];
            let mut wo = [zero; W];
            for i in 0..W {
                let lanes: S::u32s = pulp::bytemuck::cast(ws[i][j]);
                we[i] = simd.transmute_f32s_u32s(simd.wrapping_dyn_shl_u32s(lanes, shift));
                wo[i] = simd.transmute_f32s_u32s(simd.and_u32s(lanes, high));
            }
            for r in 0..R {
                let (e, d) = (xe[r][j], xo[r][j]);
                for i in 0..W {
                    acc[r][i] = simd.mul_add_e_f32s(e, we[i], acc[r][i]);
                    acc[r][i] = simd.mul_add_e_f32s(d, wo[i], acc[r][i]);
                }
            }
        }
        let mut res = [[0.0f32; W]; R];
        for r in 0..R {
            let xt = &acts.row(r0 + r)[tail_start..];
            for i in 0..W {
                let mut s = simd.reduce_sum_f32s(acc[r][i]);
                for (a, &b) in xt.iter().zip(wt[i]) {
                    s += a * bf16_to_f32(b);
                }
                res[r][i] = s;
            }
        }
        res
    }
}

struct Q8Dot<'a> {
    acts: &'a Activations<'a>,
    pf: Prefetch,
    /// The chunk's weight rows, Q8_0 blocks.
    w: &'a [u8],
    row_bytes: usize,
}

impl HasActs for Q8Dot<'_> {
    fn acts(&self) -> &Activations<'_> {
        self.acts
    }
}

/// Each accumulator's lanes summed: the dot of its row pair.
#[inline(always)]
fn reduce_all<S: Simd, const R: usize, const W: usize>(
    simd: S,
    acc: &[[S::f32s; W]; R],
) -> [[f32; W]; R] {
    core::array::from_fn(|r| core::array::from_fn(|i| simd.reduce_sum_f32s(acc[r][i])))
}

/// The little-endian f16 at byte `at` of `blk`, as f32: one load from [`F16_TO_F32`]. The weight
/// blocks' scales are converted once per block in the inner loops, and the x86-64 baseline has no
/// conversion instruction (F16C is not in pulp's `V3` token): computed in registers it was most of
/// the integer dot's instructions (a decode step's Q8_0 matmuls ran at 12 GB/s, compute-bound). The
/// table is 256 KiB, but a matrix's scales span a few exponents, so the entries it touches stay in
/// cache.
#[inline(always)]
fn f16_at(blk: &[u8], at: usize) -> f32 {
    let bits: [u8; 2] = blk[at..at + 2].try_into().expect("two bytes");
    F16_TO_F32[usize::from(u16::from_le_bytes(bits))]
}

/// Every f16 bit pattern's f32 value, built at compile time by [`f16_to_f32`].
static F16_TO_F32: [f32; 1 << 16] = f16_table();

const fn f16_table() -> [f32; 1 << 16] {
    let mut table = [0.0f32; 1 << 16];
    let mut h = 0;
    while h < table.len() {
        table[h] = f16_to_f32(h as u16);
        h += 1;
    }
    table
}

/// IEEE half (binary16) bits to f32, exactly (every f16 is an f32). A normal half's bits moved to
/// the top of an f32 mantissa need only the exponent bias corrected (`+ 112 << 23`). A subnormal
/// half is `m · 2^-24`: placed as the mantissa of `2^-14` and `2^-14` subtracted, one exact
/// subtraction of normal numbers, so no intermediate is an f32 subnormal (XLA's CPU threads, where
/// these kernels run, treat subnormal inputs as zero, and most of a Q4_K super-block's scales are
/// f16 subnormals). An all-ones exponent (inf, NaN) is set apart, and the sign is copied.
#[inline(always)]
pub(crate) const fn f16_to_f32(h: u16) -> f32 {
    const EXPONENT: u32 = 0x7c00 << 13;
    let magnitude = ((h & 0x7fff) as u32) << 13;
    let exponent = magnitude & EXPONENT;
    let normal = magnitude + (112 << 23);
    let two_to_minus_14 = f32::from_bits(113 << 23);
    let subnormal = (f32::from_bits(magnitude + (113 << 23)) - two_to_minus_14).to_bits();
    let bits = if exponent == EXPONENT {
        magnitude | 0x7f80_0000
    } else if exponent == 0 {
        subnormal
    } else {
        normal
    };
    f32::from_bits(bits | (((h & 0x8000) as u32) << 16))
}

impl Q8Dot<'_> {
    /// The block's scale and codes.
    #[inline(always)]
    fn block(&self, o: usize, b: usize) -> (f32, &[u8]) {
        let blk = &self.w[o * self.row_bytes + b * Q8_0_BLOCK_BYTES..][..Q8_0_BLOCK_BYTES];
        (f16_at(blk, 0), &blk[2..])
    }

    /// Where the dispatcher's SIMD type cannot hold the byte trick (the scalar fallback).
    fn dot_scalar<const R: usize, const W: usize>(&self, r0: usize, o: usize) -> [[f32; W]; R] {
        let mut res = [[0.0f32; W]; R];
        for r in 0..R {
            let x = self.acts.row(r0 + r);
            for i in 0..W {
                let mut s = 0.0f32;
                for (b, xb) in x.chunks_exact(Q8_0_BLOCK_ELEMS).enumerate() {
                    let (d, codes) = self.block(o + i, b);
                    for (a, &q) in xb.iter().zip(codes) {
                        s += a * (d * f32::from(q as i8));
                    }
                }
                res[r][i] = s;
            }
        }
        res
    }
}

impl Dot for Q8Dot<'_> {
    const WIDE_ROWS: bool = true;

    #[inline(always)]
    fn dot<S: Simd, const R: usize, const W: usize>(
        &self,
        simd: S,
        r0: usize,
        o: usize,
        ahead: usize,
    ) -> [[f32; W]; R] {
        let acts = self.acts;
        let lanes = S::F32_LANES;
        if acts.q8_lanes != lanes {
            return self.dot_scalar::<R, W>(r0, o);
        }
        let inner = acts.inner;
        let blocks = inner / Q8_0_BLOCK_ELEMS;
        let per_block = Q8_0_BLOCK_ELEMS / (4 * lanes);
        let mut xs: [&[S::f32s]; R] = [&[]; R];
        for r in 0..R {
            xs[r] = S::as_simd_f32s(&acts.q8x[(r0 + r) * inner..][..inner]).0;
        }
        let flip = simd.splat_u32s(0x8080_8080);
        let low = simd.splat_u32s(0xff);
        let magic = simd.splat_u32s(0x4b00_0000);
        let bias = simd.splat_f32s(8_388_736.0); // 2^23 + 128
        let zero = simd.splat_f32s(0.0);
        let mut acc = [[zero; W]; R];
        for b in 0..blocks {
            for i in 0..W {
                let (d, codes) = self.block(o + i, b);
                if b % 2 == 0 {
                    let ahead = ahead * self.row_bytes;
                    self.pf.line(codes.as_ptr().wrapping_add(ahead));
                }
                let d = simd.splat_f32s(d);
                let codes = S::as_simd_u8s(codes).0;
                for v in 0..per_block {
                    let lanes_u32: S::u32s = pulp::bytemuck::cast(codes[v]);
                    let c = simd.xor_u32s(lanes_u32, flip);
                    for k in 0..4 {
                        let shifted = simd.wrapping_dyn_shr_u32s(c, simd.splat_u32s(8 * k as u32));
                        let u = if k == 3 {
                            shifted
                        } else {
                            simd.and_u32s(shifted, low)
                        };
                        let f = simd.transmute_f32s_u32s(simd.or_u32s(u, magic));
                        let wv = simd.mul_f32s(simd.sub_f32s(f, bias), d);
                        let xi = b * (Q8_0_BLOCK_ELEMS / lanes) + v * 4 + k;
                        for r in 0..R {
                            acc[r][i] = simd.mul_add_e_f32s(xs[r][xi], wv, acc[r][i]);
                        }
                    }
                }
            }
        }
        reduce_all(simd, &acc)
    }
}

/// The nibble-coded block formats, which share one inner loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Nibbles {
    /// `d * (code - 8)`.
    Q4_0,
    /// `d * code + m`.
    Q4_1,
    /// `d * (code - 16)`, the code's bit 4 from `qh`.
    Q5_0,
}

impl Nibbles {
    fn block_bytes(self) -> usize {
        match self {
            Nibbles::Q4_0 => Q4_0_BLOCK_BYTES,
            Nibbles::Q4_1 => Q4_1_BLOCK_BYTES,
            Nibbles::Q5_0 => Q5_0_BLOCK_BYTES,
        }
    }

    /// What is subtracted from each code (Q4_1 adds `m` instead).
    fn offset(self) -> f32 {
        match self {
            Nibbles::Q4_0 => 8.0,
            Nibbles::Q4_1 => 0.0,
            Nibbles::Q5_0 => 16.0,
        }
    }
}

struct Q4Dot<'a> {
    acts: &'a Activations<'a>,
    pf: Prefetch,
    /// The chunk's weight rows, blocks of `format`.
    w: &'a [u8],
    row_bytes: usize,
    block_bytes: usize,
    format: Nibbles,
}

impl HasActs for Q4Dot<'_> {
    fn acts(&self) -> &Activations<'_> {
        self.acts
    }
}

/// One block's header: scale, minimum (Q4_1; else 0), high bits (Q5_0; else 0), and its 16 code
/// bytes.
struct NibbleBlock<'a> {
    d: f32,
    m: f32,
    qh: u32,
    codes: &'a [u8],
}

impl<'a> Q4Dot<'a> {
    fn new(
        acts: &'a Activations<'a>,
        pf: Prefetch,
        w: &'a [u8],
        o0: usize,
        n_out: usize,
        format: Nibbles,
    ) -> Self {
        let block_bytes = format.block_bytes();
        let row_bytes = acts.inner / Q4_BLOCK_ELEMS * block_bytes;
        Q4Dot {
            acts,
            pf,
            w: &w[o0 * row_bytes..(o0 + n_out) * row_bytes],
            row_bytes,
            block_bytes,
            format,
        }
    }

    #[inline(always)]
    fn block(&self, o: usize, b: usize) -> NibbleBlock<'_> {
        let blk = &self.w[o * self.row_bytes + b * self.block_bytes..][..self.block_bytes];
        let f16 = |at: usize| f16_at(blk, at);
        NibbleBlock {
            d: f16(0),
            m: if self.format == Nibbles::Q4_1 {
                f16(2)
            } else {
                0.0
            },
            qh: if self.format == Nibbles::Q5_0 {
                u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]])
            } else {
                0
            },
            codes: &blk[self.block_bytes - Q4_CODE_BYTES..],
        }
    }

    /// The weight element `e` of a block decodes to, as the dequantized matrix holds it.
    #[inline(always)]
    fn weight(&self, blk: &NibbleBlock<'_>, e: usize) -> f32 {
        let byte = blk.codes[e % Q4_CODE_BYTES];
        let nibble = if e < Q4_CODE_BYTES {
            byte & 0xF
        } else {
            byte >> 4
        };
        let code = f32::from(nibble | ((((blk.qh >> e) & 1) as u8) << 4));
        match self.format {
            Nibbles::Q4_1 => blk.d * code + blk.m,
            _ => blk.d * (code - self.format.offset()),
        }
    }

    /// Where the dispatcher's SIMD type cannot hold the pair layout.
    fn dot_scalar<const R: usize, const W: usize>(&self, r0: usize, o: usize) -> [[f32; W]; R] {
        let mut res = [[0.0f32; W]; R];
        for r in 0..R {
            let x = self.acts.row(r0 + r);
            for i in 0..W {
                let mut s = 0.0f32;
                for (b, xb) in x.chunks_exact(Q4_BLOCK_ELEMS).enumerate() {
                    let blk = self.block(o + i, b);
                    for (e, &xe) in xb.iter().enumerate() {
                        s += xe * self.weight(&blk, e);
                    }
                }
                res[r][i] = s;
            }
        }
        res
    }
}

impl Dot for Q4Dot<'_> {
    const WIDE_ROWS: bool = true;

    #[inline(always)]
    fn dot<S: Simd, const R: usize, const W: usize>(
        &self,
        simd: S,
        r0: usize,
        o: usize,
        ahead: usize,
    ) -> [[f32; W]; R] {
        let acts = self.acts;
        let lanes = S::F32_LANES;
        if acts.q4_lanes != lanes {
            return self.dot_scalar::<R, W>(r0, o);
        }
        let inner = acts.inner;
        let blocks = inner / Q4_BLOCK_ELEMS;
        let per_block = Q4_CODE_BYTES / (2 * lanes);
        let mut xs: [&[S::f32s]; R] = [&[]; R];
        for r in 0..R {
            xs[r] = S::as_simd_f32s(&acts.q4x[(r0 + r) * inner..][..inner]).0;
        }
        let nibble = simd.splat_u32s(0xF);
        let bit4 = simd.splat_u32s(0x10);
        let magic = simd.splat_u32s(0x4b00_0000);
        let bias = simd.splat_f32s(8_388_608.0 + self.format.offset()); // 2^23 + offset
        let with_min = self.format == Nibbles::Q4_1;
        let high_bits = self.format == Nibbles::Q5_0;
        let zero = simd.splat_f32s(0.0);
        let mut acc = [[zero; W]; R];
        for b in 0..blocks {
            for i in 0..W {
                let blk = self.block(o + i, b);
                let codes = blk.codes;
                if b % 3 == 0 {
                    let ahead = ahead * self.row_bytes;
                    self.pf.line(codes.as_ptr().wrapping_add(ahead));
                }
                let d = simd.splat_f32s(blk.d);
                let m = simd.splat_f32s(blk.m);
                let qh = simd.splat_u32s(blk.qh);
                for v in 0..per_block {
                    // Lane j: code bytes 2(v·L + j) and the next, zero-extended.
                    let mut pairs = simd.splat_u32s(0);
                    let lane: &mut [u32] =
                        pulp::bytemuck::cast_slice_mut(core::slice::from_mut(&mut pairs));
                    for (j, p) in lane.iter_mut().enumerate() {
                        let at = 2 * (v * lanes + j);
                        *p = u32::from(u16::from_le_bytes([codes[at], codes[at + 1]]));
                    }
                    // Lane j: qh >> 2(v·L + j), its bits 0, 16, 1, 17 those of nibbles 0..4.
                    let mut hi = simd.splat_u32s(0);
                    if high_bits {
                        let mut shifts = simd.splat_u32s(0);
                        let lane: &mut [u32] =
                            pulp::bytemuck::cast_slice_mut(core::slice::from_mut(&mut shifts));
                        for (j, s) in lane.iter_mut().enumerate() {
                            *s = (2 * (v * lanes + j)) as u32;
                        }
                        hi = simd.wrapping_dyn_shr_u32s(qh, shifts);
                    }
                    for k in 0..4 {
                        let shifted = simd.wrapping_dyn_shr_u32s(pairs, simd.splat_u32s(4 * k));
                        let mut u = if k == 3 {
                            shifted
                        } else {
                            simd.and_u32s(shifted, nibble)
                        };
                        if high_bits {
                            // Bit 0, 16, 1 or 17 of `hi` to bit 4.
                            let h = match k {
                                0 => simd.wrapping_dyn_shl_u32s(hi, simd.splat_u32s(4)),
                                1 => simd.wrapping_dyn_shr_u32s(hi, simd.splat_u32s(12)),
                                2 => simd.wrapping_dyn_shl_u32s(hi, simd.splat_u32s(3)),
                                _ => simd.wrapping_dyn_shr_u32s(hi, simd.splat_u32s(13)),
                            };
                            u = simd.or_u32s(u, simd.and_u32s(h, bit4));
                        }
                        let f = simd.transmute_f32s_u32s(simd.or_u32s(u, magic));
                        let code = simd.sub_f32s(f, bias);
                        // d * code is exact, so fused or not, Q4_1's weight is rounded once.
                        let wv = if with_min {
                            simd.mul_add_e_f32s(code, d, m)
                        } else {
                            simd.mul_f32s(code, d)
                        };
                        let xi = b * (Q4_BLOCK_ELEMS / lanes) + v * 4 + k as usize;
                        for r in 0..R {
                            acc[r][i] = simd.mul_add_e_f32s(xs[r][xi], wv, acc[r][i]);
                        }
                    }
                }
            }
        }
        reduce_all(simd, &acc)
    }
}

/// The K-quant super-block formats, which share one inner loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Super {
    /// Eight sub-blocks of 32 with 6-bit scales and mins: `(d * sc) * code - dmin * mn`.
    Q4K,
    /// Sixteen sub-blocks of 16 with `i8` scales: `(d * scale) * (code - 32)`.
    Q6K,
}

impl Super {
    fn block_bytes(self) -> usize {
        match self {
            Super::Q4K => Q4_K_BLOCK_BYTES,
            Super::Q6K => Q6_K_BLOCK_BYTES,
        }
    }

    /// The 256 weights of super-block `blk`, as the dequantized matrix holds them.
    #[inline(always)]
    fn decode(self, blk: &[u8], w: &mut [f32; K_BLOCK_ELEMS]) {
        let f16 = |at: usize| f16_at(blk, at);
        match self {
            Super::Q4K => {
                let (d, dmin) = (f16(0), f16(2));
                let s = &blk[4..16];
                // llama.cpp's get_scale_min_k4: pairs 0..4 in the low 6 bits of bytes 0..4 (scale)
                // and 4..8 (min); pairs 4..8 from the nibbles of bytes 8..12 and the top 2 bits of
                // bytes 0..8.
                let pair = |j: usize| -> (f32, f32) {
                    let (sc, mn) = if j < 4 {
                        (s[j] & 63, s[j + 4] & 63)
                    } else {
                        (
                            (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4),
                            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
                        )
                    };
                    (d * f32::from(sc), dmin * f32::from(mn))
                };
                let qs = &blk[16..Q4_K_BLOCK_BYTES];
                for g in 0..4 {
                    let ((d0, m0), (d1, m1)) = (pair(2 * g), pair(2 * g + 1));
                    let q = &qs[32 * g..][..32];
                    let (lo, hi) = w[64 * g..][..64].split_at_mut(32);
                    for l in 0..32 {
                        lo[l] = d0 * f32::from(q[l] & 15) - m0;
                        hi[l] = d1 * f32::from(q[l] >> 4) - m1;
                    }
                }
            }
            Super::Q6K => {
                let d = f16(208);
                let ds: [f32; 16] = core::array::from_fn(|i| d * f32::from(blk[192 + i] as i8));
                for h in 0..2 {
                    let ql = &blk[64 * h..][..64];
                    let qh = &blk[128 + 32 * h..][..32];
                    let y = &mut w[128 * h..][..128];
                    for half in 0..2 {
                        let sc = [0, 2, 4, 6].map(|q| ds[8 * h + q + half]);
                        for l in 16 * half..16 * half + 16 {
                            let code = |low: u8, high: u8| f32::from(low | (high & 3) << 4) - 32.0;
                            y[l] = sc[0] * code(ql[l] & 15, qh[l]);
                            y[32 + l] = sc[1] * code(ql[32 + l] & 15, qh[l] >> 2);
                            y[64 + l] = sc[2] * code(ql[l] >> 4, qh[l] >> 4);
                            y[96 + l] = sc[3] * code(ql[32 + l] >> 4, qh[l] >> 6);
                        }
                    }
                }
            }
        }
    }
}

struct KDot<'a> {
    acts: &'a Activations<'a>,
    pf: Prefetch,
    /// The chunk's weight rows, super-blocks of `format`.
    w: &'a [u8],
    row_bytes: usize,
    block_bytes: usize,
    format: Super,
}

impl HasActs for KDot<'_> {
    fn acts(&self) -> &Activations<'_> {
        self.acts
    }
}

impl<'a> KDot<'a> {
    fn new(
        acts: &'a Activations<'a>,
        pf: Prefetch,
        w: &'a [u8],
        o0: usize,
        n_out: usize,
        format: Super,
    ) -> Self {
        let block_bytes = format.block_bytes();
        let row_bytes = acts.inner / K_BLOCK_ELEMS * block_bytes;
        KDot {
            acts,
            pf,
            w: &w[o0 * row_bytes..(o0 + n_out) * row_bytes],
            row_bytes,
            block_bytes,
            format,
        }
    }
}

/// Independent partial sums per super-block and row pair: one accumulator's chain of dependent
/// multiply-adds would wait on the FMA latency.
const K_PARTIALS: usize = 4;

impl Dot for KDot<'_> {
    const WIDE_ROWS: bool = true;

    #[inline(always)]
    fn dot<S: Simd, const R: usize, const W: usize>(
        &self,
        simd: S,
        r0: usize,
        o: usize,
        ahead: usize,
    ) -> [[f32; W]; R] {
        let acts = self.acts;
        let blocks = acts.inner / K_BLOCK_ELEMS;
        let zero = simd.splat_f32s(0.0);
        let mut acc = [[zero; W]; R];
        let mut decoded = [[0.0f32; K_BLOCK_ELEMS]; W];
        let ahead = ahead * self.row_bytes;
        for b in 0..blocks {
            for i in 0..W {
                let blk =
                    &self.w[(o + i) * self.row_bytes + b * self.block_bytes..][..self.block_bytes];
                self.pf
                    .span(blk.as_ptr().wrapping_add(ahead), self.block_bytes);
                self.format.decode(blk, &mut decoded[i]);
            }
            for i in 0..W {
                let wv = S::as_simd_f32s(&decoded[i]).0;
                for r in 0..R {
                    let x = &acts.row(r0 + r)[b * K_BLOCK_ELEMS..][..K_BLOCK_ELEMS];
                    let xv = S::as_simd_f32s(x).0;
                    let mut part = [zero; K_PARTIALS];
                    for (j, (&xj, &wj)) in xv.iter().zip(wv).enumerate() {
                        part[j % K_PARTIALS] = simd.mul_add_e_f32s(xj, wj, part[j % K_PARTIALS]);
                    }
                    let sum = simd.add_f32s(
                        simd.add_f32s(part[0], part[1]),
                        simd.add_f32s(part[2], part[3]),
                    );
                    acc[r][i] = simd.add_f32s(acc[r][i], sum);
                }
            }
        }
        reduce_all(simd, &acc)
    }
}

#[cfg(test)]
mod tests {
    //! The portable path (pulp's scalar type, what a CPU without the vector features gets) against
    //! an f64 reference, on the same shapes as the dispatched path's tests. Each weight is exact in
    //! f32, so `|y - y_ref| <= γ_inner · Σ|x w|` (see `tests/matmul.rs`).

    use super::*;
    use pulp::WithSimd;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (*seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    fn scalar_chunk(acts: &Activations<'_>, w: &Matrix<'_>, out: usize) -> Vec<f32> {
        let mut yt = vec![f32::NAN; out * acts.rows];
        let (inner, pf, tile) = (acts.inner, Prefetch::new(), 8);
        let simd = pulp::Scalar::new();
        match *w {
            Matrix::F32(w) => Chunk {
                dot: F32Dot { acts, pf, w },
                n_out: out,
                tile,
                yt: &mut yt,
            }
            .with_simd(simd),
            Matrix::Bf16(w) => Chunk {
                dot: Bf16Dot { acts, pf, w },
                n_out: out,
                tile,
                yt: &mut yt,
            }
            .with_simd(simd),
            Matrix::Q8_0(w) => Chunk {
                dot: Q8Dot {
                    acts,
                    pf,
                    w,
                    row_bytes: inner / 32 * 34,
                },
                n_out: out,
                tile,
                yt: &mut yt,
            }
            .with_simd(simd),
            Matrix::Q4_0(w) => Chunk {
                dot: Q4Dot::new(acts, pf, w, 0, out, Nibbles::Q4_0),
                n_out: out,
                tile,
                yt: &mut yt,
            }
            .with_simd(simd),
            Matrix::Q4_1(w) => Chunk {
                dot: Q4Dot::new(acts, pf, w, 0, out, Nibbles::Q4_1),
                n_out: out,
                tile,
                yt: &mut yt,
            }
            .with_simd(simd),
            Matrix::Q5_0(w) => Chunk {
                dot: Q4Dot::new(acts, pf, w, 0, out, Nibbles::Q5_0),
                n_out: out,
                tile,
                yt: &mut yt,
            }
            .with_simd(simd),
            Matrix::Q4_K(w) => Chunk {
                dot: KDot::new(acts, pf, w, 0, out, Super::Q4K),
                n_out: out,
                tile,
                yt: &mut yt,
            }
            .with_simd(simd),
            Matrix::Q6_K(w) => Chunk {
                dot: KDot::new(acts, pf, w, 0, out, Super::Q6K),
                n_out: out,
                tile,
                yt: &mut yt,
            }
            .with_simd(simd),
        }
        yt
    }

    #[test]
    fn scalar_fallback_matches_reference() {
        let mut seed = 42;
        for (rows, inner, out) in [(1, 64, 5), (3, 96, 7), (5, 33, 9), (8, 576, 6)] {
            let x: Vec<f32> = (0..rows * inner).map(|_| lcg(&mut seed)).collect();
            let wf: Vec<f32> = (0..out * inner).map(|_| lcg(&mut seed)).collect();
            let wb: Vec<u16> = wf.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
            let mut wq = Vec::new();
            let mut wq_values = Vec::new();
            let (mut w40, mut w40_values, mut w41, mut w41_values) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            let (mut w50, mut w50_values) = (Vec::new(), Vec::new());
            if inner % 32 == 0 {
                for blk in 0..out * inner / 32 {
                    let d: u16 = 0x2400 + blk as u16 * 41;
                    let m: u16 = 0xa000 + blk as u16 * 13; // negative minimums
                    let codes: Vec<u8> =
                        (0..16).map(|j| ((blk * 29 + j * 11) % 256) as u8).collect();
                    let (df, mf) = (f16_to_f32(d), f16_to_f32(m));
                    w40.extend_from_slice(&d.to_le_bytes());
                    w41.extend_from_slice(&d.to_le_bytes());
                    w41.extend_from_slice(&m.to_le_bytes());
                    w40.extend_from_slice(&codes);
                    w41.extend_from_slice(&codes);
                    let nibbles = codes
                        .iter()
                        .map(|c| c & 0xF)
                        .chain(codes.iter().map(|c| c >> 4));
                    let qh = (blk as u32).wrapping_mul(0x9e37_79b9);
                    w50.extend_from_slice(&d.to_le_bytes());
                    w50.extend_from_slice(&qh.to_le_bytes());
                    w50.extend_from_slice(&codes);
                    for (e, q) in nibbles.enumerate() {
                        w40_values.push(f64::from(df * (f32::from(q) - 8.0)));
                        w41_values.push(f64::from(df * f32::from(q) + mf));
                        let q5 = u32::from(q) | ((qh >> e) & 1) << 4;
                        w50_values.push(f64::from(df * (q5 as f32 - 16.0)));
                    }
                }
                for blk in 0..out * inner / 32 {
                    let d: u16 = 0x2000 + blk as u16 * 37; // normal f16 scales around 2^-7
                    wq.extend_from_slice(&d.to_le_bytes());
                    for e in 0..32 {
                        let q = ((blk * 31 + e * 7) % 256) as u8;
                        wq.push(q);
                        wq_values.push(f64::from(f16_to_f32(d)) * f64::from(q as i8));
                    }
                }
            }
            let cases: Vec<(Matrix<'_>, Vec<f64>)> = [
                Some((Matrix::F32(&wf), wf.iter().map(|&v| f64::from(v)).collect())),
                Some((
                    Matrix::Bf16(&wb),
                    wb.iter()
                        .map(|&b| f64::from(f32::from_bits(u32::from(b) << 16)))
                        .collect(),
                )),
                (inner % 32 == 0).then(|| (Matrix::Q8_0(&wq), wq_values.clone())),
                (inner % 32 == 0).then(|| (Matrix::Q4_0(&w40), w40_values.clone())),
                (inner % 32 == 0).then(|| (Matrix::Q4_1(&w41), w41_values.clone())),
                (inner % 32 == 0).then(|| (Matrix::Q5_0(&w50), w50_values.clone())),
            ]
            .into_iter()
            .flatten()
            .collect();
            let nu = inner as f64 * f64::from(f32::EPSILON) / 2.0;
            let gamma = nu / (1.0 - nu);
            for (w, w64) in cases {
                let acts = Activations::new(&x, rows, inner, &w, false);
                let yt = scalar_chunk(&acts, &w, out);
                for n in 0..rows {
                    for o in 0..out {
                        let (mut s, mut m) = (0.0f64, 0.0f64);
                        for k in 0..inner {
                            let p = f64::from(x[n * inner + k]) * w64[o * inner + k];
                            s += p;
                            m += p.abs();
                        }
                        let got = f64::from(yt[o * rows + n]);
                        assert!(
                            (got - s).abs() <= gamma * m,
                            "{} rows={rows} inner={inner}: y[{n},{o}] = {got}, want {s}",
                            w.dtype()
                        );
                    }
                }
            }
        }
    }

    /// The K-quant formats on pulp's scalar type, against values decoded element by element
    /// from llama.cpp's definitions (random bytes: every scale, min and code).
    #[test]
    fn scalar_k_quants_match_reference() {
        let mut seed = 7;
        let byte = |seed: &mut u64| (lcg(seed).to_bits() >> 7) as u8;
        let (rows, inner, out) = (3, 512, 5);
        let x: Vec<f32> = (0..rows * inner).map(|_| lcg(&mut seed)).collect();
        let (mut w4, mut w4_values, mut w6, mut w6_values) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for blk in 0..out * inner / 256 {
            let d: u16 = 0x1c00 + blk as u16 * 37; // about 2^-8
            let dmin: u16 = 0x9c00 + blk as u16 * 13; // negative minimums
            let (df, mf) = (f16_to_f32(d), f16_to_f32(dmin));
            let s: Vec<u8> = (0..12).map(|_| byte(&mut seed)).collect();
            let qs: Vec<u8> = (0..128).map(|_| byte(&mut seed)).collect();
            w4.extend(d.to_le_bytes());
            w4.extend(dmin.to_le_bytes());
            w4.extend(&s);
            w4.extend(&qs);
            for e in 0..256 {
                let j = e / 32;
                let (sc, mn) = if j < 4 {
                    (s[j] & 63, s[j + 4] & 63)
                } else {
                    (
                        (s[j + 4] & 15) | (s[j - 4] >> 6) << 4,
                        (s[j + 4] >> 4) | (s[j] >> 6) << 4,
                    )
                };
                let q = (qs[32 * (j / 2) + e % 32] >> (4 * (j % 2))) & 15;
                let v = df * f32::from(sc) * f32::from(q) - mf * f32::from(mn);
                w4_values.push(f64::from(v));
            }
            let b: Vec<u8> = (0..208).map(|_| byte(&mut seed)).collect();
            w6.extend(&b);
            w6.extend(d.to_le_bytes());
            for e in 0..256 {
                let (h, r) = (e / 128, e % 128);
                let low = (b[64 * h + r % 64] >> (4 * (r / 64))) & 15;
                let high = (b[128 + 32 * h + r % 32] >> (2 * (r / 32))) & 3;
                let code = i32::from(low | high << 4) - 32;
                let v = df * f32::from(b[192 + e / 16] as i8) * code as f32;
                w6_values.push(f64::from(v));
            }
        }
        let nu = inner as f64 * f64::from(f32::EPSILON) / 2.0;
        let gamma = nu / (1.0 - nu);
        for (w, w64) in [
            (Matrix::Q4_K(&w4), w4_values),
            (Matrix::Q6_K(&w6), w6_values),
        ] {
            let acts = Activations::new(&x, rows, inner, &w, false);
            let yt = scalar_chunk(&acts, &w, out);
            for n in 0..rows {
                for o in 0..out {
                    let (mut s, mut m) = (0.0f64, 0.0f64);
                    for k in 0..inner {
                        let p = f64::from(x[n * inner + k]) * w64[o * inner + k];
                        s += p;
                        m += p.abs();
                    }
                    let got = f64::from(yt[o * rows + n]);
                    assert!(
                        (got - s).abs() <= gamma * m,
                        "{}: y[{n},{o}] = {got}, want {s}",
                        w.dtype()
                    );
                }
            }
        }
    }

    #[test]
    fn f16_decoding() {
        // Every half, as the kernels read it (the table), against binary16's definition.
        for h in 0..=u16::MAX {
            let sign = if h >> 15 == 1 { -1.0 } else { 1.0 };
            let (exp, mant) = (i32::from((h >> 10) & 0x1f), f64::from(h & 0x3ff));
            let got = f16_at(&h.to_le_bytes(), 0);
            assert_eq!(got.to_bits(), f16_to_f32(h).to_bits(), "{h:#06x}");
            match exp {
                0x1f if mant == 0.0 => assert_eq!(got, sign as f32 * f32::INFINITY, "{h:#06x}"),
                0x1f => assert!(got.is_nan(), "{h:#06x}"),
                _ => {
                    let want = if exp == 0 {
                        sign * mant * 2f64.powi(-24)
                    } else {
                        sign * (1.0 + mant / 1024.0) * 2f64.powi(exp - 15)
                    };
                    assert_eq!(f64::from(got), want, "{h:#06x}");
                    assert_eq!(got.is_sign_negative(), h >> 15 == 1, "{h:#06x}");
                }
            }
        }
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x83ff), -1023.0 * 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
        assert!(f16_to_f32(0x7e00).is_nan());
    }
}
