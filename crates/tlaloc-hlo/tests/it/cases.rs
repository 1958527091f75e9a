//! One small program per op (or op family), with inputs and a Rust reference of its outputs.
//! The snapshot test prints each program; the execution test runs each on every CPU plugin.

use tlaloc_hlo::{
    CompareDirection as Dir, ConstData, DotDims, FunctionBuilder, GatherSpec, Precision, ReduceOp,
    ScalarType, ScatterSpec, ScatterUpdate, TensorType, Value, bf16, f16,
};

use crate::support::{Case, Lcg, Tensor, Tolerance, embedding_spec, t, tabulate, unravel};

/// Declares the cases: `ALL` lists them for the snapshot test, and `execute` has one test per
/// case that runs it on the plugins.
macro_rules! cases {
    ($($name:ident),* $(,)?) => {
        pub const ALL: &[(&str, fn() -> Case)] = &[$((stringify!($name), $name)),*];

        mod execute {
            $(
                #[test]
                fn $name() {
                    crate::execution::run_case(stringify!($name), super::$name);
                }
            )*
        }
    };
}

cases!(
    constants,
    splat_and_full,
    iota,
    binary_f32,
    binary_bf16,
    binary_i32,
    binary_logical,
    shifts_and_masks_u8,
    unary_exact_f32,
    unary_transcendental_f32,
    compare_float,
    compare_signed_unsigned,
    select_and_clamp,
    convert,
    bitcast_convert,
    quantize_i8_and_f8e4m3fn,
    broadcast_in_dim,
    reshape_transpose,
    dot_general_matmul_highest,
    dot_general_batched,
    dot_general_bf16_to_f32,
    reduce_sum_max_min,
    reduce_i32,
    argmax_f32,
    argmax_i32,
    gather_embedding,
    gather_general_clamped,
    gather_pages,
    scatter_replace_drops_out_of_bounds,
    scatter_add,
    dynamic_slice,
    dynamic_update_slice,
    concatenate,
    slice,
    donation_and_names,
    softmax_rows,
);

fn arg(f: &mut FunctionBuilder, x: &Tensor) -> Value {
    f.arg(x.ty())
}

fn exact(module: tlaloc_hlo::Module, inputs: Vec<Tensor>, expected: Vec<Tensor>) -> Case {
    Case {
        module,
        inputs,
        expected,
        tolerance: Tolerance::Exact,
    }
}

fn map_f32(x: &[f32], g: impl Fn(f32) -> f32) -> Vec<f32> {
    x.iter().map(|&v| g(v)).collect()
}

/// A rank-1 tensor holding `v`.
fn vector<T: Clone>(v: &[T]) -> Tensor
where
    Vec<T>: Into<ConstData>,
{
    t([v.len()], v.to_vec())
}

/// Declares one argument per tensor, in order.
fn args<const N: usize>(f: &mut FunctionBuilder, xs: [&Tensor; N]) -> [Value; N] {
    xs.map(|x| arg(f, x))
}

/// add, subtract, multiply, divide, maximum and minimum of `a` and `b`, in that order.
fn arithmetic(f: &mut FunctionBuilder, a: Value, b: Value) -> Vec<Value> {
    vec![
        f.add(a, b).unwrap(),
        f.sub(a, b).unwrap(),
        f.mul(a, b).unwrap(),
        f.div(a, b).unwrap(),
        f.max(a, b).unwrap(),
        f.min(a, b).unwrap(),
    ]
}

fn zip_with<A: Copy, B: Copy, R>(a: &[A], b: &[B], g: impl Fn(A, B) -> R) -> Vec<R> {
    a.iter().zip(b).map(|(&x, &y)| g(x, y)).collect()
}

pub fn constants() -> Case {
    let mut f = FunctionBuilder::new("constants");
    let f32s = vec![
        1.0,
        -0.0,
        1.0 / 3.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ];
    let bf16s: Vec<bf16> = [0.1f32, -2.5, 65504.0, 1e-3].map(bf16::from_f32).to_vec();
    let f16s: Vec<f16> = [0.1f32, -2.5, 65504.0, 1e-3].map(f16::from_f32).to_vec();
    let outputs = vec![
        t([2, 3], f32s),
        t([2, 2], bf16s),
        t([4], f16s),
        t([3], vec![i32::MIN, 0, i32::MAX]),
        t([2], vec![i64::MIN, i64::MAX]),
        t([3], vec![i8::MIN, -1, i8::MAX]),
        t([2], vec![0u8, 255]),
        t([2, 2], vec![true, false, false, true]),
        t([], vec![-7i32]),
        t([0, 3], Vec::<f32>::new()),
    ];
    let values: Vec<Value> = outputs
        .iter()
        .map(|o| f.constant(o.dims.clone(), o.data.clone()).unwrap())
        .collect();
    exact(f.finish(&values).unwrap(), vec![], outputs)
}

pub fn splat_and_full() -> Case {
    let mut f = FunctionBuilder::new("splat_and_full");
    let a = f.splat(-1.5f32, [2, 2]).unwrap();
    let b = f
        .full(&TensorType::new(ScalarType::Bf16, [3]), 0.1)
        .unwrap();
    let c = f
        .full(&TensorType::new(ScalarType::I64, [2]), -3.0)
        .unwrap();
    let d = f.splat(true, [2]).unwrap();
    let e = f.scalar(f32::NEG_INFINITY);
    let outputs = vec![
        t([2, 2], vec![-1.5f32; 4]),
        t([3], vec![bf16::from_f64(0.1); 3]),
        t([2], vec![-3i64; 2]),
        t([2], vec![true; 2]),
        t([], vec![f32::NEG_INFINITY]),
    ];
    exact(f.finish(&[a, b, c, d, e]).unwrap(), vec![], outputs)
}

pub fn iota() -> Case {
    let mut f = FunctionBuilder::new("iota");
    let a = f.iota(TensorType::new(ScalarType::I32, [3, 4]), 1).unwrap();
    let b = f.iota(TensorType::new(ScalarType::F32, [2, 3]), 0).unwrap();
    let dims_a = [3, 4];
    let dims_b = [2, 3];
    let outputs = vec![
        t(dims_a, tabulate(&dims_a, |i| i[1] as i32)),
        t(dims_b, tabulate(&dims_b, |i| i[0] as f32)),
    ];
    exact(f.finish(&[a, b]).unwrap(), vec![], outputs)
}

/// add, subtract, multiply, divide, maximum and minimum are correctly rounded in IEEE 754, so
/// the plugin must match Rust bit for bit.
pub fn binary_f32() -> Case {
    let mut rng = Lcg::new(1);
    let x = rng.f32s(16, -4.0, 4.0);
    let y = rng.f32s(16, -4.0, 4.0);
    let (tx, ty) = (t([4, 4], x.clone()), t([4, 4], y.clone()));
    let mut f = FunctionBuilder::new("binary_f32");
    let [a, b] = args(&mut f, [&tx, &ty]);
    let outs = arithmetic(&mut f, a, b);
    let m = f.finish(&outs).unwrap();
    let exact_refs = [
        zip_with(&x, &y, |a, b| a + b),
        zip_with(&x, &y, |a, b| a - b),
        zip_with(&x, &y, |a, b| a * b),
        zip_with(&x, &y, |a, b| a / b),
        zip_with(&x, &y, f32::max),
        zip_with(&x, &y, f32::min),
    ];
    let expected = exact_refs.into_iter().map(|r| t([4, 4], r)).collect();
    exact(m, vec![tx, ty], expected)
}

/// bf16 add, multiply and divide are correctly rounded: the exact result rounded once to bf16
/// (rounding through f32 first changes nothing, f32 carrying more than twice bf16's precision).
pub fn binary_bf16() -> Case {
    let mut rng = Lcg::new(12);
    let x: Vec<bf16> = rng
        .f32s(16, -8.0, 8.0)
        .into_iter()
        .map(bf16::from_f32)
        .collect();
    let y: Vec<bf16> = rng
        .f32s(16, 0.5, 8.0)
        .into_iter()
        .map(bf16::from_f32)
        .collect();
    let (tx, ty) = (vector(&x), vector(&y));
    let mut f = FunctionBuilder::new("binary_bf16");
    let [a, b] = args(&mut f, [&tx, &ty]);
    let outs = [
        f.add(a, b).unwrap(),
        f.mul(a, b).unwrap(),
        f.div(a, b).unwrap(),
    ];
    let zip = |g: fn(f32, f32) -> f32| {
        t(
            [16],
            zip_with(&x, &y, |p, q| bf16::from_f32(g(p.to_f32(), q.to_f32()))),
        )
    };
    let expected = vec![zip(|p, q| p + q), zip(|p, q| p * q), zip(|p, q| p / q)];
    exact(f.finish(&outs).unwrap(), vec![tx, ty], expected)
}

pub fn binary_i32() -> Case {
    let mut rng = Lcg::new(2);
    let x = rng.i32s(12, -1000, 1000);
    let mut y = rng.i32s(12, -50, 50);
    for v in &mut y {
        if *v == 0 {
            *v = 7;
        }
    }
    let (tx, ty) = (vector(&x), vector(&y));
    let mut f = FunctionBuilder::new("binary_i32");
    let [a, b] = args(&mut f, [&tx, &ty]);
    let mut outs = arithmetic(&mut f, a, b);
    outs.extend([f.neg(a).unwrap(), f.abs(b).unwrap()]);
    let zip = |g: fn(i32, i32) -> i32| -> Tensor { t([12], zip_with(&x, &y, g)) };
    let expected = vec![
        zip(|a, b| a + b),
        zip(|a, b| a - b),
        zip(|a, b| a * b),
        zip(|a, b| a / b),
        zip(i32::max),
        zip(i32::min),
        zip(|a, _| -a),
        zip(|_, b| b.abs()),
    ];
    exact(f.finish(&outs).unwrap(), vec![tx, ty], expected)
}

pub fn binary_logical() -> Case {
    let p = vec![true, true, false, false];
    let q = vec![true, false, true, false];
    let x = vec![0b1100i32, -1, 5, 0];
    let y = vec![0b1010i32, 3, -6, 9];
    let (tp, tq, tx, ty) = (vector(&p), vector(&q), vector(&x), vector(&y));
    let mut f = FunctionBuilder::new("binary_logical");
    let [a, b, c, d] = args(&mut f, [&tp, &tq, &tx, &ty]);
    let outs = [
        f.and(a, b).unwrap(),
        f.or(a, b).unwrap(),
        f.not(a).unwrap(),
        f.and(c, d).unwrap(),
        f.or(c, d).unwrap(),
        f.not(c).unwrap(),
    ];
    let zb = |g: fn(bool, bool) -> bool| t([4], zip_with(&p, &q, g));
    let zi = |g: fn(i32, i32) -> i32| t([4], zip_with(&x, &y, g));
    let expected = vec![
        zb(|a, b| a & b),
        zb(|a, b| a | b),
        zb(|a, _| !a),
        zi(|a, b| a & b),
        zi(|a, b| a | b),
        zi(|a, _| !a),
    ];
    exact(f.finish(&outs).unwrap(), vec![tp, tq, tx, ty], expected)
}

/// Nibbles of bytes (a Q4_0 block's codes): `x & 0xF` and `x >> 4`, and shifts by 0..8 both
/// ways (a count of 8 gives 0).
pub fn shifts_and_masks_u8() -> Case {
    let x: Vec<u8> = vec![0x00, 0x0F, 0xF0, 0xA5, 0xFF, 0x81, 0x7E, 0x3C];
    let n: Vec<u8> = (0..8).map(|i| i + 1).collect();
    let (tx, tn) = (vector(&x), vector(&n));
    let mut f = FunctionBuilder::new("shifts_and_masks_u8");
    let [a, b] = args(&mut f, [&tx, &tn]);
    let mask = f.splat(tlaloc_hlo::Scalar::U8(0x0F), [8]).unwrap();
    let four = f.splat(tlaloc_hlo::Scalar::U8(4), [8]).unwrap();
    let outs = [
        f.and(a, mask).unwrap(),
        f.shift_right_logical(a, four).unwrap(),
        f.shift_right_logical(a, b).unwrap(),
        f.shift_left(a, b).unwrap(),
    ];
    let shift = |g: fn(u8, u8) -> u8| t([8], zip_with(&x, &n, g));
    let expected = vec![
        t([8], x.iter().map(|v| v & 0x0F).collect::<Vec<_>>()),
        t([8], x.iter().map(|v| v >> 4).collect::<Vec<_>>()),
        shift(|v, k| v.checked_shr(u32::from(k)).unwrap_or(0)),
        shift(|v, k| v.checked_shl(u32::from(k)).unwrap_or(0)),
    ];
    exact(f.finish(&outs).unwrap(), vec![tx, tn], expected)
}

/// negate, abs and sqrt are exact in IEEE 754.
pub fn unary_exact_f32() -> Case {
    let mut rng = Lcg::new(3);
    let mut x = rng.f32s(10, -9.0, 9.0);
    x.extend([-0.0, f32::INFINITY]);
    let tx = t([12], x.clone());
    let mut f = FunctionBuilder::new("unary_exact_f32");
    let a = arg(&mut f, &tx);
    let abs = f.abs(a).unwrap();
    let outs = [f.neg(a).unwrap(), abs, f.sqrt(abs).unwrap()];
    let expected = vec![
        t([12], map_f32(&x, |v| -v)),
        t([12], map_f32(&x, f32::abs)),
        t([12], map_f32(&x, |v| v.abs().sqrt())),
    ];
    exact(f.finish(&outs).unwrap(), vec![tx], expected)
}

pub fn unary_transcendental_f32() -> Case {
    let mut rng = Lcg::new(4);
    let x = rng.f32s(16, -6.0, 6.0);
    let pos = rng.f32s(16, 0.01, 50.0);
    let (tx, tp) = (vector(&x), vector(&pos));
    let mut f = FunctionBuilder::new("unary_transcendental_f32");
    let [a, p] = args(&mut f, [&tx, &tp]);
    let outs = [
        f.exp(a).unwrap(),
        f.log(p).unwrap(),
        f.rsqrt(p).unwrap(),
        f.tanh(a).unwrap(),
        f.logistic(a).unwrap(),
        f.pow(p, a).unwrap(),
    ];
    let r = |v: &[f32], g: fn(f64) -> f64| {
        t(
            [16],
            v.iter().map(|&x| g(x.into()) as f32).collect::<Vec<_>>(),
        )
    };
    let expected = vec![
        r(&x, f64::exp),
        r(&pos, f64::ln),
        r(&pos, |v| 1.0 / v.sqrt()),
        r(&x, f64::tanh),
        r(&x, |v| 1.0 / (1.0 + (-v).exp())),
        t(
            [16],
            zip_with(&pos, &x, |b, e| f64::from(b).powf(e.into()) as f32),
        ),
    ];
    Case {
        module: f.finish(&outs).unwrap(),
        inputs: vec![tx, tp],
        expected,
        // XLA CPU's vectorised exp/log/tanh are accurate to a few ulp, not correctly rounded.
        tolerance: Tolerance::Close {
            rel: 1e-6,
            abs: 1e-7,
        },
    }
}

const DIRS: [Dir; 6] = [Dir::Eq, Dir::Ne, Dir::Lt, Dir::Le, Dir::Gt, Dir::Ge];

fn holds<T: PartialOrd>(d: Dir, a: T, b: T) -> bool {
    match d {
        Dir::Eq => a == b,
        Dir::Ne => a != b,
        Dir::Lt => a < b,
        Dir::Le => a <= b,
        Dir::Gt => a > b,
        Dir::Ge => a >= b,
    }
}

pub fn compare_float() -> Case {
    let x = vec![1.0f32, 2.0, -0.0, f32::NAN, 3.0, f32::NEG_INFINITY];
    let y = vec![1.0f32, -2.0, 0.0, 1.0, f32::NAN, -1.0];
    let (tx, ty) = (vector(&x), vector(&y));
    let mut f = FunctionBuilder::new("compare_float");
    let [a, b] = args(&mut f, [&tx, &ty]);
    let outs: Vec<Value> = DIRS.iter().map(|&d| f.compare(a, d, b).unwrap()).collect();
    let expected = DIRS
        .iter()
        .map(|&d| t([6], zip_with(&x, &y, |a, b| holds(d, a, b))))
        .collect();
    exact(f.finish(&outs).unwrap(), vec![tx, ty], expected)
}

/// 200u8 > 100u8 but 200 read as i8 is negative: the UNSIGNED compare type must be printed.
pub fn compare_signed_unsigned() -> Case {
    let xi = vec![-5i32, 3, 7, i32::MIN];
    let yi = vec![3i32, 3, -7, i32::MAX];
    let xu = vec![200u8, 0, 255, 100];
    let yu = vec![100u8, 0, 1, 200];
    let (txi, tyi, txu, tyu) = (vector(&xi), vector(&yi), vector(&xu), vector(&yu));
    let mut f = FunctionBuilder::new("compare_signed_unsigned");
    let [a, b, c, d] = args(&mut f, [&txi, &tyi, &txu, &tyu]);
    let mut outs = Vec::new();
    let mut expected = Vec::new();
    for dir in [Dir::Lt, Dir::Ge] {
        outs.push(f.compare(a, dir, b).unwrap());
        expected.push(t([4], zip_with(&xi, &yi, |p, q| holds(dir, p, q))));
        outs.push(f.compare(c, dir, d).unwrap());
        expected.push(t([4], zip_with(&xu, &yu, |p, q| holds(dir, p, q))));
    }
    exact(f.finish(&outs).unwrap(), vec![txi, tyi, txu, tyu], expected)
}

pub fn select_and_clamp() -> Case {
    let p = vec![true, false, true, false, false, true];
    let x = vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    let y = vec![-1.0f32, -2.0, -3.0, -4.0, -5.0, -6.0];
    let dims = [2, 3];
    let (tp, tx, ty) = (t(dims, p.clone()), t(dims, x.clone()), t(dims, y.clone()));
    let mut f = FunctionBuilder::new("select_and_clamp");
    let [pv, xv, yv] = args(&mut f, [&tp, &tx, &ty]);
    let chosen = f.select(pv, xv, yv).unwrap();
    let scalar_pred = f.scalar(false);
    let all_y = f.select(scalar_pred, xv, yv).unwrap();
    let lo = f.scalar(-2.5f32);
    let hi = f.scalar(4.5f32);
    let clamped = f.clamp(lo, chosen, hi).unwrap();
    let chosen_ref: Vec<f32> = (0..6).map(|i| if p[i] { x[i] } else { y[i] }).collect();
    let expected = vec![
        t(dims, chosen_ref.clone()),
        t(dims, y.clone()),
        t(dims, map_f32(&chosen_ref, |v| v.clamp(-2.5, 4.5))),
    ];
    exact(
        f.finish(&[chosen, all_y, clamped]).unwrap(),
        vec![tp, tx, ty],
        expected,
    )
}

/// Bytes reread as wider and same-width types, little-endian (a Q8_0 block's f16 scale and
/// i8 codes), and f32 reread as its bytes.
pub fn bitcast_convert() -> Case {
    let scales = [f16::from_f32(0.0123), f16::from_f32(-2.5), f16::MAX];
    let bytes: Vec<u8> = scales.iter().flat_map(|v| v.to_le_bytes()).collect();
    let codes: Vec<u8> = vec![0, 1, 127, 128, 255, 200];
    let floats = vec![1.5f32, -0.0];
    let (tb, tc, tf) = (t([3, 2], bytes), vector(&codes), vector(&floats));
    let mut f = FunctionBuilder::new("bitcast_convert");
    let [bv, cv, fv] = args(&mut f, [&tb, &tc, &tf]);
    let outs = [
        f.bitcast_convert(bv, ScalarType::F16).unwrap(),
        f.bitcast_convert(cv, ScalarType::I8).unwrap(),
        f.bitcast_convert(fv, ScalarType::U8).unwrap(),
    ];
    let expected = vec![
        t([3], scales.to_vec()),
        t([6], codes.iter().map(|&c| c as i8).collect::<Vec<_>>()),
        t(
            [2, 4],
            floats
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>(),
        ),
    ];
    exact(f.finish(&outs).unwrap(), vec![tb, tc, tf], expected)
}

/// Float narrowing rounds to nearest even (as `half` does); float to int truncates toward zero.
pub fn convert() -> Case {
    let mut rng = Lcg::new(5);
    let mut x = rng.f32s(10, -300.0, 300.0);
    x.extend([1.0 + f32::EPSILON, -0.5]);
    let b = vec![true, false];
    let i = vec![-3i32, 16_777_217];
    let (tx, tb, ti) = (vector(&x), vector(&b), vector(&i));
    let mut f = FunctionBuilder::new("convert");
    let [xv, bv, iv] = args(&mut f, [&tx, &tb, &ti]);
    let to_bf16 = f.convert(xv, ScalarType::Bf16).unwrap();
    let back = f.convert(to_bf16, ScalarType::F32).unwrap();
    let outs = [
        to_bf16,
        back,
        f.convert(xv, ScalarType::F16).unwrap(),
        f.convert(xv, ScalarType::I32).unwrap(),
        f.convert(bv, ScalarType::F32).unwrap(),
        f.convert(iv, ScalarType::F32).unwrap(),
        f.convert(iv, ScalarType::I64).unwrap(),
    ];
    let bf: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
    let expected = vec![
        t([12], bf.clone()),
        t([12], bf.iter().map(|v| v.to_f32()).collect::<Vec<_>>()),
        t(
            [12],
            x.iter().map(|&v| f16::from_f32(v)).collect::<Vec<_>>(),
        ),
        t([12], x.iter().map(|&v| v as i32).collect::<Vec<_>>()),
        t([2], vec![1.0f32, 0.0]),
        t([2], i.iter().map(|&v| v as f32).collect::<Vec<_>>()),
        t([2], i.iter().map(|&v| i64::from(v)).collect::<Vec<_>>()),
    ];
    exact(f.finish(&outs).unwrap(), vec![tx, tb, ti], expected)
}

/// The value of every finite e4m3 (`f8E4M3FN`) code: sign, 4 exponent bits of bias 7,
/// 3 mantissa bits (`S.1111.111` is NaN).
fn e4m3_codes() -> Vec<(u8, f64)> {
    (0u8..=255)
        .filter(|b| b & 0x7F != 0x7F)
        .map(|b| {
            let (e, m) = (i32::from((b >> 3) & 0x0F), f64::from(b & 0x07));
            let v = if e == 0 {
                m / 8.0 * 2f64.powi(-6)
            } else {
                (1.0 + m / 8.0) * 2f64.powi(e - 7)
            };
            (b, if b & 0x80 != 0 { -v } else { v })
        })
        .collect()
}

/// e4m3 by search over every code: the nearest, ties to the even code (+0 for 0).
fn to_e4m3(x: f32) -> u8 {
    let x = f64::from(x);
    let mut best = (f64::INFINITY, 0u8);
    for (bits, v) in e4m3_codes() {
        let d = (v - x).abs();
        let better = d < best.0 || (d == best.0 && bits & 1 == 0 && best.1 & 1 == 1);
        if better && !(v == 0.0 && bits == 0x80 && x >= 0.0) {
            best = (d, bits);
        }
    }
    best.1
}

/// The K/V write's quantization ops: `round_nearest_even`, the i8 conversion of clamped codes,
/// and f32 <-> `f8E4M3FN` both ways (values within e4m3's range, normals and subnormals).
pub fn quantize_i8_and_f8e4m3fn() -> Case {
    let mut rng = Lcg::new(11);
    let mut x = rng.f32s(12, -130.0, 130.0);
    x.extend([0.5, 1.5, 2.5, -2.5, 127.49, -0.003, 0.1, 3.3]);
    let n = x.len();
    let tx = vector(&x);
    let mut f = FunctionBuilder::new("quantize");
    let [xv] = args(&mut f, [&tx]);
    let rounded = f.round_nearest_even(xv).unwrap();
    let lo = f
        .full(&TensorType::new(ScalarType::F32, [n]), -127.0)
        .unwrap();
    let hi = f
        .full(&TensorType::new(ScalarType::F32, [n]), 127.0)
        .unwrap();
    let clamped = f.clamp(lo, rounded, hi).unwrap();
    let codes = f.convert(clamped, ScalarType::I8).unwrap();
    let e4m3 = f.convert(xv, ScalarType::F8E4M3FN).unwrap();
    let widened = f.convert(e4m3, ScalarType::F32).unwrap();
    let outs = [rounded, codes, e4m3, widened];
    let e4m3_bits: Vec<u8> = x.iter().map(|&v| to_e4m3(v)).collect();
    let values = e4m3_codes();
    let value_of = |bits: u8| values.iter().find(|(b, _)| *b == bits).unwrap().1 as f32;
    let expected = vec![
        t([n], map_f32(&x, f32::round_ties_even)),
        t(
            [n],
            x.iter()
                .map(|&v| v.round_ties_even().clamp(-127.0, 127.0) as i8)
                .collect::<Vec<_>>(),
        ),
        t([n], ConstData::F8E4M3FN(e4m3_bits.clone())),
        t(
            [n],
            e4m3_bits.iter().map(|&b| value_of(b)).collect::<Vec<_>>(),
        ),
    ];
    exact(f.finish(&outs).unwrap(), vec![tx], expected)
}

pub fn broadcast_in_dim() -> Case {
    let row = vec![1.0f32, 2.0, 3.0];
    let col = vec![10i32, 20, 30];
    let m: Vec<f32> = (0..6).map(|v| v as f32).collect();
    let (trow, tcol, tm) = (
        t([3], row.clone()),
        t([3, 1], col.clone()),
        t([2, 3], m.clone()),
    );
    let mut f = FunctionBuilder::new("broadcast_in_dim");
    let [r, c, mv] = args(&mut f, [&trow, &tcol, &tm]);
    let outs = [
        f.broadcast_in_dim(r, [2, 3], [1]).unwrap(),
        f.broadcast_in_dim(c, [3, 4], [0, 1]).unwrap(),
        // Operand dims go to result dims 1 and 0: a transposing broadcast.
        f.broadcast_in_dim(mv, [3, 2, 4], [1, 0]).unwrap(),
        f.broadcast_to(r, [2, 2, 3]).unwrap(),
    ];
    let expected = vec![
        t([2, 3], tabulate(&[2, 3], |i| row[i[1]])),
        t([3, 4], tabulate(&[3, 4], |i| col[i[0]])),
        t([3, 2, 4], tabulate(&[3, 2, 4], |i| m[i[1] * 3 + i[0]])),
        t([2, 2, 3], tabulate(&[2, 2, 3], |i| row[i[2]])),
    ];
    exact(f.finish(&outs).unwrap(), vec![trow, tcol, tm], expected)
}

pub fn reshape_transpose() -> Case {
    let x: Vec<i32> = (0..24).collect();
    let tx = t([2, 3, 4], x.clone());
    let mut f = FunctionBuilder::new("reshape_transpose");
    let a = arg(&mut f, &tx);
    let outs = [
        f.reshape(a, [6, 4]).unwrap(),
        f.transpose(a, [2, 0, 1]).unwrap(),
    ];
    let expected = vec![
        t([6, 4], x.clone()),
        t(
            [4, 2, 3],
            tabulate(&[4, 2, 3], |i| x[i[1] * 12 + i[2] * 4 + i[0]]),
        ),
    ];
    exact(f.finish(&outs).unwrap(), vec![tx], expected)
}

/// f64 reference of `dot_general` with batch dims `lb`/`rb` and contracting dims `lc`/`rc`.
fn dot_reference(
    l: &[f64],
    ld: &[usize],
    r: &[f64],
    rd: &[usize],
    dims: &DotDims,
) -> (Vec<usize>, Vec<f64>) {
    let lfree: Vec<usize> = (0..ld.len())
        .filter(|d| !dims.lhs_batch.contains(d) && !dims.lhs_contract.contains(d))
        .collect();
    let rfree: Vec<usize> = (0..rd.len())
        .filter(|d| !dims.rhs_batch.contains(d) && !dims.rhs_contract.contains(d))
        .collect();
    let mut out_dims: Vec<usize> = dims.lhs_batch.iter().map(|&d| ld[d]).collect();
    out_dims.extend(lfree.iter().map(|&d| ld[d]));
    out_dims.extend(rfree.iter().map(|&d| rd[d]));
    let cdims: Vec<usize> = dims.lhs_contract.iter().map(|&d| ld[d]).collect();
    let ccount: usize = cdims.iter().product();
    let nb = dims.lhs_batch.len();
    let out = tabulate(&out_dims, |o| {
        let mut li = vec![0; ld.len()];
        let mut ri = vec![0; rd.len()];
        for k in 0..nb {
            li[dims.lhs_batch[k]] = o[k];
            ri[dims.rhs_batch[k]] = o[k];
        }
        for (k, &d) in lfree.iter().enumerate() {
            li[d] = o[nb + k];
        }
        for (k, &d) in rfree.iter().enumerate() {
            ri[d] = o[nb + lfree.len() + k];
        }
        (0..ccount)
            .map(|c| {
                let ci = unravel(c, &cdims);
                for k in 0..ci.len() {
                    li[dims.lhs_contract[k]] = ci[k];
                    ri[dims.rhs_contract[k]] = ci[k];
                }
                l[crate::support::ravel(&li, ld)] * r[crate::support::ravel(&ri, rd)]
            })
            .sum()
    });
    (out_dims, out)
}

fn dot_case(name: &str, ld: &[usize], rd: &[usize], dims: DotDims, seed: u64) -> Case {
    let mut rng = Lcg::new(seed);
    let l = rng.f32s(ld.iter().product(), -1.0, 1.0);
    let r = rng.f32s(rd.iter().product(), -1.0, 1.0);
    let (tl, tr) = (t(ld, l.clone()), t(rd, r.clone()));
    let mut f = FunctionBuilder::new(name);
    let [a, b] = args(&mut f, [&tl, &tr]);
    let out = f
        .dot_general(a, b, &dims, Some(Precision::Highest), None)
        .unwrap();
    let widen = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
    let (od, o) = dot_reference(&widen(&l), ld, &widen(&r), rd, &dims);
    Case {
        module: f.finish(&[out]).unwrap(),
        inputs: vec![tl, tr],
        expected: vec![t(od, o.iter().map(|&v| v as f32).collect::<Vec<_>>())],
        // f32 accumulation in the plugin's order against an f64 reference.
        tolerance: Tolerance::Close {
            rel: 1e-5,
            abs: 1e-6,
        },
    }
}

pub fn dot_general_matmul_highest() -> Case {
    dot_case(
        "dot_general_matmul_highest",
        &[3, 5],
        &[4, 3],
        // Contracting lhs dim 0 with rhs dim 1: neither is the usual last/first pair.
        DotDims::contracting(0, 1),
        6,
    )
}

pub fn dot_general_batched() -> Case {
    dot_case(
        "dot_general_batched",
        &[2, 3, 4, 5],
        &[2, 5, 4, 6],
        DotDims {
            lhs_batch: vec![0],
            rhs_batch: vec![0],
            lhs_contract: vec![2, 3],
            rhs_contract: vec![2, 1],
        },
        7,
    )
}

/// bf16 x bf16 accumulated into f32. Inputs are multiples of 1/8 in [-2, 2], so every product
/// and partial sum is exact in f32 and the result must match exactly.
pub fn dot_general_bf16_to_f32() -> Case {
    let mut rng = Lcg::new(8);
    let l: Vec<f32> = rng
        .i32s(2 * 8, -16, 16)
        .iter()
        .map(|&v| v as f32 / 8.0)
        .collect();
    let r: Vec<f32> = rng
        .i32s(8 * 3, -16, 16)
        .iter()
        .map(|&v| v as f32 / 8.0)
        .collect();
    let to_bf16 = |v: &[f32]| v.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>();
    let (tl, tr) = (t([2, 8], to_bf16(&l)), t([8, 3], to_bf16(&r)));
    let mut f = FunctionBuilder::new("dot_general_bf16_to_f32");
    let [a, b] = args(&mut f, [&tl, &tr]);
    let dims = DotDims::contracting(1, 0);
    let out = f
        .dot_general(a, b, &dims, Some(Precision::Highest), Some(ScalarType::F32))
        .unwrap();
    let widen = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
    let (od, o) = dot_reference(&widen(&l), &[2, 8], &widen(&r), &[8, 3], &dims);
    exact(
        f.finish(&[out]).unwrap(),
        vec![tl, tr],
        vec![t(od, o.iter().map(|&v| v as f32).collect::<Vec<_>>())],
    )
}

pub fn reduce_sum_max_min() -> Case {
    let mut rng = Lcg::new(9);
    let x = rng.f32s(24, -3.0, 3.0);
    let tx = t([2, 3, 4], x.clone());
    let mut f = FunctionBuilder::new("reduce_sum_max_min");
    let a = arg(&mut f, &tx);
    let init = f.scalar(0.5f32);
    let outs = [
        f.reduce_sum(a, [2]).unwrap(),
        f.reduce_max(a, [0, 2]).unwrap(),
        f.reduce_min(a, [1]).unwrap(),
        f.reduce(a, init, [0, 1, 2], ReduceOp::Sum).unwrap(),
    ];
    let at = |i: usize, j: usize, k: usize| x[i * 12 + j * 4 + k];
    let expected = vec![
        t(
            [2, 3],
            tabulate(&[2, 3], |o| {
                (0..4).map(|k| f64::from(at(o[0], o[1], k))).sum::<f64>() as f32
            }),
        ),
        t(
            [3],
            tabulate(&[3], |o| {
                (0..2)
                    .flat_map(|i| (0..4).map(move |k| (i, k)))
                    .map(|(i, k)| at(i, o[0], k))
                    .fold(f32::NEG_INFINITY, f32::max)
            }),
        ),
        t(
            [2, 4],
            tabulate(&[2, 4], |o| {
                (0..3)
                    .map(|j| at(o[0], j, o[1]))
                    .fold(f32::INFINITY, f32::min)
            }),
        ),
        t(
            [],
            vec![(0.5 + x.iter().map(|&v| f64::from(v)).sum::<f64>()) as f32],
        ),
    ];
    Case {
        module: f.finish(&outs).unwrap(),
        inputs: vec![tx],
        expected,
        // Sums in f32 in the plugin's order against an f64 reference; max/min are exact.
        tolerance: Tolerance::Close {
            rel: 1e-5,
            abs: 1e-5,
        },
    }
}

pub fn reduce_i32() -> Case {
    let mut rng = Lcg::new(10);
    let x = rng.i32s(15, -100, 100);
    let tx = t([3, 5], x.clone());
    let mut f = FunctionBuilder::new("reduce_i32");
    let a = arg(&mut f, &tx);
    let outs = [f.reduce_sum(a, [1]).unwrap(), f.reduce_max(a, [0]).unwrap()];
    let expected = vec![
        t(
            [3],
            tabulate(&[3], |o| (0..5).map(|k| x[o[0] * 5 + k]).sum::<i32>()),
        ),
        t(
            [5],
            tabulate(&[5], |o| (0..3).map(|i| x[i * 5 + o[0]]).max().unwrap()),
        ),
    ];
    exact(f.finish(&outs).unwrap(), vec![tx], expected)
}

/// torch.argmax's answer: the first index of the maximum, NaN counting above every number.
fn first_argmax(row: &[f32]) -> (f32, i32) {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        let b = row[best];
        if !b.is_nan() && (v.is_nan() || v > b) {
            best = i;
        }
    }
    (row[best], best as i32)
}

pub fn argmax_f32() -> Case {
    let nan = f32::NAN;
    let ninf = f32::NEG_INFINITY;
    #[rustfmt::skip]
    let x = vec![
        1.0, 3.0, 2.0, 3.0, 0.0, 3.0, -1.0, 3.0,   // tie: the first 3.0 wins
        ninf, ninf, ninf, ninf, ninf, ninf, ninf, ninf, // all -inf: index 0
        0.0, 1.0, nan, 5.0, nan, 2.0, 1.0, 0.0,    // NaN wins, the first one
        -2.0, -1.0, -3.0, -1.0, -5.0, -9.0, -1.5, -1.0,
        0.5, 0.25, 0.5, 0.125, 0.0, 0.0, 0.0, 0.5,
    ];
    let tx = t([5, 8], x.clone());
    let mut f = FunctionBuilder::new("argmax_f32");
    let a = arg(&mut f, &tx);
    let (values, indices) = f.argmax(a, 1, ScalarType::I32).unwrap();
    let (vals, idx): (Vec<f32>, Vec<i32>) = x.chunks(8).map(first_argmax).unzip();
    exact(
        f.finish(&[values, indices]).unwrap(),
        vec![tx],
        vec![t([5], vals), t([5], idx)],
    )
}

/// Argmax along a leading axis, with a 64-bit index and many ties.
pub fn argmax_i32() -> Case {
    let mut rng = Lcg::new(11);
    let x = rng.i32s(4 * 6, 0, 2);
    let tx = t([4, 6], x.clone());
    let mut f = FunctionBuilder::new("argmax_i32");
    let a = arg(&mut f, &tx);
    let (values, indices) = f.argmax(a, 0, ScalarType::I64).unwrap();
    let col = |j: usize| (0..4).map(|i| x[i * 6 + j]).collect::<Vec<_>>();
    let vals: Vec<i32> = (0..6).map(|j| *col(j).iter().max().unwrap()).collect();
    let idx: Vec<i64> = (0..6)
        .map(|j| col(j).iter().position(|&v| v == vals[j]).unwrap() as i64)
        .collect();
    exact(
        f.finish(&[values, indices]).unwrap(),
        vec![tx],
        vec![t([6], vals), t([6], idx)],
    )
}

/// Row lookup as the embedding does: table [5, 3], ids [4] -> [4, 3].
pub fn gather_embedding() -> Case {
    let table: Vec<f32> = (0..15).map(|v| v as f32 * 0.5).collect();
    let ids = vec![4i32, 0, 2, 2];
    let (tt, ti) = (t([5, 3], table.clone()), t([4], ids.clone()));
    let mut f = FunctionBuilder::new("gather_embedding");
    let [a, b] = args(&mut f, [&tt, &ti]);
    let out = f.gather(a, b, &embedding_spec()).unwrap();
    let expected = t(
        [4, 3],
        tabulate(&[4, 3], |o| table[ids[o[0]] as usize * 3 + o[1]]),
    );
    exact(f.finish(&[out]).unwrap(), vec![tt, ti], vec![expected])
}

/// 2-D start indices taking [2, 3] windows of a [4, 5] operand; a start past the edge is
/// clamped so the window stays inside, as StableHLO specifies.
pub fn gather_general_clamped() -> Case {
    let x: Vec<i32> = (0..20).collect();
    let starts = vec![1i32, 2, 3, 4, -1, 0];
    let (tx, ts) = (t([4, 5], x.clone()), t([3, 2], starts.clone()));
    let mut f = FunctionBuilder::new("gather_general_clamped");
    let [a, b] = args(&mut f, [&tx, &ts]);
    let spec = GatherSpec {
        offset_dims: vec![1, 2],
        collapsed_slice_dims: vec![],
        start_index_map: vec![0, 1],
        index_vector_dim: 1,
        slice_sizes: vec![2, 3],
        indices_are_sorted: false,
    };
    let out = f.gather(a, b, &spec).unwrap();
    let expected = t(
        [3, 2, 3],
        tabulate(&[3, 2, 3], |o| {
            let r0 = starts[o[0] * 2].clamp(0, 4 - 2) as usize;
            let c0 = starts[o[0] * 2 + 1].clamp(0, 5 - 3) as usize;
            x[(r0 + o[1]) * 5 + c0 + o[2]]
        }),
    );
    exact(f.finish(&[out]).unwrap(), vec![tx, ts], vec![expected])
}

/// The paged-attention page gather: pool [blocks 6, block 2, heads 1, dim 3] and block tables
/// [batch 2, pages 3] give [2, 3, 2, 1, 3].
pub fn gather_pages() -> Case {
    let pool: Vec<f32> = (0..36).map(|v| v as f32).collect();
    let tables = vec![5i32, 1, 0, 2, 2, 3];
    let (tp, tt) = (t([6, 2, 1, 3], pool.clone()), t([2, 3], tables.clone()));
    let mut f = FunctionBuilder::new("gather_pages");
    let [a, b] = args(&mut f, [&tp, &tt]);
    let spec = GatherSpec {
        offset_dims: vec![2, 3, 4],
        collapsed_slice_dims: vec![0],
        start_index_map: vec![0],
        index_vector_dim: 2,
        slice_sizes: vec![1, 2, 1, 3],
        indices_are_sorted: false,
    };
    let out = f.gather(a, b, &spec).unwrap();
    let expected = t(
        [2, 3, 2, 1, 3],
        tabulate(&[2, 3, 2, 1, 3], |o| {
            pool[tables[o[0] * 3 + o[1]] as usize * 6 + o[2] * 3 + o[3] * 3 + o[4]]
        }),
    );
    exact(f.finish(&[out]).unwrap(), vec![tp, tt], vec![expected])
}

/// The KV write: rows of `updates` replace pool slots; slot -1 (and one past the end) is out
/// of bounds and writes nothing.
pub fn scatter_replace_drops_out_of_bounds() -> Case {
    let pool: Vec<f32> = (0..18).map(|v| v as f32).collect();
    let slots = vec![4i32, -1, 0, 6];
    let updates: Vec<f32> = (0..12).map(|v| -(v as f32) - 1.0).collect();
    let (tp, ts, tu) = (
        t([6, 3], pool.clone()),
        t([4, 1], slots.clone()),
        t([4, 3], updates.clone()),
    );
    let mut f = FunctionBuilder::new("scatter_replace_drops_out_of_bounds");
    let [a, b, c] = args(&mut f, [&tp, &ts, &tu]);
    let spec = ScatterSpec {
        unique_indices: true,
        ..ScatterSpec::leading_dim(vec![1], ScatterUpdate::Replace)
    };
    let out = f.scatter(a, b, c, &spec).unwrap();
    let mut want = pool.clone();
    for (k, &s) in slots.iter().enumerate() {
        if (0..6).contains(&s) {
            want[s as usize * 3..s as usize * 3 + 3].copy_from_slice(&updates[k * 3..k * 3 + 3]);
        }
    }
    exact(
        f.finish(&[out]).unwrap(),
        vec![tp, ts, tu],
        vec![t([6, 3], want)],
    )
}

/// Duplicate indices accumulate. Small integers keep every sum exact in any order.
pub fn scatter_add() -> Case {
    let x = vec![1.0f32, 2.0, 3.0, 4.0, 5.0];
    let idx = vec![1i32, 3, 1, 1, 4];
    let upd = vec![10.0f32, 20.0, 30.0, 40.0, 50.0];
    let (tx, ti, tu) = (vector(&x), vector(&idx), vector(&upd));
    let mut f = FunctionBuilder::new("scatter_add");
    let [a, b, c] = args(&mut f, [&tx, &ti, &tu]);
    // index_vector_dim = rank(indices): each index is an implicit 1-vector.
    let spec = ScatterSpec::leading_dim(vec![], ScatterUpdate::Add);
    let out = f.scatter(a, b, c, &spec).unwrap();
    let mut want = x.clone();
    for (k, &i) in idx.iter().enumerate() {
        want[i as usize] += upd[k];
    }
    exact(
        f.finish(&[out]).unwrap(),
        vec![tx, ti, tu],
        vec![t([5], want)],
    )
}

pub fn dynamic_slice() -> Case {
    let x: Vec<i32> = (0..20).collect();
    let tx = t([4, 5], x.clone());
    let (r, c) = (t([], vec![1i32]), t([], vec![4i32]));
    let mut f = FunctionBuilder::new("dynamic_slice");
    let [a, rv, cv] = args(&mut f, [&tx, &r, &c]);
    let out = f.dynamic_slice(a, &[rv, cv], [2, 3]).unwrap();
    // Column start 4 is clamped to 5 - 3 = 2.
    let expected = t([2, 3], tabulate(&[2, 3], |o| x[(1 + o[0]) * 5 + 2 + o[1]]));
    exact(f.finish(&[out]).unwrap(), vec![tx, r, c], vec![expected])
}

pub fn dynamic_update_slice() -> Case {
    let x = vec![0.0f32; 12];
    let u = vec![1.0f32, 2.0, 3.0, 4.0];
    let (tx, tu) = (t([3, 4], x), t([2, 2], u.clone()));
    let (r, c) = (t([], vec![2i32]), t([], vec![1i32]));
    let mut f = FunctionBuilder::new("dynamic_update_slice");
    let [a, b, rv, cv] = args(&mut f, [&tx, &tu, &r, &c]);
    let out = f.dynamic_update_slice(a, b, &[rv, cv]).unwrap();
    // Row start 2 is clamped to 3 - 2 = 1.
    let expected = t(
        [3, 4],
        tabulate(&[3, 4], |o| {
            if (1..3).contains(&o[0]) && (1..3).contains(&o[1]) {
                u[(o[0] - 1) * 2 + o[1] - 1]
            } else {
                0.0
            }
        }),
    );
    exact(
        f.finish(&[out]).unwrap(),
        vec![tx, tu, r, c],
        vec![expected],
    )
}

pub fn concatenate() -> Case {
    let a: Vec<i32> = (0..4).collect();
    let b: Vec<i32> = (10..16).collect();
    let (ta, tb) = (t([2, 2], a.clone()), t([2, 3], b.clone()));
    let mut f = FunctionBuilder::new("concatenate");
    let [av, bv] = args(&mut f, [&ta, &tb]);
    let out = f.concatenate(&[av, bv, av], 1).unwrap();
    let expected = t(
        [2, 7],
        tabulate(&[2, 7], |o| match o[1] {
            0..2 => a[o[0] * 2 + o[1]],
            2..5 => b[o[0] * 3 + o[1] - 2],
            _ => a[o[0] * 2 + o[1] - 5],
        }),
    );
    exact(f.finish(&[out]).unwrap(), vec![ta, tb], vec![expected])
}

pub fn slice() -> Case {
    let x: Vec<i32> = (0..30).collect();
    let tx = t([5, 6], x.clone());
    let mut f = FunctionBuilder::new("slice");
    let a = arg(&mut f, &tx);
    let out = f.slice(a, [1, 0], [5, 5], [2, 3]).unwrap();
    let expected = t(
        [2, 2],
        tabulate(&[2, 2], |o| x[(1 + 2 * o[0]) * 6 + 3 * o[1]]),
    );
    exact(f.finish(&[out]).unwrap(), vec![tx], vec![expected])
}

/// A donated, named pool updated in place next to a borrowed input.
pub fn donation_and_names() -> Case {
    let pool = vec![1.0f32, 2.0, 3.0, 4.0];
    let delta = vec![0.5f32, 0.5, -1.0, 2.0];
    let (tp, td) = (vector(&pool), vector(&delta));
    let mut f = FunctionBuilder::new("donation_and_names");
    let d = f.arg_named("delta", td.ty()).unwrap();
    let p = f.arg_named("kvPool[0]", tp.ty()).unwrap();
    f.donate(p, 1).unwrap();
    let sum = f.reduce_sum(d, [0]).unwrap();
    let updated = f.add(p, d).unwrap();
    let expected = vec![
        t([], vec![delta.iter().sum::<f32>()]),
        t([4], zip_with(&pool, &delta, |a, b| a + b)),
    ];
    exact(f.finish(&[sum, updated]).unwrap(), vec![td, tp], expected)
}

/// Ops composed as the attention softmax is: row max, shift, exp, row sum, divide; reduced rows
/// are brought back to [rows, 1] and broadcast.
pub fn softmax_rows() -> Case {
    let mut rng = Lcg::new(13);
    let mut x = rng.f32s(15, -20.0, 20.0);
    x[5] = f32::NEG_INFINITY;
    let tx = t([3, 5], x.clone());
    let mut f = FunctionBuilder::new("softmax_rows");
    let a = arg(&mut f, &tx);
    let row_max = f.reduce_max(a, [1]).unwrap();
    let row_max = f.reshape(row_max, [3, 1]).unwrap();
    let row_max = f.broadcast_to(row_max, [3, 5]).unwrap();
    let shifted = f.sub(a, row_max).unwrap();
    let e = f.exp(shifted).unwrap();
    let total = f.reduce_sum(e, [1]).unwrap();
    let total = f.reshape(total, [3, 1]).unwrap();
    let total = f.broadcast_to(total, [3, 5]).unwrap();
    let out = f.div(e, total).unwrap();
    let want: Vec<f32> = x
        .chunks(5)
        .flat_map(|row| {
            let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f64> = row.iter().map(|&v| f64::from(v - m).exp()).collect();
            let s: f64 = e.iter().sum();
            e.into_iter().map(move |v| (v / s) as f32)
        })
        .collect();
    Case {
        module: f.finish(&[out]).unwrap(),
        inputs: vec![tx],
        expected: vec![t([3, 5], want)],
        tolerance: Tolerance::Close {
            rel: 2e-6,
            abs: 1e-9,
        },
    }
}
