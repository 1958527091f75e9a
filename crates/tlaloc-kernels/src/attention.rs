//! Paged attention on the host: each query row attends over the keys and values its block table
//! points at, read in place from the K/V pools (`[numBlocks, blockSize, kvHeads, headDim]`), with
//! no gathered copy of the pages.
//!
//! The function is the portable body's (the forward program of `tlaloc-export`): key position `c`
//! of a row lives in page `blockTables[b, c / blockSize]` (an index past the pool is clamped into
//! it, as XLA's gather clamps), slot `c % blockSize`; a query at position `p` of a row whose
//! sequence length is `s` sees the keys `c <= p`, `c < s` and, on a windowed layer, `c > p -
//! window`; scores are `(q · k) · scale` in f32, softmax subtracts the maximum and divides each
//! exponential by their sum, and the output is the probability-weighted sum of the values. A query
//! that sees no key gets the portable body's answer too: every key of the context weighted alike.
//! With bf16 pools, q and the probabilities are rounded to bf16 (to nearest, ties to even) before
//! their dots, as the portable body's bf16 dots take them; every product is then exact in f32.
//!
//! The difference from the portable body is work, not arithmetic: the portable body gathers every
//! row's whole context (`C` keys) and masks it, this kernel reads only the visible keys, once for
//! all query heads of a KV head (grouped-query attention). Only the order of the f32 sums differs.
//!
//! The dot products and the weighted sums are `pulp` vectors dispatched at run time (no `unsafe`,
//! no intrinsics); bf16 rows are widened into a scratch row first (two shifts per element, cheap
//! next to the loads).

use crate::simd::Prefetch;
use pulp::Simd;
use rayon::prelude::*;

/// The K or V pool as the artifact stores it: `[numBlocks, blockSize, kvHeads, headDim]`.
#[derive(Debug, Clone, Copy)]
pub enum KvPool<'a> {
    /// f32 elements.
    F32(&'a [f32]),
    /// Raw bf16 bits (the upper half of an f32).
    Bf16(&'a [u16]),
}

impl KvPool<'_> {
    /// Hints that the `len` elements from `offset` will be read soon (see [`Item`]'s walk).
    #[inline(always)]
    fn prefetch(&self, pf: Prefetch, offset: usize, len: usize) {
        match self {
            KvPool::F32(p) => pf.span(p.as_ptr().wrapping_add(offset), len * 4),
            KvPool::Bf16(p) => pf.span(p.as_ptr().wrapping_add(offset), len * 2),
        }
    }

    fn len(&self) -> usize {
        match self {
            KvPool::F32(v) => v.len(),
            KvPool::Bf16(v) => v.len(),
        }
    }

    fn dtype(&self) -> &'static str {
        match self {
            KvPool::F32(_) => "f32",
            KvPool::Bf16(_) => "bf16",
        }
    }
}

/// The dimensions of one paged-attention call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionShape {
    /// Rows of the batch (`B`).
    pub batch: usize,
    /// Query tokens per row (`T`).
    pub tokens: usize,
    /// Query heads.
    pub heads: usize,
    /// KV heads; `heads` is a multiple of it (query head `h` uses KV head `h / (heads / kvHeads)`).
    pub kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Pages in each pool.
    pub num_blocks: usize,
    /// Token slots per page.
    pub block_size: usize,
    /// Keys a row can address (`C`): its block table has `C / blockSize` entries.
    pub context: usize,
}

/// The inputs of one call besides the pools. Dims as [`AttentionShape`] names them.
#[derive(Debug, Clone, Copy)]
pub struct AttentionInputs<'a> {
    /// `[B, T, heads, headDim]` f32.
    pub q: &'a [f32],
    /// `[B, C / blockSize]`: each row's pages.
    pub block_tables: &'a [i32],
    /// `[B, T]`: each query's position.
    pub positions: &'a [i32],
    /// `[B]`: each row's length (its keys `c < seqLen` are live).
    pub seq_lens: &'a [i32],
    /// Multiplies every score.
    pub scale: f32,
    /// On a sliding-window layer, how many positions a query sees (itself included).
    pub window: Option<usize>,
}

/// Why a paged-attention call was refused.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum AttentionError {
    /// Dimensions that do not describe paged attention.
    #[error("paged_attention: {0}")]
    Geometry(String),
    /// An operand whose length is not the one its dims need.
    #[error("paged_attention: `{operand}` has {actual} elements, its dims {dims} need {expected}")]
    Shape {
        /// The operand's name.
        operand: &'static str,
        /// The dims it should have.
        dims: String,
        /// The element count those dims need.
        expected: usize,
        /// The element count it has.
        actual: usize,
    },
    /// K and V pools of different element types.
    #[error("paged_attention: the K pool is {k} and the V pool {v}; they must be the same type")]
    MixedPools {
        /// The K pool's type.
        k: &'static str,
        /// The V pool's type.
        v: &'static str,
    },
}

/// Work (multiply-adds) under which a call runs on the calling thread: handing a few hundred
/// thousand multiply-adds to the pool costs more in wake-ups than it saves.
const PARALLEL_MIN_WORK: usize = 1 << 18;

/// `out [B, T, heads, headDim]` = paged attention of `inputs.q` over the pools `k` and `v`
/// (the module doc states the function). Overwrites every element of `out`. Runs on the current
/// rayon pool when the call is large enough; its bits do not depend on the thread count.
pub fn paged_attention(
    shape: &AttentionShape,
    inputs: &AttentionInputs<'_>,
    k: KvPool<'_>,
    v: KvPool<'_>,
    out: &mut [f32],
) -> Result<(), AttentionError> {
    check(shape, inputs, &k, &v, out.len())?;
    let s = *shape;
    let groups = s.heads / s.kv_heads;
    let item = groups * s.head_dim;
    let visible_work: usize = (0..s.batch * s.tokens)
        .map(|n| visible(&s, inputs, n).map_or(s.context, |(lo, hi)| hi - lo))
        .sum::<usize>()
        * s.heads
        * s.head_dim
        * 2;
    let run = |(index, out): (usize, &mut [f32])| {
        let (n, kv_head) = (index / s.kv_heads, index % s.kv_heads);
        pulp::Arch::new().dispatch(Item {
            shape: s,
            inputs,
            k,
            v,
            n,
            kv_head,
            out,
        });
    };
    if visible_work >= PARALLEL_MIN_WORK && s.batch * s.tokens * s.kv_heads > 1 {
        out.par_chunks_mut(item).enumerate().for_each(run);
    } else {
        out.chunks_mut(item).enumerate().for_each(run);
    }
    Ok(())
}

fn check(
    s: &AttentionShape,
    inputs: &AttentionInputs<'_>,
    k: &KvPool<'_>,
    v: &KvPool<'_>,
    out: usize,
) -> Result<(), AttentionError> {
    let geometry = |m: String| Err(AttentionError::Geometry(m));
    if s.heads == 0 || s.kv_heads == 0 || s.heads % s.kv_heads != 0 {
        return geometry(format!(
            "{} query heads over {} KV heads; the query heads must be a positive multiple of the KV heads",
            s.heads, s.kv_heads
        ));
    }
    if s.head_dim == 0 || s.num_blocks == 0 || s.block_size == 0 {
        return geometry(format!(
            "head dim {}, {} pages of {} slots; each must be positive",
            s.head_dim, s.num_blocks, s.block_size
        ));
    }
    if s.context == 0 || s.context % s.block_size != 0 {
        return geometry(format!(
            "a context of {} keys is not a positive multiple of the page size {}",
            s.context, s.block_size
        ));
    }
    if let (KvPool::F32(_), KvPool::Bf16(_)) | (KvPool::Bf16(_), KvPool::F32(_)) = (k, v) {
        return Err(AttentionError::MixedPools {
            k: k.dtype(),
            v: v.dtype(),
        });
    }
    let rows = s.batch * s.tokens;
    let pool = [s.num_blocks, s.block_size, s.kv_heads, s.head_dim];
    for (operand, dims, actual) in [
        (
            "q",
            vec![s.batch, s.tokens, s.heads, s.head_dim],
            inputs.q.len(),
        ),
        ("k", pool.to_vec(), k.len()),
        ("v", pool.to_vec(), v.len()),
        (
            "blockTables",
            vec![s.batch, s.context / s.block_size],
            inputs.block_tables.len(),
        ),
        ("positions", vec![s.batch, s.tokens], inputs.positions.len()),
        ("seqLens", vec![s.batch], inputs.seq_lens.len()),
        ("out", vec![s.batch, s.tokens, s.heads, s.head_dim], out),
    ] {
        let expected = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if expected != Some(actual) {
            return Err(AttentionError::Shape {
                operand,
                dims: format!("{dims:?}"),
                expected: expected.unwrap_or(usize::MAX),
                actual,
            });
        }
    }
    debug_assert_eq!(rows * s.heads * s.head_dim, out);
    Ok(())
}

/// The keys query row `n` (of `B * T`) sees, as `[lo, hi)`; `None` when it sees none.
fn visible(s: &AttentionShape, inputs: &AttentionInputs<'_>, n: usize) -> Option<(usize, usize)> {
    let position = i64::from(inputs.positions[n]);
    let seq_len = i64::from(inputs.seq_lens[n / s.tokens]);
    let context = s.context as i64;
    let hi = (position + 1).min(seq_len).min(context);
    let lo = match inputs.window {
        Some(window) => (position - window as i64 + 1).max(0),
        None => 0,
    };
    (lo < hi).then_some((lo as usize, hi as usize))
}

/// bf16 bits to f32, exactly.
#[inline(always)]
fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// `x` rounded to the nearest bf16 (ties to even) and widened back: XLA's f32 -> bf16 convert.
#[inline(always)]
fn round_to_bf16(x: f32) -> f32 {
    let bits = x.to_bits();
    if x.is_nan() {
        // Quiet NaN with the sign kept, as a convert produces.
        return f32::from_bits((bits | 0x0040_0000) & 0xffff_0000);
    }
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1));
    f32::from_bits(rounded & 0xffff_0000)
}

/// One query row and KV head: the `groups` query heads that share the KV head, written to `out`
/// (`[groups, headDim]`).
struct Item<'a, 'o> {
    shape: AttentionShape,
    inputs: &'a AttentionInputs<'a>,
    k: KvPool<'a>,
    v: KvPool<'a>,
    n: usize,
    kv_head: usize,
    out: &'o mut [f32],
}

/// How many keys ahead of the one being read its row is prefetched.
const PREFETCH_KEYS: usize = 8;

/// The element offsets of key positions `lo..hi`'s rows of one KV head in a pool, in order: the
/// page and slot are counted up, not divided out per key (the divisions by the page size were a
/// third of the kernel's time at a short context).
struct RowOffsets<'a> {
    table: &'a [i32],
    shape: AttentionShape,
    kv_head: usize,
    page: usize,
    slot: usize,
    left: usize,
}

impl<'a> RowOffsets<'a> {
    fn new(
        s: AttentionShape,
        inputs: &'a AttentionInputs<'a>,
        n: usize,
        kv_head: usize,
        (lo, hi): (usize, usize),
    ) -> Self {
        let pages = s.context / s.block_size;
        let b = n / s.tokens;
        RowOffsets {
            table: &inputs.block_tables[b * pages..][..pages],
            shape: s,
            kv_head,
            page: lo / s.block_size,
            slot: lo % s.block_size,
            left: hi - lo,
        }
    }
}

impl Iterator for RowOffsets<'_> {
    type Item = usize;

    #[inline(always)]
    fn next(&mut self) -> Option<usize> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let s = &self.shape;
        // An index past the pool is clamped into it, as XLA's gather clamps.
        let page = usize::try_from(self.table[self.page])
            .unwrap_or(0)
            .min(s.num_blocks - 1);
        let offset = ((page * s.block_size + self.slot) * s.kv_heads + self.kv_head) * s.head_dim;
        self.slot += 1;
        if self.slot == s.block_size {
            self.slot = 0;
            self.page += 1;
        }
        Some(offset)
    }
}

/// `pool`'s row at `offset` in f32: borrowed when the pool is f32, widened into `scratch` when bf16.
#[inline(always)]
fn pool_row<'r>(pool: &'r KvPool<'_>, offset: usize, scratch: &'r mut [f32]) -> &'r [f32] {
    let len = scratch.len();
    match pool {
        KvPool::F32(p) => &p[offset..][..len],
        KvPool::Bf16(p) => {
            for (dst, &src) in scratch.iter_mut().zip(&p[offset..][..len]) {
                *dst = bf16_to_f32(src);
            }
            scratch
        }
    }
}

#[inline(always)]
fn dot<S: Simd>(simd: S, a: &[f32], b: &[f32]) -> f32 {
    let (av, at) = S::as_simd_f32s(a);
    let (bv, bt) = S::as_simd_f32s(b);
    let mut acc = simd.splat_f32s(0.0);
    for (&x, &y) in av.iter().zip(bv) {
        acc = simd.mul_add_e_f32s(x, y, acc);
    }
    let mut sum = simd.reduce_sum_f32s(acc);
    for (x, y) in at.iter().zip(bt) {
        sum += x * y;
    }
    sum
}

/// `y += alpha * x`.
#[inline(always)]
fn axpy<S: Simd>(simd: S, alpha: f32, x: &[f32], y: &mut [f32]) {
    let a = simd.splat_f32s(alpha);
    let (yv, yt) = S::as_mut_simd_f32s(y);
    let (xv, xt) = S::as_simd_f32s(x);
    for (dst, &src) in yv.iter_mut().zip(xv) {
        *dst = simd.mul_add_e_f32s(a, src, *dst);
    }
    for (dst, src) in yt.iter_mut().zip(xt) {
        *dst += alpha * src;
    }
}

impl pulp::WithSimd for Item<'_, '_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let s = self.shape;
        let d = s.head_dim;
        let groups = s.heads / s.kv_heads;
        let bf16 = matches!(self.k, KvPool::Bf16(_));
        // The group's query heads, rounded as the portable body's dot takes them.
        let first = (self.n * s.heads + self.kv_head * groups) * d;
        let mut q: Vec<f32> = self.inputs.q[first..][..groups * d].to_vec();
        if bf16 {
            q.iter_mut().for_each(|x| *x = round_to_bf16(*x));
        }
        // A query that sees no key: the portable body's masked softmax weighs all C keys alike
        // (every score is the same lowest value), so take every key with score 0.
        let seen = visible(&s, self.inputs, self.n);
        let (lo, hi) = seen.unwrap_or((0, s.context));
        let keys = hi - lo;
        let mut scratch = vec![0.0f32; d];
        let mut scores = vec![0.0f32; groups * keys];
        let mut max = vec![f32::NEG_INFINITY; groups];
        // The rows of one KV head are strided through the pool and jump at every page, which the
        // hardware prefetcher follows poorly: the walk was bound by the pool's memory latency
        // (about 2.5 GB/s at a short context). Each row is prefetched a few keys ahead instead.
        let offsets: Vec<usize> =
            RowOffsets::new(s, self.inputs, self.n, self.kv_head, (lo, hi)).collect();
        let pf = Prefetch::new();
        if seen.is_some() {
            for (j, &offset) in offsets.iter().enumerate() {
                if let Some(&ahead) = offsets.get(j + PREFETCH_KEYS) {
                    self.k.prefetch(pf, ahead, d);
                }
                let row = pool_row(&self.k, offset, &mut scratch);
                for g in 0..groups {
                    let score = dot(simd, &q[g * d..][..d], row) * self.inputs.scale;
                    scores[g * keys + j] = score;
                    // Folded in key order as it is computed: the same maximum as a second pass.
                    max[g] = max[g].max(score);
                }
            }
        } else {
            max.fill(0.0);
        }
        // The first values load while the softmax runs.
        for &offset in offsets.iter().take(PREFETCH_KEYS) {
            self.v.prefetch(pf, offset, d);
        }
        for g in 0..groups {
            let p = &mut scores[g * keys..][..keys];
            let max = max[g];
            let mut sum = 0.0f32;
            for x in p.iter_mut() {
                *x = (*x - max).exp();
                sum += *x;
            }
            for x in p.iter_mut() {
                *x /= sum;
                if bf16 {
                    *x = round_to_bf16(*x);
                }
            }
        }
        self.out.fill(0.0);
        for (j, &offset) in offsets.iter().enumerate() {
            if let Some(&ahead) = offsets.get(j + PREFETCH_KEYS) {
                self.v.prefetch(pf, ahead, d);
            }
            let row = pool_row(&self.v, offset, &mut scratch);
            for g in 0..groups {
                axpy(simd, scores[g * keys + j], row, &mut self.out[g * d..][..d]);
            }
        }
    }
}
