//! Model configuration in two steps: [`HfConfig`] mirrors a Hugging Face `config.json` as
//! written (every field optional, unknown fields ignored), and [`ModelConfig`] is the checked
//! shape Tlaloc builds from. Everything that would make the built model differ from the
//! checkpoint's (a sliding window, an unknown rope scaling, another activation) is refused here,
//! by name, rather than discovered as wrong logits later.

use std::fmt;

use serde::Deserialize;
use serde_json::Value;

use crate::error::{IngestError, Result};

/// The decoder families Tlaloc builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// `LlamaForCausalLM`.
    Llama,
    /// `MistralForCausalLM` (without a sliding window).
    Mistral,
    /// `Qwen2ForCausalLM` (q/k/v projections carry biases).
    Qwen2,
    /// `Qwen3ForCausalLM` (per-head RMSNorm of q and k before RoPE; biases as
    /// `attention_bias` says).
    Qwen3,
}

/// The architecture names accepted in `config.json`.
pub const ACCEPTED_ARCHITECTURES: &str =
    "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM";

impl Architecture {
    /// Parses a Hugging Face `architectures[0]` name.
    pub fn from_hf_name(name: &str) -> Result<Self> {
        match name {
            "LlamaForCausalLM" => Ok(Self::Llama),
            "MistralForCausalLM" => Ok(Self::Mistral),
            "Qwen2ForCausalLM" => Ok(Self::Qwen2),
            "Qwen3ForCausalLM" => Ok(Self::Qwen3),
            other => Err(IngestError::UnsupportedArchitecture {
                found: other.to_string(),
                accepted: ACCEPTED_ARCHITECTURES,
            }),
        }
    }

    /// The Hugging Face class name.
    pub fn hf_name(self) -> &'static str {
        match self {
            Self::Llama => "LlamaForCausalLM",
            Self::Mistral => "MistralForCausalLM",
            Self::Qwen2 => "Qwen2ForCausalLM",
            Self::Qwen3 => "Qwen3ForCausalLM",
        }
    }
}

/// How rotary position frequencies are rescaled.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE (`rope_type` absent or `"default"`).
    None,
    /// Positions divided by `factor`.
    Linear {
        /// The divisor.
        factor: f64,
    },
    /// Llama 3's frequency-dependent rescaling.
    Llama3 {
        /// Overall factor.
        factor: f64,
        /// Wavelengths longer than `original / low_freq_factor` are scaled fully.
        low_freq_factor: f64,
        /// Wavelengths shorter than `original / high_freq_factor` are not scaled.
        high_freq_factor: f64,
        /// The context the base model was trained on.
        original_max_position_embeddings: usize,
    },
}

/// Stored floating-point type named by the config (`torch_dtype` / `dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigDtype {
    /// `float32`.
    F32,
    /// `bfloat16`.
    BF16,
    /// `float16`.
    F16,
}

/// The checked configuration of a Llama-family decoder.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Family.
    pub architecture: Architecture,
    /// Residual width.
    pub hidden_size: usize,
    /// MLP inner width.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (divides `num_attention_heads`).
    pub num_key_value_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Rows of the embedding and of the LM head.
    pub vocab_size: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// RoPE rescaling.
    pub rope_scaling: RopeScaling,
    /// The LM head is the embedding matrix.
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry biases.
    pub qkv_bias: bool,
    /// The output projection carries a bias.
    pub o_bias: bool,
    /// gate/up/down projections carry biases.
    pub mlp_bias: bool,
    /// Each query and key head is RMS-normalized (one weight per head width for q, one for k)
    /// before RoPE (Qwen3).
    pub qk_norm: bool,
    /// Beginning-of-sequence token, if the model has one.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence tokens (any of them stops generation).
    pub eos_token_ids: Vec<u32>,
    /// Longest context the model was configured for.
    pub max_position_embeddings: usize,
    /// The stored dtype the config names, if any.
    pub dtype: Option<ConfigDtype>,
}

/// A token id or a list of them, as `bos_token_id` / `eos_token_id` may be written.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum IdOrList {
    /// One id.
    One(u32),
    /// Several ids.
    Many(Vec<u32>),
}

impl IdOrList {
    fn into_vec(self) -> Vec<u32> {
        match self {
            Self::One(id) => vec![id],
            Self::Many(ids) => ids,
        }
    }
}

/// A Hugging Face `config.json` as written. Fields Tlaloc does not read are ignored.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct HfConfig {
    /// Class names; the first one decides the architecture.
    pub architectures: Option<Vec<String>>,
    /// `model_type`, used when `architectures` is absent.
    pub model_type: Option<String>,
    /// Residual width.
    pub hidden_size: Option<usize>,
    /// MLP inner width.
    pub intermediate_size: Option<usize>,
    /// Decoder layers.
    pub num_hidden_layers: Option<usize>,
    /// Query heads.
    pub num_attention_heads: Option<usize>,
    /// Key/value heads (defaults to `num_attention_heads`).
    pub num_key_value_heads: Option<usize>,
    /// Head width (defaults to hidden / heads).
    pub head_dim: Option<usize>,
    /// Vocabulary rows.
    pub vocab_size: Option<usize>,
    /// RMSNorm epsilon.
    pub rms_norm_eps: Option<f64>,
    /// transformers-4 RoPE base.
    pub rope_theta: Option<f64>,
    /// transformers-4 RoPE scaling object.
    pub rope_scaling: Option<Value>,
    /// transformers-5 RoPE parameters (`rope_type`, `rope_theta`, `factor`, ...).
    pub rope_parameters: Option<Value>,
    /// Tied LM head.
    pub tie_word_embeddings: Option<bool>,
    /// Llama/Mistral attention bias (q, k, v and o).
    pub attention_bias: Option<bool>,
    /// MLP bias.
    pub mlp_bias: Option<bool>,
    /// BOS id(s).
    pub bos_token_id: Option<IdOrList>,
    /// EOS id(s).
    pub eos_token_id: Option<IdOrList>,
    /// Longest context.
    pub max_position_embeddings: Option<usize>,
    /// Mistral/Qwen2 sliding attention window.
    pub sliding_window: Option<usize>,
    /// Qwen2's switch for the sliding window.
    pub use_sliding_window: Option<bool>,
    /// Activation (must be `silu`).
    pub hidden_act: Option<String>,
    /// transformers-4 dtype name.
    pub torch_dtype: Option<String>,
    /// transformers-5 dtype name.
    pub dtype: Option<String>,
}

impl HfConfig {
    /// Parses `config.json` text.
    pub fn from_json(text: &str) -> std::result::Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// Checks every field and builds the internal config.
    pub fn into_config(self) -> Result<ModelConfig> {
        let architecture = match (&self.architectures, &self.model_type) {
            (Some(names), _) if !names.is_empty() => {
                if names.len() > 1 {
                    return Err(unsupported(
                        "architectures",
                        format!("{names:?}"),
                        "exactly one architecture name",
                    ));
                }
                Architecture::from_hf_name(&names[0])?
            }
            (_, Some(model_type)) => match model_type.as_str() {
                "llama" => Architecture::Llama,
                "mistral" => Architecture::Mistral,
                "qwen2" => Architecture::Qwen2,
                "qwen3" => Architecture::Qwen3,
                other => {
                    return Err(IngestError::UnsupportedArchitecture {
                        found: other.to_string(),
                        accepted: "model_type llama, mistral, qwen2, qwen3",
                    });
                }
            },
            _ => {
                return Err(IngestError::MissingField {
                    field: "architectures",
                    accepted: ACCEPTED_ARCHITECTURES,
                });
            }
        };
        if let Some(act) = &self.hidden_act
            && act != "silu"
        {
            return Err(unsupported("hidden_act", format!("{act:?}"), "\"silu\""));
        }
        let hidden_size = required(self.hidden_size, "hidden_size")?;
        let num_attention_heads = required(self.num_attention_heads, "num_attention_heads")?;
        let head_dim = match self.head_dim {
            Some(d) => d,
            None if num_attention_heads > 0 => hidden_size / num_attention_heads,
            None => 0,
        };
        let (rope_theta, rope_scaling) = parse_rope(
            self.rope_theta,
            self.rope_scaling.as_ref(),
            self.rope_parameters.as_ref(),
        )?;
        let max_position_embeddings =
            required(self.max_position_embeddings, "max_position_embeddings")?;
        let window_enabled = match architecture {
            Architecture::Llama => false,
            Architecture::Mistral => true,
            Architecture::Qwen2 | Architecture::Qwen3 => self.use_sliding_window.unwrap_or(false),
        };
        if window_enabled
            && let Some(window) = self.sliding_window
            && window < max_position_embeddings
        {
            return Err(unsupported(
                "sliding_window",
                window.to_string(),
                format!(
                    "null or at least max_position_embeddings ({max_position_embeddings}); \
                     sliding-window attention is not built"
                ),
            ));
        }
        let attention_bias = self.attention_bias.unwrap_or(false);
        let (qkv_bias, o_bias) = match architecture {
            Architecture::Qwen2 => (true, false),
            _ => (attention_bias, attention_bias),
        };
        let dtype = match self.dtype.as_deref().or(self.torch_dtype.as_deref()) {
            None => None,
            Some("float32") => Some(ConfigDtype::F32),
            Some("bfloat16") => Some(ConfigDtype::BF16),
            Some("float16") => Some(ConfigDtype::F16),
            Some(other) => {
                return Err(unsupported(
                    "torch_dtype",
                    format!("{other:?}"),
                    "\"float32\", \"bfloat16\", \"float16\"",
                ));
            }
        };
        ModelConfig {
            architecture,
            hidden_size,
            intermediate_size: required(self.intermediate_size, "intermediate_size")?,
            num_hidden_layers: required(self.num_hidden_layers, "num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads: self.num_key_value_heads.unwrap_or(num_attention_heads),
            head_dim,
            vocab_size: required(self.vocab_size, "vocab_size")?,
            rms_norm_eps: required(self.rms_norm_eps, "rms_norm_eps")?,
            rope_theta,
            rope_scaling,
            tie_word_embeddings: self.tie_word_embeddings.unwrap_or(false),
            qkv_bias,
            o_bias,
            mlp_bias: self.mlp_bias.unwrap_or(false),
            qk_norm: architecture == Architecture::Qwen3,
            bos_token_id: self
                .bos_token_id
                .and_then(|ids| ids.into_vec().first().copied()),
            eos_token_ids: self
                .eos_token_id
                .map(IdOrList::into_vec)
                .unwrap_or_default(),
            max_position_embeddings,
            dtype,
        }
        .checked()
    }
}

fn required<T>(value: Option<T>, field: &'static str) -> Result<T> {
    value.ok_or(IngestError::MissingField {
        field,
        accepted: "it is required for a Llama-family decoder",
    })
}

pub(crate) fn unsupported(
    field: impl Into<String>,
    value: impl Into<String>,
    accepted: impl Into<String>,
) -> IngestError {
    IngestError::UnsupportedValue {
        field: field.into(),
        value: value.into(),
        accepted: accepted.into(),
    }
}

const DEFAULT_ROPE_THETA: f64 = 10_000.0;

/// Reads RoPE base and scaling from transformers-4 (`rope_theta` + `rope_scaling`) or
/// transformers-5 (`rope_parameters`) fields.
fn parse_rope(
    theta: Option<f64>,
    scaling: Option<&Value>,
    parameters: Option<&Value>,
) -> Result<(f64, RopeScaling)> {
    let (field, object) = match (parameters, scaling) {
        (Some(p), _) if !p.is_null() => ("rope_parameters", p),
        (_, Some(s)) if !s.is_null() => ("rope_scaling", s),
        _ => return Ok((theta.unwrap_or(DEFAULT_ROPE_THETA), RopeScaling::None)),
    };
    let Some(map) = object.as_object() else {
        return Err(unsupported(field, object.to_string(), "an object or null"));
    };
    let number = |key: &str| -> Result<Option<f64>> {
        match map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| unsupported(format!("{field}.{key}"), v.to_string(), "a number")),
        }
    };
    let theta = number("rope_theta")?
        .or(theta)
        .unwrap_or(DEFAULT_ROPE_THETA);
    let kind = match map.get("rope_type").or_else(|| map.get("type")) {
        None | Some(Value::Null) => "default".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(unsupported(
                format!("{field}.rope_type"),
                other.to_string(),
                "a string",
            ));
        }
    };
    let allowed: &[&str] = match kind.as_str() {
        "default" => &[],
        "linear" => &["factor"],
        "llama3" => &[
            "factor",
            "low_freq_factor",
            "high_freq_factor",
            "original_max_position_embeddings",
        ],
        other => {
            return Err(unsupported(
                format!("{field}.rope_type"),
                format!("{other:?}"),
                "\"default\", \"linear\", \"llama3\"",
            ));
        }
    };
    for key in map.keys() {
        if !matches!(key.as_str(), "rope_type" | "type" | "rope_theta")
            && !allowed.contains(&key.as_str())
        {
            return Err(unsupported(
                format!("{field}.{key}"),
                map[key].to_string(),
                format!("only {allowed:?} besides rope_type/rope_theta for rope_type {kind:?}"),
            ));
        }
    }
    let need = |key: &'static str| -> Result<f64> {
        number(key)?.ok_or_else(|| unsupported(format!("{field}.{key}"), "missing", "a number"))
    };
    let scaling = match kind.as_str() {
        "linear" => RopeScaling::Linear {
            factor: need("factor")?,
        },
        "llama3" => {
            let original = need("original_max_position_embeddings")?;
            if !(original >= 1.0 && original.fract() == 0.0 && original <= u32::MAX as f64) {
                return Err(unsupported(
                    format!("{field}.original_max_position_embeddings"),
                    original.to_string(),
                    "a positive integer",
                ));
            }
            RopeScaling::Llama3 {
                factor: need("factor")?,
                low_freq_factor: need("low_freq_factor")?,
                high_freq_factor: need("high_freq_factor")?,
                original_max_position_embeddings: original as usize,
            }
        }
        _ => RopeScaling::None,
    };
    Ok((theta, scaling))
}

impl ModelConfig {
    /// Checks the invariants every builder relies on.
    pub fn checked(self) -> Result<Self> {
        let positive = [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("vocab_size", self.vocab_size),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for (field, value) in positive {
            if value == 0 {
                return Err(unsupported(field, "0", "a positive integer"));
            }
        }
        if self.num_attention_heads % self.num_key_value_heads != 0 {
            return Err(unsupported(
                "num_key_value_heads",
                self.num_key_value_heads.to_string(),
                format!(
                    "a divisor of num_attention_heads ({})",
                    self.num_attention_heads
                ),
            ));
        }
        if self.head_dim % 2 != 0 {
            return Err(unsupported(
                "head_dim",
                self.head_dim.to_string(),
                "an even number (RoPE rotates pairs)",
            ));
        }
        // Products of these sizes index memory; refuse configs whose tensors could not exist.
        for (field, rows, cols) in [
            (
                "vocab_size * hidden_size",
                self.vocab_size,
                self.hidden_size,
            ),
            (
                "intermediate_size * hidden_size",
                self.intermediate_size,
                self.hidden_size,
            ),
            (
                "num_attention_heads * head_dim",
                self.num_attention_heads,
                self.head_dim,
            ),
        ] {
            if rows
                .checked_mul(cols)
                .and_then(|n| n.checked_mul(4))
                .is_none_or(|n| n > isize::MAX as usize)
            {
                return Err(unsupported(
                    field,
                    format!("{rows} * {cols}"),
                    "a size that fits in memory",
                ));
            }
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return Err(unsupported(
                "rms_norm_eps",
                self.rms_norm_eps.to_string(),
                "a positive finite number",
            ));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(unsupported(
                "rope_theta",
                self.rope_theta.to_string(),
                "a positive finite number",
            ));
        }
        let factor = match self.rope_scaling {
            RopeScaling::None => 1.0,
            RopeScaling::Linear { factor } | RopeScaling::Llama3 { factor, .. } => factor,
        };
        if !(factor.is_finite() && factor > 0.0) {
            return Err(unsupported(
                "rope scaling factor",
                factor.to_string(),
                "a positive finite number",
            ));
        }
        if let RopeScaling::Llama3 {
            low_freq_factor,
            high_freq_factor,
            ..
        } = self.rope_scaling
            && !(low_freq_factor.is_finite()
                && high_freq_factor.is_finite()
                && high_freq_factor > low_freq_factor)
        {
            return Err(unsupported(
                "rope scaling high_freq_factor",
                format!("{high_freq_factor} (low_freq_factor {low_freq_factor})"),
                "finite factors with high_freq_factor > low_freq_factor",
            ));
        }
        for &id in self.bos_token_id.iter().chain(&self.eos_token_ids) {
            if id as usize >= self.vocab_size {
                return Err(unsupported(
                    "bos_token_id/eos_token_id",
                    id.to_string(),
                    format!("an id below vocab_size ({})", self.vocab_size),
                ));
            }
        }
        Ok(self)
    }

    /// Width of all query heads together.
    pub fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    /// Width of all key (or value) heads together.
    pub fn kv_dim(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }
}

impl fmt::Display for ModelConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "architecture            {}", self.architecture.hf_name())?;
        writeln!(f, "hidden_size             {}", self.hidden_size)?;
        writeln!(f, "intermediate_size       {}", self.intermediate_size)?;
        writeln!(f, "num_hidden_layers       {}", self.num_hidden_layers)?;
        writeln!(
            f,
            "attention heads         {} query, {} key/value, head_dim {}",
            self.num_attention_heads, self.num_key_value_heads, self.head_dim
        )?;
        writeln!(f, "vocab_size              {}", self.vocab_size)?;
        writeln!(f, "rms_norm_eps            {:e}", self.rms_norm_eps)?;
        writeln!(f, "rope_theta              {}", self.rope_theta)?;
        writeln!(f, "rope_scaling            {:?}", self.rope_scaling)?;
        writeln!(f, "tie_word_embeddings     {}", self.tie_word_embeddings)?;
        writeln!(
            f,
            "biases                  qkv {}, o {}, mlp {}",
            self.qkv_bias, self.o_bias, self.mlp_bias
        )?;
        writeln!(f, "qk_norm                 {}", self.qk_norm)?;
        writeln!(f, "bos_token_id            {:?}", self.bos_token_id)?;
        writeln!(f, "eos_token_ids           {:?}", self.eos_token_ids)?;
        writeln!(
            f,
            "max_position_embeddings {}",
            self.max_position_embeddings
        )?;
        write!(f, "dtype                   {:?}", self.dtype)
    }
}
