//! A checkpoint opened for export: its checked config, its tokenizer files, where it came from,
//! and every tensor addressed by the role it plays in a Llama-family decoder rather than by the
//! name some format gives it. Opening verifies that each tensor has a role, that each role the
//! config requires is present and that every shape agrees with the config, so nothing downstream
//! meets a surprise.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use sha2::{Digest, Sha256};

use crate::config::{HfConfig, ModelConfig};
use crate::error::{IngestError, Result, io_error};
use crate::gguf::{GgmlType, GgufCheckpoint};
use crate::safetensors::SafetensorsStore;
use crate::tokenizer::TokenizerFiles;

/// What a tensor is for inside one decoder layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LayerRole {
    /// RMSNorm weight before attention.
    AttnNorm,
    /// Query projection weight.
    Q,
    /// Key projection weight.
    K,
    /// Value projection weight.
    V,
    /// Attention output projection weight.
    O,
    /// Query projection bias.
    QBias,
    /// Key projection bias.
    KBias,
    /// Value projection bias.
    VBias,
    /// Output projection bias.
    OBias,
    /// Per-head RMSNorm weight of the queries (`[head_dim]`, Qwen3).
    QNorm,
    /// Per-head RMSNorm weight of the keys (`[head_dim]`, Qwen3).
    KNorm,
    /// RMSNorm weight before the MLP.
    MlpNorm,
    /// RMSNorm weight of the attention output, before its residual add (Gemma's
    /// `post_attention_layernorm`).
    PostAttnNorm,
    /// RMSNorm weight of the MLP output, before its residual add (Gemma's
    /// `post_feedforward_layernorm`).
    PostMlpNorm,
    /// MLP gate projection weight.
    Gate,
    /// MLP up projection weight.
    Up,
    /// MLP down projection weight.
    Down,
    /// MLP gate projection bias.
    GateBias,
    /// MLP up projection bias.
    UpBias,
    /// MLP down projection bias.
    DownBias,
}

/// What a tensor is for in the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TensorRole {
    /// Token embedding `[vocab, hidden]`.
    Embedding,
    /// Output projection `[vocab, hidden]` (the embedding when tied).
    LmHead,
    /// Final RMSNorm weight.
    FinalNorm,
    /// A tensor of decoder layer `n`.
    Layer(usize, LayerRole),
}

const LAYER_ROLES: [(LayerRole, &str, &str); 20] = [
    (
        LayerRole::AttnNorm,
        "input_layernorm.weight",
        "attn_norm.weight",
    ),
    (LayerRole::Q, "self_attn.q_proj.weight", "attn_q.weight"),
    (LayerRole::K, "self_attn.k_proj.weight", "attn_k.weight"),
    (LayerRole::V, "self_attn.v_proj.weight", "attn_v.weight"),
    (
        LayerRole::O,
        "self_attn.o_proj.weight",
        "attn_output.weight",
    ),
    (LayerRole::QBias, "self_attn.q_proj.bias", "attn_q.bias"),
    (LayerRole::KBias, "self_attn.k_proj.bias", "attn_k.bias"),
    (LayerRole::VBias, "self_attn.v_proj.bias", "attn_v.bias"),
    (
        LayerRole::OBias,
        "self_attn.o_proj.bias",
        "attn_output.bias",
    ),
    (
        LayerRole::QNorm,
        "self_attn.q_norm.weight",
        "attn_q_norm.weight",
    ),
    (
        LayerRole::KNorm,
        "self_attn.k_norm.weight",
        "attn_k_norm.weight",
    ),
    (
        LayerRole::MlpNorm,
        "post_attention_layernorm.weight",
        "ffn_norm.weight",
    ),
    // Gemma's names: its `post_attention_layernorm` is the attention output's norm (see
    // GEMMA_HF_NAMES), listed after MlpNorm so that other families' name maps to MlpNorm.
    (
        LayerRole::PostAttnNorm,
        "post_attention_layernorm.weight",
        "post_attention_norm.weight",
    ),
    (
        LayerRole::PostMlpNorm,
        "post_feedforward_layernorm.weight",
        "post_ffw_norm.weight",
    ),
    (LayerRole::Gate, "mlp.gate_proj.weight", "ffn_gate.weight"),
    (LayerRole::Up, "mlp.up_proj.weight", "ffn_up.weight"),
    (LayerRole::Down, "mlp.down_proj.weight", "ffn_down.weight"),
    (LayerRole::GateBias, "mlp.gate_proj.bias", "ffn_gate.bias"),
    (LayerRole::UpBias, "mlp.up_proj.bias", "ffn_up.bias"),
    (LayerRole::DownBias, "mlp.down_proj.bias", "ffn_down.bias"),
];

/// The Hugging Face names that mean another role in Gemma's layer than in Llama's: there
/// `post_attention_layernorm` normalizes the attention output and `pre_feedforward_layernorm`
/// is the norm before the MLP.
const GEMMA_HF_NAMES: [(LayerRole, &str); 3] = [
    (LayerRole::PostAttnNorm, "post_attention_layernorm.weight"),
    (LayerRole::MlpNorm, "pre_feedforward_layernorm.weight"),
    (LayerRole::PostMlpNorm, "post_feedforward_layernorm.weight"),
];

/// Fused projections: the stored layer tensor whose rows are these roles' rows, one after the
/// other (Hugging Face suffix, GGUF suffix).
const FUSED: [(&str, &str, &[LayerRole]); 2] = [
    (
        "self_attn.qkv_proj.weight",
        "attn_qkv.weight",
        &[LayerRole::Q, LayerRole::K, LayerRole::V],
    ),
    (
        "mlp.gate_up_proj.weight",
        "ffn_up.weight",
        &[LayerRole::Gate, LayerRole::Up],
    ),
];

/// The roles a fused stored tensor holds, in row order, in a checkpoint with `c`'s layout
/// (Phi-3 only: elsewhere `ffn_up` is the up projection alone).
fn fused_roles(name: &str, gguf: bool, c: &ModelConfig) -> Option<(usize, &'static [LayerRole])> {
    if c.architecture != crate::config::Architecture::Phi3 {
        return None;
    }
    let rest = if gguf {
        name.strip_prefix("blk.")?
    } else {
        name.strip_prefix("model.layers.")?
    };
    let (n, suffix) = rest.split_once('.')?;
    let (_, _, roles) = FUSED
        .iter()
        .find(|(hf, g, _)| suffix == if gguf { *g } else { *hf })?;
    Some((layer_index(n)?, roles))
}

/// One meta per role of the fused tensor `meta` (rows split by the config's sizes).
fn split_fused(
    meta: TensorMeta,
    layer: usize,
    roles: &[LayerRole],
    c: &ModelConfig,
    stored: &mut BTreeMap<TensorRole, TensorMeta>,
) -> Result<()> {
    let heights: Vec<usize> = roles
        .iter()
        .map(|&r| TensorRole::Layer(layer, r).expected_dims(c)[0])
        .collect();
    let total: usize = heights.iter().sum();
    let cols = TensorRole::Layer(layer, roles[0]).expected_dims(c)[1];
    if meta.dims != [total, cols] {
        return Err(IngestError::ShapeMismatch {
            tensor: meta.name,
            expected: vec![total, cols],
            found: meta.dims,
        });
    }
    let mut start = 0;
    for (&role, &height) in roles.iter().zip(&heights) {
        stored.insert(
            TensorRole::Layer(layer, role),
            TensorMeta {
                name: meta.name.clone(),
                dtype: meta.dtype.clone(),
                dims: vec![height, cols],
                byte_len: meta.byte_len / total * height,
                rows: Some((start, start + height)),
            },
        );
        start += height;
    }
    Ok(())
}

impl TensorRole {
    /// The roles a fused Hugging Face tensor (Phi-3's `qkv_proj`, `gate_up_proj`) holds in a
    /// checkpoint with `c`'s layout, in row order.
    pub fn fused_hf_roles(name: &str, c: &ModelConfig) -> Option<Vec<TensorRole>> {
        let (n, roles) = fused_roles(name, false, c)?;
        Some(roles.iter().map(|&r| TensorRole::Layer(n, r)).collect())
    }

    /// The Hugging Face state-dict name of this role in a checkpoint with `c`'s layout.
    pub fn hf_name_for(self, c: &ModelConfig) -> String {
        if let TensorRole::Layer(n, r) = self
            && c.architecture == crate::config::Architecture::Phi3
            && let Some((hf, _, _)) = FUSED.iter().find(|(_, _, roles)| roles.contains(&r))
        {
            return format!("model.layers.{n}.{hf}");
        }
        if let TensorRole::Layer(n, r) = self
            && c.sandwich_norms
            && let Some((_, name)) = GEMMA_HF_NAMES.iter().find(|(role, _)| *role == r)
        {
            return format!("model.layers.{n}.{name}");
        }
        self.hf_name()
    }

    /// The role a Hugging Face state-dict name plays in a checkpoint with `c`'s layout.
    pub fn from_hf_name_for(name: &str, c: &ModelConfig) -> Option<TensorRole> {
        if c.sandwich_norms
            && let Some(rest) = name.strip_prefix("model.layers.")
            && let Some((n, suffix)) = rest.split_once('.')
            && let Some((role, _)) = GEMMA_HF_NAMES.iter().find(|(_, s)| *s == suffix)
        {
            return layer_index(n).map(|n| TensorRole::Layer(n, *role));
        }
        Self::from_hf_name(name)
    }

    /// The Hugging Face state-dict name of this role (Llama's layout).
    pub fn hf_name(self) -> String {
        match self {
            TensorRole::Embedding => "model.embed_tokens.weight".into(),
            TensorRole::LmHead => "lm_head.weight".into(),
            TensorRole::FinalNorm => "model.norm.weight".into(),
            TensorRole::Layer(n, r) => format!("model.layers.{n}.{}", layer_names(r).0),
        }
    }

    /// The llama.cpp GGUF tensor name of this role.
    pub fn gguf_name(self) -> String {
        match self {
            TensorRole::Embedding => "token_embd.weight".into(),
            TensorRole::LmHead => "output.weight".into(),
            TensorRole::FinalNorm => "output_norm.weight".into(),
            TensorRole::Layer(n, r) => format!("blk.{n}.{}", layer_names(r).1),
        }
    }

    /// The role a Hugging Face state-dict name plays, if any.
    pub fn from_hf_name(name: &str) -> Option<TensorRole> {
        match name {
            "model.embed_tokens.weight" => Some(TensorRole::Embedding),
            "lm_head.weight" => Some(TensorRole::LmHead),
            "model.norm.weight" => Some(TensorRole::FinalNorm),
            _ => {
                let rest = name.strip_prefix("model.layers.")?;
                let (n, suffix) = rest.split_once('.')?;
                layer_role(n, suffix, |(_, hf, _)| hf)
            }
        }
    }

    /// The role a llama.cpp GGUF tensor name plays, if any.
    pub fn from_gguf_name(name: &str) -> Option<TensorRole> {
        match name {
            "token_embd.weight" => Some(TensorRole::Embedding),
            "output.weight" => Some(TensorRole::LmHead),
            "output_norm.weight" => Some(TensorRole::FinalNorm),
            _ => {
                let rest = name.strip_prefix("blk.")?;
                let (n, suffix) = rest.split_once('.')?;
                layer_role(n, suffix, |(_, _, gguf)| gguf)
            }
        }
    }

    /// The shape (Hugging Face layout, linear weights `[out, in]`) this role must have.
    pub fn expected_dims(self, c: &ModelConfig) -> Vec<usize> {
        match self {
            TensorRole::Embedding | TensorRole::LmHead => vec![c.vocab_size, c.hidden_size],
            TensorRole::FinalNorm => vec![c.hidden_size],
            TensorRole::Layer(_, r) => match r {
                LayerRole::AttnNorm
                | LayerRole::MlpNorm
                | LayerRole::PostAttnNorm
                | LayerRole::PostMlpNorm
                | LayerRole::OBias
                | LayerRole::DownBias => {
                    vec![c.hidden_size]
                }
                LayerRole::Q => vec![c.q_dim(), c.hidden_size],
                LayerRole::K | LayerRole::V => vec![c.kv_dim(), c.hidden_size],
                LayerRole::O => vec![c.hidden_size, c.q_dim()],
                LayerRole::QBias => vec![c.q_dim()],
                LayerRole::QNorm | LayerRole::KNorm => vec![c.head_dim],
                LayerRole::KBias | LayerRole::VBias => vec![c.kv_dim()],
                LayerRole::Gate | LayerRole::Up => vec![c.intermediate_size, c.hidden_size],
                LayerRole::Down => vec![c.hidden_size, c.intermediate_size],
                LayerRole::GateBias | LayerRole::UpBias => vec![c.intermediate_size],
            },
        }
    }

    /// Whether this is an RMSNorm weight.
    pub fn is_norm(self) -> bool {
        matches!(
            self,
            TensorRole::FinalNorm
                | TensorRole::Layer(
                    _,
                    LayerRole::AttnNorm
                        | LayerRole::MlpNorm
                        | LayerRole::PostAttnNorm
                        | LayerRole::PostMlpNorm
                        | LayerRole::QNorm
                        | LayerRole::KNorm
                )
        )
    }

    /// Whether a model with this config stores `role` (the LM head only when untied).
    pub fn is_required(&self, c: &ModelConfig) -> bool {
        match *self {
            TensorRole::Embedding | TensorRole::FinalNorm => true,
            TensorRole::LmHead => !c.tie_word_embeddings,
            TensorRole::Layer(n, r) => n < c.num_hidden_layers && layer_role_wanted(r, c),
        }
    }

    /// How many roles a model with this config stores (saturating: a hostile layer count
    /// must not overflow).
    pub fn required_count(c: &ModelConfig) -> usize {
        let per_layer = LAYER_ROLES
            .iter()
            .filter(|(r, _, _)| layer_role_wanted(*r, c))
            .count();
        let top = if c.tie_word_embeddings { 2 } else { 3 };
        c.num_hidden_layers
            .saturating_mul(per_layer)
            .saturating_add(top)
    }

    /// Every role a model with this config stores, in order, lazily (the layer count may be
    /// anything a config says).
    pub fn required_roles(c: &ModelConfig) -> impl Iterator<Item = TensorRole> + '_ {
        let top = [
            TensorRole::Embedding,
            TensorRole::FinalNorm,
            TensorRole::LmHead,
        ]
        .into_iter()
        .filter(move |r| r.is_required(c));
        let layers = (0..c.num_hidden_layers).flat_map(move |n| {
            LAYER_ROLES
                .iter()
                .filter(move |(r, _, _)| layer_role_wanted(*r, c))
                .map(move |(r, _, _)| TensorRole::Layer(n, *r))
        });
        top.chain(layers)
    }
}

/// At most this many missing tensors are named in an error; the rest are counted.
pub const MAX_NAMED_MISSING: usize = 16;

fn layer_role_wanted(r: LayerRole, c: &ModelConfig) -> bool {
    match r {
        LayerRole::QBias | LayerRole::KBias | LayerRole::VBias => c.qkv_bias,
        LayerRole::OBias => c.o_bias,
        LayerRole::GateBias | LayerRole::UpBias | LayerRole::DownBias => c.mlp_bias,
        LayerRole::QNorm | LayerRole::KNorm => c.qk_norm,
        LayerRole::PostAttnNorm | LayerRole::PostMlpNorm => c.sandwich_norms,
        _ => true,
    }
}

fn layer_names(role: LayerRole) -> (&'static str, &'static str) {
    let (_, hf, gguf) = LAYER_ROLES
        .iter()
        .find(|(r, _, _)| *r == role)
        .copied()
        .unwrap_or(LAYER_ROLES[0]);
    (hf, gguf)
}

/// A layer number as names write it: decimal digits, no leading zero.
fn layer_index(n: &str) -> Option<usize> {
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) || (n.len() > 1 && n.starts_with('0'))
    {
        return None;
    }
    n.parse().ok()
}

fn layer_role(
    n: &str,
    suffix: &str,
    pick: impl Fn((LayerRole, &'static str, &'static str)) -> &'static str,
) -> Option<TensorRole> {
    let n = layer_index(n)?;
    LAYER_ROLES
        .iter()
        .find(|e| pick(**e) == suffix)
        .map(|e| TensorRole::Layer(n, e.0))
}

impl fmt::Display for TensorRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TensorRole::Embedding => f.write_str("Embedding"),
            TensorRole::LmHead => f.write_str("LmHead"),
            TensorRole::FinalNorm => f.write_str("FinalNorm"),
            TensorRole::Layer(n, r) => write!(f, "Layer({n}, {r:?})"),
        }
    }
}

/// Tensor elements in the dtype they were stored in (quantized GGUF data is dequantized to f32).
#[derive(Clone, PartialEq)]
pub enum TensorData {
    /// 32-bit floats.
    F32(Vec<f32>),
    /// bfloat16.
    BF16(Vec<bf16>),
    /// IEEE half.
    F16(Vec<f16>),
}

impl fmt::Debug for TensorData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TensorData::{}[{}]", self.dtype_name(), self.len())
    }
}

impl TensorData {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            TensorData::F32(v) => v.len(),
            TensorData::BF16(v) => v.len(),
            TensorData::F16(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `F32`, `BF16` or `F16`.
    pub fn dtype_name(&self) -> &'static str {
        match self {
            TensorData::F32(_) => "F32",
            TensorData::BF16(_) => "BF16",
            TensorData::F16(_) => "F16",
        }
    }

    /// Every element widened to f32 (exact for all three types).
    pub fn to_f32(&self) -> Vec<f32> {
        match self {
            TensorData::F32(v) => v.clone(),
            TensorData::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
            TensorData::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
        }
    }
}

/// A dense row-major tensor in Hugging Face layout.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Dimensions, outermost first (linear weights are `[out_features, in_features]`).
    pub dims: Vec<usize>,
    /// Elements.
    pub data: TensorData,
}

impl Tensor {
    /// Builds a tensor, checking that `data` holds exactly `product(dims)` elements.
    pub fn new(name: &str, dims: Vec<usize>, data: TensorData) -> Result<Self> {
        let count = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if count != Some(data.len()) {
            return Err(IngestError::ShapeMismatch {
                tensor: name.to_string(),
                expected: dims,
                found: vec![data.len()],
            });
        }
        Ok(Self { dims, data })
    }

    /// The elements widened to f32.
    pub fn to_f32(&self) -> Vec<f32> {
        self.data.to_f32()
    }

    /// Rows `[start, end)` of the outermost dimension (a role's share of a fused tensor).
    pub fn rows(self, name: &str, start: usize, end: usize) -> Result<Self> {
        let height = self.dims.first().copied().unwrap_or(0);
        if start > end || end > height {
            return Err(IngestError::ShapeMismatch {
                tensor: name.to_string(),
                expected: vec![end],
                found: self.dims,
            });
        }
        let width: usize = self.dims[1..].iter().product();
        let (a, b) = (start * width, end * width);
        let data = match self.data {
            TensorData::F32(v) => TensorData::F32(v[a..b].to_vec()),
            TensorData::BF16(v) => TensorData::BF16(v[a..b].to_vec()),
            TensorData::F16(v) => TensorData::F16(v[a..b].to_vec()),
        };
        let mut dims = self.dims;
        dims[0] = end - start;
        Ok(Self { dims, data })
    }
}

/// The format a checkpoint came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    /// A Hugging Face directory with one `model.safetensors`.
    Safetensors,
    /// A Hugging Face directory with `model.safetensors.index.json` and shards.
    ShardedSafetensors,
    /// One llama.cpp `.gguf` file.
    Gguf,
}

/// One file a checkpoint was read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFile {
    /// File name relative to the checkpoint directory (or the GGUF's own name).
    pub name: String,
    /// Size in bytes.
    pub byte_len: u64,
    /// Lowercase hex sha256 of the bytes.
    pub sha256: String,
}

/// Where a checkpoint came from, for provenance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceInfo {
    /// Format.
    pub kind: SourceKind,
    /// Every file read, in a stable order.
    pub files: Vec<SourceFile>,
}

/// What is stored for one role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorMeta {
    /// The tensor's name in the checkpoint.
    pub name: String,
    /// Stored type (`F32`, `BF16`, `Q4_1`, ...).
    pub dtype: String,
    /// Dimensions in Hugging Face layout.
    pub dims: Vec<usize>,
    /// Bytes stored in the checkpoint (this role's share of a fused tensor).
    pub byte_len: usize,
    /// The rows `[start, end)` of a fused stored tensor (Phi-3's `qkv_proj`, `gate_up_proj`)
    /// that hold this role; `None` when the tensor is the role's alone.
    pub rows: Option<(usize, usize)>,
}

#[derive(Debug)]
enum Store {
    Safetensors(SafetensorsStore),
    Gguf(Box<GgufCheckpoint>),
}

/// An opened, verified checkpoint.
#[derive(Debug)]
pub struct Checkpoint {
    /// The checked model configuration.
    pub config: ModelConfig,
    /// Tokenizer files to copy into an artifact.
    pub tokenizer: TokenizerFiles,
    /// Where the checkpoint came from.
    pub source: SourceInfo,
    store: Store,
    tensors: BTreeMap<TensorRole, TensorMeta>,
}

impl Checkpoint {
    /// Opens a Hugging Face checkpoint directory (`config.json` + safetensors + tokenizer files)
    /// or a `.gguf` file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        if path.is_dir() {
            Self::open_hf_dir(path)
        } else if path.is_file() {
            if path
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
            {
                Self::open_gguf(path)
            } else {
                Err(IngestError::NotACheckpoint {
                    path: path.to_path_buf(),
                    reason: "a checkpoint is a Hugging Face directory or a .gguf file".into(),
                })
            }
        } else {
            Err(IngestError::NotACheckpoint {
                path: path.to_path_buf(),
                reason: "no such file or directory".into(),
            })
        }
    }

    fn open_hf_dir(dir: &Path) -> Result<Self> {
        let config_path = dir.join("config.json");
        let config_bytes = std::fs::read(&config_path).map_err(io_error(&config_path))?;
        let config_text = String::from_utf8_lossy(&config_bytes);
        let config = HfConfig::from_json(&config_text)
            .map_err(|e| IngestError::Json {
                path: config_path.clone(),
                reason: e.to_string(),
            })?
            .into_config()?;
        let (store, shard_names) = SafetensorsStore::open_dir(dir)?;
        let kind = if shard_names.len() == 1 && shard_names[0] == crate::safetensors::SINGLE_FILE {
            SourceKind::Safetensors
        } else {
            SourceKind::ShardedSafetensors
        };
        let mut stored = BTreeMap::new();
        let mut unexpected = Vec::new();
        for e in store.entries() {
            if !matches!(e.dtype.as_str(), "F32" | "BF16" | "F16") {
                return Err(IngestError::UnsupportedDtype {
                    tensor: e.name,
                    dtype: e.dtype,
                    accepted: crate::safetensors::ACCEPTED_DTYPES,
                });
            }
            if let Some((n, roles)) = fused_roles(&e.name, false, &config) {
                let meta = TensorMeta {
                    name: e.name,
                    dtype: e.dtype,
                    dims: e.dims,
                    byte_len: e.byte_len,
                    rows: None,
                };
                split_fused(meta, n, roles, &config, &mut stored)?;
                continue;
            }
            match TensorRole::from_hf_name_for(&e.name, &config) {
                Some(role) => {
                    stored.insert(
                        role,
                        TensorMeta {
                            name: e.name,
                            dtype: e.dtype,
                            dims: e.dims,
                            byte_len: e.byte_len,
                            rows: None,
                        },
                    );
                }
                // Older checkpoints store the RoPE table; it is recomputed from the config.
                None if e.name.ends_with(".self_attn.rotary_emb.inv_freq") => {}
                None => unexpected.push(e.name),
            }
        }
        let name_of = |role: TensorRole| role.hf_name_for(&config);
        let tensors = verify_roles(&config, stored, unexpected, &name_of)?;
        let tokenizer = TokenizerFiles::from_hf_dir(dir, &config)?;
        let mut file_names: Vec<String> = vec!["config.json".into()];
        if kind == SourceKind::ShardedSafetensors {
            file_names.push(crate::safetensors::INDEX_FILE.into());
        }
        file_names.extend(shard_names);
        file_names.extend(tokenizer.source_file_names.iter().cloned());
        let files = file_names
            .iter()
            .map(|n| hash_file(dir, n))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            config,
            tokenizer,
            source: SourceInfo { kind, files },
            store: Store::Safetensors(store),
            tensors,
        })
    }

    /// Opens a `.gguf` file without rebuilding its tokenizer: the artifact made from it takes
    /// and returns token ids only. For checking a model's numerics without the cost of
    /// rebuilding a large vocabulary.
    pub fn open_gguf_token_ids_only(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_gguf_with(path.as_ref(), false)
    }

    fn open_gguf(path: &Path) -> Result<Self> {
        Self::open_gguf_with(path, true)
    }

    fn open_gguf_with(path: &Path, with_tokenizer: bool) -> Result<Self> {
        let gguf = GgufCheckpoint::open(path)?;
        let config = gguf.config.clone();
        let mut stored = BTreeMap::new();
        let mut unexpected = Vec::new();
        for info in gguf.tensor_infos() {
            if let Some((n, roles)) = fused_roles(&info.name, true, &config) {
                let meta = TensorMeta {
                    name: info.name.clone(),
                    dtype: info.ggml_type.name().to_string(),
                    dims: info.hf_dims(),
                    byte_len: info.byte_len,
                    rows: None,
                };
                split_fused(meta, n, roles, &config, &mut stored)?;
                continue;
            }
            match TensorRole::from_gguf_name(&info.name) {
                Some(role) => {
                    stored.insert(
                        role,
                        TensorMeta {
                            name: info.name.clone(),
                            dtype: info.ggml_type.name().to_string(),
                            dims: info.hf_dims(),
                            byte_len: info.byte_len,
                            rows: None,
                        },
                    );
                }
                None => unexpected.push(info.name.clone()),
            }
        }
        let tensors = verify_roles(&config, stored, unexpected, &TensorRole::gguf_name)?;
        let tokenizer = if with_tokenizer {
            TokenizerFiles::from_gguf(gguf.header(), &config)?
        } else {
            TokenizerFiles::token_ids_only(&config)
        };
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let bytes = gguf.bytes();
        let file = SourceFile {
            name,
            byte_len: bytes.len() as u64,
            sha256: hex::encode(Sha256::digest(bytes)),
        };
        Ok(Self {
            config,
            tokenizer,
            source: SourceInfo {
                kind: SourceKind::Gguf,
                files: vec![file],
            },
            store: Store::Gguf(Box::new(gguf)),
            tensors,
        })
    }

    /// Every role this checkpoint can supply, in order (the LM head included even when tied).
    pub fn roles(&self) -> Vec<TensorRole> {
        let mut roles: Vec<TensorRole> = self.tensors.keys().copied().collect();
        if !roles.contains(&TensorRole::LmHead) {
            roles.push(TensorRole::LmHead);
            roles.sort();
        }
        roles
    }

    /// What is stored for `role` (the embedding's entry for a tied LM head).
    pub fn meta(&self, role: TensorRole) -> Result<&TensorMeta> {
        let resolved = self.resolve(role);
        self.tensors
            .get(&resolved)
            .ok_or_else(|| IngestError::NoSuchRole {
                role: role.to_string(),
            })
    }

    fn resolve(&self, role: TensorRole) -> TensorRole {
        if role == TensorRole::LmHead && self.config.tie_word_embeddings {
            TensorRole::Embedding
        } else {
            role
        }
    }

    /// Reads the tensor for `role` in Hugging Face layout. An RMSNorm weight is the weight
    /// the norm multiplies by: `ModelConfig::norm_weight_offset` is added (in f32, as
    /// transformers' Gemma norm computes `1.0 + weight.float()`).
    pub fn tensor(&self, role: TensorRole) -> Result<Tensor> {
        let tensor = self.stored_tensor(role)?;
        if self.config.norm_weight_offset != 0.0 && role.is_norm() {
            let offset = self.config.norm_weight_offset;
            let values = tensor.to_f32().into_iter().map(|w| offset + w).collect();
            return Ok(Tensor {
                dims: tensor.dims,
                data: TensorData::F32(values),
            });
        }
        Ok(tensor)
    }

    /// Reads the tensor for `role` as the file stores it (dequantized), in Hugging Face layout.
    pub fn stored_tensor(&self, role: TensorRole) -> Result<Tensor> {
        let resolved = self.resolve(role);
        let meta = self.meta(role)?;
        let tensor = match &self.store {
            Store::Safetensors(s) => s.read(&meta.name)?,
            Store::Gguf(g) => g.read(&meta.name, resolved)?,
        };
        let tensor = match meta.rows {
            Some((start, end)) => tensor.rows(&meta.name, start, end)?,
            None => tensor,
        };
        if tensor.dims != meta.dims {
            return Err(IngestError::ShapeMismatch {
                tensor: meta.name.clone(),
                expected: meta.dims.clone(),
                found: tensor.dims,
            });
        }
        Ok(tensor)
    }
}

/// A tensor as the ggml blocks a GGUF stores it in, rows in Hugging Face order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBlocks {
    /// The stored ggml type.
    pub ggml_type: GgmlType,
    /// Hugging Face dims in elements (`[out, in]` for a matrix).
    pub dims: Vec<usize>,
    /// `dims[0]` rows of equal length, each the row's blocks as stored.
    pub bytes: Vec<u8>,
}

impl Checkpoint {
    /// `role`'s tensor as the blocks the file stores it in, when the checkpoint is a GGUF
    /// (Q/K rows unpermuted and a fused tensor's rows taken as [`Checkpoint::tensor`] does,
    /// row by row of blocks); `None` for safetensors checkpoints.
    pub fn stored_blocks(&self, role: TensorRole) -> Result<Option<StoredBlocks>> {
        let resolved = self.resolve(role);
        let meta = self.meta(role)?;
        let Store::Gguf(g) = &self.store else {
            return Ok(None);
        };
        let (ggml_type, dims, mut bytes) = g.read_blocks(&meta.name, resolved)?;
        let mut dims = dims;
        if let Some((start, end)) = meta.rows {
            let row = bytes.len() / dims[0];
            bytes = bytes[start * row..end * row].to_vec();
            dims[0] = end - start;
        }
        if dims != meta.dims {
            return Err(IngestError::ShapeMismatch {
                tensor: meta.name.clone(),
                expected: meta.dims.clone(),
                found: dims,
            });
        }
        Ok(Some(StoredBlocks {
            ggml_type,
            dims,
            bytes,
        }))
    }
}

fn verify_roles(
    config: &ModelConfig,
    mut stored: BTreeMap<TensorRole, TensorMeta>,
    mut unexpected: Vec<String>,
    name_of: &dyn Fn(TensorRole) -> String,
) -> Result<BTreeMap<TensorRole, TensorMeta>> {
    // Nothing here is sized by the config's counts: a hostile layer count must not allocate
    // (or scan) per layer. Membership is a predicate; the missing list is named up to a cap
    // and counted arithmetically.
    if config.tie_word_embeddings {
        // A tied checkpoint may still carry a copy of the LM head; the embedding is used.
        stored.remove(&TensorRole::LmHead);
    }
    let extra: Vec<TensorRole> = stored
        .keys()
        .filter(|r| !r.is_required(config))
        .copied()
        .collect();
    for role in extra {
        if let Some(meta) = stored.remove(&role) {
            unexpected.push(meta.name);
        }
    }
    if !unexpected.is_empty() {
        unexpected.sort();
        return Err(IngestError::UnexpectedTensors { names: unexpected });
    }
    // Every stored role is required now, so `stored.len()` of the required ones are present;
    // after `stored.len() + MAX_NAMED_MISSING` required roles the cap is surely reached.
    let missing_total = TensorRole::required_count(config).saturating_sub(stored.len());
    if missing_total > 0 {
        let names: Vec<String> = TensorRole::required_roles(config)
            .filter(|r| !stored.contains_key(r))
            .take(MAX_NAMED_MISSING)
            .map(name_of)
            .collect();
        return Err(IngestError::MissingTensors {
            more: missing_total - names.len(),
            names,
        });
    }
    for (role, meta) in &stored {
        let expected = role.expected_dims(config);
        if meta.dims != expected {
            return Err(IngestError::ShapeMismatch {
                tensor: meta.name.clone(),
                expected,
                found: meta.dims.clone(),
            });
        }
    }
    Ok(stored)
}

fn hash_file(dir: &Path, name: &str) -> Result<SourceFile> {
    let path: PathBuf = dir.join(name);
    let mut file = std::fs::File::open(&path).map_err(io_error(&path))?;
    let mut hasher = Sha256::new();
    let byte_len = std::io::copy(&mut file, &mut hasher).map_err(io_error(&path))?;
    Ok(SourceFile {
        name: name.to_string(),
        byte_len,
        sha256: hex::encode(hasher.finalize()),
    })
}

/// A human-readable account of a checkpoint: config, source files and every tensor with its
/// stored dtype, shape and size (what `tlaloc inspect` prints).
pub fn describe(checkpoint: &Checkpoint) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "source: {:?}", checkpoint.source.kind);
    for f in &checkpoint.source.files {
        let _ = writeln!(
            out,
            "  {}  {} bytes  sha256 {}",
            f.name, f.byte_len, f.sha256
        );
    }
    let _ = writeln!(out, "config:");
    for line in checkpoint.config.to_string().lines() {
        let _ = writeln!(out, "  {line}");
    }
    let _ = writeln!(out, "tensors ({}):", checkpoint.tensors.len());
    let mut total = 0usize;
    for (role, meta) in &checkpoint.tensors {
        total += meta.byte_len;
        let _ = writeln!(
            out,
            "  {:<28} {:<40} {:<5} {:?} {} bytes",
            role.to_string(),
            meta.name,
            meta.dtype,
            meta.dims,
            meta.byte_len
        );
    }
    if checkpoint.config.tie_word_embeddings {
        let _ = writeln!(out, "  LmHead is tied to Embedding");
    }
    let _ = writeln!(out, "total stored tensor bytes: {total}");
    let _ = write!(
        out,
        "tokenizer files: {}",
        checkpoint.tokenizer.file_names().join(", ")
    );
    out
}
