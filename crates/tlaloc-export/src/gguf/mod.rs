//! llama.cpp GGUF checkpoints: the container ([`header`]), dequantization ([`dequant`]) and the
//! Llama-family reading of it — a [`ModelConfig`] from `llama.*` / `qwen2.*` / `qwen3.*`
//! metadata, tensors in Hugging Face layout with llama.cpp's Q/K row permutation undone (Llama
//! files only) exactly as transformers' `LlamaTensorProcessor._reverse_permute_weights` does.

pub mod dequant;
pub mod header;

use std::path::{Path, PathBuf};

pub use dequant::{ACCEPTED_TYPES, DequantError, GGML_TYPES, GgmlType, GgmlTypeInfo, dequantize};
pub use header::{GgufHeader, GgufTensorInfo, HeaderError, MetaValue};

use crate::checkpoint::{LayerRole, Tensor, TensorData, TensorRole};
use crate::config::{
    Activation, Architecture, LayerWindows, ModelConfig, RopeScaling, unsupported,
};
use crate::error::{IngestError, Result, io_error};
use crate::mapped::map_file;

/// An opened GGUF file with its derived config.
#[derive(Debug)]
pub struct GgufCheckpoint {
    path: PathBuf,
    mmap: Vec<u8>,
    header: GgufHeader,
    arch: String,
    /// The config built from the metadata.
    pub config: ModelConfig,
}

impl GgufCheckpoint {
    /// Maps and parses `path`, and builds the config from its metadata.
    pub fn open(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(io_error(path))?;
        let mmap = map_file(&file).map_err(io_error(path))?;
        let header = parse_header(path, &mmap)?;
        let (arch, config) = config_from_header(&header)?;
        if let Some(t) = header.tensors.iter().find(|t| !t.ggml_type.is_supported()) {
            return Err(IngestError::UnsupportedGgmlType {
                path: path.to_path_buf(),
                tensor: t.name.clone(),
                reason: DequantError::Unsupported {
                    name: t.ggml_type.name(),
                    id: t.ggml_type.id(),
                },
            });
        }
        Ok(Self {
            path: path.to_path_buf(),
            mmap,
            header,
            arch,
            config,
        })
    }

    /// The parsed header.
    pub fn header(&self) -> &GgufHeader {
        &self.header
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        &self.mmap
    }

    /// Tensor descriptions in file order.
    pub fn tensor_infos(&self) -> &[GgufTensorInfo] {
        &self.header.tensors
    }

    /// Reads tensor `name` (playing `role`) as its stored ggml blocks, rows in Hugging Face
    /// order (Q/K rows unpermuted as [`GgufCheckpoint::read`] does, whole rows of blocks at a
    /// time): the type, the Hugging Face dims and the bytes, `dims[0]` rows of equal length.
    pub fn read_blocks(
        &self,
        name: &str,
        role: TensorRole,
    ) -> Result<(GgmlType, Vec<usize>, Vec<u8>)> {
        let (info, bytes) = self.stored(name)?;
        let dims = info.hf_dims();
        let rows = dims.first().copied().unwrap_or(1);
        if rows == 0 || bytes.len() % rows != 0 {
            return Err(IngestError::Gguf {
                path: self.path.clone(),
                reason: format!(
                    "tensor {name:?}: {} bytes are not {rows} rows of whole blocks",
                    bytes.len()
                ),
            });
        }
        let mut bytes = bytes.to_vec();
        if let Some(heads) = self.permuted_heads(role) {
            let source = permuted_source_rows(rows, heads, name, &dims)?;
            bytes = permute_rows(&bytes, bytes.len() / rows, &source);
        }
        Ok((info.ggml_type, dims, bytes))
    }

    /// The tensor's description and stored bytes.
    fn stored(&self, name: &str) -> Result<(&GgufTensorInfo, &[u8])> {
        let info = self
            .header
            .tensors
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| IngestError::MissingTensors {
                names: vec![name.to_string()],
                more: 0,
            })?;
        let bytes = self
            .mmap
            .get(info.offset..info.offset + info.byte_len)
            .ok_or_else(|| IngestError::Gguf {
                path: self.path.clone(),
                reason: format!("tensor {name:?} lies past the end of the file"),
            })?;
        Ok((info, bytes))
    }

    /// The head count whose RoPE row permutation llama.cpp applied to `role`'s rows: Q and K
    /// (and their biases) of Llama-architecture files only.
    fn permuted_heads(&self, role: TensorRole) -> Option<usize> {
        if self.arch != "llama" {
            return None;
        }
        match role {
            TensorRole::Layer(_, LayerRole::Q | LayerRole::QBias) => {
                Some(self.config.num_attention_heads)
            }
            TensorRole::Layer(_, LayerRole::K | LayerRole::KBias) => {
                Some(self.config.num_key_value_heads)
            }
            _ => None,
        }
    }

    /// Reads tensor `name` (playing `role`) dequantized, in Hugging Face layout.
    pub fn read(&self, name: &str, role: TensorRole) -> Result<Tensor> {
        let (info, bytes) = self.stored(name)?;
        let data = dequantize(info.ggml_type, bytes).map_err(|reason| match reason {
            DequantError::PartialBlock { .. } => IngestError::Gguf {
                path: self.path.clone(),
                reason: format!("tensor {name:?}: {reason}"),
            },
            _ => IngestError::UnsupportedGgmlType {
                path: self.path.clone(),
                tensor: name.to_string(),
                reason,
            },
        })?;
        let mut tensor = Tensor::new(name, info.hf_dims(), data)?;
        if let Some(heads) = self.permuted_heads(role) {
            tensor = reverse_permute(tensor, heads, name)?;
        }
        Ok(tensor)
    }
}

/// Parses the header of the GGUF file `path` (whose bytes are `bytes`) into the crate's errors:
/// an unknown element type is refused as not supported, anything else wrong as malformed.
pub fn parse_header(path: &Path, bytes: &[u8]) -> Result<GgufHeader> {
    GgufHeader::parse(bytes).map_err(|e| match e {
        HeaderError::Malformed(reason) => IngestError::Gguf {
            path: path.to_path_buf(),
            reason,
        },
        HeaderError::UnknownType { tensor, error } => IngestError::UnsupportedGgmlType {
            path: path.to_path_buf(),
            tensor,
            reason: error,
        },
    })
}

/// Undoes llama.cpp's `permute`: within each head, rows `(d, 2)` were interleaved; they go back
/// to `(2, d)` (transformers: `w.reshape(n_head, dim, 2, ...).swapaxes(2, 1)`).
pub fn reverse_permute(tensor: Tensor, n_head: usize, name: &str) -> Result<Tensor> {
    let rows = tensor.dims[0];
    let cols: usize = tensor.dims[1..].iter().product();
    let source = permuted_source_rows(rows, n_head, name, &tensor.dims)?;
    let data = match &tensor.data {
        TensorData::F32(v) => TensorData::F32(permute_rows(v, cols, &source)),
        TensorData::BF16(v) => TensorData::BF16(permute_rows(v, cols, &source)),
        TensorData::F16(v) => TensorData::F16(permute_rows(v, cols, &source)),
    };
    Ok(Tensor {
        dims: tensor.dims,
        data,
    })
}

/// For each row of the unpermuted tensor of `rows` rows and `n_head` heads, the stored row it
/// comes from.
fn permuted_source_rows(
    rows: usize,
    n_head: usize,
    name: &str,
    dims: &[usize],
) -> Result<Vec<usize>> {
    if n_head == 0 || rows % (2 * n_head) != 0 {
        let cols: usize = dims[1..].iter().product();
        return Err(IngestError::ShapeMismatch {
            tensor: name.to_string(),
            expected: vec![2 * n_head, cols],
            found: dims.to_vec(),
        });
    }
    let dim = rows / n_head / 2;
    Ok((0..rows)
        .map(|out| {
            let (h, rest) = (out / (2 * dim), out % (2 * dim));
            let (a, d) = (rest / dim, rest % dim);
            h * 2 * dim + d * 2 + a
        })
        .collect())
}

/// Rows of `width` units of `v` in the order `source` gives.
fn permute_rows<T: Copy>(v: &[T], width: usize, source: &[usize]) -> Vec<T> {
    let mut out = Vec::with_capacity(v.len());
    for &s in source {
        out.extend_from_slice(&v[s * width..(s + 1) * width]);
    }
    out
}

fn meta_u64(h: &GgufHeader, key: &str) -> Result<Option<u64>> {
    match h.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| unsupported(key, format!("{v:?}"), "a non-negative integer")),
    }
}

fn meta_usize(h: &GgufHeader, key: &str) -> Result<Option<usize>> {
    meta_u64(h, key)?
        .map(|v| {
            usize::try_from(v)
                .map_err(|_| unsupported(key, v.to_string(), "a size that fits in memory"))
        })
        .transpose()
}

fn need_usize(h: &GgufHeader, key: &str) -> Result<usize> {
    meta_usize(h, key)?.ok_or_else(|| unsupported(key, "missing", "a non-negative integer"))
}

fn meta_f64(h: &GgufHeader, key: &str) -> Result<Option<f64>> {
    match h.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| unsupported(key, format!("{v:?}"), "a float")),
    }
}

fn token_id(h: &GgufHeader, key: &str) -> Result<Option<u32>> {
    meta_u64(h, key)?
        .map(|v| u32::try_from(v).map_err(|_| unsupported(key, v.to_string(), "a token id")))
        .transpose()
}

/// Builds the config from `general.architecture` and its `<arch>.*` keys.
fn config_from_header(h: &GgufHeader) -> Result<(String, ModelConfig)> {
    let arch = h
        .get("general.architecture")
        .and_then(MetaValue::as_str)
        .ok_or_else(|| {
            unsupported(
                "general.architecture",
                "missing",
                "\"llama\", \"qwen2\", \"qwen3\" or \"gemma3\"",
            )
        })?
        .to_string();
    let architecture = match arch.as_str() {
        "llama" => Architecture::Llama,
        "qwen2" => Architecture::Qwen2,
        "qwen3" => Architecture::Qwen3,
        "gemma3" => Architecture::Gemma3,
        "phi3" => Architecture::Phi3,
        other => {
            return Err(IngestError::UnsupportedArchitecture {
                found: other.to_string(),
                accepted: "GGUF general.architecture llama, qwen2, qwen3, gemma3, phi3",
            });
        }
    };
    let key = |k: &str| format!("{arch}.{k}");
    let hidden_size = need_usize(h, &key("embedding_length"))?;
    let num_attention_heads = need_usize(h, &key("attention.head_count"))?;
    let num_key_value_heads =
        meta_usize(h, &key("attention.head_count_kv"))?.unwrap_or(num_attention_heads);
    let head_dim = match meta_usize(h, &key("attention.key_length"))? {
        Some(d) => d,
        None if num_attention_heads > 0 => hidden_size / num_attention_heads,
        None => 0,
    };
    let vocab_size = match h.get("tokenizer.ggml.tokens").and_then(MetaValue::as_array) {
        Some(tokens) => tokens.len(),
        None => need_usize(h, &key("vocab_size"))?,
    };
    if let Some(stated) = meta_usize(h, &key("vocab_size"))?
        && stated != vocab_size
    {
        return Err(unsupported(
            key("vocab_size"),
            stated.to_string(),
            format!("the tokenizer's token count ({vocab_size})"),
        ));
    }
    let rope_scaling = match h.get(&key("rope.scaling.type")).map(|v| v.as_str()) {
        None | Some(Some("none")) => RopeScaling::None,
        Some(Some("linear")) => RopeScaling::Linear {
            factor: meta_f64(h, &key("rope.scaling.factor"))?
                .ok_or_else(|| unsupported(key("rope.scaling.factor"), "missing", "a float"))?,
        },
        Some(other) => {
            return Err(unsupported(
                key("rope.scaling.type"),
                format!("{other:?}"),
                "\"none\" or \"linear\"",
            ));
        }
    };
    let has = |name: &str| h.tensors.iter().any(|t| t.name == name);
    let any_layer_has = |suffix: &str| {
        h.tensors
            .iter()
            .any(|t| t.name.starts_with("blk.") && t.name.ends_with(suffix))
    };
    if let Some(t) = h.tensors.iter().find(|t| t.name == "rope_freqs.weight") {
        return Err(IngestError::UnexpectedTensors {
            names: vec![format!(
                "{} (per-frequency RoPE factors, e.g. llama3 scaling, are not built from GGUF)",
                t.name
            )],
        });
    }
    let qkv_bias = any_layer_has(".attn_q.bias");
    if architecture == Architecture::Qwen2 && !qkv_bias {
        return Err(IngestError::MissingTensors {
            names: vec!["blk.0.attn_q.bias".into()],
            more: 0,
        });
    }
    let gemma = architecture == Architecture::Gemma3;
    let num_hidden_layers = need_usize(h, &key("block_count"))?;
    let window = meta_usize(h, &key("attention.sliding_window"))?;
    let phi3 = architecture == Architecture::Phi3;
    if let Some(window) = window
        && !gemma
        && !phi3
    {
        return Err(unsupported(
            key("attention.sliding_window"),
            window.to_string(),
            "absent for GGUF architectures llama, qwen2 and qwen3 (a windowed Mistral is read \
             from its safetensors directory)",
        ));
    }
    if let Some(rotated) = meta_usize(h, &key("rope.dimension_count"))?
        && rotated != head_dim
    {
        return Err(unsupported(
            key("rope.dimension_count"),
            rotated.to_string(),
            format!("the head width ({head_dim}): partial rotary embeddings are not built"),
        ));
    }
    if let Some(cap) = meta_f64(h, &key("attn_logit_softcapping"))? {
        return Err(unsupported(
            key("attn_logit_softcapping"),
            cap.to_string(),
            "absent (soft-capped attention scores are not built)",
        ));
    }
    // Gemma 3 as transformers' GGUF loader configures it: every sixth layer global, the rest
    // sliding (llama.cpp's fixed pattern too), sliding layers at RoPE base 10,000, norms stored
    // with the 1 already added by llama.cpp's converter. The attention scale is llama.cpp's
    // `head_dim^-0.5`, which is transformers' default `query_pre_attn_scalar` (256) for every
    // Gemma 3 whose head_dim is 256.
    let layer_windows = if gemma {
        let window = window
            .ok_or_else(|| unsupported(key("attention.sliding_window"), "missing", "an integer"))?;
        LayerWindows::Periodic { window, period: 6 }
    } else if let Some(window) = window {
        // Phi-3: every layer, as transformers' Phi3Attention.
        LayerWindows::All(window)
    } else {
        LayerWindows::Full
    };
    let config = ModelConfig {
        architecture,
        hidden_size,
        intermediate_size: need_usize(h, &key("feed_forward_length"))?,
        num_hidden_layers,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        vocab_size,
        rms_norm_eps: meta_f64(h, &key("attention.layer_norm_rms_epsilon"))?.ok_or_else(|| {
            unsupported(
                key("attention.layer_norm_rms_epsilon"),
                "missing",
                "a float",
            )
        })?,
        rope_theta: meta_f64(h, &key("rope.freq_base"))?.unwrap_or(10_000.0),
        rope_scaling,
        tie_word_embeddings: !has("output.weight"),
        qkv_bias,
        o_bias: any_layer_has(".attn_output.bias"),
        mlp_bias: any_layer_has(".ffn_gate.bias"),
        qk_norm: matches!(architecture, Architecture::Qwen3 | Architecture::Gemma3),
        layer_windows,
        local_rope_theta: gemma.then_some(10_000.0),
        activation: if gemma {
            Activation::GeluTanh
        } else {
            Activation::Silu
        },
        sandwich_norms: gemma,
        scale_embedding: gemma,
        norm_weight_offset: 0.0,
        attention_scale: (head_dim as f64).powf(-0.5),
        final_logit_softcap: meta_f64(h, &key("final_logit_softcapping"))?,
        bos_token_id: token_id(h, "tokenizer.ggml.bos_token_id")?,
        eos_token_ids: token_id(h, "tokenizer.ggml.eos_token_id")?
            .into_iter()
            .collect(),
        max_position_embeddings: need_usize(h, &key("context_length"))?,
        dtype: None,
    }
    .checked()?;
    Ok((arch, config))
}
