//! K/V pool dtypes through the runtime: the pools a loaded model allocates are the manifest's
//! layout byte for byte (scales included) for f32, bf16, int8 and fp8 pools, and fp8 pools load
//! only on a plugin that runs f8E4M3FN, refused by name on the others.

use std::path::{Path, PathBuf};

use tlaloc_artifact::{Dtype, LadderOptions};
use tlaloc_export::{ExportOptions, export};
use tlaloc_pjrt::discovery::PluginRequest;
use tlaloc_pjrt::testing::test_plugin_paths;
use tlaloc_runtime::{CompileMode, LoadError, LoadOptions, Model};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn export_tiny(kv_dtype: Dtype) -> PathBuf {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("kv-pools-{kv_dtype}"));
    if out.exists() {
        std::fs::remove_dir_all(&out).unwrap();
    }
    let options = ExportOptions {
        dtype: Dtype::F32,
        kv_dtype: Some(kv_dtype),
        ladder: LadderOptions::full_pool(2, 128, 16, vec![16]),
        force: false,
    };
    let fixture = workspace_root().join("tests/data/fixtures/tiny-llama-gqa");
    export(&fixture, &out, &options, &mut |_| {}).unwrap();
    out
}

fn load(dir: &Path, plugin: &Path) -> Result<Model, LoadError> {
    Model::load(
        dir,
        &LoadOptions {
            plugin: PluginRequest::Path(plugin.to_owned()),
            compile: CompileMode::Lazy,
            compile_cache: None,
            ..LoadOptions::default()
        },
    )
}

/// Bytes per token of context from the model's own shape, counted here independently of the
/// layout's arithmetic: K and V per layer, `kvHeads * headDim` codes of the pool dtype, plus
/// one f32 scale per KV head for the quantized dtypes.
fn expected_bytes_per_token(kv_dtype: Dtype) -> u64 {
    let text = std::fs::read_to_string(
        workspace_root().join("tests/data/fixtures/tiny-llama-gqa/config.json"),
    )
    .unwrap();
    let config: serde_json::Value = serde_json::from_str(&text).unwrap();
    let get = |k: &str| config[k].as_u64().unwrap();
    let layers = get("num_hidden_layers");
    let kv_heads = get("num_key_value_heads");
    let head_dim = config["head_dim"]
        .as_u64()
        .unwrap_or_else(|| get("hidden_size") / get("num_attention_heads"));
    let code_bytes = match kv_dtype {
        Dtype::F32 => 4,
        Dtype::Bf16 => 2,
        Dtype::I8 | Dtype::F8E4M3FN => 1,
        other => panic!("{other} is no K/V dtype"),
    };
    let scale_bytes = if matches!(kv_dtype, Dtype::I8 | Dtype::F8E4M3FN) {
        4
    } else {
        0
    };
    2 * layers * (kv_heads * head_dim * code_bytes + kv_heads * scale_bytes)
}

#[test]
fn pools_are_allocated_as_the_manifest_lays_them_out() {
    for kv_dtype in [Dtype::F32, Dtype::Bf16, Dtype::I8, Dtype::F8E4M3FN] {
        let dir = export_tiny(kv_dtype);
        let manifest = tlaloc_artifact::Artifact::open(&dir)
            .unwrap()
            .manifest()
            .clone();
        let kv = &manifest.kv_cache;
        assert_eq!(kv.dtype, kv_dtype);
        assert_eq!(kv.scales.is_some(), kv_dtype.is_kv_code_dtype());
        let per_token = expected_bytes_per_token(kv_dtype);
        assert_eq!(kv.bytes_per_token(), per_token, "{kv_dtype}");
        let slots = (kv.num_blocks * kv.block_size) as u64;
        for plugin in test_plugin_paths() {
            match load(&dir, &plugin) {
                Ok(model) => {
                    assert_eq!(model.pool_bytes(), per_token * slots, "{kv_dtype}");
                    eprintln!(
                        "{kv_dtype} pools on {}: {per_token} bytes per token, {} in all",
                        plugin.display(),
                        model.pool_bytes()
                    );
                }
                Err(e) => {
                    // Only fp8 may be refused, and only by name: plugin, dtype, what to use.
                    let text = e.to_string();
                    assert_eq!(kv_dtype, Dtype::F8E4M3FN, "{kv_dtype}: {text}");
                    assert!(matches!(e, LoadError::Unsupported(_)), "{text}");
                    for needle in ["f8e4m3fn", "int8", &plugin.display().to_string()] {
                        assert!(text.contains(needle), "{needle:?} missing from: {text}");
                    }
                    eprintln!("fp8 pools on {}: refused: {text}", plugin.display());
                }
            }
        }
    }
}
