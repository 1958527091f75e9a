//! K/V pool dtypes through the runtime: the pools a loaded model allocates are the manifest's
//! layout byte for byte (scales included) for f32, bf16, int8 and fp8 pools, and fp8 pools load
//! only on a plugin that runs f8E4M3FN, refused by name on the others; served through the
//! engine, quantized pools reproduce the fixture's goldens on their decided steps, and so do
//! the `cpu` variant's bodies over bf16 pools (read in place by its attention kernel) and over
//! int8 pools.

use std::path::{Path, PathBuf};

use tlaloc_artifact::{Dtype, LadderOptions};
use tlaloc_export::{ExportOptions, export};
use tlaloc_pjrt::discovery::PluginRequest;
use tlaloc_pjrt::testing::{test_plugin_paths, workspace_root};
use tlaloc_runtime::{
    CompileMode, Engine, EngineOptions, GenerateRequest, KernelChoice, LoadError, LoadOptions,
    Model, TokenEvent,
};

fn export_tiny(kv_dtype: Dtype) -> PathBuf {
    export_tiny_with(Dtype::F32, kv_dtype, false)
}

/// The fixture exported as `dtype` with `kv_dtype` pools, with the `cpu` variant or without.
fn export_tiny_with(dtype: Dtype, kv_dtype: Dtype, cpu_variant: bool) -> PathBuf {
    let variant = if cpu_variant { "-cpu" } else { "" };
    let out = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("kv-pools-{dtype}-{kv_dtype}{variant}"));
    if out.exists() {
        std::fs::remove_dir_all(&out).unwrap();
    }
    let options = ExportOptions {
        dtype,
        kv_dtype: Some(kv_dtype),
        ladder: LadderOptions::full_pool(2, 128, 16, vec![16]),
        force: false,
        cpu_variant,
        keep_quantized: false,
        quantize_activations: false,
        tensor_parallel: 1,
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
        // `tlaloc inspect` states the dtype, the scale layout and the bytes per token.
        let inspect = std::process::Command::new(env!("CARGO_BIN_EXE_tlaloc"))
            .arg("inspect")
            .arg(&dir)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&inspect.stdout);
        let scales = if kv_dtype.is_kv_code_dtype() {
            "f32 scales perTokenHead"
        } else {
            "no scales"
        };
        for needle in [
            format!("{kv_dtype} pools, {scales}"),
            format!(
                "{per_token} bytes per token of context, {} bytes in all",
                per_token * slots
            ),
        ] {
            assert!(
                text.contains(&needle),
                "{needle:?} missing from inspect:\n{text}"
            );
        }
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

/// bf16's unit roundoff (8 significand bits).
const BF16_UNIT_ROUNDOFF: f64 = 1.0 / 256.0;

/// Served through the engine (the runtime's own argument layout, pool allocation and
/// donation of the scale pools), int8 and fp8 pools reproduce transformers' greedy ids on the
/// fixture's goldens up to the first step whose golden top-1/top-2 margin is within twice the
/// bf16 rule's bound (`sqrt((16 L + 2) / 3)` bf16 roundings of the top logit, see the export
/// crate's `forward.rs`), which covers the pools' rounding: past it, either token is right.
#[test]
fn quantized_pools_serve_the_fixture_goldens() {
    for kv_dtype in [Dtype::I8, Dtype::F8E4M3FN] {
        let dir = export_tiny(kv_dtype);
        assert_serves_goldens(&dir, KernelChoice::Auto, None, &format!("{kv_dtype} pools"));
    }
}

/// The `cpu` variant's attention kernel reads bf16 pools in place with the portable body's
/// roundings (q and the probabilities to bf16), so a bf16 export served by the variant keeps
/// to the same bf16 rule on the goldens as its portable body; over int8 pools the variant keeps
/// the graph's attention and serves them too. The load line says which bodies ran.
#[test]
fn the_cpu_variant_serves_the_fixture_goldens_over_bf16_and_int8_pools() {
    for (dtype, kv_dtype) in [(Dtype::Bf16, Dtype::Bf16), (Dtype::F32, Dtype::I8)] {
        let dir = export_tiny_with(dtype, kv_dtype, true);
        let entries = tlaloc_artifact::Artifact::open(&dir)
            .unwrap()
            .manifest()
            .entries
            .len();
        let what = format!("{dtype} export, {kv_dtype} pools");
        let variant_line = format!("variant cpu for {entries}");
        assert_serves_goldens(&dir, KernelChoice::Auto, Some(&variant_line), &what);
        assert_serves_goldens(
            &dir,
            KernelChoice::Portable,
            Some("portable for all"),
            &what,
        );
    }
}

/// Loads `dir` on every test plugin with `kernels` (checking the load's bodies line contains
/// `bodies`, where given) and checks the greedy ids of every golden case on its decided steps.
fn assert_serves_goldens(dir: &Path, kernels: KernelChoice, bodies: Option<&str>, what: &str) {
    let golden: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(workspace_root().join("tests/data/goldens/tiny-llama-gqa.json"))
            .unwrap(),
    )
    .unwrap();
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    let layers = tlaloc_artifact::Artifact::open(dir)
        .unwrap()
        .manifest()
        .model
        .num_layers;
    let units = ((16 * layers + 2) as f64 / 3.0).sqrt();
    for plugin in test_plugin_paths() {
        let engine = Engine::load_with_options(
            dir,
            LoadOptions {
                plugin: PluginRequest::Path(plugin.clone()),
                compile: CompileMode::Lazy,
                compile_cache: None,
                kernels,
                ..LoadOptions::default()
            },
            EngineOptions::default(),
        )
        .unwrap();
        if let Some(bodies) = bodies {
            let line = engine
                .load_timings()
                .and_then(|t| t.bodies.clone())
                .unwrap_or_default();
            assert!(
                line.contains(bodies),
                "{what} on {}: {line}",
                plugin.display()
            );
        }
        for case in golden["cases"].as_array().unwrap() {
            let want = ids(&case["greedy_ids"]);
            let decided = case["steps"]
                .as_array()
                .unwrap()
                .iter()
                .position(|s| {
                    let top = s["top_logits"].as_array().unwrap();
                    let scale = top[0]
                        .as_f64()
                        .unwrap()
                        .abs()
                        .max(top[1].as_f64().unwrap().abs());
                    s["margin"].as_f64().unwrap() <= 2.0 * units * BF16_UNIT_ROUNDOFF * scale
                })
                .unwrap_or(want.len());
            let request = GenerateRequest {
                ignore_eos: true,
                ..GenerateRequest::greedy(ids(&case["prompt_ids"]), want.len())
            };
            let mut events = engine.submit(request).unwrap().1;
            let mut got = Vec::new();
            while let Some(event) = events.blocking_recv() {
                match event {
                    TokenEvent::Token { id, .. } => got.push(id),
                    TokenEvent::Finished { .. } => break,
                    TokenEvent::Error { message } => panic!("{what}: {message}"),
                }
            }
            eprintln!(
                "{what} on {}, case {}: {} of {} decided steps match",
                plugin.display(),
                case["name"],
                got.iter()
                    .zip(&want)
                    .take(decided)
                    .filter(|(a, b)| a == b)
                    .count(),
                decided
            );
            assert_eq!(
                got[..decided],
                want[..decided],
                "{what}, case {}",
                case["name"]
            );
        }
        engine.shutdown();
    }
}
