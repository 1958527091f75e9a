//! Host tensors, a deterministic input generator, index arithmetic for the reference
//! computations, and the comparison of plugin results with references.

use tlaloc_hlo::{ConstData, GatherSpec, Module, Scalar, ScalarType, TensorType, bf16, f16};

/// A row-major host tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub dims: Vec<usize>,
    pub data: ConstData,
}

/// Row lookup as the embedding does: a table [rows, 3] indexed by ids [n] gives [n, 3].
pub fn embedding_spec() -> GatherSpec {
    GatherSpec {
        offset_dims: vec![1],
        collapsed_slice_dims: vec![0],
        start_index_map: vec![0],
        index_vector_dim: 1,
        slice_sizes: vec![1, 3],
        indices_are_sorted: false,
    }
}

pub fn t(dims: impl Into<Vec<usize>>, data: impl Into<ConstData>) -> Tensor {
    let t = Tensor {
        dims: dims.into(),
        data: data.into(),
    };
    assert_eq!(
        t.dims.iter().product::<usize>(),
        t.data.len(),
        "test tensor {:?} holds {} values",
        t.dims,
        t.data.len()
    );
    t
}

impl Tensor {
    pub fn ty(&self) -> TensorType {
        TensorType::new(self.data.dtype(), self.dims.clone())
    }

    /// Little-endian bytes as PJRT stores them (`i1` as one byte 0/1).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for i in 0..self.data.len() {
            match self.data.get(i).expect("index in range") {
                Scalar::F32(v) => out.extend(v.to_le_bytes()),
                Scalar::Bf16(v) => out.extend(v.to_le_bytes()),
                Scalar::F16(v) => out.extend(v.to_le_bytes()),
                Scalar::I32(v) => out.extend(v.to_le_bytes()),
                Scalar::I64(v) => out.extend(v.to_le_bytes()),
                Scalar::I8(v) => out.extend(v.to_le_bytes()),
                Scalar::U8(v) | Scalar::F8E4M3FN(v) => out.push(v),
                Scalar::Pred(v) => out.push(u8::from(v)),
            }
        }
        out
    }

    pub fn from_bytes(ty: &TensorType, bytes: &[u8]) -> Tensor {
        let n = ty.element_count().expect("small test tensor");
        let size = ty.dtype.byte_size();
        assert_eq!(
            bytes.len(),
            n * size,
            "{ty} read back as {} bytes",
            bytes.len()
        );
        let chunks = bytes.chunks_exact(size);
        let data = match ty.dtype {
            ScalarType::F32 => ConstData::F32(
                chunks
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            ScalarType::Bf16 => ConstData::Bf16(
                chunks
                    .map(|c| bf16::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            ScalarType::F16 => ConstData::F16(
                chunks
                    .map(|c| f16::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            ScalarType::I32 => ConstData::I32(
                chunks
                    .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            ScalarType::I64 => ConstData::I64(
                chunks
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            ScalarType::I8 => ConstData::I8(
                chunks
                    .map(|c| i8::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            ScalarType::U8 => ConstData::U8(bytes.to_vec()),
            ScalarType::F8E4M3FN => ConstData::F8E4M3FN(bytes.to_vec()),
            ScalarType::Pred => ConstData::Pred(bytes.iter().map(|&b| b != 0).collect()),
        };
        Tensor {
            dims: ty.dims.clone(),
            data,
        }
    }
}

/// How a result is compared with its reference.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Tolerance {
    /// Bit-identical (any NaN matches any NaN).
    Exact,
    /// `|got - want| <= abs + rel * |want|` for floats; integers stay exact.
    Close { rel: f64, abs: f64 },
}

/// A program, its inputs, and the reference outputs.
#[derive(Debug)]
pub struct Case {
    pub module: Module,
    pub inputs: Vec<Tensor>,
    pub expected: Vec<Tensor>,
    pub tolerance: Tolerance,
}

fn as_f64(s: Scalar) -> Option<f64> {
    match s {
        Scalar::F32(v) => Some(v.into()),
        Scalar::Bf16(v) => Some(v.into()),
        Scalar::F16(v) => Some(v.into()),
        _ => None,
    }
}

/// Describes every mismatch between `got` and `want` (at most a few), or `None`.
pub fn compare(got: &Tensor, want: &Tensor, tolerance: Tolerance) -> Option<String> {
    if got.dims != want.dims || got.data.dtype() != want.data.dtype() {
        return Some(format!(
            "type {} where the reference has {}",
            got.ty(),
            want.ty()
        ));
    }
    let mut bad = Vec::new();
    for i in 0..want.data.len() {
        let (g, w) = (got.data.get(i).unwrap(), want.data.get(i).unwrap());
        let ok = match (as_f64(g), as_f64(w)) {
            (Some(gf), Some(wf)) => {
                if gf.is_nan() || wf.is_nan() {
                    gf.is_nan() && wf.is_nan()
                } else {
                    match tolerance {
                        Tolerance::Exact => {
                            g == w && gf.is_sign_negative() == wf.is_sign_negative()
                        }
                        Tolerance::Close { rel, abs } => {
                            gf == wf || (gf - wf).abs() <= abs + rel * wf.abs()
                        }
                    }
                }
            }
            _ => g == w,
        };
        if !ok {
            bad.push(format!("[{i}] got {g:?}, want {w:?}"));
        }
    }
    if bad.is_empty() {
        None
    } else {
        let n = bad.len();
        bad.truncate(6);
        Some(format!("{n} elements differ: {}", bad.join("; ")))
    }
}

/// A fixed linear congruential generator: the same inputs on every run and machine.
#[derive(Debug)]
pub struct Lcg(u64);

impl Lcg {
    pub fn new(seed: u64) -> Lcg {
        Lcg(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u32(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) as u32
    }

    /// Uniform in `[lo, hi)`.
    pub fn f32s(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n)
            .map(|_| lo + (hi - lo) * (self.next_u32() as f32 / (1u64 << 31) as f32))
            .collect()
    }

    /// Uniform integers in `[lo, hi]`.
    pub fn i32s(&mut self, n: usize, lo: i32, hi: i32) -> Vec<i32> {
        let span = (hi - lo + 1) as u32;
        (0..n)
            .map(|_| lo + (self.next_u32() % span) as i32)
            .collect()
    }
}

/// Row-major strides of `dims`.
pub fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for d in (0..dims.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * dims[d + 1];
    }
    s
}

/// The multi-index of flat index `i`.
pub fn unravel(mut i: usize, dims: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; dims.len()];
    for d in (0..dims.len()).rev() {
        idx[d] = i % dims[d];
        i /= dims[d];
    }
    idx
}

pub fn ravel(idx: &[usize], dims: &[usize]) -> usize {
    idx.iter().zip(strides(dims)).map(|(i, s)| i * s).sum()
}

/// Builds a reference tensor of `dims` by evaluating `f` at each multi-index.
pub fn tabulate<T>(dims: &[usize], f: impl Fn(&[usize]) -> T) -> Vec<T> {
    let n: usize = dims.iter().product();
    (0..n).map(|i| f(&unravel(i, dims))).collect()
}
