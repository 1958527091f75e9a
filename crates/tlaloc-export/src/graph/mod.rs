//! The Llama-family forward program: one StableHLO function per ladder entry
//! `(kind, B, T, C)`, with the signature of the forward-program contract
//! (`tlaloc_artifact::ProgramSignature::expected_for`), and the weight plan that decides which
//! weight slots the program takes and in what order.
//!
//! The program: embedding gather; per layer RMSNorm, ONE q/k/v projection against the fused
//! `qkv_proj` weight (the rows of q, k and v one after the other, `[q + 2 * kv, hidden]`;
//! `dot_general` contracting dim 1 with dim 1, so no transpose is materialised; optional fused
//! bias) sliced into q, k and v, RoPE in transformers' `rotate_half` form applied to q and k
//! together, with cos/sin gathered by `positions` from tables computed at export time (see
//! [`rope`]) once per step, then paged attention: the new K/V rows of the
//! whole batch are written by ONE scatter into each pool viewed as
//! `[numBlocks * blockSize, kvHeads, headDim]` at `slotMapping` (index -1 is out of bounds and
//! dropped: the padding contract), and each row's pages are read back by ONE gather by
//! `blockTables`; grouped-query scores in f32, masked by causality (`c <= position`) and by
//! `c < seqLen`, and on a sliding-window layer by `c > position - window` (each mask is built
//! once per step), softmax in f32 (max subtracted), weighted
//! sum of V, output projection, residual, RMSNorm, ONE gate/up projection against the fused
//! `gate_up_proj` (gate rows then up rows) sliced in two, SwiGLU (`silu(gate) * up`,
//! `silu = x * logistic(x)`), down projection, residual. Fusing changes no element value: each
//! output column is the same dot product over the same weights. The
//! last real token of each row (the lowest `t` whose position is `seqLen - 1`) is picked by a
//! mask and a reduction, then final norm, LM head (the embedding matrix when tied), logits f32
//! and the greedy next token (argmax, lowest index on ties) as i32, both as `nextTokens [B]`
//! and as `nextTokenIds [B, 1]`, the shape of a decode step's `tokenIds`.
//!
//! Dtypes. f32: everything f32, every `dot_general` at `HIGHEST` precision. bf16: the matrix
//! weights (embedding, projections, LM head) and the KV pools are bf16; each projection converts
//! its f32 input to bf16 and multiplies bf16 x bf16 with an f32 result (for a single row, as a
//! multiply and an f32 reduction rather than a `dot_general`: see `linear`); the residual stream,
//! RMSNorm (and its weights), biases, RoPE, attention scores and softmax are f32. The
//! attention dots read the gathered bf16 pages as they are (widening every page to f32 would
//! cost a pass over the whole context per layer): q and the softmax probabilities are rounded
//! to bf16 and each dot accumulates in f32, as transformers does in bf16. New K/V rows are
//! rounded to bf16 when written to the pools.
//!
//! Block-quantized weights (`WeightSlot::block`, `tlaloc_artifact::quant`). A Q8_0 matrix is
//! its raw blocks, `u8 [out, in / 32 * 34]`. The portable body dequantizes it where it is used
//! (`Graph::weight`): each block's first two bytes bitcast to its f16 scale, the other 32 to
//! i8 codes, both widened to f32 and multiplied (exact), reshaped to `[out, in]` and converted
//! to the matrix dtype, so `linear` runs unchanged after it; the embedding is gathered as
//! bytes and only the gathered rows are dequantized. The `cpu` variant's `linear` passes the
//! blocks as they are to `tlaloc.cpu.matmul_q8_0` in an f32 export (in a bf16 one, whose
//! portable body rounds the dequantized weights to bf16, it dequantizes as the portable body
//! does and calls the dense kernel). A Q4_0 matrix (`u8 [out, in / 32 * 18]`)
//! is dequantized the same way, its codes the low then the high nibbles of its 16 code bytes
//! minus 8; a Q4_1 matrix (`[out, in / 32 * 20]`) likewise, each code times `d` plus `m`; a
//! Q5_0 matrix (`[out, in / 32 * 22]`) as Q4_0, with bit `e` of its 32-bit `qh` as bit 4 of
//! element `e` and 16 subtracted. A Q4_K matrix (`[out, in / 256 * 144]`) unpacks its eight
//! 6-bit (scale, min) pairs per super-block with shifts and masks and is `(d * sc) * code -
//! dmin * mn` per 32-element sub-block; a Q6_K matrix (`[out, in / 256 * 210]`) joins each low
//! nibble with its two high bits and is `(d * scale) * (code - 32)` per 16-element sub-block
//! (`Graph::dequantize_q4_k`, `Graph::dequantize_q6_k`). The `cpu` variant passes them to
//! `tlaloc.cpu.matmul_q4_0`, `_q4_1`, `_q5_0`, `_q4_k` and `_q6_k` as Q8_0's.
//!
//! Quantized K/V pools (`i8`, `f8E4M3FN`; the layout is `tlaloc_artifact::KvCacheLayout`'s).
//! The K/V write quantizes each new token's row of each KV head on its own: `s = absmax / M`
//! (`M` = 127 for i8, 448 for e4m3), codes `x / s` (i8: rounded to nearest even, clamped to
//! `[-127, 127]`; e4m3: clamped to `[-448, 448]` and rounded by the conversion), and the f32
//! `s` goes to a scale pool `[numBlocks, blockSize, kvHeads]` by the same scatter index as the
//! codes. Symmetric absmax rounding to nearest leaves `|x - q s| <= s / 2 = absmax / 254` for
//! i8. Per token and head rather than per block and head: a block's scale changes as it fills,
//! so each write would rescale (and round again) every code already in the block, and a write
//! would touch slots of tokens already written; on real SmolLM2 K/V the per-block rows
//! measured larger errors too (`kv_quant` tests, docs/benchmarks.md). The scales cost
//! `4 / headDim` bytes per code byte (6% at headDim 64). Attention reads the codes widened to
//! the matrix dtype (exact: |q| <= 448 fits bf16's exponent and e4m3's 3 mantissa bits fit
//! bf16's 7) and folds the scales in on the small side: the scores are multiplied by the K
//! scale of their key, and the probabilities by the V scale of their value before the second
//! dot, so no dequantized copy of the pages is made.
//!
//! The `cpu` variant over unquantized pools replaces everything between the K/V write and the
//! output projection (the page gathers, both attention dots, the mask and the softmax) by one
//! `tlaloc.cpu.paged_attention` call per layer on the written pools
//! (`kernels::CPU_PAGED_ATTENTION` states the function: the same as above, read in place, only
//! the visible keys). Quantized pools keep the graph's attention in the variant too.
//!
//! Tensor parallelism (`WeightPlan::tensor_parallel` = N > 1, [`crate::tensor_parallel`]): the
//! same graph over the global shapes, made an SPMD program over N partitions by annotations on
//! `@main`'s signature alone: every argument and result states its `mhlo.sharding` (step inputs
//! and the logits/token outputs replicated, each weight split on its slot's axis or replicated,
//! each pool and its aliased output split over the KV heads), and XLA's sharding propagation
//! lays out everything between them and inserts the collectives. In the tiny fixture's
//! partitioned decode and prefill (XLA CPU's optimized HLO) they are Megatron's and no more: one
//! all-reduce after the vocabulary-split embedding lookup and one after each o and down
//! projection, an all-gather of the vocabulary-split logits and two of each device's argmax
//! candidate (value, index); no weight or pool moves between devices. The signature
//! is the place because it is all a loader sees: what each device must hold is stated there and
//! nowhere else. The one change inside is how the fused projections are read: their rows are
//! shard-major, so `qkv` is read as `[N, q_k + k_k + v_k]` heads and `gate_up` as `[N, 2, I /
//! N]` (`Graph::split_qkv`, `Graph::split_gate_up`), which keeps each device's heads and MLP
//! columns on that device; with N = 1 the graph is the one above, op for op.

pub mod rope;

use std::collections::BTreeMap;

use tlaloc_artifact::step::{KvPool, PoolOperand, StepInput, StepOutput};
use tlaloc_artifact::tensor_parallel::POOL_SPLIT_AXIS;
use tlaloc_artifact::{BlockFormat, Dtype, KvCacheLayout, LadderPoint, kernels};
use tlaloc_hlo::{
    CompareDirection, DotDims, FunctionBuilder, GatherSpec, HloError, Module, Precision, Scalar,
    ScalarType, ScatterSpec, ScatterUpdate, Sharding, TensorType, Value,
};

use crate::checkpoint::{LayerRole, TensorRole};
use crate::config::{Activation, ModelConfig};

/// Where the bytes of a weight slot come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotSource {
    /// The rows of these checkpoint tensors (Hugging Face layout) concatenated along dimension
    /// 0, in order: one tensor for most slots, q/k/v or gate/up for the fused projections.
    Rows(Vec<TensorRole>),
    /// The RoPE cosine table `[maxContext, headDim]`.
    RopeCos,
    /// The RoPE sine table `[maxContext, headDim]`.
    RopeSin,
    /// The sliding-window layers' RoPE cosine table, where their base differs (Gemma 3).
    LocalRopeCos,
    /// The sliding-window layers' RoPE sine table.
    LocalRopeSin,
}

/// One weight operand of every entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightSlot {
    pub name: String,
    pub source: SlotSource,
    /// The dtype the graph computes with (the matrix dtype for a block-quantized matrix).
    pub dtype: Dtype,
    /// Logical dims (`[out, in]` elements for a block-quantized matrix).
    pub dims: Vec<usize>,
    /// The block format the slot's operand is stored in (its raw blocks, `u8 [out, row
    /// bytes]`, see `tlaloc_artifact::quant`); `None` for a dense operand of `dtype`.
    pub block: Option<BlockFormat>,
    /// In a tensor-parallel plan, the dimension of `dims` split over the devices
    /// ([`crate::tensor_parallel`]); `None` for a slot every device takes whole.
    pub split: Option<usize>,
}

impl WeightSlot {
    /// The operand's element type and dims: the raw blocks of a block-quantized matrix, or
    /// the dense tensor. `None` where the format cannot store the dims.
    pub fn operand(&self) -> Option<(Dtype, Vec<usize>)> {
        match self.block {
            None => Some((self.dtype, self.dims.clone())),
            Some(format) => Some((
                BlockFormat::OPERAND_DTYPE,
                format.operand_dims(&self.dims).ok()?,
            )),
        }
    }
}

/// The weight slots of a model in manifest (and operand) order, and what the graph needs to
/// know about the model.
#[derive(Debug, Clone)]
pub struct WeightPlan {
    pub config: ModelConfig,
    /// The export dtype of the matrix weights and the KV pools.
    pub dtype: Dtype,
    /// Rows of the RoPE tables: the largest position + 1 any entry can see.
    pub rope_positions: usize,
    pub slots: Vec<WeightSlot>,
    /// Round the input of every matrix multiplication against a block-quantized weight to
    /// 8-bit codes per 32-element block first (`Graph::round_activation_blocks`), in every
    /// body: the `cpu` variant's `_xq8` kernels then multiply integers (f32 exports only).
    pub quantize_activations: bool,
    /// Devices each program is split over (`mhlo.num_partitions`); 1 for a program of one
    /// device. Set with the slots' split axes by [`crate::tensor_parallel::apply`].
    pub tensor_parallel: usize,
}

/// The weight slots of one decoder layer: a name and the checkpoint roles whose rows it holds.
/// q, k and v are one slot (one matmul in the graph), and so are gate and up; their biases
/// are fused the same way.
fn layer_slots(c: &ModelConfig) -> Vec<(&'static str, Vec<LayerRole>)> {
    use LayerRole::*;
    let mut slots = vec![("input_norm", vec![AttnNorm]), ("qkv_proj", vec![Q, K, V])];
    if c.qkv_bias {
        slots.push(("qkv_bias", vec![QBias, KBias, VBias]));
    }
    if c.qk_norm {
        slots.push(("qk_norm", vec![QNorm, KNorm]));
    }
    slots.push(("o_proj", vec![O]));
    if c.o_bias {
        slots.push(("o_bias", vec![OBias]));
    }
    if c.sandwich_norms {
        slots.push(("attention_out_norm", vec![PostAttnNorm]));
    }
    slots.push(("post_attention_norm", vec![MlpNorm]));
    slots.push(("gate_up_proj", vec![Gate, Up]));
    if c.mlp_bias {
        slots.push(("gate_up_bias", vec![GateBias, UpBias]));
    }
    slots.push(("down_proj", vec![Down]));
    if c.mlp_bias {
        slots.push(("down_bias", vec![DownBias]));
    }
    if c.sandwich_norms {
        slots.push(("mlp_out_norm", vec![PostMlpNorm]));
    }
    slots
}

/// Slot name of a layer weight, e.g. `layers.3.qkv_proj`.
fn layer_slot(layer: usize, name: &str) -> String {
    format!("layers.{layer}.{name}")
}

pub const EMBEDDING_SLOT: &str = "embed_tokens";
pub const LM_HEAD_SLOT: &str = "lm_head";
pub const FINAL_NORM_SLOT: &str = "final_norm";
pub const ROPE_COS_SLOT: &str = "rope.cos";
pub const ROPE_SIN_SLOT: &str = "rope.sin";
pub const LOCAL_ROPE_COS_SLOT: &str = "rope.local.cos";
pub const LOCAL_ROPE_SIN_SLOT: &str = "rope.local.sin";

impl WeightPlan {
    /// The plan for `config` exported as `dtype` (f32 or bf16). Matrices take the export dtype;
    /// one-dimensional weights (norms, biases) and the RoPE tables stay f32. A tied LM head is
    /// the embedding slot, not a second copy.
    pub fn new(config: &ModelConfig, dtype: Dtype, rope_positions: usize) -> WeightPlan {
        let c = config;
        let mut slots = Vec::new();
        let mut push = |name: String, roles: Vec<TensorRole>| {
            let mut dims = roles[0].expected_dims(c);
            dims[0] = roles.iter().map(|r| r.expected_dims(c)[0]).sum();
            let dtype = if dims.len() == 1 { Dtype::F32 } else { dtype };
            slots.push(WeightSlot {
                name,
                source: SlotSource::Rows(roles),
                dtype,
                dims,
                block: None,
                split: None,
            });
        };
        push(EMBEDDING_SLOT.into(), vec![TensorRole::Embedding]);
        let per_layer = layer_slots(c);
        for layer in 0..c.num_hidden_layers {
            for (name, roles) in &per_layer {
                let roles = roles.iter().map(|&r| TensorRole::Layer(layer, r)).collect();
                push(layer_slot(layer, name), roles);
            }
        }
        push(FINAL_NORM_SLOT.into(), vec![TensorRole::FinalNorm]);
        if !c.tie_word_embeddings {
            push(LM_HEAD_SLOT.into(), vec![TensorRole::LmHead]);
        }
        let mut tables = vec![
            (ROPE_COS_SLOT, SlotSource::RopeCos),
            (ROPE_SIN_SLOT, SlotSource::RopeSin),
        ];
        if c.local_rope_theta.is_some() {
            tables.push((LOCAL_ROPE_COS_SLOT, SlotSource::LocalRopeCos));
            tables.push((LOCAL_ROPE_SIN_SLOT, SlotSource::LocalRopeSin));
        }
        for (name, source) in tables {
            slots.push(WeightSlot {
                name: name.into(),
                source,
                dtype: Dtype::F32,
                dims: vec![rope_positions, c.head_dim],
                block: None,
                split: None,
            });
        }
        WeightPlan {
            config: config.clone(),
            dtype,
            rope_positions,
            slots,
            quantize_activations: false,
            tensor_parallel: 1,
        }
    }
}

/// Why a forward program could not be built.
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    #[error("building entry {entry}: {source}")]
    Hlo {
        entry: String,
        #[source]
        source: HloError,
    },
    #[error("the forward program supports f32 and bf16, not {0}")]
    UnsupportedDtype(Dtype),
    #[error("K/V pools of {0} are not supported; use f32, bf16, i8 or f8e4m3fn")]
    UnsupportedKvDtype(Dtype),
    #[error("weight slot {slot}: {reason}")]
    UnsupportedBlockWeight { slot: String, reason: String },
    #[error(
        "entry {entry}: the cpu body variant runs on one device; a program split over {degree} devices has only the portable body"
    )]
    SplitCpuVariant { entry: String, degree: usize },
    #[error("entry {entry}: context {context} is not a multiple of the KV block size {block_size}")]
    ContextNotBlockAligned {
        entry: String,
        context: usize,
        block_size: usize,
    },
}

fn hlo_dtype(dtype: Dtype) -> Result<ScalarType, GraphError> {
    match dtype {
        Dtype::F32 => Ok(ScalarType::F32),
        Dtype::Bf16 => Ok(ScalarType::Bf16),
        other => Err(GraphError::UnsupportedDtype(other)),
    }
}

/// Which body of an entry to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    /// Pure StableHLO: every plugin compiles it.
    Portable,
    /// The `cpu` variant: matrix multiplications of at most
    /// [`kernels::CPU_VARIANT_MAX_ROWS`] rows call [`kernels::CPU_MATMUL`].
    Cpu,
}

/// Builds the forward program of `point`, as the body `kind`.
pub fn forward_program(
    plan: &WeightPlan,
    kv: &KvCacheLayout,
    point: LadderPoint,
    kind: BodyKind,
) -> Result<Module, GraphError> {
    let entry = point.name();
    if kv.block_size == 0 || point.context % kv.block_size != 0 {
        return Err(GraphError::ContextNotBlockAligned {
            entry,
            context: point.context,
            block_size: kv.block_size,
        });
    }
    if kind == BodyKind::Cpu && plan.tensor_parallel > 1 {
        return Err(GraphError::SplitCpuVariant {
            entry,
            degree: plan.tensor_parallel,
        });
    }
    let matrix = hlo_dtype(plan.dtype)?;
    let (pool, quant) = match (kv.dtype, kv.scales) {
        (Dtype::I8, Some(_)) => (
            ScalarType::I8,
            Some(KvQuant {
                code: ScalarType::I8,
                code_max: I8_CODE_MAX,
            }),
        ),
        (Dtype::F8E4M3FN, Some(_)) => (
            ScalarType::F8E4M3FN,
            Some(KvQuant {
                code: ScalarType::F8E4M3FN,
                code_max: F8E4M3FN_CODE_MAX,
            }),
        ),
        (dtype, None) => (hlo_dtype(dtype)?, None),
        (dtype, Some(_)) => return Err(GraphError::UnsupportedKvDtype(dtype)),
    };
    // Quantized pages are read widened to the matrix dtype; the others as they are.
    let attention = if quant.is_some() { matrix } else { pool };
    for slot in &plan.slots {
        if let Some(format) = slot.block {
            format.operand_dims(&slot.dims).map_err(|reason| {
                GraphError::UnsupportedBlockWeight {
                    slot: slot.name.clone(),
                    reason,
                }
            })?;
        }
    }
    let mut g = Graph {
        f: FunctionBuilder::new("tlaloc_forward"),
        weights: BTreeMap::new(),
        blocks: BTreeMap::new(),
        matrix,
        pool,
        attention,
        quant,
        kind,
        quantize_activations: plan.quantize_activations,
        shards: plan.tensor_parallel,
    };
    build(&mut g, plan, kv, point).map_err(|source| GraphError::Hlo { entry, source })
}

struct Graph {
    f: FunctionBuilder,
    /// Every weight operand as declared (the raw blocks of a block-quantized one).
    weights: BTreeMap<String, Value>,
    /// The block-quantized weights: their format and logical dims.
    blocks: BTreeMap<String, (BlockFormat, Vec<usize>)>,
    /// Element type of the matrix weights.
    matrix: ScalarType,
    /// Element type of the KV pools.
    pool: ScalarType,
    /// The type the attention dots take the pages (and q and the probabilities) in.
    attention: ScalarType,
    /// How the pools quantize, when they do.
    quant: Option<KvQuant>,
    /// Which body this is.
    kind: BodyKind,
    /// See [`WeightPlan::quantize_activations`].
    quantize_activations: bool,
    /// Devices the program is split over; the fused projections' rows are shard-major when
    /// more than 1 ([`crate::tensor_parallel`]).
    shards: usize,
}

/// Largest i8 code of symmetric absmax quantization (-128 is never used, so the range is
/// symmetric and the bound `absmax / 254` holds for both signs).
pub const I8_CODE_MAX: f64 = 127.0;
/// Largest finite e4m3 (`f8E4M3FN`) value.
pub const F8E4M3FN_CODE_MAX: f64 = 448.0;

/// The code type of quantized pools and the code that absmax maps to.
#[derive(Debug, Clone, Copy)]
struct KvQuant {
    code: ScalarType,
    code_max: f64,
}

fn f32_ty(dims: &[usize]) -> TensorType {
    TensorType::new(ScalarType::F32, dims.to_vec())
}

impl Graph {
    /// The weight `slot` in the dtype the graph computes with: a block-quantized weight is
    /// dequantized here ([`Graph::dequantize`]), so what follows is the code of a dense one.
    fn weight(&mut self, slot: &str) -> Result<Value, HloError> {
        let w = self.operand(slot)?;
        match self.blocks.get(slot).cloned() {
            None => Ok(w),
            Some((format, dims)) => self.dequantize(w, format, dims[1]),
        }
    }

    /// Raw rows of blocks `w [R, row bytes]` u8 as `[R, inner]` in the matrix dtype. Q8_0:
    /// each block's first two bytes are read as its f16 scale and the other 32 as i8 codes
    /// (bitcasts, little-endian), both widened to f32 and multiplied (exact: see
    /// `BlockFormat::Q8_0`), then converted to the matrix dtype (exact for f32).
    fn dequantize(
        &mut self,
        w: Value,
        format: BlockFormat,
        inner: usize,
    ) -> Result<Value, HloError> {
        let rows = self.dims(w)?[0];
        let (elements, bytes) = (format.block_elements(), format.block_bytes());
        let blocks = inner / elements;
        let values = match format {
            BlockFormat::Q8_0 => {
                let scale_bytes = tlaloc_artifact::quant::Q8_0_SCALE_BYTES;
                let w = self.f.reshape(w, [rows, blocks, bytes])?;
                let scales = self
                    .f
                    .slice(w, [0, 0, 0], [rows, blocks, scale_bytes], [1, 1, 1])?;
                let scales = self.f.bitcast_convert(scales, ScalarType::F16)?;
                let scales = self.f.convert(scales, ScalarType::F32)?;
                let scales = self
                    .f
                    .broadcast_in_dim(scales, [rows, blocks, elements], [0, 1])?;
                let codes =
                    self.f
                        .slice(w, [0, 0, scale_bytes], [rows, blocks, bytes], [1, 1, 1])?;
                let codes = self.f.bitcast_convert(codes, ScalarType::I8)?;
                let codes = self.f.convert(codes, ScalarType::F32)?;
                self.f.mul(codes, scales)?
            }
            BlockFormat::Q4_0 | BlockFormat::Q4_1 | BlockFormat::Q5_0 => {
                use tlaloc_artifact::quant::{
                    Q4_0_CODE_OFFSET, Q5_0_CODE_OFFSET, Q5_0_HIGH_BITS_BYTES, SCALE_BYTES,
                };
                let f16s = SCALE_BYTES;
                // Q4_0: d, then the codes; Q4_1: d, m, then the codes; Q5_0: d, qh, the codes.
                let head = match format {
                    BlockFormat::Q4_1 => 2 * f16s,
                    BlockFormat::Q5_0 => f16s + Q5_0_HIGH_BITS_BYTES,
                    _ => f16s,
                };
                let half = elements / 2;
                let dims = [rows, blocks, elements];
                let w = self.f.reshape(w, [rows, blocks, bytes])?;
                let f16_at = |g: &mut Graph, at: usize| -> Result<Value, HloError> {
                    let v =
                        g.f.slice(w, [0, 0, at], [rows, blocks, at + f16s], [1, 1, 1])?;
                    let v = g.f.bitcast_convert(v, ScalarType::F16)?;
                    let v = g.f.convert(v, ScalarType::F32)?;
                    g.f.broadcast_in_dim(v, dims, [0, 1])
                };
                let scales = f16_at(self, 0)?;
                let mins = if format == BlockFormat::Q4_1 {
                    Some(f16_at(self, f16s)?)
                } else {
                    None
                };
                let packed = self
                    .f
                    .slice(w, [0, 0, head], [rows, blocks, bytes], [1, 1, 1])?;
                // Low nibbles are elements 0..16 of the block, high nibbles 16..32.
                let mask = self.f.splat(Scalar::U8(0x0F), [rows, blocks, half])?;
                let four = self.f.splat(Scalar::U8(4), [rows, blocks, half])?;
                let low = self.f.and(packed, mask)?;
                let high = self.f.shift_right_logical(packed, four)?;
                let mut codes = self.f.concatenate(&[low, high], 2)?;
                if format == BlockFormat::Q5_0 {
                    // Bit e of the little-endian qh is bit 4 of element e: bit e % 8 of byte
                    // e / 8, so [.., 4 bytes, 8 bits] reshaped is element order.
                    let qh_dims = [rows, blocks, Q5_0_HIGH_BITS_BYTES, 8];
                    let qh = self
                        .f
                        .slice(w, [0, 0, f16s], [rows, blocks, head], [1, 1, 1])?;
                    let qh = self.f.broadcast_in_dim(qh, qh_dims, [0, 1, 2])?;
                    let bit = self
                        .f
                        .iota(TensorType::new(ScalarType::U8, qh_dims.to_vec()), 3)?;
                    let bits = self.f.shift_right_logical(qh, bit)?;
                    let one = self.f.splat(Scalar::U8(1), qh_dims)?;
                    let bits = self.f.and(bits, one)?;
                    let four = self.f.splat(Scalar::U8(4), qh_dims)?;
                    let bits = self.f.shift_left(bits, four)?;
                    let bits = self.f.reshape(bits, dims)?;
                    codes = self.f.or(codes, bits)?;
                }
                let codes = self.f.convert(codes, ScalarType::F32)?;
                match mins {
                    None => {
                        let offset = if format == BlockFormat::Q5_0 {
                            Q5_0_CODE_OFFSET
                        } else {
                            Q4_0_CODE_OFFSET
                        };
                        let offset = self.f.full(&f32_ty(&dims), f64::from(offset))?;
                        let codes = self.f.sub(codes, offset)?;
                        self.f.mul(codes, scales)?
                    }
                    Some(mins) => {
                        let scaled = self.f.mul(codes, scales)?;
                        self.f.add(scaled, mins)?
                    }
                }
            }
            BlockFormat::Q4_K => self.dequantize_q4_k(w, rows, blocks)?,
            BlockFormat::Q6_K => self.dequantize_q6_k(w, rows, blocks)?,
        };
        let values = self.f.reshape(values, [rows, inner])?;
        self.in_dtype(values, self.matrix)
    }

    /// Q4_K super-blocks `w [R, blocks * 144]` as f32 `[R, blocks, 8, 32]` (sub-blocks of 32):
    /// `d` and `dmin` from bytes 0..4 (f16 bitcasts), the eight 6-bit (scale, min) pairs
    /// unpacked from bytes 4..16 as `BlockFormat::Q4_K` says, and the codes of sub-block `j`
    /// the low (`j` even) or high nibbles of code bytes `32 (j / 2) ..`. Each element is
    /// `(d * sc) * code - dmin * mn`: exact products, one rounding, as the exporter's
    /// dequantization and the CPU kernel compute it.
    fn dequantize_q4_k(&mut self, w: Value, rows: usize, blocks: usize) -> Result<Value, HloError> {
        use tlaloc_artifact::quant::{
            K_SUPER_BLOCK_ELEMENTS, Q4_K_SCALES_BYTES, Q4_K_SUB_BLOCK_ELEMENTS, SCALE_BYTES,
        };
        let bytes = BlockFormat::Q4_K.block_bytes();
        let subs = K_SUPER_BLOCK_ELEMENTS / Q4_K_SUB_BLOCK_ELEMENTS;
        let w = self.f.reshape(w, [rows, blocks, bytes])?;
        let f16_at = |g: &mut Graph, at: usize| -> Result<Value, HloError> {
            let v =
                g.f.slice(w, [0, 0, at], [rows, blocks, at + SCALE_BYTES], [1, 1, 1])?;
            let v = g.f.bitcast_convert(v, ScalarType::F16)?;
            let v = g.f.convert(v, ScalarType::F32)?;
            g.f.broadcast_in_dim(v, [rows, blocks, subs], [0, 1])
        };
        let d = f16_at(self, 0)?;
        let dmin = f16_at(self, SCALE_BYTES)?;
        // The scale bytes as three groups a, b, c of four (llama.cpp's get_scale_min_k4).
        let head = 2 * SCALE_BYTES;
        let group = Q4_K_SCALES_BYTES / 3;
        let packed = self.f.slice(
            w,
            [0, 0, head],
            [rows, blocks, head + Q4_K_SCALES_BYTES],
            [1, 1, 1],
        )?;
        let packed = self.f.reshape(packed, [rows, blocks, 3, group])?;
        let quad = [rows, blocks, group];
        let mut groups = Vec::with_capacity(3);
        for k in 0..3 {
            let g = self.f.slice(
                packed,
                [0, 0, k, 0],
                [rows, blocks, k + 1, group],
                [1, 1, 1, 1],
            )?;
            groups.push(self.f.reshape(g, quad)?);
        }
        let (a, b, c) = (groups[0], groups[1], groups[2]);
        let u8s = |g: &mut Graph, v: u8| g.f.splat(Scalar::U8(v), quad);
        let (six_bits, nibble) = (u8s(self, 63)?, u8s(self, 15)?);
        let (four, six) = (u8s(self, 4)?, u8s(self, 6)?);
        // Pair j < 4: (a & 63, b & 63); pair j + 4: ((c & 15) | (a >> 6) << 4,
        // (c >> 4) | (b >> 6) << 4).
        let top = |g: &mut Graph, v: Value| -> Result<Value, HloError> {
            let t = g.f.shift_right_logical(v, six)?;
            g.f.shift_left(t, four)
        };
        let sc_low = self.f.and(a, six_bits)?;
        let c_low = self.f.and(c, nibble)?;
        let a_top = top(self, a)?;
        let sc_high = self.f.or(c_low, a_top)?;
        let mn_low = self.f.and(b, six_bits)?;
        let c_high = self.f.shift_right_logical(c, four)?;
        let b_top = top(self, b)?;
        let mn_high = self.f.or(c_high, b_top)?;
        let sc = self.f.concatenate(&[sc_low, sc_high], 2)?;
        let mn = self.f.concatenate(&[mn_low, mn_high], 2)?;
        let sc = self.f.convert(sc, ScalarType::F32)?;
        let mn = self.f.convert(mn, ScalarType::F32)?;
        let scale = self.f.mul(d, sc)?;
        let min = self.f.mul(dmin, mn)?;
        // Code bytes [4 pairs of sub-blocks, 32]: low nibbles then high nibbles of each.
        let half = Q4_K_SUB_BLOCK_ELEMENTS;
        let qs = self.f.slice(
            w,
            [0, 0, head + Q4_K_SCALES_BYTES],
            [rows, blocks, bytes],
            [1, 1, 1],
        )?;
        let qs_dims = [rows, blocks, subs / 2, 1, half];
        let qs = self.f.reshape(qs, qs_dims)?;
        let mask = self.f.splat(Scalar::U8(0x0F), qs_dims)?;
        let shift = self.f.splat(Scalar::U8(4), qs_dims)?;
        let low = self.f.and(qs, mask)?;
        let high = self.f.shift_right_logical(qs, shift)?;
        let codes = self.f.concatenate(&[low, high], 3)?;
        let dims = [rows, blocks, subs, half];
        let codes = self.f.reshape(codes, dims)?;
        let codes = self.f.convert(codes, ScalarType::F32)?;
        let scale = self.f.broadcast_in_dim(scale, dims, [0, 1, 2])?;
        let min = self.f.broadcast_in_dim(min, dims, [0, 1, 2])?;
        let scaled = self.f.mul(codes, scale)?;
        self.f.sub(scaled, min)
    }

    /// Q6_K super-blocks `w [R, blocks * 210]` as f32 `[R, blocks, 16, 16]` (sub-blocks of 16):
    /// element `128 h + 32 q + l` takes the low nibble of `ql[64 h + 32 (q % 2) + l]` (`q < 2`)
    /// or its high nibble (`q >= 2`) and bits `2q, 2q + 1` of `qh[32 h + l]` as bits 4 and 5,
    /// as `BlockFormat::Q6_K` says; it is `(d * scale) * (code - 32)`, exact in f32.
    fn dequantize_q6_k(&mut self, w: Value, rows: usize, blocks: usize) -> Result<Value, HloError> {
        use tlaloc_artifact::quant::{
            K_SUPER_BLOCK_ELEMENTS, Q6_K_CODE_OFFSET, Q6_K_SUB_BLOCK_ELEMENTS, SCALE_BYTES,
        };
        let bytes = BlockFormat::Q6_K.block_bytes();
        let n = K_SUPER_BLOCK_ELEMENTS;
        let (ql_end, qh_end) = (n / 2, n / 2 + n / 4);
        let subs = n / Q6_K_SUB_BLOCK_ELEMENTS;
        let scales_end = qh_end + subs;
        let w = self.f.reshape(w, [rows, blocks, bytes])?;
        // ql as [half h, 1, q % 2, l]; its low then high nibbles stacked on the unit axis give
        // [h, q / 2, q % 2, l], which is [h, q, l] in element order.
        let lanes = 32;
        let ql = self
            .f
            .slice(w, [0, 0, 0], [rows, blocks, ql_end], [1, 1, 1])?;
        let ql_dims = [rows, blocks, 2, 1, 2, lanes];
        let ql = self.f.reshape(ql, ql_dims)?;
        let mask = self.f.splat(Scalar::U8(0x0F), ql_dims)?;
        let four = self.f.splat(Scalar::U8(4), ql_dims)?;
        let low = self.f.and(ql, mask)?;
        let high = self.f.shift_right_logical(ql, four)?;
        let nibbles = self.f.concatenate(&[low, high], 3)?;
        let dims = [rows, blocks, 2, 4, lanes];
        let nibbles = self.f.reshape(nibbles, dims)?;
        // qh [h, l], broadcast over q and shifted right by 2q: bits 0, 1 are element (h, q, l)'s.
        let qh = self
            .f
            .slice(w, [0, 0, ql_end], [rows, blocks, qh_end], [1, 1, 1])?;
        let qh = self.f.reshape(qh, [rows, blocks, 2, lanes])?;
        let qh = self.f.broadcast_in_dim(qh, dims, [0, 1, 2, 4])?;
        let q = self
            .f
            .iota(TensorType::new(ScalarType::U8, dims.to_vec()), 3)?;
        let one = self.f.splat(Scalar::U8(1), dims)?;
        let shift = self.f.shift_left(q, one)?;
        let bits = self.f.shift_right_logical(qh, shift)?;
        let two_bits = self.f.splat(Scalar::U8(3), dims)?;
        let bits = self.f.and(bits, two_bits)?;
        let four = self.f.splat(Scalar::U8(4), dims)?;
        let bits = self.f.shift_left(bits, four)?;
        let codes = self.f.or(nibbles, bits)?;
        let codes = self.f.convert(codes, ScalarType::F32)?;
        let offset = self.f.full(&f32_ty(&dims), f64::from(Q6_K_CODE_OFFSET))?;
        let codes = self.f.sub(codes, offset)?;
        let out = [rows, blocks, subs, Q6_K_SUB_BLOCK_ELEMENTS];
        let codes = self.f.reshape(codes, out)?;
        let scales = self
            .f
            .slice(w, [0, 0, qh_end], [rows, blocks, scales_end], [1, 1, 1])?;
        let scales = self.f.bitcast_convert(scales, ScalarType::I8)?;
        let scales = self.f.convert(scales, ScalarType::F32)?;
        let d = self.f.slice(
            w,
            [0, 0, scales_end],
            [rows, blocks, scales_end + SCALE_BYTES],
            [1, 1, 1],
        )?;
        let d = self.f.bitcast_convert(d, ScalarType::F16)?;
        let d = self.f.convert(d, ScalarType::F32)?;
        let d = self.f.broadcast_in_dim(d, [rows, blocks, subs], [0, 1])?;
        let scale = self.f.mul(d, scales)?;
        let scale = self.f.broadcast_in_dim(scale, out, [0, 1, 2])?;
        self.f.mul(codes, scale)
    }

    /// Rows of the embedding `[vocab, hidden]` at `ids [N]`, in the matrix dtype: a
    /// block-quantized table is gathered as bytes and only the gathered rows dequantized.
    fn embedding_rows(&mut self, ids: Value) -> Result<Value, HloError> {
        let table = self.operand(EMBEDDING_SLOT)?;
        let rows = self.gather_rows(table, ids)?;
        match self.blocks.get(EMBEDDING_SLOT).cloned() {
            None => Ok(rows),
            Some((format, dims)) => self.dequantize(rows, format, dims[1]),
        }
    }

    /// The weight operand `slot` as declared.
    fn operand(&self, slot: &str) -> Result<Value, HloError> {
        self.weights
            .get(slot)
            .copied()
            .ok_or_else(|| HloError::Signature {
                function: "tlaloc_forward".into(),
                detail: format!("the weight plan has no slot {slot:?}"),
            })
    }

    fn dims(&self, v: Value) -> Result<Vec<usize>, HloError> {
        Ok(self.f.ty(v)?.dims.clone())
    }

    fn precision(&self, dtype: ScalarType) -> Option<Precision> {
        (dtype == ScalarType::F32).then_some(Precision::Highest)
    }

    /// `x [N, in] f32` times the `[out, in]` weight `slot`, plus the optional f32 bias;
    /// returns `[N, out]` f32.
    fn linear(&mut self, x: Value, slot: &str, bias: Option<&str>) -> Result<Value, HloError> {
        let block = self.blocks.get(slot).map(|(format, _)| *format);
        let x = if self.matrix == ScalarType::F32 {
            x
        } else {
            self.f.convert(x, self.matrix)?
        };
        let (n, inner) = {
            let d = self.dims(x)?;
            (d[0], d[1])
        };
        let out = self.dims(self.operand(slot)?)?[0];
        let cpu_kernel = self.kind == BodyKind::Cpu && n <= kernels::CPU_VARIANT_MAX_ROWS;
        // A block kernel multiplies by the f32 weight the portable body's dequantized matrix
        // holds; a bf16 portable body rounds those weights to bf16 first, so there the variant
        // dequantizes as the portable body does and calls the dense kernel (the same function,
        // not a more exact one).
        let block_kernel = block.filter(|_| cpu_kernel && self.matrix == ScalarType::F32);
        let round = block.is_some() && self.quantize_activations;
        let y = if let Some(format) = block_kernel {
            // The kernel takes the raw blocks; x is f32, as the portable body's dot takes it
            // (an `_xq8` kernel rounds x itself, as the portable body does below).
            let x = self.in_dtype(x, ScalarType::F32)?;
            let w = self.operand(slot)?;
            let target = if round {
                kernels::cpu_matmul_blocks_xq8(format)
            } else {
                kernels::cpu_matmul_blocks(format)
            };
            self.f
                .custom_call(target, &[x, w], f32_ty(&[n, out]), &[])?
        } else if round {
            let x = self.round_activation_blocks(x)?;
            let w = self.weight(slot)?;
            let dims = DotDims::contracting(1, 1);
            let precision = self.precision(self.matrix);
            self.f
                .dot_general(x, w, &dims, precision, Some(ScalarType::F32))?
        } else if cpu_kernel {
            let w = self.weight(slot)?;
            // The host kernel takes x in f32; x was rounded to the matrix dtype above, as the
            // portable dot takes it, so the products are the same.
            let x = if self.matrix == ScalarType::F32 {
                x
            } else {
                self.f.convert(x, ScalarType::F32)?
            };
            self.f
                .custom_call(kernels::CPU_MATMUL, &[x, w], f32_ty(&[n, out]), &[])?
        } else if n == 1 && self.matrix != ScalarType::F32 {
            let w = self.weight(slot)?;
            // One row against a low-precision matrix: multiply and reduce in f32 instead of a
            // dot. XLA GPU runs this as a reduction fusion that streams the weight at a higher
            // fraction of memory bandwidth than its GEMM for M = 1 (scripts/gpu/matvec_probe.py);
            // the products are the same bf16 x bf16 values accumulated in f32.
            let x = self.f.convert(x, ScalarType::F32)?;
            let x = self.f.reshape(x, [inner])?;
            let x = self.f.broadcast_in_dim(x, [out, inner], [1])?;
            let w = self.f.convert(w, ScalarType::F32)?;
            let products = self.f.mul(x, w)?;
            let y = self.f.reduce_sum(products, [1])?;
            self.f.reshape(y, [1, out])?
        } else {
            let w = self.weight(slot)?;
            let dims = DotDims::contracting(1, 1);
            let precision = self.precision(self.matrix);
            self.f
                .dot_general(x, w, &dims, precision, Some(ScalarType::F32))?
        };
        match bias {
            None => Ok(y),
            Some(bias) => {
                let b = self.weight(bias)?;
                let out = self.dims(y)?;
                let b = self.f.broadcast_in_dim(b, out, [1])?;
                self.f.add(y, b)
            }
        }
    }

    /// `x [N, K] f32` with each 32-element block of a row replaced by `s · code`, `s = max|x| /
    /// 127`, `code = round_half_even(x / s)` clamped to `[-127, 127]`: the rounding the `_xq8`
    /// kernels' contract states (`kernels::CPU_MATMUL_Q8_0_XQ8`), by the K/V pools' own
    /// symmetric quantization ([`quantize_rows`]) over `[N, K / 32, 32]`.
    fn round_activation_blocks(&mut self, x: Value) -> Result<Value, HloError> {
        let dims = self.dims(x)?;
        let (n, k) = (dims[0], dims[1]);
        let block = kernels::ACTIVATION_BLOCK;
        let blocks = self.f.reshape(x, [n, k / block, block])?;
        let quant = KvQuant {
            code: ScalarType::I8,
            code_max: kernels::ACTIVATION_CODE_MAX,
        };
        let (codes, scales) = quantize_rows(self, quant, blocks)?;
        let codes = self.f.convert(codes, ScalarType::F32)?;
        let scales = self
            .f
            .broadcast_in_dim(scales, [n, k / block, block], [0, 1])?;
        let rounded = self.f.mul(codes, scales)?;
        self.f.reshape(rounded, [n, k])
    }

    /// RMSNorm of `x [N, H] f32` with the f32 weight `slot`.
    fn rms_norm(&mut self, x: Value, slot: &str, eps: f64) -> Result<Value, HloError> {
        let dims = self.dims(x)?;
        let (n, h) = (dims[0], dims[1]);
        let squares = self.f.mul(x, x)?;
        let sum = self.f.reduce_sum(squares, [1])?;
        let width = self.f.full(&f32_ty(&[n]), h as f64)?;
        let mean = self.f.div(sum, width)?;
        let eps = self.f.full(&f32_ty(&[n]), eps)?;
        let variance = self.f.add(mean, eps)?;
        let scale = self.f.rsqrt(variance)?;
        let scale = self.f.broadcast_in_dim(scale, [n, h], [0])?;
        let normed = self.f.mul(x, scale)?;
        let w = self.weight(slot)?;
        let w = self.f.broadcast_in_dim(w, [n, h], [1])?;
        self.f.mul(w, normed)
    }

    /// Per-head RMSNorm of `x [N, heads + kvHeads, D]` over `D`: the query heads take the
    /// first `D` values of the slot's weight, the key heads the next `D` (transformers' Qwen3
    /// `q_norm` / `k_norm`, in f32). The heads are in [`Graph::split_qkv`]'s order: queries
    /// then keys, or, split over devices, each shard's queries then its keys.
    fn head_rms_norm(
        &mut self,
        x: Value,
        slot: &str,
        heads: usize,
        eps: f64,
    ) -> Result<Value, HloError> {
        let dims = self.dims(x)?;
        let (n, all, d) = (dims[0], dims[1], dims[2]);
        let squares = self.f.mul(x, x)?;
        let sum = self.f.reduce_sum(squares, [2])?;
        let width = self.f.full(&f32_ty(&[n, all]), d as f64)?;
        let mean = self.f.div(sum, width)?;
        let eps = self.f.full(&f32_ty(&[n, all]), eps)?;
        let variance = self.f.add(mean, eps)?;
        let scale = self.f.rsqrt(variance)?;
        let scale = self.f.broadcast_in_dim(scale, [n, all, d], [0, 1])?;
        let normed = self.f.mul(x, scale)?;
        let w = self.weight(slot)?;
        let wq = self.f.slice(w, [0], [d], [1])?;
        let wk = self.f.slice(w, [d], [2 * d], [1])?;
        let w = if self.shards == 1 {
            let wq = self.f.broadcast_in_dim(wq, [n, heads, d], [2])?;
            let wk = self.f.broadcast_in_dim(wk, [n, all - heads, d], [2])?;
            self.f.concatenate(&[wq, wk], 1)?
        } else {
            // Shard-major heads: each shard's queries, then its keys.
            let s = self.shards;
            let (hq, hk) = (heads / s, (all - heads) / s);
            let wq = self.f.broadcast_in_dim(wq, [n, s, hq, d], [3])?;
            let wk = self.f.broadcast_in_dim(wk, [n, s, hk, d], [3])?;
            let w = self.f.concatenate(&[wq, wk], 2)?;
            self.f.reshape(w, [n, all, d])?
        };
        self.f.mul(w, normed)
    }

    /// PyTorch's tanh-approximated GELU of `x` f32:
    /// `0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))`.
    fn gelu_tanh(&mut self, x: Value) -> Result<Value, HloError> {
        let ty = self.f.ty(x)?.clone();
        let cube = self.f.mul(x, x)?;
        let cube = self.f.mul(cube, x)?;
        let kappa = self.f.full(&ty, 0.044715)?;
        let inner = self.f.mul(kappa, cube)?;
        let inner = self.f.add(x, inner)?;
        // PyTorch's kBeta = M_SQRT2 * M_2_SQRTPI * 0.5, rounded to f32.
        let beta = std::f64::consts::SQRT_2 * std::f64::consts::FRAC_2_SQRT_PI * 0.5;
        let beta = self.f.full(&ty, beta)?;
        let inner = self.f.mul(beta, inner)?;
        let t = self.f.tanh(inner)?;
        let one = self.f.full(&ty, 1.0)?;
        let t = self.f.add(one, t)?;
        let half = self.f.full(&ty, 0.5)?;
        let hx = self.f.mul(half, x)?;
        self.f.mul(hx, t)
    }

    /// RoPE of `x [N, heads, D]` with `cos`, `sin` already broadcast to `[N, heads, D]`:
    /// `x * cos + rotate_half(x) * sin`.
    fn rope(&mut self, x: Value, cos: Value, sin: Value) -> Result<Value, HloError> {
        let dims = self.dims(x)?;
        let (n, heads, d) = (dims[0], dims[1], dims[2]);
        let half = d / 2;
        let first = self.f.slice(x, [0, 0, 0], [n, heads, half], [1, 1, 1])?;
        let second = self.f.slice(x, [0, 0, half], [n, heads, d], [1, 1, 1])?;
        let neg_second = self.f.neg(second)?;
        let rotated = self.f.concatenate(&[neg_second, first], 2)?;
        let a = self.f.mul(x, cos)?;
        let b = self.f.mul(rotated, sin)?;
        self.f.add(a, b)
    }

    /// `x` in the pool dtype (unchanged when the pools are f32).
    fn in_pool_dtype(&mut self, x: Value) -> Result<Value, HloError> {
        self.in_dtype(x, self.pool)
    }

    /// `x` in the dtype the attention dots take (unchanged when it is already).
    fn in_attention_dtype(&mut self, x: Value) -> Result<Value, HloError> {
        self.in_dtype(x, self.attention)
    }

    fn in_dtype(&mut self, x: Value, dtype: ScalarType) -> Result<Value, HloError> {
        if self.f.ty(x)?.dtype == dtype {
            Ok(x)
        } else {
            self.f.convert(x, dtype)
        }
    }

    /// `x [B, C, kvHeads]` f32 (one scale per key) broadcast over the scores
    /// `[B, kvHeads, T, groups, C]`.
    fn per_key(&mut self, x: Value, scores_dims: [usize; 5]) -> Result<Value, HloError> {
        let x = self.f.transpose(x, [0, 2, 1])?;
        self.f.broadcast_in_dim(x, scores_dims, [0, 1, 4])
    }

    /// The fused q/k/v projection `qkv [N, (heads + 2 kvHeads) * D]` as the queries and keys
    /// side by side `[N, heads + kvHeads, D]` (RoPE and the q/k norm take them together) and
    /// the values `[N, kvHeads, D]`. Split over devices the rows are shard-major
    /// ([`crate::tensor_parallel`]), so the heads of `qk` are each shard's queries then its
    /// keys; [`Graph::split_qk`] undoes that.
    fn split_qkv(
        &mut self,
        qkv: Value,
        (heads, kv_heads, d): (usize, usize, usize),
    ) -> Result<(Value, Value), HloError> {
        let n = self.dims(qkv)?[0];
        let qk_heads = heads + kv_heads;
        if self.shards == 1 {
            let qkv = self.f.reshape(qkv, [n, qk_heads + kv_heads, d])?;
            let qk = self.f.slice(qkv, [0, 0, 0], [n, qk_heads, d], [1, 1, 1])?;
            let v = self.f.slice(
                qkv,
                [0, qk_heads, 0],
                [n, qk_heads + kv_heads, d],
                [1, 1, 1],
            )?;
            return Ok((qk, v));
        }
        let s = self.shards;
        let (hq, hk) = (heads / s, kv_heads / s);
        let per = hq + 2 * hk;
        let qkv = self.f.reshape(qkv, [n, s, per, d])?;
        let qk = self
            .f
            .slice(qkv, [0, 0, 0, 0], [n, s, hq + hk, d], [1, 1, 1, 1])?;
        let qk = self.f.reshape(qk, [n, qk_heads, d])?;
        let v = self
            .f
            .slice(qkv, [0, 0, hq + hk, 0], [n, s, per, d], [1, 1, 1, 1])?;
        let v = self.f.reshape(v, [n, kv_heads, d])?;
        Ok((qk, v))
    }

    /// The queries `[N, heads, D]` and keys `[N, kvHeads, D]` of `qk` as [`Graph::split_qkv`]
    /// laid them out, each in head order.
    fn split_qk(
        &mut self,
        qk: Value,
        (heads, kv_heads, d): (usize, usize, usize),
    ) -> Result<(Value, Value), HloError> {
        let n = self.dims(qk)?[0];
        let qk_heads = heads + kv_heads;
        if self.shards == 1 {
            let q = self.f.slice(qk, [0, 0, 0], [n, heads, d], [1, 1, 1])?;
            let k = self
                .f
                .slice(qk, [0, heads, 0], [n, qk_heads, d], [1, 1, 1])?;
            return Ok((q, k));
        }
        let s = self.shards;
        let (hq, hk) = (heads / s, kv_heads / s);
        let qk = self.f.reshape(qk, [n, s, hq + hk, d])?;
        let q = self
            .f
            .slice(qk, [0, 0, 0, 0], [n, s, hq, d], [1, 1, 1, 1])?;
        let q = self.f.reshape(q, [n, heads, d])?;
        let k = self
            .f
            .slice(qk, [0, 0, hq, 0], [n, s, hq + hk, d], [1, 1, 1, 1])?;
        let k = self.f.reshape(k, [n, kv_heads, d])?;
        Ok((q, k))
    }

    /// The fused gate/up projection `[N, 2 * I]` as gate and up `[N, I]` each; split over
    /// devices its columns are shard-major (each shard's gate, then its up).
    fn split_gate_up(
        &mut self,
        gate_up: Value,
        intermediate: usize,
    ) -> Result<(Value, Value), HloError> {
        if self.shards == 1 {
            let gate = self.columns(gate_up, 0, intermediate)?;
            let up = self.columns(gate_up, intermediate, 2 * intermediate)?;
            return Ok((gate, up));
        }
        let n = self.dims(gate_up)?[0];
        let s = self.shards;
        let piece = intermediate / s;
        let gate_up = self.f.reshape(gate_up, [n, s, 2, piece])?;
        let gate = self
            .f
            .slice(gate_up, [0, 0, 0, 0], [n, s, 1, piece], [1, 1, 1, 1])?;
        let up = self
            .f
            .slice(gate_up, [0, 0, 1, 0], [n, s, 2, piece], [1, 1, 1, 1])?;
        Ok((
            self.f.reshape(gate, [n, intermediate])?,
            self.f.reshape(up, [n, intermediate])?,
        ))
    }

    /// Columns `[start, limit)` of `x [N, W]`.
    fn columns(&mut self, x: Value, start: usize, limit: usize) -> Result<Value, HloError> {
        let n = self.dims(x)?[0];
        self.f.slice(x, [0, start], [n, limit], [1, 1])
    }

    /// Rows of `table [R, D]` at `indices [N]` i32: `[N, D]`.
    fn gather_rows(&mut self, table: Value, indices: Value) -> Result<Value, HloError> {
        let d = self.dims(table)?[1];
        self.f.gather(
            table,
            indices,
            &GatherSpec {
                offset_dims: vec![1],
                collapsed_slice_dims: vec![0],
                start_index_map: vec![0],
                index_vector_dim: 1,
                slice_sizes: vec![1, d],
                indices_are_sorted: false,
            },
        )
    }
}

struct Inputs {
    positions: Value,
    block_tables: Value,
    seq_lens: Value,
    slot_mapping: Value,
}

fn build(
    g: &mut Graph,
    plan: &WeightPlan,
    kv: &KvCacheLayout,
    point: LadderPoint,
) -> Result<Module, HloError> {
    let c = &plan.config;
    let (b, t) = (point.batch, point.tokens);
    let n = b * t;
    let context = point.context;
    let (heads, kv_heads, d) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
    let groups = heads / kv_heads;
    let hidden = c.hidden_size;
    let i32_ty = |dims: &[usize]| TensorType::new(ScalarType::I32, dims.to_vec());

    // The step inputs as the artifact's step contract declares them (names, dims, i32).
    let mut step_arg = |input: StepInput| {
        let ty = TensorType::new(
            hlo_dtype_unchecked(StepInput::DTYPE),
            input.dims(point, kv.block_size),
        );
        g.f.arg_named(input.name(), ty)
    };
    let mut step_args = Vec::with_capacity(StepInput::ALL.len());
    for input in StepInput::ALL {
        step_args.push(step_arg(input)?);
    }
    let step_value = |input: StepInput| step_args[input.index()];
    let token_ids = step_value(StepInput::TokenIds);
    let inputs = Inputs {
        positions: step_value(StepInput::Positions),
        block_tables: step_value(StepInput::BlockTables),
        seq_lens: step_value(StepInput::SeqLens),
        slot_mapping: step_value(StepInput::SlotMapping),
    };
    for slot in &plan.slots {
        // Checked by forward_program before building.
        let (dtype, dims) = slot.operand().unwrap_or((slot.dtype, slot.dims.clone()));
        let v = g.f.arg_named(
            &slot.name,
            TensorType::new(hlo_dtype_unchecked(dtype), dims),
        )?;
        g.weights.insert(slot.name.clone(), v);
        if let Some(format) = slot.block {
            g.blocks
                .insert(slot.name.clone(), (format, slot.dims.clone()));
        }
    }
    // The donated K/V operands as the step contract lists them (codes, then scales per layer).
    let pool_operands = PoolOperand::all(kv);
    let mut pools = vec![LayerPools::default(); c.num_hidden_layers];
    let mut pool_args = Vec::with_capacity(pool_operands.len());
    for operand in &pool_operands {
        let ty = TensorType::new(hlo_dtype_unchecked(operand.dtype), operand.dims.clone());
        let v = g.f.arg_named(&operand.name, ty)?;
        pool_args.push(v);
        let layer = &mut pools[operand.layer];
        match operand.kind {
            KvPool::K => layer.k = Some(v),
            KvPool::V => layer.v = Some(v),
            KvPool::KScales => layer.k_scales = Some(v),
            KvPool::VScales => layer.v_scales = Some(v),
        }
    }

    let tp = plan.tensor_parallel;
    if tp > 1 {
        shard_operands(g, plan, &step_args, &pool_args)?;
    }

    // Embedding and the RoPE rows of every token.
    let flat_ids = g.f.reshape(token_ids, [n])?;
    let mut h = g.embedding_rows(flat_ids)?;
    if c.scale_embedding {
        // transformers multiplies by sqrt(hidden) rounded to the embedding's dtype, in it.
        let scale = g.f.full(
            &TensorType::new(g.matrix, vec![n, hidden]),
            (hidden as f64).sqrt(),
        )?;
        h = g.f.mul(h, scale)?;
    }
    if g.matrix != ScalarType::F32 {
        h = g.f.convert(h, ScalarType::F32)?;
    }
    let flat_positions = g.f.reshape(inputs.positions, [n])?;
    let cos_table = g.weight(ROPE_COS_SLOT)?;
    let sin_table = g.weight(ROPE_SIN_SLOT)?;
    let cos = g.gather_rows(cos_table, flat_positions)?;
    let sin = g.gather_rows(sin_table, flat_positions)?;
    let local_rope = match c.local_rope_theta {
        Some(_) => {
            let cos_table = g.weight(LOCAL_ROPE_COS_SLOT)?;
            let sin_table = g.weight(LOCAL_ROPE_SIN_SLOT)?;
            let cos = g.gather_rows(cos_table, flat_positions)?;
            let sin = g.gather_rows(sin_table, flat_positions)?;
            Some((cos, sin))
        }
        None => None,
    };

    // The attention masks, built once per step: [B, kvHeads, T, groups, C]. Every layer takes
    // causality (`c <= position`) and liveness (`c < seqLen`); a windowed layer also
    // `c > position - window` (transformers' `sliding_window_overlay`), one mask per distinct
    // window.
    let scores_dims = [b, kv_heads, t, groups, context];
    let key_index = g.f.iota(i32_ty(&scores_dims), 4)?;
    let position_b =
        g.f.broadcast_in_dim(inputs.positions, scores_dims, [0, 2])?;
    let seq_len_b = g.f.broadcast_in_dim(inputs.seq_lens, scores_dims, [0])?;
    let causal = g.f.compare(key_index, CompareDirection::Le, position_b)?;
    let live = g.f.compare(key_index, CompareDirection::Lt, seq_len_b)?;
    let full_mask = g.f.and(causal, live)?;
    let mut window_masks: BTreeMap<usize, Value> = BTreeMap::new();
    for window in c.layer_windows.widths() {
        // A window no position can reach past is the full mask.
        let mask = if window >= context {
            full_mask
        } else {
            let w = g.f.splat(Scalar::I32(window as i32), scores_dims)?;
            let first_seen = g.f.sub(position_b, w)?;
            let inside = g.f.compare(key_index, CompareDirection::Gt, first_seen)?;
            g.f.and(full_mask, inside)?
        };
        window_masks.insert(window, mask);
    }
    let masked_value = g.f.splat(Scalar::lowest(ScalarType::F32), scores_dims)?;
    let scale = g.f.full(&f32_ty(&scores_dims), c.attention_scale)?;

    // q and k heads side by side get RoPE together: one broadcast of the tables per step.
    let qk_heads = heads + kv_heads;
    let cos = g.f.broadcast_in_dim(cos, [n, qk_heads, d], [0, 2])?;
    let sin = g.f.broadcast_in_dim(sin, [n, qk_heads, d], [0, 2])?;
    let local_rope = match local_rope {
        Some((cos, sin)) => Some((
            g.f.broadcast_in_dim(cos, [n, qk_heads, d], [0, 2])?,
            g.f.broadcast_in_dim(sin, [n, qk_heads, d], [0, 2])?,
        )),
        None => None,
    };
    let intermediate = c.intermediate_size;

    let slot = |layer: usize, name: &str| layer_slot(layer, name);
    let bias = |layer: usize, name: &str, present: bool| present.then(|| layer_slot(layer, name));
    // The `cpu` variant reads unquantized pools in place with the host attention kernel
    // (quantized pools keep the portable attention: the kernel has no scale pools).
    let host_attention = g.kind == BodyKind::Cpu && g.quant.is_none();
    let mut new_pools = Vec::with_capacity(pool_args.len());
    for (layer, layer_pools) in pools.iter().enumerate() {
        let residual = h;
        let x = g.rms_norm(h, &slot(layer, "input_norm"), c.rms_norm_eps)?;
        // One matmul for q, k and v: [N, (heads + 2 * kvHeads) * D].
        let qkv = g.linear(
            x,
            &slot(layer, "qkv_proj"),
            bias(layer, "qkv_bias", c.qkv_bias).as_deref(),
        )?;
        let (qk, v) = g.split_qkv(qkv, (heads, kv_heads, d))?;
        let qk = if c.qk_norm {
            g.head_rms_norm(qk, &slot(layer, "qk_norm"), heads, c.rms_norm_eps)?
        } else {
            qk
        };
        let window = c.layer_windows.window(layer);
        // Sliding-window layers take their own RoPE base where the model has one.
        let (layer_cos, layer_sin) = match (window, local_rope) {
            (Some(_), Some(tables)) => tables,
            _ => (cos, sin),
        };
        let qk = g.rope(qk, layer_cos, layer_sin)?;
        let (q, k) = g.split_qk(qk, (heads, kv_heads, d))?;

        let operand = |v: Option<Value>| {
            v.ok_or_else(|| HloError::Signature {
                function: "tlaloc_forward".into(),
                detail: format!("layer {layer} lacks a K/V operand of the step contract"),
            })
        };
        let keys = write_and_read(
            g,
            kv,
            (operand(layer_pools.k)?, layer_pools.k_scales),
            k,
            &inputs,
            b,
            context,
            !host_attention,
        )?;
        let values = write_and_read(
            g,
            kv,
            (operand(layer_pools.v)?, layer_pools.v_scales),
            v,
            &inputs,
            b,
            context,
            !host_attention,
        )?;
        new_pools.push(keys.pool);
        new_pools.push(values.pool);
        if let (Some(k_scales), Some(v_scales)) = (keys.scale_pool, values.scale_pool) {
            new_pools.push(k_scales);
            new_pools.push(v_scales);
        }

        let attended = if host_attention {
            // Window widths no position can reach past are the full mask, as below.
            let window = window.filter(|&w| w < context).unwrap_or(0);
            let window = g.f.splat(Scalar::I32(window as i32), Vec::<usize>::new())?;
            let scale = g.f.full(&f32_ty(&[]), c.attention_scale)?;
            g.f.custom_call(
                kernels::CPU_PAGED_ATTENTION,
                &[
                    q,
                    keys.pool,
                    values.pool,
                    inputs.block_tables,
                    inputs.positions,
                    inputs.seq_lens,
                    scale,
                    window,
                ],
                f32_ty(&[n, heads * d]),
                &[],
            )?
        } else {
            let (Some(keys_pages), Some(values_pages)) = (keys.pages, values.pages) else {
                unreachable!("write_and_read gathers the pages unless the host kernel reads them");
            };
            // The attention dots take the pages in the pool dtype (bf16 pages are not widened;
            // the small operand is narrowed instead), quantized codes widened to the matrix dtype,
            // and accumulate in f32.
            let attention_precision = g.precision(g.attention);
            // Scores [B, kvHeads, T, groups, C]: query head h uses KV head h / groups.
            let q = g.f.reshape(q, [b, t, kv_heads, groups, d])?;
            let q = g.in_attention_dtype(q)?;
            let scores = g.f.dot_general(
                q,
                keys_pages,
                &DotDims {
                    lhs_batch: vec![0, 2],
                    rhs_batch: vec![0, 2],
                    lhs_contract: vec![4],
                    rhs_contract: vec![3],
                },
                attention_precision,
                Some(ScalarType::F32),
            )?;
            let mut scores = g.f.mul(scores, scale)?;
            if let Some(k_scales) = keys.scales {
                let k_scales = g.per_key(k_scales, scores_dims)?;
                scores = g.f.mul(scores, k_scales)?;
            }
            let mask = match window {
                Some(window) => window_masks[&window],
                None => full_mask,
            };
            let scores = g.f.select(mask, scores, masked_value)?;
            let max = g.f.reduce_max(scores, [4])?;
            let max = g.f.broadcast_in_dim(max, scores_dims, [0, 1, 2, 3])?;
            let shifted = g.f.sub(scores, max)?;
            let exp = g.f.exp(shifted)?;
            let sum = g.f.reduce_sum(exp, [4])?;
            let sum = g.f.broadcast_in_dim(sum, scores_dims, [0, 1, 2, 3])?;
            let mut probs = g.f.div(exp, sum)?;
            if let Some(v_scales) = values.scales {
                let v_scales = g.per_key(v_scales, scores_dims)?;
                probs = g.f.mul(probs, v_scales)?;
            }
            let probs = g.in_attention_dtype(probs)?;
            // [B, kvHeads, T, groups, D] -> [B, T, kvHeads, groups, D] -> [N, heads * D].
            let attended = g.f.dot_general(
                probs,
                values_pages,
                &DotDims {
                    lhs_batch: vec![0, 1],
                    rhs_batch: vec![0, 2],
                    lhs_contract: vec![4],
                    rhs_contract: vec![1],
                },
                attention_precision,
                Some(ScalarType::F32),
            )?;
            let attended = g.f.transpose(attended, [0, 2, 1, 3, 4])?;
            g.f.reshape(attended, [n, heads * d])?
        };
        let o = g.linear(
            attended,
            &slot(layer, "o_proj"),
            bias(layer, "o_bias", c.o_bias).as_deref(),
        )?;
        let o = if c.sandwich_norms {
            g.rms_norm(o, &slot(layer, "attention_out_norm"), c.rms_norm_eps)?
        } else {
            o
        };
        h = g.f.add(residual, o)?;

        let residual = h;
        let x = g.rms_norm(h, &slot(layer, "post_attention_norm"), c.rms_norm_eps)?;
        // One matmul for gate and up: [N, 2 * intermediate].
        let gate_up = g.linear(
            x,
            &slot(layer, "gate_up_proj"),
            bias(layer, "gate_up_bias", c.mlp_bias).as_deref(),
        )?;
        let (gate, up) = g.split_gate_up(gate_up, intermediate)?;
        let gate = match c.activation {
            Activation::Silu => {
                let sigmoid = g.f.logistic(gate)?;
                g.f.mul(gate, sigmoid)?
            }
            Activation::GeluTanh => g.gelu_tanh(gate)?,
        };
        let act = g.f.mul(gate, up)?;
        let down = g.linear(
            act,
            &slot(layer, "down_proj"),
            bias(layer, "down_bias", c.mlp_bias).as_deref(),
        )?;
        let down = if c.sandwich_norms {
            g.rms_norm(down, &slot(layer, "mlp_out_norm"), c.rms_norm_eps)?
        } else {
            down
        };
        h = g.f.add(residual, down)?;
    }

    // The last real token of each row: the lowest t whose position is seqLen - 1.
    let one = g.f.splat(Scalar::I32(1), [b])?;
    let last_position = g.f.sub(inputs.seq_lens, one)?;
    let last_position = g.f.broadcast_in_dim(last_position, [b, t], [0])?;
    let is_last =
        g.f.compare(inputs.positions, CompareDirection::Eq, last_position)?;
    let token_index = g.f.iota(i32_ty(&[b, t]), 1)?;
    let past_end = g.f.splat(Scalar::I32(t as i32), [b, t])?;
    let candidates = g.f.select(is_last, token_index, past_end)?;
    let chosen = g.f.reduce_min(candidates, [1])?;
    let chosen = g.f.broadcast_in_dim(chosen, [b, t], [0])?;
    let one_hot = g.f.compare(token_index, CompareDirection::Eq, chosen)?;
    let one_hot = g.f.broadcast_in_dim(one_hot, [b, t, hidden], [0, 1])?;
    let h = g.f.reshape(h, [b, t, hidden])?;
    let zeros = g.f.splat(Scalar::F32(0.0), [b, t, hidden])?;
    let picked = g.f.select(one_hot, h, zeros)?;
    let last = g.f.reduce_sum(picked, [1])?;

    let last = g.rms_norm(last, FINAL_NORM_SLOT, c.rms_norm_eps)?;
    let head = if c.tie_word_embeddings {
        EMBEDDING_SLOT
    } else {
        LM_HEAD_SLOT
    };
    let mut logits = g.linear(last, head, None)?;
    if let Some(cap) = c.final_logit_softcap {
        // transformers: logits / cap, tanh, * cap.
        let cap = g.f.full(&f32_ty(&[b, c.vocab_size]), cap)?;
        let scaled = g.f.div(logits, cap)?;
        let capped = g.f.tanh(scaled)?;
        logits = g.f.mul(capped, cap)?;
    }
    let (_, next_tokens) = g.f.argmax(logits, 1, ScalarType::I32)?;
    let next_token_ids = g.f.reshape(next_tokens, [b, 1])?;
    let [next_positions, next_seq_lens, next_slots] =
        next_decode_inputs(g, &inputs, point, kv.block_size)?;

    let mut results = vec![
        logits,
        next_tokens,
        next_token_ids,
        next_positions,
        next_seq_lens,
        next_slots,
    ];
    debug_assert_eq!(results.len(), StepOutput::ALL.len());
    for input in StepInput::ALL {
        if let Some(output) = input.donated_to(point) {
            g.f.donate(step_args[input.index()], output.index())?;
        }
    }
    for (i, &arg) in pool_args.iter().enumerate() {
        g.f.donate(arg, results.len() + i)?;
        if tp > 1 {
            g.f.shard_result(results.len() + i, Sharding::split(POOL_SPLIT_AXIS, tp))?;
        }
    }
    if tp > 1 {
        for output in 0..results.len() {
            g.f.shard_result(output, Sharding::Replicated)?;
        }
    }
    results.extend(new_pools);
    let f = std::mem::replace(&mut g.f, FunctionBuilder::new("tlaloc_forward"));
    f.finish(&results)
}

/// The `positions [B, 1]`, `seqLens [B]` and `slotMapping [B]` of the decode step after this
/// one, by the step contract's rule (`tlaloc_artifact::next_decode_row`): a live row (first
/// slot not -1) moves to position `seqLens`, one longer, with the slot its block table gives
/// that position (-1 past the context bucket); a dead row keeps the padding values. The page
/// is picked by comparing columns rather than gathered, so no index can fall out of bounds.
fn next_decode_inputs(
    g: &mut Graph,
    inputs: &Inputs,
    point: LadderPoint,
    block_size: usize,
) -> Result<[Value; 3], HloError> {
    let (b, t) = (point.batch, point.tokens);
    let cols = point.context / block_size;
    let splat =
        |g: &mut Graph, value: i32, dims: &[usize]| g.f.splat(Scalar::I32(value), dims.to_vec());

    let slots = g.f.reshape(inputs.slot_mapping, [b, t])?;
    let first_slot = g.f.slice(slots, [0, 0], [b, 1], [1, 1])?;
    let first_slot = g.f.reshape(first_slot, [b])?;
    let zero = splat(g, 0, &[b])?;
    let live = g.f.compare(first_slot, CompareDirection::Ge, zero)?;

    let position = inputs.seq_lens;
    let block = splat(g, block_size as i32, &[b])?;
    let column = g.f.div(position, block)?;
    let column_start = g.f.mul(column, block)?;
    let offset = g.f.sub(position, column_start)?;
    let column_b = g.f.broadcast_in_dim(column, [b, cols], [0])?;
    let columns =
        g.f.iota(TensorType::new(ScalarType::I32, vec![b, cols]), 1)?;
    let in_column = g.f.compare(columns, CompareDirection::Eq, column_b)?;
    let no_page = splat(g, 0, &[b, cols])?;
    let page = g.f.select(in_column, inputs.block_tables, no_page)?;
    let page = g.f.reduce_sum(page, [1])?;
    let page_start = g.f.mul(page, block)?;
    let slot = g.f.add(page_start, offset)?;
    let end = splat(g, (cols * block_size) as i32, &[b])?;
    let inside = g.f.compare(position, CompareDirection::Lt, end)?;
    let writes = g.f.and(live, inside)?;
    let dead_slot = splat(g, StepInput::SlotMapping.padding(), &[b])?;
    let next_slot = g.f.select(writes, slot, dead_slot)?;

    let dead_position = splat(g, StepInput::Positions.padding(), &[b])?;
    let next_position = g.f.select(live, position, dead_position)?;
    let next_position = g.f.reshape(next_position, [b, 1])?;
    let one = splat(g, 1, &[b])?;
    let longer = g.f.add(position, one)?;
    let dead_len = splat(g, StepInput::SeqLens.padding(), &[b])?;
    let next_len = g.f.select(live, longer, dead_len)?;
    Ok([next_position, next_len, next_slot])
}

/// The SPMD layout of every operand of a program split over `plan.tensor_parallel` devices:
/// the step inputs replicated, each weight split along its slot's axis or replicated, and the
/// K/V (and scale) pools split over their KV heads.
fn shard_operands(
    g: &mut Graph,
    plan: &WeightPlan,
    step: &[Value],
    pools: &[Value],
) -> Result<(), HloError> {
    let tp = plan.tensor_parallel;
    g.f.set_partitions(tp)?;
    for &v in step {
        g.f.shard_argument(v, Sharding::Replicated)?;
    }
    for slot in &plan.slots {
        let sharding = match slot.split {
            Some(axis) => Sharding::split(axis, tp),
            None => Sharding::Replicated,
        };
        let v = g.operand(&slot.name)?;
        g.f.shard_argument(v, sharding)?;
    }
    for &v in pools {
        g.f.shard_argument(v, Sharding::split(POOL_SPLIT_AXIS, tp))?;
    }
    Ok(())
}

/// One layer's donated K/V operands, as declared.
#[derive(Debug, Clone, Copy, Default)]
struct LayerPools {
    k: Option<Value>,
    v: Option<Value>,
    k_scales: Option<Value>,
    v_scales: Option<Value>,
}

/// What one K or V write-and-read returns.
struct Pages {
    /// The updated pool.
    pool: Value,
    /// The updated scale pool, for quantized pools.
    scale_pool: Option<Value>,
    /// Every row's keys or values `[B, C, kvHeads, D]` in the attention dtype, when gathered.
    pages: Option<Value>,
    /// Their scales `[B, C, kvHeads]` f32, for quantized pools.
    scales: Option<Value>,
}

/// Writes `rows [N, kvHeads, D]` f32 into `pool` at `slotMapping` (one scatter over the batch;
/// for quantized pools the codes and, by the same index, their scales) and, with `gather`,
/// reads each row's pages back by `blockTables` (one gather each; the host attention kernel
/// reads the updated pool in place instead).
#[allow(clippy::too_many_arguments)]
fn write_and_read(
    g: &mut Graph,
    kv: &KvCacheLayout,
    (pool, scale_pool): (Value, Option<Value>),
    rows: Value,
    inputs: &Inputs,
    b: usize,
    context: usize,
    gather: bool,
) -> Result<Pages, HloError> {
    let (blocks, block_size, kv_heads, d) =
        (kv.num_blocks, kv.block_size, kv.num_kv_heads, kv.head_dim);
    let (codes, scales) = match (g.quant, scale_pool) {
        (Some(quant), Some(_)) => {
            let (codes, scales) = quantize_rows(g, quant, rows)?;
            (codes, Some(scales))
        }
        _ => (g.in_pool_dtype(rows)?, None),
    };
    let updated = scatter_slots(g, pool, codes, inputs, &kv.pool_dims())?;
    // The write's only user: without it XLA CPU's fusion puts the write into both the gather's
    // fusion and the output's, and copy insertion then copies the whole pool (three times per
    // step) to keep the two in-place updates apart (docs/benchmarks.md).
    let updated = g.f.optimization_barrier(updated)?;
    let pages = if gather {
        let pages = gather_pages(g, updated, inputs, &[block_size, kv_heads, d])?;
        let pages = g.f.reshape(pages, [b, context, kv_heads, d])?;
        Some(g.in_attention_dtype(pages)?)
    } else {
        None
    };
    let (scale_pool, scale_pages) = match (scale_pool, scales) {
        (Some(scale_pool), Some(scales)) => {
            let updated = scatter_slots(
                g,
                scale_pool,
                scales,
                inputs,
                &[blocks, block_size, kv_heads],
            )?;
            let updated = g.f.optimization_barrier(updated)?;
            let pages = gather_pages(g, updated, inputs, &[block_size, kv_heads])?;
            let pages = g.f.reshape(pages, [b, context, kv_heads])?;
            (Some(updated), Some(pages))
        }
        _ => (None, None),
    };
    Ok(Pages {
        pool: updated,
        scale_pool,
        pages,
        scales: scale_pages,
    })
}

/// Symmetric absmax quantization of `rows [N, kvHeads, D]` f32, one scale per row and head:
/// the codes `[N, kvHeads, D]` in the code type and the scales `[N, kvHeads]` f32. An all-zero
/// row gets scale 0 and codes 0.
fn quantize_rows(g: &mut Graph, quant: KvQuant, rows: Value) -> Result<(Value, Value), HloError> {
    let dims = g.dims(rows)?;
    let (n, kv_heads) = (dims[0], dims[1]);
    let abs = g.f.abs(rows)?;
    let absmax = g.f.reduce_max(abs, [2])?;
    let code_max = g.f.full(&f32_ty(&[n, kv_heads]), quant.code_max)?;
    let scales = g.f.div(absmax, code_max)?;
    // Zero rows divide by 1 instead of 0: their codes are 0 either way, never NaN.
    let zero = g.f.full(&f32_ty(&[n, kv_heads]), 0.0)?;
    let one = g.f.full(&f32_ty(&[n, kv_heads]), 1.0)?;
    let nonzero = g.f.compare(scales, CompareDirection::Gt, zero)?;
    let divisor = g.f.select(nonzero, scales, one)?;
    let divisor = g.f.broadcast_in_dim(divisor, dims.clone(), [0, 1])?;
    let scaled = g.f.div(rows, divisor)?;
    // Rounding can carry |x| / s a hair past the code range; clamp it back.
    let scaled = if quant.code == ScalarType::I8 {
        g.f.round_nearest_even(scaled)?
    } else {
        scaled
    };
    let lo = g.f.full(&f32_ty(&dims), -quant.code_max)?;
    let hi = g.f.full(&f32_ty(&dims), quant.code_max)?;
    let clamped = g.f.clamp(lo, scaled, hi)?;
    let codes = g.f.convert(clamped, quant.code)?;
    Ok((codes, scales))
}

/// `pool` (`[numBlocks, blockSize, ...]`) with the token rows `updates [N, ...]` written at
/// `slotMapping`, by one scatter over the pool viewed as `[numBlocks * blockSize, ...]`.
fn scatter_slots(
    g: &mut Graph,
    pool: Value,
    updates: Value,
    inputs: &Inputs,
    pool_dims: &[usize],
) -> Result<Value, HloError> {
    let mut flat_dims = vec![pool_dims[0] * pool_dims[1]];
    flat_dims.extend_from_slice(&pool_dims[2..]);
    let window: Vec<usize> = (1..flat_dims.len()).collect();
    let flat = g.f.reshape(pool, flat_dims)?;
    let flat = g.f.scatter(
        flat,
        inputs.slot_mapping,
        updates,
        &ScatterSpec::leading_dim(window, ScatterUpdate::Replace),
    )?;
    g.f.reshape(flat, pool_dims.to_vec())
}

/// Each row's pages of `pool` by `blockTables`: `[B, C / blockSize, page...]`, one gather.
fn gather_pages(
    g: &mut Graph,
    pool: Value,
    inputs: &Inputs,
    page: &[usize],
) -> Result<Value, HloError> {
    let mut slice_sizes = vec![1];
    slice_sizes.extend_from_slice(page);
    g.f.gather(
        pool,
        inputs.block_tables,
        &GatherSpec {
            offset_dims: (2..2 + page.len()).collect(),
            collapsed_slice_dims: vec![0],
            start_index_map: vec![0],
            index_vector_dim: 2,
            slice_sizes,
            indices_are_sorted: false,
        },
    )
}

fn hlo_dtype_unchecked(dtype: Dtype) -> ScalarType {
    match dtype {
        Dtype::F32 => ScalarType::F32,
        Dtype::Bf16 => ScalarType::Bf16,
        Dtype::F16 => ScalarType::F16,
        Dtype::I32 => ScalarType::I32,
        Dtype::I8 => ScalarType::I8,
        Dtype::U8 => ScalarType::U8,
        Dtype::F8E4M3FN => ScalarType::F8E4M3FN,
    }
}

/// The artifact dtype of a builder type, for signatures read off a built module.
pub fn artifact_dtype(dtype: ScalarType) -> Option<Dtype> {
    Some(match dtype {
        ScalarType::F32 => Dtype::F32,
        ScalarType::Bf16 => Dtype::Bf16,
        ScalarType::F16 => Dtype::F16,
        ScalarType::I32 => Dtype::I32,
        ScalarType::I8 => Dtype::I8,
        ScalarType::U8 => Dtype::U8,
        ScalarType::F8E4M3FN => Dtype::F8E4M3FN,
        ScalarType::I64 | ScalarType::Pred => return None,
    })
}
