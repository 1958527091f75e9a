//! `paged_attention` against an f64 reference of the portable body's function on seeded random
//! pools, block tables, positions and lengths: grouped-query heads, head dims that are not a
//! multiple of any SIMD width, sliding windows, page indices past the pool (clamped, as XLA's
//! gather clamps), queries that see no key, every output element written; and the refusals.
//!
//! The reference does what the portable body does, literally: it gathers every row's whole
//! context of `C` keys through the block table, scores all of them, replaces the masked scores by
//! the lowest f32, and takes the softmax and the weighted sum over all `C` in f64.
//!
//! Error bound, per output element (Higham, *Accuracy and Stability of Numerical Algorithms*,
//! §3.1; `u = 2^-24`, `γ_n = n·u / (1 - n·u)`). A score is a dot of `D` exact f32 products summed
//! in f32 and multiplied by the scale: its error is at most `e_s = γ_{D+1} · |scale| · Σ_d |q_d
//! k_d|`. Subtracting the maximum doubles that; each exponential adds a relative 4u (`exp` is
//! within an ulp or two), their sum `γ_keys`, the division u, so every probability is within a
//! relative `δ = 2 · (2 e_s) + 4u + γ_keys + u` of the exact one, to first order (the bound
//! below is doubled for the second-order terms). The output sums `keys` products of a
//! probability and a value: `|o - o_ref| <= 2 (δ + γ_keys) · Σ_c p_c |v_c|`. With bf16 pools the
//! kernel rounds each probability to bf16, a relative error of up to 2^-8 more (q is rounded
//! before either side uses it, so it adds nothing).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tlaloc_kernels::{AttentionError, AttentionInputs, AttentionShape, KvPool, paged_attention};

fn gamma(n: usize) -> f64 {
    let nu = n as f64 * f64::from(f32::EPSILON) / 2.0;
    nu / (1.0 - nu)
}

/// f32 to the nearest bf16 (ties to even), as raw bits; finite inputs only.
fn bf16_bits(v: f32) -> u16 {
    let b = v.to_bits();
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

fn bf16_value(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// One random case: its shape and inputs.
struct Case {
    shape: AttentionShape,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    block_tables: Vec<i32>,
    positions: Vec<i32>,
    seq_lens: Vec<i32>,
    scale: f32,
    window: Option<usize>,
}

impl Case {
    fn inputs(&self) -> AttentionInputs<'_> {
        AttentionInputs {
            q: &self.q,
            block_tables: &self.block_tables,
            positions: &self.positions,
            seq_lens: &self.seq_lens,
            scale: self.scale,
            window: self.window,
        }
    }
}

fn random_case(rng: &mut StdRng, heads: usize, kv_heads: usize, head_dim: usize) -> Case {
    let batch = rng.random_range(1..=3);
    let tokens = rng.random_range(1..=4);
    let block_size = [1, 4, 5][rng.random_range(0..3)];
    let pages_per_row = rng.random_range(1..=5);
    let context = pages_per_row * block_size;
    let num_blocks = rng.random_range(2..=9);
    let shape = AttentionShape {
        batch,
        tokens,
        heads,
        kv_heads,
        head_dim,
        num_blocks,
        block_size,
        context,
    };
    let pool = num_blocks * block_size * kv_heads * head_dim;
    let mut values =
        |len: usize, r: f32| -> Vec<f32> { (0..len).map(|_| rng.random_range(-r..r)).collect() };
    let q = values(batch * tokens * heads * head_dim, 2.0);
    let k = values(pool, 2.0);
    let v = values(pool, 1.0);
    // Page indices mostly valid, sometimes past either end of the pool (clamped).
    let block_tables = (0..batch * pages_per_row)
        .map(|_| match rng.random_range(0..10) {
            0 => -3,
            1 => num_blocks as i32 + 4,
            _ => rng.random_range(0..num_blocks as i32),
        })
        .collect();
    let seq_lens: Vec<i32> = (0..batch)
        .map(|_| rng.random_range(1..=context as i32 + 2))
        .collect();
    // Mostly the positions a step has (below the length), sometimes past it or past the context.
    let positions = (0..batch * tokens)
        .map(|n| {
            let len = seq_lens[n / tokens];
            match rng.random_range(0..8) {
                0 => rng.random_range(0..context as i32 + 6),
                _ => rng.random_range(0..len),
            }
        })
        .collect();
    let window = match rng.random_range(0..3) {
        0 => Some(rng.random_range(1..=context + 1)),
        _ => None,
    };
    Case {
        shape,
        q,
        k,
        v,
        block_tables,
        positions,
        seq_lens,
        scale: rng.random_range(0.05f32..0.5),
        window,
    }
}

/// The reference output and the bound of each element, in the portable body's terms.
fn reference(case: &Case, bf16: bool) -> (Vec<f64>, Vec<f64>) {
    let s = case.shape;
    let (d, groups) = (s.head_dim, s.heads / s.kv_heads);
    let pages = s.context / s.block_size;
    let u = f64::from(f32::EPSILON) / 2.0;
    let mut out = vec![0.0; s.batch * s.tokens * s.heads * d];
    let mut bound = vec![0.0; out.len()];
    let (k, v): (Vec<f64>, Vec<f64>) = if bf16 {
        let r = |x: &f32| f64::from(bf16_value(bf16_bits(*x)));
        (
            case.k.iter().map(r).collect(),
            case.v.iter().map(r).collect(),
        )
    } else {
        (
            case.k.iter().map(|&x| f64::from(x)).collect(),
            case.v.iter().map(|&x| f64::from(x)).collect(),
        )
    };
    for n in 0..s.batch * s.tokens {
        let b = n / s.tokens;
        let position = i64::from(case.positions[n]);
        let seq_len = i64::from(case.seq_lens[b]);
        for h in 0..s.heads {
            let kv_head = h / groups;
            let q: Vec<f64> = case.q[(n * s.heads + h) * d..][..d]
                .iter()
                .map(|&x| {
                    if bf16 {
                        f64::from(bf16_value(bf16_bits(x)))
                    } else {
                        f64::from(x)
                    }
                })
                .collect();
            // The gathered context: key c's row through the (clamped) page of the table.
            let row = |c: usize| {
                let page = case.block_tables[b * pages + c / s.block_size]
                    .clamp(0, s.num_blocks as i32 - 1) as usize;
                ((page * s.block_size + c % s.block_size) * s.kv_heads + kv_head) * d
            };
            let lowest = f64::from(f32::MIN);
            let mut scores = Vec::with_capacity(s.context);
            let mut magnitude: f64 = 0.0;
            let mut keys = 0;
            for c in 0..s.context {
                let ci = c as i64;
                let seen = ci <= position
                    && ci < seq_len
                    && case.window.is_none_or(|w| ci > position - w as i64);
                let at = row(c);
                let dot: f64 = (0..d).map(|i| q[i] * k[at + i]).sum();
                let abs: f64 = (0..d).map(|i| (q[i] * k[at + i]).abs()).sum();
                if seen {
                    keys += 1;
                    magnitude = magnitude.max(abs * f64::from(case.scale));
                    scores.push(dot * f64::from(case.scale));
                } else {
                    scores.push(lowest);
                }
            }
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let exps: Vec<f64> = scores.iter().map(|&x| (x - max).exp()).collect();
            let sum: f64 = exps.iter().sum();
            let terms = if keys == 0 { s.context } else { keys };
            let e_s = gamma(d + 1) * magnitude;
            let mut delta = 4.0 * e_s + 4.0 * u + gamma(terms) + u;
            if bf16 {
                delta += 1.0 / 256.0;
            }
            let at = (n * s.heads + h) * d;
            for (c, e) in exps.iter().enumerate() {
                let p = e / sum;
                let r = row(c);
                for i in 0..d {
                    out[at + i] += p * v[r + i];
                    bound[at + i] += p * v[r + i].abs();
                }
            }
            for i in 0..d {
                bound[at + i] *= 2.0 * (delta + gamma(terms));
            }
        }
    }
    (out, bound)
}

fn run(case: &Case, bf16: bool) -> Result<Vec<f32>, AttentionError> {
    let kb: Vec<u16> = case.k.iter().map(|&x| bf16_bits(x)).collect();
    let vb: Vec<u16> = case.v.iter().map(|&x| bf16_bits(x)).collect();
    let (k, v) = if bf16 {
        (KvPool::Bf16(&kb), KvPool::Bf16(&vb))
    } else {
        (KvPool::F32(&case.k), KvPool::F32(&case.v))
    };
    let inputs = case.inputs();
    // Poisoned: an element the kernel does not write stays NaN and fails the comparison.
    let mut out = vec![f32::NAN; case.q.len()];
    paged_attention(&case.shape, &inputs, k, v, &mut out)?;
    Ok(out)
}

#[test]
fn paged_attention_matches_the_gathered_masked_softmax_of_the_portable_body() {
    let mut rng = StdRng::seed_from_u64(41);
    // (heads, kvHeads, headDim): multi-head, grouped, one KV head; odd and real head dims.
    let geometries = [
        (1, 1, 1),
        (3, 3, 7),
        (4, 2, 8),
        (6, 2, 17),
        (9, 3, 64),
        (8, 1, 33),
    ];
    let mut no_key_queries = 0;
    for &(heads, kv_heads, head_dim) in &geometries {
        for round in 0..12 {
            let case = random_case(&mut rng, heads, kv_heads, head_dim);
            for bf16 in [false, true] {
                let got = run(&case, bf16).unwrap();
                let (want, bound) = reference(&case, bf16);
                for (i, ((&g, &w), &b)) in got.iter().zip(&want).zip(&bound).enumerate() {
                    assert!(
                        (f64::from(g) - w).abs() <= b,
                        "{:?} window {:?} bf16 {bf16} round {round}: element {i} is {g}, the \
                         reference {w} (bound {b})",
                        case.shape,
                        case.window
                    );
                }
            }
            no_key_queries += (0..case.shape.batch * case.shape.tokens)
                .filter(|&n| {
                    let p = i64::from(case.positions[n]);
                    let hi = (p + 1)
                        .min(i64::from(case.seq_lens[n / case.shape.tokens]))
                        .min(case.shape.context as i64);
                    let lo = case.window.map_or(0, |w| (p - w as i64 + 1).max(0));
                    lo >= hi
                })
                .count();
        }
    }
    // The draws reach the uniform case (a query past its length by more than its window).
    assert!(
        no_key_queries > 0,
        "no query without a visible key was drawn"
    );
}

#[test]
fn paged_attention_refuses_what_is_not_paged_attention_by_name() {
    let mut rng = StdRng::seed_from_u64(7);
    let case = random_case(&mut rng, 4, 2, 8);
    let inputs = case.inputs();
    let pools = || (KvPool::F32(&case.k), KvPool::F32(&case.v));
    let mut out = vec![0.0f32; case.q.len()];

    let (k, v) = pools();
    let short = AttentionInputs {
        q: &case.q[1..],
        ..inputs
    };
    let err = paged_attention(&case.shape, &short, k, v, &mut out).unwrap_err();
    assert!(
        matches!(err, AttentionError::Shape { operand: "q", .. }),
        "{err}"
    );

    let bits: Vec<u16> = case.v.iter().map(|&x| bf16_bits(x)).collect();
    let err = paged_attention(
        &case.shape,
        &inputs,
        KvPool::F32(&case.k),
        KvPool::Bf16(&bits),
        &mut out,
    )
    .unwrap_err();
    assert_eq!(
        err,
        AttentionError::MixedPools {
            k: "f32",
            v: "bf16"
        }
    );

    let (k, v) = pools();
    let odd_heads = AttentionShape {
        heads: 3,
        ..case.shape
    };
    let err = paged_attention(&odd_heads, &inputs, k, v, &mut out).unwrap_err();
    assert!(
        err.to_string().contains("3 query heads over 2 KV heads"),
        "{err}"
    );

    let (k, v) = pools();
    let ragged = AttentionShape {
        block_size: case.shape.context + 1,
        ..case.shape
    };
    let err = paged_attention(&ragged, &inputs, k, v, &mut out).unwrap_err();
    assert!(
        err.to_string()
            .contains("not a positive multiple of the page size"),
        "{err}"
    );

    let (k, v) = pools();
    let mut long = vec![0.0f32; case.q.len() + 1];
    let err = paged_attention(&case.shape, &inputs, k, v, &mut long).unwrap_err();
    assert!(
        matches!(err, AttentionError::Shape { operand: "out", .. }),
        "{err}"
    );
}
