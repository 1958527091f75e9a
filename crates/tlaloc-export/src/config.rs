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
    /// `MistralForCausalLM` (a sliding window on every layer when `sliding_window` is set).
    Mistral,
    /// `Qwen2ForCausalLM` (q/k/v projections carry biases).
    Qwen2,
    /// `Qwen3ForCausalLM` (per-head RMSNorm of q and k before RoPE; biases as
    /// `attention_bias` says).
    Qwen3,
    /// `Gemma3ForCausalLM` (text): (1 + w) RMSNorms, four per layer, per-head q/k norms,
    /// GELU-tanh gating, the embedding scaled by sqrt(hidden), sliding-window layers with their
    /// own RoPE base, tied embeddings.
    Gemma3,
    /// `Phi3ForCausalLM`: q/k/v stored as one `qkv_proj`, gate/up as one `gate_up_proj` (split
    /// when read); a sliding window on every layer when `sliding_window` is set.
    Phi3,
}

/// Which layers attend through a sliding window, and how wide it is. Kept as a rule rather
/// than a list where the config gives one, so a hostile layer count allocates nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayerWindows {
    /// Every layer attends to the whole causal prefix.
    Full,
    /// Every layer has this window (Mistral).
    All(usize),
    /// Layer `i` is global when `(i + 1) % period == 0` and windowed otherwise (Gemma 3's
    /// `sliding_window_pattern`).
    Periodic {
        /// The window of the sliding layers.
        window: usize,
        /// Every `period`-th layer is global.
        period: usize,
    },
    /// One entry per layer (`layer_types`).
    Listed(Vec<Option<usize>>),
}

impl LayerWindows {
    /// The window of `layer` (`None`: full causal attention).
    pub fn window(&self, layer: usize) -> Option<usize> {
        match self {
            Self::Full => None,
            Self::All(w) => Some(*w),
            Self::Periodic { window, period } => ((layer + 1) % period != 0).then_some(*window),
            Self::Listed(list) => list.get(layer).copied().flatten(),
        }
    }

    /// The distinct window widths, ascending.
    pub fn widths(&self) -> Vec<usize> {
        let mut widths: Vec<usize> = match self {
            Self::Full => vec![],
            Self::All(w) | Self::Periodic { window: w, .. } => vec![*w],
            Self::Listed(list) => list.iter().flatten().copied().collect(),
        };
        widths.sort_unstable();
        widths.dedup();
        widths
    }
}

/// The MLP's gate activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `silu(gate) * up` (SwiGLU).
    Silu,
    /// `gelu_pytorch_tanh(gate) * up` (GeGLU with PyTorch's tanh approximation).
    GeluTanh,
}

/// The architecture names accepted in `config.json`.
pub const ACCEPTED_ARCHITECTURES: &str = "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma3ForCausalLM, \
     Phi3ForCausalLM";

impl Architecture {
    /// Parses a Hugging Face `architectures[0]` name.
    pub fn from_hf_name(name: &str) -> Result<Self> {
        match name {
            "LlamaForCausalLM" => Ok(Self::Llama),
            "MistralForCausalLM" => Ok(Self::Mistral),
            "Qwen2ForCausalLM" => Ok(Self::Qwen2),
            "Qwen3ForCausalLM" => Ok(Self::Qwen3),
            "Gemma3ForCausalLM" => Ok(Self::Gemma3),
            "Phi3ForCausalLM" => Ok(Self::Phi3),
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
            Self::Gemma3 => "Gemma3ForCausalLM",
            Self::Phi3 => "Phi3ForCausalLM",
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
    /// Per layer, the sliding attention window: `Some(w)` lets a query at position `p` see
    /// only keys at positions above `p - w` (transformers' `sliding_window_overlay`); `None` is
    /// full causal attention.
    pub layer_windows: LayerWindows,
    /// RoPE base of the sliding-window layers where it differs from `rope_theta` (Gemma 3's
    /// `rope_local_base_freq`; always unscaled).
    pub local_rope_theta: Option<f64>,
    /// The MLP gate activation.
    pub activation: Activation,
    /// Gemma's layer: the attention output and the MLP output are each RMS-normalized before
    /// their residual add (four norms per layer instead of two).
    pub sandwich_norms: bool,
    /// The embedding rows are multiplied by `sqrt(hidden_size)`, rounded to the embedding's
    /// dtype (Gemma).
    pub scale_embedding: bool,
    /// What is added to every stored RMSNorm weight before use: 1 for Gemma's `(1 + w)` norms
    /// as transformers stores them, 0 where the file holds the weight to multiply by (Llama,
    /// and Gemma GGUF files, whose converter already added the 1).
    pub norm_weight_offset: f32,
    /// Attention scores are multiplied by this (`head_dim^-0.5`, or Gemma's
    /// `query_pre_attn_scalar^-0.5`).
    pub attention_scale: f64,
    /// Final logits become `cap * tanh(logits / cap)` (Gemma's `final_logit_softcapping`).
    pub final_logit_softcap: Option<f64>,
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
    /// transformers-5 per-layer attention kinds (`full_attention` / `sliding_attention`).
    pub layer_types: Option<Vec<String>>,
    /// Activation (must be `silu`; Gemma: `gelu_pytorch_tanh`).
    pub hidden_act: Option<String>,
    /// Gemma's name for the activation.
    pub hidden_activation: Option<String>,
    /// Gemma 3: the attention scale is `query_pre_attn_scalar^-0.5`.
    pub query_pre_attn_scalar: Option<f64>,
    /// Gemma 3: the final logits are soft-capped at this value.
    pub final_logit_softcapping: Option<f64>,
    /// Gemma 2/3: attention scores soft-capped at this value (not built).
    pub attn_logit_softcapping: Option<f64>,
    /// Gemma 3 (transformers 4): RoPE base of the sliding layers.
    pub rope_local_base_freq: Option<f64>,
    /// Gemma 3 (older configs): every `n`-th layer is global, the rest sliding.
    pub sliding_window_pattern: Option<usize>,
    /// Phi-3 (transformers 4): the fraction of each head RoPE rotates (must be 1).
    pub partial_rotary_factor: Option<f64>,
    /// Gemma 3 embedding models: bidirectional attention (not built).
    pub use_bidirectional_attention: Option<bool>,
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
                "gemma3_text" => Architecture::Gemma3,
                "phi3" => Architecture::Phi3,
                other => {
                    return Err(IngestError::UnsupportedArchitecture {
                        found: other.to_string(),
                        accepted: "model_type llama, mistral, qwen2, qwen3, gemma3_text, phi3",
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
        let gemma = architecture == Architecture::Gemma3;
        let activation = match (
            gemma,
            self.hidden_activation
                .as_deref()
                .or(self.hidden_act.as_deref()),
        ) {
            (false, None | Some("silu")) => Activation::Silu,
            (true, None | Some("gelu_pytorch_tanh")) => Activation::GeluTanh,
            (gemma, Some(act)) => {
                let (field, accepted) = if gemma {
                    ("hidden_activation", "\"gelu_pytorch_tanh\"")
                } else {
                    ("hidden_act", "\"silu\"")
                };
                return Err(unsupported(field, format!("{act:?}"), accepted));
            }
        };
        if let Some(cap) = self.attn_logit_softcapping {
            return Err(unsupported(
                "attn_logit_softcapping",
                cap.to_string(),
                "null (soft-capped attention scores are not built)",
            ));
        }
        if let Some(factor) = self.partial_rotary_factor
            && factor != 1.0
        {
            return Err(unsupported(
                "partial_rotary_factor",
                factor.to_string(),
                "1.0 (RoPE over the whole head)",
            ));
        }
        if self.use_bidirectional_attention == Some(true) {
            return Err(unsupported(
                "use_bidirectional_attention",
                "true",
                "false (a causal decoder)",
            ));
        }
        let hidden_size = required(self.hidden_size, "hidden_size")?;
        let num_attention_heads = required(self.num_attention_heads, "num_attention_heads")?;
        let head_dim = match self.head_dim {
            Some(d) => d,
            None if num_attention_heads > 0 => hidden_size / num_attention_heads,
            None => 0,
        };
        let (rope_theta, rope_scaling, local_rope_theta) = if gemma {
            gemma_rope(
                self.rope_theta,
                self.rope_local_base_freq,
                self.rope_scaling.as_ref(),
                self.rope_parameters.as_ref(),
            )?
        } else {
            let (theta, scaling) = parse_rope(
                self.rope_theta,
                self.rope_scaling.as_ref(),
                self.rope_parameters.as_ref(),
            )?;
            (theta, scaling, None)
        };
        let max_position_embeddings =
            required(self.max_position_embeddings, "max_position_embeddings")?;
        let num_hidden_layers = required(self.num_hidden_layers, "num_hidden_layers")?;
        let layer_windows = if gemma {
            gemma_layer_windows(
                self.sliding_window,
                self.sliding_window_pattern,
                self.layer_types.as_deref(),
                num_hidden_layers,
            )?
        } else {
            layer_windows(
                architecture,
                self.sliding_window,
                self.use_sliding_window,
                self.layer_types.as_deref(),
                num_hidden_layers,
            )?
        };
        let attention_scale = match (gemma, self.query_pre_attn_scalar) {
            (true, Some(scalar)) if scalar.is_finite() && scalar > 0.0 => scalar.powf(-0.5),
            (true, Some(scalar)) => {
                return Err(unsupported(
                    "query_pre_attn_scalar",
                    scalar.to_string(),
                    "a positive number",
                ));
            }
            _ => (head_dim as f64).powf(-0.5),
        };
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
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads: self.num_key_value_heads.unwrap_or(num_attention_heads),
            head_dim,
            vocab_size: required(self.vocab_size, "vocab_size")?,
            rms_norm_eps: required(self.rms_norm_eps, "rms_norm_eps")?,
            rope_theta,
            rope_scaling,
            // Gemma's configs tie by default (transformers' Gemma3TextConfig).
            tie_word_embeddings: self.tie_word_embeddings.unwrap_or(gemma),
            qkv_bias,
            o_bias,
            mlp_bias: self.mlp_bias.unwrap_or(false),
            qk_norm: matches!(architecture, Architecture::Qwen3 | Architecture::Gemma3),
            layer_windows,
            local_rope_theta,
            activation,
            sandwich_norms: gemma,
            scale_embedding: gemma,
            norm_weight_offset: if gemma { 1.0 } else { 0.0 },
            attention_scale,
            final_logit_softcap: self.final_logit_softcapping,
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

/// The per-layer windows `config.json` asks for. Mistral windows every layer when
/// `sliding_window` is set (transformers' `MistralAttention`); Qwen2/Qwen3 windows are refused
/// while `use_sliding_window` is on (their `max_window_layers` split is not built); an explicit
/// `layer_types` list must agree with that.
fn layer_windows(
    architecture: Architecture,
    sliding_window: Option<usize>,
    use_sliding_window: Option<bool>,
    layer_types: Option<&[String]>,
    layers: usize,
) -> Result<LayerWindows> {
    let window = match architecture {
        Architecture::Llama | Architecture::Gemma3 => None,
        Architecture::Mistral | Architecture::Phi3 => sliding_window,
        Architecture::Qwen2 | Architecture::Qwen3 => {
            if use_sliding_window.unwrap_or(false)
                && let Some(window) = sliding_window
            {
                return Err(unsupported(
                    "use_sliding_window",
                    format!("true (sliding_window {window})"),
                    "false; Qwen sliding windows (max_window_layers) are not built, Mistral's \
                     and Gemma 3's are",
                ));
            }
            None
        }
    };
    if window == Some(0) {
        return Err(unsupported(
            "sliding_window",
            "0",
            "a positive integer or null",
        ));
    }
    let implied = if window.is_some() {
        "sliding_attention"
    } else {
        "full_attention"
    };
    if let Some(types) = layer_types
        && (types.len() != layers || types.iter().any(|t| t != implied))
    {
        return Err(unsupported(
            "layer_types",
            format!("{types:?}"),
            format!(
                "{implied:?} on every layer ({layers}) for {}",
                architecture.hf_name()
            ),
        ));
    }
    Ok(match window {
        Some(w) => LayerWindows::All(w),
        None => LayerWindows::Full,
    })
}

/// Gemma 3's per-layer windows: `layer_types` where the config lists them, else every
/// `sliding_window_pattern`-th layer (default 6, transformers' `Gemma3TextConfig`) global and
/// the rest sliding with `sliding_window`.
fn gemma_layer_windows(
    sliding_window: Option<usize>,
    pattern: Option<usize>,
    layer_types: Option<&[String]>,
    layers: usize,
) -> Result<LayerWindows> {
    // transformers' Gemma3TextConfig default.
    let window = sliding_window.unwrap_or(4096);
    if window == 0 {
        return Err(unsupported("sliding_window", "0", "a positive integer"));
    }
    match layer_types {
        Some(types) => {
            if types.len() != layers {
                return Err(unsupported(
                    "layer_types",
                    format!("{} entries", types.len()),
                    format!("one per layer ({layers})"),
                ));
            }
            types
                .iter()
                .map(|t| match t.as_str() {
                    "sliding_attention" => Ok(Some(window)),
                    "full_attention" => Ok(None),
                    other => Err(unsupported(
                        "layer_types",
                        format!("{other:?}"),
                        "\"sliding_attention\" or \"full_attention\"",
                    )),
                })
                .collect::<Result<Vec<_>>>()
                .map(LayerWindows::Listed)
        }
        None => {
            let pattern = pattern.unwrap_or(6);
            if pattern == 0 {
                return Err(unsupported(
                    "sliding_window_pattern",
                    "0",
                    "a positive integer",
                ));
            }
            Ok(LayerWindows::Periodic {
                window,
                period: pattern,
            })
        }
    }
}

/// Gemma 3's two RoPEs: the global layers' (`rope_parameters.full_attention`, or
/// `rope_theta` + `rope_scaling`, base 1,000,000 by default) and the sliding layers'
/// (`rope_parameters.sliding_attention` or `rope_local_base_freq`, base 10,000 by default,
/// unscaled), as transformers' `Gemma3TextConfig` reads them.
fn gemma_rope(
    theta: Option<f64>,
    local_theta: Option<f64>,
    scaling: Option<&Value>,
    parameters: Option<&Value>,
) -> Result<(f64, RopeScaling, Option<f64>)> {
    const GLOBAL: f64 = 1_000_000.0;
    const LOCAL: f64 = 10_000.0;
    let per_type = parameters
        .and_then(Value::as_object)
        .filter(|m| m.contains_key("full_attention") || m.contains_key("sliding_attention"));
    let (global, local) = match per_type {
        Some(map) => {
            let global = match map.get("full_attention") {
                Some(p) => {
                    let (t, s) = parse_rope(None, None, Some(p))?;
                    let explicit = p.get("rope_theta").is_some();
                    (if explicit { t } else { theta.unwrap_or(GLOBAL) }, s)
                }
                None => (theta.unwrap_or(GLOBAL), RopeScaling::None),
            };
            let local = match map.get("sliding_attention") {
                Some(p) => {
                    let (t, s) = parse_rope(None, None, Some(p))?;
                    if s != RopeScaling::None {
                        return Err(unsupported(
                            "rope_parameters.sliding_attention.rope_type",
                            format!("{s:?}"),
                            "\"default\" (the sliding layers' RoPE is unscaled)",
                        ));
                    }
                    let explicit = p.get("rope_theta").is_some();
                    if explicit {
                        t
                    } else {
                        local_theta.unwrap_or(LOCAL)
                    }
                }
                None => local_theta.unwrap_or(LOCAL),
            };
            (global, local)
        }
        None => {
            let (t, s) = parse_rope(Some(theta.unwrap_or(GLOBAL)), scaling, parameters)?;
            ((t, s), local_theta.unwrap_or(LOCAL))
        }
    };
    Ok((global.0, global.1, Some(local)))
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
    if let Some(factor) = map.get("partial_rotary_factor")
        && factor.as_f64() != Some(1.0)
    {
        return Err(unsupported(
            format!("{field}.partial_rotary_factor"),
            factor.to_string(),
            "1.0 (RoPE over the whole head)",
        ));
    }
    for key in map.keys() {
        if !matches!(
            key.as_str(),
            "rope_type" | "type" | "rope_theta" | "partial_rotary_factor"
        ) && !allowed.contains(&key.as_str())
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
        match &self.layer_windows {
            LayerWindows::Listed(list) if list.len() != self.num_hidden_layers => {
                return Err(unsupported(
                    "layer windows",
                    format!("{} entries", list.len()),
                    format!("one per layer ({})", self.num_hidden_layers),
                ));
            }
            LayerWindows::Periodic { period: 0, .. } => {
                return Err(unsupported(
                    "sliding window period",
                    "0",
                    "a positive integer",
                ));
            }
            _ => {}
        }
        if self.layer_windows.widths().first() == Some(&0) {
            return Err(unsupported("sliding_window", "0", "a positive integer"));
        }
        for (field, value) in [
            ("local rope theta", self.local_rope_theta),
            ("final_logit_softcapping", self.final_logit_softcap),
            ("attention scale", Some(self.attention_scale)),
        ] {
            if let Some(v) = value
                && !(v.is_finite() && v > 0.0)
            {
                return Err(unsupported(
                    field,
                    v.to_string(),
                    "a positive finite number",
                ));
            }
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
        writeln!(f, "layer_windows           {:?}", self.layer_windows)?;
        writeln!(f, "local_rope_theta        {:?}", self.local_rope_theta)?;
        writeln!(f, "activation              {:?}", self.activation)?;
        writeln!(
            f,
            "gemma layout            sandwich norms {}, scaled embedding {}, norm offset {}",
            self.sandwich_norms, self.scale_embedding, self.norm_weight_offset
        )?;
        writeln!(f, "attention_scale         {}", self.attention_scale)?;
        writeln!(f, "final_logit_softcap     {:?}", self.final_logit_softcap)?;
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
