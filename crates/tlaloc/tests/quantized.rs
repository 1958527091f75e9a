//! GGUF Q8_0, Q4_0, Q4_1, Q5_0, Q4_K and Q6_K weights kept quantized, end to end on every test
//! plugin. The tiny Llama fixture's f32 weights are quantized to each 32-element format by a
//! scalar llama.cpp quantizer here (matrices only, Q and K rows permuted as llama.cpp's converter
//! writes them) into a GGUF; the K-quants, whose rows are 256-element super-blocks, get a
//! Llama of that width with random valid Q4_K projections and a Q6_K embedding and LM head.
//! Each GGUF is exported twice: dequantized at export (f32, the reference) and with
//! `keep_quantized` plus the `cpu` variant.
//!
//! The kept blocks dequantize to exactly the f32 artifact's weights (`d * code` is exact in
//! f32, Q4_1's `+ m` and Q4_K's `- dmin * mn` round once in all three, and the Q/K row
//! permutation moves whole rows of blocks), so the portable body (which
//! dequantizes in the graph) and the `cpu` variant (whose kernel reads the blocks) compute the
//! f32 artifact's function with the same products; only the order of the f32 sums differs. Each
//! dot of length `K <= 512` then differs by at most `2 γ_K Σ|x w|` (`γ_K = K u / (1 - K u)`,
//! `u = 2^-24`, about `6e-5 Σ|x w|`), and through two layers, the norms and the log-softmax
//! that stays well inside the relative logprob tolerance below, which is the one the engine's
//! other float-order comparisons use.

mod common;

use std::path::{Path, PathBuf};

use half::f16;
use tlaloc_artifact::kernels::{
    CPU_MATMUL_Q4_0, CPU_MATMUL_Q4_1, CPU_MATMUL_Q4_1_XQ8, CPU_MATMUL_Q4_K, CPU_MATMUL_Q4_K_XQ8,
    CPU_MATMUL_Q5_0, CPU_MATMUL_Q6_K, CPU_MATMUL_Q6_K_XQ8, CPU_MATMUL_Q8_0, CPU_MATMUL_Q8_0_XQ8,
    CPU_PAGED_ATTENTION,
};
use tlaloc_artifact::{Artifact, BlockFormat, Dtype, LadderOptions};
use tlaloc_export::{Checkpoint, ExportOptions, LayerRole, TensorRole, export};
use tlaloc_pjrt::discovery::PluginRequest;
use tlaloc_pjrt::testing::{test_plugin_paths, workspace_root};

use common::scratch;
use tlaloc_runtime::{
    CompileMode, Engine, EngineHandle, EngineOptions, GenerateRequest, GenerateResult,
    KernelChoice, LoadOptions,
};

/// Relative logprob tolerance of two runs that differ only by float summation order (relative
/// to the value's magnitude, at least 1).
const LOGPROB_REL_TOL: f32 = 1e-4;

const Q8_0_TYPE: u32 = 8;
const Q4_0_TYPE: u32 = 2;
const Q4_1_TYPE: u32 = 3;
const Q5_0_TYPE: u32 = 6;
const Q4_K_TYPE: u32 = 12;
const Q6_K_TYPE: u32 = 14;
const F32_TYPE: u32 = 0;

/// Writes a small GGUF v3: u32/f32/string metadata and tensors `(name, ne, type id, bytes)`.
struct GgufWriter {
    kv: Vec<u8>,
    kv_count: u64,
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
}

impl GgufWriter {
    fn new(arch: &str) -> Self {
        let mut w = Self {
            kv: Vec::new(),
            kv_count: 0,
            tensors: Vec::new(),
        };
        w.string("general.architecture", arch);
        w
    }
    fn key(&mut self, key: &str, ty: u32) {
        self.kv.extend((key.len() as u64).to_le_bytes());
        self.kv.extend(key.as_bytes());
        self.kv.extend(ty.to_le_bytes());
        self.kv_count += 1;
    }
    fn string(&mut self, key: &str, value: &str) {
        self.key(key, 8);
        self.kv.extend((value.len() as u64).to_le_bytes());
        self.kv.extend(value.as_bytes());
    }
    fn u32(&mut self, key: &str, value: u32) {
        self.key(key, 4);
        self.kv.extend(value.to_le_bytes());
    }
    fn f32(&mut self, key: &str, value: f32) {
        self.key(key, 6);
        self.kv.extend(value.to_le_bytes());
    }
    fn strings(&mut self, key: &str, values: &[String]) {
        self.key(key, 9);
        self.kv.extend(8u32.to_le_bytes());
        self.kv.extend((values.len() as u64).to_le_bytes());
        for v in values {
            self.kv.extend((v.len() as u64).to_le_bytes());
            self.kv.extend(v.as_bytes());
        }
    }
    fn tensor(&mut self, name: &str, dims: &[usize], ty: u32, data: Vec<u8>) {
        let ne = dims.iter().rev().map(|&d| d as u64).collect();
        self.tensors.push((name.into(), ne, ty, data));
    }
    fn finish(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend(self.kv_count.to_le_bytes());
        out.extend(&self.kv);
        let mut offset = 0u64;
        for (name, ne, ty, data) in &self.tensors {
            out.extend((name.len() as u64).to_le_bytes());
            out.extend(name.as_bytes());
            out.extend((ne.len() as u32).to_le_bytes());
            for d in ne {
                out.extend(d.to_le_bytes());
            }
            out.extend(ty.to_le_bytes());
            out.extend(offset.to_le_bytes());
            offset += (data.len() as u64).next_multiple_of(32);
        }
        out.resize(out.len().next_multiple_of(32), 0);
        for (_, _, _, data) in &self.tensors {
            out.extend(data);
            out.resize(out.len().next_multiple_of(32), 0);
        }
        out
    }
}

/// llama.cpp's `quantize_row_q8_0_ref`: per block of 32, `d = absmax / 127` (stored as f16),
/// `code = round(x / d)` (computed as `x * (1 / d)` with the f32 `d`, rounded half away from
/// zero).
fn quantize_q8_0(values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() / 32 * 34);
    for block in values.chunks_exact(32) {
        let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend(f16::from_f32(d).to_le_bytes());
        for &x in block {
            out.push(((x * id).round() as i8) as u8);
        }
    }
    out
}

/// llama.cpp's `quantize_row_q4_0_ref`: per block of 32, the value of largest magnitude `m`
/// (first one on ties), `d = m / -8` (stored as f16), codes `min(15, trunc(x / d + 8.5))`,
/// element `j` in the low nibble of byte `j` and element `j + 16` in its high nibble.
fn quantize_q4_0(values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() / 32 * 18);
    for block in values.chunks_exact(32) {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in block {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend(f16::from_f32(d).to_le_bytes());
        let code = |x: f32| ((x * id + 8.5) as i8).min(15) as u8;
        for j in 0..16 {
            out.push(code(block[j]) | (code(block[j + 16]) << 4));
        }
    }
    out
}

/// llama.cpp's `quantize_row_q4_1_ref`: per block of 32, `d = (max - min) / 15` and `m = min`
/// (both stored as f16), codes `min(15, trunc((x - min) / d + 0.5))`, packed as Q4_0's.
fn quantize_q4_1(values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() / 32 * 20);
    for block in values.chunks_exact(32) {
        let min = block.iter().copied().fold(f32::MAX, f32::min);
        let max = block.iter().copied().fold(-f32::MAX, f32::max);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend(f16::from_f32(d).to_le_bytes());
        out.extend(f16::from_f32(min).to_le_bytes());
        let code = |x: f32| (((x - min) * id + 0.5) as i8).min(15) as u8;
        for j in 0..16 {
            out.push(code(block[j]) | (code(block[j + 16]) << 4));
        }
    }
    out
}

/// llama.cpp's `quantize_row_q5_0_ref`: as Q4_0 with `d = m / -16` and 5-bit codes
/// `min(31, trunc(x / d + 16.5))`, bit 4 of element `e`'s code in bit `e` of the u32 `qh`.
fn quantize_q5_0(values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() / 32 * 22);
    for block in values.chunks_exact(32) {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in block {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend(f16::from_f32(d).to_le_bytes());
        let code = |x: f32| ((x * id + 16.5) as i8).min(31) as u8;
        let mut qh = 0u32;
        let mut qs = [0u8; 16];
        for j in 0..16 {
            let (c0, c1) = (code(block[j]), code(block[j + 16]));
            qs[j] = (c0 & 0xF) | ((c1 & 0xF) << 4);
            qh |= u32::from(c0 >> 4) << j;
            qh |= u32::from(c1 >> 4) << (j + 16);
        }
        out.extend(qh.to_le_bytes());
        out.extend(qs);
    }
    out
}

/// Scalar Q5_0 dequantization: `d * (code - 16)`, each in f32.
fn dequantize_q5_0(bytes: &[u8]) -> Vec<f32> {
    let mut out = Vec::with_capacity(bytes.len() / 22 * 32);
    for block in bytes.chunks_exact(22) {
        let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
        let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
        let qs = &block[6..];
        let nibbles = qs
            .iter()
            .map(|&q| q & 0xF)
            .chain(qs.iter().map(|&q| q >> 4));
        for (e, q) in nibbles.enumerate() {
            let code = i32::from(q) | (((qh >> e) & 1) as i32) << 4;
            out.push(d * (code - 16) as f32);
        }
    }
    out
}

/// Scalar Q4_1 dequantization: `d * code + m`, in f32.
fn dequantize_q4_1(bytes: &[u8]) -> Vec<f32> {
    let mut out = Vec::with_capacity(bytes.len() / 20 * 32);
    for block in bytes.chunks_exact(20) {
        let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
        let m = f16::from_le_bytes([block[2], block[3]]).to_f32();
        let qs = &block[4..];
        out.extend(qs.iter().map(|&q| d * f32::from(q & 0xF) + m));
        out.extend(qs.iter().map(|&q| d * f32::from(q >> 4) + m));
    }
    out
}

/// Scalar Q4_0 dequantization: `d * (code - 8)`, each in f32.
fn dequantize_q4_0(bytes: &[u8]) -> Vec<f32> {
    let mut out = Vec::with_capacity(bytes.len() / 18 * 32);
    for block in bytes.chunks_exact(18) {
        let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
        let qs = &block[2..];
        out.extend(qs.iter().map(|&q| d * (i32::from(q & 0xF) - 8) as f32));
        out.extend(qs.iter().map(|&q| d * (i32::from(q >> 4) - 8) as f32));
    }
    out
}

/// Scalar Q8_0 dequantization: `d * code`, each in f32.
fn dequantize_q8_0(bytes: &[u8]) -> Vec<f32> {
    let mut out = Vec::with_capacity(bytes.len() / 34 * 32);
    for block in bytes.chunks_exact(34) {
        let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
        out.extend(block[2..].iter().map(|&q| d * f32::from(q as i8)));
    }
    out
}

/// Scalar Q4_K dequantization from llama.cpp's `dequantize_row_q4_K`, element by element:
/// sub-block `j = e / 32` has the 6-bit pair of `get_scale_min_k4(j)`, its code is nibble `j % 2`
/// of byte `32 (j / 2) + e % 32`, and the element is `(d * sc) * code - dmin * mn` in f32.
fn dequantize_q4_k(bytes: &[u8]) -> Vec<f32> {
    let mut out = Vec::with_capacity(bytes.len() / 144 * 256);
    for block in bytes.chunks_exact(144) {
        let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
        let dmin = f16::from_le_bytes([block[2], block[3]]).to_f32();
        let (s, qs) = (&block[4..16], &block[16..]);
        for e in 0..256 {
            let j = e / 32;
            let (sc, mn) = if j < 4 {
                (s[j] & 63, s[j + 4] & 63)
            } else {
                (
                    (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
                    (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
                )
            };
            let q = (qs[32 * (j / 2) + e % 32] >> (4 * (j % 2))) & 0xF;
            out.push(d * f32::from(sc) * f32::from(q) - dmin * f32::from(mn));
        }
    }
    out
}

/// Scalar Q6_K dequantization from llama.cpp's `dequantize_row_q6_K`, element by element:
/// element `e = 128 h + r` has the low nibble `ql[64 h + r % 64] >> 4 (r / 64)` and the high bits
/// `qh[32 h + r % 32] >> 2 (r / 32)`, and is `(d * scales[e / 16]) * (code - 32)` in f32.
fn dequantize_q6_k(bytes: &[u8]) -> Vec<f32> {
    let mut out = Vec::with_capacity(bytes.len() / 210 * 256);
    for block in bytes.chunks_exact(210) {
        let (ql, qh, scales) = (&block[..128], &block[128..192], &block[192..208]);
        let d = f16::from_le_bytes([block[208], block[209]]).to_f32();
        for e in 0..256 {
            let (h, r) = (e / 128, e % 128);
            let low = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0xF;
            let high = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
            let code = i32::from(low | (high << 4)) - 32;
            out.push(d * f32::from(scales[e / 16] as i8) * code as f32);
        }
    }
    out
}

/// The dequantized f32 values of `format` blocks.
fn dequantize(format: BlockFormat, bytes: &[u8]) -> Vec<f32> {
    match format {
        BlockFormat::Q8_0 => dequantize_q8_0(bytes),
        BlockFormat::Q4_0 => dequantize_q4_0(bytes),
        BlockFormat::Q4_1 => dequantize_q4_1(bytes),
        BlockFormat::Q5_0 => dequantize_q5_0(bytes),
        BlockFormat::Q4_K => dequantize_q4_k(bytes),
        BlockFormat::Q6_K => dequantize_q6_k(bytes),
    }
}

/// llama.cpp's `permute(w, n_head)` of a `[rows, cols]` tensor: within each head the rows
/// `(2, dim)` are written as `(dim, 2)`.
fn llama_permute(values: &[f32], rows: usize, n_head: usize) -> Vec<f32> {
    let cols = values.len() / rows;
    let dim = rows / n_head / 2;
    let mut out = Vec::with_capacity(values.len());
    for r in 0..rows {
        let (h, rest) = (r / (2 * dim), r % (2 * dim));
        let (d, a) = (rest / 2, rest % 2);
        let src = h * 2 * dim + a * dim + d;
        out.extend_from_slice(&values[src * cols..(src + 1) * cols]);
    }
    out
}

/// The tiny Llama fixture as a llama.cpp GGUF: matrices in `format`, norms f32, a placeholder
/// `gpt2` vocabulary of the model's size.
fn tiny_gguf(dir: &Path, format: BlockFormat) -> PathBuf {
    let st = Checkpoint::open(workspace_root().join("tests/data/fixtures/tiny-llama-gqa")).unwrap();
    let c = &st.config;
    let mut w = GgufWriter::new("llama");
    for (k, v) in [
        ("embedding_length", c.hidden_size),
        ("feed_forward_length", c.intermediate_size),
        ("block_count", c.num_hidden_layers),
        ("attention.head_count", c.num_attention_heads),
        ("attention.head_count_kv", c.num_key_value_heads),
        ("attention.key_length", c.head_dim),
        ("context_length", c.max_position_embeddings),
    ] {
        w.u32(&format!("llama.{k}"), v as u32);
    }
    w.f32(
        "llama.attention.layer_norm_rms_epsilon",
        c.rms_norm_eps as f32,
    );
    w.f32("llama.rope.freq_base", c.rope_theta as f32);
    w.string("tokenizer.ggml.model", "gpt2");
    let tokens: Vec<String> = (0..c.vocab_size).map(|i| format!("t{i}")).collect();
    w.strings("tokenizer.ggml.tokens", &tokens);
    w.strings("tokenizer.ggml.merges", &[]);
    for role in st.roles() {
        let t = st.tensor(role).unwrap();
        let mut values = t.to_f32();
        let heads = match role {
            TensorRole::Layer(_, LayerRole::Q) => Some(c.num_attention_heads),
            TensorRole::Layer(_, LayerRole::K) => Some(c.num_key_value_heads),
            _ => None,
        };
        if let Some(heads) = heads {
            values = llama_permute(&values, t.dims[0], heads);
        }
        let (ty, bytes) = if t.dims.len() == 2 {
            match format {
                BlockFormat::Q8_0 => (Q8_0_TYPE, quantize_q8_0(&values)),
                BlockFormat::Q4_0 => (Q4_0_TYPE, quantize_q4_0(&values)),
                BlockFormat::Q4_1 => (Q4_1_TYPE, quantize_q4_1(&values)),
                BlockFormat::Q5_0 => (Q5_0_TYPE, quantize_q5_0(&values)),
                BlockFormat::Q4_K | BlockFormat::Q6_K => {
                    unreachable!("the fixture's rows are not 256-element super-blocks")
                }
            }
        } else {
            (
                F32_TYPE,
                values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            )
        };
        w.tensor(&role.gguf_name(), &t.dims, ty, bytes);
    }
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join(format!("tiny-{format}.gguf"));
    std::fs::write(&path, w.finish()).unwrap();
    path
}

/// A deterministic byte stream for random blocks.
struct Lcg(u64);

impl Lcg {
    fn byte(&mut self) -> u8 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 56) as u8
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.byte()).collect()
    }
    /// An f16 `scale * (1 + b / 256)`, `b` a random byte.
    fn f16_near(&mut self, scale: f32) -> [u8; 2] {
        f16::from_f32(scale * (1.0 + f32::from(self.byte()) / 256.0)).to_le_bytes()
    }
}

/// Random Q4_K blocks for `elements` weights: `d` about 4e-4 and `dmin` about 7.5 `d` (so a
/// sub-block's codes centre near zero when its scale and min are alike), every scale, min and
/// code random; weights of magnitude about 0.1.
fn random_q4_k(rng: &mut Lcg, elements: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(elements / 256 * 144);
    for _ in 0..elements / 256 {
        out.extend(rng.f16_near(4e-4));
        out.extend(rng.f16_near(3e-3));
        out.extend(rng.bytes(12 + 128));
    }
    out
}

/// Random Q6_K blocks for `elements` weights: `d` about 7e-5, every code and `i8` scale random;
/// weights of magnitude about 0.1.
fn random_q6_k(rng: &mut Lcg, elements: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(elements / 256 * 210);
    for _ in 0..elements / 256 {
        out.extend(rng.bytes(128 + 64 + 16));
        out.extend(rng.f16_near(7e-5));
    }
    out
}

/// A one-layer Llama of K-quant width (hidden 256, 4 heads of 64, 2 K/V heads, MLP 512, vocab
/// 512) as a llama.cpp GGUF: random Q4_K projections, a Q6_K embedding and LM head, f32 norms.
fn k_quant_gguf(dir: &Path) -> PathBuf {
    let (hidden, heads, kv_heads, head_dim, mlp, vocab) = (256, 4, 2, 64, 512, 512);
    let mut w = GgufWriter::new("llama");
    for (k, v) in [
        ("embedding_length", hidden),
        ("feed_forward_length", mlp),
        ("block_count", 1),
        ("attention.head_count", heads),
        ("attention.head_count_kv", kv_heads),
        ("attention.key_length", head_dim),
        ("context_length", 256),
    ] {
        w.u32(&format!("llama.{k}"), v as u32);
    }
    w.f32("llama.attention.layer_norm_rms_epsilon", 1e-5);
    w.f32("llama.rope.freq_base", 10_000.0);
    w.string("tokenizer.ggml.model", "gpt2");
    let tokens: Vec<String> = (0..vocab).map(|i| format!("t{i}")).collect();
    w.strings("tokenizer.ggml.tokens", &tokens);
    w.strings("tokenizer.ggml.merges", &[]);
    let mut rng = Lcg(0x4b5f_7175_616e_7473);
    let norm = |rng: &mut Lcg, n: usize| -> Vec<u8> {
        (0..n)
            .flat_map(|_| (1.0 + (f32::from(rng.byte()) - 128.0) / 1024.0).to_le_bytes())
            .collect()
    };
    for role in [TensorRole::Embedding, TensorRole::LmHead] {
        let data = random_q6_k(&mut rng, vocab * hidden);
        w.tensor(&role.gguf_name(), &[vocab, hidden], Q6_K_TYPE, data);
    }
    let data = norm(&mut rng, hidden);
    w.tensor(
        &TensorRole::FinalNorm.gguf_name(),
        &[hidden],
        F32_TYPE,
        data,
    );
    let q_out = heads * head_dim;
    let kv_out = kv_heads * head_dim;
    for (role, dims) in [
        (LayerRole::Q, [q_out, hidden]),
        (LayerRole::K, [kv_out, hidden]),
        (LayerRole::V, [kv_out, hidden]),
        (LayerRole::O, [hidden, q_out]),
        (LayerRole::Gate, [mlp, hidden]),
        (LayerRole::Up, [mlp, hidden]),
        (LayerRole::Down, [hidden, mlp]),
    ] {
        let data = random_q4_k(&mut rng, dims[0] * dims[1]);
        w.tensor(
            &TensorRole::Layer(0, role).gguf_name(),
            &dims,
            Q4_K_TYPE,
            data,
        );
    }
    for role in [LayerRole::AttnNorm, LayerRole::MlpNorm] {
        let data = norm(&mut rng, hidden);
        w.tensor(
            &TensorRole::Layer(0, role).gguf_name(),
            &[hidden],
            F32_TYPE,
            data,
        );
    }
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("k-quants.gguf");
    std::fs::write(&path, w.finish()).unwrap();
    path
}

fn export_tiny(gguf: &Path, name: &str, keep_quantized: bool) -> PathBuf {
    export_with(gguf, name, keep_quantized, false)
}

fn export_with(
    gguf: &Path,
    name: &str,
    keep_quantized: bool,
    quantize_activations: bool,
) -> PathBuf {
    let out = scratch(name);
    let options = ExportOptions {
        dtype: Dtype::F32,
        kv_dtype: None,
        // Decode batches 1, 2, 4 and prefill chunks of 16: every entry has a cpu variant.
        ladder: LadderOptions::full_pool(4, 128, 16, vec![16]),
        force: false,
        cpu_variant: keep_quantized,
        keep_quantized,
        quantize_activations,
        tensor_parallel: 1,
    };
    export(gguf, &out, &options, &mut |_| {})
        .unwrap_or_else(|e| panic!("exporting {}: {e}", gguf.display()));
    out
}

fn load(dir: &Path, plugin: &Path, kernels: KernelChoice, cache: &Path) -> EngineHandle {
    Engine::load_with_options(
        dir,
        LoadOptions {
            plugin: PluginRequest::Path(plugin.to_owned()),
            compile: CompileMode::Lazy,
            compile_cache: Some(cache.to_owned()),
            kernels,
            ..LoadOptions::default()
        },
        EngineOptions::default(),
    )
    .unwrap_or_else(|e| panic!("loading {} on {}: {e}", dir.display(), plugin.display()))
}

/// The same ids up to the first step whose top two are too close for float order, and
/// logprobs (chosen and top two) within [`LOGPROB_REL_TOL`].
fn assert_same_run(want: &GenerateResult, got: &GenerateResult, what: &str) {
    let comparable = want
        .top_logprobs
        .iter()
        .position(|top| top.len() < 2 || top[0].1 - top[1].1 < 1e-3)
        .unwrap_or(want.token_ids.len());
    assert!(comparable > 0, "{what}: no step to compare");
    assert_eq!(
        got.token_ids[..comparable],
        want.token_ids[..comparable],
        "{what}"
    );
    let close = |w: f32, g: f32| (w - g).abs() <= LOGPROB_REL_TOL * w.abs().max(1.0);
    for k in 0..comparable {
        let (w, g) = (want.logprobs[k].unwrap(), got.logprobs[k].unwrap());
        assert!(close(w, g), "{what}: step {k} logprob {g} vs {w}");
        for ((wt, wl), (gt, gl)) in want.top_logprobs[k].iter().zip(&got.top_logprobs[k]) {
            assert_eq!(wt, gt, "{what}: step {k} top tokens");
            assert!(close(*wl, *gl), "{what}: step {k} top logprob {gl} vs {wl}");
        }
    }
}

#[test]
fn q8_0_weights_kept_quantized_run_as_the_dequantized_f32_artifact_on_every_plugin() {
    check_kept_quantized(BlockFormat::Q8_0, CPU_MATMUL_Q8_0);
}

#[test]
fn q4_0_weights_kept_quantized_run_as_the_dequantized_f32_artifact_on_every_plugin() {
    check_kept_quantized(BlockFormat::Q4_0, CPU_MATMUL_Q4_0);
}

/// Q4_1's `d * code + m` rounds once in f32, in the dense export, the portable body and the
/// kernel alike.
#[test]
fn q4_1_weights_kept_quantized_run_as_the_dequantized_f32_artifact_on_every_plugin() {
    check_kept_quantized(BlockFormat::Q4_1, CPU_MATMUL_Q4_1);
}

#[test]
fn q5_0_weights_kept_quantized_run_as_the_dequantized_f32_artifact_on_every_plugin() {
    check_kept_quantized(BlockFormat::Q5_0, CPU_MATMUL_Q5_0);
}

/// Q4_K's `(d * sc) * code - dmin * mn` rounds once in f32, Q6_K's product is exact: the kept
/// projections (Q4_K) and embedding and LM head (Q6_K) run as the artifact dequantized at export.
#[test]
fn q4_k_and_q6_k_weights_kept_quantized_run_as_the_dequantized_f32_artifact_on_every_plugin() {
    let gguf = k_quant_gguf(&scratch("k-quants-gguf"));
    let format_of = |slot: &str| {
        if slot.starts_with("layers.") {
            BlockFormat::Q4_K
        } else {
            BlockFormat::Q6_K
        }
    };
    check_kept(
        &gguf,
        "k-quants",
        &format_of,
        &[CPU_MATMUL_Q4_K, CPU_MATMUL_Q6_K],
    );
}

fn check_kept_quantized(format: BlockFormat, kernel: &str) {
    let gguf = tiny_gguf(&scratch(&format!("{format}-gguf")), format);
    check_kept(&gguf, &format.to_string(), &|_| format, &[kernel]);
}

/// Exports `gguf` dense and kept and checks that every matrix slot is kept in
/// `format_of(slot)`, that the entries' variants call `kernels` (and the host attention), and
/// that the kept artifact's portable body and `cpu` variant run as the dense artifact on every
/// plugin.
fn check_kept(gguf: &Path, name: &str, format_of: &dyn Fn(&str) -> BlockFormat, kernels: &[&str]) {
    let dense = export_tiny(gguf, &format!("{name}-dense"), false);
    let kept = export_tiny(gguf, &format!("{name}-kept"), true);

    // The manifest: every matrix names its format, keeps its logical dims and stores the
    // format's bytes per block; the blocks dequantize to the dense artifact's f32 weights bit
    // for bit.
    let dense_artifact = Artifact::open(&dense).unwrap();
    let kept_artifact = Artifact::open(&kept).unwrap();
    let (dm, km) = (dense_artifact.manifest(), kept_artifact.manifest());
    assert_eq!(dm.weights.len(), km.weights.len());
    let mut blocked = 0;
    for (d, k) in dm.weights.iter().zip(&km.weights) {
        assert_eq!((&d.slot, &d.dims), (&k.slot, &k.dims));
        let want: Vec<f32> = dense_artifact
            .weight_bytes(&d.slot)
            .unwrap()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let bytes = kept_artifact.weight_bytes(&k.slot).unwrap();
        if k.dims.len() == 2 && !k.slot.starts_with("rope.") {
            blocked += 1;
            let format = format_of(&k.slot);
            assert_eq!(k.block_format, Some(format), "{}", k.slot);
            assert_eq!(k.dtype, Dtype::U8, "{}", k.slot);
            let elements: usize = k.dims.iter().product();
            // llama.cpp's sizes: 34, 18, 20, 22 bytes per 32 elements; 144, 210 per 256.
            let (block_elements, block_bytes) = match format {
                BlockFormat::Q8_0 => (32, 34),
                BlockFormat::Q4_0 => (32, 18),
                BlockFormat::Q4_1 => (32, 20),
                BlockFormat::Q5_0 => (32, 22),
                BlockFormat::Q4_K => (256, 144),
                BlockFormat::Q6_K => (256, 210),
            };
            let got = dequantize(format, &bytes);
            assert_eq!(
                k.byte_length as usize,
                elements / block_elements * block_bytes,
                "{}",
                k.slot
            );
            let differ = got
                .iter()
                .zip(&want)
                .filter(|(g, w)| g.to_bits() != w.to_bits())
                .count();
            assert_eq!(got.len(), want.len(), "{}", k.slot);
            assert_eq!(differ, 0, "{}: dequantized blocks differ", k.slot);
        } else {
            assert_eq!(k.block_format, None, "{}", k.slot);
            assert_eq!(bytes, dense_artifact.weight_bytes(&d.slot).unwrap());
        }
    }
    // Embedding, LM head and four projections per layer.
    assert_eq!(blocked, 2 + 4 * km.model.num_layers);
    // The signature's operand is the raw bytes; the variant calls only `kernel`.
    let qkv = km.weight("layers.0.qkv_proj").unwrap();
    let format = format_of(&qkv.slot);
    assert_eq!(
        qkv.operand().unwrap(),
        (
            Dtype::U8,
            vec![
                qkv.dims[0],
                qkv.dims[1] / format.block_elements() * format.block_bytes()
            ]
        )
    );
    // The matrix kernels, then the host attention over the f32 pools.
    let kernels: Vec<String> = kernels
        .iter()
        .chain(&[CPU_PAGED_ATTENTION])
        .map(|k| k.to_string())
        .collect();
    for entry in &km.entries {
        assert_eq!(entry.variants.len(), 1, "{}", entry.name);
        assert_eq!(entry.variants[0].kernels, kernels, "{}", entry.name);
    }

    let cache = scratch(&format!("{name}-compile-cache"));
    let prompts: Vec<Vec<u32>> = vec![
        vec![1, 17, 230, 5, 99],
        (0..23).map(|i| (i * 37 + 11) % 512).collect(),
        vec![300],
    ];
    for plugin in test_plugin_paths() {
        let reference = load(&dense, &plugin, KernelChoice::Auto, &cache);
        let portable = load(&kept, &plugin, KernelChoice::Portable, &cache);
        let cpu = load(&kept, &plugin, KernelChoice::Auto, &cache);
        let line = cpu
            .load_timings()
            .and_then(|t| t.bodies.clone())
            .expect("an artifact with variants has a bodies line");
        assert!(
            line.contains(&format!("variant cpu for {}", km.entries.len())),
            "{}: {line}",
            plugin.display()
        );
        for (i, prompt) in prompts.iter().enumerate() {
            let request = GenerateRequest {
                logprobs: Some(2),
                ignore_eos: true,
                ..GenerateRequest::greedy(prompt.clone(), 12)
            };
            let want = reference.generate_blocking(request.clone()).unwrap();
            for (engine, body) in [(&portable, "portable"), (&cpu, "cpu")] {
                let got = engine.generate_blocking(request.clone()).unwrap();
                assert_same_run(
                    &want,
                    &got,
                    &format!("prompt {i}, {body} body on {}", plugin.display()),
                );
            }
        }
    }
}

fn goldens(model: &str) -> serde_json::Value {
    let path = workspace_root()
        .join("tests/data/goldens")
        .join(format!("{model}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run `bash scripts/oracle/regenerate.sh`",
            path.display()
        )
    });
    serde_json::from_str(&text).unwrap()
}

fn ids(value: &serde_json::Value) -> Vec<u32> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("not an id list: {value}"))
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

/// The real SmolLM2 Q4_1 GGUF exported with its Q4_1 (and any Q8_0) matrices kept as blocks:
/// on every plugin, the portable body and the `cpu` variant give transformers' greedy ids for
/// the first two golden cases (up
/// to the first golden step whose top-2 margin is under 1e-3, where float order may pick the
/// other token).
#[test]
fn smollm2_with_its_q4_1_blocks_kept_reproduces_the_transformers_goldens() {
    let gguf = workspace_root().join(".tlaloc/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        gguf.is_file(),
        "{} is missing: run `bash scripts/setup.sh`",
        gguf.display()
    );
    let dir = export_tiny(&gguf, "smollm2-kept", true);
    let manifest = Artifact::open(&dir).unwrap().manifest().clone();
    let blocked = manifest
        .weights
        .iter()
        .filter(|w| w.block_format.is_some())
        .count();
    assert!(
        blocked >= 4 * manifest.model.num_layers,
        "only {blocked} weights kept as blocks"
    );
    let golden = goldens("SmolLM2-135M-Instruct");
    // Two cases (a short and a chunked prompt): the portable body dequantizes every weight each
    // step, which is slow in this test's build.
    let cases: Vec<&serde_json::Value> =
        golden["cases"].as_array().unwrap().iter().take(2).collect();
    assert_goldens(&dir, &cases, "smollm2-kept-compile-cache");
}

/// Gemma 3 270M's Q4_K_M GGUF exported with its matrices kept as blocks (Q5_0 and Q8_0 where a
/// row is not whole 256-element super-blocks, Q4_K and Q6_K where it is): on every plugin, the
/// portable body and the `cpu` variant give transformers' greedy ids for the golden's short
/// cases.
#[test]
fn gemma3_with_its_q4_k_q6_k_q5_0_and_q8_0_blocks_kept_reproduces_the_transformers_goldens() {
    let gguf = workspace_root().join(".tlaloc/models/gemma-3-270m-q4_k_m.gguf");
    assert!(
        gguf.is_file(),
        "{} is missing: run `bash scripts/setup.sh`",
        gguf.display()
    );
    let dir = export_tiny(&gguf, "gemma3-kept", true);
    let manifest = Artifact::open(&dir).unwrap().manifest().clone();
    let kept = |format| {
        manifest
            .weights
            .iter()
            .filter(|w| w.block_format == Some(format))
            .count()
    };
    for format in [
        BlockFormat::Q4_K,
        BlockFormat::Q6_K,
        BlockFormat::Q5_0,
        BlockFormat::Q8_0,
    ] {
        assert!(kept(format) > 0, "no {format} matrix kept");
    }
    let golden = goldens("gemma-3-270m");
    let cases: Vec<&serde_json::Value> = golden["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["prompt_ids"].as_array().unwrap().len() + 16 <= 64)
        .take(2)
        .collect();
    assert_eq!(cases.len(), 2, "the golden has two short cases");
    assert_goldens(&dir, &cases, "gemma3-kept-compile-cache");
}

/// On every plugin and with both bodies, each case's greedy ids are transformers' up to the
/// first golden step whose top-2 margin is under 1e-3 (where float order may pick the other
/// token).
fn assert_goldens(dir: &Path, cases: &[&serde_json::Value], cache: &str) {
    assert_goldens_above(dir, cases, cache, &|_| 1e-3);
}

/// As [`assert_goldens`], comparing up to the first golden step whose top-2 margin is under
/// `threshold(step)`.
fn assert_goldens_above(
    dir: &Path,
    cases: &[&serde_json::Value],
    cache: &str,
    threshold: &dyn Fn(&serde_json::Value) -> f64,
) -> usize {
    let mut compared = 0;
    let cache = scratch(cache);
    for plugin in test_plugin_paths() {
        for choice in [KernelChoice::Portable, KernelChoice::Auto] {
            let engine = load(dir, &plugin, choice, &cache);
            for case in cases {
                let name = case["name"].as_str().unwrap();
                let expected = ids(&case["greedy_ids"]);
                let request = GenerateRequest {
                    ignore_eos: true,
                    ..GenerateRequest::greedy(ids(&case["prompt_ids"]), expected.len())
                };
                let got = engine.generate_blocking(request).unwrap();
                let n = case["steps"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .position(|s| s["margin"].as_f64().unwrap() < threshold(s))
                    .unwrap_or(usize::MAX)
                    .min(expected.len());
                assert_eq!(
                    got.token_ids[..n],
                    expected[..n],
                    "{name}, {choice:?} on {}",
                    plugin.display()
                );
                compared += n;
            }
        }
    }
    compared
}

/// How far activations rounded to 8-bit codes per 32-element block (`quantize_activations`)
/// may move a logit, relative to the logits' scale: each rounded element is within half a code
/// step, `1 / 254` of its block's largest magnitude, and a token's logits pass through `4L + 1`
/// rounded matrix multiplications (q/k/v, o, gate/up and down per layer, then the LM head).
/// RMSNorm undoes any change of scale, so errors add rather than multiply to first order:
/// linearly in the worst case (`worst`), as the square root of the count for independent
/// rounding errors (not `worst`).
fn rounding_rel(layers: usize, worst: bool) -> f64 {
    let matmuls = (4 * layers + 1) as f64;
    (if worst { matmuls } else { matmuls.sqrt() }) / 254.0
}

/// The kept artifacts of the tiny fixtures (Q8_0, Q4_1, and the K-quant Llama) exported with
/// `quantize_activations`: the variants call the `_xq8` kernels, and on every plugin both
/// bodies give the dense f32 artifact's greedy ids up to the first step whose top-2 margin is
/// under twice [`rounding_rel`]'s worst case (relative to the logprob's magnitude, at least 1).
/// The logprobs' changes are printed, not bounded (see below).
#[test]
fn quantized_activations_stay_within_the_rounding_bound_of_the_f32_function_on_every_plugin() {
    let q8 = tiny_gguf(&scratch("xq8-q8_0-gguf"), BlockFormat::Q8_0);
    let q4 = tiny_gguf(&scratch("xq8-q4_1-gguf"), BlockFormat::Q4_1);
    let k = k_quant_gguf(&scratch("xq8-k-gguf"));
    let cases: [(&str, &Path, &[&str]); 3] = [
        ("q8_0", &q8, &[CPU_MATMUL_Q8_0_XQ8]),
        ("q4_1", &q4, &[CPU_MATMUL_Q4_1_XQ8]),
        ("k", &k, &[CPU_MATMUL_Q4_K_XQ8, CPU_MATMUL_Q6_K_XQ8]),
    ];
    let prompts: Vec<Vec<u32>> = vec![
        vec![1, 17, 230, 5, 99],
        (0..23).map(|i| (i * 37 + 11) % 512).collect(),
    ];
    for (name, gguf, kernels) in cases {
        let dense = export_with(gguf, &format!("xq8-{name}-dense"), false, false);
        let rounded = export_with(gguf, &format!("xq8-{name}-rounded"), true, true);
        let manifest = Artifact::open(&rounded).unwrap().manifest().clone();
        let kernels: Vec<String> = kernels
            .iter()
            .chain(&[CPU_PAGED_ATTENTION])
            .map(|k| k.to_string())
            .collect();
        for entry in &manifest.entries {
            assert_eq!(entry.variants[0].kernels, kernels, "{name}: {}", entry.name);
        }
        assert_eq!(
            manifest.provenance.options["quantizeActivations"], "q8_0-blocks",
            "{name}"
        );
        let rel = rounding_rel(manifest.model.num_layers, true);
        let cache = scratch(&format!("xq8-{name}-compile-cache"));
        let mut largest = 0.0f32;
        for plugin in test_plugin_paths() {
            let reference = load(&dense, &plugin, KernelChoice::Auto, &cache);
            for choice in [KernelChoice::Portable, KernelChoice::Auto] {
                let engine = load(&rounded, &plugin, choice, &cache);
                for (i, prompt) in prompts.iter().enumerate() {
                    let request = GenerateRequest {
                        logprobs: Some(2),
                        ignore_eos: true,
                        ..GenerateRequest::greedy(prompt.clone(), 12)
                    };
                    let want = reference.generate_blocking(request.clone()).unwrap();
                    let got = engine.generate_blocking(request).unwrap();
                    let what = format!("{name} prompt {i}, {choice:?} on {}", plugin.display());
                    let tol = |lp: f32| (rel * f64::from(lp.abs().max(1.0))) as f32;
                    let comparable = want
                        .top_logprobs
                        .iter()
                        .position(|top| top[0].1 - top[1].1 < 2.0 * tol(top[0].1))
                        .unwrap_or(want.token_ids.len());
                    assert_eq!(
                        got.token_ids[..comparable],
                        want.token_ids[..comparable],
                        "{what}"
                    );
                    // Logprob values are reported, not bounded: the bound is on the logits'
                    // scale, which the logprobs do not give (a Q4_1 step moved 0.099 nats at
                    // a logprob of -2.47).
                    for k in 0..comparable {
                        let (w, g) = (want.logprobs[k].unwrap(), got.logprobs[k].unwrap());
                        largest = largest.max((w - g).abs());
                    }
                    assert!(comparable > 0, "{what}: no step to compare");
                }
            }
        }
        eprintln!("{name}: largest logprob change {largest:e} (margin bound {rel:.3} relative)");
    }
}

/// The real SmolLM2 Q4_1 GGUF kept as blocks with `quantize_activations`: on every plugin both
/// bodies give transformers' greedy ids up to the first golden step whose top-2 margin is under
/// twice [`rounding_rel`] (independent errors) of the step's largest logit magnitude.
#[test]
fn smollm2_with_quantized_activations_reproduces_the_transformers_goldens_within_the_rounding_bound()
 {
    let gguf = workspace_root().join(".tlaloc/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        gguf.is_file(),
        "{} is missing: run `bash scripts/setup.sh`",
        gguf.display()
    );
    let dir = export_with(&gguf, "smollm2-xq8", true, true);
    let layers = Artifact::open(&dir).unwrap().manifest().model.num_layers;
    let rel = rounding_rel(layers, false);
    let golden = goldens("SmolLM2-135M-Instruct");
    let cases: Vec<&serde_json::Value> =
        golden["cases"].as_array().unwrap().iter().take(4).collect();
    let threshold = |step: &serde_json::Value| {
        let scale = step["top_logits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l.as_f64().unwrap().abs())
            .fold(0.0, f64::max);
        2.0 * rel * scale
    };
    let compared = assert_goldens_above(&dir, &cases, "smollm2-xq8-compile-cache", &threshold);
    eprintln!("smollm2 with quantized activations: {compared} golden steps compared");
    assert!(compared > 0, "the bound left no golden step to compare");
}
