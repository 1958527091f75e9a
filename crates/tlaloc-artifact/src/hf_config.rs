//! The Hugging Face `config.json` an artifact carries for engines that read one (vLLM): what it
//! says is derived from the manifest alone, and [`check_hf_config`] refuses a file that
//! disagrees with the manifest, naming the first field that does.
//!
//! The file sits in the artifact's tokenizer directory (`tokenizer/config.json`, a tokenizer
//! file of the manifest, so `verify` hashes it like every other file): that directory is then a
//! Hugging Face model directory (model config, tokenizer, generation config) an engine can be
//! pointed at, while the weights and programs stay the artifact's own. Only the fields an engine
//! reads to size its scheduler and tokenizer are written; activation functions and other
//! per-architecture details keep the config class's defaults, since no engine computes with
//! them here.

use serde_json::{Map, Value, json};
use thiserror::Error;

use crate::dtype::Dtype;
use crate::manifest::{Manifest, ManifestModel, ManifestRopeScaling};

/// The config's file name inside the tokenizer directory.
pub const HF_CONFIG_FILE: &str = "config.json";

/// A `config.json` refused against its manifest.
#[derive(Debug, Error, PartialEq)]
pub enum HfConfigError {
    /// The file is not a JSON object.
    #[error("config.json is not a JSON object: {0}")]
    Parse(String),
    /// A field the manifest determines is absent.
    #[error("config.json has no `{field}`; the manifest says {expected}")]
    Missing { field: String, expected: String },
    /// A field that disagrees with the manifest.
    #[error("config.json field `{field}` is {found} but the manifest says {expected}")]
    Mismatch {
        field: String,
        found: String,
        expected: String,
    },
}

/// The Hugging Face `model_type` of an architecture class.
pub fn model_type_of(architecture: &str) -> Option<&'static str> {
    Some(match architecture {
        "LlamaForCausalLM" => "llama",
        "MistralForCausalLM" => "mistral",
        "Qwen2ForCausalLM" => "qwen2",
        "Qwen3ForCausalLM" => "qwen3",
        "Gemma3ForCausalLM" => "gemma3_text",
        "Phi3ForCausalLM" => "phi3",
        _ => return None,
    })
}

/// The `torch_dtype` name of a model dtype.
pub fn torch_dtype_of(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::F32 => "float32",
        Dtype::Bf16 => "bfloat16",
        Dtype::F16 => "float16",
        Dtype::I32 => "int32",
        Dtype::I8 => "int8",
        Dtype::U8 => "uint8",
        Dtype::F8E4M3FN => "float8_e4m3fn",
    }
}

/// The config's fields for `model` with weights in `dtype`, in a stable order.
pub fn hf_config_fields(model: &ManifestModel, dtype: Dtype) -> Map<String, Value> {
    let mut fields = Map::new();
    let mut put = |k: &str, v: Value| {
        fields.insert(k.to_owned(), v);
    };
    put("architectures", json!([model.architecture]));
    if let Some(model_type) = model_type_of(&model.architecture) {
        put("model_type", json!(model_type));
    }
    put("hidden_size", json!(model.hidden_size));
    put("intermediate_size", json!(model.intermediate_size));
    put("num_hidden_layers", json!(model.num_layers));
    put("num_attention_heads", json!(model.num_heads));
    put("num_key_value_heads", json!(model.num_kv_heads));
    put("head_dim", json!(model.head_dim));
    put("vocab_size", json!(model.vocab_size));
    put("rms_norm_eps", json!(model.rms_norm_eps));
    put("rope_theta", json!(model.rope_theta));
    put(
        "rope_scaling",
        match &model.rope_scaling {
            None => Value::Null,
            Some(ManifestRopeScaling::Linear { factor }) => {
                json!({"rope_type": "linear", "factor": factor})
            }
            Some(ManifestRopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            }) => json!({
                "rope_type": "llama3",
                "factor": factor,
                "low_freq_factor": low_freq_factor,
                "high_freq_factor": high_freq_factor,
                "original_max_position_embeddings": original_max_position_embeddings,
            }),
        },
    );
    put("tie_word_embeddings", json!(model.tied_embeddings));
    put("attention_bias", json!(model.attention_bias));
    put(
        "max_position_embeddings",
        json!(model.max_position_embeddings),
    );
    put("bos_token_id", json!(model.bos_token_id));
    put(
        "eos_token_id",
        match model.eos_token_ids.as_slice() {
            [one] => json!(one),
            many => json!(many),
        },
    );
    put("torch_dtype", json!(torch_dtype_of(dtype)));
    fields
}

/// The bytes of `config.json` for `model`: pretty JSON with a trailing newline, keys sorted,
/// so two exports of one checkpoint write the same bytes.
pub fn hf_config_json(model: &ManifestModel, dtype: Dtype) -> Vec<u8> {
    let mut bytes = serde_json::to_vec_pretty(&Value::Object(hf_config_fields(model, dtype)))
        .expect("a JSON value always serializes");
    bytes.push(b'\n');
    bytes
}

/// Refuses `bytes` unless every field the manifest determines is present and equal (numbers
/// compared as numbers, so `1e-5` and `0.00001` agree). Fields the manifest does not determine
/// are left alone.
pub fn check_hf_config(manifest: &Manifest, bytes: &[u8]) -> Result<(), HfConfigError> {
    check_hf_config_of(&manifest.model, manifest.dtype, bytes)
}

/// [`check_hf_config`] against a manifest's model and dtype.
pub fn check_hf_config_of(
    model: &ManifestModel,
    dtype: Dtype,
    bytes: &[u8],
) -> Result<(), HfConfigError> {
    let found: Value =
        serde_json::from_slice(bytes).map_err(|e| HfConfigError::Parse(e.to_string()))?;
    let Value::Object(found) = found else {
        return Err(HfConfigError::Parse(
            "the top level is not an object".into(),
        ));
    };
    for (field, expected) in hf_config_fields(model, dtype) {
        match found.get(&field) {
            None => {
                return Err(HfConfigError::Missing {
                    field,
                    expected: expected.to_string(),
                });
            }
            Some(value) if !same(value, &expected) => {
                return Err(HfConfigError::Mismatch {
                    field,
                    found: value.to_string(),
                    expected: expected.to_string(),
                });
            }
            Some(_) => {}
        }
    }
    Ok(())
}

fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> ManifestModel {
        ManifestModel {
            architecture: "LlamaForCausalLM".into(),
            hidden_size: 576,
            intermediate_size: 1536,
            num_layers: 30,
            num_heads: 9,
            num_kv_heads: 3,
            head_dim: 64,
            vocab_size: 49152,
            rms_norm_eps: 1e-5,
            rope_theta: 100000.0,
            rope_scaling: None,
            tied_embeddings: true,
            attention_bias: false,
            max_position_embeddings: 8192,
            bos_token_id: Some(1),
            eos_token_ids: vec![2],
        }
    }

    fn check(model: &ManifestModel, dtype: Dtype, bytes: &[u8]) -> Result<(), HfConfigError> {
        check_hf_config_of(model, dtype, bytes)
    }

    #[test]
    fn the_rendering_is_what_transformers_names_and_is_stable() {
        let bytes = hf_config_json(&model(), Dtype::F32);
        assert_eq!(bytes, hf_config_json(&model(), Dtype::F32));
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["model_type"], "llama");
        assert_eq!(v["num_hidden_layers"], 30);
        assert_eq!(v["num_key_value_heads"], 3);
        assert_eq!(v["eos_token_id"], 2);
        assert_eq!(v["torch_dtype"], "float32");
        assert!(check(&model(), Dtype::F32, &bytes).is_ok());
    }

    #[test]
    fn a_changed_field_is_refused_by_name() {
        let mut v: Value = serde_json::from_slice(&hf_config_json(&model(), Dtype::F32)).unwrap();
        v["num_hidden_layers"] = json!(12);
        let err = check(&model(), Dtype::F32, v.to_string().as_bytes()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "config.json field `num_hidden_layers` is 12 but the manifest says 30"
        );
        v.as_object_mut().unwrap().remove("num_hidden_layers");
        let err = check(&model(), Dtype::F32, v.to_string().as_bytes()).unwrap_err();
        assert!(
            matches!(err, HfConfigError::Missing { field, .. } if field == "num_hidden_layers")
        );
    }

    #[test]
    fn numbers_compare_as_numbers_and_other_fields_are_ignored() {
        let mut v: Value = serde_json::from_slice(&hf_config_json(&model(), Dtype::Bf16)).unwrap();
        v["rms_norm_eps"] = json!(0.00001);
        v["rope_theta"] = json!(100000);
        v["hidden_act"] = json!("silu");
        assert!(check(&model(), Dtype::Bf16, v.to_string().as_bytes()).is_ok());
        assert!(check(&model(), Dtype::F32, v.to_string().as_bytes()).is_err());
    }
}
