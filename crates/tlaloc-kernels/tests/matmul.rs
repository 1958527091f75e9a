//! `matmul_xwt` against a scalar f64 reference on seeded random inputs, for f32, bf16, Q8_0, Q4_0,
//! Q4_1, Q5_0, Q4_K and Q6_K weights, odd shapes (not multiples of any SIMD width), and the shape
//! checks.
//!
//! Error bound. Every f32 input is exact in f64, and the reference sums the exact products in f64
//! (relative error ~1e-16, negligible here). The kernel forms each product once and adds it into an
//! f32 sum along some tree (lanes, accumulators, the final reduction, the scalar tail): each term
//! sees at most `n` roundings of unit roundoff `u = 2^-24`, so by the standard dot-product bound
//! (Higham, *Accuracy and Stability of Numerical Algorithms*, §3.1)
//!
//! `|y - y_ref| <= γ_n · Σ_k |x_k · w_k|`, with `γ_n = n·u / (1 - n·u)`,
//!
//! with `n = inner`: the weights reach the products exactly as f32 (widening bf16 is exact, a
//! Q8_0, Q4_0 or Q5_0 weight `d * code` has at most 11 + 8 significant bits, a Q6_K weight
//! `(d * scale) * code` at most 11 + 8 + 6). A Q4_1 weight is `d * code + m` and a Q4_K weight
//! `(d * sc) * code - dmin * mn`, each rounded once to f32, the value the dequantized matrix
//! holds: the reference takes that f32 (computed here from the block's definition) as the
//! weight, and the bound is the same.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tlaloc_kernels::{
    INT_DOT_MAX_ROWS, KernelError, Matrix, matmul_xwt, matmul_xwt_int8, round_activations,
};

const ROWS: [usize; 6] = [1, 2, 3, 5, 8, 17];
/// (inner, out): tiny, odd, just over a vector width, and a real projection width with odd out.
const SHAPES: [(usize, usize); 6] = [(1, 1), (7, 3), (17, 5), (67, 13), (129, 9), (576, 37)];

fn gamma(n: usize) -> f64 {
    let nu = n as f64 * f64::from(f32::EPSILON) / 2.0;
    nu / (1.0 - nu)
}

fn random_f32(rng: &mut StdRng, len: usize) -> Vec<f32> {
    (0..len).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

fn bf16_bits(v: f32) -> u16 {
    // Round to nearest even, as a checkpoint converter would (NaN never produced here).
    let b = v.to_bits();
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

fn bf16_value(b: u16) -> f64 {
    f64::from(f32::from_bits(u32::from(b) << 16))
}

/// IEEE binary16 decoded from its definition, independently of the kernel's bit manipulation.
fn f16_value(h: u16) -> f64 {
    let sign = if h >> 15 == 1 { -1.0 } else { 1.0 };
    let exp = i32::from((h >> 10) & 0x1f);
    let mant = f64::from(h & 0x3ff);
    assert!(exp != 0x1f, "test scales are finite");
    if exp == 0 {
        sign * mant * 2f64.powi(-24)
    } else {
        sign * (1.0 + mant / 1024.0) * 2f64.powi(exp - 15)
    }
}

/// Reference: y[n, o] and the bound's Σ|x w| for each entry, given the weights as f64.
fn reference(x: &[f32], rows: usize, inner: usize, w: &[f64], out: usize) -> (Vec<f64>, Vec<f64>) {
    let mut y = vec![0.0; rows * out];
    let mut mag = vec![0.0; rows * out];
    for n in 0..rows {
        for o in 0..out {
            let (mut s, mut a) = (0.0f64, 0.0f64);
            for k in 0..inner {
                let p = f64::from(x[n * inner + k]) * w[o * inner + k];
                s += p;
                a += p.abs();
            }
            y[n * out + o] = s;
            mag[n * out + o] = a;
        }
    }
    (y, mag)
}

fn assert_close(what: &str, got: &[f32], want: &[f64], mag: &[f64], n_terms: usize, out: usize) {
    let g = gamma(n_terms);
    for (idx, ((&y, &r), &m)) in got.iter().zip(want).zip(mag).enumerate() {
        let err = (f64::from(y) - r).abs();
        assert!(
            err <= g * m,
            "{what}: y[{}, {}] = {y}, reference {r}, |err| {err:e} > γ_{n_terms}·Σ|xw| = {:e}",
            idx / out,
            idx % out,
            g * m
        );
    }
}

#[test]
fn f32_weights_match_reference() {
    let mut rng = StdRng::seed_from_u64(32);
    for &(inner, out) in &SHAPES {
        let w = random_f32(&mut rng, out * inner);
        let w64: Vec<f64> = w.iter().map(|&v| f64::from(v)).collect();
        for &rows in &ROWS {
            let x = random_f32(&mut rng, rows * inner);
            let mut y = vec![f32::NAN; rows * out];
            matmul_xwt(&x, rows, inner, Matrix::F32(&w), out, &mut y).unwrap();
            let (want, mag) = reference(&x, rows, inner, &w64, out);
            let what = format!("f32 rows={rows} inner={inner} out={out}");
            assert_close(&what, &y, &want, &mag, inner, out);
        }
    }
}

#[test]
fn bf16_weights_match_reference() {
    let mut rng = StdRng::seed_from_u64(16);
    for &(inner, out) in &SHAPES {
        let w: Vec<u16> = random_f32(&mut rng, out * inner)
            .into_iter()
            .map(bf16_bits)
            .collect();
        let w64: Vec<f64> = w.iter().map(|&b| bf16_value(b)).collect();
        for &rows in &ROWS {
            let x = random_f32(&mut rng, rows * inner);
            let mut y = vec![f32::NAN; rows * out];
            matmul_xwt(&x, rows, inner, Matrix::Bf16(&w), out, &mut y).unwrap();
            let (want, mag) = reference(&x, rows, inner, &w64, out);
            let what = format!("bf16 rows={rows} inner={inner} out={out}");
            assert_close(&what, &y, &want, &mag, inner, out);
        }
    }
}

/// Random Q8_0 rows and their values: scales spread over f16's normal range around 2^-8 .. 2^4,
/// one block per matrix with a subnormal scale, codes over the whole i8 range.
fn random_q8_0(rng: &mut StdRng, out: usize, inner: usize) -> (Vec<u8>, Vec<f64>) {
    let blocks = out * inner / 32;
    let mut bytes = Vec::with_capacity(blocks * 34);
    let mut values = Vec::with_capacity(out * inner);
    for b in 0..blocks {
        let d: u16 = if b == blocks / 2 {
            rng.random_range(1..0x400) // subnormal
        } else {
            let sign = u16::from(rng.random::<bool>()) << 15;
            sign | (rng.random_range(7u16..19) << 10) | rng.random_range(0..0x400)
        };
        bytes.extend_from_slice(&d.to_le_bytes());
        let scale = f16_value(d);
        for _ in 0..32 {
            let q: i8 = rng.random();
            bytes.push(q as u8);
            values.push(scale * f64::from(q));
        }
    }
    (bytes, values)
}

/// The nibble-coded formats.
#[derive(Clone, Copy, PartialEq)]
enum Nibbles {
    Q4_0,
    Q4_1,
    Q5_0,
}

/// Random Q4_0, Q4_1 or Q5_0 rows and their values (f32, as a dequantized matrix holds them):
/// scales as in [`random_q8_0`], minimums of either sign, codes over all 16 (32) values.
fn random_q4(rng: &mut StdRng, out: usize, inner: usize, format: Nibbles) -> (Vec<u8>, Vec<f64>) {
    let with_min = format == Nibbles::Q4_1;
    let blocks = out * inner / 32;
    let mut bytes = Vec::new();
    let mut values = Vec::with_capacity(out * inner);
    let f16 = |rng: &mut StdRng| -> u16 {
        let sign = u16::from(rng.random::<bool>()) << 15;
        sign | (rng.random_range(7u16..19) << 10) | rng.random_range(0..0x400)
    };
    for b in 0..blocks {
        let d = if b == blocks / 2 {
            rng.random_range(1..0x400) // subnormal
        } else {
            f16(rng)
        };
        bytes.extend_from_slice(&d.to_le_bytes());
        let m = if with_min {
            let m = f16(rng);
            bytes.extend_from_slice(&m.to_le_bytes());
            f16_value(m) as f32
        } else {
            0.0
        };
        let qh: u32 = if format == Nibbles::Q5_0 {
            rng.random()
        } else {
            0
        };
        if format == Nibbles::Q5_0 {
            bytes.extend_from_slice(&qh.to_le_bytes());
        }
        let codes: [u8; 16] = rng.random();
        bytes.extend_from_slice(&codes);
        let d = f16_value(d) as f32;
        let (low, high) = (codes.map(|c| c & 0xF), codes.map(|c| c >> 4));
        for (e, q) in low.into_iter().chain(high).enumerate() {
            let q = f32::from(q);
            let v = match format {
                Nibbles::Q4_0 => d * (q - 8.0),
                Nibbles::Q4_1 => d * q + m,
                Nibbles::Q5_0 => d * (q + 16.0 * ((qh >> e) & 1) as f32 - 16.0),
            };
            values.push(f64::from(v));
        }
    }
    (bytes, values)
}

#[test]
fn q4_weights_match_reference() {
    let mut rng = StdRng::seed_from_u64(4);
    for format in [Nibbles::Q4_0, Nibbles::Q4_1, Nibbles::Q5_0] {
        for &(inner, out) in &[(32, 1), (32, 7), (96, 5), (576, 13), (1536, 3)] {
            let (w, w64) = random_q4(&mut rng, out, inner, format);
            let (name, matrix) = match format {
                Nibbles::Q4_0 => ("Q4_0", Matrix::Q4_0(&w)),
                Nibbles::Q4_1 => ("Q4_1", Matrix::Q4_1(&w)),
                Nibbles::Q5_0 => ("Q5_0", Matrix::Q5_0(&w)),
            };
            for &rows in &ROWS {
                let x = random_f32(&mut rng, rows * inner);
                let mut y = vec![f32::NAN; rows * out];
                matmul_xwt(&x, rows, inner, matrix, out, &mut y).unwrap();
                let (want, mag) = reference(&x, rows, inner, &w64, out);
                let what = format!("{name} rows={rows} inner={inner} out={out}");
                assert_close(&what, &y, &want, &mag, inner, out);
            }
        }
    }
}

/// The K-quant super-block formats.
#[derive(Clone, Copy, PartialEq)]
enum KQuant {
    Q4K,
    Q6K,
}

/// A random normal f16 of either sign, 2^-8 .. 2^4.
fn random_f16(rng: &mut StdRng) -> u16 {
    let sign = u16::from(rng.random::<bool>()) << 15;
    sign | (rng.random_range(7u16..19) << 10) | rng.random_range(0..0x400)
}

/// Random Q4_K or Q6_K rows and their values (f32, as a dequantized matrix holds them), decoded
/// element by element from llama.cpp's definitions (`dequantize_row_q4_K`, `dequantize_row_q6_K`):
/// every scale, min and code byte random, one super-block per matrix with a subnormal `d`.
fn random_k(rng: &mut StdRng, out: usize, inner: usize, format: KQuant) -> (Vec<u8>, Vec<f64>) {
    let blocks = out * inner / 256;
    let mut bytes = Vec::new();
    let mut values = Vec::with_capacity(out * inner);
    for b in 0..blocks {
        let d = if b == blocks / 2 {
            rng.random_range(1..0x400) // subnormal
        } else {
            random_f16(rng)
        };
        let d32 = f16_value(d) as f32;
        match format {
            KQuant::Q4K => {
                let dmin = random_f16(rng);
                let scales: [u8; 12] = rng.random();
                let mut qs = [0u8; 128];
                rng.fill(&mut qs[..]);
                bytes.extend_from_slice(&d.to_le_bytes());
                bytes.extend_from_slice(&dmin.to_le_bytes());
                bytes.extend_from_slice(&scales);
                bytes.extend_from_slice(&qs);
                let dmin = f16_value(dmin) as f32;
                for e in 0..256 {
                    let j = e / 32;
                    let (sc, mn) = if j < 4 {
                        (scales[j] & 63, scales[j + 4] & 63)
                    } else {
                        (
                            (scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4),
                            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
                        )
                    };
                    let q = (qs[32 * (j / 2) + e % 32] >> (4 * (j % 2))) & 0xF;
                    let v = d32 * f32::from(sc) * f32::from(q) - dmin * f32::from(mn);
                    values.push(f64::from(v));
                }
            }
            KQuant::Q6K => {
                let mut ql = [0u8; 128];
                let mut qh = [0u8; 64];
                rng.fill(&mut ql[..]);
                rng.fill(&mut qh[..]);
                let scales: [i8; 16] = rng.random();
                bytes.extend_from_slice(&ql);
                bytes.extend_from_slice(&qh);
                bytes.extend(scales.iter().map(|&s| s as u8));
                bytes.extend_from_slice(&d.to_le_bytes());
                for e in 0..256 {
                    let (h, r) = (e / 128, e % 128);
                    let low = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0xF;
                    let high = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
                    let code = i32::from(low | (high << 4)) - 32;
                    let v = d32 * f32::from(scales[e / 16]) * code as f32;
                    values.push(f64::from(v));
                }
            }
        }
    }
    (bytes, values)
}

#[test]
fn k_quant_weights_match_reference() {
    let mut rng = StdRng::seed_from_u64(256);
    for format in [KQuant::Q4K, KQuant::Q6K] {
        for &(inner, out) in &[(256, 1), (256, 7), (512, 5), (1536, 13)] {
            let (w, w64) = random_k(&mut rng, out, inner, format);
            let (name, matrix) = match format {
                KQuant::Q4K => ("Q4_K", Matrix::Q4_K(&w)),
                KQuant::Q6K => ("Q6_K", Matrix::Q6_K(&w)),
            };
            for &rows in &ROWS {
                let x = random_f32(&mut rng, rows * inner);
                let mut y = vec![f32::NAN; rows * out];
                matmul_xwt(&x, rows, inner, matrix, out, &mut y).unwrap();
                let (want, mag) = reference(&x, rows, inner, &w64, out);
                let what = format!("{name} rows={rows} inner={inner} out={out}");
                assert_close(&what, &y, &want, &mag, inner, out);
            }
        }
    }
}

#[test]
fn q8_0_weights_match_reference() {
    let mut rng = StdRng::seed_from_u64(8);
    for &(inner, out) in &[(32, 1), (32, 7), (96, 5), (576, 13), (1536, 3)] {
        let (w, w64) = random_q8_0(&mut rng, out, inner);
        for &rows in &ROWS {
            let x = random_f32(&mut rng, rows * inner);
            let mut y = vec![f32::NAN; rows * out];
            matmul_xwt(&x, rows, inner, Matrix::Q8_0(&w), out, &mut y).unwrap();
            let (want, mag) = reference(&x, rows, inner, &w64, out);
            let what = format!("Q8_0 rows={rows} inner={inner} out={out}");
            assert_close(&what, &y, &want, &mag, inner, out);
        }
    }
}

/// Large enough for the parallel path (over 128 KiB of weights), in pools of 1 and 4 threads: the
/// result is the reference's within the bound, and bit-identical however the rows are chunked
/// (each output's summation order does not depend on the chunking).
#[test]
fn parallel_chunks_match_reference_and_single_thread() {
    let mut rng = StdRng::seed_from_u64(7777);
    let (rows, inner, out) = (5, 1031, 71);
    let wf = random_f32(&mut rng, out * inner);
    let wb: Vec<u16> = wf.iter().map(|&v| bf16_bits(v)).collect();
    let (inner_q, out_q) = (1024, 163);
    let (wq, wq64) = random_q8_0(&mut rng, out_q, inner_q);
    let (w40, w40_64) = random_q4(&mut rng, out_q, inner_q, Nibbles::Q4_0);
    let (w41, w41_64) = random_q4(&mut rng, out_q, inner_q, Nibbles::Q4_1);
    let (w50, w50_64) = random_q4(&mut rng, out_q, inner_q, Nibbles::Q5_0);
    // Over 128 KiB of Q4_K too.
    let (inner_k, out_k) = (2048, 163);
    let (w4k, w4k_64) = random_k(&mut rng, out_k, inner_k, KQuant::Q4K);
    let (w6k, w6k_64) = random_k(&mut rng, out_k, inner_k, KQuant::Q6K);
    let x = random_f32(&mut rng, rows * inner);
    let xq = random_f32(&mut rng, rows * inner_q);
    let xk = random_f32(&mut rng, rows * inner_k);
    let f32_values = wf.iter().map(|&v| f64::from(v)).collect();
    let bf16_values = wb.iter().map(|&b| bf16_value(b)).collect();
    let cases = [
        ("f32", Matrix::F32(&wf), &x, inner, out, f32_values),
        ("bf16", Matrix::Bf16(&wb), &x, inner, out, bf16_values),
        ("Q8_0", Matrix::Q8_0(&wq), &xq, inner_q, out_q, wq64),
        ("Q4_0", Matrix::Q4_0(&w40), &xq, inner_q, out_q, w40_64),
        ("Q4_1", Matrix::Q4_1(&w41), &xq, inner_q, out_q, w41_64),
        ("Q5_0", Matrix::Q5_0(&w50), &xq, inner_q, out_q, w50_64),
        ("Q4_K", Matrix::Q4_K(&w4k), &xk, inner_k, out_k, w4k_64),
        ("Q6_K", Matrix::Q6_K(&w6k), &xk, inner_k, out_k, w6k_64),
    ];
    for (name, w, x, inner, out, w64) in cases {
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut y = vec![f32::NAN; rows * out];
            pool.install(|| matmul_xwt(x, rows, inner, w, out, &mut y))
                .unwrap();
            y
        };
        let (y1, y4) = (run(1), run(4));
        let (want, mag) = reference(x, rows, inner, &w64, out);
        assert_close(&format!("{name} 4 threads"), &y4, &want, &mag, inner, out);
        let bits = |y: &[f32]| y.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&y1), bits(&y4), "{name}: 1 vs 4 threads differ");
    }
}

#[test]
fn empty_dimensions() {
    let mut y = vec![f32::NAN; 6];
    matmul_xwt(&[], 2, 0, Matrix::F32(&[]), 3, &mut y).unwrap();
    assert_eq!(y, vec![0.0; 6], "inner = 0 gives zeros");
    matmul_xwt(&[], 0, 4, Matrix::Bf16(&[0; 12]), 3, &mut []).unwrap();
    matmul_xwt(&[0.0; 8], 2, 4, Matrix::F32(&[]), 0, &mut []).unwrap();
}

fn shape_err(r: Result<(), KernelError>) -> (&'static str, usize, usize, String) {
    match r {
        Err(e @ KernelError::Shape { .. }) => {
            let msg = e.to_string();
            let KernelError::Shape {
                operand,
                expected,
                actual,
                ..
            } = e
            else {
                unreachable!()
            };
            (operand, expected, actual, msg)
        }
        other => panic!("expected a shape error, got {other:?}"),
    }
}

#[test]
fn shape_mismatches_are_refused_by_operand() {
    let (rows, inner, out) = (2, 5, 3);
    let x = vec![0.0f32; rows * inner];
    let w = vec![0.0f32; out * inner];
    let mut y = vec![0.0f32; rows * out];

    let (op, want, got, msg) = shape_err(matmul_xwt(
        &x[1..],
        rows,
        inner,
        Matrix::F32(&w),
        out,
        &mut y,
    ));
    assert_eq!((op, want, got), ("x", 10, 9));
    assert!(
        msg.contains("`x`") && msg.contains("rows=2, inner=5"),
        "{msg}"
    );

    let (op, want, got, msg) = shape_err(matmul_xwt(
        &x,
        rows,
        inner,
        Matrix::Bf16(&[0u16; 14]),
        out,
        &mut y,
    ));
    assert_eq!((op, want, got), ("w", 15, 14));
    assert!(
        msg.contains("bf16") && msg.contains("out=3, inner=5"),
        "{msg}"
    );

    let (op, want, got, _) = shape_err(matmul_xwt(
        &x,
        rows,
        inner,
        Matrix::F32(&w),
        out,
        &mut y[..5],
    ));
    assert_eq!((op, want, got), ("y", 6, 5));

    let q = vec![0u8; 3 * 34];
    let (op, want, got, msg) = shape_err(matmul_xwt(
        &vec![0.0; 64],
        2,
        32,
        Matrix::Q8_0(&q[..100]),
        3,
        &mut y,
    ));
    assert_eq!((op, want, got), ("w", 102, 100));
    assert!(msg.contains("bytes"), "{msg}");

    let err = matmul_xwt(&vec![0.0; 66], 2, 33, Matrix::Q8_0(&q), 3, &mut y).unwrap_err();
    assert_eq!(
        err,
        KernelError::InnerNotBlockMultiple {
            format: "Q8_0",
            block_elements: 32,
            inner: 33
        }
    );
    assert!(err.to_string().contains("multiple of 32"), "{err}");

    let q4 = vec![0u8; 3 * 20];
    let (op, want, got, msg) = shape_err(matmul_xwt(
        &vec![0.0; 64],
        2,
        32,
        Matrix::Q4_1(&q4[..59]),
        3,
        &mut y,
    ));
    assert_eq!((op, want, got), ("w", 60, 59));
    assert!(msg.contains("Q4_1"), "{msg}");
    let (op, want, got, _) = shape_err(matmul_xwt(
        &vec![0.0; 64],
        2,
        32,
        Matrix::Q4_0(&q4),
        3,
        &mut y,
    ));
    assert_eq!((op, want, got), ("w", 54, 60));
    let err = matmul_xwt(&vec![0.0; 96], 2, 48, Matrix::Q4_0(&q4), 3, &mut y).unwrap_err();
    assert!(
        err.to_string()
            .contains("Q4_0 weights need inner to be a multiple of 32"),
        "{err}"
    );

    let err = matmul_xwt(&vec![0.0; 1024], 2, 512, Matrix::Q6_K(&[0; 420]), 3, &mut y).unwrap_err();
    let (op, want, got, msg) = shape_err(Err(err));
    assert_eq!((op, want, got), ("w", 3 * 2 * 210, 420));
    assert!(msg.contains("Q6_K") && msg.contains("blocks=2"), "{msg}");
    let err = matmul_xwt(&vec![0.0; 64], 2, 32, Matrix::Q4_K(&[0; 144]), 3, &mut y).unwrap_err();
    assert!(
        err.to_string()
            .contains("Q4_K weights need inner to be a multiple of 256"),
        "{err}"
    );

    let err = matmul_xwt(&x, usize::MAX, 2, Matrix::F32(&w), out, &mut y).unwrap_err();
    assert!(
        matches!(err, KernelError::Overflow { operand: "x", .. }),
        "{err:?}"
    );
}

/// Activation block rounding as `matmul_xwt_int8` documents it, written from that definition in
/// f32: `scale = max|x| / 127`, `code = round_half_even(x / scale)`.
fn round_block(x: &[f32]) -> (f32, Vec<i32>) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let scale = amax / 127.0;
    if scale == 0.0 {
        return (0.0, vec![0; x.len()]);
    }
    (
        scale,
        x.iter()
            .map(|v| (v / scale).round_ties_even() as i32)
            .collect(),
    )
}

/// Integer reference for `matmul_xwt_int8`: per output, the exact (f64) value of
/// `Σ_b d_w·s_b·Σ code_w·code_x (+ m_w·s_b·Σ code_x)` over the f32 scale products the kernel
/// forms, the magnitude `Σ_b |d_w·s_b|·Σ|code_w·code_x| + |m_w·s_b·Σ code_x|` of its terms, and the
/// rounding bound's term `Σ_b (s_b / 2)·Σ|w|` against the unrounded activations.
fn int8_reference(
    format: &str,
    w: &[u8],
    x: &[f32],
    rows: usize,
    inner: usize,
    out: usize,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let block_bytes = match format {
        "Q8_0" => 34,
        "Q4_0" => 18,
        _ => 20,
    };
    let blocks = inner / 32;
    let (mut y, mut mag, mut rounding) = (
        vec![0.0; rows * out],
        vec![0.0; rows * out],
        vec![0.0; rows * out],
    );
    for n in 0..rows {
        let rounded: Vec<(f32, Vec<i32>)> = x[n * inner..][..inner]
            .chunks(32)
            .map(round_block)
            .collect();
        for o in 0..out {
            let at = n * out + o;
            for (b, (s, qx)) in rounded.iter().enumerate() {
                let blk = &w[(o * blocks + b) * block_bytes..][..block_bytes];
                let h = |i: usize| u16::from_le_bytes([blk[i], blk[i + 1]]);
                let d = f16_value(h(0)) as f32;
                let (m, codes): (f32, Vec<i32>) = match format {
                    "Q8_0" => (0.0, blk[2..].iter().map(|&c| i32::from(c as i8)).collect()),
                    _ => {
                        let bytes = &blk[block_bytes - 16..];
                        let nib = bytes
                            .iter()
                            .map(|c| c & 0xF)
                            .chain(bytes.iter().map(|c| c >> 4));
                        if format == "Q4_0" {
                            (0.0, nib.map(|c| i32::from(c) - 8).collect())
                        } else {
                            (f16_value(h(2)) as f32, nib.map(i32::from).collect())
                        }
                    }
                };
                let isum: i64 = codes.iter().zip(qx).map(|(&c, &q)| i64::from(c * q)).sum();
                let iabs: i64 = codes
                    .iter()
                    .zip(qx)
                    .map(|(&c, &q)| i64::from((c * q).abs()))
                    .sum();
                let qsum: i64 = qx.iter().map(|&q| i64::from(q)).sum();
                let scale = f64::from(d * s);
                let min_term = f64::from(m) * f64::from(*s) * qsum as f64;
                y[at] += scale * isum as f64 + min_term;
                mag[at] += scale.abs() * iabs as f64 + min_term.abs();
                let wabs: f64 = codes
                    .iter()
                    .map(|&c| (f64::from(d) * f64::from(c) + f64::from(m)).abs())
                    .sum();
                rounding[at] += f64::from(*s) / 2.0 * wabs;
            }
        }
    }
    (y, mag, rounding)
}

/// `x` with each block rounded by the test's own definition ([`round_block`]), as f32
/// `scale · code`.
fn rounded_by_definition(x: &[f32]) -> Vec<f32> {
    x.chunks(32)
        .flat_map(|b| {
            let (scale, codes) = round_block(b);
            codes.into_iter().map(move |c| scale * c as f32)
        })
        .collect()
}

#[test]
fn activations_round_as_defined() {
    let mut rng = StdRng::seed_from_u64(87);
    let mut x = random_f32(&mut rng, 32 * 40);
    x[..32].fill(0.0);
    // Ties: 0.5 and 1.5 code steps from a block whose largest element is 127.
    x[32] = 127.0;
    x[33] = 0.5;
    x[34] = 1.5;
    x[35] = -2.5;
    let got = round_activations(&x);
    let want = rounded_by_definition(&x);
    assert_eq!(got, want);
    assert_eq!(&got[32..36], &[127.0, 0.0, 2.0, -2.0]);
}

/// `matmul_xwt_int8` against the integer reference (the integer dots, at most
/// `INT_DOT_MAX_ROWS` rows of Q8_0, Q4_0 and Q4_1), against the exact product of the rounded
/// activations (every other case), and against `matmul_xwt`'s exact reference of the unrounded
/// activations (all).
///
/// Error bound against the integer reference: the integer sums are exact (each pair of `|w| ≤
/// 128` by `|q| ≤ 127` fits i16, every lane sum is under 2^24), so only the f32 scaling and
/// summation round: the scale product once, the min term twice, the multiply-add into a lane once
/// per block, the lanes' sum up to 8 more: `γ_{blocks + 12} · mag`. The f32 path multiplies the
/// rounded activations, exact f32 values, so `matmul_xwt`'s bound `γ_inner · Σ|x̃ w|` holds. Against
/// the unrounded activations the rounding adds at most `Σ_b (s_b / 2)·Σ|w|` (each code is within
/// half a step, and no code is clamped: `|x / s| ≤ 127` up to one rounding), and `x̃`'s own
/// rounding `u · Σ|x̃ w|`.
#[test]
fn int8_dots_match_integer_reference_and_stay_within_the_rounding_bound() {
    let mut rng = StdRng::seed_from_u64(88);
    for format in ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q6_K"] {
        let shapes: &[(usize, usize)] = if format.ends_with("_K") {
            &[(256, 3), (512, 7), (1536, 5)]
        } else {
            &[(32, 1), (32, 7), (96, 5), (576, 13), (2048, 9)]
        };
        for &(inner, out) in shapes {
            let (w, w64) = match format {
                "Q8_0" => random_q8_0(&mut rng, out, inner),
                "Q4_0" => random_q4(&mut rng, out, inner, Nibbles::Q4_0),
                "Q4_1" => random_q4(&mut rng, out, inner, Nibbles::Q4_1),
                "Q5_0" => random_q4(&mut rng, out, inner, Nibbles::Q5_0),
                "Q4_K" => random_k(&mut rng, out, inner, KQuant::Q4K),
                _ => random_k(&mut rng, out, inner, KQuant::Q6K),
            };
            let matrix = match format {
                "Q8_0" => Matrix::Q8_0(&w),
                "Q4_0" => Matrix::Q4_0(&w),
                "Q4_1" => Matrix::Q4_1(&w),
                "Q5_0" => Matrix::Q5_0(&w),
                "Q4_K" => Matrix::Q4_K(&w),
                _ => Matrix::Q6_K(&w),
            };
            for &rows in &ROWS {
                let mut x = random_f32(&mut rng, rows * inner);
                // An all-zero block (scale 0) in the first row.
                x[..32].fill(0.0);
                let mut y = vec![f32::NAN; rows * out];
                matmul_xwt_int8(&x, rows, inner, matrix, out, &mut y).unwrap();
                let integer =
                    rows <= INT_DOT_MAX_ROWS && ["Q8_0", "Q4_0", "Q4_1"].contains(&format);
                let (want, mag, g) = if integer {
                    let (want, mag, _) = int8_reference(format, &w, &x, rows, inner, out);
                    (want, mag, gamma(inner / 32 + 12))
                } else {
                    let (want, mag) = reference(&rounded_by_definition(&x), rows, inner, &w64, out);
                    (want, mag, gamma(inner))
                };
                let rounding = rounding_bound(&x, rows, inner, &w64, out);
                let (exact, exact_mag) = reference(&x, rows, inner, &w64, out);
                for (at, &got) in y.iter().enumerate() {
                    let what = format!("{format} rows={rows} inner={inner} out={out} y[{at}]");
                    let err = (f64::from(got) - want[at]).abs();
                    assert!(
                        err <= g * mag[at],
                        "{what}: {got} vs reference {}, |err| {err:e} > {:e}",
                        want[at],
                        g * mag[at]
                    );
                    let moved = (f64::from(got) - exact[at]).abs();
                    let bound = rounding[at] + 2.0 * g * mag[at] + gamma(inner) * exact_mag[at];
                    assert!(
                        moved <= bound,
                        "{what}: {got} vs unrounded {}, moved {moved:e} > {bound:e}",
                        exact[at]
                    );
                }
            }
        }
    }
}

/// Per output, `Σ_b (s_b / 2) · Σ_{k in b} |w[o, k]|`: how far rounding the activations can move
/// it.
fn rounding_bound(x: &[f32], rows: usize, inner: usize, w: &[f64], out: usize) -> Vec<f64> {
    let mut bound = vec![0.0; rows * out];
    for n in 0..rows {
        let scales: Vec<f64> = x[n * inner..][..inner]
            .chunks(32)
            .map(|b| f64::from(round_block(b).0))
            .collect();
        for o in 0..out {
            let row = &w[o * inner..][..inner];
            bound[n * out + o] = row
                .chunks(32)
                .zip(&scales)
                .map(|(wb, s)| s / 2.0 * wb.iter().map(|v| v.abs()).sum::<f64>())
                .sum();
        }
    }
    bound
}

#[test]
fn int8_dots_propagate_non_finite_activations_and_refuse_dense_weights() {
    let mut rng = StdRng::seed_from_u64(89);
    let (inner, out) = (64, 3);
    let (w, _) = random_q8_0(&mut rng, out, inner);
    for rows in [2, INT_DOT_MAX_ROWS + 1] {
        let mut x = random_f32(&mut rng, rows * inner);
        x[inner + 40] = f32::INFINITY;
        let mut y = vec![0.0f32; rows * out];
        matmul_xwt_int8(&x, rows, inner, Matrix::Q8_0(&w), out, &mut y).unwrap();
        assert!(y[..out].iter().all(|v| v.is_finite()), "{y:?}");
        assert!(
            y[out..2 * out].iter().all(|v| v.is_nan()),
            "row 1 holds an infinity: {y:?}"
        );
    }

    let x = random_f32(&mut rng, 2 * inner);
    let mut y = vec![0.0f32; 2 * out];
    for (name, matrix) in [
        ("f32", Matrix::F32(&[0.0; 3 * 64])),
        ("bf16", Matrix::Bf16(&[0; 3 * 64])),
    ] {
        let err = matmul_xwt_int8(&x, 2, inner, matrix, out, &mut y).unwrap_err();
        assert_eq!(err, KernelError::NotBlockQuantized { format: name });
        let msg = err.to_string();
        assert!(
            msg.contains(name) && msg.contains("Q8_0, Q4_0, Q4_1"),
            "{msg}"
        );
    }
}
